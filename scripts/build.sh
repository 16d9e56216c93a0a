#!/usr/bin/env bash
# Configures and builds the project into build/ (Release unless BUILD_TYPE is set).
# Extra arguments go to cmake's configure step, e.g. -DTPUSIM_SANITIZE=ON.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "$@"
cmake --build "$build" -j "$(nproc)"
