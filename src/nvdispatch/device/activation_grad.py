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
from .simulator_compat import simulator_active

cuda = None  # numba.cuda, imported when the kernels are first built

__all__ = ["KINDS", "ROWS_PER_BLOCK", "THREADS", "bf16_bits", "bf16_values", "kernels", "launch_shape", "launch"]

KINDS = ("relu", "relu_bits", "gelu", "none")
#: rows of the input each block walks (its column sums are one row of ``partials``)
ROWS_PER_BLOCK = 64
#: threads per block (each owns four adjacent columns)
THREADS = 128

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
def _bit_casts():
    if simulator_active():

        def as_float(i):
            return np.array(i, np.int64).astype(np.int32).view(np.float32)[()]

        def as_int(f):
            return int(np.array(f, np.float32).view(np.int32)[()])

        return as_float, as_int
    from numba.cuda import libdevice

    return libdevice.int_as_float, libdevice.float_as_int


@functools.cache
def kernels(kind: str):
    """``(pass kernel, sums kernel)`` for ``kind`` (compiled by Numba on first launch)."""
    global cuda  # the simulator swaps the module global ``cuda`` inside kernels: they must read it as one
    from numba import cuda, float32, int32, int64

    if kind not in KINDS:
        raise DeviceConfigurationError("kind", KINDS, kind)
    as_float_, as_int_ = _bit_casts()
    as_float = cuda.jit(device=True)(as_float_) if simulator_active() else as_float_
    as_int = cuda.jit(device=True)(as_int_) if simulator_active() else as_int_
    relu, relu_bits, gelu = kind == "relu", kind == "relu_bits", kind == "gelu"
    derived = kind != "none"
    beta, kappa = float32(_SQRT_2_OVER_PI), float32(_KAPPA)
    rows_per_block = ROWS_PER_BLOCK

    @cuda.jit(device=True)
    def value(lane):  # bf16 bits (0..0xFFFF) -> float32
        f = as_float(int32((lane & 0x7FFF) << 16))
        return -f if lane & 0x8000 else f

    @cuda.jit(device=True)
    def bits(f):  # float32 -> bf16 bits, nearest even
        u = int64(as_int(f)) & 0xFFFFFFFF
        if (u & 0x7FFFFFFF) > 0x7F800000:
            return int64(0x7FC0)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF

    @cuda.jit(device=True)
    def gelu_grad(g, z):
        z2 = z * z
        t = math.tanh(beta * (z + kappa * z2 * z))
        return g * (float32(0.5) * (float32(1.0) + t) + float32(0.5) * z * (float32(1.0) - t * t) * beta *
                    (float32(1.0) + float32(3.0) * kappa * z2))  # fmt: skip

    @cuda.jit(device=True)
    def derive(gv, sv):  # four lanes of dz from four lanes of g and of the saved tensor
        if relu:
            keep = int64(0)
            for k in range(4):
                hb = (sv >> (16 * k)) & 0xFFFF
                if hb != 0 and hb < 0x7F81:  # h > 0 (h = relu(z) is never negative)
                    keep |= int64(0xFFFF) << (16 * k)
            return gv & keep
        if relu_bits:  # sv: the mask's byte, shifted so that bit k is lane k's
            keep = int64(0)
            for k in range(4):
                if (sv >> k) & 1:
                    keep |= int64(0xFFFF) << (16 * k)
            return gv & keep
        if gelu:
            out = int64(0)
            for k in range(4):
                lane = bits(gelu_grad(value((gv >> (16 * k)) & 0xFFFF), value((sv >> (16 * k)) & 0xFFFF)))
                out |= (lane - 0x10000 if (k == 3 and lane & 0x8000) else lane) << (16 * k)
            return out
        return gv

    @cuda.jit(device=True)
    def load(saved, r, q):  # what derive() takes of the saved tensor for quad q of row r
        if relu_bits:
            return int64(saved[r, q >> 1]) >> (4 * (q & 1))
        return int64(saved[r, q])

    @cuda.jit(device=True)
    def lane(v, k):
        return value((v >> (16 * k)) & 0xFFFF)

    @cuda.jit
    def column_pass(g, saved, dz, partials):
        q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if q >= g.shape[1]:
            return
        r = cuda.blockIdx.y * rows_per_block
        r1 = min(r + rows_per_block, g.shape[0])
        s0 = float32(0.0)
        s1 = float32(0.0)
        s2 = float32(0.0)
        s3 = float32(0.0)
        while r + 4 <= r1:  # four rows a step, their loads issued together
            g0, g1, g2, g3 = int64(g[r, q]), int64(g[r + 1, q]), int64(g[r + 2, q]), int64(g[r + 3, q])
            if derived:
                v0, v1, v2, v3 = load(saved, r, q), load(saved, r + 1, q), load(saved, r + 2, q), load(saved, r + 3, q)
                g0, g1, g2, g3 = derive(g0, v0), derive(g1, v1), derive(g2, v2), derive(g3, v3)
                dz[r, q], dz[r + 1, q], dz[r + 2, q], dz[r + 3, q] = g0, g1, g2, g3
            s0 += (lane(g0, 0) + lane(g1, 0)) + (lane(g2, 0) + lane(g3, 0))
            s1 += (lane(g0, 1) + lane(g1, 1)) + (lane(g2, 1) + lane(g3, 1))
            s2 += (lane(g0, 2) + lane(g1, 2)) + (lane(g2, 2) + lane(g3, 2))
            s3 += (lane(g0, 3) + lane(g1, 3)) + (lane(g2, 3) + lane(g3, 3))
            r += 4
        while r < r1:
            gv = int64(g[r, q])
            if derived:
                gv = derive(gv, load(saved, r, q))
                dz[r, q] = gv
            s0 += lane(gv, 0)
            s1 += lane(gv, 1)
            s2 += lane(gv, 2)
            s3 += lane(gv, 3)
            r += 1
        row = cuda.blockIdx.y
        partials[row, 4 * q] = s0
        partials[row, 4 * q + 1] = s1
        partials[row, 4 * q + 2] = s2
        partials[row, 4 * q + 3] = s3

    @cuda.jit
    def column_sums(partials, out):
        j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if j >= out.shape[0]:
            return
        s = float32(0.0)
        rows = partials.shape[0]
        r = 0
        while r + 8 <= rows:  # eight loads issued together, then added in a fixed order
            p0, p1, p2, p3 = partials[r, j], partials[r + 1, j], partials[r + 2, j], partials[r + 3, j]
            p4, p5, p6, p7 = partials[r + 4, j], partials[r + 5, j], partials[r + 6, j], partials[r + 7, j]
            s += ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))
            r += 8
        while r < rows:
            s += partials[r, j]
            r += 1
        b = bits(s)
        out[j] = b - 0x10000 if b & 0x8000 else b

    return column_pass, column_sums


def launch(kind: str, g, saved, dz, partials, sums, stream) -> None:
    """Queue the pass of ``kind`` and the column sums on Numba stream ``stream``: ``g``, ``saved``, ``dz`` int64
    device arrays ``(m, n // 4)`` (``saved`` the uint8 mask for ``"relu_bits"``; ``saved``/``dz`` ignored for
    ``"none"``: pass ``g``), ``partials`` a float32
    scratch array of :func:`launch_shape`'s ``partial rows`` by ``n``, ``sums`` an int16 array of ``n``."""
    column_pass, column_sums = kernels(kind)
    m, quads = g.shape
    grid, threads, _ = launch_shape(m, 4 * quads)
    column_pass[grid, threads, stream](g, saved, dz, partials)
    n = 4 * quads
    column_sums[-(-n // 256), 256, stream](partials, sums)
