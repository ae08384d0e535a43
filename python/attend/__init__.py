"""attend: scaled-dot-product attention with a pass-aware backend selector.

``attend.torch`` holds the PyTorch functions and module; this package level
holds what does not need tensors: errors, the selection policy and explain().
"""

import torch as _torch  # noqa: F401  (loads libtorch before the extension needs it)

try:
    from . import _C
except ImportError as e:  # e.g. the source tree's python/ ahead of the build's on sys.path
    raise ImportError(f"attend's native extension _C is not next to {__file__}: build it with CMake and put "
                      "<build>/python on PYTHONPATH (see README, 'Python / PyTorch')") from e
from .errors import (AttendError, AttendIOError, AttendMemoryError, BadStateError, InvalidArgumentError,
                     ShapeMismatchError, SizeOverflowError, UnsupportedError)
from ._spec_fields import SpecField, spec, spec_fields
from .policy import Explanation, backends, explain, get_policy, policy, reset_policy, set_policy

__all__ = [
    "AttendError", "AttendIOError", "AttendMemoryError", "BadStateError", "InvalidArgumentError",
    "ShapeMismatchError", "SizeOverflowError", "UnsupportedError", "Explanation", "backends", "explain",
    "get_policy", "policy", "reset_policy", "set_policy", "flash_isa", "SpecField", "spec", "spec_fields",
]


def flash_isa():
    """The kernel family flash runs with: 'avx512amx', 'avx512bf16', 'avx512', 'avx2' or 'scalar'
    (the best the CPU has, or ATTEND_ISA's choice)."""
    return _C.flash_isa()


def __getattr__(name):
    # `attend.torch` on first use, so that `import attend` alone stays light.
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(name)
