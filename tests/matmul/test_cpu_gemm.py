"""The NumPy executor's ``gemm`` engine (NumPy's own BLAS gemm called from C with beta=1 into a zeroed result, then
the bias and the activation in one compiled sweep, ``_hotpath_epilog.c``) against the independent float64 oracle:
every real and complex dtype, operand layout, epilog it takes, alpha/beta/c; the compiled call alone (panels,
padded results, complex biases); the fallbacks (layouts BLAS cannot read, unaligned data, a bias of another
dtype); how NumPy's BLAS is found (``numpy_blas``); the engine's absence without it; explain and the DEBUG log."""

from __future__ import annotations

import ctypes
import logging
from functools import partial

import numpy as np
import pytest
from engine_checks import assert_route_runs_without, data, engine_plan, no_fallback
from matmul_reference import assert_close, assert_engine_matches_oracle, expected

import nvdispatch
from nvdispatch import Epilog
from nvdispatch.executors import numpy_blas, numpy_matmul, numpy_matmul_calibration, numpy_matmul_engines
from nvdispatch.executors.numpy_matmul_engines import applicable, available, gemm_kernel

GEMM = gemm_kernel("float32")
needs_gemm = pytest.mark.skipif(GEMM is None, reason="no compiled extension, or NumPy's BLAS is not an OpenBLAS")
REAL = [Epilog.BIAS, Epilog.RELU_BIAS, Epilog.GELU_BIAS, Epilog.RELU, Epilog.GELU, Epilog.DEFAULT]


_data = data
_plan = partial(engine_plan, "gemm")
_no_fallback = partial(no_fallback, engine="gemm")


@needs_gemm
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("epilog", REAL, ids=lambda e: e.name)
@pytest.mark.parametrize(
    "m, k, n, a_order, b_order",
    [(37, 6, 9, "C", "C"), (130, 40, 70, "F", "C"), (64, 33, 17, "C", "F"), (5, 3, 1, "F", "F"), (1, 8, 5, "C", "C")],
)
def test_gemm_matches_oracle(dtype, epilog, m, k, n, a_order, b_order):
    def plan(a, b, **kw):
        return _no_fallback(_plan(a, b, **kw))

    scale = 4 if "GELU" in epilog.name else 1
    got = assert_engine_matches_oracle(plan, _data, dtype, epilog, m, k, n, a_order, b_order, scale=scale)
    assert got.flags.c_contiguous


@needs_gemm
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("epilog", [Epilog.BIAS, Epilog.DEFAULT], ids=lambda e: e.name)
@pytest.mark.parametrize("a_order, b_order", [("C", "C"), ("F", "C"), ("C", "F")])
def test_gemm_complex_matches_oracle(dtype, epilog, a_order, b_order):
    m, k, n = 45, 12, 19
    a, b = _data((m, k), dtype, 5, a_order), _data((k, n), dtype, 6, b_order)
    alpha = 0.5 - 1.5j
    ops = {"a": a, "b": b, "alpha": alpha, "beta": None}
    kw = {"epilog": epilog, "alpha": alpha}
    inputs = c = beta = None
    if epilog is Epilog.BIAS:
        inputs = {"bias": _data((n,), dtype, 7)}
        kw["epilog_inputs"] = inputs
        ops.update(inputs)
    else:
        c, beta = _data((m, n), dtype, 8), 2.0 + 0.5j
        kw.update(c=c, beta=beta)
        ops.update(c=c, beta=beta)
    plan = _no_fallback(_plan(a, b, **kw))
    want, _ = expected(a, b, c, alpha, beta, epilog, inputs)
    got = plan.execute(ops)
    assert got.dtype == np.dtype(dtype)
    assert_close(got, want, dtype)
    assert_close(nvdispatch.matmul(a, b, **kw), want, dtype)  # and whichever engine the route takes


@needs_gemm
def test_gemm_keeps_nan_and_signs_as_the_sweep():
    a = np.array([[np.nan, 1.0], [1.0, 1.0], [-np.inf, 0.0], [-1.0, 0.0]], np.float32)
    b = np.eye(2, dtype=np.float32)
    bias = np.array([0.0, -5.0], np.float32)
    with np.errstate(invalid="ignore"):
        got = _no_fallback(_plan(a, b, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias})).direct(a, b, bias)
        want = np.maximum(a.astype(np.float64) @ b + bias, 0).astype(np.float32)
    np.testing.assert_array_equal(got, want)


@needs_gemm
def test_gemm_falls_back_where_blas_cannot_read_the_arrays():
    dtype = "float32"
    a_big, b = _data((40, 20), dtype, 9), _data((10, 7), dtype, 10)
    bias = _data((7,), dtype, 11)
    a = a_big[::2, ::2]  # strided: BLAS would need a copy
    plan = _plan(np.ascontiguousarray(a), b, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias})
    want, _ = expected(a, b, None, 1, None, Epilog.RELU_BIAS, {"bias": bias})
    assert_close(plan.direct(a, b, bias), want, dtype)
    # unaligned data (np.matmul does not hand it to BLAS either)
    raw = np.zeros(a.size * 4 + 1, np.uint8)[1:].view(np.float32).reshape(a.shape)
    raw[...] = a
    assert not raw.flags.aligned
    assert_close(plan.direct(raw, b, bias), want, dtype)
    # a bias of another dtype, a strided one: added by the ufuncs (RELU after it, not before)
    assert_close(plan.direct(np.ascontiguousarray(a), b, bias.astype(np.float64)), want, dtype)
    strided = np.repeat(bias, 2)[::2]
    assert_close(plan.direct(np.ascontiguousarray(a), b, strided), want, dtype)


@needs_gemm
def test_gemm_batch_of_one_and_read_only_operands():
    a, b, bias = _data((1, 30, 8), "float64", 12), _data((8, 11), "float64", 13), _data((11,), "float64", 14)
    a.flags.writeable = False
    b.flags.writeable = False
    kw = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
    plan = _no_fallback(_plan(a, b, **kw))
    want, _ = expected(a, b, None, 1, None, Epilog.RELU_BIAS, {"bias": bias})
    got = plan.execute({"a": a, "b": b, "bias": bias, "alpha": 1, "beta": None})
    assert got.shape == (1, 30, 11)
    assert_close(got, want, "float64")


# -- the compiled call alone -------------------------------------------------------------------------------------
def _call(dtype, a, b, out, bias, relu, panel, alpha=1.0, beta=1.0, trans_a=False, trans_b=False, ldo=None):
    kernel, address, ilp64, kind = gemm_kernel(dtype)
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    n = b.shape[0] if trans_b else b.shape[1]
    kernel(address, ilp64, kind, trans_a, trans_b, m, n, k, alpha, a.ctypes.data, a.shape[1], b.ctypes.data,
           b.shape[1], beta, out.ctypes.data, ldo or out.shape[1], None if bias is None else bias.ctypes.data, relu,
           panel)  # fmt: skip


@needs_gemm
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize("panel", [1, 7, 64, 1000])
@pytest.mark.parametrize("with_bias", [True, False])
def test_kernel_in_panels_on_a_padded_result(dtype, panel, with_bias):
    """Panels of any height (the last one short), into a result wider than its columns (ld > n: the padding
    untouched), beta = 1 onto the values there."""
    m, k, n, ld = 61, 9, 13, 16
    a, b = _data((m, k), dtype, 15), _data((k, n), dtype, 16)
    full = _data((m, ld), dtype, 17)
    before = full.copy()
    bias = _data((n,), dtype, 18) if with_bias else None
    relu = np.dtype(dtype).kind == "f"
    _call(dtype, a, b, full, bias, relu, panel, alpha=0.5, beta=1.0, ldo=ld)
    want = 0.5 * (a.astype(np.complex128) @ b) + before[:, :n]
    if with_bias:
        want = want + bias
    if relu:
        want = np.maximum(want.real, 0)
    assert_close(full[:, :n], want, dtype)
    np.testing.assert_array_equal(full[:, n:], before[:, n:])


@needs_gemm
def test_kernel_transposed_operands():
    dtype = "float64"
    a, b = _data((17, 6), dtype, 19), _data((6, 23), dtype, 20)
    out = np.zeros((17, 23))
    # a.T and b.T stored C-contiguous, read transposed
    _call(dtype, np.ascontiguousarray(a.T), np.ascontiguousarray(b.T), out, None, False, 5, trans_a=True,
          trans_b=True)  # fmt: skip
    np.testing.assert_allclose(out, a @ b, rtol=1e-12)


@needs_gemm
def test_kernel_rejects_bad_arguments():
    kernel, address, ilp64, kind = GEMM
    x = np.zeros((4, 4), np.float32)
    p = x.ctypes.data
    with pytest.raises(TypeError):
        kernel(address, ilp64, kind)
    good = [address, ilp64, kind, False, False, 4, 4, 4, 1.0, p, 4, p, 4, 0.0, p, 4, None, True, 4]
    for at, bad in ((0, 0), (2, 7), (5, 0), (15, 3), (18, 0)):  # no gemm, kind, m, ldo < n, panel
        args = list(good)
        args[at] = bad
        with pytest.raises(ValueError):
            kernel(*args)
    args = list(good)
    args[2], args[17] = 2, True  # RELU of a complex result
    with pytest.raises(ValueError):
        kernel(*args)
    if not ilp64:
        args = list(good)
        args[5] = 1 << 40
        with pytest.raises(OverflowError):
            kernel(*args)


# -- finding NumPy's BLAS, and going without -----------------------------------------------------------------------
def test_numpy_blas_is_numpy_s_own_library():
    lib = numpy_blas.library()
    if lib is None:
        pytest.skip("NumPy's BLAS is not an OpenBLAS here")
    assert "numpy" in lib._name or "scipy.libs" not in lib._name  # NumPy's copy where it bundles one
    for dtype in numpy_blas.GEMM_KINDS:
        found = numpy_blas.gemm(dtype)
        assert found is None or (isinstance(found[0], int) and found[0] and isinstance(found[1], bool))
    assert numpy_blas.gemm("float16") is None


def test_only_a_library_already_loaded_is_taken_by_name(tmp_path):
    missing = str(tmp_path / "libopenblas_not_here.so")
    assert numpy_blas._first_openblas([missing], loaded_only=True) is None
    assert numpy_blas._first_openblas([missing], loaded_only=False) is None
    lib = numpy_blas.library()
    if lib is not None:  # NumPy's, loaded: found again without loading anything
        again = numpy_blas._first_openblas([lib._name], loaded_only=True)
        assert again is not None and again._name == lib._name


def test_ilp64_from_the_configuration_string():
    class Config:
        def __init__(self, text):
            self.restype = None
            self.text = text

        def __call__(self):
            return self.text

    class Lib:
        pass

    lib = Lib()
    assert numpy_blas._ilp64_by_config(lib) is None  # no configuration: width unknown, no gemm offered
    lib.openblas_get_config = Config(b"OpenBLAS 0.3.31 USE64BITINT DYNAMIC_ARCH")
    assert numpy_blas._ilp64_by_config(lib) is True
    lib.openblas_get_config = Config(b"OpenBLAS 0.3.31 DYNAMIC_ARCH")
    assert numpy_blas._ilp64_by_config(lib) is False
    assert ctypes.c_char_p  # (what the real function's restype is set to)


def test_no_gemm_engine_without_the_blas_or_the_extension(monkeypatch):
    monkeypatch.setattr(numpy_matmul_engines, "gemm_kernel", lambda dtype: None)
    assert "gemm" not in available()
    assert_route_runs_without("gemm", 21)


@needs_gemm
def test_gemm_named_by_explain_and_logged(caplog):
    a, b, bias = _data((64, 16), "float32", 24), _data((16, 48), "float32", 25), _data((48,), "float32", 26)
    kw = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
    problem = nvdispatch.explain(a, b, **kw).problem
    steps = numpy_matmul.engine_plan(problem, "gemm").steps
    assert "engine 'gemm'" in steps[0] and "NumPy's own BLAS" in steps[0]
    assert all("compiled sweep" in s for s in steps[1:])
    numpy_matmul_calibration.clear()
    nvdispatch.plan_cache.clear()
    try:
        with caplog.at_level(logging.DEBUG, logger="nvdispatch"):
            numpy_matmul.plan(problem, "inplace")
    finally:
        numpy_matmul_calibration.clear()
        nvdispatch.plan_cache.clear()
    assert any("numpy matmul plan 64x48x16 float32: strategy inplace, engine" in r.message for r in caplog.records)


def test_default_order_puts_gemm_first_only_past_the_cache():
    a, b, bias = _data((8, 4), "float32", 27), _data((4, 8), "float32", 28), _data((8,), "float32", 29)
    problem = nvdispatch.explain(a, b, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias}).problem
    order = numpy_matmul_calibration.default_order(("gemm", "sweep", "ufunc"), problem)
    assert order[0] == "ufunc"  # in cache: the ufuncs' smaller cost per call
    assert numpy_matmul_calibration.default_order(("sweep", "ufunc", "gemm"))[0] == "gemm"


def test_gelu_and_complex_activations_are_not_swept():
    a, b, bias = _data((9, 4), "float32", 30), _data((4, 6), "float32", 31), _data((6,), "float32", 32)
    problem = nvdispatch.explain(a, b, epilog=Epilog.GELU_BIAS, epilog_inputs={"bias": bias}).problem
    if "gemm" in applicable(problem):  # GELU after the compiled call, by the ufuncs
        assert any("gelu (in place over the whole result)" in s for s in numpy_matmul.engine_plan(problem, "gemm").steps)
    ac, bc = _data((9, 4), "complex64", 33), _data((4, 6), "complex64", 34)
    complex_engines = applicable(nvdispatch.explain(ac, bc, epilog=Epilog.BIAS, epilog_inputs={"bias": ac[0, :1].repeat(6)}).problem)
    assert set(complex_engines) <= {"gemm", "ufunc"}
