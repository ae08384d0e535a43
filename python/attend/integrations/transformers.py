"""attend as a Hugging Face transformers attention implementation.

    import attend.integrations.transformers  # registers "attend"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="attend")
    model.set_attn_implementation("attend")  # or switch a loaded model

Importing this module registers two functions under the name "attend":

- with ``AttentionMaskInterface``, a mask function. transformers calls it once
  per forward and mask kind (full, sliding) instead of building a dense
  (B, 1, Sq, Sk) mask; it returns a :class:`PaddingMask` (which keys of each
  sequence are real, where the queries sit among the keys, and the causal /
  sliding-window pattern read off the model's mask function);
- with ``AttentionInterface``, the attention function every attention layer
  calls. It maps the layer's problem onto attend.torch:

  * no padding: ``flash_attn_func`` on the (B, H, S, D) tensors as they are
    (strided views, no copy): causal bottom-right aligned, so a query block
    shorter than the keys (cached generation) sits at the end of the keys;
  * padded batches (left padding in generation, right padding in training):
    ``flash_attn_varlen_func`` over each sequence's real tokens (query rows
    and keys gathered with autograd, the output scattered back, padding rows
    0); in inference with left padding only (``generate``),
    ``flash_attn_with_kvcache`` reads the keys in place from each sequence's
    first real key (``cache_leftpad``), with no gather;
  * padding-free batches (sequences packed into one row, position_ids that
    restart, or FlashAttention's ``cu_seq_lens_q``/``cu_seq_lens_k``):
    ``flash_attn_varlen_func`` over the flattened tokens, each sequence on
    its own;
  * GQA/MQA without repeating K/V, the layer's ``scaling``, ``softcap``
    (Gemma-2), attention sinks (gpt-oss ``s_aux``, with their gradient) and
    ``dropout`` as the layer passes them; autograd through attend's backward.

  A mask attend cannot express (a model's own mask function, e.g. image-token
  overlays or chunked attention, or key padding with holes) falls back, with
  a warning naming the reason, to a dense boolean mask that attend runs as an
  additive bias (``scaled_dot_product_attention``): still attend, but with a
  dense mask. A 4-D mask passed in by the caller is run the same way.

The tensors' device decides the backend: attend's CPU backends today; on
another device attend raises an error naming the device. ``ATTEND_LOG=info``
prints each new selection (which backend runs which layer's problem).
"""

import logging
from typing import Any, Optional, Tuple

import torch

try:
    import transformers
    from transformers import masking_utils
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface
except ImportError as e:
    raise ImportError(f"attend.integrations.transformers needs Hugging Face transformers with "
                      f"AttentionInterface and AttentionMaskInterface (pip install 'attend[transformers]'): {e}") from e

from .. import _kv8
from ..errors import InvalidArgumentError, ShapeMismatchError, UnsupportedError, _raise
from .._torch_inputs import one_device
from ..torch import (flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache,
                     scaled_dot_product_attention)

__all__ = ["NAME", "PaddingMask", "QuantizedKVCache", "attention_forward", "create_mask", "register"]

NAME = "attend"

logger = logging.getLogger(__name__)
_warned = set()


def _warn_once(reason, message):
    if reason not in _warned:
        _warned.add(reason)
        logger.warning(message)


class PaddingMask:
    """What the "attend" mask function hands each attention layer in place of a
    dense 4-D mask.

    keys: bool (B, kv_length), True for a real key (None: every key is real);
    q_start: the key index of query row 0 (row i sits at key q_start + i);
    left, right: the window in key positions around each query (-1:
    unbounded), right == 0 being causal;
    segments: for packed sequences (padding-free batches: position_ids that
    restart), (B, S) ids, nondecreasing along each row, of the sequence each
    token belongs to; attention stays within a sequence. None otherwise.

    ``shape`` and ``ndim`` are those of the dense mask it stands for, as
    transformers reads them from a mask built ahead of the forward (``generate``
    with a static cache builds the masks once per step and hands them to the
    model, whose own mask creation must then pass them through)."""

    __slots__ = ("keys", "q_start", "left", "right", "batch", "q_length", "kv_length", "segments")
    ndim = 4

    def __init__(self, keys: Optional[torch.Tensor], q_start: int, left: int, right: int, batch: int,
                 q_length: int, kv_length: int, segments: Optional[torch.Tensor] = None):
        self.keys, self.q_start, self.left, self.right = keys, q_start, left, right
        self.batch, self.q_length, self.kv_length, self.segments = batch, q_length, kv_length, segments

    @property
    def shape(self) -> Tuple[int, int, int, int]:
        return self.batch, 1, self.q_length, self.kv_length

    def dim(self) -> int:
        return 4

    def __repr__(self):
        keys = None if self.keys is None else tuple(self.keys.shape)
        return (f"PaddingMask(keys={keys}, q_start={self.q_start}, left={self.left}, right={self.right}, "
                f"shape={self.shape})")


# --- reading transformers' mask functions ---------------------------------------------------------

def _code(factory, *args):
    """The code object of the closures `factory` makes (None if this transformers lacks it)."""
    f = getattr(masking_utils, factory, None)
    return f(*args).__code__ if f is not None else None


_AND = _code("and_masks", masking_utils.causal_mask_function)
_SLIDING = _code("sliding_window_overlay", 1)
_SLIDING_BIDIRECTIONAL = _code("sliding_window_bidirectional_overlay", 1)
_PACKED = _code("packed_sequence_mask_function", None)
_REMAP = _code("remap_positions_for_packed_sequence", masking_utils.causal_mask_function, None)


def _cells(fn):
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))


def _tighter(a, b):
    return b if a < 0 else a if b < 0 else min(a, b)


def _pattern(fn) -> Optional[Tuple[int, int, Optional[torch.Tensor]]]:
    """(left, right, segments) of a transformers mask function built from its
    causal, bidirectional, sliding-window and packed-sequence pieces (-1: an
    unbounded side; segments: the packed-sequence ids or None); None for any
    other function, whose meaning only evaluating it would tell."""
    if fn is masking_utils.causal_mask_function:
        return -1, 0, None  # kv <= q
    if fn is masking_utils.bidirectional_mask_function:
        return -1, -1, None
    code = getattr(fn, "__code__", None)
    if code is None or code not in (_AND, _SLIDING, _SLIDING_BIDIRECTIONAL, _PACKED, _REMAP):
        return None
    cells = _cells(fn)
    if code is _SLIDING:  # kv > q - w
        return int(cells["sliding_window"]) - 1, -1, None
    if code is _SLIDING_BIDIRECTIONAL:  # |q - kv| <= w
        w = int(cells["sliding_window"])
        return w, w, None
    if code is _PACKED:  # same sequence id
        return -1, -1, cells["packed_sequence_mask"]
    if code is _REMAP:
        # Positions renumbered from each packed sequence's start: within a
        # sequence they still step by one (that is how transformers finds the
        # sequences), so distances, and the window, are unchanged.
        return _pattern(cells["mask_function"])
    left, right, segments = -1, -1, None  # and_masks: the intersection of its parts
    for part in cells["mask_functions"]:
        p = _pattern(part)
        if p is None or (p[2] is not None and segments is not None):
            return None
        left, right, segments = _tighter(left, p[0]), _tighter(right, p[1]), (
            p[2] if p[2] is not None else segments)
    return left, right, segments


def create_mask(batch_size: int, q_length: Optional[int] = None, kv_length: Optional[int] = None, q_offset: Any = 0,
                kv_offset: Any = 0, mask_function: Any = masking_utils.causal_mask_function,
                attention_mask: Any = None, cache_position: Optional[torch.Tensor] = None, **kwargs: Any):
    """transformers' mask-interface signature (masking_utils.sdpa_mask's, either
    form: q_length and q_offset, or, before transformers 5.x moved to them, the
    query positions as cache_position): a PaddingMask when attend can run the
    mask as it is, else a dense boolean (B, 1, q_length, kv_length) mask (with a
    warning saying why)."""
    if isinstance(attention_mask, PaddingMask):
        return attention_mask  # built ahead of the forward (generate with a static cache)
    if kv_length is None:
        _raise(InvalidArgumentError, "kv_length", None, "transformers passes the key length to mask functions")
    if cache_position is not None:
        q_length, q_offset = int(cache_position.shape[0]), int(cache_position[0]) if cache_position.numel() else 0
        if q_length and int(cache_position[-1]) != q_offset + q_length - 1:
            _raise(UnsupportedError, "cache_position", cache_position.tolist(),
                   "query positions must be consecutive")
    if q_length is None:
        _raise(InvalidArgumentError, "q_length", None, "transformers passes q_length or cache_position")
    pattern = _pattern(mask_function)
    q_offset, kv_offset = int(q_offset), int(kv_offset)
    if pattern is None:
        _warn_once(("mask_function", getattr(mask_function, "__qualname__", "")),
                   f"attend: the model's mask function {getattr(mask_function, '__qualname__', mask_function)!r} "
                   "is not a causal/sliding-window pattern attend reads; falling back to a dense "
                   f"(B, 1, {q_length}, {kv_length}) mask, which attend runs as an additive bias")
        where = (dict(cache_position=cache_position) if cache_position is not None
                 else dict(q_length=q_length, q_offset=q_offset))
        kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
        return masking_utils.sdpa_mask(batch_size=batch_size, kv_length=kv_length, kv_offset=kv_offset,
                                       mask_function=mask_function, attention_mask=attention_mask, **where,
                                       **kwargs)
    keys = None
    if attention_mask is not None:
        # Key index j is sequence position kv_offset + j; positions past the 2-D
        # mask (a static cache's unused slots) are not keys (as in sdpa_mask).
        keys = attention_mask.to(torch.bool)
        short = kv_offset + kv_length - keys.shape[-1]
        if short > 0:
            keys = torch.nn.functional.pad(keys, (0, short), value=False)
        keys = keys[:, kv_offset:kv_offset + kv_length]
        if bool(keys.all()):
            keys = None
    left, right, segments = pattern
    return PaddingMask(keys, q_offset - kv_offset, left, right, batch_size, q_length, kv_length, segments)


# --- the attention function ---------------------------------------------------------------------

def _dense(query, key, value, mask, dropout, scaling, softcap, sinks):
    """A dense (B|1, 1|H, Sq, >= Sk) bool or additive mask, run by attend as a bias."""
    if mask.dim() != 4:
        _raise(ShapeMismatchError, "attention_mask.dim", mask.dim(), "expected a 4-D (B, 1, Sq, Sk) mask, a 2-D "
               "(B, Sk) padding mask or the PaddingMask of the 'attend' mask function")
    mask = mask[:, :, :, :key.shape[-2]]  # as eager attention slices it
    if mask.dtype != torch.bool and mask.dtype != query.dtype:
        mask = mask.to(query.dtype)
    extra = {"softcap": float(softcap)} if softcap else {}
    out = scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling,
                                       enable_gqa=True, sinks=sinks, **extra)
    return out.transpose(1, 2)


def _cumulative(lengths):
    """cu_seqlens (int32, from 0) of per-sequence lengths."""
    return torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))


def _runs(valid):
    """Per sequence, the first real key, one past the last and the count."""
    n = valid.shape[1]
    count = valid.sum(1)
    first = torch.where(count > 0, valid.to(torch.int8).argmax(1), torch.zeros_like(count))
    last = torch.where(count > 0, n - valid.flip(1).to(torch.int8).argmax(1), torch.zeros_like(count))
    return first, last, count


def _padded(q, k, v, m, flash, dense_fallback):
    """Attention over each sequence's real keys. q (B, Sq, H, D), k/v (B, Sk, Hk, D)."""
    B, Sq, Sk = q.shape[0], q.shape[1], k.shape[1]
    valid = m.keys if m.keys is not None else torch.ones(B, Sk, dtype=torch.bool, device=k.device)
    positional = m.left >= 0 or m.right >= 0
    if not positional:
        # No mask depends on positions: every query row attends to its sequence's
        # real keys, wherever they are (holes too).
        _no_kv8(k, "a padding mask without a causal or window pattern")
        nk = valid.sum(1)
        cu_q = torch.arange(B + 1, dtype=torch.int32, device=q.device) * Sq
        cu_k = _cumulative(nk)
        out = flash_attn_varlen_func(q.reshape(B * Sq, *q.shape[2:]), k[valid], v[valid], cu_q, cu_k, Sq,
                                     max(int(nk.max()), 1), causal=False, **flash)
        return out.view(B, Sq, *out.shape[1:])
    first, last, count = _runs(valid)
    if bool(((last - first != count) & (count > 0)).any()):
        return dense_fallback("padding with holes", "key padding that is not one run of real keys per sequence "
                              "(e.g. right padding in generation)")
    # Query rows whose own position is a real key, [q_lo, q_hi); the keys they
    # can see end at the last such row (causal) for bottom-right alignment.
    q_lo = (first - m.q_start).clamp(0, Sq)
    q_hi = (last - m.q_start).clamp(0, Sq)
    if m.right != 0 and bool((last > m.q_start + Sq).any()):
        return dense_fallback("keys after the queries", "a window that sees real keys after the last query row")
    nq = (q_hi - q_lo).clamp(min=0)
    nk = torch.where(nq > 0, m.q_start + q_hi - first, torch.zeros_like(nq))
    left, right = m.left, m.right
    if (not torch.is_grad_enabled() or not any(t.requires_grad for t in (q, k, v))) \
            and flash["dropout_p"] == 0.0 and bool((q_hi == Sq).all()) and bool((first + nk == Sk).all()):
        # Left padding only, nothing to differentiate (generate): the cache reader
        # takes each sequence's keys from its first real one, in place. Rows
        # before a sequence's first real token are padding, whose output nobody
        # reads (under a causal mask they see no key and come out 0).
        return flash_attn_with_kvcache(q, k, v, cache_seqlens=Sk, cache_leftpad=first.to(torch.int32),
                                       softmax_scale=flash["softmax_scale"], causal=right == 0,
                                       window_size=(left, right), softcap=flash["softcap"], sinks=flash["sinks"],
                                       k_descale=flash.get("k_descale"), v_descale=flash.get("v_descale"))
    _no_kv8(k, "padding other than left padding in inference (generate)")
    rows = torch.arange(Sq, device=q.device)
    cols = torch.arange(Sk, device=k.device)
    q_sel = (rows >= q_lo[:, None]) & (rows < q_hi[:, None])
    k_sel = (cols >= first[:, None]) & (cols < (first + nk)[:, None])
    cu_q = _cumulative(nq)
    cu_k = _cumulative(nk)
    out = flash_attn_varlen_func(q[q_sel], k[k_sel], v[k_sel], cu_q, cu_k, max(int(nq.max()), 1),
                                 max(int(nk.max()), 1), causal=right == 0, window_size=(left, right), **flash)
    return out.new_zeros(B, Sq, *out.shape[1:]).index_put((q_sel,), out)


def _no_kv8(k, what):
    if _kv8.is_kv8(k):
        _raise(UnsupportedError, "key.dtype", k.dtype, f"8-bit K/V (QuantizedKVCache) run without padding or with "
               f"left padding in generation; {what} needs attend's varlen or dense-mask path, which takes no 8-bit "
               "K/V")


def _flat(q, k, v, cu_q, cu_k, m, flash):
    """Sequences packed along the flattened (B * S) tokens, split at cu_q / cu_k
    (padding-free batches), each attended on its own."""
    _no_kv8(k, "a padding-free batch")
    B, Sq, Sk = q.shape[0], q.shape[1], k.shape[1]
    cu_q, cu_k = cu_q.to(torch.int32), cu_k.to(torch.int32)
    for cu, n, total in ((cu_q, "cu_seq_lens_q", B * Sq), (cu_k, "cu_seq_lens_k", B * Sk)):
        if cu.dim() != 1 or cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != total:
            _raise(ShapeMismatchError, n, cu.tolist(), f"expected cumulative lengths from 0 to the {total} "
                   "tokens of the flattened batch")
    out = flash_attn_varlen_func(q.reshape(B * Sq, *q.shape[2:]), k.reshape(B * Sk, *k.shape[2:]),
                                 v.reshape(B * Sk, *v.shape[2:]), cu_q, cu_k, int(cu_q.diff().max()),
                                 int(cu_k.diff().max()), causal=m.right == 0, window_size=(m.left, m.right), **flash)
    return out.view(B, Sq, *out.shape[1:])


def _cu_from_segments(segments):
    """Cumulative lengths of the flattened runs of equal ids (a new run at each
    row too)."""
    B, S = segments.shape
    start = torch.ones(B, S, dtype=torch.bool, device=segments.device)
    start[:, 1:] = segments[:, 1:] != segments[:, :-1]
    idx = start.flatten().nonzero().flatten().to(torch.int32)
    return torch.cat([idx, idx.new_tensor([B * S])])


def _keep(m, batch, sq, sk, device):
    """The dense (B, 1, Sq, Sk) keep mask of a PaddingMask (for the fallback)."""
    i = torch.arange(sq, device=device)[:, None] + m.q_start
    j = torch.arange(sk, device=device)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if m.left >= 0:
        keep &= j >= i - m.left
    if m.right >= 0:
        keep &= j <= i + m.right
    keep = keep.expand(batch, 1, sq, sk)
    return keep & m.keys[:, None, None, :] if m.keys is not None else keep


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Any, dropout: float = 0.0, scaling: Optional[float] = None,
                      sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                      is_causal: Optional[bool] = None, s_aux: Optional[torch.Tensor] = None,
                      sinks: Optional[torch.Tensor] = None, position_bias: Optional[torch.Tensor] = None,
                      **kwargs: Any) -> Tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query (B, H, Sq, D), key and
    value (B, Hk, Sk, D) -> ((B, Sq, H, Dv), None). No attention weights are
    returned (attend never forms them)."""
    if position_bias is not None:
        _raise(UnsupportedError, "position_bias", "set", "attend adds no learned relative position bias "
               "(T5-style models): use attn_implementation='eager' or 'sdpa' for this model")
    if kwargs.get("output_attentions"):
        _warn_once("output_attentions", "attend: output_attentions=True returns None for the attention weights "
                   "(attend never forms them; use attn_implementation='eager' to get them)")
    for t, n in ((query, "query"), (key, "key"), (value, "value")):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            _raise(ShapeMismatchError, f"{n}.dim", getattr(t, "dim", lambda: None)(),
                   "expected (batch, heads, seq, head_dim) tensors")
    if sinks is None:
        sinks = s_aux  # gpt-oss names its sink logits s_aux
    one_device("attend's transformers attention", query=query, key=key, value=value, attention_mask=attention_mask,
               sinks=sinks, cu_seq_lens_q=kwargs.get("cu_seq_lens_q"), cu_seq_lens_k=kwargs.get("cu_seq_lens_k"))
    softcap = float(softcap) if softcap else 0.0
    dropout = float(dropout)
    flash = dict(dropout_p=dropout, softmax_scale=scaling, softcap=softcap, sinks=sinks)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # (B, S, H, D) views
    B, Sq, Sk = q.shape[0], q.shape[1], k.shape[1]
    kv8 = _kv8.is_kv8(key)
    if kv8:
        # Codes from QuantizedKVCache.update(), which hangs their scales on
        # them: attend reads the codes, nothing is dequantized here.
        k_descale, v_descale = getattr(key, _DESCALE, None), getattr(value, _DESCALE, None)
        if k_descale is None or v_descale is None:
            _raise(InvalidArgumentError, "key.dtype", key.dtype, "8-bit keys and values need their scales: store "
                   "them with attend.integrations.transformers.QuantizedKVCache")
        flash.update(k_descale=k_descale, v_descale=v_descale)

    m = attention_mask
    if isinstance(m, torch.Tensor) and m.dim() == 4:
        _warn_once("4d", "attend: a dense 4-D attention mask was passed in; attend runs it as an additive bias "
                   "(a 2-D padding mask or the model's own mask creation avoids the dense mask)")
        _no_kv8(key, "a dense 4-D mask")
        return _dense(query, key, value, m, dropout, scaling, softcap, sinks), None
    if m is None or isinstance(m, torch.Tensor):
        # No mask from the 'attend' mask function (a model calling attention
        # directly, or a raw 2-D padding mask): the layer's own flags decide,
        # queries at the end of the keys, as FlashAttention reads them.
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        w = int(sliding_window) - 1 if sliding_window else -1
        if m is not None and (m.dim() != 2 or m.shape[0] != B or m.shape[1] < Sk):
            _raise(ShapeMismatchError, "attention_mask.shape", tuple(m.shape),
                   f"expected a 2-D (batch={B}, keys>={Sk}) padding mask or a 4-D mask")
        keys = m[:, -Sk:].to(torch.bool) if m is not None else None
        m = PaddingMask(None if keys is None or bool(keys.all()) else keys, Sk - Sq, w,
                        0 if causal else w, B, Sq, Sk)
    if not isinstance(m, PaddingMask):
        _raise(InvalidArgumentError, "attention_mask", type(m).__name__,
               "expected None, a 2-D or 4-D tensor, or the PaddingMask of the 'attend' mask function")
    if Sk < m.kv_length:
        _raise(ShapeMismatchError, "key.shape[2]", Sk, f"the mask covers {m.kv_length} keys")
    if Sk > m.kv_length:  # a static cache longer than the mask: the rest are unused slots
        k, v, key, value, Sk = k[:, :m.kv_length], v[:, :m.kv_length], key[:, :, :m.kv_length], \
            value[:, :, :m.kv_length], m.kv_length
        if kv8 and flash["k_descale"].dim() == 3:  # per_token scales (B, S, Hk) follow the keys
            flash.update(k_descale=flash["k_descale"][:, :Sk], v_descale=flash["v_descale"][:, :Sk])

    def dense_fallback(reason, what):
        _no_kv8(k, what)
        _warn_once(reason, f"attend: {what} has no varlen form; falling back to a dense mask that attend runs "
                   "as an additive bias")
        return _dense(query, key, value, _keep(m, B, Sq, Sk, query.device), dropout, scaling, softcap, sinks)

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if m.segments is not None:  # packed sequences found in position_ids (no cache: queries are the keys)
        if m.keys is not None or tuple(m.segments.shape) != (B, Sq) or Sq != Sk or m.q_start != 0:
            _raise(ShapeMismatchError, "packed_sequence_mask.shape", tuple(m.segments.shape),
                   f"packed sequences need queries that are the keys, (B, S) = ({B}, {Sk}), and no padding mask")
        cu_q = cu_k = _cu_from_segments(m.segments)
    if cu_q is not None or cu_k is not None:  # padding-free: FlashAttention's cu_seq_lens kwargs
        if cu_q is None or cu_k is None or m.keys is not None:
            _raise(InvalidArgumentError, "cu_seq_lens_k" if cu_k is None else "cu_seq_lens_q",
                   None if cu_k is None or cu_q is None else "set", "a padding-free batch needs both cu_seq_lens_q "
                   "and cu_seq_lens_k, and no padding in the attention mask")
        out = _flat(q, k, v, cu_q, cu_k, m, flash)
    elif m.keys is None and (m.q_start + Sq == Sk or (m.left < 0 and m.right < 0)):
        out = flash_attn_func(q, k, v, causal=m.right == 0, window_size=(m.left, m.right), **flash)
    else:
        out = _padded(q, k, v, m, flash, dense_fallback)
    return out, None


# --- an 8-bit KV cache -----------------------------------------------------------------------------

# The attribute of the key/value code tensors QuantizedKVCache.update() returns
# that holds their scales (the attention function reads it): transformers
# hands update()'s tensors to the attention function as they are.
_DESCALE = "_attend_descale"
_KV8_DTYPES = {"int8": torch.int8, "i8": torch.int8}
for _n, _a in (("float8_e4m3fn", "fp8_e4m3"), ("float8_e5m2", "fp8_e5m2")):
    if hasattr(torch, _n):
        _KV8_DTYPES[_n] = _KV8_DTYPES[_a] = getattr(torch, _n)


class QuantizedKVLayer(transformers.cache_utils.DynamicLayer):
    """One layer of a QuantizedKVCache: K and V as 8-bit codes in (B, capacity,
    Hk, D) buffers that grow by doubling, with f32 scales (B, capacity, Hk)
    per_token or (B, Hk) per_head."""

    is_croppable = True

    def __init__(self, kv_dtype: torch.dtype = torch.int8, kv_scale: str = "per_token"):
        super().__init__()
        self.kv_dtype, self.kv_scale = kv_dtype, kv_scale
        self.length = 0
        self._k = self._v = self._ks = self._vs = self._kfix = self._vfix = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    def _grow(self, batch, need, heads, dk, dv):
        cap = 0 if self._k is None else self._k.shape[1]
        if need <= cap:
            return
        cap = max(need, 2 * cap, 64)
        def bigger(old, shape, dtype):
            new = torch.empty(shape, dtype=dtype, device=self.device)
            if old is not None:
                new[:, :self.length] = old[:, :self.length]
            return new
        self._k = bigger(self._k, (batch, cap, heads, dk), self.kv_dtype)
        self._v = bigger(self._v, (batch, cap, heads, dv), self.kv_dtype)
        if self.kv_scale == "per_token":
            self._ks = bigger(self._ks, (batch, cap, heads), torch.float32)
            self._vs = bigger(self._vs, (batch, cap, heads), torch.float32)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        """Quantizes the new (B, Hk, S, D) states into the cache and returns every
        stored token's codes as (B, Hk, S_total, D) views, their scales attached
        for attend's attention function."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        # Refused before anything changes: no 8-bit code holds inf or NaN.
        _kv8.refuse_non_finite(key_states, "key_states")
        _kv8.refuse_non_finite(value_states, "value_states")
        k, v = key_states.transpose(1, 2), value_states.transpose(1, 2)  # (B, S, Hk, D)
        B, S, H = k.shape[0], k.shape[1], k.shape[2]
        if self._k is not None and self._k.shape[0] != B:
            _raise(ShapeMismatchError, "key_states.shape[0]", B, f"the cache holds {self._k.shape[0]} sequences")
        self._grow(B, self.length + S, H, k.shape[3], v.shape[3])
        end = self.length + S
        with torch.no_grad():
            if self.kv_scale == "per_token":
                ks, vs = _kv8.token_scales(k, self.kv_dtype), _kv8.token_scales(v, self.kv_dtype)
                self._ks[:, self.length:end], self._vs[:, self.length:end] = ks, vs
                ks, vs = ks.unsqueeze(-1), vs.unsqueeze(-1)
            else:
                # per_head: each (sequence, kv head)'s scale is fixed by its first
                # non-zero values, with headroom (attend.KVCache's rule; until then
                # every code it stored is 0, which reads 0 at any scale).
                if self._ks is None:
                    self._ks, self._vs = (torch.ones(B, H, dtype=torch.float32, device=k.device) for _ in range(2))
                    self._kfix, self._vfix = (torch.zeros(B, H, dtype=torch.bool, device=k.device) for _ in range(2))
                for scale, fixed, x in ((self._ks, self._kfix, k), (self._vs, self._vfix, v)):
                    first = ~fixed & (x.float().abs().amax(dim=(1, 3)) > 0)
                    scale[first] = _kv8.head_scales(x, self.kv_dtype, (1, 3))[first]
                    fixed |= first
                ks, vs = self._ks[:, None, :, None], self._vs[:, None, :, None]
            self._k[:, self.length:end] = _kv8.quantize(k, ks, self.kv_dtype)
            self._v[:, self.length:end] = _kv8.quantize(v, vs, self.kv_dtype)
        self.length = end
        return self._views()

    def _views(self):
        keys, values = self._k[:, :self.length].transpose(1, 2), self._v[:, :self.length].transpose(1, 2)
        per_token = self.kv_scale == "per_token"
        setattr(keys, _DESCALE, self._ks[:, :self.length] if per_token else self._ks)
        setattr(values, _DESCALE, self._vs[:, :self.length] if per_token else self._vs)
        self.keys, self.values = keys, values
        return keys, values

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def nbytes(self) -> int:
        """Bytes of the stored tokens: codes and scales (allocated capacity aside)."""
        if self._k is None:
            return 0
        b, _, h, _ = self._k.shape
        codes = self.length * b * h * (self._k.shape[3] + self._v.shape[3]) * self._k.element_size()
        scales = (2 * self.length * b * h if self.kv_scale == "per_token" else 2 * b * h) * 4
        return codes + scales

    def reset(self) -> None:
        self.length = 0
        self._k = self._v = self._ks = self._vs = self._kfix = self._vfix = None
        self.keys = self.values = None
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove (transformers' convention)")
        self.length = max(self.length + tokens_to_remove, 0)
        if self._k is not None:
            self._views()

    def _select(self, index):
        if self._k is None:
            return
        self._k, self._v = self._k[index], self._v[index]
        if self._ks is not None:
            self._ks, self._vs = self._ks[index], self._vs[index]
        if self._kfix is not None:
            self._kfix, self._vfix = self._kfix[index], self._vfix[index]
        self._views()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._select(beam_idx.to(self.device))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._select(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._k is not None:
            self._select(torch.arange(self._k.shape[0], device=self.device).repeat_interleave(repeats))


class QuantizedKVCache(transformers.Cache):
    """A transformers Cache holding K and V in 8 bits, read by attend as they
    are (attn_implementation="attend"; no layer dequantizes the cache):

        cache = QuantizedKVCache(model.config)                 # int8, per-token scales
        cache = QuantizedKVCache(model.config, "float8_e4m3fn")  # fp8, per-head scales
        model.generate(**inputs, past_key_values=cache)

    ``kv_dtype``: "int8" (default), "float8_e4m3fn" or "float8_e5m2" (torch >=
    2.1), or the torch dtype. ``kv_scale``: "per_token" (int8's default: one
    f32 scale per token and kv head, max |x| / code max, so each row's largest
    element is exact) or "per_head" (fp8's default: one per sequence and kv
    head, fixed at its first non-zero update (the prompt) at twice its max |x|
    / code max; later values beyond that saturate at the largest code). Values are
    rounded to nearest even; inf/NaN states are refused. Full-attention and
    sliding-window layers (a sliding layer's tokens are all kept, its window
    applied as they are read: memory grows with the context, as for full
    layers); batches without padding or with left padding (generate)."""

    def __init__(self, config: Any = None, kv_dtype: Any = "int8", kv_scale: Optional[str] = None):
        dtype = _KV8_DTYPES.get(kv_dtype) if isinstance(kv_dtype, str) else kv_dtype
        if dtype not in _kv8.KV8:
            _raise(InvalidArgumentError, "kv_dtype", kv_dtype, "expected int8, float8_e4m3fn or float8_e5m2 (the "
                   "float8 dtypes need torch >= 2.1)")
        if kv_scale is None:
            kv_scale = "per_token" if dtype == torch.int8 else "per_head"
        if kv_scale not in ("per_token", "per_head"):
            _raise(InvalidArgumentError, "kv_scale", kv_scale, "expected per_token or per_head")
        # Another attention implementation would get the int8/float8 codes as
        # K/V: torch's own dtype error, far from the cause.
        impl = getattr(config, "_attn_implementation", None) if config is not None else None
        if impl is not None and impl != "attend":
            _raise(InvalidArgumentError, "config._attn_implementation", impl, "QuantizedKVCache holds 8-bit codes "
                   "that only attend's attention reads: load the model with attn_implementation=\"attend\"")
        self.kv_dtype, self.kv_scale = dtype, kv_scale
        make = (lambda: QuantizedKVLayer(dtype, kv_scale))
        if config is not None:
            n = config.get_text_config(decoder=True).num_hidden_layers
            super().__init__(layers=[make() for _ in range(n)])
        else:
            super().__init__(layer_class_to_replicate=make)

    def nbytes(self) -> int:
        """Bytes of the stored tokens over every layer: codes and scales."""
        return sum(layer.nbytes() for layer in self.layers)


# The range pyproject.toml's "transformers" extra pins and the tests run (5.0.0, 5.25.0).
SUPPORTED = (5, 6)


def _check_version():
    try:
        major = int(transformers.__version__.split(".")[0])
    except ValueError:
        return
    if not SUPPORTED[0] <= major < SUPPORTED[1]:
        logger.warning(f"attend: transformers {transformers.__version__} is outside the tested range "
                       f">={SUPPORTED[0]},<{SUPPORTED[1]} (pip install 'attend[transformers]')")


def register() -> None:
    """Registers "attend" with transformers' AttentionInterface and
    AttentionMaskInterface (done on import; calling it again is harmless)."""
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, create_mask)


_check_version()
register()
