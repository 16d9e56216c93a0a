#!/usr/bin/env bash
# README command 1: install what is needed, build, and run the main job on the
# bundled default (scripts/main_job.sh), printing its report.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
exec "$root/scripts/main_job.sh" "${BUILD_DIR:-$root/build}"
