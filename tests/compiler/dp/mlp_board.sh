#!/bin/sh
# The bundled MLP (traces/models/make_mlp.py) at batch 64 compiled for 8 replicas
# of a v3-8 board: the bundle on the functional reference (race checker on) and on
# the SystemC model must both equal the graph reference of the whole-batch graph,
# bit for bit. Usage: mlp_board.sh TPUSIM WORKDIR
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
