#!/usr/bin/python3
"""scripts/blocks_model.py against closed forms it must reproduce: one block with
whole steps is the hierarchical closed form of allreduce_bw.py (every group on its
own link, the on-chip steps shared by the core's groups); blocks that never
overlap (gate = every step, one in flight) take the sum of their closed forms;
and no run beats the links, inner steps split or not: a link carries every
block's beta terms."""
import argparse
import importlib.util
import sys


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", required=True)
    a = ap.parse_args()
    m = load("blocks_model", a.script)
    bw = m.bw
    fails = 0

    def report(ok, what):
        nonlocal fails
        print("%s %s" % ("ok  " if ok else "FAIL", what))
        fails += not ok

    def check(what, got, want, rel=1e-9):
        report(abs(got - want) <= rel * want, "%s: %.1f, expected %.1f" % (what, got, want))

    boards = {"v2-4x4": ([4, 4], 62e9, 700e6), "v3-8": ([2, 2], 82e9, 940e6), "v4-4x4x4": ([4, 4, 4], 50e9, 1.05e9)}
    for name, (dims, link, clock) in boards.items():
        bw.ICI_B = link * 0.8681 / clock  # the model's link rate and the closed forms'
        T = 2 + 2 * sum(k - 1 for k in dims)
        for n in (1 << 20, 8 << 20):
            check("%s %d B, one block, whole steps" % (name, n), m.simulate(dims, n, n, 2, min(dims), n),
                  bw.closed_form_hierarchical(dims, n))
        n, block = 24 << 20, 8 << 20
        check("%s 3 blocks in sequence" % name, m.simulate(dims, n, block, 1, T, n),
              3 * bw.closed_form_hierarchical(dims, block))
        beta = bw.torus_groups(dims, block, 0.0)  # a block's time on its busiest link
        for F, piece, inner in ((2, 128 << 10, 1), (4, 64 << 10, 4)):
            got = m.simulate(dims, 4 * block, block, F, 1, piece, inner)
            report(got >= 4 * beta, "%s 4 blocks, %d in flight, inner steps in up to %d pieces: %.0f >= %.0f, the "
                   "links' time" % (name, F, inner, got, 4 * beta))
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
