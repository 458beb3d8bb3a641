"""The one route on a GPU (run on the GPU machine): CUDA operands are taken by memory kind (a CUDA Torch tensor is
"torch.Tensor" and "cuda" memory, a CuPy array "cupy.ndarray" and "cuda", a ``__cuda_array_interface__`` or CUDA
DLPack object "cuda"), repeated calls keep their fast paths, every entry point returns the caller's type on the
caller's device, and ``stream=`` takes CUDA streams and refuses what is none. References: NumPy float64."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch.errors import InvalidArgumentError

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

RNG = np.random.default_rng(11)
A = RNG.standard_normal((16, 24)).astype(np.float32)
B = RNG.standard_normal((24, 16)).astype(np.float32)
BIAS = RNG.standard_normal(16).astype(np.float32)
WANT = np.maximum(A.astype(np.float64) @ B + BIAS, 0)


def _close(got, want, tol=2e-3):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max())))


def test_torch_cuda_tensors_take_their_executors_by_memory_kind_and_stay_on_their_device():
    a, b, bias = (torch.from_numpy(x).cuda() for x in (A, B, BIAS))
    assert nvdispatch.explain(a, b).executor == "torch"  # a plain product: Torch's own matmul
    assert nvdispatch.explain(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}).executor in ("cuda", "torch")
    for _ in range(4):  # planned, then the call key (and the compiled front's memo)
        got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        assert isinstance(got, torch.Tensor) and got.device == a.device
        _close(got.cpu().numpy(), WANT)
    with nvdispatch.set_backend("cuda", only=True):
        for _ in range(2):
            got = nvdispatch.matmul(a, b)
            assert isinstance(got, torch.Tensor) and got.device == a.device
            _close(got.cpu().numpy(), A.astype(np.float64) @ B)
    with nvdispatch.Matmul(a, b) as mm:
        got = mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias}).execute()
        assert isinstance(got, torch.Tensor)
        _close(got.cpu().numpy(), WANT)


def test_cuda_streams_are_taken_and_what_is_no_stream_is_refused():
    a, b = torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda()
    s = torch.cuda.Stream()
    for stream in (s, s.cuda_stream, None):
        got = nvdispatch.matmul(a, b, epilog="RELU", stream=stream)
        torch.cuda.synchronize()
        _close(got.cpu().numpy(), np.maximum(A.astype(np.float64) @ B, 0))
    for bad in ("x", 3.5, object()):
        with pytest.raises(InvalidArgumentError, match="stream"):
            nvdispatch.matmul(a, b, stream=bad)
        with pytest.raises(InvalidArgumentError, match="stream"):
            nvdispatch.fft.fft(a.to(torch.complex64), stream=bad)


def test_cuda_array_interface_operands_get_cuda_arrays_back_from_every_entry_point():
    cupy = pytest.importorskip("cupy")

    class Cai:  # known only by the protocol
        def __init__(self, arr):
            self.arr = arr
            self.__cuda_array_interface__ = arr.__cuda_array_interface__

    a, b = Cai(cupy.asarray(A)), Cai(cupy.asarray(B))
    for _ in range(2):
        got = nvdispatch.matmul(a, b, epilog="RELU")
        assert isinstance(got, nvdispatch.CudaArray)
        _close(got.copy_to_host(), np.maximum(A.astype(np.float64) @ B, 0))
    shifted = nvdispatch.fft.fftshift(a, axes=1)
    assert isinstance(shifted, nvdispatch.CudaArray)
    np.testing.assert_array_equal(shifted.copy_to_host(), np.fft.fftshift(A, axes=1))
    spectrum = nvdispatch.fft.fft(Cai(cupy.asarray(A.astype(np.complex64))), axis=1)
    assert isinstance(spectrum, nvdispatch.CudaArray)
    _close(spectrum.copy_to_host(), np.fft.fft(A.astype(np.float64), axis=1))


def test_cupy_arrays_keep_cupys_fast_paths_and_type():
    cupy = pytest.importorskip("cupy")
    a, b = cupy.asarray(A), cupy.asarray(B)
    assert nvdispatch.explain(a, b).executor == "cupy"  # a plain product: cupy.matmul
    for _ in range(3):
        got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": cupy.asarray(BIAS)})
        assert isinstance(got, cupy.ndarray)
        _close(cupy.asnumpy(got), WANT)
        y = nvdispatch.fft.fft(a.astype(cupy.complex64), axis=1)
        assert isinstance(y, cupy.ndarray)
        _close(cupy.asnumpy(y), np.fft.fft(A.astype(np.float64), axis=1))


def test_the_stateful_fft_and_shifts_return_cuda_torch_tensors():
    x = torch.from_numpy(A.astype(np.complex64)).cuda()
    with nvdispatch.fft.FFT(x, axes=(1,)) as f:
        y = f.plan().execute()
    assert isinstance(y, torch.Tensor) and y.device == x.device
    _close(y.cpu().numpy(), np.fft.fft(A.astype(np.float64), axis=1))
    shifted = nvdispatch.fft.fftshift(x.real.contiguous(), axes=1)
    assert isinstance(shifted, torch.Tensor) and shifted.is_cuda
    np.testing.assert_array_equal(shifted.cpu().numpy(), np.fft.fftshift(A, axes=1))
    freq = nvdispatch.fft.fftfreq(8, device=torch.device("cuda", 0))
    assert isinstance(freq, torch.Tensor) and freq.is_cuda
    np.testing.assert_allclose(freq.cpu().numpy(), np.fft.fftfreq(8))


def test_jax_gpu_cached_calls_come_back_as_jax_arrays_on_their_device():
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("this JAX has no GPU backend")
    a, b, bias = (jax.device_put(jax.numpy.asarray(x), gpu) for x in (A, B, BIAS))
    for _ in range(3):
        got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        assert isinstance(got, jax.Array) and got.devices() == {gpu}
        _close(np.asarray(got), WANT)
    with nvdispatch.Matmul(a, b) as mm:
        got = mm.plan().execute()
    assert isinstance(got, jax.Array) and got.devices() == {gpu}
    _close(np.asarray(got), A.astype(np.float64) @ B)
