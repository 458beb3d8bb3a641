"""The same answer on every executor and strategy where libraries differ (see ``nvdispatch._epilog``): NaN through
RELU (propagated, as cuBLASLt, Torch and NumPy give natively), alpha and beta*c with a bias (the bias added after them), GELU's tanh form, DRELU with a
non-finite upstream gradient at masked positions (0), and float16/bfloat16 reductions accumulated in float32.

Each case runs on the NumPy and Torch CPU executors here, and the same cases marked ``gpu`` on the Torch CUDA,
``cuda`` and ``cupy`` executors (run on a GPU machine). The expected values are the test tree's oracle."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
from matmul_reference import epilog_reference, gelu, to_numpy

import nvdispatch
from nvdispatch import Epilog

gpu = pytest.mark.gpu

#: (framework, device, backend forced with set_backend(..., only=True) or None); every strategy the executor
#: offers for the call is run (``explain().strategies``), so a strategy added later is held to the same answers
CPU_EXECUTORS = [
    pytest.param(("numpy", "cpu", None), id="numpy"),
    pytest.param(("torch", "cpu", None), id="torch-cpu"),
]
GPU_EXECUTORS = [
    pytest.param(("torch", "cuda", "torch"), id="torch-cuda", marks=gpu),
    pytest.param(("torch", "cuda", "cuda"), id="cuda", marks=gpu),
    pytest.param(("cupy", "cuda", "cupy"), id="cupy", marks=gpu),
]
EXECUTORS = CPU_EXECUTORS + GPU_EXECUTORS


def _to(x: np.ndarray, framework: str, device: str, dtype=None):
    """``x`` as a ``dtype`` array of ``framework`` on ``device``, keeping a Fortran layout."""
    fortran = x.ndim == 2 and x.flags.f_contiguous and not x.flags.c_contiguous
    if framework == "numpy":
        return np.asarray(x, dtype=dtype, order="K")
    if framework == "cupy":
        cupy = pytest.importorskip("cupy")
        return cupy.asarray(np.asarray(x, dtype=dtype, order="K"), order="F" if fortran else "C")
    torch = pytest.importorskip("torch")
    torch_dtype = None if dtype is None else getattr(torch, dtype)
    if fortran:  # a transposed view of a C-ordered tensor
        return torch.from_numpy(np.ascontiguousarray(x.T)).to(device=device, dtype=torch_dtype).T
    return torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=torch_dtype)


def _host(x) -> np.ndarray:
    mod = type(x).__module__.split(".")[0]
    if mod == "cupy":
        return x.get()
    return to_numpy(x)


def _call(executor, a, b, c=None, *, dtype=None, inputs=None, **kwargs):
    """``matmul`` on ``executor`` with NumPy operands converted to its framework, once per strategy it offers:
    ``[(strategy, result on the host, aux)]``."""
    framework, device, backend = executor
    if framework == "numpy" and dtype == "bfloat16":
        pytest.skip("NumPy has no bfloat16")
    conv = lambda x: None if x is None else _to(x, framework, device, None if x.dtype == bool else dtype)  # noqa: E731
    args = (conv(a), conv(b), conv(c))
    inputs = {k: conv(v) for k, v in (inputs or {}).items()} or None
    with contextlib.ExitStack() as stack:
        if backend is not None:
            stack.enter_context(nvdispatch.set_backend(backend, only=True))
        runs = []
        for strategy in nvdispatch.explain(*args, epilog_inputs=inputs, **kwargs).strategies:
            got = nvdispatch.matmul(*args, epilog_inputs=inputs, preferences={"strategy": strategy}, **kwargs)
            out, aux = got if isinstance(got, tuple) else (got, {})
            runs.append((strategy, _host(out), dict(aux)))
    return runs


# -- NaN through RELU ------------------------------------------------------------------------------------------
A_NAN = np.array([[np.nan, 1.0], [1.0, -2.0], [0.0, 0.0], [3.0, 1.0]])
B_NAN = np.array([[1.0, 0.0, -1.0], [0.5, 1.0, 2.0]])
BIAS3 = np.array([0.5, -0.25, 1.0])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("epilog", [Epilog.RELU, Epilog.RELU_BIAS, Epilog.RELU_AUX, Epilog.RELU_AUX_BIAS])
def test_nan_through_relu_propagates(executor, epilog):
    inputs = {"bias": BIAS3} if "BIAS" in epilog.name else None
    d = A_NAN @ B_NAN
    want, want_aux = epilog_reference(epilog.name, d, {"bias": BIAS3} if inputs else {})
    nan = np.isnan(d)
    assert nan[0].all() and not nan[1:].any()
    assert np.isnan(want[nan]).all() and (want[~nan] == 0).any()  # the oracle propagates NaN, clamps the rest
    for strategy, out, aux in _call(executor, A_NAN, B_NAN, dtype="float32", epilog=epilog, inputs=inputs):
        np.testing.assert_array_equal(np.isnan(out), nan, err_msg=f"{strategy}: NaN exactly where d is NaN")
        np.testing.assert_allclose(out[~nan], want[~nan], rtol=1e-6, atol=1e-6, err_msg=strategy)
        if "relu_aux" in aux and executor[2] not in ("cuda", "cupy"):  # the GPU executors return cuBLASLt's bits
            np.testing.assert_array_equal(_host(aux["relu_aux"]), want_aux["relu_aux"], err_msg=strategy)


# -- alpha, beta * c and the bias ------------------------------------------------------------------------------
@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("epilog", [Epilog.BIAS, Epilog.RELU_BIAS, Epilog.GELU_BIAS])
@pytest.mark.parametrize("with_c", [False, True], ids=["alpha", "alpha-beta-c"])
def test_bias_is_added_after_alpha_and_beta_c(executor, epilog, with_c):
    rng = np.random.default_rng(1)
    a, b = rng.integers(-3, 4, (5, 4)).astype(float), rng.integers(-3, 4, (4, 3)).astype(float)
    c = rng.integers(-3, 4, (5, 3)).astype(float) if with_c else None
    alpha, beta = 2.0, (3.0 if with_c else None)
    d = alpha * (a @ b) + (beta * c if with_c else 0)
    want, _ = epilog_reference(epilog.name, d, {"bias": BIAS3})
    wrong, _ = epilog_reference(epilog.name, alpha * (a @ b + BIAS3) + (beta * c if with_c else 0), {})
    # per entry, scaled to what was summed (sum |alpha a_ik b_kj| + |beta c| + |bias|): float64 rounding in any
    # order (a GPU's FMAs), and for GELU cuBLASLt's activation, accurate to ~6e-9 relative (H200)
    scale = abs(alpha) * (np.abs(a) @ np.abs(b)) + (abs(beta) * np.abs(c) if with_c else 0) + np.abs(BIAS3)
    tol = scale * (1e-7 if "GELU" in epilog.name else 1e-12)
    assert (np.abs(wrong - want) > 100 * tol).any()  # the two readings are far apart at this tolerance
    runs = _call(executor, a, b, c, dtype="float64", alpha=alpha, beta=beta, epilog=epilog, inputs={"bias": BIAS3})
    for strategy, out, _ in runs:
        np.testing.assert_array_less(np.abs(out - want), tol, err_msg=strategy)


# -- GELU is the tanh approximation -----------------------------------------------------------------------------
@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("epilog", [Epilog.GELU, Epilog.GELU_BIAS, Epilog.GELU_AUX_BIAS])
def test_gelu_is_the_tanh_form(executor, epilog):
    a = np.array([[2.7, -2.7, 1.5, 0.3]]).T  # where the erf and tanh forms differ by ~5e-4
    b = np.ones((1, 3))
    bias = np.array([0.0, 0.1, -0.2])
    inputs = {"bias": bias} if "BIAS" in epilog.name else None
    x = a @ b + (bias if inputs else 0)
    want = gelu(x)
    # cuBLASLt's GELU is accurate to ~6e-9 relative (H200); the erf form is >= 3e-8 away at every entry
    rtol, atol = 1e-7, 1e-9
    erf_form = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    assert (np.abs(erf_form - want) > atol + rtol * np.abs(want)).all()
    for strategy, out, _ in _call(executor, a, b, dtype="float64", epilog=epilog, inputs=inputs):
        np.testing.assert_allclose(out, want, rtol=rtol, atol=atol, err_msg=strategy)


# -- DRELU with a non-finite upstream gradient at masked positions --------------------------------------------
@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("epilog", [Epilog.DRELU, Epilog.DRELU_BGRAD])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_drelu_gives_zero_where_masked_whatever_the_gradient(executor, epilog, bad):
    a = np.array([[bad, 0.0], [1.0, 2.0], [-1.0, 1.0], [bad, 0.0]])
    b = np.array([[1.0, 1.0, 1.0], [0.5, -1.0, 2.0]])
    mask = np.array([[False, False, False], [True, False, True], [True, True, False], [False, False, False]])
    want, want_aux = epilog_reference(epilog.name, a @ b, {"relu_aux": mask})
    for strategy, out, aux in _call(executor, a, b, dtype="float32", epilog=epilog, inputs={"relu_aux": mask}):
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6, err_msg=strategy)
        if want_aux:
            got = _host(aux["drelu_bgrad"])
            np.testing.assert_allclose(got, want_aux["drelu_bgrad"], rtol=1e-6, atol=1e-6, err_msg=strategy)


# -- reductions of float16/bfloat16 data accumulate in float32 ------------------------------------------------
ROWS = 65536  # 65536 * 0.25 = 16384; summed in float16 it sticks at 512 (0.25 is below half an ulp there)


def _reduction_case(epilog, layout):
    if epilog in (Epilog.DRELU_BGRAD, Epilog.DGELU_BGRAD):
        a, b = np.full((ROWS, 1), 0.25), np.ones((1, 2))
        if epilog == Epilog.DRELU_BGRAD:
            aux = {"relu_aux": np.ones((ROWS, 2), bool)}
        else:
            aux = {"gelu_aux": np.full((ROWS, 2), 8.0)}  # gelu'(8) = 1
        return a, b, aux, epilog.name.lower(), np.full(2, ROWS * 0.25)
    if epilog == Epilog.BGRADA:  # a summed over K
        a = np.full((2, ROWS), 0.25)
        a = np.asfortranarray(a) if layout == "F" else a
        return a, np.ones((ROWS, 3)), {}, "bgrada", np.full(2, ROWS * 0.25)
    b = np.full((ROWS, 2), 0.25)  # BGRADB: b summed over K
    b = np.asfortranarray(b) if layout == "F" else b
    return np.ones((3, ROWS)), b, {}, "bgradb", np.full(2, ROWS * 0.25)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    "epilog, layout",
    [
        (Epilog.DRELU_BGRAD, "C"),
        (Epilog.DGELU_BGRAD, "C"),
        (Epilog.BGRADA, "C"),
        (Epilog.BGRADA, "F"),
        (Epilog.BGRADB, "C"),
        (Epilog.BGRADB, "F"),
    ],
)
def test_half_precision_reductions_accumulate_in_float32(executor, dtype, epilog, layout):
    if dtype == "bfloat16" and executor[0] == "cupy":
        pytest.skip("CuPy has no bfloat16")
    a, b, inputs, name, want = _reduction_case(epilog, layout)
    for strategy, _, aux in _call(executor, a, b, dtype=dtype, epilog=epilog, inputs=inputs):
        got = _host(aux[name]).astype(np.float64).reshape(-1)
        np.testing.assert_allclose(got, want, rtol=1e-2, err_msg=strategy)
