"""``nvdispatch.fft.convolve``: filter a batch of signals in the frequency domain, ``ifft(fft(x, n) * h, n)``.

The problem (:class:`ConvolveProblem`) is the forward transform of ``x`` (``fft`` for complex ``x``,
``rfft`` for real ``x``), the filter's layout, and the inverse transform; executors implement the op
``fft_convolve`` (``executors/<executor>_fft_convolve.py``):

* ``"cuda"``: the fastest of its strategies, timed on the first call of a large problem (one generated
  kernel for lengths up to 4096, the four-step kernels for longer signals, cuFFT with one multiply kernel or
  an LTO callback), see :mod:`nvdispatch.executors.cuda_fft_convolve`;
* NumPy, Torch, CuPy: the executor's forward FFT, one multiply, its inverse FFT;
* Dask: the same, lazily, block by block (:mod:`nvdispatch.executors.dask_fft_convolve`).

The result is the same for every ``norm`` pair of the array API (the two factors multiply to ``1/n``), so
there is no ``norm`` argument.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

from ._adapters import adapter_for
from ._detect import OperandInfo, detect
from ._fft_callbacks import DataLayout
from ._fft_conventions import autocast_promotion
from ._fft_problem import FFTProblem, build_fft_problem
from ._precision import FFT_AUTOCAST, FILTER_AUTOCAST
from ._route import (
    Explanation,
    check_stream,
    coerce_operands,
    explain_selected,
    placement,
    run_uncached,
    select,
)
from ._shapes import broadcast_shapes
from .errors import ShapeMismatchError, UnsupportedDtypeError

__all__ = [
    "ConvolveProblem",
    "OP",
    "build_convolve_problem",
    "run",
    "explain",
    "VectorisedConvolvePlan",
    "VectorisedConvolveOp",
]

OP = "fft_convolve"


@dataclass(frozen=True)
class ConvolveProblem:
    """``inverse(forward(x) * h)``: the two transforms and the filter's layout (the plan-cache key)."""

    forward: FFTProblem
    inverse: FFTProblem
    filter: DataLayout

    @property
    def framework(self) -> str:
        return self.forward.framework

    @property
    def device(self):
        return self.forward.device

    @property
    def memory(self) -> frozenset[str]:
        return self.forward.memory

    @property
    def spectrum_shape(self) -> tuple[int, ...]:
        return self.forward.out_shape

    @property
    def filter_rows(self) -> str | None:
        """How the filter spans the batch when the transform is along the last axis: ``"one"`` (one filter
        for every row), ``"each"`` (a C-contiguous filter of the spectrum's shape), None otherwise."""
        shape, spec = self.filter.shape, self.spectrum_shape
        if all(e == 1 for e in shape[:-1]) and shape and shape[-1] == spec[-1]:
            return "one"
        if tuple(shape) == tuple(spec) and self.filter.c_contiguous:
            return "each"
        return None

    def describe(self) -> str:
        f = self.forward
        return (
            f"convolve({f.dtype}{list(f.shape)}, h={self.filter.dtype}{list(self.filter.shape)}, n={f.lengths[0]}, "
            f"axis={f.axes[0]}) = {self.inverse.func}({f.func}(x) * h) -> {self.inverse.result_dtype}"
            f"{list(self.inverse.out_shape)}"
        )


def prepare(x, h, n, axis):
    """Validate; return ``(problem, operands, precision)``: ``precision`` names the autocast region that cast
    operands (:func:`autocast_operands`), else None."""
    infos = {"x": detect("x", x), "h": detect("h", h)}  # both required: None is an error
    infos, precision = autocast_operands(infos)
    framework, device = placement(infos)
    problem = build_convolve_problem(infos["x"], infos["h"], framework, device, n, axis)
    return problem, {"x": infos["x"].array, "h": infos["h"].array}, precision  # the views executors take


def autocast_operands(infos: dict[str, OperandInfo]) -> tuple[dict[str, OperandInfo], str | None]:
    """``infos`` (``x``'s and ``h``'s) with the operands an autocast region the framework's FFTs follow casts cast
    (:func:`~nvdispatch._fft_conventions.autocast_promotion`): the convolution is ours, and follows the composition
    of the framework's own ops in the region, ``irfft(rfft(x, n) * h, n)``, whose forward transform computes a
    float16/bfloat16 ``x`` in float32 and whose product promotes a half-precision ``h`` (complex32 too) to the
    spectrum's precision; and the note ``explain()`` gives (None where nothing is cast)."""
    notes = []
    for name, rule in (("x", FFT_AUTOCAST), ("h", FILTER_AUTOCAST)):
        info = infos[name]
        region = autocast_promotion(info.array, info.dtype, rule=rule)
        if region is not None:
            cast = adapter_for(info.array).cast(info.array, region[0])
            infos = {**infos, name: detect(name, cast)}
            notes.append((region[1], f"{name} ({info.dtype}) cast to {region[0]}"))
    if not notes:
        return infos, None
    return infos, (
        f"{notes[0][0]}: {', '.join(n for _, n in notes)} first, as the framework's own irfft(rfft(x) * h) computes "
        "in the region"
    )


def build_convolve_problem(xi: OperandInfo, hi: OperandInfo, framework: str, device, n, axis) -> ConvolveProblem:
    """The :class:`ConvolveProblem` of signals ``xi`` and filter ``hi`` (operand descriptions), validated."""
    real = xi.dtype in ("float32", "float64")
    forward = build_fft_problem("rfft" if real else "fft", xi, framework, device, n=n, axis=axis)
    spectrum = OperandInfo(None, framework, device, forward.result_dtype, forward.out_shape, None, memory=xi.memory)
    length = forward.lengths[0]
    inverse = build_fft_problem("irfft" if real else "ifft", spectrum, framework, device, n=length, axis=axis)
    if hi.dtype not in ("float32", "float64", "complex64", "complex128"):
        raise UnsupportedDtypeError("h", "a floating filter (real or complex)", hi.dtype)
    spec_shape = forward.out_shape
    try:
        ok = broadcast_shapes(tuple(hi.shape), spec_shape) == spec_shape
    except ValueError:
        ok = False
    if not ok:
        raise ShapeMismatchError(
            "h",
            f"a filter broadcastable to the spectrum's shape {spec_shape} "
            f"({spec_shape[forward.axes[0]]} values along axis {forward.axes[0]})",
            f"shape {tuple(hi.shape)}",
        )
    layout = DataLayout(hi.framework, hi.device, hi.dtype, tuple(hi.shape), hi.strides)
    return ConvolveProblem(forward, inverse, layout)


def run(x, h, n=None, axis=-1, stream=None):
    problem, operands, _ = prepare(x, h, n, axis)
    check_stream(stream, x)
    return run_uncached(OP, problem, operands, stream, _coerce, x)


def _coerce(sel, operands: dict) -> dict:
    return coerce_operands(sel, operands, ("x", "h"))


def explain(x, h, n=None, axis=-1, stream=None) -> Explanation:
    problem, _, precision = prepare(x, h, n, axis)
    check_stream(stream, x)
    explanation = explain_selected("convolve", OP, problem, select(OP, problem))
    return explanation if precision is None else dataclasses.replace(explanation, precision=precision)


class VectorisedConvolvePlan:
    """The executor's forward FFT, ``* h`` (cast back to the transform's dtype), its inverse FFT."""

    def __init__(self, problem: ConvolveProblem, strategy: str, forward, inverse, stream_context=None):
        self.problem, self.strategy = problem, strategy
        self.forward, self.inverse = forward, inverse
        self._stream_context = stream_context
        self.steps = (
            *forward.steps[:-1],
            f"multiply the spectrum by h ({problem.filter.dtype}{list(problem.filter.shape)}, broadcast)",
            *inverse.steps[:-1],
            problem.describe(),
        )

    def execute(self, operands, stream=None):
        from array_api_compat import array_namespace

        ctx = self._stream_context(stream, self.problem.device) if self._stream_context else contextlib.nullcontext()
        with ctx:
            x, h = operands["x"], operands["h"]
            xp = array_namespace(x)
            y = self.forward.execute({"x": x}, stream)
            y = y * h
            want = getattr(xp, self.problem.forward.result_dtype)
            if y.dtype != want:
                y = xp.astype(y, want)
            return self.inverse.execute({"x": y}, stream)

    def release(self) -> None:
        self.forward.release()
        self.inverse.release()


class VectorisedConvolveOp:
    """The ``fft_convolve`` op of an executor that has a plain FFT op (module ``base``): its forward FFT,
    one multiply, its inverse FFT. An executor's ``<name>_fft_convolve`` module exposes the bound methods as
    its ``decline``/``strategies``/``plan``; ``stream_context`` as in :class:`VectorisedConvolvePlan`."""

    def __init__(self, base, stream_context=None):
        self.base, self.stream_context = base, stream_context

    def decline(self, problem: ConvolveProblem) -> str | None:
        return self.base.decline(problem.forward) or self.base.decline(problem.inverse)

    def strategies(self, problem: ConvolveProblem) -> tuple[str, ...]:
        return ("fft-multiply-ifft",)

    def plan(self, problem: ConvolveProblem, strategy: str, tuning=None) -> VectorisedConvolvePlan:
        base = self.base
        forward = base.plan(problem.forward, base.strategies(problem.forward)[0])
        inverse = base.plan(problem.inverse, base.strategies(problem.inverse)[0])
        return VectorisedConvolvePlan(problem, strategy, forward, inverse, self.stream_context)
