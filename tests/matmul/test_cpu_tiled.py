"""The NumPy executor's ``tiled`` engine (nvdispatch's own blocked GEMM applying the epilog per register tile,
``_hotpath_tiled.c``) against the independent float64 oracle: float32 and float64, both layouts of each operand,
shapes that are no multiple of any tile (1x1, primes, k = 1, long k, few rows and many columns), with and
without bias and RELU, NaN through RELU; every kernel this processor runs (AVX-512, AVX2 + FMA, the portable
one) on one and on several threads, results of any alignment; the fallbacks (beta * c, strided or unaligned
operands, a bias of another dtype, GELU), inputs never modified; explain, the DEBUG log, and the engine's
absence without the extension."""

from __future__ import annotations

import logging
from functools import partial

import numpy as np
import pytest
from engine_checks import assert_calibration_chooses, assert_route_runs_without, data, engine_plan, no_fallback
from matmul_reference import assert_close, assert_engine_matches_oracle, expected

import nvdispatch
from nvdispatch import Epilog
from nvdispatch.executors import numpy_blas, numpy_matmul, numpy_matmul_calibration, numpy_matmul_engines
from nvdispatch.executors.numpy_matmul_engines import applicable, available, tiled_isa, tiled_kernel

TILED = tiled_kernel()
needs_tiled = pytest.mark.skipif(TILED is None, reason="no compiled extension")
ISAS = () if TILED is None else nvdispatch._hotpath.tiled_isas()
LINEAR = [Epilog.BIAS, Epilog.RELU_BIAS, Epilog.RELU, Epilog.DEFAULT]
#: the engine's threads: its own, and NumPy's OpenBLAS workers where that BLAS has a pool
BLAS_POOL = numpy_blas.pool()
POOLS = pytest.mark.parametrize("pool", [None, BLAS_POOL] if BLAS_POOL else [None], ids=["own", "blas"][: 1 + bool(BLAS_POOL)])


_data = data
_plan = partial(engine_plan, "tiled")
_no_fallback = partial(no_fallback, engine="tiled")


def _oracle(a, b, bias, relu, alpha=1.0):
    want = alpha * (a.astype(np.float64) @ b.astype(np.float64))
    if bias is not None:
        want = want + bias
    return np.maximum(want, 0) if relu else want


@needs_tiled
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("epilog", LINEAR, ids=lambda e: e.name)
@pytest.mark.parametrize(
    "m, k, n, a_order, b_order",
    [(37, 61, 53, "C", "C"), (130, 40, 70, "F", "C"), (64, 33, 17, "C", "F"), (5, 3, 1, "F", "F"), (1, 8, 5, "C", "C")],
)
def test_tiled_matches_oracle(dtype, epilog, m, k, n, a_order, b_order):
    def plan(a, b, **kw):
        made = _plan(a, b, **kw)
        return made if epilog is Epilog.DEFAULT else _no_fallback(made)  # (beta * c: the ufuncs)

    got = assert_engine_matches_oracle(plan, _data, dtype, epilog, m, k, n, a_order, b_order)
    assert got.flags.c_contiguous


@needs_tiled
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "m, k, n",
    [(1, 1, 1), (37, 53, 61), (14, 1, 32), (15, 300, 33), (2, 700, 3), (3, 5, 517), (29, 17, 16), (100, 64, 100)],
)
@pytest.mark.parametrize("threads", [1, 3])
@POOLS
def test_each_kernel_matches_oracle(isa, dtype, m, k, n, threads, pool):
    """Every kernel this processor runs, each layout, with and without bias and RELU, on one and several threads
    (few rows: the columns are shared out instead), into a result whose rows start anywhere on a cache line."""
    kind = 0 if dtype == "float32" else 1
    for seed, (a_order, b_order, with_bias, relu) in enumerate(
        [("C", "C", True, True), ("F", "C", False, True), ("C", "F", True, False), ("F", "F", False, False)]
    ):
        a, b = _data((m, k), dtype, seed, a_order), _data((k, n), dtype, seed + 10, b_order)
        bias = _data((n,), dtype, seed + 20) if with_bias else None
        before = [x.copy() for x in (a, b) + ((bias,) if with_bias else ())]
        for offset in (0, 1, 3):  # the result `offset` elements into its buffer, the buffer's padding kept
            ld = n + (16 if n > 40 else 0)
            buf = np.full(m * ld + offset + 8, 7.0, dtype)
            out = buf[offset : offset + m * ld].reshape(m, ld)
            TILED(kind, isa, a_order == "F", b_order == "F", m, n, k, 0.75, a.ctypes.data,
                  m if a_order == "F" else k, b.ctypes.data, k if b_order == "F" else n, out.ctypes.data, ld,
                  None if bias is None else bias.ctypes.data, relu, threads, 4096, pool)  # fmt: skip
            assert_close(out[:, :n], _oracle(a, b, bias, relu, 0.75), dtype)
            assert (out[:, n:] == 7).all() and (buf[:offset] == 7).all() and (buf[offset + m * ld :] == 7).all()
        for x, was in zip((a, b) + ((bias,) if with_bias else ()), before):
            np.testing.assert_array_equal(x, was)


@needs_tiled
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_relu_keeps_nan_as_np_maximum(isa, dtype):
    a = np.array([[np.nan, 1.0], [1.0, 1.0], [-np.inf, 0.0], [-1.0, 0.0], [np.inf, 0.0]], dtype)
    b = np.eye(2, dtype=dtype)
    bias = np.array([0.0, -5.0], dtype)
    out = np.empty((5, 2), dtype)
    TILED(dtype == "float64", isa, False, False, 5, 2, 2, 1.0, a.ctypes.data, 2, b.ctypes.data, 2, out.ctypes.data,
          2, bias.ctypes.data, True, 1, 0, None)  # fmt: skip
    with np.errstate(invalid="ignore"):
        want = np.maximum(a.astype(np.float64) @ b + bias, 0).astype(dtype)
    np.testing.assert_array_equal(out, want)
    assert np.isnan(out[0, 0]) and np.isnan(out[2, 1])  # NaN, and -inf * 0 = NaN: kept


@needs_tiled
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m, k, n, threads", [(20, 300, 1000, 3), (300, 200, 300, 4), (1, 2000, 2100, 8)])
@POOLS
def test_threads_share_the_tiles(isa, m, k, n, threads, pool):
    """Work enough for several threads (few strips of rows and many panels: the panels are grouped finer so every
    thread has tiles; more threads than cores), each layout of ``a``, float32 and float64."""
    for dtype, a_order in (("float32", "C"), ("float64", "F")):
        kind = 0 if dtype == "float32" else 1
        a, b, bias = _data((m, k), dtype, 60, a_order), _data((k, n), dtype, 61), _data((n,), dtype, 62)
        out = np.empty((m, n), dtype)
        TILED(kind, isa, a_order == "F", False, m, n, k, 1.0, a.ctypes.data, m if a_order == "F" else k,
              b.ctypes.data, n, out.ctypes.data, n, bias.ctypes.data, True, threads, 1 << 16, pool)  # fmt: skip
        assert_close(out, _oracle(a, b, bias, True), dtype, scale=4)


@needs_tiled
def test_callers_on_several_python_threads_at_once():
    """Several Python threads calling the engine at the same moment (as Dask's threaded scheduler does), each call
    starting threads of its own: every result is its own product, none mixed with another call's."""
    from concurrent.futures import ThreadPoolExecutor

    def one(seed):
        a, b = _data((300, 200), "float32", seed), _data((200, 300), "float32", seed + 1)  # work for several threads
        bias = _data((300,), "float32", seed + 2)
        plan = _no_fallback(_plan(a, b, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias}))
        got = [plan.execute({"a": a, "b": b, "bias": bias}) for _ in range(5)]
        return got, _oracle(a, b, bias, True)

    with ThreadPoolExecutor(4) as pool:
        for got, want in pool.map(one, range(100, 140, 5)):
            for out in got:
                assert_close(out, want, "float32")


@needs_tiled
@pytest.mark.skipif(BLAS_POOL is None, reason="NumPy's BLAS has no thread pool")
def test_pool_follows_the_blas_thread_limit_and_concurrent_callers():
    """On NumPy's OpenBLAS workers, as many as that BLAS runs now: with its threads limited to one (as
    threadpoolctl or OPENBLAS_NUM_THREADS does) and restored, called alone and from several Python threads at
    once beside NumPy's own threaded products (each call queues its shares on the same workers), every result is
    its own product."""
    from concurrent.futures import ThreadPoolExecutor

    lib = numpy_blas.library()
    get = next(getattr(lib, name) for name in numpy_blas._THREAD_COUNTS if hasattr(lib, name))
    set_ = next(getattr(lib, name) for name in numpy_blas._MARKERS if hasattr(lib, name))
    before = get()

    def one(seed):
        a, b, bias = _data((200, 150), "float32", seed), _data((150, 260), "float32", seed + 1), None
        bias = _data((260,), "float32", seed + 2)
        out = np.empty((200, 260), np.float32)
        TILED(0, None, False, False, 200, 260, 150, 1.0, a.ctypes.data, 150, b.ctypes.data, 260, out.ctypes.data,
              260, bias.ctypes.data, True, 4, 1 << 14, BLAS_POOL)  # fmt: skip
        return out, _oracle(a, b, bias, True)

    try:
        for limit in (1, max(2, before)):
            set_(limit)
            got, want = one(limit)
            assert_close(got, want, "float32")
            with ThreadPoolExecutor(4) as pool:
                products = [pool.submit(np.matmul, x, x) for x in [_data((300, 300), "float64", 7)] * 4]
                for got, want in pool.map(one, range(300, 340, 5)):  # beside NumPy's own products on the pool
                    assert_close(got, want, "float32")
                for product in products:
                    assert_close(product.result(), _oracle(*[_data((300, 300), "float64", 7)] * 2, None, False),
                                 "float64")  # fmt: skip
    finally:
        set_(before)
    assert get() == before


@needs_tiled
def test_long_k_and_many_panels_per_block():
    """k past any cache block (each panel group one panel), and many groups of panels per strip."""
    a, b, bias = _data((45, 3000), "float32", 30), _data((3000, 70), "float32", 31), _data((70,), "float32", 32)
    for block in (0, 1 << 30):
        out = np.empty((45, 70), np.float32)
        TILED(0, None, False, False, 45, 70, 3000, 1.0, a.ctypes.data, 3000, b.ctypes.data, 70, out.ctypes.data, 70,
              bias.ctypes.data, True, 2, block, BLAS_POOL)  # fmt: skip
        assert_close(out, _oracle(a, b, bias, True), "float32", scale=4)


@needs_tiled
def test_tiled_falls_back_where_it_cannot_read_the_arrays():
    dtype = "float32"
    a_big, b = _data((40, 20), dtype, 33), _data((10, 7), dtype, 34)
    bias = _data((7,), dtype, 35)
    a = a_big[::2, ::2]  # strided
    plan = _plan(np.ascontiguousarray(a), b, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias})
    want, _ = expected(a, b, None, 1, None, Epilog.RELU_BIAS, {"bias": bias})
    assert_close(plan.direct(a, b, bias), want, dtype)
    raw = np.zeros(a.size * 4 + 1, np.uint8)[1:].view(np.float32).reshape(a.shape)  # unaligned
    raw[...] = a
    assert not raw.flags.aligned
    assert_close(plan.direct(raw, b, bias), want, dtype)
    # a bias of another dtype: added by the ufuncs (RELU after it); a strided one is read as a contiguous copy
    assert_close(plan.direct(np.ascontiguousarray(a), b, bias.astype(np.float64)), want, dtype)
    strided = np.repeat(bias, 2)[::2]
    assert_close(_no_fallback(plan).direct(np.ascontiguousarray(a), b, strided), want, dtype)


@needs_tiled
def test_batch_of_one_and_read_only_operands():
    a, b, bias = _data((1, 30, 8), "float64", 36), _data((8, 11), "float64", 37), _data((11,), "float64", 38)
    a.flags.writeable = False
    b.flags.writeable = False
    kw = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
    plan = _no_fallback(_plan(a, b, **kw))
    want, _ = expected(a, b, None, 1, None, Epilog.RELU_BIAS, {"bias": bias})
    got = plan.execute({"a": a, "b": b, "bias": bias, "alpha": 1, "beta": None})
    assert got.shape == (1, 30, 11)
    assert_close(got, want, "float64")


@needs_tiled
def test_route_takes_the_tiled_engine_when_preferred():
    """Through the route, the engine named by an autotuning-style preference: the same values."""
    a, b, bias = _data((50, 20), "float32", 39), _data((20, 30), "float32", 40), _data((30,), "float32", 41)
    kw = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
    want, _ = expected(a, b, None, 1, None, Epilog.RELU_BIAS, {"bias": bias})
    plan = _no_fallback(_plan(a, b, **kw))
    assert_close(plan.direct(a, b, bias), want, "float32")
    assert_close(nvdispatch.matmul(a, b, **kw), want, "float32")  # whichever engine the route takes


def test_tiled_engine_only_for_real_2d_linear_layers_it_applies():
    a, b, bias = _data((9, 4), "float32", 42), _data((4, 6), "float32", 43), _data((6,), "float32", 44)
    gelu = nvdispatch.explain(a, b, epilog=Epilog.GELU_BIAS, epilog_inputs={"bias": bias}).problem
    assert "tiled" not in applicable(gelu)  # GELU: not applied per tile
    batched = nvdispatch.explain(np.stack([a, a]), b, epilog=Epilog.RELU).problem
    assert "tiled" not in applicable(batched)
    ac, bc = a.astype(np.complex64), b.astype(np.complex64)
    assert "tiled" not in applicable(nvdispatch.explain(ac, bc).problem)
    relu = nvdispatch.explain(a, b, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias}).problem
    assert ("tiled" in applicable(relu)) == (TILED is not None)


def test_no_tiled_engine_without_the_extension(monkeypatch):
    monkeypatch.setattr(numpy_matmul_engines, "tiled_kernel", lambda: None)
    assert "tiled" not in available()
    assert_route_runs_without("tiled", 45)


@needs_tiled
def test_kernel_rejects_bad_arguments():
    x = np.zeros((4, 4), np.float32)
    p = x.ctypes.data
    with pytest.raises(TypeError):
        TILED(0, None, False)
    good = [0, None, False, False, 4, 4, 4, 1.0, p, 4, p, 4, p, 4, None, True, 2, 0, None]
    TILED(*good)
    for bad_pool, error in (((0, 0), ValueError), ((1,), TypeError), ("pool", TypeError)):
        with pytest.raises(error, match="pool"):
            TILED(*good[:-1], bad_pool)
    with pytest.raises(TypeError):
        TILED(*good[:-1], (1, "x"))
    # kind, isa, m, k, lda < k, ldo < n, threads, block_bytes, no address
    for at, bad in ((0, 2), (1, "sse9"), (4, 0), (6, 0), (9, 3), (13, 3), (16, 0), (17, -1), (8, 0)):
        args = list(good)
        args[at] = bad
        with pytest.raises(ValueError):
            TILED(*args)
    assert set(ISAS) <= {"avx512", "avx2", "portable"} and ISAS[-1] == "portable" and ISAS[0] == tiled_isa()


@needs_tiled
def test_tiled_named_by_explain_and_logged(caplog):
    a, b, bias = _data((64, 16), "float32", 48), _data((16, 48), "float32", 49), _data((48,), "float32", 50)
    kw = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
    problem = nvdispatch.explain(a, b, **kw).problem
    plan = numpy_matmul.engine_plan(problem, "tiled")
    steps = plan.steps
    assert "engine 'tiled'" in steps[0] and "blocked GEMM" in steps[0] and tiled_isa() in steps[0]
    assert ("NumPy's OpenBLAS workers" if BLAS_POOL else "its own") in steps[0]
    assert all("on each tile of the product in registers" in s for s in steps[1:])
    assert plan.own_threads == (1 if BLAS_POOL else numpy_matmul_engines.CPUS)
    numpy_matmul_calibration.clear()
    nvdispatch.plan_cache.clear()
    try:
        with caplog.at_level(logging.DEBUG, logger="nvdispatch"):
            numpy_matmul.plan(problem, "inplace")
    finally:
        numpy_matmul_calibration.clear()
        nvdispatch.plan_cache.clear()
    assert any("numpy matmul plan 64x48x16 float32: strategy inplace, engine" in r.message for r in caplog.records)


@needs_tiled
def test_calibration_can_choose_tiled(monkeypatch):
    """With every other engine made slower, the calibration ranks ``tiled`` first and the route runs it (strategy
    ``inplace``, engine ``tiled`` in explain), the hot path included."""
    a, b, bias = _data((70, 9), "float32", 51), _data((9, 11), "float32", 52), _data((11,), "float32", 53)
    want, _ = expected(a, b, None, 1, None, Epilog.RELU_BIAS, {"bias": bias})
    assert_calibration_chooses(monkeypatch, "tiled", a, b, bias, lambda got: assert_close(got, want, "float32"))
