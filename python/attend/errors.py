"""Exceptions raised by attend: one class per attend::ErrorCode.

Every exception carries the fields of the native attend::Error: ``code`` (the
ErrorCode name), ``field`` (what was wrong), ``value``, ``limit`` and ``detail``.
For ``UnsupportedError`` the message contains the whole verdict table: one line
per backend and one reason per unmet requirement.
"""


class AttendError(RuntimeError):
    """Base class of every attend error."""

    code = "error"

    def __init__(self, message, field="", value="", limit="", detail=""):
        super().__init__(message)
        self.field = field
        self.value = value
        self.limit = limit
        self.detail = detail or message


class UnsupportedError(AttendError):
    """No backend (or not the forced one) can run the problem in the requested mode."""

    code = "unsupported"


class InvalidArgumentError(AttendError, ValueError):
    """A field of the problem or a tensor is malformed."""

    code = "invalid_argument"


class ShapeMismatchError(InvalidArgumentError):
    """Tensors disagree with the problem or with each other."""

    code = "shape_mismatch"


class SizeOverflowError(AttendError, OverflowError):
    """A size computation would overflow."""

    code = "overflow"


class BadStateError(AttendError):
    """For example backward through a forward that selected in inference mode."""

    code = "bad_state"


class AttendIOError(AttendError):
    """A file could not be read or parsed."""

    code = "io"


class AttendMemoryError(AttendError, MemoryError):
    """An allocation failed."""

    code = "out_of_memory"


_BY_CODE = {cls.code: cls for cls in (UnsupportedError, InvalidArgumentError, ShapeMismatchError,
                                     SizeOverflowError, BadStateError, AttendIOError, AttendMemoryError)}


def _from_native(code, message, field, value, limit, detail):
    """Called by the extension to turn an attend::Error into its Python class."""
    return _BY_CODE.get(code, AttendError)(message, field, value, limit, detail)


def _raise(cls, field, value, detail, limit=""):
    """Raises `cls` with a message in the native format ("field=value: detail")."""
    message = f"attend [{cls.code}] {field}={value}: {detail}" + (f" (limit: {limit})" if limit else "")
    raise cls(message, str(field), str(value), str(limit), detail)
