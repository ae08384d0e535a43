"""attend.torch's FlashAttention API (B, S, H, D) / (total, H, D) against autograd over the math path."""

import pytest
import torch

import attend
from attend.torch import (draw_dropout_seed, dropout_mask_varlen, flash_attn_func, flash_attn_kvpacked_func,
                          flash_attn_qkvpacked_func, flash_attn_varlen_func, last_selection)
from conftest import check_attention, math_attention, randn


def window_bias(sq, sk, left, right, causal):
    """FlashAttention's mask: bottom-right aligned, inclusive, -1 unbounded."""
    right = 0 if causal else right
    i = torch.arange(sq).unsqueeze(1) + sk - sq
    j = torch.arange(sk).unsqueeze(0)
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return torch.zeros(sq, sk).masked_fill(~keep, float("-inf"))


def bhsd(fn):
    """The math reference takes (B, H, S, D); the FA API is (B, S, H, D)."""
    def ref(q, k, v, upcast, reorder, **kw):
        return fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), upcast=upcast, reorder=reorder,
                  **kw).transpose(1, 2)
    return ref


@pytest.mark.parametrize("hq,hk", [(6, 6), (6, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("sq,sk", [(37, 53), (53, 37)])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (9, 4)), (True, (7, -1))],
                         ids=["full", "causal", "window", "causal_window"])
def test_flash_attn_func_matches_math(hq, hk, sq, sk, causal, window):
    q, k, v = randn(2, sq, hq, 32, seed=1), randn(2, sk, hk, 32, seed=2), randn(2, sk, hk, 32, seed=3)
    bias = window_bias(sq, sk, *window, causal)
    check_attention(lambda q, k, v: flash_attn_func(q, k, v, causal=causal, window_size=window),
                    bhsd(lambda q, k, v, **kw: math_attention(q, k, v, bias=bias, **kw)), (q, k, v))
    assert last_selection().selected == "flash"


def test_flash_attn_any_negative_window_side_is_unbounded_as_in_flash_attn():
    q, k, v = randn(1, 24, 2, 16, seed=7), randn(1, 24, 2, 16, seed=8), randn(1, 24, 2, 16, seed=9)
    want = flash_attn_func(q, k, v, window_size=(-1, 3))
    assert torch.equal(flash_attn_func(q, k, v, window_size=(-5, 3)), want)
    assert torch.equal(flash_attn_func(q, k, v, window_size=(-1, -2)), flash_attn_func(q, k, v))


@pytest.mark.parametrize("d,dv", [(192, 128), (64, 512)])
def test_flash_attn_func_different_value_head_dim_trains(d, dv):
    q, k, v = randn(1, 40, 2, d, seed=4), randn(1, 40, 2, d, seed=5), randn(1, 40, 2, dv, seed=6)
    check_attention(lambda q, k, v: flash_attn_func(q, k, v, causal=True),
                    bhsd(lambda q, k, v, **kw: math_attention(q, k, v, bias=window_bias(40, 40, -1, 0, True),
                                                              **kw)), (q, k, v))


def test_flash_attn_softcap_and_alibi_and_scale():
    sq, sk, h = 21, 30, 4
    q, k, v = randn(2, sq, h, 16, seed=7) * 3, randn(2, sk, h, 16, seed=8), randn(2, sk, h, 16, seed=9)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    i = torch.arange(sq).view(-1, 1) + sk - sq
    j = torch.arange(sk).view(1, -1)
    alibi = -(slopes.view(h, 1, 1) * (i - j).abs())

    def ref(q, k, v, upcast, reorder):
        qq, kk, vv = (t.transpose(1, 2) for t in (q, k, v))
        if upcast:
            qq, kk, vv = qq.double(), kk.double(), vv.double()
        s = (qq * 0.2) @ kk.transpose(-1, -2)
        s = 5.0 * torch.tanh(s / 5.0) + alibi.to(s.dtype)
        return (torch.softmax(s, -1) @ vv).to(q.dtype).transpose(1, 2)

    check_attention(lambda q, k, v: flash_attn_func(q, k, v, softmax_scale=0.2, softcap=5.0, alibi_slopes=slopes),
                    ref, (q, k, v))


def test_flash_attn_return_attn_probs_gives_lse_and_dropout_mask():
    p, b, sq, sk, h = 0.17, 2, 19, 26, 3
    q, k, v = randn(b, sq, h, 8, seed=1), randn(b, sk, h, 8, seed=2), randn(b, sk, h, 8, seed=3)
    torch.manual_seed(5)
    out, lse, keep = flash_attn_func(q, k, v, dropout_p=p, return_attn_probs=True)
    s = (q.transpose(1, 2).double() * 8 ** -0.5) @ k.transpose(1, 2).double().transpose(-1, -2)
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1), rtol=1e-5, atol=1e-5)
    ref = bhsd(lambda q, k, v, **kw: math_attention(q, k, v, keep=keep, dropout_p=p, **kw))(q, k, v, True, False)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert not lse.requires_grad
    _, _, empty = flash_attn_func(q, k, v, return_attn_probs=True)
    assert empty.numel() == 0


def test_flash_attn_packed_variants_read_in_place():
    qkv = randn(2, 17, 3, 2, 8, seed=3)
    torch.testing.assert_close(flash_attn_qkvpacked_func(qkv, causal=True),
                               flash_attn_func(qkv[:, :, 0].contiguous(), qkv[:, :, 1].contiguous(),
                                               qkv[:, :, 2].contiguous(), causal=True), rtol=0, atol=0)
    q, kv = randn(2, 9, 2, 8, seed=4), randn(2, 17, 2, 1, 8, seed=5)
    torch.testing.assert_close(flash_attn_kvpacked_func(q, kv), flash_attn_func(q, kv[:, :, 0], kv[:, :, 1]),
                               rtol=0, atol=0)


def varlen_ref(lens_q, lens_k, causal, keep=None, p=0.0):
    """Per-sequence math attention on packed (total, H, D) tensors."""
    def ref(q, k, v, upcast, reorder):
        outs, oq, ok = [], 0, 0
        for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
            qb, kb, vb = (t.transpose(0, 1).unsqueeze(0) for t in (q[oq:oq + lq], k[ok:ok + lk], v[ok:ok + lk]))
            bias = window_bias(lq, lk, -1, 0, True) if causal else None
            kp = keep[b].unsqueeze(0) if keep is not None else None
            outs.append(math_attention(qb, kb, vb, bias=bias, keep=kp, dropout_p=p, upcast=upcast,
                                       reorder=reorder)[0].transpose(0, 1))
            oq, ok = oq + lq, ok + lk
        return torch.cat(outs)
    return ref


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_flash_attn_varlen_with_an_empty_sequence(causal, dropout):
    lens_q, lens_k = [5, 0, 17, 9], [8, 4, 11, 0]
    cu_q = torch.tensor([0, 5, 5, 22, 31], dtype=torch.int32)
    cu_k = torch.tensor([0, 8, 12, 23, 23], dtype=torch.int32)
    h, hk = 4, 2
    q, k, v = randn(31, h, 16, seed=1), randn(23, hk, 16, seed=2), randn(23, hk, 8, seed=3)
    torch.manual_seed(3)
    seed = draw_dropout_seed()
    keep = dropout_mask_varlen(seed, dropout, h, cu_q, cu_k) if dropout else None

    def run(q, k, v):
        torch.manual_seed(3)
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 11, dropout_p=dropout, causal=causal)

    def ref(q, k, v, upcast, reorder):
        # GQA by repetition, per sequence (math_attention expects whole heads).
        return varlen_ref(lens_q, lens_k, causal, keep, dropout)(q, k.repeat_interleave(2, 1),
                                                                 v.repeat_interleave(2, 1), upcast, reorder)

    out, _ = check_attention(run, ref, (q, k, v))
    assert torch.all(out[22:] == 0)  # the sequence with no keys
    _, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 11, causal=causal, return_attn_probs=True)
    assert lse.shape == (h, 31) and torch.all(torch.isneginf(lse[:, 22:]))


def test_flash_attn_varlen_rejects_paged_kv_and_bad_cu_seqlens():
    q = randn(4, 1, 8)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(attend.UnsupportedError, match="block_table"):
        flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, block_table=torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(attend.InvalidArgumentError, match="cu_seqlens"):
        flash_attn_varlen_func(q, q, q, torch.tensor([0, 5], dtype=torch.int32), cu, 5, 4)
