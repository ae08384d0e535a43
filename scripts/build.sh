#!/usr/bin/env bash
# Configures and builds attend (Release, warnings as errors) into ${ATTEND_BUILD_DIR:-build}.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ATTEND_BUILD_DIR:-$root/build}"
jobs="${ATTEND_JOBS:-$(nproc)}"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTEND_WERROR=ON "$@" >/dev/null
cmake --build "$build" -j "$jobs"
