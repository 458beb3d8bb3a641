"""Checking that the candidates of a timed choice compute what a trusted candidate computes.

Where nvdispatch chooses among strategies or algorithms by timing them (the GPU convolution's strategies,
cuBLASLt's algorithms, the CPU matmul strategies of ``Matmul.autotune``), a candidate that is fast but wrong
would otherwise be chosen silently and kept with the plan. So when the choice is made (once: it is cached with
the plan, never per call), every candidate's result is compared with the *reference* candidate's (the
simplest, most trusted one) on a deterministic sample of the result, and a candidate that disagrees is left
out of the choice, with a WARNING naming it, the problem and the error, and a line in ``explain()``.

The sample (:func:`runs`) is a few rows spread across the batch (the first, the last, the middle and a few
between), and in each row its two ends, the elements around its quarters and middle (where tiles of a
power-of-two split meet) and a strided sweep over the whole row, offset differently per row. Only the sample
is read back: :func:`gather` reads it through a ``read(offset, step, count)`` function, on the host from an
array (:func:`host_reader`) or from device memory by the caller's copy.

The tolerances grow with the dtype's rounding unit and the problem's size: for an FFT convolution of length
``n``, ``FFT_FACTOR * eps * log2(n) * scale``; for a GEMM of depth ``k``, ``GEMM_FACTOR * eps * k * scale``,
``scale`` being the magnitude the result's rounding errors are relative to (the caller's estimate from its
operands' and the reference's samples). A wrong index gives errors of the order of the result itself, far
above either.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "FFT_FACTOR",
    "GEMM_FACTOR",
    "Rejection",
    "ResultCheck",
    "Run",
    "disagreement",
    "eps_of",
    "fft_tolerance",
    "gather",
    "gemm_tolerance",
    "host_reader",
    "magnitude",
    "position",
    "runs",
    "sample_host",
    "warn",
]

#: the constant of the FFT bound (generous: a rejection must never be rounding)
FFT_FACTOR = 32.0
#: the constant of the GEMM bound
GEMM_FACTOR = 4.0
#: rows of the result sampled at most
ROWS = 8
#: elements read at each end of a row and around each of its quarter points
EDGE = 16
#: elements of the strided sweep over each sampled row
SWEEP = 64

_log = logging.getLogger("nvdispatch")
_EPS = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "tf32": 2.0**-11}


def eps_of(dtype: Any) -> float:
    """The rounding unit (machine epsilon) of ``dtype``: a NumPy dtype, its name, ``"bfloat16"`` or ``"tf32"``;
    a complex dtype's is its parts'.

    Examples
    --------
    >>> eps_of("float32") == 2.0**-23, eps_of("complex128") == 2.0**-52, eps_of("bfloat16")
    (True, True, 0.00390625)
    """
    name = str(dtype)
    if name in _EPS:
        return _EPS[name]
    dt = np.dtype(dtype)
    if dt.kind == "c":
        dt = np.dtype(f"f{dt.itemsize // 2}")
    if dt.kind != "f":
        return 0.0  # integers: exact
    return float(np.finfo(dt).eps)


def fft_tolerance(dtype: Any, n: int, scale: float) -> float:
    """The largest difference two correct FFT convolutions of length ``n`` in ``dtype`` may show at an element,
    for results of magnitude ``scale``.

    Examples
    --------
    >>> fft_tolerance("float64", 1024, 1.0) == 32 * 2.0**-52 * 10
    True
    """
    return FFT_FACTOR * eps_of(dtype) * max(math.log2(max(n, 2)), 1.0) * scale


def gemm_tolerance(dtype: Any, k: int, scale: float, result_dtype: Any = None, result_scale: float = 0.0) -> float:
    """The largest difference two correct GEMMs of depth ``k`` accumulated in ``dtype`` may show at an element,
    ``scale`` bounding ``|alpha * a[i, l] * b[l, j]|`` (e.g. ``max|a| * max|b|``), plus the rounding of a
    ``result_dtype`` result (and epilog terms) of magnitude ``result_scale``.

    Examples
    --------
    >>> gemm_tolerance("float32", 256, 1.0) == 4 * 2.0**-23 * 256
    True
    >>> gemm_tolerance("float32", 256, 1.0, "bfloat16", 8.0) == 4 * (2.0**-23 * 256 + 2.0**-8 * 8)
    True
    """
    out = eps_of(result_dtype) * result_scale if result_dtype is not None else 0.0
    return GEMM_FACTOR * (eps_of(dtype) * max(k, 1) * scale + out)


@dataclasses.dataclass(frozen=True)
class Run:
    """``count`` elements ``step`` apart along the last axis, from ``first`` (an index of the leading axes)
    and ``start`` (along the last)."""

    first: tuple[int, ...]
    start: int
    step: int
    count: int


def _rows(total: int) -> list[int]:
    if total <= ROWS:
        return list(range(total))
    picked = {0, 1, total // 2, total - 2, total - 1}
    i = 1
    while len(picked) < ROWS:
        picked.add((i * 0x9E3779B1) % total)  # spread by the golden ratio, the same every time
        i += 1
    return sorted(picked)


def runs(shape: Sequence[int]) -> tuple[Run, ...]:
    """The sample of a result of ``shape``: see the module docstring. Empty for an empty result.

    Examples
    --------
    >>> [(r.first, r.start, r.step, r.count) for r in runs((2, 3))]
    [((0,), 0, 1, 3), ((1,), 0, 1, 3)]
    """
    shape = tuple(int(d) for d in shape) or (1,)
    length, lead = shape[-1], shape[:-1]
    total = math.prod(lead)
    if length == 0 or total == 0:
        return ()
    out = []
    for row in _rows(total):
        first = tuple(int(i) for i in np.unravel_index(row, lead)) if lead else ()
        if length <= 2 * EDGE + SWEEP:
            out.append(Run(first, 0, 1, length))
            continue
        out.append(Run(first, 0, 1, EDGE))
        for quarter in (1, 2, 3):
            out.append(Run(first, length * quarter // 4 - EDGE // 2, 1, EDGE))
        out.append(Run(first, length - EDGE, 1, EDGE))
        step = length // SWEEP
        out.append(Run(first, row % step, step, SWEEP))
    return tuple(out)


def gather(shape: Sequence[int], read: Callable[[Run], np.ndarray]) -> np.ndarray:
    """The sample of a result of ``shape`` as one 1-D array, each of :func:`runs` read by ``read(run)``."""
    parts = [np.asarray(read(r)).reshape(-1) for r in runs(shape)]
    return np.concatenate(parts) if parts else np.empty(0)


def host_reader(array: np.ndarray) -> Callable[[Run], np.ndarray]:
    """``read`` for :func:`gather` over a host array."""
    a = np.asarray(array)
    a = a.reshape(1) if a.ndim == 0 else a
    return lambda r: a[r.first][r.start : r.start + r.step * (r.count - 1) + 1 : r.step]


def sample_host(array: Any) -> np.ndarray:
    """The sample of a host array (anything ``np.asarray`` takes)."""
    a = np.asarray(array)
    return gather(a.shape, host_reader(a))


def magnitude(*samples: np.ndarray) -> float:
    """The largest finite absolute value among ``samples`` (0 where none)."""
    best = 0.0
    for s in samples:
        s = np.abs(np.asarray(s, dtype=np.complex128 if np.iscomplexobj(s) else np.float64))
        s = s[np.isfinite(s)]
        if s.size:
            best = max(best, float(s.max()))
    return best


def disagreement(reference: np.ndarray, candidate: np.ndarray, tolerance: float) -> tuple[float, int] | None:
    """``(error, position in the sample)`` of the largest difference above ``tolerance``, else None. Where the
    reference is not finite nothing is compared; where it is and the candidate is not, the error is infinite.

    Examples
    --------
    >>> disagreement(np.array([1.0, 2.0]), np.array([1.0, 2.5]), 0.1)
    (0.5, 1)
    >>> disagreement(np.array([1.0, np.nan]), np.array([1.0, 7.0]), 0.1) is None
    True
    """
    ref = np.asarray(reference)
    got = np.asarray(candidate)
    if ref.shape != got.shape:
        return math.inf, 0
    wide = np.complex128 if np.iscomplexobj(ref) or np.iscomplexobj(got) else np.float64
    ref, got = ref.astype(wide), got.astype(wide)
    diff = np.where(np.isfinite(ref), np.abs(got - ref), 0.0)
    diff = np.where(np.isnan(diff), np.inf, diff)
    if diff.size == 0:
        return None
    where = int(np.argmax(diff))
    error = float(diff[where])
    return (error, where) if error > tolerance else None


@dataclasses.dataclass(frozen=True)
class Rejection:
    """A candidate left out because its result disagrees with the reference's."""

    label: str
    reference: str
    error: float
    tolerance: float
    where: str = ""

    def reason(self) -> str:
        at = f" at {self.where}" if self.where else ""
        return (
            f"its result differs from {self.reference}'s by {self.error:.3g}{at} "
            f"(tolerance {self.tolerance:.3g}): rejected as wrong"
        )


def position(shape: Sequence[int], index: int) -> str:
    """The element of a result of ``shape`` at position ``index`` of its sample, as ``[i, j, ...]``."""
    seen = 0
    for r in runs(shape):
        if index < seen + r.count:
            return str([*r.first, r.start + r.step * (index - seen)])
        seen += r.count
    return ""


def warn(what: str, problem: str, rejection: Rejection) -> None:
    """Log the WARNING of a rejected candidate."""
    _log.warning("%s: candidate %s left out for %s: %s", what, rejection.label, problem, rejection.reason())


@dataclasses.dataclass(frozen=True)
class ResultCheck:
    """How a timed choice checks its candidates' results: ``reference`` is the trusted candidate's label,
    ``sample(result, stream)`` reads a candidate's result's sample to the host (:func:`gather`), and
    ``tolerance(reference_sample, operands, stream)`` the largest difference rounding can explain."""

    reference: str
    sample: Callable[[Any, Any], np.ndarray]
    tolerance: Callable[[np.ndarray, dict, Any], float]
    shape: tuple[int, ...] = ()  # the result's shape, to name the element of a disagreement
