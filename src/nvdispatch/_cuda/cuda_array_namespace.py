"""The array namespace of :class:`~nvdispatch._cuda.arrays.CudaArray` (``x.__array_namespace__()``).

A ``CudaArray`` is what nvdispatch returns to callers whose operands are known only by
``__cuda_array_interface__``/DLPack. Its namespace is the array API of a GPU framework installed here — CuPy
first, else Torch (through array-api-compat) — whose functions take ``CudaArray`` arguments as zero-copy views
of the same memory. Their results are arrays of that framework (the namespace's own array type), on the same
device.

Examples
--------
A ``CudaArray`` needs a GPU; the namespace wraps any array-API namespace (NumPy's here) the same way:

>>> import numpy as np
>>> from nvdispatch._cuda.cuda_array_namespace import CudaArrayNamespace
>>> class Boxed:  # stands for CudaArray
...     def __init__(self, values):
...         self.values = values
>>> xp = CudaArrayNamespace("numpy", np, lambda x: x.values, Boxed)
>>> float(xp.sum(Boxed(np.ones(3))))
3.0
>>> float(xp.sum(xp.ones(3)))  # the namespace's own arrays as they are
3.0
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

from ..errors import ExecutorUnavailableError, InvalidArgumentError

__all__ = ["CudaArrayNamespace", "namespace"]

#: array API versions a namespace may be asked for (None: the newest its framework has)
_VERSIONS = (None, "2021.12", "2022.12", "2023.12", "2024.12")


class CudaArrayNamespace:
    """An array-API namespace ``xp`` whose functions first turn arguments of type ``takes`` (``CudaArray``; also
    inside lists and tuples) into ``xp``'s arrays with ``adopt``; everything else (constants, dtypes) is ``xp``'s
    own."""

    def __init__(self, framework: str, xp: Any, adopt: Callable[[Any], Any], takes: type):
        self.framework = framework
        self._xp = xp
        self._adopt = adopt
        self._takes = takes
        self.__name__ = f"nvdispatch CudaArray namespace ({framework})"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(self._xp, name)
        if isinstance(attr, types.ModuleType):  # linalg, fft: namespaces of their own
            wrapped: Any = CudaArrayNamespace(self.framework, attr, self._adopt, self._takes)
        elif callable(attr) and not isinstance(attr, type):
            wrapped = _taking(self._takes, attr, self._adopt)
        else:
            return attr  # constants, dtypes
        setattr(self, name, wrapped)  # looked up once
        return wrapped

    def __dir__(self):
        return sorted(set(dir(self._xp)) | {"framework"})

    def __repr__(self) -> str:
        return f"<{self.__name__}>"


def _taking(takes: type, fn: Callable, adopt: Callable[[Any], Any]) -> Callable:
    """``fn`` converting its arguments of type ``takes`` with ``adopt`` first."""

    def convert(v):
        if isinstance(v, takes):
            return adopt(v)
        if isinstance(v, (list, tuple)) and any(isinstance(e, takes) for e in v):
            return type(v)(convert(e) for e in v)
        return v

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return fn(*(convert(a) for a in args), **{k: convert(v) for k, v in kwargs.items()})

    return call


@functools.cache
def namespace(takes: type, api_version: str | None = None) -> CudaArrayNamespace:
    """The namespace of ``CudaArray`` results (``takes``: the class): CuPy's where CuPy is installed, else Torch's
    (CUDA build)."""
    if api_version not in _VERSIONS:
        raise InvalidArgumentError("api_version", f"one of {_VERSIONS}", repr(api_version))
    try:
        import array_api_compat.cupy as xp
        import cupy

        return CudaArrayNamespace("cupy", xp, cupy.asarray, takes)  # zero-copy through __cuda_array_interface__
    except ImportError:
        pass
    try:
        import array_api_compat.torch as xp
        import torch

        if torch.cuda.is_available():
            return CudaArrayNamespace("torch", xp, torch.from_dlpack, takes)
    except ImportError:
        pass
    raise ExecutorUnavailableError(
        "CudaArray.__array_namespace__",
        "CuPy or a CUDA build of Torch installed, whose array API works on CudaArray memory",
        "neither",
    )
