"""8-bit K/V for the torch entry points: dtypes, descale layouts, quantization.

attend reads 8-bit K/V codes (int8, float8_e4m3fn, float8_e5m2) that stand
for code * scale (AttentionSpec kv_dtype / kv_scale, Inputs k_scale / v_scale).
Quantization here is torch ops, bit for bit the native rule (attend's
kv8_code, which the tests compare against): x / scale in float32, rounded to
nearest even and saturated at the largest code (int8 symmetric at +-127, e4m3
at +-448, e5m2 at +-57344).
"""

import torch

from .errors import InvalidArgumentError, ShapeMismatchError, _raise

# torch dtype -> (attend name, largest code); torch 1.x has no float8 dtypes.
KV8 = {torch.int8: ("i8", 127.0)}
for _name, _kv, _max in (("float8_e4m3fn", "fp8_e4m3", 448.0), ("float8_e5m2", "fp8_e5m2", 57344.0)):
    if hasattr(torch, _name):
        KV8[getattr(torch, _name)] = (_kv, _max)
TORCH_DTYPE = {name: dt for dt, (name, _) in KV8.items()}


def is_kv8(t):
    return isinstance(t, torch.Tensor) and t.dtype in KV8


def name(dtype):
    return KV8[dtype][0]


def code_max(dtype):
    return KV8[dtype][1]


def refuse_non_finite(t, field):
    """Raises naming the first inf/NaN element of t (no 8-bit code holds
    one), in the native form k[b][t][h][d]."""
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        where = [int(i) for i in bad.nonzero()[0]]
        _raise(InvalidArgumentError, field + "".join(f"[{i}]" for i in where), float(t[tuple(where)]),
               "an 8-bit cache holds finite values only (no code for inf or NaN)")


def quantize(x, scale, dtype):
    """Codes of x / scale (scale broadcast against x; float32 arithmetic)."""
    y = x.float() / scale
    m = code_max(dtype)
    if dtype == torch.int8:
        # torch.round rounds half to even, as nearbyint does.
        return y.clamp(-m, m).round().to(torch.int8)
    # The float8 casts round to nearest even but do not saturate (past the
    # largest finite value e4m3 gives NaN, e5m2 inf): clamp first.
    return y.clamp(-m, m).to(dtype)


def token_scales(x, dtype):
    """Per-token scales of x (..., D): max|x| over the last dim / code max,
    1 for an all-zero row (attend's KVCache rule: the largest element is exact
    and none saturates)."""
    a = x.float().abs().amax(-1)
    return torch.where(a > 0, a / code_max(dtype), torch.ones_like(a))


def head_scales(x, dtype, dims):
    """Per-head scales fixed by a first batch of values: 2 * max|x| over
    `dims` / code max, so later values up to twice as large still fit (the
    KVCache rule); 1 where that max is 0."""
    a = x.float().abs().amax(dim=dims)
    return torch.where(a > 0, 2.0 * a / code_max(dtype), torch.ones_like(a))


def dequantize(codes, scale):
    """code * scale in float32 (for references and tests; attend reads codes)."""
    return codes.float() * scale


def requested(k, v, k_descale, v_descale):
    """Whether a call asks for 8-bit K/V: either is 8-bit or a descale is given."""
    return is_kv8(k) or is_kv8(v) or k_descale is not None or v_descale is not None


def descale(d, field, dtype_field):
    """A descale argument as an f32 tensor: a Python number becomes a (1,)
    tensor, a 0-d tensor is viewed as (1,)."""
    if d is None:
        return None
    if not isinstance(d, torch.Tensor):
        if isinstance(d, (str, bytes, bool)):  # float() would take "0.1" and True
            _raise(InvalidArgumentError, field, type(d).__name__, "expected a float32 tensor or a number")
        try:
            d = float(d)
        except (TypeError, ValueError):
            _raise(InvalidArgumentError, field, type(d).__name__, "expected a float32 tensor or a number")
        return torch.tensor([d], dtype=torch.float32)
    if d.dtype != torch.float32:
        _raise(InvalidArgumentError, dtype_field, d.dtype, "descales are float32 (as in FlashAttention 3)")
    return d.reshape(1) if d.dim() == 0 else d


def scale_layout(k_descale, v_descale, per_head, per_token):
    """(kv_scale, k_scale, v_scale) from FlashAttention 3 style descales: (1,)
    per_tensor, `per_head` (B, Hkv) per_head, `per_token` (k's shape without
    its last dim) per_token; none given: kv_scale none. One missing while the
    other is given reads as all ones in the other's layout (FA3: None is 1).
    Where per_head and per_token have one shape (varlen with as many tokens as
    sequences), it is per_head, FA3's."""
    k_descale = descale(k_descale, "k_descale", "k_descale.dtype")
    v_descale = descale(v_descale, "v_descale", "v_descale.dtype")
    if k_descale is None and v_descale is None:
        return "none", None, None
    shapes = {tuple(per_token): "per_token", (1,): "per_tensor", tuple(per_head): "per_head"}
    layouts = []
    for d, field in ((k_descale, "k_descale"), (v_descale, "v_descale")):
        if d is None:
            continue
        layout = shapes.get(tuple(d.shape))
        if layout is None:
            _raise(ShapeMismatchError, f"{field}.shape", tuple(d.shape),
                   f"expected (1,) or a number (per_tensor), {tuple(per_head)} (per_head: batch, kv heads) or "
                   f"{tuple(per_token)} (per_token: k's shape without its last dim)")
        layouts.append(layout)
    if len(set(layouts)) > 1:
        _raise(ShapeMismatchError, "v_descale.shape", tuple(v_descale.shape),
               f"k_descale's {tuple(k_descale.shape)} is {layouts[0]}: both descales share one layout")
    if k_descale is None:
        k_descale = torch.ones(v_descale.shape, dtype=torch.float32)
    if v_descale is None:
        v_descale = torch.ones(k_descale.shape, dtype=torch.float32)
    return layouts[0], k_descale, v_descale
