"""``matmul`` and the stateful ``Matmul``: ``epilog(alpha * a @ b + beta * c)`` on any executor."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._adapters import adapter_for, call_key_classes
from ._autocast_plan import AutocastPlan
from ._call_key import SCALARS, class_keys, long_key, short_form, short_key
from ._compiled import hotpath
from ._copying_plan import keep_copying_plan
from ._detect import detect
from ._epilog import INPUTS, Epilog, spec_of
from ._execute import run, run_direct
from ._fp8 import MatmulQuantizationScales, build_fp8_problem, scale_values, wants_fp8
from ._matmul_agreement import agreeing, result_sampler
from ._matmul_problem import (
    ComputeType,
    MatmulOptions,
    MatmulPlanPreferences,
    as_options,
    as_preferences,
    build_problem,
    check_scalar,
    scalar_always_valid,
    scalar_value,
)
from ._plan_cache import plan_cache
from ._precision import AUTOCAST_DTYPES, PrecisionConvention, autocast_targets
from ._route import (
    Explanation,
    FrontParts,
    acquire_plan,
    check_stream,
    choice_key,
    choose_strategy,
    coerce_operands,
    debug_enabled,
    detect_all,
    explain_selected,
    keep_or_select,
    log_hit,
    log_levels,
    placement,
    plan_key,
    refuse_recorded_call,
    strategies_of,
)
from ._traced import announce, traced_handler
from ._tunings import STRATEGY_CHOICE
from ._typing import Array, Scalar, Stream
from .errors import (
    EpilogInputError,
    InvalidArgumentError,
    MixedOperandsError,
    PlanStateError,
    ShapeMismatchError,
    UnsupportedDtypeError,
    UnsupportedOperandError,
    describe,
)
from .executors.blas_threads import let_workers_sleep

_acquire = plan_cache.acquire  # the call route's first step (pins the plan), bound once
_acquire_handle = plan_cache.acquire_handle  # the same, by a handle the call-key memo kept
_handle = plan_cache.handle
_classes = call_key_classes  # class -> ClassKeys (_call_key), read first on the hot path

__all__ = ["matmul", "Matmul", "explain_matmul", "Epilog", "ComputeType", "MatmulOptions", "MatmulPlanPreferences"]

_OPERAND_NAMES = ("a", "b", "c", *INPUTS)  # the operands and every epilog input of the table


def _check_epilog_inputs(epilog_inputs) -> dict[str, Any]:
    if epilog_inputs is None:
        return {}
    if not isinstance(epilog_inputs, dict):
        raise EpilogInputError("epilog_inputs", "a dict of named arrays", describe(epilog_inputs))
    for key, value in epilog_inputs.items():
        if key not in INPUTS:
            expected = f"keys among {', '.join(map(repr, INPUTS))}"
            raise EpilogInputError("epilog_inputs", expected, f"unexpected key {key!r}")
        if value is None:
            raise EpilogInputError(f"epilog_inputs[{key!r}]", "an array", "None")
    return epilog_inputs


def _check_required(a, b) -> None:
    """``a`` and ``b`` must be given (None means "absent" only for ``c`` and the epilog inputs)."""
    for name, value in (("a", a), ("b", b)):
        if value is None:
            raise UnsupportedOperandError(name, "an array", "None")


def _as_array(name: str, x: Any) -> Any:
    """``x`` itself when an adapter knows it (or None), else ``numpy.asarray(x)``: array-likes (lists, tuples,
    objects with ``__array__``) are taken the NumPy way, as ``numpy.matmul`` takes them."""
    if x is None or x.__class__ is np.ndarray or adapter_for(x) is not None:
        return x
    expected = "an array or a numeric array-like (a list or tuple of numbers)"
    if isinstance(x, (str, bytes)):
        raise UnsupportedOperandError(name, expected, describe(x))
    try:
        arr = np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - whatever NumPy says, the operand is no array
        raise UnsupportedOperandError(name, expected, describe(x)) from exc
    if arr.dtype.kind not in "biufc":
        raise UnsupportedOperandError(name, expected, describe(x))
    return arr


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """A validated, selected matmul: its problem, executor selection, strategy and operand infos."""

    problem: Any
    selection: Any
    strategy: str
    #: the operands as given (an autocast region's casts are the plan's: ``problem.autocast`` names them)
    infos: dict[str, Any]
    #: the precision convention the problem followed (None: none, or the caller's ``compute_type``)
    convention: PrecisionConvention | None = None


@dataclasses.dataclass(frozen=True)
class _Bound:
    """What every execute of a ``Matmul``'s plan on its current operands passes: the operands (views, as
    executors take them), the arguments of the plan's direct call where the route would take it (as
    :func:`matmul` does), whether an operand requires grad (a plan made without autograd must not run a call
    autograd records: its executor may drop the graph, or its direct call have no derivative) and the arrays,
    and how the result goes back (``(adapter, like)``, or None)."""

    plan: Any
    operands: dict[str, Any]
    direct: tuple | None
    grads: bool
    arrays: dict[str, Any]
    wrap: tuple[Any, Any] | None
    #: whether the operands hold copies of lazy views' values (``OperandInfo.materialized``) that the next
    #: execute makes anew (the values may have changed since)
    stale: bool = False


#: ``_prepare``'s ``convention`` default: the operands' framework's precision convention, read now
_READ_NOW = object()


def _prepare(
    a,
    b,
    c,
    alpha,
    beta,
    epilog,
    epilog_inputs,
    options,
    preferences,
    scales=None,
    selection=None,
    infos=None,
    convention=_READ_NOW,
    stream=None,
    fold_conj=False,
) -> _Prepared:
    """Validate a call, choose its executor and strategy. ``infos``: a, b, c detected already (a ``Matmul``'s);
    ``selection``: keep that executor (a stateful object's) unless it declines the problem; ``convention``: the
    precision convention to follow (a ``Matmul``'s re-plan keeps its ``plan()``'s), by default the framework's
    now (see :mod:`nvdispatch._precision`), never read where ``options`` give a compute type; ``stream``: where
    an autocast region's casts are made (the call's); ``fold_conj``: ``a`` and ``b`` detected here (``infos``
    None) may be lazy conjugate views described by their memory (:func:`_detect_folding`) where the executor
    chosen folds the conjugation into its plan; for any other it is prepared again on copies of their values."""
    spec = spec_of(epilog)
    inputs = _check_epilog_inputs(epilog_inputs)
    opts = as_options(options)
    prefs = as_preferences(preferences)
    if infos is None:
        _check_required(a, b)
        named = {"a": a, "b": b, "c": c, **inputs}
        infos = _detect_folding(named) if fold_conj else detect_all(named)
    else:
        infos = {**{k: v for k, v in infos.items() if k in ("a", "b", "c")}, **detect_all(inputs)}
    framework, device = placement(infos)
    if wants_fp8(infos, opts, scales):
        convention = None
        problem = build_fp8_problem(framework, device, infos, spec, opts, alpha, beta, tuple(inputs), scales)
    else:
        if opts.compute_type is not None:
            convention = None
        elif convention is _READ_NOW:
            ad = adapter_for(a)
            convention = None if ad is None else ad.precision_convention(device)
        cast, autocast = _autocast_operands(infos, convention, a, stream)
        problem = build_problem(
            framework, device, cast, spec, opts, alpha, beta, tuple(inputs), convention, autocast
        )
    plan_prefs = prefs.for_plan()
    if plan_prefs is not None:  # limit / max_workspace_bytes shape the plan: part of its key
        problem = dataclasses.replace(problem, preferences=plan_prefs)
    sel = keep_or_select(selection, "matmul", problem)
    if problem.a.conj or problem.b.conj:
        strategy = _folding_strategy(sel, problem, prefs.strategy)
        if strategy is None:  # its executor would read their memory as it is: prepared on copies of their values
            return _prepare(a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, scales, selection,
                            None, convention, stream)  # fmt: skip
    else:
        strategy = choose_strategy(sel.executor, "matmul", problem, prefs.strategy)
    return _Prepared(problem, sel, strategy, infos, convention)


def _folding_strategy(sel, problem, preferred: str | None) -> str | None:
    """The strategy of ``problem``, whose operands marked ``conj`` hold their values' conjugates, where the executor
    of ``sel`` runs it reading them conjugated (:func:`_folds_conjugates`); None where it would not (a coercing
    backend, no strategy for it, the caller's ``preferred`` one not among them, a plan that does not fold)."""
    if sel.coerce:
        return None
    available = strategies_of(sel.executor, "matmul", problem)
    if not available or (preferred is not None and preferred not in available):
        return None
    strategy = choose_strategy(sel.executor, "matmul", problem, preferred)
    return strategy if _folds_conjugates(sel.executor, problem, strategy) else None


def _detect_folding(named) -> dict[str, Any]:
    """:func:`~nvdispatch._route.detect_all` of a call's operands, ``a`` and ``b`` described by their memory where
    that holds the conjugates of their values (their adapter's ``info_conjugated``: a Torch CUDA ``z.mH``, marked
    ``conjugated``), which :func:`_prepare` keeps only for an executor that folds the conjugation in
    (:func:`_folds_conjugates`), where otherwise each call copies their values."""
    infos = {}
    for name, x in named.items():
        if x is None:
            continue
        info = None
        if name in ("a", "b"):
            ad = adapter_for(x)
            info = None if ad is None else ad.info_conjugated(name, x)
        infos[name] = detect(name, x) if info is None else info
    return infos


def _copied(infos) -> tuple[str, ...]:
    """The operands a plan was made on copies of the values of (``OperandInfo.materialized``: a Torch CUDA ``z.mH``
    an executor does not fold): a repeated call must copy them anew, so its key (which the views' signatures give)
    may not find that plan itself, which would read the views' memory, but a :class:`CopyingPlan` of it."""
    return tuple(name for name, info in infos.items() if info.materialized)


def _folds_conjugates(executor, problem, strategy: str) -> bool:
    """Whether ``executor``'s ``strategy`` plan of ``problem`` reads its operands marked ``conj`` conjugating them
    (``Executor.folds_conjugates``; an executor without the method does not)."""
    folds = getattr(executor, "folds_conjugates", None)
    return folds is not None and bool(folds("matmul", problem, strategy))


def _forget_copying_plans(executor, problem, strategy) -> None:
    """Forget the call keys of every :class:`CopyingPlan` of (problem, executor, strategy), whichever operands it
    copies (``_copied``'s names, in the call's operand order): their calls choose their plan again."""
    kept = plan_key(executor, "matmul", problem, strategy)
    names = ("a", "b", "c", *problem.epilog.inputs)
    for count in range(1, len(names) + 1):
        for copied in itertools.combinations(names, count):
            key = ("copying", kept, copied)
            plan = plan_cache.peek(key)
            if plan is not None:
                plan_cache.forget_keys_but(plan, key)


def _autocast_operands(infos, convention, like, stream):
    """``(infos, names)``: ``infos`` with the operands ``convention``'s autocast region casts cast by ``like``'s
    adapter (on ``stream`` for a GPU call, where the product reads them) and their names; ``(infos, None)`` where
    no region applies."""
    if convention is None or convention.autocast is None:
        return infos, None
    targets = autocast_targets(convention.autocast, {name: info.dtype for name, info in infos.items()})
    if targets is None:
        return infos, None
    ad = adapter_for(like)
    device = infos["a"].device
    out = dict(infos)
    with ad.native_stream_context(stream if device.kind == "cuda" else None, device.index):
        for name, dtype in targets.items():
            out[name] = detect(name, ad.cast(infos[name].array, dtype))
    return out, tuple(targets)


def _acquire_autocast_plan(executor, problem, strategy, like, call_key):
    """The plan a call in an autocast region runs (pinned for the caller): an :class:`AutocastPlan` casting the
    operands ``problem.autocast`` names, by ``like``'s adapter, then running the cast problem's plan; cached
    beside that plan (and under ``call_key``, where given), holding it as long as it lives itself."""
    ad = adapter_for(like)
    device = problem.device

    def make(_tuning):
        inner = acquire_plan(executor, "matmul", problem, strategy)
        try:
            on_stream = None
            if device.kind == "cuda":
                on_stream = lambda stream: ad.native_stream_context(stream, device.index)  # noqa: E731
            return AutocastPlan(
                inner, plan_cache.hold(inner), problem.autocast, problem.result_dtype, ad.cast, on_stream
            )
        finally:
            plan_cache.let_go(inner)

    return plan_cache.acquire_or_create(_autocast_key(executor, problem, strategy, like), make, alias=call_key)


def _autocast_key(executor, problem, strategy, like):
    """The plan-cache key of the :class:`AutocastPlan` of (problem, executor, strategy) for ``like``'s framework;
    None where the problem's operands are not cast."""
    if problem.autocast is None:
        return None
    return ("autocast", plan_key(executor, "matmul", problem, strategy), adapter_for(like).name)


def _operands(a, b, c, alpha, beta, epilog_inputs, scales=None) -> dict[str, Any]:
    ops = {"a": a, "b": b, "alpha": alpha, "beta": beta}
    if c is not None:
        ops["c"] = c
    if epilog_inputs:
        ops.update(epilog_inputs)
    if scales is not None:
        ops["quantization_scales"] = scale_values(scales)
    return ops


def matmul(
    a: Array,
    b: Array,
    c: Array | None = None,
    *,
    alpha: Scalar = 1,
    beta: Scalar | None = None,
    epilog: Epilog | str | None = None,
    epilog_inputs: Mapping[str, Array] | None = None,
    options: MatmulOptions | Mapping[str, Any] | None = None,
    preferences: MatmulPlanPreferences | Mapping[str, Any] | None = None,
    stream: Stream = None,
    quantization_scales: MatmulQuantizationScales | Mapping[str, Any] | None = None,
) -> Array:  # (result, aux) for an epilog with outputs
    """Compute ``epilog(alpha * a @ b + beta * c)`` with whichever executor owns the operands.

    The stateless form of :class:`Matmul`: ``Matmul(a, b, c, ...).plan(epilog, ...).execute()``, whose plan
    stays in the plan cache under the call's key, so a repeated call runs it at once.

    Parameters
    ----------
    a, b : array
        Arrays of one registered framework and device (NumPy, CuPy, Torch, JAX, array-api-strict, Dask, any
        ``__cuda_array_interface__`` / DLPack object), or array-likes NumPy takes (lists, tuples). PEP 465
        semantics: 1-D operands are promoted (and the added dimension removed from the result); leading
        batch dimensions broadcast.
    c : array, optional
        Added as ``beta * c``; must broadcast to the result.
    alpha, beta : scalar
        Python or NumPy scalars. ``beta`` defaults to 1 when ``c`` is given, and must be 0/None otherwise.
    epilog : Epilog or str, optional
        One of :class:`Epilog` (see ``nvdispatch._epilog`` for the exact math of each).
    epilog_inputs : dict, optional
        ``{"bias": ...}`` (shape ``(n,)``, ``(..., 1, n)`` or ``(..., m, 1)``), ``{"relu_aux": ...}``,
        ``{"gelu_aux": ...}`` as the epilog requires.
    options : MatmulOptions or dict, optional
        ``compute_type``, ``scale_type``, ``bgrad_axis``; for FP8 operands ``result_type``, ``result_amax``
        and ``operand_types`` (see :mod:`nvdispatch._fp8`).
    preferences : MatmulPlanPreferences or dict, optional
        ``strategy`` forces an epilog fusion strategy.
    stream : optional
        GPU stream (Torch/CuPy stream, ``__cuda_stream__`` object or raw pointer); default: the
        operands' framework's current stream. On the CPU only None (or the framework's own CPU stream, such as
        ``torch.cpu.Stream``); anything else is an :class:`~nvdispatch.errors.InvalidArgumentError`.
    quantization_scales : dict or MatmulQuantizationScales, optional
        FP8 operands (``float8_e4m3fn``/``float8_e5m2``): per-tensor scales ``{"a", "b", "c", "d"}``, Python
        numbers or one-element float32 device arrays; the result is
        ``scale_d * epilog(alpha * scale_a * scale_b * a @ b + beta * scale_c * c)``, saturated and rounded to
        an FP8 ``result_type``. cuBLASLt's FP8 kernels on compute capability 8.9+, Torch's reference path
        elsewhere; ``explain()`` says which.

    Returns
    -------
    array or (array, dict)
        The result in the operands' framework and on their device (a 1-D @ 1-D NumPy product: a NumPy
        scalar, as ``numpy.matmul`` gives); with epilogs that have auxiliary outputs (``*_AUX``, ``*_BGRAD``,
        ``BGRADA``, ``BGRADB``) or ``result_amax`` a tuple ``(result, aux)``.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> x = np.ones((4, 3), np.float32); w = np.full((3, 2), -1.0, np.float32)
    >>> bias = np.array([1.0, 5.0], np.float32)
    >>> nvdispatch.matmul(x, w, epilog=nvdispatch.Epilog.RELU_BIAS, epilog_inputs={"bias": bias})[0]
    array([0., 2.], dtype=float32)
    """
    return _front(a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, stream, quantization_scales)


announce("matmul", matmul)


def _route(
    a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, stream, quantization_scales, memo_checked=False
):
    """The route of a ``matmul`` call: its call key (:mod:`nvdispatch._call_key`) and the plan cache (the
    call-key memo first, for a repeated call of a short form), then the run step on the cached plan; else the
    stateful object's path (:func:`_plan_and_run`). ``memo_checked``: the compiled front (``_front``) tried
    the form's remembered handles already and none served the call."""
    entry = _classes.get(a.__class__)
    if entry is None:
        entry = class_keys(a.__class__)
    plain, sig, memo = entry[:3]
    plan = key = learn = form = None
    pinned = True  # let go of the plan after the call (a no-op for a plan the cache does not pin)
    try:
        if sig is not None:
            if c is None and beta is None and options is None and preferences is None and quantization_scales is None:
                form, arrays, key = short_form(entry, a, b, alpha, epilog, epilog_inputs)
            if form is None:
                key = long_key(
                    entry, a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, quantization_scales
                )
            if form is not None and memo is not None:
                # where the class has a guard, a repeated call's plan handle is remembered behind it
                for check, handle, epoch in () if memo_checked else memo.handles.get(form, ()):
                    if check(*arrays):
                        plan = _acquire_handle(handle, epoch)
                        break
                if plan is None:
                    key, learn = short_key(form, entry, arrays), memo
                else:
                    pinned = not handle.pinless  # the cache does not pin it: letting go would do nothing
            if plan is None and key is not None:
                plan = _acquire(key)  # pinned until this call returns (if it needs release)
    except TypeError:  # an unhashable argument: the full path validates (and reports) it
        key = plan = None
    if plan is None:
        return _plan_and_run(
            key, a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, stream, quantization_scales
        )
    if learn is not None:  # a repeated call, found by its signatures
        learn.remember(form, arrays, _handle(key))
    if form is not None and plain and stream is None and alpha == 1 and log_levels.get(10) is False:
        # the commonest hit, a short form: its arrays (a, b[, bias]) to the plan's direct call, as _run_cached would
        if getattr(plan, "direct", None) is not None:
            return run_direct(plan, arrays, pinned)
    return _run_cached(plan, pinned, entry, a, b, c, alpha, beta, epilog_inputs, stream, quantization_scales)


def _run_cached(plan, pinned, entry, a, b, c, alpha, beta, epilog_inputs, stream, scales):
    """The run step of a call whose plan its key found (pinned unless the cache does not pin it): on the
    arrays' views, by the plan's direct call where every per-call value but the arrays is at its default, the
    result through the adapter's ``wrap`` (:func:`nvdispatch._execute.run`)."""
    try:
        if stream is not None:
            check_stream(stream, a)
        if log_levels.get(10) is not False and debug_enabled():
            log_hit("matmul", plan)
        direct = None
        if stream is None and alpha == 1 and c is None and scales is None:
            direct = getattr(plan, "direct", None)
        wrap = None
        if not entry.plain:  # an adapter with views or a way back: executors take views, callers get their type
            wrap = (entry.adapter, a) if entry.wraps else None
            a, b, c, epilog_inputs = _views(entry, a, b, c, epilog_inputs)
    except BaseException:
        if pinned:
            plan_cache.let_go(plan)
        raise
    if direct is not None:
        args = (a, b) if not epilog_inputs else (a, b, *epilog_inputs.values())
        return run(plan, None, None, args, wrap, pinned)
    return run(plan, _operands(a, b, c, alpha, beta, epilog_inputs, scales), stream, None, wrap, pinned)


def _views(entry, a, b, c, epilog_inputs):
    """The views of a cached call's arrays that executors take (``ClassKeys.view`` of each array's class)."""

    def view(x):
        own = entry if x.__class__ is a.__class__ else class_keys(x.__class__)
        return x if own.view is None else own.view(x)

    inputs = {} if epilog_inputs is None else {k: view(v) for k, v in epilog_inputs.items()}
    return view(a), view(b), None if c is None else view(c), inputs


def _plan_and_run(key, a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, stream, scales):
    """A call whose plan is not cached under its key: the stateful object's path. ``Matmul`` plans it (keeping
    the plan under ``key`` too where every call with that key validates and selects the same way), executes
    once and lets go. A call on traced arrays (inside ``jax.jit``...) is handed to the integration that stages
    it, and a call a framework must see itself (a Torch call autograd records...) to its integration
    (``nvdispatch._traced``), with its key: the integration may keep a plan under it that serves the call's
    repeats from the route's hit."""
    inputs = epilog_inputs.values() if epilog_inputs.__class__ is dict else ()
    handler = traced_handler("matmul", (a, b, c, *inputs, alpha, beta), key)  # a traced scale is refused there
    if handler is not None:
        result = handler(
            a, b, c, alpha=alpha, beta=beta, epilog=epilog, epilog_inputs=epilog_inputs, options=options,
            preferences=preferences, stream=stream, quantization_scales=scales,
        )  # fmt: skip
        if result is not NotImplemented:
            return result
    mm = Matmul._for_call(a, b, c, alpha, beta, options, stream, scales)
    mm._fold_conj = True  # its operands are read once, right after planning
    try:
        mm._plan_with(epilog, epilog_inputs, preferences, None, call_key=key)
        return mm.execute(stream=stream)
    finally:
        mm.free()


def hold_call_plan(a: Array, b: Array, epilog: Epilog | str | None = None, epilog_inputs=None) -> Any:
    """A hold (:class:`~nvdispatch._plan_cache.PlanHold`: ``plan``, ``close()``) on the plan that
    ``matmul(a, b, epilog=epilog, epilog_inputs=epilog_inputs)`` runs now (backend state, precision settings and
    the operands' autograd state as they are), planned and cached as that call would be. For integrations that run
    a call's plan themselves (the Torch operators' autograd Function on a recorded call's repeats).

    Examples
    --------
    >>> import numpy as np
    >>> hold = hold_call_plan(np.ones((2, 3)), np.ones((3, 4)))
    >>> hold.plan.execute({"a": np.ones((2, 3)), "b": np.ones((3, 4)), "alpha": 1, "beta": None}, None)[0, 0]
    np.float64(3.0)
    >>> hold.close()
    """
    return _hold_and_selection(a, b, epilog, epilog_inputs)[0]


def _hold_and_selection(a, b, epilog, epilog_inputs) -> tuple[Any, Any, bool]:
    """``(hold, selection, copies)`` of :func:`hold_call_plan` (the selection: how the executor was chosen;
    ``copies``: the plan was made on copies of lazy views' values, which each call must make anew)."""
    mm = Matmul._for_call(a, b, None, 1, None, None, None, None)
    try:
        mm._plan_with(epilog, epilog_inputs, None, None)
        return plan_cache.hold(mm._plan), mm._selection, bool(_copied(mm._infos))
    finally:
        mm.free()


def prepare_call(a: Array, b: Array, epilog: Epilog | str | None = None, epilog_inputs=None) -> tuple[Any, Any]:
    """``(hold, call)``: a hold on the plan ``matmul(a, b, epilog=epilog, epilog_inputs=epilog_inputs)`` runs now
    (:func:`hold_call_plan`) and the call that runs it on arrays with the signatures of these,
    ``call(a, b, *inputs)`` (the epilog's inputs in ``epilog_inputs``' order) returning what ``matmul`` returns:
    the plan's direct call itself where the route's hit would take it (arrays executors take as they are, a
    plan with a direct call), else the hit's run step (views, the plan's direct call or execute path, the
    result wrapped), or where a coercing backend chose the executor or the plan was made on copies of lazy views'
    values the public function itself. For
    integrations that run a fixed sequence of calls (a fused MLP's chain) without a key per call; they keep the
    hold as long as the call.

    Examples
    --------
    >>> import numpy as np
    >>> hold, call = prepare_call(np.ones((2, 3)), np.ones((3, 4)), "BIAS", {"bias": np.zeros(4)})
    >>> call(np.ones((2, 3)), np.full((3, 4), 2.0), np.ones(4))[1, 3]
    np.float64(7.0)
    >>> hold.close()
    """
    hold, selection, copies = _hold_and_selection(a, b, epilog, epilog_inputs)
    plan = hold.plan
    entry = _classes.get(a.__class__)
    if entry is None:
        entry = class_keys(a.__class__)
    names = () if not epilog_inputs else tuple(epilog_inputs)
    if selection.coerce or copies:
        # the executor converts the operands first, or takes copies of lazy views' values (a Torch CUDA conjugate
        # view its plan does not fold): the call takes the public path each time

        def public(a, b, *inputs):
            return matmul(a, b, epilog=epilog, epilog_inputs=dict(zip(names, inputs)) if names else None)

        return hold, public
    direct = getattr(plan, "direct", None)
    arrays = (b, *([] if not epilog_inputs else epilog_inputs.values()))
    if direct is not None and entry.plain and len(names) <= 1 and all(class_keys(x.__class__).plain for x in arrays):
        return hold, direct

    def call(a, b, *inputs):
        given = dict(zip(names, inputs)) if names else None
        return _run_cached(plan, False, entry, a, b, None, 1, None, given, None, None)

    return hold, call


def _compiled_front():
    """:func:`_route` behind its hit compiled (``_hotpath.c``: a repeated call of the short forms, served by the
    call-key memo or the call key, for classes whose arrays executors take as they are), where the extension is
    built and ``NVDISPATCH_PURE_PYTHON`` is not set; else :func:`_route` itself. The compiled hit reads one
    object, :data:`_FRONT_PARTS`, and leaves every other call to the route."""
    compiled = hotpath()
    if compiled is None:  # the route is the same, in Python
        return _route
    return compiled.make_matmul_front(_FRONT_PARTS)


class _FrontParts(FrontParts):
    """What the matmul front reads (:class:`~nvdispatch._route.FrontParts`, ``route`` being :func:`_route`, which
    serves every call the front does not, with ``memo_checked``), and ``operands``: :func:`_operands`, for a plan
    without a direct call."""

    def __init__(self) -> None:
        super().__init__(_route)
        self.operands = _operands


_FRONT_PARTS = _FrontParts()
_front = _compiled_front()




def _scales_always_valid(problem) -> bool:
    """Whether every call whose key matches this problem's passes its scales' checks: not so for scale arrays in
    host memory (planning checks their values, which their signatures do not hold)."""
    fp8 = problem.quantization
    return fp8 is None or problem.device.kind != "cpu" or all(kind == "host" for _, kind in fp8.scales)


def explain_matmul(
    a: Array,
    b: Array,
    c: Array | None = None,
    *,
    alpha: Scalar = 1,
    beta: Scalar | None = None,
    epilog: Epilog | str | None = None,
    epilog_inputs: Mapping[str, Array] | None = None,
    options: MatmulOptions | Mapping[str, Any] | None = None,
    preferences: MatmulPlanPreferences | Mapping[str, Any] | None = None,
    stream: Stream = None,
    quantization_scales: MatmulQuantizationScales | Mapping[str, Any] | None = None,
) -> Explanation:
    """What ``matmul`` would do with these arguments, without running it.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> nvdispatch.linalg.explain_matmul(np.ones((4, 3)), np.ones((3, 2)), epilog="RELU").executor
    'numpy'
    """
    a, b, c = _as_array("a", a), _as_array("b", b), _as_array("c", c)
    epilog_inputs = _as_inputs(epilog_inputs)
    prep = _prepare(
        a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, quantization_scales, fold_conj=True
    )
    check_stream(stream, a)
    return explain_selected("matmul", "matmul", prep.problem, prep.selection, prep.strategy)


def _as_inputs(epilog_inputs):
    """Epilog inputs with array-likes taken the NumPy way (a dict of arrays is returned as it is)."""
    if epilog_inputs.__class__ is not dict or all(
        v is None or v.__class__ is np.ndarray or adapter_for(v) is not None for v in epilog_inputs.values()
    ):
        return epilog_inputs
    return {k: _as_array(f"epilog_inputs[{k!r}]", v) for k, v in epilog_inputs.items()}


class Matmul:
    """Stateful matmul: plan once (and autotune), execute many times, swap operands in between.

    Parameters
    ----------
    a, b, c, alpha, beta, options, quantization_scales
        As for :func:`matmul`.
    stream : optional
        Default stream for ``plan``/``autotune``/``execute``.

    Notes
    -----
    *Executor.* ``plan()`` selects the executor under the backend state active then (``set_backend``...);
    re-plans that follow (``reset_operands`` with other strides) keep that executor, whatever backend state
    is active at that time, unless it declines the new operands (then one is selected again: ``executor``
    and ``explain()`` say which). Calling ``plan()`` again selects afresh.

    *Plan lifetime.* The object holds its plan: the shared plan cache may evict it (or be cleared) while the
    object lives, but releases it only once ``free()`` (or garbage collection) lets go of it.

    *Threads.* One object may be used from several threads: ``execute`` calls may run concurrently (each runs
    the plan and operands current when it starts), and ``plan``/``autotune``/``reset_operands``/``free`` are
    serialised with each other and never disturb an ``execute`` already running.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> a = np.random.rand(64, 32).astype(np.float32); b = np.random.rand(32, 16).astype(np.float32)
    >>> bias = np.random.rand(1, 16).astype(np.float32)
    >>> with nvdispatch.Matmul(a, b, options={"compute_type": nvdispatch.ComputeType.COMPUTE_32F_FAST_16F}) as mm:
    ...     r = mm.plan(epilog=nvdispatch.Epilog.RELU_BIAS, epilog_inputs={"bias": bias}).execute()  # plan() returns mm
    ...     r2 = mm.execute()  # planned once, run again
    >>> bool(np.allclose(r, np.maximum(a @ b + bias, 0), rtol=1e-5))
    True
    """

    def __init__(
        self,
        a: Array,
        b: Array,
        c: Array | None = None,
        *,
        alpha: Scalar = 1,
        beta: Scalar | None = None,
        options: MatmulOptions | Mapping[str, Any] | None = None,
        stream: Stream = None,
        quantization_scales: MatmulQuantizationScales | Mapping[str, Any] | None = None,
    ) -> None:
        a, b, c = _as_array("a", a), _as_array("b", b), _as_array("c", c)
        self._setup(a, b, c, alpha, beta, as_options(options), stream, quantization_scales)
        # validate shapes and dtypes now, so mistakes surface at construction
        _check_required(a, b)
        infos = detect_all({"a": a, "b": b, "c": c})
        framework, device = placement(infos)
        if wants_fp8(infos, self._options, quantization_scales):
            spec, scales = spec_of(None), quantization_scales
            problem = build_fp8_problem(framework, device, infos, spec, self._options, alpha, beta, (), scales)
        else:
            problem = build_problem(framework, device, infos, spec_of(None), self._options, alpha, beta)
        check_stream(stream, a)
        self._infos = infos
        # alpha/beta are float32 scalars of FP8 matmuls
        self._result_dtype = problem.result_dtype if problem.quantization is None else "float32"

    def _setup(self, a, b, c, alpha, beta, options, stream, scales) -> None:
        self._options = options
        self._scales = scales
        self._lock = threading.RLock()
        self._infos: dict[str, Any] | None = None  # a, b, c (and once planned, the epilog inputs) detected
        self._result_dtype = None
        self._a, self._b, self._c = a, b, c
        self._alpha, self._beta = alpha, beta
        self._stream = stream
        self._epilog = None
        self._inputs: dict[str, Any] = {}
        #: the precision convention plan() followed (its re-plans keep it); None: none, or not planned yet
        self._convention = None
        self._as_planned = None  # runs execute's plan with plan()'s precision kept (see _plan_with)
        self._problem = None
        self._selection = None
        self._hold = None  # our hold on the plan (PlanHold)
        self._bound: _Bound | None = None  # what execute passes the plan; None after a change
        self._strategy = None
        self._freed = False
        self._stateless = False  # a stateless call's object (planned and executed at once)
        #: whether plan() may read lazy conjugate views by their memory (a ``matmul()`` call's object: its operands
        #: are planned and executed at once; see :func:`_prepare`)
        self._fold_conj = False

    @classmethod
    def _for_call(cls, a, b, c, alpha, beta, options, stream, scales) -> Matmul:
        """The object a stateless call plans and executes with: nothing is validated before :meth:`plan`,
        which validates the whole call (in the order the stateless call always has)."""
        self = cls.__new__(cls)
        self._setup(_as_array("a", a), _as_array("b", b), _as_array("c", c), alpha, beta, options, stream, scales)
        self._stateless = True
        return self

    # -- helpers --------------------------------------------------------------------------------------
    @property
    def _plan(self):
        hold = self._hold
        return None if hold is None else hold.plan

    def _check_alive(self, what: str) -> None:
        if self._freed:
            raise PlanStateError("self", f"a live Matmul to {what}", "one that was freed", "create a new Matmul")

    def _check_planned(self, what: str) -> None:
        self._check_alive(what)
        if self._hold is None:
            raise PlanStateError("self", f"a planned Matmul to {what}", "one not planned yet", "call plan() first")

    def _views(self, now: bool = False) -> tuple[Any, Any, Any, dict[str, Any]]:
        """The views of the operands executors take (their adapters' ``OperandInfo.array``); ``now``: a view that
        is a copy of a lazy view's values (``OperandInfo.materialized``) made anew, from the values as they are."""
        infos = self._infos
        given = {"a": self._a, "b": self._b, "c": self._c, **self._inputs}

        def view(name):
            info = infos.get(name)
            if info is None:
                return None
            return detect(name, given[name]).array if now and info.materialized else info.array

        return view("a"), view("b"), view("c"), {name: view(name) for name in self._inputs}

    def _stale(self) -> bool:
        """Whether an operand's view is a copy of a lazy view's values that an execute must make anew: a stateful
        object's (its operands may change between executes; a stateless call's are planned just before)."""
        return not self._stateless and any(info.materialized for info in self._infos.values())

    def _operands(self, views=None):
        a, b, c, inputs = self._views() if views is None else views
        ops = _operands(a, b, c, self._alpha, self._beta, inputs, self._scales)
        return coerce_operands(self._selection, ops, _OPERAND_NAMES)

    def _adopt(self, plan) -> None:
        """Hold ``plan`` (pinned by the caller) instead of the current one."""
        old, self._hold = self._hold, plan_cache.hold(plan)
        if old is not None:
            old.close()

    # -- public API -----------------------------------------------------------------------------------
    @property
    def strategy(self) -> str | None:
        """The fusion strategy of the current plan."""
        return self._strategy

    @property
    def executor(self) -> str | None:
        """The name of the executor the current plan runs on."""
        sel = self._selection
        return None if sel is None else sel.executor.name

    def plan(
        self,
        epilog: Epilog | str | None = None,
        epilog_inputs: Mapping[str, Array] | None = None,
        preferences: MatmulPlanPreferences | Mapping[str, Any] | None = None,
        *,
        stream: Stream = None,
    ) -> Matmul:
        """Choose the executor and strategy and prepare the plan (kept in the shared plan cache)."""
        with self._lock:
            check_stream(stream, self._a)
            return self._plan_with(epilog, epilog_inputs, preferences, None)

    def _plan_with(self, epilog, epilog_inputs, preferences, selection, call_key=None, convention=_READ_NOW):
        """Plan (and hold) the call; ``call_key``: a stateless call's key, to keep the plan under too where every
        call with that key validates and selects the same way; ``convention``: the precision convention to follow
        (a re-plan keeps ``plan()``'s), by default the framework's now."""
        self._check_alive("plan")
        inputs = dict(_check_epilog_inputs(_as_inputs(epilog_inputs)))
        prep = _prepare(
            self._a,
            self._b,
            self._c,
            self._alpha,
            self._beta,
            epilog,
            inputs,
            self._options,
            preferences,
            self._scales,
            selection,
            self._infos,
            convention,
            self._stream,
            self._fold_conj,
        )
        problem, sel = prep.problem, prep.selection
        if call_key is not None and not (
            not sel.coerce
            and scalar_always_valid(self._alpha, problem.result_dtype)
            and (self._beta is None or scalar_always_valid(self._beta, problem.result_dtype))
            and _scales_always_valid(problem)
        ):
            call_key = None
        copied = _copied(prep.infos)
        if copied and problem.autocast is not None:
            call_key = None  # (a region's casts of copies: the full path each time)
        own_key = None if copied else call_key  # a plan made on copies is kept under the key behind a CopyingPlan
        if problem.autocast is None:
            plan = acquire_plan(sel.executor, "matmul", problem, prep.strategy, own_key)
        else:
            plan = _acquire_autocast_plan(sel.executor, problem, prep.strategy, self._a, own_key)
        try:
            if copied and call_key is not None:
                copying_key = ("copying", plan_key(sel.executor, "matmul", problem, prep.strategy), copied)
                arguments = ("a", "b", *problem.epilog.inputs)  # the direct call's: an epilog takes at most one input
                keep_copying_plan(plan, copied, arguments, call_key, copying_key, self._a, problem.device)
            self._adopt(plan)
        finally:
            plan_cache.let_go(plan)
        # the plan's precision is plan()'s: an autocast region around execute() must not recast its products, nor
        # a float32 precision setting lowered since make the framework's own matmul compute less precisely
        eligible = {problem.a.dtype, problem.b.dtype} <= AUTOCAST_DTYPES
        ad = adapter_for(self._a)
        self._as_planned = None
        if eligible and ad is not None:
            ct = problem.options.compute_type
            float32 = None  # a plan computing with the framework's own matmul reads its settings when it runs
            if problem.result_dtype == "float32" and getattr(plan, "reads_framework_precision", False):
                float32 = ct.name if ct is not None else "COMPUTE_32F"
            self._as_planned = ad.as_planned(problem.device, float32)
        self._convention = prep.convention
        self._problem, self._selection, self._strategy = problem, sel, prep.strategy
        self._epilog, self._inputs, self._infos = epilog, inputs, prep.infos
        self._result_dtype = problem.result_dtype if problem.quantization is None else "float32"
        self._bound = None
        return self

    def autotune(self, iterations: int = 3, *, stream: Stream = None) -> dict[str, float]:
        """Time each strategy the executor offers (and each plan's own knobs) on the actual operands and
        keep the fastest. A strategy whose result disagrees with the plainest one's beyond rounding is left
        out first, with a WARNING (see ``nvdispatch._matmul_agreement``; ``explain_matmul`` names it).
        Returns ``{strategy: seconds}`` per call (of the strategies kept): ``iterations`` samples of each, taken
        in turns, their median (on the CPU the fastest, since other load only adds time). The choice is
        recorded for ``plan_cache.save()``, and stateless calls of the problem take it from their next call.

        Interrupted (``KeyboardInterrupt``) or failing part-way, it leaves this object and every cached plan
        as they were."""
        with self._lock:
            self._check_planned("autotune")
            check_stream(stream, self._a)
            if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 1:
                raise InvalidArgumentError("iterations", "an int >= 1", repr(iterations))
            stream = stream if stream is not None else self._stream
            ex, problem = self._selection.executor, self._problem
            operands = self._operands()
            held = self._hold.plan
            if isinstance(held, AutocastPlan):  # the plans below take the operands as the region casts them
                operands = held.prepare_operands(operands, stream)
            plans: dict[str, Any] = {}  # strategy -> its plan, pinned until the choice is adopted
            proposals: dict[str, Any] = {}  # strategy -> its plan's proposed tuning, committed at the end
            hold = None
            try:
                for strategy in strategies_of(ex, "matmul", problem):
                    plans[strategy] = acquire_plan(ex, "matmul", problem, strategy)
                    proposal = _tune_plan(plans[strategy], problem, operands, iterations, stream)
                    if proposal is not None:
                        proposals[strategy] = proposal
                trials = {s: proposals[s].plan if s in proposals else plan for s, plan in plans.items()}
                results: dict[str, Any] = {}  # samples of the strategies' results, from their timed warm-ups
                sample = result_sampler(problem, stream)
                timings = _time_in_turns(trials, problem, operands, iterations, stream, results, sample)
                kept, rejected = agreeing(trials, problem, operands, stream, samples=results)
                timings = {s: t for s, t in timings.items() if s in kept}
                chosen = min(timings, key=timings.get)
                get = getattr(trials[chosen], "tuning", None)  # (the proposal's copy: as the plan will be)
                record = {"strategy": chosen, "plan": get() if callable(get) else None}
                if rejected:
                    record["rejected"] = {s: r.reason() for s, r in rejected.items()}
                key = choice_key(ex, "matmul", problem)
                if problem.autocast is None:
                    hold = plan_cache.hold(plans[chosen])
                else:
                    auto = _acquire_autocast_plan(ex, problem, chosen, self._a, None)
                    hold = plan_cache.hold(auto)
                    plan_cache.let_go(auto)
            except BaseException:
                if hold is not None:
                    hold.close()
                raise
            finally:
                for plan in plans.values():
                    plan_cache.let_go(plan)
            # the commit: every change at the end, recording the choice last; interrupted before that, it is
            # all undone (after it, the autotune is done: only the interrupt goes on)
            old, old_strategy = self._hold, self._strategy
            try:
                _commit(proposals.values())
                for strategy, plan in plans.items():  # stateless calls that ran another plan choose again
                    if strategy != chosen:
                        plan_cache.forget_keys_but(plan, plan_key(ex, "matmul", problem, strategy))
                        auto_key = _autocast_key(ex, problem, strategy, self._a)
                        auto = None if auto_key is None else plan_cache.get(auto_key)
                        if auto is not None:
                            plan_cache.forget_keys_but(auto, auto_key)
                        _forget_copying_plans(ex, problem, strategy)
                self._hold, self._strategy = hold, chosen
                plan_cache.record_tuning(key, record, STRATEGY_CHOICE)
            except BaseException:
                if plan_cache.tuning_for(key) is not record:
                    self._hold, self._strategy = old, old_strategy
                    _undo(proposals.values())
                    hold.close()
                raise
            old.close()
            return timings

    def execute(self, *, stream: Stream = None) -> Array:  # (result, aux) for an epilog with outputs
        """Run the planned matmul on the current operands; returns as :func:`matmul` does (the operands'
        framework, on their device)."""
        with self._lock:
            if self._freed or self._hold is None:  # (the checks' own calls only where one refuses)
                self._check_planned("execute")
            plan = self._hold.plan
            plan_cache.pin(plan)  # a concurrent free() or re-plan must not release it while it runs
            try:
                bound = self._bound
                if bound is None or bound.plan is not plan or bound.stale:
                    bound = self._bound = self._bind(plan)
                if bound.grads:  # an operand requires grad
                    refuse_recorded_call(self._problem, bound.arrays)
                if stream is not None:
                    check_stream(stream, self._a)
            except BaseException:
                plan_cache.let_go(plan)
                raise
            stream = stream if stream is not None else self._stream
            outside = self._as_planned
        if outside is None:
            return run(plan, bound.operands, stream, bound.direct if stream is None else None, bound.wrap)
        return outside(run, plan, bound.operands, stream, bound.direct if stream is None else None, bound.wrap)

    def _bind(self, plan) -> _Bound:
        """What every execute of ``plan`` on the current operands passes (see :class:`_Bound`)."""
        stale = self._stale()
        views = self._views(now=stale)
        operands = self._operands(views)
        a, b, _, inputs = views
        direct = getattr(plan, "direct", None)
        args = None
        if direct is not None and not self._selection.coerce and self._c is None and self._scales is None:
            if self._alpha.__class__ in SCALARS and self._alpha == 1:
                args = (a, b, *inputs.values())
        arrays = {"a": self._a, "b": self._b, "c": self._c, **self._inputs}
        grads = any(getattr(x, "requires_grad", False) is True for x in arrays.values())
        ad = adapter_for(self._a)
        wrap = (ad, self._a) if ad is not None and ad.wraps and not self._selection.coerce else None
        return _Bound(plan, operands, args, grads, arrays, wrap, stale)

    def reset_operands(
        self,
        a: Array | None = None,
        b: Array | None = None,
        c: Array | None = None,
        *,
        alpha: Scalar | None = None,
        beta: Scalar | None = None,
        epilog_inputs: Mapping[str, Array] | None = None,
        quantization_scales: MatmulQuantizationScales | Mapping[str, Any] | None = None,
    ) -> None:
        """Swap in new operands of the same framework, device, dtypes and shapes, and/or new ``alpha``/``beta``
        and (FP8) ``quantization_scales`` (replacing all scales given at construction).

        Operands with other strides are fine: the plan is then looked up again in the cache, on the executor
        the object was planned with (see the class notes). The checks are those of construction; nothing is
        changed when one fails.
        """
        a, b, c = _as_array("a", a), _as_array("b", b), _as_array("c", c)
        epilog_inputs = _as_inputs(epilog_inputs)
        with self._lock:
            self._check_alive("reset operands")
            if quantization_scales is not None:
                if self._problem is not None:
                    p = self._problem
                    infos = self._infos
                    fw, dev = p.framework, p.device
                    names = tuple(self._inputs)
                    build_fp8_problem(fw, dev, infos, p.epilog, p.options, 1, None, names, quantization_scales)
                else:
                    infos = {k: v for k, v in self._infos.items() if k in ("a", "b", "c")}
                    fw, dev = placement(infos)
                    build_fp8_problem(fw, dev, infos, spec_of(None), self._options, 1, None, (), quantization_scales)
            new_inputs = _check_epilog_inputs(epilog_inputs)
            replaced = {k: v for k, v in {"a": a, "b": b, "c": c, **new_inputs}.items() if v is not None}
            infos = dict(self._infos)
            restride = False
            for name, arr in replaced.items():
                arg = name if name in ("a", "b", "c") else f"epilog_inputs[{name!r}]"
                old = self._infos.get(name)
                if old is None:
                    raise EpilogInputError(arg, "an operand the Matmul was created or planned with", f"a new {name!r}")
                info = detect(arg, arr)
                if (info.framework, info.device) != (old.framework, old.device):
                    raise MixedOperandsError(
                        arg,
                        f"a {old.framework} array on {old.device} (as planned)",
                        f"{info.framework} on {info.device}",
                    )
                if info.dtype != old.dtype:
                    raise UnsupportedDtypeError(arg, f"dtype {old.dtype} (as planned)", info.dtype)
                if tuple(info.shape) != tuple(old.shape):
                    raise ShapeMismatchError(arg, f"shape {old.shape} (as planned)", str(tuple(info.shape)))
                restride |= info.strides != old.strides
                infos[name] = info
            if alpha is not None:
                check_scalar("alpha", alpha, self._result_dtype)
            if beta is not None:
                check_scalar("beta", beta, self._result_dtype)
                if self._c is None and scalar_value(beta) != 0:
                    raise InvalidArgumentError("beta", "0 or None when the Matmul has no c", repr(beta))
            saved = (self._a, self._b, self._c, self._alpha, self._beta, dict(self._inputs), self._infos, self._scales)
            self._bound = None
            self._a = a if a is not None else self._a
            self._b = b if b is not None else self._b
            self._c = c if c is not None else self._c
            self._alpha = alpha if alpha is not None else self._alpha
            self._beta = beta if beta is not None else self._beta
            self._inputs.update(new_inputs)
            self._infos = infos
            if quantization_scales is not None:
                self._scales = quantization_scales
                restride |= self._hold is not None  # a scale that moved between host and device needs another plan
            if self._hold is not None and restride:
                try:
                    self._plan_with(
                        self._epilog,
                        self._inputs,
                        {"strategy": self._strategy},
                        self._selection,
                        convention=self._convention,
                    )
                except BaseException:
                    self._a, self._b, self._c, self._alpha, self._beta, self._inputs, self._infos, self._scales = saved
                    raise

    def free(self) -> None:
        """Let go of the plan and drop operand references. Using the object afterwards raises
        ``PlanStateError``; an ``execute`` running in another thread finishes normally."""
        with self._lock:
            self._a = self._b = self._c = None
            self._inputs = {}
            self._bound = None
            hold, self._hold = self._hold, None
            self._problem = self._selection = None
            self._freed = True
        if hold is not None:
            hold.close()

    def __enter__(self) -> Matmul:
        return self

    def __exit__(self, *exc: object) -> bool:
        self.free()
        return False

    def explain(self) -> Explanation:
        """What :meth:`execute` runs: the executor, strategy and steps of the plan held, and the compute type its
        ``plan()`` chose and what chose it (the caller's ``compute_type``, a framework's precision convention in
        force at ``plan()``, the dtype), which execute keeps until ``plan()`` is called again, whatever autocast
        region or precision setting is active when it runs.

        Examples
        --------
        >>> import numpy as np, nvdispatch
        >>> mm = nvdispatch.Matmul(np.ones((4, 3), np.float32), np.ones((3, 2), np.float32)).plan(epilog="RELU")
        >>> e = mm.explain()
        >>> e.executor, e.precision
        ('numpy', 'compute type COMPUTE_32F: the float32 default (no precision convention applies); kept from plan()')
        """
        with self._lock:
            self._check_planned("explain")
            problem, sel, strategy = self._problem, self._selection, self._strategy
            steps = tuple(self._hold.plan.steps)
        note = getattr(problem, "precision_note", None)
        return Explanation(
            "matmul",
            sel.executor.name,
            strategy,
            steps,
            tuple(sel.declined),
            strategies_of(sel.executor, "matmul", problem),
            True,
            problem,
            None if note is None else f"{note}; kept from plan()",
            None,
        )

    def __repr__(self) -> str:
        state = "freed" if self._freed else ("planned" if self._hold else "not planned")
        return f"<nvdispatch.Matmul {state} executor={self.executor} strategy={self._strategy}>"


def _device_sync(problem):
    """A callable waiting for the problem's GPU to finish its work (a no-op on the CPU)."""
    if problem.device.kind != "cuda":
        return lambda: None
    from ._cuda import runtime

    rt = runtime.cudart()
    return lambda: runtime.check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")


def _tune_plan(plan, problem, operands, iterations: int, stream):
    """Tune ``plan``'s own knobs, if it has any: a plan that proposes (``propose_tuning``) returns a proposal
    the caller commits at the end (its ``plan`` a tuned private copy to time meanwhile); one that only has
    ``autotune`` applies its choice itself (None returned)."""
    propose = getattr(plan, "propose_tuning", None)
    tune = propose if callable(propose) else getattr(plan, "autotune", None)
    if not callable(tune):
        return None
    if problem.device.kind == "cpu":
        let_workers_sleep()
    got = tune(operands, iterations, stream) if _takes_stream(tune) else tune(operands, iterations)
    return got if callable(propose) else None


def _commit(proposals) -> None:
    """Commit every proposal, or (interrupted or failing part-way) none: those made are undone."""
    done = []
    try:
        for proposal in proposals:
            done.append(proposal)  # (first: undoing one not yet committed changes nothing)
            proposal.commit()
    except BaseException:
        _undo(done)
        raise


def _undo(proposals) -> None:
    for proposal in reversed(list(proposals)):
        proposal.undo()


def _time_in_turns(
    plans: dict[str, Any], problem, operands, iterations: int, stream, results: dict | None = None, sample=None
) -> dict[str, float]:
    """Seconds per call of each plan on ``operands``: ``iterations`` samples of each, taken in turns (one of
    every plan per round), so that load or clocks changing meanwhile weigh on all alike; on the CPU the fastest
    sample (other load only ever adds time, and a 2-core box has plenty), elsewhere the median. A plan's own
    ``time`` takes its sample (CUDA events); else one run after a warm one, timed to completion. With
    ``results``, ``sample(result)`` of each plan's first warm run is kept there (for the agreement check)."""
    cpu = problem.device.kind == "cpu"
    sync = _device_sync(problem)
    samples: dict[str, list[float]] = {name: [] for name in plans}
    for _ in range(iterations):
        for name, plan in plans.items():
            if cpu:  # on a 2-core box, the strategy timed after another's BLAS workers would lose half its cores
                let_workers_sleep()
            timer = getattr(plan, "time", None)
            if callable(timer):
                samples[name].append(float(timer(operands, 1, stream)))
                continue
            got = plan.execute(operands, stream)  # warm: caches, BLAS workers, allocator
            sync()
            if results is not None and name not in results and (kept := sample(got)) is not None:
                results[name] = kept
            del got
            t0 = time.perf_counter()
            plan.execute(operands, stream)
            sync()  # GPU work is asynchronous: time it to completion
            samples[name].append(time.perf_counter() - t0)
    return {name: float(min(v) if cpu else np.median(v)) for name, v in samples.items()}


def _takes_stream(fn) -> bool:
    import inspect

    try:
        return len(inspect.signature(fn).parameters) >= 3
    except (TypeError, ValueError):
        return False
