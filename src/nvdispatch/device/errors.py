"""Exception types raised by :mod:`nvdispatch.device` when a configuration cannot be built.

They are part of nvdispatch's one error tree: a :class:`DeviceConfigurationError` is an
:class:`~nvdispatch.errors.InvalidArgumentError`, so both ``except nvdispatch.errors.NvdispatchError`` and
``except ValueError`` catch it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["DeviceConfigurationError", "UnsupportedConfigurationError"]


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
    >>> from nvdispatch.device import fft
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
