"""Arrays as the native extension sees them: (address, dtype, shape, strides).

The extension links no array library. A torch tensor, a numpy array or any
object exporting DLPack (read through numpy's ``from_dlpack``) becomes a
descriptor here; the object a descriptor points into is returned alongside it
and must be kept alive while the native side reads or writes it. attend reads
strided memory in place: only a last dimension that is not contiguous, a
negative stride or a non-native byte order costs a copy.
"""

import sys

from .errors import InvalidArgumentError, UnsupportedError, _raise

_NUMPY_NAMES = {"float32": "f32", "float64": "f64", "float16": "f16", "int32": "i32", "int8": "i8"}
_NUMPY_DTYPES = {v: k for k, v in _NUMPY_NAMES.items()}


def _torch():
    return sys.modules.get("torch")


def is_torch(x):
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


_TORCH_NAMES = {}


def torch_dtype_names():
    if not _TORCH_NAMES:  # filled on first use: importing attend must not import torch
        import torch
        _TORCH_NAMES.update({torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16",
                             torch.float16: "f16", torch.int32: "i32", torch.int8: "i8"})
        # 8-bit K/V codes (kv_dtype); torch 1.x has no float8 dtypes.
        for name, kv in (("float8_e4m3fn", "fp8_e4m3"), ("float8_e5m2", "fp8_e5m2")):
            if hasattr(torch, name):
                _TORCH_NAMES[getattr(torch, name)] = kv
    return _TORCH_NAMES


def _describe_torch(t, name):
    import torch
    if t.device.type != "cpu":
        _raise(InvalidArgumentError, f"{name}.device", t.device,
               "no attend backend serves this device: attend computes on the CPU (move the tensor with .cpu())")
    wrapped = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)
    if wrapped is not None and wrapped(t):
        _raise(UnsupportedError, f"{name}.transform", "torch.func", "a torch.func transform's tensor (vmap, grad, "
               "jvp) has no memory attend can read: call attend.torch's functions, whose ops support vmap")
    if t.layout != torch.strided or t.is_quantized:
        _raise(InvalidArgumentError, f"{name}.layout", t.layout, "attend needs a dense strided tensor")
    dtype = torch_dtype_names().get(t.dtype)
    if dtype is None:
        _raise(InvalidArgumentError, f"{name}.dtype", t.dtype,
               "attend handles float32, float64, bfloat16, float16, int32 index tensors and 8-bit K/V (int8, "
               "float8_e4m3fn, float8_e5m2)")
    # A view with a negative bit would be read without it (conjugation only
    # concerns complex dtypes, which are rejected above).
    if hasattr(t, "is_neg") and t.is_neg():
        t = t.resolve_neg()
    if t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        t = t.contiguous()
    return (t.data_ptr(), dtype, tuple(t.shape), tuple(t.stride())), t


def _describe_numpy(a, name):
    import numpy as np
    dtype = _NUMPY_NAMES.get(a.dtype.name)
    if dtype is None:
        _raise(InvalidArgumentError, f"{name}.dtype", a.dtype,
               "attend handles float32, float64, float16, int32 index arrays and int8 K/V (numpy has no bfloat16)")
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    item = a.itemsize
    if (any(s < 0 or s % item for s in a.strides)
            or (a.ndim > 0 and a.shape[-1] > 1 and a.strides[-1] != item)):
        a = np.ascontiguousarray(a)
    return (a.__array_interface__["data"][0], dtype, tuple(a.shape), tuple(s // item for s in a.strides)), a


def adopt(x):
    """x itself if torch or numpy; a numpy view of any other DLPack exporter."""
    if x is None or is_torch(x):
        return x
    import numpy as np
    if isinstance(x, np.ndarray):
        return x
    return np.from_dlpack(x) if hasattr(x, "__dlpack__") else np.asarray(x)


def describe(x, name):
    """(descriptor, owner) of an array-like; None gives (None, None)."""
    if x is None:
        return None, None
    if is_torch(x):
        return _describe_torch(x, name)
    import numpy as np
    if not isinstance(x, np.ndarray):
        if hasattr(x, "__dlpack__"):
            x = np.from_dlpack(x)
        else:
            x = np.asarray(x)
    return _describe_numpy(x, name)


def describe_all(tensors):
    """Descriptors of a dict of named arrays (None entries dropped), and their owners."""
    descs, keep = {}, []
    for name, x in tensors.items():
        d, owner = describe(x, name)
        if d is not None:
            descs[name] = d
            keep.append(owner)
    return descs, keep


def empty(like, shape, dtype, zeros=False):
    """An array of the library `like` belongs to (torch or numpy), on the host."""
    if is_torch(like):
        import torch
        td = {v: k for k, v in torch_dtype_names().items()}[dtype]
        return (torch.zeros if zeros else torch.empty)(tuple(shape), dtype=td)
    import numpy as np
    if dtype not in _NUMPY_DTYPES:
        _raise(InvalidArgumentError, "dtype", dtype, "numpy has no such dtype (bf16 needs torch tensors)")
    return (np.zeros if zeros else np.empty)(tuple(shape), dtype=_NUMPY_DTYPES[dtype])


def dtype_name(x, name="q"):
    """attend's name for the dtype of an array-like (f32, f64, bf16, f16, i32)."""
    return describe(x, name)[0][1]


def to_list(x):
    """The values of a small 1-D index array."""
    if is_torch(x):
        return [int(v) for v in x.tolist()]
    import numpy as np
    return [int(v) for v in np.asarray(x).reshape(-1)]
