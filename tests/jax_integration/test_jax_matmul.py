"""``nvdispatch.matmul`` inside ``jax.jit``, under ``jax.grad`` and ``jax.vmap`` (CPU).

Values against the float64 NumPy oracle of the matmul tests (``matmul_reference``); gradients against central
finite differences of that oracle in float64 (directional derivatives along random directions), so nothing of
nvdispatch or of JAX's differentiation is the reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from matmul_reference import assert_close, assert_relu_mask, expected

import nvdispatch
from nvdispatch import Epilog, plan_cache

EPILOGS = [e.name for e in Epilog]
BIAS_EPILOGS = [e for e in EPILOGS if "BIAS" in e and "BGRAD" not in e]


def _ints(rng, shape, dtype):
    return rng.integers(-3, 4, size=shape).astype(dtype)


def _case(epilog: str, sa, sb, dtype="float32", bias_axis="n", seed=0, ints=True, c_shape=None):
    """Operands (NumPy) of ``epilog`` on ``a`` of shape ``sa`` and ``b`` of shape ``sb``: ``(a, b, c, inputs)``."""
    rng = np.random.default_rng(seed)
    make = (lambda s: _ints(rng, s, dtype)) if ints else (lambda s: rng.standard_normal(s).astype(dtype))
    a, b = make(sa), make(sb)
    result = np.matmul(np.zeros(sa), np.zeros(sb)).shape
    pa, pb = (1, *sa) if len(sa) == 1 else sa, (*sb, 1) if len(sb) == 1 else sb
    m, n = pa[-2], pb[-1]
    inputs = {}
    if "BIAS" in epilog and "BGRAD" not in epilog:
        inputs["bias"] = make((n,) if bias_axis == "n" else (m, 1))
    if epilog.startswith("DRELU"):
        inputs["relu_aux"] = rng.random(result) > 0.4
    if epilog.startswith("DGELU"):
        inputs["gelu_aux"] = rng.standard_normal(result).astype(dtype)
    c = None if c_shape is None else make(c_shape)
    return a, b, c, inputs


def _check(got, a, b, c, inputs, epilog, alpha=1, beta=None, bgrad_axis="n", dtype="float32"):
    want, want_aux = expected(a, b, c, alpha, beta, epilog, inputs, bgrad_axis)
    spec_outputs = nvdispatch._epilog.spec_of(epilog).outputs
    if spec_outputs:
        got, aux = got
        assert set(aux) == set(spec_outputs)
        for name in spec_outputs:
            assert isinstance(aux[name], jax.Array)
            assert aux[name].shape == want_aux[name].shape, (name, aux[name].shape, want_aux[name].shape)
            if name == "relu_aux":
                assert_relu_mask(aux[name], a, b, c, alpha, beta, epilog, inputs, bgrad_axis)
            else:
                assert_close(np.asarray(aux[name].astype(jnp.float64 if dtype == "float64" else jnp.float32)),
                             want_aux[name], dtype, name)
    assert isinstance(got, jax.Array) and got.shape == want.shape and str(got.dtype) == dtype
    assert_close(np.asarray(got.astype(jnp.float32)) if dtype == "bfloat16" else np.asarray(got), want, dtype)


def _jitted(epilog, bgrad_axis="n", alpha=1, beta=None):
    options = {"bgrad_axis": bgrad_axis} if bgrad_axis != "n" else None

    def f(a, b, c, inputs):
        return nvdispatch.matmul(
            a, b, c, alpha=alpha, beta=beta, epilog=epilog, epilog_inputs=inputs or None, options=options
        )

    return jax.jit(f)


SHAPES = [
    ((5, 3), (3, 4)),  # a linear layer
    ((2, 5, 3), (3, 4)),  # batched a
    ((5, 3), (2, 3, 4)),  # batched b
    ((1, 5, 3), (2, 3, 4)),  # batch broadcast
]


@pytest.mark.parametrize("epilog", EPILOGS)
@pytest.mark.parametrize("shapes", SHAPES, ids=["2d", "batch-a", "batch-b", "broadcast"])
def test_every_epilog_inside_jit_matches_the_oracle(epilog, shapes):
    a, b, c, inputs = _case(epilog, *shapes)
    got = _jitted(epilog)(a, b, c, inputs)
    _check(got, a, b, c, inputs, epilog)


@pytest.mark.parametrize("epilog", [*BIAS_EPILOGS, "DRELU_BGRAD", "DGELU_BGRAD"])
def test_bias_along_m_and_bias_gradients_along_n(epilog):
    axis = "m" if "BGRAD" in epilog else "n"
    a, b, c, inputs = _case(epilog, (2, 5, 3), (3, 4), bias_axis="m")
    got = _jitted(epilog, bgrad_axis=axis)(a, b, c, inputs)
    _check(got, a, b, c, inputs, epilog, bgrad_axis=axis)


@pytest.mark.parametrize("epilog", ["DEFAULT", "RELU_AUX", "GELU_AUX", "BGRADA", "BGRADB"])
@pytest.mark.parametrize("shapes", [((3,), (3, 4)), ((5, 3), (3,)), ((3,), (3,)), ((3,), (2, 3, 4))])
def test_vector_operands_follow_pep465(epilog, shapes):
    a, b, c, inputs = _case(epilog, *shapes)
    _check(_jitted(epilog)(a, b, c, inputs), a, b, c, inputs, epilog)


@pytest.mark.parametrize("epilog", ["DEFAULT", "RELU_BIAS", "GELU_AUX_BIAS"])
def test_c_alpha_beta(epilog):
    a, b, c, inputs = _case(epilog, (2, 5, 3), (3, 4), c_shape=(5, 4))
    got = _jitted(epilog, alpha=2.0, beta=-1.0)(a, b, c, inputs)
    _check(got, a, b, c, inputs, epilog, alpha=2.0, beta=-1.0)


@pytest.mark.parametrize("epilog", ["DEFAULT", "RELU_AUX_BIAS", "GELU_BIAS", "DRELU_BGRAD", "BGRADB"])
def test_float64(x64, epilog):
    a, b, c, inputs = _case(epilog, (2, 5, 3), (3, 4), dtype="float64", ints=False)
    _check(_jitted(epilog)(a, b, c, inputs), a, b, c, inputs, epilog, dtype="float64")


@pytest.mark.parametrize("epilog", ["DEFAULT", "RELU_BIAS", "GELU_AUX_BIAS", "BGRADB", "DRELU_BGRAD"])
def test_bfloat16_rounds_once(epilog):
    a, b, c, inputs = _case(epilog, (5, 3), (3, 4))
    to_bf16 = {k: (jnp.asarray(v, jnp.bfloat16) if v.dtype != bool else v) for k, v in inputs.items()}
    got = _jitted(epilog)(jnp.asarray(a, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16), None, to_bf16)
    assert (got[0] if isinstance(got, tuple) else got).dtype == jnp.bfloat16
    _check(got, a, b, c, inputs, epilog, dtype="bfloat16")


def test_float32_bias_of_a_bfloat16_product():
    a, b, _, inputs = _case("RELU_BIAS", (5, 3), (3, 4))
    got = _jitted("RELU_BIAS")(jnp.asarray(a, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16), None, inputs)
    assert got.dtype == jnp.bfloat16
    _check(got, a, b, None, inputs, "RELU_BIAS", dtype="bfloat16")


def test_numpy_constants_and_concrete_arrays_beside_tracers():
    a, b, _, inputs = _case("RELU_BIAS", (5, 3), (3, 4))
    f = jax.jit(lambda x: nvdispatch.matmul(x, b, epilog="RELU_BIAS", epilog_inputs={"bias": jnp.asarray(inputs["bias"])}))
    _check(f(a), a, b, None, inputs, "RELU_BIAS")


# -- vmap ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "in_axes, shapes",
    [
        ((0, None, None), ((4, 5, 3), (3, 2), (2,))),  # a batch of inputs through one layer
        ((None, 0, 0), ((5, 3), (4, 3, 2), (4, 2))),  # one input through a batch of layers (bias vmapped)
        ((1, None, None), ((5, 4, 3), (3, 2), (2,))),  # a positive, non-leading axis
        ((-1, 2, None), ((5, 3, 4), (3, 2, 4), (2,))),  # negative and positive axes
        ((0, None, None), ((4, 3), (3, 2), (2,))),  # vmap over a vector a: each example a 1-D operand
    ],
)
def test_vmap_over_any_axis_matches_per_example_calls(in_axes, shapes):
    rng = np.random.default_rng(1)
    a, b, bias = (_ints(rng, s, "float32") for s in shapes)
    f = lambda a, b, bias: nvdispatch.matmul(a, b, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias})
    y, aux = jax.jit(jax.vmap(f, in_axes=in_axes))(a, b, bias)
    size = next(s[ax] for s, ax in zip(shapes, in_axes) if ax is not None)
    for i in range(size):
        args = [np.take(x, i, axis=ax) if ax is not None else x for x, ax in zip((a, b, bias), in_axes)]
        want, want_aux = expected(*args[:2], None, 1, None, "RELU_AUX_BIAS", {"bias": args[2]})
        assert_close(np.asarray(y[i]), want, "float32")
        np.testing.assert_array_equal(np.asarray(aux["relu_aux"][i]), want_aux["relu_aux"])


@pytest.mark.parametrize("epilog", ["BGRADA", "BGRADB", "DRELU_BGRAD", "GELU_AUX"])
def test_vmap_of_auxiliary_outputs(epilog):
    a, b, c, inputs = _case(epilog, (3, 5, 3), (3, 4), seed=4)
    f = lambda a, inputs: nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=inputs or None)
    got = jax.jit(jax.vmap(f))(a, inputs)
    for i in range(3):
        per = {k: v[i] for k, v in inputs.items()}
        want, want_aux = expected(a[i], b, None, 1, None, epilog, per)
        assert_close(np.asarray(got[0][i]), want, "float32")
        for name, value in want_aux.items():
            assert_close(np.asarray(got[1][name][i]), value, "float32", name)


#: (epilog, what is batched) where ``a`` and ``b`` are shared and only ``c`` or an epilog input carries the batch
ONLY_INPUT_BATCHED = [("DGELU", "gelu_aux"), ("DRELU", "relu_aux"), ("RELU_BIAS", "bias"), ("DEFAULT", "c"),
                      ("GELU_AUX_BIAS", "bias")]


def check_vmap_over_inputs_only(epilog: str, batched: str, size: int = 3):
    """``jax.vmap`` over ``c`` or one epilog input alone (``a``, ``b`` shared): each batch matrix of the result
    and its auxiliary outputs against the per-example oracle."""
    a, b, _, inputs = _case(epilog, (5, 3), (3, 4), seed=7)
    rng = np.random.default_rng(8)
    if batched == "c":
        stack = _ints(rng, (size, 5, 4), "float32")
    else:
        stack = np.stack([_case(epilog, (5, 3), (3, 4), seed=20 + i)[3][batched] for i in range(size)])
    beta = 1.0 if batched == "c" else None

    def f(x):
        if batched == "c":
            return nvdispatch.matmul(a, b, x, beta=beta)
        return nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs={**inputs, batched: x})

    got = jax.jit(jax.vmap(f))(stack)
    for i in range(size):
        c = stack[i] if batched == "c" else None
        per = inputs if batched == "c" else {**inputs, batched: stack[i]}
        want, want_aux = expected(a, b, c, 1, beta, epilog, per)
        result = got[0] if want_aux else got
        assert result.shape == (size, *want.shape)
        assert_close(np.asarray(result[i]), want, "float32")
        for name, value in want_aux.items():
            if name == "relu_aux":
                assert_relu_mask(got[1][name][i], a, b, c, 1, beta, epilog, per)
            else:
                assert_close(np.asarray(got[1][name][i]), value, "float32", name)


@pytest.mark.parametrize("epilog, batched", ONLY_INPUT_BATCHED)
def test_vmap_over_an_epilog_input_or_c_alone(epilog, batched):
    check_vmap_over_inputs_only(epilog, batched)


# -- gradients ------------------------------------------------------------------------------------------------------
def _weights(rng, want, want_aux):
    """Random weights of a scalar loss over the result and every floating auxiliary output."""
    w = {"out": rng.standard_normal(want.shape)}
    for name, value in want_aux.items():
        if value.dtype != bool:
            w[name] = rng.standard_normal(value.shape)
    return w


def _oracle_loss(weights, a, b, c, inputs, epilog, alpha, beta, bgrad_axis):
    want, aux = expected(a, b, c, alpha, beta, epilog, inputs, bgrad_axis)
    total = float(np.sum(weights["out"] * want))
    return total + sum(float(np.sum(weights[k] * v)) for k, v in aux.items() if k in weights)


def _check_gradients(epilog, sa, sb, *, bias_axis="n", bgrad_axis="n", c_shape=None, alpha=1, beta=None, seed=0):
    """jax.grad (inside jit) of a loss over the result and the floating aux outputs, wrt every floating operand,
    against central differences of the float64 oracle along random directions."""
    a, b, c, inputs = _case(epilog, sa, sb, "float64", bias_axis, seed, ints=False, c_shape=c_shape)
    rng = np.random.default_rng(seed + 100)
    want, want_aux = expected(a, b, c, alpha, beta, epilog, inputs, bgrad_axis)
    weights = _weights(rng, want, want_aux)
    floats = {"a": a, "b": b, **({"c": c} if c is not None else {}), **{k: v for k, v in inputs.items() if v.dtype != bool}}
    masks = {k: v for k, v in inputs.items() if v.dtype == bool}
    options = {"bgrad_axis": bgrad_axis}

    def loss(fl):
        ins = {**{k: fl[k] for k in inputs if k in fl}, **masks}
        got = nvdispatch.matmul(fl["a"], fl["b"], fl.get("c"), alpha=alpha, beta=beta, epilog=epilog,
                                epilog_inputs=ins or None, options=options)
        y, aux = got if isinstance(got, tuple) else (got, {})
        total = jnp.sum(weights["out"] * y)
        return total + sum(jnp.sum(weights[k] * v) for k, v in aux.items() if k in weights)

    grads = jax.jit(jax.grad(loss))({k: jnp.asarray(v) for k, v in floats.items()})
    eps = 1e-6
    for name, value in floats.items():
        v = rng.standard_normal(value.shape)

        def at(t, name=name, value=value, v=v):
            moved = dict(floats)
            moved[name] = value + t * v
            ins = {**{k: moved[k] for k in inputs if k in moved}, **masks}
            return _oracle_loss(weights, moved["a"], moved["b"], moved.get("c"), ins, epilog, alpha, beta, bgrad_axis)

        numeric = (at(eps) - at(-eps)) / (2 * eps)
        analytic = float(np.sum(np.asarray(grads[name]) * v))
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(numeric)), (name, numeric, analytic)


@pytest.mark.parametrize("epilog", EPILOGS)
def test_gradients_of_every_epilog(x64, epilog):
    _check_gradients(epilog, (5, 3), (3, 4))


@pytest.mark.parametrize("epilog", ["BIAS", "RELU_BIAS", "GELU_AUX_BIAS", "DRELU_BGRAD", "DGELU_BGRAD"])
def test_gradients_along_m(x64, epilog):
    _check_gradients(epilog, (2, 5, 3), (3, 4), bias_axis="m", bgrad_axis="m")


@pytest.mark.parametrize("shapes", [((2, 5, 3), (3, 4)), ((5, 3), (2, 3, 4)), ((1, 5, 3), (2, 3, 4)), ((3,), (3, 4)), ((5, 3), (3,))])
@pytest.mark.parametrize("epilog", ["RELU_BIAS", "GELU_BIAS", "BGRADA", "BGRADB"])
def test_gradients_of_batched_and_vector_products(x64, epilog, shapes):
    if "BIAS" in epilog and len(shapes[1]) == 1:
        pytest.skip("a bias needs an N axis")
    _check_gradients(epilog, *shapes)


def test_gradients_of_c_alpha_beta(x64):
    _check_gradients("GELU_BIAS", (2, 5, 3), (3, 4), c_shape=(5, 4), alpha=0.5, beta=2.0)


def test_grad_without_jit_and_per_example_gradients_with_vmap(x64):
    rng = np.random.default_rng(7)
    x, w, bias = rng.standard_normal((6, 3)), rng.standard_normal((3, 4)), rng.standard_normal(4)

    def loss(w, bias, x):
        return jnp.sum(nvdispatch.matmul(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias}) ** 2)

    gw, gb = jax.grad(loss, argnums=(0, 1))(w, bias, x)  # eager: JVP/linearize tracers
    z = x @ w + bias
    dz = 2 * np.maximum(z, 0) * (z > 0)
    np.testing.assert_allclose(np.asarray(gw), x.T @ dz, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(np.asarray(gb), dz.sum(0), rtol=1e-10, atol=1e-10)
    per = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, None, 0)))(w, bias, x[:, None, :])
    for i in range(6):
        zi = x[i : i + 1] @ w + bias
        np.testing.assert_allclose(np.asarray(per[i]), x[i : i + 1].T @ (2 * np.maximum(zi, 0)), rtol=1e-10, atol=1e-10)


def test_second_derivatives(x64):
    rng = np.random.default_rng(8)
    x, w, bias = rng.standard_normal((4, 3)), rng.standard_normal((3, 2)), rng.standard_normal(2)

    def f(w):
        return jnp.sum(nvdispatch.matmul(x, w, epilog="GELU_BIAS", epilog_inputs={"bias": bias}))

    def oracle_grad(w):
        from matmul_reference import gelu_grad

        return x.T @ gelu_grad(x @ w + bias)

    v = rng.standard_normal(w.shape)
    eps = 1e-6
    numeric = (oracle_grad(w + eps * v) - oracle_grad(w - eps * v)) / (2 * eps)
    hvp = jax.jit(jax.grad(lambda w: jnp.sum(jax.grad(f)(w) * v)))(w)
    np.testing.assert_allclose(np.asarray(hvp), numeric, rtol=1e-5, atol=1e-6)


# -- plans -----------------------------------------------------------------------------------------------------------
def test_tracing_the_same_shapes_again_plans_nothing():
    a, b, _, inputs = _case("RELU_BIAS", (8, 3), (3, 4))

    def f(a, b, bias):
        return nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})

    jax.jit(f)(a, b, inputs["bias"]).block_until_ready()
    misses = plan_cache.stats()["misses"]
    jax.clear_caches()
    for _ in range(3):
        jax.jit(lambda a, b, bias: f(a, b, bias))(a, b, inputs["bias"]).block_until_ready()  # traced anew
    assert plan_cache.stats()["misses"] == misses


def test_backend_state_of_the_trace_is_honoured():
    a, b, _, _ = _case("DEFAULT", (4, 3), (3, 2))
    with nvdispatch.skip_backend("numpy"):
        f = jax.jit(lambda a, b: nvdispatch.matmul(a, b))
        with pytest.raises(Exception, match="NoExecutorError|executor"):
            f(a, b).block_until_ready()


def test_integer_products():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.arange(12, dtype=np.int32).reshape(3, 4) - 5
    got = jax.jit(lambda a, b: nvdispatch.matmul(a, b, epilog="RELU"))(a, b)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), np.maximum(a @ b, 0))


@pytest.mark.parametrize("traced", ["a", "b", "c", "bias"])
def test_a_tracer_in_any_position_stages_the_call(traced):
    rng = np.random.default_rng(9)
    ops = {"a": _ints(rng, (4, 3), "float32"), "b": _ints(rng, (3, 2), "float32"), "c": _ints(rng, (4, 2), "float32"),
           "bias": _ints(rng, (2,), "float32")}

    def f(x):
        args = {**ops, traced: x}
        return nvdispatch.matmul(args["a"], args["b"], args["c"], epilog="RELU_BIAS", epilog_inputs={"bias": args["bias"]})

    want, _ = expected(ops["a"], ops["b"], ops["c"], 1, None, "RELU_BIAS", {"bias": ops["bias"]})
    assert_close(np.asarray(jax.jit(f)(ops[traced])), want, "float32")
