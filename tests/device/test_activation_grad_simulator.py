"""The one-pass activation backward + bias-gradient kernels (nvdispatch.device.activation_grad) under Numba's CUDA
simulator, against a float64 NumPy oracle: ReLU masks bit-exactly, GELU's derivative to bfloat16 rounding, the
column sums to float32 accumulation of bfloat16 values."""

from __future__ import annotations

import math

import numpy as np
import pytest

cuda = pytest.importorskip("numba.cuda")

from nvdispatch.device import DeviceConfigurationError  # noqa: E402
from nvdispatch.device import activation_grad as A  # noqa: E402
from nvdispatch.device.simulator_compat import simulator_active  # noqa: E402

pytestmark = pytest.mark.skipif(not simulator_active(), reason="runs under NUMBA_ENABLE_CUDASIM=1")


def _bf16(x):
    return A.bf16_bits(np.asarray(x, np.float32))


def _values(bits):
    return A.bf16_values(bits).astype(np.float64)


def _gelu_grad(g, z):
    k = math.sqrt(2 / math.pi)
    t = np.tanh(k * (z + 0.044715 * z**3))
    return g * (0.5 * (1 + t) + 0.5 * z * (1 - t**2) * k * (1 + 3 * 0.044715 * z**2))


def _run(kind, g, saved):
    m, n = g.shape
    _, _, rows = A.launch_shape(m, n)
    gd = cuda.to_device(g.view(np.int64))
    sd = cuda.to_device(saved if saved.dtype == np.uint8 else saved.view(np.int64))
    dz = cuda.to_device(np.full((m, n // 4), -1, np.int64))  # garbage where nothing is written
    partials = cuda.device_array((rows, n), np.float32)
    sums = cuda.device_array(n, np.int16)
    A.launch(kind, gd, sd, dz, partials, sums, 0)
    return dz.copy_to_host().view(np.uint16), sums.copy_to_host()


# shapes: one partial row block (m < 64), a full and a partial block, columns beyond one block of threads
@pytest.mark.parametrize("shape", [(5, 8), (70, 12), (3, 4 * A.THREADS + 8)])
def test_relu_mask_and_bias_gradient(shape):
    rng = np.random.default_rng(1)
    g = _bf16(rng.standard_normal(shape))
    z = rng.standard_normal(shape)
    z[0, :4] = [0.0, -0.0, 1e-30, -1e-30]  # zero, negative zero, tiny values each way
    h = _bf16(np.maximum(z, 0.0))
    h[0, 1] = 0x8000  # a negative zero in the saved output: not positive
    dz, sums = _run("relu", g, h)
    want = np.where(_values(h) > 0, _values(g), 0.0)
    np.testing.assert_array_equal(_values(dz), want)  # a mask rounds nothing
    np.testing.assert_allclose(_values(sums), want.sum(0), rtol=1e-2, atol=1e-2 * np.abs(want).sum(0).max())


def _relu_bits(z):
    """cuBLASLt's ReLU mask of ``z``: bit ``j % 8`` of byte ``j // 8`` of row ``i`` is ``z[i, j] > 0``, each row
    padded to a multiple of 128 columns (the padding bits set, as garbage would be)."""
    m, n = z.shape
    padded = np.ones((m, -(-n // 128) * 128), bool)
    padded[:, :n] = z > 0
    return np.packbits(padded, axis=1, bitorder="little")


@pytest.mark.parametrize("shape", [(5, 8), (70, 12), (3, 4 * A.THREADS + 8)])
def test_relu_mask_from_cublaslt_bits(shape):
    rng = np.random.default_rng(4)
    g = _bf16(rng.standard_normal(shape))
    z = rng.standard_normal(shape)
    dz, sums = _run("relu_bits", g, _relu_bits(z))
    want = np.where(z > 0, _values(g), 0.0)
    np.testing.assert_array_equal(_values(dz), want)
    np.testing.assert_allclose(_values(sums), want.sum(0), rtol=1e-2, atol=1e-2 * np.abs(want).sum(0).max())


@pytest.mark.parametrize("shape", [(6, 8), (67, 16)])
def test_gelu_derivative_and_bias_gradient(shape):
    rng = np.random.default_rng(2)
    g = _bf16(rng.standard_normal(shape))
    z = _bf16(3 * rng.standard_normal(shape))
    dz, sums = _run("gelu", g, z)
    want = _gelu_grad(_values(g), _values(z))
    np.testing.assert_allclose(_values(dz), want, rtol=2**-8, atol=1e-6)  # one bfloat16 rounding
    np.testing.assert_allclose(_values(sums), want.sum(0), rtol=2e-2, atol=2e-2 * np.abs(want).sum(0).max())


@pytest.mark.parametrize("rows", [9, 9 * A.ROWS_PER_BLOCK + 3])  # one block of rows; more than eight
def test_column_sums_alone_write_nothing(rows):
    rng = np.random.default_rng(3)
    g = _bf16(rng.standard_normal((rows, 8)) + 4.0)
    dz, sums = _run("none", g, g)
    assert (dz == 0xFFFF).all()  # the -1 it held
    want = _values(g).sum(0)
    np.testing.assert_allclose(_values(sums), want, rtol=2**-7)


def test_bf16_conversions_round_to_nearest_even():
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.0, np.inf, np.nan], np.float32)
    bits = A.bf16_bits(x)
    assert bits.tolist()[:5] == [0x3F80, 0x3F80, 0x3F82, 0xC000, 0x7F80]
    assert np.isnan(A.bf16_values(bits)[5])


def test_an_unknown_kind_is_refused():
    with pytest.raises(DeviceConfigurationError, match="kind"):
        A.kernels("tanh")


def test_the_sums_kernel_adds_every_partial_row():
    """More partial rows than its four-loads-a-step loop takes at once, columns beyond one block."""
    rng = np.random.default_rng(5)
    rows, n = 4 * A.SUM_SLICES * 2 + 5, A.SUM_COLUMNS + 4
    partials = rng.standard_normal((rows, n)).astype(np.float32)
    sums = cuda.device_array(n, np.int16)
    _, column_sums = A.kernels("none")
    column_sums[-(-n // A.SUM_COLUMNS), (A.SUM_COLUMNS, A.SUM_SLICES), 0](cuda.to_device(partials), sums)
    want = partials.astype(np.float64).sum(0)
    np.testing.assert_allclose(_values(sums.copy_to_host()), want, rtol=2**-8, atol=1e-5 * np.abs(want).max())
