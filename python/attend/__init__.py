"""attend: scaled-dot-product attention with a pass-aware backend selector.

This package level needs numpy only: errors, the selection policy, explain()
and select() (plans), and attend.forward/backward/merge and the KV cache on
numpy arrays or anything exporting DLPack. ``attend.torch`` holds the PyTorch
functions and module (with autograd and torch.compile support); it needs torch
1.13 or newer.
"""

try:
    from . import _C
except ImportError as e:  # e.g. the source tree's python/ ahead of the build's on sys.path
    raise ImportError(f"attend's native extension _C is not next to {__file__}: install the package "
                      "(pip install .) or build it with CMake and put <build>/python on PYTHONPATH "
                      "(see README, 'Python')") from e
from .errors import (AttendError, AttendIOError, AttendMemoryError, BadStateError, InvalidArgumentError,
                     ShapeMismatchError, SizeOverflowError, UnsupportedError)
from ._spec_fields import SpecField, spec, spec_fields
from .policy import Explanation, backends, explain, get_policy, policy, reset_policy, set_policy
from ._core import KVCache, Plan, backward, forward, merge, select

__version__: str = _C.__version__

__all__ = [
    "AttendError", "AttendIOError", "AttendMemoryError", "BadStateError", "InvalidArgumentError",
    "ShapeMismatchError", "SizeOverflowError", "UnsupportedError", "Explanation", "backends", "explain",
    "get_policy", "policy", "reset_policy", "set_policy", "flash_isa", "SpecField", "spec", "spec_fields",
    "forward", "backward", "merge", "select", "Plan", "KVCache", "__version__",
]


def flash_isa() -> str:
    """The kernel family flash runs with: 'avx512amx', 'avx512bf16', 'avx512', 'avx2' or 'scalar'
    (the best the CPU has, or ATTEND_ISA's choice)."""
    return _C.flash_isa()


def __getattr__(name):
    # `attend.torch` on first use, so that `import attend` alone needs no torch.
    if name == "torch":
        import importlib
        try:
            import torch  # noqa: F401
        except ImportError as e:
            raise ImportError(f"attend.torch needs PyTorch (torch >= 1.13), which this python "
                              f"cannot import ({e}); install it (pip install torch) — attend's numpy API "
                              "(attend.forward, attend.explain, attend.select) works without it") from e
        return importlib.import_module(".torch", __name__)
    raise AttributeError(name)
