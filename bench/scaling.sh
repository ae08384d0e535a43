#!/usr/bin/env bash
# The scaling table and plot: attend bench at S = 512 ... 8192 with B*S fixed
# (flash, the public path with given outputs, unfused; sgemm peak beside
# them), PyTorch 2.x's CPU SDPA on the same shapes (python/bench_sdpa.py, in
# the cached torch2 venv), and a PNG of GFLOP/s against S (bench/plot.py).
#
#   bench/scaling.sh [OUT_DIR]     OUT_DIR defaults to build/bench
#
# OpenBLAS pinning is removed from the benchmarks' environment only, as in
# bench/run.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ATTEND_BUILD_DIR:-$root/build}"
out="${1:-$build/bench}"
tokens="${ATTEND_BENCH_TOKENS:-8192}"
bash "$root/scripts/build.sh" -DATTEND_BUILD_PYTHON=ON
mkdir -p "$out"
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$build/cli/attend" bench --seqlens 512,1024,2048,4096,8192 \
  --tokens "$tokens" --impls flash,api:given,unfused --json "$out/scaling.json" | tee "$out/scaling.txt"
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH="$build/python" \
  bash "$root/scripts/python-venv.sh" bench "$root/python/bench_sdpa.py" --scaling --tokens "$tokens" \
  --json "$out/sdpa-scaling.json" | tee "$out/sdpa-scaling.txt"
bash "$root/scripts/python-venv.sh" bench "$root/bench/plot.py" "$out/scaling.json" \
  --sdpa "$out/sdpa-scaling.json" -o "$out/scaling.png"
