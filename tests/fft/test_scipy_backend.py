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
        n = np.arange(x.size)  # DCT-II as SciPy defines it (norm=None), written out: SciPy's private modules move
        want = 2 * np.cos(np.pi * n[:, None] * (2 * n[None, :] + 1) / (2 * x.size)) @ x
        np.testing.assert_allclose(sfft.dct(x), want, rtol=1e-12, atol=1e-12)
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


# -- SciPy's functions through the backend: x alone (the shortcut to the front) and with arguments ---------------

_SCIPY_FUNCS = [
    ("fft", "complex64", {"n": 12, "axis": 0}),
    ("ifft", "complex128", {"norm": "ortho"}),
    ("rfft", "float32", {"n": 20}),
    ("rfft", "float64", {"axis": 0, "norm": "forward"}),
    ("irfft", "complex128", {"n": 30}),
    ("hfft", "complex64", {"norm": "ortho"}),
    ("ihfft", "float64", {"n": 10}),
    ("fftn", "complex128", {"axes": (0,)}),
    ("ifftn", "complex64", {"s": (4, 6)}),
    ("rfftn", "float64", {"s": (8, 10), "axes": (0, 1)}),
    ("irfftn", "complex128", {"axes": (1,), "norm": "forward"}),
    ("fft2", "complex64", {"s": (6, 6)}),
    ("ifft2", "complex128", {"norm": "forward"}),
    ("rfft2", "float32", {"axes": (1, 0)}),
    ("irfft2", "complex64", {"s": (8, 14)}),
    ("hfftn", "complex128", {"s": (8, 14)}),
    ("ihfftn", "float64", {"axes": (0,)}),
    ("hfft2", "complex64", {}),
    ("ihfft2", "float32", {"norm": "ortho"}),
]


def _scipys_own(name, x, **kw):
    with sfft.set_backend("scipy", only=True):
        return getattr(sfft, name)(x, **kw)


@pytest.mark.parametrize("name, dtype, kw", _SCIPY_FUNCS)
def test_every_scipy_transform_gives_scipys_values_and_dtype_with_x_alone_and_with_arguments(name, dtype, kw):
    x = make((8, 16), dtype, seed=3)
    wide = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)
    for call_kw in ({}, kw):  # x alone: uarray hands the backend (x,) and no keywords
        with sfft.set_backend(F, only=True):
            got = getattr(sfft, name)(x, **call_kw)
        assert type(got) is np.ndarray
        assert got.dtype == _scipys_own(name, x, **call_kw).dtype  # SciPy's own dtype: precision kept
        assert_close(got, _scipys_own(name, wide, **call_kw), dtype)  # SciPy's own values, in double precision
    assert x.tobytes() == make((8, 16), dtype, seed=3).tobytes()  # the input is never written


def test_x_by_keyword_defaults_spelled_out_and_scipys_extras_give_the_same_values():
    x = make((64,), "float64", seed=5)
    want = np.fft.rfft(x)
    with sfft.set_backend(F, only=True):
        calls = (
            sfft.rfft(x=x),
            sfft.rfft(x, None, -1, None),  # uarray drops trailing defaults: the call of x alone
            sfft.rfft(x, None, -1, None, False, None),
            sfft.rfft(x, workers=2),
            sfft.rfft(x, overwrite_x=True),
        )
        for got in calls:
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        with pytest.raises(uarray.BackendNotImplementedError):
            sfft.rfft(x, workers=0)  # declined (a typed error inside), and only=True lets nobody else serve it
    with sfft.set_backend(F):
        with pytest.raises(ValueError, match="workers"):
            sfft.rfft(x, workers=0)  # declined: SciPy's own backend serves it, with SciPy's own error


# -- the protocol's entry points, called as uarray calls them ------------------------------------------------------


def test_ua_convert_passes_an_ndarray_as_it_is():
    x = np.ones(4)
    for coerce in (False, True):
        (got,) = F.__ua_convert__((uarray.Dispatchable(x, np.ndarray),), coerce)
        assert got is x
    got = F.__ua_convert__((uarray.Dispatchable(x, np.ndarray), uarray.Dispatchable(3, int)), False)
    assert got[0] is x and got[1] == 3  # a dispatchable of another type passes as it is


def test_ua_convert_declines_what_is_no_array_unless_coerced():
    values = [1.0, 2.0]
    lone = (uarray.Dispatchable(values, np.ndarray),)
    assert F.__ua_convert__(lone, False) is NotImplemented
    (got,) = F.__ua_convert__(lone, True)
    assert type(got) is np.ndarray and got.tolist() == values
    assert F.__ua_convert__((uarray.Dispatchable(values, np.ndarray, coercible=False),), True) is NotImplemented
    pair = (uarray.Dispatchable(np.ones(2), np.ndarray), uarray.Dispatchable(values, np.ndarray))
    assert F.__ua_convert__(pair, False) is NotImplemented  # one that is no array declines the call


def test_ua_convert_passes_subclasses_and_other_frameworks_arrays_as_they_are():
    masked = np.ma.masked_array([1.0, 2.0])
    (got,) = F.__ua_convert__((uarray.Dispatchable(masked, np.ndarray),), False)
    assert got is masked
    if torch is not None:
        t = torch.ones(3)
        (got,) = F.__ua_convert__((uarray.Dispatchable(t, np.ndarray),), False)
        assert got is t


def test_ua_function_serves_its_transforms_and_declines_the_rest():
    x = make((16,), "float64", seed=2)
    np.testing.assert_allclose(F.__ua_function__(sfft.rfft, (x,), {}), np.fft.rfft(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        F.__ua_function__(sfft.fft2, (x.reshape(4, 4),), {}), np.fft.fft2(x.reshape(4, 4)), rtol=1e-12, atol=1e-12
    )
    assert F.__ua_function__(sfft.dct, (x,), {}) is NotImplemented  # not an nvdispatch transform
    assert F.__ua_function__(object(), (x,), {}) is NotImplemented  # no name at all
    assert F.__ua_function__(sfft.rfft, (x.astype(np.complex128),), {}) is NotImplemented  # a dtype it refuses
    assert F.__ua_function__(sfft.rfft, (x,), {"bogus": 1}) is NotImplemented  # SciPy reports the argument


def test_ua_function_remembers_a_bounded_number_of_callables():
    x = np.ones(4)
    for _ in range(600):
        assert F.__ua_function__(lambda: None, (x,), {}) is NotImplemented
    assert len(_scipy_backend._rows) <= 256
