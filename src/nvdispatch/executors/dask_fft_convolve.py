"""``nvdispatch.fft.convolve`` for Dask arrays, lazily: the Dask executor's forward FFT (blocks along whole axes,
rechunked where the convolved axis is chunked), one multiply by the filter (Dask broadcasts and aligns the
filter's chunks), and the inverse FFT of that product as it is chunked then (see :mod:`nvdispatch._fft_convolve`)."""

from __future__ import annotations

from .. import fft
from .._fft_convolve import ConvolveProblem, VectorisedConvolveOp
from . import dask_fft as base
from . import dask_graph as G

_op = VectorisedConvolveOp(base)
decline, strategies = _op.decline, _op.strategies


def plan(problem: ConvolveProblem, strategy: str, tuning=None) -> DaskConvolvePlan:
    return DaskConvolvePlan(problem, strategy)


class DaskConvolvePlan:
    """The forward FFT's stages, ``* h``, the inverse FFT: the inverse is planned on the product's own chunks
    (the multiply may rechunk it), through ``nvdispatch.fft`` as every Dask stage is."""

    def __init__(self, problem: ConvolveProblem, strategy: str):
        self.problem, self.strategy = problem, strategy
        self.forward = base.plan(problem.forward, "stages")
        inv = problem.inverse
        self.steps = (
            *self.forward.steps[:-1],
            f"multiply the spectrum by h ({problem.filter.dtype}{list(problem.filter.shape)}, broadcast, lazily)",
            f"{inv.func} of the product along axis {inv.axes[0]} (n={inv.lengths[0]}), staged on its chunks",
            problem.describe(),
        )

    def execute(self, operands, stream=None):
        inv = self.problem.inverse
        y = self.forward.execute({"x": operands["x"]}, stream) * G.wrap(operands["h"])
        y = y.astype(self.problem.forward.result_dtype, copy=False)
        return getattr(fft, inv.func)(y, n=inv.lengths[0], axis=inv.axes[0])

    def release(self) -> None:
        self.forward.release()
