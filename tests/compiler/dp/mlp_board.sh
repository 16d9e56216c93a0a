#!/bin/sh
# The bundled MLP (traces/models/make_mlp.py) at batch 64 compiled for 8 replicas
# of a v3-8 board: the bundle on the functional reference (race checker on) and on
# the SystemC model must both equal the graph reference of the whole-batch graph,
# bit for bit; then all_reduce bundles on both, and the direct collectives (values,
# the entry tokens' time, and all_gather's bytes on the links). Usage: mlp_board.sh TPUSIM WORKDIR
set -eu
T=$1
W=$2
HERE=$(dirname "$0")
rm -rf "$W" && mkdir -p "$W"
/usr/bin/python3 "$HERE/../../../traces/models/make_mlp.py" "$W/mlp.graph" --batch 64
"$T" compile "$W/mlp.graph" --preset v3-8 --replicas 8 -o "$W/mlp.tpb"
"$T" ref "$W/mlp.graph" --random-inputs 3 --out "$W/graph"
"$T" ref "$W/mlp.tpb" --random-inputs 3 --check-races --out "$W/ref"
"$T" run "$W/mlp.tpb" --preset v3-8 --random-inputs 3 --out "$W/run" > "$W/report.txt"
"$T" diff "$W/graph" "$W/ref"
"$T" diff "$W/graph" "$W/run"
# An all_reduce graph: per-replica column sums of a [batch, rows, cols] input,
# summed over the replicas. Usage: ar_graph FILE BATCH ROWS COLS
ar_graph() {
  printf 'graph ar {\n  input %%x : f32[%s,%s,%s]\n' "$2" "$3" "$4" > "$1"
  printf '  %%s = reduce_sum(%%x) {axes=[0], keepdims=0} : f32[%s,%s] #0\n' "$3" "$4" >> "$1"
  printf '  %%g = all_reduce(%%s) : f32[%s,%s] #1\n  output %%g\n}\n' "$3" "$4" >> "$1"
}
# A bundle on the SystemC model against the same bundle on the functional
# reference (races checked): landings that complete out of order must not change
# a bit. Usage: run_equals_ref NAME PRESET SEED (the bundle is $W/NAME.tpb)
run_equals_ref() {
  "$T" ref "$W/$1.tpb" --random-inputs "$3" --check-races --out "$W/$1_ref"
  "$T" run "$W/$1.tpb" --preset "$2" --random-inputs "$3" --out "$W/$1_run" > "$W/$1_report.txt"
  "$T" diff "$W/$1_ref" "$W/$1_run"
}
# Over the 8 replicas of a v3-8 (torus algorithm).
ar_graph "$W/ar.graph" 64 37 29
"$T" compile "$W/ar.graph" --preset v3-8 --replicas 8 -o "$W/ar.tpb"
run_equals_ref ar v3-8 5
# `tpusim compile --block-bytes`: a 16 x 1031 all_reduce on the 16 chips of a
# v2-4x4 in blocks of 8192 fp32 elements (3 blocks, docs/codegen.md "Blocks")
# instead of one: another bundle, and the model still equals the reference of it.
ar_graph "$W/ar32.graph" 32 16 1031
"$T" compile "$W/ar32.graph" --preset v2-4x4 --replicas 32 -o "$W/ar32_one.tpb"
"$T" compile "$W/ar32.graph" --preset v2-4x4 --replicas 32 --block-bytes 32768 -o "$W/ar32.tpb"
if cmp -s "$W/ar32_one.tpb" "$W/ar32.tpb"; then
  echo "--block-bytes 32768 did not change the bundle" >&2
  exit 1
fi
run_equals_ref ar32 v2-4x4 7
# The same blocks on two instruction streams, whose consumes go in arrival order
# (docs/codegen.md "Arrival order"): on the model landings come out of order, so
# some dispatches go on their candidate's landing (the sequencer's
# wait_any_second), and the output must still equal the reference's.
"$T" compile "$W/ar32.graph" --preset v2-4x4 --replicas 32 --block-bytes 32768 --all-reduce-streams 2 \
  --arrival-order on -o "$W/ar32s.tpb"
run_equals_ref ar32s v2-4x4 7
/usr/bin/python3 - "$W/ar32s_run/stats.json" <<'PY'
import json, sys
n = 0
def walk(o):
    global n
    if isinstance(o, dict):
        for k, v in o.items():
            if k == "wait_any_second":
                n += v
            else:
                walk(v)
    elif isinstance(o, list):
        for v in o:
            walk(v)
walk(json.load(open(sys.argv[1])))
print(f"wait.any that went on the later landing: {n}")
if n == 0:
    sys.exit("no dispatch saw a later landing first")
PY
# The direct collectives over the 8 replicas of a v3-8 (docs/codegen.md
# "Collectives"): values equal to the reference, and each op at least two ICI
# crossings long: every replica's entry token to the others, then the blocks.
# The published neighbour VMEM-to-VMEM latency is 1941 cycles
# (configs/chips/v3.yaml); with a free barrier in place of the tokens this
# all_gather took 3,647 cycles.
printf 'graph dc {\n  input %%x : f32[64,128]\n' > "$W/dc.graph"
printf '  %%rs = reduce_scatter(%%x) : f32[64,128] #0\n' >> "$W/dc.graph"
printf '  %%ag = all_gather(%%rs) : f32[64,128] #1\n  output %%ag\n}\n' >> "$W/dc.graph"
"$T" compile "$W/dc.graph" --preset v3-8 --replicas 8 -o "$W/dc.tpb"
"$T" disasm "$W/dc.tpb" > "$W/dc.s"
if grep -q "^ *barrier" "$W/dc.s"; then echo "a direct collective still waits at a barrier" >&2; exit 1; fi
run_equals_ref dc v3-8 9
/usr/bin/python3 - "$W/dc_run/stats.json" <<'PY'
import json, sys
ops = {o["id"]: o["cycles"] for o in json.load(open(sys.argv[1]))["ops"]}
for i, name in ((0, "reduce_scatter"), (1, "all_gather")):
    print(f"{name}: {ops[i]} cycles")
    if ops[i] < 2 * 1941:
        sys.exit(f"{name} took {ops[i]} cycles, less than a token's and a block's crossings (2 x 1941)")
PY
# all_gather sends each block once to every other chip, to the core of its
# sender's index, which passes its chip's blocks on to the other core
# (docs/codegen.md "One copy a chip"). On v3-8's 2x2 torus a replica's 3 blocks cross 4
# links (2 neighbours, the diagonal chip 2 hops) and its 4-byte entry tokens to
# the 6 replicas off its chip 8, so the links carry 8 x (4 x BLOCK + 32) bytes;
# every core receiving every block over ICI made it 8 x (8 x BLOCK + 32).
# all_gather_links NAME ROWS HOPS SEED: an all_gather of ROWS x 1024 fp32 a
# replica (BLOCK bytes) on v3-8, equal to the graph reference on the model and
# on the functional reference, must put exactly 8 x (HOPS x BLOCK + 32) bytes on
# the chips' links.
all_gather_links() {
  printf 'graph %s {\n  input %%x : f32[%d,1024]\n  %%ag = all_gather(%%x) : f32[%d,1024] #0\n  output %%ag\n}\n' \
    "$1" $((8 * $2)) $((8 * $2)) > "$W/$1.graph"
  "$T" compile "$W/$1.graph" --preset v3-8 --replicas 8 -o "$W/$1.tpb"
  run_equals_ref "$1" v3-8 "$4"
  "$T" ref "$W/$1.graph" --random-inputs "$4" --out "$W/$1_graph"
  "$T" diff "$W/$1_graph" "$W/$1_run"
  /usr/bin/python3 - "$W/$1_run/stats.json" $(($2 * 4096)) "$3" <<'PY'
import json, sys
units = json.load(open(sys.argv[1]))["units"]
block, hops = int(sys.argv[2]), int(sys.argv[3])
links = sum(u["bytes"] for k, u in units.items() if k.split(".")[1:2] == ["ici"] and k.split(".")[-1][0] in "xy")
print(f"all_gather: {links} bytes over the chips' links, {links / block:.4f} blocks")
if links != 8 * (hops * block + 32):
    sys.exit(f"the links carried {links} bytes, not 8 x ({hops} x {block} + 32) = {8 * (hops * block + 32)}")
PY
}
all_gather_links ag 16 4 4
# Each core passes its own block on at once and each other chip's as it lands
# (one landing flag a source chip on v3-8, f20..f22): four DMAs to the other
# core, the last three each right after the wait for its block (docs/codegen.md
# "Passed on as they land"). One wait for all three made it one DMA after it.
"$T" disasm "$W/ag.tpb" > "$W/ag.s"
/usr/bin/python3 - "$W/ag.s" <<'PY'
import sys
core, lines = None, []
for line in open(sys.argv[1]):
    if line.startswith(".core"):
        core = line.split()[1]
    elif core == "chip0.core0":
        lines.append(line.strip())
passes = [i for i, l in enumerate(lines) if l.startswith("dma hbm@chip0.c1:") and l.endswith("rflag=f60")]
waits = [lines[i - 1] for i in passes[1:]]
print("all_gather passing on, chip0.core0:", len(passes), "DMAs, after", waits)
if len(passes) != 4 or waits != ["wait f20, 1", "wait f21, 1", "wait f22, 1"]:
    sys.exit("chip0.core0 does not pass each landed block on after its own landing flag")
PY
# From blocks of about 248 KB on v3-8 all_gather goes dimension by dimension
# (docs/codegen.md "All_gather by dimensions"): a core sends its block to the
# core of its index on its x neighbour, then what it holds (2 blocks) to its y
# neighbour, so a replica's blocks cross 3 links where the direct exchange took
# 4 (the diagonal chip is 2 hops): 8 x (3 x BLOCK + 32) bytes on the links, with
# the values of the graph reference.
all_gather_links ag1m 256 3 6
