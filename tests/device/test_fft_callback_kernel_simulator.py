"""The generated load -> prolog -> block FFT -> epilog -> store kernels (and the fused convolution) against
float64 NumPy, under Numba's CUDA simulator in CI (a few small blocks per launch)."""

from __future__ import annotations

import numpy as np
import pytest

from nvdispatch.device.fft_callback_kernel import KernelSpec, build_callback_kernel, covers

RNG = np.random.default_rng(7)


def ramp_by_filter(v, i, h):
    return v * h[i % h.shape[0]] + 0.25


def times_index(v, i):
    return v * (1.0 + 0.01 * i)


def shift_and_scale(v, i, a, b):
    return (v + a[i % a.shape[0]]) * b[0]


def _input(kind, rows, m, precision):
    real = np.dtype(precision)
    if kind == "r2c":
        return RNG.standard_normal((rows, m)).astype(real)
    return (RNG.standard_normal((rows, m)) + 1j * RNG.standard_normal((rows, m))).astype(
        np.result_type(real, np.complex64)
    )


def _reference(spec: KernelSpec, x, prolog, pdata, epilog, edata):
    rows, n = x.shape[0], spec.size
    xin = np.zeros((rows, spec.n_in), np.float64 if spec.fft_type == "r2c" else np.complex128)
    m = min(x.shape[1], spec.n_in)
    xin[:, :m] = x[:, :m]
    if prolog is not None:
        xin = prolog(xin, np.arange(xin.size).reshape(xin.shape), *pdata)
    if spec.fft_type == "c2c":
        y = np.fft.fft(xin) if spec.direction == "forward" else np.fft.ifft(xin) * n
    elif spec.fft_type == "r2c":
        y = np.fft.rfft(xin)
    else:
        y = np.fft.irfft(xin, n) * n
    y = y * spec.scale
    if epilog is not None:
        y = epilog(y, np.arange(y.size).reshape(y.shape), *edata)
    return y


CASES = [
    # kind, direction, n, m_in, ept, fpb
    ("c2c", "forward", 16, 16, 4, 2),
    ("c2c", "inverse", 16, 12, 4, 2),
    ("c2c", "forward", 12, 20, 6, 1),
    ("r2c", "forward", 16, 16, 4, 2),
    ("r2c", "forward", 8, 5, 2, 1),
    ("c2r", "inverse", 16, 9, 4, 2),
    ("c2r", "inverse", 16, 7, 8, 1),
]


@pytest.mark.parametrize("kind,direction,n,m_in,ept,fpb", CASES)
@pytest.mark.parametrize("which", ["prolog", "epilog", "both"])
def test_generated_kernel_matches_numpy(kind, direction, n, m_in, ept, fpb, which):
    h = RNG.standard_normal(5).astype(np.float32)
    a, b = RNG.standard_normal(3).astype(np.float32), np.array([0.5], np.float32)
    prolog, pdata = (ramp_by_filter, (h,)) if which in ("prolog", "both") else (None, ())
    epilog, edata = (shift_and_scale, (a, b)) if which in ("epilog", "both") else (None, ())
    if which == "epilog" and kind == "r2c":
        epilog, edata = times_index, ()
    spec = KernelSpec(
        kind,
        n,
        "float32",
        direction,
        m_in,
        prolog_args=None if prolog is None else len(pdata),
        epilog_args=None if epilog is None else len(edata),
        scale=1.0 / n if direction == "inverse" else 1.0,
        elements_per_thread=ept,
        ffts_per_block=fpb,
    )
    kernel = build_callback_kernel(spec, prolog, epilog)
    rows = fpb + 1  # the last block is partly idle
    x = _input(kind, rows, m_in, np.float32)
    out = np.zeros((rows, spec.n_out), np.float32 if kind == "c2r" else np.complex64)
    kernel.launch(x, out, None, pdata, edata, 0)
    want = _reference(spec, x, prolog, pdata, epilog, edata)
    assert np.abs(out - want).max() <= 2e-5 * max(np.abs(want).max(), 1.0)


def test_real_input_promoted_to_complex_in_the_load():
    spec = KernelSpec("c2c", 8, "float64", "forward", 8, epilog_args=0, promote=True, elements_per_thread=2)
    kernel = build_callback_kernel(spec, None, times_index)
    x = RNG.standard_normal((2, 8))
    out = np.zeros((2, 8), np.complex128)
    kernel.launch(x, out, None, (), (), 0)
    want = times_index(np.fft.fft(x), np.arange(16).reshape(2, 8))
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["c2c", "r2c"])
@pytest.mark.parametrize("per_row", [False, True])
def test_fused_convolution_matches_fft_multiply_ifft(kind, per_row):
    n, rows = 16, 3
    spec = KernelSpec(
        kind,
        n,
        "float32",
        "forward",
        n,
        scale=1.0 / n,
        convolve=True,
        filter_per_row=per_row,
        elements_per_thread=4,
        ffts_per_block=2,
    )
    kernel = build_callback_kernel(spec)
    n_mid = n // 2 + 1 if kind == "r2c" else n
    x = _input(kind, rows, n, np.float32)
    h = _input("c2c", rows if per_row else 1, n_mid, np.float32)
    out = np.zeros((rows, n), np.float32 if kind == "r2c" else np.complex64)
    kernel.launch(x, out, h, (), (), 0)
    if kind == "r2c":
        want = np.fft.irfft(np.fft.rfft(x.astype(np.float64)) * h, n)
    else:
        want = np.fft.ifft(np.fft.fft(x.astype(np.complex128)) * h)
    assert np.abs(out - want).max() <= 2e-5 * np.abs(want).max()


@pytest.mark.parametrize("kind,precision,n", [("c2c", "float32", 16384), ("r2c", "float32", 16384), ("r2c", "float64", 4096)])
def test_fused_convolution_of_the_longest_blocks(kind, precision, n):
    """The longest block of each precision; 16384 float32 points take one shared-memory plane of more than 48 KiB
    (the kernel opts in on a GPU)."""
    rows = 2
    spec = KernelSpec(kind, n, precision, "forward", n, scale=1.0 / n, convolve=True, elements_per_thread=32)
    kernel = build_callback_kernel(spec)
    assert kernel.shared_memory_size > 48 * 1024 or n < 16384
    n_mid = n // 2 + 1 if kind == "r2c" else n
    x = _input(kind, rows, n, np.dtype(precision).type)
    h = _input("c2c", 1, n_mid, np.dtype(precision).type)
    complex_dtype = np.result_type(np.dtype(precision), np.complex64)
    out = np.zeros((rows, n), precision if kind == "r2c" else complex_dtype)
    kernel.launch(x, out, h, (), (), 0)
    if kind == "r2c":
        want = np.fft.irfft(np.fft.rfft(x.astype(np.float64)) * h, n)
    else:
        want = np.fft.ifft(np.fft.fft(x.astype(np.complex128)) * h)
    tolerance = 2e-5 if precision == "float32" else 1e-12
    assert np.abs(out - want).max() <= tolerance * np.abs(want).max()


def test_covers_the_device_engine_sizes():
    assert covers(1024) and covers(16384) and covers(7 * 9 * 5) and not covers(32768)
    assert covers(8192) and not covers(11) and not covers(1)
    assert covers(4096, "float64") and not covers(8192, "float64") and not covers(8192, "complex128")


def test_generated_source_calls_the_callbacks_once_per_element():
    spec = KernelSpec("c2c", 16, "float32", "forward", 16, prolog_args=1, epilog_args=0, elements_per_thread=4)
    kernel = build_callback_kernel(spec, ramp_by_filter, times_index)
    assert kernel.source.count("PROLOG(") == 4 and kernel.source.count("EPILOG(") == 4
    assert kernel.source.count("FIRST(") == 1 and "SECOND(" not in kernel.source


@pytest.mark.parametrize("rows,m_in", [(3, 16), (4, 16), (1, 12)])
@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_pairs_of_real_rows_convolve_as_one_complex_transform(rows, m_in, precision):
    """Rows 2r, 2r + 1 of real x as one complex signal, h completed to a Hermitian filter: irfft(rfft(x) * h)."""
    from nvdispatch.device.fft_filter import launch_permute

    n = 16
    spec = KernelSpec(
        "c2c", n, precision, "forward", m_in, convolve=True, pairs=True,
        elements_per_thread=4, ffts_per_block=2,
    )
    kernel = build_callback_kernel(spec)
    cplx = np.result_type(np.dtype(precision), np.complex64)
    x = np.random.default_rng(3).standard_normal((rows, m_in)).astype(precision)
    h = _input("c2c", 1, n // 2 + 1, np.dtype(precision).type)[0].astype(cplx)
    h[0] += 2j  # irfft ignores the imaginary parts at 0 and n/2: so must the completion
    hp = np.zeros((1, n), cplx)
    launch_permute(h, hp, True, 0, np.dtype(precision).type(1.0 / n))  # the 1/n folded into the filter
    out = np.full((rows, n), np.nan, precision)
    kernel.launch(x, out, hp, (), (), 0)
    want = np.fft.irfft(np.fft.rfft(x.astype(np.float64), n) * h, n)
    tol = 2e-5 if precision == "float32" else 1e-12
    assert np.abs(out - want).max() <= tol * np.abs(want).max()
    assert "x[a + 1, " in kernel.source and "out[a + 1, " in kernel.source


def test_pairs_need_a_plain_c2c_convolution():
    with pytest.raises(ValueError, match="pairs"):
        build_callback_kernel(KernelSpec("r2c", 16, "float32", "forward", 16, convolve=True, pairs=True))
