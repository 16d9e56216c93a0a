#!/usr/bin/python3
"""ctest scripts.plot: scripts/plot.py on a stats.json of the CLI's schema.

The stats file comes from tests/scripts/stats_fixture.cpp (sim/run's make_stats,
refused unless check_stats accepts it); this test adds a per-op list to it. The
numbers plot.py reports are checked against the roofline's closed forms written
out here, the PNGs are parsed chunk by chunk (png_check.py) and decoded, and every malformed input must give exit status 2 and one
line on stderr naming the file.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from png_check import png_info

ARGS = None

CLOCK = 1.05e9
OPS = [  # id, name, flops, hbm_bytes, cycles
    (0, "matmul", 2 * 1024 * 1024 * 1024, 3 * 1024 * 1024 * 2, 9000),  # 2 GFLOP: intensity 341 (compute side)
    (1, "matmul", 2 * 128 * 128 * 128, 3 * 128 * 128 * 2, 400),        # intensity 42.7 (memory side)
    (2, "softmax", 5 * 128 * 1024, 2 * 128 * 1024 * 4, 3000),          # intensity 0.625
    (3, "infeed", 0, 1 << 20, 1500),                                   # no FLOPs: clipped to the bottom edge
    ("4b", "reduce", 4096, 0, 50),                                     # no HBM traffic: clipped to the right edge
]


def run(args, check_rc=None):
    p = subprocess.run([sys.executable, ARGS.plot] + args, capture_output=True, text=True, timeout=100)
    if check_rc is not None and p.returncode != check_rc:
        raise AssertionError(f"plot.py {args}: exit {p.returncode}, stderr: {p.stderr}")
    return p


def parse_summary(stdout):
    points, units = {}, {}
    for line in stdout.splitlines():
        rec = json.loads(line)
        if "point" in rec:
            points[rec["point"]] = rec
        else:
            units[rec["unit"]] = rec
    return points, units


class PlotTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tpusim_plot_")
        self.stats_path = os.path.join(self.dir, "stats.json")
        subprocess.run([ARGS.fixture, self.stats_path], check=True)
        with open(self.stats_path) as f:
            self.stats = json.load(f)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def write(self, doc, name="stats.json"):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(doc if isinstance(doc, str) else json.dumps(doc))
        return path

    def check_png(self, path, min_colours):
        self.assertTrue(os.path.isfile(path), path)
        size = os.path.getsize(path)
        self.assertGreater(size, 10_000, f"{path}: {size} bytes, too small for a chart")
        self.assertLess(size, 300_000, f"{path}: {size} bytes")
        width, height, colours, _ = png_info(path)
        self.assertTrue(300 <= width <= 3000 and 200 <= height <= 3000, (width, height))
        self.assertGreaterEqual(colours, min_colours, f"{path}: only {colours} colours, a blank figure?")

    def test_roofline_with_ops_matches_closed_forms(self):
        doc = dict(self.stats)
        doc["ops"] = [{"id": i, "name": n, "flops": f, "hbm_bytes": b, "cycles": c} for i, n, f, b, c in OPS]
        path = self.write(doc, "with_ops.json")
        roof, util = os.path.join(self.dir, "r.png"), os.path.join(self.dir, "u.png")
        p = run([path, "--roofline", roof, "--utilization", util, "--summary"], check_rc=0)
        self.check_png(roof, 20)
        self.check_png(util, 10)
        points, _ = parse_summary(p.stdout)
        peak = 2 * 128 * 128 * 4 * 2 * CLOCK
        ridge = peak / 1.2e12
        self.assertEqual(set(points), {str(o[0]) for o in OPS} | {"run"})
        for op_id, name, flops, nbytes, cycles in OPS:
            got = points[str(op_id)]
            self.assertEqual(got["name"], name)
            want_i = flops / nbytes if nbytes else math.inf
            self.assertEqual(got["intensity"], want_i)
            self.assertAlmostEqual(got["attained_flops_per_s"], flops * CLOCK / cycles,
                                   delta=1e-12 * flops * CLOCK / cycles)
            self.assertEqual(got["bound"], "compute" if want_i >= ridge else "memory")
        run_point = points["run"]
        self.assertAlmostEqual(run_point["intensity"], 1e9 / 4e6)
        self.assertAlmostEqual(run_point["attained_flops_per_s"] / (1e9 / (20000 / CLOCK)), 1.0, places=12)
        self.assertEqual(run_point["bound"], "compute")  # 250 FLOP/B vs the v4 ridge of 229.4

    def test_utilization_fractions_and_stall_spellings(self):
        p = run([self.stats_path, "--utilization", os.path.join(self.dir, "u.png"), "--summary"], check_rc=0)
        _, units = parse_summary(p.stdout)
        busy = lambda u: units[u]["busy"]
        stall = lambda u, r: units[u]["stall"][r]
        self.assertNotIn("chip0.hbm", units)  # neither busy nor stall counters
        self.assertEqual(busy("chip0.core0.mxu0"), 15000 / 20000)
        self.assertEqual(units["chip0.core0.mxu0"]["stall"], {"fifo_full": 1000 / 20000, "array_busy": 3000 / 20000})
        self.assertEqual(units["chip0.core0.mxu1"]["stall"], {"waiting_for_results": 2000 / 20000})
        self.assertIsNone(busy("chip0.core0.sequencer"))
        self.assertEqual(stall("chip0.core0.sequencer", "flag"), 4000 / 20000)
        self.assertEqual(stall("chip0.core0.sequencer", "queue_full"), 500 / 20000)
        self.assertEqual(stall("chip0.core0.vpu", "dependency"), 100 / 20000)
        self.assertEqual(busy("chip0.core0.dma0"), 8000 / 16000)  # the unit's own cycle count
        self.assertEqual(busy("chip0.ici.link0"), 1234.5 / 20000)
        self.assertEqual(units["chip0.ici.link0"]["stall"], {"credit": 10 / 20000})

    def test_a_pod_of_units_keeps_the_chart_readable(self):
        doc = json.loads(json.dumps(self.stats))
        doc["units"] = {f"chip{c}.core{k}.mxu{m}": {"busy_cycles": (c * 7 + m) % 20000}
                        for c in range(256) for k in range(2) for m in range(4)}
        path = self.write(doc, "pod.json")
        out = os.path.join(self.dir, "pod.png")
        p = run([path, "--utilization", out, "--summary"], check_rc=0)
        _, units = parse_summary(p.stdout)
        self.assertEqual(len(units), 2048)  # the numbers cover every unit ...
        width, height, _, _ = png_info(out)
        self.assertLess(height, 3000)  # ... the chart the busiest 64 (2048 rows would be ~86000 px)

    def test_whole_run_is_the_only_point_without_ops(self):
        p = run([self.stats_path, "--roofline", os.path.join(self.dir, "r.png"), "--summary"], check_rc=0)
        points, _ = parse_summary(p.stdout)
        self.assertEqual(list(points), ["run"])
        self.check_png(os.path.join(self.dir, "r.png"), 20)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "utilization.png")))

    def test_default_outputs_next_to_the_stats_file(self):
        run([self.stats_path], check_rc=0)
        self.check_png(os.path.join(self.dir, "roofline.png"), 20)
        self.check_png(os.path.join(self.dir, "utilization.png"), 10)

    def test_malformed_inputs_exit_2_with_one_line(self):
        good = self.stats

        def variant(edit):
            doc = json.loads(json.dumps(good))
            edit(doc)
            return doc

        def op(**kw):
            o = {"id": 0, "name": "mm", "flops": 1, "hbm_bytes": 1, "cycles": 1}
            o.update(kw)
            return o

        cases = {
            "missing": None,
            "empty": "",
            "not_json": "{\"cycles\": 12,",
            "array": [],
            "no_cycles": variant(lambda d: d.pop("cycles")),
            "negative_cycles": variant(lambda d: d.update(cycles=-5)),
            "float_flops": variant(lambda d: d.update(flops=1.5)),
            "bool_cycles": variant(lambda d: d.update(cycles=True)),
            "hbm_string": variant(lambda d: d.update(hbm="fast")),
            "no_peak_bw": variant(lambda d: d["hbm"].pop("peak_bytes_per_s")),
            "zero_peak": variant(lambda d: d.update(peak_flops_per_s=0)),
            "unit_number": variant(lambda d: d["units"].update({"chip0.x": 3})),
            "ops_object": variant(lambda d: d.update(ops={"id": 0})),
            "op_no_bytes": variant(lambda d: d.update(ops=[{"id": 0, "name": "a", "flops": 1, "cycles": 1}])),
            "op_zero_cycles": variant(lambda d: d.update(ops=[op(cycles=0)])),
            "op_duplicate_id": variant(lambda d: d.update(ops=[op(), op()])),
            "op_name_number": variant(lambda d: d.update(ops=[op(name=7)])),
        }
        for name, doc in cases.items():
            with self.subTest(name):
                path = os.path.join(self.dir, name + ".json")
                if doc is not None:
                    self.write(doc, name + ".json")
                out = os.path.join(self.dir, name + ".png")
                p = run([path, "--roofline", out])
                self.assertEqual(p.returncode, 2, p.stderr)
                lines = p.stderr.strip().splitlines()
                self.assertEqual(len(lines), 1, p.stderr)
                self.assertIn(path, lines[0])
                self.assertFalse(os.path.exists(out))

    def test_bad_options_exit_2(self):
        for args in (["--roofline"], [self.stats_path, "--bogus"],
                     [self.stats_path, "--roofline", os.path.join(self.dir, "nodir", "r.png")]):
            with self.subTest(args=args):
                p = run(args)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)

    def test_stats_of_a_real_run(self):
        """tpusim asm + run on traces/matmul, then plot its stats.json."""
        if not ARGS.tpusim or not os.path.exists(ARGS.tpusim):
            self.skipTest("no tpusim binary")
        bundle = os.path.join(self.dir, "m.tpu")
        out = os.path.join(self.dir, "run")
        subprocess.run([ARGS.tpusim, "asm", os.path.join(ARGS.repo, "traces/matmul/prog.s"), "-o", bundle],
                       check=True, capture_output=True)
        r = subprocess.run([ARGS.tpusim, "run", bundle, "--preset", "v4", "--random-inputs", "1", "--out", out,
                            "-q"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        p = run([os.path.join(out, "stats.json"), "--summary"], check_rc=0)
        points, units = parse_summary(p.stdout)
        with open(os.path.join(out, "stats.json")) as f:
            s = json.load(f)
        nbytes = s["hbm"]["bytes_read"] + s["hbm"]["bytes_written"]
        self.assertAlmostEqual(points["run"]["intensity"], s["flops"] / nbytes)
        self.assertTrue(any(u.endswith(".mxu0") for u in units), units)
        self.check_png(os.path.join(out, "roofline.png"), 20)
        self.check_png(os.path.join(out, "utilization.png"), 10)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--plot", required=True)
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--tpusim", default="")
    ap.add_argument("--repo", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
