#!/usr/bin/env bash
# Builds attend (scripts/build.sh) and runs `attend bench` (the target problem
# unless flags say otherwise), writing bench-results.{txt,csv,json} into OUT_DIR.
#
#   bench/run.sh [OUT_DIR] [attend bench flags...]      OUT_DIR defaults to build/bench
#
# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed from the benchmark's
# environment (never from the caller's, the tests' or CI's), so that OpenBLAS
# picks its kernel from the CPU it runs on; the header's blas_config line shows
# which one it chose.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ATTEND_BUILD_DIR:-$root/build}"
out="$build/bench"
if [[ $# -gt 0 && "$1" != -* ]]; then
  out="$1"
  shift
fi
bash "$root/scripts/build.sh"
mkdir -p "$out"
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$build/cli/attend" bench \
  --csv "$out/bench-results.csv" --json "$out/bench-results.json" "$@" | tee "$out/bench-results.txt"
echo "results: $out/bench-results.{txt,csv,json}"
