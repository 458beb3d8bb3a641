"""Typed errors from the code Dynamo traces in place of the public functions.

Dynamo cannot build nvdispatch's error classes inside a traced frame (their ``__init__`` chains to built-in
exceptions), so those errors are raised by :func:`refuse`, a function Dynamo runs for real when it meets it
(``torch.compiler.assume_constant_result``): the trace stops with the typed error, its message naming the argument,
as its cause. Called eagerly, it simply raises.
"""

from __future__ import annotations

import torch

from .. import errors

__all__ = ["refuse", "describe"]


def describe(value) -> str:
    """A short description of ``value`` for an error message, in code Dynamo traces (``errors.describe`` reads
    what Dynamo cannot: module names of arbitrary types)."""
    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return f"{type(value).__name__} {value!r}"
    if isinstance(value, torch.Tensor):
        return f"a tensor of {value.dim()} dimensions and dtype {str(value.dtype)[6:]}"
    return f"a {type(value).__name__}"


@torch.compiler.assume_constant_result
def refuse(kind: str, argument: str, expected: str, got: str, hint: str = "") -> None:
    """Raise ``nvdispatch.errors.<kind>(argument, expected, got, hint)``."""
    raise getattr(errors, kind)(argument, expected, got, hint)
