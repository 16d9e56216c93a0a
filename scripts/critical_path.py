#!/usr/bin/python3
"""Where a run's critical path leaves a resource: reads the file of
`tpusim run --critical-path FILE.json` (docs/cli.md "The critical path") and
lists the stretches of the path between its segments of one cause (default ici,
the links), longest first, each with its start, length and the causes it is made
of. A collective whose path is mostly ici is link-bound; the stretches off the
links are what keeps the links waiting (on-chip phases, HBM, the cores' order).
With --detail N the N longest are listed segment by segment: each transfer and
wait with the pc of its instruction and, given the bundle's `tpusim disasm`
text, the instruction itself; a core's own time between them on one line. With
--by-instruction (and --disasm) the time off the cause is summed by the kind of
instruction it is the time of: a DMA by its endpoints (e.g. `hbm -> vmem`, a
load; `vmem -> hbm (other core)`, a store into the chip's other core's HBM), a
wait, or the cores' own time.

    /usr/bin/python3 scripts/critical_path.py cp.json [--op 1] [--on ici] [--top 10]
        [--detail 2] [--disasm bundle.s [--by-instruction]]
"""
import argparse
import json
import sys


def stretches(segments, on):
    """The maximal runs of consecutive segments whose cause is not `on`:
    (begin, cycles, {cause: cycles}, [segments]) in path order."""
    out = []
    for s in segments:
        n = s["end"] - s["begin"]
        if s["cause"] == on:
            out.append(None)
            continue
        if not out or out[-1] is None:
            out.append([s["begin"], 0, {}, []])
        out[-1][1] += n
        out[-1][2][s["cause"]] = out[-1][2].get(s["cause"], 0) + n
        out[-1][3].append(s)
    return [tuple(x) for x in out if x is not None]


def read_disasm(path):
    """{core name: [instruction text by pc]} from `tpusim disasm` output: each
    `.core NAME` section's indented lines (labels and directives are no pc),
    without comments."""
    code, cur = {}, None
    with open(path) as f:
        for line in f:
            if line.startswith(".core "):
                cur = code.setdefault(line.split()[1], [])
            elif cur is not None and line[:1].isspace() and line.strip():
                cur.append(line.split("#")[0].strip())  # `tpusim disasm --pc` adds "# pc N"
    return code


def instruction(code, segment):
    """The text of the instruction a segment names by its pc ("" when `code`
    does not have it)."""
    text = code.get(segment["core"], [])
    return text[segment["pc"]] if segment["pc"] < len(text) else ""


def endpoint(text, chip, core):
    """`hbm@chip6.c1:[s0 + 4]` seen from chipC.coreK: its space, and where it is."""
    space, _, where = text.split(":")[0].partition("@")
    if not where:
        return space, ""
    other_chip, _, other_core = where.partition(".c")
    if other_chip != "chip%s" % chip:
        return space, " (other chip)"
    return space, "" if other_core == core else " (other core)"


def kind(instruction, core_name):
    """The kind of an instruction for --by-instruction: a DMA `src -> dst` with
    each remote end marked, else the opcode."""
    if not instruction.startswith("dma "):
        return instruction.split()[0] if instruction else "?"
    chip, _, core = core_name[len("chip"):].partition(".core")
    dst, src = [e.strip() for e in instruction[len("dma "):].split("]")[:2]]
    (ds, dw), (ss, sw) = endpoint(dst, chip, core), endpoint(src.lstrip(", "), chip, core)
    return "%s%s -> %s%s" % (ss, sw, ds, dw)


def by_instruction(segments, on, code):
    """Cycles off `on` by (instruction kind, cause), the most first."""
    total = {}
    for s in segments:
        if s["cause"] == on:
            continue
        if "pc" in s:
            k = kind(instruction(code, s), s["core"])
        else:
            k = "own time"
        total[(k, s["cause"])] = total.get((k, s["cause"]), 0) + s["end"] - s["begin"]
    return sorted(total.items(), key=lambda x: (-x[1], x[0]))


def mix(causes):
    return ", ".join("%s %d" % (c, v) for c, v in sorted(causes.items(), key=lambda x: (-x[1], x[0])))


def detail(segments, code):
    """The lines of one stretch: a segment with a pc (a transfer, its queue wait,
    a wait passing) on its own, with its instruction when `code` has it; the
    segments without one in a row on one core merged into that core's own time."""
    lines, own = [], None
    for s in segments + [None]:
        if s is not None and "pc" not in s and own is not None and own[1] == s["core"]:
            own[2][s["cause"]] = own[2].get(s["cause"], 0) + s["end"] - s["begin"]
            continue
        if own is not None:
            lines.append("    %9d  %7d  %-12s own time: %s" % (own[0], sum(own[2].values()), own[1], mix(own[2])))
            own = None
        if s is None:
            break
        if "pc" not in s:
            own = [s["begin"], s["core"], {s["cause"]: s["end"] - s["begin"]}]
            continue
        ins = instruction(code, s)
        lines.append(("    %9d  %7d  %-12s %-10s pc %d  %s" % (s["begin"], s["end"] - s["begin"], s["core"], s["cause"],
                                                            s["pc"], ins)).rstrip())
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="the --critical-path file")
    ap.add_argument("--op", type=int, help="only the segments of this op id")
    ap.add_argument("--on", default="ici", help="the cause whose gaps to list (default ici)")
    ap.add_argument("--top", type=int, default=10, help="how many stretches to list")
    ap.add_argument("--detail", type=int, default=0, help="list this many of them segment by segment")
    ap.add_argument("--disasm", help="the bundle's `tpusim disasm` text, to show each pc's instruction")
    ap.add_argument("--by-instruction", action="store_true",
                    help="sum the time off the cause by the kind of instruction it is the time of (needs --disasm)")
    a = ap.parse_args(argv)
    if a.by_instruction and not a.disasm:
        ap.error("--by-instruction needs --disasm")
    try:
        with open(a.path) as f:
            doc = json.load(f)
        segments = doc["segments"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit("%s: not a tpusim critical path file (%s)" % (a.path, e))
    if a.op is not None:
        segments = [s for s in segments if s["op"] == a.op]
    total = sum(s["end"] - s["begin"] for s in segments)
    on = sum(s["end"] - s["begin"] for s in segments if s["cause"] == a.on)
    hops = sum(1 for i, s in enumerate(segments) if s["cause"] == a.on and (i == 0 or segments[i - 1]["cause"] != a.on))
    off = stretches(segments, a.on)
    scope = "op %d" % a.op if a.op is not None else "the run"
    print("%s: %d cycles of the path, %d (%.1f%%) %s in %d runs, %d in %d stretches off it" %
          (scope, total, on, 100.0 * on / total if total else 0.0, a.on, hops, total - on, len(off)))
    code = {}
    if a.disasm:
        try:
            code = read_disasm(a.disasm)
        except OSError as e:
            sys.exit("%s: cannot read (%s)" % (a.disasm, e.strerror))
    for i, (begin, n, causes, segs) in enumerate(sorted(off, key=lambda x: (-x[1], x[0]))[:a.top]):
        print("  at %9d  %8d cycles: %s" % (begin, n, mix(causes)))
        if i < a.detail:
            print("\n".join(detail(segs, code)))
    if a.by_instruction:
        print("off %s by instruction:" % a.on)
        for (k, cause), n in by_instruction(segments, a.on, code):
            print("  %9d  %-12s %s" % (n, cause, k))


if __name__ == "__main__":
    main()
