"""FFT on the CPU for NumPy arrays: ``scipy.fft`` when SciPy is installed, else ``numpy.fft``.

``scipy.fft`` keeps single precision and runs batched/n-D transforms over ``workers`` threads: on one thread
or on all cores the process may use, as predicted for the transform's work by this machine's calibrated
threshold (:mod:`.numpy_fft_workers`). Everything a call's checks would settle is settled when the plan is
made, so a repeated call of an aligned array of the planned dtype goes straight to pocketfft's compiled
transform (the one ``scipy.fft`` itself ends in, with the same arguments); other arrays take ``scipy.fft``'s
own function. ``numpy.fft`` (the fallback) computed in double precision before NumPy 2.0, so its result is
cast back to the problem's dtype. The input is never written to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from .._fft_problem import FFTProblem
from . import numpy_fft_workers

try:  # pragma: no cover - exercised through whichever is installed
    # SciPy's own (pocketfft) implementation, called directly: going through the public ``scipy.fft``
    # multimethods would come back to nvdispatch when it is the active ``scipy.fft`` backend.
    from scipy.fft import _pocketfft as _scipy_fft
except ImportError:  # pragma: no cover - no SciPy (or a SciPy without it): numpy.fft
    _scipy_fft = None
try:  # pragma: no cover - the compiled transforms under it (SciPy >= 1.4); without them, the functions above
    from scipy.fft._pocketfft import pypocketfft as _pocketfft
except ImportError:  # pragma: no cover
    _pocketfft = None

#: scipy.fft's norm -> pocketfft's normalisation code of a forward transform (a backward one takes 2 - code)
_NORM_CODES = {"backward": 0, "ortho": 1, "forward": 2}
_COMPLEX_OF = {"float32": "complex64", "float64": "complex128"}
_REAL_OF = {"complex64": "float32", "complex128": "float64"}


def decline(problem: FFTProblem) -> str | None:
    return None


def strategies(problem: FFTProblem) -> tuple[str, ...]:
    return ("scipy",) if _scipy_fft is not None else ("numpy",)


def plan(problem: FFTProblem, strategy: str, tuning=None):
    return NumpyFFTPlan(problem, strategy)


class NumpyFFTPlan:
    needs_release = False  # holds nothing to free: calls need not pin it (see the plan cache)
    # few objects per plan, and no reference cycle (a plan keeping its own bound method would be one): every plan
    # cached adds to what the garbage collector walks, and an evicted one is freed at once
    __slots__ = ("problem", "strategy", "kwargs", "_how", "_fn", "_compiled", "_args", "_in_dtype", "_result_dtype",
                 "__weakref__")

    def __init__(self, problem: FFTProblem, strategy: str):
        self.problem = problem
        self.strategy = strategy
        p = problem
        if p.ndim_api:
            kwargs = {"s": p.lengths, "axes": p.axes, "norm": p.norm}
        else:
            kwargs = {"n": p.lengths[0], "axis": p.axes[0], "norm": p.norm}
        self.kwargs, self._how, self._fn = _by_function_setup(p, strategy, kwargs)
        self._compiled, self._args = _compiled(p, kwargs.get("workers", 1)) if strategy == "scipy" else (None, ())
        self._in_dtype = np.dtype(p.dtype)
        self._result_dtype = np.dtype(p.result_dtype)

    @property
    def steps(self) -> tuple[str, ...]:
        return (_function_text(self), self.problem.describe())

    def execute(self, operands, stream=None):
        return self.direct(operands["x"])

    def direct(self, x):
        """The Plan protocol's direct call: pocketfft's compiled transform for an aligned ndarray of the planned
        dtype where the plan has one, else ``scipy.fft``'s (or ``numpy.fft``'s) function."""
        if self._compiled is not None and x.__class__ is np.ndarray and x.dtype is self._in_dtype and x.flags.aligned:
            return self._compiled(x, *self._args)
        return _by_function(self, x)

    def release(self) -> None:
        pass

    def any_length(self, lengths_given: bool) -> NumpyAnyLengthFFTPlan | None:
        """The plan of every operand length of this plan's transform (see :class:`NumpyAnyLengthFFTPlan`), where
        one serves them all: a 1-D operand's; None for others (a batch's threads follow its size).
        ``lengths_given``: the calls give the transform's length (``n``/``s``), else it follows the operand's."""
        if len(self.problem.shape) != 1:
            return None
        return NumpyAnyLengthFFTPlan(self.problem, self.strategy, lengths_given)


class NumpyAnyLengthFFTPlan:
    """The plan of a 1-D operand's transform for every operand length: what a new length costs is then
    pocketfft's own, as in ``scipy.fft``.

    A single 1-D transform runs on one thread whatever its length, and every other choice the plan holds
    (function, axis, normalisation, dtypes) is the length's too. Where the calls give the transform's length
    (``lengths_given``: ``n``, or ``s`` without -1) it is the plan's, and an operand of another extent is padded
    or trimmed by the function, as ``scipy.fft`` does; else it follows the operand's (c2r's output length,
    ``2 * (m - 1)`` of an input of ``m``, is read per call). ``problem`` is the transform the plan was made from
    (its operand one of many); the route runs it for operands of its dtype and rank whose extent is at least 2."""

    needs_release = False
    __slots__ = ("problem", "strategy", "kwargs", "_how", "_fn", "_compiled", "_args", "_c2r", "_in_length",
                 "_in_dtype", "_result_dtype", "__weakref__")

    def __init__(self, problem: FFTProblem, strategy: str, lengths_given: bool = False):
        self.problem = p = problem
        self.strategy = strategy
        if lengths_given:
            kwargs = {"s": p.lengths, "axes": p.axes} if p.ndim_api else {"n": p.lengths[0], "axis": p.axes[0]}
        else:
            kwargs = {"axes": p.axes} if p.ndim_api else {"axis": p.axes[0]}
        kwargs["norm"] = p.norm
        self.kwargs, self._how, self._fn = _by_function_setup(p, strategy, kwargs)
        # the compiled transform of an operand needing no padding or trimming (of the plan's length, where given)
        unpadded = dataclasses.replace(p, shape=p.in_lengths, strides=None)
        compiled, args = _compiled(unpadded, kwargs.get("workers", 1)) if strategy == "scipy" else (None, ())
        self._in_length = p.in_lengths[0] if lengths_given else None
        self._c2r = compiled is not None and p.kind == "c2r" and not lengths_given
        # c2r following the operand: the arguments without its output length, which is read per call
        self._compiled, self._args = compiled, ((args[0], *args[2:]) if self._c2r else args)
        self._in_dtype = np.dtype(p.dtype)
        self._result_dtype = np.dtype(p.result_dtype)

    @property
    def steps(self) -> tuple[str, ...]:
        return (
            _function_text(self),
            f"one plan for every extent of a 1-D {self.problem.dtype} operand (made from {self.problem.describe()})",
        )

    def execute(self, operands, stream=None):
        return self.direct(operands["x"])

    def direct(self, x):
        """pocketfft's compiled transform of ``x`` where the plan has one and ``x`` needs no padding or trimming,
        as :meth:`NumpyFFTPlan.direct`; else the function."""
        if (
            self._compiled is not None
            and x.__class__ is np.ndarray
            and x.dtype is self._in_dtype
            and x.flags.aligned
            and (self._in_length is None or x.shape[0] == self._in_length)
        ):
            if self._c2r:
                return self._compiled(x, self._args[0], 2 * x.shape[0] - 2, *self._args[1:])
            return self._compiled(x, *self._args)
        return _by_function(self, x)

    def release(self) -> None:
        pass


def _by_function_setup(p: FFTProblem, strategy: str, kwargs: dict) -> tuple[dict, str, Callable]:
    """``(kwargs, how, function)`` of a plan's transform by function: ``kwargs`` with ``scipy.fft``'s workers
    (strategy ``"scipy"``), what runs it, and ``scipy.fft``'s or ``numpy.fft``'s function."""
    if strategy == "scipy":
        kwargs["workers"], how = numpy_fft_workers.workers_for(p)
    else:
        how = f"numpy.fft (pocketfft), result cast to {p.result_dtype}"
    return kwargs, how, getattr(_scipy_fft if strategy == "scipy" else np.fft, p.func)


def _function_text(plan) -> str:
    """The function call a plan's ``steps`` show."""
    args = ", ".join(f"{k}={v!r}" for k, v in plan.kwargs.items())
    module = "scipy.fft" if plan.strategy == "scipy" else "numpy.fft"
    return f"{module}.{plan.problem.func}(x, {args}) via {plan._how}"


def _by_function(plan, x):
    """``plan``'s transform of ``x`` through ``scipy.fft``'s (or ``numpy.fft``'s) function, where its compiled
    transform does not take ``x`` (another dtype or class, unaligned, another length)."""
    if x.dtype.kind not in "fc":  # DLPack views of exotic dtypes never reach here; be safe anyway
        x = x.astype(plan.problem.compute_dtype)
    out = plan._fn(x, **plan.kwargs)
    if out.dtype != plan._result_dtype:
        out = out.astype(plan._result_dtype, copy=False)
    return out


def _compiled(p: FFTProblem, workers: int) -> tuple:
    """``(transform, args)``: pocketfft's compiled c2c/r2c/c2r and the arguments after the input with which
    ``scipy.fft.<func>`` calls it for ``p``, where nothing is left to check per call (no padding or trimming, the
    input and result dtypes scipy.fft would keep); ``(None, ())`` otherwise."""
    if _pocketfft is None or p.needs_resize or p.empty or p.norm not in _NORM_CODES:
        return None, ()
    forward = p.direction == "forward"
    code = _NORM_CODES[p.norm] if forward else 2 - _NORM_CODES[p.norm]
    axes = tuple(a % len(p.shape) for a in p.axes)
    if p.kind == "c2c" and p.dtype in _REAL_OF and p.result_dtype == p.dtype:
        return _pocketfft.c2c, (axes, forward, code, None, workers)
    if p.kind == "r2c" and p.dtype in _COMPLEX_OF and p.result_dtype == _COMPLEX_OF[p.dtype]:
        return _pocketfft.r2c, (axes, forward, code, None, workers)
    if p.kind == "c2r" and p.dtype in _REAL_OF and p.result_dtype == _REAL_OF[p.dtype]:
        return _pocketfft.c2r, (axes, p.lengths[-1], forward, code, None, workers)
    return None, ()
