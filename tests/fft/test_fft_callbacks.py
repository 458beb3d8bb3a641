"""FFT prolog/epilog callbacks on the CPU executors (NumPy, Torch) against float64 NumPy references."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import fft as nfft
from nvdispatch.errors import CallbackError, InvalidArgumentError, MixedOperandsError

RNG = np.random.default_rng(12)


def _complex(shape, dtype=np.complex64):
    return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dtype)


def _real(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# The callbacks, written once (plans are keyed by the functions' identity).
def scale_by_filter(v, i, h):
    return v * h[i % h.shape[0]]


def ramp(v, i):
    return v * (1.0 + 0.001 * i)


def conj_epilog(v, i):
    return v.conj()


def add_two(v, i, a, b):
    return v + a[i % a.shape[0]] * b[i % b.shape[0]]


def _idx(shape):
    return np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)


def _padded(x, axes, lengths, dtype):
    out = np.zeros([lengths[axes.index(a)] if a in axes else e for a, e in enumerate(x.shape)], dtype)
    src = tuple(slice(0, min(e, out.shape[a])) for a, e in enumerate(x.shape))
    out[src] = x[src]
    return out


def _reference(func, x, kw, prolog=None, pdata=(), epilog=None, edata=()):
    """float64 reference: pad/trim, prolog on the whole array, numpy.fft, epilog on the whole result."""
    real_in = func in ("rfft", "rfftn", "ihfft")
    x64 = x.astype(np.float64 if real_in else np.complex128)
    nd = "axes" in kw
    axes = tuple(a % x.ndim for a in (kw.get("axes") if nd else (kw.get("axis", -1),)))
    lengths = list(kw.get("s") or [None] * len(axes)) if nd else [kw.get("n")]
    for k, a in enumerate(axes):
        if lengths[k] is None:
            m = x.shape[a]
            lengths[k] = 2 * (m - 1) if func in ("irfft", "irfftn", "hfft") and k == len(axes) - 1 else m
    in_lengths = list(lengths)
    if func in ("irfft", "irfftn", "hfft"):
        in_lengths[-1] = lengths[-1] // 2 + 1
    if prolog is not None:
        x64 = _padded(x64, list(axes), in_lengths, x64.dtype)
        x64 = prolog(x64, _idx(x64.shape), *[np.asarray(d, np.result_type(d, np.float64)) for d in pdata])
    y = getattr(np.fft, func)(x64, **kw)
    if epilog is not None:
        y = epilog(y, _idx(y.shape), *[np.asarray(d, np.result_type(d, np.float64)) for d in edata])
    return y


CASES = [
    ("fft", {}, (3, 16)),
    ("ifft", {"norm": "ortho"}, (3, 16)),
    ("fft", {"n": 20, "axis": 0}, (12, 5)),
    ("rfft", {}, (4, 18)),
    ("irfft", {}, (4, 9)),
    ("irfft", {"n": 15}, (2, 9)),
    ("hfft", {}, (3, 7)),
    ("ihfft", {"norm": "forward"}, (3, 10)),
    ("fftn", {"axes": (0, 1)}, (6, 8)),
    ("ifftn", {"axes": (1, 2), "s": (4, 6)}, (2, 5, 5)),
    ("rfftn", {"axes": (0, 1)}, (6, 8)),
    ("irfftn", {"axes": (0, 1)}, (6, 5)),
]


@pytest.mark.parametrize("func,kw,shape", CASES)
@pytest.mark.parametrize("which", ["prolog", "epilog", "both"])
@pytest.mark.parametrize("precision", ["single", "double"])
def test_numpy_matches_reference(func, kw, shape, which, precision):
    real_in = func in ("rfft", "rfftn", "ihfft")
    x = _real(shape) if real_in else _complex(shape)
    if precision == "double":
        x = x.astype(np.float64 if real_in else np.complex128)
    h = _real((7,), np.float64 if precision == "double" else np.float32)
    g = _complex((5,), np.complex128 if precision == "double" else np.complex64)
    prolog = (ramp if real_in else scale_by_filter) if which in ("prolog", "both") else None
    pdata = () if prolog in (None, ramp) else (h,)
    epilog = add_two if which in ("epilog", "both") else None
    edata = (g, h) if epilog is not None else ()
    if func in ("irfft", "irfftn", "hfft") and epilog is not None:
        epilog, edata = scale_by_filter, (h,)  # real output: a real filter keeps it real
    got = getattr(nfft, func)(
        x, **kw, prolog=prolog, prolog_data=pdata or None, epilog=epilog, epilog_data=edata or None
    )
    want = _reference(func, x, kw, prolog, pdata, epilog, edata)
    expected_dtype = getattr(np.fft, func)(x, **kw).dtype if precision == "double" else None
    if precision == "single":
        expected_dtype = np.float32 if func in ("irfft", "irfftn", "hfft") else np.complex64
    assert got.dtype == expected_dtype
    assert got.shape == want.shape
    tol = 2e-4 if precision == "single" else 1e-10
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def test_input_is_not_modified_and_padding_zeros_reach_the_prolog():
    x = _complex((2, 6))
    before = x.copy()
    seen = {}

    def record(v, i):
        seen["shape"], seen["tail"] = v.shape, v[:, 6:].copy()
        return v + 1

    y = nfft.fft(x, n=8, prolog=record)
    np.testing.assert_array_equal(x, before)
    assert seen["shape"] == (2, 8) and np.all(seen["tail"] == 0)
    np.testing.assert_allclose(y, np.fft.fft(np.pad(x.astype(np.complex128), ((0, 0), (0, 2))) + 1), atol=1e-4)


def test_epilog_sees_the_normalised_output():
    x = _complex((16,))
    y = nfft.ifft(x, epilog=lambda v, i: v * 0 + np.abs(v))
    np.testing.assert_allclose(y.real, np.abs(np.fft.ifft(x)), rtol=1e-5, atol=1e-6)


def test_torch_cpu_matches_numpy_and_keeps_autograd():
    torch = pytest.importorskip("torch")
    x = _complex((3, 16))
    h = _real((16,))
    t, th = torch.tensor(x), torch.tensor(h)
    got = nfft.fft(t, epilog=scale_by_filter, epilog_data=(th,))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.complex64
    np.testing.assert_allclose(got.numpy(), np.fft.fft(x.astype(np.complex128)) * h[None, :], rtol=2e-4, atol=2e-4)
    xr = torch.randn(4, 10, dtype=torch.float64, requires_grad=True)
    y = nfft.rfft(xr, prolog=ramp)
    y.abs().sum().backward()
    assert xr.grad is not None and xr.grad.shape == xr.shape


def test_stateful_fft_with_callbacks_both_directions():
    x = _complex((4, 8))
    h = _real((8,))
    with nfft.FFT(x, axes=(1,)) as f:
        f.plan(epilog=scale_by_filter, epilog_data=(h,))
        fwd = f.execute()
        inv = f.execute(direction="inverse")
        f.reset_operand(np.asfortranarray(x))  # new strides: planned again with the same callbacks
        again = f.execute()
    np.testing.assert_allclose(fwd, np.fft.fft(x.astype(np.complex128), axis=1) * h, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(inv, np.fft.ifft(x.astype(np.complex128), axis=1) * h, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(again, fwd, rtol=1e-5, atol=1e-5)


def test_plan_key_is_function_identity_and_data_layout_not_values():
    x = _complex((2, 8))
    nvdispatch.plan_cache.clear()
    nfft.fft(x, epilog=scale_by_filter, epilog_data=(_real((8,)),))
    first = len(nvdispatch.plan_cache)
    nfft.fft(x, epilog=scale_by_filter, epilog_data=(_real((8,)),))  # other values, same layout
    assert len(nvdispatch.plan_cache) == first
    nfft.fft(x, epilog=scale_by_filter, epilog_data=(_real((8,), np.float64),))  # other dtype
    nfft.fft(x, epilog=ramp)  # other function
    assert len(nvdispatch.plan_cache) == first + 2


def test_explain_says_vectorised_and_names_the_callbacks():
    e = nvdispatch.explain(nfft.rfft, _real((4, 8)), prolog=ramp, epilog=conj_epilog)
    assert e.executor == "numpy" and e.strategy == "vectorised"
    text = str(e)
    assert "prolog ramp" in text and "epilog conj_epilog" in text


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"prolog": 3}, InvalidArgumentError, "prolog"),
        ({"prolog_data": (np.ones(3),)}, InvalidArgumentError, "prolog_data"),
        ({"epilog": ramp, "epilog_data": (None,)}, InvalidArgumentError, "epilog_data"),
        ({"prolog": lambda v, i: v * 1j}, CallbackError, "real values"),
        ({"epilog": lambda v, i: v[:1]}, CallbackError, "one value per element"),
        ({"epilog": lambda v, i, h: v * h.nope, "epilog_data": (np.ones(2),)}, CallbackError, "AttributeError"),
        ({"prolog": lambda v, i: "text"}, CallbackError, "return an array"),
    ],
)
def test_bad_callbacks_raise_typed_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        nfft.rfft(_real((2, 8)), **kwargs)


def test_data_of_another_framework_is_rejected():
    torch = pytest.importorskip("torch")
    with pytest.raises(MixedOperandsError, match="epilog_data"):
        nfft.fft(_complex((8,)), epilog=scale_by_filter, epilog_data=(torch.ones(8),))


# -- convolve -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "xshape,hshape,kw,real",
    [
        ((4, 16), (16,), {}, False),
        ((4, 16), (4, 16), {}, False),
        ((3, 16), (9,), {}, True),
        ((2, 3, 12), (1, 3, 7), {}, True),
        ((10, 3), (16, 1), {"n": 16, "axis": 0}, False),
        ((5, 20), (16,), {"n": 16}, False),
    ],
)
def test_convolve_matches_fft_multiply_ifft(xshape, hshape, kw, real):
    x = _real(xshape) if real else _complex(xshape)
    h = _complex(hshape)
    got = nfft.convolve(x, h, **kw)
    n, axis = kw.get("n"), kw.get("axis", -1)
    if real:
        m = n or x.shape[axis]
        want = np.fft.irfft(np.fft.rfft(x.astype(np.float64), n=n, axis=axis) * h, n=m, axis=axis)
        assert got.dtype == np.float32
    else:
        want = np.fft.ifft(np.fft.fft(x.astype(np.complex128), n=n, axis=axis) * h, axis=axis)
        assert got.dtype == np.complex64
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


def test_convolve_rejects_a_filter_that_does_not_broadcast():
    from nvdispatch.errors import ShapeMismatchError, UnsupportedDtypeError

    with pytest.raises(ShapeMismatchError, match="h"):
        nfft.convolve(_complex((4, 16)), _complex((15,)))
    with pytest.raises(UnsupportedDtypeError, match="h"):
        nfft.convolve(_complex((4, 16)), np.ones(16, np.int32))


def test_convolve_on_torch_and_explain():
    torch = pytest.importorskip("torch")
    x, h = _complex((3, 8)), _complex((8,))
    got = nfft.convolve(torch.tensor(x), torch.tensor(h))
    np.testing.assert_allclose(got.numpy(), np.fft.ifft(np.fft.fft(x) * h), rtol=2e-4, atol=2e-4)
    e = nvdispatch.explain(nfft.convolve, x, h)
    assert e.executor == "numpy" and "multiply the spectrum by h" in str(e)
