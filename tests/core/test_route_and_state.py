"""One route per call (call key -> plan cache -> full path -> store) and backend state that cannot leak:
regression tests for issue #14 item 2 and issue #15 item 1. Each failed on the code before the fix."""

from __future__ import annotations

import asyncio
import contextvars
import dis
import sys
import threading

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors, linalg
from nvdispatch._backends import _unregister_all, candidates
from nvdispatch.executors.base import Executor

A = np.arange(6, dtype=np.float64).reshape(2, 3)


def _defaults_only() -> bool:
    """Whether backend resolution here is back to the built-in defaults (no context left active)."""
    return [c.executor.name for c in candidates("numpy", "cpu")] == ["numpy"]


B = np.arange(12, dtype=np.float64).reshape(3, 4)


#: what a Recorder's plans return (a result the executor contract accepts: the result's shape and dtype)
RECORDED = -1234.5


def recorded(result) -> bool:
    return isinstance(result, np.ndarray) and bool(np.all(result == RECORDED))


class Recorder(Executor):
    """Takes matmuls of the given frameworks; records each plan's problem and each run's device."""

    def __init__(self, frameworks=("numpy",)):
        self.name = "recorder"
        self.frameworks = frameworks
        self.planned, self.runs, self.devices = [], 0, []

    def decline(self, op, problem, *, coerce=False):
        return None if op == "matmul" and problem.framework in self.frameworks else "not mine"

    def strategies(self, op, problem):
        return ("plain",)

    def plan(self, op, problem, strategy, tuning=None):
        self.planned.append(problem)
        rec = self

        class _Plan:
            steps = ("recorded",)

            def __init__(self):
                self.strategy = strategy

            def execute(self, operands, stream=None):
                rec.runs += 1
                rec.devices.append(problem.device)
                return np.full(problem.result_shape, RECORDED, dtype=problem.result_dtype)

            def release(self):
                pass

        return _Plan()


@pytest.fixture(autouse=True)
def _clean():
    nvdispatch.reset_backends()
    nvdispatch.plan_cache.clear()
    yield
    nvdispatch.reset_backends()
    _unregister_all()


@pytest.fixture
def count_full_path(monkeypatch):
    """How many matmul calls took the full detect/validate/select path."""
    calls = []
    full = linalg._prepare

    def counting(*args, **kwargs):
        calls.append(1)
        return full(*args, **kwargs)

    monkeypatch.setattr(linalg, "_prepare", counting)
    return calls


# -- #14: the call key ---------------------------------------------------------------------------------------
def test_fftn_with_array_axes_does_not_grow_the_cache():
    x = np.ones((4, 4, 2))
    nvdispatch.fft.fftn(x, axes=np.array([0, 1]))
    size = nvdispatch.plan_cache.stats()["size"]
    for _ in range(5):
        np.testing.assert_allclose(nvdispatch.fft.fftn(x, axes=np.array([0, 1])), np.fft.fftn(x, axes=(0, 1)))
    assert nvdispatch.plan_cache.stats()["size"] == size


def test_repeated_calls_take_one_lookup(count_full_path):
    bias = np.ones(4)
    for _ in range(3):
        np.testing.assert_allclose(nvdispatch.matmul(A, B), A @ B)
        out = nvdispatch.matmul(A, B, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        np.testing.assert_allclose(out, np.maximum(A @ B + 1, 0))
        np.testing.assert_allclose(nvdispatch.matmul(A, B, np.ones((2, 4)), beta=2.0), A @ B + 2)
    assert len(count_full_path) == 3  # the first call of each kind


def test_the_linear_layer_key_tells_bias_shapes_classes_and_epilogs_apart(count_full_path):
    # a call with a bias alone has a short key of its own: nothing that changes the plan may share it
    a, b = np.arange(8.0).reshape(2, 4), np.arange(12.0).reshape(4, 3) - 5
    row, col = np.array([1.0, -2.0, 3.0]), np.array([[4.0], [-30.0]])
    for _ in range(2):
        np.testing.assert_allclose(nvdispatch.matmul(a, b, epilog="BIAS", epilog_inputs={"bias": row}), a @ b + row)
        got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": row})
        np.testing.assert_allclose(got, np.maximum(a @ b + row, 0))
        got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": col})  # along M
        np.testing.assert_allclose(got, np.maximum(a @ b + col, 0))
        with pytest.raises(errors.EpilogInputError, match="float64"):  # another dtype: never a cached plan
            nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": row.astype(np.float32)})
    assert len(count_full_path) == 3 + 2  # one full path per valid form; the invalid one is checked every time
    torch = pytest.importorskip("torch")
    with pytest.raises(errors.MixedOperandsError):  # a bias of another framework still takes the checks
        nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": torch.from_numpy(row)})


def test_a_thread_inside_set_backend_does_not_change_another_threads_route(count_full_path):
    nvdispatch.matmul(A, B)
    inside, done = threading.Event(), threading.Event()
    rec = Recorder()

    def other():
        with nvdispatch.set_backend(rec):
            assert recorded(nvdispatch.matmul(A, B))
            inside.set()
            done.wait(10)

    t = threading.Thread(target=other)
    t.start()
    try:
        assert inside.wait(10)
        for _ in range(3):
            np.testing.assert_allclose(nvdispatch.matmul(A, B), A @ B)
    finally:
        done.set()
        t.join()
    assert len(count_full_path) == 2  # the warm-up call here and the recorder's first call there
    assert rec.runs == 1


def test_a_task_started_inside_set_backend_keeps_it_after_the_block_exits():
    rec = Recorder()
    nvdispatch.matmul(A, B)  # the NumPy plan is cached for this call

    async def work():
        await asyncio.sleep(0)
        return nvdispatch.matmul(A, B)

    async def main():
        with nvdispatch.set_backend(rec):
            task = asyncio.create_task(work())
        assert _defaults_only()
        return await task

    assert recorded(asyncio.run(main()))
    np.testing.assert_allclose(nvdispatch.matmul(A, B), A @ B)


def test_a_thread_started_in_a_copied_context_keeps_the_backend_after_the_block_exits():
    rec = Recorder()
    nvdispatch.matmul(A, B)
    go, out = threading.Event(), []

    def work():
        go.wait(10)
        out.append(nvdispatch.matmul(A, B))

    with nvdispatch.set_backend(rec):
        t = threading.Thread(target=contextvars.copy_context().run, args=(work,))
        t.start()
    go.set()
    t.join()
    assert recorded(out[0])
    np.testing.assert_allclose(nvdispatch.matmul(A, B), A @ B)


def test_get_state_and_set_state_carry_the_backend_into_a_worker_thread():
    rec = Recorder()
    with nvdispatch.set_backend(rec):
        state = nvdispatch.get_state()
    out = []

    def work():
        with nvdispatch.set_state(state):
            out.append(nvdispatch.matmul(A, B))
        out.append(nvdispatch.matmul(A, B))

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert recorded(out[0])
    np.testing.assert_allclose(out[1], A @ B)
    with pytest.raises(nvdispatch.errors.InvalidArgumentError, match="state"):
        nvdispatch.set_state("numpy")


def test_cai_operands_on_two_gpus_get_two_plans(monkeypatch):
    from nvdispatch import _adapters

    monkeypatch.setattr(_adapters.cai, "pointer_device", lambda ptr: 0 if ptr < (1 << 40) else 1)

    class FakeCai:
        def __init__(self, ptr):
            self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (4, 4), "typestr": "<f4", "version": 3}

    rec = Recorder(frameworks=("cuda_array_interface",))
    with nvdispatch.set_backend(rec):
        on0 = nvdispatch.matmul(FakeCai(1 << 20), FakeCai(1 << 21))
        on1 = nvdispatch.matmul(FakeCai(1 << 41), FakeCai(1 << 42))
    assert [p.device.index for p in rec.planned] == [0, 1]
    assert recorded(on0) and recorded(on1) and [d.index for d in rec.devices] == [0, 1]


# -- #15 item 1: contexts shared by threads and tasks, interrupts ----------------------------------------------
def test_one_context_object_entered_from_two_threads():
    torch = pytest.importorskip("torch")
    ctx = nvdispatch.set_backend("torch", coerce=True)
    entered, first_out = threading.Barrier(2), threading.Event()
    errors, after = [], []

    def worker(first: bool):
        try:
            with ctx:
                entered.wait(10)
                assert isinstance(nvdispatch.matmul(A, B), torch.Tensor)
                if not first:
                    first_out.wait(10)  # the other thread leaves first
            if first:
                first_out.set()
            after.append(nvdispatch.matmul(A, B))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            first_out.set()

    threads = [threading.Thread(target=worker, args=(f,)) for f in (True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert all(isinstance(r, np.ndarray) for r in after) and len(after) == 2
    assert isinstance(nvdispatch.matmul(A, B), np.ndarray)


def test_one_context_object_entered_from_two_tasks_and_reentered():
    ctx = nvdispatch.set_backend(Recorder())

    async def task(delay):
        with ctx:
            with ctx:  # re-entrant
                await asyncio.sleep(delay)
                inner = nvdispatch.matmul(A, B)
            await asyncio.sleep(delay)
            outer = nvdispatch.matmul(A, B)
        return recorded(inner), recorded(outer), type(nvdispatch.matmul(A, B))

    async def main():
        return await asyncio.gather(task(0.01), task(0.0))

    assert asyncio.run(main()) == [(True, True, np.ndarray)] * 2
    assert _defaults_only()


def _interrupt_everywhere(run):
    """Run ``run()`` once per point where CPython may raise a pending KeyboardInterrupt while the ``with``
    statement in ``run`` enters and leaves: the start of every Python function it calls, and the
    instruction after every call or backward jump in them (where the interpreter checks for signals).
    Each run raises KeyboardInterrupt at one such point; yields after each run."""
    k = 0
    while True:
        seen, previous = [0], {}

        def tracer(frame, event, arg, k=k, seen=seen, previous=previous):
            if frame.f_code is run.__code__:
                return tracer if event == "call" else None
            frame.f_trace_opcodes = True
            point = event == "call"
            if event == "opcode":
                op = dis.opname[frame.f_code.co_code[frame.f_lasti]]
                point = previous.get(frame) in ("CALL", "JUMP_BACKWARD", "CALL_FUNCTION", "CALL_METHOD")
                previous[frame] = op
            if point:
                seen[0] += 1
                if seen[0] == k + 1:
                    raise KeyboardInterrupt
            return tracer

        sys.settrace(tracer)
        try:
            run()
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        yield k
        if seen[0] <= k:  # ran to the end without reaching point k: every point was tried
            return
        k += 1


@pytest.mark.parametrize("make", [lambda: nvdispatch.set_backend(Recorder()), lambda: nvdispatch.skip_backend("numpy")])
def test_an_interrupt_at_any_point_of_entering_or_leaving_leaves_no_context_active(make):
    ctx = make()

    def run():
        with ctx:
            pass

    points = 0
    for _ in _interrupt_everywhere(run):
        points += 1
        assert _defaults_only()
    assert points > 5


def test_reset_backends_clears_global_registered_and_local_state():
    rec = Recorder()
    nvdispatch.set_global_backend(rec)
    nvdispatch.register_backend(Recorder())
    ctx = nvdispatch.skip_backend("torch")
    ctx.__enter__()  # left open, as after an interrupt in an interactive session
    nvdispatch.reset_backends()
    assert nvdispatch.get_state().local == () and nvdispatch.get_state().skipped == ()
    np.testing.assert_allclose(nvdispatch.matmul(A, B), A @ B)
    assert rec.runs == 0


def test_exit_by_hand_and_through_exit_stack():
    import contextlib

    ctx = nvdispatch.set_backend(Recorder())
    ctx.__enter__()
    assert recorded(nvdispatch.matmul(A, B))
    ctx.__exit__(None, None, None)
    with contextlib.ExitStack() as stack:
        stack.enter_context(ctx)
        assert recorded(nvdispatch.matmul(A, B))
    assert isinstance(nvdispatch.matmul(A, B), np.ndarray) and _defaults_only()
    with pytest.raises(nvdispatch.errors.InvalidArgumentError, match="not active"):
        ctx.__exit__(None, None, None)


def test_an_exception_in_the_block_propagates():
    with pytest.raises(ZeroDivisionError):
        with nvdispatch.set_backend("numpy"):
            raise ZeroDivisionError
    assert _defaults_only()


# -- #26.1: one path --------------------------------------------------------------------------------------------
def test_a_stateless_matmul_is_the_stateful_objects_path_with_its_plan_under_the_call_key(monkeypatch):
    planned, puts = [], []
    plan_with = linalg.Matmul._plan_with

    def spy(self, *args, **kwargs):
        planned.append(kwargs.get("call_key"))
        return plan_with(self, *args, **kwargs)

    monkeypatch.setattr(linalg.Matmul, "_plan_with", spy)
    monkeypatch.setattr(nvdispatch.plan_cache, "put", lambda *a: puts.append(a))
    bias = np.arange(4.0)
    for _ in range(3):
        got = nvdispatch.matmul(A, B, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        np.testing.assert_allclose(got, np.maximum(A @ B + bias, 0))
    assert len(planned) == 1 and planned[0] is not None  # planned once, by Matmul, with the call's key
    assert puts == []  # the plan and its call key entered the cache in one step
    stats = nvdispatch.plan_cache.stats()
    assert stats["size"] == 1 and stats["keys"] == 2  # one plan, under its problem key and the call key


def test_a_stateless_transform_is_the_stateful_fft_path(monkeypatch):
    from nvdispatch.fft._stateful import FFT

    made = []
    for_call = FFT._for_call.__func__

    def spy(cls, *args, **kwargs):
        made.append(args[0])
        return for_call(cls, *args, **kwargs)

    monkeypatch.setattr(FFT, "_for_call", classmethod(spy))
    x = np.arange(8.0)
    for _ in range(3):
        np.testing.assert_allclose(nvdispatch.fft.rfft(x, n=6), np.fft.rfft(x, n=6))
    assert made == ["rfft"]  # once; then the call key finds the plan
    from nvdispatch.executors.numpy_fft import NumpyAnyLengthFFTPlan

    plans = nvdispatch.plan_cache.plans()  # the call's plan, and the one it keeps for every length of x
    assert len(plans) == 2 and sum(isinstance(p, NumpyAnyLengthFFTPlan) for p in plans) == 1


def test_the_dask_executor_carries_the_backend_order_the_registry_implements():
    from nvdispatch._backends import registry
    from nvdispatch.executors.dask_tasks import carry_state

    rec, other = Recorder(), Recorder()
    other.name = "other"
    nvdispatch.register_backend(rec)
    nvdispatch.set_global_backend(other, try_last=True)
    with nvdispatch.set_backend("numpy"):
        order = [c.executor for c in registry.order()]
        assert [getattr(e, "name", e) for e in order] == ["numpy", "recorder", "other"]
        carried = carry_state()
    assert [ref for ref, _, _ in carried.chosen] == [other, rec, "numpy"]  # outermost first: the order reversed
