#!/usr/bin/env bash
# The test command: install dependencies, build everything, run the whole suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ATTEND_BUILD_DIR:-$root/build}"
bash "$root/scripts/install-deps.sh"
# ON, not AUTO: the PyTorch binding's tests must not vanish when torch is missing.
bash "$root/scripts/build.sh" -DATTEND_BUILD_PYTHON=ON
ctest --test-dir "$build" --output-on-failure -j "${ATTEND_JOBS:-$(nproc)}"
