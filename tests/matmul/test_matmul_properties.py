"""Property tests: every epilog × dtype × shape × layout × bias orientation × alpha/beta/c, on the NumPy and
Torch (CPU) executors, against a float64 NumPy reference; inputs are never modified."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from matmul_reference import assert_close, expected, gelu, gelu_grad, to_numpy

import nvdispatch
from nvdispatch import Epilog
from nvdispatch._epilog import spec_of

torch = pytest.importorskip("torch")

NUMPY_DTYPES = [
    "float32", "float64", "float16", "complex64", "complex128",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
]  # fmt: skip
TORCH_DTYPES = [
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "complex64",
    "complex128",
    "int8",
    "int32",
    "int64",
    "uint8",
]


def _allowed(epilog: Epilog, dtype: str) -> bool:
    spec = spec_of(epilog)
    if spec.real_only and dtype.startswith("complex"):
        return False
    if spec.float_only and not dtype.startswith(("float", "bfloat")):
        return False
    return True


def _values(rng, shape, dtype):
    lo = 0 if dtype.startswith("uint") else -3
    return rng.integers(lo, 4, size=shape).astype(np.float64)


def _make(rng, shape, dtype, framework, layout):
    """An operand of ``shape`` and ``dtype`` in ``framework``, stored with ``layout``."""
    base = _values(rng, shape, dtype)
    if dtype.startswith("complex"):
        base = base + 1j * _values(rng, shape, dtype)
    if layout == "transposed" and len(shape) >= 2:
        store = np.ascontiguousarray(np.swapaxes(base, -1, -2))
        view = lambda x: x.swapaxes(-1, -2) if framework == "numpy" else x.transpose(-1, -2)  # noqa: E731
    elif layout == "sliced" and len(shape) >= 1:
        store = np.repeat(base, 2, axis=-1)
        view = lambda x: x[..., ::2]  # noqa: E731
    elif layout == "reversed" and framework == "numpy" and len(shape) >= 1:
        store = np.ascontiguousarray(base[..., ::-1])
        view = lambda x: x[..., ::-1]  # noqa: E731
    else:
        store, view = base, (lambda x: x)
    if framework == "numpy":
        return view(store.astype(dtype))
    t = torch.from_numpy(np.array(store, order="C"))
    t = t.to(getattr(torch, dtype))
    return view(t)


@st.composite
def cases(draw, framework):
    dtypes = NUMPY_DTYPES if framework == "numpy" else TORCH_DTYPES
    dtype = draw(st.sampled_from(dtypes))
    epilog = draw(st.sampled_from([e for e in Epilog if _allowed(e, dtype)]))
    spec = spec_of(epilog)
    m, n, k = draw(st.integers(0, 5)), draw(st.integers(0, 5)), draw(st.integers(0, 5))
    a_vec = draw(st.booleans()) if not spec.has_bias else False
    b_vec = draw(st.booleans()) if not spec.has_bias else False
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    a_batch = batch[draw(st.integers(0, len(batch))) :] if not a_vec else ()
    b_batch = batch if not b_vec else ()
    if a_batch != batch and b_vec:
        a_batch = batch
    if a_batch and draw(st.booleans()):  # broadcast a size-1 batch dim
        a_batch = (1,) + a_batch[1:]
    layouts = ["plain", "transposed", "sliced"] + (["reversed"] if framework == "numpy" else [])
    return {
        "dtype": dtype,
        "epilog": epilog,
        "m": m, "n": n, "k": k,
        "a_shape": (k,) if a_vec else (*a_batch, m, k),
        "b_shape": (k,) if b_vec else (*b_batch, k, n),
        "batch": batch if not (a_vec and b_vec) else (),
        "a_layout": draw(st.sampled_from(layouts)),
        "b_layout": draw(st.sampled_from(layouts)),
        "bias": draw(st.sampled_from(["n1", "n2", "m", "batched_n"])) if spec.has_bias else None,
        "alpha": draw(st.sampled_from([1, 2, -1] if not dtype.startswith("uint") else [1, 2])),
        "c": draw(st.booleans()) and "_BGRAD" not in epilog.name,
        "beta": draw(st.sampled_from([None, 1, 2, 0])),
        "bgrad_axis": draw(st.sampled_from(["n", "m"])),
        "seed": draw(st.integers(0, 2**16)),
    }  # fmt: skip


def _run_case(case, framework):
    rng = np.random.default_rng(case["seed"])
    dtype = case["dtype"]
    a = _make(rng, case["a_shape"], dtype, framework, case["a_layout"])
    b = _make(rng, case["b_shape"], dtype, framework, case["b_layout"])
    result_shape = np.matmul(np.empty(case["a_shape"]), np.empty(case["b_shape"])).shape
    m, n = case["m"], case["n"]
    spec = spec_of(case["epilog"])
    inputs = {}
    if spec.has_bias:
        batch = case["batch"]
        shape = {"n1": (n,), "n2": (1, n), "m": (m, 1), "batched_n": (*batch, 1, n)}[case["bias"]]
        inputs["bias"] = _make(rng, shape, dtype, framework, "plain")
    if "relu_aux" in spec.inputs:
        mask = rng.integers(0, 2, size=result_shape).astype(bool)
        inputs["relu_aux"] = mask if framework == "numpy" else torch.from_numpy(mask)
    if "gelu_aux" in spec.inputs:
        inputs["gelu_aux"] = _make(rng, result_shape, dtype, framework, "plain")
    c = _make(rng, result_shape[-1:], dtype, framework, "plain") if case["c"] and result_shape else None
    beta = case["beta"] if c is not None else None
    options = {"bgrad_axis": case["bgrad_axis"]}

    before = {k: to_numpy(v).copy() for k, v in {"a": a, "b": b, "c": c, **inputs}.items() if v is not None}
    got = nvdispatch.matmul(
        a, b, c, alpha=case["alpha"], beta=beta, epilog=case["epilog"], epilog_inputs=inputs or None, options=options
    )
    want, want_aux = expected(a, b, c, case["alpha"], beta, case["epilog"], inputs, case["bgrad_axis"])
    if spec.outputs:
        got, aux = got
        assert set(aux) == set(spec.outputs)
        for name in spec.outputs:
            assert_close(aux[name], want_aux[name], dtype if name != "relu_aux" else "bool", name, scale=4.0)
    if framework == "numpy":  # numpy.matmul's type: a scalar for a 1-D @ 1-D product, else an array
        assert type(got) is type(np.matmul(to_numpy(a), to_numpy(b)))
    else:
        assert type(got) is torch.Tensor
    assert tuple(got.shape) == tuple(want.shape)
    if framework == "torch":
        assert str(got.dtype).removeprefix("torch.") == dtype
    else:
        assert got.dtype == np.dtype(dtype)
    assert_close(got, want, dtype, "result", scale=4.0 if spec.activation == "gelu" else 1.0)
    for name, value in before.items():
        current = {"a": a, "b": b, "c": c, **inputs}[name]
        np.testing.assert_array_equal(to_numpy(current), value, err_msg=f"{name} was modified")


_settings = settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@_settings
@given(cases("numpy"))
def test_numpy_executor_matches_reference(case):
    _run_case(case, "numpy")


@_settings
@given(cases("torch"))
def test_torch_executor_matches_reference(case):
    _run_case(case, "torch")


@pytest.mark.parametrize("framework", ["numpy", "torch"])
@pytest.mark.parametrize(
    "forward,backward", [(Epilog.RELU_AUX_BIAS, Epilog.DRELU_BGRAD), (Epilog.GELU_AUX_BIAS, Epilog.DGELU_BGRAD)]
)
def test_aux_round_trip_gives_the_gradient(framework, forward, backward):
    """Forward with *_AUX, then backward with the returned aux: the gradient of a linear layer."""
    rng = np.random.default_rng(0)
    x, w, bias, w2 = (rng.standard_normal(s) for s in [(8, 5), (5, 6), (6,), (6, 3)])
    grad_out = rng.standard_normal((8, 3))
    conv = (lambda v: v) if framework == "numpy" else torch.from_numpy
    y, aux = nvdispatch.matmul(conv(x), conv(w), epilog=forward, epilog_inputs={"bias": conv(bias)})
    name = "relu_aux" if "RELU" in forward.name else "gelu_aux"
    # the gradient wrt the pre-activation, given dL/dy = grad_out @ w2.T
    dz, grads = nvdispatch.matmul(conv(grad_out), conv(w2.T), epilog=backward, epilog_inputs={name: aux[name]})
    pre = x @ w + bias
    if name == "relu_aux":
        local = (pre > 0).astype(float)
    else:
        local = gelu_grad(pre)
    want = (grad_out @ w2.T) * local
    np.testing.assert_allclose(to_numpy(dz), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(to_numpy(grads[backward.name.lower()]), want.sum(axis=0), rtol=1e-10, atol=1e-12)
    # numerically: finite differences of sum(grad_out * f(x@w + bias) @ w2) wrt bias
    eps = 1e-6
    act = (lambda t: np.maximum(t, 0)) if name == "relu_aux" else gelu
    fd = [
        (np.sum(grad_out * (act(x @ w + bias + eps * e) @ w2)) - np.sum(grad_out * (act(x @ w + bias - eps * e) @ w2)))
        / (2 * eps)
        for e in np.eye(6)
    ]
    np.testing.assert_allclose(to_numpy(grads[backward.name.lower()]), fd, rtol=1e-5, atol=1e-6)
    assert to_numpy(y).shape == (8, 6)
