#!/usr/bin/env bash
# The test command: install dependencies, build everything, run the whole suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ATTEND_BUILD_DIR:-$root/build}"
bash "$root/scripts/install-deps.sh"
# The cudnn backend's headers (cudnn-frontend, from PyPI); without them AUTO leaves cudnn out.
bash "$root/scripts/cudnn-frontend.sh" >/dev/null || echo "test.sh: no cudnn-frontend headers: cudnn is not built" >&2
# ON, not AUTO: the PyTorch binding's tests must not vanish when torch is missing.
# Every switch explicit: a tree the main job configured (scripts/run-default.sh)
# has tests, benchmarks, MPI and CUDA switched off in its cache.
bash "$root/scripts/build.sh" -DATTEND_BUILD_CLI=ON -DATTEND_BUILD_TESTS=ON -DATTEND_BUILD_BENCH=ON \
  -DATTEND_BUILD_PYTHON=ON -DATTEND_CUDA=AUTO -DATTEND_CUDNN=AUTO -DATTEND_CP_MPI=ON
# The cudnn rule-vs-engine sweep writes its figures here where cuDNN could
# answer deviceless (a passing test's output is otherwise not shown); a file
# left by an earlier run must not pass for this one's.
sweep="$build/tests/cudnn_deviceless_sweep.txt"
rm -f "$sweep"
ctest --test-dir "$build" --output-on-failure -j "${ATTEND_JOBS:-$(nproc)}"
if [[ -f "$sweep" ]]; then cat "$sweep"; fi
