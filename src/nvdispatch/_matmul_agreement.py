"""``Matmul.autotune``'s check that the strategies it times compute what the plainest one computes.

Each strategy's result on the call's operands (of a run the timing makes anyway, where the caller keeps its
sample, else of a run of its own) is compared on a sample (:mod:`nvdispatch._agreement`) with the reference
strategy's: ``plain`` (the framework's own
matmul, then the epilog's steps one by one) where the executor offers it, else ``inplace``. A strategy that
disagrees beyond :func:`~nvdispatch._agreement.gemm_tolerance` (``k``, the operands' magnitudes, plus the
result's own rounding) is left out of the choice with a WARNING. Host results are sampled in place; device
results through :mod:`nvdispatch._cuda.result_sample` (only the sample is copied). Where a result or operand
cannot be sampled (a dtype the host cannot read), nothing is checked and the timing goes on as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from ._agreement import Rejection, disagreement, gemm_tolerance, magnitude, position, sample_host, warn
from ._matmul_problem import scalar_value

__all__ = ["REFERENCES", "reference_of", "agreeing", "result_sampler", "compute_dtype", "describe", "scalar_magnitude"]

#: the strategies trusted as the reference, most trusted first
REFERENCES = ("plain", "inplace")
_log = logging.getLogger("nvdispatch")


def reference_of(strategies) -> str | None:
    """The reference among ``strategies``, None where there is none."""
    return next((s for s in REFERENCES if s in strategies), None)


def _sampler(problem, stream) -> Callable[[Any], np.ndarray]:
    if problem.device.kind == "cpu":
        return sample_host
    from ._cuda import arrays, result_sample, streams

    fw = problem.framework
    pointer = streams.stream_pointer(stream, fw, problem.device.index)
    return lambda x: result_sample.sample_device(arrays.view(x, fw), pointer)


def compute_dtype(problem) -> str:
    """The dtype whose rounding the products accumulate in, taken loosely: TF32's for float32 on a GPU (cuBLAS
    may take it) and for FP8 products (fast accumulation), float32's for half types, or the reduced type of a
    compute type asked for."""
    if getattr(problem, "quantization", None) is not None:
        return "tf32"
    asked = str(getattr(getattr(problem, "options", None), "compute_type", None) or "")
    for marker, dtype in (("16BF", "bfloat16"), ("16F", "float16"), ("TF32", "tf32")):
        if marker in asked:  # a reduced-precision compute type asked for (e.g. COMPUTE_32F_FAST_16BF)
            return dtype
    dt = problem.result_dtype
    if dt in ("float16", "bfloat16"):
        return "float32"
    if dt in ("float32", "complex64") and problem.device.kind != "cpu":
        return "tf32"
    return dt


def scalar_magnitude(value) -> float:
    """``|value|`` of a scalar operand (``alpha``, ``beta``); 1 where it is no number here (a device scalar)."""
    try:
        return abs(complex(scalar_value(value)))
    except (TypeError, ValueError):
        return 1.0


def agreeing(
    plans: dict[str, Any],
    problem,
    operands: dict,
    stream,
    reference: str | None = None,
    what: str = "matmul autotune",
    samples: dict[str, np.ndarray] | None = None,
) -> tuple[dict[str, Any], dict[str, Rejection]]:
    """``(the plans whose results agree with the reference's, {name: rejection})``: see the module docstring.
    ``reference`` names the trusted plan (default: :func:`reference_of` the names); ``what`` is the choice being
    made, for the WARNING; ``samples`` the samples (:func:`result_sampler`) of results the caller already has
    (of the runs it times: those plans are not run again). A plan failing when checked is left for the timing to
    report."""
    ref = reference if reference in plans else reference_of(plans)
    if ref is None or len(plans) < 2:
        return plans, {}
    samples = dict(samples or {})
    try:
        sample = _sampler(problem, stream)
        expected = samples[ref] if ref in samples else sample(_result(plans[ref].execute(operands, stream)))
        a, b = sample(operands["a"]), sample(operands["b"])
        extra = [sample(operands[name]) for name, _ in problem.inputs if name in operands]
        beta = operands.get("beta")
        c = magnitude(sample(operands["c"])) if operands.get("c") is not None else 0.0
        c_scale = c * (1.0 if beta is None else scalar_magnitude(beta))
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - what cannot be sampled is not checked
        _log.debug("%s: results not checked for %s (%s)", what, describe(problem), exc)
        return plans, {}
    scale = scalar_magnitude(operands.get("alpha", 1)) * magnitude(a) * magnitude(b)
    result_scale = magnitude(expected) + c_scale + magnitude(*extra)
    tolerance = gemm_tolerance(compute_dtype(problem), problem.k, scale, problem.result_dtype, result_scale)
    kept, rejected = {ref: plans[ref]}, {}
    shape = tuple(problem.result_shape)
    for name, plan in plans.items():
        if name == ref:
            continue
        try:
            got = samples[name] if name in samples else sample(_result(plan.execute(operands, stream)))
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except Exception:  # noqa: BLE001 - the timing runs it again and reports the failure
            kept[name] = plan
            continue
        bad = disagreement(expected, got, tolerance)
        if bad is None:
            kept[name] = plan
            continue
        where = position(shape, bad[1]) if shape else f"sample element {bad[1]}"
        rejected[name] = Rejection(name, ref, bad[0], tolerance, where)
        warn(what, describe(problem), rejected[name])
    return {s: kept[s] for s in plans if s in kept}, rejected


def result_sampler(problem, stream) -> Callable[[Any], np.ndarray | None]:
    """A function giving the sample of a plan's result (a ``(result, aux)`` pair's result), None where it
    cannot be sampled: for callers that keep the samples of runs they make anyway (``agreeing(samples=)``)."""
    try:
        sample = _sampler(problem, stream)
    except Exception:  # noqa: BLE001 - no sampling here: agreeing runs what it needs itself
        return lambda got: None

    def sampled(got):
        try:
            return sample(_result(got))
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except Exception:  # noqa: BLE001
            return None

    return sampled


def describe(problem) -> str:
    steps = " + ".join(problem.epilog.steps) or "none"
    c = f" + beta * c{list(problem.c.shape)}" if problem.c is not None else ""
    return (
        f"matmul({problem.a.dtype}{list(problem.a.shape)} @ {problem.b.dtype}{list(problem.b.shape)}{c}, "
        f"epilog {steps}) -> {problem.result_dtype}{list(problem.result_shape)}"
    )


def _result(got):
    return got[0] if isinstance(got, tuple) else got
