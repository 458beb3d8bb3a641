"""The user-executor contract: the core applies epilogs an executor does not fuse, and every breach of the
protocol (a wrong result, no plan, no strategies, a decline without coerce) is an ExecutorContractError
naming the executor."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import Epilog, errors
from nvdispatch.executors.base import Executor

rng = np.random.default_rng(0)
A = rng.standard_normal((5, 4))
B = rng.standard_normal((4, 3))
BIAS = rng.standard_normal(3)


class _ProductPlan:
    """alpha * a @ b + beta * c and nothing else (whatever the epilog)."""

    strategy = "plain"
    steps = ("np.matmul",)

    def __init__(self, problem, result=None):
        self.problem, self.result = problem, result

    def execute(self, operands, stream=None):
        if self.result is not None:
            return self.result(operands)
        d = operands["alpha"] * np.matmul(operands["a"], operands["b"])
        if operands.get("c") is not None:
            d = d + (1 if operands["beta"] is None else operands["beta"]) * operands["c"]
        return d.astype(self.problem.result_dtype)


class ProductOnly(Executor):
    """Computes the product only; declares no fused epilogs, so the core applies them."""

    name = "product-only"
    made = 0

    def __init__(self, result=None, fused=frozenset(), strategies=("plain",), plan=None):
        self._result, self.fused_epilogs, self._strategies, self._plan = result, fused, strategies, plan
        ProductOnly.made += 1  # plans are cached per executor name: one name per test executor
        self.name = f"{type(self).name}-{ProductOnly.made}"

    def decline(self, op, problem, *, coerce=False):
        return None if op == "matmul" else "matmul only"

    def strategies(self, op, problem):
        return self._strategies

    def plan(self, op, problem, strategy, tuning=None):
        return self._plan if self._plan is not None else _ProductPlan(problem, self._result)


def _with(executor, fn):
    with nvdispatch.set_backend(executor, only=True):
        return fn()


def test_core_applies_an_epilog_the_executor_does_not_fuse():
    y = _with(ProductOnly(), lambda: nvdispatch.matmul(A, B, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": BIAS}))
    np.testing.assert_allclose(y, np.maximum(A @ B + BIAS, 0))
    e = _with(ProductOnly(), lambda: nvdispatch.explain(A, B, epilog="RELU_BIAS", epilog_inputs={"bias": BIAS}))
    assert e.executor.startswith("product-only") and any("applied by nvdispatch" in s for s in e.steps)


def test_core_epilog_with_outputs_and_backward():
    ex = ProductOnly()
    y, aux = _with(ex, lambda: nvdispatch.matmul(A, B, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": BIAS}))
    z = A @ B + BIAS
    np.testing.assert_allclose(y, np.maximum(z, 0))
    np.testing.assert_array_equal(aux["relu_aux"], z > 0)
    dy = rng.standard_normal((5, 3))
    w = rng.standard_normal((3, 3))
    dz, g = _with(ex, lambda: nvdispatch.matmul(dy, w, epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": aux["relu_aux"]}))
    np.testing.assert_allclose(dz, (dy @ w) * (z > 0))
    np.testing.assert_allclose(g["drelu_bgrad"], ((dy @ w) * (z > 0)).sum(0))
    dw, gb = _with(ex, lambda: nvdispatch.matmul(A.T, dy, epilog="BGRADB"))
    np.testing.assert_allclose(dw, A.T @ dy)
    np.testing.assert_allclose(gb["bgradb"], dy.sum(0))


def test_core_epilog_with_vector_operand_and_alpha_c():
    v = rng.standard_normal(4)
    c = rng.standard_normal(3)
    y = _with(ProductOnly(), lambda: nvdispatch.matmul(v, B, c, alpha=2.0, beta=0.5, epilog="GELU_BIAS", epilog_inputs={"bias": BIAS}))
    pre = 2.0 * (v @ B) + 0.5 * c + BIAS
    want = 0.5 * pre * (1 + np.tanh(np.sqrt(2 / np.pi) * (pre + 0.044715 * pre**3)))
    np.testing.assert_allclose(y, want, rtol=1e-12)


def test_core_epilog_on_torch_operands():
    torch = pytest.importorskip("torch")

    class TorchProduct(ProductOnly):
        name = "torch-product"

        def plan(self, op, problem, strategy, tuning=None):
            return _ProductPlan(problem, lambda ops: torch.matmul(ops["a"], ops["b"]))

    a, b, bias = (torch.from_numpy(x) for x in (A, B, BIAS))
    y = _with(TorchProduct(), lambda: nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}))
    assert isinstance(y, torch.Tensor)
    np.testing.assert_allclose(y.numpy(), np.maximum(A @ B + BIAS, 0))


def _contract_error(executor, **kwargs):
    with pytest.raises(errors.ExecutorContractError) as info:
        _with(executor, lambda: nvdispatch.matmul(A, B, **kwargs))
    assert repr(executor.name) in str(info.value)
    assert isinstance(info.value, errors.NvdispatchError)
    return info.value


@pytest.mark.parametrize(
    "result, expected",
    [
        (lambda ops: np.ones((5, 4)), "shape (5, 3)"),
        (lambda ops: np.ones((5, 3), np.float32), "dtype float64"),
        (lambda ops: "not an array", "an array nvdispatch recognises"),
        (lambda ops: None, "an array nvdispatch recognises"),
    ],
    ids=["shape", "dtype", "string", "None"],
)
def test_wrong_result_is_a_contract_error(result, expected):
    err = _contract_error(ProductOnly(result=result))
    assert "plan.execute()" in err.argument and expected in err.expected


def test_claimed_epilog_with_outputs_must_return_result_and_aux():
    ex = ProductOnly(fused=frozenset({"RELU_AUX_BIAS"}), result=lambda ops: np.zeros((5, 3)))
    err = _contract_error(ex, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": BIAS})
    assert "(result, aux)" in err.expected
    ex = ProductOnly(fused=frozenset({"RELU_AUX_BIAS"}), result=lambda ops: (np.zeros((5, 3)), {"mask": np.ones(1)}))
    err = _contract_error(ex, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": BIAS})
    assert "aux keys ['relu_aux']" in err.expected


def test_plan_that_is_no_plan():
    ex = ProductOnly()
    ex.plan = lambda op, problem, strategy, tuning=None: None
    err = _contract_error(ex)
    assert "plan()" in err.argument and "execute" in err.expected


@pytest.mark.parametrize("got", [(), [], None, ("plain", 3)])
def test_strategies_must_name_at_least_one(got):
    err = _contract_error(ProductOnly(strategies=got))
    assert "strategies()" in err.argument


def test_decline_without_coerce_keyword():
    class OldStyle(ProductOnly):
        name = "old-style"

        def decline(self, op, problem):  # no coerce
            return None

    err = _contract_error(OldStyle())
    assert "decline()" in err.argument and "coerce" in err.expected


def test_decline_must_return_a_reason_or_none():
    class Boolean(ProductOnly):
        name = "boolean"

        def decline(self, op, problem, *, coerce=False):
            return False

    assert "decline()" in _contract_error(Boolean()).argument


def test_built_in_executors_are_not_wrapped():
    from nvdispatch._executor_contract import CheckedPlan, trusted
    from nvdispatch._route import get_plan, select

    e = nvdispatch.explain(A, B)
    assert e.executor == "numpy" and trusted(nvdispatch.executors.builtin("numpy"))
    problem = e.problem
    assert not isinstance(get_plan(select("matmul", problem).executor, "matmul", problem, e.strategy), CheckedPlan)


def test_unregister_backend():
    ex = ProductOnly()
    nvdispatch.register_backend(ex)
    try:
        assert nvdispatch.explain(A, B).executor == ex.name
    finally:
        nvdispatch.unregister_backend(ex.name)
    assert nvdispatch.explain(A, B).executor == "numpy"
    with pytest.raises(errors.UnknownBackendError) as info:
        nvdispatch.unregister_backend(ex)
    assert info.value.argument == "backend" and isinstance(info.value, ValueError)
    nvdispatch.register_backend(ex)
    nvdispatch.unregister_backend(ex)  # by object
    assert nvdispatch.explain(A, B).executor == "numpy"


def test_two_executors_with_one_name_do_not_share_plans():
    first = ProductOnly(result=lambda ops: np.zeros((5, 3)))
    second = ProductOnly()
    second.name = first.name
    assert not _with(first, lambda: nvdispatch.matmul(A, B)).any()
    np.testing.assert_allclose(_with(second, lambda: nvdispatch.matmul(A, B)), A @ B)
