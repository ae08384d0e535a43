"""Input conventions every torch entry point shares: attend.torch's functions
and DotProductAttention (attend.module) both import them from here, so that
neither of those two modules imports the other."""

import torch

_NEW_AUTOCAST = hasattr(torch, "get_autocast_dtype")


# Looked up once: every call asks, and the lookups cost as much as the answer.
_IS_COMPILING = getattr(getattr(torch, "compiler", None), "is_compiling", None)


def compiling():
    """True inside a torch.compile trace (it cannot call into the extension)."""
    return _IS_COMPILING is not None and _IS_COMPILING()


def autocast_dtype():
    """The dtype torch.autocast on the CPU runs lower-precision ops in, or None when it is off."""
    if _NEW_AUTOCAST:
        return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
    return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None


def autocast(*tensors):
    """Under torch.autocast on the CPU, floating inputs in the autocast dtype
    (attention is a lower-precision op there, as torch's own SDPA is)."""
    dt = autocast_dtype()
    if dt is None:
        return tensors
    return tuple(t.to(dt) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != dt else t
                 for t in tensors)
