"""The NumPy executor's ``sweep`` engine (the product, then the bias and the activation in one compiled sweep,
``_hotpath_epilog.c``) against the independent float64 oracle: the engine's plan called both ways (``execute``
and the route's direct call), the compiled kernel on its own, and the engine's absence without the extension."""

from __future__ import annotations

import numpy as np
import pytest
from matmul_reference import assert_close, assert_engine_matches_oracle, expected

import nvdispatch
from nvdispatch import Epilog
from nvdispatch._compiled import hotpath
from nvdispatch.executors import numpy_matmul, numpy_matmul_calibration
from nvdispatch.executors.numpy_matmul_engines import applicable, available

KERNEL = getattr(hotpath(), "bias_activation", None)
needs_kernel = pytest.mark.skipif(KERNEL is None, reason="the compiled extension is not built here")
SWEPT = [Epilog.BIAS, Epilog.RELU_BIAS, Epilog.RELU, Epilog.DEFAULT]


def _data(shape, dtype, seed, order="C"):
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return np.asfortranarray(x) if order == "F" else x


def _plan(a, b, **kw):
    problem = nvdispatch.explain(a, b, **kw).problem
    assert "sweep" in applicable(problem)
    return numpy_matmul.engine_plan(problem, "sweep")


@needs_kernel
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("epilog", SWEPT, ids=lambda e: e.name)
@pytest.mark.parametrize(
    "m, k, n, a_order, b_order", [(37, 6, 9, "C", "C"), (130, 40, 70, "F", "C"), (5, 3, 1, "F", "F")]
)
def test_sweep_matches_oracle(dtype, epilog, m, k, n, a_order, b_order):
    assert_engine_matches_oracle(_plan, _data, dtype, epilog, m, k, n, a_order, b_order)


@needs_kernel
def test_sweep_through_the_route_and_explain():
    a, b, bias = _data((64, 16), "float32", 5), _data((16, 48), "float32", 6), _data((48,), "float32", 7)
    kw = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
    numpy_matmul_calibration.clear()
    nvdispatch.plan_cache.clear()
    try:
        got = nvdispatch.matmul(a, b, **kw, preferences={"strategy": "inplace"})
        info = nvdispatch.explain(a, b, **kw, preferences={"strategy": "inplace"})
    finally:
        numpy_matmul_calibration.clear()
        nvdispatch.plan_cache.clear()
    want, _ = expected(a, b, None, 1, None, Epilog.RELU_BIAS, {"bias": bias})
    assert_close(got, want, "float32")
    if info.problem and numpy_matmul.engine_order(info.problem)[0] == "sweep":
        assert any("engine 'sweep'" in s for s in info.steps)


@needs_kernel
def test_sweep_batched_and_odd_biases():
    a, b = _data((3, 20, 8), "float64", 8), _data((3, 8, 12), "float64", 9)
    bias = _data((12,), "float64", 10)
    want, _ = expected(a, b, None, 1, None, Epilog.RELU_BIAS, {"bias": bias})
    plan = _plan(a, b, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias})
    assert_close(plan.execute({"a": a, "b": b, "bias": bias, "alpha": 1, "beta": None}), want, "float64")
    # a strided bias (copied for the sweep, the caller's left as it is) and one of another dtype (ufuncs instead)
    a2, b2 = a[0], b[0]
    strided = np.repeat(bias, 2)[::2]
    want2, _ = expected(a2, b2, None, 1, None, Epilog.RELU_BIAS, {"bias": bias})
    plan2 = _plan(a2, b2, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": strided})
    assert_close(plan2.direct(a2, b2, strided), want2, "float64")
    assert_close(plan2.direct(a2, b2, bias.astype(np.float32)), want2, "float32")


@needs_kernel
def test_sweep_keeps_nan_as_every_strategy_does():
    a = np.array([[np.nan, 1.0], [1.0, 1.0], [-np.inf, 0.0]], np.float32)
    b = np.eye(2, dtype=np.float32)
    bias = np.array([0.0, -5.0], np.float32)
    with np.errstate(invalid="ignore"):
        got = _plan(a, b, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias}).direct(a, b, bias)
        want = np.maximum(a.astype(np.float64) @ b + bias, 0).astype(np.float32)
    assert np.isnan(want).sum() == 3
    np.testing.assert_array_equal(got, want)


@needs_kernel
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("relu", [True, False])
def test_kernel_alone_on_a_padded_matrix(dtype, with_bias, relu):
    rows, cols, ld = 7, 13, 16
    full = _data((rows, ld), dtype, 11)
    full[2, 3] = np.nan
    bias = _data((cols,), dtype, 12)
    want = full.astype(np.float64)
    if with_bias:
        want[:, :cols] += bias
    if relu:
        want[:, :cols] = np.where(want[:, :cols] < 0, 0, want[:, :cols])
    want[:, cols:] = full[:, cols:]  # beyond cols: untouched
    address = full.__array_interface__["data"][0]
    KERNEL(
        address, bias.__array_interface__["data"][0] if with_bias else None, rows, cols, ld, dtype == "float64", relu
    )
    np.testing.assert_allclose(full, want.astype(dtype), rtol=1e-6, equal_nan=True)


@needs_kernel
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cols", [1, 15, 16, 17, 63, 64, 65, 257])
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_kernel_vector_body_matches_numpy(dtype, cols, offset):
    """Rows as wide as the widest vector build (the sweep is also built for AVX2 and AVX-512, chosen at load time)
    and wider, starting off vector alignment, with NaN, infinities and signed zeros scattered through: the
    vector body and its remainder agree with NumPy's add and maximum element for element."""
    rows, ld = 5, cols + offset + 3
    rng = np.random.default_rng(cols * 7 + offset)
    buffer = rng.standard_normal(rows * ld + offset).astype(dtype)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], dtype)
    where = rng.choice(buffer.size, size=max(1, buffer.size // 9), replace=False)
    buffer[where] = specials[np.arange(where.size) % specials.size]
    full = buffer[offset:].reshape(rows, ld)  # (starts ``offset`` elements past the allocation's alignment)
    bias = rng.standard_normal(cols).astype(dtype)
    bias[::11] = -np.inf
    before = full.copy()
    with np.errstate(invalid="ignore"):
        want = np.maximum(full[:, :cols] + bias, 0)  # np.maximum keeps NaN, as the sweep must
    KERNEL(full.__array_interface__["data"][0], bias.__array_interface__["data"][0], rows, cols, ld, dtype == "float64", True)
    np.testing.assert_array_equal(full[:, :cols], want)
    np.testing.assert_array_equal(full[:, cols:], before[:, cols:])  # beyond cols: untouched


@needs_kernel
def test_kernel_rejects_bad_arguments():
    with pytest.raises(TypeError):
        KERNEL(0, None, 1, 1)
    with pytest.raises(ValueError):
        KERNEL(0, None, 1, 1, 1, False, True)  # no address
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError):
        KERNEL(x.__array_interface__["data"][0], None, 2, 4, 3, False, True)  # ld < cols


def test_no_sweep_without_the_extension(monkeypatch):
    monkeypatch.setenv("NVDISPATCH_PURE_PYTHON", "1")
    assert "sweep" not in available()
    a, b, bias = _data((9, 4), "float32", 13), _data((4, 6), "float32", 14), _data((6,), "float32", 15)
    numpy_matmul_calibration.clear()
    nvdispatch.plan_cache.clear()
    try:
        kw = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
        got = nvdispatch.matmul(a, b, **kw)
        assert "sweep" not in numpy_matmul.engine_order(nvdispatch.explain(a, b, **kw).problem)
    finally:
        numpy_matmul_calibration.clear()
        nvdispatch.plan_cache.clear()
    want, _ = expected(a, b, None, 1, None, Epilog.RELU_BIAS, {"bias": bias})
    assert_close(got, want, "float32")


def test_gelu_is_not_swept():
    a, b, bias = _data((9, 4), "float32", 16), _data((4, 6), "float32", 17), _data((6,), "float32", 18)
    problem = nvdispatch.explain(a, b, epilog=Epilog.GELU_BIAS, epilog_inputs={"bias": bias}).problem
    assert "sweep" not in applicable(problem)
