#!/usr/bin/python3
"""ctest scripts.sweep: scripts/sweep.py against direct `tpusim run`s of the same points.

- Every row of a sweep of traces/matmul (HBM clock x DMA engines) equals the stats
  of `tpusim run --set ...` of that point, in grid order; the CSV is byte-identical
  on a second sweep.
- A model swept over the MXU shape is compiled once per shape (the HBM clock axis
  shares the bundle), its FLOPs are the model's on every shape (2 M K N), and each
  point's peak is 2 R C x MXUs x cores x clock.
- A point that faults is a row with status fault and exit status 1, the others
  still measured; an override a point cannot take stops the sweep with exit 2 and
  one line naming the point, before anything is written.
- The keys `tpusim compile` reads all fall under the script's compile prefixes, so
  a point that reuses a bundle cannot need another.
- --plot writes a valid PNG.
"""

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from png_check import png_info  # noqa: E402

ARGS = None
MLP = """graph mm {
  input %x : f32[16,300]
  input %w : f32[300,200]
  %h = matmul(%x, %w) {} : f32[16,200] #0
  output %h
}
"""


def sweep(*args):
    return subprocess.run([sys.executable, ARGS.script, "--tpusim", ARGS.tpusim, *args], capture_output=True,
                          text=True, timeout=300)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def rows(out):
    with open(os.path.join(out, "sweep.csv"), newline="") as f:
        return list(csv.DictReader(f))


class SweepTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tpusim_sweep_")
        self.prog = os.path.join(ARGS.repo, "traces", "matmul", "prog.s")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_rows_are_the_points_direct_runs(self):
        out = os.path.join(self.dir, "s")
        axes = ["--axis", "hbm.clock_hz=292968750,1171875000", "--axis", "core.dma.engines=1,4"]
        p = sweep(self.prog, "--preset", "v4", "--random-inputs", "1", "--out", out, *axes)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = rows(out)
        grid = [(c, e) for c in ("292968750", "1171875000") for e in ("1", "4")]  # first axis slowest
        self.assertEqual([(r["hbm.clock_hz"], r["core.dma.engines"]) for r in got], grid)
        bundle = os.path.join(self.dir, "mm.tpb")
        self.assertEqual(subprocess.run([ARGS.tpusim, "asm", self.prog, "-o", bundle]).returncode, 0)
        for r, (clock, engines) in zip(got, grid):
            d = os.path.join(self.dir, f"direct_{clock}_{engines}")
            q = subprocess.run([ARGS.tpusim, "run", bundle, "--preset", "v4", "--random-inputs", "1", "--out", d, "-q",
                                "--set", f"hbm.clock_hz={clock}", "--set", f"core.dma.engines={engines}"],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(q.returncode, 0, q.stderr)
            with open(os.path.join(d, "stats.json")) as f:
                s = json.load(f)
            self.assertEqual(r["status"], "ok")
            self.assertEqual(int(r["cycles"]), s["cycles"])
            self.assertEqual(int(r["flops"]), s["flops"])
            self.assertEqual(int(r["hbm_bytes"]), s["hbm"]["bytes_read"] + s["hbm"]["bytes_written"])
            self.assertAlmostEqual(float(r["hbm_peak_bytes_per_s"]), s["hbm"]["peak_bytes_per_s"],
                                   delta=1e-5 * s["hbm"]["peak_bytes_per_s"])
            # The report's mean row: one core with a program, so its own shares.
            t = s["time_by_cause"]["chip0.core0"]
            self.assertAlmostEqual(float(r["hbm_wait"]), t["hbm"] / s["cycles"], places=5)
        # One engine cannot overlap the loads: never faster than four.
        for clock in ("292968750", "1171875000"):
            one, four = (int(r["cycles"]) for r in got if r["hbm.clock_hz"] == clock)
            self.assertGreater(one, four)
        first = read_bytes(os.path.join(out, "sweep.csv"))
        p = sweep(self.prog, "--preset", "v4", "--random-inputs", "1", "--out", out, *axes)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(read_bytes(os.path.join(out, "sweep.csv")), first)

    def test_a_model_compiles_once_per_mxu_shape(self):
        model = os.path.join(self.dir, "mm.ir")
        with open(model, "w") as f:
            f.write(MLP)
        out = os.path.join(self.dir, "m")
        png = os.path.join(self.dir, "m.png")
        p = sweep(model, "--preset", "v4", "--random-inputs", "2", "--out", out, "--jobs", "2",
                  "--axis", "core.mxu.rows+core.mxu.cols=32,64", "--axis", "hbm.clock_hz=585937500,1171875000",
                  "--plot", png, "--y", "cycles")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("4 point(s), 2 compile(s)", p.stdout)
        got = rows(out)
        self.assertEqual(len(got), 4)
        for r in got:
            n = int(r["core.mxu.rows+core.mxu.cols"])
            self.assertEqual(r["status"], "ok", r["error"])
            self.assertEqual(int(r["flops"]), 2 * 16 * 300 * 200)
            self.assertAlmostEqual(float(r["peak_flops_per_s"]), 2 * n * n * 4 * 2 * 1.05e9, delta=1e3)
        # A smaller array takes more passes: slower at either HBM clock.
        by = {(r["core.mxu.rows+core.mxu.cols"], r["hbm.clock_hz"]): int(r["cycles"]) for r in got}
        for clock in ("585937500", "1171875000"):
            self.assertGreater(by[("32", clock)], by[("64", clock)])
        width, height, colours, _ = png_info(png)
        self.assertGreater(width, 100)
        self.assertGreater(colours, 3)

    def test_several_presets_are_the_first_axis(self):
        out = os.path.join(self.dir, "p")
        p = sweep(self.prog, "--preset", "v3,v4", "--random-inputs", "1", "--out", out, "--axis", "core.dma.engines=2")
        self.assertEqual(p.returncode, 0, p.stderr)
        got = rows(out)
        self.assertEqual([r["preset"] for r in got], ["v3", "v4"])
        # Peaks from the published TPU facts: 2 x 128 x 128 x MXUs x 2 cores x clock.
        for r, mxus, clock in zip(got, (2, 4), (940e6, 1050e6)):
            self.assertAlmostEqual(float(r["peak_flops_per_s"]), 2 * 128 * 128 * mxus * 2 * clock, delta=1e9)
        bundle = os.path.join(self.dir, "mm.tpb")
        self.assertEqual(subprocess.run([ARGS.tpusim, "asm", self.prog, "-o", bundle]).returncode, 0)
        for r in got:
            d = os.path.join(self.dir, "direct_" + r["preset"])
            q = subprocess.run([ARGS.tpusim, "run", bundle, "--preset", r["preset"], "--random-inputs", "1", "--out", d,
                                "-q", "--set", "core.dma.engines=2"], capture_output=True, text=True, timeout=120)
            self.assertEqual(q.returncode, 0, q.stderr)
            with open(os.path.join(d, "stats.json")) as f:
                self.assertEqual(int(r["cycles"]), json.load(f)["cycles"])
        p = sweep(self.prog, "--preset", "v4", "--out", out)
        self.assertEqual(p.returncode, 2)
        self.assertIn("nothing to sweep", p.stderr)

    def test_a_faulting_point_is_a_row_and_exit_1(self):
        out = os.path.join(self.dir, "f")
        p = sweep(self.prog, "--preset", "v4", "--random-inputs", "1", "--out", out, "--max-cycles", "20000",
                  "--axis", "core.dma.hbm_to_vmem.latency_cycles=100,30000")
        self.assertEqual(p.returncode, 1, p.stderr)
        got = rows(out)
        self.assertEqual([r["status"] for r in got], ["ok", "fault"])
        self.assertIn("20000", got[1]["error"])
        self.assertEqual(got[1]["cycles"], "")
        self.assertEqual(len([l for l in p.stderr.splitlines() if l.strip()]), 1, p.stderr)

    def test_bad_overrides_stop_before_anything_runs(self):
        for axis, needle in (("core.mxu.rowz=64", "unknown parameter 'core.mxu.rowz'"),
                             ("core.mxu.rows=64,256", "rows=256 must be a multiple of 8 in 8..128"),
                             ("core.dma.engines=2.5", "expected an integer"),
                             ("core.dma.engines=", "expected V1,V2"),
                             ("core.dma.engines", "expected KEY")):
            with self.subTest(axis=axis):
                out = os.path.join(self.dir, "bad")
                p = sweep(self.prog, "--preset", "v4", "--out", out, "--axis", axis)
                self.assertEqual(p.returncode, 2, p.stderr)
                lines = [l for l in p.stderr.splitlines() if l.strip()]
                self.assertEqual(len(lines), 1, p.stderr)
                self.assertIn(needle, lines[0])
                self.assertFalse(os.path.exists(out))

    def test_compile_prefixes_cover_the_keys_compile_reads(self):
        sys.path.insert(0, os.path.dirname(ARGS.script))
        import sweep as sweep_module  # noqa: E402
        keys = set()
        for src in ("sim/cmd_compile.cpp", "hw/ici/topology.cpp"):
            with open(os.path.join(ARGS.repo, src)) as f:
                keys.update(re.findall(r'get_(?:int|double|string|bool|int_list)\("([^"]+)"\)', f.read()))
        self.assertIn("core.mxu.rows", keys)  # the pattern still finds the reads
        self.assertIn("system.dims", keys)
        for k in sorted(keys):
            self.assertTrue(sweep_module.compiles_differently(k), k)
        self.assertFalse(sweep_module.compiles_differently("hbm.clock_hz"))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", required=True)
    ap.add_argument("--tpusim", required=True)
    ap.add_argument("--repo", required=True)
    ARGS, rest = ap.parse_known_args()
    prog = unittest.main(argv=[sys.argv[0]] + rest, verbosity=2, exit=False)
    sys.exit(0 if prog.result.wasSuccessful() else 1)
