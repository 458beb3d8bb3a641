"""The bad-input catalogue: each mistake raises a typed error from nvdispatch.errors naming the argument."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import Epilog, errors
from nvdispatch.executors.base import Executor

torch = pytest.importorskip("torch")

f32 = np.float32
A = np.ones((4, 3), f32)
B = np.ones((3, 5), f32)
BIAS = np.ones(5, f32)


class Declines(Executor):
    name = "always-declines"

    def decline(self, op, problem, *, coerce=False):
        return "it never runs anything"

    def strategies(self, op, problem):
        return ()

    def plan(self, op, problem, strategy, tuning=None):
        raise AssertionError


def _freed():
    mm = nvdispatch.Matmul(A, B)
    mm.free()
    return mm


CASES = [
    # (id, callable, error type, argument named in the message)
    ("inner dims", lambda: nvdispatch.matmul(A, np.ones((4, 5), f32)), errors.ShapeMismatchError, "b"),
    ("0-d a", lambda: nvdispatch.matmul(np.float32(1.0) * np.ones(()), B), errors.ShapeMismatchError, "a"),
    ("0-d b", lambda: nvdispatch.matmul(A, np.ones((), f32)), errors.ShapeMismatchError, "b"),
    ("1-d a, 0-d b", lambda: nvdispatch.matmul(np.ones(1), np.ones(())), errors.ShapeMismatchError, "b"),
    ("None a", lambda: nvdispatch.matmul(None, B), errors.UnsupportedOperandError, "a"),
    ("None b", lambda: nvdispatch.matmul(A, None), errors.UnsupportedOperandError, "b"),
    ("None bias", lambda: nvdispatch.matmul(A, B, epilog="BIAS", epilog_inputs={"bias": None}), errors.EpilogInputError, "bias"),
    ("None relu_aux", lambda: nvdispatch.matmul(A, B, epilog="DRELU", epilog_inputs={"relu_aux": None}), errors.EpilogInputError, "relu_aux"),
    ("Matmul None b", lambda: nvdispatch.Matmul(A, None), errors.UnsupportedOperandError, "b"),
    ("ragged list operand", lambda: nvdispatch.matmul([[1.0], [1.0, 2.0]], B), errors.UnsupportedOperandError, "a"),
    ("list of strings", lambda: nvdispatch.matmul([["x"]], B), errors.UnsupportedOperandError, "a"),
    ("string operand", lambda: nvdispatch.matmul(A, "b"), errors.UnsupportedOperandError, "b"),
    ("bool dtype", lambda: nvdispatch.matmul(A.astype(bool), B), errors.UnsupportedDtypeError, "a"),
    ("object dtype", lambda: nvdispatch.matmul(A, B.astype(object)), errors.UnsupportedDtypeError, "b"),
    ("batch mismatch", lambda: nvdispatch.matmul(np.ones((2, 4, 3)), np.ones((3, 3, 5))), errors.ShapeMismatchError, "b"),
    ("mixed frameworks", lambda: nvdispatch.matmul(A, torch.ones(3, 5)), errors.MixedOperandsError, "b"),
    ("mixed c framework", lambda: nvdispatch.matmul(A, B, torch.ones(4, 5)), errors.MixedOperandsError, "c"),
    ("mixed bias framework", lambda: nvdispatch.matmul(A, B, epilog="BIAS", epilog_inputs={"bias": torch.ones(5)}), errors.MixedOperandsError, "bias"),
    ("c shape", lambda: nvdispatch.matmul(A, B, np.ones((3, 5), f32)), errors.ShapeMismatchError, "c"),
    ("c widens dtype", lambda: nvdispatch.matmul(A, B, np.ones((4, 5), np.float64)), errors.UnsupportedDtypeError, "c"),
    ("beta without c", lambda: nvdispatch.matmul(A, B, beta=2.0), errors.InvalidArgumentError, "beta"),
    ("alpha not scalar", lambda: nvdispatch.matmul(A, B, alpha="2"), errors.InvalidArgumentError, "alpha"),
    ("alpha complex on real", lambda: nvdispatch.matmul(A, B, alpha=1j), errors.InvalidArgumentError, "alpha"),
    ("alpha fractional on int", lambda: nvdispatch.matmul(A.astype(np.int32), B.astype(np.int32), alpha=0.5), errors.InvalidArgumentError, "alpha"),
    ("unknown epilog", lambda: nvdispatch.matmul(A, B, epilog="SWISH"), errors.InvalidArgumentError, "epilog"),
    ("epilog wrong type", lambda: nvdispatch.matmul(A, B, epilog=3.5), errors.InvalidArgumentError, "epilog"),
    ("missing bias", lambda: nvdispatch.matmul(A, B, epilog=Epilog.RELU_BIAS), errors.EpilogInputError, "epilog_inputs"),
    ("extra input", lambda: nvdispatch.matmul(A, B, epilog=Epilog.RELU, epilog_inputs={"bias": BIAS}), errors.EpilogInputError, "epilog_inputs"),
    ("unknown input key", lambda: nvdispatch.matmul(A, B, epilog="BIAS", epilog_inputs={"biass": BIAS}), errors.EpilogInputError, "epilog_inputs"),
    ("inputs not a dict", lambda: nvdispatch.matmul(A, B, epilog="BIAS", epilog_inputs=[BIAS]), errors.EpilogInputError, "epilog_inputs"),
    ("bias wrong length", lambda: nvdispatch.matmul(A, B, epilog="BIAS", epilog_inputs={"bias": np.ones(4, f32)}), errors.EpilogInputError, "bias"),
    ("bias wrong 2-D shape", lambda: nvdispatch.matmul(A, B, epilog="BIAS", epilog_inputs={"bias": np.ones((4, 5), f32)}), errors.EpilogInputError, "bias"),
    ("bias wrong dtype", lambda: nvdispatch.matmul(A, B, epilog="BIAS", epilog_inputs={"bias": BIAS.astype(np.float64)}), errors.EpilogInputError, "bias"),
    ("bias batch mismatch", lambda: nvdispatch.matmul(np.ones((2, 4, 3), f32), B, epilog="BIAS", epilog_inputs={"bias": np.ones((3, 1, 5), f32)}), errors.EpilogInputError, "bias"),
    ("relu_aux wrong shape", lambda: nvdispatch.matmul(A, B, epilog="DRELU", epilog_inputs={"relu_aux": np.ones((4, 4), bool)}), errors.EpilogInputError, "relu_aux"),
    ("relu_aux wrong dtype", lambda: nvdispatch.matmul(A, B, epilog="DRELU", epilog_inputs={"relu_aux": np.ones((4, 5), f32)}), errors.EpilogInputError, "relu_aux"),
    ("gelu_aux wrong dtype", lambda: nvdispatch.matmul(A, B, epilog="DGELU", epilog_inputs={"gelu_aux": np.ones((4, 5))}), errors.EpilogInputError, "gelu_aux"),
    ("gelu on ints", lambda: nvdispatch.matmul(A.astype(np.int32), B.astype(np.int32), epilog="GELU"), errors.UnsupportedDtypeError, "epilog"),
    ("relu on complex", lambda: nvdispatch.matmul(A.astype(np.complex64), B.astype(np.complex64), epilog="RELU"), errors.UnsupportedDtypeError, "epilog"),
    ("bad options key", lambda: nvdispatch.matmul(A, B, options={"compute": 1}), errors.InvalidArgumentError, "options"),
    ("bad options type", lambda: nvdispatch.matmul(A, B, options=42), errors.InvalidArgumentError, "options"),
    ("bad compute type", lambda: nvdispatch.matmul(A, B, options={"compute_type": "COMPUTE_99"}), errors.InvalidArgumentError, "options.compute_type"),
    ("compute type for dtype", lambda: nvdispatch.matmul(A, B, options={"compute_type": nvdispatch.ComputeType.COMPUTE_64F}), errors.InvalidArgumentError, "options.compute_type"),
    ("bad bgrad axis", lambda: nvdispatch.matmul(A, B, options={"bgrad_axis": "k"}), errors.InvalidArgumentError, "options.bgrad_axis"),
    ("bad strategy", lambda: nvdispatch.matmul(A, B, epilog="RELU", preferences={"strategy": "magic"}), errors.InvalidArgumentError, "preferences.strategy"),
    ("strategy not offered", lambda: nvdispatch.matmul(A, B, preferences={"strategy": "native"}), errors.InvalidArgumentError, "preferences.strategy"),
    ("bfloat16 on numpy only", lambda: _only_numpy(lambda: nvdispatch.matmul(torch.ones(2, 2, dtype=torch.bfloat16), torch.ones(2, 2, dtype=torch.bfloat16))), errors.NoExecutorError, "backend"),
    ("unknown backend", lambda: nvdispatch.set_backend("tensorflow"), errors.UnknownBackendError, "backend"),
    ("backend wrong type", lambda: nvdispatch.set_backend(42), errors.UnknownBackendError, "backend"),
    ("only with declining backend", lambda: _only(Declines(), lambda: nvdispatch.matmul(A, B)), errors.NoExecutorError, "backend"),
    ("freed Matmul execute", lambda: _freed().execute(), errors.PlanStateError, "self"),
    ("freed Matmul plan", lambda: _freed().plan(), errors.PlanStateError, "self"),
    ("execute before plan", lambda: nvdispatch.Matmul(A, B).execute(), errors.PlanStateError, "self"),
    ("autotune before plan", lambda: nvdispatch.Matmul(A, B).autotune(), errors.PlanStateError, "self"),
    ("reset wrong shape", lambda: nvdispatch.Matmul(A, B).plan().reset_operands(a=np.ones((5, 3), f32)), errors.ShapeMismatchError, "a"),
    ("reset wrong dtype", lambda: nvdispatch.Matmul(A, B).plan().reset_operands(b=B.astype(np.float64)), errors.UnsupportedDtypeError, "b"),
    ("Matmul shape check at construction", lambda: nvdispatch.Matmul(A, A), errors.ShapeMismatchError, "b"),
    ("plan cache size", lambda: setattr(nvdispatch.plan_cache, "maxsize", -1), errors.InvalidArgumentError, "maxsize"),
]  # fmt: skip


def _only(backend, fn):
    with nvdispatch.set_backend(backend, only=True):
        return fn()


def _only_numpy(fn):
    with nvdispatch.set_backend("numpy", only=True):
        return fn()


def test_catalogue_is_large_enough():
    assert len(CASES) >= 30


@pytest.mark.parametrize("fn,error,argument", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_typed_error_naming_the_argument(fn, error, argument):
    with pytest.raises(error) as info:
        fn()
    assert isinstance(info.value, errors.NvdispatchError)
    assert argument in str(info.value), str(info.value)
    assert "expected" in str(info.value) and "got" in str(info.value)


def test_errors_are_also_builtin_exceptions():
    with pytest.raises(ValueError):
        nvdispatch.matmul(A, np.ones((4, 5), f32))
    with pytest.raises(TypeError):
        nvdispatch.matmul(A, torch.ones(3, 5))


def test_no_executor_error_lists_each_declining_executor():
    with pytest.raises(errors.NoExecutorError) as info:
        _only_numpy(lambda: nvdispatch.matmul(torch.ones(2, 2, dtype=torch.bfloat16), torch.ones(2, 2)))
    assert info.value.declined and info.value.declined[0][0] == "numpy"
    assert "numpy:" in str(info.value)


def test_no_partial_result_and_inputs_untouched_on_error():
    a = A.copy()
    with pytest.raises(errors.EpilogInputError):
        nvdispatch.matmul(a, B, epilog="BIAS", epilog_inputs={"bias": np.ones(4, f32)})
    np.testing.assert_array_equal(a, A)
