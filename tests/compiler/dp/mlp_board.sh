#!/bin/sh
# The bundled MLP (traces/models/make_mlp.py) at batch 64 compiled for 8 replicas
# of a v3-8 board: the bundle on the functional reference (race checker on) and on
# the SystemC model must both equal the graph reference of the whole-batch graph,
# bit for bit; then an all_reduce bundle on both. Usage: mlp_board.sh TPUSIM WORKDIR
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
# An all_reduce (per-replica column sums of the batch, summed over the 8 replicas,
# torus algorithm) on the SystemC model against the same bundle on the functional
# reference: landings that complete out of order must not change a bit.
cat > "$W/ar.graph" <<'GRAPH'
graph ar {
  input %x : f32[64,37,29]
  %s = reduce_sum(%x) {axes=[0], keepdims=0} : f32[37,29] #0
  %g = all_reduce(%s) : f32[37,29] #1
  output %g
}
GRAPH
"$T" compile "$W/ar.graph" --preset v3-8 --replicas 8 -o "$W/ar.tpb"
"$T" ref "$W/ar.tpb" --random-inputs 5 --check-races --out "$W/ar_ref"
"$T" run "$W/ar.tpb" --preset v3-8 --random-inputs 5 --out "$W/ar_run" > "$W/ar_report.txt"
"$T" diff "$W/ar_ref" "$W/ar_run"
# `tpusim compile --block-bytes`: a 16 x 1031 all_reduce on the 16 chips of a
# v2-4x4 in blocks of 8192 fp32 elements (3 blocks, docs/codegen.md "Blocks")
# instead of one. Another bundle, and the SystemC model still equals the
# functional reference of it (races checked).
cat > "$W/ar32.graph" <<'GRAPH'
graph ar {
  input %x : f32[32,16,1031]
  %s = reduce_sum(%x) {axes=[0], keepdims=0} : f32[16,1031] #0
  %g = all_reduce(%s) : f32[16,1031] #1
  output %g
}
GRAPH
"$T" compile "$W/ar32.graph" --preset v2-4x4 --replicas 32 -o "$W/ar32_one.tpb"
"$T" compile "$W/ar32.graph" --preset v2-4x4 --replicas 32 --block-bytes 32768 -o "$W/ar32_blocks.tpb"
if cmp -s "$W/ar32_one.tpb" "$W/ar32_blocks.tpb"; then
  echo "--block-bytes 32768 did not change the bundle" >&2
  exit 1
fi
"$T" ref "$W/ar32_blocks.tpb" --random-inputs 7 --check-races --out "$W/ar32_ref"
"$T" run "$W/ar32_blocks.tpb" --preset v2-4x4 --random-inputs 7 --out "$W/ar32_run" > "$W/ar32_report.txt"
"$T" diff "$W/ar32_ref" "$W/ar32_run"
