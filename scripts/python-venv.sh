#!/usr/bin/env bash
# Runs the python of a cached virtual environment, creating it when missing:
#   scripts/python-venv.sh torch2|bench [python arguments...]
# torch2: PyTorch 2.x from PyPI (a CUDA build of several GB that runs on the
# CPU), numpy, pytest and Hugging Face transformers (in the range pyproject.toml's
# "transformers" extra supports: python/tests/test_transformers.py runs real
# models on attend), in ${ATTEND_TORCH2_VENV:-~/.cache/attend/venv-torch2},
# made from ${ATTEND_PYTHON:-/usr/bin/python3} (the interpreter the in-tree
# extension is built for, so the same build loads there). Installed once;
# reused while it imports torch, numpy, pytest and transformers.
# bench: the same environment plus matplotlib (the benchmark plots), added
# when missing; tests and CI use torch2 and never install it.
set -euo pipefail
kind="${1:?usage: python-venv.sh torch2 [python args...]}"
shift
case "$kind" in
  torch2) packages=(torch numpy pytest "transformers>=5.0,<6") ;;
  bench) packages=(torch numpy pytest matplotlib) ;;
  *) echo "python-venv.sh: unknown environment '$kind' (expected torch2 or bench)" >&2; exit 2 ;;
esac
venv="${ATTEND_TORCH2_VENV:-$HOME/.cache/attend/venv-torch2}"
base="${ATTEND_PYTHON:-/usr/bin/python3}"
# The import names: the requirements less their version ranges.
names=("${packages[@]%%[<>=!]*}")
modules="$(IFS=,; echo "${names[*]}")"
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
