#!/usr/bin/python3
"""ctest scripts.config_table and scripts.config_doc: scripts/config_table.py and docs/config.md.

- The script resolves `include:` the way the simulator does: for every chip and
  board preset its leaf keys and values equal those of `tpusim presets NAME
  --params` (hw/config/params.cpp's merge, dumped by yaml-cpp).
- --write fills the marked sections of a doc and --check then passes; a stale or
  unmarked doc fails --check.
- (--doc mode) every leaf key of every preset in configs/ has a row in
  docs/config.md's reference tables, and the generated tables there are current.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

ARGS = None


def script(*args):
    return subprocess.run([sys.executable, ARGS.script, *args], capture_output=True, text=True, timeout=60)


def keys_of(preset):
    p = script("--configs", os.path.join(ARGS.repo, "configs"), "--keys", preset)
    assert p.returncode == 0, p.stderr
    return dict(line.split(" = ", 1) for line in p.stdout.splitlines())


def preset_names(section):
    d = os.path.join(ARGS.repo, "configs", section)
    return sorted(f[:-5] for f in os.listdir(d) if f.endswith(".yaml"))


def flatten(node, prefix=""):
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else k))
        return out
    if isinstance(node, list):
        return {prefix: "[" + ", ".join(node) + "]"}
    return {prefix: node}


class ConfigTableTest(unittest.TestCase):
    def test_includes_resolve_as_the_simulator_does(self):
        if not ARGS.tpusim:
            self.skipTest("no tpusim binary")
        for name in preset_names("chips") + preset_names("boards"):
            with self.subTest(preset=name):
                p = subprocess.run([ARGS.tpusim, "presets", name, "--params"], capture_output=True, text=True,
                                   timeout=60)
                self.assertEqual(p.returncode, 0, p.stderr)
                dump = p.stdout.split("\n\n", 1)[1]
                want = flatten(yaml.load(dump, Loader=yaml.BaseLoader))
                self.assertEqual(keys_of(name), want)

    def test_write_then_check(self):
        d = tempfile.mkdtemp(prefix="tpusim_cfgdoc_")
        try:
            doc = os.path.join(d, "config.md")
            body = "".join(f"intro {s}\n<!-- BEGIN config_table: {s} -->\nstale\n<!-- END config_table: {s} -->\n"
                           for s in ("chips", "boards", "hbm"))
            with open(doc, "w") as f:
                f.write(body)
            self.assertEqual(script("--doc", doc, "--check").returncode, 1)
            self.assertEqual(script("--doc", doc, "--write").returncode, 0)
            self.assertEqual(script("--doc", doc, "--check").returncode, 0)
            with open(doc) as f:
                text = f.read()
            self.assertNotIn("stale", text)
            self.assertIn("intro boards", text)
            # The v4 column of the chips table carries v4's MXU count.
            row = re.search(r"^\| `core.mxu.count` \|(.*)$", text, re.M).group(1).split("|")
            header = re.search(r"^\| key \|(.*)$", text, re.M).group(1).split("|")
            cols = [h.strip().strip("`") for h in header]
            self.assertEqual(row[cols.index("v4")].strip(), keys_of("v4")["core.mxu.count"])
            with open(doc, "w") as f:
                f.write("no markers here\n")
            p = script("--doc", doc, "--write")
            self.assertEqual(p.returncode, 2)
            self.assertIn("no markers", p.stderr)
        finally:
            shutil.rmtree(d)

    def test_unknown_preset_is_an_error(self):
        p = script("--keys", "v99")
        self.assertEqual(p.returncode, 2)
        self.assertEqual(len(p.stderr.strip().splitlines()), 1)


class ConfigDocTest(unittest.TestCase):
    """docs/config.md documents every parameter the presets have, with current values."""

    def documented_keys(self):
        with open(os.path.join(ARGS.repo, "docs", "config.md")) as f:
            text = f.read()
        # Rows of the reference tables: "| `key`, `key2` | unit | meaning | source |"
        # (the generated value tables sit between markers and do not count).
        text = re.sub(r"<!-- BEGIN config_table.*?<!-- END config_table: \w+ -->", "", text, flags=re.S)
        keys = set()
        for line in text.splitlines():
            m = re.match(r"^\|\s*((?:`[^`]+`(?:,\s*)?)+)\s*\|", line)
            if m:
                keys.update(re.findall(r"`([^`]+)`", m.group(1)))
        return keys

    def test_every_preset_key_is_documented(self):
        documented = self.documented_keys()
        missing = {}
        for section in ("chips", "boards", "hbm"):
            for name in preset_names(section):
                for key in keys_of(os.path.join(ARGS.repo, "configs", section, name + ".yaml")):
                    if key not in documented:
                        missing.setdefault(key, name)
        self.assertEqual(missing, {}, "preset keys without a row in docs/config.md (key: first preset)")

    def test_generated_tables_are_current(self):
        p = script("--configs", os.path.join(ARGS.repo, "configs"), "--doc",
                   os.path.join(ARGS.repo, "docs", "config.md"), "--check")
        self.assertEqual(p.returncode, 0, p.stderr + " (run: /usr/bin/python3 scripts/config_table.py --write)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", required=True)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--tpusim", default="")
    ap.add_argument("--doc", action="store_true", help="run the docs/config.md checks instead")
    ARGS, rest = ap.parse_known_args()
    suite = ConfigDocTest if ARGS.doc else ConfigTableTest
    prog = unittest.main(argv=[sys.argv[0]] + rest, verbosity=2, exit=False,
                         defaultTest=[suite.__name__])
    sys.exit(0 if prog.result.wasSuccessful() else 1)
