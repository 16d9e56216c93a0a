#!/usr/bin/python3
"""Per-preset value tables of configs/ for docs/config.md, regenerated from the YAML.

usage: scripts/config_table.py [--configs DIR] [--doc docs/config.md] [--write | --check]
       scripts/config_table.py --keys PRESET     # every leaf key = value of one preset

Without --write or --check it prints the tables (Markdown) on stdout. With --write
it replaces the text between the markers
    <!-- BEGIN config_table: SECTION -->  ...  <!-- END config_table: SECTION -->
in the doc (SECTION is chips, boards or hbm); with --check it exits 1 when the
doc's generated parts differ from what the configs give now. Run it after editing
a preset:  /usr/bin/python3 scripts/config_table.py --write

Presets resolve `include: PATH` exactly as hw/config/params.cpp does: the included
file's mapping with the including mapping's other entries deep-merged over it
(mappings merge key by key, anything else replaces), at any depth. Values are shown
as written in the YAML (the text `--set` accepts), with a readable size or rate
after byte counts, byte rates and clocks.
"""

import argparse
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTIONS = ("chips", "boards", "hbm")
CHIP_ORDER = ["v2", "v3", "v4", "v5e"]


def fail(msg, status=2):
    print(f"config_table.py: error: {msg}", file=sys.stderr)
    sys.exit(status)


def load_yaml(path):
    try:
        with open(path) as f:
            # BaseLoader keeps every scalar as its text: "0.7e12" stays "0.7e12" (as
            # yaml-cpp reads it), where PyYAML's YAML 1.1 resolver would disagree on types.
            return yaml.load(f, Loader=yaml.BaseLoader)
    except OSError as e:
        fail(f"{path}: cannot read: {e.strerror}")
    except yaml.YAMLError as e:
        fail(f"{path}: {str(e).splitlines()[0]}")


def merged(base, over):
    if not isinstance(base, dict) or not isinstance(over, dict):
        return over
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if k in out else v
    return out


def resolve(node, directory, depth=0):
    if depth > 16:
        fail(f"{directory}: includes nested too deep (a cycle?)")
    if not isinstance(node, dict):
        return node
    own = {k: resolve(v, directory, depth) for k, v in node.items() if k != "include"}
    if "include" not in node:
        return own
    inc = os.path.normpath(os.path.join(directory, node["include"]))
    base = resolve(load_yaml(inc), os.path.dirname(inc), depth + 1)
    if not isinstance(base, dict):
        fail(f"{inc}: an included file must hold a mapping")
    return merged(base, own)


def load_preset(path):
    return resolve(load_yaml(path), os.path.dirname(path))


def leaves(node, prefix=""):
    """{dotted key: value text}; a list is one leaf, written in flow style as --set takes it."""
    out = {}
    if isinstance(node, dict):
        for k, v in node.items():
            out.update(leaves(v, f"{prefix}.{k}" if prefix else k))
    elif isinstance(node, list):
        out[prefix] = "[" + ", ".join(leaves(v, "x")["x"] if not isinstance(v, (dict, list)) else str(v)
                                      for v in node) + "]"
    else:
        out[prefix] = node
    return out


def human(key, text):
    """A readable size, rate or frequency after the raw value, where the key names the unit."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        return text
    last = key.split(".")[-1]
    if last.endswith("bytes_per_s"):
        return f"{text} ({v / 1e9:g} GB/s)"
    if last.endswith("_hz"):
        return f"{text} ({v / 1e6:g} MHz)"
    if last == "bytes" and v >= 1 << 20:
        for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20)):
            if v >= size and v % size == 0:
                return f"{text} ({int(v // size)} {unit})"
        return f"{text} ({v / 1e9:g} GB)"
    return text


def presets(configs, section):
    d = os.path.join(configs, section)
    if not os.path.isdir(d):
        fail(f"{d}: no such folder")
    names = sorted(f[:-5] for f in os.listdir(d) if f.endswith(".yaml"))
    if section == "chips":
        names.sort(key=lambda n: (CHIP_ORDER.index(n) if n in CHIP_ORDER else len(CHIP_ORDER), n))
    return [(n, load_preset(os.path.join(d, n + ".yaml"))) for n in names]


def cell(text):
    return str(text).replace("|", "\\|")


def table(rows_by_preset, keys=None, note=None):
    names = list(rows_by_preset)
    if keys is None:  # the files' own order, which groups keys by unit as the preset files do
        keys = list(dict.fromkeys(k for r in rows_by_preset.values() for k in r))
    lines = []
    if note:
        lines += [note, ""]
    lines.append("| key | " + " | ".join(f"`{n}`" for n in names) + " |")
    lines.append("|---|" + "---|" * len(names))
    for k in keys:
        vals = [human(k, rows_by_preset[n][k]) if k in rows_by_preset[n] else "-" for n in names]
        lines.append(f"| `{k}` | " + " | ".join(cell(v) for v in vals) + " |")
    return "\n".join(lines)


def generate(configs):
    chips = {n: leaves(p) for n, p in presets(configs, "chips")}
    boards = {n: leaves(p) for n, p in presets(configs, "boards")}
    hbm = {n: leaves(p) for n, p in presets(configs, "hbm")}
    out = {"chips": table(chips)}
    # A board is its chip plus what it overrides: show the chip it builds on and
    # every key whose value differs from that chip's.
    chip_of = {}
    for n in boards:
        with open(os.path.join(configs, "boards", n + ".yaml")) as f:
            inc = load_yaml(f.name).get("include", "")
        chip_of[n] = os.path.splitext(os.path.basename(inc))[0] if inc else ""
    differing = sorted({k for n, r in boards.items() for k, v in r.items()
                        if chip_of[n] not in chips or chips[chip_of[n]].get(k) != v})
    def board_order(n):  # by chip generation, then size
        chip = chip_of[n]
        size = int(boards[n].get("system.chips", "0")) if boards[n].get("system.chips", "0").isdigit() else 0
        return (CHIP_ORDER.index(chip) if chip in CHIP_ORDER else len(CHIP_ORDER), chip, size, n)

    rows = {n: dict(boards[n], include=f"chips/{chip_of[n]}.yaml" if chip_of[n] else "-")
            for n in sorted(boards, key=board_order)}
    out["boards"] = table(rows, ["include"] + differing,
                          note="Every other key of a board is its chip's value (table above).")
    out["hbm"] = table(hbm)
    return out


MARK = re.compile(r"(<!-- BEGIN config_table: (\w+) -->\n)(.*?)(<!-- END config_table: \2 -->)", re.S)


def splice(doc_text, tables):
    found = set()

    def repl(m):
        found.add(m.group(2))
        if m.group(2) not in tables:
            fail(f"unknown generated section '{m.group(2)}' (known: {', '.join(SECTIONS)})")
        return m.group(1) + tables[m.group(2)] + "\n" + m.group(4)

    new = MARK.sub(repl, doc_text)
    missing = set(SECTIONS) - found
    return new, missing


def main(argv):
    ap = argparse.ArgumentParser(prog="config_table.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=os.path.join(ROOT, "configs"), help="the presets folder (default: configs/)")
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "config.md"))
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="rewrite the generated tables in --doc")
    g.add_argument("--check", action="store_true", help="exit 1 if --doc's generated tables are stale")
    g.add_argument("--keys", metavar="PRESET", help="print KEY = VALUE for every leaf of one preset (name or path)")
    args = ap.parse_args(argv)

    if args.keys:
        path = args.keys
        if not os.path.isfile(path):
            for section in SECTIONS:
                cand = os.path.join(args.configs, section, args.keys + ".yaml")
                if os.path.isfile(cand):
                    path = cand
                    break
            else:
                fail(f"unknown preset '{args.keys}'")
        for k, v in sorted(leaves(load_preset(path)).items()):
            print(f"{k} = {v}")
        return 0

    tables = generate(args.configs)
    if not args.write and not args.check:
        for s in SECTIONS:
            print(f"<!-- {s} -->\n{tables[s]}\n")
        return 0
    try:
        with open(args.doc) as f:
            text = f.read()
    except OSError as e:
        fail(f"{args.doc}: cannot read: {e.strerror}")
    new, missing = splice(text, tables)
    if missing:
        fail(f"{args.doc}: no markers for section(s) {', '.join(sorted(missing))}")
    if args.check:
        if new != text:
            print(f"config_table.py: {args.doc} is stale; run scripts/config_table.py --write", file=sys.stderr)
            return 1
        return 0
    if new != text:
        with open(args.doc, "w") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
