"""bfloat16 / float16 tensors: forward and gradients in the input dtype (f32
accumulation inside attend, f32 LSE), checked with §3.3 against torch math:
out_ref in float64 from the half leaves (rounded to the dtype), out_pt a naive
same-precision computation (every intermediate rounded to the dtype, matmuls
accumulating in float32 — torch 1.13 has no float16 CPU matmul, so both dtypes
emulate it the same way)."""

import pytest
import torch

import attend
import attend.torch as at
from attend.torch import scaled_dot_product_attention as sdpa
from conftest import math_attention, randn

DTYPES = [torch.bfloat16, torch.float16]


def naive_half(q, k, v, scale=None, causal=False):
    dt = q.dtype

    def rnd(x):
        return x.to(dt).to(torch.float32)

    qf, kf, vf = q.float(), k.float(), v.float()
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    s = rnd(qf @ rnd(kf * scale).transpose(-1, -2))
    if causal:
        sq, sk = s.shape[-2:]
        keep = torch.ones(sq, sk, dtype=torch.bool).tril()  # sdpa: top-left aligned
        s = s.masked_fill(~keep, float("-inf"))
    p = rnd(torch.softmax(s, dim=-1))
    return (p @ vf).to(dt)


def reference(q, k, v, causal=False):
    bias = None
    if causal:
        sq, sk = q.shape[-2], k.shape[-2]
        keep = torch.ones(sq, sk, dtype=torch.bool).tril()  # sdpa: top-left aligned
        bias = torch.zeros(sq, sk, dtype=q.dtype).masked_fill(~keep, float("-inf"))
    return math_attention(q, k, v, bias=bias, upcast=True)


def floor(ref):
    ref = ref.float()
    return 2 * ((ref + 0.3 - 0.3) - ref).abs().max().item() + 1e-6


def within(name, got, ref, pt, c):
    err = (got.double() - ref.double()).abs().max().item()
    err_pt = (pt.double() - ref.double()).abs().max().item()
    bound = c * err_pt + floor(ref.to(got.dtype))
    assert err <= bound, f"{name}: max err {err:.3e} > {c}*{err_pt:.3e} + floor = {bound:.3e}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_half_forward_and_gradients_within_same_precision_baseline(dtype, causal):
    q0, k0, v0 = randn(2, 4, 70, 40, dtype=dtype), randn(2, 4, 90, 40, seed=1, dtype=dtype), \
        randn(2, 4, 90, 24, seed=2, dtype=dtype)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q0, k0, v0)]
    out = sdpa(*leaves, is_causal=causal)
    assert out.dtype == dtype and at.last_selection().selected == "flash"
    ref = reference(*leaves, causal=causal)
    pt = naive_half(*leaves, causal=causal)
    within("out", out, ref, pt, 2)
    g = randn(*out.shape, seed=5).to(dtype)
    for i, (a, r, p) in enumerate(zip(torch.autograd.grad(out, leaves, g), torch.autograd.grad(ref, leaves, g),
                                      torch.autograd.grad(pt, leaves, g))):
        assert a.dtype == dtype
        within(f"grad[{i}]", a, r.to(dtype), p, 3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_half_decode_shapes_select_decode_and_match(dtype):
    q, k, v = randn(1, 8, 1, 64, dtype=dtype), randn(1, 2, 700, 64, seed=1, dtype=dtype), \
        randn(1, 2, 700, 64, seed=2, dtype=dtype)
    with torch.no_grad():
        out = sdpa(q, k, v, enable_gqa=True)
    assert out.dtype == dtype and at.last_selection().selected == "decode"
    kk, vv = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
    within("out", out, math_attention(q, kk, vv, upcast=True), naive_half(q, kk, vv), 2)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_explain_notes_how_flash_runs_a_half_dtype(dtype):
    e = attend.explain(batch=1, seqlen_q=64, seqlen_kv=64, heads_q=2, heads_kv=2,
                       head_dim_qk=32, head_dim_v=32, dtype=dtype, mode="training")
    assert e.selected == "flash"
    flash = e.verdicts["flash"]
    for p in ("forward", "backward"):
        (note,) = flash[p]["notes"]
        assert note.startswith(f"dtype={dtype}: ") and ("widened to f32" in note or "GEMMs on" in note), note
        assert f"note {p}: {note}" in e.table
    assert e.verdicts["reference"]["forward"]["notes"] == [
        f"dtype={dtype}: upcast element by element to f64 (a correctness baseline, not a fast path)"]
