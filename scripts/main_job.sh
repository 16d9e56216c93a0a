#!/usr/bin/env bash
# The main job on the bundled default: the MLP of traces/models compiled for a
# preset board (v3-8: 4 chips of 2 TensorCores joined by ICI, the batch split
# over all 8 cores), simulated (fast mode) with its report printed, and its
# output checked bit for bit against the graph reference of the same model.
# Usage: main_job.sh BUILD_DIR [PRESET [CORES]]   (quickstart.sh and ctest both call it)
#   PRESET defaults to v3-8 with CORES 8; another preset defaults to CORES 1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: main_job.sh BUILD_DIR [PRESET [CORES]]}" && pwd)
preset=${2:-v3-8}
if [ $# -ge 2 ]; then cores=${3:-1}; else cores=8; fi
tpusim="$build/sim/tpusim"
work="$build/main-job"
rm -rf "$work"
mkdir -p "$work"
export SYSTEMC_DISABLE_COPYRIGHT_MESSAGE=1
/usr/bin/python3 "$root/traces/models/make_mlp.py" "$work/mlp.graph"
"$tpusim" compile "$work/mlp.graph" --preset "$preset" --cores "$cores" -o "$work/mlp.tpb"
"$tpusim" run "$work/mlp.tpb" --preset "$preset" --random-inputs 1 --out "$work/run"
"$tpusim" ref "$work/mlp.graph" --random-inputs 1 --out "$work/graph-ref" 2>/dev/null
echo "graph reference vs simulated chip:"
"$tpusim" diff "$work/graph-ref" "$work/run"
