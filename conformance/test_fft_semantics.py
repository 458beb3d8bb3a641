"""Conformance: the array-API fft extension's semantics (2024.12) on every available executor, with
numpy.fft (complex128) as the oracle. GPU executors run where a GPU is present (marked ``gpu``).

Checked per function: result shape (n/s padding and trimming, -1 in s, the halved last axis of rfftn,
irfftn's default ``2*(m-1)``), result dtype (precision kept, real input promoted), the three norms, axes in
any order and negative, and that the input is left unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
import nvdispatch.fft as F


def _to_numpy(y):
    mod = type(y).__module__.split(".")[0]
    if mod == "torch":
        return y.detach().cpu().resolve_conj().numpy()
    if mod == "cupy":
        return y.get()
    return np.asarray(y)


def _targets():
    out = [pytest.param("numpy", np.asarray, id="numpy-cpu")]
    try:
        import torch

        out.append(pytest.param("torch", torch.from_numpy, id="torch-cpu"))
        out.append(pytest.param("torch", lambda a: torch.from_numpy(a).cuda(), id="torch-cuda", marks=pytest.mark.gpu))
        out.append(
            pytest.param("cuda", lambda a: torch.from_numpy(a).cuda(), id="cuda-on-torch", marks=pytest.mark.gpu)
        )
    except ImportError:
        pass
    try:
        import cupy

        out.append(pytest.param("cupy", cupy.asarray, id="cupy", marks=pytest.mark.gpu))
    except ImportError:
        pass
    return out


# (function, input shape, input dtype, keywords, expected result shape)
TABLE = [
    ("fft", (6, 8), "complex64", {}, (6, 8)),
    ("fft", (6, 8), "complex64", {"n": 5, "axis": 0}, (5, 8)),
    ("fft", (6, 8), "complex64", {"n": 12}, (6, 12)),
    ("fft", (6, 8), "float32", {}, (6, 8)),
    ("ifft", (6, 8), "complex128", {"axis": -2, "norm": "ortho"}, (6, 8)),
    ("fftn", (4, 6, 8), "complex64", {}, (4, 6, 8)),
    ("fftn", (4, 6, 8), "complex64", {"axes": (2, 0)}, (4, 6, 8)),
    ("fftn", (4, 6, 8), "complex64", {"s": (3, -1), "axes": (0, 2)}, (3, 6, 8)),
    ("ifftn", (4, 6, 8), "complex128", {"s": (10, 2), "axes": (-1, -3), "norm": "forward"}, (2, 6, 10)),
    ("rfft", (6, 8), "float32", {}, (6, 5)),
    ("rfft", (6, 9), "float64", {"n": 7, "norm": "forward"}, (6, 4)),
    ("irfft", (6, 5), "complex64", {}, (6, 8)),
    ("irfft", (6, 5), "complex64", {"n": 9}, (6, 9)),
    ("rfftn", (4, 6, 8), "float32", {}, (4, 6, 5)),
    ("rfftn", (4, 6, 8), "float64", {"axes": (2, 0)}, (3, 6, 8)),
    ("irfftn", (4, 6, 5), "complex64", {}, (4, 6, 8)),
    ("irfftn", (4, 6, 5), "complex64", {"s": (-1, -1, 7), "axes": (0, 1, 2)}, (4, 6, 7)),
    ("irfftn", (4, 6, 5), "complex128", {"s": (3, 9), "axes": (1, 0), "norm": "ortho"}, (9, 3, 5)),
    ("hfft", (6, 5), "complex64", {}, (6, 8)),
    ("hfft", (6, 5), "complex128", {"n": 9, "axis": 0}, (9, 5)),
    ("ihfft", (6, 8), "float32", {}, (6, 5)),
    ("ihfft", (6, 8), "float64", {"n": 5, "axis": 0, "norm": "ortho"}, (3, 8)),
]


def _oracle(func, x, kw):
    kw = dict(kw)
    if kw.get("s") is not None:
        axes = kw["axes"]
        s = [x.shape[a] if v == -1 else v for a, v in zip(axes, kw["s"])]
        if func == "irfftn" and kw["s"][-1] == -1:
            s[-1] = 2 * (x.shape[axes[-1]] - 1)
        kw["s"] = tuple(s)
    xx = x.astype(np.float64 if func in ("rfft", "rfftn", "ihfft") else np.complex128)
    return getattr(np.fft, func)(xx, **kw)


@pytest.mark.parametrize("executor, to_dev", _targets())
@pytest.mark.parametrize("func, shape, dtype, kw, out_shape", TABLE)
def test_fft_semantics(executor, to_dev, func, shape, dtype, kw, out_shape):
    from nvdispatch.executors import builtin

    if builtin(executor) is None:
        pytest.skip(f"executor {executor!r} is not part of this build")
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape)
    if dtype.startswith("complex"):
        x = x + 1j * rng.standard_normal(shape)
    x = x.astype(dtype)
    xd = to_dev(x.copy())
    with nvdispatch.set_backend(executor):  # the executor under test first; a decline falls to the default
        y = getattr(F, func)(xd, **kw)
    y = _to_numpy(y)
    single = dtype in ("float32", "complex64")
    real_out = func in ("irfft", "irfftn", "hfft")
    want = {(True, True): "float32", (True, False): "complex64", (False, True): "float64"}.get(
        (single, real_out), "complex128"
    )
    assert y.shape == out_shape
    assert y.dtype == np.dtype(want)
    ref = _oracle(func, x, kw)
    tol = 2e-5 if single else 1e-12
    assert np.max(np.abs(y - ref)) <= tol * max(1.0, np.max(np.abs(ref)))
    np.testing.assert_array_equal(_to_numpy(xd), x)


@pytest.mark.parametrize("n, d", [(1, 1.0), (8, 0.1), (9, 2.0)])
def test_freqs_and_shifts(n, d):
    np.testing.assert_allclose(F.fftfreq(n, d=d), np.fft.fftfreq(n, d=d))
    np.testing.assert_allclose(F.rfftfreq(n, d=d), np.fft.rfftfreq(n, d=d))
    x = np.arange(n * 3).reshape(3, n)
    np.testing.assert_array_equal(F.fftshift(x), np.fft.fftshift(x))
    np.testing.assert_array_equal(F.ifftshift(x, axes=(1,)), np.fft.ifftshift(x, axes=(1,)))
