#!/usr/bin/env bash
# README command 1: install what is needed, build, and run the main job on the
# bundled default, printing its report.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
export SYSTEMC_DISABLE_COPYRIGHT_MESSAGE=1
exec "$root/build/sim/tpusim" demo
