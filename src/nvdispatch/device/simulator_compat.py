"""Make kernels that are valid on a GPU behave the same under Numba's CUDA simulator.

Numba's simulator (``NUMBA_ENABLE_CUDASIM=1``) differs from the GPU target in ways that break ordinary
cuFFTDx-style kernels:

* ``@cuda.jit(link=[])`` raises, although an empty link list is valid on a GPU;
* ``cuda.shared.array(shape=(0,), dtype=...)`` returns an empty array instead of the dynamic shared memory;
* a NumPy scalar *class* (``np.complex64``) as the dtype of dynamic shared memory crashes.

:func:`install` patches those three places in the simulator, and only when the simulator is active. It is
called once when :mod:`nvdispatch.device` is imported; calling it again does nothing. On a GPU nothing is
patched.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import numpy as np

__all__ = ["simulator_active", "install"]

_PATCHED_MARK = "_nvdispatch_simulator_compat"


def simulator_active() -> bool:
    """Whether ``numba.cuda`` is Numba's CUDA simulator in this process.

    Examples
    --------
    >>> isinstance(simulator_active(), bool)
    True
    """
    from numba import cuda

    return cuda.jit.__module__.startswith("numba.cuda.simulator") or getattr(cuda.jit, _PATCHED_MARK, False)


def install() -> bool:
    """Patch the simulator so GPU-valid kernels run unchanged; return whether anything was patched."""
    if not simulator_active():
        return False
    from numba import cuda
    from numba.cuda.simulator import kernelapi

    if getattr(cuda.jit, _PATCHED_MARK, False):
        return False
    cuda.jit = _jit_accepting_empty_link(cuda.jit)
    kernelapi.FakeCUDAShared.array = _shared_array
    return True


def _jit_accepting_empty_link(simulator_jit):
    @functools.wraps(simulator_jit)
    def jit(*args: Any, **kwargs: Any):
        link = kwargs.get("link")
        if link is not None and len(link) == 0:
            kwargs["link"] = None
        return simulator_jit(*args, **kwargs)

    setattr(jit, _PATCHED_MARK, True)
    return jit


def _as_numpy_dtype(dtype: Any) -> np.dtype:
    from numba.np import numpy_support

    if type(dtype).__module__.startswith("numba"):
        return numpy_support.as_dtype(dtype)
    return np.dtype(dtype)


def _is_dynamic_shape(shape: Any) -> bool:
    if isinstance(shape, tuple):
        return len(shape) == 1 and shape[0] == 0
    return shape == 0


def _shared_array(self, shape, dtype, alignment=None):
    """Replacement for the simulator's ``cuda.shared.array`` (same semantics as on a GPU)."""
    if alignment is not None:
        raise RuntimeError("Array alignment is not supported in cudasim")
    dtype = _as_numpy_dtype(dtype)
    if _is_dynamic_shape(shape):
        count = self._dynshared_size // dtype.itemsize
        return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
    # Static shared arrays are identified by the calling source line, as the simulator does.
    caller = sys._getframe(1)
    key = (caller.f_code.co_filename, caller.f_lineno)
    result = self._allocations.get(key)
    if result is None:
        result = np.empty(shape, dtype)
        self._allocations[key] = result
    return result
