#!/usr/bin/python3
"""Where a run's critical path leaves a resource: reads the file of
`tpusim run --critical-path FILE.json` (docs/cli.md "The critical path") and
lists the stretches of the path between its segments of one cause (default ici,
the links), longest first, each with its start, length and the causes it is made
of. A collective whose path is mostly ici is link-bound; the stretches off the
links are what keeps the links waiting (on-chip phases, HBM, the cores' order).

    /usr/bin/python3 scripts/critical_path.py cp.json [--op 1] [--on ici] [--top 10]
"""
import argparse
import json
import sys


def stretches(segments, on):
    """The maximal runs of consecutive segments whose cause is not `on`:
    (begin, cycles, {cause: cycles}) in path order."""
    out = []
    for s in segments:
        n = s["end"] - s["begin"]
        if s["cause"] == on:
            out.append(None)
            continue
        if not out or out[-1] is None:
            out.append([s["begin"], 0, {}])
        out[-1][1] += n
        out[-1][2][s["cause"]] = out[-1][2].get(s["cause"], 0) + n
    return [tuple(x) for x in out if x is not None]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="the --critical-path file")
    ap.add_argument("--op", type=int, help="only the segments of this op id")
    ap.add_argument("--on", default="ici", help="the cause whose gaps to list (default ici)")
    ap.add_argument("--top", type=int, default=10, help="how many stretches to list")
    a = ap.parse_args(argv)
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
    for begin, n, causes in sorted(off, key=lambda x: (-x[1], x[0]))[:a.top]:
        mix = ", ".join("%s %d" % (c, v) for c, v in sorted(causes.items(), key=lambda x: (-x[1], x[0])))
        print("  at %9d  %8d cycles: %s" % (begin, n, mix))


if __name__ == "__main__":
    main()
