"""nvdispatch.fft as a scipy.fft backend (uarray protocol)."""

from __future__ import annotations

import numpy as np
import pytest
from fft_reference import assert_close, make

import nvdispatch.fft as F
from nvdispatch.fft import _scipy_backend

sfft = pytest.importorskip("scipy.fft")
uarray = pytest.importorskip("scipy._lib.uarray")

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None


def _count_calls(monkeypatch):
    """The transforms the backend hands nvdispatch's front (which serves them from its plans or routes them)."""
    calls = []
    real = _scipy_backend.transform_front

    def spy(func, *args):
        calls.append(func)
        return real(func, *args)

    monkeypatch.setattr(_scipy_backend, "transform_front", spy)
    return calls


def test_protocol_attributes():
    assert F.__ua_domain__ == "numpy.scipy.fft"
    assert callable(F.__ua_function__) and callable(F.__ua_convert__)


def test_set_backend_runs_through_nvdispatch(monkeypatch):
    calls = _count_calls(monkeypatch)
    x = make((8, 16), "complex64")
    with sfft.set_backend(F):
        y = sfft.fft(x)
        z = sfft.fft2(x, workers=2, overwrite_x=True)
        w = sfft.irfftn(x, s=(8, 30))  # SciPy's s without axes: the last len(s) axes
        v = sfft.rfft(x.real, 20, 0, "ortho")
    assert calls == ["fft", "fftn", "irfftn", "rfft"]
    assert y.dtype == np.complex64  # precision kept
    assert_close(y, np.fft.fft(x.astype(np.complex128)), "complex64")
    assert_close(z, np.fft.fft2(x.astype(np.complex128)), "complex64")
    assert_close(w, np.fft.irfftn(x.astype(np.complex128), s=(8, 30), axes=(0, 1)), "complex64")
    assert_close(v, np.fft.rfft(x.real.astype(np.float64), 20, 0, "ortho"), "complex64")
    assert x.flags.writeable  # overwrite_x accepted, input left alone


def test_only_true_and_fall_through(monkeypatch):
    x = make((16,), "float64")
    with sfft.set_backend(F, only=True):
        np.testing.assert_allclose(sfft.ifft(sfft.fft(x)).real, x, atol=1e-12)
        with pytest.raises(uarray.BackendNotImplementedError):
            sfft.dct(x)  # not implemented by nvdispatch, and only=True forbids falling through
        with pytest.raises(uarray.BackendNotImplementedError):
            sfft.fft([1.0, 2.0])  # a list is no array without coerce
    with sfft.set_backend(F):
        np.testing.assert_allclose(sfft.dct(x), sfft.dct(x))  # falls through to SciPy
        np.testing.assert_allclose(sfft.fft([1.0, 2.0]), [3.0, -1.0])  # SciPy takes the list
    with sfft.set_backend(F, coerce=True):
        np.testing.assert_allclose(sfft.fft([1.0, 2.0]), [3.0, -1.0])  # coerced by __ua_convert__


def test_integer_input_is_promoted_like_scipy():
    with sfft.set_backend(F, only=True):
        np.testing.assert_allclose(sfft.fft(np.arange(4)), np.fft.fft(np.arange(4)))


def test_skip_backend(monkeypatch):
    calls = _count_calls(monkeypatch)
    x = make((8,), "complex128")
    with sfft.set_backend(F):
        with sfft.skip_backend(F):
            sfft.fft(x)
        assert calls == []
        sfft.fft(x)
    assert calls == ["fft"]


def test_global_and_registered(monkeypatch):
    calls = _count_calls(monkeypatch)
    x = make((8,), "complex128")
    try:
        sfft.set_global_backend(F)
        sfft.fft(x)
        assert calls == ["fft"]
    finally:
        sfft.set_global_backend("scipy")
    sfft.register_backend(F)  # tried after the global (SciPy) backend, so SciPy serves this one
    sfft.fft(x)
    assert calls == ["fft"]


def test_as_the_global_backend_with_scipy_registered_scipy_serves_what_nvdispatch_declines(monkeypatch):
    # set_global_backend replaces SciPy's own backend: registering it again keeps dct & co. available (as the
    # README says to do), while the transforms nvdispatch implements still run through it
    calls = _count_calls(monkeypatch)
    x = make((8,), "float64")
    try:
        sfft.set_global_backend(F)
        sfft.register_backend("scipy")
        np.testing.assert_allclose(sfft.dct(x), sfft._pocketfft.dct(x))
        sfft.rfft(x)
        assert calls == ["rfft"]
    finally:
        sfft.set_global_backend("scipy", try_last=True)


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_torch_input_through_scipy():
    t = torch.from_numpy(make((4, 8), "complex64"))
    with sfft.set_backend(F):
        y = sfft.fftn(t, axes=(0, 1))
    assert isinstance(y, torch.Tensor) and y.dtype == torch.complex64
    assert_close(y.numpy(), np.fft.fftn(t.numpy().astype(np.complex128)), "complex64")
