#!/usr/bin/env bash
# Checks that the C/C++ lines changed since BASE follow .clang-format (only the
# changed lines: code nobody touched is never reformatted by this check).
#
#   scripts/check-format.sh [BASE]     BASE: a commit; default $ATTEND_FORMAT_BASE or HEAD~1
#
# In CI (a fresh clone of main) HEAD~1 is the commit before the newest one, so
# the newest commit's changes (a merge's whole branch) are checked. Where BASE
# is not in the history (a shallow clone of depth 1), there is nothing to
# compare against: the check says so and passes. Installs clang-format from
# Debian when missing, as the project's other scripts install what they need.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
base="${1:-${ATTEND_FORMAT_BASE:-HEAD~1}}"

if ! command -v clang-format >/dev/null || ! command -v git-clang-format >/dev/null; then
  echo "check-format: installing clang-format"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends clang-format
fi

if ! git rev-parse --verify -q "${base}^{commit}" >/dev/null; then
  echo "check-format: $base is not in this clone's history (shallow?): no changes to check"
  exit 0
fi

diff="$(git clang-format --diff --extensions c,cc,cpp,h,hpp "$base" 2>&1 || true)"
if grep -q '^diff --git' <<<"$diff"; then
  echo "$diff"
  echo "check-format: lines changed since $base do not follow .clang-format;"
  echo "  fix with: git clang-format $base"
  exit 1
fi
echo "check-format: lines changed since $base follow .clang-format"
