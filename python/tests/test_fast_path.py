"""The eager inference fast path (attend._autograd.fast_call) is only a
faster route: the same outputs bit for bit as the general path, the policy in
force applied on every call, and every call it does not take (other ranks,
strides, dtypes, masks, errors) left to the general path unchanged."""

import pytest
import torch

import attend
import attend.torch as at
from attend import _autograd
from conftest import randn


@pytest.fixture
def general_only(monkeypatch):
    """Runs a function with the fast path switched off (the general path alone)."""
    def run(fn, *args, **kwargs):
        with monkeypatch.context() as m:
            m.setattr(_autograd, "fast_call", lambda *a, **k: None)
            return fn(*args, **kwargs)
    return run


@pytest.fixture
def spec_builds(monkeypatch):
    """Counts the general path's problem builds (each fast-path signature needs one)."""
    _autograd._SIZED.clear()  # signatures earlier tests left are built already
    calls = []
    for name in ("_sdpa_problem", "_flash_problem"):
        original = getattr(at, name)
        monkeypatch.setattr(at, name, lambda *a, _f=original, **k: calls.append(1) or _f(*a, **k))
    return calls


def bhsd(b, h, hk, sq, sk, d, dv, dtype, seed=0):
    return (randn(b, h, sq, d, seed=seed, dtype=dtype), randn(b, hk, sk, d, seed=seed + 1, dtype=dtype),
            randn(b, hk, sk, dv, seed=seed + 2, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("hk,causal,scale", [(8, False, None), (2, False, 0.3), (1, True, None)])
def test_sdpa_fast_path_equals_the_general_path(dtype, hk, causal, scale, general_only, spec_builds):
    with torch.no_grad():
        for sk in (37, 38, 300):  # a decode loop: the key count changes every call
            q, k, v = bhsd(2, 8, hk, sk if causal else 1, sk, 64, 48, dtype, seed=sk)
            kw = dict(is_causal=causal, scale=scale, enable_gqa=hk not in (1, 8))
            fast = at.scaled_dot_product_attention(q, k, v, **kw)
            assert at.last_selection().mode == "inference"
            general = general_only(at.scaled_dot_product_attention, q, k, v, **kw)
            assert fast.dtype == dtype and fast.shape == general.shape
            assert torch.equal(fast, general)
    # One build for the signature (the general path's own spec), none per size.
    assert len(spec_builds) == 1 + 3


def test_flash_fast_path_equals_the_general_path_on_strided_views(general_only, spec_builds):
    # A preallocated KV cache read up to its current length: strided views, read in place.
    cache_k, cache_v = randn(2, 64, 2, 32, seed=1), randn(2, 64, 2, 32, seed=2)
    kw = dict(causal=True, window_size=(16, 0), softcap=30.0, softmax_scale=0.2)
    with torch.no_grad():
        for n in (5, 6, 40):
            q = randn(2, 1, 4, 32, seed=n)
            k, v = cache_k[:, :n], cache_v[:, :n]
            assert not k.is_contiguous()
            fast = at.flash_attn_func(q, k, v, **kw)
            assert torch.equal(fast, general_only(at.flash_attn_func, q, k, v, **kw))
            # bhsd views of bshd memory through SDPA: strides, not copies
            fast = at.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   enable_gqa=True)
            general = general_only(at.scaled_dot_product_attention, q.transpose(1, 2), k.transpose(1, 2),
                                   v.transpose(1, 2), enable_gqa=True)
            assert torch.equal(fast, general)
    assert len(spec_builds) == 2 + 3 + 3


def test_each_fast_call_selects_under_the_policy_in_force(restore_policy):
    q, k, v = bhsd(1, 4, 4, 1, 50, 32, 32, torch.float32)
    with torch.no_grad():
        outs = {}
        for backend in ("reference", "flash", "decode"):
            with attend.policy(force=backend):
                outs[backend] = at.scaled_dot_product_attention(q, k, v)
                assert at.last_selection().selected == backend
                assert at.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)) is not None
                assert at.last_selection().selected == backend
        with attend.policy(disable="decode,flash"):
            at.scaled_dot_product_attention(q, k, v)
            assert at.last_selection().selected == "reference"
    assert torch.allclose(outs["flash"], outs["reference"], atol=1e-5)
    assert torch.allclose(outs["decode"], outs["reference"], atol=1e-5)


def test_calls_the_fast_path_declines_keep_the_general_paths_results_and_errors(general_only):
    q, k, v = bhsd(1, 4, 4, 6, 9, 16, 16, torch.float32)
    with torch.no_grad():
        cases = [
            ((q[0], k[0], v[0]), {}),  # 3-D
            ((q, k, v), dict(is_causal=True)),  # top-left causal, L != S: keys sliced
            ((q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v), {}),  # last dim not contiguous: copied
            ((torch._neg_view(q), k, v), {}),  # a negative-bit view: its memory holds q, not -q
            ((q[:0], k[:0], v[:0]), {}),  # empty batch
        ]
        for args, kw in cases:
            assert torch.equal(at.scaled_dot_product_attention(*args, **kw),
                               general_only(at.scaled_dot_product_attention, *args, **kw))
    bad = [
        ((q, k[..., :8], v), attend.ShapeMismatchError, "key.shape"),
        ((q, k.double(), v.double()), attend.AttendError, "dtype"),
        ((q, k[:, :3], v[:, :3]), attend.ShapeMismatchError, "key.heads"),
        ((q.int(), k.int(), v.int()), attend.InvalidArgumentError, "query.dtype"),
    ]
    for args, error, match in bad:
        with pytest.raises(error, match=match) as fast_error:
            at.scaled_dot_product_attention(*args)
        with pytest.raises(error) as general_error:
            general_only(at.scaled_dot_product_attention, *args)
        assert str(fast_error.value) == str(general_error.value)
    qb, kb, vb = (t.transpose(1, 2) for t in bhsd(1, 6, 4, 3, 5, 16, 16, torch.float32))
    with pytest.raises(attend.AttendError) as fast_error:  # 6 heads over 4 kv heads: the runtime says so
        at.flash_attn_func(qb, kb, vb)
    with pytest.raises(attend.AttendError) as general_error:
        general_only(at.flash_attn_func, qb, kb, vb)
    assert str(fast_error.value) == str(general_error.value) and "heads" in str(fast_error.value)


def test_grad_mode_decides_the_mode_and_autocast_takes_the_general_path(spec_builds):
    q, k, v = bhsd(1, 2, 2, 4, 4, 8, 8, torch.float32)
    q.requires_grad_(True)
    out = at.scaled_dot_product_attention(q, k, v)
    assert out.requires_grad and at.last_selection().mode == "training"
    with torch.no_grad():
        assert not at.scaled_dot_product_attention(q, k, v).requires_grad
        assert at.last_selection().mode == "inference"
    assert len(spec_builds) == 1  # one signature for both modes
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert at.scaled_dot_product_attention(q, k, v).dtype == torch.bfloat16
    assert len(spec_builds) == 2


@pytest.mark.parametrize("api", ["sdpa", "flash"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_fast_path_equals_the_general_path(api, dtype, general_only, spec_builds):
    fn = at.scaled_dot_product_attention if api == "sdpa" else at.flash_attn_func
    kw = dict(is_causal=True, enable_gqa=True) if api == "sdpa" else dict(causal=True, window_size=(7, 0))
    for sq in (9, 30):
        q, k, v = bhsd(2, 4, 2, sq, sq, 16, 24, dtype, seed=sq)
        if api == "flash":
            q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        grad_out = randn(*q.shape[:-1], 24, seed=7, dtype=dtype)

        def run(*args):
            leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
            out = fn(*leaves, **kw)
            return (out,) + torch.autograd.grad(out, leaves, grad_out)

        fast = run()
        assert at.last_selection().mode == "training"
        general = general_only(run)
        for name, a, b in zip(("out", "dq", "dk", "dv"), fast, general):
            assert a.dtype == b.dtype and torch.equal(a, b), name
    assert len(spec_builds) == 1 + 2


def test_training_fast_path_keeps_autograds_checks_and_hooks():
    q, k, v = (t.requires_grad_(True) for t in bhsd(1, 2, 2, 5, 5, 8, 8, torch.float32))
    out = at.scaled_dot_product_attention(q, k, v)
    with torch.no_grad():
        k.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    out = at.scaled_dot_product_attention(q, k, v)
    (dq,) = torch.autograd.grad(out.sum(), q, create_graph=False)
    with pytest.raises(attend.UnsupportedError, match="double backward"):
        torch.autograd.grad(at.scaled_dot_product_attention(q, k, v).sum(), q, create_graph=True)
    # Saved-tensor hooks see what backward reads, and what they hand back is what it reads.
    packed = []

    def pack(t):
        packed.append(t.shape)
        return t.clone()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        hooked = at.scaled_dot_product_attention(q, k, v)
    assert (1, 2, 5) in packed  # the LSE
    (hooked_dq,) = torch.autograd.grad(hooked.sum(), q)
    assert torch.equal(hooked_dq, dq)
