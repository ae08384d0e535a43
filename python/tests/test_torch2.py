"""PyTorch 2.x only: attend against torch's own scaled_dot_product_attention
(math and CPU flash kernels), and torch.compile tracing through attend's
torch.library ops without graph breaks. Skipped on older torch."""

import pytest
import torch

import attend
import attend.torch
from attend.torch import flash_attn_func, scaled_dot_product_attention
from conftest import check_close, randn

TORCH2 = hasattr(torch.nn.functional, "scaled_dot_product_attention") and hasattr(torch.nn, "attention")
pytestmark = pytest.mark.skipif(not TORCH2, reason=f"torch {torch.__version__} has no SDPA")


def _torch_sdpa(backend, *args, **kwargs):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(getattr(SDPBackend, backend)):
        return torch.nn.functional.scaled_dot_product_attention(*args, **kwargs)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 33, 64), (1, 2, 128, 32)])
def test_matches_torch_sdpa_math_and_flash(causal, shape):
    q, k, v = (randn(*shape, seed=s).requires_grad_(True) for s in range(3))
    g = randn(*shape, seed=7)
    ours = scaled_dot_product_attention(q, k, v, is_causal=causal)
    d_ours = torch.autograd.grad(ours, (q, k, v), g)
    exact = _torch_sdpa("MATH", q.double(), k.double(), v.double(), is_causal=causal)
    d_exact = torch.autograd.grad(exact, (q, k, v), g.double())
    for backend in ("MATH", "FLASH_ATTENTION"):
        theirs = _torch_sdpa(backend, q, k, v, is_causal=causal)
        d_theirs = torch.autograd.grad(theirs, (q, k, v), g)
        # attend must be at least (about) as close to the float64 result as torch's kernel is.
        check_close(f"out vs {backend}", ours, exact, theirs, c=2.0)
        for i, (a, e, t) in enumerate(zip(d_ours, d_exact, d_theirs)):
            check_close(f"grad[{i}] vs {backend}", a, e, t, c=3.0)


def test_gqa_and_float_mask_match_torch_sdpa():
    q = randn(2, 8, 20, 32, seed=0)
    k, v = randn(2, 2, 24, 32, seed=1), randn(2, 2, 24, 16, seed=2)
    mask = randn(2, 1, 20, 24, seed=3)
    ours = scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    theirs = _torch_sdpa("MATH", q.double(), k.double(), v.double(), attn_mask=mask.double(), enable_gqa=True)
    assert (ours.double() - theirs).abs().max().item() < 1e-5


@pytest.mark.skipif(not attend.torch.HAS_TORCH_LIBRARY_OPS, reason="torch.library.custom_op needs torch >= 2.4")
def test_torch_compile_fullgraph_matches_eager():
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(32, 96)

        def forward(self, x):
            q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 4, 8).unbind(2)
            return flash_attn_func(q, k, v, causal=True).sum(-1)

    torch.manual_seed(0)
    model = Attention()
    x = torch.randn(2, 16, 32)
    eager = model(x)
    (g_eager,) = torch.autograd.grad(eager.sum(), model.qkv.weight)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # raises on any graph break
    out = compiled(x)
    (g_comp,) = torch.autograd.grad(out.sum(), model.qkv.weight)
    assert torch.allclose(out, eager, atol=1e-6) and torch.allclose(g_comp, g_eager, atol=1e-5)


@pytest.mark.skipif(not attend.torch.HAS_TORCH_LIBRARY_OPS, reason="torch.library.custom_op needs torch >= 2.4")
@pytest.mark.parametrize("api", ["sdpa_causal", "sdpa_bool_mask", "dot_product_attention", "flash_offsets"])
def test_every_surface_compiles_without_graph_breaks(api):
    calls = {
        "sdpa_causal": lambda q, k, v: scaled_dot_product_attention(q, k, v, is_causal=True),
        "sdpa_bool_mask": lambda q, k, v: scaled_dot_product_attention(
            q, k, v, attn_mask=torch.ones(16, 16, dtype=torch.bool).tril()),
        "dot_product_attention": lambda q, k, v: attend.torch.DotProductAttention(4, 8, qkv_format="bshd")(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)),
        # spec fields through **spec_fields are parsed when the op runs
        "flash_offsets": lambda q, k, v: flash_attn_func(q, k, v, causal=True, q_offset=3, kv_offset=3),
    }
    fn = calls[api]
    q, k, v = (randn(2, 4, 16, 8, seed=s).requires_grad_(True) for s in range(3))
    eager = fn(q, k, v)
    g_eager = torch.autograd.grad(eager.sum(), (q, k, v))
    torch._dynamo.reset()
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v)
    g_comp = torch.autograd.grad(out.sum(), (q, k, v))
    assert torch.equal(out, eager)
    for a, b in zip(g_comp, g_eager):
        assert torch.equal(a, b)


@pytest.mark.skipif(not attend.torch.HAS_TORCH_LIBRARY_OPS, reason="torch.library.custom_op needs torch >= 2.4")
def test_the_ops_pass_torch_library_opcheck():
    q, k, v = (randn(1, 8, 2, 16, seed=s).requires_grad_(True) for s in range(3))
    spec = attend.torch._autograd.spec_text(dict(batch=1, seqlen_q=8, seqlen_kv=8, heads_q=2, heads_kv=2,
                                                 head_dim_qk=16, head_dim_v=16, layout="bshd"))
    torch.library.opcheck(torch.ops.attend.attention_forward.default,
                          (q, k, v, None, None, None, None, None, spec, "training"))
    z = randn(2, seed=5).requires_grad_(True)
    torch.library.opcheck(torch.ops.attend.attention_forward.default,
                          (q, k, v, None, None, None, None, z, spec + ";softmax_type=learnable", "training"))


@pytest.mark.skipif(not attend.torch.HAS_TORCH_LIBRARY_OPS, reason="torch.library.custom_op needs torch >= 2.4")
@pytest.mark.parametrize("bad", [2.5, float("nan"), float("inf")])
def test_a_non_integral_int_field_reaches_the_op_as_written_and_is_refused_by_name(bad):
    # In a trace the spec is not parsed in Python: spec_text must not truncate
    # 2.5 to 2 (a silently different window), but hand it to the native parse.
    q, k, v = (randn(1, 8, 2, 16, seed=s) for s in range(3))
    spec = attend.torch._autograd.spec_text(dict(batch=1, seqlen_q=8, seqlen_kv=8, heads_q=2, heads_kv=2,
                                                 head_dim_qk=16, head_dim_v=16, layout="bshd", window_left=bad))
    assert f"window_left={bad}" in spec
    with pytest.raises(attend.InvalidArgumentError) as e:
        torch.ops.attend.attention_forward.default(q, k, v, None, None, None, None, None, spec, "inference")
    assert e.value.field == "window_left"


@pytest.mark.skipif(not attend.torch.HAS_TORCH_LIBRARY_OPS, reason="torch.library.custom_op needs torch >= 2.4")
def test_dynamic_shapes_compile_and_match_eager():
    # The ops read sizes from their tensors, so one graph serves every sequence length.
    def fn(q, k, v):
        return flash_attn_func(q, k, v, causal=True, softcap=0.5, softmax_scale=0.3)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")
    for s in (16, 24, 40):
        q, k, v = (randn(2, s, 4, 8, seed=i).requires_grad_(True) for i in range(3))
        out = compiled(q, k, v)
        eager = fn(q, k, v)
        assert torch.equal(out, eager)
        for a, b in zip(torch.autograd.grad(out.sum(), (q, k, v)), torch.autograd.grad(eager.sum(), (q, k, v))):
            assert torch.equal(a, b)


def test_sinks_compile_fullgraph_with_gradient():
    q, k, v = (randn(2, 5, 4, 16, seed=s).requires_grad_(True) for s in (40, 41, 42))
    kk, vv = k[:, :, :2].detach().requires_grad_(True), v[:, :, :2].detach().requires_grad_(True)
    z = randn(4, seed=43).requires_grad_(True)

    def fn(q, k, v, z):
        return flash_attn_func(q, k, v, causal=True, sinks=z)

    eager = fn(q, kk, vv, z)
    d_eager = torch.autograd.grad(eager.sum(), (q, kk, vv, z))
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, kk, vv, z)
    d_out = torch.autograd.grad(out.sum(), (q, kk, vv, z))
    assert torch.equal(out, eager)
    for a, b in zip(d_out, d_eager):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.skipif(not attend.torch.HAS_TORCH_LIBRARY_OPS, reason="torch.library.custom_op needs torch >= 2.4")
def test_plain_eager_calls_skip_the_op_dispatch(monkeypatch):
    # No graph being traced: plain calls run the native forward directly, for
    # inference and training alike (the op's dispatch costs ~10x a decode
    # step's kernels; training runs an autograd.Function). Calls the fast path
    # declines that need autograd still go through the op.
    calls = []
    op = attend.torch._autograd.attention_forward
    monkeypatch.setattr(attend.torch._autograd, "attention_forward", lambda *a: calls.append(1) or op(*a))
    q, k, v = (randn(2, 4, 16, 8, seed=s) for s in range(3))
    with torch.no_grad():
        direct = scaled_dot_product_attention(q, k, v, is_causal=True)
    assert calls == []
    leaf = q.clone().requires_grad_(True)
    trained = scaled_dot_product_attention(leaf, k, v, is_causal=True)
    assert calls == [] and trained.requires_grad
    (grad,) = torch.autograd.grad(trained.sum(), leaf)
    masked_leaf = q.clone().requires_grad_(True)
    masked = scaled_dot_product_attention(masked_leaf, k, v, attn_mask=torch.ones(16, 16, dtype=torch.bool).tril())
    assert calls == [1]
    (masked_grad,) = torch.autograd.grad(masked.sum(), masked_leaf)
    assert torch.allclose(direct, trained.detach(), rtol=1e-5, atol=1e-6)
    assert torch.allclose(direct, masked.detach(), rtol=1e-5, atol=1e-6)
    assert torch.allclose(grad, masked_grad, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not attend.torch.HAS_TORCH_LIBRARY_OPS, reason="torch.library.custom_op needs torch >= 2.4")
def test_inference_under_compile_still_traces_the_op():
    # Under tracing the direct call would meet fake tensors: the op stays in the graph.
    def fn(q, k, v):
        return flash_attn_func(q, k, v, causal=True)

    q, k, v = (randn(2, 16, 4, 8, seed=s) for s in range(3))
    torch._dynamo.reset()
    with torch.no_grad():
        eager = fn(q, k, v)
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v)
    assert torch.equal(compiled, eager)
