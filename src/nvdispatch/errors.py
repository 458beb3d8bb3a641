"""The exception types nvdispatch raises.

Every error names the argument at fault, what was expected and what came. Each class also derives from
the built-in exception a Python user would reach for first (``ValueError``, ``TypeError``,
``RuntimeError``), so ``except ValueError`` keeps working.
"""

from __future__ import annotations

__all__ = [
    "NvdispatchError",
    "InvalidArgumentError",
    "ShapeMismatchError",
    "UnsupportedDtypeError",
    "UnsupportedOperandError",
    "MixedOperandsError",
    "EpilogInputError",
    "BackendError",
    "UnknownBackendError",
    "NoExecutorError",
    "PlanStateError",
    "ExecutorUnavailableError",
    "describe",
]


def describe(value: object) -> str:
    """A short, human description of ``value`` for error messages (type, shape, dtype where present)."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    name = type(value).__module__.split(".")[0] + "." + type(value).__qualname__
    if shape is not None and dtype is not None:
        return f"{name} of shape {tuple(shape)} and dtype {dtype}"
    if isinstance(value, (str, int, float, complex, bool)) or value is None:
        return f"{type(value).__name__} {value!r}"
    return name


class NvdispatchError(Exception):
    """Base class of every error nvdispatch raises on purpose."""

    def __init__(self, argument: str, expected: str, got: str, hint: str = ""):
        self.argument = argument
        self.expected = expected
        self.got = got
        message = f"{argument}: expected {expected}, got {got}"
        if hint:
            message += f". {hint}"
        super().__init__(message)

    def __reduce__(self):  # keep errors picklable across processes
        return (type(self), (self.argument, self.expected, self.got))


class InvalidArgumentError(NvdispatchError, ValueError):
    """An argument has the right type but an invalid value (a bad axis, a non-positive size, ...)."""


class ShapeMismatchError(InvalidArgumentError):
    """Operand shapes do not fit together (inner dimensions, broadcasting, epilog input shapes)."""


class UnsupportedDtypeError(NvdispatchError, TypeError):
    """A dtype the requested operation or executor cannot take."""


class UnsupportedOperandError(NvdispatchError, TypeError):
    """An object that is no array nvdispatch can recognise (or a 0-d array where a matrix is needed)."""


class MixedOperandsError(NvdispatchError, TypeError):
    """Operands that belong to different frameworks or live on different devices."""


class EpilogInputError(InvalidArgumentError):
    """An epilog input that is missing, unexpected, or of the wrong shape or dtype."""


class BackendError(NvdispatchError, RuntimeError):
    """Base class of backend-selection failures."""


class UnknownBackendError(BackendError, ValueError):
    """A backend name that is not registered, or an object that is no executor."""


class NoExecutorError(BackendError):
    """No executor could take the call; the message lists each one tried and why it declined."""

    def __init__(self, argument: str, expected: str, got: str, hint: str = "", declined=()):
        self.declined = tuple(declined)
        super().__init__(argument, expected, got, hint)


class PlanStateError(NvdispatchError, RuntimeError):
    """A stateful object used out of order (executed before planning, used after ``free()``, ...)."""


class ExecutorUnavailableError(BackendError):
    """An executor whose library is not installed or that finds no device."""
