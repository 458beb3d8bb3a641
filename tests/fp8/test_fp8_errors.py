"""Typed errors for bad FP8 calls: scales (shape, dtype, zero, device), types, options, executors."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors

torch = pytest.importorskip("torch")

A = torch.ones(16, 32).to(torch.float8_e4m3fn)
B = torch.ones(32, 16).to(torch.float8_e4m3fn)
B5 = torch.ones(32, 16).to(torch.float8_e5m2)
A5 = torch.ones(16, 32).to(torch.float8_e5m2)

CASES = [
    ("scale of shape (2,)", dict(quantization_scales={"a": torch.ones(2)}), errors.ShapeMismatchError, "['a']"),
    (
        "float64 scale",
        dict(quantization_scales={"b": torch.ones((), dtype=torch.float64)}),
        errors.UnsupportedDtypeError,
        "['b']",
    ),
    ("zero scale", dict(quantization_scales={"a": 0.0}), errors.InvalidArgumentError, "non-zero"),
    ("zero tensor scale", dict(quantization_scales={"a": torch.zeros(1)}), errors.InvalidArgumentError, "non-zero"),
    ("nan scale", dict(quantization_scales={"b": float("nan")}), errors.InvalidArgumentError, "finite"),
    ("bool scale", dict(quantization_scales={"a": True}), errors.InvalidArgumentError, "['a']"),
    (
        "numpy scale for torch operands",
        dict(quantization_scales={"a": np.ones(1, np.float32)}),
        errors.MixedOperandsError,
        "torch",
    ),
    ("unknown key", dict(quantization_scales={"e": 1.0}), errors.InvalidArgumentError, "unknown"),
    ("not a dict", dict(quantization_scales=[1.0]), errors.InvalidArgumentError, "quantization_scales"),
    (
        "d scale, bf16 result",
        dict(quantization_scales={"d": 2.0}, options={"result_type": "bfloat16"}),
        errors.InvalidArgumentError,
        "['d']",
    ),
    ("c scale without c", dict(quantization_scales={"c": 2.0}), errors.InvalidArgumentError, "['c']"),
    (
        "amax, bf16 result",
        dict(options={"result_type": "bfloat16", "result_amax": True}),
        errors.InvalidArgumentError,
        "result_amax",
    ),
    ("amax not a bool", dict(options={"result_amax": 1}), errors.InvalidArgumentError, "result_amax"),
    ("bad result type", dict(options={"result_type": "int8"}), errors.InvalidArgumentError, "result_type"),
    (
        "fast_accumulation not a bool",
        dict(options={"fast_accumulation": "yes"}),
        errors.InvalidArgumentError,
        "fast_accumulation",
    ),
    (
        "e5m2 result of e4m3 operands",
        dict(options={"result_type": "float8_e5m2"}),
        errors.UnsupportedDtypeError,
        "result_type",
    ),
    ("fp32 bias", dict(epilog="BIAS", epilog_inputs={"bias": torch.ones(16)}), errors.EpilogInputError, "bias"),
    (
        "backward epilog",
        dict(epilog="DRELU", epilog_inputs={"relu_aux": torch.ones(16, 16, dtype=torch.bool)}),
        errors.UnsupportedDtypeError,
        "epilog",
    ),
    (
        "compute type",
        dict(options={"compute_type": "COMPUTE_32F_FAST_TF32"}),
        errors.InvalidArgumentError,
        "compute_type",
    ),
    ("bad operand_types", dict(options={"operand_types": {"a": "int8"}}), errors.InvalidArgumentError, "operand_types"),
]


@pytest.mark.parametrize("what,kwargs,exc,needle", CASES, ids=[c[0] for c in CASES])
def test_bad_fp8_calls(what, kwargs, exc, needle):
    with pytest.raises(exc, match=None) as info:
        nvdispatch.matmul(A, B, **kwargs)
    assert needle in str(info.value), str(info.value)


def test_bad_operand_types():
    with pytest.raises(errors.UnsupportedDtypeError, match="e5m2 x e5m2|float8_e4m3fn when a"):
        nvdispatch.matmul(A5, B5)
    with pytest.raises(errors.UnsupportedDtypeError, match="FP8 dtype like a"):
        nvdispatch.matmul(A, torch.ones(32, 16, dtype=torch.bfloat16))
    with pytest.raises(errors.UnsupportedDtypeError, match="FP8 operands"):
        nvdispatch.matmul(torch.ones(4, 4), torch.ones(4, 4), quantization_scales={"a": 2.0})
    with pytest.raises(errors.UnsupportedDtypeError, match="FP8 operands"):
        nvdispatch.matmul(torch.ones(4, 4), torch.ones(4, 4), options={"result_type": "float32"})
    with pytest.raises(errors.UnsupportedDtypeError, match="uint8 storage"):
        nvdispatch.matmul(A.float(), B, options={"operand_types": {"a": "float8_e4m3fn"}})
    with pytest.raises(errors.UnsupportedDtypeError, match="'c'|c:"):
        nvdispatch.matmul(A, B, torch.ones(16, 16), options={"result_type": "float8_e4m3fn"})


def test_fp8_operands_on_executors_that_cannot_take_them():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.ones((4, 4), ml_dtypes.float8_e4m3fn)
    with pytest.raises(errors.NoExecutorError, match="NumPy has no FP8"):
        nvdispatch.matmul(a, a)
    with nvdispatch.set_backend("numpy", coerce=True, only=True), pytest.raises(errors.NoExecutorError, match="FP8"):
        nvdispatch.matmul(A, B)


def test_a_failed_call_changes_nothing():
    a0 = A.clone()
    with pytest.raises(errors.InvalidArgumentError):
        nvdispatch.matmul(A, B, quantization_scales={"a": 0.0})
    assert torch.equal(A.view(torch.uint8), a0.view(torch.uint8))
    mm = nvdispatch.Matmul(A, B, quantization_scales={"a": 2.0})
    with pytest.raises(errors.InvalidArgumentError):
        mm.reset_operands(quantization_scales={"a": 0.0})
    assert mm._scales == {"a": 2.0}


def test_fast_accumulation_is_for_fp8_operands_only():
    x = torch.ones(8, 8)
    with pytest.raises(errors.UnsupportedDtypeError) as info:
        nvdispatch.matmul(x, x, options={"fast_accumulation": True})
    assert "fast_accumulation" in str(info.value) and "FP8" in str(info.value)
    nvdispatch.matmul(x, x, options={"fast_accumulation": False})  # the default is no FP8 request
