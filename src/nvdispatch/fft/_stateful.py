"""The stateful :class:`FFT` (plan once, execute many times, swap operands) and its :class:`FFTOptions`."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .. import _fft_callbacks
from .._adapters import adapter_for
from .._copying_plan import keep_copying_plan
from .._detect import detect
from .._execute import run, run_direct
from .._fft_problem import FUNCS, NORMS, FFTProblem, build_fft_problem, resolve_axes
from .._plan_cache import plan_cache
from .._route import (
    acquire_plan,
    check_stream,
    choose_strategy,
    coerce_operands,
    keep_any_length,
    keep_or_select,
    placement,
    plan_key,
    refuse_recorded_call,
)
from .._strides import overlapping
from .._typing import Array, Axes, CallbackData, ElementCallback, Stream
from ..errors import InvalidArgumentError, PlanStateError, ShapeMismatchError, UnsupportedDtypeError, describe

__all__ = ["FFT", "FFTOptions", "run_stateless"]


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

    def __post_init__(self) -> None:
        for field, value in _checked(vars(self), "options.{}").items():
            object.__setattr__(self, field, value)


_FFT_TYPES = (None, "C2C", "R2C", "C2R")


def _checked(values: dict[str, Any], name: str) -> dict[str, Any]:
    """The option ``values`` validated by type and value, normalised (NumPy bools become bools, a None norm
    "backward"); errors name each field as ``name.format(field)``."""
    out = dict(values)
    fft_type = out.get("fft_type")
    if fft_type is not None and not (isinstance(fft_type, str) and fft_type in _FFT_TYPES):
        raise InvalidArgumentError(name.format("fft_type"), "None, 'C2C', 'R2C' or 'C2R'", repr(fft_type))
    if "inplace" in out:
        inplace = out["inplace"]
        if not isinstance(inplace, (bool, np.bool_)):
            raise InvalidArgumentError(name.format("inplace"), "a bool (True or False)", describe(inplace))
        out["inplace"] = bool(inplace)
    parity = out.get("last_axis_parity", "even")
    if not (isinstance(parity, str) and parity in ("even", "odd")):
        raise InvalidArgumentError(name.format("last_axis_parity"), "'even' or 'odd'", repr(parity))
    if "norm" in out:
        norm = out["norm"]
        if norm is not None and not (isinstance(norm, str) and norm in NORMS):
            raise InvalidArgumentError(name.format("norm"), "'backward', 'ortho', 'forward' or None", repr(norm))
        out["norm"] = "backward" if norm is None else norm
    return out


_DEFAULT_OPTIONS = FFTOptions()  # frozen: every stateless transform's object shares it
_FFT_TYPE_OF_KIND = {"c2c": "C2C", "r2c": "R2C", "c2r": "C2R"}


def _as_fft_options(options) -> FFTOptions:
    if options is None:
        return FFTOptions()
    if isinstance(options, FFTOptions):
        return FFTOptions(**vars(options))  # validated again: an instance may have been altered after __init__
    if isinstance(options, dict):
        unknown = set(options) - {"fft_type", "inplace", "last_axis_parity", "norm"}
        if unknown:
            raise InvalidArgumentError(
                "options", "keys among fft_type, inplace, last_axis_parity, norm", f"{sorted(unknown, key=repr)}"
            )
        return FFTOptions(**_checked(options, 'options["{}"]'))
    raise InvalidArgumentError("options", "an FFTOptions, a dict or None", describe(options))


_DIRECTIONS = {"forward": "forward", "inverse": "inverse", -1: "forward", 1: "inverse"}


def _direction_key(direction) -> str | int | None:
    """``direction`` as a key of ``_DIRECTIONS``: a string in any case, or an int (not a bool, not a float)."""
    if isinstance(direction, str):
        return direction.lower()
    if isinstance(direction, (int, np.integer)) and not isinstance(direction, (bool, np.bool_)):
        return int(direction)
    return None


def _as_axes(axes) -> tuple | None:
    """``axes`` as a tuple (its items are checked against the operand by the problem), or None."""
    if axes is None:
        return None
    if isinstance(axes, (str, bytes)) or not hasattr(axes, "__iter__"):
        raise InvalidArgumentError("axes", "None or a sequence of ints", describe(axes))
    return tuple(axes)


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

    *Autocast.* The object's precision is its operand's, fixed at ``plan()`` as ``Matmul`` keeps its plan's: it
    takes float32, float64, complex64 and complex128 operands only, which no ``torch.autocast`` region changes
    (Torch's FFTs compute float16/bfloat16 input in float32 in a CPU region, and leave every other dtype as it is),
    so an object planned outside a region executes the same inside one, and one planned inside executes the same
    outside. Half-precision operands are refused inside a region too: cast them first (as the region would), or
    call the stateless transforms, which follow the region.

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
        self._setup(x, _as_fft_options(options), stream, _as_axes(axes))
        self._info = detect("x", x)
        self._fft_type = self._infer_type(self._info.dtype)
        # validate now so mistakes surface at construction
        self._build(self._info)
        self._check_target(x, self._info)
        check_stream(stream, x)

    def _setup(self, x, options: FFTOptions, stream, axes) -> None:
        self._options = options
        self._stream = stream
        self._freed = False
        self._callbacks: dict[str, Any] = {}  # prolog/epilog/prolog_data/epilog_data given to plan()
        self._cb_data: dict[str, tuple] = {}
        self._lock = threading.RLock()
        self._holds: dict[str, Any] = {}  # direction -> PlanHold
        self._problems: dict[str, FFTProblem] = {}
        self._selections: dict[str, Any] = {}
        self._axes = axes
        self._x = x
        self._info = None
        self._call = None  # a stateless transform's (func, n, axis, s, axes, norm): its one problem
        self._ready = None  # (operand, plan, pinned?) of the default direction's direct call, see _refresh_ready

    @classmethod
    def _for_call(cls, func: str, x, n, axis, s, axes, norm, callbacks=None) -> FFT:
        """The object a stateless transform (``nvdispatch.fft.<func>``) plans and executes with: the one
        direction of ``func``, its problem built from the call's own arguments (``n``/``s`` included)."""
        if x is None:
            detect("x", x)  # the typed error naming the operand (plan() detects the others)
        self = cls.__new__(cls)
        self._setup(x, _DEFAULT_OPTIONS, None, None)
        self._call = (func, n, axis, s, axes, norm)
        self._fft_type = _FFT_TYPE_OF_KIND[FUNCS[func][0]]
        if callbacks is not None:
            prolog, epilog, prolog_data, epilog_data = callbacks
            self._callbacks = {"prolog": prolog, "epilog": epilog, "prolog_data": prolog_data,
                               "epilog_data": epilog_data}
        return self

    # -- helpers --------------------------------------------------------------------------------------------
    def _infer_type(self, dtype: str) -> str:
        t = self._options.fft_type
        real = dtype in ("float32", "float64")
        if t is None and not real and dtype not in ("complex64", "complex128"):
            raise UnsupportedDtypeError(
                "x",
                "a floating operand (float32/float64: an R2C FFT; complex64/complex128: a C2C FFT)",
                dtype,
                "cast it first; the stateless nvdispatch.fft functions promote integer, boolean and half-precision "
                "input by its framework's rule (and a torch.autocast region's)",
            )
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

    def _build(self, info) -> dict[str, FFTProblem]:
        """direction -> the problem of this object's transform in that direction, for the operand ``info``
        describes."""
        framework, device = placement({"x": info})
        if self._call is not None:
            func, n, axis, s, axes, norm = self._call
            problem = build_fft_problem(func, info, framework, device, n, axis, s, axes, norm)
            return {problem.direction: problem}
        axes = self._axes if self._axes is not None else tuple(range(len(info.shape)))
        s = None
        if self._fft_type == "C2R":
            axes_r, _ = resolve_axes("irfftn", tuple(info.shape), axes=axes)
            m = info.shape[axes_r[-1]]
            last = 2 * (m - 1) + (1 if self._options.last_axis_parity == "odd" else 0)
            s = tuple([-1] * (len(axes_r) - 1) + [last])
        out = {}
        for direction, func in self._funcs().items():
            problem = build_fft_problem(func, info, framework, device, s=s, axes=axes, norm=self._options.norm)
            out[direction] = problem
        return out

    def _check_target(self, x, info) -> None:
        """An in-place transform needs an operand it may write: not read-only, no overlapping elements."""
        if self._options.inplace:
            why = _unwritable(x, info)
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

    def _plan_with(self, callbacks: dict[str, Any], selections: dict[str, Any], call_key=None, any_length_key=None):
        """Plan (and hold) each direction; ``call_key``: a stateless transform's key, to keep its plan under too
        (unless a coercing backend runs it: other calls with that key may not); ``any_length_key``: its any-length
        key, to keep the plan's any-length form under (``_route.keep_any_length``) on the same terms."""
        self._check_alive("plan")
        if self._x is None:
            raise PlanStateError("x", "an operand to plan for", "None", "call reset_operand(x) first")
        info = detect("x", self._x)  # as at this plan() (grad mode, say): the operand's detection read now
        self._check_target(self._x, info)
        with_callbacks = any(v is not None for v in callbacks.values())
        holds, problems, chosen, cb_data = {}, {}, {}, {}
        try:
            for direction, problem in self._build(info).items():
                op = "fft"
                if with_callbacks:
                    op = _fft_callbacks.OP
                    problem, cb_data = _fft_callbacks.attach(problem, **callbacks)
                sel = keep_or_select(selections.get(direction), op, problem)
                strategy = choose_strategy(sel.executor, op, problem)
                key = None if sel.coerce or with_callbacks else call_key
                # a plan made on a copy of a lazy view's values: the key finds it behind a CopyingPlan (the view's
                # next call must copy anew; the plan itself would read the view's memory)
                copied = key is not None and info.materialized
                plan = acquire_plan(sel.executor, op, problem, strategy, None if copied else key)
                if copied:
                    copying_key = ("copying", plan_key(sel.executor, op, problem, strategy))
                    keep_copying_plan(plan, ("x",), ("x",), key, copying_key, self._x, problem.device)
                elif key is not None and any_length_key is not None:
                    given = self._call[1] is not None or self._call[3] is not None  # n or s
                    keep_any_length(plan, sel, op, any_length_key, given)
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
        self._info, self._problems, self._selections = info, problems, chosen
        self._callbacks, self._cb_data = callbacks, cb_data
        self._refresh_ready()
        for hold in old.values():
            hold.close()
        return self

    def _refresh_ready(self) -> None:
        """What ``execute()`` with no arguments runs without its checks (``_ready``), where that is the plan's
        direct call on the operand as it is: no callbacks, ``inplace``, coercing backend, default stream or
        wrapped result, and a plan with a direct call; else None. Called under the lock whenever the operand,
        the plans or the holds change."""
        self._ready = None
        x, info = self._x, self._info
        if x is None or info is None or info.array is not x or self._stream is not None or self._cb_data:
            return
        if self._options.inplace or any(v is not None for v in self._callbacks.values()):
            return
        d = "inverse" if self._fft_type == "C2R" else "forward"
        hold, sel = self._holds.get(d), self._selections.get(d)
        if hold is None or sel is None or sel.coerce:
            return
        ad = adapter_for(x)
        if getattr(hold.plan, "direct", None) is None or (ad is not None and ad.wraps):
            return
        self._ready = (x, hold.plan, getattr(hold.plan, "needs_release", True) is not False)

    def execute(self, *, direction: Literal["forward", "inverse"] | None = None, stream: Stream = None) -> Array:
        """Run the transform; ``direction`` ``"forward"``/``"inverse"`` (C2C; R2C is forward, C2R inverse).

        Returns the result in the operand's framework (the operand itself when ``inplace``).
        """
        if direction is None and stream is None and self._ready is not None:
            with self._lock:
                ready = self._ready
                if ready is not None and getattr(ready[0], "requires_grad", False) is not True:
                    if ready[2]:
                        plan_cache.pin(ready[1])  # a concurrent free() or re-plan must not release it while it runs
                else:
                    ready = None  # autograd records the call: the checks below refuse it
            if ready is not None:
                x, plan, pinned = ready
                return run_direct(plan, (x,), pinned)
        with self._lock:
            self._check_alive("execute")
            if not self._holds:
                raise PlanStateError("self", "a planned FFT to execute", "one not planned yet", "call plan() first")
            if self._x is None:
                raise PlanStateError("x", "an operand to transform", "None", "call reset_operand(x) first")
            if direction is None:
                direction = "inverse" if self._fft_type == "C2R" else "forward"
            d = _DIRECTIONS.get(_direction_key(direction))
            if d is None or d not in self._holds:
                allowed = tuple(self._holds)
                raise InvalidArgumentError(
                    "direction", f"one of {allowed} for a {self._fft_type} FFT", repr(direction)
                )
            if getattr(self._x, "requires_grad", False) is True:
                refuse_recorded_call(self._problems[d], {"x": self._x})
            check_stream(stream, self._x)
            stream = stream if stream is not None else self._stream
            sel, x, cb_data = self._selections[d], self._x, self._cb_data
            operand = self._info.array  # as executors take it (a CPU DLPack object's NumPy view)
            # a copy of a lazy view's values made when the operand was detected: a stateful object's operand may
            # have changed since (a stateless call's, planned just now, has not)
            materialized = self._info.materialized
            stale = materialized and self._call is None
            plan = self._holds[d].plan
            plan_cache.pin(plan)  # a concurrent free() or re-plan must not release it while it runs
        try:
            if stale:  # the values as they are now
                operand = detect("x", x).array
            operands = coerce_operands(sel, {"x": operand}, ("x",))
            if cb_data:
                operands = _fft_callbacks.coerce_all(sel, {"x": operand, **cb_data})
        except BaseException:
            plan_cache.let_go(plan)
            raise
        if self._options.inplace and getattr(plan, "supports_out", False):
            operands["out"] = operand
            run(plan, operands, stream)
            if materialized:  # the result is in the copy: the operand (a lazy view) takes it as its values
                _copy_into(x, operand)
            return x
        ad = adapter_for(x)
        wrap = (ad, x) if ad is not None and ad.wraps and not sel.coerce and not self._options.inplace else None
        result = run(plan, operands, stream, None, wrap)
        if self._options.inplace:
            _copy_into(x if materialized else operand, result)
            return x
        return result

    def reset_operand(self, x: Array | None = None, *, stream: Stream = None) -> None:
        """Swap in a new operand of the same framework, device, dtype and shape (``None`` drops the
        reference). Strides may change: plans are then looked up again in the cache, on the executor the
        object was planned with (see the class notes)."""
        with self._lock:
            self._check_alive("reset operand")
            if x is None:
                self._x = self._ready = None
                return
            info = detect("x", x)
            old = self._info
            if (info.framework, info.device.kind) != (old.framework, old.device.kind):
                raise ShapeMismatchError(
                    "x", f"a {old.framework} array on {old.device}", f"{info.framework} on {info.device}"
                )
            if info.dtype != old.dtype:
                raise UnsupportedDtypeError("x", f"dtype {old.dtype} (as planned)", info.dtype)
            if tuple(info.shape) != tuple(old.shape):
                raise ShapeMismatchError("x", f"shape {tuple(old.shape)} (as planned)", str(tuple(info.shape)))
            self._check_target(x, info)
            saved = (self._x, self._info)
            self._x, self._info = x, info
            if self._holds and info.strides != old.strides:
                try:
                    self._plan_with(self._callbacks, dict(self._selections))
                except BaseException:
                    self._x, self._info = saved
                    raise
            self._refresh_ready()

    def free(self) -> None:
        """Let go of the plans and drop the operand reference. Using the object afterwards raises
        ``PlanStateError``; an ``execute`` running in another thread finishes normally."""
        with self._lock:
            self._x = None
            holds, self._holds = self._holds, {}
            self._selections = {}
            self._problems = {}
            self._callbacks, self._cb_data = {}, {}
            self._ready = None
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


def run_stateless(func: str, x, n, axis, s, axes, norm, callbacks, call_key, stream, any_length_key=None):
    """A stateless transform (``nvdispatch.fft.<func>``) whose plan its call key did not find: an :class:`FFT` of
    the call's one direction plans it (keeping the plan under ``call_key`` too, where given, and its any-length
    form under ``any_length_key``), executes once and lets go. ``callbacks``: ``(prolog, epilog, prolog_data,
    epilog_data)`` or None."""
    f = FFT._for_call(func, x, n, axis, s, axes, norm, callbacks)
    try:
        f._plan_with(f._callbacks, {}, call_key=call_key, any_length_key=any_length_key)
        return f.execute(direction=FUNCS[func][1], stream=stream)
    finally:
        f.free()


def _unwritable(x, info) -> str:
    """Why an in-place transform may not write into operand ``x`` ('' when it may): its adapter's answer (and
    that of the view executors write into), then overlapping elements of that view. (Where the view is a copy of
    a lazy view, ``info.materialized``, the result is copied back into ``x``: ``x``'s adapter answers for ``x``'s own
    elements, e.g. a Torch conjugate view of an expanded tensor.)"""
    for arr in (x, info.array):
        ad = adapter_for(arr)
        why = "" if ad is None else ad.unwritable(arr)
        if why:
            return why
    if info.strides is not None and overlapping(info.shape, info.strides):
        return f"an array whose elements overlap (strides {tuple(info.strides)}, a broadcast view?)"
    return ""


def _copy_into(dst, src) -> None:
    ad = adapter_for(dst)
    if ad is None or not ad.can_copy_into:
        raise InvalidArgumentError("options.inplace", "an operand the executor can write into", describe(dst))
    ad.copy_into(dst, src)
