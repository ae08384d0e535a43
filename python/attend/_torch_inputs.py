"""Input conventions every torch entry point shares: attend.torch's functions
and DotProductAttention (attend.module) both import them from here, so that
neither of those two modules imports the other."""

import torch

_NEW_AUTOCAST = hasattr(torch, "get_autocast_dtype")


def compiling():
    """True inside a torch.compile trace (it cannot call into the extension)."""
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling()


def autocast(*tensors):
    """Under torch.autocast on the CPU, floating inputs in the autocast dtype
    (attention is a lower-precision op there, as torch's own SDPA is)."""
    if _NEW_AUTOCAST:
        if not torch.is_autocast_enabled("cpu"):
            return tensors
        dt = torch.get_autocast_dtype("cpu")
    else:
        if not torch.is_autocast_cpu_enabled():
            return tensors
        dt = torch.get_autocast_cpu_dtype()
    return tuple(t.to(dt) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != dt else t
                 for t in tensors)
