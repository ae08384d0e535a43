#!/usr/bin/env bash
# The package as users install it: pip builds a wheel of this checkout
# (scikit-build-core: the library, the extension and the CLI) in a fresh
# virtual environment without torch, installs it there and runs the numpy-only
# tests (python/tests_numpy) and its `attend` console script, then installs the
# same wheel into a fresh environment that sees Debian's torch 1.13
# (--system-site-packages) and runs a PyTorch forward+backward against
# autograd's math path.
#
# Wall time: with ATTEND_PREBUILT=<build tree> (ctest passes its own) the wheel
# links that tree's libattend and compiles only the extension; the CMake build
# directory and the venvs are cached per checkout in ${ATTEND_CACHE:-~/.cache/attend}
# (incremental rebuilds), and pip's own cache keeps the downloads.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
base="${ATTEND_PYTHON:-/usr/bin/python3}"
cache="${ATTEND_CACHE:-$HOME/.cache/attend}"
# Fixed paths per checkout: the cached CMake build remembers its source tree,
# the interpreter and the pybind11 it found.
work="$cache/install-test/$(printf '%s' "$root" | sha1sum | cut -c1-12)"
numpy_env="$work/numpy"
torch_env="$work/torch1"
wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"' EXIT
mkdir -p "$work"
prebuilt=()
if [[ -n "${ATTEND_PREBUILT:-}" ]]; then
  prebuilt=(--config-settings=cmake.define.ATTEND_PYTHON_PREBUILT="$ATTEND_PREBUILT")
fi

rm -rf "$numpy_env" "$torch_env"
"$base" -m venv "$numpy_env"
"$numpy_env/bin/python" -m pip install -q numpy pytest scikit-build-core pybind11
# --no-build-isolation: the build tools above, at fixed paths the cached build can keep.
"$numpy_env/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$wheels" \
  --config-settings=build-dir="$work/build" "${prebuilt[@]}" "$root"
wheel="$(ls "$wheels"/attend-*.whl)"
echo "built $(basename "$wheel")"
"$numpy_env/bin/python" -m pip install -q "$wheel"
cd "$wheels"  # not the checkout: its python/ must not shadow the installed package
"$numpy_env/bin/python" -m pytest "$root/python/tests_numpy" -q -p no:cacheprovider
# The console script runs the CLI the wheel carries (CLI11 is installed here).
"$numpy_env/bin/attend" select --seqlen 64 --heads 2 --head-dim 32 --training | tee "$wheels/select.txt"
grep -q "^selected: flash" "$wheels/select.txt"

"$base" -m venv --system-site-packages "$torch_env"
"$torch_env/bin/python" -m pip install -q --no-deps "$wheel"
"$torch_env/bin/python" - <<'PY'
import attend, attend.torch, torch
assert attend.__file__.startswith(__import__("sys").prefix), attend.__file__  # the installed copy
torch.manual_seed(0)
q, k, v = (torch.randn(2, 3, 17, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
out = attend.torch.scaled_dot_product_attention(q, k, v, is_causal=True)
mask = torch.ones(17, 17, dtype=torch.bool).tril()
ref = torch.softmax((q @ k.transpose(-1, -2) / 4).masked_fill(~mask, float("-inf")), -1) @ v
g = torch.randn_like(out)
got = torch.autograd.grad(out, (q, k, v), g)
want = torch.autograd.grad(ref, (q, k, v), g)
err = max([(out - ref).abs().max().item()] + [(a - b).abs().max().item() for a, b in zip(got, want)])
print(f"attend {attend.__version__} on torch {torch.__version__}: forward+backward max err {err:.2e}")
assert err < 1e-10, err
PY
