#!/usr/bin/env bash
# Configures and builds attend (Release, warnings as errors) into ${ATTEND_BUILD_DIR:-build}.
#   build.sh [CMAKE_DEFINES...]                       every target the configuration enables
#   build.sh --target T [--target T...] -- [DEFINES]  only those targets
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ATTEND_BUILD_DIR:-$root/build}"
jobs="${ATTEND_JOBS:-$(nproc)}"
targets=()
while [[ "${1:-}" == "--target" ]]; do
  targets+=(--target "$2")
  shift 2
done
[[ "${1:-}" == "--" ]] && shift
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTEND_WERROR=ON "$@" >/dev/null
cmake --build "$build" -j "$jobs" "${targets[@]}"
