#!/usr/bin/env bash
# The hardening stage (docs/hardening.md), run by .ci/run after scripts/test.sh:
#   1. ASan+UBSan build (clang) of the whole suite and the fuzz targets; ctest
#   2. TSan build (clang + LLVM libomp with its Archer TSan annotations) of the
#      threaded tests: selector/cache, the stress test, flash/decode/reference
#   3. the three libFuzzer targets (ASan+UBSan), ATTEND_FUZZ_SECONDS (60) each,
#      starting from the checked-in corpora
# Installs its own extra packages. Build dirs: build-asan (suite + fuzz targets), build-tsan.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${ATTEND_JOBS:-$(nproc)}"
fuzz_seconds="${ATTEND_FUZZ_SECONDS:-60}"
cd "$root"

bash scripts/install-deps.sh
packages=(clang libclang-rt-14-dev libomp-14-dev llvm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "test-hardening: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

export CC=clang CXX=clang++
# Huge allocations must reach attend's out_of_memory path (a test provokes one).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
export LSAN_OPTIONS="suppressions=$root/scripts/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LLVM_SYMBOLIZER_PATH="$(command -v llvm-symbolizer || echo /usr/lib/llvm-14/bin/llvm-symbolizer)"
# Warnings are errors in scripts/test.sh (GCC); here clang only reports them, so
# a clang-only warning cannot hide the sanitizer results.
# The MPI engine is off: Open MPI's own allocations and shared-memory transport
# are not sanitizer-clean (docs/hardening.md); the CP planning layer stays in.
common=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTEND_WERROR=OFF -DATTEND_CP_MPI=OFF)
stage() { echo; echo "=== test-hardening: $* ($(date +%T))"; }

stage "ASan+UBSan build (suite and fuzz targets) and full suite"
# One build serves the suite and the fuzz targets: the libFuzzer coverage
# instrumentation (-fsanitize=fuzzer-no-link) costs the tests little, and a
# second sanitized build of the library would cost minutes. The benchmarks are
# in it: fuzz_cli_flags drives `attend bench` (the harness, its data and FLOP
# counts) only when the harness is built, and the bench tests run sanitized.
cmake -S . -B build-asan "${common[@]}" -DATTEND_SANITIZE=address,undefined -DATTEND_BUILD_FUZZ=ON \
  -DATTEND_BUILD_BENCH=ON >/dev/null
cmake --build build-asan -j "$jobs"
# install_*: builds a consumer without the sanitizer runtime; covered by scripts/test.sh.
# *_out_of_memory: provoke an allocation failure, which ASan's operator new reports
# and exits on instead of throwing (as the ResourceLimits tests, which skip themselves).
ctest --test-dir build-asan --output-on-failure -j "$jobs" -E '^install_|_out_of_memory$'

stage "TSan build and threaded subset"
# libgomp is not TSan-instrumented (false reports at every barrier); LLVM's
# libomp with the Archer tool tells TSan about OpenMP's synchronisation.
archer="$(ls /usr/lib/llvm-14/lib/libarcher.so 2>/dev/null || true)"
[[ -n "$archer" ]] || { echo "libarcher.so not found (libomp-14-dev)"; exit 1; }
cmake -S . -B build-tsan "${common[@]}" -DATTEND_SANITIZE=thread -DATTEND_BUILD_CLI=OFF -DATTEND_BUILD_BENCH=OFF \
  >/dev/null
tsan_tests=(test_core test_hardening test_flash test_reference)
[[ -f tests/backends/decode/test_decode_vs_reference.cpp ]] && tsan_tests+=(test_decode)
cmake --build build-tsan -j "$jobs" --target "${tsan_tests[@]}"
# Everything that runs threads: selector and cache, the stress test, flash and
# decode kernels, reference thread-count tests. The 1000-rerun test and the
# reference's gradient checks are single-threaded numerics (run under ASan).
declare -A filter=([test_reference]='ReferenceSemantics.*'
                   [test_hardening]='-Determinism.EveryBackendIsBitwiseIdenticalOver1000Reruns')
for t in "${tsan_tests[@]}"; do
  echo "--- $t (TSan)"
  OMP_TOOL_LIBRARIES="$archer" TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/scripts/sanitizers/tsan.supp" \
    "build-tsan/tests/$t" --gtest_brief=1 --gtest_filter="${filter[$t]:-*}"
done

stage "fuzz targets, ${fuzz_seconds}s each"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for t in npy spec cli_flags; do
  mkdir -p "$work/$t"
  dict=(); [[ -f fuzz/$t.dict ]] && dict=(-dict=fuzz/$t.dict)
  # New corpus entries go to $work; crashes to build-asan/ (kept for the report).
  build-asan/fuzz/fuzz_$t -max_total_time="$fuzz_seconds" -timeout=10 -print_final_stats=1 "${dict[@]}" \
    -artifact_prefix="build-asan/$t-" "$work/$t" fuzz/corpus/$t 2>&1 | tee "$work/$t.log" |
    grep -E "^(INFO: Seed|#[0-9]+ +DONE|stat::number_of_executed_units|==[0-9]+==ERROR|SUMMARY)" || true
  if ! grep -q "DONE" "$work/$t.log"; then
    tail -40 "$work/$t.log"
    echo "fuzz_$t failed: reproduce with build-asan/fuzz/fuzz_$t build-asan/$t-crash-*"
    exit 1
  fi
done
stage "done"
