#!/usr/bin/env bash
# The GPU backends' checks on a machine with a GPU, from binaries built here
# (the GPU machine of this project's device tool has nvcc but none of the
# test dependencies). Build first, then run this there with the carried paths:
#
#   bash scripts/build.sh && bash scripts/cuda-device-check.sh --stage
#   device run: carry build/tests/test_cuda build/tests/test_cudnn build/tests/test_cudnn_deviceless
#               build/src/backends/cudnn/attend-cudnn-descriptor build/bench/cuda_bench .devlib
#               command: bash scripts/cuda-device-check.sh [all|cuda|cudnn|bench]
#
# --stage copies the shared libraries the binaries need beyond glibc and
# libstdc++ into .devlib/ (ignored by git), plus libcudart.so.13, which
# cudnn-frontend opens at run time. cuDNN itself (~500 MB) is not carried: the
# cudnn steps look for libcudnn.so.9 on the device (ATTEND_CUDNN_LIBRARY, the
# loader's cache, the CUDA toolkit, a Python wheel) and say so when it is absent.
#
# Parts (default all). Each step has its own timeout; the worst cases are cuda
# 4 min, cudnn 7.5 min (plan builds may compile kernels), bench 7 min, so with
# a 10-minute limit per device command, run one part per command:
#   cuda   test_cuda (conformance, half, large cases), memcheck on the small ones
#   cudnn  attend-cudnn-descriptor: this GPU's device descriptor (saved as
#          $OUT/descriptor.json, the file ATTEND_CUDNN_TARGET=path.json takes);
#          test_cudnn: the rule-vs-engine sweep (fails on any case the rules
#          accept and cuDNN refuses; lists the rules too strict) with, per
#          case, cuDNN's deviceless verdict for that captured descriptor (and
#          then the shipped one of this GPU) beside the on-device one, and the
#          conformance cases on cudnn in bf16/f16 against the f64 reference;
#          test_cudnn_deviceless: the CPU sweep for every shipped target, here
#          on the real driver
#   bench  cuda_bench (cuda and cudnn rows, cuBLAS GEMM peaks in the same run)
#          and, where torch with CUDA imports, python/bench_sdpa_cuda.py
#          (PyTorch SDPA on its cuDNN and flash backends, same shapes)
# Results go to $OUT (or /tmp/attend-cuda-check); exit 1 when a step failed.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${ATTEND_DEVICE_BUILD:-build}"
bins=("$build/tests/test_cuda" "$build/tests/test_cudnn" "$build/tests/test_cudnn_deviceless"
  "$build/src/backends/cudnn/attend-cudnn-descriptor" "$build/bench/cuda_bench")
if [[ "${1:-}" == "--stage" ]]; then
  mkdir -p .devlib
  for bin in "${bins[@]}"; do
    [[ -x "$bin" ]] || { echo "cuda-device-check.sh: $bin is not built (skipped)" >&2; continue; }
    ldd "$bin" | awk '$3 ~ /^\// {print $3}' | grep -v -E 'lib(c|m|stdc\+\+|gcc_s|pthread|dl|rt)\.so' |
      xargs -r -I{} cp -L {} .devlib/
  done
  cudart="$(ldconfig -p | awk '/libcudart\.so\.13 / {print $NF; exit}')"
  [[ -n "$cudart" ]] || cudart="$(ls /usr/local/cuda/lib64/libcudart.so.13 2>/dev/null | head -1)"
  [[ -n "$cudart" ]] && cp -L "$cudart" .devlib/libcudart.so.13
  ls -la .devlib
  exit 0
fi
part="${1:-all}"
case "$part" in all | cuda | cudnn | bench) ;; *) echo "usage: $0 [--stage | all|cuda|cudnn|bench]" >&2; exit 2 ;; esac
wants() { [[ "$part" == all || "$part" == "$1" ]]; }
out="${OUT:-/tmp/attend-cuda-check}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$root/.devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee "$out/gpu.txt"
status=0

# cuDNN on this machine: the backend opens libcudnn.so.9 by name, or the path
# in ATTEND_CUDNN_LIBRARY; its engine libraries are found next to it.
find_cudnn() {
  [[ -n "${ATTEND_CUDNN_LIBRARY:-}" ]] && { echo "$ATTEND_CUDNN_LIBRARY"; return; }
  local hit
  hit="$(ldconfig -p 2>/dev/null | awk '/libcudnn\.so\.9 / {print $NF; exit}')"
  [[ -n "$hit" ]] && { echo "$hit"; return; }
  for hit in /usr/local/cuda*/lib*/libcudnn.so.9 /usr/lib/x86_64-linux-gnu/libcudnn.so.9 \
    /usr/local/lib/python3*/dist-packages/nvidia/cudnn/lib/libcudnn.so.9 \
    "$HOME"/.local/lib/python3*/site-packages/nvidia/cudnn/lib/libcudnn.so.9; do
    [[ -e "$hit" ]] && { echo "$hit"; return; }
  done
}

if wants cuda; then
  timeout 150 "$build/tests/test_cuda" 2>&1 | tee "$out/test_cuda.log" || status=1
  if command -v compute-sanitizer >/dev/null; then
    # Out-of-bounds and race checks on the small conformance cases only (memcheck is ~100x slower).
    timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 "$build/tests/test_cuda" \
      --gtest_filter='Cuda.Conformance*:Cases/CudaHalf.*' 2>&1 | tail -25 | tee "$out/memcheck.log" || status=1
  fi
fi

if wants cudnn || wants bench; then
  cudnn="$(find_cudnn)"
  if [[ -n "$cudnn" ]]; then
    export ATTEND_CUDNN_LIBRARY="$cudnn"
    export LD_LIBRARY_PATH="$(dirname "$cudnn"):$LD_LIBRARY_PATH"
    echo "cudnn: $cudnn" | tee "$out/cudnn.txt"
  else
    echo "cudnn: no libcudnn.so.9 on this machine: the cudnn engine steps are BLOCKED (they skip)" |
      tee "$out/cudnn.txt"
  fi
fi

if wants cudnn; then
  # This GPU's descriptor as cuDNN serializes it, next to the shipped ones
  # (src/backends/cudnn/cudnn_targets.cpp): a differing key is a correction.
  timeout 30 "$build/src/backends/cudnn/attend-cudnn-descriptor" 0 >"$out/descriptor.json" 2>"$out/descriptor.err" ||
    { cat "$out/descriptor.err"; status=1; }
  cat "$out/descriptor.json"
  # The sweep prints one line per (case, pass): rules vs engine vs deviceless
  # (for the captured descriptor), and the totals.
  compare=()
  [[ -s "$out/descriptor.json" ]] && compare=(env "ATTEND_CUDNN_COMPARE_TARGET=$out/descriptor.json")
  timeout 240 "${compare[@]}" "$build/tests/test_cudnn" --gtest_filter='CudnnDevice.*:CudnnSelection.*' 2>&1 |
    tee "$out/cudnn_sweep.log" || status=1
  timeout 120 "$build/tests/test_cudnn_deviceless" 2>&1 | tee "$out/cudnn_deviceless.log" || status=1
  timeout 200 "$build/tests/test_cudnn" --gtest_filter='Dtypes/CudnnHalf.*' 2>&1 |
    tee "$out/cudnn_conformance.log" || status=1
  grep -q "SKIPPED \] CudnnDevice" "$out/cudnn_sweep.log" && echo "cudnn: the device tests SKIPPED (see the logs): not a pass" |
    tee -a "$out/cudnn.txt"
fi

if wants bench; then
  timeout 240 "$build/bench/cuda_bench" ${ATTEND_CUDA_BENCH_ARGS:-} 2>&1 | tee "$out/bench.log" || status=1
  py="$(command -v python3 || true)"
  if [[ -n "$py" ]]; then
    timeout 180 "$py" python/bench_sdpa_cuda.py --json "$out/torch_sdpa.json" ${ATTEND_TORCH_BENCH_ARGS:-} 2>&1 |
      tee "$out/torch_sdpa.log"
    rc=${PIPESTATUS[0]}
    [[ $rc == 0 || $rc == 77 ]] || status=1
  else
    echo "torch SDPA baseline: skipped (no python3)" | tee "$out/torch_sdpa.log"
  fi
fi
exit $status
