"""The raw cuda executor's prepared transforms on the GPU (real input to a complex transform, hfft/ihfft, padding and
trimming by n/s), for operands known only by ``__cuda_array_interface__`` or DLPack and for Numba device arrays,
against numpy.fft on the host copy; skipped without a GPU. (JAX GPU arrays, stateful FFT included:
tests/jax_integration/test_jax_gpu_prepared_fft.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from fft_reference import assert_close, expected_dtype, make, reference

import nvdispatch
import nvdispatch.fft as F
from nvdispatch.errors import UnsupportedDtypeError

pytestmark = pytest.mark.gpu


def _device_module():
    """CuPy, else Torch: what makes the device arrays the protocol-only objects below wrap."""
    try:
        import cupy

        def to_host(a):
            return cupy.asnumpy(cupy.asarray(a) if hasattr(a, "__cuda_array_interface__") else cupy.from_dlpack(a))

        return "cupy", cupy.asarray, to_host
    except ImportError:
        pass
    try:
        import torch

        if torch.cuda.is_available():

            def to_host(a):
                if hasattr(a, "__cuda_array_interface__"):
                    return torch.as_tensor(a, device="cuda").cpu().numpy()
                return torch.from_dlpack(a).cpu().numpy()

            return "torch", lambda x: torch.from_numpy(np.ascontiguousarray(x)).cuda(), to_host
    except ImportError:
        pass
    return None, None, None


HELPER, TO_DEVICE, TO_HOST = _device_module()
needs_helper = pytest.mark.skipif(HELPER is None, reason="the array passes need CuPy or Torch")


class CaiOnly:
    """An object known only by ``__cuda_array_interface__`` (no framework claims it)."""

    def __init__(self, a):
        self._a = a

    @property
    def __cuda_array_interface__(self):
        return self._a.__cuda_array_interface__


class DlpackOnly:
    """An object known only by DLPack."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, *args, **kwargs):
        return self._a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def _host(r):
    """A result (CudaArray, Numba device array, or anything with CAI/DLPack) as a NumPy array."""
    if hasattr(r, "copy_to_host"):
        return np.asarray(r.copy_to_host())
    return TO_HOST(r)


def _wrap_cai(x):
    return CaiOnly(TO_DEVICE(x))


def _wrap_dlpack(x):
    return DlpackOnly(TO_DEVICE(x))


def _wrap_numba(x):
    numba_cuda = pytest.importorskip("numba.cuda")
    return numba_cuda.to_device(np.ascontiguousarray(x))


WRAPS = {"cai": _wrap_cai, "dlpack": _wrap_dlpack, "numba": _wrap_numba}

# func, shape, dtype, kwargs (nvdispatch.fft and numpy.fft take the same)
CASES = [
    ("fft", (16, 40), "float32", {}),
    ("fft", (16, 40), "float64", {"axis": 0}),
    ("ifft", (6, 30, 5), "float32", {"axis": 1}),
    ("fftn", (12, 10, 8), "float64", {"axes": (0, 2)}),
    ("fft2", (12, 10, 8), "float32", {}),
    ("ifft2", (12, 10), "float64", {}),
    ("fft", (16, 40), "complex64", {"n": 64}),
    ("fft", (16, 40), "complex128", {"n": 25}),
    ("fft", (16, 40), "float32", {"n": 50, "axis": 0}),
    ("ifft", (16, 40), "complex64", {"n": 33}),
    ("fftn", (12, 10, 8), "complex64", {"s": (16, 7), "axes": (0, 1)}),
    ("fftn", (12, 10, 8), "float64", {"s": (5, 10, 12), "axes": (0, 1, 2)}),
    ("ifftn", (12, 10), "complex128", {"s": (20, 6), "axes": (0, 1)}),
    ("fft2", (12, 10), "float32", {"s": (9, 14)}),
    ("rfft", (16, 40), "float32", {"n": 64}),
    ("rfft", (16, 40), "float64", {"n": 30, "axis": 0}),
    ("rfftn", (12, 10, 8), "float32", {"s": (7, 12), "axes": (0, 2)}),
    ("irfft", (16, 21), "complex64", {"n": 50}),
    ("irfft", (16, 21), "complex128", {"n": 13}),
    ("irfft", (16, 21), "float32", {}),
    ("irfftn", (12, 10, 5), "complex64", {"s": (6, 10, 12), "axes": (0, 1, 2)}),
    ("hfft", (16, 21), "complex64", {}),
    ("hfft", (16, 21), "complex128", {"n": 61}),
    ("hfft", (21, 16), "complex64", {"n": 11, "axis": 0}),
    ("hfft", (16, 21), "float64", {}),
    ("ihfft", (16, 40), "float32", {}),
    ("ihfft", (16, 41), "float64", {"n": 64}),
    ("ihfft", (40, 16), "float32", {"n": 9, "axis": 0}),
]
IDS = [f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(CASES)]


def _oracle(func, x, kw, norm):
    """numpy.fft in double precision (fft2/ifft2: numpy's own, over the last two axes)."""
    if func in ("fft2", "ifft2"):
        return getattr(np.fft, func)(x.astype(np.complex128), norm=norm, **kw)
    return reference(func, x, norm=norm, **kw)


def _check(func, x, xd, kw, norm, dtype):
    before = _host(xd).copy()
    with nvdispatch.set_backend("cuda", only=True):
        got = getattr(F, func)(xd, norm=norm, **kw)
    assert hasattr(got, "__cuda_array_interface__") or hasattr(got, "__dlpack__")
    got = _host(got)
    want_dtype = expected_dtype(func if func not in ("fft2", "ifft2") else "fft", dtype)
    assert got.dtype == want_dtype, (func, got.dtype, want_dtype)
    assert_close(got, _oracle(func, x, kw, norm), dtype)
    np.testing.assert_array_equal(_host(xd), before)  # the input is never written


@needs_helper
@pytest.mark.parametrize("wrap", ["cai", "dlpack"])
@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_protocol_only_operands_against_numpy(case, norm, wrap):
    func, shape, dtype, kw = case
    x = make(shape, dtype)
    _check(func, x, WRAPS[wrap](x), kw, norm, dtype)


@needs_helper
@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("case", CASES[::3], ids=IDS[::3])
def test_numba_device_arrays_against_numpy(case, norm):
    func, shape, dtype, kw = case
    x = make(shape, dtype)
    _check(func, x, _wrap_numba(x), kw, norm, dtype)


@needs_helper
def test_strided_protocol_operand():
    """A strided device view (CAI strides) is gathered as it lies."""
    base = make((32, 80), "float32")
    xd = CaiOnly(TO_DEVICE(base)[::2, 1::2])
    x = base[::2, 1::2]
    with nvdispatch.set_backend("cuda", only=True):
        for func, kw in (
            ("fft", {"n": 48}),
            ("hfft", {"n": 30}),
            ("ihfft", {}),
            ("fftn", {"s": (20, 30), "axes": (0, 1)}),
        ):
            assert_close(_host(getattr(F, func)(xd, **kw)), reference(func, x, **kw), "float32")


@needs_helper
def test_explain_shows_the_route_and_the_plan_is_cached():
    x = make((16, 40), "float32")
    xd = _wrap_cai(x)
    nvdispatch.plan_cache.clear()
    e = nvdispatch.explain(F.fft, xd, n=64, norm="ortho")
    text = str(e)
    assert e.executor == "cuda", text
    for words in ("widened to complex64", "axis 1 zero-padded from 40 to 64", "cufftMakePlanMany64 C2C",
                  "scale by 0.125"):  # fmt: skip
        assert words in text, (words, text)
    F.fft(xd, n=64, norm="ortho")
    assert nvdispatch.explain(F.fft, xd, n=64, norm="ortho").cached
    assert "conjugated" in str(nvdispatch.explain(F.ihfft, xd))


@needs_helper
def test_stateful_fft_of_real_protocol_operand():
    x = make((12, 20), "float64")
    xd = _wrap_cai(x)
    with nvdispatch.set_backend("cuda", only=True):
        with F.FFT(xd, options={"fft_type": "C2C", "norm": "ortho"}) as f:
            y = _host(f.plan().execute())
            z = _host(f.execute(direction="inverse"))
            assert f.executor == "cuda"
    assert_close(y, np.fft.fftn(x, norm="ortho"), "float64")
    assert_close(z, np.fft.ifftn(x, norm="ortho"), "float64")


def test_half_precision_protocol_operands_follow_the_rules():
    """float16 known only by a protocol has no framework rule to promote it: a dtype error, not NoExecutorError."""
    if HELPER is None:
        pytest.skip("no device framework to make the array")
    xd = _wrap_cai(make((8, 16), "float16"))
    with pytest.raises(UnsupportedDtypeError):
        F.fft(xd)


@pytest.mark.parametrize("fw", ["cupy", "torch"])
def test_framework_arrays_stay_with_their_own_fft_unless_cuda_is_asked_for(fw):
    mod = pytest.importorskip(fw)
    x = make((16, 40), "float32")
    xd = mod.asarray(x, device="cuda") if fw == "torch" else mod.asarray(x)
    e = nvdispatch.explain(F.fft, xd, n=64)
    assert e.executor == fw, str(e)
    assert any(name == "cuda" and "own FFT" in why for name, why in e.declined), e.declined
    with nvdispatch.set_backend("cuda"):
        assert nvdispatch.explain(F.fft, xd, n=64).executor == "cuda"
        got = F.hfft(xd, n=50, norm="forward")
    assert type(got).__module__.split(".")[0] == fw
    out = got.get() if fw == "cupy" else got.cpu().numpy()
    assert_close(out, reference("hfft", x, n=50, norm="forward"), "float32")
