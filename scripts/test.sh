#!/usr/bin/env bash
# README command 2: install what is needed, build, and run the whole test suite
# through ctest (which prints its summary line).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" "$@"
export SYSTEMC_DISABLE_COPYRIGHT_MESSAGE=1
cd "${BUILD_DIR:-$root/build}"
ctest --output-on-failure -j "$(nproc)" --timeout 900
