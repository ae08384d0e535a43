"""torch.compile with dynamic shapes (issue 36, row 2): every drop-in function
compiled with dynamic=True (and with the default, which turns dynamic on the
second shape), called with shapes that change, forward and backward, equals
eager. Sizes a call derives from its shapes (the top-left causal rewrite's
flag and window) are SymBool/SymInt there and must reach the spec as values.
PyTorch 2.4+ only (torch.library ops); skipped on older torch."""

import pytest
import torch

import attend.torch as at
from conftest import randn

pytestmark = pytest.mark.skipif(not at.HAS_TORCH_LIBRARY_OPS,
                                reason=f"torch {torch.__version__}: torch.compile traces attend from torch 2.4")


def _leaves(*shapes, seed=0):
    return [randn(*s, seed=seed + i).requires_grad_(True) for i, s in enumerate(shapes)]


def _compare(fn, shape_sets, dynamic=True, fullgraph=True, backward=True):
    """fn compiled against fn eager on each set of input shapes, bit for bit."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=fullgraph, dynamic=dynamic, backend="aot_eager")
    for n, shapes in enumerate(shape_sets):
        args = _leaves(*shapes, seed=10 * n)
        eager = fn(*args)
        out = compiled(*args)
        assert torch.equal(out, eager), f"forward differs at shapes {shapes}"
        if backward:
            g_eager = torch.autograd.grad(eager.sum(), args)
            g_comp = torch.autograd.grad(out.sum(), args)
            for i, (a, b) in enumerate(zip(g_comp, g_eager)):
                assert torch.equal(a, b), f"grad {i} differs at shapes {shapes}"


@pytest.mark.parametrize("dynamic", [True, None])
def test_sdpa_causal_with_changing_lengths(dynamic):
    # The reproduction: is_causal=True raised "causal=True: expected true or false".
    _compare(lambda q: at.scaled_dot_product_attention(q, q, q, is_causal=True),
             [[(1, 2, 5, 16)], [(1, 2, 9, 16)], [(1, 2, 12, 16)]], dynamic=dynamic)


def test_sdpa_top_left_causal_with_fewer_queries_than_keys():
    # L != S: the top-left mask is rewritten over a prefix of the keys whose
    # length, flag and window come from the (symbolic) sizes.
    _compare(lambda q, k, v: at.scaled_dot_product_attention(q, k, v, is_causal=True),
             [[(1, 2, 4, 16), (1, 2, 7, 16), (1, 2, 7, 16)], [(1, 2, 6, 16), (1, 2, 11, 16), (1, 2, 11, 16)],
              [(1, 2, 9, 16), (1, 2, 9, 16), (1, 2, 9, 16)]])


def test_flash_attn_func_with_changing_lengths_and_batch():
    _compare(lambda q, k, v: at.flash_attn_func(q, k, v, causal=True, window_size=(3, 0)),
             [[(2, 5, 4, 8), (2, 7, 2, 8), (2, 7, 2, 8)], [(3, 9, 4, 8), (3, 12, 2, 8), (3, 12, 2, 8)]])


def test_flash_attn_varlen_func_with_changing_token_counts():
    def fn(q, k, v):
        n = q.shape[0]
        cu = torch.tensor([0, 3, n], dtype=torch.int32)
        return at.flash_attn_varlen_func(q, k, v, cu, cu, n - 3, n - 3, causal=True)

    _compare(fn, [[(8, 2, 16)] * 3, [(11, 2, 16)] * 3, [(14, 2, 16)] * 3], fullgraph=False)


def test_dot_product_attention_module_with_changing_lengths():
    module = at.DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="causal")
    _compare(lambda q, k, v: module(q, k, v), [[(2, 5, 2, 16)] * 3, [(2, 8, 2, 16)] * 3, [(2, 13, 2, 16)] * 3])


def test_flash_attn_with_kvcache_with_changing_lengths():
    def fn(q, kc, vc, k, v):
        return at.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, cache_seqlens=2, causal=True)

    torch._dynamo.reset()
    compiled = torch.compile(fn, dynamic=True, backend="aot_eager")
    for n, (sq, cache) in enumerate(((1, 8), (3, 12), (2, 16))):
        q = randn(2, sq, 4, 16, seed=n)
        kc, vc = randn(2, cache, 2, 16, seed=n + 1), randn(2, cache, 2, 16, seed=n + 2)
        k, v = randn(2, sq, 2, 16, seed=n + 3), randn(2, sq, 2, 16, seed=n + 4)
        kc2, vc2 = kc.clone(), vc.clone()
        eager = fn(q, kc, vc, k, v)
        out = compiled(q, kc2, vc2, k, v)
        assert torch.equal(out, eager)
        assert torch.equal(kc2, kc) and torch.equal(vc2, vc)  # the appends landed alike
