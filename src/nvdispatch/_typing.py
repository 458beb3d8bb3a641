"""Type aliases of nvdispatch's public signatures.

nvdispatch takes and returns the arrays of whichever framework the caller holds (NumPy, Torch, CuPy, JAX,
Dask, ``__cuda_array_interface__`` and DLPack objects), and no static type covers them all: the aliases
below name what a parameter means, and stay ``Any`` to a type checker so that every framework's array
passes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias

__all__ = ["Array", "ArrayLike", "Stream", "Scalar", "Norm", "Axes", "Shape", "ElementCallback", "CallbackData"]

#: an array of a supported framework (results come back as the operands' framework's arrays)
Array: TypeAlias = Any
#: an array, or what NumPy turns into one (lists, scalars) where a function accepts that
ArrayLike: TypeAlias = Any
#: a GPU stream of the operands' framework (``torch.cuda.Stream``, ``cupy.cuda.Stream``, a raw handle) or None
Stream: TypeAlias = Any
#: a Python or NumPy number (``alpha``, ``beta``)
Scalar: TypeAlias = int | float | complex | Any
#: FFT scaling
Norm: TypeAlias = Literal["backward", "ortho", "forward"] | None
#: axes of an n-dimensional transform
Axes: TypeAlias = Sequence[int] | None
#: transform lengths of an n-dimensional transform
Shape: TypeAlias = Sequence[int] | None
#: an FFT prolog/epilog: ``f(value, index, *data) -> value`` (see :mod:`nvdispatch._fft_callbacks`)
ElementCallback: TypeAlias = Callable[..., Any]
#: the extra arrays a prolog/epilog reads (one array or a sequence of them)
CallbackData: TypeAlias = Any
