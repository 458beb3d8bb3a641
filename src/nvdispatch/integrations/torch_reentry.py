"""The re-entry guard of the Torch operators: while an operator's real kernel runs the public function, that
call takes the route, never the operator again."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

__all__ = ["in_kernel", "inside_kernel"]

_in_kernel: contextvars.ContextVar[bool] = contextvars.ContextVar("nvdispatch_torch_kernel", default=False)


@contextlib.contextmanager
def in_kernel() -> Iterator[None]:
    """While an operator's real kernel calls the public function."""
    token = _in_kernel.set(True)
    try:
        yield
    finally:
        _in_kernel.reset(token)


def inside_kernel() -> bool:
    """Whether the current call comes from an operator's real kernel."""
    return _in_kernel.get()
