"""The :class:`~.lt_autotune.ResultSample` a cuBLASLt autotune checks its winner with: a sample of the
result read back from the device (:mod:`.result_sample`), and a tolerance from the GEMM's depth and the
magnitudes of samples of ``a`` and ``b`` (:func:`~nvdispatch._agreement.gemm_tolerance`), plus the result's
own rounding (its reference sample, ``beta * c`` and the epilog's inputs). Where an operand cannot be read
on the host (FP8), the result's magnitude stands in for ``max|a| * max|b|`` (per product term: looser)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._agreement import gemm_tolerance, magnitude
from .._matmul_agreement import compute_dtype, describe, scalar_magnitude
from .._matmul_problem import MatmulProblem
from .lt_autotune import ResultSample
from .result_sample import sample_device

__all__ = ["result_check"]


def result_check(
    problem: MatmulProblem,
    result: Callable[[], Any],
    shape: tuple[int, ...],
    operands: dict[str, Any],
    stream: int,
    alpha: Any = 1,
    beta: Any = None,
) -> ResultSample:
    """The check of ``problem``'s candidates: ``result()`` gives the view (``ptr``, ``dtype``, ``shape``,
    ``strides`` in elements) of the latest launch's result, whose shape is ``shape``; ``operands`` views of
    ``a``, ``b`` and, where given, ``c`` and the epilog's inputs; copies are queued on ``stream``."""

    def read():
        return sample_device(result(), stream)

    def sampled(name: str) -> float | None:
        view = operands.get(name)
        if view is None:
            return 0.0
        try:
            return magnitude(sample_device(view, stream))
        except TypeError:  # a dtype NumPy has not (FP8)
            return None

    def tolerance(expected) -> float:
        ref = magnitude(expected)
        a, b = sampled("a"), sampled("b")
        scale = ref if a is None or b is None else scalar_magnitude(alpha) * a * b
        extra = max((sampled(name) or 0.0 for name in operands if name not in ("a", "b", "c")), default=0.0)
        c = (sampled("c") or 0.0) * (scalar_magnitude(beta) if beta is not None else 1.0)
        return gemm_tolerance(compute_dtype(problem), problem.k, scale, problem.result_dtype, ref + c + extra)

    return ResultSample(read, tolerance, tuple(shape), describe(problem))
