"""The NumPy executor's row-panel engine (``numpy_matmul_panels``), forced with explicit panel sizes and thread
counts, against float64 NumPy expressions written here; and the calibration choosing it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from engine_checks import assert_calibration_chooses

import nvdispatch
from nvdispatch.executors import blas_threads, numpy_matmul_engines
from nvdispatch.executors.numpy_matmul_panels import PanelPlan, panel_byte_choices

TOL = {"float32": 1e-5, "float64": 1e-12}


def _ints(shape, dtype, seed, order="C"):
    x = np.random.default_rng(seed).integers(-3, 4, shape).astype(dtype)
    return np.asfortranarray(x) if order == "F" else x


def _want(a, b, c=None, alpha=1.0, beta=1.0, bias=None, act=None):
    """act(alpha a@b + beta c + bias) in float64; RELU keeps NaN, GELU is the tanh form."""
    d = alpha * (a.astype(np.float64) @ b.astype(np.float64))
    if c is not None:
        d = d + beta * c.astype(np.float64)
    if bias is not None:
        d = d + bias.astype(np.float64)
    if act == "relu":
        d = np.where((d > 0) | np.isnan(d), d, 0.0)
    elif act == "gelu":
        d = 0.5 * d * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (d + 0.044715 * d**3)))
    return d


def _plan(a, b, c=None, *, epilog=None, bias=None, alpha=1.0, beta=None, rows=16, threads=2):
    inputs = {"bias": bias} if bias is not None else None
    problem = nvdispatch.explain(a, b, c, epilog=epilog, epilog_inputs=inputs, alpha=alpha, beta=beta).problem
    assert "panels" in numpy_matmul_engines.applicable(problem)
    itemsize = np.dtype(problem.result_dtype).itemsize
    plan = PanelPlan(problem, {"panel_bytes": rows * problem.n * itemsize, "threads": threads})
    operands = {"a": a, "b": b, "alpha": alpha, "beta": beta, "c": c}
    if bias is not None:
        operands["bias"] = bias
    return plan, operands


def _check(got, want, dtype, scale=1.0):
    tol = TOL[dtype] * scale
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.max(np.abs(want), initial=0))))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "epilog, act", [("RELU_BIAS", "relu"), ("GELU_BIAS", "gelu"), ("BIAS", None), ("RELU", "relu"), (None, None)]
)
@pytest.mark.parametrize("m, k, n", [(37, 6, 9), (1, 5, 4), (3, 8, 2), (64, 33, 17), (100, 16, 70)])
def test_panels_match_float64(m, k, n, epilog, act, dtype, threads):
    a, b = _ints((m, k), dtype, 1), _ints((k, n), dtype, 2)
    bias = _ints((n,), dtype, 3) if epilog and "BIAS" in epilog else None
    plan, ops = _plan(a, b, epilog=epilog, bias=bias, alpha=0.5, threads=threads)
    before = (a.copy(), b.copy(), None if bias is None else bias.copy())
    got = plan.execute(ops)
    assert got.dtype == np.dtype(dtype) and got.shape == (m, n)
    _check(got, _want(a, b, alpha=0.5, bias=bias, act=act), dtype, scale=4 if act == "gelu" else 1)
    np.testing.assert_array_equal(a, before[0])
    np.testing.assert_array_equal(b, before[1])
    if bias is not None:
        np.testing.assert_array_equal(bias, before[2])


@pytest.mark.parametrize("rows", [16, 20, 1000])
@pytest.mark.parametrize("a_order, b_order", [("C", "C"), ("F", "C"), ("C", "F"), ("F", "F")])
def test_panels_alpha_beta_c_and_layouts(a_order, b_order, rows):
    a, b = _ints((53, 12), "float64", 4, a_order), _ints((12, 21), "float64", 5, b_order)
    c, bias = _ints((53, 21), "float64", 6, a_order), _ints((21,), "float64", 7)
    plan, ops = _plan(a, b, c, epilog="RELU_BIAS", bias=bias, alpha=-1.5, beta=0.25, rows=rows)
    got = plan.execute(ops)
    _check(got, _want(a, b, c, alpha=-1.5, beta=0.25, bias=bias, act="relu"), "float64")
    np.testing.assert_array_equal(c, _ints((53, 21), "float64", 6, a_order))  # c is not written


def test_panels_take_strided_read_only_and_broadcast_c():
    a = _ints((80, 30), "float32", 8)[::2, ::3]  # (40, 10), neither C- nor F-contiguous
    b = _ints((10, 13), "float32", 9)
    b.flags.writeable = False
    c = _ints((13,), "float32", 10)  # broadcast along the rows
    plan, ops = _plan(a, b, c, epilog="GELU", alpha=2.0, beta=-1.0, rows=16)
    _check(plan.execute(ops), _want(a, b, np.broadcast_to(c, (40, 13)), 2.0, -1.0, act="gelu"), "float32", 4)


def test_panels_direct_call_and_nan_through_relu():
    a = _ints((40, 4), "float32", 11)
    a[3, 1] = np.nan
    b, bias = _ints((4, 6), "float32", 12), _ints((6,), "float32", 13)
    plan, _ = _plan(a, b, epilog="RELU_BIAS", bias=bias, rows=16)
    got = plan.direct(a, b, bias)  # the hot path the route takes for act(a @ b + bias)
    want = _want(a, b, bias=bias, act="relu")
    assert np.isnan(got[3]).all() and np.isnan(want[3]).all()
    _check(got, want, "float32")


def test_panels_batch_of_one_and_vector():
    bias = _ints((5,), "float64", 14)
    a, b = _ints((1, 30, 4), "float64", 15), _ints((4, 5), "float64", 16)
    plan, ops = _plan(a, b, epilog="RELU_BIAS", bias=bias, rows=16)
    got = plan.execute(ops)
    assert got.shape == (1, 30, 5)
    _check(got[0], _want(a[0], b, bias=bias, act="relu"), "float64")
    v = _ints((4,), "float64", 17)
    plan, ops = _plan(v, b, epilog="RELU_BIAS", bias=bias)
    got = plan.execute(ops)
    assert got.shape == (5,)
    _check(got, _want(v[None], b, bias=bias, act="relu")[0], "float64")


def test_panel_threads_restore_the_blas_thread_count():
    a, b = _ints((200, 8), "float32", 18), _ints((8, 16), "float32", 19)
    plan, ops = _plan(a, b, epilog="RELU", rows=16, threads=2)
    blas = blas_threads._numpy_openblas()
    before = blas[1]() if blas else None
    plan.execute(ops)
    assert (blas[1]() if blas else None) == before


def test_panel_sizes_come_from_the_cache_and_autotune_keeps_one():
    choices = panel_byte_choices()
    assert choices[-1] == 0 and all(c > 0 for c in choices[:-1])
    a, b, bias = _ints((300, 8), "float32", 20), _ints((8, 40), "float32", 21), _ints((40,), "float32", 22)
    plan, ops = _plan(a, b, epilog="RELU_BIAS", bias=bias)
    timings = plan.autotune(ops, iterations=1)
    assert len(timings) >= 2 and all(t > 0 for t in timings.values())
    assert plan.tuning()["threads"] >= 1 and any("engine 'panels'" in s for s in plan.steps)
    _check(plan.execute(ops), _want(a, b, bias=bias, act="relu"), "float32")


def test_calibration_can_choose_panels(monkeypatch):
    """With every other engine made slower, the calibration ranks the panels first and the route runs them
    (strategy ``inplace``, engine ``panels`` in explain), the hot path included."""
    a, b, bias = _ints((70, 9), "float32", 23), _ints((9, 11), "float32", 24), _ints((11,), "float32", 25)
    want = _want(a, b, bias=bias, act="relu")
    assert_calibration_chooses(monkeypatch, "panels", a, b, bias, lambda got: _check(got, want, "float32"))


def test_panels_are_dealt_in_runs_and_a_finished_thread_helps_the_longest():
    from nvdispatch.executors.numpy_matmul_panels import _Shares

    shares = _Shares(10, 3)  # runs 0-3, 4-7, 8-9
    assert [shares.take(2), shares.take(2)] == [8, 9]
    assert shares.take(2) == 3  # its own run done: from the back of the longest left (0-3)
    assert [shares.take(0), shares.take(1)] == [0, 4]
    taken = [shares.take(t) for t in (0, 0, 1, 1, 1, 2)]
    assert taken[-1] is None
    assert sorted([8, 9, 3, 0, 4, *[i for i in taken if i is not None]]) == list(range(10))
    assert _Shares(3, 8).take(7) in (0, 1, 2)  # more threads than panels: each still finds one


@pytest.mark.parametrize("a_order, b_order", [("C", "C"), ("F", "C"), ("C", "F"), ("F", "F")])
@pytest.mark.parametrize("threads", [1, 2])
def test_compiled_panels_and_the_python_ones_agree(a_order, b_order, threads):
    """Where NumPy's BLAS can be called from C (``numpy_matmul_engines.gemm_kernel``), each panel is one compiled
    call (gemm into the zeroed rows, then the sweep); without it, np.matmul and the sweep per panel. Both against
    the oracle, on every layout, with a bias of another dtype (the Python panels then) too."""
    a, b = _ints((75, 12), "float32", 20, a_order), _ints((12, 19), "float32", 21, b_order)
    bias = _ints((19,), "float32", 22)
    want = _want(a, b, alpha=-2.0, bias=bias, act="relu")
    plan, ops = _plan(a, b, epilog="RELU_BIAS", bias=bias, alpha=-2.0, rows=16, threads=threads)
    if plan.panel_gemm is not None:
        assert "NumPy's BLAS gemm from C" in plan.steps[0]
    _check(plan.execute(ops), want, "float32")
    _check(plan.direct(a, b, bias.astype(np.float64)), _want(a, b, bias=bias, act="relu"), "float32")
    plan.panel_gemm = None
    assert "np.matmul(a[rows]" in plan.steps[0]
    _check(plan.execute(ops), want, "float32")
