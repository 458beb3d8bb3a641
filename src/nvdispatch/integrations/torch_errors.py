"""Typed errors from the code Torch traces: the entries Dynamo traces in place of the public functions, and the
operators' fake kernels.

Dynamo cannot build nvdispatch's error classes inside a traced frame (their ``__init__`` chains to built-in
exceptions), so those errors are raised by :func:`refuse`, a function Dynamo runs for real when it meets it
(``torch.compiler.assume_constant_result``). Called eagerly, it simply raises.

Dynamo rewraps what it does not know as its own exceptions (``InternalTorchDynamoError``, or
``TorchRuntimeError`` for a fake kernel's), which a caller's ``except nvdispatch.errors.…`` would not catch.
While Torch compiles, an error is therefore raised as :func:`traced_error` makes it: an instance of its own
class that is also one of the exceptions Dynamo lets through unchanged, with the same message and fields:
``torch._dynamo.exc.TorchRuntimeError`` from :func:`refuse` (the trace stops there, with or without
``fullgraph``: the call is never silently run eagerly with what could not be compiled; Dynamo's ``Unsupported``
and ``UserError`` would fall back to eager without ``fullgraph``), ``torch._dynamo.exc.Unsupported`` from a fake
kernel (the only kind Dynamo lets out of one; without ``fullgraph`` the operator's eager run raises the same
error). ``torch.compile`` and ``torch.export`` (strict or not) thus raise the typed error, naming the argument,
at trace time.

Whether Torch is compiling is read for real here (:func:`compiling`): these functions run outside Dynamo's
trace. ``torch.compiler.is_compiling()`` answers True there only from Torch 2.13 on (pytorch/pytorch#184614 holds
its flag for the whole ``torch.compile`` session; before, only ``torch.export`` set it, and ``torch.compile``
answered True to the calls it traced alone), so the tracing context Dynamo and AOTAutograd install while they
trace says so too: without it Torch 2.11 rewrapped the plain error as ``InternalTorchDynamoError`` (from
:func:`refuse`) or ``TorchRuntimeError`` (from a fake kernel).
"""

from __future__ import annotations

import functools

import torch

from .. import errors

__all__ = ["refuse", "describe", "compiling", "traced_error", "fake_kernel"]


def describe(value) -> str:
    """A short description of ``value`` for an error message, in code Dynamo traces (``errors.describe`` reads
    what Dynamo cannot: module names of arbitrary types)."""
    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return f"{type(value).__name__} {value!r}"
    if isinstance(value, torch.Tensor):
        return f"a tensor of {value.dim()} dimensions and dtype {str(value.dtype)[6:]}"
    return f"a {type(value).__name__}"


def compiling() -> bool:
    """Whether Torch is compiling or exporting a program, read for real (outside Dynamo's trace too: in a
    function Dynamo runs, a fake kernel, an AOTAutograd trace); see the module notes."""
    if torch.compiler.is_compiling():
        return True
    try:
        return torch._guards.TracingContext.try_get() is not None
    except AttributeError:  # a Torch without the tracing context
        return False


@functools.cache
def _traced_class(cls: type, through: type) -> type:
    """``cls`` (an nvdispatch error class) joined with ``through`` (a Dynamo exception), pickled as ``cls``."""

    def __reduce__(self):  # the error as raised, without Dynamo's fields and the user stack it adds to the message
        return self._untraced.__reduce__()

    return type(cls.__name__, (cls, through), {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                               "__reduce__": __reduce__})  # fmt: skip


def traced_error(error: errors.NvdispatchError, graph_break: bool = False) -> errors.NvdispatchError:
    """``error`` as Torch's compilers let it through while they trace (see the module notes): joined with
    Dynamo's ``Unsupported`` where ``graph_break`` (a fake kernel's), else with its ``TorchRuntimeError``;
    ``error`` itself in eager code."""
    if isinstance(error, IndexError) or not compiling():  # IndexError: let through already
        return error
    try:
        from torch._dynamo.exc import TorchRuntimeError, Unsupported
    except ImportError:  # a Torch without these exceptions: as it is
        return error
    through = Unsupported if graph_break else TorchRuntimeError
    traced = Exception.__new__(_traced_class(type(error), through))
    through.__init__(traced, str(error))  # Dynamo's fields (message; for Unsupported its stack and stats)
    traced.__dict__.update(error.__dict__)
    traced._untraced = error
    return traced


@torch.compiler.assume_constant_result
def refuse(kind: str, argument: str, expected: str, got: str, hint: str = "") -> None:
    """Raise ``nvdispatch.errors.<kind>(argument, expected, got, hint)``."""
    raise traced_error(getattr(errors, kind)(argument, expected, got, hint))


def fake_kernel(fake):
    """``fake`` (an operator's fake kernel) raising its nvdispatch errors as :func:`traced_error` makes them."""

    @functools.wraps(fake)
    def run(*args):
        try:
            return fake(*args)
        except errors.NvdispatchError as error:
            traced = traced_error(error, graph_break=True)
            if traced is error:
                raise
            raise traced.with_traceback(error.__traceback__) from None

    return run
