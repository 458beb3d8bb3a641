"""array-api-strict, added the documented way (one adapter file, ``_adapters/array_api_strict.py``, and one
registration): every entry point returns strict arrays on the operand's device (the namespace simulates several),
with values checked against a NumPy float64 oracle (``tests/matmul/matmul_reference.py``,
``tests/fft/fft_reference.py``: independent of nvdispatch's own steps)."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors

xp = pytest.importorskip("array_api_strict")
sys.path[:0] = [str(pathlib.Path(__file__).parents[1] / d) for d in ("matmul", "fft")]
from fft_reference import assert_close as fft_close  # noqa: E402
from fft_reference import reference as fft_reference  # noqa: E402
from matmul_reference import assert_close, expected  # noqa: E402

DEVICES = [xp.Device("CPU_DEVICE"), xp.Device("device1")]
RNG = np.random.default_rng(7)
A = RNG.integers(-3, 4, (5, 4)).astype(np.float64)
B = RNG.integers(-3, 4, (4, 3)).astype(np.float64)


@pytest.fixture(params=DEVICES, ids=lambda d: str(d).split("'")[1])
def device(request):
    nvdispatch.plan_cache.clear()
    return request.param


def strict(x, device, dtype=None):
    return xp.asarray(np.asarray(x, dtype=dtype), device=device)


def host(x) -> np.ndarray:
    return np.asarray(np.from_dlpack(x))


def assert_strict(x, device):
    assert isinstance(x, type(xp.asarray(0))), type(x)
    assert x.device == device


def _inputs(epilog: str, dtype: str, m: int, n: int):
    spec = nvdispatch._epilog.spec_of(epilog)
    values = {
        "bias": RNG.integers(-2, 3, n).astype(dtype),
        "relu_aux": RNG.integers(0, 2, (m, n)).astype(bool),
        "gelu_aux": RNG.standard_normal((m, n)).astype(dtype),
    }
    return {name: values[name] for name in spec.inputs}


# -- matmul -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("epilog", [e.name for e in nvdispatch.Epilog])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_runs_every_epilog_and_returns_strict_arrays_on_the_operands_device(epilog, dtype, device):
    a, b = A.astype(dtype), B.astype(dtype)
    inputs = _inputs(epilog, dtype, 5, 3)
    want, want_aux = expected(a, b, None, 1, None, epilog, inputs)
    for _ in range(2):  # planned, then the cached call
        got = nvdispatch.matmul(
            strict(a, device),
            strict(b, device),
            epilog=epilog,
            epilog_inputs={k: strict(v, device) for k, v in inputs.items()} or None,
        )
        out, aux = got if isinstance(got, tuple) else (got, {})
        assert_strict(out, device)
        assert_close(host(out), want, dtype)
        assert set(aux) == set(want_aux)
        for name, value in aux.items():
            assert_strict(value, device)
            assert_close(host(value), np.asarray(want_aux[name], dtype=host(value).dtype), dtype, name)


def test_matmul_with_c_alpha_beta_vectors_and_transposed_views(device):
    a, b, c = strict(A, device), strict(B, device), strict(np.ones((5, 3)), device)
    for _ in range(2):
        got = nvdispatch.matmul(a, b, c, alpha=2.0, beta=-1.0)
        assert_strict(got, device)
        np.testing.assert_allclose(host(got), 2 * A @ B - 1)
        at, bt = xp.matrix_transpose(strict(A.T.copy(), device)), strict(B.T.copy(), device).mT  # strided views
        got = nvdispatch.matmul(at, bt)
        assert_strict(got, device)
        np.testing.assert_allclose(host(got), A @ B, rtol=1e-12)
        v = strict(A[:, 0], device)
        dot = nvdispatch.matmul(v, v)  # a 1-D @ 1-D product: a 0-d strict array (the namespace's own)
        assert_strict(dot, device)
        assert dot.shape == () and float(dot) == pytest.approx(float(A[:, 0] @ A[:, 0]))


def test_the_stateful_matmul_plans_executes_resets_and_autotunes_on_strict_arrays(device):
    a, b, bias = strict(A, device), strict(B, device), strict(np.arange(3.0), device)
    want = np.maximum(A @ B + np.arange(3.0), 0)
    with nvdispatch.Matmul(a, b) as mm:
        mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        for _ in range(2):
            got = mm.execute()
            assert_strict(got, device)
            np.testing.assert_allclose(host(got), want)
        mm.reset_operands(a=strict(-A, device))
        got = mm.execute()
        assert_strict(got, device)
        np.testing.assert_allclose(host(got), np.maximum(-A @ B + np.arange(3.0), 0))
        timings = mm.autotune(iterations=1)
        assert mm.strategy in timings
        got = mm.execute()
        assert_strict(got, device)
        np.testing.assert_allclose(host(got), np.maximum(-A @ B + np.arange(3.0), 0))


def test_mixing_strict_arrays_with_numpy_names_both_frameworks():
    with pytest.raises(errors.MixedOperandsError, match="array_api_strict") as info:
        nvdispatch.matmul(strict(A, DEVICES[0]), B)
    assert "numpy" in str(info.value)


def test_explain_names_the_framework_and_the_host_executor():
    e = nvdispatch.explain(strict(A, DEVICES[1]), strict(B, DEVICES[1]), epilog="RELU")
    assert e.executor == "numpy" and e.problem.framework == "array_api_strict"


# -- fft ----------------------------------------------------------------------------------------------------------
ONE_D = ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")
N_D = ("fftn", "ifftn", "rfftn", "irfftn", "fft2", "ifft2", "rfft2", "irfft2")
REAL_IN = ("rfft", "rfftn", "rfft2", "ihfft")


def _signal(func, shape=(4, 8)):
    x = RNG.standard_normal(shape)
    return x if func in REAL_IN else x + 1j * RNG.standard_normal(shape)


@pytest.mark.parametrize("func", ONE_D + N_D)
def test_every_transform_returns_strict_arrays_on_the_operands_device(func, device):
    x = _signal(func)
    kw = {"axis": 0} if func in ONE_D else {}
    ref_func = {"fft2": "fftn", "ifft2": "ifftn", "rfft2": "rfftn", "irfft2": "irfftn"}.get(func, func)
    want = fft_reference(ref_func, x, **kw)
    for _ in range(2):  # planned, then the cached call
        got = getattr(nvdispatch.fft, func)(strict(x, device), **kw)
        assert_strict(got, device)
        fft_close(host(got), want, "float64")


def test_the_stateful_fft_executes_both_ways_in_place_and_after_a_reset(device):
    x = _signal("fft")
    with nvdispatch.fft.FFT(strict(x, device), axes=(1,)) as f:
        f.plan()
        y = f.execute()
        assert_strict(y, device)
        fft_close(host(y), np.fft.fft(x, axis=1), "float64")
        z = f.execute(direction="inverse")
        assert_strict(z, device)
        fft_close(host(z), np.fft.ifft(x, axis=1), "float64")
        f.reset_operand(strict(2 * x, device))
        fft_close(host(f.execute()), np.fft.fft(2 * x, axis=1), "float64")
    s = strict(x.copy(), device)  # (asarray may share the NumPy array's memory: the transform overwrites it)
    with nvdispatch.fft.FFT(s, options={"inplace": True}) as f:
        out = f.plan().execute()
        assert out is s
        fft_close(host(s), np.fft.fftn(x), "float64")


def test_shifts_frequencies_and_convolve_return_strict_arrays_on_the_device(device):
    x = RNG.standard_normal((3, 8))
    got = nvdispatch.fft.fftshift(strict(x, device), axes=1)
    assert_strict(got, device)
    np.testing.assert_array_equal(host(got), np.fft.fftshift(x, axes=1))
    got = nvdispatch.fft.ifftshift(strict(x, device))
    assert_strict(got, device)
    np.testing.assert_array_equal(host(got), np.fft.ifftshift(x))
    for fn, ref in ((nvdispatch.fft.fftfreq, np.fft.fftfreq), (nvdispatch.fft.rfftfreq, np.fft.rfftfreq)):
        got = fn(8, d=0.5, device=device, dtype=xp.float32)
        assert_strict(got, device)
        assert got.dtype == xp.float32
        np.testing.assert_allclose(host(got), ref(8, d=0.5), rtol=1e-7)
    h = np.fft.rfft(np.r_[1.0, 1.0, 1.0, np.zeros(5)] / 3)
    for _ in range(2):
        got = nvdispatch.fft.convolve(strict(x, device), strict(h, device))
        assert_strict(got, device)
        np.testing.assert_allclose(host(got), np.fft.irfft(np.fft.rfft(x) * h, n=8), atol=1e-12)


def test_callbacks_run_on_strict_operands_and_return_strict_arrays(device):
    x = _signal("fft")
    window = np.hanning(8)

    def prolog(v, i, w):
        return v * w[i % 8]

    def epilog(v, i):
        return v * (i % 8 < 4)

    for _ in range(2):
        got = nvdispatch.fft.fft(strict(x, device), prolog=prolog, prolog_data=(strict(window, device),), epilog=epilog)
        assert_strict(got, device)
        fft_close(host(got), np.fft.fft(x * window) * (np.arange(8) < 4), "float64")


def test_a_stream_is_refused_on_strict_arrays_naming_the_argument():
    a = strict(A, DEVICES[0])
    with pytest.raises(errors.InvalidArgumentError, match="stream"):
        nvdispatch.matmul(a, strict(B, DEVICES[0]), stream=object())
    with pytest.raises(errors.InvalidArgumentError, match="stream"):
        nvdispatch.fft.fft(a, stream="x")
