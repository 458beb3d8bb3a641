"""Turning the user's ``precision`` argument into the NumPy scalar types the generated code uses."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import DeviceConfigurationError

__all__ = ["SUPPORTED_PRECISIONS", "normalize_precision", "complex_of"]

#: Real precisions the generated code supports.
SUPPORTED_PRECISIONS: tuple[type[np.floating], ...] = (np.float32, np.float64)


def normalize_precision(precision: Any, argument: str = "precision") -> type[np.floating]:
    """Return ``np.float32`` or ``np.float64`` for anything NumPy reads as one of those.

    Accepts NumPy scalar types, dtypes, strings (``"float32"``) and Numba scalar types.

    Examples
    --------
    >>> normalize_precision("float64")
    <class 'numpy.float64'>
    """
    try:
        dtype = np.dtype(str(precision) if _is_numba_type(precision) else precision)
    except TypeError:
        dtype = None
    if dtype is None or dtype.type not in SUPPORTED_PRECISIONS:
        raise DeviceConfigurationError(argument, [p.__name__ for p in SUPPORTED_PRECISIONS], precision)
    return dtype.type


def complex_of(precision: type[np.floating]) -> type[np.complexfloating]:
    """The complex NumPy type whose parts are ``precision``."""
    return np.complex64 if precision is np.float32 else np.complex128


def _is_numba_type(value: Any) -> bool:
    return type(value).__module__.startswith("numba")
