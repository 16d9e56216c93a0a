#!/usr/bin/python3
"""How long the blocked hierarchical all-reduce (docs/codegen.md "Blocks") takes on
the links alone when F blocks may be in flight, against the sliced bound of
tests/compiler/dp/allreduce_bw.py (docs/validation.md "Session 42").

The model follows one core's torus groups on one chip (every chip and core is
alike): D groups, group j doing the on-chip reduce-scatter of its share, (k - 1)
reduce-scatter steps over each chip-torus dimension in the order j, j + 1, ..,
the all-gathers in reverse, then the on-chip all-gather. A step goes as pieces of
at most PIECE bytes, one after another on its resource (the + link of its
dimension, or the on-chip path), which the pieces on it at a time share equally;
each piece then takes the step's latency (alpha). Piece p of a step leaves once
the step before has delivered the same share of its bytes ((p + 1) / pieces), as
the lowering orders a move's pieces by their next use. With --inner-split N (the
lowering's default on a 3-D chip torus: 4) a step of at most half the widest
chip-to-chip chunk goes as up to N pieces of at least 16 KiB, as plan_stream's
inner_cap cuts it. Block b + 1 starts once
every group of block b has done its first GATE steps (the lowering's block-start
gate: the on-chip step and the first dimension's), block b + F once block b is
over (F slot pools). No HBM, DMA engines, VMEM slots or program order: what the
pipeline of blocks costs on the links. With one block and whole steps (--piece 0)
it is the hierarchical closed form exactly (tests/scripts/test_blocks_model.py).

usage: blocks_model.py [--dims 4,4] [--clock 700e6] [--link-bytes-per-s 62e9]
                       [--size 64M] [--block 8M] [--piece 128K] [--inner-split 1]
                       [--in-flight 2] [--gate 0]"""
import argparse
import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("allreduce_bw", os.path.join(HERE, "..", "tests", "compiler", "dp",
                                                                          "allreduce_bw.py"))
bw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bw)


INNER_PIECE_MIN = 16 << 10  # kMinInnerPieceElems of compiler/lower/collective.cpp, in bytes


def chain(dims, j, block):
    """Group j's steps: (resource, alpha, bytes, bytes/cycle of the resource), at the
    rates of allreduce_bw (its ICI_B: the link rate the bound is priced at too)."""
    D, G = len(dims), 2 * len(dims)
    onchip = ("onchip", bw.ONCHIP_ALPHA, block / 2 / D, bw.ONCHIP_B)  # the core's half, a share a group
    rs, prod = [], 1
    for h in range(D):
        d = (j + h) % D
        prod *= dims[d]
        rs += [("link%d" % d, bw.ICI_ALPHA, block / (G * prod), bw.ICI_B)] * (dims[d] - 1)
    return [onchip] + rs + rs[::-1] + [onchip]


def simulate(dims, n, block, in_flight, gate, piece, inner_split=1):
    """The op's cycles: blocks of `block` bytes, at most `in_flight` at once. A step
    goes as pieces of at most `piece` bytes, one after another on its resource, each
    then taking the latency; piece p can leave once the step before has delivered
    the same share of its bytes ((p + 1) / pieces); inner steps as up to
    `inner_split` pieces."""
    nb = max(1, -(-n // block))
    D = len(dims)
    WAIT, READY, SEND, FLY, DONE = range(5)
    chains = {}  # (block, group) -> {"steps", "pieces": per step [[state, left, transfer cycles]]}
    start, end = [None] * nb, [None] * nb
    t, nxt = 0.0, 0

    def steps_done(c):
        k = 0
        while k < len(c["steps"]) and all(pc[0] == DONE for pc in c["pieces"][k]):
            k += 1
        return k

    def may_start(b):
        if b == 0:
            return True
        if start[b - 1] is None or any(steps_done(chains[(b - 1, j)]) < gate for j in range(D)):
            return False
        return b < in_flight or end[b - in_flight] is not None

    def release(c):
        for s, pcs in enumerate(c["pieces"]):
            for p, pc in enumerate(pcs):
                if pc[0] == WAIT:
                    if s > 0:
                        prev = c["pieces"][s - 1]
                        if any(q[0] != DONE for q in prev[:-(-(p + 1) * len(prev) // len(pcs))]):
                            break
                    pc[0] = READY
                if pc[0] == READY:
                    if p > 0 and pcs[p - 1][0] < FLY:
                        break
                    pc[0], pc[1] = SEND, pc[2]

    while True:
        while nxt < nb and may_start(nxt):
            start[nxt] = t
            for j in range(D):
                steps = chain(dims, j, min(block, n - nxt * block))  # the last block: what is left
                widest = max(size for res, _, size, _ in steps if res != "onchip")
                pieces = []
                for res, _, size, bps in steps:
                    cap = piece
                    if inner_split > 1 and res != "onchip" and 2 * size <= widest:
                        k = min(max(int(size // min(INNER_PIECE_MIN, piece / 4)), 1), inner_split)
                        cap = min(piece, -(-size // k))
                    k = max(1, -(-int(size) // int(cap)))
                    pieces.append([[WAIT, 0.0, size / k / bps] for _ in range(k)])
                c = {"steps": steps, "pieces": pieces}
                release(c)
                chains[(nxt, j)] = c
            nxt += 1
        live = [(c, s, pc) for c in chains.values() for s, pcs in enumerate(c["pieces"]) for pc in pcs
                if pc[0] in (SEND, FLY)]
        if not live:
            return t
        users = {}
        for c, s, pc in live:
            if pc[0] == SEND:
                users[c["steps"][s][0]] = users.get(c["steps"][s][0], 0) + 1
        rate = [1.0 if pc[0] == FLY else 1.0 / users[c["steps"][s][0]] for c, s, pc in live]
        dt = min(pc[1] / r for (c, s, pc), r in zip(live, rate))
        t += dt
        touched = {}
        for (c, s, pc), r in zip(live, rate):
            pc[1] -= dt * r
            if pc[1] > 1e-6:
                continue
            if pc[0] == SEND:
                pc[0], pc[1] = FLY, c["steps"][s][1]
            else:
                pc[0] = DONE
            touched[id(c)] = c
        for c in touched.values():
            release(c)
        for b in range(nb):
            if start[b] is not None and end[b] is None and all(
                    steps_done(chains[(b, j)]) == len(chains[(b, j)]["steps"]) for j in range(D)):
                end[b] = t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", default="4,4", help="the chip torus (v2-4x4: 4,4; v4-4x4x4: 4,4,4)")
    ap.add_argument("--clock", type=float, default=700e6)
    ap.add_argument("--link-bytes-per-s", type=float, default=62e9)
    ap.add_argument("--size", default="64M", help="bytes per replica")
    ap.add_argument("--block", default="8M", help="bytes per replica in a block (ReplicaSpec::block_elems x 4)")
    ap.add_argument("--in-flight", type=int, default=2, help="blocks in flight (the slot pools)")
    ap.add_argument("--piece", default="128K", help="bytes a message (0: a step's chunk whole; the lowering's "
                                                    "blocked plans: 128 KiB on v2-4x4, 88 KB on v4-4x4x4)")
    ap.add_argument("--inner-split", type=int, default=1, help="pieces an inner step goes as, at most (the "
                                                                 "lowering's: 4 on v4-4x4x4, else 1)")
    ap.add_argument("--gate", type=int, default=0, help="steps of block b before block b + 1 starts (0: the "
                                                        "lowering's, 1 + the smallest torus dimension - 1)")
    a = ap.parse_args()
    dims = [int(x) for x in a.dims.split(",")]
    bw.ICI_B = a.link_bytes_per_s * 0.8681 / a.clock  # the model's and the bound's link rate
    n, block = bw.parse_size(a.size), bw.parse_size(a.block)
    bw.BLOCK_BYTES = block
    if bw.two_blocks(dims, n, block):
        block = -(-n // 2)
    gate = a.gate if a.gate > 0 else min(dims)  # the on-chip step and k - 1 steps
    cycles = simulate(dims, n, block, a.in_flight, gate, bw.parse_size(a.piece) or n, a.inner_split)
    bound = bw.closed_form_hierarchical_sliced(dims, n)
    print("dims %s, %s a replica in %d blocks of %d KiB, %d in flight, gate %d: %.0f cycles, sliced bound %.0f, %.3f"
          % (a.dims, a.size, max(1, -(-n // block)), min(block, n) >> 10, a.in_flight, gate, cycles, bound,
             cycles / bound))


if __name__ == "__main__":
    main()
