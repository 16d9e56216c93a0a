#!/usr/bin/python3
"""scripts/critical_path.py on a path written by hand, whose stretches off the
links are known: the summary line's totals and the listed stretches, their
order, lengths and cause mix; --op keeps one op's segments; a file that is not a
critical path is refused with one line and a non-zero exit; --detail lists a
stretch segment by segment, a transfer with its pc and, from a `tpusim disasm`
text, its instruction, a core's own time merged on one line; --by-instruction
sums the time off the links by instruction kind (a DMA by its endpoints)."""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", required=True)
    a = ap.parse_args()
    fails = 0

    def report(ok, what):
        nonlocal fails
        print("%s %s" % ("ok  " if ok else "FAIL", what))
        fails += not ok

    def seg(b, e, c, op=1, pc=None, core="chip0.core0"):
        s = {"core": core, "begin": b, "end": e, "cause": c, "op": op}
        if pc is not None:
            s["pc"] = pc
        return s

    doc = {"cycles": 400, "segments": [
        seg(0, 10, "issue", 0), seg(10, 100, "ici"), seg(100, 150, "hbm", pc=1, core="chip0.core1"),
        seg(150, 160, "dma_queue", pc=1, core="chip0.core1"),
        seg(160, 300, "ici"), seg(300, 305, "issue"), seg(305, 330, "ici"), seg(330, 400, "core_to_core", 2)]}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "cp.json")
        with open(path, "w") as f:
            json.dump(doc, f)

        def run(*extra):
            return subprocess.run(["/usr/bin/python3", a.script, path, *extra], capture_output=True, text=True)

        r = run()
        lines = r.stdout.splitlines()
        report(r.returncode == 0, "runs (%s)" % r.stderr.strip())
        # ici: 90 + 140 + 25 = 255 in 3 runs; off it 10 + 60 + 5 + 70 = 145 in 4 stretches.
        report(lines[0] == "the run: 400 cycles of the path, 255 (63.8%) ici in 3 runs, 145 in 4 stretches off it",
               "summary: " + lines[0])
        want = ["  at       330        70 cycles: core_to_core 70",
                "  at       100        60 cycles: hbm 50, dma_queue 10",
                "  at         0        10 cycles: issue 10",
                "  at       300         5 cycles: issue 5"]
        report(lines[1:] == want, "stretches, longest first: %s" % lines[1:])
        r = run("--op", "1", "--top", "1")
        lines = r.stdout.splitlines()
        report(lines[0] == "op 1: 320 cycles of the path, 255 (79.7%) ici in 3 runs, 65 in 2 stretches off it",
               "--op 1: " + lines[0])
        report(lines[1:] == ["  at       100        60 cycles: hbm 50, dma_queue 10"], "--top 1: %s" % lines[1:])
        r = run("--on", "hbm")
        report(r.stdout.splitlines()[0].startswith("the run: 400 cycles of the path, 50 (12.5%) hbm in 1 runs"),
               "--on hbm: " + r.stdout.splitlines()[0])
        # The 60-cycle stretch in detail, with the instructions of a disassembly
        # (core1's pc 1 is its dma: the label is no instruction; the comment of
        # `tpusim disasm --pc` is dropped).
        dis = os.path.join(d, "b.s")
        with open(dis, "w") as f:
            f.write(".target chips=1 cores=2\n\n.core chip0.core0\n  halt\n.core chip0.core1\n  wait f1, 1\n"
                    "next:\n  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=4, flag=f1  # pc 1\n  halt\n")
        r = run("--top", "2", "--detail", "2", "--disasm", dis)
        want = ["  at       330        70 cycles: core_to_core 70",
                "          330       70  chip0.core0  own time: core_to_core 70",
                "  at       100        60 cycles: hbm 50, dma_queue 10",
                "          100       50  chip0.core1  hbm        pc 1  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=4, flag=f1",
                "          150       10  chip0.core1  dma_queue  pc 1  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=4, flag=f1"]
        report(r.stdout.splitlines()[1:] == want, "--detail 2 --disasm: %s" % r.stdout.splitlines()[1:])
        r = run("--top", "0", "--disasm", dis, "--by-instruction")
        by_kind = ["off ici by instruction:",
                   "         70  core_to_core own time",
                   "         50  hbm          hbm -> vmem",
                   "         15  issue        own time",
                   "         10  dma_queue    hbm -> vmem"]
        report(r.stdout.splitlines()[1:] == by_kind, "--by-instruction: %s" % r.stdout.splitlines()[1:])
        r = run("--by-instruction")
        report(r.returncode != 0 and "--by-instruction needs --disasm" in r.stderr, "--by-instruction alone: refused")
        # A DMA's kind from its endpoints, seen from the issuing core.
        spec = importlib.util.spec_from_file_location("critical_path", a.script)
        cp = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cp)
        kinds = [cp.kind("dma hbm@chip6.c0:[s0 + 64], vmem:[s0 + 0], bytes=4, flag=f1", "chip6.core1"),
                 cp.kind("dma vmem@chip9.c1:[s0 + 0], vmem:[s0 + 0], bytes=4, rflag=f3", "chip6.core1"),
                 cp.kind("dma smem@chip6.c1:[s0 + 0], smem:[s0 + 4], bytes=4", "chip6.core1"),
                 cp.kind("dma vmem:[s0 + 0], hbm@chip2.c0:[s0 + 0], bytes=4", "chip6.core1"),
                 cp.kind("wait f1, 2", "chip6.core1")]
        report(kinds == ["vmem -> hbm (other core)", "vmem -> vmem (other chip)", "smem -> smem",
                         "hbm (other chip) -> vmem", "wait"], "kinds: %s" % kinds)
        r = run("--top", "2", "--detail", "2")
        report(r.stdout.splitlines()[1:] == [w[:w.index("pc 1") + 4] if "pc 1" in w else w for w in want],
               "--detail without a disassembly: %s" % r.stdout.splitlines()[1:])
        with open(path, "w") as f:
            f.write("{\"cycles\": 1}")
        r = run()
        report(r.returncode != 0 and "not a tpusim critical path file" in r.stderr and len(r.stderr.splitlines()) == 1,
               "a file without segments is refused: " + r.stderr.strip())
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
