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
I64 = np.ones((3, 3), np.int64)


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
    ("datetime dtype", lambda: nvdispatch.matmul(np.zeros(A.shape, "M8[s]"), B), errors.UnsupportedDtypeError, "a"),
    ("bool product with an epilog", lambda: nvdispatch.matmul(A > 0, B > 0, epilog="RELU"), errors.UnsupportedDtypeError,
     "epilog"),
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
    # options and preferences by type (#27.1): a string, an int or a float is no bool, a float no int
    ("option bool as string", lambda: nvdispatch.matmul(A, B, options={"fast_accumulation": "no"}), errors.InvalidArgumentError, "options.fast_accumulation"),
    ("option bool as int", lambda: nvdispatch.matmul(A, B, options={"result_amax": 1}), errors.InvalidArgumentError, "options.result_amax"),
    ("compute type as float", lambda: nvdispatch.matmul(A, B, options={"compute_type": 68.0}), errors.InvalidArgumentError, "options.compute_type"),
    ("compute type as bool", lambda: nvdispatch.matmul(A, B, options={"compute_type": True}), errors.InvalidArgumentError, "options.compute_type"),
    ("bgrad axis as list", lambda: nvdispatch.matmul(A, B, options={"bgrad_axis": ["n"]}), errors.InvalidArgumentError, "options.bgrad_axis"),
    ("scale type as number", lambda: nvdispatch.matmul(A, B, options={"scale_type": 1.0}), errors.InvalidArgumentError, "options.scale_type"),
    ("options keys not strings", lambda: nvdispatch.matmul(A, B, options={1: 2, "x": 3}), errors.InvalidArgumentError, "options"),
    ("MatmulOptions bool as string", lambda: nvdispatch.MatmulOptions(result_amax="yes"), errors.InvalidArgumentError, "options.result_amax"),
    ("limit as float", lambda: nvdispatch.matmul(A, B, preferences={"limit": 2.0}), errors.InvalidArgumentError, "preferences.limit"),
    ("limit as bool", lambda: nvdispatch.matmul(A, B, preferences={"limit": True}), errors.InvalidArgumentError, "preferences.limit"),
    ("workspace as bool", lambda: nvdispatch.matmul(A, B, preferences={"max_workspace_bytes": True}), errors.InvalidArgumentError, "preferences.max_workspace_bytes"),
    ("strategy as list", lambda: nvdispatch.matmul(A, B, epilog="RELU", preferences={"strategy": ["plain"]}), errors.InvalidArgumentError, "preferences.strategy"),
    ("Matmul.plan preferences", lambda: nvdispatch.Matmul(A, B).plan(preferences={"limit": "8"}), errors.InvalidArgumentError, "preferences.limit"),
    ("explain options", lambda: nvdispatch.explain(A, B, options={"fast_accumulation": "no"}), errors.InvalidArgumentError, "options.fast_accumulation"),
    ("coerce as string", lambda: nvdispatch.set_backend("numpy", coerce="no"), errors.InvalidArgumentError, "coerce"),
    ("only as int", lambda: nvdispatch.set_backend("numpy", only=1), errors.InvalidArgumentError, "only"),
    ("try_last as string", lambda: nvdispatch.set_global_backend("numpy", try_last="yes"), errors.InvalidArgumentError, "try_last"),
    # scalars the result cannot hold (#27.7)
    ("alpha beyond int64", lambda: nvdispatch.matmul(I64, I64, alpha=2**70), errors.InvalidArgumentError, "alpha"),
    ("beta beyond int64", lambda: nvdispatch.matmul(I64, I64, I64, beta=2**70), errors.InvalidArgumentError, "beta"),
    ("alpha beyond int32", lambda: nvdispatch.matmul(I64.astype(np.int32), I64.astype(np.int32), alpha=2**40), errors.InvalidArgumentError, "alpha"),
    ("alpha negative on uint8", lambda: nvdispatch.matmul(I64.astype(np.uint8), I64.astype(np.uint8), alpha=-1), errors.InvalidArgumentError, "alpha"),
    ("alpha beyond float", lambda: nvdispatch.matmul(A, B, alpha=2**1100), errors.InvalidArgumentError, "alpha"),
    ("alpha beyond int64, torch", lambda: nvdispatch.matmul(torch.from_numpy(I64), torch.from_numpy(I64), alpha=2**70), errors.InvalidArgumentError, "alpha"),
    ("Matmul alpha beyond int64", lambda: nvdispatch.Matmul(I64, I64, alpha=2**70), errors.InvalidArgumentError, "alpha"),
    ("reset alpha beyond int64", lambda: nvdispatch.Matmul(I64, I64).plan().reset_operands(alpha=2**70), errors.InvalidArgumentError, "alpha"),
    # operands and results no memory can hold (#27.7)
    ("broadcast rows beyond memory", lambda: nvdispatch.matmul(np.broadcast_to(np.int8(1), (2**62, 1)), np.ones((1, 4), np.int8)), errors.OutOfMemoryError, "a of shape"),
    ("broadcast batch beyond memory", lambda: nvdispatch.matmul(*_huge_batch(np)), errors.OutOfMemoryError, "b of shape"),
    ("explain beyond memory", lambda: nvdispatch.explain(np.broadcast_to(np.int8(1), (2**62, 1)), np.ones((1, 4), np.int8)), errors.OutOfMemoryError, "a of shape"),
    ("torch expand beyond address space", lambda: nvdispatch.matmul(torch.ones(1, 1, dtype=torch.float64).expand(2**62, 1), torch.ones(1, 1, dtype=torch.float64)), errors.ShapeMismatchError, "a"),
    ("torch expand b beyond address space", lambda: nvdispatch.matmul(torch.ones(2, 1), torch.ones(1, 1).expand(1, 2**62)), errors.ShapeMismatchError, "b"),
    ("torch Matmul expand", lambda: nvdispatch.Matmul(torch.ones(1, 1).expand(2**62, 1), torch.ones(1, 1)), errors.ShapeMismatchError, "a"),
    ("torch batch beyond memory", lambda: nvdispatch.matmul(*_huge_batch(torch)), errors.OutOfMemoryError, "a of shape"),
    ("c beside a result beyond memory", lambda: nvdispatch.matmul(*_huge_batch(np), np.ones((2, 2)), beta=1.0), errors.OutOfMemoryError, "memory"),
    ("Dask of Torch chunks", lambda: nvdispatch.matmul(_dask_of_torch(), _dask_of_torch()), errors.UnsupportedOperandError, "a"),
]  # fmt: skip


def _huge_batch(xp):
    """Operands of 4 elements whose broadcast batch is 2**62 matrices."""
    if xp is torch:
        one = torch.ones(1, 1, 2, 2, dtype=torch.float64)
        return one.expand(2**31, 1, 2, 2), one.expand(1, 2**31, 2, 2)
    one = np.ones((1, 1, 2, 2))
    return np.broadcast_to(one, (2**31, 1, 2, 2)), np.broadcast_to(one, (1, 2**31, 2, 2))


def _dask_of_torch():
    da = pytest.importorskip("dask.array")
    return da.from_array(np.ones((4, 4)), chunks=2).map_blocks(torch.from_numpy)


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


def test_a_cached_call_does_not_let_an_equal_but_invalid_option_or_scalar_through():
    """The call-key memo must not serve a call whose options or scalars compare equal to a cached call's but
    would not validate (0 == False, 70 == 70.0; alpha 2 and 2**70 are both ints)."""
    a = np.ones((3, 3))
    for good, bad in [
        ({"fast_accumulation": False}, {"fast_accumulation": 0}),
        ({"result_amax": False}, {"result_amax": 0.0}),
        ({"compute_type": 70}, {"compute_type": 70.0}),
    ]:
        for _ in range(3):
            np.testing.assert_allclose(nvdispatch.matmul(a, a, options=good), a @ a)
        with pytest.raises(errors.InvalidArgumentError, match="options"):
            nvdispatch.matmul(a, a, options=bad)
    for _ in range(3):
        np.testing.assert_array_equal(nvdispatch.matmul(I64, I64, alpha=2), 2 * (I64 @ I64))
        np.testing.assert_array_equal(nvdispatch.matmul(I64, I64, epilog="BIAS", epilog_inputs={"bias": I64[0]}, alpha=2), 2 * (I64 @ I64) + 1)
    with pytest.raises(errors.InvalidArgumentError, match="alpha"):
        nvdispatch.matmul(I64, I64, alpha=2**70)
    with pytest.raises(errors.InvalidArgumentError, match="alpha"):
        nvdispatch.matmul(I64, I64, epilog="BIAS", epilog_inputs={"bias": I64[0]}, alpha=2**70)
    np.testing.assert_array_equal(nvdispatch.matmul(I64, I64, alpha=2**40), 2**40 * (I64 @ I64))  # keyed anew
    with pytest.raises(errors.InvalidArgumentError, match="alpha"):  # an np.int64 scalar on an int32 result
        nvdispatch.matmul(I64.astype(np.int32), I64.astype(np.int32), alpha=np.int64(2**40))


def test_options_given_as_numpy_scalars_or_mappings_are_taken():
    import types

    opts = nvdispatch.MatmulOptions(result_amax=np.False_, compute_type=np.int64(70))
    assert opts.result_amax is False and opts.compute_type is nvdispatch.ComputeType.COMPUTE_64F
    assert nvdispatch.MatmulPlanPreferences(limit=np.int64(3)).limit == 3
    got = nvdispatch.matmul(A, B, options=types.MappingProxyType({"bgrad_axis": "n"}))
    np.testing.assert_allclose(got, A @ B)
