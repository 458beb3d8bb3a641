"""The re-entry guard of the Torch operators: while an operator's real kernel runs the public function, that
call takes the route, never the operator again."""

from __future__ import annotations

import contextvars

__all__ = ["in_kernel", "inside_kernel"]

_in_kernel: contextvars.ContextVar[bool] = contextvars.ContextVar("nvdispatch_torch_kernel", default=False)


class in_kernel:  # noqa: N801 - used as a context manager, like a function
    """``with in_kernel():`` while an operator's real kernel calls the public function."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _in_kernel.set(True)

    def __exit__(self, *exc: object) -> None:
        _in_kernel.reset(self._token)


def inside_kernel() -> bool:
    """Whether the current call comes from an operator's real kernel."""
    return _in_kernel.get()
