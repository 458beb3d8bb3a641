"""The four-step convolution kernels (column pass, middle pass, filter layout) and the spectrum-multiply
kernel against float64 NumPy, under Numba's CUDA simulator in CI (a few small blocks per launch)."""

from __future__ import annotations

import numpy as np
import pytest

from nvdispatch.device.errors import DeviceConfigurationError
from nvdispatch.device.fft_filter import launch_multiply, launch_permute
from nvdispatch.device.fft_four_step import (
    TRAVERSALS,
    ColumnSpec,
    FourStepConvolution,
    column_spec,
    generate_column_source,
    split,
)

RNG = np.random.default_rng(11)


def _signal(rows, n, precision, real):
    if real:
        return RNG.standard_normal((rows, n)).astype(precision)
    cplx = np.result_type(np.dtype(precision), np.complex64)
    return (RNG.standard_normal((rows, n)) + 1j * RNG.standard_normal((rows, n))).astype(cplx)


def _filter(m, precision, real_filter):
    if real_filter:
        return RNG.standard_normal(m).astype(precision)
    return (RNG.standard_normal(m) + 1j * RNG.standard_normal(m)).astype(np.result_type(precision, np.complex64))


def _reference(x, h, n, real):
    if real:
        return np.fft.irfft(np.fft.rfft(x.astype(np.float64)) * h.astype(np.complex128), n)
    return np.fft.ifft(np.fft.fft(x.astype(np.complex128)) * h.astype(np.complex128))


def _run(engine: FourStepConvolution, x, h):
    rows = x.shape[0]
    work_shape, filter_shape = engine.work_shapes(rows)
    work = np.zeros(work_shape, engine.complex_dtype)
    hp = np.zeros(filter_shape, engine.complex_dtype)
    dummy = np.zeros((1, 1), engine.precision)
    out = np.zeros(x.shape, x.dtype)
    engine.launch(x, out, h, work, hp, dummy, 0)
    return out


# n, (n1, n2), column (ept, columns), middle (ept, fpb), rows: a thread per column, tiles, odd lengths
CASES = [
    (64, (8, 8), (4, 2), (4, 2), 2),  # tile of 2 columns, 2 threads per column
    (64, (8, 8), (8, 4), (4, 2), 2),  # a thread per column
    (64, (4, 16), (4, 4), (4, 2), 3),
    (48, (6, 8), (6, 2), (4, 2), 1),
    (90, (9, 10), (3, 2), (10, 1), 1),  # radix 3 over three threads, a 10-point row
    (64, (16, 4), (4, 1), (4, 1), 2),  # one column a block, 4 threads each: no tile
    (128, (8, 16), (4, 16), (4, 2), 1),  # a tile of 16 columns (the width of the wider variants)
]


@pytest.mark.parametrize("n,parts,column,middle,rows", CASES)
@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("real", [False, True])
def test_four_step_convolution_matches_numpy(n, parts, column, middle, rows, precision, real):
    engine = FourStepConvolution(
        n, precision, real, parts=parts, column=ColumnSpec(parts[0], precision, *column), middle_knobs=middle
    )
    x = _signal(rows, n, precision, real)
    h = _filter(n // 2 + 1 if real else n, precision, real_filter=False)
    got = _run(engine, x, h)
    want = _reference(x, h, n, real)
    tol = 2e-5 if precision == "float32" else 1e-12
    assert got.dtype == x.dtype
    assert np.abs(got - want).max() <= tol * np.abs(want).max()


@pytest.mark.parametrize("real", [False, True])
def test_a_real_filter(real):
    n, parts = 64, (8, 8)
    engine = FourStepConvolution(
        n, "float64", real, parts=parts, column=ColumnSpec(8, "float64", 4, 2), middle_knobs=(4, 2)
    )
    x = _signal(3, n, "float64", real)
    h = _filter(n // 2 + 1 if real else n, "float64", real_filter=True)
    np.testing.assert_allclose(_run(engine, x, h), _reference(x, h, n, real), rtol=1e-12, atol=1e-12)


def test_real_signals_ignore_the_imaginary_parts_irfft_ignores():
    """irfft discards Im at 0 and n/2: so does the Hermitian completion (no cross-talk between packed rows)."""
    n = 64
    engine = FourStepConvolution(
        n, "float64", True, parts=(8, 8), column=ColumnSpec(8, "float64", 4, 2), middle_knobs=(4, 2)
    )
    x = _signal(2, n, "float64", True)
    h = _filter(n // 2 + 1, "float64", real_filter=False)
    h[0] += 3j
    h[n // 2] -= 2j
    np.testing.assert_allclose(_run(engine, x, h), _reference(x, h, n, True), rtol=1e-12, atol=1e-12)


def test_split_prefers_rows_near_1024():
    assert split(65536) == (64, 1024)
    assert split(1 << 20) == (1024, 1024)
    assert split(1 << 22) == (4096, 1024)
    assert split(3 * 4096) == (12, 1024)
    assert split(2048) == (2, 1024)
    assert split(11 * 4096) is None and split(4096 * 4096 * 2) is None


def test_column_spec_by_length_and_precision():
    short = column_spec(16, 1024, "float32")
    assert short.threads_per_column == 1 and short.columns == 128 and short.tile_bytes == 0
    long = column_spec(1024, 1024, "float32")
    assert long.threads_per_column > 1 and long.tile_bytes <= 48 * 1024
    double = column_spec(1024, 1024, "float64")
    assert double.columns < long.columns and double.tile_bytes <= 48 * 1024
    assert column_spec(64, 12, "float32").columns <= 4  # a power of two dividing n2
    longest = column_spec(4096, 4096, "float32")  # a tile of two columns would not fit: one, read directly
    assert longest.columns == 1 and longest.tile_bytes == 0


def test_variants_start_with_the_default_then_longer_rows_then_wider_tiles():
    from nvdispatch.device.fft_config import MAX_SHARED_MEMORY
    from nvdispatch.device.fft_four_step import FourStepVariant, column_specs, four_step_variants

    variants = four_step_variants(1 << 20, "float32", most=4)
    assert variants[0] == FourStepVariant((1024, 1024), column_spec(1024, 1024, "float32"))
    assert variants[1] == FourStepVariant((256, 4096), column_spec(256, 4096, "float32"))  # shorter columns
    assert all(256 * 4096 == v.parts[0] * v.parts[1] for v in variants)
    same_split = [v.column.columns for v in variants if v.parts == (1024, 1024)]
    assert same_split[0] < min(same_split[1:]) and len(set(same_split)) == len(same_split) == 3
    assert all(v.column.tile_bytes <= MAX_SHARED_MEMORY for v in variants)
    assert max(v.column.tile_bytes for v in variants) > 48 * 1024  # a tile that opts in to more shared memory
    assert four_step_variants(1 << 20, "float32", most=2) == variants[:2]
    assert column_specs(16, 1024, "float32") == [column_spec(16, 1024, "float32")]  # a thread per column
    assert four_step_variants(11 * 4096, "float32") == []
    assert variants[2].label == "1024x1024 cols 16x16"
    assert FourStepVariant((8, 8), ColumnSpec(8, "float32", 4, 2), (4, 2)).label == "8x8 cols 4x2 rows 4x2"


def test_column_source_has_one_fft_and_both_directions():
    src = generate_column_source(ColumnSpec(8, "float32", 4, 2))
    assert src.count("FFT(thread_data, shared_mem)") == 1
    assert "if inverse:" in src and "if real_in:" in src and "if real_out:" in src
    assert src.count("cuda.syncthreads()") == 4  # tile in, before the FFT, tile out (twice)
    assert "cuda.syncthreads()" not in generate_column_source(ColumnSpec(8, "float32", 8, 4))
    # twiddles: a sincospi every TWIDDLE_EXACT_EVERY slots and one for the rotation, per direction
    from nvdispatch.device.fft_four_step import TWIDDLE_EXACT_EVERY

    thread = generate_column_source(ColumnSpec(16, "float32", 16, 128))
    assert thread.count("SINCOSPI") == 2 * (1 + 16 // TWIDDLE_EXACT_EVERY) < 16


def test_bad_configurations_are_refused():
    with pytest.raises(DeviceConfigurationError, match="n"):
        FourStepConvolution(11 * 4096, "float32", False)
    with pytest.raises(DeviceConfigurationError, match="column"):
        FourStepConvolution(64, "float32", False, parts=(8, 8), column=ColumnSpec(8, "float32", 4, 16))


def test_describe_counts_the_traversals():
    engine = FourStepConvolution(
        64, "float32", False, parts=(8, 8), column=ColumnSpec(8, "float32", 4, 2), middle_knobs=(4, 2)
    )
    text = "\n".join(engine.describe())
    assert f"{TRAVERSALS} traversals" in text and "64 = 8 x 8" in text


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("h_real", [False, True])
def test_multiply_by_filter(per_row, h_real):
    y = _signal(3, 5, "float32", False)
    h = _filter(5, "float32", h_real).reshape(1, 5)
    if per_row:
        h = np.concatenate([h, 2 * h, 3 * h])
    want = y.astype(np.complex128) * h * 0.25
    launch_multiply(y, h, per_row, np.float32(0.25))
    np.testing.assert_allclose(y, want, rtol=1e-6)


@pytest.mark.parametrize("n", [8, 9])
def test_multiply_by_filter_of_real_signals_keeps_what_irfft_reads(n):
    # irfft(rfft(x) * h) ignores the product's imaginary parts at DC and (even n) Nyquist: so must the multiply
    rng = np.random.default_rng(n)
    x = rng.standard_normal((3, n))
    h = rng.standard_normal(n // 2 + 1) + 1j * rng.standard_normal(n // 2 + 1)
    y = np.fft.rfft(x).astype(np.complex64)
    launch_multiply(y, h.astype(np.complex64).reshape(1, -1), False, np.float32(1.0), real_n=n)
    assert y[:, 0].imag.max() == 0 and (n % 2 or y[:, n // 2].imag.max() == 0)
    # a complex inverse of the Hermitian completion of y: exact whatever C2R does with imaginary parts
    full = np.concatenate([y, np.conj(y[:, 1 : n - n // 2][:, ::-1])], axis=1)
    np.testing.assert_allclose(np.fft.ifft(full).real, np.fft.irfft(np.fft.rfft(x) * h, n), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hermitian", [False, True])
@pytest.mark.parametrize("h_real", [False, True])
def test_permute_filter(hermitian, h_real):
    n1, n2 = 4, 6
    n = n1 * n2
    h = _filter(n // 2 + 1 if hermitian else n, "float64", h_real)
    full = h.astype(np.complex128)
    if hermitian:
        full = np.concatenate([h, np.conj(h[1 : n - n // 2][::-1])]).astype(np.complex128)
        full[0], full[n // 2] = full[0].real, full[n // 2].real
    hp = np.zeros((n1, n2), np.complex128)
    launch_permute(h, hp, hermitian)
    k1, k2 = np.meshgrid(np.arange(n1), np.arange(n2), indexing="ij")
    np.testing.assert_array_equal(hp, full[k1 + n1 * k2])
    launch_permute(h, hp, hermitian, 0, np.float64(0.25))  # a scale folded in
    np.testing.assert_array_equal(hp, full[k1 + n1 * k2] * 0.25)
