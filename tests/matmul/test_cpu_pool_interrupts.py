"""The CPU executor's worker pool (nvdispatch.executors.cpu_threads) under interrupts: a KeyboardInterrupt
landing anywhere in a multi-threaded CPU matmul, the pool's own code and the standard library's threading and
queue code included, must leave every later multi-threaded call working (issue #27 item 3). The interrupts are
injected deterministically, at each traced event in turn, by a trace function."""

from __future__ import annotations

import os
import sys
import threading

import numpy as np
import pytest

import nvdispatch
from nvdispatch.executors import blas_threads, cpu_threads, numpy_matmul
from nvdispatch.executors.numpy_matmul_panels import PanelPlan

#: the files whose Python frames an interrupt is injected into: the pool, the BLAS thread switch, and whatever
#: of the standard library they (or a concurrent.futures pool) run in the calling thread
_TRACED = ("cpu_threads.py", "blas_threads.py", "numpy_matmul", "threading.py", "queue.py", "contextlib.py",
           f"concurrent{os.sep}futures")


def _problem_and_operands():
    rng = np.random.default_rng(5)
    a, b, bias = rng.standard_normal((64, 32)), rng.standard_normal((32, 64)), rng.standard_normal(64)
    problem = nvdispatch.explain(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}).problem
    return problem, {"a": a, "b": b, "bias": bias, "alpha": 1, "beta": None}, np.maximum(a @ b + bias, 0)


def _plans(problem):
    """Plans spreading one call over 2 threads: the blocked epilog pass and the row panels."""
    blocked = numpy_matmul.NumpyMatmulPlan(problem, "inplace", {"block_bytes": 1 << 12, "threads": 2})
    panels = PanelPlan(problem, {"panel_bytes": 1 << 12, "threads": 2})
    assert blocked.threads == 2 and panels.own_threads == 2
    return {"blocked": blocked, "panels": panels}


class _InterruptAt:
    """A trace function raising KeyboardInterrupt at the ``n``-th event (call, line or return) of a frame in
    one of the traced files, in the thread that installs it."""

    def __init__(self, n: int):
        self.n, self.seen, self.fired = n, 0, False

    def __call__(self, frame, event, arg):
        if self.fired or not frame.f_code.co_filename.endswith(_TRACED) and not any(
            t in frame.f_code.co_filename for t in _TRACED
        ):
            return None
        if event in ("call", "line", "return"):
            self.seen += 1
            if self.seen == self.n:
                self.fired = True
                raise KeyboardInterrupt
        return self


def _finishes(fn, seconds: float = 20.0):
    """``(finished, result)`` of ``fn()`` run in another thread under a watchdog (a hang does not hang the
    test run: the thread is left behind, a daemon)."""
    box = {}

    def target():
        box["result"] = fn()

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive(), box.get("result")


def test_the_pool_runs_every_share_and_the_caller_takes_the_first():
    pool = cpu_threads.WorkerPool(2, "nvdispatch-test")
    threads = pool.run(lambda i: (i * i, threading.current_thread().name), list(range(7)))
    assert [r for r, _ in threads] == [i * i for i in range(7)]
    assert threads[0][1] == threading.current_thread().name
    assert pool.run(lambda i: i, []) == []
    assert cpu_threads.WorkerPool(0).run(lambda i: -i, [1, 2, 3]) == [-1, -2, -3]


def test_an_error_in_any_share_is_raised_after_every_share_ended():
    pool = cpu_threads.WorkerPool(2, "nvdispatch-test")
    ended = []

    def work(i):
        if i == 2:
            raise ValueError("share 2")
        ended.append(i)
        return i

    with pytest.raises(ValueError, match="share 2"):
        pool.run(work, [0, 1, 2, 3])
    assert sorted(ended) == [0, 1, 3]
    assert pool.run(lambda i: i + 1, [0, 1, 2]) == [1, 2, 3]  # the workers serve on


@pytest.mark.skipif(cpu_threads.CPUS < 2, reason="needs 2 cores for a multi-threaded call")
@pytest.mark.parametrize("engine", ["blocked", "panels"])
def test_an_interrupt_anywhere_in_a_threaded_call_leaves_later_calls_working(engine):
    problem, ops, want = _problem_and_operands()
    plan = _plans(problem)[engine]
    np.testing.assert_allclose(plan.execute(ops), want, rtol=1e-12)
    interrupted = 0
    for n in range(1, 2000):
        trace = _InterruptAt(n)
        sys.settrace(trace)
        try:
            plan.execute(ops)
        except KeyboardInterrupt:
            interrupted += 1
        finally:
            sys.settrace(None)
        done, got = _finishes(lambda: plan.execute(ops))
        assert done, f"a call after an interrupt at traced event {n} hangs"
        np.testing.assert_allclose(got, want, rtol=1e-12)
        if not trace.fired:  # the whole call ran without reaching event n: every point was tried
            break
    else:
        pytest.fail("more traced events than expected")
    assert interrupted > 10
    assert not blas_threads._holders  # no run left BLAS held to one thread
