"""Shared oracle and tolerance for the attend.torch tests.

The oracle is PyTorch's own autograd over the math definition of attention,
softmax(q k^T * scale + mask) v written out here, so the suite runs unchanged on
torch 1.13 (which has no F.scaled_dot_product_attention) and 2.x (where
test_torch2.py also compares with torch's own SDPA kernels). Tolerances follow
docs/semantics.md §7: with out_ref computed in float64 from the
float32 leaves and out_pt a naive float32 computation (scale moved onto k), the
kernel must satisfy max|out - out_ref| <= C * max|out_pt - out_ref| + atol, with
atol = 2 * max|(ref + 0.3 - 0.3) - ref| (the rounding noise of one add in f32).
"""

import os
import sys

import pytest
import torch

# Fresh processes get the environment's policy; tests that change it restore it.
os.environ.pop("ATTEND_BACKEND", None)
os.environ.pop("ATTEND_DISABLE", None)

try:
    import attend  # noqa: F401
    import attend.torch  # noqa: F401
except ImportError as e:  # a missing extension must fail loudly, never skip
    raise ImportError(f"attend is not importable (PYTHONPATH={os.environ.get('PYTHONPATH')!r}, "
                      f"python={sys.executable}): {e}") from e


def math_attention(q, k, v, scale=None, bias=None, keep=None, dropout_p=0.0, upcast=True, reorder=False):
    """Reference attention in (B, H, S, D) with GQA by repetition.

    bias: additive, broadcastable to (B, H, Sq, Sk), -inf = masked; keep: bool
    dropout keep mask (B, H, Sq, Sk); fully masked rows give 0 (attend's and
    FlashAttention's convention). upcast computes in float64 and rounds the
    result to the input dtype; reorder applies the scale to k (§3.3's baseline)."""
    dtype = q.dtype
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
        bias = bias.double() if bias is not None else None
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    s = q @ (k * scale).transpose(-1, -2) if reorder else (q * scale) @ k.transpose(-1, -2)
    if bias is not None:
        s = s + bias
    # Rows with no unmasked key: softmax would be NaN (also in its backward).
    empty = torch.isneginf(s).all(dim=-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    if keep is not None:
        p = p.masked_fill(~keep, 0.0) / (1.0 - dropout_p)
    return (p @ v).to(dtype)


def rounding_floor(ref):
    return 2 * ((ref + 0.3 - 0.3) - ref).abs().max().item()


def check_close(name, got, ref, pt, c=2.0):
    """§3.3: max|got - ref| <= c * max|pt - ref| + 2 ulp-noise floor."""
    err = (got.double() - ref.double()).abs().max().item()
    err_pt = (pt.double() - ref.double()).abs().max().item()
    bound = c * err_pt + rounding_floor(ref)
    assert err <= bound, f"{name}: max err {err:.3e} > {c}*{err_pt:.3e} + floor = {bound:.3e}"


# FlashAttention's strict rule for f32 gradients: err <= 3 x err(naive f32 math) + 1e-5, both against float64.
STRICT_ATOL = 1e-5


def grad_ratios(got, ref, naive, names=("dq", "dk", "dv")):
    """{name: (err / bound, err, err_naive)} for each gradient: > 1 breaks the strict rule."""
    ratios = {}
    for name, g, r, n in zip(names, got, ref, naive):
        err = (g.double() - r.double()).abs().max().item()
        err_naive = (n.double() - r.double()).abs().max().item()
        ratios[name] = (err / (3 * err_naive + STRICT_ATOL), err, err_naive)
    return ratios


def assert_strict(ratios, where=""):
    bad = {k: v for k, v in ratios.items() if v[0] > 1}
    assert not bad, (where + ": " if where else "") + ", ".join(
        f"{k}: err {e:.3e} > 3 x naive f32 {n:.3e} + {STRICT_ATOL}" for k, (_, e, n) in bad.items())


def check_attention(fn, ref_fn, inputs, grad_c=3.0, out_c=2.0, seed=0):
    """Runs fn (the attend call) and ref_fn(upcast, reorder) on the same leaf
    tensors, checks the output and every leaf's gradient with §3.3."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    ref = ref_fn(*leaves, upcast=True, reorder=False)
    pt = ref_fn(*leaves, upcast=False, reorder=True)
    check_close("out", out, ref, pt, out_c)
    gen = torch.Generator().manual_seed(seed + 99)
    g = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    grads = torch.autograd.grad(out, leaves, g)
    grads_ref = torch.autograd.grad(ref, leaves, g)
    grads_pt = torch.autograd.grad(pt, leaves, g)
    for i, (a, r, p) in enumerate(zip(grads, grads_ref, grads_pt)):
        check_close(f"grad[{i}]", a, r, p, grad_c)
    return out, grads


@pytest.fixture
def restore_policy():
    import attend
    saved = attend.get_policy()
    yield
    attend.set_policy(saved["force"], saved["disable"], saved["log"], saved["select"], saved["tune_cache"])


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
