"""The re-entry guard of the Torch operators: while an operator's real kernel runs the public function, that
call takes the route, never the operator again.

A kernel may run below Torch's functionalization (in a compiled or exported graph), which dispatches past the
Conjugate and Negative keys with both excluded: Torch's own functions that return or consume lazily conjugated
views inside the kernel (``torch.fft.hfft`` conjugates its input, ``ifft`` of real input and ``ihfft`` return
conjugate views) would then read the stored values without the conjugation. The guard re-enables both keys for
the kernel's body, as in an eager call."""

from __future__ import annotations

import contextvars
import sys

__all__ = ["in_kernel", "inside_kernel"]

_in_kernel: contextvars.ContextVar[bool] = contextvars.ContextVar("nvdispatch_torch_kernel", default=False)


class in_kernel:  # noqa: N801 - used as a context manager, like a function
    """``with in_kernel():`` while an operator's real kernel calls the public function."""

    __slots__ = ("_token", "_keys")

    def __enter__(self) -> None:
        self._token = _in_kernel.set(True)
        c = sys.modules["torch"]._C
        keys = (c.DispatchKey.Conjugate, c.DispatchKey.Negative)
        self._keys = [c._SetExcludeDispatchKeyGuard(k, False) for k in keys]
        for guard in self._keys:
            guard.__enter__()

    def __exit__(self, *exc: object) -> None:
        for guard in reversed(self._keys):
            guard.__exit__(*exc)
        _in_kernel.reset(self._token)


def inside_kernel() -> bool:
    """Whether the current call comes from an operator's real kernel."""
    return _in_kernel.get()
