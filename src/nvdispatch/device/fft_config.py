"""Validation of the FFT knobs, the ``"suggested"`` choices, and the lists of valid values."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import DeviceConfigurationError, UnsupportedConfigurationError
from .precision import normalize_precision
from .shared_layout import Padding, exchange_paddings, plane_length

__all__ = [
    "FFTConfig",
    "FFT_TYPES",
    "DIRECTIONS",
    "EXECUTIONS",
    "MAX_SIZE",
    "MAX_SIZE_FLOAT64",
    "max_block_size",
    "MAX_THREAD_SIZE",
    "DEFAULT_SHARED_MEMORY",
    "MAX_SHARED_MEMORY",
    "valid_sizes",
    "is_smooth",
]

FFT_TYPES = ("c2c", "r2c", "c2r")
DIRECTIONS = ("forward", "inverse")
EXECUTIONS = ("Block", "Thread")
#: Largest transform a block computes (single precision).
MAX_SIZE = 16384
#: Largest double-precision transform a block computes: a float64 element takes twice the registers, and the
#: longer blocks' threads run out of them at launch (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES).
MAX_SIZE_FLOAT64 = 4096
#: Largest transform a single thread computes in its registers.
MAX_THREAD_SIZE = 64
#: Most elements one thread holds in Block execution (register budget).
MAX_ELEMENTS_PER_THREAD = 32
MAX_THREADS_PER_BLOCK = 1024
#: Dynamic shared memory available to a kernel without ``cudaFuncAttributeMaxDynamicSharedMemorySize``.
DEFAULT_SHARED_MEMORY = 48 * 1024
#: The most dynamic shared memory a block can opt into (compute capability 9.0). ``"suggested"`` knobs stay
#: within :data:`DEFAULT_SHARED_MEMORY`; a configuration beyond it needs a kernel that opts in
#: (:func:`nvdispatch.device.shared_opt_in.allow_shared_memory`) and a GPU that has that much.
MAX_SHARED_MEMORY = 227 * 1024
#: Largest block (bytes of shared memory with both regions) of several FFTs that still gets two regions
TWO_REGION_SHARED_LIMIT = 24 * 1024
_PRIMES = (2, 3, 5, 7)


def max_block_size(precision: Any = np.float32) -> int:
    """The longest Block transform in ``precision`` (``np.float32``/``np.float64`` or their names).

    Examples
    --------
    >>> max_block_size("float32"), max_block_size("float64")
    (16384, 4096)
    """
    return MAX_SIZE_FLOAT64 if np.dtype(precision).itemsize >= 8 else MAX_SIZE


def valid_sizes(execution: str = "Block", precision: Any = np.float32) -> list[int]:
    """Transform sizes supported for ``execution`` in ``precision``: every 2**a 3**b 5**c 7**d from 2 up to
    the limit.

    Examples
    --------
    >>> valid_sizes("Thread")[:8]
    [2, 3, 4, 5, 6, 7, 8, 9]
    >>> valid_sizes("Block", np.float64)[-1]
    4096
    """
    limit = MAX_THREAD_SIZE if execution == "Thread" else max_block_size(precision)
    return [n for n in range(2, limit + 1) if is_smooth(n)]


def is_smooth(n: int) -> bool:
    """Whether ``n`` has no prime factor above 7 (the sizes the device FFT builds)."""
    for p in _PRIMES:
        while n % p == 0:
            n //= p
    return n == 1


def shared_fft_stride(plane: int, planes: int, threads_per_fft: int) -> int:
    """Reals reserved per FFT. When several FFTs share a warp (fewer than 32 threads each), the stride is
    congruent to the thread count modulo the 32 banks, so the FFTs of a warp hit disjoint banks."""
    stride = planes * plane
    if threads_per_fft < 32:
        stride += (threads_per_fft - stride) % 32
    return stride


def radix_plan(size: int, elements_per_thread: int) -> list[int] | None:
    """Radices of the Stockham passes (each divides ``elements_per_thread``), or None if impossible."""
    radices, rest = [], size
    while rest > 1:
        r = math.gcd(rest, elements_per_thread)
        if r == 1:
            return None
        radices.append(r)
        rest //= r
    return radices


def valid_elements_per_thread(size: int, fft_type: str = "c2c") -> list[int]:
    """Elements-per-thread values accepted for Block execution of ``size``."""

    def ok(e: int) -> bool:
        return size % e == 0 and size // e <= MAX_THREADS_PER_BLOCK and radix_plan(size, e) is not None

    out = [e for e in range(2, min(size, MAX_ELEMENTS_PER_THREAD) + 1) if ok(e)]
    if not out:
        # Sizes like 3 * 5 * 7 need every prime in one thread: allow the smallest such count beyond the cap.
        out = [next(e for e in range(MAX_ELEMENTS_PER_THREAD + 1, size + 1) if ok(e))]
    return out


@dataclass(frozen=True)
class FFTConfig:
    """A complete, validated description of one device FFT."""

    fft_type: str
    size: int
    precision: type[np.floating]
    direction: str
    execution: str
    elements_per_thread: int
    ffts_per_block: int

    @property
    def sign(self) -> int:
        return -1 if self.direction == "forward" else 1

    @property
    def threads_per_fft(self) -> int:
        return 1 if self.execution == "Thread" else self.size // self.elements_per_thread

    @property
    def shared_planes(self) -> int:
        """2: real and imaginary planes exchanged together; 1: one after the other (fits 48 KiB)."""
        if self.execution == "Thread" or self.threads_per_fft == 1:
            return 2
        two_planes = self.ffts_per_block * shared_fft_stride(self.plane, 2, self.threads_per_fft)
        return 2 if two_planes * np.dtype(self.precision).itemsize <= DEFAULT_SHARED_MEMORY else 1

    @property
    def paddings(self) -> tuple[Padding, ...]:
        """Shared-memory padding of each exchange between passes (see :mod:`.shared_layout`)."""
        return _paddings(self.size, self.elements_per_thread, self.precision)

    @property
    def plane(self) -> int:
        """Reals in one (real or imaginary) shared-memory plane."""
        return plane_length(self.size, self.paddings)

    @property
    def exchanges(self) -> int:
        """Shared-memory exchanges of one Block FFT (between passes, and c2r's half-spectrum exchange)."""
        if self.execution == "Thread" or self.threads_per_fft == 1:
            return 0
        return len(self.radices) - 1 + (self.fft_type == "c2r")

    @property
    def regions(self) -> int:
        """2: consecutive exchanges alternate between two shared-memory regions, so an exchange's writes need
        no barrier of their own (the reads of the region they overwrite were fenced by the previous exchange's
        barrier). Used for one FFT per block when it fits the 48 KiB, and for several when the doubled block
        stays within :data:`TWO_REGION_SHARED_LIMIT` (two regions are faster for one FFT per block and slower
        for several whose doubled block outgrows that limit: ``docs/notes/device-fft.md``)."""
        if self.exchanges < 2 or self.shared_planes == 1:
            return 1
        doubled = self.ffts_per_block * shared_fft_stride(self.plane, 4, self.threads_per_fft)
        limit = DEFAULT_SHARED_MEMORY if self.ffts_per_block == 1 else TWO_REGION_SHARED_LIMIT
        return 2 if doubled * np.dtype(self.precision).itemsize <= limit else 1

    @property
    def region_offset(self) -> int:
        """Reals between the two regions of one FFT (see :attr:`regions`)."""
        return self.shared_planes * self.plane

    @property
    def shared_stride(self) -> int:
        """Reals between the shared-memory regions of consecutive FFTs of the block."""
        return shared_fft_stride(self.plane, self.shared_planes * self.regions, self.threads_per_fft)

    @property
    def radices(self) -> list[int]:
        if self.execution == "Thread":
            return [self.size]
        plan = radix_plan(self.size, self.elements_per_thread)
        assert plan is not None
        return plan

    @property
    def key(self) -> str:
        """A short unique name for this configuration (used for generated function and Numba type names)."""
        return (
            f"{self.fft_type}_{self.size}_{np.dtype(self.precision).name}_{self.direction}_{self.execution}"
            f"_ept{self.elements_per_thread}_fpb{self.ffts_per_block}"
        )

    @classmethod
    def build(
        cls,
        *,
        fft_type: Any,
        size: Any,
        precision: Any,
        direction: Any,
        execution: Any,
        elements_per_thread: Any,
        ffts_per_block: Any,
    ) -> FFTConfig:
        """Check every knob, resolve ``"suggested"`` and return the configuration."""
        _check_choice("fft_type", fft_type, FFT_TYPES)
        _check_choice("execution", execution, EXECUTIONS)
        if direction is None:
            direction = {"r2c": "forward", "c2r": "inverse"}.get(fft_type)
        _check_choice("direction", direction, DIRECTIONS)
        if (fft_type, direction) in (("r2c", "inverse"), ("c2r", "forward")):
            raise UnsupportedConfigurationError(
                "direction", ["forward" if fft_type == "r2c" else "inverse"], direction
            )
        precision = normalize_precision(precision)
        sizes = valid_sizes(execution, precision)
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or int(size) not in sizes:
            raise DeviceConfigurationError(
                "size",
                f"an integer 2**a * 3**b * 5**c * 7**d in [2, {sizes[-1]}] for {execution} in {precision.__name__}",
                size,
            )
        size = int(size)
        if execution == "Thread":
            ept = _resolve("elements_per_thread", elements_per_thread, [size], size)
            fpb = _resolve("ffts_per_block", ffts_per_block, None, 1)
        else:
            options = valid_elements_per_thread(size, fft_type)
            ept = _resolve("elements_per_thread", elements_per_thread, options, _suggest_ept(size, options, precision))
            threads = size // ept
            fpb_limit = max(1, min(MAX_THREADS_PER_BLOCK // threads, _shared_fit(size, ept, precision, 1)))
            suggestion = max(1, min(fpb_limit, _suggest_fpb(threads), _shared_fit(size, ept, precision, 2)))
            fpb = _resolve("ffts_per_block", ffts_per_block, list(range(1, fpb_limit + 1)), suggestion)
        return cls(fft_type, size, precision, direction, execution, ept, fpb)


def _check_choice(argument: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise DeviceConfigurationError(argument, choices, value)


def _resolve(argument: str, value: Any, options: list[int] | None, suggestion: int) -> int:
    if value is None or (isinstance(value, str) and value == "suggested"):
        return suggestion
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1
    if ok and (options is None or int(value) in options):
        return int(value)
    if options is None:
        raise DeviceConfigurationError(argument, "a positive integer or 'suggested'", value)
    raise DeviceConfigurationError(argument, [*options, "suggested"], value)


def _paddings(size: int, ept: int, precision: type[np.floating]) -> tuple[Padding, ...]:
    plan = radix_plan(size, ept)
    assert plan is not None
    return exchange_paddings(size, ept, tuple(plan), np.dtype(precision).itemsize)


def _shared_fit(size: int, ept: int, precision: type[np.floating], planes: int) -> int:
    """How many FFTs fit: with both planes in the 48 KiB a kernel gets without opting in (``planes=2``), or
    with one plane (what blocks beyond 48 KiB exchange through) in :data:`MAX_SHARED_MEMORY`."""
    threads = size // ept
    if threads == 1:
        return MAX_THREADS_PER_BLOCK
    plane = plane_length(size, _paddings(size, ept, precision))
    per_fft = shared_fft_stride(plane, planes, threads) * np.dtype(precision).itemsize
    return (DEFAULT_SHARED_MEMORY if planes == 2 else MAX_SHARED_MEMORY) // per_fft


#: Elements per thread fastest for fp32 power-of-two sizes in the GPU benchmark (benchmarks/device_fft_bench.py
#: kernels, ~128 threads per block; figures in docs/notes/device-fft.md). The cost rule of :func:`_suggest_ept`
#: agrees except at 128 and 2048, where its 16-element plans (16x8, 16x16x8) are slower than 8 elements per thread.
_MEASURED_EPT_FP32 = {64: 8, 128: 8, 256: 16, 512: 8, 1024: 16, 2048: 8, 4096: 16}


def _suggest_ept(size: int, options: list[int], precision: type[np.floating]) -> int:
    """The measured choice where there is one, else the fewest butterfly groups per thread plus exchanges,
    summed over the passes (ties go to larger counts).

    In the GPU benchmark (``benchmarks/results/device_fft_bench.json``) uniform-radix plans mostly win (512: 8x8x8
    beats 16x16x2), and 32 elements per thread loses everywhere (register pressure), so at most 16 is suggested.
    """
    measured = _MEASURED_EPT_FP32.get(size) if precision == np.float32 else None
    if measured in options:
        return measured
    if size <= 16 and size in options:
        return size
    capped = [e for e in options if e <= 16] or options

    def cost(e: int) -> tuple[int, int]:
        plan = radix_plan(size, e) or []
        return sum(e // r for r in plan) + len(plan), -e

    return min(capped, key=cost)


def _suggest_fpb(threads_per_fft: int) -> int:
    """About 128 threads per block: the best in the GPU benchmark for the load -> FFT -> store kernels."""
    return max(1, 128 // threads_per_fft)
