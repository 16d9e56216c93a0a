#!/usr/bin/python3
"""Achieved bandwidth of the lowered all_reduce (compiler/lower/collective.cpp) on a
board preset, against the alpha-beta closed form of docs/ici.md extended to the
replica topology (docs/codegen.md "Collectives"). Per size: a graph whose replicas
each pad a 1-element input to N fp32 values, all_reduce them and slice 8 back, is
compiled with --replicas and run on the SystemC model (fast mode); the all_reduce's
time is taken from the timeline as (last replica's end of the op) - (last replica's
start of it), so the input scatter's skew between replicas is not counted; above
16 MiB (timelines of gigabytes) from stats.json's per-op span, which includes that
skew (a few thousand cycles).

usage: allreduce_bw.py TPUSIM [--preset v3-8] [--replicas 8] [--collective auto]
                       [--sizes 1K,4K,...] [--work DIR]"""
import argparse, json, os, subprocess, sys

# The neighbour-message fit of docs/ici.md; clock and link rate per chip (--clock,
# --link-bytes-per-s; defaults v3, configs/chips/v3.yaml).
CLOCK = 940e6
ICI_ALPHA = 1941.0                             # cycles, one neighbour message
ICI_B = 82.0e9 * 0.8681 / CLOCK                # payload bytes/cycle of one link direction
ONCHIP_ALPHA = 414.0                           # core to core on one chip
ONCHIP_B = 512.0


def parse_size(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * m[s[-1]] if s[-1] in m else int(s)


def closed_form(alg, dims, n, cores, one_link=False):
    """Cycles of an all-reduce of n bytes per replica on replica dims [cores, chip
    dims...]: dim 0 on chip, the others over ICI links that the chip's `cores`
    replicas share (each link carries every core's message of a step). one_link: a
    size-2 ICI dimension's + and - messages share one of its two parallel links (the
    DMA engines route every message with the default tie direction)."""
    ab = []
    for i, k in enumerate(dims):
        if i == 0 and cores > 1:
            ab.append((ONCHIP_ALPHA, 1.0 / ONCHIP_B))
        else:
            share = 2 if one_link and k == 2 else 1
            ab.append((ICI_ALPHA, cores * share / ICI_B))
    p = 1
    for k in dims:
        p *= k
    # Rings (approximate): the ring order walks dimension 0 fastest, so a share
    # (cores-1)/cores of its hops are on chip; the latency term takes the mean hop,
    # the bandwidth term one ICI link per direction (a ring step puts one message on
    # each link), both ring directions on one link when one_link (size-2 dims).
    if alg in ("ring", "bidir-ring"):
        alpha = ((cores - 1) * ONCHIP_ALPHA + ICI_ALPHA) / cores
        beta = (2 if one_link and alg == "bidir-ring" else 1) / ICI_B
        return 2 * (p - 1) * (alpha + beta * n / (p * (2 if alg == "bidir-ring" else 1)))
    D = len(dims)
    G = 2 * D
    best = 0.0
    for j in range(D):
        t, prod = 0.0, 1
        for h in range(D):
            d = (j + h) % D
            prod *= dims[d]
            t += (dims[d] - 1) * (ab[d][0] + ab[d][1] * n / (G * prod))
        best = max(best, 2 * t)
    return best


def closed_form_links(dims, n, cores):
    """The torus algorithm's alpha-beta closed form with the links shared: alpha
    times the steps of a group's chain plus beta times the bytes of the busiest link.
    closed_form() charges each group only its own messages; on a replica topology
    whose on-chip dimension is much faster than the ICI ones the groups' ICI phases
    overlap on the same links (on v3-8 [2, 2, 2] an ICI link carries 7/6 of what the
    slowest group alone sends over it), so that form is below this bound. Per ICI
    link direction: the + groups' ring messages of that dimension, of both cores of
    the chip (on a size-2 dimension each core's + and - messages take one of the two
    parallel links, hw/dma's tie by core parity: the same total); reduce-scatter
    and all-gather each once. For equal dimensions it equals closed_form()."""
    ab = []
    for i, k in enumerate(dims):
        if i == 0 and cores > 1:
            ab.append((ONCHIP_ALPHA, 1.0 / ONCHIP_B, 1))
        else:
            ab.append((ICI_ALPHA, 1.0 / ICI_B, cores))
    D = len(dims)
    G = 2 * D
    alpha = 0.0
    load = [0.0] * D  # bytes per link direction of each dimension, reduce-scatter
    for j in range(D):
        a, prod = 0.0, 1
        for h in range(D):
            d = (j + h) % D
            prod *= dims[d]
            a += (dims[d] - 1) * ab[d][0]
            load[d] += (dims[d] - 1) * n / (G * prod) * ab[d][2]
        alpha = max(alpha, 2 * a)
    return alpha + max(2 * load[d] * ab[d][1] for d in range(D))


def closed_form_hierarchical(chip_dims, n):
    """The hierarchical algorithm (hw/ici/collectives.h; docs/ici.md): the torus
    algorithm's closed form on the chip topology (G = 2D groups, every ICI link
    carries one core's messages) plus the on-chip reduce-scatter and all-gather
    of half the buffer each."""
    return torus_groups(chip_dims, n, ICI_ALPHA) + 2 * (ONCHIP_ALPHA + n / 2 / ONCHIP_B)


def torus_groups(chip_dims, n, alpha):
    """The slowest of the torus algorithm's G = 2D groups on the chip topology,
    reduce-scatter and all-gather: 2 sum_h (k_h - 1)(alpha + beta n / (G k_1..k_h))."""
    D = len(chip_dims)
    G = 2 * D
    best = 0.0
    for j in range(D):
        t, prod = 0.0, 1
        for h in range(D):
            k = chip_dims[(j + h) % D]
            prod *= k
            t += (k - 1) * (alpha + n / (G * prod) / ICI_B)
        best = max(best, 2 * t)
    return best


# The streamed lowering's slices (compiler/lower/collective.cpp, LowerOptions):
# pieces of 256 KiB, slices of 4 MiB per replica, slice j + 1 two steps behind j.
PIECE_BYTES = 256 << 10
SLICE_BYTES = 4 << 20


# compiler/ref/replicas.h, ReplicaSpec::block_elems (fp32 elements per replica)
BLOCK_BYTES = (2 << 20) * 4


def two_blocks(chip_dims, n, block):
    """Whether all_reduce_blocks runs n bytes a replica as two blocks of half of it
    though it fits one block: on a 3-D chip torus, more than half a block."""
    return sum(k > 1 for k in chip_dims) >= 3 and block < 2 * n <= 2 * block


def slices_hierarchical(chip_dims, n):
    """S of the lowering: on 16 chips or more, the contiguous blocks of
    all_reduce_blocks (ceil(n / 8 MiB) above 8 MiB, and 2 above 4 MiB where the
    chips form a 3-D torus); else one up to 4 MiB, and above it the fewest slices
    whose parts of a segment between two chunk boundaries (n / (2 D P): 2 cores,
    D groups each, P chips) are at most 3/4 of a piece, but no more than 3/4 of
    4 MiB makes (slice_schedule's one-pool rule, session 89)."""
    D, P = len(chip_dims), 1
    for k in chip_dims:
        P *= k
    if P >= 16:
        return 2 if two_blocks(chip_dims, n, BLOCK_BYTES) else max(1, -(-n // BLOCK_BYTES))
    if n <= SLICE_BYTES:
        return 1
    seg = n // (2 * D * P)
    return min(-(-4 * n // (3 * SLICE_BYTES)), -(-4 * seg // (3 * PIECE_BYTES)))


def closed_form_hierarchical_sliced(chip_dims, n):
    """The hierarchical algorithm run on S slices as a pipeline: one slice's closed
    form, then one slice per the busiest resource's time for a slice (an ICI link
    direction: the beta terms of the torus form; or the on-chip path: both on-chip
    steps), the alpha-beta bound of the sliced schedule. Equals
    closed_form_hierarchical for S = 1. The piece bound below with pieces of a whole
    half slice."""
    return closed_form_hierarchical_pieces(chip_dims, n, piece=float("inf"))


def closed_form_hierarchical_pieces(chip_dims, n, piece=PIECE_BYTES):
    """The sliced bound with the lowering's pieces in it, the pipelined form of the
    algorithm as lowered: every move goes in pieces of at most PIECE_BYTES, so the
    torus steps start once the first on-chip reduce-scatter piece has landed and
    the last on-chip all-gather piece follows the last torus step; the other
    on-chip pieces run under the torus steps. The pipeline's fill and drain on
    chip are therefore one piece each, 2 (alpha + min(piece, m / 2) beta) for a
    slice of m bytes, where the sliced bound has the first slice's half buffer
    (m / 2) in each. Equals the sliced bound up to 512 KiB a slice."""
    S = slices_hierarchical(chip_dims, n)
    m = n / S
    link = torus_groups(chip_dims, m, 0.0)
    onchip = 2 * m / 2 / ONCHIP_B
    fill_drain = 2 * (ONCHIP_ALPHA + min(piece, m / 2) / ONCHIP_B)
    return torus_groups(chip_dims, m, ICI_ALPHA) + fill_drain + (S - 1) * max(link, onchip)


def timeline_span(path):
    """(us, cycles) from the last replica's start of op 1 to the last one's end."""
    ev = json.load(open(path))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    names = {}
    for e in ev:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    start, end = {}, {}
    for e in ev:
        if e.get("ph") == "X" and e.get("name", "").split(":")[0] == "op 1" and names.get((e["pid"], e["tid"]), "").endswith("sequencer"):
            k = (e["pid"], e["tid"])
            start[k] = min(start.get(k, 1e30), e["ts"])
            end[k] = max(end.get(k, 0), e["ts"] + e["dur"])
    us = max(end.values()) - max(start.values())
    return us, us * 1e-6 * CLOCK


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tpusim")
    ap.add_argument("--preset", default="v3-8")
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--cores-per-chip", type=int, default=2)
    ap.add_argument("--dims", default="2,2", help="the board's chip dims (v3-8: 2,2)")
    ap.add_argument("--collective", default="auto")
    ap.add_argument("--block-lag", default="0", help="tpusim compile --block-lag (0: the default lag)")
    ap.add_argument("--all-reduce-streams", default="0",
                    help="tpusim compile --all-reduce-streams (0 = the compiler's choice, 1 or 2)")
    ap.add_argument("--urgent", default="auto",
                    help="tpusim compile --urgent: auto, on or off (inner steps, credits and tokens as urgent ICI traffic)")
    ap.add_argument("--stream-from", default="0", help="tpusim compile --stream-from (0: the default)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="tpusim run --set (a preset override, e.g. core.dma.remote_queue=own); repeatable")
    ap.add_argument("--sizes", default="1K,4K,16K,64K,256K,1M,4M,16M,64M")
    ap.add_argument("--work", default="/tmp/allreduce_bw")
    ap.add_argument("--clock", type=float, default=940e6)
    ap.add_argument("--link-bytes-per-s", type=float, default=82.0e9)
    ap.add_argument("--json", help="also append the rows to this JSON file (a list)")
    ap.add_argument("--pad-value", default="1.0",
                    help="what pads the input to N values; 0.0 leaves the simulator's memory pages "
                         "unallocated (zeros are not stored), so 128 replicas x 256 MiB fit; the "
                         "timing does not depend on the values")
    ap.add_argument("--timeline-max", default="16M",
                    help="largest size timed from the timeline; larger ones from stats.json's op span "
                         "(a 128-replica timeline of 16 MiB holds no op slices)")
    a = ap.parse_args()
    global CLOCK, ICI_B
    CLOCK = a.clock
    ICI_B = a.link_bytes_per_s * 0.8681 / CLOCK
    os.makedirs(a.work, exist_ok=True)
    R = a.replicas
    cores = min(R, a.cores_per_chip)
    chips = R // cores
    dims = [cores] if cores > 1 else []
    prod = 1
    for d in [int(x) for x in a.dims.split(",")]:
        if prod < chips:
            prod *= d
            if d > 1:
                dims.append(d)
    print("| preset | replicas | algorithm | bytes/replica | cycles | us | algbw GB/s | closed form (links shared) "
          "| sim/closed | closed form (per group) | sim/closed | sliced bound | sim/sliced | piece bound | sim/pieces |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = json.load(open(a.json)) if a.json and os.path.exists(a.json) else []
    for s in a.sizes.split(","):
        n = parse_size(s)
        E = n // 4
        g = os.path.join(a.work, f"ar_{s}.graph")
        with open(g, "w") as f:
            f.write(f"graph ar {{\n  input %x : f32[{R},1]\n"
                    f"  %a = pad(%x) {{pads=[0,0,0,{E - 1}], value={a.pad_value}}} : f32[{R},{E}] #0\n"
                    f"  %g = all_reduce(%a) : f32[{R},{E}] #1\n"
                    f"  %o = slice(%g) {{starts=[0,0], ends=[1,8], axes=[0,1], steps=[1,1]}} : f32[1,8] #2\n"
                    "  output %o\n}\n")
        tpb, out = g + ".tpb", os.path.join(a.work, f"out_{s}")
        subprocess.run([a.tpusim, "compile", g, "--preset", a.preset, "--replicas", str(R), "--collective",
                        a.collective, "--block-lag", a.block_lag,
                        "--all-reduce-streams", a.all_reduce_streams, "--urgent", a.urgent,
                        "--stream-from", a.stream_from, "-o", tpb], check=True, stdout=subprocess.DEVNULL)
        big = n > parse_size(a.timeline_max)
        subprocess.run([a.tpusim, "run", tpb, "--preset", a.preset, "--random-inputs", "1", "--out", out] +
                       [arg for kv in a.set for arg in ("--set", kv)] +
                       ([] if big else ["--timeline", os.path.join(out, "t.json")]), check=True,
                       stdout=subprocess.DEVNULL)
        stats = json.load(open(os.path.join(out, "stats.json")))
        if big:
            cyc = next(o["cycles"] for o in stats["ops"] if o["id"] == 1)
            us = cyc / CLOCK * 1e6
        else:
            us, cyc = timeline_span(os.path.join(out, "t.json"))
        alg = a.collective
        if alg == "auto":
            # choose_algorithm (compiler/ref/replicas.cpp)
            D = len(dims)
            alg = ("hierarchical" if cores == 2 and chips > 1 and E >= 2 else
                   "torus" if D >= 2 and E >= 2 * D * R else "bidir-ring" if E >= 2 * R else "ring")
        if alg == "hierarchical":
            cf = cl = closed_form_hierarchical(dims[1:], n)
            cs = closed_form_hierarchical_sliced(dims[1:], n)
            cp = closed_form_hierarchical_pieces(dims[1:], n)
        else:
            cf = closed_form(alg, dims, n, cores)
            cl = closed_form_links(dims, n, cores) if alg == "torus" else cf
            # The torus algorithm's groups share links (on v5e-8's 2x4 the size-4
            # dimension's carry 9/16 of the buffer each way, the size-2 one's 5/16),
            # so its links-shared form is the bound; the per-group form is below it.
            cs = cp = cl
        print(f"| {a.preset} | {R} | {alg} | {s}iB | {cyc:.0f} | {us:.1f} | {n / (us * 1e-6) / 1e9:.2f} | {cl:.0f} | "
              f"{cyc / cl:.3f} | {cf:.0f} | {cyc / cf:.3f} | {cs:.0f} | {cyc / cs:.3f} | {cp:.0f} | {cyc / cp:.3f} |", flush=True)
        if a.json:
            rows.append({"preset": a.preset, "replicas": R, "algorithm": alg, "bytes": n, "cycles": round(cyc),
                         "us": us, "algbw_gbps": n / (us * 1e-6) / 1e9, "closed_links": cl, "closed_group": cf, "closed_sliced": cs, "closed_pieces": cp,
                         "clock": CLOCK, "span_from": "stats.json" if big else "timeline"})
            json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
