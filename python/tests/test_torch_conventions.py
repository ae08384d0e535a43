"""PyTorch conventions on every torch version: autocast, double backward,
dropout_p range, devices, the KV cache entry point, dq_dtype, and a short
training loop against torch's math attention."""

import math

import pytest
import torch

import attend
from attend.torch import flash_attn_func, flash_attn_with_kvcache, scaled_dot_product_attention
from conftest import math_attention, randn


def test_autocast_cpu_bf16_runs_in_bf16_and_matches():
    q, k, v = (randn(2, 3, 16, 32, seed=s) for s in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype == torch.bfloat16
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    ref = math_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(),
                         bias=torch.zeros(16, 16).masked_fill(~mask, float("-inf")))
    err = (out.double() - ref.double()).abs().max().item()
    assert err <= 2 * 2 ** -8 * ref.abs().max().item(), err  # a couple of bf16 ulps


def test_double_backward_raises_a_clear_error():
    q, k, v = (randn(1, 2, 8, 16, seed=s).requires_grad_(True) for s in range(3))
    out = scaled_dot_product_attention(q, k, v)
    with pytest.raises(attend.UnsupportedError, match="double backward"):
        torch.autograd.grad(out.sum(), (q,), create_graph=True)


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan")])
def test_dropout_p_outside_unit_interval_is_an_error(p):
    q = randn(1, 8, 2, 16)
    with pytest.raises(attend.InvalidArgumentError, match="dropout_p"):
        flash_attn_func(q, q, q, dropout_p=p)
    with pytest.raises(attend.InvalidArgumentError, match="dropout_p"):
        scaled_dot_product_attention(q, q, q, dropout_p=p)


def test_a_device_no_backend_serves_is_named():
    q = torch.empty(1, 8, 2, 16, device="meta")
    with pytest.raises(attend.InvalidArgumentError, match="q.device=meta"):
        attend.forward(q, q, q)
    if attend.torch.HAS_TORCH_LIBRARY_OPS:
        # The op's fake kernel serves meta tensors: shapes only, as torch's own ops do.
        assert flash_attn_func(q, q, q).shape == (1, 8, 2, 16)
    else:
        with pytest.raises(attend.InvalidArgumentError, match="q.device=meta"):
            flash_attn_func(q, q, q)


def test_dq_dtype_is_reachable_and_unrounded():
    q, k, v = (randn(1, 16, 2, 32, seed=s, dtype=torch.bfloat16) for s in range(3))
    out, lse = attend.forward(q, k, v, mode="training")
    dout = randn(1, 16, 2, 32, seed=5, dtype=torch.bfloat16)
    g32 = attend.backward(q, k, v, out, lse, dout, dq_dtype="f32")
    g16 = attend.backward(q, k, v, out, lse, dout)
    assert g32["dq"].dtype == torch.float32 and g16["dq"].dtype == torch.bfloat16
    assert torch.equal(g32["dq"].bfloat16(), g16["dq"])  # the same accumulator, rounded once


@pytest.mark.parametrize("paged", [False, True])
def test_flash_attn_with_kvcache_appends_in_place_and_matches(paged):
    B, H, Hk, D, S0, new = 2, 4, 2, 16, 11, 3
    keys = randn(B, S0 + new, Hk, D, seed=1)
    vals = randn(B, S0 + new, Hk, D, seed=2)
    q = randn(B, 2, H, D, seed=3)
    if paged:
        ps, pages_per_seq = 4, 5
        k_cache = torch.zeros(B * pages_per_seq, ps, Hk, D)
        v_cache = torch.zeros_like(k_cache)
        block_table = (torch.arange(B * pages_per_seq, dtype=torch.int32).view(B, pages_per_seq).flip(1))
        for b in range(B):
            for t in range(S0):
                k_cache[block_table[b, t // ps], t % ps] = keys[b, t]
                v_cache[block_table[b, t // ps], t % ps] = vals[b, t]
    else:
        block_table = None
        k_cache, v_cache = torch.zeros(B, 20, Hk, D), torch.zeros(B, 20, Hk, D)
        k_cache[:, :S0], v_cache[:, :S0] = keys[:, :S0], vals[:, :S0]
    seqlens = torch.full((B,), S0, dtype=torch.int32)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, keys[:, S0:], vals[:, S0:], cache_seqlens=seqlens,
                                       block_table=block_table, causal=True, return_softmax_lse=True)
    # The new tokens are in the cache now (FlashAttention's in-place append).
    if not paged:
        assert torch.equal(k_cache[:, S0:S0 + new], keys[:, S0:])
    sk, sq = S0 + new, 2
    keep = torch.arange(sk).view(1, sk) <= torch.arange(sq).view(sq, 1) + (sk - sq)
    bias = torch.zeros(sq, sk).masked_fill(~keep, float("-inf"))
    ref = math_attention(q.transpose(1, 2), keys.transpose(1, 2), vals.transpose(1, 2), bias=bias).transpose(1, 2)
    assert (out - ref).abs().max().item() < 1e-5
    assert lse.shape == (B, H, sq)


def test_flash_attn_with_kvcache_leftpad():
    B, H, D = 2, 2, 16
    k_cache, v_cache = randn(B, 12, H, D, seed=1), randn(B, 12, H, D, seed=2)
    q = randn(B, 1, H, D, seed=3)
    pad = torch.tensor([3, 0], dtype=torch.int32)
    lens = torch.tensor([10, 7], dtype=torch.int32)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, cache_leftpad=pad)
    for b in range(B):
        s, e = int(pad[b]), int(lens[b])
        ref = math_attention(q[b:b + 1].transpose(1, 2), k_cache[b:b + 1, s:e].transpose(1, 2),
                             v_cache[b:b + 1, s:e].transpose(1, 2)).transpose(1, 2)
        assert (out[b:b + 1] - ref).abs().max().item() < 1e-5


class Block(torch.nn.Module):
    def __init__(self, dim, heads, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        a = self.attention(q, k, v)
        x = x + self.proj(a.reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


def _math_causal(q, k, v):
    s = q.shape[1]
    bias = torch.zeros(s, s).masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
    return math_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias=bias,
                          upcast=False).transpose(1, 2)


def _train(attention, steps=5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 32), Block(32, 4, attention), Block(32, 4, attention),
                                torch.nn.Linear(32, 50))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randint(0, 50, (4, 17), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(steps):
        logits = model(data[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), data[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_two_block_transformer_trains_like_math_attention():
    ours = _train(lambda q, k, v: flash_attn_func(q, k, v, causal=True))
    ref = _train(_math_causal)
    assert ours[-1] < ours[0] - 0.05  # it learns
    for a, b in zip(ours, ref):
        assert math.isclose(a, b, rel_tol=1e-4), (ours, ref)
