"""Property tests: every fft-extension function against numpy.fft (complex128) on the CPU executors,
over dtypes x shapes x axes x n/s x norm, with contiguous and strided inputs."""

from __future__ import annotations

import numpy as np
import pytest
from fft_reference import DTYPES, N_D, ONE_D, assert_close, expected_dtype, make, reference, to_numpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nvdispatch
import nvdispatch.fft as F

EXECUTORS = ["numpy"]
try:
    import torch

    EXECUTORS.append("torch")
except ImportError:  # pragma: no cover
    torch = None

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def cases(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim)))
    dtype = draw(st.sampled_from(DTYPES))
    norm = draw(st.sampled_from(["backward", "ortho", "forward"]))
    strided = draw(st.booleans())
    if draw(st.booleans()):
        func = draw(st.sampled_from(ONE_D))
        axis = draw(st.integers(-ndim, ndim - 1))
        n = draw(st.one_of(st.none(), st.integers(1, 12)))
        kw = {"n": n, "axis": axis, "norm": norm}
    else:
        func = draw(st.sampled_from(N_D))
        axes = draw(st.one_of(st.none(), st.permutations(range(ndim)).flatmap(lambda p: st.just(p[: max(1, len(p))]))))
        if axes is not None:
            k = draw(st.integers(1, ndim))
            axes = tuple(axes[:k])
            if draw(st.booleans()):
                axes = tuple(a - ndim for a in axes)
        s = None
        if axes is not None and draw(st.booleans()):
            s = tuple(draw(st.sampled_from([-1, 1, 2, 3, 5, 8, 10])) for _ in axes)
        kw = {"s": s, "axes": axes, "norm": norm}
    if func in ("rfft", "rfftn", "ihfft"):
        dtype = {"complex64": "float32", "complex128": "float64"}.get(dtype, dtype)
    # c2r default output length 2*(m-1) must be positive
    if func in ("irfft", "hfft") and kw["n"] is None and shape[kw["axis"]] < 2:
        kw["n"] = 4
    if func == "irfftn":
        last = (kw["axes"] or tuple(range(ndim)))[-1]
        if shape[last] < 2 and (kw["s"] is None or kw["s"][-1] == -1):
            if kw["axes"] is None:
                kw["axes"] = tuple(range(ndim))
            kw["s"] = (*(kw["s"] or (-1,) * len(kw["axes"]))[:-1], 4)
    return func, shape, dtype, kw, strided


def _operand(shape, dtype, strided, seed):
    if not strided:
        return make(shape, dtype, seed)
    big = make(tuple(2 * d for d in shape), dtype, seed)
    return big[tuple(slice(None, None, 2) for _ in shape)]  # non-contiguous view


@pytest.mark.parametrize("executor", EXECUTORS)
@SETTINGS
@given(case=cases(), seed=st.integers(0, 2**16))
def test_against_numpy_fft(executor, case, seed):
    func, shape, dtype, kw, strided = case
    x = _operand(shape, dtype, strided, seed)
    ref_kw = dict(kw)
    if ref_kw.get("s") is not None:
        # -1 keeps the input extent; for irfftn's last axis the array API (and Torch) read it as the default
        # output 2*(m-1), numpy.fft as the output length m (nvdispatch follows NumPy on NumPy input)
        sizes = [x.shape[a] if v == -1 else v for a, v in zip(ref_kw["axes"], ref_kw["s"])]
        if func == "irfftn" and ref_kw["s"][-1] == -1 and executor != "numpy":
            sizes[-1] = 2 * (x.shape[ref_kw["axes"][-1]] - 1)
        ref_kw["s"] = tuple(sizes)
    ref = reference(func, x, **ref_kw)
    before = x.copy()
    arg = x if executor == "numpy" else torch.from_numpy(x)
    got = getattr(F, func)(arg, **kw)
    assert type(got).__module__.split(".")[0] == ("numpy" if executor == "numpy" else "torch")
    got = to_numpy(got)
    assert got.dtype == expected_dtype(func, dtype)
    assert_close(got, ref, dtype)
    np.testing.assert_array_equal(x, before)  # input never mutated


@pytest.mark.parametrize("executor", EXECUTORS)
@settings(max_examples=30, deadline=None)
@given(
    shape=st.lists(st.integers(1, 8), min_size=1, max_size=3).map(tuple),
    dtype=st.sampled_from(["float32", "float64"]),
    norm=st.sampled_from(["backward", "ortho", "forward"]),
)
def test_round_trips(executor, shape, dtype, norm):
    x = make(shape, dtype)
    xx = x if executor == "numpy" else torch.from_numpy(x)
    n = shape[-1]
    back = to_numpy(F.irfft(F.rfft(xx, norm=norm), n=n, norm=norm))
    assert_close(back, x.astype(np.float64), dtype)
    c = make(shape, {"float32": "complex64", "float64": "complex128"}[dtype])
    cc = c if executor == "numpy" else torch.from_numpy(c)
    assert_close(to_numpy(F.ifft(F.fft(cc, norm=norm), norm=norm)), c.astype(np.complex128), dtype)
    assert_close(to_numpy(F.ifftn(F.fftn(cc, norm=norm), norm=norm)), c.astype(np.complex128), dtype)
    axes = tuple(range(len(shape)))
    s = tuple(shape)
    back = to_numpy(F.irfftn(F.rfftn(xx, norm=norm), s=s, axes=axes, norm=norm))
    assert_close(back, x.astype(np.float64), dtype)


def test_executor_used():
    x = make((4, 8), "complex64")
    assert nvdispatch.explain(F.fft, x).executor == "numpy"
    if torch is not None:
        assert nvdispatch.explain(F.fftn, torch.from_numpy(x), axes=(0,)).executor == "torch"
