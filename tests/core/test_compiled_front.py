"""``matmul``'s memo hit compiled (src/nvdispatch/_hotpath.c): built where a C compiler is, serving repeated calls
exactly as the Python route (``linalg._route``) does, and handing every other call to it. Each test runs on both
fronts where the extension is built (the Python route alone is what an install without a compiler runs)."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors, linalg
from nvdispatch._adapters import call_key_classes
from nvdispatch.executors.base import Executor

torch = pytest.importorskip("torch")

COMPILED = linalg._front is not linalg._route
#: every test on both fronts (the root conftest's fixture)
pytestmark = pytest.mark.usefixtures("matmul_front")


def _relu_bias(a, b, bias):
    return np.maximum(a.detach().numpy() @ b.detach().numpy() + bias.detach().numpy(), 0)


def _operands(seed=0, m=5, k=3, n=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(k, n, generator=g), torch.randn(n, generator=g)


def _memo_records():
    return [rec for recs in call_key_classes[torch.Tensor].memo.handles.values() for rec in recs]


def test_the_extension_is_built_where_a_c_compiler_and_the_python_headers_are(matmul_front):
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]  # as setuptools picks it
    headers = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    works = shutil.which(cc) and subprocess.run([cc, "--version"], capture_output=True).returncode == 0
    if not (works and headers) or os.environ.get("NVDISPATCH_PURE_PYTHON"):
        pytest.skip("no C compiler or no Python headers here: the install runs the Python route")
    import nvdispatch._hotpath  # noqa: F401 - built by the install (setup.py, optional extension)

    assert COMPILED


def test_repeated_calls_of_every_form_the_memo_holds_give_numpy_results():
    a, b, bias = _operands()
    pw, pbias = torch.nn.Parameter(b.clone()), torch.nn.Parameter(bias.clone())
    for _ in range(3):
        np.testing.assert_allclose(nvdispatch.matmul(a, b).numpy(), a.numpy() @ b.numpy(), rtol=1e-5, atol=1e-5)
        for epilog in ("RELU_BIAS", nvdispatch.Epilog.RELU_BIAS, "BIAS"):
            got = nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs={"bias": bias})
            want = a.numpy() @ b.numpy() + bias.numpy()
            np.testing.assert_allclose(got.numpy(), want if epilog == "BIAS" else np.maximum(want, 0), rtol=1e-5,
                                       atol=1e-6)
        got = nvdispatch.matmul(a, pw, epilog="RELU_BIAS", epilog_inputs={"bias": pbias})  # Parameters
        assert got.grad_fn is not None
        np.testing.assert_allclose(got.detach().numpy(), _relu_bias(a, pw, pbias), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(nvdispatch.matmul(a, b.t().contiguous().t()).numpy(), a.numpy() @ b.numpy(),
                                   rtol=1e-5, atol=1e-5)
    hits = nvdispatch.plan_cache.hits
    nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    assert nvdispatch.plan_cache.hits == hits + 1


@pytest.mark.parametrize(
    "kwargs, want",
    [
        ({"alpha": 2}, lambda a, b, bias: 2 * (a @ b)),
        ({"alpha": 1.0}, lambda a, b, bias: a @ b),
        ({"alpha": np.float32(0.5)}, lambda a, b, bias: 0.5 * (a @ b)),
        ({"stream": None}, lambda a, b, bias: a @ b),
        ({"options": None, "preferences": None, "quantization_scales": None}, lambda a, b, bias: a @ b),
        ({"c": "bias"}, lambda a, b, bias: a @ b + bias),
        ({"epilog": "RELU"}, lambda a, b, bias: np.maximum(a @ b, 0)),
        ({"epilog": "BIAS", "epilog_inputs": "bias", "alpha": 3}, lambda a, b, bias: 3 * (a @ b) + bias),
        ({"options": {"compute_type": None}}, lambda a, b, bias: a @ b),
    ],
)
def test_calls_beside_the_memo_forms_take_the_route_and_get_their_results(kwargs, want):
    a, b, bias = _operands(1)
    kwargs = {k: ({"bias": bias} if v == "bias" and k == "epilog_inputs" else bias if v == "bias" else v)
              for k, v in kwargs.items()}
    for _ in range(3):
        nvdispatch.matmul(a, b)  # the plain form, remembered: the calls below must not take its plan
        got = nvdispatch.matmul(a, b, **kwargs)
        np.testing.assert_allclose(got.numpy(), want(a.numpy(), b.numpy(), bias.numpy()), rtol=1e-5, atol=1e-6)


def test_bad_input_after_remembered_calls_still_gets_its_typed_error():
    a, b, bias = _operands(2)
    for _ in range(3):
        nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    with pytest.raises(errors.InvalidArgumentError):
        nvdispatch.matmul(a, b, epilog=["RELU"])  # unhashable: the route's full path reports it
    with pytest.raises(errors.EpilogInputError):
        nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias, "extra": bias})
    with pytest.raises(errors.EpilogInputError):
        nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bais": bias})
    with pytest.raises(errors.ShapeMismatchError):
        nvdispatch.matmul(a, a, epilog="RELU_BIAS", epilog_inputs={"bias": bias})


def test_a_failing_guard_is_tried_once_per_call_and_a_passing_one_serves_it():
    a, b, bias = _operands(3)
    for _ in range(3):
        nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    memo = call_key_classes[torch.Tensor].memo
    (form,) = [f for f in memo.handles if "bias" in f]
    calls = []

    def counting(check):
        return lambda *xs: calls.append(len(xs)) or check(*xs)

    memo.handles[form] = tuple((counting(c), e, ep) for c, e, ep in memo.handles[form])
    other = torch.randn(5, 3)[:, [0, 1, 2]].t().contiguous().t()  # same shape, other strides: the guard refuses
    got = nvdispatch.matmul(other, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    np.testing.assert_allclose(got.numpy(), _relu_bias(other, b, bias), rtol=1e-5, atol=1e-6)
    assert calls == [3]  # tried by the front; the route did not try it again
    calls.clear()
    nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    assert calls[:1] == [3]


@pytest.mark.parametrize("raised", [KeyboardInterrupt, RuntimeError, TypeError])
def test_an_error_in_a_guard_is_the_calls_unless_the_route_handles_it(raised):
    # TypeError is the route's to handle (an argument a guard cannot check): the call takes the full path
    a, b, _ = _operands(4)
    for _ in range(3):
        nvdispatch.matmul(a, b)
    memo = call_key_classes[torch.Tensor].memo
    (form,) = list(memo.handles)

    def failing(*xs):
        raise raised("from the guard")

    memo.handles[form] = tuple((failing, e, ep) for _, e, ep in memo.handles[form])
    if raised is TypeError:
        np.testing.assert_allclose(nvdispatch.matmul(a, b).numpy(), a.numpy() @ b.numpy(), rtol=1e-5, atol=1e-5)
        return
    with pytest.raises(raised, match="from the guard"):
        nvdispatch.matmul(a, b)


class _Failing(Exception):
    pass


@pytest.mark.parametrize(
    "error, expected",
    [(_Failing("boom"), _Failing), (MemoryError("no more"), errors.OutOfMemoryError),
     (RuntimeError("CUDA error: out of memory"), errors.OutOfMemoryError), (KeyboardInterrupt(), KeyboardInterrupt)],
)
def test_an_error_in_a_remembered_plans_run_propagates_as_the_route_raises_it(monkeypatch, error, expected):
    a, b, bias = _operands(6)
    for _ in range(3):
        nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    (plan,) = {id(e.plan): e.plan for _, e, _ in _memo_records()}.values()

    def failing(*args):
        raise error

    monkeypatch.setattr(plan, "direct", failing)
    with pytest.raises(expected) as info:
        nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    if expected is errors.OutOfMemoryError:
        assert info.value.__cause__ is error


class _PinnedTorch(Executor):
    """Takes Torch matmuls with plans the cache pins (needs_release) and no direct call: the route's execute
    branch, with let_go after every run, failing or not."""

    name = "pinned-torch"

    def __init__(self):
        self.seen, self.fail = [], False

    def decline(self, op, problem, *, coerce=False):
        return None if op == "matmul" and problem.framework == "torch" else "Torch matmuls only"

    def strategies(self, op, problem):
        return ("plain",)

    def plan(self, op, problem, strategy, tuning=None):
        ex = self

        class _Plan:
            needs_release = True
            steps = ("pinned",)

            def __init__(self):
                self.strategy = strategy

            def execute(self, operands, stream=None):
                ex.seen.append((sorted(operands), operands.get("alpha"), operands.get("beta"), stream))
                if ex.fail:
                    raise _Failing("execute failed")
                out = operands["a"] @ operands["b"]
                return torch.relu(out + operands["bias"]) if "bias" in operands else out

            def release(self):
                pass

        return _Plan()


def _pins():
    return sum(len(e.users) for e in nvdispatch.plan_cache._lru)


def test_a_pinned_plan_retired_while_a_remembered_call_runs_it_is_released_when_that_call_lets_go():
    # the front lets go by the plan-cache entry the memo's handle pinned: the last user of a retired entry
    # releases its plan, exactly once
    a, b, bias = _operands(11)
    ex = _PinnedTorch()
    released = []
    with nvdispatch.set_backend(ex, only=True):
        for _ in range(3):
            nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        (entry,) = {id(e): e for _, e, _ in _memo_records() if not e.pinless}.values()
        plan = entry.plan
        plan.release = lambda: released.append(plan)
        plan_execute = plan.execute

        def clearing(operands, stream=None):
            assert entry.users and not released  # pinned by this call: clearing only retires it
            nvdispatch.plan_cache.clear()
            return plan_execute(operands, stream)

        plan.execute = clearing
        got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        np.testing.assert_allclose(got.numpy(), _relu_bias(a, b, bias), rtol=1e-5, atol=1e-6)
        assert released == [plan] and entry.users == [] and entry.retired
        got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})  # planned again
        np.testing.assert_allclose(got.numpy(), _relu_bias(a, b, bias), rtol=1e-5, atol=1e-6)
        assert released == [plan] and _pins() == 0


def test_a_pinned_plan_without_a_direct_call_runs_execute_and_is_let_go_every_time():
    a, b, bias = _operands(7)
    ex = _PinnedTorch()
    with nvdispatch.set_backend(ex, only=True):
        for _ in range(4):
            got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
            np.testing.assert_allclose(got.numpy(), _relu_bias(a, b, bias), rtol=1e-5, atol=1e-6)
            assert _pins() == 0
        assert len(ex.seen) == 4 and {"a", "b"} <= set(ex.seen[-1][0]) and ex.seen[-1][1:] == (1, None, None)
        assert any(not e.pinless for _, e, _ in _memo_records())
        ex.fail = True
        with pytest.raises(_Failing):
            nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        assert _pins() == 0


def test_calls_hold_no_references_they_did_not_hold_before():
    a, b, bias = _operands(8)
    inputs = {"bias": bias}
    for _ in range(3):
        nvdispatch.matmul(a, b, epilog=nvdispatch.Epilog.RELU_BIAS, epilog_inputs=inputs)
        nvdispatch.matmul(a, b)
    gc.collect()
    before = [sys.getrefcount(x) for x in (a, b, bias, inputs, None, nvdispatch.Epilog.RELU_BIAS)]
    for _ in range(200):
        nvdispatch.matmul(a, b, epilog=nvdispatch.Epilog.RELU_BIAS, epilog_inputs=inputs)
        nvdispatch.matmul(a, b)
    gc.collect()
    after = [sys.getrefcount(x) for x in (a, b, bias, inputs, None, nvdispatch.Epilog.RELU_BIAS)]
    assert after[:4] == before[:4] and after[5] == before[5]
    assert abs(after[4] - before[4]) < 50  # None: a few held elsewhere come and go; a leak would be 200+


def test_the_front_is_not_called_by_its_own_arguments_name():
    # the public function keeps its signature, annotations and docstring: the compiled part is behind it
    import inspect

    sig = inspect.signature(nvdispatch.matmul)
    assert list(sig.parameters)[:3] == ["a", "b", "c"] and sig.parameters["alpha"].default == 1
    assert inspect.isfunction(nvdispatch.matmul) and "Examples" in nvdispatch.matmul.__doc__


def test_numpy_calls_are_served_by_their_call_key_and_hold_no_new_references():
    rng = np.random.default_rng(9)
    a, b, bias = rng.standard_normal((6, 4)), rng.standard_normal((4, 3)), rng.standard_normal(3)
    inputs = {"bias": bias}
    for _ in range(3):
        for x in (a, a.astype(np.float32), np.asfortranarray(a)):  # each signature its own key
            y, z = b.astype(x.dtype), bias.astype(x.dtype)
            got = nvdispatch.matmul(x, y, epilog="RELU_BIAS", epilog_inputs={"bias": z})
            np.testing.assert_allclose(got, np.maximum(x @ y + z, 0), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(nvdispatch.matmul(x, y), x @ y, rtol=1e-5, atol=1e-5)
    hits = nvdispatch.plan_cache.hits
    nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs=inputs)
    assert nvdispatch.plan_cache.hits == hits + 1
    before = [sys.getrefcount(x) for x in (a, b, bias, inputs)]
    for _ in range(100):
        nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs=inputs)
    assert [sys.getrefcount(x) for x in (a, b, bias, inputs)] == before


# -- cublasLtMatmul called directly (nvdispatch._cuda.cublaslt.matmul_call) ------------------------------------
def _probe_checksum(args):
    return sum((i + 1) * (x or 0) for i, x in enumerate(args)) % 1000003


def test_the_direct_cublaslt_call_passes_its_sixteen_integers_in_order(matmul_front):
    if matmul_front != "compiled":
        pytest.skip("the direct call is the extension's")
    from nvdispatch._hotpath import LT_MATMUL_PROBE, make_lt_matmul

    call = make_lt_matmul(LT_MATMUL_PROBE)  # a function of cublasLtMatmul's shape returning a checksum
    rng = np.random.default_rng(10)
    for _ in range(20):
        args = [int(x) for x in rng.integers(0, 2**47, 16)]
        args[14] = int(rng.integers(0, 2**40))  # the workspace size
        assert call(*args) == _probe_checksum(args)
    args[3] = args[9] = None  # NULL pointers
    assert call(*args) == _probe_checksum(args)
    with pytest.raises(TypeError, match="16 arguments"):
        call(*args[:15])
    with pytest.raises(TypeError, match="argument 2"):
        call(*args[:2], "ptr", *args[3:])
    with pytest.raises(TypeError, match="argument 14"):
        call(*args[:14], -1, args[15])
    with pytest.raises(ValueError):
        make_lt_matmul(0)


@pytest.mark.gpu
@pytest.mark.parametrize("launcher", ["direct", "ctypes"])
def test_cublaslt_plans_compute_the_same_through_either_launcher(matmul_front, launcher, monkeypatch):
    if matmul_front != "compiled":
        pytest.skip("one run per launcher is enough")
    from nvdispatch._cuda import cublaslt as lt

    if launcher == "ctypes":
        monkeypatch.setattr(lt, "matmul_call", lambda: lt.lib().cublasLtMatmul)
    g = torch.Generator().manual_seed(11)
    a, b, bias = (torch.randn(*s, generator=g) for s in ((40, 24), (24, 33), (33,)))
    with nvdispatch.set_backend("cuda", only=True):
        for _ in range(2):
            got = nvdispatch.matmul(a.cuda(), b.cuda(), epilog="RELU_BIAS", epilog_inputs={"bias": bias.cuda()})
            np.testing.assert_allclose(got.cpu().numpy(), _relu_bias(a, b, bias), rtol=2e-3, atol=2e-3)


# -- the one object the compiled front receives ---------------------------------------------------------------------
def test_the_compiled_front_is_made_from_one_object_with_documented_attributes(matmul_front):
    if matmul_front != "compiled":
        pytest.skip("the extension's")
    from nvdispatch._hotpath import make_matmul_front

    parts = linalg._FRONT_PARTS
    documented = ("route", "classes", "backends", "acquire", "acquire_handle", "let_go", "log_levels", "log_hit",
                  "raise_if_out_of_memory", "operands")
    assert all(hasattr(parts, name) for name in documented)
    assert callable(make_matmul_front(parts))

    class Missing:
        pass

    with pytest.raises(AttributeError):
        make_matmul_front(Missing())


def test_the_compiled_front_and_the_call_key_module_build_the_same_keys():
    from nvdispatch._call_key import class_keys, short_form

    a, b = np.ones((3, 4), np.float32), np.ones((4, 2), np.float32)
    bias = np.ones(2, np.float32)
    for inputs, epilog in ((None, None), ({"bias": bias}, "RELU_BIAS")):
        nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=inputs)  # planned by the route: kept under its key
        entry = class_keys(np.ndarray)
        _, _, key = short_form(entry, a, b, 1, epilog, inputs)
        assert nvdispatch.plan_cache.contains(key)
        hits = nvdispatch.plan_cache.hits
        nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=inputs)  # found by that key (in C or in Python)
        assert nvdispatch.plan_cache.hits == hits + 1
