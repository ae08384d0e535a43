#!/usr/bin/env bash
# The main job: install what the library and the CLI need, build those two
# alone, and run `attend run` on its built-in default problem (an MLA-shaped
# training step, head dims 192/128, checked against the float64 reference).
# Tests, benchmarks, fuzz targets, the Python extension and the CUDA backend
# belong to the test command (scripts/test.sh) and to opt-in builds.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install-deps.sh" core
bash "$root/scripts/build.sh" --target attend_cli -- \
  -DATTEND_BUILD_CLI=ON -DATTEND_BUILD_TESTS=OFF -DATTEND_BUILD_BENCH=OFF \
  -DATTEND_BUILD_PYTHON=OFF -DATTEND_CUDA=OFF -DATTEND_CP_MPI=OFF
"${ATTEND_BUILD_DIR:-$root/build}/cli/attend" run "$@"
