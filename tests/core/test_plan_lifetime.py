"""Plans are reference-counted by their users: the cache, stateful Matmul/FFT objects and calls in flight.

Eviction and ``plan_cache.clear()`` release a plan only when the last user lets go. A poisoning executor
(tests/core/poisoning.py) makes a released plan fail loudly when executed.
"""

from __future__ import annotations

import gc
import io
import threading
import time

import numpy as np
import pytest
from poisoning import VIOLATIONS, PoisonedPlan, PoisoningExecutor

import nvdispatch
from nvdispatch import errors, plan_cache
from nvdispatch._compiled import hotpath
from nvdispatch._plan_cache import PlanCache
from nvdispatch.executors import builtin

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True, params=["compiled", "python"])
def steps(request, monkeypatch):
    """The per-call steps of the caches a test makes: compiled (where the extension is built) or the Python
    methods (what an install without it runs)."""
    if request.param == "compiled" and hotpath() is None:
        pytest.skip("the extension is not built here")
    if request.param == "python":
        monkeypatch.setattr(nvdispatch._plan_cache, "hotpath", lambda: None)
    return request.param


@pytest.fixture(autouse=True)
def _fresh():
    old = plan_cache.maxsize, plan_cache.max_bytes
    plan_cache.clear()
    VIOLATIONS.clear()
    yield
    plan_cache.maxsize, plan_cache.max_bytes = old
    plan_cache.clear()
    assert not VIOLATIONS, VIOLATIONS


class P:
    """A plan that records its release."""

    def __init__(self, log, name, nbytes=0):
        self.log, self.name, self.workspace_bytes = log, name, nbytes

    def release(self):
        self.log.append(self.name)


# -- the cache alone ---------------------------------------------------------------------------------------
def test_a_pinned_plan_survives_clear_and_eviction_until_let_go():
    released = []
    cache = PlanCache(maxsize=1)
    cache.put("a", P(released, "a"))
    plan = cache.acquire("a")
    cache.clear()
    assert released == [] and cache.stats()["in_use"] == 1 and len(cache) == 0
    cache.let_go(plan)
    assert released == ["a"] and cache.stats()["in_use"] == 0

    cache.put("b", P(released, "b"))
    b = cache.acquire("b")
    cache.put("c", P(released, "c"))  # evicts b while pinned
    assert cache.get("b") is None and released == ["a"]
    cache.let_go(b)
    assert released == ["a", "b"]
    cache.let_go(b)  # unbalanced: ignored, never a second release
    assert released == ["a", "b"]


def test_acquire_or_create_pins_and_a_miss_builds_once():
    released, built = [], []
    cache = PlanCache(maxsize=4)

    def factory(tuning):
        built.append(tuning)
        return P(released, "x")

    p1 = cache.acquire_or_create("k", factory)
    p2 = cache.acquire_or_create("k", factory)
    assert p1 is p2 and built == [None] and cache.users(p1) == 2
    cache.clear()
    cache.let_go(p1)
    assert released == []
    cache.let_go(p2)
    assert released == ["x"]


def test_a_hold_keeps_its_plan_until_closed_or_collected():
    released = []
    cache = PlanCache(maxsize=2)
    hold = cache.hold(cache.put("k", P(released, "k")))
    cache.clear()
    assert released == []
    hold.close()
    hold.close()
    assert released == ["k"]
    hold = cache.hold(cache.put("j", P(released, "j")))
    cache.clear()
    del hold
    gc.collect()
    assert released == ["k", "j"]


def test_caching_disabled_releases_each_plan_after_its_use():
    released = []
    cache = PlanCache(maxsize=0)
    plan = cache.acquire_or_create("k", lambda tuning: P(released, "k"))
    assert released == [] and len(cache) == 0
    cache.let_go(plan)
    assert released == ["k"]


class Pinless(P):
    """A plan whose release frees nothing: calls run it without pinning it."""

    needs_release = False


def test_calls_do_not_pin_a_plan_whose_release_frees_nothing_but_holds_count():
    released = []
    cache = PlanCache(maxsize=1)
    plan = cache.put("a", Pinless(released, "a"))
    assert cache.acquire("a") is plan and cache.users(plan) == 0  # a call: no bookkeeping
    cache.pin(plan)
    assert cache.users(plan) == 0
    hold = cache.hold(plan)
    assert cache.users(plan) == 1  # a stateful object's hold is counted
    cache.let_go(plan)  # a call's let-go never ends the hold
    assert cache.users(plan) == 1 and released == []
    cache.put("b", Pinless(released, "b"))  # evicts a: still held
    assert released == [] and cache.acquire("a") is None
    hold.close()
    assert released == ["a"]
    assert cache.acquire_or_create("c", lambda tuning: Pinless(released, "c")).name == "c"
    assert cache.users(cache.get("c")) == 0 and released == ["a", "b"]


def test_the_cpu_plans_are_pinless():
    a = np.ones((4, 4))
    nvdispatch.matmul(a, a)
    nvdispatch.fft.fft(a)
    plans = [entry.plan for entry in plan_cache._lru]
    assert len(plans) == 2
    assert all(plan.needs_release is False and plan_cache.users(plan) == 0 for plan in plans)


def test_a_lost_race_releases_the_duplicate_only():
    released = []
    cache = PlanCache(maxsize=4)
    kept = cache.put("k", P(released, "first"))
    assert cache.put("k", P(released, "second")) is kept
    assert released == ["second"]


# -- count, bytes, stats ------------------------------------------------------------------------------------
def test_the_bound_counts_plans_not_keys():
    released = []
    cache = PlanCache(maxsize=3)
    plans = [P(released, i) for i in range(3)]
    for i, p in enumerate(plans):
        cache.put(("full", i), p)
        cache.put(("fast", i), p)  # an alias: same entry
    s = cache.stats()
    assert (s["size"], s["keys"], s["evictions"]) == (3, 6, 0) and released == []
    cache.put("more", P(released, "more"))
    s = cache.stats()
    assert (s["size"], s["keys"], s["evictions"]) == (3, 5, 1) and released == [0]
    assert len(cache) == 3


def test_workspace_bytes_are_bounded():
    released = []
    cache = PlanCache(maxsize=100, max_bytes=250)
    for i in range(5):
        cache.put(i, P(released, i, nbytes=100))
        assert cache.nbytes <= 250
    assert len(cache) == 2 and released == [0, 1, 2] and cache.stats()["bytes"] == 200
    cache.put("big", P(released, "big", nbytes=1000))  # larger than the bound: not kept
    assert len(cache) == 0 and released == [0, 1, 2, 3, 4, "big"]
    cache.max_bytes = float("inf")
    with pytest.raises(errors.InvalidArgumentError, match="max_bytes"):
        cache.max_bytes = -1


def test_workspaces_that_grow_after_insertion_count_once_the_plan_says_so():
    released = []
    cache = PlanCache(maxsize=100, max_bytes=150)
    grower = P(released, "grower", nbytes=0)
    cache.put("g", grower)
    cache.put("h", P(released, "h", nbytes=100))
    grower.workspace_bytes = 100  # allocated at first use...
    assert cache.nbytes == 100  # ...counted once the plan reports it
    cache.resized(grower)
    assert released == ["grower"] and cache.nbytes == 100  # the least recently used plan went
    cache.resized(grower)  # no longer cached: ignored
    assert cache.nbytes == 100


class _CountsReads:
    """A plan that counts how often its workspace bytes are read."""

    def __init__(self, nbytes):
        self.reads, self._nbytes = 0, nbytes

    @property
    def workspace_bytes(self):
        self.reads += 1
        return self._nbytes

    def release(self):
        pass


def test_a_plans_bytes_are_read_once_when_cached_not_on_every_insertion():
    cache = PlanCache(maxsize=8, max_bytes=10_000)
    plans = [_CountsReads(100) for _ in range(20)]
    for i, plan in enumerate(plans):
        cache.put(i, plan)
        cache.put(("alias", i), plan)  # another key of a cached plan: not read again
    assert [p.reads for p in plans] == [1] * 20
    assert cache.nbytes == cache.stats()["bytes"] == 800
    cache.clear()
    assert cache.nbytes == 0


def test_stats_show_info_and_tunings_are_visible(tmp_path):
    cache = PlanCache(maxsize=4)
    cache.put("k", P([], "k", nbytes=64))
    cache.record_tuning("k", {"threads": 2})
    out = io.StringIO()
    cache.show_info(file=out)
    text = out.getvalue()
    assert "1 / 4 plans" in text and "64 / " in text and "tunings 1" in text and "P" in text
    assert cache.stats()["tunings"] == 1


def test_memo_is_bounded_and_cleared():
    cache = PlanCache(maxsize=2)
    calls = []
    for key in (1, 2, 1, 3, 1):
        cache.memo(key, lambda key=key: calls.append(key) or key * 10)
    assert calls == [1, 2, 3] and cache.stats()["memos"] == 2
    cache.clear()
    assert cache.stats()["memos"] == 0


def test_no_module_reads_the_cache_privately():
    import pathlib

    src = pathlib.Path(nvdispatch.__file__).parent
    for path in src.rglob("*.py"):
        if path.name == "_plan_cache.py":
            continue
        text = path.read_text()
        for private in ("plan_cache._plans", "plan_cache._tunings", "plan_cache._keys", "plan_cache._lru"):
            assert private not in text, f"{path.name} reads {private}"


# -- stateful objects and calls in flight, through the real route ------------------------------------------
def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def test_a_matmul_object_keeps_its_plan_across_clear_and_eviction():
    ex = PoisoningExecutor()
    a, b = _rand(5, 4), _rand(4, 3, seed=1)
    with nvdispatch.set_backend(ex, only=True):
        mm = nvdispatch.Matmul(a, b).plan(epilog="RELU")
    plan_cache.clear()
    plan_cache.maxsize = 1
    with nvdispatch.set_backend(ex, only=True):
        nvdispatch.matmul(_rand(2, 2), _rand(2, 2))  # churn: other plans come and go
        nvdispatch.matmul(_rand(3, 2), _rand(2, 2))
    np.testing.assert_allclose(mm.execute(), np.maximum(a @ b, 0), rtol=1e-12)
    mine = ex.plans[0]  # the first plan made: mm's (the cache wraps it to check results)
    assert mine.released == 0 and mine.executions >= 1
    mm.free()
    assert mine.released == 1
    assert all(p.released <= 1 for p in ex.plans)


def test_explain_reads_the_steps_of_a_plan_it_holds(monkeypatch):
    """A plan over the byte bound is retired as it is cached and released when its last user lets go:
    ``explain()`` reads its steps before letting go (the GPU convolution's ``KeyError: 'unfused'``)."""
    ex = builtin("numpy")
    inner_plan = ex.plan
    made = []

    def plan(op, problem, strategy, tuning=None):
        made.append(PoisonedPlan(inner_plan(op, problem, strategy, tuning), nbytes=2 * plan_cache.max_bytes))
        return made[-1]

    monkeypatch.setattr(ex, "plan", plan)
    x = _rand(8)
    with nvdispatch.set_backend("numpy", only=True):
        explained = nvdispatch.explain(nvdispatch.fft.fft, x)
    assert explained.executor == "numpy" and explained.steps == made[0].inner.steps
    assert made[0].released == 1 and len(plan_cache) == 0


def test_a_forgotten_matmul_object_lets_go_when_collected():
    ex = PoisoningExecutor()
    with nvdispatch.set_backend(ex, only=True):
        mm = nvdispatch.Matmul(_rand(2, 3), _rand(3, 2)).plan()
    (plan,) = ex.plans
    plan_cache.clear()
    assert plan.released == 0
    del mm
    gc.collect()
    assert plan.released == 1


def test_an_fft_object_keeps_its_plans(monkeypatch):
    from nvdispatch.executors import numpy_fft

    released = []
    monkeypatch.setattr(numpy_fft.NumpyFFTPlan, "release", lambda self: released.append(self))
    x = _rand(4, 8) + 1j * _rand(4, 8, seed=3)
    f = nvdispatch.fft.FFT(x, axes=(1,)).plan()
    plan_cache.clear()
    assert released == []
    np.testing.assert_allclose(f.execute(), np.fft.fft(x, axis=1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(f.execute(direction="inverse"), np.fft.ifft(x, axis=1), rtol=1e-12, atol=1e-12)
    f.free()
    assert len(released) == 2


@pytest.mark.parametrize("route", ["stateless", "stateful"])
def test_a_call_in_flight_keeps_its_plan_through_clear(route):
    gate = threading.Event()
    ex = PoisoningExecutor(gate=gate)
    a, b = _rand(6, 4), _rand(4, 5, seed=1)
    result = {}

    def call():
        with nvdispatch.set_backend(ex, only=True):
            if route == "stateless":
                result["r"] = nvdispatch.matmul(a, b)
            else:
                mm = nvdispatch.Matmul(a, b).plan()
                try:
                    result["r"] = mm.execute()
                finally:
                    mm.free()

    t = threading.Thread(target=call)
    t.start()
    while not ex.plans:
        pass
    plan = ex.plans[0]
    assert plan.started.wait(10)
    plan_cache.clear()  # the call is inside execute now
    assert plan.released == 0
    gate.set()
    t.join(10)
    np.testing.assert_allclose(result["r"], a @ b, rtol=1e-12)
    assert plan.released == 1


@pytest.mark.parametrize("needs_release", [True, False])
def test_hot_path_calls_never_run_a_released_plan(monkeypatch, needs_release):
    """Default route (NumPy executor, hot path) under clear() churn from a thread. Plans that need releasing
    (the NumPy plans made so here) carry a released-plan trap: calls must pin them. As they are (release
    frees nothing) calls run them unpinned, and every result must still be right."""
    from nvdispatch.executors import numpy_matmul, numpy_matmul_engines

    released = []
    for cls in (numpy_matmul.NumpyMatmulPlan, numpy_matmul_engines.EnginePlan):
        if not needs_release:
            real_release = cls.release
            monkeypatch.setattr(cls, "release", lambda self, real=real_release: released.append(1) or real(self))
            continue
        monkeypatch.setattr(cls, "needs_release", True)
        real_execute = cls.execute

        def release(self):
            self.poisoned = True
            if getattr(self, "direct", None) is not None:  # the hot path's direct call is poisoned too
                self.direct = lambda *args: VIOLATIONS.append("hot path ran a released plan (direct)")
            released.append(1)

        def execute(self, operands, stream=None, real_execute=real_execute):
            if getattr(self, "poisoned", False):
                VIOLATIONS.append("hot path ran a released plan")
            return real_execute(self, operands, stream)

        monkeypatch.setattr(cls, "release", release)
        monkeypatch.setattr(cls, "execute", execute)
    plan_cache.maxsize = 2
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            plan_cache.clear()

    t = threading.Thread(target=churn)
    t.start()
    try:
        rng = np.random.default_rng(0)
        for i in range(300):
            n = 2 + i % 3
            a, b, bias = rng.standard_normal((3, 4)), rng.standard_normal((4, n)), rng.standard_normal(n)
            got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
            np.testing.assert_allclose(got, np.maximum(a @ b + bias, 0), rtol=1e-12)
    finally:
        stop.set()
        t.join()
    assert released  # the trap was armed


# -- executor kept across re-plans (#15 item 9) --------------------------------------------------------------
def test_matmul_keeps_its_executor_when_reset_operands_replans():
    a, b = _rand(4, 3), _rand(3, 2, seed=1)
    with nvdispatch.set_backend("torch", coerce=True):
        mm = nvdispatch.Matmul(a, b).plan()
    assert mm.executor == "torch"
    a2 = np.asfortranarray(_rand(4, 3, seed=2))
    mm.reset_operands(a=a2)  # other strides: re-planned, outside the backend context
    r = mm.execute()
    assert mm.executor == "torch" and isinstance(r, torch.Tensor)
    np.testing.assert_allclose(r.numpy(), a2 @ b, rtol=1e-12)
    mm.plan()  # an explicit plan() selects afresh
    assert mm.executor == "numpy"


def test_fft_keeps_its_executor_when_reset_operand_replans():
    x = _rand(4, 8) + 0j
    with nvdispatch.set_backend("torch", coerce=True):
        f = nvdispatch.fft.FFT(x, axes=(1,)).plan()
    assert f.executor == "torch"
    x2 = np.asfortranarray(_rand(4, 8, seed=5) + 0j)
    f.reset_operand(x2)
    r = f.execute()
    assert f.executor == "torch" and isinstance(r, torch.Tensor)
    np.testing.assert_allclose(r.numpy(), np.fft.fft(x2, axis=1), rtol=1e-12, atol=1e-12)


# -- thread safety of one object ----------------------------------------------------------------------------
def test_one_matmul_object_from_many_threads():
    rng = np.random.default_rng(7)
    a, b, bias = rng.standard_normal((16, 8)), rng.standard_normal((8, 4)), rng.standard_normal(4)
    want = np.maximum(a @ b + bias, 0)
    mm = nvdispatch.Matmul(a, b).plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    failures = []
    stop = threading.Event()

    def execute():
        try:
            for _ in range(40):
                np.testing.assert_allclose(mm.execute(), want, rtol=1e-12)
        except Exception as exc:  # noqa: BLE001
            failures.append(exc)

    def restride():  # same values, alternating layouts: re-plans while others execute
        orders = [np.ascontiguousarray(a), np.asfortranarray(a)]
        i = 0
        while not stop.is_set():
            mm.reset_operands(a=orders[i % 2])
            plan_cache.clear()
            i += 1
            time.sleep(0.001)

    workers = [threading.Thread(target=execute) for _ in range(6)]
    r = threading.Thread(target=restride)
    r.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    r.join()
    assert not failures, failures[:2]
    mm.free()
    with pytest.raises(errors.PlanStateError):
        mm.execute()


def test_one_fft_object_from_many_threads():
    x = _rand(8, 16) + 1j * _rand(8, 16, seed=9)
    want_f, want_i = np.fft.fft(x, axis=1), np.fft.ifft(x, axis=1)
    f = nvdispatch.fft.FFT(x, axes=(1,)).plan()
    failures = []
    stop = threading.Event()

    def execute(i):
        try:
            for _ in range(30):
                if i % 2:
                    np.testing.assert_allclose(f.execute(), want_f, rtol=1e-12, atol=1e-12)
                else:
                    np.testing.assert_allclose(f.execute(direction="inverse"), want_i, rtol=1e-12, atol=1e-12)
        except Exception as exc:  # noqa: BLE001
            failures.append(exc)

    def restride():
        layouts = [np.ascontiguousarray(x), np.asfortranarray(x)]
        i = 0
        while not stop.is_set():
            f.reset_operand(layouts[i % 2])
            plan_cache.clear()
            i += 1
            time.sleep(0.001)

    workers = [threading.Thread(target=execute, args=(i,)) for i in range(6)]
    r = threading.Thread(target=restride)
    r.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    r.join()
    assert not failures, failures[:2]
    f.free()


# -- autotune (#15 item 11) ----------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["ufunc", "panels"])
def test_an_interrupted_autotune_leaves_the_shared_plan_and_explain_as_they_were(monkeypatch, engine):
    from nvdispatch.executors import numpy_matmul, numpy_matmul_engines

    rng = np.random.default_rng(3)
    # a result over one block (256 KiB): strategy inplace runs the blocked NumPy plan or the row panels (as
    # calibrated; forced here), whose autotunes have knobs to try
    a, b, bias = rng.standard_normal((700, 40)), rng.standard_normal((40, 50)), rng.standard_normal(50)
    kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}, "preferences": {"strategy": "inplace"}}
    plan_cache.clear()
    monkeypatch.setattr(numpy_matmul, "_inplace_engine", lambda problem, tuning: engine)
    mm = nvdispatch.Matmul(a, b).plan(**kw)
    shared = mm._plan
    cls = numpy_matmul.NumpyMatmulPlan if engine == "ufunc" else numpy_matmul_engines.EnginePlan
    assert isinstance(shared, cls) and (engine == "ufunc") == (type(shared).__name__ == "NumpyMatmulPlan")
    knobs = ("block_rows", "threads", "steps") if engine == "ufunc" else ("panel_rows", "threads", "steps")
    before = tuple(getattr(shared, k) for k in knobs)
    explained = nvdispatch.explain(a, b, **kw).steps
    real = cls.execute
    calls = [0]

    def interrupting(self, operands, stream=None):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return real(self, operands, stream)

    monkeypatch.setattr(cls, "execute", interrupting)
    with pytest.raises(KeyboardInterrupt):
        mm.autotune(iterations=1)
    monkeypatch.setattr(cls, "execute", real)
    assert tuple(getattr(shared, k) for k in knobs) == before
    assert mm._plan is shared and mm.strategy == "inplace"
    assert nvdispatch.explain(a, b, **kw).steps == explained == shared.steps
    np.testing.assert_allclose(mm.execute(), np.maximum(a @ b + bias, 0), rtol=1e-12)
    assert plan_cache.users(shared) == 1  # only mm's hold: the autotune let go of everything it pinned
