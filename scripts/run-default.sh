#!/usr/bin/env bash
# The main job: install dependencies, build, and run `attend run` on its built-in
# default problem (an MLA-shaped training step, head dims 192/128, checked
# against the float64 reference).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build.sh"
"${ATTEND_BUILD_DIR:-$root/build}/cli/attend" run "$@"
