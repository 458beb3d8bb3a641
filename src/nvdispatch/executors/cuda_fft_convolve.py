"""``nvdispatch.fft.convolve`` on the raw ``"cuda"`` executor.

Strategies (``explain()`` names the one that runs, and why):

``timed``
    The route's choice whenever two or more of the strategies below apply: a
    :class:`~nvdispatch.executors.timed_choice.TimedChoicePlan` over them, in the order of the cost model
    (:mod:`.cuda_fft_convolve_model`: the memory each moves, weighted by how fast). The first call of a
    problem times the candidates the model does not rule out (``unfused`` always among them, so no fused
    strategy can lose to the three-kernel form), on that call's operands and stream, and keeps the fastest.
    Before timing, each candidate's result is compared with ``unfused``'s on a sample (rows across the
    batch, both ends and the tile seams of each): one that disagrees beyond rounding is rejected (a WARNING,
    and ``explain()`` says so), never chosen.
    The choice is recorded for ``plan_cache.save`` and, loaded on a machine with the same GPU, driver and
    cuFFT, taken without timing. Problems under :data:`TIMING_MIN_BYTES` take the model's first. Planning a
    timed choice compiles every candidate's kernels (seconds each, once per process and kernel); with a
    recorded choice only the chosen one is planned.
``device-fused``
    One generated kernel per call (:mod:`nvdispatch.device.fft_callback_kernel`): load -> block FFT ->
    multiply by ``h`` in registers -> inverse block FFT -> scale -> store. The signal is read once and
    written once. Along the last axis of a C-contiguous ``x``, for lengths the device engine has
    (2**a 3**b 5**c 7**d up to 16384 in float32, 4096 in float64 on every GPU: longer double-precision blocks
    ran out of registers at launch; a block beyond 48 KiB of shared memory opts in to more), with a
    C-contiguous filter that is one row for all signals (shape ``(m,)``, ``(1, ..., m)``) or one row per
    signal (the spectrum's shape). The timed choice also tries the
    kernel with other block-FFT knobs and, for real signals with one filter row, ``device-fused pairs``: two
    real rows as one complex transform with the filter completed to a Hermitian one (half the FFT work).
``four-step``
    Long signals (``n > 1024``, ``n = n1 * n2``): three kernels, the multiply folded into the middle one, 6
    traversals of memory whatever cuFFT would need (:mod:`.cuda_fft_convolve_four_step`). The timed choice
    tries up to :data:`MOST_FOUR_STEP` configurations (``four-step <split> cols <ept>x<columns>``: a split
    into longer rows and shorter columns, and a wider tile of columns, whose rows are longer runs of adjacent
    values, opting in to more shared memory).
``unfused``
    cuFFT forward, one multiply kernel (``h / n``), cuFFT inverse: ``4P + 2`` traversals for cuFFT's ``P``
    passes, one fewer pass than CuPy's and Torch's ``ifft(fft(x) * h)`` (:mod:`.cuda_fft_convolve_unfused`).
``cufft-lto``
    cuFFT's forward transform with the multiply (and ``1/n``) linked in as an LTO store callback, then
    cuFFT's inverse: ``4P`` traversals. Complex signals only (real ones take ``cufft-lto-load``).
``cufft-lto-load``
    cuFFT's forward transform, then cuFFT's inverse with the multiply (and ``1/n``) linked in as an LTO load
    callback: ``4P`` traversals, the callback on the other transform.

The three cuFFT strategies share one launch sequence (:mod:`.cuda_fft_convolve_cufft`) and differ in where
the multiply happens. Otherwise the executor declines and the Torch/CuPy executors run fft, multiply, ifft.
Every plan's ``steps`` (what ``explain()`` shows) end with the strategies not offered for the problem and why
(:func:`refusals`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math

import numpy as np

from .._agreement import ResultCheck, fft_tolerance, magnitude
from .._fft_callbacks import Callback, CallbackFFTProblem, DataLayout
from .._fft_convolve import ConvolveProblem
from .._version import __version__
from ..errors import CallbackError
from . import cuda_fft_convolve_model as model
from .cuda_fft import CudaFFTPlan, layout
from .cuda_fft_callbacks import LtoCallbackPlan, decline_by, lto_reason, strategies_by
from .cuda_fft_convolve_cufft import CufftConvolvePlan
from .cuda_fft_convolve_four_step import FourStepConvolvePlan, four_step_reason
from .cuda_fft_convolve_unfused import UnfusedConvolvePlan, unfused_reason
from .cuda_numba import c_contiguous, numba_reason, on_device
from .cuda_numba_launch import StepLauncher
from .timed_choice import Candidate, TimedChoicePlan

_log = logging.getLogger("nvdispatch")

__all__ = [
    "TIMING_MIN_BYTES",
    "decline",
    "refusals",
    "strategies",
    "plan",
    "candidates",
    "FusedConvolvePlan",
    "LtoConvolvePlan",
    "LtoLoadConvolvePlan",
]

#: problems moving less than this (one read of x, one write of the result) take the model's choice untimed
TIMING_MIN_BYTES = 32 << 20
#: candidates the model puts beyond this many times its best estimate are not timed (``unfused`` always is)
TIMED_WITHIN = 2.0
#: at most this many candidates are planned and timed
MOST_CANDIDATES = 6
#: at most this many configurations of the four-step among them (``fft_four_step.four_step_variants``)
MOST_FOUR_STEP = 3


def times_filter_row(v, i, h):
    """Epilog of the cuFFT route: one filter row for every signal."""
    return v * h[i % h.shape[0]]


def times_filter_flat(v, i, h):
    """Epilog of the cuFFT route: a filter of the spectrum's shape."""
    return v * h[i]


def fused_reason(problem: ConvolveProblem) -> str | None:
    why = numba_reason()
    if why:
        return why
    from ..device.fft_callback_kernel import length_reason

    p = problem.forward
    if p.axes[0] != len(p.shape) - 1:
        return "the device engine transforms along the last axis"
    why = length_reason(p.lengths[0], p.real_dtype)
    if why:
        return why
    if not c_contiguous(p):
        return "x is not C-contiguous"
    if problem.filter_rows is None or not problem.filter.c_contiguous:
        return "h must be C-contiguous, one row for all signals or the spectrum's shape"
    return None


_FILTER_ALONG_LAST_AXIS = "h must be C-contiguous, one row for all signals or the spectrum's shape, along the last axis"


def _filter_reason(problem: ConvolveProblem) -> str | None:
    """Why the filter cannot be a callback's data (one flat C-contiguous array along the last axis), or None."""
    last = problem.forward.axes[0] == len(problem.forward.shape) - 1
    if not last or problem.filter_rows is None or not problem.filter.c_contiguous:
        return _FILTER_ALONG_LAST_AXIS
    return None


def _flat_filter(problem: ConvolveProblem) -> DataLayout:
    f = problem.filter
    shape = (f.shape[-1],) if problem.filter_rows == "one" else (math.prod(f.shape),)
    return DataLayout(f.framework, f.device, f.dtype, shape, (1,))


def _lto_problem(problem: ConvolveProblem) -> CallbackFFTProblem | str:
    """The forward transform with ``* h`` (and ``1/n``) as its store callback, or why there is none."""
    why = _filter_reason(problem)
    if why:
        return why
    fn = times_filter_row if problem.filter_rows == "one" else times_filter_flat
    scaled = dataclasses.replace(problem.forward, norm="forward")  # 1/n in the store callback
    return CallbackFFTProblem(scaled, None, Callback("epilog", fn, (_flat_filter(problem),)))


@functools.lru_cache(maxsize=64)
def _scaled_loader(per_signal: bool, scale):
    """The load callback of ``cufft-lto-load``: the spectrum times the filter times ``scale`` (``1/n``, a
    constant of the working precision); one function per ``(per_signal, scale)``, so plans share it."""
    if per_signal:

        def times_filter_flat_scaled(v, i, h):
            return v * h[i] * scale

        return times_filter_flat_scaled

    def times_filter_row_scaled(v, i, h):
        return v * h[i % h.shape[0]] * scale

    return times_filter_row_scaled


def _lto_load_problem(problem: ConvolveProblem) -> CallbackFFTProblem | str:
    """The inverse transform with ``* h / n`` as its load callback, or why there is none."""
    why = _filter_reason(problem)
    if why:
        return why
    inv = problem.inverse
    scale = np.dtype(inv.real_dtype).type(1.0 / inv.lengths[0])
    fn = _scaled_loader(problem.filter_rows == "each", scale)
    return CallbackFFTProblem(inv, Callback("prolog", fn, (_flat_filter(problem),)), None)


def _callback_form_reason(with_callback: CallbackFFTProblem | str, plain) -> str | None:
    """Why a cuFFT callback strategy does not apply: its transform with the callback (or why there is none),
    and the plain transform (one cuFFT launch), or None."""
    if isinstance(with_callback, str):
        return with_callback
    why = lto_reason(with_callback)
    if why:
        return why
    lay = layout(plain)
    if isinstance(lay, str):
        return lay
    return "the batch needs several cuFFT launches" if lay["loops"] else None


def lto_load_reason(problem: ConvolveProblem) -> str | None:
    if problem.forward.empty:
        return "an empty batch"
    return _callback_form_reason(_lto_load_problem(problem), problem.forward)


def lto_convolve_reason(problem: ConvolveProblem) -> str | None:
    if problem.forward.empty:
        return "an empty batch"
    if problem.forward.kind == "r2c":
        # a store callback on cuFFT's R2C gets the DC and Nyquist bins wrong (tests/fft/test_convolve_gpu.py
        # checks real signals on a GPU); cufft-lto-load covers them
        return "real signals take the load-callback form (cufft-lto-load), not a store callback on cuFFT's R2C"
    return _callback_form_reason(_lto_problem(problem), problem.inverse)


_REASONS = (
    ("device-fused", fused_reason),
    ("four-step", four_step_reason),
    ("unfused", unfused_reason),
    ("cufft-lto", lto_convolve_reason),
    ("cufft-lto-load", lto_load_reason),
)


def decline(problem: ConvolveProblem) -> str | None:
    return decline_by(problem, problem.forward.autograd, _REASONS)


def refusals(problem: ConvolveProblem) -> tuple[tuple[str, str], ...]:
    """The strategies that do not apply to ``problem``, each with why (the order of ``_REASONS``): what
    ``explain()`` shows as ``not offered``.

    A ``complex128`` signal of 8192 points, for instance, has no ``device-fused`` strategy: the device engine's
    double-precision Block FFTs stop at 4096 points
    (:data:`~nvdispatch.device.fft_config.MAX_SIZE_FLOAT64`), on every GPU."""
    return tuple((name, why) for name, reason in _REASONS if (why := reason(problem)) is not None)


def _refusal_steps(problem: ConvolveProblem) -> tuple[str, ...]:
    return tuple(f"not offered: {name} ({why})" for name, why in refusals(problem))


def _four_step_variants(problem: ConvolveProblem) -> list:
    from ..device.fft_four_step import four_step_variants

    f = problem.forward
    return four_step_variants(f.lengths[0], f.real_dtype, MOST_FOUR_STEP)


def _four_step_estimate(problem: ConvolveProblem, variant) -> model.Estimate:
    c = variant.column
    run = 0 if c.threads_per_column == 1 else c.columns * c.complex_bytes
    return model.estimate(problem, "four-step", tile_run_bytes=run, middle_length=variant.parts[1])


def _estimate(problem: ConvolveProblem, strategy: str) -> model.Estimate:
    """The model's estimate of ``strategy``; of the four-step, its best configuration's."""
    if strategy != "four-step":
        return model.estimate(problem, strategy)
    return min((_four_step_estimate(problem, v) for v in _four_step_variants(problem)), key=lambda e: e.floors)


def _ordered(problem: ConvolveProblem) -> list[tuple[str, model.Estimate]]:
    """The strategies that apply, cheapest first by the model (ties: the order of ``_REASONS``)."""
    rated = [(name, _estimate(problem, name)) for name in strategies_by(problem, _REASONS)]
    return sorted(rated, key=lambda item: item[1].floors)


def strategies(problem: ConvolveProblem) -> tuple[str, ...]:
    names = tuple(name for name, _ in _ordered(problem))
    return ("timed", *names) if len(names) > 1 else names


def _fused_alternative(problem: ConvolveProblem) -> int | None:
    """Elements per thread of a second device-fused kernel worth timing (lengths from 512), or None."""
    from ..device.fft_config import FFTConfig, valid_elements_per_thread

    p = problem.forward
    n = p.lengths[0]
    if n < 512:
        return None
    suggested = FFTConfig.build(
        fft_type=p.kind,
        size=n,
        precision=np.dtype(p.real_dtype).type,
        direction="forward",
        execution="Block",
        elements_per_thread="suggested",
        ffts_per_block="suggested",
    ).elements_per_thread
    options = valid_elements_per_thread(n, p.kind)
    return next((e for e in (8, 16, 32) if e != suggested and e in options), None)


def candidates(problem: ConvolveProblem) -> list[Candidate]:
    """What the timed choice plans and times, cheapest first by the model: the strategies within
    :data:`TIMED_WITHIN` of the model's best (and ``unfused``), at most :data:`MOST_CANDIDATES`."""
    rated = _ordered(problem)
    best = rated[0][1].floors
    chosen: list[Candidate] = []
    for name, est in rated:
        if name != "unfused" and est.floors > TIMED_WITHIN * best:
            continue
        if name == "four-step":
            chosen += _four_step_candidates(problem)
            continue
        chosen.append(Candidate(name, functools.partial(_make, problem, name), est.floors, est.detail))
        if name == "device-fused" and pairs_reason(problem) is None:
            paired = model.estimate(problem, name, pairs=True)
            make = functools.partial(FusedConvolvePlan, problem, name, pairs=True)
            chosen.append(Candidate("device-fused pairs", make, paired.floors, paired.detail))
        if name == "device-fused":
            alt = _fused_alternative(problem)
            if alt is not None:
                make = functools.partial(FusedConvolvePlan, problem, "device-fused", alt)
                chosen.append(Candidate(f"device-fused ept={alt}", make, est.floors, est.detail))
    chosen.sort(key=lambda c: c.model)
    if len(chosen) > MOST_CANDIDATES:
        keep = [c for c in chosen if c.label != "unfused"][: MOST_CANDIDATES - 1]
        chosen = [c for c in chosen if c in keep or c.label == "unfused"]
    return chosen


def _four_step_candidates(problem: ConvolveProblem) -> list[Candidate]:
    """The four-step's configurations: ``four-step`` (the engine's default), then ``four-step <label>``."""
    out = []
    for i, variant in enumerate(_four_step_variants(problem)):
        est = _four_step_estimate(problem, variant)
        if i == 0:
            make = functools.partial(_make, problem, "four-step")
            label = "four-step"
        else:
            make = functools.partial(FourStepConvolvePlan, problem, "four-step", variant)
            label = f"four-step {variant.label}"
        out.append(Candidate(label, make, est.floors, est.detail))
    return out


@functools.lru_cache(maxsize=16)
def environment(device_index: int) -> dict:
    """What a timed choice depends on besides the problem: the GPU, the driver, cuFFT, nvdispatch."""
    from .._cuda import cufft, runtime

    rt = runtime.cudart()
    prop = runtime.check(rt.cudaGetDeviceProperties(device_index), "cudaGetDeviceProperties")
    name = prop.name.decode(errors="replace") if isinstance(prop.name, bytes) else str(prop.name)
    return {
        "gpu": name.split("\x00", 1)[0].strip(),
        "cc": f"{prop.major}.{prop.minor}",
        "driver": int(runtime.check(rt.cudaDriverGetVersion(), "cudaDriverGetVersion")),
        "cufft": cufft.version(),
        "nvdispatch": __version__,
    }


def _clock_for(problem: ConvolveProblem, device_index: int):
    def clock_for(operands, stream):
        from .._cuda import stream_clock, streams

        s = streams.stream_pointer(stream, problem.framework, device_index)
        try:
            return stream_clock.clock_for(s)
        except Exception as exc:  # noqa: BLE001 - no timing here: the model's first runs, the call goes on
            _log.warning("convolve: cannot time the candidates on stream %#x (%s); the model's first runs", s, exc)
            return None

    return clock_for


def _result_check(problem: ConvolveProblem, device_index: int) -> ResultCheck:
    """The timed choice's check of its candidates against ``unfused`` (cuFFT, one multiply, cuFFT): a sample
    of each result read back, within :func:`~nvdispatch._fft_tolerance` of results as large as the
    reference's sample or as ``max|x| * max|h|`` (``h`` scales the spectrum: the result's rounding follows
    the signal's size even where the filter makes the result small)."""
    fw = problem.framework

    def sample(result, stream):
        from .._cuda import arrays, result_sample, streams

        return result_sample.sample_device(arrays.view(result, fw), streams.stream_pointer(stream, fw, device_index))

    def tolerance(expected, operands, stream):
        inputs = [sample(operands[name], stream) for name in ("x", "h")]
        scale = max(magnitude(expected), magnitude(inputs[0]) * magnitude(inputs[1]))
        return fft_tolerance(problem.forward.real_dtype, problem.forward.lengths[0], scale)

    return ResultCheck("unfused", sample, tolerance, tuple(problem.inverse.out_shape))


def _timed_plan(problem: ConvolveProblem, tuning) -> TimedChoicePlan:
    from .._cuda import runtime

    dev = problem.device.index if problem.device.index is not None else runtime.current_device()
    env = environment(dev)
    sizes = model.sizes_of(problem)
    cands = candidates(problem)
    time_it = sizes.floor_bytes >= TIMING_MIN_BYTES and len(cands) > 1
    if len(cands) == 1:
        why = "the model rules out the others"
    else:
        why = f"{sizes.floor_bytes / 2**20:.1f} MiB moved, under the {TIMING_MIN_BYTES >> 20} MiB worth timing"
    key = ("timed-choice", "fft_convolve", tuple(sorted(env.items())), problem)
    return TimedChoicePlan(
        problem,
        "timed",
        cands,
        environment=env,
        clock_for=_clock_for(problem, dev),
        tuning_key=key,
        tuning=tuning,
        time_it=time_it,
        why_not_timed=why,
        check=_result_check(problem, dev),
        notes=_refusal_steps(problem),
    )


def _make(problem: ConvolveProblem, strategy: str):
    if strategy == "device-fused":
        return FusedConvolvePlan(problem, strategy)
    if strategy == "four-step":
        return FourStepConvolvePlan(problem, strategy)
    if strategy == "unfused":
        return UnfusedConvolvePlan(problem, strategy)
    if strategy == "cufft-lto-load":
        return LtoLoadConvolvePlan(problem, strategy)
    return LtoConvolvePlan(problem, strategy)


def plan(problem: ConvolveProblem, strategy: str, tuning=None):
    """The plan of ``strategy``; its ``steps`` (what ``explain()`` shows) end with the strategies not offered
    for ``problem`` and why (:func:`refusals`)."""
    if strategy == "timed":
        return _timed_plan(problem, tuning)
    made = _make(problem, strategy)
    notes = _refusal_steps(problem)
    if notes:
        made.steps = (*made.steps[:-1], *notes, made.steps[-1])
    return made


def pairs_reason(problem: ConvolveProblem) -> str | None:
    """Why the one-kernel convolution cannot take two real rows as one complex signal, or None."""
    p = problem.forward
    if p.kind != "r2c":
        return "complex signals"
    if p.dtype != p.real_dtype:
        return f"{p.dtype} x would be promoted first"
    if problem.filter_rows != "one":
        return "a filter row per signal (the two rows of a pair need one filter)"
    return None


class FusedConvolvePlan:
    """One kernel: load -> FFT -> * h -> inverse FFT -> store. With ``pairs`` (real signals, one filter row)
    two real rows are one complex transform and ``h`` is first completed to a Hermitian filter (a small
    kernel): half the transforms of the real form."""

    def __init__(
        self,
        problem: ConvolveProblem,
        strategy: str,
        elements_per_thread: int | str = "suggested",
        ffts_per_block: int | str = "suggested",
        pairs: bool = False,
    ):
        from numba.cuda import types
        from numba.np.numpy_support import from_dtype

        from .._cuda import arrays, runtime
        from ..device.fft_callback_kernel import KernelSpec, convolution_kernel
        from ..device.fft_filter import permute_kernel

        self.problem, self.strategy = problem, strategy
        p = problem.forward
        if pairs and pairs_reason(problem):
            raise CallbackError("x", "real signals with one filter row (pairs)", pairs_reason(problem))
        self.pairs = pairs
        self.device_index = p.device.index if p.device.index is not None else runtime.current_device()
        n = p.lengths[0]
        self.rows = math.prod(p.shape[:-1])
        self.n_mid = p.out_shape[-1]
        self.per_row = problem.filter_rows == "each"
        spec = KernelSpec(
            "c2c" if pairs else p.kind,
            n,
            p.real_dtype,
            "forward",
            p.shape[-1],
            scale=1.0 if pairs else 1.0 / n,  # pairs: 1/n is folded into the completed filter
            convolve=True,
            filter_per_row=self.per_row,
            elements_per_thread=elements_per_thread,
            ffts_per_block=ffts_per_block,
            pairs=pairs,
        )
        self.spec = spec
        self.kernel = convolution_kernel(spec)
        self.complex_dtype = np.dtype(p.compute_dtype)
        argtypes = [
            types.Array(from_dtype(np.dtype(p.dtype)), 2, "C"),
            types.Array(from_dtype(np.dtype(problem.inverse.result_dtype)), 2, "C"),
            types.Array(from_dtype(self.complex_dtype if pairs else np.dtype(problem.filter.dtype)), 2, "C"),
        ]
        self._several = runtime.device_count() > 1
        try:
            with on_device(self.device_index, self._several):
                self.kernel.compile(argtypes)
                if pairs:
                    h1 = types.Array(from_dtype(np.dtype(problem.filter.dtype)), 1, "C")
                    real = from_dtype(np.dtype(p.real_dtype))
                    permute_kernel(problem.filter.dtype).compile((h1, argtypes[2], types.int64, types.int64, real))
        except Exception as exc:  # noqa: BLE001
            raise CallbackError("h", "a filter the generated convolution kernel compiles for", str(exc)) from exc
        self._pointer = arrays.pointer_getter(p.framework)
        self.launcher = StepLauncher(
            self._steps(), 4 if pairs else 3, self.device_index, self._several, f"convolve {strategy}"
        )
        F = self.kernel.first
        pair_steps = (
            f"complete h to a Hermitian filter of {n} values, times 1/{n} (two real rows x[2r] + i x[2r+1] are one "
            "complex signal: the real and imaginary parts of its convolution are the two rows')",
        )
        kind = "c2c (two real rows a transform)" if pairs else p.kind
        self.steps = (
            *(pair_steps if pairs else ()),
            f"one generated Numba kernel per call: load x -> block {kind} FFT n={n} -> multiply by h "
            f"({'one row per signal' if self.per_row else 'one row for all'}) in registers -> block "
            f"{self.kernel.second.fft_type} inverse FFT -> {'' if pairs else f'scale 1/{n} -> '}store "
            f"({F.elements_per_thread} elements/thread, {F.ffts_per_block} FFTs/block)",
            f"grid {self.kernel.grid(self.rows)} x block {self.kernel.block_dim}, "
            f"{self.kernel.shared_memory_size} B shared memory, on the caller's stream",
            self.launcher.how,
            problem.describe(),
        )

    def _steps(self) -> tuple:
        """The launches on the operands ``(x, out, h[, the completed filter])``."""
        from ..device.fft_filter import permute_step
        from ..device.kernel_steps import ArrayArg

        p, problem = self.problem.forward, self.problem
        x = ArrayArg(0, (self.rows, p.shape[-1]), np.dtype(p.dtype))
        out = ArrayArg(1, (self.rows, self.spec.n_out), np.dtype(problem.inverse.result_dtype))
        h_dtype = np.dtype(problem.filter.dtype)
        if not self.pairs:
            h = ArrayArg(2, (self.rows if self.per_row else 1, self.n_mid), h_dtype)
            return (self.kernel.convolution_step(x, out, h),)
        n = p.lengths[0]
        completed = ArrayArg(3, (1, n), self.complex_dtype)
        scale = np.dtype(p.real_dtype).type(1.0 / n)
        return (
            permute_step(ArrayArg(2, (self.n_mid,), h_dtype), completed, True, scale),
            self.kernel.convolution_step(x, out, completed),
        )

    def execute(self, operands, stream=None):
        from .._cuda import arrays, memory, streams

        p, inv = self.problem.forward, self.problem.inverse
        fw = p.framework
        x, h = operands["x"], operands["h"]
        s = streams.stream_pointer(stream, fw, self.device_index)
        out, out_ptr = arrays.empty(arrays.result_kind(x, fw), inv.out_shape, inv.result_dtype, self.device_index, s)
        if self.rows == 0:
            return out
        pointer = self._pointer
        if not self.pairs:
            self.launcher(s, (pointer(x), out_ptr, pointer(h)))
            return out
        n = p.lengths[0]
        scratch = memory.scratch(n * self.complex_dtype.itemsize, fw, self.device_index, s)
        try:
            self.launcher(s, (pointer(x), out_ptr, pointer(h), scratch.ptr))
        finally:
            scratch.release()  # stream-ordered: reused only after the kernel
        return out

    def release(self) -> None:
        pass


class LtoConvolvePlan(CufftConvolvePlan):
    """cuFFT forward with ``* h / n`` as LTO store callback into a scratch spectrum, then cuFFT inverse
    (unnormalised) into the result."""

    def __init__(self, problem: ConvolveProblem, strategy: str):
        super().__init__(
            problem,
            strategy,
            lambda: LtoCallbackPlan(_lto_problem(problem), "cufft-lto"),
            lambda: CudaFFTPlan(problem.inverse, "cufft"),
        )
        self.steps = (
            *self.forward.steps[:-1],
            self.inverse.steps[0],
            "cufftExec of the inverse on the caller's stream, unnormalised (it may overwrite the spectrum)",
            problem.describe(),
        )

    def before_forward(self, operands: dict, stream: int) -> None:
        self.forward.bind_data({"epilog_data": (operands["h"],)}, stream)


class LtoLoadConvolvePlan(CufftConvolvePlan):
    """cuFFT forward into a scratch spectrum, then cuFFT inverse with ``* h / n`` as LTO load callback into the
    result."""

    def __init__(self, problem: ConvolveProblem, strategy: str):
        super().__init__(
            problem,
            strategy,
            lambda: CudaFFTPlan(problem.forward, "cufft"),
            lambda: LtoCallbackPlan(_lto_load_problem(problem), "cufft-lto"),
        )
        f = problem.forward
        self.steps = (
            self.forward.steps[0],
            "cufftExec of the forward transform on the caller's stream into a scratch spectrum",
            *[s for s in self.inverse.steps[:-1] if not s.startswith(("scale by", "copy the input", "cufftExec"))],
            "cufftExec of the inverse on the caller's stream (it may overwrite the spectrum)",
            f"the load callback multiplies by h / {f.lengths[0]}: the inverse runs unnormalised",
            problem.describe(),
        )

    def between_transforms(self, spectrum, operands: dict, stream: int) -> None:
        self.inverse.bind_data({"prolog_data": (operands["h"],)}, stream)
