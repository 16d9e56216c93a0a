#!/bin/sh
# `tpusim compile --train` end to end on a small MLP (traces/models/make_mlp_train.py):
# the step's graph reference, the bundle on the functional reference and on the
# SystemC model agree bit for bit, on one v3 core and data parallel over the 8
# cores of a v3-8 board and the 8 chips of a v5e-8 (the step's replicated graph
# reference: `tpusim ref STEP.ir --preset v3-8 --replicas 8`); a bad optimizer spec is a one-line error, exit 2.
# Usage: train_cli.sh TPUSIM WORKDIR
set -eu
T=$1
W=$2
HERE=$(dirname "$0")
rm -rf "$W" && mkdir -p "$W"
/usr/bin/python3 "$HERE/../../../traces/models/make_mlp_train.py" "$W/mlp.ir" --batch 16 --hidden 32
"$T" compile "$W/mlp.ir" --preset v3 --train sgd:lr=0.05,momentum=0.9 --loss xent --emit-graph "$W/step.ir" -o "$W/step.tpb"
"$T" ref "$W/step.ir" --random-inputs 2 --out "$W/graph" > /dev/null
"$T" ref "$W/step.tpb" --random-inputs 2 --check-races --out "$W/ref" > /dev/null
"$T" run "$W/step.tpb" --preset v3 --random-inputs 2 --out "$W/run" > "$W/report.txt"
"$T" diff "$W/graph" "$W/ref"
"$T" diff "$W/ref" "$W/run"
"$T" compile "$W/mlp.ir" --preset v3-8 --replicas 8 --train sgd:lr=0.05,momentum=0.9 --emit-graph "$W/dp_step.ir" \
  -o "$W/dp.tpb"
"$T" ref "$W/dp_step.ir" --preset v3-8 --replicas 8 --random-inputs 2 --out "$W/dp_graph" > /dev/null
"$T" ref "$W/dp.tpb" --random-inputs 2 --check-races --out "$W/dp_ref" > /dev/null
"$T" run "$W/dp.tpb" --preset v3-8 --random-inputs 2 --out "$W/dp_run" > "$W/dp_report.txt"
"$T" diff "$W/dp_graph" "$W/dp_ref"
"$T" diff "$W/dp_ref" "$W/dp_run"
# A v5e-8 slice: one core a chip, 8 chips in a 2x4 torus, so the torus algorithm.
"$T" compile "$W/mlp.ir" --preset v5e-8 --replicas 8 --train sgd:lr=0.05,momentum=0.9 --emit-graph "$W/v5_step.ir" \
  -o "$W/v5.tpb"
"$T" ref "$W/v5_step.ir" --preset v5e-8 --replicas 8 --random-inputs 2 --out "$W/v5_graph" > /dev/null
"$T" run "$W/v5.tpb" --preset v5e-8 --random-inputs 2 --out "$W/v5_run" > "$W/v5_report.txt"
"$T" diff "$W/v5_graph" "$W/v5_run"
# A torch-exported ONNX CNN (Conv with bias, ReLU, MaxPool, GlobalAveragePool via
# AdaptiveAvgPool, Flatten, Gemm with transB) trains through the same path.
/usr/bin/python3 - "$W/cnn.onnx" <<'PY'
import sys
import torch
torch.manual_seed(0)
c = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                        torch.nn.Flatten(), torch.nn.Linear(8, 10))
torch.onnx.export(c, torch.randn(4, 3, 8, 8), sys.argv[1], input_names=["x"], output_names=["logits"])
PY
"$T" compile "$W/cnn.onnx" --preset v3 --train sgd:lr=0.1 --emit-graph "$W/cnn_step.ir" -o "$W/cnn.tpb"
"$T" ref "$W/cnn_step.ir" --random-inputs 4 --out "$W/cnn_graph" > /dev/null
"$T" ref "$W/cnn.tpb" --random-inputs 4 --check-races --out "$W/cnn_ref" > /dev/null
"$T" diff "$W/cnn_graph" "$W/cnn_ref"
set +e
"$T" compile "$W/mlp.ir" --preset v3 --train adam:lr=1 -o "$W/bad.tpb" 2> "$W/bad.txt"
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "bad --train: exit $rc, want 2"; exit 1; }
grep -q "optimizer 'adam' is not supported" "$W/bad.txt" || { cat "$W/bad.txt"; exit 1; }
echo "train cli: all identical"
