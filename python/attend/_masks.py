"""Masks: mapping other libraries' conventions onto attend's.

attend aligns causal masks and windows bottom-right (FlashAttention >= 2.1: query
row i sits at key position i + Sk - Sq). PyTorch's SDPA ``is_causal`` and
TransformerEngine's ``causal`` are top-left aligned (row i sits at key i). For
Sq == Sk the two agree; otherwise a top-left window is rewritten exactly as a
bottom-right one over a prefix of the keys (keys a top-left mask never reaches
get zero gradient through the slice), and only the cases that rewrite cannot
express fall back to an additive -inf bias.
"""

import torch

from . import _C
from .errors import InvalidArgumentError, _raise

_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16", torch.float16: "f16"}


def dtype_name(t, name="query"):
    """attend's name for t's dtype. bf16/f16 are computed natively (f32
    accumulation inside the kernels, results in the input dtype); any backend
    that cannot do them says so in its reasons (never a silent upcast)."""
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        _raise(InvalidArgumentError, f"{name}.dtype", t.dtype,
               "attend computes float32, float64, bfloat16 and float16")


def window_sides(window_size):
    """(left, right) of a FlashAttention-style window_size (None: unbounded). As in
    FlashAttention, any negative side means unbounded; attend spells that -1."""
    if window_size is None:
        return -1, -1
    try:
        left, right = window_size
        left, right = int(left), int(right)
    except (TypeError, ValueError):
        _raise(InvalidArgumentError, "window_size", window_size, "expected a pair (left, right) of ints, -1 for an "
               "unbounded side, or None")
    return max(left, -1), max(right, -1)


def top_left_window(sq, sk, left, right):
    """A top-left aligned window (left, right; -1 unbounded) as (keys, left', right')
    in attend's bottom-right alignment over keys [0, keys); None if inexpressible."""
    keys = sk if right < 0 else min(sk, sq + right)
    off = keys - sq
    new_right = -1 if right < 0 else right - off  # >= 0: off <= right by construction
    if left < 0:
        return keys, -1, new_right
    new_left = left + off
    if new_left < 0:
        return None
    return keys, new_left, new_right


def window_keep(sq, sk, left, right, top_left, device=None):
    """Boolean (sq, sk) keep mask of a window (-1 unbounded side), either alignment."""
    i = torch.arange(sq, device=device).unsqueeze(1) + (0 if top_left else sk - sq)
    j = torch.arange(sk, device=device).unsqueeze(0)
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def bias_from_keep(keep, dtype):
    """0 where keep is True, -inf elsewhere (same shape)."""
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, float("-inf"))


def _keep(seed, dropout_p, b, heads, sq, sk):
    """Sequence b's keep mask, bool (heads, sq, sk), from the native bytes."""
    raw = _C.dropout_keep(seed, dropout_p, b, heads, sq, sk)
    if not raw:
        return torch.zeros(heads, sq, sk, dtype=torch.bool)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(heads, sq, sk).bool()


def dropout_mask(seed, dropout_p, batch, heads, seqlen_q, seqlen_kv):
    """attend's dropout keep mask for a dense problem: bool (batch, heads, seqlen_q,
    seqlen_kv), True where the element is kept (and scaled by 1/(1-p)). The same
    Philox4x32-10 function every backend uses, so it reproduces any call's mask
    from its seed (see attend.torch.draw_dropout_seed)."""
    for name, n in (("batch", batch), ("heads", heads), ("seqlen_q", seqlen_q), ("seqlen_kv", seqlen_kv)):
        if int(n) < 0:
            _raise(InvalidArgumentError, name, n, "must be >= 0")
    if batch == 0:
        return torch.zeros(0, heads, seqlen_q, seqlen_kv, dtype=torch.bool)
    return torch.stack([_keep(seed, dropout_p, b, heads, seqlen_q, seqlen_kv) for b in range(batch)])


def dropout_mask_varlen(seed, dropout_p, heads, cu_seqlens_q, cu_seqlens_kv):
    """Per-sequence keep masks of a varlen problem: a list of bool (heads, len_q_b,
    len_kv_b) tensors (rows and columns are local to each sequence)."""
    cq = [int(x) for x in cu_seqlens_q]
    ck = [int(x) for x in cu_seqlens_kv]
    return [_keep(seed, dropout_p, b, heads, cq[b + 1] - cq[b], ck[b + 1] - ck[b])
            for b in range(len(cq) - 1)]
