#!/usr/bin/env bash
# The cuda backend's checks on a machine with a GPU, from binaries built here
# (the GPU machine of this project's device tool has nvcc but none of the
# test dependencies). Build first, then run this there with the carried paths:
#
#   bash scripts/build.sh && bash scripts/cuda-device-check.sh --stage
#   device run: carry build/tests/test_cuda build/bench/cuda_bench .devlib
#               command: bash scripts/cuda-device-check.sh
#
# --stage copies the shared libraries the binaries need beyond glibc and
# libstdc++ into .devlib/ (ignored by git). Results go to $OUT (or /tmp).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [[ "${1:-}" == "--stage" ]]; then
  mkdir -p .devlib
  for bin in build/tests/test_cuda build/bench/cuda_bench; do
    ldd "$bin" | awk '$3 ~ /^\// {print $3}' | grep -v -E 'lib(c|m|stdc\+\+|gcc_s|pthread|dl|rt)\.so' |
      xargs -r -I{} cp -L {} .devlib/
  done
  ls -la .devlib
  exit 0
fi
out="${OUT:-/tmp/attend-cuda-check}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$root/.devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee "$out/gpu.txt"
status=0
timeout 150 build/tests/test_cuda 2>&1 | tee "$out/test_cuda.log" || status=1
if command -v compute-sanitizer >/dev/null; then
  # Out-of-bounds and race checks on the small conformance cases only (memcheck is ~100x slower).
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 build/tests/test_cuda \
    --gtest_filter='Cuda.Conformance*:Cases/CudaHalf.*' 2>&1 | tail -25 | tee "$out/memcheck.log" || status=1
fi
timeout 120 build/bench/cuda_bench ${ATTEND_CUDA_BENCH_ARGS:-} 2>&1 | tee "$out/bench.log" || status=1
exit $status
