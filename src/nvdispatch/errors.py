"""The exception types nvdispatch raises: one tree under :class:`NvdispatchError`.

Every error names the argument at fault, what was expected and what came. Each class also derives from
the built-in exception a Python user would reach for first (``ValueError``, ``TypeError``,
``RuntimeError``), so ``except ValueError`` keeps working. Every error pickles with all its fields (it
crosses process boundaries in Dask and multiprocessing workers).

::

    NvdispatchError
    ├── InvalidArgumentError (ValueError)
    │   ├── ShapeMismatchError
    │   ├── AxisError (IndexError)              an axis out of range, as NumPy's, SciPy's and Torch's IndexError
    │   ├── EpilogInputError
    │   ├── TuningsFileError
    │   └── DeviceConfigurationError            (nvdispatch.device)
    │       └── UnsupportedConfigurationError
    ├── UnsupportedDtypeError (TypeError)
    ├── UnsupportedOperandError (TypeError)
    ├── MixedOperandsError (TypeError)
    ├── BackendError (RuntimeError)
    │   ├── UnknownBackendError (ValueError)
    │   ├── NoExecutorError
    │   ├── ExecutorUnavailableError
    │   └── ExecutorContractError
    ├── PlanStateError (RuntimeError)
    ├── CudaLibraryError (RuntimeError)         a CUDA library call returned an error status
    │   ├── CudaRuntimeError
    │   ├── CublasLtError
    │   └── CufftError
    ├── CallbackError (TypeError)
    └── OutOfMemoryError (MemoryError)

    TuningsWarning (UserWarning)                a tunings file entry skipped, or a tuning dropped
"""

from __future__ import annotations

__all__ = [
    "NvdispatchError",
    "InvalidArgumentError",
    "ShapeMismatchError",
    "AxisError",
    "UnsupportedDtypeError",
    "UnsupportedOperandError",
    "MixedOperandsError",
    "EpilogInputError",
    "BackendError",
    "UnknownBackendError",
    "NoExecutorError",
    "PlanStateError",
    "ExecutorUnavailableError",
    "ExecutorContractError",
    "CudaLibraryError",
    "CudaRuntimeError",
    "CublasLtError",
    "CufftError",
    "CallbackError",
    "OutOfMemoryError",
    "TuningsFileError",
    "TuningsWarning",
    "describe",
    "expect_bool",
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
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        if len(value) > 8:
            return f"{type(value).__name__} of {len(value)} items"
        text = repr(value)
        return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"
    return name


def expect_bool(argument: str, value: object) -> bool:
    """``value`` as a bool if it is one (Python's or NumPy's), else :class:`InvalidArgumentError` naming
    ``argument``: an option is validated by type, so ``"no"`` is not False (nor ``0``, nor ``None``)."""
    if isinstance(value, bool):
        return value
    cls = type(value)
    if cls.__module__ == "numpy" and cls.__name__ in ("bool", "bool_"):
        return bool(value)
    raise InvalidArgumentError(argument, "True or False", describe(value))


class NvdispatchError(Exception):
    """Base class of every error nvdispatch raises on purpose."""

    def __init__(self, argument: str, expected: str, got: str, hint: str = ""):
        self.argument = argument
        self.hint = hint
        self.expected = expected
        self.got = got
        message = f"{argument}: expected {expected}, got {got}"
        if hint:
            message += f". {hint}"
        super().__init__(message)

    def __reduce__(self):
        # every field survives pickling, whatever a subclass's __init__ takes (hint, declined, status, ...)
        return (_rebuild, (type(self), self.args, self.__dict__.copy()))


def _rebuild(cls, args, state):
    """Unpickle an :class:`NvdispatchError` without calling its ``__init__``."""
    error = Exception.__new__(cls, *args)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class InvalidArgumentError(NvdispatchError, ValueError):
    """An argument has the right type but an invalid value (a bad axis, a non-positive size, ...)."""


class ShapeMismatchError(InvalidArgumentError):
    """Operand shapes do not fit together (inner dimensions, broadcasting, epilog input shapes)."""


class AxisError(InvalidArgumentError, IndexError):
    """An axis outside the array's dimensions (an ``IndexError`` too, as NumPy's ``AxisError`` and the
    ``IndexError`` of ``numpy.fft``, ``scipy.fft`` and ``torch.fft``)."""


class UnsupportedDtypeError(NvdispatchError, TypeError):
    """A dtype the requested operation or executor cannot take."""


class UnsupportedOperandError(NvdispatchError, TypeError):
    """An object that is no array nvdispatch can recognise (None included where an array is required)."""


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


class ExecutorContractError(BackendError):
    """A user executor broke the executor protocol (see ``nvdispatch.executors.base``): a ``decline`` that
    cannot take ``coerce``, no strategies, a ``plan`` that is no plan, a result of the wrong type, shape or
    dtype, or the wrong aux outputs. ``argument`` names the executor and the method."""


class CudaLibraryError(NvdispatchError, RuntimeError):
    """A call into a CUDA library returned an error status.

    Attributes
    ----------
    call : str
        The library function (with what it was doing, where useful).
    status : int
        The status code the library returned.
    status_name : str
        Its symbolic name (e.g. ``CUBLAS_STATUS_NOT_SUPPORTED``).
    """

    library = "CUDA"
    #: status code -> name, per library
    status_names: dict[int, str] = {}

    def __init__(self, call: str, status: int, status_name: str | None = None, hint: str = ""):
        self.call = call
        self.status = int(status)
        self.status_name = status_name or self.status_names.get(self.status, str(status))
        self.argument, self.expected, self.got, self.hint = call, f"{self.library} success", self.status_name, hint
        message = f"{call} failed: {self.status_name}"
        Exception.__init__(self, f"{message}. {hint}" if hint else message)


class CudaRuntimeError(CudaLibraryError):
    """A CUDA runtime call (through cuda-bindings) failed."""

    library = "CUDA runtime"


class CublasLtError(CudaLibraryError):
    """A cuBLASLt call failed (or its heuristic found no algorithm: ``CUBLAS_STATUS_NOT_SUPPORTED``)."""

    library = "cuBLASLt"
    status_names = {
        0: "CUBLAS_STATUS_SUCCESS",
        1: "CUBLAS_STATUS_NOT_INITIALIZED",
        3: "CUBLAS_STATUS_ALLOC_FAILED",
        7: "CUBLAS_STATUS_INVALID_VALUE",
        8: "CUBLAS_STATUS_ARCH_MISMATCH",
        11: "CUBLAS_STATUS_MAPPING_ERROR",
        13: "CUBLAS_STATUS_EXECUTION_FAILED",
        14: "CUBLAS_STATUS_INTERNAL_ERROR",
        15: "CUBLAS_STATUS_NOT_SUPPORTED",
        16: "CUBLAS_STATUS_LICENSE_ERROR",
    }


class CufftError(CudaLibraryError):
    """A cuFFT call failed."""

    library = "cuFFT"
    status_names = {
        1: "CUFFT_INVALID_PLAN",
        2: "CUFFT_ALLOC_FAILED",
        3: "CUFFT_INVALID_TYPE",
        4: "CUFFT_INVALID_VALUE",
        5: "CUFFT_INTERNAL_ERROR",
        6: "CUFFT_EXEC_FAILED",
        7: "CUFFT_SETUP_FAILED",
        8: "CUFFT_INVALID_SIZE",
        9: "CUFFT_UNALIGNED_DATA",
        12: "CUFFT_NOT_SUPPORTED",
    }


class CallbackError(NvdispatchError, TypeError):
    """An FFT prolog/epilog callback that cannot be compiled or run, or returns the wrong dtype or shape
    (``argument`` is ``"prolog"`` or ``"epilog"``; the message names the function and what failed)."""


class OutOfMemoryError(NvdispatchError, MemoryError):
    """Host or device memory ran out (raised for every executor; the framework's own error is ``__cause__``)."""


class TuningsFileError(InvalidArgumentError):
    """A tunings file ``plan_cache.load()`` cannot read (missing, a directory, unreadable, not JSON, nested
    too deeply, another format, no ``"tunings"``), or a ``plan_cache.save()`` path that is a directory. The
    underlying error, if any, is ``__cause__``."""


class TuningsWarning(UserWarning):
    """A tunings file entry that was skipped (its key, kind or value is not valid here), a file from
    another nvdispatch version or format, or a loaded tuning that could not be applied to its plan."""
