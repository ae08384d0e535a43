"""attend.torch.scaled_dot_product_attention against autograd over the math path."""

import pytest
import torch

import attend
from attend.torch import draw_dropout_seed, dropout_mask, last_selection, scaled_dot_product_attention as sdpa
from conftest import check_attention, math_attention, randn


def qkv(b, hq, hk, sq, sk, d, dv, seed=0):
    return randn(b, hq, sq, d, seed=seed), randn(b, hk, sk, d, seed=seed + 1), randn(b, hk, sk, dv, seed=seed + 2)


def causal_bias(sq, sk):
    """PyTorch's is_causal: top-left aligned tril."""
    keep = torch.ones(sq, sk, dtype=torch.bool).tril()
    return torch.zeros(sq, sk).masked_fill(~keep, float("-inf"))


@pytest.mark.parametrize("hq,hk", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("d,dv", [(32, 32), (192, 128), (64, 512)])
def test_sdpa_matches_math_outputs_and_gradients(hq, hk, d, dv):
    q, k, v = qkv(2, hq, hk, 37, 45, d, dv)
    out, _ = check_attention(lambda q, k, v: sdpa(q, k, v, enable_gqa=True),
                             lambda q, k, v, **kw: math_attention(q, k, v, **kw), (q, k, v))
    assert out.shape == (2, hq, 37, dv)
    assert last_selection().mode == "training"


@pytest.mark.parametrize("sq,sk", [(33, 33), (20, 50), (50, 20)])
def test_sdpa_is_causal_is_top_left_aligned_like_pytorch(sq, sk):
    q, k, v = qkv(1, 2, 2, sq, sk, 16, 16, seed=3)
    check_attention(lambda q, k, v: sdpa(q, k, v, is_causal=True),
                    lambda q, k, v, **kw: math_attention(q, k, v, bias=causal_bias(sq, sk), **kw), (q, k, v))


def test_sdpa_bool_mask_keeps_true_and_float_mask_adds():
    q, k, v = qkv(2, 2, 2, 24, 31, 16, 8, seed=5)
    keep = randn(2, 1, 24, 31, seed=9) > -0.8
    keep[..., 0] = True  # no fully masked row: PyTorch's math path would give NaN there
    bias = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    check_attention(lambda q, k, v: sdpa(q, k, v, attn_mask=keep),
                    lambda q, k, v, **kw: math_attention(q, k, v, bias=bias, **kw), (q, k, v))
    fbias = randn(24, 31, seed=11) * 0.5
    check_attention(lambda q, k, v: sdpa(q, k, v, attn_mask=fbias, scale=0.3),
                    lambda q, k, v, **kw: math_attention(q, k, v, bias=fbias, scale=0.3, **kw), (q, k, v))


def test_sdpa_float_mask_requiring_grad_gets_its_gradient_from_reference():
    q, k, v = qkv(1, 2, 2, 12, 17, 8, 8, seed=2)
    bias = (randn(1, 2, 12, 17, seed=4) * 0.3)
    check_attention(lambda q, k, v, b: sdpa(q, k, v, attn_mask=b),
                    lambda q, k, v, b, **kw: math_attention(q, k, v, bias=b, **kw), (q, k, v, bias))
    # flash has no dbias: the selector falls back, and says why.
    e = last_selection()
    assert e.selected == "reference"
    assert any(code == "bias_grad" for _, code, _ in e.reasons("flash"))


@pytest.mark.parametrize("hk", [4, 2])
def test_sdpa_dropout_matches_math_with_the_mask_reproduced_from_the_seed(hk):
    p = 0.17
    b, hq, sq, sk = 2, 4, 29, 41
    q, k, v = qkv(b, hq, hk, sq, sk, 16, 24, seed=7)
    torch.manual_seed(1234)
    seed = draw_dropout_seed()
    keep = dropout_mask(seed, p, b, hq, sq, sk)
    assert abs((~keep).float().mean().item() - p) < 0.03

    def run(q, k, v):
        torch.manual_seed(1234)  # the call draws the same seed
        return sdpa(q, k, v, dropout_p=p, enable_gqa=True)

    check_attention(run, lambda q, k, v, **kw: math_attention(q, k, v, keep=keep, dropout_p=p, **kw), (q, k, v))


def test_sdpa_dropout_is_reproducible_under_manual_seed_and_varies_without():
    q, k, v = qkv(1, 2, 2, 16, 16, 8, 8)
    torch.manual_seed(0)
    a = sdpa(q, k, v, dropout_p=0.5)
    torch.manual_seed(0)
    b = sdpa(q, k, v, dropout_p=0.5)
    c = sdpa(q, k, v, dropout_p=0.5)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_sdpa_accepts_non_contiguous_and_3d_inputs():
    base = randn(2, 40, 6, 16, seed=1)  # (B, S, H, D) viewed as (B, H, S, D): strided
    q = base.transpose(1, 2)
    k = randn(2, 6, 40, 32, seed=2)[..., ::2]  # last dim not contiguous: copied
    v = randn(2, 40, 6, 16, seed=3).transpose(1, 2)
    assert not q.is_contiguous() and k.stride(-1) == 2
    check_attention(lambda q, k, v: sdpa(q, k, v), lambda q, k, v, **kw: math_attention(q, k, v, **kw),
                    (q, k, v))
    q3, k3, v3 = randn(3, 10, 8, seed=4), randn(3, 12, 8, seed=5), randn(3, 12, 4, seed=6)
    out = sdpa(q3, k3, v3)
    ref = math_attention(q3.unsqueeze(1), k3.unsqueeze(1), v3.unsqueeze(1)).squeeze(1)
    assert out.shape == (3, 10, 4)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_sdpa_float64_runs_on_reference():
    q, k, v = qkv(1, 2, 2, 9, 11, 8, 8, seed=8)
    q, k, v = q.double(), k.double(), v.double()
    out = sdpa(q, k, v, is_causal=True)
    torch.testing.assert_close(out, math_attention(q, k, v, bias=causal_bias(9, 11).double()),
                               rtol=1e-12, atol=1e-12)
    assert last_selection().selected == "reference"


def test_sdpa_dout_with_zero_strides_and_retain_graph():
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 2, 8, 8, 8, 8))
    out = sdpa(q, k, v)
    out.sum().backward(retain_graph=True)  # dout is an expanded (all-zero-stride) tensor
    g1 = q.grad.clone()
    q.grad = None
    out.sum().backward()
    torch.testing.assert_close(q.grad, g1, rtol=0, atol=0)


def test_sdpa_in_place_change_of_an_input_is_caught_before_backward():
    q, k, v = qkv(1, 1, 1, 4, 4, 4, 4)
    k.requires_grad_()
    kk = k * 1.0
    out = sdpa(q, kk, v)
    kk.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_sdpa_shape_errors_are_value_errors_with_fields():
    q, k, v = qkv(1, 4, 3, 8, 8, 8, 8)
    with pytest.raises(attend.ShapeMismatchError) as e:
        sdpa(q, k, v, enable_gqa=True)
    assert isinstance(e.value, ValueError) and e.value.field == "key.heads"
    with pytest.raises(attend.InvalidArgumentError):
        sdpa(q, k[:, :1], v[:, :1], attn_mask=torch.ones(8, 8, dtype=torch.bool), is_causal=True)
    with pytest.raises(attend.ShapeMismatchError):
        sdpa(q, k[:, :1], v[:, :1, :5])
