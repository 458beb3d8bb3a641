"""JAX arrays (and any DLPack producer) get their own type back: results are imported with the caller's
namespace's ``from_dlpack``; CudaArray/any nvdispatch-owned memory exports DLPack itself. References are
plain NumPy float64 expressions."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import nvdispatch
from nvdispatch._cuda import dlpack_export
from nvdispatch._cuda.dlpack_abi import KDL_CPU
from nvdispatch.errors import InvalidArgumentError, MixedOperandsError

jax = pytest.importorskip("jax")
jnp = jax.numpy

RNG = np.random.default_rng(3)
A = RNG.standard_normal((6, 4)).astype(np.float32)
B = RNG.standard_normal((4, 5)).astype(np.float32)
BIAS = RNG.standard_normal(5).astype(np.float32)


@pytest.fixture(autouse=True)
def _jax_on_the_cpu_unless_gpu_marked(request):
    """The unmarked tests are about JAX CPU arrays (a GPU machine's JAX would put them on its GPU, where JAX's
    default matmul precision, which nvdispatch follows, is not float32's)."""
    if request.node.get_closest_marker("gpu"):
        yield
        return
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _is_jax(x) -> bool:
    return isinstance(x, jax.Array)


def test_matmul_returns_jax_arrays_that_do_jax_arithmetic():
    a, b, bias = jnp.asarray(A), jnp.asarray(B), jnp.asarray(BIAS)
    got = nvdispatch.matmul(a, b)
    assert _is_jax(got) and got.devices() == a.devices()
    np.testing.assert_allclose(np.asarray(got - 1.0), A.astype(np.float64) @ B - 1.0, rtol=1e-5, atol=1e-5)
    fused = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    assert _is_jax(fused)
    np.testing.assert_allclose(np.asarray(fused), np.maximum(A.astype(np.float64) @ B + BIAS, 0), rtol=1e-5, atol=1e-5)
    out, aux = nvdispatch.matmul(a, b, epilog="RELU_AUX")
    assert _is_jax(out) and _is_jax(aux["relu_aux"])
    np.testing.assert_array_equal(np.asarray(aux["relu_aux"]), A.astype(np.float64) @ B > 0)


def test_fft_returns_jax_arrays():
    x = jnp.asarray(A)
    got = nvdispatch.fft.fft(x, axis=0)
    assert _is_jax(got) and got.dtype == jnp.complex64
    np.testing.assert_allclose(np.asarray(got), np.fft.fft(A.astype(np.float64), axis=0), rtol=1e-4, atol=1e-4)
    back = nvdispatch.fft.irfftn(nvdispatch.fft.rfftn(x), s=A.shape, axes=(0, 1))
    assert _is_jax(back)
    np.testing.assert_allclose(np.asarray(back), A, rtol=1e-4, atol=1e-4)
    ints = nvdispatch.fft.rfft(jnp.arange(8))  # integers: JAX's default float, as jnp.fft does
    assert _is_jax(ints) and ints.dtype == jnp.fft.rfft(jnp.arange(8)).dtype
    np.testing.assert_allclose(np.asarray(ints), np.fft.rfft(np.arange(8.0)), rtol=1e-5, atol=1e-4)


def test_jax_errors_are_typed():
    with pytest.raises(MixedOperandsError):
        nvdispatch.matmul(jnp.asarray(A), B)
    with pytest.raises(InvalidArgumentError, match="out"):
        nvdispatch.fft.fft(jnp.asarray(A), out=jnp.zeros((6, 4), jnp.complex64))  # JAX arrays are immutable


class _Producer:
    """A DLPack producer no framework claims and no array-API namespace describes."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, **kw):
        return self.arr.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_producer_without_namespace_gets_a_numpy_result():
    got = nvdispatch.matmul(_Producer(A), _Producer(B))
    assert type(got) is np.ndarray
    np.testing.assert_allclose(got, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)


def test_dlpack_export_is_imported_zero_copy_and_released():
    torch = pytest.importorskip("torch")
    base = np.arange(24, dtype=np.float64).reshape(4, 6)

    class Owner:
        def __init__(self, arr):
            self.arr = arr

        def __dlpack__(self, **kw):
            a = self.arr
            strides = [s // a.itemsize for s in a.strides]
            return dlpack_export.capsule(a.ctypes.data, a.shape, strides, a.dtype, KDL_CPU, 0, self)

        def __dlpack_device__(self):
            return (KDL_CPU, 0)

    before = dlpack_export.live_exports()
    view = base[:, ::2]  # strided (JAX takes compact layouts only)
    for consumer, arr in ((np.from_dlpack, view), (torch.from_dlpack, view), (jnp.from_dlpack, base)):
        got = consumer(Owner(arr))
        np.testing.assert_array_equal(np.asarray(got), arr)
        del got
    np.from_dlpack(Owner(np.array([True, False])))
    unconsumed = Owner(view).__dlpack__()
    del unconsumed
    gc.collect()
    assert dlpack_export.live_exports() == before


@pytest.mark.gpu
def test_jax_gpu_arrays_come_back_as_jax_arrays_on_their_device():
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        pytest.skip("this JAX has no GPU backend (pip install 'jax[cuda12]')")
    a = jax.device_put(jnp.asarray(A), gpus[0])
    b = jax.device_put(jnp.asarray(B), gpus[0])
    bias = jax.device_put(jnp.asarray(BIAS), gpus[0])
    with jax.default_matmul_precision("highest"):  # float32 (JAX's default precision is TF32 on the GPU)
        got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    assert _is_jax(got) and got.devices() == {gpus[0]}
    np.testing.assert_allclose(
        np.asarray(got - 1.0), np.maximum(A.astype(np.float64) @ B + BIAS, 0) - 1.0, rtol=1e-3, atol=1e-3
    )
    spectrum = nvdispatch.fft.fft(a.astype(jnp.complex64), axis=1)
    assert _is_jax(spectrum) and spectrum.devices() == {gpus[0]}
    np.testing.assert_allclose(np.asarray(spectrum), np.fft.fft(A.astype(np.float64), axis=1), rtol=1e-3, atol=1e-3)


# -- every entry point, cached calls included (issue #26.1; #28.7) --------------------------------------------------
def test_cached_calls_and_the_stateful_matmul_return_jax_arrays():
    a, b, bias = jnp.asarray(A), jnp.asarray(B), jnp.asarray(BIAS)
    want = np.maximum(A.astype(np.float64) @ B + BIAS, 0)
    for _ in range(3):  # planned, then served by the call key
        got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        assert _is_jax(got) and got.devices() == a.devices()
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    with nvdispatch.Matmul(a, b) as mm:
        mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        for _ in range(2):
            got = mm.execute()
            assert _is_jax(got)
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
        mm.reset_operands(a=jnp.asarray(-A))
        np.testing.assert_allclose(
            np.asarray(mm.execute()), np.maximum(-A.astype(np.float64) @ B + BIAS, 0), rtol=1e-5, atol=1e-5
        )


def test_the_stateful_fft_shifts_convolve_and_callbacks_return_jax_arrays():
    x = jnp.asarray(A.astype(np.complex64))
    with nvdispatch.fft.FFT(x, axes=(1,)) as f:
        y = f.plan().execute()
    assert _is_jax(y)
    np.testing.assert_allclose(np.asarray(y), np.fft.fft(A.astype(np.float64), axis=1), rtol=1e-4, atol=1e-4)
    shifted = nvdispatch.fft.fftshift(jnp.asarray(A), axes=1)
    assert _is_jax(shifted)
    np.testing.assert_array_equal(np.asarray(shifted), np.fft.fftshift(A, axes=1))
    h = np.fft.rfft(np.r_[1.0, 1.0, np.zeros(2)] / 2).astype(np.complex64)
    for _ in range(2):
        conv = nvdispatch.fft.convolve(jnp.asarray(A), jnp.asarray(h))
        assert _is_jax(conv)
        np.testing.assert_allclose(np.asarray(conv), np.fft.irfft(np.fft.rfft(A) * h, n=4), rtol=1e-4, atol=1e-5)
    for _ in range(2):
        got = nvdispatch.fft.fft(x, epilog=lambda v, i: v * (i % 4 < 2))
        assert _is_jax(got)
        np.testing.assert_allclose(np.asarray(got), np.fft.fft(A) * (np.arange(4) < 2), rtol=1e-4, atol=1e-4)


def test_jax_bfloat16_on_the_cpu_follows_jax():
    """jnp.matmul of bfloat16 gives bfloat16 (computed in float32 here, rounded once); jnp.fft.rfft refuses
    bfloat16, and so does nvdispatch, naming the operand; float8, which NumPy cannot compute on, is a typed error."""
    from nvdispatch.errors import UnsupportedDtypeError

    a = jnp.asarray(A, dtype=jnp.bfloat16)
    got = nvdispatch.matmul(a, a.T)
    assert _is_jax(got) and got.dtype == jnp.bfloat16
    wide = np.asarray(a, np.float64)
    np.testing.assert_allclose(np.asarray(got, np.float64), wide @ wide.T, rtol=1e-2, atol=1e-2)
    with pytest.raises(UnsupportedDtypeError, match="bfloat16") as info:
        nvdispatch.fft.rfft(a)
    assert info.value.argument == "x"
    with pytest.raises(UnsupportedDtypeError, match="float8") as info:
        nvdispatch.matmul(a.astype(jnp.float8_e4m3fn), a.T.astype(jnp.float8_e4m3fn))
    assert info.value.argument == "a"


def test_mixed_operand_errors_name_jax_not_dlpack():
    with pytest.raises(MixedOperandsError) as info:
        nvdispatch.matmul(jnp.asarray(A), B)
    assert "jax" in str(info.value) and "dlpack" not in str(info.value)


def test_a_stream_is_refused_for_jax_cpu_arrays():
    with pytest.raises(InvalidArgumentError, match="stream"):
        nvdispatch.matmul(jnp.asarray(A), jnp.asarray(B), stream=3.5)


def test_a_jax_device_pointer_is_read_once_jax_has_written_the_array():
    """JAX writes arrays on its own streams: the pointer a plan launches on (every repeated call) is taken only
    after the array is ready, as the DLPack export of the first call waits."""
    from nvdispatch._adapters.jax import JaxAdapter

    events = []

    class Pending:
        def block_until_ready(self):
            events.append("ready")
            return self

        def unsafe_buffer_pointer(self):
            events.append("pointer")
            return 0x1000

    assert JaxAdapter().data_ptr(Pending()) == 0x1000
    assert events == ["ready", "pointer"]
