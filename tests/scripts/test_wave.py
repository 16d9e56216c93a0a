#!/usr/bin/python3
"""ctest scripts.wave_screenshot: the per-PE MXU waveform and its headless screenshot.

tests/scripts/mxu_wave runs an 8 x 8 per-PE MXU (one PE per cycle) through four
mmuls and writes a VCD. Checked here against expectations of our own: every PE's
partial sum and entering activation is in the file; the activation reaches PE
(0, c) exactly c cycles after PE (0, 0) (P = 1 PE per cycle, docs/mxu.md); the
bottom row's last partial sums are row 7 of the last mmul, computed here with
numpy from the same integer inputs. Then scripts/wave_screenshot.sh must turn it
into a valid PNG with traces drawn, and refuse bad input with exit status 2.
Exit 77 (ctest: skipped) when gtkwave or the X tools are missing.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from png_check import png_info

ARGS = None
CYCLE_UNITS = 10  # VCD timescale 100 ps, 1 ns cycle


def parse_vcd(path):
    """{full name: (type, [(time, value), ...])} with dotted names as GTKWave builds them."""
    scopes, by_id, out, t = [], {}, {}, 0
    with open(path) as f:
        lines = iter(f.read().splitlines())
    for line in lines:
        tok = line.split()
        if not tok:
            continue
        if tok[0] == "$scope":
            scopes.append(tok[2])
        elif tok[0] == "$upscope":
            scopes.pop()
        elif tok[0] == "$var":
            name = ".".join(scopes + [tok[4]])
            out[name] = (tok[1], [])
            by_id.setdefault(tok[3], []).append(name)
        elif tok[0] == "$enddefinitions":
            break
    for line in lines:
        if not line or line.startswith("$"):
            continue
        if line[0] == "#":
            t = int(line[1:])
        elif line[0] in "rRbB":
            value, ident = line[1:].split()
            for n in by_id.get(ident, []):
                out[n][1].append((t, float(value) if line[0] in "rR" else int(value, 2) if value.isdigit() else value))
        else:
            for n in by_id.get(line[1:], []):
                out[n][1].append((t, int(line[0]) if line[0] in "01" else line[0]))
    return out


def first_rise(changes):
    return next(t for t, v in changes if v == 1)


class WaveTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tpusim_wave_")
        cls.base = os.path.join(cls.dir, "mxu")
        p = subprocess.run([ARGS.mxu_wave, cls.base], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        cls.stdout = p.stdout
        cls.vcd = cls.base + ".vcd"
        cls.signals = parse_vcd(cls.vcd)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def test_vcd_has_every_pe_and_the_unit_state(self):
        for sig in ("busy", "fifo_rows", "inflight_rows", "staging_rows", "queue_depth", "last_op", "stall_reason"):
            self.assertIn(f"SystemC.mxu0.{sig}", self.signals)
        for r in range(8):
            for c in range(8):
                pe = f"SystemC.mxu0.array.pe_{r}_{c}"
                self.assertEqual(self.signals[pe + ".psum"][0], "real")
                self.assertIn(pe + ".act.valid", self.signals)
                self.assertIn(pe + ".act.value", self.signals)

    def test_activation_moves_one_pe_per_cycle(self):
        t0 = first_rise(self.signals["SystemC.mxu0.array.pe_0_0.act.valid"][1])
        for c in range(1, 8):
            self.assertEqual(first_rise(self.signals[f"SystemC.mxu0.array.pe_0_{c}.act.valid"][1]) - t0,
                             c * CYCLE_UNITS, c)

    def test_bottom_row_ends_with_the_last_mmul(self):
        # The inputs of tests/scripts/mxu_wave.cpp: mmul 3 on weight tile 1.
        k, c = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
        w = ((k * 3 + c * 5 + 1 * 2) % 7 - 3).astype(np.float64)
        m, kk = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
        a = ((m + 2 * kk + 3 * 3) % 5 - 2).astype(np.float64)
        want = (a @ w)[7]
        printed = re.search(r"last_mmul_row7 (.*)", self.stdout).group(1).split()
        np.testing.assert_array_equal(np.array(printed, dtype=float), want)
        got = [self.signals[f"SystemC.mxu0.array.pe_7_{c}.psum"][1][-1][1] for c in range(8)]
        np.testing.assert_array_equal(np.array(got), want)

    def screenshot(self, *args):
        return subprocess.run([ARGS.script, *args], capture_output=True, text=True, timeout=90)

    def test_screenshot_shows_traces(self):
        out = os.path.join(self.dir, "shot.png")
        gtkw = os.path.join(self.dir, "shot.gtkw")
        p = self.screenshot("--save", gtkw, self.vcd, out, "SystemC.clk", "*.mxu0.busy", "*.mxu0.fifo_rows",
                            "*.pe_[0-7]_0.act.valid", "*.pe_7_[0-3].psum")
        self.assertEqual(p.returncode, 0, p.stderr)
        width, height, colours, pixels = png_info(out)
        self.assertTrue(1000 <= width <= 1500 and 300 <= height <= 1500, (width, height))  # the window
        self.assertGreater(colours, 20)
        # GTKWave draws traces in green on black: a blank or failed view has none.
        rgb = pixels[..., :3]
        green = (rgb[..., 1] > 0.7) & (rgb[..., 0] < 0.3) & (rgb[..., 2] < 0.3)
        self.assertGreater(int(green.sum()), 2000)
        with open(gtkw) as f:
            saved = f.read()
        # 1 + 1 + 1 + 8 + 4 traces, in glob order.
        names = re.findall(r"^\+\{[^}]*\} (\S+)$", saved, re.M)
        self.assertEqual(len(names), 15)
        self.assertEqual(names[0], "SystemC.clk")
        self.assertEqual(names[3:11], [f"SystemC.mxu0.array.pe_{r}_0.act.valid" for r in range(8)])

    def test_list_and_screenshot_fst(self):
        p = self.screenshot("--list", self.vcd)
        self.assertEqual(p.returncode, 0, p.stderr)
        listed = p.stdout.split()
        self.assertEqual(len(listed), len(self.signals))
        self.assertIn("SystemC.mxu0.array.pe_7_7.psum", listed)
        self.assertIn("SystemC.mxu0.fifo_rows[31:0]", listed)
        if shutil.which("vcd2fst"):
            fst = self.base + ".fst"
            subprocess.run(["vcd2fst", self.vcd, fst], check=True, capture_output=True)
            p = self.screenshot("--list", fst)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(sorted(p.stdout.split()), sorted(listed))
            out = os.path.join(self.dir, "fst.png")
            p = self.screenshot(fst, out, "*.mxu0.*_rows")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("3 signals", p.stderr)
            self.assertGreater(png_info(out)[2], 10)

    def test_bad_input_exits_2(self):
        bogus = os.path.join(self.dir, "bogus.txt")
        with open(bogus, "w") as f:
            f.write("not a waveform\n")
        cases = [
            [os.path.join(self.dir, "missing.vcd"), os.path.join(self.dir, "a.png")],
            [bogus, os.path.join(self.dir, "a.png")],
            [self.vcd, os.path.join(self.dir, "a.jpg")],
            [self.vcd, os.path.join(self.dir, "nodir", "a.png")],
            [self.vcd, os.path.join(self.dir, "a.png"), "*.no_such_signal"],
            ["--size", "huge", self.vcd, os.path.join(self.dir, "a.png")],
        ]
        for args in cases:
            with self.subTest(args=args):
                p = self.screenshot(*args)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
                self.assertFalse(os.path.exists(os.path.join(self.dir, "a.png")))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", required=True)
    ap.add_argument("--mxu-wave", required=True)
    ARGS, rest = ap.parse_known_args()
    missing = [t for t in ("gtkwave", "xvfb-run", "xauth", "xwd", "convert") if not shutil.which(t)]
    if missing:
        print(f"skipped: {', '.join(missing)} not installed (scripts/packages.txt)")
        sys.exit(77)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
