#!/usr/bin/env bash
# Runs the python of a cached virtual environment, creating it when missing:
#   scripts/python-venv.sh torch2 [python arguments...]
# torch2: PyTorch 2.x from PyPI (a CUDA build of several GB that runs on the
# CPU), numpy and pytest, in ${ATTEND_TORCH2_VENV:-~/.cache/attend/venv-torch2},
# made from ${ATTEND_PYTHON:-/usr/bin/python3} (the interpreter the in-tree
# extension is built for, so the same build loads there). Installed once;
# reused while it imports torch, numpy and pytest.
set -euo pipefail
kind="${1:?usage: python-venv.sh torch2 [python args...]}"
shift
case "$kind" in
  torch2) venv="${ATTEND_TORCH2_VENV:-$HOME/.cache/attend/venv-torch2}"; packages=(torch numpy pytest) ;;
  *) echo "python-venv.sh: unknown environment '$kind' (expected torch2)" >&2; exit 2 ;;
esac
base="${ATTEND_PYTHON:-/usr/bin/python3}"
if ! "$venv/bin/python" -c "import torch, numpy, pytest" >/dev/null 2>&1; then
  echo "python-venv.sh: creating $venv (pip install ${packages[*]}; several GB, once)" >&2
  "$base" -m venv "$venv"
  "$venv/bin/python" -m pip install -q "${packages[@]}"
fi
exec "$venv/bin/python" "$@"
