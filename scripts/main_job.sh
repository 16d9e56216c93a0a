#!/usr/bin/env bash
# The main job on the bundled default: the MLP of traces/models compiled for a
# preset chip, simulated (fast mode) with its report printed, and its output
# checked bit for bit against the graph reference of the same model.
# Usage: main_job.sh BUILD_DIR [PRESET]   (quickstart.sh and ctest both call it)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: main_job.sh BUILD_DIR [PRESET]}" && pwd)
preset=${2:-v3}
tpusim="$build/sim/tpusim"
work="$build/main-job"
rm -rf "$work"
mkdir -p "$work"
export SYSTEMC_DISABLE_COPYRIGHT_MESSAGE=1
/usr/bin/python3 "$root/traces/models/make_mlp.py" "$work/mlp.graph"
"$tpusim" compile "$work/mlp.graph" --preset "$preset" -o "$work/mlp.tpb"
"$tpusim" run "$work/mlp.tpb" --preset "$preset" --random-inputs 1 --out "$work/run"
"$tpusim" ref "$work/mlp.graph" --random-inputs 1 --out "$work/graph-ref" 2>/dev/null
echo "graph reference vs simulated chip:"
"$tpusim" diff "$work/graph-ref" "$work/run"
