"""torch.func transforms over attend.torch (issue 41): vmap runs (the ops
have a vmap rule), grad and jvp are attend errors naming the transform; before,
all three failed reading the data pointer of a functorch wrapper."""

import pytest
import torch

import attend.torch as at
from attend.errors import UnsupportedError
from conftest import math_attention, randn

needs_vmap = pytest.mark.skipif(not (at.HAS_TORCH_LIBRARY_OPS and hasattr(torch.library, "register_vmap")),
                                reason="vmap rules need torch.library ops and register_vmap")
# torch.func came with torch 2.0 (py/torch1 runs Debian's 1.x).
needs_func = pytest.mark.skipif(not hasattr(torch, "func"), reason="torch.func needs torch >= 2.0")


def _math_flash(q, k, v, causal=False):
    # flash_attn's (B, S, H, D) through the (B, H, S, D) math reference
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    sq, sk = q.shape[1], k.shape[1]
    bias = None
    if causal:
        keep = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
        bias = torch.zeros(sq, sk, dtype=q.dtype).masked_fill(~keep, float("-inf"))
    return t(math_attention(t(q), t(k), t(v), bias=bias))


@needs_vmap
def test_vmap_over_flash_attn_func_matches_each_element():
    x = randn(3, 1, 5, 2, 8)
    out = torch.func.vmap(lambda a: at.flash_attn_func(a, a, a))(x)
    assert out.shape == x.shape
    for i in range(3):
        torch.testing.assert_close(out[i], at.flash_attn_func(x[i], x[i], x[i]))
    torch.testing.assert_close(out[1], _math_flash(x[1], x[1], x[1]), rtol=1e-5, atol=1e-5)


@needs_vmap
def test_vmap_with_some_arguments_unmapped_and_other_dims():
    q, kv = randn(1, 4, 2, 2, 8, seed=1), randn(1, 6, 2, 8, seed=2)  # q mapped over dim 2
    out = torch.func.vmap(lambda a: at.flash_attn_func(a, kv, kv, causal=True), in_dims=2)(q)
    assert out.shape == (2, 1, 4, 2, 8)  # (the mapped dim comes out first)
    for i in range(2):
        torch.testing.assert_close(out[i], at.flash_attn_func(q[:, :, i], kv, kv, causal=True))
    sd = randn(3, 1, 2, 5, 8, seed=3)
    out = torch.func.vmap(lambda a: at.scaled_dot_product_attention(a, a, a, is_causal=True))(sd)
    torch.testing.assert_close(out[2], at.scaled_dot_product_attention(sd[2], sd[2], sd[2], is_causal=True))


@needs_vmap
def test_vmap_in_training_gives_the_per_element_gradients():
    x = randn(2, 1, 5, 2, 8).requires_grad_(True)
    out = torch.func.vmap(lambda a: at.flash_attn_func(a, a, a, causal=True))(x)
    (g,) = torch.autograd.grad(out.square().sum(), x)
    for i in range(2):
        xi = x[i].detach().requires_grad_(True)
        (gi,) = torch.autograd.grad(at.flash_attn_func(xi, xi, xi, causal=True).square().sum(), xi)
        torch.testing.assert_close(g[i], gi)


@needs_func
def test_grad_and_jvp_are_errors_naming_the_transform():
    x = randn(1, 5, 2, 8)
    with pytest.raises(UnsupportedError, match="torch.func.grad") as e:
        torch.func.grad(lambda a: at.flash_attn_func(a, a, a).sum())(x)
    assert e.value.field == "torch.func" and e.value.value == "grad" and "torch.autograd" in str(e.value)
    with pytest.raises(UnsupportedError, match="torch.func.grad"):
        torch.func.vmap(torch.func.grad(lambda a: at.flash_attn_func(a, a, a).sum()))(x.unsqueeze(0))
    with pytest.raises(UnsupportedError, match="torch.func.jvp") as e:
        torch.func.jvp(lambda a: at.flash_attn_func(a, a, a), (x,), (x,))
    assert e.value.value == "jvp"
    with pytest.raises(UnsupportedError, match="torch.func.grad"):
        torch.func.grad(lambda a: at.scaled_dot_product_attention(a, a, a).sum())(x)


@needs_func
def test_entry_points_that_read_memory_refuse_vmap_by_name():
    x = randn(2, 1, 1, 2, 8)
    cache = torch.zeros(1, 8, 2, 8)
    with pytest.raises(UnsupportedError, match="flash_attn_with_kvcache does not support torch.func.vmap"):
        torch.func.vmap(lambda a: at.flash_attn_with_kvcache(a, cache, cache, cache_seqlens=3))(x)
    with pytest.raises(UnsupportedError, match="dropout"):
        torch.func.vmap(lambda a: at.flash_attn_func(a, a, a, dropout_p=0.1), randomness="same")(x)
