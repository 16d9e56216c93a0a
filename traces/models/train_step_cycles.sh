#!/bin/sh
# Cycles per training step of the bundled examples (docs/training.md, "Measured"):
# writes the forward graph, compiles one SGD-momentum step for PRESET with
# REPLICAS data-parallel replicas (global batch = per-core batch x replicas), runs
# it on the SystemC model (fast mode) and on the functional reference, checks the
# two bit for bit and prints one table row.
# Usage: train_step_cycles.sh TPUSIM mlp|cnn PER_CORE_BATCH PRESET REPLICAS WORKDIR
set -eu
T=$1 MODEL=$2 B=$3 PRESET=$4 R=$5 W=$6
HERE=$(dirname "$0")
mkdir -p "$W"
G=$((B * R))
/usr/bin/python3 "$HERE/make_${MODEL}_train.py" "$W/fwd.ir" --batch "$G"
REP=""
[ "$R" -gt 1 ] && REP="--replicas $R"
"$T" compile "$W/fwd.ir" --preset "$PRESET" $REP --train sgd:lr=0.05,momentum=0.9 --loss xent -o "$W/step.tpb" > "$W/compile.txt"
"$T" run "$W/step.tpb" --preset "$PRESET" --random-inputs 1 --out "$W/run" > "$W/report.txt"
"$T" ref "$W/step.tpb" --random-inputs 1 --out "$W/ref" > /dev/null
"$T" diff "$W/ref" "$W/run" > "$W/diff.txt"
/usr/bin/python3 - "$W" "$MODEL" "$B" "$PRESET" "$R" <<'PY'
import json, sys
w, model, b, preset, r = sys.argv[1:]
s = json.load(open(f"{w}/run/stats.json"))
ins = open(f"{w}/compile.txt").read().split(":")[1].split("instructions")[0].strip()
same = open(f"{w}/diff.txt").read().strip()
print(f"| {model} | {preset} | {r} | {b} | {int(b) * int(r)} | {s['cycles']} | {s['seconds'] * 1e6:.0f} | "
      f"{s['flops'] / 1e9:.3f} | {s['mxu_utilization'] * 100:.3f}% | {ins} | {s['host']['wall_seconds']:.0f} | {same} |")
PY
