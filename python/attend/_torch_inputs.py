"""Input conventions every torch entry point shares: attend.torch's functions
and DotProductAttention (attend.module) both import them from here, so that
neither of those two modules imports the other."""

import torch

from .errors import InvalidArgumentError, UnsupportedError, _raise

_NEW_AUTOCAST = hasattr(torch, "get_autocast_dtype")


# Looked up once: every call asks, and the lookups cost as much as the answer.
_IS_COMPILING = getattr(getattr(torch, "compiler", None), "is_compiling", None)


def compiling():
    """True inside a torch.compile trace (it cannot call into the extension)."""
    return _IS_COMPILING is not None and _IS_COMPILING()


_TRANSFORMS_ACTIVE = getattr(torch._C, "_are_functorch_transforms_active", None)


def transforming():
    """True under a torch.func transform (vmap, grad, jvp, ...): its tensors
    are wrappers with no memory of their own, which only the ops can take."""
    return _TRANSFORMS_ACTIVE is not None and _TRANSFORMS_ACTIVE()


# What each torch.func transform attend cannot follow covers, and why.
_REFUSED = {
    "Grad": ("grad", "torch.func.grad, grad_and_value, vjp, jacrev and hessian differentiate through a "
             "torch.func rule attend's ops do not have: use torch.autograd (loss.backward(), torch.autograd.grad), "
             "per sample in a loop for per-sample gradients"),
    "Jvp": ("jvp", "attend's ops have no forward-mode derivative (torch.func.jvp, jacfwd, hessian): use "
            "torch.autograd's reverse mode"),
}


def refuse_transforms(api, vmap_ok):
    """Raises an UnsupportedError naming the torch.func transform in force that
    `api` cannot run under (vmap unless `vmap_ok`). Without it the wrappers
    reached the extension, which failed reading their data pointer."""
    if not transforming():
        return
    stack = getattr(torch._C._functorch, "get_interpreter_stack", lambda: None)() or []
    for interpreter in stack:
        kind = str(interpreter.key()).rsplit(".", 1)[-1]
        if kind in _REFUSED:
            name, why = _REFUSED[kind]
            _raise(UnsupportedError, "torch.func", name, f"{api} does not support torch.func.{name}: {why}")
        if kind == "Vmap" and not vmap_ok:
            _raise(UnsupportedError, "torch.func", "vmap", f"{api} does not support torch.func.vmap: call it per "
                   "batch element, or fold the mapped dimension into the batch")


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


def one_device(api, **tensors):
    """Raises naming the first tensor argument (None and non-tensors skipped)
    on another device than the first one. Nothing moves data between devices
    (torch's SDPA refuses too): a meta tensor among CPU ones would otherwise
    send the whole call to the op's fake kernel, whose output is on q's device
    and uninitialised, and CPU tensors among meta ones would give a meta
    result for a call that cannot run."""
    first = None
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            continue
        if first is None:
            first = (name, t.device)
        elif t.device != first[1]:
            _raise(InvalidArgumentError, f"{name}.device", t.device, f"{first[0]} is on {first[1]}: every tensor "
                   f"argument of {api} must be on one device (attend moves nothing between devices)")


def no_meta(api, why, **tensors):
    """Raises naming the first meta tensor: `api` reads values (`why`), which a
    meta tensor has none of."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.is_meta:
            _raise(UnsupportedError, f"{name}.device", t.device, f"{api} {why}: a meta tensor has none (meta "
                   "tensors serve the shape-only entry points: scaled_dot_product_attention, flash_attn_func, "
                   "flash_attn_varlen_func, DotProductAttention)")
