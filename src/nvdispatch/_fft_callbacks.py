"""FFT prolog and epilog callbacks: the problem they add to an FFT, their route, and the vectorised plan.

A *prolog* is applied to every element of the transform's input as it is loaded, an *epilog* to every
element of its output before it is stored. Both are plain Python functions::

    def prolog(value, index, *prolog_data): ...   # returns the value the transform reads
    def epilog(value, index, *epilog_data): ...   # returns the value stored in the result

``data`` are the extra arrays passed as ``prolog_data=(...)`` / ``epilog_data=(...)`` (same framework and
device as ``x``). The same function runs on every executor:

* GPU, fused: compiled by Numba for one element at a time (``value`` a scalar, ``index`` an int64), inlined
  into a generated kernel (load -> prolog -> block FFT -> epilog -> store, sizes up to 4096) or into cuFFT as
  an LTO callback; ``explain()`` says which.
* everywhere else (NumPy, Torch, CuPy): called once on whole arrays, ``value`` the input (or output) array
  and ``index`` an int64 array of the same shape. Write it with operators, comparisons, ``abs`` and
  ``h[i]`` indexing, which mean the same on a scalar and on arrays, and the results agree. (Method names
  differ between libraries: the complex conjugate is ``v.conjugate()`` for Numba, NumPy and CuPy, but
  ``v.conj()`` for Torch tensors.) Dask arrays are not supported with callbacks.

The layout of ``index``
-----------------------
``index`` is the element's flat C-order position in the *logical* input (prolog) or output (epilog)
array of the transform, independent of the operand's strides:

* prolog: the input after padding/trimming by ``n``/``s`` (``FFTProblem.in_lengths`` along the transformed
  axes, the other axes as in ``x``); the prolog is also called on the zeros that padding adds.
  c2c (``fft``, ``ifft``, ``fftn``, ``ifftn``): complex values, ``n`` per transformed axis (real ``x`` is
  promoted first); r2c (``rfft``, ``rfftn``, ``ihfft``): real values; c2r (``irfft``, ``irfftn``,
  ``hfft``): complex values of the half spectrum, ``n//2 + 1`` along the last transformed axis.
* epilog: the result array (``out_shape``): complex ``n`` per axis for c2c, complex ``n//2 + 1`` along the
  last transformed axis for r2c, real ``n`` for c2r. The epilog sees the *normalised* output (``norm``
  applied), so ``fft(x, epilog=e)`` equals ``e(fft(x), index)``.

For a batch of 1-D transforms of length ``n`` along the last axis of a ``(B, n)`` array, ``index = b * n + k``:
``k = index % n`` is the frequency (or sample) and ``b = index // n`` the row. A per-frequency filter ``h``
of shape ``(n,)`` is applied as ``lambda v, i, h: v * h[i % n]``; a per-element one of the result's shape as
``h.reshape(-1)[i]``-style flat indexing (pass ``h.reshape(-1)``).

Plans are cached by the functions' identity and the data arrays' layout (framework, device, dtype, shape,
strides), never their values: define a callback once and reuse it (a ``lambda`` written inside a loop is a
new function each time, hence a new plan and, on the GPU, a new compilation).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._detect import detect
from ._fft_problem import FFTProblem, build_fft_problem
from ._route import Explanation, coerce_operands, detect_all, explain_selected, placement, select
from .errors import CallbackError, InvalidArgumentError, MixedOperandsError, describe

__all__ = [
    "DataLayout",
    "Callback",
    "CallbackFFTProblem",
    "OP",
    "explain",
    "prepare",
    "attach",
    "VectorisedCallbackPlan",
    "VectorisedCallbackOp",
]

#: the operation name executors implement (``executors/<executor>_fft_callbacks.py``)
OP = "fft_callbacks"


@dataclass(frozen=True)
class DataLayout:
    """What a plan may depend on of one data array: never its values."""

    framework: str
    device: Any
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None

    @property
    def c_contiguous(self) -> bool:
        if self.strides is None:
            return True
        step = 1
        for extent, stride in zip(reversed(self.shape), reversed(self.strides)):
            if extent > 1 and stride != step:
                return False
            step *= extent
        return True


@dataclass(frozen=True)
class Callback:
    """One prolog or epilog: the function (compared by identity) and the layout of its data arrays."""

    role: str  # "prolog" | "epilog"
    function: Callable[..., Any]
    data: tuple[DataLayout, ...] = ()

    @property
    def name(self) -> str:
        f = self.function
        return getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or repr(f)

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, Callback)
            and self.role == other.role
            and self.function is other.function
            and self.data == other.data
        )

    def __hash__(self) -> int:
        return hash((self.role, id(self.function), self.data))


@dataclass(frozen=True)
class CallbackFFTProblem:
    """An FFT with a prolog and/or an epilog (the plan-cache key of ``fft_callbacks``)."""

    fft: FFTProblem
    prolog: Callback | None
    epilog: Callback | None

    # what dispatch reads of every problem
    @property
    def framework(self) -> str:
        return self.fft.framework

    @property
    def device(self):
        return self.fft.device

    @property
    def memory(self) -> frozenset[str]:
        return self.fft.memory

    @property
    def autograd(self) -> bool:
        return self.fft.autograd

    @property
    def in_shape(self) -> tuple[int, ...]:
        """The logical input the prolog sees: ``x`` padded/trimmed along the transformed axes."""
        shape = list(self.fft.shape)
        for ax, n in zip(self.fft.axes, self.fft.in_lengths):
            shape[ax] = n
        return tuple(shape)

    @property
    def in_dtype(self) -> str:
        """The dtype of the values the prolog receives (real for r2c, the complex dtype otherwise)."""
        p = self.fft
        return p.real_dtype if p.kind == "r2c" else p.compute_dtype

    @property
    def out_dtype(self) -> str:
        return self.fft.result_dtype

    def describe(self) -> str:
        parts = [self.fft.describe()]
        for cb in (self.prolog, self.epilog):
            if cb is not None:
                data = ", ".join(f"{d.dtype}{list(d.shape)}" for d in cb.data)
                parts.append(f"{cb.role}={cb.name}({'value, index' + (', ' + data if data else '')})")
        return "; ".join(parts)


# -- validation -------------------------------------------------------------------------------------------
def _as_data(data, role: str) -> tuple:
    if data is None:
        return ()
    if isinstance(data, (tuple, list)):
        return tuple(data)
    return (data,)  # a single array


def _check_function(fn, role: str) -> None:
    if fn is not None and not callable(fn):
        raise InvalidArgumentError(role, "a function (value, index, *data) or None", describe(fn))


def attach(problem: FFTProblem, prolog=None, epilog=None, prolog_data=None, epilog_data=None):
    """``problem`` with these callbacks: ``(CallbackFFTProblem, data operands)``, everything validated (the
    data arrays must be arrays of ``problem``'s framework and device)."""
    _check_function(prolog, "prolog")
    _check_function(epilog, "epilog")
    pdata, edata = _as_data(prolog_data, "prolog_data"), _as_data(epilog_data, "epilog_data")
    if prolog is None and epilog is None:
        raise InvalidArgumentError("prolog", "a prolog or an epilog function with prolog_data/epilog_data", "None")
    if prolog is None and pdata:
        raise InvalidArgumentError("prolog_data", "no data without a prolog", f"{len(pdata)} array(s)")
    if epilog is None and edata:
        raise InvalidArgumentError("epilog_data", "no data without an epilog", f"{len(edata)} array(s)")
    named = {f"prolog_data[{i}]": d for i, d in enumerate(pdata)}
    named.update({f"epilog_data[{i}]": d for i, d in enumerate(edata)})
    for name, value in named.items():
        if value is None:
            raise InvalidArgumentError(name, "an array", "None")
    infos = detect_all(named)
    for name, info in infos.items():
        if info.framework != problem.framework or info.device.kind != problem.device.kind:
            raise MixedOperandsError(
                name, f"an array like x ({problem.framework} on {problem.device})", f"{info.framework} on {info.device}"
            )
        if None not in (info.device.index, problem.device.index) and info.device != problem.device:
            raise MixedOperandsError(name, f"an array on x's device ({problem.device})", f"one on {info.device}")

    def layouts(prefix, count):
        return tuple(
            DataLayout(i.framework, i.device, i.dtype, tuple(i.shape), i.strides)
            for i in (infos[f"{prefix}[{k}]"] for k in range(count))
        )

    cb_problem = CallbackFFTProblem(
        problem,
        None if prolog is None else Callback("prolog", prolog, layouts("prolog_data", len(pdata))),
        None if epilog is None else Callback("epilog", epilog, layouts("epilog_data", len(edata))),
    )
    data = {  # the views executors take (their adapters' OperandInfo.array)
        "prolog_data": tuple(infos[f"prolog_data[{i}]"].array for i in range(len(pdata))),
        "epilog_data": tuple(infos[f"epilog_data[{i}]"].array for i in range(len(edata))),
    }
    return cb_problem, data


def prepare(func: str, x, n, axis, s, axes, norm, prolog, epilog, prolog_data, epilog_data):
    """Validate a callback call; return ``(problem, operands)`` (operands: x's view and the two data tuples)."""
    infos = {"x": detect("x", x)}
    framework, device = placement(infos)
    info = infos["x"]
    fft_problem = build_fft_problem(func, info, framework, device, n, axis, s, axes, norm)
    problem, data = attach(fft_problem, prolog, epilog, prolog_data, epilog_data)
    return problem, {"x": info.array, **data}


def coerce_all(sel, operands: dict) -> dict:
    """``coerce_operands`` for x and every data array (under a coercing backend)."""
    if not sel.coerce:
        return operands
    out = coerce_operands(sel, {"x": operands["x"]}, ("x",))
    conv = sel.executor.coerce_operand
    out["prolog_data"] = tuple(conv(d) for d in operands["prolog_data"])
    out["epilog_data"] = tuple(conv(d) for d in operands["epilog_data"])
    return out


# -- explain ---------------------------------------------------------------------------------------------
def explain(func, x, n=None, axis=-1, s=None, axes=None, norm="backward", stream=None, *, callbacks) -> Explanation:
    """What a callback FFT would do (executor, strategy, fused or not), without running it."""
    problem, _ = prepare(func, x, n, axis, s, axes, norm, *callbacks)
    return explain_selected(func, OP, problem, select(OP, problem))


# -- the vectorised plan (NumPy, Torch, CuPy) ----------------------------------------------------------------
_SMALL_INDEX = 1 << 22  # index arrays up to this many elements are kept by the plan


class VectorisedCallbackPlan:
    """prolog on the whole (padded) input array -> the executor's own FFT plan -> epilog on the result.

    ``inner`` is the executor's plain FFT plan of ``problem.fft``; ``stream_context(stream, device)`` makes
    ``stream`` current for the framework around the three steps (a null context on the CPU).
    """

    def __init__(self, problem: CallbackFFTProblem, strategy: str, inner, stream_context=None):
        self.problem = problem
        self.strategy = strategy
        self.inner = inner
        self._stream_context = stream_context
        self._index: dict[str, Any] = {}
        p = problem.fft
        steps = []
        if p.kind != "r2c" and p.dtype != p.compute_dtype:
            steps.append(f"promote x to {p.compute_dtype}")
        if p.needs_resize:
            steps.append(f"pad/trim x to {list(problem.in_shape)}")
        if problem.prolog is not None:
            steps.append(f"prolog {problem.prolog.name}(x, index, *prolog_data) on the whole input (not fused)")
        steps += list(inner.steps[:-1])
        if problem.epilog is not None:
            steps.append(f"epilog {problem.epilog.name}(y, index, *epilog_data) on the whole result (not fused)")
        self.steps = (*steps, problem.describe())

    def _index_array(self, xp, which: str, shape, like):
        cached = self._index.get(which)
        if cached is not None:
            return cached
        size = 1
        for e in shape:
            size *= e
        idx = xp.reshape(xp.arange(size, dtype=xp.int64, device=_device_of(xp, like)), shape)
        if size <= _SMALL_INDEX:
            self._index[which] = idx
        return idx

    def execute(self, operands, stream=None):
        ctx = self._stream_context(stream, self.problem.device) if self._stream_context else contextlib.nullcontext()
        with ctx:
            return self._execute(operands, stream)

    def _execute(self, operands, stream):
        from array_api_compat import array_namespace

        problem, p = self.problem, self.problem.fft
        x = operands["x"]
        xp = array_namespace(x)
        if problem.prolog is not None:
            if p.kind != "r2c" and p.dtype != p.compute_dtype:
                x = xp.astype(x, getattr(xp, p.compute_dtype))
            if p.needs_resize:
                x = _resize(xp, x, p.axes, p.in_lengths)
            index = self._index_array(xp, "in", problem.in_shape, x)
            x = _apply(problem.prolog, xp, x, index, operands.get("prolog_data", ()), problem.in_dtype)
        y = self.inner.execute({"x": x}, stream)
        if problem.epilog is not None:
            index = self._index_array(xp, "out", p.out_shape, y)
            y = _apply(problem.epilog, xp, y, index, operands.get("epilog_data", ()), problem.out_dtype)
        return y

    def release(self) -> None:
        self._index.clear()
        self.inner.release()


class VectorisedCallbackOp:
    """The ``fft_callbacks`` op of an executor that has a plain FFT op (module ``base``): the callbacks run
    vectorised around its FFT plan. An executor's ``<name>_fft_callbacks`` module exposes the bound methods
    as its ``decline``/``strategies``/``plan``; ``stream_context`` as in :class:`VectorisedCallbackPlan`."""

    def __init__(self, base, stream_context=None):
        self.base, self.stream_context = base, stream_context

    def decline(self, problem: CallbackFFTProblem) -> str | None:
        return self.base.decline(problem.fft)

    def strategies(self, problem: CallbackFFTProblem) -> tuple[str, ...]:
        return ("vectorised",)

    def plan(self, problem: CallbackFFTProblem, strategy: str, tuning=None) -> VectorisedCallbackPlan:
        inner = self.base.plan(problem.fft, self.base.strategies(problem.fft)[0])
        return VectorisedCallbackPlan(problem, strategy, inner, self.stream_context)


def _device_of(xp, like):
    from array_api_compat import device

    return device(like)


def _resize(xp, x, axes, lengths):
    """``x`` zero-padded or trimmed to ``lengths`` along ``axes`` (a new array when anything changes)."""
    shape = list(x.shape)
    src = [slice(None)] * len(shape)
    target = list(shape)
    for ax, n in zip(axes, lengths):
        src[ax] = slice(0, min(n, shape[ax]))
        target[ax] = n
    trimmed = x[tuple(src)]
    if tuple(trimmed.shape) == tuple(target):
        return trimmed
    out = xp.zeros(tuple(target), dtype=x.dtype, device=_device_of(xp, x))
    out[tuple(slice(0, e) for e in trimmed.shape)] = trimmed
    return out


def _kind(xp, dtype) -> str:
    if xp.isdtype(dtype, "complex floating"):
        return "complex"
    if xp.isdtype(dtype, ("real floating", "integral")) or xp.isdtype(dtype, "bool"):
        return "real"
    return "other"


def _apply(cb: Callback, xp, values, index, data, expected: str):
    """``cb.function(values, index, *data)`` checked (shape, dtype kind) and cast to ``expected``."""
    try:
        out = cb.function(values, index, *data)
    except Exception as exc:  # noqa: BLE001 - any failure of user code is reported as the callback's
        raise CallbackError(
            cb.role,
            f"{cb.name}(value, index, *{cb.role}_data) to run on {values.dtype} arrays of shape {tuple(values.shape)}",
            f"{type(exc).__name__}: {exc}",
        ) from exc
    want = getattr(xp, expected)
    if not hasattr(out, "shape") or not hasattr(out, "dtype"):
        raise CallbackError(cb.role, f"{cb.name} to return an array of {expected} values", describe(out))
    if tuple(out.shape) != tuple(values.shape):
        raise CallbackError(
            cb.role,
            f"{cb.name} to return one value per element (shape {tuple(values.shape)})",
            f"shape {tuple(out.shape)}",
        )
    got_kind, want_kind = _kind(xp, out.dtype), ("complex" if expected.startswith("complex") else "real")
    if got_kind == "other" or (got_kind == "complex" and want_kind == "real"):
        raise CallbackError(
            cb.role,
            f"{cb.name} to return {want_kind} values ({expected})",
            f"{out.dtype}",
            "take the real part (or .real) in the callback" if want_kind == "real" else "",
        )
    return out if out.dtype == want else xp.astype(out, want)
