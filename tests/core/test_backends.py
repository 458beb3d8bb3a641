"""SciPy-style backend control: set_backend (context-local), set_global_backend, register_backend,
skip_backend, with only/coerce, and a user-written executor."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors
from nvdispatch._backends import _unregister_all, candidates
from nvdispatch.executors.base import Executor

torch = pytest.importorskip("torch")

A = np.arange(6, dtype=np.float64).reshape(2, 3)
B = np.arange(12, dtype=np.float64).reshape(3, 4)


class RecordingExecutor(Executor):
    """A user executor: runs NumPy matmuls (optionally declining) and records what it ran."""

    def __init__(self, name="recorder", decline_reason=None):
        self.name = name
        self.decline_reason = decline_reason
        self.calls = 0

    def decline(self, op, problem, *, coerce=False):
        if self.decline_reason:
            return self.decline_reason
        if op != "matmul":
            return "only matmul"
        if problem.framework != "numpy" and not coerce:
            return "only NumPy arrays"
        return None

    def strategies(self, op, problem):
        return ("plain",)

    def plan(self, op, problem, strategy, tuning=None):
        ex = self

        class _Plan:
            steps = ("recorder matmul",)

            def __init__(self):
                self.strategy = strategy

            def execute(self, operands, stream=None):
                ex.calls += 1
                return np.matmul(operands["a"], operands["b"]) * operands.get("alpha", 1)

            def release(self):
                pass

        return _Plan()

    def coerce_operand(self, array):
        return np.asarray(array.numpy() if hasattr(array, "numpy") else array)


@pytest.fixture(autouse=True)
def _clean_state():
    _unregister_all()
    nvdispatch.plan_cache.clear()
    yield
    _unregister_all()


def test_user_executor_via_set_backend_runs_the_call():
    rec = RecordingExecutor()
    with nvdispatch.set_backend(rec):
        np.testing.assert_allclose(nvdispatch.matmul(A, B), A @ B)
        assert nvdispatch.explain(A, B).executor == "recorder"
    assert rec.calls == 1
    nvdispatch.matmul(A, B)
    assert rec.calls == 1  # the context ended


def test_declining_backend_falls_through_unless_only():
    rec = RecordingExecutor(decline_reason="busy")
    with nvdispatch.set_backend(rec):
        np.testing.assert_allclose(nvdispatch.matmul(A, B), A @ B)
        e = nvdispatch.explain(A, B)
        assert e.executor == "numpy" and e.declined == (("recorder", "busy"),)
    with nvdispatch.set_backend(rec, only=True), pytest.raises(errors.NoExecutorError, match="recorder: busy"):
        nvdispatch.matmul(A, B)


def test_innermost_context_wins_and_nesting_unwinds():
    outer, inner = RecordingExecutor("outer"), RecordingExecutor("inner")
    with nvdispatch.set_backend(outer):
        with nvdispatch.set_backend(inner):
            nvdispatch.matmul(A, B)
        nvdispatch.matmul(A, B)
    assert (outer.calls, inner.calls) == (1, 1)


def test_skip_backend_removes_it_everywhere():
    rec = RecordingExecutor()
    nvdispatch.set_global_backend(rec)
    with nvdispatch.skip_backend(rec):
        assert nvdispatch.explain(A, B).executor == "numpy"
        with nvdispatch.set_backend(rec):
            assert nvdispatch.explain(A, B).executor == "numpy"
    assert nvdispatch.explain(A, B).executor == "recorder"


def test_skip_builtin_leaves_no_executor():
    with nvdispatch.skip_backend("numpy"), pytest.raises(errors.NoExecutorError):
        nvdispatch.matmul(A, B)


def test_global_backend_and_try_last_order_with_registered():
    glob, reg = RecordingExecutor("glob"), RecordingExecutor("reg")
    nvdispatch.register_backend(reg)
    nvdispatch.set_global_backend(glob)
    assert [c.executor.name for c in candidates("numpy", "cpu")] == ["glob", "reg", "numpy"]
    nvdispatch.set_global_backend(glob, try_last=True)
    assert [c.executor.name for c in candidates("numpy", "cpu")] == ["reg", "glob", "numpy"]
    nvdispatch.set_global_backend(glob, only=True)
    assert [c.executor.name for c in candidates("numpy", "cpu")] == ["glob"]
    nvdispatch.set_global_backend(None)
    assert [c.executor.name for c in candidates("numpy", "cpu")] == ["reg", "numpy"]


def test_local_beats_global_and_registered_name_is_selectable():
    glob, reg = RecordingExecutor("glob"), RecordingExecutor("reg")
    nvdispatch.set_global_backend(glob)
    nvdispatch.register_backend(reg)
    with nvdispatch.set_backend("reg"):
        nvdispatch.matmul(A, B)
    assert (glob.calls, reg.calls) == (0, 1)
    nvdispatch.matmul(A, B)
    assert glob.calls == 1


def test_register_twice_is_one_entry():
    reg = RecordingExecutor("reg")
    nvdispatch.register_backend(reg)
    nvdispatch.register_backend(reg)
    assert [c.executor.name for c in candidates("numpy", "cpu")] == ["reg", "numpy"]


def test_builtin_names_resolve():
    with nvdispatch.set_backend("numpy", only=True):
        assert nvdispatch.explain(A, B).executor == "numpy"
    with nvdispatch.set_backend("torch", only=True):
        t = torch.ones(2, 3)
        assert nvdispatch.explain(t, torch.ones(3, 4)).executor == "torch"


def test_without_coerce_a_foreign_backend_declines():
    with nvdispatch.set_backend("torch", only=True), pytest.raises(errors.NoExecutorError, match="numpy arrays"):
        nvdispatch.matmul(A, B)


def test_coerce_converts_operands_and_returns_backend_type():
    with nvdispatch.set_backend("torch", coerce=True):
        out = nvdispatch.matmul(A, B)
    assert isinstance(out, torch.Tensor)
    np.testing.assert_allclose(out.numpy(), A @ B)
    # coerce allows mixed frameworks too
    with nvdispatch.set_backend("numpy", coerce=True):
        out = nvdispatch.matmul(A, torch.from_numpy(B))
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, A @ B)


def test_mixed_frameworks_without_coerce_is_a_typed_error():
    with pytest.raises(errors.MixedOperandsError, match="numpy"):
        nvdispatch.matmul(A, torch.from_numpy(B))


def test_context_state_is_thread_local():
    rec = RecordingExecutor()
    seen = {}
    inside, leave = threading.Event(), threading.Event()

    def other():
        inside.wait()
        seen["other"] = nvdispatch.explain(A, B).executor
        leave.set()

    t = threading.Thread(target=other)
    t.start()
    with nvdispatch.set_backend(rec):
        inside.set()
        leave.wait()
        seen["this"] = nvdispatch.explain(A, B).executor
    t.join()
    assert seen == {"other": "numpy", "this": "recorder"}


def test_set_backend_object_is_reusable_and_reentrant():
    rec = RecordingExecutor()
    ctx = nvdispatch.set_backend(rec)
    with ctx:
        with ctx:
            nvdispatch.matmul(A, B)
        nvdispatch.matmul(A, B)
    nvdispatch.matmul(A, B)
    assert rec.calls == 2


def test_plain_fast_path_respects_backend_state():
    rec = RecordingExecutor()
    a, b = np.ones((8, 8), np.float32), np.ones((8, 8), np.float32)
    nvdispatch.matmul(a, b)  # warms the fast path
    with nvdispatch.set_backend(rec):
        nvdispatch.matmul(a, b)
    assert rec.calls == 1
