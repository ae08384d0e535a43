"""Attention sinks (softmax_type) through attend.torch, against a plain torch
oracle with autograd: the sink logit is one extra score column per row, taken
into the softmax and dropped before P @ V (gpt-oss's formulation)."""

import pytest
import torch

import attend
import attend.torch as at
from conftest import check_attention, randn


def sink_attention(q, k, v, sinks, causal=False, scale=None, upcast=True, reorder=False):
    """q (B, H, Sq, D), k/v (B, Hk, Sk, D), sinks (H) or None (off_by_one: 0)."""
    dtype = q.dtype
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    H, Sq, Sk = q.shape[1], q.shape[2], k.shape[2]
    g = H // k.shape[1]
    if g > 1:
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    s = q @ (k * scale).transpose(-1, -2) if reorder else (q * scale) @ k.transpose(-1, -2)
    if causal:  # bottom-right aligned, as flash_attn
        i = torch.arange(Sq).view(-1, 1) + (Sk - Sq)
        s = s.masked_fill(torch.arange(Sk).view(1, -1) > i, float("-inf"))
    z = (sinks.to(s.dtype) if sinks is not None else s.new_zeros(H)).view(1, H, 1, 1).expand(*s.shape[:3], 1)
    p = torch.softmax(torch.cat([s, z], dim=-1), dim=-1)[..., :-1]
    return (p @ v).to(dtype)


def bshd(t):
    return t.transpose(1, 2)


@pytest.mark.parametrize("causal,hk", [(False, 4), (True, 4), (True, 2), (False, 1)])
def test_flash_attn_func_sinks_match_oracle_with_gradient(causal, hk):
    q, k, v = randn(2, 5, 4, 16, seed=1), randn(2, 7, hk, 16, seed=2), randn(2, 7, hk, 16, seed=3)
    sinks = randn(4, seed=4)
    check_attention(lambda q, k, v, z: at.flash_attn_func(q, k, v, causal=causal, sinks=z),
                    lambda q, k, v, z, **kw: bshd(sink_attention(bshd(q), bshd(k), bshd(v), z, causal, **kw)),
                    (q, k, v, sinks))


def test_sdpa_sinks_and_off_by_one():
    q, k, v = randn(1, 4, 6, 8, seed=5), randn(1, 2, 6, 8, seed=6), randn(1, 2, 6, 8, seed=7)
    sinks = randn(4, seed=8)
    check_attention(lambda q, k, v, z: at.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=z),
                    lambda q, k, v, z, **kw: sink_attention(q, k, v, z, **kw), (q, k, v, sinks))
    check_attention(lambda q, k, v: at.scaled_dot_product_attention(q, k, v, enable_gqa=True,
                                                                    softmax_type="off_by_one"),
                    lambda q, k, v, **kw: sink_attention(q, k, v, None, **kw), (q, k, v))


def test_varlen_and_packed_sinks():
    lens = [3, 5]
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    q, k, v = randn(8, 2, 8, seed=9), randn(8, 2, 8, seed=10), randn(8, 2, 8, seed=11)
    sinks = randn(2, seed=12)

    def per_sequence(q, k, v, z, **kw):
        outs, a = [], 0
        for n in lens:
            sl = slice(a, a + n)
            outs.append(sink_attention(q[sl].transpose(0, 1)[None], k[sl].transpose(0, 1)[None],
                                       v[sl].transpose(0, 1)[None], z, causal=True, **kw)[0].transpose(0, 1))
            a += n
        return torch.cat(outs)

    check_attention(lambda q, k, v, z: at.flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, causal=True, sinks=z),
                    per_sequence, (q, k, v, sinks))
    qkv = torch.stack([q, k, v], dim=1)
    got = at.flash_attn_varlen_qkvpacked_func(qkv, cu, 5, causal=True, sinks=sinks)
    assert torch.allclose(got, per_sequence(q, k, v, sinks).float(), atol=1e-5)
    qd, kd, vd = randn(1, 4, 2, 8, seed=13), randn(1, 4, 2, 8, seed=14), randn(1, 4, 2, 8, seed=15)
    ref = bshd(sink_attention(bshd(qd), bshd(kd), bshd(vd), sinks)).float()
    assert torch.allclose(at.flash_attn_qkvpacked_func(torch.stack([qd, kd, vd], 2), sinks=sinks), ref, atol=1e-5)
    assert torch.allclose(at.flash_attn_kvpacked_func(qd, torch.stack([kd, vd], 2), sinks=sinks), ref, atol=1e-5)


def test_kvcache_sinks():
    q, kc, vc = randn(2, 1, 4, 8, seed=16), randn(2, 6, 2, 8, seed=17), randn(2, 6, 2, 8, seed=18)
    sinks = randn(4, seed=19)
    got = at.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor([4, 6], dtype=torch.int32), sinks=sinks)
    for b, n in enumerate((4, 6)):
        ref = sink_attention(bshd(q[b:b + 1]), bshd(kc[b:b + 1, :n]), bshd(vc[b:b + 1, :n]), sinks)
        assert torch.allclose(got[b:b + 1], bshd(ref).float(), atol=1e-5)


def test_module_learnable_sinks_are_a_trained_parameter():
    m = at.DotProductAttention(4, 8, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="causal",
                               softmax_type="learnable")
    assert isinstance(m.softmax_offset, torch.nn.Parameter) and m.softmax_offset.shape == (4,)
    with torch.no_grad():
        m.softmax_offset.copy_(randn(4, seed=20))
    q, k, v = randn(2, 6, 4, 8, seed=21), randn(2, 6, 2, 8, seed=22), randn(2, 6, 2, 8, seed=23)
    check_attention(lambda q, k, v: m(q, k, v),
                    lambda q, k, v, **kw: bshd(sink_attention(bshd(q), bshd(k), bshd(v), m.softmax_offset,
                                                              causal=True, **kw)).flatten(-2), (q, k, v))
    m.zero_grad()
    m(q, k, v).square().sum().backward()
    z = m.softmax_offset.detach().clone().requires_grad_(True)
    bshd(sink_attention(bshd(q), bshd(k), bshd(v), z, causal=True)).flatten(-2).square().sum().backward()
    assert torch.allclose(m.softmax_offset.grad.double(), z.grad.double(), atol=1e-4)
    assert "off_by_one" in repr(at.DotProductAttention(4, 8, softmax_type="off-by-one"))
    with pytest.raises(attend.InvalidArgumentError, match="softmax_type"):
        at.DotProductAttention(4, 8, softmax_type="sigmoid")


def test_explain_sees_the_sinks():
    q = randn(1, 3, 2, 8).requires_grad_(True)
    e = at.explain(q, q, q, api="flash_attn", causal=True, sinks=torch.zeros(2, requires_grad=True))
    assert e.mode == "training" and "sinks=learnable" in e.data["problem"]


def test_sinks_errors_name_the_field():
    q = randn(1, 3, 2, 8)
    with pytest.raises(attend.AttendError, match="sinks"):
        at.flash_attn_func(q, q, q, sinks=torch.zeros(3))  # H = 2
    with pytest.raises(attend.InvalidArgumentError, match="softmax_type"):
        at.flash_attn_func(q, q, q, sinks=torch.zeros(2), softmax_type="off_by_one")


def test_numpy_forward_backward_with_sinks():
    np = pytest.importorskip("numpy")
    q, k, v = (randn(1, 4, 2, 8, seed=s) for s in (24, 25, 26))
    z = randn(2, seed=27)
    out, lse = attend.forward(q.numpy(), k.numpy(), v.numpy(), sinks=z.numpy(), causal=True)
    leaves = [t.double().requires_grad_(True) for t in (q, k, v, z)]
    ref = bshd(sink_attention(*(bshd(t) for t in leaves[:3]), leaves[3], causal=True))
    assert np.abs(out - ref.detach().numpy()).max() < 1e-5
    dout = randn(1, 4, 2, 8, seed=28)
    g = attend.backward(q.numpy(), k.numpy(), v.numpy(), out, lse, dout.numpy(), sinks=z.numpy(), causal=True)
    refs = torch.autograd.grad(ref, leaves, dout.double())
    for name, r in zip(("dq", "dk", "dv", "dsinks"), refs):
        assert np.abs(g[name] - r.numpy()).max() < 1e-4, name
