"""The sample frequencies (``fftfreq``, ``rfftfreq``) and the shifts (``fftshift``, ``ifftshift``): array
operations in the caller's framework, no transform and no plan."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .._adapters import adapter_for, adapter_named, adapters, framework_names
from .._detect import detect
from .._fft_problem import normalize_axis
from .._route import Explanation
from .._traced import traced_handler
from .._typing import Array, Axes
from ..errors import InvalidArgumentError, UnsupportedOperandError, describe
from ..executors import builtin

__all__ = ["fftfreq", "rfftfreq", "fftshift", "ifftshift"]


def _framework_of_device(device):
    """(adapter, its device object) that ``fftfreq``'s ``device`` argument asks for: a framework's device
    object is its framework's; a string (``"cpu"``, ``"cuda[:N]"``) goes to the first adapter taking it."""
    if device is None:
        return adapter_named("numpy"), None
    ranked = adapters() if not isinstance(device, str) else sorted(adapters(), key=lambda a: a.device_string_rank)
    for ad in ranked:
        native = ad.native_device(device)
        if native is not None:
            return ad, native
    raise InvalidArgumentError(
        "device",
        f"None, 'cpu', 'cuda[:N]' or a device object of a registered framework ({framework_names()})",
        describe(device),
    )


def _freq(n, d, dtype, device, real: bool, name: str):
    staged = traced_handler("fft_freq", (d,))  # a sample spacing traced by jax.jit...
    if staged is not None:
        return staged(n, d=d, dtype=dtype, device=device, real=real)
    n_ = _as_pos_int(n, "n")
    if _real_scalar_array(d):  # a 0-d array (a concrete JAX scalar, as jax.test_util's finite differences pass)
        d = float(d)
    if isinstance(d, bool) or not isinstance(d, (int, float, np.floating, np.integer)):
        raise InvalidArgumentError("d", "a real number", repr(d))
    if d == 0:
        raise InvalidArgumentError("d", "a non-zero sample spacing", repr(d))
    ad, dev = _framework_of_device(device)
    if real:
        k = np.arange(n_ // 2 + 1, dtype=np.float64)
    else:
        k = np.concatenate([np.arange((n_ - 1) // 2 + 1), np.arange(-(n_ // 2), 0)]).astype(np.float64)
    return ad.from_host_values(k / (n_ * float(d)), dtype, dev)


def _real_scalar_array(d) -> bool:
    dtype = getattr(d, "dtype", None)
    return getattr(d, "shape", None) == () and dtype is not None and np.dtype(dtype).kind in "iuf"


def _as_pos_int(n, arg):
    if isinstance(n, bool):
        raise InvalidArgumentError(arg, "an int >= 1", repr(n))
    try:
        v = operator.index(n)
    except TypeError:
        raise InvalidArgumentError(arg, "an int >= 1", repr(n)) from None
    if v < 1:
        raise InvalidArgumentError(arg, "an int >= 1", repr(n))
    return v


def fftfreq(n: int, /, *, d: float = 1.0, dtype: Any = None, device: Any = None, chunks: Any = None) -> Array:
    """The sample frequencies ``[0, 1, ..., n//2-ish, -.., -1] / (d*n)`` of an ``n``-point DFT.

    ``device``: None or ``"cpu"`` (NumPy array), a ``torch.device`` (Torch tensor), a ``cupy.cuda.Device``
    (CuPy array), or ``"cuda[:N]"`` (Torch when installed, else CuPy). ``dtype`` defaults to float64.
    ``chunks`` (nvdispatch extra): a lazy Dask array chunked so (e.g. ``chunks=1000``), of blocks of that
    framework and device.

    Examples
    --------
    >>> import nvdispatch
    >>> nvdispatch.fft.fftfreq(4, d=0.5).tolist()
    [0.0, 0.5, -1.0, -0.5]
    """
    if chunks is not None:
        return _dask_freq(n, d, dtype, device, False, chunks)
    return _freq(n, d, dtype, device, False, "fftfreq")


def rfftfreq(n: int, /, *, d: float = 1.0, dtype: Any = None, device: Any = None, chunks: Any = None) -> Array:
    """The sample frequencies ``[0, 1, ..., n//2] / (d*n)`` of an ``n``-point real DFT (see :func:`fftfreq`).

    Examples
    --------
    >>> import nvdispatch
    >>> nvdispatch.fft.rfftfreq(4, d=0.5).tolist()
    [0.0, 0.5, 1.0]
    """
    if chunks is not None:
        return _dask_freq(n, d, dtype, device, True, chunks)
    return _freq(n, d, dtype, device, True, "rfftfreq")


def _dask_freq(n, d, dtype, device, real: bool, chunks):
    like = _freq(1, d, dtype, device, real, "fftfreq")  # validates the arguments, fixes dtype and device
    return builtin("dask").frequencies(_as_pos_int(n, "n"), d, real, chunks, like)


def _shift(x, axes, inverse: bool):
    staged = traced_handler("fft_shift", (x,))
    if staged is not None:
        return staged(x, axes=axes, inverse=inverse)
    info = detect("x", x)
    ndim = len(info.shape)
    if axes is None:
        axes_t = tuple(range(ndim))
    else:
        seq = (axes,) if isinstance(axes, int) else axes
        if isinstance(seq, (str, bytes)) or not hasattr(seq, "__iter__"):
            raise InvalidArgumentError("axes", "an int, a sequence of ints, or None", repr(axes))
        axes_t = tuple(normalize_axis(a, ndim, "axes") for a in seq)
    shifts = tuple(-(info.shape[a] // 2) if inverse else info.shape[a] // 2 for a in axes_t)
    return _roll(x, info, shifts, axes_t)


def _roll(x, info, shifts, axes):
    """``x`` rolled by ``shifts`` along ``axes`` (a copy when no axes), as the caller's type: by its adapter where
    it rolls its own arrays, else on the view executors take (``info.array``: a host view by NumPy, a device array
    known only by a protocol through the helper namespace that can view it, CuPy, else Torch), the result
    handed back through the adapter."""
    ad = adapter_for(x)
    if ad.can_roll:
        return ad.roll(x, shifts, axes)
    view = info.array
    vad = adapter_for(view)
    if vad is not None and vad is not ad and vad.can_roll:
        out = vad.roll(view, shifts, axes)
    else:
        from .._cuda.xp import namespace_for

        helper = namespace_for(info.framework)
        if helper is None:
            raise UnsupportedOperandError(
                "x", "an array CuPy or Torch can view (to shift it)", f"a {info.framework} array", ""
            )
        vad = adapter_named(helper)
        out = vad.roll(vad.view_device_array(view), shifts, axes)
        if not ad.wraps:  # a protocol's device array: the result as the kind of result its adapter makes
            return ad.as_result(ad.result_kind(x), out, helper)
    return ad.wrap(out, x) if ad.wraps else out


def fftshift(x: Array, /, *, axes: int | Axes = None) -> Array:
    """Move the zero-frequency term to the centre along ``axes`` (all axes when None).

    The result is of the caller's type, on its device (``__cuda_array_interface__`` arrays are shifted by CuPy
    or Torch and come back as nvdispatch's ``CudaArray``, or Numba device arrays for Numba callers).

    Examples
    --------
    >>> import nvdispatch
    >>> nvdispatch.fft.fftshift(nvdispatch.fft.fftfreq(4)).tolist()
    [-0.5, -0.25, 0.0, 0.25]
    """
    return _shift(x, axes, False)


def ifftshift(x: Array, /, *, axes: int | Axes = None) -> Array:
    """Inverse of :func:`fftshift`.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> nvdispatch.fft.ifftshift(np.array([-2, -1, 0, 1])).tolist()
    [0, 1, -2, -1]
    """
    return _shift(x, axes, True)


def _explain_simple(name):
    def _explain(*args, **kwargs):
        first = args[0] if args else None
        where = "numpy"
        if name in ("fftshift", "ifftshift"):
            where = detect("x", first).framework
        elif kwargs.get("device") is not None:
            where = _framework_of_device(kwargs["device"])[0].name
        steps = (f"{name}: computed with {where} array operations (no transform, no plan)",)
        return Explanation(name, where, "direct", steps, (), ("direct",), False, None)

    return _explain


for _f in (fftfreq, rfftfreq, fftshift, ifftshift):
    _f.__nvdispatch_explain__ = _explain_simple(_f.__name__)
del _f
