"""nvdispatch.fft as a drop-in for numpy.fft on NumPy input, the array-API signatures kept, SciPy's backend
protocol; references are numpy.fft itself (the library being replaced)."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest

import nvdispatch.fft as F
from nvdispatch.errors import ShapeMismatchError, UnsupportedDtypeError, UnsupportedOperandError
from nvdispatch.fft import _route

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

RNG = np.random.default_rng(7)
X = RNG.standard_normal((6, 8)) + 1j * RNG.standard_normal((6, 8))
XR = RNG.standard_normal((6, 8))


@pytest.mark.parametrize(
    "func, args, kwargs",
    [
        ("fft", (XR.tolist(), 5, 0), {}),  # a list, n and axis positional
        ("ifft", (X, 10), {"norm": "ortho"}),
        ("rfft", (XR, None, 0, "forward"), {}),
        ("irfft", (X, 7), {"axis": 0}),
        ("hfft", (X[0],), {}),
        ("ihfft", (XR, 6), {}),
        ("fftn", (X, (3, 5), (1, 0)), {}),
        ("rfft2", (XR,), {"s": (4, 6)}),
        ("irfft2", (X,), {}),
        ("ifft2", (X, None, (0, 1), None), {}),
        ("rfftn", (np.ones((2, 3)),), {"axes": (0, 0, 1), "s": (10, 20, 40)}),  # repeated axis, NumPy's way
        ("fftn", (X,), {"axes": (1, 1)}),
        ("irfftn", (X,), {"axes": (0, 1, 0)}),
        ("irfftn", (X,), {"s": (-1, -1), "axes": (0, 1)}),  # NumPy: -1 on the last axis is its input length
        ("fft", (np.arange(5, dtype=np.int16),), {}),
        ("rfft", (np.array([True, False, True]),), {}),
        ("irfft", (np.arange(10, dtype=np.uint8),), {"n": 1}),
        ("fft", (XR.astype(np.float16),), {}),
        ("irfft", (X.astype(np.complex64)[:, :3].real.astype(np.float16),), {}),  # float16 real output
        ("fft", (X.astype(np.clongdouble),), {}),
        ("irfftn", (X.astype(np.clongdouble),), {"axes": (0, 1)}),
        ("rfft", (XR.astype(np.longdouble), 9), {}),
        ("fft", ([3.0],), {}),
    ],
)
def test_matches_numpy_fft_dtype_included(func, args, kwargs):
    ref = getattr(np.fft, func)(*args, **kwargs)
    got = getattr(F, func)(*args, **kwargs)
    assert type(got) is np.ndarray
    assert got.dtype == ref.dtype and got.shape == ref.shape
    tol = {2: 1e-2, 4: 1e-5, 8: 1e-5}.get(np.finfo(ref.dtype).bits // 8, 1e-12)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_s_without_axes_and_none_in_s_warn_like_numpy():
    with pytest.warns(DeprecationWarning, match="axes"):
        got = F.fftn(X, s=(-1, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        np.testing.assert_allclose(got, np.fft.fftn(X, s=(-1, 5)), atol=1e-12)
    with pytest.warns(DeprecationWarning, match="None"):
        got = F.irfftn(X, s=(None, 4), axes=(0, 1))
    np.testing.assert_allclose(got, np.fft.irfftn(X, s=(6, 4), axes=(0, 1)), atol=1e-12)


def test_out_in_place_and_partial():
    y = X.copy()
    expected = np.fft.fft(y, axis=0)
    assert F.fft(y, axis=0, out=y) is y  # fully in place
    np.testing.assert_allclose(y, expected, atol=1e-12)
    y = X.copy()
    out = y[:, :5]  # part of the input, the rest untouched
    assert F.fft(y, 5, 1, out=out) is out
    np.testing.assert_allclose(out, np.fft.fft(X, 5, 1), atol=1e-12)
    np.testing.assert_array_equal(y[:, 5:], X[:, 5:])
    out32 = np.zeros((6, 8), np.complex64)  # same_kind casting, as numpy's out= allows
    F.fftn(X, out=out32)
    np.testing.assert_allclose(out32, np.fft.fftn(X), rtol=1e-5, atol=1e-4)
    real_out = np.zeros((6, 14))
    assert F.irfft(X, axis=1, out=real_out) is real_out
    np.testing.assert_allclose(real_out, np.fft.irfft(X, axis=1), atol=1e-12)


@pytest.mark.parametrize(
    "call, err, fragment",
    [
        (lambda: F.fft(XR, out=np.zeros((6, 8))), UnsupportedDtypeError, "Cannot cast"),
        (lambda: F.fftn(X, s=(3, 3), axes=(0, 1), out=np.zeros_like(X)), ShapeMismatchError, "wrong shape"),
        (lambda: F.fft(XR, out=""), TypeError, "ArrayType"),
        (lambda: F.ifft([]), ValueError, "Invalid number of FFT data points"),
    ],
)
def test_out_and_empty_errors_are_typed_with_numpys_words(call, err, fragment):
    before = X.copy()
    with pytest.raises(err, match=fragment):
        call()
    np.testing.assert_array_equal(X, before)


# out= is checked before any transform runs, with numpy.fft's exception types and in its order: the number of
# dimensions and the length along the (last) transformed axis (ValueError, "has wrong shape"), then the dtype
# (TypeError, same_kind), then the other dimensions (ValueError). (numpy.fft's hfft, ifft2 and irfft2 ignore
# out= and its n-D functions use out for intermediate steps too; nvdispatch honours out= everywhere.)
X3 = RNG.standard_normal((4, 5, 6)) + 1j * RNG.standard_normal((4, 5, 6))
_OUT_CALLS = {  # name -> (input, kwargs); the result has shape (4, 5, 3) or (4, 5, 4), never (4, 5, 6)
    "fft": (X3, {"n": 3}),
    "ifft": (X3, {"n": 3}),
    "rfft": (X3.real, {}),
    "irfft": (X3, {"n": 4}),
    "hfft": (X3, {"n": 4}),
    "ihfft": (X3.real, {}),
    "fftn": (X3, {"s": (3,), "axes": (2,)}),
    "ifftn": (X3, {"s": (3,), "axes": (2,)}),
    "rfftn": (X3.real, {"axes": (1, 2)}),
    "irfftn": (X3, {"s": (5, 4), "axes": (1, 2)}),
    "fft2": (X3, {"s": (5, 3)}),
    "ifft2": (X3, {"s": (5, 3)}),
    "rfft2": (X3.real, {}),
    "irfft2": (X3, {"s": (5, 4)}),
}
_HONOURED_BY_NUMPY = sorted(set(_OUT_CALLS) - {"hfft", "ifft2", "irfft2"})


def _bad_outs(name):
    x, kw = _OUT_CALLS[name]
    good = getattr(np.fft, name)(x, **kw)
    wrong_kind = np.float64 if good.dtype.kind == "c" else np.int64
    shape = good.shape
    return {
        "one dimension too few": (np.zeros(shape[1:], good.dtype), ValueError, "wrong shape"),
        "transformed axis too long": (np.zeros(shape[:-1] + (6,), good.dtype), ValueError, "wrong shape"),
        "dtype it cannot cast to": (np.zeros(shape, wrong_kind), TypeError, "Cannot cast"),
        "dtype and a batch axis wrong": (np.zeros((7,) + shape[1:], wrong_kind), TypeError, "Cannot cast"),
        "a batch axis wrong": (np.zeros((7,) + shape[1:], good.dtype), ValueError, "wrong shape"),
        "no array": ([0.0] * 6, TypeError, "ArrayType"),
    }


@pytest.mark.parametrize("name", sorted(_OUT_CALLS))
@pytest.mark.parametrize("case", list(_bad_outs("fft")))
def test_a_bad_out_is_refused_before_any_transform_numpys_way(monkeypatch, name, case):
    x, kw = _OUT_CALLS[name]
    out, err, words = _bad_outs(name)[case]
    if name in _HONOURED_BY_NUMPY and case != "no array":  # the same exception type as numpy.fft's
        with pytest.raises(err):
            getattr(np.fft, name)(x, out=np.array(out, copy=True), **kw)
    ran = []
    monkeypatch.setattr(_route, "_run", lambda *a, **k: ran.append(a))
    with pytest.raises(err, match=words) as info:
        getattr(F, name)(x, out=out, **kw)
    assert info.value.argument == "out" and not ran


@pytest.mark.parametrize("name", sorted(_OUT_CALLS))
def test_a_right_out_receives_the_result(name):
    x, kw = _OUT_CALLS[name]
    want = getattr(np.fft, name)(x, **kw)
    out = np.zeros(want.shape, np.complex64 if want.dtype.kind == "c" else np.float32)  # same_kind
    assert getattr(F, name)(x, out=out, **kw) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fft", ["fftn", "ifftn", "rfftn"])
def test_fftn_out_and_s_interaction(fft):
    """NumPy's own test (test_pocketfft.py), plus: the check comes before the transform."""
    x = X3.real if fft == "rfftn" else X3
    with pytest.raises(ValueError, match="has wrong shape"):
        getattr(F, fft)(x, out=np.zeros_like(x), s=(3, 3, 3), axes=(0, 1, 2))
    s = (4, 5, 5)
    expected = getattr(np.fft, fft)(x, s=s, axes=(0, 1, 2))
    out = np.zeros_like(expected)
    assert getattr(F, fft)(x, s=s, axes=(0, 1, 2), out=out) is out
    np.testing.assert_allclose(out, expected, atol=1e-12)


def test_a_wrong_out_shape_is_reported_before_the_inputs_dtype():
    """numpy.fft compares out's shape along the transformed axis first: rfftn of complex input with such an
    out is a ValueError, with a right one the input's TypeError."""
    with pytest.raises(ShapeMismatchError):
        F.rfftn(X3, out=np.zeros_like(X3), s=(3, 3, 3), axes=(0, 1, 2))
    with pytest.raises(UnsupportedDtypeError) as info:
        F.rfftn(X3, out=np.zeros((3, 3, 2), complex), s=(3, 3, 3), axes=(0, 1, 2))
    assert info.value.argument == "x"


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_a_bad_torch_out_is_refused_before_any_transform(monkeypatch):
    t = torch.from_numpy(X3)
    ran = []
    monkeypatch.setattr(_route, "_run", lambda *a, **k: ran.append(a))
    with pytest.raises(ShapeMismatchError):
        F.fftn(t, s=(3, 3), axes=(1, 2), out=torch.zeros(4, 5, 6, dtype=torch.complex128))
    with pytest.raises(UnsupportedDtypeError):
        F.fft(t, out=torch.zeros(4, 5, 6, dtype=torch.float64))
    with pytest.raises(UnsupportedOperandError):
        F.fft(t, out=np.zeros((4, 5, 6), complex))
    assert not ran


# The array API (2024.12) signatures, as its test suite's test_signatures.py checks them: parameters before
# the stub's "*" keep their position (and name unless positional-only); keyword-only ones may be keyword
# or positional-or-keyword.
_STUBS = {
    "fft": "(x, /, *, n=None, axis=-1, norm='backward')",
    "ifft": "(x, /, *, n=None, axis=-1, norm='backward')",
    "rfft": "(x, /, *, n=None, axis=-1, norm='backward')",
    "irfft": "(x, /, *, n=None, axis=-1, norm='backward')",
    "hfft": "(x, /, *, n=None, axis=-1, norm='backward')",
    "ihfft": "(x, /, *, n=None, axis=-1, norm='backward')",
    "fftn": "(x, /, *, s=None, axes=None, norm='backward')",
    "ifftn": "(x, /, *, s=None, axes=None, norm='backward')",
    "rfftn": "(x, /, *, s=None, axes=None, norm='backward')",
    "irfftn": "(x, /, *, s=None, axes=None, norm='backward')",
    "fftfreq": "(n, /, *, d=1.0, dtype=None, device=None)",
    "rfftfreq": "(n, /, *, d=1.0, dtype=None, device=None)",
    "fftshift": "(x, /, *, axes=None)",
    "ifftshift": "(x, /, *, axes=None)",
}


@pytest.mark.parametrize("name", sorted(_STUBS))
def test_array_api_signature(name):
    P = inspect.Parameter
    stub_sig = inspect.signature(eval(f"lambda {_STUBS[name][1:-1]}: None"))  # a fixed table above
    sig = inspect.signature(getattr(F, name))
    params = list(sig.parameters.values())
    for i, sp in enumerate(p for p in stub_sig.parameters.values() if p.kind != P.KEYWORD_ONLY):
        assert len(params) > i
        if sp.kind != P.POSITIONAL_ONLY:
            assert params[i].name == sp.name
    for sp in (p for p in stub_sig.parameters.values() if p.kind == P.KEYWORD_ONLY):
        assert sp.name in sig.parameters
        assert sig.parameters[sp.name].kind in (P.KEYWORD_ONLY, P.POSITIONAL_OR_KEYWORD)
    # keyword use as the standard writes it keeps working
    if name in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft"):
        x = XR if name in ("rfft", "ihfft") else X
        got = getattr(F, name)(x, n=6, axis=0, norm="ortho")
        np.testing.assert_allclose(got, getattr(np.fft, name)(x, n=6, axis=0, norm="ortho"), atol=1e-12)


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_torch_integer_input_and_out_behave_torchs_way():
    t = torch.arange(8, dtype=torch.int32)
    got = F.fft(t)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.fft.fft(t).dtype == torch.complex64
    np.testing.assert_allclose(got.numpy(), np.fft.fft(np.arange(8)), rtol=1e-5, atol=1e-4)
    out = torch.zeros(8, dtype=torch.complex64)
    assert F.fft(t.float(), out=out) is out
    np.testing.assert_allclose(out.numpy(), np.fft.fft(np.arange(8)), rtol=1e-5, atol=1e-4)


def test_scipy_backend_serves_long_double_and_declines_what_it_cannot(monkeypatch):
    sfft = pytest.importorskip("scipy.fft")
    calls = []
    real = _route._run

    def spy(func, x, **kw):
        calls.append(func)
        return real(func, x, **kw)

    x = X.astype(np.clongdouble)
    monkeypatch.setattr(_route, "_run", spy)
    with sfft.set_backend(F):
        got = sfft.fft(x, workers=2, overwrite_x=True)
        h = sfft.hfftn(X, s=(4, 6))
        c = sfft.fft(np.arange(4))  # integers promoted as SciPy does
        d = sfft.dct(XR)  # not implemented here: SciPy's own
        with pytest.raises(ValueError):
            sfft.fft(X, 0)  # declined, then SciPy's own error
    monkeypatch.undo()
    assert got.dtype == np.clongdouble
    np.testing.assert_allclose(got, sfft.fft(x), rtol=1e-15, atol=1e-12)
    np.testing.assert_allclose(h, sfft.hfftn(X, s=(4, 6)), atol=1e-10)
    assert c.dtype == np.complex128
    np.testing.assert_allclose(d, sfft.dct(XR))
    assert calls[:3] == ["fft", "irfftn", "fft"]
    with sfft.set_backend(F, only=True):
        with pytest.raises(Exception, match="[Nn]o.*backend|NotImplemented|could not"):
            sfft.fft(X, plan=object())  # a precomputed plan is SciPy's own: declined
