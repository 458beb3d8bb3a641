"""FFT with prolog/epilog callbacks fused on the GPU (the raw ``"cuda"`` executor).

Strategies, best first (``explain()`` names the one taken and why the others do not apply):

``device-fused``
    One generated Numba kernel per plan (:mod:`nvdispatch.device.fft_callback_kernel`): load -> prolog ->
    block FFT -> norm -> epilog -> store, the callbacks inlined; one launch per call, prepared with the plan
    (:class:`~nvdispatch.executors.cuda_numba_launch.StepLauncher`: the data arrays' parameters packed from
    their layouts in the plan's key, only pointers and the stream handed per call). Taken for 1-D
    transforms along the last axis of a C-contiguous operand, of a length the device engine has
    (2**a 3**b 5**c 7**d up to 4096), except hfft/ihfft. Padding/trimming by ``n`` and real input to a
    complex transform are done in the load.
``cufft-lto``
    cuFFT with the callbacks linked in as LTO callbacks (``cufftXtSetJITCallback``, LTO-IR compiled from
    the Python functions by numba-cuda; see :mod:`nvdispatch._cuda.cufft_callbacks`): any size and up to 3
    axes, when the installed cuFFT has them, for C-contiguous operands without padding/trimming and
    C-contiguous data arrays. The norm is folded into the epilog (or one scaling pass without one).

Otherwise the executor declines and the Torch/CuPy executors run the unfused sequence (the callbacks on
whole arrays around their FFT). Callbacks are compiled when the plan is made: one that Numba cannot
compile, or that returns the wrong kind of value, raises :class:`~nvdispatch.errors.CallbackError` then.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from .._fft_callbacks import Callback, CallbackFFTProblem
from .._memory import CUDA
from ..errors import CallbackError
from .cuda_fft import CudaFFTPlan, layout
from .cuda_numba import NumbaStreams, c_contiguous, numba_reason, numba_view, on_device
from .cuda_numba_launch import StepLauncher

_log = logging.getLogger("nvdispatch")


def fused_reason(problem: CallbackFFTProblem) -> str | None:
    """Why the generated-kernel strategy does not apply, or None."""
    p = problem.fft
    why = numba_reason()
    if why:
        return why
    from ..device.fft_callback_kernel import length_reason

    if p.func in ("hfft", "ihfft"):
        return "hfft/ihfft have no device-engine kernel"
    if len(p.axes) != 1 or p.axes[0] != len(p.shape) - 1:
        return "the device engine runs 1-D transforms along the last axis"
    why = length_reason(p.lengths[0], p.real_dtype)
    if why:
        return why
    if not c_contiguous(p):
        return "x is not C-contiguous"
    if p.compute_dtype not in ("complex64", "complex128"):
        return f"{p.compute_dtype} transforms"
    return None


def lto_reason(problem: CallbackFFTProblem) -> str | None:
    """Why the cuFFT LTO-callback strategy does not apply, or None."""
    from .._cuda import cufft_callbacks

    why = cufft_callbacks.unavailable()
    if why:
        return why
    p = problem.fft
    lay = layout(p)
    if isinstance(lay, str):
        return lay
    if lay["loops"]:
        return "the batch needs several cuFFT launches"
    if not c_contiguous(p):
        return "x is not C-contiguous (cuFFT's callback offset would not be the logical index)"
    for cb in (problem.prolog, problem.epilog):
        if cb is not None and any(not d.c_contiguous or not d.shape for d in cb.data):
            return f"{cb.role} data arrays must be C-contiguous arrays of at least 1 dimension"
    return None


def decline_by(problem, autograd: bool, reasons) -> str | None:
    """Why no strategy of ``reasons`` (``(name, reason(problem))`` pairs, best first) runs ``problem``, None
    when one does; a call autograd records is left to the Torch executor. Shared with ``cuda_fft_convolve``."""
    if autograd:
        return "autograd records this call; the Torch executor keeps the graph"
    why = [(name, reason(problem)) for name, reason in reasons]
    if any(w is None for _, w in why):
        return None
    return "; ".join(f"{name}: {w}" for name, w in why)


def strategies_by(problem, reasons) -> tuple[str, ...]:
    """The strategies of ``reasons`` (as for :func:`decline_by`) that run ``problem``, best first."""
    return tuple(name for name, reason in reasons if reason(problem) is None)


_REASONS = (("device-fused", fused_reason), ("cufft-lto", lto_reason))


def decline(problem: CallbackFFTProblem) -> str | None:
    return decline_by(problem, problem.fft.autograd, _REASONS)


def strategies(problem: CallbackFFTProblem) -> tuple[str, ...]:
    return strategies_by(problem, _REASONS)


def plan(problem: CallbackFFTProblem, strategy: str, tuning=None):
    if strategy == "device-fused":
        return FusedCallbackPlan(problem, strategy)
    return LtoCallbackPlan(problem, strategy)


# -- compile-time checks --------------------------------------------------------------------------------------
def _array_type(layout):
    from numba.cuda import types
    from numba.np.numpy_support import from_dtype

    return types.Array(from_dtype(np.dtype(layout.dtype)), len(layout.shape), "C" if layout.c_contiguous else "A")


def check_callback(cb: Callback | None, value_dtype: str) -> None:
    """Compile ``cb`` for one element (Numba, CUDA target) and check its return type; CallbackError if not."""
    if cb is None:
        return
    from numba import cuda
    from numba.cuda import types
    from numba.np.numpy_support import from_dtype

    argtypes = (from_dtype(np.dtype(value_dtype)), types.int64, *(_array_type(d) for d in cb.data))
    described = ", ".join(str(t) for t in argtypes)
    try:
        cc = cuda.get_current_device().compute_capability
        _, resty = cuda.compile(cb.function, argtypes, device=True, abi="numba", output="ptx", cc=cc)
    except Exception as exc:  # noqa: BLE001 - Numba's typing/lowering errors, reported as the callback's
        message = str(exc).strip().splitlines()
        raise CallbackError(
            cb.role,
            f"{cb.name} compilable by Numba for the GPU with arguments ({described})",
            f"{type(exc).__name__}: {' '.join(message[:6])}",
        ) from exc
    complex_ok = value_dtype.startswith("complex")
    accepted = (types.Float, types.Integer, types.Boolean) + ((types.Complex,) if complex_ok else ())
    if not isinstance(resty, accepted):
        raise CallbackError(
            cb.role,
            f"{cb.name} to return a {'complex or real' if complex_ok else 'real'} scalar ({value_dtype})",
            f"{resty} (Numba's inferred return type for ({described}))",
        )


# -- device-fused -------------------------------------------------------------------------------------------
def fused_step(problem: CallbackFFTProblem, kernel, rows: int):
    """The launch of the generated kernel (a :class:`~nvdispatch.device.fft_callback_kernel.CallbackKernel`) over
    ``rows`` rows, on the operands ``(x, out, *prolog_data, *epilog_data)`` by number: ``x`` ``(rows, m_in)``,
    ``out`` ``(rows, n_out)``, each data array of its layout in the problem (part of the plan's key)."""
    from ..device.kernel_steps import ArrayArg, KernelStep

    p = problem.fft
    args = [
        ArrayArg(0, (rows, p.shape[-1]), np.dtype(p.dtype)),
        ArrayArg(1, (rows, kernel.spec.n_out), np.dtype(p.result_dtype)),
    ]
    data = [d for cb in (problem.prolog, problem.epilog) if cb is not None for d in cb.data]
    for i, d in enumerate(data):
        dt = np.dtype(d.dtype)
        strides = None if d.c_contiguous else tuple(st * dt.itemsize for st in d.strides)
        args.append(ArrayArg(2 + i, tuple(d.shape), dt, strides))
    return KernelStep(kernel.kernel, (kernel.grid(rows),), kernel.block_dim, kernel.shared_memory_size, tuple(args))


def laid_out_as(view, arg) -> bool:
    """Whether device array ``view`` (a ``_cuda.arrays.DeviceView``: strides in elements) is what ``arg`` (an
    :class:`~nvdispatch.device.kernel_steps.ArrayArg`) describes: its dtype and elements, C-contiguous where
    ``arg`` is, else of its shape and byte strides (extents of one: any stride)."""
    dt = np.dtype(view.dtype)
    if dt != arg.dtype or math.prod(view.shape) != arg.size:
        return False
    if arg.strides is None:
        shape, want = tuple(view.shape), None
    else:
        shape, want = arg.shape, arg.strides
        if tuple(view.shape) != shape:
            return False
    if want is None:  # C order over the view's own shape
        want, step = [], dt.itemsize
        for extent in reversed(shape):
            want.append(step)
            step *= extent
        want.reverse()
    got = [st * dt.itemsize for st in view.strides]
    return all(e <= 1 or g == w for e, g, w in zip(shape, got, want))


class FusedCallbackPlan:
    """One generated kernel: load -> prolog -> block FFT -> norm -> epilog -> store."""

    def __init__(self, problem: CallbackFFTProblem, strategy: str):
        from .._cuda import arrays, runtime
        from ..device.fft_callback_kernel import KernelSpec, build_callback_kernel

        self.problem = problem
        self.strategy = strategy
        p = problem.fft
        self.device_index = p.device.index if p.device.index is not None else runtime.current_device()
        pro, epi = problem.prolog, problem.epilog
        check_callback(pro, problem.in_dtype)
        check_callback(epi, problem.out_dtype)
        n, m_in = p.lengths[0], p.shape[-1]
        self.rows = math.prod(p.shape[:-1])
        spec = KernelSpec(
            p.kind,
            n,
            p.real_dtype,
            p.direction,
            m_in,
            prolog_args=None if pro is None else len(pro.data),
            epilog_args=None if epi is None else len(epi.data),
            scale=p.scale(),
            promote=p.kind != "r2c" and p.dtype != p.compute_dtype,
        )
        self.spec = spec
        self.kernel = build_callback_kernel(
            spec, None if pro is None else pro.function, None if epi is None else epi.function
        )
        step = fused_step(problem, self.kernel, self.rows)
        self._several = runtime.device_count() > 1
        try:
            with on_device(self.device_index, self._several):
                self.kernel.compile(step.argument_types())
        except Exception as exc:  # noqa: BLE001
            raise CallbackError(
                "prolog" if pro is not None else "epilog",
                "callbacks that compile into the generated FFT kernel",
                f"{type(exc).__name__}: {' '.join(str(exc).strip().splitlines()[:6])}",
            ) from exc
        launches = (step,) if self.rows else ()
        self.launcher = StepLauncher(launches, len(step.args), self.device_index, self._several, "fft_callbacks")
        self._pointer = arrays.pointer_getter(p.framework)
        # device operands reach execute as the key describes them; a coercing backend's copies may not
        self._as_keyed = CUDA in p.memory
        self._streams = NumbaStreams()
        F = self.kernel.first
        steps = [
            f"one generated Numba kernel per call: load x ({p.dtype}, rows of {m_in}"
            + (f", padded/trimmed to {spec.n_in}" if m_in != spec.n_in else "")
            + ")"
            + ("" if pro is None else f" -> prolog {pro.name} (inlined)")
            + f" -> block {p.kind} FFT n={n} ({F.elements_per_thread} elements/thread, {F.ffts_per_block} FFTs/block)"
            + (f" -> scale {spec.scale:.6g}" if spec.scale != 1.0 else "")
            + ("" if epi is None else f" -> epilog {epi.name} (inlined)")
            + " -> store",
            f"grid {self.kernel.grid(self.rows)} x block {self.kernel.block_dim}, "
            f"{self.kernel.shared_memory_size} B shared memory, on the caller's stream",
            self.launcher.how,
        ]
        self.steps = (*steps, problem.describe())

    def execute(self, operands, stream=None):
        from .._cuda import arrays, streams

        p, pointer = self.problem.fft, self._pointer
        fw = p.framework
        x = operands["x"]
        s = streams.stream_pointer(stream, fw, self.device_index)
        out, out_ptr = arrays.empty(arrays.result_kind(x, fw), p.out_shape, p.result_dtype, self.device_index, s)
        if self.rows == 0:
            return out
        data = (*operands.get("prolog_data", ()), *operands.get("epilog_data", ()))
        if self._as_keyed:
            self.launcher(s, (pointer(x), out_ptr, *[pointer(d) for d in data]))
            return out
        # copies a coercing backend made: their layouts are read, and the prepared parameters taken where they match
        views = [arrays.view(a, fw) for a in (x, *data)]
        args = self.launcher.steps[0].args
        if all(laid_out_as(v, a) for v, a in zip(views, (args[0], *args[2:]))):
            self.launcher(s, (views[0].ptr, out_ptr, *[v.ptr for v in views[1:]]))
            return out
        _log.debug("fft_callbacks: operands laid out unlike the plan's key, this call launched by Numba")
        with on_device(self.device_index, self._several):
            xv = numba_view(x, fw, (self.rows, p.shape[-1]))
            ov = numba_view(out, arrays.result_kind(x, fw), (self.rows, self.spec.n_out))
            pdata = tuple(numba_view(d, fw) for d in operands.get("prolog_data", ()))
            edata = tuple(numba_view(d, fw) for d in operands.get("epilog_data", ()))
            self.kernel.launch(xv, ov, None, pdata, edata, self._streams(s))
        return out

    def release(self) -> None:
        pass


# -- cuFFT LTO callbacks ---------------------------------------------------------------------------------------
class LtoCallbackPlan(CudaFFTPlan):
    """The raw cuFFT plan with the prolog/epilog linked in as LTO callbacks."""

    def __init__(self, problem: CallbackFFTProblem, strategy: str):
        from .._cuda import cufft_callbacks as cbs

        p = problem.fft
        pro, epi = problem.prolog, problem.epilog
        check_callback(pro, problem.in_dtype)
        check_callback(epi, problem.out_dtype)
        self.cb_problem = problem
        self._pinfo = cbs.CallerInfo(len(pro.data)) if pro is not None else None
        self._einfo = cbs.CallerInfo(len(epi.data)) if epi is not None else None
        load = store = None
        try:
            if pro is not None:
                load = (
                    cbs.compile_callback(pro.function, "Load", problem.in_dtype, pro.data),
                    problem.in_dtype,
                    self._pinfo.ptr,
                )
            if epi is not None:
                ltoir = cbs.compile_callback(epi.function, "Store", problem.out_dtype, epi.data, scale=p.scale())
                store = (ltoir, problem.out_dtype, self._einfo.ptr)
        except Exception as exc:  # noqa: BLE001
            raise CallbackError(
                "prolog" if load is None and pro is not None else "epilog",
                "a callback numba-cuda compiles to LTO-IR for cuFFT",
                f"{type(exc).__name__}: {' '.join(str(exc).strip().splitlines()[:6])}",
            ) from exc
        self._configure = cbs.configure_callbacks(load, store)
        super().__init__(p, strategy)
        steps = list(self.steps[:-1])
        linked = [f"{cb.role} {cb.name}" for cb in (pro, epi) if cb is not None]
        steps.insert(0, f"cuFFT LTO callbacks ({', '.join(linked)}) compiled by numba-cuda, linked into the plan")
        if epi is not None and self.scale != 1.0:
            steps = [s for s in steps if not s.startswith("scale by")]
            steps.append(f"norm factor {self.scale:.6g} applied in the store callback, before the epilog")
            self.scale = 1.0
            self.direct = self._direct_call()
        self.steps = (*steps, problem.describe())

    def bind_data(self, operands, stream: int) -> None:
        """Point the callbacks at ``operands``' ``prolog_data``/``epilog_data`` arrays (in ``stream``'s order)."""
        from .._cuda import arrays

        fw = self.problem.framework
        pdata, edata = operands.get("prolog_data", ()), operands.get("epilog_data", ())
        if pdata:
            self._pinfo.bind(tuple(arrays.view(d, fw).ptr for d in pdata), stream)
        if edata:
            self._einfo.bind(tuple(arrays.view(d, fw).ptr for d in edata), stream)

    def execute(self, operands, stream=None):
        if operands.get("prolog_data") or operands.get("epilog_data"):
            from .._cuda import streams

            self.bind_data(operands, streams.stream_pointer(stream, self.problem.framework, self.device_index))
        return super().execute({"x": operands["x"]}, stream)

    def release(self) -> None:
        super().release()
        for info in (self._pinfo, self._einfo):
            if info is not None:
                info.free()
