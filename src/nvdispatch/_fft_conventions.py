"""NumPy's and SciPy's calling conventions on top of nvdispatch's array-API transforms.

``nvdispatch.fft`` is a drop-in for ``numpy.fft`` on NumPy input and serves ``scipy.fft`` as a backend. What
those libraries accept beyond the array API is brought here to the one route every call takes
(``nvdispatch.fft._route``): array-likes become NumPy arrays, integer/boolean/half inputs are promoted, ``s``/``axes`` are
resolved NumPy's way (a repeated axis is transformed once per entry), and ``out=`` receives the result.

Promotion, per convention (the caller's library decides, so results match it dtype for dtype):

* ``"numpy"`` (``nvdispatch.fft.*`` on NumPy input): booleans and integers → float64; float16 → float32,
  except that the real output of ``irfft``/``hfft`` (and a one-axis ``irfftn``) is float16 again, as
  ``numpy.fft`` returns it.
* ``"scipy"`` (the ``scipy.fft`` backend on NumPy input): booleans and integers → float64, float16 → float32.
* any other framework: booleans and integers → the framework's default real floating dtype (array-API
  inspection, e.g. Torch's ``torch.get_default_dtype()``, JAX's float32), as its own fft module does.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import array_api_compat
import numpy as np

from ._adapters import adapter_for
from ._fft_problem import normalize_axis
from .errors import (
    InvalidArgumentError,
    ShapeMismatchError,
    UnsupportedDtypeError,
    UnsupportedOperandError,
    describe,
)

__all__ = ["as_operand", "promote", "numpy_nd_args", "run_nd_numpy_way", "write_out"]

_log = logging.getLogger("nvdispatch")

#: transforms whose real output numpy.fft gives in float16 for float16 input
_HALF_REAL_OUT = frozenset({"irfft", "hfft"})
_ARRAY_PROTOCOLS = ("__array_namespace__", "__dlpack__", "__cuda_array_interface__")


def as_operand(x: Any) -> Any:
    """``x`` itself when it is an array of some framework, else ``numpy.asarray(x)`` (lists, tuples, scalars,
    objects with ``__array__``), as ``numpy.fft`` and ``scipy.fft`` take them."""
    if isinstance(x, np.ndarray):
        return x
    if not isinstance(x, np.generic) and any(hasattr(x, p) for p in _ARRAY_PROTOCOLS):
        return x
    if adapter_for(x) is not None:  # an array nvdispatch knows (e.g. a lazy Dask array: never compute it)
        return x
    try:
        arr = np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - whatever NumPy says, the operand is no array
        raise UnsupportedOperandError("x", "an array or an array-like (list, tuple, scalar)", describe(x)) from exc
    if arr.dtype == object:
        raise UnsupportedOperandError("x", "an array or a numeric array-like", describe(x))
    return arr


def promote(x: Any, func: str, convention: str, naxes: int = 1) -> tuple[Any, Any]:
    """``(operand, final dtype or None)``: integer/boolean/half input promoted by ``convention``'s rules
    (see the module docstring); the final dtype is what the result must be cast to afterwards."""
    if isinstance(x, np.ndarray):
        kind = x.dtype.kind
        if kind in "fc" and x.dtype.itemsize > 2:
            return x, None
        if kind in "biu":
            return x.astype(np.float64), None
        if x.dtype == np.float16:
            half_out = convention == "numpy" and (func in _HALF_REAL_OUT or (func == "irfftn" and naxes == 1))
            return x.astype(np.float32), (np.float16 if half_out else None)
        return x, None  # anything else: the problem builder names it in a typed error
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return x, None
    try:
        xp = array_api_compat.array_namespace(x)
        if not xp.isdtype(dtype, ("bool", "integral")):
            return x, None
        default = xp.__array_namespace_info__().default_dtypes()["real floating"]
        return xp.astype(x, default), None
    except Exception:  # noqa: BLE001 - a namespace without inspection: the dtype error explains
        return x, None


def numpy_nd_args(func: str, shape: tuple[int, ...], s, axes, stacklevel: int = 4):
    """``(s, axes)`` as ``numpy.fft`` resolves them (``_cook_nd_args``): concrete sizes, normalised axes
    (repeats kept), and NumPy 2's DeprecationWarnings for ``s`` without ``axes`` and ``None`` in ``s``."""
    ndim = len(shape)
    if axes is None:
        if s is None:
            axes_t = tuple(range(ndim))
        else:
            if isinstance(s, (str, bytes)) or not hasattr(s, "__len__"):
                raise InvalidArgumentError("s", "a sequence of ints (or None)", repr(s))
            warnings.warn(
                "`axes` should not be `None` if `s` is not `None` (Deprecated in NumPy 2.0): s applies to the "
                "last len(s) axes; pass axes explicitly",
                DeprecationWarning,
                stacklevel=stacklevel,
            )
            if len(s) > ndim:
                raise ShapeMismatchError("s", f"at most {ndim} sizes for a {ndim}-D input", repr(tuple(s)))
            axes_t = tuple(range(ndim - len(s), ndim))
    else:
        if isinstance(axes, (str, bytes)) or not hasattr(axes, "__iter__"):
            raise InvalidArgumentError("axes", "a sequence of ints (or None)", repr(axes))
        axes_t = tuple(normalize_axis(a, ndim, "axes") for a in axes)
    c2r = func == "irfftn"
    if s is None:
        sizes = [shape[a] for a in axes_t]
        if c2r and axes_t:
            sizes[-1] = 2 * (shape[axes_t[-1]] - 1)
        return tuple(sizes), axes_t
    if isinstance(s, (str, bytes)) or not hasattr(s, "__iter__"):
        raise InvalidArgumentError("s", "a sequence of ints (or None)", repr(s))
    s_l = list(s)
    if len(s_l) != len(axes_t):
        raise ShapeMismatchError("s", f"{len(axes_t)} sizes, one per entry of axes", f"{len(s_l)}: {tuple(s_l)}")
    if any(v is None for v in s_l):
        warnings.warn(
            "Passing an array containing `None` values to `s` is deprecated in NumPy 2.0: each None takes the "
            "default of the corresponding 1-D transform",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
    sizes = []
    for i, (v, a) in enumerate(zip(s_l, axes_t)):
        if v is None:
            v = 2 * (shape[a] - 1) if c2r and i == len(axes_t) - 1 else shape[a]
        elif not isinstance(v, bool) and v == -1:
            v = shape[a]
        sizes.append(v)
    return tuple(sizes), axes_t


def run_nd_numpy_way(func: str, x, sizes, axes, norm, run_1d: Callable):
    """An n-D transform as ``numpy.fft`` composes it from 1-D ones (used for repeated axes):
    ``run_1d(func, x, n, axis, norm)`` runs one 1-D transform through the normal route."""
    _log.debug("fft %s: axes %s repeat an axis; one 1-D transform per entry, as numpy.fft does", func, axes)
    last = len(axes) - 1
    if func in ("fftn", "ifftn"):
        one = func[:-1]
        for i in range(last, -1, -1):
            x = run_1d(one, x, sizes[i], axes[i], norm)
        return x
    if func == "rfftn":
        x = run_1d("rfft", x, sizes[last], axes[last], norm)
        for i in range(last - 1, -1, -1):
            x = run_1d("fft", x, sizes[i], axes[i], norm)
        return x
    for i in range(last):  # irfftn
        x = run_1d("ifft", x, sizes[i], axes[i], norm)
    return run_1d("irfft", x, sizes[last], axes[last], norm)


def write_out(result, out):
    """Write ``result`` into the caller's ``out`` array (NumPy's ``same_kind`` casting) and return ``out``;
    a typed error, naming ``out``, when it is no array of the result's framework or has the wrong shape or
    dtype. ``out`` may overlap the input: the result is complete before it is written."""
    if isinstance(result, np.ndarray):
        if not isinstance(out, np.ndarray):
            raise UnsupportedOperandError(
                "out", "a NumPy array to write the result into (out must be of ArrayType)", describe(out)
            )
        if out.shape != result.shape:
            raise ShapeMismatchError(
                "out", f"shape {result.shape}", f"shape {out.shape}", "the output array has wrong shape"
            )
        if not np.can_cast(result.dtype, out.dtype, "same_kind"):
            raise UnsupportedDtypeError(
                "out",
                f"a dtype the {result.dtype} result casts to (same_kind)",
                str(out.dtype),
                f"Cannot cast {result.dtype} to {out.dtype}",
            )
        if not out.flags.writeable:
            raise InvalidArgumentError("out", "a writeable array", "a read-only array")
        np.copyto(out, result, casting="same_kind")
        return out
    xp = array_api_compat.array_namespace(result)
    try:
        same = array_api_compat.array_namespace(out) is xp
    except TypeError:
        same = False
    if not same:
        raise UnsupportedOperandError("out", f"an array of the result's framework ({xp.__name__})", describe(out))
    if tuple(out.shape) != tuple(result.shape):
        raise ShapeMismatchError(
            "out", f"shape {tuple(result.shape)}", f"shape {tuple(out.shape)}", "the output array has wrong shape"
        )
    if not xp.can_cast(result.dtype, out.dtype) and not _same_kind(xp, result.dtype, out.dtype):
        raise UnsupportedDtypeError("out", f"a dtype the {result.dtype} result casts to", str(out.dtype))
    if hasattr(out, "copy_"):  # Torch: in place, autograd-aware
        out.copy_(result)
    else:
        try:
            out[...] = result
        except Exception as exc:  # noqa: BLE001 - e.g. JAX arrays are immutable
            raise InvalidArgumentError("out", "a mutable array", describe(out), str(exc)) from exc
    return out


def _same_kind(xp, src, dst) -> bool:
    """Precision may drop within a kind (complex128 → complex64), as NumPy's same_kind casting allows."""
    for kind in ("complex floating", "real floating"):
        if xp.isdtype(src, kind):
            return xp.isdtype(dst, kind) or (kind == "real floating" and xp.isdtype(dst, "complex floating"))
    return False
