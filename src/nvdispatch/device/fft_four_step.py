"""Convolution of long signals in three passes over memory: the four-step (Bailey) FFT with the multiply by
the filter folded into its middle pass.

With ``n = n1 * n2``, each signal ``x[i1 * n2 + i2]`` is an ``(n1, n2)`` matrix, and its spectrum is

    ``X[k1 + n1 * k2] = FFT_n2( w^(k1 i2) * FFT_n1(x[:, i2])[k1] )[k2]``,  ``w = exp(-2 pi i / n)``.

The convolution ``ifft(fft(x) * H)`` never needs ``X`` in natural order, only in *some* order the filter is
permuted to, so it runs as:

1. **column pass** (:class:`ColumnKernel`, forward): for each column ``i2``, FFT of length ``n1`` over
   ``i1``, times the twiddle ``w^(k1 i2)``; stored as ``B[k1, i2]``, in the signal's own layout. A block
   loads a tile of adjacent columns through shared memory, so global reads and writes are coalesced.
2. **middle pass** (:func:`nvdispatch.device.fft_callback_kernel.convolution_kernel`, one transform per row of
   ``B``): FFT of length ``n2``, times ``Hp[k1, k2] = H[k1 + n1 * k2] / n`` (:func:`fft_filter.launch_permute`
   lays the filter out so, the convolution's ``1/n`` folded in), inverse FFT; in place.
3. **inverse column pass** (the same :class:`ColumnKernel`, inverse): times ``w^(-k1 i2)``, inverse FFT of
   length ``n1`` over ``k1``; stored as the result.

Each pass reads and writes the signal once: **6 traversals** of memory (3 reads, 3 writes). For comparison
(one traversal = the signal's bytes read or written once): the one-kernel convolution of lengths the
device engine holds in a block (``n <= 4096``) makes 2; cuFFT forward, one multiply and cuFFT inverse make
``2P + 2 + 2P`` where ``P`` is the number of passes cuFFT needs for ``n`` (1 while a transform fits one
kernel, 2 or 3 beyond), and CuPy's and Torch's ``ifft(fft(x) * h)`` add a normalisation pass (``4P + 4``).

Real signals: two rows are packed into one complex signal ``x[2s] + i x[2s + 1]`` (a zero row pads an odd
batch) and the half-spectrum filter is completed to a Hermitian one (:mod:`.fft_filter`); the real and
imaginary parts of the result are then the two rows' convolutions, ``irfft(rfft(x) * h, n)``. The passes
move half the complex volume, so the count of traversals is the same.

The column kernel is one per ``(n1, precision, tile)``; its direction, the packing of real signals and ``n2``
are launch arguments, so forward and inverse passes, real and complex signals, and every
``n2`` share one compiled kernel.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import DeviceConfigurationError
from .fft import FFT
from .fft_callback_kernel import KernelSpec, convolution_kernel, covers, launch_bounds
from .fft_config import DEFAULT_SHARED_MEMORY, MAX_SHARED_MEMORY, MAX_THREADS_PER_BLOCK, FFTConfig
from .fft_filter import permute_kernel, permute_step
from .kernel_object import sincospi_function
from .kernel_steps import ArrayArg, KernelStep, launch_with_numba
from .shared_opt_in import allow_shared_memory
from .simulator_compat import simulator_active

__all__ = [
    "ROW_LENGTH",
    "LONG_ROW_LENGTH",
    "split",
    "ColumnSpec",
    "column_spec",
    "column_specs",
    "ColumnKernel",
    "column_kernel",
    "FourStepConvolution",
    "FourStepVariant",
    "four_step_variants",
    "TRAVERSALS",
]

#: The row length (``n2``) preferred: the one-kernel convolution's most efficient block FFTs are about there.
ROW_LENGTH = 1024
#: The row length of the second split worth timing: longer rows, so shorter columns (a column pass whose
#: transforms fit a thread, or a smaller tile) at the price of a middle pass over longer block FFTs.
LONG_ROW_LENGTH = 4096
#: Traversals of the signal's memory (reads + writes) of the three passes.
TRAVERSALS = 6
#: Columns a thread transforms alone (in registers, no shared memory), by precision.
_THREAD_COLUMNS = {"float32": 32, "float64": 16}
_MAX_TILE_COLUMNS = 16
_THREADS_PER_TILE = 256
_THREAD_COLUMN_BLOCK = 128
#: the longest column and row of a split (longer Block FFTs need more than the default shared memory)
_MAX_PART = 4096
KERNEL_NAME = "four_step_column_kernel"


def split(n: int, row_length: int = ROW_LENGTH) -> tuple[int, int] | None:
    """``(n1, n2)`` with ``n = n1 * n2``, both lengths the device engine has, ``n2`` (the rows the middle pass
    convolves) nearest ``row_length`` from below (above only when ``n1`` would be too long); None when
    ``n`` has no such split.

    Examples
    --------
    >>> split(65536), split(1 << 20), split(3 * 4096)
    ((64, 1024), (1024, 1024), (12, 1024))
    >>> split(1 << 20, LONG_ROW_LENGTH), split(65536, LONG_ROW_LENGTH)
    ((256, 4096), (16, 4096))
    >>> split(11 * 4096) is None
    True
    """
    options = [d for d in range(2, min(n // 2, _MAX_PART) + 1) if n % d == 0 and n // d <= _MAX_PART]
    options = [d for d in options if covers(d) and covers(n // d)]
    if not options:
        return None
    below = [d for d in options if d <= row_length]
    n2 = max(below) if below else min(options)
    return n // n2, n2


@dataclass(frozen=True)
class ColumnSpec:
    """What the column kernel's source depends on: the column FFT's length, precision and knobs, and how many
    adjacent columns a block transforms (``columns``, a power of two dividing every ``n2`` it runs with)."""

    n1: int
    precision: str  # "float32" | "float64"
    elements_per_thread: int
    columns: int

    @property
    def threads_per_column(self) -> int:
        return self.n1 // self.elements_per_thread

    @property
    def complex_bytes(self) -> int:
        return 2 * np.dtype(self.precision).itemsize

    @property
    def tile_bytes(self) -> int:
        """Shared memory of the tile of ``columns`` columns (one padding slot a row), 0 without a tile (a thread
        per column, or one column a block: each thread then reads its elements straight from memory)."""
        if self.threads_per_column == 1 or self.columns == 1:
            return 0
        return self.n1 * (self.columns + 1) * self.complex_bytes


def _fft_config(n1: int, precision: str, ept, columns: int) -> FFTConfig:
    return FFTConfig.build(
        fft_type="c2c",
        size=n1,
        precision=np.dtype(precision).type,
        direction="forward",
        execution="Block",
        elements_per_thread=ept,
        ffts_per_block=columns,
    )


def column_spec(n1: int, n2: int, precision: str) -> ColumnSpec:
    """The column kernel's configuration for columns of ``n1`` in rows of ``n2``.

    Short columns are a thread's each (all ``n1`` values in its registers: ``columns`` threads read adjacent
    addresses); longer ones are Block FFTs of the suggested knobs over a tile of up to 16 columns that fits
    the 48 KiB of shared memory.

    Examples
    --------
    >>> column_spec(16, 1024, "float32")
    ColumnSpec(n1=16, precision='float32', elements_per_thread=16, columns=128)
    >>> column_spec(1024, 1024, "float32")
    ColumnSpec(n1=1024, precision='float32', elements_per_thread=16, columns=4)
    """
    power = n2 & -n2  # the largest power of two dividing n2
    if n1 <= _THREAD_COLUMNS[precision]:
        try:
            _fft_config(n1, precision, n1, 1)
            return ColumnSpec(n1, precision, n1, min(power, _THREAD_COLUMN_BLOCK))
        except DeviceConfigurationError:
            pass  # lengths a single thread's radix plan cannot take: Block FFTs below
    ept = _fft_config(n1, precision, "suggested", 1).elements_per_thread
    threads = n1 // ept
    columns = min(power, _MAX_TILE_COLUMNS, max(1, _THREADS_PER_TILE // threads))
    while columns > 1:
        spec = ColumnSpec(n1, precision, ept, columns)
        if spec.tile_bytes <= DEFAULT_SHARED_MEMORY and threads * columns <= MAX_THREADS_PER_BLOCK:
            try:
                _fft_config(n1, precision, ept, columns)
                return spec
            except DeviceConfigurationError:
                pass
        columns //= 2
    return ColumnSpec(n1, precision, ept, 1)


def column_specs(n1: int, n2: int, precision: str, most: int = 3) -> list[ColumnSpec]:
    """:func:`column_spec` first, then (for columns transformed by a block of threads) wider tiles whose rows
    are longer runs of adjacent values in memory: up to ``most`` configurations worth timing. Tiles beyond
    48 KiB of shared memory opt in to more (the GPU may refuse them: a timed choice then leaves them out).

    Examples
    --------
    >>> [(s.elements_per_thread, s.columns) for s in column_specs(1024, 1024, "float32")]
    [(16, 4), (16, 16), (16, 8)]
    >>> len(column_specs(16, 1024, "float32"))  # a thread per column: coalesced already
    1
    """
    first = column_spec(n1, n2, precision)
    specs = [first]
    if first.threads_per_column == 1:
        return specs
    power = n2 & -n2
    ept = first.elements_per_thread
    for columns in (16, 8, 32):
        if len(specs) >= most:
            break
        spec = ColumnSpec(n1, precision, ept, columns)
        fits = spec.tile_bytes <= MAX_SHARED_MEMORY and spec.threads_per_column * columns <= MAX_THREADS_PER_BLOCK
        if columns <= first.columns or power % columns or not fits:
            continue
        try:
            _fft_config(n1, precision, ept, columns)
        except DeviceConfigurationError:
            continue
        specs.append(spec)
    return specs


class _Source:
    def __init__(self):
        self.lines: list[str] = []
        self.depth = 1

    def __call__(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def block(self, header: str):
        self(header)
        self.depth += 1

    def end(self) -> None:
        self.depth -= 1


#: The column pass computes the twiddle of every this many slots with a sincospi; the slots between rotate the
#: previous one by ``w^(threads col)`` (two sincospi and a few multiplies instead of one sincospi a slot)
TWIDDLE_EXACT_EVERY = 4


def _twiddles(w: _Source, elements: int, threads: int, inverse: bool) -> None:
    """Multiply every slot ``i`` (index ``k = t + i * threads`` along the column, column ``col``) by
    ``w^(k col)`` (forward), or conjugate it and multiply by ``w^(k col)`` (inverse: ``conj(v * w^(-k col))``,
    the conjugation trick). ``(cs, sn)`` is ``(cos, sin)`` of ``pi * k * col * step``: exact every
    :data:`TWIDDLE_EXACT_EVERY` slots, else the previous slot's rotated by the angle of ``threads`` rows."""
    if elements > 1 and TWIDDLE_EXACT_EVERY > 1:
        w(f"rs, rc = SINCOSPI(REAL({threads} * col) * step)")
    for i in range(elements):
        if i % TWIDDLE_EXACT_EVERY == 0:
            w(f"sn, cs = SINCOSPI(REAL((t + {i * threads}) * col) * step)")
        else:
            w("cs, sn = cs * rc - sn * rs, sn * rc + cs * rs")
        w(f"vr = tdf[{2 * i}]")
        w(f"vi = tdf[{2 * i + 1}]")
        if inverse:
            w(f"tdf[{2 * i}] = vr * cs - vi * sn")
            w(f"tdf[{2 * i + 1}] = -(vr * sn + vi * cs)")
        else:
            w(f"tdf[{2 * i}] = vr * cs + vi * sn")
            w(f"tdf[{2 * i + 1}] = vi * cs - vr * sn")


def generate_column_source(spec: ColumnSpec) -> str:
    """The Python source of the column kernel (globals: see :class:`ColumnKernel`).

    Arguments: ``src_c``/``src_r`` (complex / real source, ``(signals, n)`` / ``(rows_r, n)``), ``dst_c``/
    ``dst_r`` (likewise), ``n2``, ``tiles`` (``n2 // columns``), ``inverse``, ``real_in`` (two real rows per
    signal are read), ``real_out`` (two real rows are written), ``rows_r`` (rows of the real array) and
    ``step`` (``2 / n``). The inverse is unnormalised. Block ``b`` transforms columns
    ``(b % tiles) * columns + threadIdx.y`` of signal ``b // tiles``.
    """
    e, threads, columns = spec.elements_per_thread, spec.threads_per_column, spec.columns
    tile = spec.tile_bytes > 0
    stride = columns + 1  # tile row length: one padding slot
    w = _Source()
    w("thread_data = cuda.local.array(STORAGE, VALUE)")
    w("shared_mem = cuda.shared.array(0, VALUE)")
    w("tdf = thread_data.view(REAL)")
    w("t = cuda.threadIdx.x")
    w("y = cuda.threadIdx.y")
    w("blk = INDEX(cuda.blockIdx.x)")
    w("sig = blk // tiles")
    w(f"col0 = (blk - sig * tiles) * {columns}")
    w("col = col0 + y")
    w("a = 2 * sig")
    w("second = a + 1 < rows_r")
    if tile:
        w("smf = shared_mem.view(REAL)")
        w(f"lin = t + y * {threads}")  # the thread's rank in the block: tile loads run along the columns
        w(f"r0 = lin // {columns}")
        w(f"c = lin - r0 * {columns}")
        w.block("if real_in:")
        for j in range(e):
            w(f"g = (r0 + {j * threads}) * n2 + col0 + c")
            w(f"s = (r0 + {j * threads}) * {stride} + c")
            w("smf[2 * s] = src_r[a, g]")
            w("smf[2 * s + 1] = src_r[a + 1, g] if second else RZERO")
        w.end()
        w.block("else:")
        for j in range(e):
            w(f"shared_mem[(r0 + {j * threads}) * {stride} + c] = src_c[sig, (r0 + {j * threads}) * n2 + col0 + c]")
        w.end()
        w("cuda.syncthreads()")
        for i in range(e):
            w(f"thread_data[{i}] = shared_mem[(t + {i * threads}) * {stride} + y]")
    else:
        w.block("if real_in:")
        for i in range(e):
            w(f"g = (t + {i * threads}) * n2 + col")
            w(f"tdf[{2 * i}] = src_r[a, g]")
            w(f"tdf[{2 * i + 1}] = src_r[a + 1, g] if second else RZERO")
        w.end()
        w.block("else:")
        for i in range(e):
            w(f"thread_data[{i}] = src_c[sig, (t + {i * threads}) * n2 + col]")
        w.end()
    w.block("if inverse:")
    _twiddles(w, e, threads, inverse=True)
    w.end()
    if tile:
        w("cuda.syncthreads()")  # the FFT's exchanges reuse the tile's memory
    w("FFT(thread_data, shared_mem)")
    w.block("if inverse:")
    for i in range(e):
        w(f"tdf[{2 * i + 1}] = -tdf[{2 * i + 1}]")
    w.end()
    w.block("else:")
    _twiddles(w, e, threads, inverse=False)
    w.end()
    if tile:
        w("cuda.syncthreads()")
        for i in range(e):
            w(f"shared_mem[(t + {i * threads}) * {stride} + y] = thread_data[{i}]")
        w("cuda.syncthreads()")
        w.block("if real_out:")
        for j in range(e):
            w(f"g = (r0 + {j * threads}) * n2 + col0 + c")
            w(f"v = shared_mem[(r0 + {j * threads}) * {stride} + c]")
            w("dst_r[a, g] = v.real")
            w.block("if second:")
            w("dst_r[a + 1, g] = v.imag")
            w.end()
        w.end()
        w.block("else:")
        for j in range(e):
            w(f"dst_c[sig, (r0 + {j * threads}) * n2 + col0 + c] = shared_mem[(r0 + {j * threads}) * {stride} + c]")
        w.end()
    else:
        w.block("if real_out:")
        for i in range(e):
            w(f"g = (t + {i * threads}) * n2 + col")
            w(f"dst_r[a, g] = tdf[{2 * i}]")
            w.block("if second:")
            w(f"dst_r[a + 1, g] = tdf[{2 * i + 1}]")
            w.end()
        w.end()
        w.block("else:")
        for i in range(e):
            w(f"dst_c[sig, (t + {i * threads}) * n2 + col] = thread_data[{i}]")
        w.end()
    params = "src_c, src_r, dst_c, dst_r, n2, tiles, inverse, real_in, real_out, rows_r, step"
    return f"def {KERNEL_NAME}({params}):\n" + "\n".join(w.lines) + "\n"


class ColumnKernel:
    """The column pass of one :class:`ColumnSpec`: ``launch(...)`` runs it forward or inverse."""

    def __init__(self, spec: ColumnSpec):
        from numba import cuda
        from numba.np.numpy_support import from_dtype

        real = np.dtype(spec.precision).type
        cplx = np.dtype(np.result_type(real, np.complex64))
        self.spec = spec
        self.fft = FFT(
            size=spec.n1,
            precision=real,
            fft_type="c2c",
            execution="Block",
            direction="forward",
            elements_per_thread=spec.elements_per_thread,
            ffts_per_block=spec.columns,
        )
        self.source = generate_column_source(spec)
        namespace: dict[str, Any] = {
            "cuda": cuda,
            "STORAGE": self.fft.storage_size,
            "VALUE": from_dtype(cplx),
            "REAL": real,
            "RZERO": real(0),
            "INDEX": np.int64,
            "SINCOSPI": sincospi_function(real),
            "FFT": self.fft,
        }
        code = compile(self.source, f"<nvdispatch generated {KERNEL_NAME} {self.fft._numba_key}>", "exec")
        exec(code, namespace)  # noqa: S102 - generated by this module
        self.python_function = namespace[KERNEL_NAME]
        self.block_dim = (spec.threads_per_column, spec.columns)
        self.kernel = cuda.jit(**launch_bounds(spec.threads_per_column * spec.columns))(self.python_function)
        self.shared_memory_size = max(spec.tile_bytes, self.fft.shared_memory_size)
        self._real, self._complex = real, cplx

    def argtypes(self) -> tuple:
        from numba.cuda import types
        from numba.np.numpy_support import from_dtype

        c2 = types.Array(from_dtype(self._complex), 2, "C")
        r2 = types.Array(from_dtype(np.dtype(self._real)), 2, "C")
        real = from_dtype(np.dtype(self._real))
        i64 = types.int64
        return (c2, r2, c2, r2, i64, i64, i64, i64, i64, i64, real)

    def compile(self) -> None:
        """Compile now (at plan time) for the only argument types the launches use; a tile beyond 48 KiB
        opts in to that much shared memory here."""
        if not simulator_active():
            self.kernel.compile(self.argtypes())
            allow_shared_memory(self.kernel, self.argtypes(), self.shared_memory_size)

    def step(
        self,
        src_c: ArrayArg,
        src_r: ArrayArg,
        dst_c: ArrayArg,
        dst_r: ArrayArg,
        *,
        signals: int,
        n2: int,
        inverse: bool,
        real_in: bool,
        real_out: bool,
        rows_r: int,
        step: float,
    ) -> KernelStep:
        """The launch of one pass over ``signals`` signals (see :func:`generate_column_source` for the
        arguments)."""
        tiles = n2 // self.spec.columns
        i64 = np.int64
        args = (src_c, src_r, dst_c, dst_r, i64(n2), i64(tiles), i64(inverse), i64(real_in), i64(real_out),
                i64(rows_r), self._real(step))  # fmt: skip
        return KernelStep(self.kernel, (signals * tiles,), self.block_dim, self.shared_memory_size, args)


@functools.lru_cache(maxsize=64)
def column_kernel(spec: ColumnSpec) -> ColumnKernel:
    """The column kernel of ``spec``, made once per process (every convolution with these columns shares it)."""
    return ColumnKernel(spec)


class FourStepConvolution:
    """The three passes for signals of length ``n`` (``split(n)``) in ``precision``, real or complex.

    :meth:`launch` takes 2-D C-contiguous arrays (Numba device arrays; NumPy arrays under the simulator):
    ``x`` ``(rows, n)`` (real or complex), ``out`` like ``x``, ``h`` the 1-D filter (``n`` values, or
    ``n // 2 + 1`` for real signals; real or complex), and the work arrays of :meth:`work_shapes`.
    """

    def __init__(
        self,
        n: int,
        precision: str,
        real_signal: bool,
        *,
        parts: tuple[int, int] | None = None,
        column: ColumnSpec | None = None,
        middle_knobs: tuple[int | str, int | str] = ("suggested", "suggested"),
    ):
        """``parts``, ``column`` and ``middle_knobs`` (elements per thread, FFTs per block of the middle pass)
        override the defaults (:func:`split`, :func:`column_spec`, the engine's suggestion)."""
        parts = parts or split(n)
        if parts is None or parts[0] * parts[1] != n:
            raise DeviceConfigurationError("n", "a length n1 * n2 of two device-engine lengths", n)
        self.n, self.precision, self.real_signal = n, precision, real_signal
        self.n1, self.n2 = parts
        self.column = column_kernel(column or column_spec(self.n1, self.n2, precision))
        if self.n2 % self.column.spec.columns or self.column.spec.n1 != self.n1:
            raise DeviceConfigurationError("column", f"a ColumnSpec of n1={self.n1} dividing n2={self.n2}", column)
        ept, fpb = middle_knobs
        self.middle = convolution_kernel(
            KernelSpec(
                "c2c",
                self.n2,
                precision,
                "forward",
                self.n2,
                scale=1.0,
                convolve=True,
                elements_per_thread=ept,
                ffts_per_block=fpb,
            )
        )
        self.complex_dtype = np.dtype(np.result_type(np.dtype(precision), np.complex64))

    def signals(self, rows: int) -> int:
        """Complex signals the passes transform for ``rows`` rows (two real rows make one)."""
        return (rows + 1) // 2 if self.real_signal else rows

    def work_shapes(self, rows: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """Shapes of the complex work arrays: the intermediate ``(signals, n)`` and the permuted filter."""
        return (self.signals(rows), self.n), (self.n1, self.n2)

    def compile(self, h_dtype) -> None:
        """Compile every kernel now for a filter of ``h_dtype``."""
        if simulator_active():
            return
        from numba.cuda import types
        from numba.np.numpy_support import from_dtype

        c2 = types.Array(from_dtype(self.complex_dtype), 2, "C")
        self.column.compile()
        self.middle.compile((c2, c2, c2))
        h1 = types.Array(from_dtype(np.dtype(h_dtype)), 1, "C")
        real = from_dtype(np.dtype(self.precision))
        permute_kernel(h_dtype).compile((h1, c2, types.int64, types.int64, real))

    def steps(self, rows: int, x_dtype, h_dtype) -> tuple[KernelStep, ...]:
        """The launches convolving ``rows`` signals of ``x_dtype`` with a filter of ``h_dtype``, on the operands
        ``(x, out, h, work, hp, dummy_real)`` of :meth:`launch` (nothing for an empty batch)."""
        signals = self.signals(rows)
        if signals == 0:
            return ()
        n, n1, n2, real = self.n, self.n1, self.n2, self.real_signal
        work_shape, hp_shape = self.work_shapes(rows)
        cplx, real_dtype = self.complex_dtype, np.dtype(self.precision)
        x = ArrayArg(0, (rows, n), np.dtype(x_dtype))
        out = ArrayArg(1, (rows, n), real_dtype if real else cplx)
        h = ArrayArg(2, (n // 2 + 1 if real else n,), np.dtype(h_dtype))
        work = ArrayArg(3, work_shape, cplx)
        hp = ArrayArg(4, hp_shape, cplx)
        dummy = ArrayArg(5, (1, 1), real_dtype)
        rows_view = ArrayArg(3, (signals * n1, n2), cplx)
        common = {"signals": signals, "n2": n2, "rows_r": rows, "step": 2.0 / n}
        return (
            permute_step(h, hp, real, real_dtype.type(1.0 / n)),
            self.column.step(
                work if real else x, x if real else dummy, work, dummy,
                inverse=False, real_in=real, real_out=False, **common,
            ),
            self.middle.convolution_step(rows_view, rows_view, hp),
            self.column.step(
                work, dummy, work if real else out, out if real else dummy,
                inverse=True, real_in=False, real_out=real, **common,
            ),
        )  # fmt: skip

    def launch(self, x, out, h, work, hp, dummy_real, stream=0) -> None:
        """Queue the convolution of ``x`` with ``h`` into ``out``. ``work``/``hp``: arrays of
        :meth:`work_shapes` (complex); ``dummy_real``: any ``(1, 1)`` C-contiguous array of the real precision
        (what the column kernel gets for the real arrays a pass does not use)."""
        steps = self.steps(x.shape[0], x.dtype, h.dtype)
        launch_with_numba(steps, (x, out, h, work, hp, dummy_real), stream)

    def describe(self) -> tuple[str, ...]:
        c, f = self.column.spec, self.column.fft
        where = "a thread per column" if c.threads_per_column == 1 else "a tile in shared memory"
        return (
            f"four-step split n={self.n} = {self.n1} x {self.n2}"
            + (" (two real rows packed into one complex signal, Hermitian filter)" if self.real_signal else ""),
            f"permute h into the four-step order (an ({self.n1}, {self.n2}) array), times 1/{self.n}",
            f"column pass: FFT n1={self.n1} over {c.columns} adjacent columns a block "
            f"({f.elements_per_thread} elements/thread, {where}), "
            f"twiddles, coalesced store",
            f"middle pass: one kernel per row of n2={self.n2}: FFT -> multiply by the permuted h -> inverse FFT, "
            f"in place ({self.middle.first.elements_per_thread} elements/thread, "
            f"{self.middle.ffts_per_block} FFTs/block)",
            f"inverse column pass: conjugate twiddles, inverse FFT n1={self.n1}, store the result",
            f"{TRAVERSALS} traversals of the signal's memory (3 reads, 3 writes)",
        )


@dataclass(frozen=True)
class FourStepVariant:
    """One configuration of the three passes: the split ``(n1, n2)``, the column kernel's spec and the middle
    kernel's knobs (elements per thread, FFTs per block)."""

    parts: tuple[int, int]
    column: ColumnSpec
    middle: tuple[int | str, int | str] = ("suggested", "suggested")  # elements per thread, FFTs per block

    def knobs(self) -> dict:
        """Keyword arguments of :class:`FourStepConvolution`."""
        return {"parts": self.parts, "column": self.column, "middle_knobs": self.middle}

    @property
    def label(self) -> str:
        c = self.column
        middle = "" if self.middle == ("suggested", "suggested") else " rows " + "x".join(map(str, self.middle))
        return f"{self.parts[0]}x{self.parts[1]} cols {c.elements_per_thread}x{c.columns}{middle}"


def four_step_variants(n: int, precision: str, most: int = 2) -> list[FourStepVariant]:
    """Configurations of the four-step for length ``n`` worth timing against each other, at most ``most``: the
    default first; then the split of :data:`LONG_ROW_LENGTH` rows (shorter columns), where it differs; then the
    default split with the wider column tiles of :func:`column_specs`. Empty when ``n`` has no split.

    Examples
    --------
    >>> [v.label for v in four_step_variants(1 << 20, "float32")]
    ['1024x1024 cols 16x4', '256x4096 cols 16x16']
    >>> [v.label for v in four_step_variants(1 << 20, "float32", 3)]
    ['1024x1024 cols 16x4', '256x4096 cols 16x16', '1024x1024 cols 16x16']
    >>> [v.label for v in four_step_variants(16384, "float32")]
    ['16x1024 cols 16x128', '4x4096 cols 4x128']
    >>> [v.label for v in four_step_variants(1 << 18, "float64")]
    ['256x1024 cols 16x8', '64x4096 cols 8x16']
    """
    parts = split(n)
    if parts is None:
        return []
    default = column_specs(*parts, precision, most)
    variants = [FourStepVariant(parts, default[0])]
    longer = split(n, LONG_ROW_LENGTH)
    if longer is not None and longer != parts and longer[0] > 1:
        variants.append(FourStepVariant(longer, column_spec(*longer, precision)))
    variants += [FourStepVariant(parts, spec) for spec in default[1:]]
    return variants[:most]
