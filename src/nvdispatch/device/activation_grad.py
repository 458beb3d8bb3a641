"""One memory pass for the backward of a hidden layer: the activation's derivative applied to a GEMM's result, and
the column sums of what comes out (the layer's bias gradient), on bfloat16 rows.

A layer ``h = act(z)``, ``z = x @ W + b``: from ``g = dh`` (the GEMM ``dz_above @ W_above``), ``dz = g * act'(z)``
and ``db = dz.sum(axis=0)``. Computed apart these are two passes over ``(m, n)`` (the elementwise op, then a
reduction, or a GEMM epilogue that reduces); here each thread of a block reads its rows of ``g`` and of the
saved tensor once, writes ``dz`` and keeps running column sums in registers; the blocks' sums (one row of
``partials`` per block of rows) are added in a fixed order by a second, small kernel, so the result does not
depend on scheduling. Three forms (``kind``):

``"relu"``
    ``dz = g`` where the saved output ``h = relu(z)`` is positive, else 0 (bit-exact: no rounding);
``"relu_bits"``
    the same from cuBLASLt's ReLU bit mask (``RELU_AUX_BIAS``'s ``relu_aux`` in its row orientation: ``uint8``
    ``(m, >= n / 8)``, bit ``j % 8`` of byte ``j // 8`` of row ``i`` set where ``z[i, j] > 0``), which reads
    1/16 of the bytes ``h`` takes;
``"gelu"``
    ``dz = g * gelu'(z)`` from the saved pre-activation ``z`` (the tanh approximation), in float32, rounded to
    bfloat16 to nearest even;
``"none"``
    no derivative: only the column sums of ``g`` (nothing written).

Operands are bfloat16 bit patterns, C-contiguous, ``n`` a multiple of 4, presented as int64 arrays of shape
``(m, n // 4)`` (four values per element, read and written 8 bytes at a time); the column sums are float32
internally and returned as bfloat16 bits in an int16 array of ``n`` elements. Column sums are those of the rounded
``dz`` (what a framework summing the bfloat16 tensor gets), accumulated in float32.

The kernels run on the GPU and, for tests, under Numba's CUDA simulator (bit casts through NumPy there,
libdevice on the GPU).

Examples
--------
>>> import numpy as np
>>> from nvdispatch.device.activation_grad import bf16_bits, bf16_values
>>> bits = bf16_bits(np.array([1.0, -2.5, 0.0, 3.140625], np.float32))
>>> bf16_values(bits).tolist()
[1.0, -2.5, 0.0, 3.140625]
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .errors import DeviceConfigurationError
from .kernel_steps import ArrayArg, KernelStep, launch_with_numba
from .simulator_compat import simulator_active

cuda = None  # numba.cuda, imported when the kernels are first built

__all__ = [
    "KINDS", "ROWS_PER_BLOCK", "THREADS", "SUM_COLUMNS", "SUM_SLICES", "bf16_bits", "bf16_values", "kernels",
    "launch_shape", "OPERANDS", "steps", "launch",
]  # fmt: skip

KINDS = ("relu", "relu_bits", "gelu", "none")
#: rows of the input each block walks (its column sums are one row of ``partials``)
ROWS_PER_BLOCK = 64
#: threads per block (each owns four adjacent columns)
THREADS = 128
#: the column-sums kernel's block: columns by slices of the partial rows
SUM_COLUMNS, SUM_SLICES = 32, 8

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_KAPPA = 0.044715


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """Host helper: bfloat16 bit patterns (uint16) of float32 ``x``, rounded to nearest even."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, np.uint16(0x7FC0), rounded)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """Host helper: float32 values of bfloat16 bit patterns ``bits`` (any 16-bit integer dtype)."""
    return (np.asarray(bits).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def launch_shape(m: int, n: int) -> tuple[tuple[int, int], int, int]:
    """``(grid, threads, partial rows)`` of the first kernel for an ``(m, n)`` problem."""
    quads = n // 4
    row_blocks = -(-m // ROWS_PER_BLOCK)
    return (-(-quads // THREADS), row_blocks), THREADS, row_blocks


@functools.cache
def _intrinsics():
    """``(int -> float32 bit cast, float32 -> int32 bit cast, fast exp)``: libdevice on the GPU, NumPy under the
    simulator (where an int of any width is wrapped to 32 bits first)."""
    if simulator_active():

        def as_float(i):
            return np.array(i, np.int64).astype(np.int32).view(np.float32)[()]

        def as_int(f):
            return np.array(f, np.float32).view(np.int32)[()]

        def exp(x):
            return np.float32(math.exp(float(x)))

        return as_float, as_int, exp
    from numba.cuda import libdevice

    return libdevice.int_as_float, libdevice.float_as_int, libdevice.fast_expf


@functools.cache
def kernels(kind: str):
    """``(pass kernel, sums kernel)`` for ``kind`` (compiled by Numba on first launch).

    Each 8-byte element is handled as two 32-bit words of two bfloat16 lanes: a lane's value is its word shifted
    (low lane) or masked (high lane) into a float32's upper half, so a conversion is one integer op and a bit cast.
    """
    global cuda  # the simulator swaps the module global ``cuda`` inside kernels: they must read it as one
    from numba import cuda, float32, int32, int64

    if kind not in KINDS:
        raise DeviceConfigurationError("kind", KINDS, kind)
    intrinsics = _intrinsics()
    if simulator_active():
        intrinsics = tuple(cuda.jit(device=True)(f) for f in intrinsics)
    as_float, as_int, fast_exp = intrinsics
    relu, relu_bits = kind == "relu", kind == "relu_bits"
    derived = kind != "none"
    beta, kappa = float32(_SQRT_2_OVER_PI), float32(_KAPPA)
    rows_per_block = ROWS_PER_BLOCK
    high = int32(-65536)  # 0xFFFF0000

    @cuda.jit(device=True)
    def low_value(w):  # float32 of the low bfloat16 lane of 32-bit word w
        return as_float(int32(w << 16))

    @cuda.jit(device=True)
    def high_value(w):
        return as_float(int32(w & high))

    @cuda.jit(device=True)
    def bits(f):  # float32 -> bf16 bits (0..0xFFFF), nearest even
        u = as_int(f)
        if (u & 0x7FFFFFFF) > 0x7F800000:
            return int32(0x7FC0)
        return int32(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)

    @cuda.jit(device=True, fastmath=True)
    def gelu_grad(g, z):
        # with t = tanh(u), e = exp(2u): (1 + t) / 2 = e / (1 + e) and 1 - t^2 = 4e / (1 + e)^2, free of the
        # cancellation 1 - t^2 suffers where |t| is near 1
        z2 = z * z
        u = min(max(beta * (z + kappa * z2 * z), float32(-15.0)), float32(15.0))  # beyond: t rounds to +-1
        e = fast_exp(float32(2.0) * u)
        r = float32(1.0) / (float32(1.0) + e)
        left = e * r
        return g * (left + float32(2.0) * z * left * r * beta * (float32(1.0) + float32(3.0) * kappa * z2))

    @cuda.jit(device=True)
    def derive_word(gw, sw, nibble):  # two lanes of dz from word gw of g and word sw of the saved tensor
        if relu:
            keep = (int32(0xFFFF) if low_value(sw) > 0 else int32(0)) | (high if high_value(sw) > 0 else int32(0))
            return int32(gw & keep)
        if relu_bits:  # nibble: the two mask bits of these lanes
            keep = (int32(0xFFFF) if nibble & 1 else int32(0)) | (high if nibble & 2 else int32(0))
            return int32(gw & keep)
        lo = bits(gelu_grad(low_value(gw), low_value(sw)))
        hi = bits(gelu_grad(high_value(gw), high_value(sw)))
        return int32(lo | (hi << 16))

    @cuda.jit(device=True)
    def load(saved, r, q):  # what derive() takes of the saved tensor for quad q of row r
        if relu_bits:
            return int64(saved[r, q >> 1]) >> (4 * (q & 1))
        return int64(saved[r, q])

    @cuda.jit(device=True)
    def derive(gv, sv):  # four lanes of dz from four lanes of g and what load() gave
        lo = derive_word(int32(gv), int32(sv), sv)
        hi = derive_word(int32(gv >> 32), int32(sv >> 32), sv >> 2)
        return (int64(lo) & 0xFFFFFFFF) | (int64(hi) << 32)

    @cuda.jit(device=True)
    def add(s, v):  # the running column sums s (four float32) plus the four lanes of v
        lo, hi = int32(v), int32(v >> 32)
        return (s[0] + low_value(lo), s[1] + high_value(lo), s[2] + low_value(hi), s[3] + high_value(hi))

    @cuda.jit
    def column_pass(g, saved, dz, partials):
        q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if q >= g.shape[1]:
            return
        r = cuda.blockIdx.y * rows_per_block
        r1 = min(r + rows_per_block, g.shape[0])
        zero = float32(0.0)
        s = (zero, zero, zero, zero)
        while r + 4 <= r1:  # four rows a step, their loads issued together
            g0, g1, g2, g3 = int64(g[r, q]), int64(g[r + 1, q]), int64(g[r + 2, q]), int64(g[r + 3, q])
            if derived:
                v0, v1, v2, v3 = load(saved, r, q), load(saved, r + 1, q), load(saved, r + 2, q), load(saved, r + 3, q)
                g0, g1, g2, g3 = derive(g0, v0), derive(g1, v1), derive(g2, v2), derive(g3, v3)
                dz[r, q], dz[r + 1, q], dz[r + 2, q], dz[r + 3, q] = g0, g1, g2, g3
            s = add(add(add(add(s, g0), g1), g2), g3)
            r += 4
        while r < r1:
            gv = int64(g[r, q])
            if derived:
                gv = derive(gv, load(saved, r, q))
                dz[r, q] = gv
            s = add(s, gv)
            r += 1
        row = cuda.blockIdx.y
        partials[row, 4 * q] = s[0]
        partials[row, 4 * q + 1] = s[1]
        partials[row, 4 * q + 2] = s[2]
        partials[row, 4 * q + 3] = s[3]

    @cuda.jit
    def column_sums(partials, out):
        # a block: SUM_COLUMNS columns x SUM_SLICES slices of the rows; the slices' sums added in a fixed order
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        j = cuda.blockIdx.x * SUM_COLUMNS + tx
        rows = partials.shape[0]
        part = cuda.shared.array((SUM_SLICES, SUM_COLUMNS), float32)
        acc = float32(0.0)
        if j < out.shape[0]:
            r = ty
            while r + 3 * SUM_SLICES < rows:  # four loads issued together
                p0, p1 = partials[r, j], partials[r + SUM_SLICES, j]
                p2, p3 = partials[r + 2 * SUM_SLICES, j], partials[r + 3 * SUM_SLICES, j]
                acc += (p0 + p1) + (p2 + p3)
                r += 4 * SUM_SLICES
            while r < rows:
                acc += partials[r, j]
                r += SUM_SLICES
        part[ty, tx] = acc
        cuda.syncthreads()
        if ty == 0 and j < out.shape[0]:
            total = float32(0.0)
            for k in range(SUM_SLICES):
                total += part[k, tx]
            b = bits(total)
            out[j] = b - 0x10000 if b & 0x8000 else b

    return column_pass, column_sums


#: the operands of :func:`steps`, by number
OPERANDS = ("g", "saved", "dz", "partials", "sums")


def steps(kind: str, m: int, n: int, saved_shape: tuple[int, ...] | None = None) -> tuple[KernelStep, KernelStep]:
    """The two launches of ``kind`` for an ``(m, n)`` problem, on the operands of :data:`OPERANDS` (by number):
    ``g``, ``saved``, ``dz`` int64 ``(m, n // 4)`` (``saved``: the uint8 mask of ``saved_shape`` for
    ``"relu_bits"``; ``"none"`` reads ``g`` in their places), ``partials`` float32 (:func:`launch_shape`'s
    partial rows, ``n``), ``sums`` int16 ``(n,)``.

    Examples
    --------
    >>> column_pass, column_sums = steps("relu", 70, 12)
    >>> column_pass.grid, column_pass.block, [a.operand for a in column_pass.args]
    ((1, 2), (128,), [0, 1, 2, 3])
    >>> column_sums.grid, column_sums.block, column_sums.args[1].shape
    ((1,), (32, 8), (12,))
    """
    column_pass, column_sums = kernels(kind)
    grid, threads, rows = launch_shape(m, n)
    quads = (m, n // 4)
    g = ArrayArg(0, quads, np.dtype(np.int64))
    if kind == "none":
        saved = dz = g
    else:
        bits = kind == "relu_bits"
        if bits and saved_shape is None:
            raise DeviceConfigurationError("saved_shape", "the mask's shape for relu_bits", None)
        saved = ArrayArg(1, tuple(saved_shape), np.dtype(np.uint8)) if bits else ArrayArg(1, quads, g.dtype)
        dz = ArrayArg(2, quads, g.dtype)
    partials = ArrayArg(3, (rows, n), np.dtype(np.float32))
    sums = ArrayArg(4, (n,), np.dtype(np.int16))
    return (
        KernelStep(column_pass, grid, (threads,), 0, (g, saved, dz, partials)),
        KernelStep(column_sums, (-(-n // SUM_COLUMNS),), (SUM_COLUMNS, SUM_SLICES), 0, (partials, sums)),
    )


def launch(kind: str, g, saved, dz, partials, sums, stream) -> None:
    """Queue the pass of ``kind`` and the column sums on Numba stream ``stream`` (the launches of :func:`steps`,
    through Numba): ``g``, ``saved``, ``dz`` int64 device arrays ``(m, n // 4)`` (``saved`` the uint8 mask for
    ``"relu_bits"``; ``saved``/``dz`` ignored for ``"none"``: pass ``g``), ``partials`` a float32 scratch array of
    :func:`launch_shape`'s ``partial rows`` by ``n``, ``sums`` an int16 array of ``n``."""
    m, quads = g.shape
    shape = tuple(saved.shape) if kind == "relu_bits" else None
    launch_with_numba(steps(kind, m, 4 * quads, shape), (g, saved, dz, partials, sums), stream)
