"""The ``scipy.fft`` backend protocol (uarray): ``scipy.fft.set_backend(nvdispatch.fft)`` runs SciPy's
transforms through nvdispatch; what nvdispatch cannot serve returns ``NotImplemented`` so SciPy falls through
to its next backend."""

from __future__ import annotations

import logging

import array_api_compat
import numpy as np

from .._fft_conventions import as_operand
from .._fft_problem import check_norm
from .._route import detect_all
from ..errors import InvalidArgumentError, NvdispatchError, describe
from ._route import transform_front

__all__ = ["__ua_domain__", "__ua_convert__", "__ua_function__"]

__ua_domain__ = "numpy.scipy.fft"
_log = logging.getLogger("nvdispatch")


def _check_scipy_extras(workers, plan) -> None:
    """SciPy's extra keywords: ``overwrite_x`` needs nothing (nvdispatch never writes its input), ``workers``
    is taken (nvdispatch's CPU executor already uses every core), a precomputed ``plan`` is SciPy's own."""
    if plan is not None:
        raise InvalidArgumentError("plan", "None (precomputed plans belong to SciPy's own backend)", describe(plan))
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers == 0:
            raise InvalidArgumentError("workers", "a non-zero int or None", repr(workers))


def _one_d(func: str) -> tuple:
    """The table row of SciPy's 1-D ``func``."""

    def f(x, n=None, axis=-1, norm=None, overwrite_x=False, workers=None, *, plan=None):
        if workers is not None or plan is not None:
            _check_scipy_extras(workers, plan)
        return transform_front(func, x, n, axis, None, None, norm, None, None, "scipy", None)

    return f, func, None


def _n_d(func: str, default_axes=None) -> tuple:
    """The table row of SciPy's n-D ``func`` (or of its 2-D form, whose axes default to ``default_axes``)."""

    def f(x, s=None, axes=default_axes, norm=None, overwrite_x=False, workers=None, *, plan=None):
        if workers is not None or plan is not None:
            _check_scipy_extras(workers, plan)
        return transform_front(func, x, None, -1, s, axes, norm, None, None, "scipy", None)

    return f, func, default_axes


_SWAP_NORM = {"backward": "forward", "ortho": "ortho", "forward": "backward"}


def _conj(x):
    return np.conjugate(x) if isinstance(x, np.ndarray) else array_api_compat.array_namespace(x).conj(x)


def _hermitian_n_d(inverse: bool, default_axes=None) -> tuple:
    """The table row of SciPy's ``hfftn``/``ihfftn`` (and the 2-D forms), from the real transforms as SciPy
    defines them: ``hfftn(x) = irfftn(conj(x))`` and ``ihfftn(x) = conj(rfftn(x))`` with the norm's direction
    swapped."""

    def f(x, s=None, axes=default_axes, norm=None, overwrite_x=False, workers=None, *, plan=None):
        _check_scipy_extras(workers, plan)
        swapped = _SWAP_NORM[check_norm(norm)]
        if inverse:
            return _conj(transform_front("rfftn", x, None, -1, s, axes, swapped, None, None, "scipy", None))
        x = as_operand(x)
        if not isinstance(x, np.ndarray) or x.dtype.kind == "c":
            x = _conj(x)
        return transform_front("irfftn", x, None, -1, s, axes, swapped, None, None, "scipy", None)

    return f, None, None


#: SciPy's function name -> (the function with SciPy's signature, the transform nvdispatch runs for a call
#: with ``x`` alone and SciPy's defaults, the default axes of that call); None: no such shortcut
_SCIPY_IMPL = {
    "hfftn": _hermitian_n_d(False),
    "ihfftn": _hermitian_n_d(True),
    "hfft2": _hermitian_n_d(False, (-2, -1)),
    "ihfft2": _hermitian_n_d(True, (-2, -1)),
    "fft": _one_d("fft"),
    "ifft": _one_d("ifft"),
    "rfft": _one_d("rfft"),
    "irfft": _one_d("irfft"),
    "hfft": _one_d("hfft"),
    "ihfft": _one_d("ihfft"),
    "fftn": _n_d("fftn"),
    "ifftn": _n_d("ifftn"),
    "rfftn": _n_d("rfftn"),
    "irfftn": _n_d("irfftn"),
    "fft2": _n_d("fftn", (-2, -1)),
    "ifft2": _n_d("ifftn", (-2, -1)),
    "rfft2": _n_d("rfftn", (-2, -1)),
    "irfft2": _n_d("irfftn", (-2, -1)),
}
_DECLINED = (None, None, None)  # the row of a function nvdispatch does not implement
#: SciPy's multimethod -> its row of _SCIPY_IMPL, found by name on its first call (a bounded memo)
_rows: dict = {}


def _row_of(method) -> tuple:
    row = _SCIPY_IMPL.get(getattr(method, "__name__", ""), _DECLINED)
    if len(_rows) < 256:
        _rows[method] = row
    return row


def _is_array(v) -> bool:
    if isinstance(v, np.ndarray):
        return True
    try:
        detect_all({"x": v})
    except Exception:  # noqa: BLE001 - anything undetectable is not ours
        return False
    return True


def __ua_convert__(dispatchables, coerce):
    """uarray conversion: arrays nvdispatch recognises pass as they are; with ``coerce`` (SciPy's
    ``set_backend(..., coerce=True)``) other values (lists, scalars) become NumPy arrays."""
    if len(dispatchables) == 1 and dispatchables[0].value.__class__ is np.ndarray:  # SciPy's transforms: x alone
        return (dispatchables[0].value,)
    converted = []
    for d in dispatchables:
        v = d.value
        if v.__class__ is np.ndarray:  # the commonest operand: an array, whatever the dispatchable's type
            converted.append(v)
        elif d.type is np.ndarray:
            if _is_array(v):
                converted.append(v)
            elif coerce and d.coercible:
                try:
                    converted.append(np.asarray(v))
                except Exception:  # noqa: BLE001
                    return NotImplemented
            else:
                return NotImplemented
        else:
            converted.append(v)
    return converted


def __ua_function__(method, args, kwargs):
    """uarray entry point: run SciPy's ``method`` through nvdispatch, or return ``NotImplemented`` so SciPy
    falls back to its next backend. nvdispatch declines (and SciPy then serves, with SciPy's own errors for
    bad arguments) whatever no nvdispatch executor can run: transforms it does not implement (``dct``,
    ``hfftn``, ...), dtypes, arguments and layouts its executors refuse (each refusal is a typed
    :class:`~nvdispatch.errors.NvdispatchError`, logged at DEBUG)."""
    row = _rows.get(method)
    if row is None:
        row = _row_of(method)
    impl, func, axes = row
    if impl is None:
        return NotImplemented
    try:
        if func is not None and not kwargs and len(args) == 1:  # x alone (uarray drops arguments left at default)
            return transform_front(func, args[0], None, -1, None, axes, None, None, None, "scipy", None)
        return impl(*args, **kwargs)
    except NvdispatchError as exc:
        _log.debug("scipy.fft.%s: nvdispatch declines (%s); SciPy's next backend runs it", method.__name__, exc)
        return NotImplemented
    except TypeError as exc:  # arguments SciPy's signature does not have: SciPy reports them
        _log.debug("scipy.fft.%s: %s; SciPy's next backend runs it", method.__name__, exc)
        return NotImplemented
