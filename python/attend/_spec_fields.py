"""attend::AttentionSpec fields by their C++ table names (src/runtime/spec_fields.cpp).

The table lives in C++; Python reads it (``spec_fields()``) and hands field
dicts back to be parsed there, so a field added to the table is a keyword here
without a change to this package, and a bad value fails with the same error
(naming the field) as in C++ and the CLI.
"""

import collections
from typing import Any, Dict, List

from . import _C
from .errors import InvalidArgumentError, _raise

SpecField = collections.namedtuple("SpecField", "name kind optional help default")
SpecField.__doc__ = ("One AttentionSpec field: its name (keyword), kind ('int', 'uint', 'real', 'bool', 'dtype' "
                     "or 'layout'), whether it may be None (unset), a one-line help and its default.")


def spec_fields() -> List[SpecField]:
    """Every attend::AttentionSpec field, in declaration order, as SpecField tuples."""
    return [SpecField(**row) for row in _C.spec_fields()]


def spec(**fields: Any) -> Dict[str, Any]:
    """The complete attend::AttentionSpec that ``fields`` describe, as a dict of
    every field (the others at their defaults), e.g.
    ``attend.spec(batch=2, seqlen_q=128, seqlen_kv=128, causal=True, out_dtype="f32")``.
    An unknown name or a malformed value raises InvalidArgumentError naming the
    field; range checks (e.g. dropout_p < 1) happen when a call uses the spec."""
    return _C.spec_from_fields(fields)


_NAMES = frozenset(row["name"] for row in _C.spec_fields())


def with_fields(spec_dict, fields, api, parse=True):
    """`spec_dict` (what entry point `api` derived from its arguments) plus the
    caller's extra ``**spec_fields``. A field the entry point sets itself is an
    error naming it, since its arguments and tensors decide it; dropout_seed is
    the exception: a given seed replaces the one drawn for the call. Unknown
    names fail here; malformed values fail in the native parse, now (`parse`)
    or, inside a torch.compile trace (which cannot call into the extension), when
    the op runs."""
    if not fields:
        return spec_dict
    for name, value in fields.items():
        if name not in _NAMES:
            _raise(InvalidArgumentError, name, value,
                   "not a field of attend::AttentionSpec (attend.spec_fields() lists them)")
        if name in spec_dict and name != "dropout_seed":
            _raise(InvalidArgumentError, name, value, f"{api} derives it from its arguments and tensors")
    merged = dict(spec_dict, **fields)
    if parse:
        _C.spec_from_fields(merged)  # malformed values fail now, naming the field
    return merged
