"""Exception types raised by :mod:`nvdispatch.device` when a configuration cannot be built.

They are part of nvdispatch's one error tree: a :class:`DeviceConfigurationError` is an
:class:`~nvdispatch.errors.InvalidArgumentError`, so both ``except nvdispatch.errors.NvdispatchError`` and
``except ValueError`` catch it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["DeviceConfigurationError", "UnsupportedConfigurationError", "DeviceLaunchError"]


class DeviceConfigurationError(InvalidArgumentError):
    """A knob of a device-side FFT or GEMM got a value it cannot take.

    Attributes
    ----------
    argument : str
        The name of the offending argument, as the caller spelled it.
    expected : str
        What would have been accepted (for a discrete knob: the valid values).
    got : Any
        The value that came.

    Examples
    --------
    >>> from nvdispatch.device import DeviceConfigurationError, fft
    >>> try:
    ...     fft(fft_type="c2c", size=128, precision="float32", direction="forward", elements_per_thread=3)
    ... except DeviceConfigurationError as error:
    ...     print(error.argument)
    elements_per_thread
    """

    def __init__(self, argument: str, expected: str | Iterable[Any], got: Any):
        if not isinstance(expected, str):
            expected = "one of " + ", ".join(repr(v) for v in expected)
        super().__init__(argument, expected, repr(got))
        self.got = got


class UnsupportedConfigurationError(DeviceConfigurationError):
    """Each knob is valid on its own but this combination is not implemented."""


class DeviceLaunchError(InvalidArgumentError):
    """A kernel calls a device FFT/GEMM in a way it cannot run: launched with the wrong block dimensions, too
    little shared memory, a ``thread_data`` or GEMM tile too small. Raised from inside the kernel (always
    under the simulator, on a GPU in debug mode: see :mod:`nvdispatch.device.launch_checks`).

    Numba and the simulator re-create an exception raised on the device from its message alone (with the
    thread's coordinates in front), so the constructor also accepts that single message and reads the
    argument, what was expected and what came back out of it.

    Examples
    --------
    >>> from nvdispatch.device import DeviceLaunchError
    >>> error = DeviceLaunchError("tid=[0, 0, 0] ctaid=[0, 0, 0]: block_dim: expected x == 64, got blockDim.x = 32")
    >>> error.argument, error.expected, error.got
    ('block_dim', 'x == 64', 'blockDim.x = 32')
    """

    def __init__(self, argument: str, expected: str | None = None, got: str | None = None, hint: str = ""):
        if expected is None and got is None:
            import re

            found = re.fullmatch(r"(?:(.*?): )?(\w+): expected (.*), got (.*)", argument, flags=re.S)
            if found:
                where, argument, expected, got = found.groups()
                hint = hint or (f"in thread {where}" if where else "")
            else:
                argument, expected, got = "launch", "a valid launch", argument
        super().__init__(argument, expected or "", got or "", hint)
