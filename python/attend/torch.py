"""attend for PyTorch: drop-in attention functions and a module, with autograd.

    from attend.torch import scaled_dot_product_attention      # torch.nn.functional's
    from attend.torch import flash_attn_func, flash_attn_varlen_func  # flash_attn's
    from attend.torch import DotProductAttention                # TransformerEngine-style

Each call selects a backend for its problem: in *training* mode (forward and
backward must be supported) whenever grad mode is on and an input requires grad,
else in *inference* mode (forward only). Backward runs on the backend forward
chose, from the saved LSE and dropout seed. CPU tensors: float32, bfloat16 and
float16 (flash, decode, reference; half types accumulate in f32 and return
results and gradients in their own dtype, LSE in float32) and float64
(reference); a backend that cannot do a dtype gives its reasons rather than
upcasting. Errors are attend.errors classes.
"""

from typing import Any, Optional, Tuple, Union

import torch

from . import _C, _arrays, _autograd, _kv8, _masks
from .errors import InvalidArgumentError, ShapeMismatchError, UnsupportedError, _raise
from ._autograd import Problem, draw_dropout_seed
from ._index import int32_index, require_non_negative
from ._masks import dropout_mask, dropout_mask_varlen
from ._spec_fields import with_fields
from ._torch_inputs import (autocast as _autocast, autocast_dtype as _autocast_dtype, compiling as _compiling,
                            no_meta as _no_meta, one_device as _one_device, refuse_transforms as _refuse_transforms,
                            transforming as _transforming)
from .module import DotProductAttention
from .policy import Explanation

__all__ = [
    "scaled_dot_product_attention", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func",
    "DotProductAttention", "explain", "last_selection", "draw_dropout_seed", "dropout_mask",
    "dropout_mask_varlen", "Explanation", "flash_attn_with_kvcache", "HAS_TORCH_LIBRARY_OPS",
]

# True when the ops are torch.library custom ops (torch >= 2.4; torch.compile
# traces through them), False for the autograd.Function of older torch.
HAS_TORCH_LIBRARY_OPS: bool = _autograd.HAS_OPS

# out, or (out, softmax_lse, S) with return_attn_probs=True.
FlashResult = Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]

def last_selection() -> Optional[Explanation]:
    """Explanation of the most recent attend.torch forward in this process (its
    backend and mode), or None before the first call."""
    return _autograd.last_explanation()


def _check_tensor(t, name, dims):
    if not isinstance(t, torch.Tensor):
        _raise(InvalidArgumentError, name, type(t).__name__, "expected a torch.Tensor")
    if t.dim() not in dims:
        _raise(ShapeMismatchError, f"{name}.dim", t.dim(), f"expected {' or '.join(map(str, dims))} dimensions")


def _real(x, name, what):
    """float(x), or an attend error naming `name` when x is no real number."""
    try:
        return float(x)
    except (TypeError, ValueError):
        _raise(InvalidArgumentError, name, x, f"expected {what}")


def _check_dropout(dropout_p, name="dropout_p"):
    # [0, 1), as the native spec check says: p = 1 drops every term, and the
    # 1/(1-p) rescaling of what is kept is undefined.
    p = _real(dropout_p, name, "a dropout probability in [0, 1)")
    if not 0.0 <= p < 1.0:
        _raise(InvalidArgumentError, name, dropout_p, "must lie in [0, 1)")
    return p


def _softcap(softcap):
    """softcap as the spec takes it: None, like 0, disables it."""
    return 0.0 if softcap is None else _real(softcap, "softcap", "a real number >= 0 (0 or None disables it)")


def _bias_requires_grad(bias):
    return bias is not None and bias.requires_grad and torch.is_grad_enabled()


# --- torch.nn.functional.scaled_dot_product_attention ------------------------------------

def _sdpa_problem(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False, **spec_fields):
    for t, n in ((query, "query"), (key, "key"), (value, "value")):
        _check_tensor(t, n, range(3, 9))
    _one_device("scaled_dot_product_attention", query=query, key=key, value=value, attn_mask=attn_mask)
    dropout_p = _check_dropout(dropout_p)
    query, key, value = _autocast(query, key, value)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        (attn_mask,) = _autocast(attn_mask)
    if not (query.dim() == key.dim() == value.dim()):
        _raise(ShapeMismatchError, "key.dim", key.dim(), "query, key and value must have the same number of dims")
    lead = query.shape[:-2]
    if key.shape[:-3] != lead[:-1] or value.shape[:-3] != lead[:-1] or (query.dim() == 3 and (
            key.shape[0] != query.shape[0] or value.shape[0] != query.shape[0])):
        _raise(ShapeMismatchError, "key.shape", tuple(key.shape), f"batch dims must equal query's {tuple(lead)}")
    if key.shape[-3 if key.dim() > 3 else 0] != value.shape[-3 if value.dim() > 3 else 0] \
            or key.shape[-2] != value.shape[-2]:
        _raise(ShapeMismatchError, "value.shape", tuple(value.shape), f"must match key {tuple(key.shape)} "
               "in heads and sequence length")
    if key.shape[-1] != query.shape[-1]:
        _raise(ShapeMismatchError, "key.shape[-1]", key.shape[-1], f"must equal query's head dim {query.shape[-1]}")
    if is_causal and attn_mask is not None:
        _raise(InvalidArgumentError, "attn_mask", "set", "must be None when is_causal=True (as in PyTorch)")

    def to4d(t):
        if t.dim() == 3:
            return t.unsqueeze(1)
        return t if t.dim() == 4 else t.reshape(-1, *t.shape[-3:])

    q, k, v = to4d(query), to4d(key), to4d(value)
    B, Hq, L, E = q.shape
    Hk, S, Ev = k.shape[1], k.shape[2], v.shape[3]
    if Hq != Hk and not ((enable_gqa and Hq % Hk == 0) or Hk == 1):
        _raise(ShapeMismatchError, "key.heads", Hk, f"query has {Hq} heads: pass enable_gqa=True with "
               f"{Hq} % {Hk} == 0 (or use 1 key/value head)")
    out_shape = tuple(query.shape[:-1]) + (Ev,)
    if B == 0:
        with_fields({}, spec_fields, "scaled_dot_product_attention", not _compiling())  # still reject unknown fields
        return None, out_shape
    if is_causal and L != S and (spec_fields.get("q_offset") or spec_fields.get("kv_offset")):
        # The top-left rewrite below slices keys by local positions, which offsets move.
        _raise(UnsupportedError, "q_offset" if spec_fields.get("q_offset") else "kv_offset", "set",
               f"is_causal is top-left aligned and L={L} != S={S}: offsets need flash_attn_func's bottom-right "
               "causal mask (or L == S)")

    bias = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = _masks.bias_from_keep(attn_mask, query.dtype)
        elif attn_mask.dtype != query.dtype:
            _raise(InvalidArgumentError, "attn_mask.dtype", attn_mask.dtype,
                   f"must be bool or the query's dtype {query.dtype}")
        try:
            bias = to4d(torch.broadcast_to(attn_mask, tuple(query.shape[:-1]) + (S,)))
        except RuntimeError:
            _raise(ShapeMismatchError, "attn_mask.shape", tuple(attn_mask.shape),
                   f"not broadcastable to {tuple(query.shape[:-1]) + (S,)}")

    causal, left, right = False, -1, -1
    if is_causal:  # top-left aligned in PyTorch
        keys, left, right = _masks.top_left_window(L, S, -1, 0)
        if keys < S:
            k, v = k[:, :, :keys], v[:, :, :keys]
            S = keys
        causal, right = right == 0, (-1 if right == 0 else right)

    spec = dict(batch=B, seqlen_q=L, seqlen_kv=S, heads_q=Hq, heads_kv=Hk, head_dim_qk=E, head_dim_v=Ev,
                dtype=_masks.dtype_name(query), layout="bhsd", scale=scale, causal=causal, window_left=left,
                window_right=right, has_bias=bias is not None, bias_requires_grad=_bias_requires_grad(bias))
    if dropout_p > 0.0:
        spec.update(dropout_p=float(dropout_p), dropout_seed=draw_dropout_seed())
    spec = with_fields(spec, spec_fields, "scaled_dot_product_attention", not _compiling())
    return Problem(spec, q, k, v, bias, restore=lambda o: o.reshape(out_shape)), out_shape


def _eager():
    """Not under torch.compile, autocast or a torch.func transform: what the fast paths assume."""
    return not _compiling() and _autocast_dtype() is None and not _transforming()


def _sdpa_fast(query, key, value, is_causal, scale, enable_gqa):
    """The output of a 4-D call without mask, dropout, sinks or spec fields,
    through _autograd.fast_call; None sends the call down the general
    path, which raises every error (the checks here only admit calls it
    accepts unchanged: no top-left key slicing, no reshape)."""
    if not (type(query) is torch.Tensor and type(key) is torch.Tensor and type(value) is torch.Tensor):
        return None
    qs, ks, vs = query.shape, key.shape, value.shape
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4 or not (scale is None or type(scale) in (float, int)):
        return None
    b, hq, sq, e = qs
    hk, sk = ks[1], ks[2]
    if b == 0 or ks[0] != b or vs[0] != b or vs[1] != hk or vs[2] != sk or ks[3] != e:
        return None
    if hq != hk and not ((enable_gqa and hq % hk == 0) or hk == 1):
        return None
    if is_causal and sq != sk:  # top-left causal over fewer queries than keys slices the keys
        return None
    if not _eager():
        return None
    return _autograd.fast_call(
        ("sdpa", scale, bool(is_causal)),
        lambda: _sdpa_problem(query, key, value, None, 0.0, is_causal, scale, enable_gqa)[0].spec, query, key, value,
        seq_dim=2)


def scaled_dot_product_attention(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
        dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None, enable_gqa: bool = False,
        sinks: Optional[torch.Tensor] = None, **spec_fields: Any) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention (PyTorch 2.x semantics):
    query (N..., L, E), key (N..., S, E), value (N..., S, Ev) -> (N..., L, Ev).

    attn_mask: bool (True = take part) or float added to the scores, broadcastable
    to (N..., L, S); is_causal: top-left aligned (row i sees keys <= i); dropout
    is applied whenever dropout_p > 0; scale defaults to 1/sqrt(E); enable_gqa:
    key/value may have H/g heads, query head h reads kv head h // g.
    A fully masked row gives 0 (PyTorch's math path gives NaN).

    ``**spec_fields``: further attend::AttentionSpec fields by name (attend.spec_fields()),
    e.g. q_offset/kv_offset, out_dtype="f32", need_lse, dropout_seed; a field the
    arguments already decide (batch, dtype, causal, ...) is an InvalidArgumentError.

    Attention sinks: ``sinks`` (H) float logits (gpt-oss style, learnable, with
    gradient) add exp(sinks[h]) to each row's softmax denominator;
    ``softmax_type="off_by_one"`` adds a sink logit 0 without a tensor."""
    if attn_mask is None and not dropout_p and sinks is None and not spec_fields:
        out = _sdpa_fast(query, key, value, is_causal, scale, enable_gqa)
        if out is not None:
            return out
    problem, out_shape = _sdpa_problem(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                       **spec_fields)
    if problem is None:  # an empty batch: nothing to compute, keep the graph connected
        return query.new_zeros(out_shape) + 0 * (query.sum() + key.sum() + value.sum())
    return problem.with_sinks(sinks).run()[0]


# --- flash_attn ---------------------------------------------------------------------------

def _window(causal, window_size):
    left, right = _masks.window_sides(window_size)
    return left, (0 if causal else right)


def _flash_spec(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic):
    dropout_p = _check_dropout(dropout_p)
    left, right = _window(causal, window_size)
    spec = dict(heads_q=q.shape[-2], heads_kv=k.shape[-2], head_dim_qk=q.shape[-1], head_dim_v=v.shape[-1],
                dtype=_masks.dtype_name(q, "q"), scale=softmax_scale, causal=bool(causal), window_left=left,
                window_right=right, softcap=_softcap(softcap), alibi=alibi_slopes is not None,
                deterministic=bool(deterministic))
    if dropout_p > 0.0:
        spec.update(dropout_p=float(dropout_p), dropout_seed=draw_dropout_seed())
    return spec


def _kv8_fields(k, v, k_descale, v_descale, per_head, per_token, api):
    """None where K/V are not 8-bit and no descale is given; else (spec fields
    kv_dtype and kv_scale, k_scale, v_scale) from the descales' layout."""
    if not _kv8.requested(k, v, k_descale, v_descale):
        return None
    kv_dtype = _kv8_dtype(k, v, "k", "v", k_descale, v_descale)
    _kv8_eager(api, kv_dtype)
    layout, k_scale, v_scale = _kv8.scale_layout(k_descale, v_descale, per_head, per_token)
    return dict(kv_dtype=kv_dtype, kv_scale=layout), k_scale, v_scale


def _with_kv8(problem, kv8):
    """problem carrying an 8-bit call's scales (k_scale, v_scale; None: none)."""
    problem.k_scale, problem.v_scale = (kv8[1], kv8[2]) if kv8 else (None, None)
    return problem


def _flash_problem(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                   alibi_slopes=None, deterministic=False, return_attn_probs=False, *, k_descale=None, v_descale=None,
                   **spec_fields):
    for t, n in ((q, "q"), (k, "k"), (v, "v")):
        _check_tensor(t, n, (4,))
    _one_device("flash_attn_func", q=q, k=k, v=v, alibi_slopes=alibi_slopes, k_descale=k_descale,
                v_descale=v_descale)
    kv8 = _kv8_fields(k, v, k_descale, v_descale, (k.shape[0], k.shape[2]), k.shape[:3], "flash_attn_func")
    if kv8 is None:
        q, k, v = _autocast(q, k, v)
    else:
        (q,) = _autocast(q)  # the codes are what they are: only q follows autocast
    spec = _flash_spec(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic)
    spec.update(batch=q.shape[0], seqlen_q=q.shape[1], seqlen_kv=k.shape[1], layout="bshd", **(kv8[0] if kv8 else {}))
    spec = with_fields(spec, spec_fields, "flash_attn_func", not _compiling())
    return _with_kv8(Problem(spec, q, k, v, slopes=alibi_slopes), kv8)


def _flash_fast(q, k, v, softmax_scale, causal, window_size, softcap, deterministic):
    """flash_attn_func's output through _autograd.fast_call for a call
    without dropout, ALiBi, sinks, attention probabilities, context parallelism
    or spec fields; None sends it down the general path. Sizes are checked by
    the runtime in both paths, with the same errors."""
    if not (type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor):
        return None
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or not _eager():
        return None
    if not (softmax_scale is None or type(softmax_scale) in (float, int)) or type(softcap) not in (float, int):
        return None
    try:
        signature = ("flash", softmax_scale, bool(causal), tuple(window_size), softcap, bool(deterministic))
        hash(signature)
    except TypeError:  # e.g. window_size=None or tensor-valued: the general path says what it makes of it
        return None
    return _autograd.fast_call(
        signature, lambda: _flash_problem(q, k, v, 0.0, softmax_scale, causal, window_size, softcap, None,
                                          deterministic).spec, q, k, v, seq_dim=1)


def flash_attn_func(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
        window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
        deterministic: bool = False, return_attn_probs: bool = False, sinks: Optional[torch.Tensor] = None,
        cp_group: Any = None, cp_strategy: str = "auto", k_descale: Union[torch.Tensor, float, None] = None,
        v_descale: Union[torch.Tensor, float, None] = None, **spec_fields: Any) -> FlashResult:
    """flash_attn.flash_attn_func: q (B, Sq, H, D), k (B, Sk, Hk, D), v (B, Sk, Hk, Dv)
    -> out (B, Sq, H, Dv). Causal and windows are bottom-right aligned; softcap,
    ALiBi (f32 slopes (H) or (B, H)), GQA/MQA (H % Hk == 0), dropout as in FA2.
    return_attn_probs: (out, softmax_lse (B, H, Sq) f32/f64, S) where S is attend's
    bool dropout keep mask (B, H, Sq, Sk) when dropout_p > 0, else an empty tensor
    (FA2's S_dmask encoding is tied to its CUDA tiling and is not reproduced).
    ``**spec_fields``: further attend::AttentionSpec fields by name (attend.spec_fields()),
    e.g. q_offset/kv_offset for a chunk of a longer sequence, out_dtype="f32",
    dropout_seed; one the arguments already decide is an InvalidArgumentError.
    ``sinks``: (H) learnable sink logits (gpt-oss style; float32, float64 for
    float64 q) added to each row's softmax denominator as exp(sinks[h]); its
    gradient flows. ``softmax_type="off_by_one"`` is the tensor-free sink 0.
    ``cp_group``: a torch.distributed process group sharing the sequence (context
    parallelism, attend.parallel): q, k, v are this rank's rows in the CP layout
    (attend.parallel.shard), out likewise; ``cp_strategy`` "auto", "ring" or "a2a".

    8-bit K/V (inference only): k and v int8, float8_e4m3fn or float8_e5m2
    codes standing for code * descale (FlashAttention 3's k_descale /
    v_descale), q and out in f32/bf16/f16. The descale's shape is the layout:
    a number or (1,) per tensor, (B, Hk) per (sequence, kv head), (B, Sk, Hk)
    per token; none given: scale 1. float32, finite and > 0 (a bad one is
    refused naming k_scale / v_scale, attend's names for them)."""
    if _kv8.requested(k, v, k_descale, v_descale):
        if cp_group is not None:
            _raise(UnsupportedError, "cp_group", "set", "context parallelism does not take 8-bit K/V")
        return _flash_kv8(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                          deterministic, return_attn_probs, sinks, k_descale, v_descale, spec_fields)
    if (not dropout_p and alibi_slopes is None and not return_attn_probs and sinks is None and cp_group is None
            and not spec_fields):
        out = _flash_fast(q, k, v, softmax_scale, causal, window_size, softcap, deterministic)
        if out is not None:
            return out
    problem = _flash_problem(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                             deterministic, **spec_fields).with_sinks(sinks)
    if cp_group is not None:
        from . import parallel
        if return_attn_probs and dropout_p > 0.0:
            _raise(UnsupportedError, "return_attn_probs", True,
                   "the dropout mask of a cp_group call spans the whole sequence, not this rank's rows")
        out, lse = parallel.attention(problem.q, problem.k, problem.v, problem.spec, cp_group, cp_strategy,
                                      alibi_slopes, sinks=problem.sinks)
    else:
        out, lse = problem.run()
    if not return_attn_probs:
        return out
    s = problem.spec
    probs = (dropout_mask(s["dropout_seed"], s["dropout_p"], s["batch"], s["heads_q"], s["seqlen_q"],
                          s["seqlen_kv"]) if dropout_p > 0.0 else q.new_empty(0))
    return out, lse, probs


def _kv8_dtype(k, v, k_name, v_name, k_descale, v_descale):
    """The attend name of 8-bit K/V's dtype; descales without 8-bit K/V,
    or K and V of two dtypes, are refused."""
    if not _kv8.is_kv8(k):
        if k_descale is not None or v_descale is not None:
            _raise(InvalidArgumentError, "k_descale" if k_descale is not None else "v_descale", "set",
                   f"descales scale 8-bit K/V (int8, float8_e4m3fn, float8_e5m2); {k_name} is {k.dtype}")
        _raise(InvalidArgumentError, f"{k_name}.dtype", k.dtype, f"{v_name} is 8-bit ({v.dtype}): K and V share one "
               "kv_dtype")
    if v.dtype != k.dtype:
        _raise(InvalidArgumentError, f"{v_name}.dtype", v.dtype, f"must equal {k_name}'s {k.dtype} (K and V share "
               "one kv_dtype)")
    return _kv8.name(k.dtype)


def _kv8_eager(api, kv_dtype):
    """The torch.library ops that torch.compile and torch.func go through carry
    no scales: 8-bit K/V calls run eagerly (and a trace cannot call the
    extension that checks their spec)."""
    if _compiling() or _transforming():
        _raise(UnsupportedError, "kv_dtype", kv_dtype, f"{api} with 8-bit K/V runs eagerly: not under "
               "torch.compile or a torch.func transform")


def _kv8_forward(spec, tensors, api):
    """(out, lse) of an 8-bit K/V call: the native forward in inference mode
    (no backend has a backward for 8-bit K/V)."""
    _kv8_eager(api, spec["kv_dtype"])
    # The caller's names for what asks for a gradient (the descales are k_scale/v_scale here).
    grads = [{"k_scale": "k_descale", "v_scale": "v_descale"}.get(name, name) for name, t in tensors.items()
             if isinstance(t, torch.Tensor) and t.requires_grad]
    if torch.is_grad_enabled() and grads:
        _raise(UnsupportedError, "kv_dtype", spec["kv_dtype"], "8-bit K/V are inference only (no backend has a "
               "backward for them): run under torch.no_grad() or torch.inference_mode(), or detach "
               + ", ".join(grads))
    out, lse, _, _ = _autograd._native_forward(spec, "inference", tensors)
    return out, lse


def _flash_kv8(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
               return_attn_probs, sinks, k_descale, v_descale, spec_fields):
    _one_device("flash_attn_func", q=q, sinks=sinks)
    problem = _flash_problem(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                             deterministic, k_descale=k_descale, v_descale=v_descale, **spec_fields).with_sinks(sinks)
    out, lse = _kv8_forward(problem.spec, dict(q=problem.q, k=k, v=v, alibi_slopes=alibi_slopes, sinks=problem.sinks,
                                               k_scale=problem.k_scale, v_scale=problem.v_scale), "flash_attn_func")
    if not return_attn_probs:
        return out
    s = problem.spec
    probs = (dropout_mask(s["dropout_seed"], s["dropout_p"], s["batch"], s["heads_q"], s["seqlen_q"],
                          s["seqlen_kv"]) if s.get("dropout_p", 0.0) > 0.0 else q.new_empty(0))
    return out, lse, probs


def flash_attn_qkvpacked_func(
        qkv: torch.Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
        window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
        deterministic: bool = False, return_attn_probs: bool = False, sinks: Optional[torch.Tensor] = None,
        cp_group: Any = None, cp_strategy: str = "auto", **spec_fields: Any) -> FlashResult:
    """flash_attn.flash_attn_qkvpacked_func: qkv (B, S, 3, H, D); read in place (strided)."""
    _check_tensor(qkv, "qkv", (5,))
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal, window_size,
                           softcap, alibi_slopes, deterministic, return_attn_probs, sinks=sinks, cp_group=cp_group,
                           cp_strategy=cp_strategy, **spec_fields)


def flash_attn_kvpacked_func(
        q: torch.Tensor, kv: torch.Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
        window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
        deterministic: bool = False, return_attn_probs: bool = False, sinks: Optional[torch.Tensor] = None,
        cp_group: Any = None, cp_strategy: str = "auto", **spec_fields: Any) -> FlashResult:
    """flash_attn.flash_attn_kvpacked_func: q (B, Sq, H, D), kv (B, Sk, 2, Hk, D)."""
    _check_tensor(kv, "kv", (5,))
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, sinks=sinks, cp_group=cp_group,
                           cp_strategy=cp_strategy, **spec_fields)


def _cu(t, name):
    return int32_index(t, name, 1)


def _check_max_seqlen(cu, given, name, field):
    """The longest sequence must fit `given` (max_seqlen_q/k), as inference
    checks natively; the ops read sizes from cu_seqlens, so training would
    otherwise accept a wrong maximum silently. Skipped inside a trace, where the
    values are not known."""
    if _compiling() or cu.is_meta or cu.numel() < 2:  # (a meta tensor has no values)
        return
    longest = int((cu[1:] - cu[:-1]).max())
    if longest > int(given):
        b = int((cu[1:] - cu[:-1]).argmax())
        _raise(InvalidArgumentError, name, int(given), f"sequence {b} has length {longest} ({field}[{b + 1}] - "
               f"{field}[{b}]): the maximum must be at least that")


def _varlen_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    deterministic=False, return_attn_probs=False, block_table=None, *, k_descale=None,
                    v_descale=None, **spec_fields):
    _one_device("flash_attn_varlen_func", q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                alibi_slopes=alibi_slopes, block_table=block_table, k_descale=k_descale, v_descale=v_descale)
    if block_table is not None:
        _raise(UnsupportedError, "block_table", "set", "paged K/V is not supported by attend.torch yet")
    for t, n in ((q, "q"), (k, "k"), (v, "v")):
        _check_tensor(t, n, (3,))
    cu_q, cu_k = _cu(cu_seqlens_q, "cu_seqlens_q"), _cu(cu_seqlens_k, "cu_seqlens_k")
    kv8 = _kv8_fields(k, v, k_descale, v_descale, (cu_q.numel() - 1, k.shape[1]), k.shape[:2],
                      "flash_attn_varlen_func")
    if kv8 is None:
        q, k, v = _autocast(q, k, v)
    else:
        (q,) = _autocast(q)
    if cu_q.numel() != cu_k.numel() or cu_q.numel() < 2:
        _raise(ShapeMismatchError, "cu_seqlens_k.numel", cu_k.numel(),
               f"cu_seqlens_q and cu_seqlens_k need the same B+1 >= 2 entries (cu_seqlens_q has {cu_q.numel()})")
    _check_max_seqlen(cu_q, max_seqlen_q, "max_seqlen_q", "cu_seqlens_q")
    _check_max_seqlen(cu_k, max_seqlen_k, "max_seqlen_k", "cu_seqlens_k")
    spec = _flash_spec(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic)
    spec.update(batch=cu_q.numel() - 1, seqlen_q=int(max_seqlen_q), seqlen_kv=int(max_seqlen_k), layout="thd",
                total_q=q.shape[0], total_kv=k.shape[0], **(kv8[0] if kv8 else {}))
    spec = with_fields(spec, spec_fields, "flash_attn_varlen_func", not _compiling())
    return _with_kv8(Problem(spec, q, k, v, slopes=alibi_slopes, cu_q=cu_q, cu_kv=cu_k), kv8)


def flash_attn_varlen_func(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
        window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
        deterministic: bool = False, return_attn_probs: bool = False, block_table: Optional[torch.Tensor] = None,
        sinks: Optional[torch.Tensor] = None, k_descale: Union[torch.Tensor, float, None] = None,
        v_descale: Union[torch.Tensor, float, None] = None, **spec_fields: Any) -> FlashResult:
    """flash_attn.flash_attn_varlen_func: q (total_q, H, D), k (total_k, Hk, D),
    v (total_k, Hk, Dv), cu_seqlens int32 (B+1,); masks per sequence, bottom-right
    aligned; empty sequences allowed (their rows are 0, LSE -inf).
    return_attn_probs: (out, softmax_lse (H, total_q), S) with S an empty tensor
    (per-sequence keep masks: attend.torch.dropout_mask_varlen). block_table
    (paged K/V) raises UnsupportedError. ``**spec_fields`` as in flash_attn_func.
    k and v may be 8-bit codes (int8, float8_e4m3fn, float8_e5m2; inference
    only) standing for code * descale, as in flash_attn_func: k_descale /
    v_descale (1,) or a number per tensor, (B, Hk) per (sequence, kv head) —
    FA3's, and what a shape both could be means — or (total_k, Hk) per token."""
    if _kv8.requested(k, v, k_descale, v_descale):
        return _varlen_kv8(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                           causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table,
                           sinks, k_descale, v_descale, spec_fields)
    problem = _varlen_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                              softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                              return_attn_probs, block_table, **spec_fields)
    out, lse = problem.with_sinks(sinks).run()
    return (out, lse, q.new_empty(0)) if return_attn_probs else out


def _varlen_kv8(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table, sinks, k_descale,
                v_descale, spec_fields):
    problem = _varlen_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                              softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                              return_attn_probs, block_table, k_descale=k_descale, v_descale=v_descale,
                              **spec_fields).with_sinks(sinks)
    out, lse = _kv8_forward(problem.spec, dict(q=problem.q, k=k, v=v, alibi_slopes=alibi_slopes,
                                               cu_seqlens_q=problem.cu_q, cu_seqlens_kv=problem.cu_kv,
                                               sinks=problem.sinks, k_scale=problem.k_scale,
                                               v_scale=problem.v_scale), "flash_attn_varlen_func")
    return (out, lse, q.new_empty(0)) if return_attn_probs else out


def flash_attn_varlen_qkvpacked_func(
        qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
        window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
        deterministic: bool = False, return_attn_probs: bool = False, sinks: Optional[torch.Tensor] = None,
        **spec_fields: Any) -> FlashResult:
    """flash_attn.flash_attn_varlen_qkvpacked_func: qkv (total, 3, H, D)."""
    _check_tensor(qkv, "qkv", (4,))
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  deterministic, return_attn_probs, sinks=sinks, **spec_fields)


def flash_attn_varlen_kvpacked_func(
        q: torch.Tensor, kv: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
        max_seqlen_k: int, dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
        window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
        deterministic: bool = False, return_attn_probs: bool = False, sinks: Optional[torch.Tensor] = None,
        **spec_fields: Any) -> FlashResult:
    """flash_attn.flash_attn_varlen_kvpacked_func: q (total_q, H, D), kv (total_k, 2, Hk, D)."""
    _check_tensor(kv, "kv", (4,))
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  deterministic, return_attn_probs, sinks=sinks, **spec_fields)


# --- explain ------------------------------------------------------------------------------

_PROBLEMS = {"sdpa": lambda *a, **kw: _sdpa_problem(*a, **kw)[0], "flash_attn": _flash_problem,
             "flash_attn_varlen": _varlen_problem}


def explain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, api: str = "sdpa",
            mode: Optional[str] = None, **kwargs: Any) -> Explanation:
    """The verdict table a call would get, without running it.

    ``api`` names whose arguments follow q, k, v: "sdpa" (scaled_dot_product_attention,
    the default), "flash_attn" or "flash_attn_varlen". ``mode`` ("training" or
    "inference") defaults to what the call would use: training when grad mode is
    on and an input requires grad. Returns an attend.Explanation (``str()`` is the
    table, ``.data`` the structured form, ``.selected`` the backend or None)."""
    if api not in _PROBLEMS:
        _raise(InvalidArgumentError, "api", api, f"expected one of {sorted(_PROBLEMS)}")
    sinks = kwargs.pop("sinks", None)
    problem = _PROBLEMS[api](q, k, v, *args, **kwargs)
    if problem is None:
        _raise(InvalidArgumentError, "query.shape[0]", 0, "an empty batch has no problem to explain")
    return problem.with_sinks(sinks).explain(mode)


# --- flash_attn_with_kvcache ---------------------------------------------------------------

def _cache_slots(k_cache, block_table, seqlens, new_tokens):
    """(page, slot), each (B, S_new), where an append of new_tokens tokens at
    each sequence's end (seqlens: the lengths before it) writes."""
    ps, pages = k_cache.shape[1], block_table.shape[1]
    pos = seqlens.long().unsqueeze(1) + torch.arange(new_tokens).unsqueeze(0)  # (B, S_new)
    if pos.numel() and int(pos.max()) >= pages * ps:
        _raise(InvalidArgumentError, "cache_seqlens", seqlens.tolist(),
               f"appending {new_tokens} tokens passes the cache capacity of {pages * ps} tokens per sequence")
    page = block_table.long().gather(1, pos // ps)
    if pos.numel() and (int(page.min()) < 0 or int(page.max()) >= k_cache.shape[0]):
        _raise(InvalidArgumentError, "block_table", "entry", f"page ids must lie in [0, {k_cache.shape[0]})")
    return page, pos % ps


def _append_to_cache(k_cache, v_cache, k, v, block_table, seqlens):
    """Writes k, v (B, S_new, Hk, D) into the paged caches at each sequence's
    end, in place (as FlashAttention does); returns the new lengths."""
    page, slot = _cache_slots(k_cache, block_table, seqlens, k.shape[1])
    with torch.no_grad():
        k_cache[page, slot] = k
        v_cache[page, slot] = v
    return seqlens + k.shape[1]


def _kv8_codes(x, layout, scale, dtype):
    """x (B, S_new, Hk, D) as codes: per_token scale (B, S_new, Hk) of its own
    rows, per_head (B, Hk), per_tensor (1,), none 1."""
    if layout == "per_token":
        scale = scale.unsqueeze(-1)
    elif layout == "per_head":
        scale = scale[:, None, :, None]
    elif layout == "none":
        scale = 1.0
    return _kv8.quantize(x, scale, dtype)


def flash_attn_with_kvcache(
        q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor] = None,
        v: Optional[torch.Tensor] = None, rotary_cos: Optional[torch.Tensor] = None,
        rotary_sin: Optional[torch.Tensor] = None, cache_seqlens: Union[int, torch.Tensor, None] = None,
        cache_batch_idx: Optional[torch.Tensor] = None, cache_leftpad: Optional[torch.Tensor] = None,
        block_table: Optional[torch.Tensor] = None, softmax_scale: Optional[float] = None, causal: bool = False,
        window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, rotary_interleaved: bool = True,
        alibi_slopes: Optional[torch.Tensor] = None, num_splits: int = 0, return_softmax_lse: bool = False,
        sinks: Optional[torch.Tensor] = None, k_descale: Union[torch.Tensor, float, None] = None,
        v_descale: Union[torch.Tensor, float, None] = None,
        **spec_fields: Any) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """flash_attn.flash_attn_with_kvcache (inference): q (B, Sq, H, D); k_cache,
    v_cache (B_cache, S_cache, Hk, D) or, with block_table (B, max_pages) int32,
    page pools (num_blocks, page_block_size, Hk, D). k, v (B, S_new, Hk, D), when
    given, are written into the cache in place at cache_seqlens (int or (B,)
    int32, not updated: the caller advances it) and attended to. cache_leftpad
    (B,): each sequence's first valid token. cache_batch_idx (B,): the cache rows
    of a non-paged cache. Masks are bottom-right aligned to each sequence's keys.
    Returns out (B, Sq, H, Dv), and the LSE (B, H, Sq) with return_softmax_lse.
    Rotary embedding is not supported (apply it to q/k before the call).
    ``sinks``: (H) sink logits (gpt-oss style), as in flash_attn_func.

    8-bit caches: k_cache, v_cache int8, float8_e4m3fn or float8_e5m2 codes
    standing for code * descale, laid out as the descale's shape says: a
    number or (1,) per tensor, (B, Hk) per (sequence of q, kv head; FA3's
    k_descale / v_descale), k_cache's shape without its last dim per token,
    none given: scale 1. New k, v come in q's dtype and are quantized into the
    caches (round to nearest even, saturating at the largest code); per_token
    descales get the new tokens' scales (max |x| of each (token, kv head) row
    / the largest code) written in place, per_head and per_tensor ones are
    used as given. inf or NaN in k or v is refused before anything is written."""
    tensor_args = dict(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                       cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
                       block_table=block_table, alibi_slopes=alibi_slopes, sinks=sinks, k_descale=k_descale,
                       v_descale=v_descale)
    _refuse_transforms("flash_attn_with_kvcache", vmap_ok=False)  # it writes the caches in place
    _one_device("flash_attn_with_kvcache", **tensor_args)
    _no_meta("flash_attn_with_kvcache", "reads the cache lengths and writes the caches", **tensor_args)
    if rotary_cos is not None or rotary_sin is not None:
        _raise(UnsupportedError, "rotary_cos", "set", "attend applies no rotary embedding: rotate q and k first")
    _check_tensor(q, "q", (4,))
    _check_tensor(k_cache, "k_cache", (4,))
    _check_tensor(v_cache, "v_cache", (4,))
    # Named here, as the caller wrote them: the spec built below calls the
    # caches k and v, and a page of 0 slots would read as a shape rule on k.
    for cache, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        if cache.shape[1] == 0:
            _raise(ShapeMismatchError, f"{name}.shape[1]", 0, "a cache row needs at least one token slot ((batch, "
                   "seqlen_cache, heads, dim), or (pages, page_size, heads, dim) with a block_table)")
    if k_cache.shape[3] != q.shape[3]:
        _raise(ShapeMismatchError, "k_cache.shape[3]", k_cache.shape[3], f"head dim must equal q's {q.shape[3]}")
    if (k is None) != (v is None):
        _raise(InvalidArgumentError, "k" if k is None else "v", None, "k and v are appended together")
    B = q.shape[0]
    kv_dtype = kv_scale = k_scale = v_scale = None
    if _kv8.requested(k_cache, v_cache, k_descale, v_descale):
        kv_dtype = _kv8_dtype(k_cache, v_cache, "k_cache", "v_cache", k_descale, v_descale)
        kv_scale, k_scale, v_scale = _kv8.scale_layout(k_descale, v_descale, (B, k_cache.shape[2]),
                                                       k_cache.shape[:3])
    block_table = _kv_block_table(B, k_cache, block_table, cache_batch_idx)
    if cache_seqlens is None:
        seqlens = torch.full((B,), k_cache.shape[1] * block_table.shape[1], dtype=torch.int32)
    elif isinstance(cache_seqlens, int):
        if not _INT32_MIN <= cache_seqlens <= _INT32_MAX:
            _raise(InvalidArgumentError, "cache_seqlens", cache_seqlens, "outside the int32 range")
        seqlens = torch.full((B,), cache_seqlens, dtype=torch.int32)
    else:
        seqlens = _kv_per_sequence(cache_seqlens, "cache_seqlens", B)
    require_non_negative(seqlens, "cache_seqlens")
    pad = _kv_per_sequence(cache_leftpad, "cache_leftpad", B) if cache_leftpad is not None else None
    if k is not None:
        _kv_check_append(q, k_cache, v_cache, k, v, kv_dtype is not None)
        _kv_check_written(k_cache, v_cache, k_descale, v_descale, k_scale, v_scale, kv_scale)
        grown = seqlens.long() + k.shape[1]
        if B and int(grown.max()) > _INT32_MAX:
            _raise(InvalidArgumentError, "cache_seqlens", int(seqlens.max()),
                   f"appending {k.shape[1]} tokens passes the int32 range of cache lengths")
        seqlens = grown.to(torch.int32)
    left, right = _window(causal, window_size)
    keys = seqlens - pad if pad is not None else seqlens
    spec = dict(batch=B, seqlen_q=q.shape[1], seqlen_kv=max(int(keys.max()), 1) if B else 1, heads_q=q.shape[2],
                heads_kv=k_cache.shape[2], head_dim_qk=q.shape[3], head_dim_v=v_cache.shape[3],
                dtype=_masks.dtype_name(q, "q"), layout="bshd", scale=softmax_scale, causal=bool(causal),
                window_left=left, window_right=right, softcap=_softcap(softcap), alibi=alibi_slopes is not None,
                kv_page_size=k_cache.shape[1], kv_leftpad=pad is not None)
    if kv_dtype is not None:
        spec.update(kv_dtype=kv_dtype, kv_scale=kv_scale)
    spec = with_fields(spec, spec_fields, "flash_attn_with_kvcache", not _compiling())
    if sinks is not None:
        problem = Problem(spec, q, k_cache, v_cache).with_sinks(sinks)
        spec, sinks = problem.spec, problem.sinks.detach()
    tensors = dict(q=q.detach(), k=k_cache.detach(), v=v_cache.detach(), alibi_slopes=alibi_slopes,
                   block_table=block_table, cache_seqlens=seqlens, cache_leftpad=pad, sinks=sinks, k_scale=k_scale,
                   v_scale=v_scale)
    if k is not None and kv_dtype is not None:
        _append_kv8(spec, tensors, k_cache, v_cache, k, v, block_table, seqlens - k.shape[1], kv_scale,
                    cache_batch_idx is not None)
    elif k is not None:
        # Everything the call will be refused for is found before the caches
        # change: a refused call leaves them as they were. The tensors as they
        # will be after the append (their contents are not read), then whether
        # a backend runs the problem at all.
        descs, keep = _arrays.describe_all(tensors)
        _C.validate_cache_append(spec, descs, k.shape[1], cache_batch_idx is not None)
        _C.Plan(spec, "inference")
        del keep
        _append_to_cache(k_cache, v_cache, k, v, block_table, seqlens - k.shape[1])
    out, lse, _, _ = _autograd._native_forward(spec, "inference", tensors)
    return (out, lse) if return_softmax_lse else out


_INT32_MIN, _INT32_MAX = -2 ** 31, 2 ** 31 - 1


def _kv_per_sequence(t, name, batch):
    t = int32_index(t, name, 1)
    if t.shape[0] != batch:
        _raise(ShapeMismatchError, f"{name}.shape[0]", t.shape[0], f"needs one entry per sequence of q: {batch}")
    return t


def _kv_block_table(batch, k_cache, block_table, cache_batch_idx):
    """The (B, pages) int32 table the call reads the caches through: a dense
    cache is a pool of one page per cache row."""
    if block_table is not None:
        if cache_batch_idx is not None:
            _raise(UnsupportedError, "cache_batch_idx", "set", "cache_batch_idx needs a non-paged cache (as in FA2)")
        table = int32_index(block_table, "block_table", 2)
        if table.shape[0] != batch:
            _raise(ShapeMismatchError, "block_table.shape[0]", table.shape[0],
                   f"needs one row per sequence of q: {batch}")
        return table
    rows = k_cache.shape[0]
    if cache_batch_idx is None:
        if rows < batch:
            _raise(ShapeMismatchError, "k_cache.shape[0]", rows, f"fewer cache rows than q's batch {batch}: pass "
                   "cache_batch_idx or a larger cache")
        return torch.arange(batch, dtype=torch.int32).reshape(batch, 1)
    idx = _kv_per_sequence(cache_batch_idx, "cache_batch_idx", batch)
    bad = (idx < 0) | (idx >= rows)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        _raise(InvalidArgumentError, f"cache_batch_idx[{i}]", int(idx[i]), f"must lie in [0, {rows}) (the cache's "
               "rows)")
    return idx.reshape(batch, 1)


def _append_kv8(spec, tensors, k_cache, v_cache, k, v, block_table, seqlens, layout, batch_idx):
    """Quantizes k, v (B, S_new, Hk, D) into 8-bit caches at each sequence's
    end (seqlens: the lengths before the append), all or nothing: inf/NaN, a
    bad slot or scale, or a problem no backend runs is refused before the
    caches change (per_token scales, written first so that validation sees the
    scales the call will read, are put back)."""
    refuse = (lambda t, n: _kv8.refuse_non_finite(t.detach(), n))
    refuse(k, "k")
    refuse(v, "v")
    page, slot = _cache_slots(k_cache, block_table, seqlens, k.shape[1])
    dtype, k_scale, v_scale = k_cache.dtype, tensors["k_scale"], tensors["v_scale"]
    with torch.no_grad():
        k, v = k.detach(), v.detach()
        if layout == "per_token":
            old = (k_scale[page, slot].clone(), v_scale[page, slot].clone())
            new_k, new_v = _kv8.token_scales(k, dtype), _kv8.token_scales(v, dtype)
            k_scale[page, slot], v_scale[page, slot] = new_k, new_v
            k_codes, v_codes = _kv8_codes(k, layout, new_k, dtype), _kv8_codes(v, layout, new_v, dtype)
        else:
            k_codes, v_codes = _kv8_codes(k, layout, k_scale, dtype), _kv8_codes(v, layout, v_scale, dtype)
        try:
            descs, keep = _arrays.describe_all(tensors)
            _C.validate_cache_append(spec, descs, k.shape[1], batch_idx)
            _C.Plan(spec, "inference")
            del keep
        except Exception:
            if layout == "per_token":
                k_scale[page, slot], v_scale[page, slot] = old
            raise
        k_cache[page, slot] = k_codes
        v_cache[page, slot] = v_codes


def _kv_check_append(q, k_cache, v_cache, k, v, kv8=False):
    """New keys and values must already be what the caches hold: attend neither
    broadcasts them over sequences or heads nor casts them (8-bit caches take
    them in q's dtype and quantize them)."""
    B = q.shape[0]
    for t, name, cache in ((k, "k", k_cache), (v, "v", v_cache)):
        _check_tensor(t, name, (4,))
        if t.shape[0] != B:
            _raise(ShapeMismatchError, f"{name}.shape[0]", t.shape[0], f"batch must equal q's {B} (appended "
                   "tokens are not broadcast over sequences)")
        if t.shape[2] != cache.shape[2]:
            _raise(ShapeMismatchError, f"{name}.shape[2]", t.shape[2], f"heads must equal {name}_cache's "
                   f"{cache.shape[2]} (appended tokens are not broadcast over heads)")
        if t.shape[3] != cache.shape[3]:
            _raise(ShapeMismatchError, f"{name}.shape[3]", t.shape[3], f"head dim must equal {name}_cache's "
                   f"{cache.shape[3]}")
        if kv8 and t.dtype != q.dtype:
            _raise(InvalidArgumentError, f"{name}.dtype", t.dtype, f"must equal q's {q.dtype}: new tokens of an "
                   f"8-bit {name}_cache come in q's dtype and are quantized into it")
        elif not kv8 and t.dtype != cache.dtype:
            _raise(InvalidArgumentError, f"{name}.dtype", t.dtype, f"must equal {name}_cache's {cache.dtype} "
                   "(appended tokens are not cast)")
    if v.shape[1] != k.shape[1]:
        _raise(ShapeMismatchError, "v.shape[1]", v.shape[1], f"must equal k's {k.shape[1]} new tokens")


def _kv_check_written(k_cache, v_cache, k_descale, v_descale, k_scale, v_scale, kv_scale):
    """An append writes the caches, and a per-token 8-bit cache's descales, in
    place: each must be a tensor of its own, one element per slot. Refused
    before anything changes: a missing per-token descale (the new tokens'
    scales would go into a temporary, and the next call read the codes at 1),
    an expanded view (every token would share one scale, rewritten by each
    append), and K's and V's tensors being one memory (V's writes would
    overwrite K's)."""
    written = [(k_cache, "k_cache", v_cache, "v_cache")]
    if kv_scale == "per_token":
        for d, name in ((k_descale, "k_descale"), (v_descale, "v_descale")):
            if d is None:
                _raise(InvalidArgumentError, name, None, "appending to a per-token 8-bit cache writes the new "
                       "tokens' scales into k_descale and v_descale: pass both (the cache's scales)")
        written.append((k_scale, "k_descale", v_scale, "v_descale"))
    for a, a_name, b, b_name in written:
        for t, name in ((a, a_name), (b, b_name)):
            if torch._debug_has_internal_overlap(t) == 1:
                _raise(InvalidArgumentError, name, f"strides {tuple(t.stride())}", "elements share memory (an "
                       "expanded view?): an append writes it in place, one element per slot")
        if a.data_ptr() == b.data_ptr() and a.numel() and b.numel():
            _raise(InvalidArgumentError, b_name, "the same memory as " + a_name, "an append writes both in "
                   "place: K's and V's must be separate tensors")


def _cu_like(t, name, dims):
    return int32_index(t, name, dims)
