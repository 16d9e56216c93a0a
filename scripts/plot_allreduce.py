#!/usr/bin/python3
"""All-reduce bandwidth against its alpha-beta closed form, one panel per board
(docs/validation.md "Compiled all-reduce against its closed form").

Inputs: the chip-model rows of tests/compiler/dp/allreduce_bw.py --json (the
compiled all_reduce, one buffer per replica = TensorCore, the hierarchical
algorithm that auto picks on these boards) and the markdown table that
build/bench/ici_allreduce prints (the torus schedule on the network alone, one
buffer per chip; the hierarchical schedule there, one buffer per core, if the
table has it). Each is drawn as points over its own closed-form curve.

usage: plot_allreduce.py --chip rows.json [--chip more.json] --network ici_allreduce.txt -o out.png"""
import argparse
import importlib.util
import json
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("allreduce_bw", os.path.join(HERE, "..", "tests", "compiler", "dp",
                                                                          "allreduce_bw.py"))
bw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bw)

BOARDS = {  # preset: (clock, link bytes/s, cores per chip, chip dims)
    "v3-8": (940e6, 82e9, 2, [2, 2]),
    "v2-4x4": (700e6, 62e9, 2, [4, 4]),
    "v4-4x4x4": (1050e6, 50e9, 2, [4, 4, 4]),
}
UNIT = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_network(path):
    """Rows of ici_allreduce's table: (preset, algorithm, bytes, cycles, closed)."""
    rows = []
    for line in open(path):
        f = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(f) < 9 or not re.match(r"^\d+( KiB| MiB| GiB)?$", f[2]):
            continue
        num, _, unit = f[2].partition(" ")
        rows.append((f[0], f[1], int(num) * UNIT.get(unit, 1), float(f[3]), float(f[6])))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chip", action="append", default=[])
    ap.add_argument("--network")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    chip = []
    for p in a.chip:
        chip += json.load(open(p))
    net = parse_network(a.network) if a.network else []
    fig, axes = plt.subplots(1, 3, figsize=(16, 5), sharey=True)
    for ax, (preset, (clock, link, cores, cdims)) in zip(axes, BOARDS.items()):
        gb = lambda n, cyc, c=clock: n / (cyc / c) / 1e9  # noqa: E731
        pts = [r for r in net if r[0] == preset and r[1] == "torus"]
        if pts:
            xs = [r[2] for r in pts]
            ax.plot(xs, [gb(r[2], r[4]) for r in pts], "-", color="tab:blue",
                    label=f"closed form, torus {'x'.join(map(str, cdims))}, buffer per chip")
            ax.plot(xs, [gb(r[2], r[3]) for r in pts], "o", color="tab:blue", mfc="none",
                    label="network-level run (hw/ici, no cores)")
        rows = sorted([r for r in chip if r["preset"] == preset], key=lambda r: r["bytes"])
        if rows:
            bw.CLOCK, bw.ICI_B = clock, link * 0.8681 / clock
            xs = [1 << k for k in range(10, 29)]
            ax.plot(xs, [gb(n, bw.closed_form_hierarchical(cdims, n)) for n in xs], "-", color="tab:red",
                    label=f"closed form, hierarchical: 2 cores x torus {'x'.join(map(str, cdims))}")
            ax.plot(xs, [gb(n, bw.closed_form_hierarchical_pieces(cdims, n)) for n in xs], "--", color="tab:red",
                    label="its bound on the lowering's slices and pieces (pipelined)")
            ax.plot(xs, [gb(n, bw.closed_form_hierarchical_sliced(cdims, n)) for n in xs], ":", color="tab:red",
                    lw=1, label="the same with the on-chip steps of a slice whole")
            ax.plot([r["bytes"] for r in rows], [r["algbw_gbps"] for r in rows], "s", color="tab:red",
                    label=f"compiled all_reduce, {rows[0]['replicas']} replicas, chip model (fast)")
        hier = [r for r in net if r[0] == preset and r[1] == "hierarchical"]
        if hier:
            ax.plot([r[2] for r in hier], [gb(r[2], r[3]) for r in hier], "o", color="tab:red", mfc="none",
                    label="hierarchical schedule on the network alone (hw/ici, no core program)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(preset)
        ax.set_xlabel("bytes per replica / per chip")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("algorithm bandwidth, GB/s (bytes / time)")
    fig.suptitle("All-reduce: achieved bandwidth vs the alpha-beta closed form")
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)


if __name__ == "__main__":
    main()
