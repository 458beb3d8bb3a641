"""What cannot be staged into a JAX program is refused at trace time with a typed error naming the argument;
what fails eagerly fails the same way when traced; JAX's precision setting reaches GPU products (CPU: the
compute type chosen)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nvdispatch
from nvdispatch import ComputeType
from nvdispatch.errors import (
    EpilogInputError,
    InvalidArgumentError,
    ShapeMismatchError,
    UnsupportedDtypeError,
    UnsupportedOperandError,
)
from nvdispatch.integrations.jax_precision import convention_compute_type

A = np.ones((4, 3), np.float32)
B = np.ones((3, 2), np.float32)
BIAS = np.ones(2, np.float32)


def _traced(f, *args):
    return jax.jit(f)(*args)


@pytest.mark.parametrize(
    "kwargs, error, argument",
    [
        ({"stream": 0}, InvalidArgumentError, "stream"),
        ({"quantization_scales": {"a": 1.0}}, InvalidArgumentError, "quantization_scales"),
        ({"options": {"result_amax": True}}, InvalidArgumentError, "options.result_amax"),
        ({"options": {"fast_accumulation": True}}, InvalidArgumentError, "options.fast_accumulation"),
        ({"epilog": "NOPE"}, InvalidArgumentError, "epilog"),
        ({"epilog": "RELU_BIAS"}, EpilogInputError, "epilog_inputs"),
        ({"epilog": "BIAS", "epilog_inputs": {"bias": np.ones(3, np.float32)}}, EpilogInputError, "epilog_inputs['bias']"),
        ({"epilog_inputs": {"nope": BIAS}}, EpilogInputError, "epilog_inputs"),
        ({"epilog": "DRELU", "epilog_inputs": {"relu_aux": np.zeros((4, 16), np.uint8)}}, EpilogInputError, "epilog_inputs['relu_aux']"),
    ],
)
def test_refused_at_trace_time_naming_the_argument(kwargs, error, argument):
    with pytest.raises(error) as info:
        _traced(lambda a, b: nvdispatch.matmul(a, b, **kwargs), A, B)
    assert info.value.argument.startswith(argument)


def test_shape_and_dtype_errors_are_the_eager_ones():
    with pytest.raises(ShapeMismatchError) as eager:
        nvdispatch.matmul(A, A)
    with pytest.raises(ShapeMismatchError) as traced:
        _traced(lambda a: nvdispatch.matmul(a, a), A)
    assert traced.value.argument == eager.value.argument == "b"
    with pytest.raises(UnsupportedDtypeError):
        _traced(lambda a: nvdispatch.matmul(a.astype(jnp.float8_e4m3fn), a.T.astype(jnp.float8_e4m3fn)), A)


def test_traced_scalars_and_non_arrays():
    with pytest.raises(InvalidArgumentError, match="alpha"):
        _traced(lambda a, s: nvdispatch.matmul(a, B, alpha=s), A, 2.0)
    with pytest.raises(UnsupportedOperandError) as info:
        _traced(lambda a: nvdispatch.matmul(a, [[1.0, 2.0]] * 3), A)
    assert info.value.argument == "b"


def test_apis_that_run_now_say_tracers_hold_no_values():
    def f(a):
        nvdispatch.Matmul(a, B).plan()
        return a

    with pytest.raises(UnsupportedOperandError, match="tracer") as info:
        _traced(f, A)
    assert info.value.argument == "a"
    with pytest.raises(UnsupportedOperandError, match="tracer"):
        _traced(lambda a: nvdispatch.explain(a, B) and a, A)
    with pytest.raises(UnsupportedOperandError, match="tracer"):
        _traced(lambda a: nvdispatch.fft.FFT(a.astype(jnp.complex64)).plan() and a, A)


def test_zero_size_products():
    got = _traced(lambda a, b, bias: nvdispatch.matmul(a, b, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias}),
                  np.ones((4, 0), np.float32), np.ones((0, 3), np.float32), np.array([-1.0, 0.0, 2.0], np.float32))
    np.testing.assert_array_equal(np.asarray(got[0]), np.tile([0.0, 0.0, 2.0], (4, 1)))
    np.testing.assert_array_equal(np.asarray(got[1]["relu_aux"]), np.tile([False, False, True], (4, 1)))
    assert _traced(lambda a: nvdispatch.matmul(a, B), np.ones((0, 3), np.float32)).shape == (0, 2)


@pytest.mark.parametrize(
    "setting, expected",
    [
        (None, ComputeType.COMPUTE_32F_FAST_TF32),
        ("highest", ComputeType.COMPUTE_32F),
        ("float32", ComputeType.COMPUTE_32F),
        ("tensorfloat32", ComputeType.COMPUTE_32F_FAST_TF32),
        ("bfloat16", ComputeType.COMPUTE_32F_FAST_TF32),
        ("BF16_BF16_F32", ComputeType.COMPUTE_32F_FAST_16BF),
        ("F32_F32_F32", ComputeType.COMPUTE_32F),
    ],
)
def test_jax_precision_setting_gives_the_gpu_compute_type(setting, expected):
    with jax.default_matmul_precision(setting):
        assert convention_compute_type("float32") == expected
        assert convention_compute_type("complex64") == expected
        assert convention_compute_type("bfloat16") is None
        assert convention_compute_type("float64") is None
