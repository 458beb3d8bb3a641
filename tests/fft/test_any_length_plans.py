"""The plan kept for every length of a 1-D NumPy transform (its any-length key): which calls keep and run it, which
take the full route, and that every length it runs gives NumPy's float64 result."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import scipy.fft

import nvdispatch
import nvdispatch.fft as F
from nvdispatch import plan_cache
from nvdispatch._adapters.numpy import NumpyAdapter
from nvdispatch._call_key import any_length_key, class_keys, fft_form
from nvdispatch.errors import AxisError, InvalidArgumentError, ShapeMismatchError
from nvdispatch.executors.base import Executor
from nvdispatch.executors.numpy_fft import NumpyAnyLengthFFTPlan
from nvdispatch.fft import _route

rng = np.random.default_rng(7)
REAL_FUNCS = ("rfft", "ihfft", "rfftn")
COMPLEX_FUNCS = ("fft", "ifft", "irfft", "hfft", "fftn", "ifftn", "irfftn")


@pytest.fixture(autouse=True)
def fresh_cache():
    plan_cache.clear()
    plan_cache.clear_tunings()  # (a test elsewhere may have autotuned: the plan counts here assume none known)
    yield
    plan_cache.clear()
    plan_cache.clear_tunings()


@pytest.fixture
def full_paths(monkeypatch):
    """How many calls took the route's full path (their own key and the any-length key found nothing)."""
    count = [0]
    real = _route.run_stateless

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(_route, "run_stateless", counted)
    return count


def _operand(func: str, dtype, n: int) -> np.ndarray:
    x = rng.standard_normal(n)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(n)
    return x.astype(dtype)


def _oracle(func: str, x: np.ndarray, norm: str) -> np.ndarray:
    wide = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)
    return getattr(np.fft, func)(wide, norm=norm)


def _any_length_plans() -> list:
    return [p for p in plan_cache.plans() if isinstance(p, NumpyAnyLengthFFTPlan)]


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize(
    ("func", "dtype"),
    [(f, d) for f in REAL_FUNCS for d in (np.float32, np.float64)]
    + [(f, d) for f in COMPLEX_FUNCS for d in (np.complex64, np.complex128)],
)
def test_every_length_gives_numpys_result_and_one_full_path(func, dtype, norm, full_paths):
    lengths = (16, 17, 2, 3, 1000, 1001, 97, 128)
    for n in lengths:
        x = _operand(func, dtype, n)
        y = getattr(F, func)(x, norm=norm)
        want = _oracle(func, x, norm)
        assert y.shape == want.shape
        real_out = func in ("irfft", "hfft", "irfftn")
        single = np.dtype(dtype) in (np.dtype(np.float32), np.dtype(np.complex64))
        assert y.dtype == (np.float32 if single else np.float64) if real_out else y.dtype.kind == "c"
        np.testing.assert_allclose(y, want, rtol=2e-4 if single else 1e-10, atol=(2e-4 if single else 1e-10) * n)
    assert full_paths[0] == 1  # the first length; every other ran the plan kept for every length
    assert len(_any_length_plans()) == 1


@pytest.mark.parametrize("view", [lambda x: x[::2], lambda x: x[::-1], lambda x: x[1:]])
def test_views_and_byte_orders_of_one_rank_share_it(view, full_paths):
    F.rfft(rng.standard_normal(33))
    for n in (40, 41, 77):
        x = view(rng.standard_normal(n))
        np.testing.assert_allclose(F.rfft(x), np.fft.rfft(x), atol=1e-10 * n)
    assert full_paths[0] == 1
    swapped = rng.standard_normal(50).astype(">f8")  # another dtype: another key, its own first call
    np.testing.assert_allclose(F.rfft(swapped), np.fft.rfft(swapped.astype(np.float64)), atol=1e-10 * 50)
    assert full_paths[0] == 2


def test_extents_below_two_take_the_full_path_and_its_errors(full_paths):
    F.irfft(_operand("irfft", np.complex128, 9))
    F.rfft(rng.standard_normal(9))
    with pytest.raises(InvalidArgumentError, match="n"):  # irfft's default length 2*(1-1) is not positive
        F.irfft(np.ones(1, np.complex128))
    with pytest.raises(ShapeMismatchError):
        F.rfft(np.ones(0))
    np.testing.assert_allclose(F.rfft(np.array([3.0])), np.fft.rfft(np.array([3.0])))
    assert full_paths[0] == 5


@pytest.mark.parametrize("norm", ["backward", "ortho"])
@pytest.mark.parametrize(
    ("func", "dtype"),
    [(f, d) for f in REAL_FUNCS for d in (np.float32, np.float64)]
    + [(f, d) for f in COMPLEX_FUNCS for d in (np.complex64, np.complex128)],
)
def test_a_given_length_is_the_plans_for_every_extent(func, dtype, norm, full_paths):
    nd = func.endswith("n")
    for size in (16, 31):
        for extent in (16, 9, 31, 40, 17, 2):  # padded, trimmed, or neither
            x = _operand(func, dtype, extent)
            if nd:
                y, want = getattr(F, func)(x, s=(size,), axes=(0,), norm=norm), getattr(np.fft, func)
                want = want(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64), s=(size,), axes=(0,),
                            norm=norm)
            else:
                y = getattr(F, func)(x, size, norm=norm)
                want = getattr(np.fft, func)(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64), size,
                                             norm=norm)
            single = np.dtype(dtype) in (np.dtype(np.float32), np.dtype(np.complex64))
            assert y.shape == want.shape
            np.testing.assert_allclose(y, want, rtol=2e-4 if single else 1e-10, atol=(2e-4 if single else 1e-10) * 40)
    assert full_paths[0] == 2  # one per given length
    assert len(_any_length_plans()) == 2


def test_batches_zero_d_and_s_keeping_an_extent_keep_no_any_length_plan(full_paths):
    for n in (8, 20, 31):  # through the scipy.fft backend, s's -1 reaches the route as it is
        y = rng.standard_normal(n)
        with scipy.fft.set_backend(F, only=True):
            got = scipy.fft.rfftn(y, s=(-1,), axes=(0,))
        np.testing.assert_allclose(got, np.fft.rfftn(y, axes=(0,)), atol=1e-10 * n)
    for rows, n in ((2, 8), (3, 9), (2, 10)):
        b = rng.standard_normal((rows, n))
        np.testing.assert_allclose(F.rfft(b), np.fft.rfft(b), atol=1e-10 * n)
        np.testing.assert_allclose(F.rfft(b, n=12), np.fft.rfft(b, n=12), atol=1e-10 * n)
    with pytest.raises(AxisError):  # a 0-d input has no axis to transform (numpy.fft: an IndexError)
        F.rfft(np.float64(3.0).reshape(()))
    assert _any_length_plans() == []
    assert full_paths[0] == 10



def test_the_key_is_the_form_dtype_and_rank():
    x = rng.standard_normal(12)
    F.fft(x, norm="ortho")
    form = fft_form("fft", x, None, -1, None, None, "ortho")
    key = any_length_key(form, class_keys(np.ndarray).rank_signature(x))
    assert key[2] == (np.dtype(np.float64), 1)
    assert isinstance(plan_cache.peek(key), NumpyAnyLengthFFTPlan)
    assert plan_cache.peek(any_length_key(fft_form("fft", x, None, -1, None, None, "forward"), key[2])) is None
    assert not plan_cache.contains(any_length_key(form, (np.dtype(np.float32), 1)))
    assert plan_cache.peek(key) is not None and plan_cache.peek((form, "no such key")) is None


def test_only_plain_ndarrays_have_a_rank_signature():
    ad = NumpyAdapter()
    assert ad.rank_signature_for(np.ndarray)(np.ones((2, 3), np.float32)) == (np.dtype(np.float32), 2)
    assert ad.rank_signature_for(np.matrix) is None and ad.rank_signature_for(np.memmap) is None


def test_clear_drops_it_and_explain_says_which_plan_a_call_runs(full_paths):
    F.irfft(_operand("irfft", np.complex128, 9))
    e = nvdispatch.explain(F.irfft, _operand("irfft", np.complex128, 40))
    assert e.cached and any("every extent" in step for step in e.steps)
    e = nvdispatch.explain(F.irfft, _operand("irfft", np.complex128, 40), n=12)  # a given n: its own plan
    assert not e.cached and not any("every extent" in step for step in e.steps)
    plan_cache.clear()
    F.irfft(_operand("irfft", np.complex128, 41))
    assert full_paths[0] == 2


def test_the_debug_log_names_the_key(caplog):
    F.rfft(rng.standard_normal(30))
    with caplog.at_level(logging.DEBUG, logger="nvdispatch"):
        F.rfft(rng.standard_normal(31))
    assert "plan cache hit (any-length key): plan NumpyAnyLengthFFTPlan" in caplog.text


def test_none_kept_while_a_tuning_is_known(full_paths):
    plan_cache.record_tuning(("choice", "fft", "someone", "something"), {"strategy": "x"})
    F.rfft(rng.standard_normal(30))
    F.rfft(rng.standard_normal(31))
    assert _any_length_plans() == [] and full_paths[0] == 2


def test_a_tuned_choice_of_another_operation_keeps_it():
    """A GEMM's autotuned choice (recorded, or loaded from a tunings file) concerns no transform: rfft still keeps
    its plan for every length."""
    a, b = rng.standard_normal((64, 32)), rng.standard_normal((32, 16))
    mm = nvdispatch.Matmul(a, b)
    mm.plan()
    mm.autotune()
    assert plan_cache.has_tunings() and plan_cache.has_tunings("matmul") and not plan_cache.has_tunings("fft")
    x = rng.standard_normal(30)
    np.testing.assert_allclose(F.rfft(x), np.fft.rfft(x), atol=1e-10 * 30)
    assert len(_any_length_plans()) == 1
    plan_cache.record_tuning(("fft", "someone", "something", "else"), {"strategy": "x"})  # a plan key's form
    assert plan_cache.has_tunings("fft")


class _ShortOnly(Executor):
    """Takes transforms of at most 8 points (NumPy's own result), declines longer ones."""

    name = "short-only-fft"

    def __init__(self):
        self.ran = []

    def decline(self, op, problem, *, coerce=False):
        return None if op == "fft" and problem.shape[-1] <= 8 else "at most 8 points"

    def strategies(self, op, problem):
        return ("plain",)

    def plan(self, op, problem, strategy, tuning=None):
        ran = self.ran

        class Plan:
            steps = ("np.fft",)

            def execute(self, operands, stream=None):
                ran.append(problem.shape)
                return getattr(np.fft, problem.func)(operands["x"]).astype(problem.result_dtype)

        Plan.strategy = strategy
        return Plan()


def test_an_executor_asked_first_that_declines_a_length_still_gets_the_others():
    ex = _ShortOnly()
    with nvdispatch.set_backend(ex):
        np.testing.assert_allclose(F.rfft(np.arange(16.0)), np.fft.rfft(np.arange(16.0)))  # declined: NumPy's
        np.testing.assert_allclose(F.rfft(np.arange(4.0)), np.fft.rfft(np.arange(4.0)))  # taken
        np.testing.assert_allclose(F.rfft(np.arange(6.0)), np.fft.rfft(np.arange(6.0)))
    assert ex.ran == [(4,), (6,)]
    assert _any_length_plans() == []


@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize(("func", "dtype"), [("rfft", np.float32), ("irfft", np.complex128), ("fft", np.complex64)])
def test_numpy_fft_strategy_serves_every_extent_too(func, dtype, given):
    """Without SciPy the plan calls numpy.fft (and casts back to the problem's dtype)."""
    x0 = _operand(func, dtype, 12)
    getattr(F, func)(x0, 12) if given else getattr(F, func)(x0)
    (kept,) = _any_length_plans()
    plan = NumpyAnyLengthFFTPlan(kept.problem, "numpy", given)
    for extent in (5, 12, 33):
        x = _operand(func, dtype, extent)
        wide = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)
        want = getattr(np.fft, func)(wide, 12) if given else getattr(np.fft, func)(wide)
        y = plan.direct(x)
        assert y.dtype == np.dtype(kept.problem.result_dtype) and y.shape == want.shape
        np.testing.assert_allclose(y, want, rtol=2e-4, atol=2e-4 * extent)
    assert any("numpy.fft" in step for step in plan.steps)


def test_through_the_scipy_backend_new_lengths_run_it(full_paths):
    with scipy.fft.set_backend(F, only=True):
        for n in (30, 31, 64, 65):
            x = rng.standard_normal(n)
            np.testing.assert_allclose(scipy.fft.rfft(x), np.fft.rfft(x), atol=1e-10 * n)
            spectrum = np.fft.rfft(x)  # of 16 or 33 points: padded or trimmed to irfft's 64
            np.testing.assert_allclose(scipy.fft.irfft(spectrum, 64), np.fft.irfft(spectrum, 64), atol=1e-10 * n)
    assert full_paths[0] == 2  # rfft's first length, irfft(., 64)'s first extent
