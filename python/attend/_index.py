"""Index tensors as attend reads them: int32 on the host.

cu_seqlens, seqused, block tables, cache lengths, the cache batch index and
leftpad arrive as whatever integer dtype the caller had (int64 is torch's
default). Narrowing to int32 wraps silently (2**32 + 10 becomes 10: another
sequence boundary, another page), so every value is range-checked first and
a value outside int32 is an error naming the tensor, the position and the value.
"""

import torch

from .errors import InvalidArgumentError, ShapeMismatchError, _raise

_INT32_MIN, _INT32_MAX = -2 ** 31, 2 ** 31 - 1
_NARROWED = (torch.int64, torch.int16, torch.int8, torch.uint8)


def _first_outside(t):
    """(flat position, value) of the first entry outside int32, or None."""
    bad = (t < _INT32_MIN) | (t > _INT32_MAX)
    if not bool(bad.any()):
        return None
    i = int(bad.reshape(-1).nonzero()[0, 0])
    return i, int(t.reshape(-1)[i])


def int32_index(t, name, dims):
    """`t` as a `dims`-D int32 CPU tensor, or an attend error naming `name`."""
    if not isinstance(t, torch.Tensor):
        _raise(InvalidArgumentError, name, type(t).__name__, f"expected a {dims}-D int32 torch.Tensor")
    if t.dim() != dims:
        _raise(ShapeMismatchError, f"{name}.dim", t.dim(), f"expected a {dims}-D int32 tensor, got shape "
               f"{tuple(t.shape)}")
    if t.dtype == torch.int32:
        return t
    if t.dtype not in _NARROWED:
        _raise(InvalidArgumentError, f"{name}.dtype", t.dtype, "expected int32 (or an integer dtype whose values "
               "fit in int32)")
    if t.dtype == torch.int64 and t.numel() and not t.is_meta:  # (a meta tensor has no values to check)
        hit = _first_outside(t)
        if hit is not None:
            _raise(InvalidArgumentError, f"{name}[{hit[0]}]", hit[1],
                   f"outside the int32 range [{_INT32_MIN}, {_INT32_MAX}] attend reads index tensors in")
    return t.to(torch.int32)


def require_non_negative(t, name):
    """Raises naming the first negative entry of an int32 index tensor."""
    if t.numel() and bool((t < 0).any()):
        i = int((t.reshape(-1) < 0).nonzero()[0, 0])
        _raise(InvalidArgumentError, f"{name}[{i}]", int(t.reshape(-1)[i]), "must be >= 0")
