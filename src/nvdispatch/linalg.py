"""``matmul`` and the stateful ``Matmul``: ``epilog(alpha * a @ b + beta * c)`` on any executor."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _backends
from ._autocast_plan import AutocastPlan
from ._backends import _state
from ._compiled import hotpath
from ._detect import detect
from ._dispatch import (
    Explanation,
    _log_levels,
    acquire_plan,
    adapter_for,
    autocast_operands,
    choice_key,
    choose_strategy,
    coerce_operands,
    debug_enabled,
    detect_all,
    explain_selected,
    keep_or_select,
    log_hit,
    placement,
    plan_key,
    precision_convention,
    refuse_recorded_call,
    signature_function,
    signature_of,
    store,
    strategies_of,
    wrap_result,
)
from ._dispatch import call_key_memo_by_class as _memos
from ._dispatch import precision_key_by_class as _precision_keys
from ._dispatch import signature_by_class as _signatures
from ._epilog import INPUTS, Epilog, spec_of
from ._execute import raise_if_out_of_memory, run
from ._fp8 import _SCALE_NAMES, MatmulQuantizationScales, build_fp8_problem, scale_values, wants_fp8
from ._matmul_problem import (
    ComputeType,
    MatmulOptions,
    MatmulPlanPreferences,
    as_options,
    as_preferences,
    build_problem,
    check_scalar,
    dict_form_key,
    scalar_always_valid,
    scalar_key,
    scalar_value,
)
from ._plan_cache import plan_cache
from ._precision import AUTOCAST_DTYPES
from ._traced import traced_handler
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
_let_go = plan_cache.let_go  # and its last

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
    convention=_READ_NOW,
    stream=None,
):
    """Validate a call, choose its executor and strategy: (problem, selection, strategy, operand infos), the
    infos of the operands as the problem's plan takes them (cast, where an autocast region applies).

    ``selection``: keep that executor (a stateful object's) unless it declines the problem. ``convention``: the
    precision convention to follow (a stateful object's, from its ``plan()``), by default the framework's now;
    it is not read where ``options`` give a compute type. ``stream``: where the operands an autocast region casts
    are cast (the call's)."""
    spec = spec_of(epilog)
    inputs = _check_epilog_inputs(epilog_inputs)
    opts = as_options(options)
    prefs = as_preferences(preferences)
    _check_required(a, b)
    infos = detect_all({"a": a, "b": b, "c": c, **inputs})
    framework, device = placement(infos)
    if wants_fp8(infos, opts, scales):
        problem = build_fp8_problem(framework, device, infos, spec, opts, alpha, beta, tuple(inputs), scales)
    else:
        if opts.compute_type is not None:
            convention = None
        elif convention is _READ_NOW:
            convention = precision_convention(a, device)
        infos, autocast = autocast_operands(infos, convention, a, stream)
        problem = build_problem(
            framework, device, infos, spec, opts, alpha, beta, tuple(inputs), convention, autocast
        )
    plan_prefs = prefs.for_plan()
    if plan_prefs is not None:  # limit / max_workspace_bytes shape the plan: part of its key
        problem = dataclasses.replace(problem, preferences=plan_prefs)
    sel = keep_or_select(selection, "matmul", problem)
    return problem, sel, choose_strategy(sel.executor, "matmul", problem, prefs.strategy), infos


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

    Parameters
    ----------
    a, b : array
        NumPy, CuPy or Torch arrays, or any ``__cuda_array_interface__`` / DLPack object, all of one
        framework and device. PEP 465 semantics: 1-D operands are promoted (and the added dimension
        removed from the result); leading batch dimensions broadcast.
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
        operands' framework's current stream. Ignored on the CPU.
    quantization_scales : dict or MatmulQuantizationScales, optional
        FP8 operands (``float8_e4m3fn``/``float8_e5m2``): per-tensor scales ``{"a", "b", "c", "d"}``, Python
        numbers or one-element float32 device arrays; the result is
        ``scale_d * epilog(alpha * scale_a * scale_b * a @ b + beta * scale_c * c)``, saturated and rounded to
        an FP8 ``result_type``. cuBLASLt's FP8 kernels on compute capability 8.9+, Torch's reference path
        elsewhere; ``explain()`` says which.

    Returns
    -------
    array or (array, dict)
        The result in the operands' framework and device; with epilogs that have auxiliary outputs
        (``*_AUX``, ``*_BGRAD``, ``BGRADA``, ``BGRADB``) or ``result_amax`` a tuple ``(result, aux)``.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> x = np.ones((4, 3), np.float32); w = np.full((3, 2), -1.0, np.float32)
    >>> bias = np.array([1.0, 5.0], np.float32)
    >>> nvdispatch.matmul(x, w, epilog=nvdispatch.Epilog.RELU_BIAS, epilog_inputs={"bias": bias})[0]
    array([0., 2.], dtype=float32)
    """
    return _front(a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, stream, quantization_scales)


def _route(
    a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, stream, quantization_scales, memo_checked=False
):
    """The route of a ``matmul`` call: its call key, the plan cache (the call-key memo first, for a repeated
    call of the forms it holds), else the full path (:func:`_plan_and_run`). ``memo_checked``: the compiled
    front (``_front``) tried the form's remembered handles already and none served the call."""
    # The call key (see _dispatch), built inline for the common call: a function call costs as much.
    cls = a.__class__
    sig = _signatures.get(cls, signature_of)
    if sig is signature_of:
        sig = signature_of(cls)
    form = learn = bias = plan = key = None
    pinned = True  # let go of the plan after the call (a no-op for a plan the cache does not pin)
    try:
        # the framework's precision settings (TF32, autocast...: nvdispatch._precision), part of every key
        precision = _precision_keys.get(cls)
        if precision is not None:
            precision = precision()
        if sig is None or alpha.__class__ not in _SCALARS:
            pass
        elif (
            c is not None
            or beta is not None
            or options is not None
            or preferences is not None
            or quantization_scales is not None
        ):
            key = _call_key(
                cls,
                sig,
                a,
                b,
                c,
                alpha,
                beta,
                epilog,
                epilog_inputs,
                options,
                preferences,
                quantization_scales,
                precision,
            )
        elif epilog_inputs is None:
            # the shortest keys, (form, signatures...), for the commonest calls: a plain product and a linear
            # layer (a bias alone); _call_key's keys have another shape, so no two kinds of call share a key
            if b.__class__ is cls:
                classes = cls
            elif _signatures.get(b.__class__) is sig:
                classes = (cls, b.__class__)
            else:
                classes = _classes_sharing(sig, a, b)
            if classes is None:
                key = _call_key(
                    cls, sig, a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, None, precision
                )
            else:
                form = (classes, epilog, scalar_key(alpha), _state.get().key, _backends._global.key, precision)
        elif epilog_inputs.__class__ is dict and len(epilog_inputs) == 1 and "bias" in epilog_inputs:
            bias = epilog_inputs["bias"]
            if b.__class__ is cls is bias.__class__:
                classes = cls
            elif _signatures.get(b.__class__) is sig is _signatures.get(bias.__class__):
                classes = (cls, b.__class__, bias.__class__)  # a Parameter beside tensors, say
            else:
                classes = _classes_sharing(sig, a, b, bias)
            if classes is None:
                key = _call_key(
                    cls, sig, a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, None, precision
                )
                bias = None
            else:
                form = (
                    classes, epilog, "bias", scalar_key(alpha), _state.get().key, _backends._global.key, precision
                )
        else:
            key = _call_key(
                cls, sig, a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, None, precision
            )
        if form is not None:
            # where the class has a guard, a repeated call's plan handle is remembered behind it (_call_key_memo)
            memo = _memos.get(cls)
            if memo is not None:
                for check, entry, epoch in () if memo_checked else memo.handles.get(form, ()):
                    if check(a, b) if bias is None else check(a, b, bias):
                        plan = _acquire_handle(entry, epoch)
                        break
                if plan is None:
                    learn = memo
                else:
                    pinned = not entry.pinless  # the cache does not pin it: letting go would do nothing
            if plan is None:
                key = (form, sig(a), sig(b)) if bias is None else (form, sig(a), sig(b), sig(bias))
                plan = _acquire(key)  # pinned until this call returns (if it needs release)
        elif key is not None:
            plan = _acquire(key)
    except TypeError:  # an unhashable argument: the full path validates (and reports) it
        key = plan = None
    if plan is None:
        return _plan_and_run(
            key, a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, stream, quantization_scales
        )
    if learn is not None:  # a repeated call, found by its signatures
        learn.remember(form, (a, b) if bias is None else (a, b, bias), _handle(key))
    try:
        if _log_levels.get(10) is not False and debug_enabled():
            log_hit("matmul", plan)
        if stream is None and alpha == 1 and c is None and quantization_scales is None:
            direct = getattr(plan, "direct", None)
            if direct is not None:
                if epilog_inputs is None:
                    return direct(a, b)
                return direct(a, b, bias) if form is not None else direct(a, b, *epilog_inputs.values())
        return plan.execute(_operands(a, b, c, alpha, beta, epilog_inputs, quantization_scales), stream)
    except Exception as exc:
        raise_if_out_of_memory(exc)
        raise
    finally:
        if pinned:
            _let_go(plan)


def _plan_and_run(key, a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, stream, scales):
    """The full path of a call: detect, validate, select, plan (and keep the plan under the call key when
    every call with that key validates and selects the same way), execute, wrap. A call on traced arrays
    (inside ``jax.jit``...) is handed to the integration that stages it (``nvdispatch._traced``)."""
    inputs = epilog_inputs.values() if epilog_inputs.__class__ is dict else ()
    staged = traced_handler("matmul", (a, b, c, *inputs))
    if staged is not None:
        return staged(
            a, b, c, alpha=alpha, beta=beta, epilog=epilog, epilog_inputs=epilog_inputs, options=options,
            preferences=preferences, stream=stream, quantization_scales=scales,
        )
    problem, sel, strategy, infos = _prepare(
        a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, scales, stream=stream
    )
    plan = acquire_plan(sel.executor, "matmul", problem, strategy)  # pinned until run() returns
    try:
        scalars_ok = scalar_always_valid(alpha, problem.result_dtype) and (
            beta is None or scalar_always_valid(beta, problem.result_dtype)
        )
        if not sel.coerce and scalars_ok and _scales_always_valid(problem):
            store(key, _autocast_plan(plan, problem, a))
        operands = _operands(a, b, c, alpha, beta, epilog_inputs, scales)
        operands.update((name, info.array) for name, info in infos.items())  # as executors take them
        operands = coerce_operands(sel, operands, _OPERAND_NAMES)
    except BaseException:
        plan_cache.let_go(plan)
        raise
    return wrap_result(run(plan, operands, stream), a)


def _autocast_plan(plan, problem, like):
    """What a call with ``problem`` runs: ``plan``, behind an :class:`AutocastPlan` casting the operands an autocast
    region cast (by ``like``'s adapter) where one did."""
    if not problem.autocast:
        return plan
    ad = adapter_for(like)
    on_stream = None
    if problem.device.kind == "cuda":
        index = problem.device.index
        on_stream = lambda stream: ad.native_stream_context(stream, index)
    return AutocastPlan(plan, plan_cache.hold(plan), problem.autocast, problem.result_dtype, ad.cast, on_stream)


def _compiled_front():
    """:func:`_route` behind its hit compiled (``_hotpath.c``: a repeated call of the forms the route keys
    inline, served by the call-key memo or the call key), where the extension is built and
    ``NVDISPATCH_PURE_PYTHON`` is not set; else :func:`_route` itself. The compiled hit reads the route's own
    objects (handed over here) and leaves every other call to the route."""
    compiled = hotpath()
    if compiled is None:  # the route is the same, in Python
        return _route
    return compiled.make_matmul_front(
        _route,
        _signatures,
        _memos,
        _precision_keys,
        _state.get,
        _backends,
        _acquire,
        _acquire_handle,
        _let_go,
        _log_levels,
        debug_enabled,
        log_hit,
        raise_if_out_of_memory,
        _operands,
    )


_front = _compiled_front()


def _concrete_subclasses(cls: type) -> set[type]:
    subs = set(cls.__subclasses__())
    return {c for c in subs if not c.__subclasses__()} | {d for c in subs for d in _concrete_subclasses(c)}


#: scalar classes a call key may hold (it holds the class, not the value): Python's and NumPy's numbers
_SCALARS = frozenset({int, float, complex} | {c for c in _concrete_subclasses(np.number) if c is not np.timedelta64})


def _call_key(cls, sig, a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, scales, precision):
    """The call key of a matmul with ``c``/``beta``, epilog inputs, operands of more than one class or FP8
    scales (``matmul`` builds the plainest ones): the operands' adapter signatures, the scalars' classes, the
    epilog, options, preferences, scales, backend state and the framework's precision settings (``precision``);
    None when the call does not qualify (it takes the full path)."""
    if scales is not None:
        scales = _scales_key(cls, sig, scales)
        if scales is None:
            return None
    if c is None:
        if beta is not None:
            return None
        c_sig = None
    elif beta is not None and beta.__class__ not in _SCALARS:
        return None
    else:
        c_sig = (_operand_signature(cls, sig, c), scalar_key(beta))
    if epilog_inputs is None:
        inputs = None
    elif epilog_inputs.__class__ is dict:
        inputs = tuple((name, _operand_signature(cls, sig, value)) for name, value in epilog_inputs.items())
    else:
        return None
    if options.__class__ is dict:  # the documented dict form (unhashable values take the full path)
        options = dict_form_key(options)
    if preferences.__class__ is dict:
        preferences = dict_form_key(preferences)
    b_sig = sig(b) if b.__class__ is cls else _operand_signature(cls, sig, b)
    if b_sig is None or (c_sig is not None and c_sig[0] is None) or (inputs and any(s is None for _, s in inputs)):
        return None
    return (
        "matmul",
        cls,
        sig(a),
        b_sig,
        epilog,
        inputs,
        scalar_key(alpha),
        c_sig,
        options,
        preferences,
        scales,
        _state.get().key,
        _backends._global.key,
        precision,
    )


def _scales_key(cls, sig, scales):
    """FP8 scales' part of a call key: each given scale's name with a Python number's class (its value checked
    here as planning checks it: finite, non-zero) or an array's signature; None where the call must take the
    full path (an unknown form or name, a bad value: the full path reports it)."""
    if scales.__class__ is dict:
        items = scales.items()
    elif scales.__class__ is MatmulQuantizationScales:
        items = ((name, getattr(scales, name)) for name in _SCALE_NAMES)
    else:
        return None
    parts = []
    for name, value in items:
        if name not in _SCALE_NAMES:
            return None
        if value is None:
            continue
        if value.__class__ is float or value.__class__ is int:
            if value == 0 or not math.isfinite(value):
                return None
            parts.append((name, value.__class__))
        else:
            signature = _operand_signature(cls, sig, value)
            if signature is None:
                return None
            parts.append((name, signature))
    return tuple(sorted(parts))


def _scales_always_valid(problem) -> bool:
    """Whether every call whose key matches this problem's passes its scales' checks: not so for scale arrays in
    host memory (planning checks their values, which their signatures do not hold)."""
    fp8 = problem.quantization
    return fp8 is None or problem.device.kind != "cpu" or all(kind == "host" for _, kind in fp8.scales)


def _classes_sharing(sig, *arrays):
    """The classes of operands of more than one class whose signatures all come from ``sig`` (a Torch
    ``Parameter`` beside plain tensors), for the form of their call key; None when they do not share it."""
    classes = tuple(x.__class__ for x in arrays)
    return classes if all(signature_function(cls) is sig for cls in classes) else None


def _operand_signature(cls, sig, x):
    """``x``'s part of a call key whose first operand is of class ``cls`` (signature function ``sig``): its
    signature; for an operand of another class (a Torch ``Parameter`` beside plain tensors), that class and its
    own signature. None when its class has none (the call then takes the full path)."""
    other = x.__class__
    if other is cls:
        return sig(x)
    own = signature_function(other)
    return None if own is None else (other, own(x))


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
    """What ``matmul`` would do with these arguments, without running it."""
    problem, sel, strategy, _ = _prepare(
        a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, quantization_scales
    )
    return explain_selected("matmul", "matmul", problem, sel, strategy)


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
        self._options = as_options(options)
        # validate shapes and dtypes now, so mistakes surface at construction
        _check_required(a, b)
        infos = detect_all({"a": a, "b": b, "c": c})
        framework, device = placement(infos)
        if wants_fp8(infos, self._options, quantization_scales):
            spec, scales = spec_of(None), quantization_scales
            problem = build_fp8_problem(framework, device, infos, spec, self._options, alpha, beta, (), scales)
        else:
            problem = build_problem(framework, device, infos, spec_of(None), self._options, alpha, beta)
        self._scales = quantization_scales
        self._lock = threading.RLock()
        self._infos = infos
        # alpha/beta are float32 scalars of FP8 matmuls
        self._result_dtype = problem.result_dtype if problem.quantization is None else "float32"
        self._a, self._b, self._c = a, b, c
        self._alpha, self._beta = alpha, beta
        self._stream = stream
        self._epilog = None
        #: the precision convention plan() followed (re-plans keep it); None: none, or not planned yet
        self._convention = None
        self._outside_autocast = None  # runs execute's plan outside autocast regions (see _plan_with)
        self._inputs: dict[str, Any] = {}
        self._problem = None
        self._selection = None
        self._hold = None  # our hold on the plan (PlanHold)
        self._bound = None  # (plan, operands, direct-call arguments, requires grad) for execute; None after a change
        self._strategy = None
        self._freed = False

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

    def _operands(self):
        ops = _operands(self._a, self._b, self._c, self._alpha, self._beta, self._inputs, self._scales)
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
            self._check_alive("plan")
            convention = self._convention
            if self._options.compute_type is None:  # the framework's precision settings now
                convention = precision_convention(self._a, placement(self._infos)[1])
            self._plan_with(epilog, epilog_inputs, preferences, None, convention)
            self._convention = convention
            return self

    def _plan_with(self, epilog, epilog_inputs, preferences, selection, convention):
        self._check_alive("plan")
        inputs = dict(_check_epilog_inputs(epilog_inputs))
        problem, sel, strategy, infos = _prepare(
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
            convention,
        )
        plan = acquire_plan(sel.executor, "matmul", problem, strategy)
        try:
            self._adopt(_autocast_plan(plan, problem, self._a))
        finally:
            plan_cache.let_go(plan)
        if problem.autocast:  # the operands as given, not as cast (reset_operands compares new ones with them)
            given = {"a": self._a, "b": self._b, "c": self._c, **inputs}
            infos = {**infos, **detect_all({name: given[name] for name in problem.autocast})}
        # the plan's precision is plan()'s: an autocast region around execute() must not recast its products
        eligible = {problem.a.dtype, problem.b.dtype} <= AUTOCAST_DTYPES
        self._outside_autocast = adapter_for(self._a).outside_autocast(problem.device) if eligible else None
        self._problem, self._selection, self._strategy = problem, sel, strategy
        self._epilog, self._inputs, self._infos = epilog, inputs, infos
        return self

    def autotune(self, iterations: int = 3, *, stream: Stream = None) -> dict[str, float]:
        """Time each strategy the executor offers (and each plan's own knobs) on the actual operands and
        keep the fastest. Returns ``{strategy: seconds}`` per call: ``iterations`` samples of each strategy,
        taken in turns, their median (on the CPU the fastest, since other load only adds time). The choice is
        recorded for ``plan_cache.save()``, and stateless calls of the problem take it from their next call.

        Interrupted (``KeyboardInterrupt``) or failing part-way, it leaves this object and every cached plan
        as they were."""
        with self._lock:
            self._check_planned("autotune")
            if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 1:
                raise InvalidArgumentError("iterations", "an int >= 1", repr(iterations))
            stream = stream if stream is not None else self._stream
            ex, problem = self._selection.executor, self._problem
            held = self._hold.plan
            operands = self._operands()
            if isinstance(held, AutocastPlan):  # the plans below take the operands as the region casts them
                operands = held.cast_operands(operands, stream)
            plans: dict[str, Any] = {}  # strategy -> its plan, pinned until the choice is adopted
            try:
                for strategy in strategies_of(ex, "matmul", problem):
                    plans[strategy] = acquire_plan(ex, "matmul", problem, strategy)
                    _tune_plan(plans[strategy], problem, operands, iterations, stream)
                timings = _time_in_turns(plans, problem, operands, iterations, stream)
                chosen = min(timings, key=timings.get)
                self._adopt(_autocast_plan(plans[chosen], problem, self._a))
            finally:
                for plan in plans.values():
                    plan_cache.let_go(plan)
            self._strategy = chosen
            get = getattr(plans[chosen], "tuning", None)
            plan_cache.record_tuning(
                choice_key(ex, "matmul", problem),
                {"strategy": chosen, "plan": get() if callable(get) else None},
                STRATEGY_CHOICE,
            )
            for strategy, plan in plans.items():  # stateless calls that ran another plan choose again
                if strategy != chosen:
                    plan_cache.forget_keys_but(plan, plan_key(ex, "matmul", problem, strategy))
            return timings

    def execute(self, *, stream: Stream = None) -> Array:  # (result, aux) for an epilog with outputs
        """Run the planned matmul on the current operands; returns as :func:`matmul` does."""
        with self._lock:
            self._check_planned("execute")
            plan = self._hold.plan
            plan_cache.pin(plan)  # a concurrent free() or re-plan must not release it while it runs
            try:
                bound = self._bound
                if bound is None or bound[0] is not plan:
                    bound = self._bound = self._bind(plan)
                if bound[3]:  # an operand requires grad
                    refuse_recorded_call(self._problem)
            except BaseException:
                plan_cache.let_go(plan)
                raise
            stream = stream if stream is not None else self._stream
            outside = self._outside_autocast
        if outside is None:
            return run(plan, bound[1], stream, bound[2] if stream is None else None)
        return outside(run, plan, bound[1], stream, bound[2] if stream is None else None)

    def _bind(self, plan) -> tuple[Any, dict[str, Any], tuple | None, bool]:
        """What every execute of ``plan`` on the current operands passes: the operands, and the arguments of
        the plan's direct call where the route would take it (as :func:`matmul` does); and whether an operand
        requires grad (a plan made without autograd must not run a call autograd records: its executor may
        drop the graph, or its direct call have no derivative)."""
        operands = self._operands()
        direct = getattr(plan, "direct", None)
        args = None
        if direct is not None and not self._selection.coerce and self._c is None and self._scales is None:
            if self._alpha.__class__ in _SCALARS and self._alpha == 1:
                args = (self._a, self._b, *self._inputs.values())
        grads = any(getattr(x, "requires_grad", False) is True for x in operands.values())
        return plan, operands, args, grads

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
                        self._epilog, self._inputs, {"strategy": self._strategy}, self._selection, self._convention
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


def _tune_plan(plan, problem, operands, iterations: int, stream) -> None:
    """Tune ``plan``'s own knobs, if it has any (its ``autotune``)."""
    tune = getattr(plan, "autotune", None)
    if callable(tune):
        if problem.device.kind == "cpu":
            let_workers_sleep()
        tune(operands, iterations, stream) if _takes_stream(tune) else tune(operands, iterations)


def _time_in_turns(plans: dict[str, Any], problem, operands, iterations: int, stream) -> dict[str, float]:
    """Seconds per call of each plan on ``operands``: ``iterations`` samples of each, taken in turns (one of
    every plan per round), so that load or clocks changing meanwhile weigh on all alike; on the CPU the fastest
    sample (other load only ever adds time, and a 2-core box has plenty), elsewhere the median. A plan's own
    ``time`` takes its sample (CUDA events); else one run after a warm one, timed to completion."""
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
            plan.execute(operands, stream)  # warm: caches, BLAS workers, allocator
            sync()
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
