"""8-bit K/V (int8, float8_e4m3fn, float8_e5m2 codes with f32 scales) through attend.torch.

Outputs are checked with conftest.check_close against a float64 reference on
the dequantized values (code * scale): attend's error is at most twice that of
a naive same-precision torch implementation on the same values, plus the
rounding floor. The torch quantization that appends use is compared bit for
bit with attend's own (the native kv8_code). float8 needs torch >= 2.1: those
cases skip on Debian's torch 1.13, int8 runs everywhere. The transformers cases
(QuantizedKVCache) skip where transformers 5 is absent.
"""

import importlib.util
import os
import warnings

import pytest
import torch

import attend
import attend.torch as at
from attend import _C, _kv8
from attend.errors import InvalidArgumentError, ShapeMismatchError, UnsupportedError
from conftest import check_close, math_attention, randn

FP8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
needs_fp8 = pytest.mark.skipif(not FP8, reason=f"torch {torch.__version__} has no float8 dtypes")


def kv_dtypes():
    """int8 always; the float8 dtypes as skipped cases where torch lacks them."""
    out = [torch.int8]
    for n in ("float8_e4m3fn", "float8_e5m2"):
        out.append(getattr(torch, n) if hasattr(torch, n) else pytest.param(n, marks=needs_fp8))
    return out


def codes_of(x, dtype):
    """attend's own codes of float32 x, as a uint8 tensor of x's shape."""
    raw = _C.kv8_codes(_kv8.name(dtype), x.float().flatten().tolist())
    return torch.tensor(list(raw), dtype=torch.uint8).reshape(x.shape)


def bits(t):
    return t.view(torch.uint8)


# --- quantization: torch ops == attend's kv8_code ------------------------------------------------

def _probe_values(dtype):
    """Values that probe rounding: ties, subnormals, saturation, and a log-uniform spread."""
    m = _kv8.code_max(dtype)
    g = torch.Generator().manual_seed(5)
    ties = torch.arange(-130, 131, dtype=torch.float32) + 0.5
    magnitude = torch.exp(torch.empty(4000).uniform_(-25.0, 12.0, generator=g))
    spread = magnitude * torch.sign(torch.randn(4000, generator=g))
    edge = torch.tensor([0.0, -0.0, m, -m, m * 1.01, -m * 1.04, m * 4, 1e30, -1e30, 2 ** -9, 2 ** -10, 3 * 2 ** -11,
                         2 ** -16, 2 ** -17, 3 * 2 ** -18, 1e-30])
    if dtype != torch.int8:
        # Midpoints between neighbouring codes (the exact ties of RNE), from the code table.
        values = torch.tensor([_C.kv8_value(_kv8.name(dtype), c) for c in range(256)])
        values = values[torch.isfinite(values)].unique()
        ties = torch.cat([ties, (values[1:] + values[:-1]) / 2])
    return torch.cat([ties, spread, edge]).float()


@pytest.mark.parametrize("dtype", kv_dtypes())
def test_torch_quantization_equals_attends_codes(dtype):
    x = _probe_values(dtype)
    got = _kv8.quantize(x, 1.0, dtype)
    want = codes_of(x, dtype)
    bad = (bits(got) != want).nonzero().flatten()
    assert bad.numel() == 0, [(x[i].item(), int(bits(got)[i]), int(want[i])) for i in bad[:8]]
    # Scaled: x / scale rounds in float32 first, as natively.
    scale = torch.tensor(0.37)
    assert torch.equal(bits(_kv8.quantize(x, scale, dtype)), codes_of(x / scale, dtype))


@pytest.mark.parametrize("dtype", kv_dtypes())
def test_code_values_equal_attends(dtype):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)
    got = codes.float()
    want = torch.tensor([_C.kv8_value(_kv8.name(dtype), c) for c in range(256)])
    finite = torch.isfinite(want)
    assert torch.equal(got[finite], want[finite])


# --- flash_attn_func over 8-bit K/V -----------------------------------------------------------

def quantized(x, dtype, layout):
    """(codes, descale, dequantized f32) of x (B, S, H, D) in a descale layout."""
    B, S, H, _ = x.shape
    if layout == "per_token":
        s = _kv8.token_scales(x, dtype)
        codes = _kv8.quantize(x, s.unsqueeze(-1), dtype)
        return codes, s, _kv8.dequantize(codes, s.unsqueeze(-1))
    if layout == "per_head":
        s = _kv8.head_scales(x, dtype, (1, 3))
        codes = _kv8.quantize(x, s[:, None, :, None], dtype)
        return codes, s, _kv8.dequantize(codes, s[:, None, :, None])
    if layout == "none":
        codes = _kv8.quantize(x * (_kv8.code_max(dtype) / 4), 1.0, dtype)
        return codes, None, codes.float()
    value = float(2 * x.abs().max() / _kv8.code_max(dtype))
    codes = _kv8.quantize(x, value, dtype)
    given = {"float": value, "0-d": torch.tensor(value), "(1,)": torch.tensor([value])}[layout]
    return codes, given, _kv8.dequantize(codes, value)


def reference(q, kd, vd, causal=False, scale=None):
    """(float64 reference, naive same-precision torch) of (B, S, H, D) tensors."""
    t = (lambda x: x.transpose(1, 2))
    S, Sk = q.shape[1], kd.shape[1]
    bias = None
    if causal:
        keep = torch.ones(S, Sk, dtype=torch.bool).tril(Sk - S)
        bias = torch.zeros(S, Sk).masked_fill(~keep, float("-inf"))
    ref = math_attention(t(q.double()), t(kd.double()), t(vd.double()), scale, bias, upcast=True)
    pt = math_attention(t(q), t(kd.to(q.dtype)), t(vd.to(q.dtype)), scale,
                        None if bias is None else bias.to(q.dtype), upcast=False, reorder=True)
    return t(ref), t(pt)


LAYOUTS = ["none", "float", "0-d", "(1,)", "per_head", "per_token"]


@pytest.mark.parametrize("dtype", kv_dtypes())
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("qdtype", [torch.float32, torch.bfloat16])
def test_flash_attn_func_reads_8bit_kv(dtype, layout, qdtype):
    B, Sq, Sk, H, Hk, D = 2, 5, 67, 4, 2, 32
    q = randn(B, Sq, H, D, seed=1).to(qdtype)
    kc, ks, kd = quantized(randn(B, Sk, Hk, D, seed=2), dtype, layout)
    vc, vs, vd = quantized(randn(B, Sk, Hk, D, seed=3), dtype, layout)
    out = at.flash_attn_func(q, kc, vc, causal=True, k_descale=ks, v_descale=vs)
    assert out.dtype == qdtype and out.shape == (B, Sq, H, D)
    ref, pt = reference(q, kd, vd, causal=True)
    check_close(f"{dtype}/{layout}/{qdtype}", out, ref, pt)


@needs_fp8
def test_one_descale_alone_reads_the_other_as_ones():
    q = randn(1, 3, 2, 16, seed=1)
    kc, ks, kd = quantized(randn(1, 9, 2, 16, seed=2), torch.float8_e4m3fn, "per_head")
    vc = _kv8.quantize(randn(1, 9, 2, 16, seed=3), 1.0, torch.float8_e4m3fn)
    out = at.flash_attn_func(q, kc, vc, k_descale=ks)
    ref, pt = reference(q, kd, vc.float())
    check_close("k_descale only", out, ref, pt)


def test_return_attn_probs_gives_the_lse():
    q = randn(1, 4, 2, 16, seed=1)
    kc, ks, kd = quantized(randn(1, 11, 2, 16, seed=2), torch.int8, "per_token")
    vc, vs, vd = quantized(randn(1, 11, 2, 16, seed=3), torch.int8, "per_token")
    out, lse, s = at.flash_attn_func(q, kc, vc, k_descale=ks, v_descale=vs, return_attn_probs=True)
    out_f, lse_f, _ = at.flash_attn_func(q, kd, vd, return_attn_probs=True)
    assert s.numel() == 0 and lse.shape == (1, 2, 4)
    assert torch.allclose(lse, lse_f, atol=1e-5) and torch.allclose(out, out_f, atol=1e-5)


def varlen_quantized(x, lens, dtype, layout):
    """(codes, descale, dequantized f32) of x (total, H, D) holding sequences of `lens` tokens."""
    if layout == "per_head":  # (B, H): each sequence's own scales
        parts = torch.split(x, lens)
        s = torch.stack([_kv8.head_scales(p, dtype, (0, 2)) for p in parts])
        per_row = torch.cat([s[b].expand(n, -1) for b, n in enumerate(lens)])[..., None]
        codes = _kv8.quantize(x, per_row, dtype)
        return codes, s, _kv8.dequantize(codes, per_row)
    codes, d, deq = quantized(x[None], dtype, layout)
    return codes[0], d[0] if layout == "per_token" else d, deq[0]


@pytest.mark.parametrize("dtype", kv_dtypes())
@pytest.mark.parametrize("layout", ["float", "per_head", "per_token"])
@pytest.mark.parametrize("qdtype", [torch.float32, torch.bfloat16])
def test_flash_attn_varlen_func_reads_8bit_kv(dtype, layout, qdtype):
    lens_q, lens_k, H, Hk, D = [5, 2, 0, 4], [40, 7, 3, 19], 4, 2, 32
    cu_q = torch.tensor([0] + lens_q, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu_k = torch.tensor([0] + lens_k, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    q = randn(sum(lens_q), H, D, seed=1).to(qdtype)
    kc, ks, kd = varlen_quantized(randn(sum(lens_k), Hk, D, seed=2), lens_k, dtype, layout)
    vc, vs, vd = varlen_quantized(randn(sum(lens_k), Hk, D, seed=3), lens_k, dtype, layout)
    if layout == "per_head":
        assert ks.shape == (4, Hk)
    out = at.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, k_descale=ks,
                                    v_descale=vs)
    assert out.dtype == qdtype and out.shape == (sum(lens_q), H, D)
    refs, pts = [], []
    for b in range(4):
        qs, ks_ = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        ref, pt = reference(q[qs][None], kd[ks_][None], vd[ks_][None], causal=True)
        refs.append(ref[0])
        pts.append(pt[0])
    check_close(f"varlen {dtype}/{layout}/{qdtype}", out, torch.cat(refs), torch.cat(pts))


def test_varlen_descales_of_one_shape_for_both_layouts_are_per_head():
    """As many key tokens as sequences: (B, Hk) is also (total_k, Hk). It is
    read as FA3's per (sequence, kv head) descale."""
    cu_q, cu_k = torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([0, 0, 2], dtype=torch.int32)
    q = randn(5, 2, 16, seed=1)
    kc = _kv8.quantize(randn(2, 1, 16, seed=2), 0.05, torch.int8)
    vc = _kv8.quantize(randn(2, 1, 16, seed=3), 0.05, torch.int8)
    ks = torch.tensor([[0.02], [0.03]])  # sequence 0 has no keys: only 0.03 (sequence 1's) may act
    out = at.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 3, 2, k_descale=ks, v_descale=ks)
    ref, pt = reference(q[None, 3:], (kc.float() * 0.03)[None], (vc.float() * 0.03)[None])
    assert torch.equal(out[:3], torch.zeros_like(out[:3]))
    check_close("per_head reading", out[3:], ref[0], pt[0])


def test_varlen_8bit_kv_refuses_bad_descales_and_training():
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    q = randn(8, 2, 16, seed=1)
    kc = _kv8.quantize(randn(8, 2, 16, seed=2), 0.05, torch.int8)
    with pytest.raises(ShapeMismatchError, match="k_descale.shape"):
        at.flash_attn_varlen_func(q, kc, kc, cu, cu, 5, 5, k_descale=torch.ones(3, 2))
    with pytest.raises(InvalidArgumentError, match="v.dtype"):
        at.flash_attn_varlen_func(q, kc, kc.float(), cu, cu, 5, 5, k_descale=0.05)
    with pytest.raises(UnsupportedError, match="inference only"):
        at.flash_attn_varlen_func(q.requires_grad_(), kc, kc, cu, cu, 5, 5, k_descale=0.05, v_descale=0.05)


def test_explain_describes_the_8bit_call():
    """explain() sees what the call would run: 8-bit K/V with their scale
    layout, selected for inference, refused for training with the kv_dtype
    reason (it described an f32 K/V call before)."""
    q = randn(1, 4, 2, 16, seed=1)
    kc = _kv8.quantize(randn(1, 9, 2, 16, seed=2), 0.05, torch.int8)
    e = at.explain(q, kc, kc, api="flash_attn", k_descale=0.05, v_descale=0.05)
    assert "kv=i8/per_tensor" in str(e) and e.selected is not None, str(e)
    cu_q, cu_k = torch.tensor([0, 4], dtype=torch.int32), torch.tensor([0, 9], dtype=torch.int32)
    e = at.explain(q[0], kc[0], kc[0], cu_q, cu_k, 4, 9, api="flash_attn_varlen", k_descale=torch.full((1, 2), 0.05))
    assert "kv=i8/per_head" in str(e) and e.selected is not None, str(e)
    e = at.explain(q, kc, kc, api="flash_attn", k_descale=0.05, mode="training")
    assert e.selected is None and "kv_dtype=i8: an 8-bit K/V cache is forward only" in str(e), str(e)


# --- flash_attn_with_kvcache: 8-bit caches, appends quantized by torch ----------------------------

def _cache(paged, dtype, layout, B=2, Hk=2, D=32, cap=48, ps=16):
    """(k_cache, v_cache, k_descale, v_descale, block_table) of an empty cache."""
    if paged:
        pages = B * cap // ps + 1
        shape = (pages, ps, Hk, D)
        # Sequences own interleaved, reversed pages (page 0 unused): a table, not an identity.
        table = torch.arange(1, pages, dtype=torch.int32).reshape(-1, B).t().flip(1).contiguous()
    else:
        shape, table = (B, cap, Hk, D), None
    k_cache = torch.zeros(shape, dtype=dtype)
    v_cache = torch.zeros(shape, dtype=dtype)
    if layout == "per_token":
        ks, vs = torch.ones(shape[:3]), torch.ones(shape[:3])
    elif layout == "per_head":
        ks, vs = torch.rand(B, Hk) * 0.02 + 0.01, torch.rand(B, Hk) * 0.02 + 0.01
    elif layout == "per_tensor":
        ks, vs = torch.tensor([0.03]), torch.tensor([0.025])
    else:
        ks = vs = None
    return k_cache, v_cache, ks, vs, table


def _gather(cache, table, b, n):
    """Sequence b's first n tokens of a dense or paged cache (or per-token scales)."""
    if table is None:
        return cache[b, :n]
    return torch.cat([cache[p] for p in table[b].long()])[:n]


def _dequantized(k_cache, ks, table, layout, b, n):
    codes = _gather(k_cache, table, b, n).float()
    if layout == "per_token":
        return codes * _gather(ks, table, b, n).unsqueeze(-1)
    if layout == "per_head":
        return codes * ks[b][None, :, None]
    if layout == "per_tensor":
        return codes * ks
    return codes


def _expected_codes(x, layout, scale, dtype, b):
    if layout == "per_token":
        s = _kv8.token_scales(x, dtype).unsqueeze(-1)
    elif layout == "per_head":
        s = scale[b][None, :, None]
    elif layout == "per_tensor":
        s = scale
    else:
        s = torch.tensor(1.0)
    return codes_of(x.float() / s, dtype)


@pytest.mark.parametrize("dtype", kv_dtypes())
@pytest.mark.parametrize("layout", ["none", "per_tensor", "per_head", "per_token"])
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_kvcache_appends_quantize_and_attend(dtype, layout, paged):
    B, H, Hk, D = 2, 4, 2, 32
    k_cache, v_cache, ks, vs, table = _cache(paged, dtype, layout)
    lens = [0, 0]
    outs, refs, pts = [], [], []  # one check over every step: a single decode row's naive error is noise
    for step, new in enumerate((13, 1, 1, 5)):
        q = randn(B, new, H, D, seed=10 + step)
        # Scale 1 (none): values a few codes wide, not all rounded to 0 or 1.
        k = randn(B, new, Hk, D, seed=20 + step) * (4 if layout == "none" else 1)
        v = randn(B, new, Hk, D, seed=30 + step) * (4 if layout == "none" else 1)
        seqlens = torch.tensor(lens, dtype=torch.int32)
        out = at.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, block_table=table,
                                         causal=True, k_descale=ks, v_descale=vs)
        lens = [n + new for n in lens]
        for b in range(B):
            n = lens[b]
            new_codes = _gather(k_cache, table, b, n)[n - new:]
            assert torch.equal(bits(new_codes), _expected_codes(k[b], layout, ks, dtype, b)), f"step {step} b {b}"
            if layout == "per_token":
                assert torch.equal(_gather(ks, table, b, n)[n - new:], _kv8.token_scales(k[b], dtype))
            kd = _dequantized(k_cache, ks, table, layout, b, n)
            vd = _dequantized(v_cache, vs, table, layout, b, n)
            ref, pt = reference(q[b:b + 1], kd[None], vd[None], causal=True)
            outs.append(out[b:b + 1].flatten())
            refs.append(ref.flatten())
            pts.append(pt.flatten())
    check_close(f"{dtype}/{layout}", torch.cat(outs), torch.cat(refs), torch.cat(pts))


def test_kvcache_without_append_and_with_leftpad():
    dtype = torch.int8
    k_cache, v_cache, ks, vs, _ = _cache(False, dtype, "per_token", cap=24)
    k, v = randn(2, 24, 2, 32, seed=1), randn(2, 24, 2, 32, seed=2)
    k_cache[:], ks[:] = _kv8.quantize(k, _kv8.token_scales(k, dtype).unsqueeze(-1), dtype), _kv8.token_scales(k, dtype)
    v_cache[:], vs[:] = _kv8.quantize(v, _kv8.token_scales(v, dtype).unsqueeze(-1), dtype), _kv8.token_scales(v, dtype)
    ks[0, :3] = float("nan")  # padding: never read, so never checked
    q = randn(2, 1, 4, 32, seed=3)
    pad = torch.tensor([3, 0], dtype=torch.int32)
    out = at.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=20, cache_leftpad=pad, k_descale=ks,
                                     v_descale=vs)
    refs, pts = [], []
    for b in range(2):
        p = int(pad[b])
        kd = k_cache[b, p:20].float() * ks[b, p:20, :, None]
        vd = v_cache[b, p:20].float() * vs[b, p:20, :, None]
        ref, pt = reference(q[b:b + 1], kd[None], vd[None])
        refs.append(ref)
        pts.append(pt)
    check_close("leftpad", out, torch.cat(refs), torch.cat(pts))


def test_kvcache_matches_attends_own_quantizing_cache():
    """attend.KVCache (native quantizing appends) and flash_attn_with_kvcache
    (torch quantization) store the same codes and scales: equal outputs."""
    B, H, Hk, D = 2, 4, 2, 32
    native = attend.KVCache(batch=B, heads_kv=Hk, head_dim_qk=D, max_seqlen=32, page_size=8, kv_dtype="i8")
    assert (native.kv_dtype, native.kv_scale, native.dtype) == ("i8", "per_token", "f32")
    k_cache, v_cache, ks, vs, table = _cache(True, torch.int8, "per_token", B=B, Hk=Hk, D=D, cap=32, ps=8)
    lens = torch.zeros(B, dtype=torch.int32)
    for step, new in enumerate((9, 1, 3)):
        k, v, q = randn(B, new, Hk, D, seed=step), randn(B, new, Hk, D, seed=50 + step), randn(B, 1, H, D, seed=99)
        native.append(k, v)
        out = at.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, block_table=table,
                                         k_descale=ks, v_descale=vs)
        lens += new
        want, _ = native.attend(q)
        assert torch.allclose(out, want, rtol=0, atol=1e-6), (out - want).abs().max()
    scales = native.k_scales()
    assert scales.shape[1:] == (8, Hk) and scales.dtype.name == "float32"


def test_native_kvcache_per_head_scales_can_be_set():
    c = attend.KVCache(batch=1, heads_kv=2, head_dim_qk=16, max_seqlen=16, page_size=8, kv_dtype="i8",
                       kv_scale="per_head")
    c.set_scales(0, [0.5, 0.25], [1.0, 2.0])
    assert c.k_scales().tolist() == [[0.5, 0.25]] and c.v_scales().tolist() == [[1.0, 2.0]]
    with pytest.raises(InvalidArgumentError) as e:
        c.set_scales(0, [0.5, 0.0], [1.0, 2.0])
    assert "k_scale" in e.value.field
    assert attend.KVCache(batch=1, heads_kv=1, head_dim_qk=16, max_seqlen=8).k_scales() is None


# --- refusals ---------------------------------------------------------------------------------

def _small(dtype=torch.int8):
    q = randn(1, 2, 2, 16, seed=1)
    kc, ks, _ = quantized(randn(1, 7, 2, 16, seed=2), dtype, "per_token")
    vc, vs, _ = quantized(randn(1, 7, 2, 16, seed=3), dtype, "per_token")
    return q, kc, vc, ks, vs


@pytest.mark.parametrize("bad", [float("nan"), 0.0, -1.0, float("inf")])
def test_bad_scale_values_are_refused_by_name(bad):
    q, kc, vc, ks, vs = _small()
    vs[0, 3, 1] = bad
    with pytest.raises(InvalidArgumentError) as e:
        at.flash_attn_func(q, kc, vc, k_descale=ks, v_descale=vs)
    assert e.value.field == "v_scale[0][3][1]", e.value
    with pytest.raises(InvalidArgumentError) as e:
        at.flash_attn_func(q, kc, vc, k_descale=bad, v_descale=1.0)
    assert e.value.field.startswith("k_scale"), e.value


def test_bad_descale_shapes_and_dtypes_are_refused_by_name():
    q, kc, vc, ks, vs = _small()
    cases = [
        (dict(k_descale=ks[:, :5], v_descale=vs), ShapeMismatchError, "k_descale.shape"),
        (dict(k_descale=ks, v_descale=torch.ones(2)), ShapeMismatchError, "v_descale.shape"),
        (dict(k_descale=ks, v_descale=torch.ones(1, 2)), ShapeMismatchError, "v_descale.shape"),  # per_head vs token
        (dict(k_descale=ks.double(), v_descale=vs), InvalidArgumentError, "k_descale.dtype"),
        (dict(k_descale="x", v_descale=vs), InvalidArgumentError, "k_descale"),
    ]
    for kwargs, cls, field in cases:
        with pytest.raises(cls) as e:
            at.flash_attn_func(q, kc, vc, **kwargs)
        assert e.value.field == field, (field, e.value)


def test_mismatched_or_unscaled_dtypes_are_refused():
    q, kc, vc, ks, vs = _small()
    with pytest.raises(InvalidArgumentError) as e:
        at.flash_attn_func(q, kc, vc.float(), k_descale=ks, v_descale=vs)
    assert e.value.field == "v.dtype"
    with pytest.raises(InvalidArgumentError) as e:
        at.flash_attn_func(q, kc.float(), kc.float(), k_descale=ks)
    assert e.value.field == "k_descale"
    with pytest.raises(InvalidArgumentError) as e:
        at.flash_attn_func(q, kc.float(), vc)
    assert e.value.field == "k.dtype"


def test_8bit_kv_is_inference_only():
    q, kc, vc, ks, vs = _small()
    q.requires_grad_(True)
    with pytest.raises(UnsupportedError) as e:
        at.flash_attn_func(q, kc, vc, k_descale=ks, v_descale=vs)
    assert e.value.field == "kv_dtype"
    assert str(e.value).endswith("or detach q"), e.value
    # The advice names what asks for the gradient, as the caller called it.
    with pytest.raises(UnsupportedError) as e:
        at.flash_attn_func(q.detach(), kc, vc, k_descale=ks.clone().requires_grad_(True), v_descale=vs)
    assert str(e.value).endswith("or detach k_descale"), e.value
    with torch.no_grad():
        at.flash_attn_func(q, kc, vc, k_descale=ks, v_descale=vs)
    # Selection for training names the reason: no backend has an 8-bit backward.
    with pytest.raises(UnsupportedError) as e:
        attend.select("training", batch=1, seqlen_q=2, seqlen_kv=7, heads_q=2, heads_kv=2, head_dim_qk=16,
                      head_dim_v=16, kv_dtype="i8", kv_scale="per_token")
    assert "kv_dtype" in str(e.value)


def _snapshot(*tensors):
    return [t.clone() for t in tensors]


def _unchanged(before, *tensors):
    return all(torch.equal(bits(a) if a.dtype in _kv8.KV8 else a, bits(b) if b.dtype in _kv8.KV8 else b)
               for a, b in zip(before, tensors))


@pytest.mark.parametrize("dtype", kv_dtypes()[1:2] + [torch.int8])
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_appends_are_refused_and_change_nothing(dtype, bad):
    k_cache, v_cache, ks, vs, table = _cache(True, dtype, "per_token")
    q, k, v = randn(2, 2, 4, 32, seed=1), randn(2, 2, 2, 32, seed=2), randn(2, 2, 2, 32, seed=3)
    at.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=0, block_table=table, k_descale=ks,
                               v_descale=vs)
    before = _snapshot(k_cache, v_cache, ks, vs)
    k[1, 1, 0, 7] = bad
    with pytest.raises(InvalidArgumentError) as e:
        at.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=2, block_table=table, k_descale=ks,
                                   v_descale=vs)
    assert e.value.field == "k[1][1][0][7]", e.value
    assert _unchanged(before, k_cache, v_cache, ks, vs)


def test_a_refused_append_puts_the_per_token_scales_back():
    k_cache, v_cache, ks, vs, table = _cache(False, torch.int8, "per_token")
    q, k, v = randn(2, 3, 4, 32, seed=1), randn(2, 3, 2, 32, seed=2), randn(2, 3, 2, 32, seed=3)
    at.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=0, k_descale=ks, v_descale=vs)
    ks[0, 1, 1] = 0.0  # a context token's scale: the next call reads it, and is refused
    before = _snapshot(k_cache, v_cache, ks, vs)
    with pytest.raises(InvalidArgumentError) as e:
        at.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=3, k_descale=ks, v_descale=vs)
    assert e.value.field == "k_scale[0][1][1]", e.value
    assert _unchanged(before, k_cache, v_cache, ks, vs)
    # Appended tokens in another dtype than q's are refused as well.
    with pytest.raises(InvalidArgumentError) as e:
        at.flash_attn_with_kvcache(q, k_cache, v_cache, k.double(), v.double(), cache_seqlens=3, k_descale=ks,
                                   v_descale=vs)
    assert e.value.field == "k.dtype"
    assert _unchanged(before, k_cache, v_cache, ks, vs)


@pytest.mark.parametrize("dtype", kv_dtypes())
def test_per_head_appends_saturate(dtype):
    k_cache, v_cache, ks, vs, _ = _cache(False, dtype, "per_head", cap=8)
    q, k, v = randn(2, 1, 4, 32, seed=1), randn(2, 1, 2, 32, seed=2) * 1e6, randn(2, 1, 2, 32, seed=3)
    at.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=0, k_descale=ks, v_descale=vs)
    assert float(k_cache[:, :1].float().abs().max()) == _kv8.code_max(dtype)


def test_appends_that_would_lose_or_share_written_memory_are_refused():
    """An append writes the caches (and per-token descales) in place: a missing
    per-token descale, an expanded one, or K's and V's being one tensor would
    silently lose or overwrite what was written; each is refused by name, and
    nothing changes."""
    k_cache, v_cache, ks, vs, _ = _cache(False, torch.int8, "per_token")
    q, k, v = randn(2, 1, 4, 32, seed=1), randn(2, 1, 2, 32, seed=2), randn(2, 1, 2, 32, seed=3)
    shared = torch.full((1, 1, 1), 0.05).expand(ks.shape)
    before = _snapshot(k_cache, v_cache, ks, vs)
    for kw, field in ((dict(v_descale=vs), "k_descale"), (dict(k_descale=ks), "v_descale"),
                      (dict(k_descale=shared, v_descale=vs), "k_descale"),
                      (dict(k_descale=ks, v_descale=ks), "v_descale")):
        with pytest.raises(InvalidArgumentError) as e:
            at.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=0, **kw)
        assert e.value.field == field, (kw.keys(), e.value)
    with pytest.raises(InvalidArgumentError) as e:
        at.flash_attn_with_kvcache(q, k_cache, k_cache, k, v, cache_seqlens=0, k_descale=ks, v_descale=vs)
    assert e.value.field == "v_cache"
    assert _unchanged(before, k_cache, v_cache, ks, vs)
    wide = torch.zeros(2, 8, 2, 32, dtype=torch.bfloat16)
    with pytest.raises(InvalidArgumentError) as e:
        at.flash_attn_with_kvcache(q.bfloat16(), wide, wide, k.bfloat16(), v.bfloat16(), cache_seqlens=0)
    assert e.value.field == "v_cache"
    assert not wide.any()
    # Reading writes nothing: one descale for both, or an expanded one, is fine there.
    at.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=1, k_descale=shared, v_descale=shared)


# --- transformers: QuantizedKVCache ----------------------------------------------------------------


def _has_transformers():
    if importlib.util.find_spec("transformers") is None:
        return False
    import transformers
    return int(transformers.__version__.split(".")[0]) >= 5


needs_hf = pytest.mark.skipif(not _has_transformers(), reason="needs Hugging Face transformers >= 5")
QWEN2 = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.15, pad_token_id=0,
             bos_token_id=1, eos_token_id=None, tie_word_embeddings=False)
PROMPT, NEW = 16, 64


def _qwen2(dtype, **config):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    import attend.integrations.transformers  # noqa: F401  (registers "attend")
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(transformers.Qwen2Config(**QWEN2, **config),
                                                         attn_implementation="attend", dtype=dtype).eval()


def _cache_kw(fn):
    """transformers 5.x renames past_key_values= to cache= (the old name warns)."""
    import inspect
    return "cache" if "cache" in inspect.signature(fn).parameters else "past_key_values"


def _forced_logits(model, cache, seq):
    """Next-token logits after the prompt and after each later token of seq,
    fed one at a time through `cache` (teacher forcing: both caches see the same
    tokens, so a divergence does not compound)."""
    kw = {_cache_kw(model.forward): cache, "use_cache": True}
    with torch.no_grad():
        logits = [model(seq[:, :PROMPT], **kw).logits[:, -1]]
        for t in range(PROMPT, seq.shape[1] - 1):
            logits.append(model(seq[:, t:t + 1], **kw).logits[:, -1])
    return torch.stack(logits, 1).float()


def _generate(model, ids, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # past_key_values= is being renamed cache=
        return model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, **kwargs)


# kv_dtype -> (max |logit difference|, top-1 agreement) bounds for the bf16 model over 64 teacher-forced
# steps; measured 0.109 / 0.984 (int8), 0.50 / 0.89 (e4m3), 1.09 / 0.81 (e5m2), logits up to ~4.8.
BOUNDS = {"int8": (0.5, 0.95), "float8_e4m3fn": (1.5, 0.8), "float8_e5m2": (2.5, 0.7)}


@needs_hf
@pytest.mark.parametrize("kv_dtype", ["int8", pytest.param("float8_e4m3fn", marks=needs_fp8),
                                      pytest.param("float8_e5m2", marks=needs_fp8)])
def test_quantized_cache_generation_tracks_the_bf16_cache(kv_dtype):
    from transformers import DynamicCache
    from attend.integrations.transformers import QuantizedKVCache
    model = _qwen2(torch.bfloat16)
    ids = torch.randint(2, 97, (2, PROMPT), generator=torch.Generator().manual_seed(1))
    ref = _generate(model, ids)
    cache = QuantizedKVCache(model.config, kv_dtype)
    out = _generate(model, ids, past_key_values=cache)
    assert out.shape == ref.shape == (2, PROMPT + NEW)
    assert cache.layers[0].keys.dtype == getattr(torch, kv_dtype)
    dense = DynamicCache()
    quant = QuantizedKVCache(model.config, kv_dtype)
    want, got = _forced_logits(model, dense, ref), _forced_logits(model, quant, ref)
    delta = (got - want).abs().max().item()
    top1 = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    max_delta, min_top1 = BOUNDS[kv_dtype]
    assert delta <= max_delta and top1 >= min_top1, (kv_dtype, delta, top1)
    # Memory: 1-byte codes plus f32 scales against bf16's 2 bytes.
    bf16 = sum(layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
               for layer in dense.layers)
    tokens, layers, heads, d = PROMPT + NEW - 1, 2, 2, 16
    scales = 2 * 4 * (tokens if quant.kv_scale == "per_token" else 1)
    assert quant.nbytes() == layers * 2 * heads * (2 * d * tokens + scales)
    assert bf16 == layers * 2 * heads * tokens * 2 * d * 2 and quant.nbytes() < bf16


def _fake_quant_cache(layers):
    """A transformers Cache storing, in f32, what int8 per-token codes stand
    for: the f32 model must compute on it what it computes on the codes."""
    from transformers.cache_utils import Cache, DynamicLayer

    def dequantized(x):
        s = _kv8.token_scales(x, torch.int8).unsqueeze(-1)
        return _kv8.dequantize(_kv8.quantize(x, s, torch.int8), s)

    class FakeQuant(DynamicLayer):
        def update(self, k, v, *args, **kwargs):
            return super().update(dequantized(k), dequantized(v))

    return Cache(layers=[FakeQuant() for _ in range(layers)])


# The codes and the f32 values they stand for differ only in rounding order
# inside the kernels (~1e-6 in the logits), but a value that rounding moves
# across a code boundary is cached one code step apart and the difference
# grows with the tokens that read it: measured 1.7e-3 over 64 left-padded
# generated tokens, against ~0.1 between int8 and bf16 caches.
DEQUANTIZED_ATOL = 1e-2


@needs_hf
@pytest.mark.parametrize("window", [None, 6], ids=["full", "sliding_window"])
def test_quantized_cache_computes_on_the_dequantized_values(window):
    """Sliding-window layers too: the cache keeps every token and the
    window applies as the keys are read (measured 2.6e-6 from the f32 values)."""
    from attend.integrations.transformers import QuantizedKVCache
    config = {} if window is None else dict(use_sliding_window=True, sliding_window=window, max_window_layers=0)
    model = _qwen2(torch.float32, **config)
    assert window is None or set(model.config.layer_types) == {"sliding_attention"}
    seq = torch.randint(2, 97, (2, PROMPT + 24), generator=torch.Generator().manual_seed(2))
    want = _forced_logits(model, _fake_quant_cache(2), seq)
    got = _forced_logits(model, QuantizedKVCache(model.config), seq)
    assert (got - want).abs().max().item() <= DEQUANTIZED_ATOL
    # transformers' own SDPA on the same values, its masks applying the window.
    model.set_attn_implementation("sdpa")
    sdpa = _forced_logits(model, _fake_quant_cache(2), seq)
    assert (got - sdpa).abs().max().item() <= DEQUANTIZED_ATOL


@needs_hf
def test_quantized_cache_generates_a_left_padded_batch():
    """Left padding in generate: attention runs flash_attn_with_kvcache over the
    codes from each sequence's first real key (cache_leftpad)."""
    from attend.integrations.transformers import QuantizedKVCache
    model = _qwen2(torch.float32)
    ids = torch.randint(2, 97, (2, PROMPT), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[0, :5], mask[0, :5] = 0, 0
    kw = dict(attention_mask=mask, output_logits=True, return_dict_in_generate=True)
    want = _generate(model, ids, past_key_values=_fake_quant_cache(2), **kw)
    got = _generate(model, ids, past_key_values=QuantizedKVCache(model.config), **kw)
    assert got.sequences.shape == (2, PROMPT + NEW)
    assert (torch.stack(got.logits) - torch.stack(want.logits)).abs().max().item() <= DEQUANTIZED_ATOL


@needs_hf
def test_quantized_cache_refuses_bad_settings_and_unscaled_codes():
    from attend.integrations.transformers import QuantizedKVCache, attention_forward
    with pytest.raises(InvalidArgumentError) as e:
        QuantizedKVCache(None, "int4")
    assert e.value.field == "kv_dtype"
    with pytest.raises(InvalidArgumentError) as e:
        QuantizedKVCache(None, "int8", "per_tensor")
    assert e.value.field == "kv_scale"
    q = randn(1, 2, 3, 16)
    codes = torch.zeros(1, 2, 3, 16, dtype=torch.int8)
    with pytest.raises(InvalidArgumentError) as e:
        attention_forward(torch.nn.Module(), q, codes, codes, None)
    assert e.value.field == "key.dtype"
    cache = QuantizedKVCache(None)
    k = randn(1, 2, 3, 16)
    k[0, 1, 2, 3] = float("inf")
    with pytest.raises(InvalidArgumentError) as e:
        cache.update(k, randn(1, 2, 3, 16), 0)
    assert e.value.field == "key_states[0][1][2][3]"
    assert cache.get_seq_length() == 0


@needs_hf
def test_quantized_layer_fixes_per_head_scales_at_the_first_non_zero_values():
    """attend.KVCache's rule: an all-zero first update leaves a per-head scale
    open (its codes are 0 at any scale); the first non-zero values fix it."""
    from attend.integrations.transformers import _DESCALE, QuantizedKVLayer
    layer = QuantizedKVLayer(torch.int8, "per_head")
    zeros = torch.zeros(1, 2, 3, 16)
    layer.update(zeros, zeros)
    k, v = randn(1, 2, 4, 16, seed=1) * 0.01, randn(1, 2, 4, 16, seed=2) * 0.01
    k[0, 1] = 0.0  # head 1 stays open for K, but not for V
    keys, values = layer.update(k, v)
    for codes, x in ((keys, k), (values, v)):
        got = codes.float() * getattr(codes, _DESCALE)[:, :, None, None]
        assert float((got[:, :, 3:] - x).abs().max()) <= float(x.abs().max()) / 100, got  # scale 1: error = max
    k2 = randn(1, 2, 1, 16, seed=3) * 0.01
    keys, _ = layer.update(k2, v[:, :, :1])
    got = keys.float() * getattr(keys, _DESCALE)[:, :, None, None]
    assert float((got[:, :, 7:] - k2).abs().max()) <= float(k2.abs().max()) / 50, got


@needs_hf
def test_quantized_cache_refuses_a_model_on_another_attention():
    """Only attend's attention reads the codes: SDPA or eager would fail on
    them with torch's dtype error, far from the cause."""
    from attend.integrations.transformers import QuantizedKVCache
    model = _qwen2(torch.float32)
    QuantizedKVCache(model.config)
    model.set_attn_implementation("sdpa")
    with pytest.raises(InvalidArgumentError) as e:
        QuantizedKVCache(model.config)
    assert e.value.field == "config._attn_implementation"


def test_descales_that_are_not_numbers_are_refused():
    q, kc, vc = randn(1, 1, 2, 16), torch.zeros(1, 4, 1, 16, dtype=torch.int8), torch.zeros(1, 4, 1, 16,
                                                                                          dtype=torch.int8)
    for bad in ("0.1", True, b"1"):
        with pytest.raises(InvalidArgumentError) as e:
            at.flash_attn_with_kvcache(q, kc, vc, k_descale=bad, v_descale=1.0)
        assert e.value.field == "k_descale", bad
    at.flash_attn_with_kvcache(q, kc, vc, k_descale=0.1, v_descale=1)  # numbers are


@pytest.mark.parametrize("dtype", [torch.int8, torch.bfloat16])
def test_cache_shape_errors_name_the_cache(dtype):
    """The caches are k and v inside the spec; errors about them name k_cache
    and v_cache, as the caller wrote them."""
    q = randn(1, 1, 4, 64).to(torch.bfloat16)
    kw = dict(k_descale=1.0, v_descale=1.0) if dtype == torch.int8 else {}
    empty = torch.zeros(1, 0, 2, 64, dtype=dtype)
    with pytest.raises(ShapeMismatchError) as e:
        at.flash_attn_with_kvcache(q, empty, empty, **kw)
    assert e.value.field == "k_cache.shape[1]"
    narrow = torch.zeros(1, 8, 2, 32, dtype=dtype)
    with pytest.raises(ShapeMismatchError) as e:
        at.flash_attn_with_kvcache(q, narrow, torch.zeros(1, 8, 2, 64, dtype=dtype), **kw)
    assert e.value.field == "k_cache.shape[3]"
