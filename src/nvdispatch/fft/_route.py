"""The route of one transform call, as it stands: the call key and its memo first (a repeated call runs
its cached plan), else detect → problem → select → plan → run → wrap; NumPy's/SciPy's conventions
(array-likes, promotions, repeated axes, ``out=``) around it where they differ from the array API's.

The public transforms and the ``scipy.fft`` backend enter through :data:`transform_front`: :func:`call_transform`
itself, or where the compiled extension is built, its hit compiled (``_hotpath_fft.c``: the memo, the any-length
key and the call key, in :func:`_run`'s order), which reads one object, :data:`FRONT_PARTS`, and hands every call
it does not serve to :func:`call_transform`."""

from __future__ import annotations

import dataclasses

import numpy as np

from .._adapters import call_key_classes as _classes
from .._call_key import any_length_key, class_keys, fft_form, int_seq
from .._compiled import hotpath
from .._detect import detect
from .._execute import run, run_direct
from .._fft_conventions import (
    as_operand,
    autocast_promotion,
    cast_result,
    check_out,
    framework_promotion,
    names_one_axis,
    numpy_nd_args,
    outside_autocast,
    promote,
    run_nd_numpy_way,
    write_out,
)
from .._fft_problem import FUNCS, build_fft_problem
from .._plan_cache import plan_cache
from .._route import (
    Explanation,
    FrontParts,
    check_stream,
    debug_enabled,
    explain_selected,
    log_hit,
    log_levels,
    placement,
    select,
)
from .._traced import traced_framework, traced_handler
from .._typing import Array, Axes, Norm, Shape, Stream
from ..errors import InvalidArgumentError, NoExecutorError, UnsupportedDtypeError, UnsupportedOperandError, describe
from ._stateful import run_stateless

__all__ = ["call_transform", "explain_fft", "transform_front", "FRONT_PARTS", "TransformFrontParts"]

_acquire = plan_cache.acquire  # the call route's first step (pins the plan), bound once
_acquire_handle = plan_cache.acquire_handle  # the same, by a handle the call-key memo kept
_handle = plan_cache.handle
_ANY_LENGTH = any_length_key((), None)[1]


def _problem(func: str, x, n=None, axis=-1, s=None, axes=None, norm="backward", compute_dtype=None):
    """The problem of a call; ``compute_dtype``: the dtype ``x`` is cast to first, where its framework's rule
    widens it (:func:`~nvdispatch._fft_conventions.framework_promotion`)."""
    infos = {"x": detect("x", x)}  # x is required: None is an error, not an absent operand
    if compute_dtype is not None:
        infos["x"] = dataclasses.replace(infos["x"], dtype=compute_dtype)
    framework, device = placement(infos)
    return build_fft_problem(func, infos["x"], framework, device, n, axis, s, axes, norm)


def _explained_elsewhere(func: str, x, problem, stream, declined: NoExecutorError) -> Explanation:
    """How a call no executor takes runs all the same, where its framework's integration runs such calls (JAX
    GPU arrays: as JAX's operations around the kernel), asked of the handler offered ``"fft_explain"``; else the
    selection's error, ``declined``, is raised."""
    handler = traced_handler("fft_explain", (x,))
    explanation = NotImplemented if handler is None else handler(func, x, problem, declined.declined, stream=stream)
    if explanation is NotImplemented:
        raise declined
    return explanation


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
    seq = int_seq(axes)
    if not seq or seq.__class__ is int:
        return False
    answer = all(-ndim <= ax < ndim for ax in seq) and len({ax % ndim for ax in seq}) == len(seq)
    if axes.__class__ is tuple and len(_distinct) < 256:
        _distinct[(axes, ndim)] = answer
    return answer


def _all_extents_above_one(shape: tuple) -> bool:
    """Whether an operand of ``shape`` (at least 1-D) has every extent >= 2: where the plan of every length may
    run it (a transform without ``n``/``s`` of each such extent is valid, and not empty)."""
    return bool(shape) and min(shape) > 1


def _run(func: str, x, n=None, axis=-1, s=None, axes=None, norm="backward", stream=None, callbacks=None):
    """One transform: its call key (:mod:`nvdispatch._call_key`) and the plan cache (the call-key memo first, then
    the any-length key, :func:`nvdispatch._call_key.any_length_key`), then the run step on the cached plan; else the
    stateful object's path (``FFT``), whose plan is kept under the key. ``callbacks``: a prolog/epilog call,
    which has no key (its plans are cached by problem)."""
    entry = _classes.get(x.__class__)
    if entry is None:
        entry = class_keys(x.__class__)
    _, sig, memo, view, wraps, adapter, _, ranked, _ = entry
    plan = key = learn = form = general = None
    hit = "call key"
    try:
        if sig is not None and callbacks is None:
            form = fft_form(func, x, n, axis, s, axes, norm)
            if form is not None:
                if memo is not None:  # a repeated call's handle, behind the class's guard
                    for check, handle, epoch in memo.handles.get(form, ()):
                        if check(x):
                            plan = _acquire_handle(handle, epoch)
                            break
                if plan is None and ranked is not None and (s is None or -1 not in s):
                    # the plan of every operand extent, where one is kept, runs it (where its extents are all
                    # >= 2: each a valid transform length, none empty; s's -1, an extent of its own, excepted)
                    general = (form, _ANY_LENGTH, ranked(x))  # any_length_key's, built here (the per-call path)
                    shape = x.shape
                    if shape and min(shape) > 1:
                        plan = _acquire(general)
                        if plan is not None:
                            hit = "any-length key"
                if plan is None:
                    key, learn = (form, sig(x)), memo
                    plan = _acquire(key)  # pinned until run() returns
    except TypeError:  # an unhashable argument: the full path validates (and reports) it
        key = plan = learn = general = None
    if plan is None:
        # a traced array (inside jax.jit...) is staged, not run; a Torch call autograd records goes through the
        # Torch operators (nvdispatch._traced)
        handler = traced_handler("fft", (x,)) if callbacks is None else None
        if handler is not None:
            result = handler(func, x, n=n, axis=axis, s=s, axes=axes, norm=norm, stream=stream)
            if result is not NotImplemented:
                return result
        return run_stateless(func, x, n, axis, s, axes, norm, callbacks, key, stream, general)
    if learn is not None:  # a repeated call, found by its signature
        learn.remember(form, (x,), _handle(key))
    try:
        if stream is not None:
            check_stream(stream, x)
        if log_levels.get(10) is not False and debug_enabled():
            log_hit("fft", plan, hit)
        direct = getattr(plan, "direct", None) if stream is None and view is None and not wraps else None
        operand = x if view is None else view(x)
    except BaseException:
        plan_cache.let_go(plan)
        raise
    if direct is not None:  # the plan's launch as the compiled front makes it
        return run_direct(plan, (operand,))
    return run(plan, {"x": operand}, stream, None, (adapter, x) if wraps else None)


def explain_fft(
    func: str,
    x: Array,
    n: int | None = None,
    axis: int = -1,
    s: Shape = None,
    axes: Axes = None,
    norm: Norm = "backward",
    stream: Stream = None,
    out: Array | None = None,
) -> Explanation:
    """What ``nvdispatch.fft.<func>`` would do with these arguments, without running it (as
    ``nvdispatch.explain(nvdispatch.fft.<func>, x, ...)`` says). ``out``: the call's ``out=``, which keeps an
    autocast region from applying (as Torch's own ``out=`` calls; the explanation's ``precision`` says so where the
    region would have cast ``x``); it is not checked here.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> nvdispatch.fft.explain_fft("rfft", np.ones(64)).problem.out_shape
    (33,)
    """
    if out is not None:
        outside = outside_autocast(x)
        if outside is not None:
            return _explain_outside(outside, func, x, n, axis, s, axes, norm, stream)
    promotion = framework_promotion(func, x, one_axis=names_one_axis(func, axes))
    problem = _problem(func, x, n, axis, s, axes, norm, None if promotion is None else promotion[0])
    try:
        sel = select("fft", problem)
    except NoExecutorError as exc:
        sel, explanation = None, _explained_elsewhere(func, x, problem, stream, exc)
    check_stream(stream, x)
    if sel is not None:
        explanation = explain_selected(func, "fft", problem, sel)
    if promotion is not None:
        dtype = _dtype_of(x)
        region = autocast_promotion(x, dtype)
        if region is not None:  # the region's convention, named as matmul's explain() names it
            note = (
                f"{region[1]}: {dtype} input cast to {region[0]} first, as {problem.framework}'s own FFTs in the "
                f"region ({problem.compute_dtype} transform, {problem.result_dtype} result)"
            )
        else:
            note = (
                f"{problem.framework}'s rule for {dtype} input: computed in {problem.real_dtype} "
                f"({problem.compute_dtype} transform), the result cast to {promotion[1]}"
            )
        explanation = dataclasses.replace(explanation, precision=note)
    general = None if sel is None else _any_length_plan(func, x, n, axis, s, axes, norm)
    if general is not None:  # what the call would run: the plan kept for every length
        explanation = dataclasses.replace(explanation, steps=tuple(general.steps), cached=True)
    return explanation


def _explain_outside(outside, func: str, x, n, axis, s, axes, norm, stream) -> Explanation:
    """:func:`explain_fft` of a call given ``out=`` inside an autocast region: the call as it runs, outside the
    region (``outside``: :func:`~nvdispatch._fft_conventions.outside_autocast`'s runner), its ``precision`` naming
    the region it does not follow where that region would have cast ``x``."""
    explanation = outside(explain_fft, func, x, n, axis, s, axes, norm, stream)
    dtype = _dtype_of(x)
    region = autocast_promotion(x, dtype)  # read inside the region
    if region is None:
        return explanation
    framework = getattr(explanation.problem, "framework", "the framework")
    note = (
        f"{region[1]} not applied: out= is given, and {framework} autocasts no call given an explicit out= (its "
        f"{dtype} input would have been cast to {region[0]} first)"
    )
    precision = note if not explanation.precision else f"{note}; {explanation.precision}"
    return dataclasses.replace(explanation, precision=precision)


def _any_length_plan(func: str, x, n, axis, s, axes, norm):
    """The plan a call would run by its any-length key (as :func:`_run` looks it up), or None."""
    entry = class_keys(x.__class__)
    if entry.signature is None or entry.rank_signature is None:
        return None
    try:
        form = fft_form(func, x, n, axis, s, axes, norm)
        if form is None or entry.memo is not None or (s is not None and -1 in s) or not _all_extents_above_one(x.shape):
            return None
        return plan_cache.peek(any_length_key(form, entry.rank_signature(x)))
    except TypeError:
        return None


def call_transform(
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
    """Every public transform: the array-API route as it is, NumPy's/SciPy's conventions where they differ. A call
    given ``out=`` runs outside any autocast region active on ``a``'s device, as Torch's own ``out=`` calls do
    (:func:`~nvdispatch._fft_conventions.outside_autocast`)."""
    if out is not None:
        outside = outside_autocast(a)
        if outside is not None:  # within it no region is active: this call takes the route below
            try:
                return outside(call_transform, func, a, n, axis, s, axes, norm, out, stream, convention, callbacks)
            except UnsupportedDtypeError as exc:
                if callbacks is None or callbacks == _NO_CALLBACKS:  # (a prolog/epilog call no region promotes)
                    _refuse_outside_region(exc, a)
                raise
    if callbacks is not None and callbacks != _NO_CALLBACKS:  # prolog/epilog: planned by problem, no call key
        if traced_framework(a) is not None:
            _refuse_traced(callbacks, out)
        result = _run(func, as_operand(a), n, axis, s, axes, norm, stream, callbacks)
        return result if out is None else write_out(result, out)
    if out is not None and traced_framework(a) is not None:
        _refuse_traced(_NO_CALLBACKS, out)
    if out is None and s is None and (axes is None or a.__class__ is not np.ndarray or _distinct_axes(axes, a.ndim)):
        try:
            return _run(func, a, n=n, axis=axis, s=s, axes=axes, norm=norm, stream=stream)
        except (UnsupportedDtypeError, UnsupportedOperandError):
            pass  # an array-like, or a dtype NumPy/SciPy/the framework promote: the conventions below
    x = as_operand(a)
    nd = FUNCS[func][2]
    naxes = 1 if not nd else len(axes if axes is not None else (s if s is not None else getattr(x, "shape", ())))
    x, final = promote(x, func, convention, naxes, names_one_axis(func, axes))
    if nd and convention == "numpy" and isinstance(x, np.ndarray):
        sizes, axes_t = numpy_nd_args(func, x.shape, s, axes)
        if out is not None:
            check_out(out, x, func, final, numpy_way=(sizes, axes_t))
        if not axes_t and func in ("fftn", "ifftn"):
            result = x.copy()  # numpy.fft: nothing to transform, the input comes back
        elif len(set(axes_t)) != len(axes_t):
            one = lambda f, y, n_, ax, nm: _run(f, y, n=n_, axis=ax, norm=nm, stream=stream)  # noqa: E731
            result = run_nd_numpy_way(func, x, sizes, axes_t, norm, one)
        else:
            result = _run(func, x, s=sizes, axes=axes_t, norm=norm, stream=stream)
    else:
        if out is not None:
            check_out(out, x, func, final, n, axis, s, axes)
        result = _run(func, x, n=n, axis=axis, s=s, axes=axes, norm=norm, stream=stream)
    if final is not None:
        result = cast_result(result, final)
    return result if out is None else write_out(result, out)


def _dtype_of(x) -> str:
    """The name of array ``x``'s dtype, without its framework's prefix (``torch.float16`` -> ``float16``)."""
    return str(getattr(x, "dtype", "")).rpartition(".")[2]


def _refuse_outside_region(exc: UnsupportedDtypeError, x) -> None:
    """Where ``x``'s dtype, refused outside the autocast region active on its device, is one the region casts: the
    error ``exc`` again, saying that ``out=`` kept the region from applying."""
    region = None if exc.argument != "x" else autocast_promotion(x, _dtype_of(x))
    if region is not None:
        hint = (
            f"{exc.hint + '; ' if exc.hint else ''}{region[1]}, which would compute it in {region[0]}, is not "
            "applied to a call given out= (the framework's own out= calls are not autocast either): call without "
            "out=, or cast x first"
        )
        raise UnsupportedDtypeError(exc.argument, exc.expected, exc.got, hint) from None


def _refuse_traced(callbacks, out) -> None:
    """What a traced program (``jax.jit``...) cannot stage: a prolog/epilog (Python code run on whole arrays
    or compiled for the GPU) and ``out=`` (JAX arrays are immutable)."""
    if out is not None:
        raise InvalidArgumentError(
            "out", "None inside jax.jit/grad/vmap (JAX arrays are immutable)", describe(out), "use the result"
        )
    for name, value in zip(("prolog", "epilog", "prolog_data", "epilog_data"), callbacks):
        if value is not None:
            raise InvalidArgumentError(
                name,
                "None inside jax.jit/grad/vmap (a Python element callback cannot be staged into a traced program)",
                describe(value),
                "apply the function to the input or result with jax.numpy instead; XLA fuses it",
            )


class TransformFrontParts(FrontParts):
    """What the transforms' compiled front reads: :class:`~nvdispatch._route.FrontParts` of :func:`call_transform`,
    and ``any_length``, the middle of an any-length key (:func:`nvdispatch._call_key.any_length_key`), by which it
    finds the plan kept for every extent of an operand as :func:`_run` does."""

    def __init__(self) -> None:
        super().__init__(call_transform)
        self.any_length = _ANY_LENGTH


def _transform_front():
    """:func:`call_transform` behind its hit compiled where the extension is built (and ``NVDISPATCH_PURE_PYTHON``
    is not set); else :func:`call_transform` itself."""
    compiled = hotpath()
    return call_transform if compiled is None else compiled.make_fft_front(FRONT_PARTS)


FRONT_PARTS = TransformFrontParts()
#: ``transform_front(func, a, n, axis, s, axes, norm, out, stream, convention, callbacks)``: the public
#: transforms' entry (:func:`call_transform`'s arguments, all positional)
transform_front = _transform_front()
