"""``nvdispatch.fft``: the array-API fft extension (2024.12) on every executor, a stateful :class:`FFT`,
and the ``scipy.fft`` backend protocol.

Functions (signatures as the standard writes them; ``stream=`` is an nvdispatch extra for GPU arrays):
``fft, ifft, fftn, ifftn, rfft, irfft, rfftn, irfftn, hfft, ihfft, fftfreq, rfftfreq, fftshift, ifftshift``.

Executors: NumPy arrays go to ``scipy.fft`` on all cores (``numpy.fft`` without SciPy); Torch tensors to
``torch.fft``; CuPy arrays to cuFFT (raw ``"cuda"`` executor, else ``cupy.fft`` with plans kept in the
shared plan cache); ``__cuda_array_interface__``/DLPack device arrays to the raw ``"cuda"`` executor.
``nvdispatch.set_backend`` and friends choose among them; ``nvdispatch.explain(nvdispatch.fft.rfft, x, n=64)``
says what a call would do.

Signatures are the array API's, widened to NumPy's: ``n``/``s``, ``axis``/``axes``, ``norm`` may be given
positionally, ``out=`` receives the result, ``fft2``/``ifft2``/``rfft2``/``irfft2`` exist. On NumPy input
every call ``numpy.fft`` accepts gives its result, dtype included (array-likes, integer/boolean/float16
input, long double, repeated axes, ``s`` without ``axes``; see ``nvdispatch._fft_conventions``). On other
frameworks the same arguments behave that framework's way (Torch: integers → its default float dtype).

Dtype rules (see ``nvdispatch._fft_problem``): precision is kept; real floating input to the complex
transforms (``fft``, ``ifft``, ``fftn``, ``ifftn``, ``irfft``, ``irfftn``, ``hfft``) is promoted to the
complex dtype of the same precision; complex input to ``rfft``/``rfftn``/``ihfft`` raises
``UnsupportedDtypeError``.

As a SciPy backend::

    import scipy.fft, nvdispatch.fft
    with scipy.fft.set_backend(nvdispatch.fft):
        y = scipy.fft.fft(x)          # NumPy, Torch or CuPy x

SciPy's ``overwrite_x`` and ``workers`` keywords are accepted (nvdispatch never overwrites its input, and on
the CPU runs each transform shape on one thread or on all cores, whichever it measured faster); integer input
is promoted as SciPy does. Whatever nvdispatch cannot serve returns ``NotImplemented`` so SciPy falls through
to its next backend: transforms it does not implement (``dct``, ``dst``, ``fht``, ...), a precomputed ``plan=``,
and any call an executor refuses (dtype, argument, layout).
SciPy's own ``scipy/fft/tests/test_basic.py`` passes whole under this backend (``conformance/``). As the
global backend (``scipy.fft.set_global_backend(nvdispatch.fft)``), which replaces SciPy's own, register SciPy's
again (``scipy.fft.register_backend("scipy")``) so that it serves what nvdispatch declines.

Examples
--------
>>> import numpy as np, nvdispatch
>>> x = np.arange(8, dtype=np.float32)
>>> nvdispatch.fft.rfft(x).dtype
dtype('complex64')
>>> bool(np.allclose(nvdispatch.fft.irfft(nvdispatch.fft.rfft(x), n=8), x, atol=1e-5))
True
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import array_api_compat
import numpy as np

from . import _backends, _fft_callbacks, _fft_convolve
from ._adapters import adapter_for, adapter_named
from ._backends import _state
from ._dispatch import (
    Explanation,
    _log_levels,
    acquire_plan,
    choose_strategy,
    coerce_operands,
    debug_enabled,
    detect_all,
    explain_selected,
    keep_or_select,
    log_hit,
    placement,
    refuse_recorded_call,
    select,
    signature_of,
    store,
    wrap_result,
)
from ._dispatch import call_key_memo_by_class as _memos
from ._dispatch import signature_by_class as _signatures
from ._execute import run
from ._fft_conventions import as_operand, numpy_nd_args, promote, run_nd_numpy_way, write_out
from ._fft_problem import FUNCS, FFTProblem, build_fft_problem, check_norm
from ._integration_hooks import announce, taker_for
from ._plan_cache import plan_cache
from ._typing import Array, ArrayLike, Axes, CallbackData, ElementCallback, Norm, Shape, Stream
from .errors import (
    InvalidArgumentError,
    NvdispatchError,
    PlanStateError,
    ShapeMismatchError,
    UnsupportedDtypeError,
    UnsupportedOperandError,
    describe,
)

__all__ = [
    "fft",
    "ifft",
    "fftn",
    "ifftn",
    "rfft",
    "irfft",
    "rfftn",
    "irfftn",
    "hfft",
    "ihfft",
    "fft2",
    "ifft2",
    "rfft2",
    "irfft2",
    "fftfreq",
    "rfftfreq",
    "fftshift",
    "ifftshift",
    "convolve",
    "FFT",
    "FFTOptions",
    "explain_fft",
]

__ua_domain__ = "numpy.scipy.fft"
_acquire = plan_cache.acquire  # the call route's first step (pins the plan), bound once
_acquire_handle = plan_cache.acquire_handle  # the same, by a handle the call-key memo kept
_handle = plan_cache.handle
_log = logging.getLogger("nvdispatch")


# -- dispatch ------------------------------------------------------------------------------------------------
def _prepare(func: str, x, n=None, axis=-1, s=None, axes=None, norm="backward"):
    infos = detect_all({"x": x})
    framework, device = placement(infos)
    info = infos["x"]
    problem = build_fft_problem(func, info, framework, device, n, axis, s, axes, norm)
    # the operand as executors take it (e.g. a CPU DLPack object's zero-copy NumPy view)
    return problem, select("fft", problem), info.array


def _call_form(func: str, x, n, axis, s, axes, norm):
    """``(form, sig, memo)``: the form of a transform's call key (see ``_dispatch``; the key is
    ``(form, sig(x))``), None when the call does not qualify; and the call-key memo of the array's class (see
    ``_call_key_memo``), None when it has none."""
    cls = x.__class__
    sig = _signatures.get(cls, signature_of)
    if sig is signature_of:
        sig = signature_of(cls)
    if sig is None:
        return None, None, None
    if s is not None:
        s = _int_seq(s)
    if axes is not None:
        axes = _int_seq(axes)
    if s is False or axes is False:
        return None, None, None
    form = ("fft", func, cls, n, axis, s, axes, norm, _state.get().key, _backends._global.key)
    return form, sig, _memos.get(cls)


_NO_CALLBACKS = (None, None, None, None)  # (prolog, epilog, prolog_data, epilog_data) of a plain transform
_distinct: dict[tuple, bool] = {}  # (axes, ndim) -> _distinct_axes' answer, for axes given as tuples


def _distinct_axes(axes, ndim: int) -> bool:
    """Whether ``axes`` are ints naming distinct dimensions of an ``ndim``-D array, where NumPy's and the array
    API's conventions agree (NumPy transforms a repeated axis again, and ``axes=()`` copies the input)."""
    known = None
    if axes.__class__ is tuple:
        try:
            known = _distinct.get((axes, ndim))
        except TypeError:  # unhashable items: the conventions path reports them
            return False
    if known is not None:
        return known
    seq = _int_seq(axes)
    if not seq or seq.__class__ is int:
        return False
    answer = all(-ndim <= ax < ndim for ax in seq) and len({ax % ndim for ax in seq}) == len(seq)
    if axes.__class__ is tuple and len(_distinct) < 256:
        _distinct[(axes, ndim)] = answer
    return answer


def _int_seq(v):
    """``v`` as a key part: None, an int, or a tuple of ints; False when it is anything else (arrays of
    axes, ...): such calls are validated in full every time instead of growing the cache."""
    if v is None or v.__class__ is int:
        return v
    if v.__class__ in (tuple, list) and all(e.__class__ is int for e in v):
        return tuple(v)
    return False


def _run(func: str, x, n=None, axis=-1, s=None, axes=None, norm="backward", stream=None):
    key = plan = learn = None
    try:
        form, sig, memo = _call_form(func, x, n, axis, s, axes, norm)
        if memo is not None:  # a repeated call's plan handle, remembered behind the class's guard
            for check, entry, epoch in memo.handles.get(form, ()):
                if check(x):
                    plan = _acquire_handle(entry, epoch)
                    break
        if plan is None and form is not None:
            key = (form, sig(x))
            plan = _acquire(key)  # pinned until run() returns
            learn = memo
    except TypeError:  # an unhashable argument: the full path validates (and reports) it
        key = plan = learn = None
    if plan is None:
        take = taker_for(x)  # a framework integration takes the call where it must (see _integration_hooks)
        if take is not None:
            taken = take("fft", func, x, n, axis, s, axes, norm, stream)
            if taken is not NotImplemented:
                return taken
        problem, sel, operand = _prepare(func, x, n, axis, s, axes, norm)
        plan = acquire_plan(sel.executor, "fft", problem, choose_strategy(sel.executor, "fft", problem))
        try:
            if not sel.coerce:
                store(key, plan)
            operands = coerce_operands(sel, {"x": operand}, ("x",))
        except BaseException:
            plan_cache.let_go(plan)
            raise
        return wrap_result(run(plan, operands, stream), x)
    if learn is not None:  # a repeated call, found by its signature
        learn.remember(form, (x,), _handle(key))
    if _log_levels.get(10) is not False and debug_enabled():
        log_hit("fft", plan)
    return run(plan, {"x": x}, stream)


def explain_fft(
    func: str,
    x: Array,
    n: int | None = None,
    axis: int = -1,
    s: Shape = None,
    axes: Axes = None,
    norm: Norm = "backward",
    stream: Stream = None,
) -> Explanation:
    """What ``nvdispatch.fft.<func>`` would do with these arguments, without running it."""
    problem, sel, _ = _prepare(func, x, n, axis, s, axes, norm)
    return explain_selected(func, "fft", problem, sel)


def _call(
    func,
    a,
    n=None,
    axis=-1,
    s=None,
    axes=None,
    norm="backward",
    out=None,
    stream=None,
    convention="numpy",
    callbacks=None,
):
    """Every public transform: the array-API route as it is, NumPy's/SciPy's conventions where they differ."""
    if callbacks is not None and callbacks != _NO_CALLBACKS:  # prolog/epilog: their own route
        result = _fft_callbacks.run(func, as_operand(a), n, axis, s, axes, norm, stream, callbacks=callbacks)
        return result if out is None else write_out(result, out)
    if out is None and s is None and (axes is None or a.__class__ is not np.ndarray or _distinct_axes(axes, a.ndim)):
        try:
            return _run(func, a, n=n, axis=axis, s=s, axes=axes, norm=norm, stream=stream)
        except (UnsupportedDtypeError, UnsupportedOperandError):
            pass  # an array-like, or a dtype NumPy/SciPy/the framework promote: the conventions below
    x = as_operand(a)
    nd = FUNCS[func][2]
    naxes = 1 if not nd else len(axes if axes is not None else (s if s is not None else getattr(x, "shape", ())))
    x, final = promote(x, func, convention, naxes)
    if nd and convention == "numpy" and isinstance(x, np.ndarray):
        sizes, axes_t = numpy_nd_args(func, x.shape, s, axes)
        if not axes_t and func in ("fftn", "ifftn"):
            result = x.copy()  # numpy.fft: nothing to transform, the input comes back
        elif len(set(axes_t)) != len(axes_t):
            one = lambda f, y, n_, ax, nm: _run(f, y, n=n_, axis=ax, norm=nm, stream=stream)  # noqa: E731
            result = run_nd_numpy_way(func, x, sizes, axes_t, norm, one)
        else:
            result = _run(func, x, s=sizes, axes=axes_t, norm=norm, stream=stream)
    else:
        result = _run(func, x, n=n, axis=axis, s=s, axes=axes, norm=norm, stream=stream)
    if final is not None:
        result = result.astype(final)
    return result if out is None else write_out(result, out)


_Func = TypeVar("_Func", bound=Callable[..., Any])


def _with_explain(func_name: str, nd: bool) -> Callable[[_Func], _Func]:
    def deco(f: _Func) -> _Func:
        if nd:

            def _explain(
                a,
                s=None,
                axes=None,
                norm="backward",
                out=None,
                *,
                stream=None,
                prolog=None,
                epilog=None,
                prolog_data=None,
                epilog_data=None,
            ):
                cbs = (prolog, epilog, prolog_data, epilog_data)
                if any(c is not None for c in cbs):
                    return _fft_callbacks.explain(func_name, a, None, -1, s, axes, norm, stream, callbacks=cbs)
                return explain_fft(func_name, a, s=s, axes=axes, norm=norm, stream=stream)
        else:

            def _explain(
                a,
                n=None,
                axis=-1,
                norm="backward",
                out=None,
                *,
                stream=None,
                prolog=None,
                epilog=None,
                prolog_data=None,
                epilog_data=None,
            ):
                cbs = (prolog, epilog, prolog_data, epilog_data)
                if any(c is not None for c in cbs):
                    return _fft_callbacks.explain(func_name, a, n, axis, None, None, norm, stream, callbacks=cbs)
                return explain_fft(func_name, a, n=n, axis=axis, norm=norm, stream=stream)

        f.__nvdispatch_explain__ = _explain
        return f

    return deco


# -- the array-API functions (NumPy's positional n/axis, s/axes and out= accepted too) ----------------------
_ONE_D_DOC = """

    Parameters
    ----------
    a : array or array_like
        NumPy, Torch, CuPy, JAX, ``__cuda_array_interface__`` or DLPack array; lists and scalars become NumPy
        arrays. Integer and boolean input is promoted as the caller's library does (NumPy: float64).
    n : int, optional
        Transform length along ``axis`` (the input is zero-padded or trimmed); positional as in NumPy.
    axis : int, optional
        The axis to transform (default: the last).
    norm : {"backward", "ortho", "forward"} or None, optional
        Scaling (None: "backward").
    out : array, optional
        Where to write the result (NumPy: ``same_kind`` casting; may be the input itself); returned.
    stream : optional
        GPU stream (ignored on the CPU).
    prolog, epilog : callable, optional
        ``f(value, index, *data)`` applied to every input element as the transform loads it (prolog) and to
        every normalised output element before it is stored (epilog); ``index`` is the element's flat
        C-order position in the logical input (after padding/trimming) or output. Fused on the GPU (a
        generated kernel, or cuFFT LTO callbacks), called on whole arrays elsewhere; see
        :mod:`nvdispatch._fft_callbacks`.
    prolog_data, epilog_data : array or tuple of arrays, optional
        Extra arguments of the prolog/epilog (same framework and device as ``a``).
    """

_N_D_DOC = """

    Parameters
    ----------
    a : array or array_like
        As for :func:`fft`.
    s : sequence of int, optional
        Transform length per axis in ``axes`` (-1: the input's); without ``axes`` the last ``len(s)`` axes
        (NumPy input: with NumPy 2's DeprecationWarning).
    axes : sequence of int, optional
        Axes to transform (default: all). On NumPy input an axis may repeat (transformed once per entry, as
        ``numpy.fft`` does).
    norm : {"backward", "ortho", "forward"} or None, optional
        Scaling (None: "backward").
    out : array, optional
        Where to write the result; returned.
    stream : optional
        GPU stream (ignored on the CPU).
    prolog, epilog : callable, optional
        ``f(value, index, *data)`` applied to every input element as the transform loads it (prolog) and to
        every normalised output element before it is stored (epilog); ``index`` is the element's flat
        C-order position in the logical input (after padding/trimming) or output. Fused on the GPU (a
        generated kernel, or cuFFT LTO callbacks), called on whole arrays elsewhere; see
        :mod:`nvdispatch._fft_callbacks`.
    prolog_data, epilog_data : array or tuple of arrays, optional
        Extra arguments of the prolog/epilog (same framework and device as ``a``).
    """


def _doc(summary: str, nd: bool, example: str) -> str:
    return summary + (_N_D_DOC if nd else _ONE_D_DOC) + "\n    Examples\n    --------\n" + example


@_with_explain("fft", False)
def fft(
    a: ArrayLike,
    n: int | None = None,
    axis: int = -1,
    norm: Norm = "backward",
    out: Array | None = None,
    *,
    stream: Stream = None,
    prolog: ElementCallback | None = None,
    epilog: ElementCallback | None = None,
    prolog_data: CallbackData = None,
    epilog_data: CallbackData = None,
) -> Array:
    return _call("fft", a, n, axis, None, None, norm, out, stream, callbacks=(prolog, epilog, prolog_data, epilog_data))


@_with_explain("ifft", False)
def ifft(
    a: ArrayLike,
    n: int | None = None,
    axis: int = -1,
    norm: Norm = "backward",
    out: Array | None = None,
    *,
    stream: Stream = None,
    prolog: ElementCallback | None = None,
    epilog: ElementCallback | None = None,
    prolog_data: CallbackData = None,
    epilog_data: CallbackData = None,
) -> Array:
    return _call(
        "ifft", a, n, axis, None, None, norm, out, stream, callbacks=(prolog, epilog, prolog_data, epilog_data)
    )


@_with_explain("fftn", True)
def fftn(
    a: ArrayLike,
    s: Shape = None,
    axes: Axes = None,
    norm: Norm = "backward",
    out: Array | None = None,
    *,
    stream: Stream = None,
    prolog: ElementCallback | None = None,
    epilog: ElementCallback | None = None,
    prolog_data: CallbackData = None,
    epilog_data: CallbackData = None,
) -> Array:
    return _call("fftn", a, None, -1, s, axes, norm, out, stream, callbacks=(prolog, epilog, prolog_data, epilog_data))


@_with_explain("ifftn", True)
def ifftn(
    a: ArrayLike,
    s: Shape = None,
    axes: Axes = None,
    norm: Norm = "backward",
    out: Array | None = None,
    *,
    stream: Stream = None,
    prolog: ElementCallback | None = None,
    epilog: ElementCallback | None = None,
    prolog_data: CallbackData = None,
    epilog_data: CallbackData = None,
) -> Array:
    return _call("ifftn", a, None, -1, s, axes, norm, out, stream, callbacks=(prolog, epilog, prolog_data, epilog_data))


@_with_explain("rfft", False)
def rfft(
    a: ArrayLike,
    n: int | None = None,
    axis: int = -1,
    norm: Norm = "backward",
    out: Array | None = None,
    *,
    stream: Stream = None,
    prolog: ElementCallback | None = None,
    epilog: ElementCallback | None = None,
    prolog_data: CallbackData = None,
    epilog_data: CallbackData = None,
) -> Array:
    return _call(
        "rfft", a, n, axis, None, None, norm, out, stream, callbacks=(prolog, epilog, prolog_data, epilog_data)
    )


@_with_explain("irfft", False)
def irfft(
    a: ArrayLike,
    n: int | None = None,
    axis: int = -1,
    norm: Norm = "backward",
    out: Array | None = None,
    *,
    stream: Stream = None,
    prolog: ElementCallback | None = None,
    epilog: ElementCallback | None = None,
    prolog_data: CallbackData = None,
    epilog_data: CallbackData = None,
) -> Array:
    return _call(
        "irfft", a, n, axis, None, None, norm, out, stream, callbacks=(prolog, epilog, prolog_data, epilog_data)
    )


@_with_explain("rfftn", True)
def rfftn(
    a: ArrayLike,
    s: Shape = None,
    axes: Axes = None,
    norm: Norm = "backward",
    out: Array | None = None,
    *,
    stream: Stream = None,
    prolog: ElementCallback | None = None,
    epilog: ElementCallback | None = None,
    prolog_data: CallbackData = None,
    epilog_data: CallbackData = None,
) -> Array:
    return _call("rfftn", a, None, -1, s, axes, norm, out, stream, callbacks=(prolog, epilog, prolog_data, epilog_data))


@_with_explain("irfftn", True)
def irfftn(
    a: ArrayLike,
    s: Shape = None,
    axes: Axes = None,
    norm: Norm = "backward",
    out: Array | None = None,
    *,
    stream: Stream = None,
    prolog: ElementCallback | None = None,
    epilog: ElementCallback | None = None,
    prolog_data: CallbackData = None,
    epilog_data: CallbackData = None,
) -> Array:
    return _call(
        "irfftn", a, None, -1, s, axes, norm, out, stream, callbacks=(prolog, epilog, prolog_data, epilog_data)
    )


@_with_explain("hfft", False)
def hfft(
    a: ArrayLike,
    n: int | None = None,
    axis: int = -1,
    norm: Norm = "backward",
    out: Array | None = None,
    *,
    stream: Stream = None,
    prolog: ElementCallback | None = None,
    epilog: ElementCallback | None = None,
    prolog_data: CallbackData = None,
    epilog_data: CallbackData = None,
) -> Array:
    return _call(
        "hfft", a, n, axis, None, None, norm, out, stream, callbacks=(prolog, epilog, prolog_data, epilog_data)
    )


@_with_explain("ihfft", False)
def ihfft(
    a: ArrayLike,
    n: int | None = None,
    axis: int = -1,
    norm: Norm = "backward",
    out: Array | None = None,
    *,
    stream: Stream = None,
    prolog: ElementCallback | None = None,
    epilog: ElementCallback | None = None,
    prolog_data: CallbackData = None,
    epilog_data: CallbackData = None,
) -> Array:
    return _call(
        "ihfft", a, n, axis, None, None, norm, out, stream, callbacks=(prolog, epilog, prolog_data, epilog_data)
    )


@_with_explain("fftn", True)
def fft2(
    a: ArrayLike,
    s: Shape = None,
    axes: Axes = (-2, -1),
    norm: Norm = "backward",
    out: Array | None = None,
    *,
    stream: Stream = None,
    prolog: ElementCallback | None = None,
    epilog: ElementCallback | None = None,
    prolog_data: CallbackData = None,
    epilog_data: CallbackData = None,
) -> Array:
    return _call("fftn", a, None, -1, s, axes, norm, out, stream, callbacks=(prolog, epilog, prolog_data, epilog_data))


@_with_explain("ifftn", True)
def ifft2(
    a: ArrayLike,
    s: Shape = None,
    axes: Axes = (-2, -1),
    norm: Norm = "backward",
    out: Array | None = None,
    *,
    stream: Stream = None,
    prolog: ElementCallback | None = None,
    epilog: ElementCallback | None = None,
    prolog_data: CallbackData = None,
    epilog_data: CallbackData = None,
) -> Array:
    return _call("ifftn", a, None, -1, s, axes, norm, out, stream, callbacks=(prolog, epilog, prolog_data, epilog_data))


@_with_explain("rfftn", True)
def rfft2(
    a: ArrayLike,
    s: Shape = None,
    axes: Axes = (-2, -1),
    norm: Norm = "backward",
    out: Array | None = None,
    *,
    stream: Stream = None,
    prolog: ElementCallback | None = None,
    epilog: ElementCallback | None = None,
    prolog_data: CallbackData = None,
    epilog_data: CallbackData = None,
) -> Array:
    return _call("rfftn", a, None, -1, s, axes, norm, out, stream, callbacks=(prolog, epilog, prolog_data, epilog_data))


@_with_explain("irfftn", True)
def irfft2(
    a: ArrayLike,
    s: Shape = None,
    axes: Axes = (-2, -1),
    norm: Norm = "backward",
    out: Array | None = None,
    *,
    stream: Stream = None,
    prolog: ElementCallback | None = None,
    epilog: ElementCallback | None = None,
    prolog_data: CallbackData = None,
    epilog_data: CallbackData = None,
) -> Array:
    return _call(
        "irfftn", a, None, -1, s, axes, norm, out, stream, callbacks=(prolog, epilog, prolog_data, epilog_data)
    )


fft.__doc__ = _doc(
    "One-dimensional discrete Fourier transform of ``a`` along ``axis``; complex, of the input's precision.",
    False,
    "    >>> import nvdispatch\n    >>> nvdispatch.fft.fft([1.0, 0.0, 0.0, 0.0], 2).real  # n positional\n"
    "    array([1., 1.])\n",
)
ifft.__doc__ = _doc(
    "One-dimensional inverse DFT (``norm='backward'`` scales by ``1/n``).",
    False,
    "    >>> import nvdispatch\n    >>> nvdispatch.fft.ifft([4, 0, 0, 0]).real\n    array([1., 1., 1., 1.])\n",
)
fftn.__doc__ = _doc(
    "n-dimensional DFT over ``axes``.",
    True,
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.fftn(np.ones((2, 2))).real\n"
    "    array([[4., 0.],\n           [0., 0.]])\n",
)
ifftn.__doc__ = _doc(
    "n-dimensional inverse DFT over ``axes``.",
    True,
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.ifftn(np.full((2, 2), 4.0)).real\n"
    "    array([[4., 0.],\n           [0., 0.]])\n",
)
rfft.__doc__ = _doc(
    "DFT of real input: the ``n//2 + 1`` non-negative frequency terms along ``axis``.",
    False,
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.rfft(np.ones(4, np.float32))\n"
    "    array([4.+0.j, 0.+0.j, 0.+0.j], dtype=complex64)\n",
)
irfft.__doc__ = _doc(
    "Inverse of :func:`rfft`: real output of length ``n`` (default ``2*(m-1)``) along ``axis``.",
    False,
    "    >>> import nvdispatch\n    >>> nvdispatch.fft.irfft([4, 0, 0])\n    array([1., 1., 1., 1.])\n",
)
rfftn.__doc__ = _doc(
    "n-dimensional DFT of real input; the last axis in ``axes`` is halved to ``s[-1]//2 + 1``.",
    True,
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.rfftn(np.ones((2, 4))).shape\n    (2, 3)\n",
)
irfftn.__doc__ = _doc(
    "Inverse of :func:`rfftn`; ``s[-1]`` is the real output length of the last axis (default ``2*(m-1)``).",
    True,
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.irfftn(np.ones((2, 3))).shape\n    (2, 4)\n",
)
hfft.__doc__ = _doc(
    "DFT of a Hermitian-symmetric signal given by its first half: real output of length ``n``.",
    False,
    "    >>> import nvdispatch\n    >>> nvdispatch.fft.hfft([1, 0, 0])\n    array([1., 1., 1., 1.])\n",
)
ihfft.__doc__ = _doc(
    "Inverse of :func:`hfft`: the ``n//2 + 1`` terms of the Hermitian spectrum of real input.",
    False,
    "    >>> import nvdispatch\n    >>> nvdispatch.fft.ihfft([1.0, 1.0, 1.0, 1.0]).real\n"
    "    array([1., 0., 0.])\n",
)
fft2.__doc__ = _doc(
    "Two-dimensional DFT (NumPy's ``fft2``: :func:`fftn` over the last two axes by default).",
    True,
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.fft2(np.ones((2, 2))).real\n"
    "    array([[4., 0.],\n           [0., 0.]])\n",
)
ifft2.__doc__ = _doc(
    "Two-dimensional inverse DFT (NumPy's ``ifft2``).",
    True,
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.ifft2(np.full((2, 2), 4.0)).real\n"
    "    array([[4., 0.],\n           [0., 0.]])\n",
)
rfft2.__doc__ = _doc(
    "Two-dimensional DFT of real input (NumPy's ``rfft2``).",
    True,
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.rfft2(np.ones((2, 4))).shape\n    (2, 3)\n",
)
irfft2.__doc__ = _doc(
    "Inverse of :func:`rfft2` (NumPy's ``irfft2``).",
    True,
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.irfft2(np.ones((2, 3))).shape\n    (2, 4)\n",
)


def convolve(x: Array, h: Array, /, *, n: int | None = None, axis: int = -1, stream: Stream = None) -> Array:
    """Filter signals in the frequency domain: ``ifft(fft(x, n) * h, n)`` along ``axis`` (``irfft(rfft(x, n)
    * h, n)`` for real ``x``), a circular convolution of ``x`` with the filter whose spectrum is ``h``.

    ``h`` broadcasts against the spectrum (``n`` values along ``axis``, ``n//2 + 1`` for real ``x``). On the
    GPU, for lengths up to 4096 along the last axis, the whole convolution is one generated kernel (the
    multiply between the two FFTs happens in registers); larger sizes use cuFFT with the multiply as an LTO
    callback; elsewhere it is the executor's FFT, one multiply and its inverse FFT
    (see :mod:`nvdispatch._fft_convolve`; ``nvdispatch.explain(nvdispatch.fft.convolve, x, h)`` says which).

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    >>> kernel = np.zeros(16, np.float32); kernel[:3] = 1 / 3          # a 3-tap moving average
    >>> y = nvdispatch.fft.convolve(x, np.fft.rfft(kernel))
    >>> bool(np.allclose(y[:, 2], x[:, :3].mean(axis=1), atol=1e-5))
    True
    """
    return _fft_convolve.run(x, h, n=n, axis=axis, stream=stream)


for _name in ("fft", "ifft", "fftn", "ifftn", "rfft", "irfft", "rfftn", "irfftn", "hfft", "ihfft", "fft2", "ifft2"):
    announce(_name, globals()[_name])
for _name in ("rfft2", "irfft2", "convolve"):
    announce(_name, globals()[_name])
del _name

convolve.__nvdispatch_explain__ = lambda x, h, /, *, n=None, axis=-1, stream=None: _fft_convolve.explain(
    x, h, n=n, axis=axis, stream=stream
)


# -- frequencies and shifts ----------------------------------------------------------------------------------
def _framework_of_device(device):
    """(adapter, its device object) that ``fftfreq``'s ``device`` argument asks for: a framework's device
    object is its framework's; a string (``"cpu"``, ``"cuda[:N]"``) goes to the first adapter taking it."""
    from ._adapters import adapters

    if device is None:
        return adapter_named("numpy"), None
    ranked = adapters() if not isinstance(device, str) else sorted(adapters(), key=lambda a: a.device_string_rank)
    for ad in ranked:
        native = ad.native_device(device)
        if native is not None:
            return ad, native
    raise InvalidArgumentError(
        "device", "None, 'cpu', 'cuda[:N]', a torch.device or a cupy.cuda.Device", describe(device)
    )


def _freq(n, d, dtype, device, real: bool, name: str):
    n_ = _as_pos_int(n, "n")
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


def _as_pos_int(n, arg):
    import operator

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
    from .executors.dask_fft import freq

    like = _freq(1, d, dtype, device, real, "fftfreq")  # validates the arguments, fixes dtype and device
    return freq(_as_pos_int(n, "n"), d, real, chunks, like)


def _shift(x, axes, inverse: bool):
    info = detect_all({"x": x})["x"]
    ndim = len(info.shape)
    if axes is None:
        axes_t = tuple(range(ndim))
    else:
        from ._fft_problem import _axis

        seq = (axes,) if isinstance(axes, int) else axes
        if isinstance(seq, (str, bytes)) or not hasattr(seq, "__iter__"):
            raise InvalidArgumentError("axes", "an int, a sequence of ints, or None", repr(axes))
        axes_t = tuple(_axis(a, ndim, "axes") for a in seq)
    shifts = tuple(-(info.shape[a] // 2) if inverse else info.shape[a] // 2 for a in axes_t)
    return _roll(info, shifts, axes_t)


def _roll(info, shifts, axes):
    """``info.array`` rolled by ``shifts`` along ``axes`` (a copy when no axes), through its adapter; device
    arrays known only by a protocol through the helper namespace that can view them (CuPy, else Torch)."""
    arr = info.array  # (a CPU DLPack object's NumPy view)
    ad = adapter_for(arr)
    if not ad.can_roll:
        from ._cuda.xp import namespace_for

        helper = namespace_for(info.framework)
        if helper is None:
            raise UnsupportedOperandError(
                "x", "an array CuPy or Torch can view (to shift it)", f"a {info.framework} array", ""
            )
        ad = adapter_named(helper)
        arr = ad.view_device_array(arr)
    return ad.roll(arr, shifts, axes)


def fftshift(x: Array, /, *, axes: int | Axes = None) -> Array:
    """Move the zero-frequency term to the centre along ``axes`` (all axes when None).

    ``__cuda_array_interface__``/DLPack device arrays come back as CuPy arrays.

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
        if name in ("fftshift", "ifftshift") and first is not None:
            where = detect_all({"x": first})["x"].framework
        elif kwargs.get("device") is not None:
            where = _framework_of_device(kwargs["device"])[0].name
        steps = (f"{name}: computed with {where} array operations (no transform, no plan)",)
        return Explanation(name, where, "direct", steps, (), ("direct",), False, None)

    return _explain


for _f in (fftfreq, rfftfreq, fftshift, ifftshift):
    _f.__nvdispatch_explain__ = _explain_simple(_f.__name__)
del _f


# -- stateful FFT ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FFTOptions:
    """Options of the stateful :class:`FFT` (modelled on ``nvmath.fft.FFTOptions``).

    fft_type : None, "C2C", "R2C" or "C2R"
        None infers it: real input → R2C, complex → C2C. C2R (complex Hermitian half-spectrum in, real out)
        must be asked for.
    inplace : bool
        C2C only: the result overwrites the operand (which ``execute`` then returns).
    last_axis_parity : "even" or "odd"
        C2R only: the real output's last transformed axis has ``2*(m-1)`` (even) or ``2*(m-1)+1`` (odd)
        elements, ``m`` being the input's extent there.
    norm : "backward", "ortho" or "forward"
        Scaling as in the array API (nvmath's FFT leaves both directions unnormalised; nvdispatch follows
        the array API so the stateless and stateful results agree).

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> x = np.ones(8, np.complex64)
    >>> opts = nvdispatch.fft.FFTOptions(inplace=True, norm="ortho")  # or the same as a dict
    >>> with nvdispatch.fft.FFT(x, options=opts) as f:
    ...     y = f.plan().execute()
    >>> y is x, round(float(x[0].real), 4)
    (True, 2.8284)
    """

    fft_type: str | None = None
    inplace: bool = False
    last_axis_parity: str = "even"
    norm: str = "backward"


def _as_fft_options(options) -> FFTOptions:
    if options is None:
        opts = FFTOptions()
    elif isinstance(options, FFTOptions):
        opts = options
    elif isinstance(options, dict):
        unknown = set(options) - {"fft_type", "inplace", "last_axis_parity", "norm"}
        if unknown:
            raise InvalidArgumentError(
                "options", "keys among fft_type, inplace, last_axis_parity, norm", f"{sorted(unknown)}"
            )
        opts = FFTOptions(**options)
    else:
        raise InvalidArgumentError("options", "an FFTOptions, a dict or None", describe(options))
    if opts.fft_type not in (None, "C2C", "R2C", "C2R"):
        raise InvalidArgumentError("options.fft_type", "None, 'C2C', 'R2C' or 'C2R'", repr(opts.fft_type))
    if opts.last_axis_parity not in ("even", "odd"):
        raise InvalidArgumentError("options.last_axis_parity", "'even' or 'odd'", repr(opts.last_axis_parity))
    check_norm(opts.norm)
    return opts


_DIRECTIONS = {"forward": "forward", "inverse": "inverse", -1: "forward", 1: "inverse"}


class FFT:
    """Stateful FFT: plan once, execute many times (either direction for C2C), swap operands in between.

    Parameters
    ----------
    x : array
        The operand (NumPy, Torch, CuPy, ``__cuda_array_interface__`` or DLPack).
    axes : sequence of int, optional
        The axes to transform (all when None); the last one is the halved axis of R2C/C2R.
    options : FFTOptions or dict, optional
        ``fft_type``, ``inplace``, ``last_axis_parity``, ``norm``.
    stream : optional
        Default GPU stream for ``execute``.

    Notes
    -----
    *Executor.* ``plan()`` selects the executor under the backend state active then; re-plans that follow
    (``reset_operand`` with other strides) keep it, whatever backend state is active at that time, unless it
    declines the new operand (then one is selected again and ``executor`` says which).

    *Plan lifetime.* The object holds its plans: the shared plan cache may evict them (or be cleared) while
    the object lives, but releases them only once ``free()`` (or garbage collection) lets go of them.

    *Threads.* One object may be used from several threads: ``execute`` calls may run concurrently (each runs
    the plan and operand current when it starts; with ``inplace`` they write the same operand, so give each
    thread its own object), and ``plan``/``reset_operand``/``free`` are serialised with each other and never
    disturb an ``execute`` already running.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> x = (np.random.rand(8, 16) + 1j * np.random.rand(8, 16)).astype(np.complex64)
    >>> with nvdispatch.fft.FFT(x, axes=(1,)) as f:
    ...     y = f.plan().execute()  # plan() returns f
    ...     z = f.execute(direction="inverse")
    >>> bool(np.allclose(y, np.fft.fft(x, axis=1), atol=1e-4))
    True
    """

    def __init__(
        self, x: Array, *, axes: Axes = None, options: FFTOptions | dict[str, Any] | None = None, stream: Stream = None
    ) -> None:
        self._options = _as_fft_options(options)
        self._stream = stream
        self._freed = False
        self._callbacks: dict[str, Any] = {}  # prolog/epilog/prolog_data/epilog_data given to plan()
        self._cb_data: dict[str, tuple] = {}
        self._lock = threading.RLock()
        self._holds: dict[str, Any] = {}  # direction -> PlanHold
        self._problems: dict[str, FFTProblem] = {}
        self._selections: dict[str, Any] = {}
        self._axes = None if axes is None else tuple(axes)
        self._x = x
        self._info = detect_all({"x": x})["x"]
        self._fft_type = self._infer_type(self._info.dtype)
        # validate now so mistakes surface at construction
        self._build(x)
        self._check_target(self._info)

    # -- helpers --------------------------------------------------------------------------------------------
    def _infer_type(self, dtype: str) -> str:
        t = self._options.fft_type
        real = dtype in ("float32", "float64")
        if t is None:
            t = "R2C" if real else "C2C"
        if t == "R2C" and not real:
            raise UnsupportedDtypeError("x", "a real floating operand for an R2C FFT", dtype)
        if t in ("C2C", "C2R") and dtype not in ("complex64", "complex128", "float32", "float64"):
            raise UnsupportedDtypeError("x", f"a complex floating operand for a {t} FFT", dtype)
        if self._options.inplace and t != "C2C":
            raise InvalidArgumentError("options.inplace", "False for an R2C/C2R FFT (in-place is C2C only)", "True")
        if self._options.inplace and dtype not in ("complex64", "complex128"):
            raise UnsupportedDtypeError("x", "a complex operand for an in-place FFT", dtype)
        return t

    def _funcs(self) -> dict[str, str]:
        return {
            "C2C": {"forward": "fftn", "inverse": "ifftn"},
            "R2C": {"forward": "rfftn"},
            "C2R": {"inverse": "irfftn"},
        }[self._fft_type]

    def _build(self, x) -> dict[str, tuple[FFTProblem, Any, Any]]:
        infos = detect_all({"x": x})
        framework, device = placement(infos)
        info = infos["x"]
        axes = self._axes if self._axes is not None else tuple(range(len(info.shape)))
        s = None
        if self._fft_type == "C2R":
            from ._fft_problem import resolve_axes

            axes_r, _ = resolve_axes("irfftn", tuple(info.shape), axes=axes)
            m = info.shape[axes_r[-1]]
            last = 2 * (m - 1) + (1 if self._options.last_axis_parity == "odd" else 0)
            s = tuple([-1] * (len(axes_r) - 1) + [last])
        out = {}
        for direction, func in self._funcs().items():
            problem = build_fft_problem(func, info, framework, device, s=s, axes=axes, norm=self._options.norm)
            out[direction] = problem
        return out

    def _check_target(self, info) -> None:
        """An in-place transform needs an operand it may write: not read-only, no overlapping elements."""
        if self._options.inplace:
            why = _unwritable(info)
            if why:
                raise InvalidArgumentError(
                    "x", "a writable array whose elements do not overlap (options.inplace=True)", why,
                    "pass a copy (or plan out of place)",
                )

    def _check_alive(self, what: str) -> None:
        if self._freed:
            raise PlanStateError("self", f"a live FFT to {what}", "one that was freed", "create a new FFT")

    # -- public API -----------------------------------------------------------------------------------------
    @property
    def fft_type(self) -> str:
        return self._fft_type

    @property
    def executor(self) -> str | None:
        sel = next(iter(self._selections.values()), None)
        return None if sel is None else sel.executor.name

    def plan(
        self,
        *,
        stream: Stream = None,
        prolog: ElementCallback | None = None,
        epilog: ElementCallback | None = None,
        prolog_data: CallbackData = None,
        epilog_data: CallbackData = None,
    ) -> FFT:
        """Choose the executor and prepare the plan(s) (kept in the shared plan cache).

        ``prolog``/``epilog`` (with their ``prolog_data``/``epilog_data`` arrays) are fused into the
        transform(s) of this object, in every direction it executes; see :mod:`nvdispatch._fft_callbacks`
        for their signature and the layout of ``index``. Planning again with other data arrays of the same
        layout reuses the cached plan.
        """
        callbacks = {"prolog": prolog, "epilog": epilog, "prolog_data": prolog_data, "epilog_data": epilog_data}
        with self._lock:
            return self._plan_with(callbacks, {})

    def _plan_with(self, callbacks: dict[str, Any], selections: dict[str, Any]):
        self._check_alive("plan")
        if self._x is None:
            raise PlanStateError("x", "an operand to plan for", "None", "call reset_operand(x) first")
        self._check_target(self._info)
        with_callbacks = any(v is not None for v in callbacks.values())
        holds, problems, chosen, cb_data = {}, {}, {}, {}
        try:
            for direction, problem in self._build(self._x).items():
                op = "fft"
                if with_callbacks:
                    op = _fft_callbacks.OP
                    problem, cb_data = _fft_callbacks.attach(problem, **callbacks)
                sel = keep_or_select(selections.get(direction), op, problem)
                strategy = choose_strategy(sel.executor, op, problem)
                plan = acquire_plan(sel.executor, op, problem, strategy)
                try:
                    holds[direction] = plan_cache.hold(plan)
                finally:
                    plan_cache.let_go(plan)
                problems[direction], chosen[direction] = problem, sel
        except BaseException:
            for hold in holds.values():
                hold.close()
            raise
        old, self._holds = self._holds, holds
        self._problems, self._selections = problems, chosen
        self._callbacks, self._cb_data = callbacks, cb_data
        for hold in old.values():
            hold.close()
        return self

    def execute(self, *, direction: Literal["forward", "inverse"] | None = None, stream: Stream = None) -> Array:
        """Run the transform; ``direction`` ``"forward"``/``"inverse"`` (C2C; R2C is forward, C2R inverse).

        Returns the result in the operand's framework (the operand itself when ``inplace``).
        """
        with self._lock:
            self._check_alive("execute")
            if not self._holds:
                raise PlanStateError("self", "a planned FFT to execute", "one not planned yet", "call plan() first")
            if self._x is None:
                raise PlanStateError("x", "an operand to transform", "None", "call reset_operand(x) first")
            if direction is None:
                direction = "inverse" if self._fft_type == "C2R" else "forward"
            d = _DIRECTIONS.get(direction.lower() if isinstance(direction, str) else direction)
            if d is None or d not in self._holds:
                allowed = tuple(self._holds)
                raise InvalidArgumentError(
                    "direction", f"one of {allowed} for a {self._fft_type} FFT", repr(direction)
                )
            if getattr(self._x, "requires_grad", False) is True:
                refuse_recorded_call(self._problems[d])
            stream = stream if stream is not None else self._stream
            sel, x, cb_data = self._selections[d], self._x, self._cb_data
            operand = self._info.array  # as executors take it (a CPU DLPack object's NumPy view)
            plan = self._holds[d].plan
            plan_cache.pin(plan)  # a concurrent free() or re-plan must not release it while it runs
        try:
            operands = coerce_operands(sel, {"x": operand}, ("x",))
            if cb_data:
                operands = _fft_callbacks.coerce_all(sel, {"x": operand, **cb_data})
        except BaseException:
            plan_cache.let_go(plan)
            raise
        if self._options.inplace and getattr(plan, "supports_out", False):
            operands["out"] = operand
            run(plan, operands, stream)
            return x
        result = run(plan, operands, stream)
        if self._options.inplace:
            _copy_into(operand, result)
            return x
        return result

    def reset_operand(self, x: Array | None = None, *, stream: Stream = None) -> None:
        """Swap in a new operand of the same framework, device, dtype and shape (``None`` drops the
        reference). Strides may change: plans are then looked up again in the cache, on the executor the
        object was planned with (see the class notes)."""
        with self._lock:
            self._check_alive("reset operand")
            if x is None:
                self._x = None
                return
            info = detect_all({"x": x})["x"]
            old = self._info
            if (info.framework, info.device.kind) != (old.framework, old.device.kind):
                raise ShapeMismatchError(
                    "x", f"a {old.framework} array on {old.device}", f"{info.framework} on {info.device}"
                )
            if info.dtype != old.dtype:
                raise UnsupportedDtypeError("x", f"dtype {old.dtype} (as planned)", info.dtype)
            if tuple(info.shape) != tuple(old.shape):
                raise ShapeMismatchError("x", f"shape {tuple(old.shape)} (as planned)", str(tuple(info.shape)))
            self._check_target(info)
            saved = (self._x, self._info)
            self._x, self._info = x, info
            if self._holds and info.strides != old.strides:
                try:
                    self._plan_with(self._callbacks, dict(self._selections))
                except BaseException:
                    self._x, self._info = saved
                    raise

    def free(self) -> None:
        """Let go of the plans and drop the operand reference. Using the object afterwards raises
        ``PlanStateError``; an ``execute`` running in another thread finishes normally."""
        with self._lock:
            self._x = None
            holds, self._holds = self._holds, {}
            self._selections = {}
            self._problems = {}
            self._callbacks, self._cb_data = {}, {}
            self._freed = True
        for hold in holds.values():
            hold.close()

    def __enter__(self) -> FFT:
        return self

    def __exit__(self, *exc: object) -> bool:
        self.free()
        return False

    def __repr__(self) -> str:
        state = "freed" if self._freed else ("planned" if self._holds else "not planned")
        return f"<nvdispatch.fft.FFT {self._fft_type} {state} executor={self.executor}>"


def _unwritable(info) -> str:
    """Why an in-place transform may not write into this operand ('' when it may)."""
    x = info.array
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        return "a read-only NumPy array"
    if info.framework == "torch" and x.requires_grad and x.is_leaf:
        return "a leaf Torch tensor that requires grad (autograd forbids writing it in place)"
    cai = getattr(x, "__cuda_array_interface__", None) if info.framework == "cuda_array_interface" else None
    if cai is not None and cai.get("data", (0, False))[1]:
        return "a read-only __cuda_array_interface__ array"
    if info.strides is not None:
        dims = sorted((abs(st), n) for n, st in zip(info.shape, info.strides) if n > 1)
        span = 0  # elements spanned by the faster dimensions
        for stride, n in dims:
            if stride <= span:
                return f"an array whose elements overlap (strides {tuple(info.strides)}, a broadcast view?)"
            span += stride * (n - 1)
    return ""


def _copy_into(dst, src) -> None:
    ad = adapter_for(dst)
    if ad is None or not ad.can_copy_into:
        raise InvalidArgumentError("options.inplace", "an operand the executor can write into", describe(dst))
    ad.copy_into(dst, src)


# -- scipy.fft backend protocol --------------------------------------------------------------------------------
def _check_scipy_extras(workers, plan) -> None:
    """SciPy's extra keywords: ``overwrite_x`` needs nothing (nvdispatch never writes its input), ``workers``
    is taken (nvdispatch's CPU executor already uses every core), a precomputed ``plan`` is SciPy's own."""
    if plan is not None:
        raise InvalidArgumentError("plan", "None (precomputed plans belong to SciPy's own backend)", describe(plan))
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers == 0:
            raise InvalidArgumentError("workers", "a non-zero int or None", repr(workers))


def _sp_1d(func):
    def f(x, n=None, axis=-1, norm=None, overwrite_x=False, workers=None, *, plan=None):
        _check_scipy_extras(workers, plan)
        return _call(func, x, n, axis, None, None, norm, None, None, "scipy")

    return f


def _sp_nd(func, default_axes=None):
    def f(x, s=None, axes=default_axes, norm=None, overwrite_x=False, workers=None, *, plan=None):
        _check_scipy_extras(workers, plan)
        return _call(func, x, None, -1, s, axes, norm, None, None, "scipy")

    return f


_SWAP_NORM = {"backward": "forward", "ortho": "ortho", "forward": "backward"}


def _conj(x):
    return np.conjugate(x) if isinstance(x, np.ndarray) else array_api_compat.array_namespace(x).conj(x)


def _sp_hermitian_nd(inverse: bool, default_axes=None):
    """SciPy's ``hfftn``/``ihfftn`` (and the 2-D forms) from the real transforms, as SciPy defines them:
    ``hfftn(x) = irfftn(conj(x))`` and ``ihfftn(x) = conj(rfftn(x))`` with the norm's direction swapped."""

    def f(x, s=None, axes=default_axes, norm=None, overwrite_x=False, workers=None, *, plan=None):
        _check_scipy_extras(workers, plan)
        swapped = _SWAP_NORM[check_norm(norm)]
        if inverse:
            return _conj(_call("rfftn", x, None, -1, s, axes, swapped, None, None, "scipy"))
        x = as_operand(x)
        if not isinstance(x, np.ndarray) or x.dtype.kind == "c":
            x = _conj(x)
        return _call("irfftn", x, None, -1, s, axes, swapped, None, None, "scipy")

    return f


_SCIPY_IMPL = {
    "hfftn": _sp_hermitian_nd(False),
    "ihfftn": _sp_hermitian_nd(True),
    "hfft2": _sp_hermitian_nd(False, (-2, -1)),
    "ihfft2": _sp_hermitian_nd(True, (-2, -1)),
    "fft": _sp_1d("fft"),
    "ifft": _sp_1d("ifft"),
    "rfft": _sp_1d("rfft"),
    "irfft": _sp_1d("irfft"),
    "hfft": _sp_1d("hfft"),
    "ihfft": _sp_1d("ihfft"),
    "fftn": _sp_nd("fftn"),
    "ifftn": _sp_nd("ifftn"),
    "rfftn": _sp_nd("rfftn"),
    "irfftn": _sp_nd("irfftn"),
    "fft2": _sp_nd("fftn", (-2, -1)),
    "ifft2": _sp_nd("ifftn", (-2, -1)),
    "rfft2": _sp_nd("rfftn", (-2, -1)),
    "irfft2": _sp_nd("irfftn", (-2, -1)),
}


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
    converted = []
    for d in dispatchables:
        v = d.value
        if d.type is np.ndarray:
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
    impl = _SCIPY_IMPL.get(getattr(method, "__name__", ""))
    if impl is None:
        return NotImplemented
    try:
        return impl(*args, **kwargs)
    except NvdispatchError as exc:
        _log.debug("scipy.fft.%s: nvdispatch declines (%s); SciPy's next backend runs it", method.__name__, exc)
        return NotImplemented
    except TypeError as exc:  # arguments SciPy's signature does not have: SciPy reports them
        _log.debug("scipy.fft.%s: %s; SciPy's next backend runs it", method.__name__, exc)
        return NotImplemented
