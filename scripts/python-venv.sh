#!/usr/bin/env bash
# Runs the python of a cached virtual environment, creating it when missing:
#   scripts/python-venv.sh torch2|bench [python arguments...]
# torch2: PyTorch 2.x from PyPI (a CUDA build of several GB that runs on the
# CPU), numpy and pytest, in ${ATTEND_TORCH2_VENV:-~/.cache/attend/venv-torch2},
# made from ${ATTEND_PYTHON:-/usr/bin/python3} (the interpreter the in-tree
# extension is built for, so the same build loads there). Installed once;
# reused while it imports torch, numpy and pytest.
# bench: the same environment plus matplotlib (the benchmark plots), added
# when missing; tests and CI use torch2 and never install it.
set -euo pipefail
kind="${1:?usage: python-venv.sh torch2 [python args...]}"
shift
case "$kind" in
  torch2) packages=(torch numpy pytest) ;;
  bench) packages=(torch numpy pytest matplotlib) ;;
  *) echo "python-venv.sh: unknown environment '$kind' (expected torch2 or bench)" >&2; exit 2 ;;
esac
venv="${ATTEND_TORCH2_VENV:-$HOME/.cache/attend/venv-torch2}"
base="${ATTEND_PYTHON:-/usr/bin/python3}"
modules="$(IFS=,; echo "${packages[*]}")"
if ! "$venv/bin/python" -c "import $modules" >/dev/null 2>&1; then
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "python-venv.sh: creating $venv (pip install ${packages[*]}; several GB, once)" >&2
    "$base" -m venv "$venv"
  else
    echo "python-venv.sh: adding to $venv what is missing of ${packages[*]}" >&2
  fi
  "$venv/bin/python" -m pip install -q "${packages[@]}"
fi
exec "$venv/bin/python" "$@"
