"""``nvdispatch.fft``: the array-API fft extension (2024.12) on every executor, a stateful :class:`FFT`,
and the ``scipy.fft`` backend protocol.

Functions (signatures as the standard writes them; ``stream=`` is an nvdispatch extra for GPU arrays):
``fft, ifft, fftn, ifftn, rfft, irfft, rfftn, irfftn, hfft, ihfft, fftfreq, rfftfreq, fftshift, ifftshift``.

Executors: NumPy arrays go to ``scipy.fft`` on all cores (``numpy.fft`` without SciPy); Torch tensors to
``torch.fft``; CuPy arrays to cuFFT (raw ``"cuda"`` executor, else ``cupy.fft`` with plans kept in the
shared plan cache); ``__cuda_array_interface__``/DLPack device arrays to the raw ``"cuda"`` executor.
``nvdispatch.set_backend`` and friends choose among them; ``nvdispatch.explain(nvdispatch.fft.rfft, x, n=64)``
says what a call would do.

Dtype rules (see ``nvdispatch._fft_problem``): precision is kept; real floating input to the complex
transforms (``fft``, ``ifft``, ``fftn``, ``ifftn``, ``irfft``, ``irfftn``, ``hfft``) is promoted to the
complex dtype of the same precision; integer, boolean and half-precision input raise
``UnsupportedDtypeError``, as does complex input to ``rfft``/``rfftn``/``ihfft``.

As a SciPy backend::

    import scipy.fft, nvdispatch.fft
    with scipy.fft.set_backend(nvdispatch.fft):
        y = scipy.fft.fft(x)          # NumPy, Torch or CuPy x

SciPy's ``overwrite_x``, ``workers`` and ``plan`` keywords are accepted (and ignored: nvdispatch never
overwrites its input and uses all cores); transforms nvdispatch does not implement (``dct``, ``dst``,
``fht``, ``hfftn``, ...) return ``NotImplemented`` so SciPy falls through to the next backend.

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

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _backends
from ._dispatch import Explanation, choose_strategy, coerce_operands, detect_all, get_plan, placement, plan_key, select
from ._fft_problem import FFTProblem, build_fft_problem, check_norm
from ._plan_cache import plan_cache
from .errors import (
    InvalidArgumentError,
    PlanStateError,
    ShapeMismatchError,
    UnsupportedDtypeError,
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
    "fftfreq",
    "rfftfreq",
    "fftshift",
    "ifftshift",
    "FFT",
    "FFTOptions",
    "explain_fft",
]

__ua_domain__ = "numpy.scipy.fft"


# -- dispatch ------------------------------------------------------------------------------------------------
def _prepare(func: str, x, n=None, axis=-1, s=None, axes=None, norm="backward"):
    infos = detect_all({"x": x})
    framework, device = placement(infos)
    info = infos["x"]
    problem = build_fft_problem(func, info, framework, device, n, axis, s, axes, norm)
    # CPU DLPack objects are executed through their zero-copy NumPy view
    operand = info.array if framework == "dlpack" and device.kind == "cpu" else x
    return problem, select("fft", problem), operand


def _fast_key(x):
    """A cache key for the operand's layout when it is a plain NumPy/Torch/CuPy array, else None."""
    t = type(x)
    if t is np.ndarray:
        return (t, x.dtype, x.shape, x.strides)
    mod = t.__module__
    if mod == "torch" and t.__name__ in ("Tensor", "Parameter"):
        autograd = x.requires_grad and sys.modules["torch"].is_grad_enabled()
        return (t, x.dtype, tuple(x.shape), x.stride(), x.device, autograd)
    if mod.startswith("cupy") and t.__name__ == "ndarray":
        return (t, x.dtype, x.shape, x.strides, x.device.id)
    return None


def _run(func: str, x, n=None, axis=-1, s=None, axes=None, norm="backward", stream=None):
    # Fast path: a NumPy/Torch/CuPy operand and no backend control in effect -> one cache lookup.
    if _backends.is_default_state():
        xk = _fast_key(x)
        if xk is not None:
            key = ("fft-fast", func, xk, n, axis, _hashable(s), _hashable(axes), norm)
            try:
                plan = plan_cache.get(key)
            except TypeError:  # unhashable arguments: validation below explains
                plan, key = None, None
            if plan is not None:
                return plan.execute({"x": x}, stream)
            problem, sel, operand = _prepare(func, x, n, axis, s, axes, norm)
            plan = get_plan(sel.executor, "fft", problem, choose_strategy(sel.executor, "fft", problem))
            if key is not None:
                plan_cache.put(key, plan)
            return plan.execute({"x": operand}, stream)
    problem, sel, operand = _prepare(func, x, n, axis, s, axes, norm)
    plan = get_plan(sel.executor, "fft", problem, choose_strategy(sel.executor, "fft", problem))
    operands = coerce_operands(sel, {"x": operand}, ("x",))
    return plan.execute(operands, stream)


def _hashable(v):
    if v is None or isinstance(v, (int, str)):
        return v
    return ("seq", *v) if isinstance(v, (tuple, list)) else object()


def explain_fft(func: str, x, n=None, axis=-1, s=None, axes=None, norm="backward", stream=None) -> Explanation:
    """What ``nvdispatch.fft.<func>`` would do with these arguments, without running it."""
    problem, sel, _ = _prepare(func, x, n, axis, s, axes, norm)
    strategies = tuple(sel.executor.strategies("fft", problem))
    strategy = choose_strategy(sel.executor, "fft", problem)
    cached = plan_cache._plans.get(plan_key(sel.executor, "fft", problem, strategy)) is not None
    plan = get_plan(sel.executor, "fft", problem, strategy)
    return Explanation(
        func, sel.executor.name, strategy, tuple(plan.steps), tuple(sel.declined), strategies, cached, problem
    )


def _with_explain(func_name: str, nd: bool):
    def deco(f):
        if nd:

            def _explain(x, /, *, s=None, axes=None, norm="backward", stream=None):
                return explain_fft(func_name, x, s=s, axes=axes, norm=norm, stream=stream)
        else:

            def _explain(x, /, *, n=None, axis=-1, norm="backward", stream=None):
                return explain_fft(func_name, x, n=n, axis=axis, norm=norm, stream=stream)

        f.__nvdispatch_explain__ = _explain
        return f

    return deco


# -- the array-API functions ---------------------------------------------------------------------------------
@_with_explain("fft", False)
def fft(x, /, *, n=None, axis=-1, norm="backward", stream=None):
    """One-dimensional discrete Fourier transform of ``x`` along ``axis`` (zero-padded/trimmed to ``n``).

    Returns a complex array of the input's precision. ``norm``: ``"backward"`` (no scaling),
    ``"ortho"`` (``1/sqrt(n)``) or ``"forward"`` (``1/n``).
    """
    return _run("fft", x, n=n, axis=axis, norm=norm, stream=stream)


@_with_explain("ifft", False)
def ifft(x, /, *, n=None, axis=-1, norm="backward", stream=None):
    """One-dimensional inverse DFT (``"backward"`` scales by ``1/n``)."""
    return _run("ifft", x, n=n, axis=axis, norm=norm, stream=stream)


@_with_explain("fftn", True)
def fftn(x, /, *, s=None, axes=None, norm="backward", stream=None):
    """n-dimensional DFT over ``axes`` (all axes when None); ``s`` (requires ``axes``) pads/trims each."""
    return _run("fftn", x, s=s, axes=axes, norm=norm, stream=stream)


@_with_explain("ifftn", True)
def ifftn(x, /, *, s=None, axes=None, norm="backward", stream=None):
    """n-dimensional inverse DFT over ``axes``."""
    return _run("ifftn", x, s=s, axes=axes, norm=norm, stream=stream)


@_with_explain("rfft", False)
def rfft(x, /, *, n=None, axis=-1, norm="backward", stream=None):
    """DFT of real input: the ``n//2 + 1`` non-negative frequency terms along ``axis``."""
    return _run("rfft", x, n=n, axis=axis, norm=norm, stream=stream)


@_with_explain("irfft", False)
def irfft(x, /, *, n=None, axis=-1, norm="backward", stream=None):
    """Inverse of :func:`rfft`: real output of length ``n`` (default ``2*(m-1)``) along ``axis``."""
    return _run("irfft", x, n=n, axis=axis, norm=norm, stream=stream)


@_with_explain("rfftn", True)
def rfftn(x, /, *, s=None, axes=None, norm="backward", stream=None):
    """n-dimensional DFT of real input; the last axis in ``axes`` is halved to ``s[-1]//2 + 1``."""
    return _run("rfftn", x, s=s, axes=axes, norm=norm, stream=stream)


@_with_explain("irfftn", True)
def irfftn(x, /, *, s=None, axes=None, norm="backward", stream=None):
    """Inverse of :func:`rfftn`; ``s[-1]`` is the real output length of the last axis (default ``2*(m-1)``)."""
    return _run("irfftn", x, s=s, axes=axes, norm=norm, stream=stream)


@_with_explain("hfft", False)
def hfft(x, /, *, n=None, axis=-1, norm="backward", stream=None):
    """DFT of a Hermitian-symmetric signal given by its first half: real output of length ``n``."""
    return _run("hfft", x, n=n, axis=axis, norm=norm, stream=stream)


@_with_explain("ihfft", False)
def ihfft(x, /, *, n=None, axis=-1, norm="backward", stream=None):
    """Inverse of :func:`hfft`: the ``n//2 + 1`` terms of the Hermitian spectrum of real input."""
    return _run("ihfft", x, n=n, axis=axis, norm=norm, stream=stream)


# -- frequencies and shifts ----------------------------------------------------------------------------------
def _framework_of_device(device):
    """(framework module name, device object) that ``fftfreq``'s ``device`` argument asks for."""
    if device is None or (isinstance(device, str) and device == "cpu"):
        return "numpy", None
    mod = type(device).__module__.split(".")[0]
    if mod == "torch":
        return "torch", device
    if mod == "cupy":
        return "cupy", device
    if isinstance(device, str) and device.startswith("cuda"):
        try:
            import torch  # noqa: F401

            return "torch", device
        except ImportError:
            import cupy

            idx = int(device.split(":")[1]) if ":" in device else 0
            return "cupy", cupy.cuda.Device(idx)
    raise InvalidArgumentError(
        "device", "None, 'cpu', 'cuda[:N]', a torch.device or a cupy.cuda.Device", describe(device)
    )


def _freq(n, d, dtype, device, real: bool, name: str):
    n_ = _as_pos_int(n, "n")
    if isinstance(d, bool) or not isinstance(d, (int, float, np.floating, np.integer)):
        raise InvalidArgumentError("d", "a real number", repr(d))
    if d == 0:
        raise InvalidArgumentError("d", "a non-zero sample spacing", repr(d))
    fw, dev = _framework_of_device(device)
    if real:
        k = np.arange(n_ // 2 + 1, dtype=np.float64)
    else:
        k = np.concatenate([np.arange((n_ - 1) // 2 + 1), np.arange(-(n_ // 2), 0)]).astype(np.float64)
    values = k / (n_ * float(d))
    if fw == "numpy":
        dt = np.dtype("float64" if dtype is None else dtype)
        if dt.kind != "f":
            raise UnsupportedDtypeError("dtype", "a real floating dtype", str(dtype))
        return values.astype(dt)
    if fw == "torch":
        import torch

        dt = torch.float64 if dtype is None else dtype
        if not (isinstance(dt, torch.dtype) and dt.is_floating_point):
            raise UnsupportedDtypeError("dtype", "a real floating torch.dtype", str(dtype))
        return torch.as_tensor(values, dtype=dt, device=dev)
    import cupy

    dt = np.dtype("float64" if dtype is None else dtype)
    if dt.kind != "f":
        raise UnsupportedDtypeError("dtype", "a real floating dtype", str(dtype))
    with dev:
        return cupy.asarray(values.astype(dt))


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


def fftfreq(n, /, *, d=1.0, dtype=None, device=None):
    """The sample frequencies ``[0, 1, ..., n//2-ish, -.., -1] / (d*n)`` of an ``n``-point DFT.

    ``device``: None or ``"cpu"`` (NumPy array), a ``torch.device`` (Torch tensor), a ``cupy.cuda.Device``
    (CuPy array), or ``"cuda[:N]"`` (Torch when installed, else CuPy). ``dtype`` defaults to float64.
    """
    return _freq(n, d, dtype, device, False, "fftfreq")


def rfftfreq(n, /, *, d=1.0, dtype=None, device=None):
    """The sample frequencies ``[0, 1, ..., n//2] / (d*n)`` of an ``n``-point real DFT (see :func:`fftfreq`)."""
    return _freq(n, d, dtype, device, True, "rfftfreq")


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
    fw = info.framework
    if fw == "torch":
        import torch

        return torch.roll(x, shifts, axes_t) if axes_t else x.clone()
    if fw == "numpy" or (fw == "dlpack" and info.device.kind == "cpu"):
        return np.roll(info.array, shifts, axes_t) if axes_t else info.array.copy()
    import cupy

    arr = x if fw == "cupy" else cupy.asarray(x)
    return cupy.roll(arr, shifts, axes_t) if axes_t else arr.copy()


def fftshift(x, /, *, axes=None):
    """Move the zero-frequency term to the centre along ``axes`` (all axes when None).

    ``__cuda_array_interface__``/DLPack device arrays come back as CuPy arrays.
    """
    return _shift(x, axes, False)


def ifftshift(x, /, *, axes=None):
    """Inverse of :func:`fftshift`."""
    return _shift(x, axes, True)


def _explain_simple(name):
    def _explain(*args, **kwargs):
        first = args[0] if args else None
        where = "numpy"
        if name in ("fftshift", "ifftshift") and first is not None:
            where = detect_all({"x": first})["x"].framework
        elif kwargs.get("device") is not None:
            where = _framework_of_device(kwargs["device"])[0]
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

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> x = (np.random.rand(8, 16) + 1j * np.random.rand(8, 16)).astype(np.complex64)
    >>> with nvdispatch.fft.FFT(x, axes=(1,)) as f:
    ...     f.plan()
    ...     y = f.execute()
    ...     z = f.execute(direction="inverse")
    >>> bool(np.allclose(y, np.fft.fft(x, axis=1), atol=1e-4))
    True
    """

    def __init__(self, x, *, axes=None, options=None, stream=None):
        self._options = _as_fft_options(options)
        self._stream = stream
        self._freed = False
        self._plans: dict[str, Any] = {}
        self._problems: dict[str, FFTProblem] = {}
        self._selections: dict[str, Any] = {}
        self._axes = None if axes is None else tuple(axes)
        self._x = x
        self._info = detect_all({"x": x})["x"]
        self._fft_type = self._infer_type(self._info.dtype)
        # validate now so mistakes surface at construction
        self._build(x)

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

    def plan(self, *, stream=None):
        """Choose the executor and prepare the plan(s) (kept in the shared plan cache)."""
        self._check_alive("plan")
        if self._x is None:
            raise PlanStateError("x", "an operand to plan for", "None", "call reset_operand(x) first")
        self._plans.clear()
        for direction, problem in self._build(self._x).items():
            sel = select("fft", problem)
            strategy = choose_strategy(sel.executor, "fft", problem)
            self._plans[direction] = get_plan(sel.executor, "fft", problem, strategy)
            self._problems[direction], self._selections[direction] = problem, sel
        return self

    def execute(self, *, direction=None, stream=None):
        """Run the transform; ``direction`` ``"forward"``/``"inverse"`` (C2C; R2C is forward, C2R inverse).

        Returns the result in the operand's framework (the operand itself when ``inplace``).
        """
        self._check_alive("execute")
        if not self._plans:
            raise PlanStateError("self", "a planned FFT to execute", "one not planned yet", "call plan() first")
        if self._x is None:
            raise PlanStateError("x", "an operand to transform", "None", "call reset_operand(x) first")
        if direction is None:
            direction = "inverse" if self._fft_type == "C2R" else "forward"
        d = _DIRECTIONS.get(direction.lower() if isinstance(direction, str) else direction)
        if d is None or d not in self._plans:
            allowed = tuple(self._plans)
            raise InvalidArgumentError("direction", f"one of {allowed} for a {self._fft_type} FFT", repr(direction))
        stream = stream if stream is not None else self._stream
        sel = self._selections[d]
        operand = self._x
        if self._info.framework == "dlpack" and self._info.device.kind == "cpu":
            operand = self._info.array
        operands = coerce_operands(sel, {"x": operand}, ("x",))
        plan = self._plans[d]
        if self._options.inplace and getattr(plan, "supports_out", False):
            operands["out"] = operand
            plan.execute(operands, stream)
            return self._x
        result = plan.execute(operands, stream)
        if self._options.inplace:
            _copy_into(operand, result)
            return self._x
        return result

    def reset_operand(self, x=None, *, stream=None):
        """Swap in a new operand of the same framework, device, dtype and shape (``None`` drops the
        reference). Strides may change: plans are then looked up again in the cache."""
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
        self._x, self._info = x, info
        if self._plans and info.strides != old.strides:
            self.plan(stream=stream)

    def free(self) -> None:
        """Drop plans and the operand reference. Using the object afterwards raises ``PlanStateError``."""
        self._x = None
        self._plans.clear()
        self._selections.clear()
        self._problems.clear()
        self._freed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()
        return False

    def __repr__(self) -> str:
        state = "freed" if self._freed else ("planned" if self._plans else "not planned")
        return f"<nvdispatch.fft.FFT {self._fft_type} {state} executor={self.executor}>"


def _copy_into(dst, src) -> None:
    mod = type(dst).__module__.split(".")[0]
    if mod == "torch":
        dst.copy_(src)
    elif isinstance(dst, np.ndarray) or mod == "cupy":
        dst[...] = src
    else:
        raise InvalidArgumentError("options.inplace", "an operand the executor can write into", describe(dst))


# -- scipy.fft backend protocol --------------------------------------------------------------------------------
def _sp_1d(func):
    def f(x, n=None, axis=-1, norm=None, overwrite_x=False, workers=None, *, plan=None):
        return _run(func, x, n=n, axis=axis, norm=norm if norm is not None else "backward")

    return f


def _sp_nd(func, default_axes=None):
    def f(x, s=None, axes=default_axes, norm=None, overwrite_x=False, workers=None, *, plan=None):
        if s is not None and axes is None:  # SciPy/NumPy: s alone applies to the last len(s) axes
            axes = tuple(range(-len(s), 0))
        return _run(func, x, s=s, axes=axes, norm=norm if norm is not None else "backward")

    return f


_SCIPY_IMPL = {
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
    """uarray entry point: run SciPy's ``method`` through nvdispatch, or ``NotImplemented`` to fall through."""
    impl = _SCIPY_IMPL.get(getattr(method, "__name__", ""))
    if impl is None:
        return NotImplemented
    if args:
        x = args[0]
        if isinstance(x, np.ndarray) and x.dtype.kind in "biu" or (isinstance(x, np.ndarray) and x.dtype == np.float16):
            # SciPy promotes these; do the same for NumPy input
            args = (x.astype(np.float32 if x.dtype == np.float16 else np.float64), *args[1:])
        elif not isinstance(x, np.ndarray):
            info = detect_all({"x": x})["x"]
            if info.dtype not in ("float32", "float64", "complex64", "complex128"):
                return NotImplemented
    return impl(*args, **kwargs)
