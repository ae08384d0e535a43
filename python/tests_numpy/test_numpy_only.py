"""attend without torch: numpy arrays, DLPack, explain/select, and the error
attend.torch gives. Run in a python that cannot import torch
(scripts/test-python-install.sh); the oracle is a float64 numpy attention."""

import importlib.util

import numpy as np
import pytest

import attend


def test_this_python_has_no_torch():
    assert importlib.util.find_spec("torch") is None


def test_attend_torch_says_what_is_missing():
    with pytest.raises(ImportError, match=r"attend\.torch needs PyTorch"):
        attend.torch  # noqa: B018


def reference(q, k, v, causal=False, scale=None):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * (scale or q.shape[-1] ** -0.5)
    if causal:
        sq, sk = s.shape[-2:]
        keep = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
        s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    lse = np.log(p.sum(-1)) + m[..., 0]
    return np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v), lse


def arrays(b=2, sq=13, sk=29, h=4, hk=2, d=16, dv=8, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, sq, h, d)).astype(dtype), rng.standard_normal((b, sk, hk, d)).astype(dtype),
            rng.standard_normal((b, sk, hk, dv)).astype(dtype))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_matches_float64_reference(causal, dtype):
    q, k, v = arrays(dtype=dtype)
    out, lse = attend.forward(q, k, v, causal=causal)
    ref, ref_lse = reference(q, k, v, causal)
    assert out.dtype == dtype and out.shape == ref.shape
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert np.abs(out - ref).max() < tol
    assert np.abs(lse - ref_lse).max() < tol


def test_strided_inputs_and_dlpack():
    q, k, v = arrays(d=16, dv=16)
    qs = np.ascontiguousarray(q.transpose(0, 2, 1, 3))  # (b, h, s, d): read through bhsd strides
    out, _ = attend.forward(qs.transpose(0, 2, 1, 3), k, v)
    ref, _ = reference(q, k, v)
    assert np.abs(out - ref).max() < 1e-5

    class Exporter:  # any DLPack exporter, not only numpy
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    out2, _ = attend.forward(Exporter(q), Exporter(k), Exporter(v))
    assert np.array_equal(out, out2)


def test_backward_matches_finite_differences():
    q, k, v = arrays(b=1, sq=3, sk=5, h=1, hk=1, d=4, dv=4, dtype=np.float64)
    out, lse = attend.forward(q, k, v, causal=True, mode="training")
    dout = np.random.default_rng(1).standard_normal(out.shape)
    grads = attend.backward(q, k, v, out, lse, dout, causal=True)
    eps = 1e-6
    for name, x in (("dq", q), ("dk", k), ("dv", v)):
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            x[idx] += eps
            up = (reference(q, k, v, True)[0] * dout).sum()
            x[idx] -= 2 * eps
            down = (reference(q, k, v, True)[0] * dout).sum()
            x[idx] += eps
            num[idx] = (up - down) / (2 * eps)
        assert np.abs(grads[name] - num).max() < 1e-7, name


def test_partials_merge_to_the_whole():
    q, k, v = arrays(sq=8, sk=32)
    whole, whole_lse = attend.forward(q, k, v)
    parts = [attend.forward(q, k[:, :12], v[:, :12], out_dtype="f32"),
             attend.forward(q, k[:, 12:], v[:, 12:], out_dtype="f32")]
    out, lse = attend.merge(parts)
    assert np.abs(out - whole).max() < 1e-5 and np.abs(lse - whole_lse).max() < 1e-5


def test_paged_kv_cache_matches_dense():
    q, k, v = arrays(b=2, sq=1, sk=20, h=4, hk=2, d=16, dv=16)
    cache = attend.KVCache(batch=2, heads_kv=2, head_dim_qk=16, max_seqlen=32, page_size=8)
    cache.append(k[:, :15], v[:, :15])
    cache.append(k[:, 15:], v[:, 15:])
    out, _ = cache.attend(q)
    ref, _ = reference(q, k, v)
    assert cache.length(0) == 20 and np.abs(out - ref).max() < 1e-5


def test_explain_select_and_spec_fields_without_torch():
    fields = dict(batch=1, seqlen_q=64, seqlen_kv=64, heads_q=2, heads_kv=2, head_dim_qk=32, head_dim_v=32)
    e = attend.explain(mode="training", **fields)
    assert e.selected in attend.backends()
    plan = attend.select("training", **fields)
    assert plan.backend == e.selected
    names = {f.name for f in attend.spec_fields()}
    assert {"dq_dtype", "kv_page_size", "kv_leftpad"} <= names
    with pytest.raises(attend.InvalidArgumentError, match="dropout_p"):
        attend.select("training", dropout_p=1.5, **fields)
    with pytest.raises(attend.InvalidArgumentError, match="q.dtype"):
        attend.forward(*(x.astype(np.int64) for x in arrays()))
