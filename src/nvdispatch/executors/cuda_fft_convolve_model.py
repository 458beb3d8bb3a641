"""A cost model of the GPU convolution strategies: the memory each moves, weighted by how fast it moves it.

An FFT convolution of a batch this size is memory-bound: what decides between the strategies is how many
times each reads and writes the signals, and how close each kernel comes to the copy bandwidth. The model
counts the bytes of every pass and divides each by an *efficiency* (the fraction of a device-to-device
copy's bandwidth the pass reaches), and reports the sum relative to the *HBM floor*: one read of ``x`` and
one write of the result. ``unfused 4.1`` reads "about 4.1 times the floor".

Passes (``x``, ``out``: the signal and the result; ``S``: the complex spectrum; ``P``: cuFFT's passes over
memory for the length, :func:`cufft_passes`):

==============  =====================================================================================
strategy        traffic
==============  =====================================================================================
device-fused    ``x + out``: one kernel (block FFT, multiply, inverse block FFT); real rows two a
                transform (``pairs``) or each its own, at half the efficiency
four-step       ``x + B``, ``2B``, ``B + out`` (column pass, middle pass, inverse column pass; ``B`` a
                complex copy of the batch), see :mod:`nvdispatch.device.fft_four_step`
unfused         cuFFT ``x + S + 2(P-1)S``, multiply ``2S``, cuFFT ``S + out + 2(P-1)S``
cufft-lto       as unfused without the multiply, the forward cuFFT running with a store callback
cufft-lto-load  as unfused without the multiply, the inverse cuFFT running with a load callback
==============  =====================================================================================

A filter of one row is read from cache; a filter per signal adds its bytes to the pass that reads it. Each
kernel launch adds :data:`LAUNCH_BYTES` (the device time of a launch, as bytes a copy would move meanwhile),
which ranks the strategies of few kernels first for small problems.

The efficiencies are the model's parameters, set from the H200 runs of ``benchmarks/fft_callbacks_bench.py``
and ``benchmarks/device_fft_bench.py`` and refined by ``benchmarks/convolve_bench.py`` (their results are in
``benchmarks/results/``). The model orders the
strategies and chooses which of them the timed choice (:mod:`nvdispatch.executors.timed_choice`) times; the
timing on the actual GPU decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Sizes",
    "Estimate",
    "sizes_of",
    "cufft_passes",
    "estimate",
    "fused_efficiency",
    "column_efficiency",
    "CUFFT_SINGLE_PASS_BYTES",
]

#: a transform whose signal (complex bytes) fits this runs as one cuFFT kernel (one pass over memory)
CUFFT_SINGLE_PASS_BYTES = 128 * 1024
#: efficiencies (fraction of the copy bandwidth) of: a cuFFT pass; a cuFFT pass running a store callback
#: for lengths up to / beyond :data:`CALLBACK_SHORT`; one elementwise multiply
CUFFT_PASS = 0.85
#: a one-pass cuFFT transform longer than this many bytes (one block holds the whole signal) is slower
CUFFT_LONG_SINGLE_PASS = 64 * 1024
CUFFT_LONG_SINGLE_PASS_EFFICIENCY = 0.6
CUFFT_CALLBACK_SHORT = 0.8
CUFFT_CALLBACK_LONG = 0.3
CALLBACK_SHORT = 4096
ELEMENTWISE = 0.9
#: the four-step column pass: a thread per column (coalesced, no shared memory); a tile of columns, limited by
#: the bytes of adjacent values each tile row reads and by the column's length (its block FFT), up to the keys
COLUMN_BY_THREAD = 0.95
_COLUMN_BY_TILE = ((32, 0.35), (64, 0.5), (1 << 30, 0.7))
_COLUMN_BY_LENGTH = ((64, 0.7), (256, 0.5), (1 << 30, 0.37))
#: the one-kernel convolution (two block FFTs) by length, up to the key (fp32; fp64 at FP64_FACTOR)
_FUSED = ((256, 0.8), (512, 0.65), (1024, 0.63), (2048, 0.45), (4096, 0.3), (8192, 0.3), (16384, 0.3))
FP64_FACTOR = 0.8
#: the one-kernel convolution of real rows each transformed as a complex signal (twice the work per byte)
REAL_UNPAIRED = 0.5
#: the cost of one kernel launch, in bytes a copy moves in that time
LAUNCH_BYTES = 16 << 20
#: kernel launches per call
LAUNCHES = {"device-fused": 1, "four-step": 4, "unfused": 3, "cufft-lto": 2, "cufft-lto-load": 2}


@dataclass(frozen=True)
class Sizes:
    """The byte counts of one convolution problem the model works with."""

    rows: int  # signals in the batch
    n: int  # transform length
    real: bool  # real signals (rfft/irfft)
    complex_bytes: int  # of one complex value of the transform
    x_bytes: int
    out_bytes: int
    spectrum_bytes: int
    filter_bytes: int  # bytes of h read once per signal (0 for one row for all, read from cache)

    @property
    def floor_bytes(self) -> int:
        """One read of ``x`` and one write of the result."""
        return self.x_bytes + self.out_bytes

    @property
    def complex_batch_bytes(self) -> int:
        """The four-step intermediate: the batch as complex signals (two real rows make one)."""
        signals = (self.rows + 1) // 2 if self.real else self.rows
        return signals * self.n * self.complex_bytes


def sizes_of(problem) -> Sizes:
    """The :class:`Sizes` of a :class:`~nvdispatch._fft_convolve.ConvolveProblem`."""
    f, inv = problem.forward, problem.inverse
    n = f.lengths[0]
    rows = math.prod(f.shape) // max(f.shape[f.axes[0]], 1) if f.shape else 1
    cbytes = np.dtype(f.compute_dtype).itemsize
    x_bytes = math.prod(f.shape) * np.dtype(f.dtype).itemsize
    out_bytes = math.prod(inv.out_shape) * np.dtype(inv.result_dtype).itemsize
    spectrum = math.prod(f.out_shape) * cbytes
    h = problem.filter
    filter_bytes = 0 if problem.filter_rows == "one" else math.prod(h.shape) * np.dtype(h.dtype).itemsize
    return Sizes(rows, n, f.kind == "r2c", cbytes, x_bytes, out_bytes, spectrum, filter_bytes)


def cufft_passes(n: int, complex_bytes: int) -> int:
    """Passes over memory cuFFT makes for a transform of ``n`` complex values (a real one: ``n // 2``)."""
    passes, span = 1, CUFFT_SINGLE_PASS_BYTES // complex_bytes
    while n > span:
        passes += 1
        span *= CUFFT_SINGLE_PASS_BYTES // complex_bytes
    return passes


def fused_efficiency(n: int, complex_bytes: int) -> float:
    """The model's efficiency of the one-kernel convolution of length ``n`` (0 beyond the device engine)."""
    for limit, eff in _FUSED:
        if n <= limit:
            return eff * (FP64_FACTOR if complex_bytes == 16 else 1.0)
    return 0.0


@dataclass(frozen=True)
class Estimate:
    """The model's cost of one strategy: ``floors`` times the HBM floor's time, and how it got there."""

    strategy: str
    floors: float
    detail: str

    def __str__(self) -> str:
        return f"{self.strategy} {self.floors:.1f}"


def column_efficiency(tile_run_bytes: int, length: int = 64) -> float:
    """The model's efficiency of the four-step column pass: a thread per column (``tile_run_bytes`` 0), or a
    tile whose rows read ``tile_run_bytes`` of adjacent values (short runs waste memory transactions) of
    columns of ``length`` (long columns' block FFTs leave few blocks per SM to overlap memory and work)."""
    if tile_run_bytes <= 0:
        return COLUMN_BY_THREAD
    by_run = next(eff for limit, eff in _COLUMN_BY_TILE if tile_run_bytes <= limit)
    return min(by_run, next(eff for limit, eff in _COLUMN_BY_LENGTH if length <= limit))


def estimate(
    problem, strategy: str, *, tile_run_bytes: int = 0, middle_length: int | None = None, pairs: bool = False
) -> Estimate:
    """The model's :class:`Estimate` of ``strategy`` for ``problem``. ``tile_run_bytes`` (see
    :func:`column_efficiency`) and ``middle_length`` (``n2``; the columns are ``n / n2`` long) describe the
    four-step's column and middle passes (see ``fft_four_step``); ``pairs``: the one-kernel convolution of
    real signals transforms two rows as one complex signal (else each real row as a complex one: twice the
    work per byte)."""
    s = sizes_of(problem)
    floor = max(s.floor_bytes, 1)
    spec = s.spectrum_bytes
    transform = s.n // 2 if s.real else s.n
    passes = cufft_passes(transform, s.complex_bytes)
    extra = 2 * (passes - 1) * spec
    long_single = passes == 1 and transform * s.complex_bytes > CUFFT_LONG_SINGLE_PASS
    cufft = CUFFT_LONG_SINGLE_PASS_EFFICIENCY if long_single else CUFFT_PASS
    if strategy == "device-fused":
        eff = fused_efficiency(s.n, s.complex_bytes) * (REAL_UNPAIRED if s.real and not pairs else 1.0)
        cost = math.inf if eff == 0 else (s.floor_bytes + s.filter_bytes) / eff
        detail = f"one kernel, 2 traversals at {eff:.2f} of a copy" + (", two real rows a transform" if pairs else "")
    elif strategy == "four-step":
        b = s.complex_batch_bytes
        n2 = middle_length or 1024
        column = column_efficiency(tile_run_bytes, max(1, s.n // n2))
        middle = fused_efficiency(n2, s.complex_bytes)
        cost = (s.x_bytes + b) / column + (2 * b + s.filter_bytes) / middle + (b + s.out_bytes) / column
        detail = f"3 kernels, 6 traversals (columns at {column:.2f}, rows at {middle:.2f} of a copy)"
    elif strategy == "unfused":
        forward = (s.x_bytes + spec + extra) / cufft
        multiply = (2 * spec + s.filter_bytes) / ELEMENTWISE
        inverse = (spec + s.out_bytes + extra) / cufft
        cost = forward + multiply + inverse
        detail = f"cuFFT ({passes} pass{'es' if passes > 1 else ''}), multiply, cuFFT: {4 * passes + 2} traversals"
    elif strategy == "cufft-lto":
        eff = CUFFT_CALLBACK_SHORT if s.n <= CALLBACK_SHORT else CUFFT_CALLBACK_LONG
        cost = (s.x_bytes + spec + extra + s.filter_bytes) / eff + (spec + s.out_bytes + extra) / cufft
        detail = f"cuFFT with a store callback (at {eff:.2f} of a copy), cuFFT: {4 * passes} traversals"
    elif strategy == "cufft-lto-load":
        eff = CUFFT_CALLBACK_SHORT if s.n <= CALLBACK_SHORT else CUFFT_CALLBACK_LONG
        cost = (s.x_bytes + spec + extra) / cufft + (spec + s.out_bytes + extra + s.filter_bytes) / eff
        detail = f"cuFFT, cuFFT with a load callback (at {eff:.2f} of a copy): {4 * passes} traversals"
    else:
        raise ValueError(f"no model of strategy {strategy!r}")
    return Estimate(strategy, (cost + LAUNCHES[strategy] * LAUNCH_BYTES) / floor, detail)
