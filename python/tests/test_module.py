"""attend.torch.DotProductAttention (TransformerEngine-style) against the math path."""

import pytest
import torch

import attend
from attend.torch import DotProductAttention, last_selection
from conftest import check_attention, math_attention, randn


def tl_causal(sq, sk):
    keep = torch.ones(sq, sk, dtype=torch.bool).tril()
    return torch.zeros(sq, sk).masked_fill(~keep, float("-inf"))


def to_bhsd(t, fmt):
    return t.permute(1, 2, 0, 3) if fmt == "sbhd" else t.transpose(1, 2)


def from_bhsd(o, fmt):
    o = o.permute(2, 0, 1, 3) if fmt == "sbhd" else o.transpose(1, 2)
    return o.flatten(-2)


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("mask_type", ["no_mask", "causal", "causal_bottom_right"])
def test_module_matches_math_for_gqa_and_split_head_dims(fmt, mask_type):
    b, sq, sk, h, g, dqk, dv = 2, 19, 27, 4, 2, 24, 16
    m = DotProductAttention(h, (dqk, dv), num_gqa_groups=g, qkv_format=fmt, attn_mask_type=mask_type)
    shape = (lambda s, n, d: (s, b, n, d)) if fmt == "sbhd" else (lambda s, n, d: (b, s, n, d))
    q, k, v = randn(*shape(sq, h, dqk), seed=1), randn(*shape(sk, g, dqk), seed=2), randn(*shape(sk, g, dv), seed=3)
    if mask_type == "causal":
        bias = tl_causal(sq, sk)
    elif mask_type == "causal_bottom_right":
        keep = torch.arange(sk).view(1, -1) <= torch.arange(sq).view(-1, 1) + sk - sq
        bias = torch.zeros(sq, sk).masked_fill(~keep, float("-inf"))
    else:
        bias = None

    def ref(q, k, v, upcast, reorder):
        return from_bhsd(math_attention(to_bhsd(q, fmt), to_bhsd(k, fmt), to_bhsd(v, fmt), bias=bias, upcast=upcast,
                                        reorder=reorder), fmt)

    out, _ = check_attention(m, ref, (q, k, v))
    assert out.shape[-1] == h * dv


def test_module_padding_mask_excludes_true_positions():
    b, s, h, d = 2, 12, 2, 8
    m = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="padding_causal")
    q, k, v = randn(b, s, h, d, seed=1), randn(b, s, h, d, seed=2), randn(b, s, h, d, seed=3)
    pad = torch.zeros(b, 1, 1, s, dtype=torch.bool)
    pad[1, ..., 9:] = True  # sequence 1 has 9 real tokens
    excluded = pad.reshape(b, 1, s, 1) | pad.reshape(b, 1, 1, s)
    bias = torch.zeros(b, 1, s, s).masked_fill(excluded, float("-inf")) + tl_causal(s, s)
    out = m(q, k, v, attention_mask=pad)
    ref = math_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias=bias).transpose(1, 2)
    torch.testing.assert_close(out, ref.flatten(-2), rtol=1e-5, atol=1e-5)
    assert torch.all(out[1, 9:] == 0)  # padded queries attend to nothing


def test_module_thd_matches_per_sequence_math():
    lens = [6, 0, 11]
    cu = torch.tensor([0, 6, 6, 17], dtype=torch.int32)
    h, d = 2, 8
    m = DotProductAttention(h, d, qkv_format="thd", attn_mask_type="padding_causal")
    q, k, v = randn(17, h, d, seed=1), randn(17, h, d, seed=2), randn(17, h, d, seed=3)

    def ref(q, k, v, upcast, reorder):
        outs, o = [], 0
        for n in lens:
            qb, kb, vb = (t[o:o + n].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            outs.append(math_attention(qb, kb, vb, bias=tl_causal(n, n), upcast=upcast,
                                       reorder=reorder)[0].transpose(0, 1).flatten(-2))
            o += n
        return torch.cat(outs)

    check_attention(lambda q, k, v: m(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu), ref, (q, k, v))


def test_module_training_flag_and_grad_mode_decide_the_mode_and_dropout():
    m = DotProductAttention(2, 8, qkv_format="bshd", attn_mask_type="no_mask", attention_dropout=0.5)
    q, k, v = randn(1, 10, 2, 8, seed=1), randn(1, 10, 2, 8, seed=2), randn(1, 10, 2, 8, seed=3)
    m.train()
    a = m(q, k, v)
    assert last_selection().mode == "training"  # training module: forward + backward required
    m.eval()
    b = m(q, k, v)
    assert last_selection().mode == "inference"
    with torch.no_grad():
        m.train()
        m(q, k, v)
        assert last_selection().mode == "inference"
    m.eval()
    m(q.requires_grad_(), k, v)
    assert last_selection().mode == "training"  # a backward may follow
    ref = math_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2).flatten(-2)
    torch.testing.assert_close(b, ref, rtol=1e-5, atol=1e-5)  # eval: no dropout
    assert not torch.allclose(a, ref, atol=1e-3)              # train: dropout applied
    assert "heads=2" in repr(m)


def test_module_rejects_wrong_shapes_and_unknown_options():
    m = DotProductAttention(4, 8, qkv_format="bshd")
    with pytest.raises(attend.ShapeMismatchError, match="4 heads"):
        m(randn(1, 3, 2, 8), randn(1, 3, 2, 8), randn(1, 3, 2, 8))
    with pytest.raises(attend.UnsupportedError, match="tp_size"):
        DotProductAttention(4, 8, tp_size=2)
    with pytest.raises(attend.InvalidArgumentError, match="attn_mask_type"):
        m(randn(1, 3, 4, 8), randn(1, 3, 4, 8), randn(1, 3, 4, 8), attn_mask_type="bogus")


@pytest.mark.parametrize("sq,sk,window", [(20, 8, (2, 0)), (8, 20, (3, 0)), (12, 12, (4, 0))],
                         ids=["mask_fallback", "key_prefix", "square"])
def test_module_top_left_causal_window_and_arbitrary_mask(sq, sk, window):
    h, d = 2, 8
    m = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal", window_size=window)
    q, k, v = randn(1, sq, h, d, seed=1), randn(1, sk, h, d, seed=2), randn(1, sk, h, d, seed=3)
    i, j = torch.arange(sq).view(-1, 1), torch.arange(sk).view(1, -1)
    keep = (j <= i) & (j >= i - window[0])  # TE's "causal": top-left aligned

    def ref(q, k, v, upcast, reorder, keep=keep):
        bias = torch.zeros(sq, sk).masked_fill(~keep, float("-inf"))
        return math_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias=bias, upcast=upcast,
                              reorder=reorder).transpose(1, 2).flatten(-2)

    check_attention(m, ref, (q, k, v))
    excluded = randn(1, 1, sq, sk, seed=5) > 0.5
    excluded[..., 0] = False
    out = m(q, k, v, attention_mask=excluded, attn_mask_type="arbitrary", window_size=(-1, -1))
    torch.testing.assert_close(out, ref(q, k, v, True, False, keep=~excluded[0, 0]), rtol=1e-5, atol=1e-5)


def test_module_any_negative_window_side_is_unbounded():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 16, 4, 8) for _ in range(3))
    m = DotProductAttention(4, 8, qkv_format="bshd", attn_mask_type="no_mask")
    assert torch.equal(m(q, k, v, window_size=(-3, -7)), m(q, k, v, window_size=(-1, -1)))
