#!/usr/bin/env bash
# scripts/check-format.sh in a scratch repository: a misformatted change fails,
# the same change formatted passes, and misformatted lines nobody changed are
# left alone. Exit 77 (skipped) without clang-format.
set -euo pipefail
root="$1"
command -v git-clang-format >/dev/null || exit 77
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/scripts"
cp "$root/scripts/check-format.sh" "$work/scripts/"
cp "$root/.clang-format" "$work/"
cd "$work"
git init -q . && git config user.email t@t && git config user.name t
printf 'int   old_untouched( int x ){return x;}\n' > a.cpp
git add -A && git commit -qm base
printf 'int   old_untouched( int x ){return x;}\nint added( int y ){return y;}\n' > a.cpp
git commit -qam bad
if bash scripts/check-format.sh HEAD~1 >/dev/null; then echo "a misformatted change passed"; exit 1; fi
printf 'int   old_untouched( int x ){return x;}\nint added(int y) { return y; }\n' > a.cpp
git commit -qam good
bash scripts/check-format.sh HEAD~2 >/dev/null || { echo "a formatted change failed"; exit 1; }
echo "check-format behaves"
