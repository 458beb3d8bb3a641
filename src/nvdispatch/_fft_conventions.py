"""NumPy's and SciPy's calling conventions on top of nvdispatch's array-API transforms.

``nvdispatch.fft`` is a drop-in for ``numpy.fft`` on NumPy input and serves ``scipy.fft`` as a backend. What
those libraries accept beyond the array API is brought here to the one route every call takes
(``nvdispatch.fft._route``): array-likes become NumPy arrays, integer/boolean/half inputs are promoted,
``s``/``axes`` are resolved NumPy's way (a repeated axis is transformed once per entry), and ``out=`` receives
the result.

Promotion, per convention (the caller's library decides, so results match it dtype for dtype):

* ``"numpy"`` (``nvdispatch.fft.*`` on NumPy input): booleans and integers → float64; float16 → float32,
  except that the real output of ``irfft``/``hfft`` (and a one-axis ``irfftn``) is float16 again, as
  ``numpy.fft`` returns it.
* ``"scipy"`` (the ``scipy.fft`` backend on NumPy input): booleans and integers → float64, float16 → float32.
* any other framework: the framework's own rule where its adapter gives one (``Adapter.fft_promotion``: Torch
  computes float16/complex32 in float32/complex64 and returns float16 or complex32; JAX's rule is asked of
  ``jax.numpy.fft`` itself (booleans, integers, float16 and bfloat16 → float32, 64-bit integers → float64
  under ``jax_enable_x64``); CuPy computes float16 in float32 and returns complex64/float32, and from CuPy 14
  on float16 again for the real result of one named axis: ``irfft``, ``hfft``, ``irfftn`` given one axis);
  else booleans and integers → the framework's default real floating dtype (array-API inspection, e.g. Torch's
  ``torch.get_default_dtype()``), as its own fft module does.

An autocast region the framework's own FFTs follow comes first (:func:`autocast_promotion`: Torch on the CPU
computes float16/bfloat16 input in float32 there and returns the float32/complex64 result, see
:func:`nvdispatch._precision.fft_autocast_target`). It is decided on every call, before any call key is looked up:
half-precision operands have no key of their own (no transform takes them as they are), and the float32 operand a
region casts to finds the float32 call's plan, which computes the same inside a region and outside.

A call given ``out=`` is not autocast (Torch's rule: "calls that explicitly supply an ``out=...`` Tensor are allowed
in autocast-enabled regions, but won't go through autocasting"): :func:`outside_autocast` runs it with the region
suspended, so it computes as it would outside the region.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import array_api_compat
import numpy as np

from ._adapters import adapter_for
from ._fft_problem import FUNCS, normalize_axis, result_dtype, result_layout
from ._precision import FFT_AUTOCAST, fft_autocast_target
from .errors import (
    InvalidArgumentError,
    ShapeMismatchError,
    UnsupportedDtypeError,
    UnsupportedOperandError,
    describe,
)

__all__ = [
    "as_operand",
    "promote",
    "framework_promotion",
    "names_one_axis",
    "autocast_promotion",
    "outside_autocast",
    "cast_result",
    "numpy_nd_args",
    "numpy_way_steps",
    "run_nd_numpy_way",
    "check_out",
    "write_out",
]

_log = logging.getLogger("nvdispatch")

#: transforms whose real output numpy.fft gives in float16 for float16 input
_HALF_REAL_OUT = frozenset({"irfft", "hfft"})
#: dtypes every framework's transforms take as they are (by name: ``torch.float32`` is ``float32``)
_TRANSFORMED = frozenset({"float32", "float64", "complex64", "complex128"})
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


def promote(x: Any, func: str, convention: str, naxes: int = 1, one_axis: bool | None = None) -> tuple[Any, Any]:
    """``(operand, final dtype or None)``: integer/boolean/half input promoted by ``convention``'s rules
    (see the module docstring); the final dtype is what the result must be cast to afterwards
    (:func:`cast_result`: a NumPy dtype for NumPy input, else the dtype's name). ``naxes``: how many axes the
    call transforms; ``one_axis``: whether it names exactly one (see :func:`names_one_axis`; default: ``func``
    is a 1-D transform)."""
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
    name = str(dtype).rpartition(".")[2]  # torch.float16 -> float16
    if dtype is None or name in _TRANSFORMED:
        return x, None
    rule = framework_promotion(func, x, name, one_axis)
    if rule is not None:
        compute, final = rule
        if final is None:
            _log.debug("fft %s: %s input computed in %s (an autocast region, as the framework's FFTs)", func, name,
                       compute)  # fmt: skip
        else:
            _log.debug("fft %s: %s input computed in %s, the result cast to %s (its framework's rule)", func, name,
                       compute, final)  # fmt: skip
        return adapter_for(x).cast(x, compute), final
    try:
        xp = array_api_compat.array_namespace(x)
        if not xp.isdtype(dtype, ("bool", "integral")):
            return x, None
        default = xp.__array_namespace_info__().default_dtypes()["real floating"]
        return xp.astype(x, default), None
    except Exception:  # noqa: BLE001 - a namespace without inspection: the dtype error explains
        return x, None


def framework_promotion(
    func: str, x: Any, dtype: str | None = None, one_axis: bool | None = None
) -> tuple[str, str | None] | None:
    """``(the dtype x is computed in, the result's dtype)`` by the rule of ``x``'s framework for ``func`` (dtype
    names; see ``Adapter.fft_promotion``), or None where the framework has none for ``x``'s dtype. In an autocast
    region the framework's FFTs follow (:func:`autocast_promotion`): ``(the region's compute dtype, None)``, the
    result being the computed transform's. ``dtype``: ``x``'s dtype name, where the caller has it; ``one_axis``:
    whether the call names exactly one axis (:func:`names_one_axis`; default: ``func`` is a 1-D transform)."""
    adapter = adapter_for(x)
    hook = getattr(adapter, "fft_promotion", None)
    if hook is None:
        return None
    if dtype is None:
        dtype = adapter.info("x", x).dtype
    if dtype in _TRANSFORMED:  # taken as it is (JAX's hook answers complex64 input with its real dtype)
        return None
    region = autocast_promotion(x, dtype, adapter)
    if region is not None:
        return region[0], None
    kind, _, nd = FUNCS[func]
    return hook(kind, dtype, one_axis=not nd if one_axis is None else one_axis)


def names_one_axis(func: str, axes: Any = None) -> bool:
    """Whether a call of ``func`` names exactly one axis to transform: a 1-D transform, or an n-D one given
    ``axes`` of one entry (``axes=None`` names none, whatever the input's rank, as CuPy counts them)."""
    if not FUNCS[func][2]:
        return True
    try:
        return axes is not None and len(axes) == 1
    except TypeError:  # not a sequence: the problem builder names it
        return False


def autocast_promotion(x: Any, dtype: str, adapter: Any = None, rule=FFT_AUTOCAST) -> tuple[str, str] | None:
    """``(the dtype x is cast to, why)`` where an autocast region active on ``x``'s device casts a transform's
    operand of ``dtype`` (its adapter's precision convention, ``fft_autocast``; the rule:
    :func:`nvdispatch._precision.fft_autocast_target`, ``rule`` its table), ``why`` naming the region as
    ``explain()`` does; None elsewhere (a dtype no region casts, and a call outside any region, are answered
    without reading the framework's settings)."""
    if dtype not in rule:
        return None
    adapter = adapter_for(x) if adapter is None else adapter
    if adapter is None or adapter.autocast_region(x) is None:  # outside any region (or a framework without)
        return None
    convention = adapter.precision_convention(adapter.device(x))
    target = fft_autocast_target(convention, dtype, rule)
    return None if target is None else (target, convention.autocast_reason)


def outside_autocast(x: Any) -> Callable[..., Any] | None:
    """``run(fn, *args)``: ``fn(*args)`` with the autocast region active on array ``x``'s device suspended (its
    adapter's :meth:`~nvdispatch.adapters.Adapter.as_planned`), for a call given ``out=``, which Torch's autocast
    leaves as it is ("calls that explicitly supply an out=... Tensor ... won't go through autocasting", its autocast
    op reference): the call then computes as it does outside the region, and so do the framework's own operations it
    runs (the ``nvdispatch::`` operators' autocast kernels included). None where no region is active on ``x``'s
    device (and for frameworks without regions)."""
    adapter = adapter_for(x)
    if adapter is None or adapter.autocast_region(x) is None:
        return None
    return adapter.as_planned(adapter.device(x), None)


def cast_result(result: Any, final: Any) -> Any:
    """``result`` cast to ``final``, the dtype :func:`promote` said (a NumPy dtype, or a dtype name for arrays of
    other frameworks, which their adapter casts)."""
    if isinstance(result, np.ndarray):
        return result.astype(final)
    return adapter_for(result).cast(result, final)


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


def numpy_way_steps(func: str, sizes, axes) -> list[tuple[str, int, int]]:
    """The 1-D transforms ``(func, n, axis)``, in order, by which ``numpy.fft`` composes an n-D one (so a
    repeated axis is transformed once per entry)."""
    last = len(axes) - 1
    if func in ("fftn", "ifftn"):
        return [(func[:-1], sizes[i], axes[i]) for i in range(last, -1, -1)]
    if func == "rfftn":
        return [("rfft", sizes[last], axes[last])] + [("fft", sizes[i], axes[i]) for i in range(last - 1, -1, -1)]
    return [("ifft", sizes[i], axes[i]) for i in range(last)] + [("irfft", sizes[last], axes[last])]  # irfftn


def run_nd_numpy_way(func: str, x, sizes, axes, norm, run_1d: Callable):
    """An n-D transform as ``numpy.fft`` composes it from 1-D ones (used for repeated axes):
    ``run_1d(func, x, n, axis, norm)`` runs one 1-D transform through the normal route."""
    _log.debug("fft %s: axes %s repeat an axis; one 1-D transform per entry, as numpy.fft does", func, axes)
    for one, n, axis in numpy_way_steps(func, sizes, axes):
        x = run_1d(one, x, n, axis, norm)
    return x


def check_out(out, x, func: str, final=None, n=None, axis=-1, s=None, axes=None, numpy_way=None) -> None:
    """``out`` checked before any transform runs, in ``numpy.fft``'s order and with its exception types: an
    array of ``x``'s framework (TypeError), as many dimensions as ``x`` and the result's length along the
    (last) transformed axis (ValueError, "has wrong shape"), a dtype the result casts to under ``same_kind``
    (TypeError), then the other dimensions (ValueError). ``final``: the dtype the result is cast to (float16
    input); ``numpy_way``: ``(sizes, axes)`` as :func:`numpy_nd_args` resolved them (axes may repeat)."""
    numpy = isinstance(x, np.ndarray)
    if not numpy and not _has_namespace(x):
        return  # an array known by a protocol only: write_out checks the result against out
    shape = tuple(x.shape)
    if numpy_way is None:
        want, axes_t = result_layout(func, shape, n, axis, s, axes)
    else:
        sizes, axes_t = numpy_way
        if not axes_t and func not in ("fftn", "ifftn"):
            return  # the transform reports the empty axes
        if len(set(axes_t)) == len(axes_t):
            want = result_layout(func, shape, s=sizes, axes=axes_t)[0] if axes_t else shape  # no axes: a copy
        else:
            want = shape
            for one, n_, ax in numpy_way_steps(func, sizes, axes_t):
                want = result_layout(one, want, n=n_, axis=ax)[0]
    last_axis = axes_t[-1] if axes_t else None
    try:
        name = _numpy_name(x.dtype) if numpy else str(x.dtype).rpartition(".")[2]  # torch.float32 -> float32
        dtype = result_dtype(func, name)
    except UnsupportedDtypeError as exc:  # x's own dtype: raised where numpy.fft checks dtypes
        _check_out(out, x, None, want, last_axis, dtype_error=exc)
        raise
    if numpy:
        dtype = np.dtype(dtype if final is None else final)
    else:  # None: write_out checks it
        dtype = getattr(array_api_compat.array_namespace(x), dtype if final is None else final, None)
    _check_out(out, x, dtype, want, last_axis)


def _numpy_name(dtype: np.dtype) -> str:
    """``dtype.name`` for the floating kinds (long double included), without its cost."""
    kind = {"f": "float", "c": "complex"}.get(dtype.kind)
    return f"{kind}{dtype.itemsize * 8}" if kind else dtype.name


def _has_namespace(x) -> bool:
    try:
        array_api_compat.array_namespace(x)
    except TypeError:
        return False
    return True


def _check_out(out, like, dtype, shape: tuple[int, ...], first_axis: int | None, dtype_error=None) -> None:
    """``out`` must be an array of ``like``'s framework, of ``shape``, whose dtype ``dtype`` casts to
    (``first_axis``: the axis compared before the dtype, as ``numpy.fft`` does; ``dtype``: None, not
    checked; ``dtype_error``: the input's own dtype error, raised at the dtype step)."""
    numpy = isinstance(like, np.ndarray)
    if numpy:
        if not isinstance(out, np.ndarray):
            raise UnsupportedOperandError(
                "out", "a NumPy array to write the result into (out must be of ArrayType)", describe(out)
            )
    else:
        xp = array_api_compat.array_namespace(like)
        try:
            same = array_api_compat.array_namespace(out) is xp
        except TypeError:
            same = False
        if not same:
            raise UnsupportedOperandError("out", f"an array of the result's framework ({xp.__name__})", describe(out))
    got = tuple(out.shape)

    def wrong_shape():
        return ShapeMismatchError("out", f"shape {shape}", f"shape {got}", "the output array has wrong shape")

    if len(got) != len(shape) or (first_axis is not None and got[first_axis] != shape[first_axis]):
        raise wrong_shape()
    if dtype_error is not None:
        raise dtype_error
    if dtype is not None:
        if numpy and not np.can_cast(dtype, out.dtype, "same_kind"):
            raise UnsupportedDtypeError(
                "out",
                f"a dtype the {dtype} result casts to (same_kind)",
                str(out.dtype),
                f"Cannot cast {dtype} to {out.dtype}",
            )
        if not numpy and not xp.can_cast(dtype, out.dtype) and not _same_kind(xp, dtype, out.dtype):
            raise UnsupportedDtypeError("out", f"a dtype the {dtype} result casts to", str(out.dtype))
    if got != shape:
        raise wrong_shape()
    if numpy and not out.flags.writeable:
        raise InvalidArgumentError("out", "a writeable array", "a read-only array")
    if not numpy:  # what its framework will not write (an immutable array, a broadcast view): said before any work
        adapter = adapter_for(out)
        why = "" if adapter is None else adapter.unwritable(out)
        if why:
            raise InvalidArgumentError(
                "out", "an array the result can be written into (writable, no overlapping elements)", why,
                "pass a fresh array, or use the result",
            )  # fmt: skip


def write_out(result, out):
    """Write ``result`` into the caller's ``out`` array (NumPy's ``same_kind`` casting) and return ``out``;
    a typed error, naming ``out``, when it is no array of the result's framework or has the wrong shape or
    dtype. ``out`` may overlap the input: the result is complete before it is written."""
    _check_out(out, result, result.dtype, tuple(result.shape), None)
    if isinstance(result, np.ndarray):
        np.copyto(out, result, casting="same_kind")
    elif hasattr(out, "copy_"):  # Torch: in place, autograd-aware
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
