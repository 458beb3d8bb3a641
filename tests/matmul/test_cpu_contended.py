"""The CPU linear layer's engine picked per call by whether another thread of the process is running
(``cpu_contention``, ``numpy_matmul_contended``): the look at the threads' states (a busy thread seen, an idle
process not), the two answers a calibration keeps where they differ (forced here, as the other
``test_calibration_can_choose_*`` tests force theirs), the plan taking the busy engine while a thread spins and
the free one otherwise, results against the float64 oracle either way, the answers kept in the store and read
back, explain and the DEBUG log. No timing is asserted."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
from matmul_reference import assert_close, expected

import nvdispatch
from nvdispatch import Epilog
from nvdispatch.executors import blas_threads, cpu_contention, numpy_blas, numpy_matmul, numpy_matmul_calibration
from nvdispatch.executors import cpu_calibration_store as cal_store
from nvdispatch.executors.cpu_threads import CPUS
from nvdispatch.executors.numpy_matmul_contended import ContendedPlan

LOOK = cpu_contention.probe()
needs_look = pytest.mark.skipif(LOOK is None or LOOK() is None, reason="no compiled extension or no /proc")


class _Busy:
    """A thread busy in compiled code (NumPy sorting with the GIL let go) until the block ends."""

    def __enter__(self):
        self.stop = threading.Event()
        x = np.random.default_rng(0).standard_normal(1 << 18)

        def work():
            while not self.stop.is_set():
                np.sort(x)

        self.thread = threading.Thread(target=work, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def _quiet():
    """Let the BLAS's workers an earlier product left spinning go to sleep."""
    blas_threads.let_workers_sleep()


def _looks(n=50):
    got = []
    for _ in range(n):
        got.append(cpu_contention.running_threads())
        time.sleep(1e-3)
    return got


@needs_look
def test_a_busy_thread_is_seen_and_an_idle_process_is_not():
    with _Busy():
        assert any(r >= 1 for r in _looks())
    _quiet()
    assert any(r == 0 for r in _looks())  # (the caller itself is never counted)


@needs_look
@pytest.mark.skipif(not blas_threads.controllable() or CPUS < 2, reason="no threaded OpenBLAS")
def test_the_blas_worker_spinning_after_a_product_is_seen():
    a = np.ones((512, 512), np.float32)
    seen = []
    for _ in range(5):
        np.matmul(a, a)
        seen.append(cpu_contention.running_threads())
    assert any(r >= 1 for r in seen)


def test_without_the_extension_the_cores_are_taken_as_free(monkeypatch):
    monkeypatch.setattr(cpu_contention, "hotpath", lambda: None)
    assert cpu_contention.probe() is None and cpu_contention.running_threads() is None


# -- two answers, forced -------------------------------------------------------------------------------------
def _operands(m=70, k=9, n=11, dtype="float32"):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype)
    return a, b, {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}


def _two_answers(free: str, busy: str, seconds: float = 1.0):
    """A ``_measure`` whose settled timing puts ``free`` first and whose timing right after a product puts ``busy``
    first (``seconds`` per call for the winners, twice that for the others)."""

    def measure(rep, candidates, make_plan):
        settled = {e: seconds * (1 if e == free else 2) for e in candidates}
        mixed = {e: seconds * (1 if e == busy else 2) for e in candidates}
        return {e: max(settled[e], mixed[e]) for e in candidates}, settled, mixed

    return measure


@pytest.fixture
def forced(monkeypatch, tmp_path):
    """The class's two answers forced: ``tiled`` with the cores free, another ``inplace`` engine when busy;
    ``tiled`` on threads of its own (as where NumPy's BLAS has no pool to run it on: two answers are kept only
    where the engine first with the cores free runs threads of its own)."""
    monkeypatch.setenv(cal_store.ENV, str(tmp_path))
    monkeypatch.setattr(numpy_blas, "pool", lambda: None)
    numpy_matmul_calibration.clear()
    nvdispatch.plan_cache.clear()
    a, b, kw = _operands()
    problem = nvdispatch.explain(a, b, **kw).problem
    have = numpy_matmul.candidates(problem)
    if "tiled" not in have:
        pytest.skip("no tiled engine (no compiled extension)")
    busy = next(e for e in ("gemm", "sweep", "ufunc") if e in have)
    monkeypatch.setattr(numpy_matmul_calibration, "_measure", _two_answers("tiled", busy))
    ranked = numpy_matmul.calibrate(problem)
    nvdispatch.plan_cache.clear()
    yield a, b, kw, busy, ranked
    numpy_matmul_calibration.clear()
    nvdispatch.plan_cache.clear()


def _matmul_plan(a, b, kw):
    mm = nvdispatch.Matmul(a, b)
    mm.plan(**kw)
    return mm, mm._plan


def test_the_calibration_keeps_both_answers_and_explain_says_so(forced):
    a, b, kw, busy, ranked = forced
    assert ranked.free[0] == "tiled" and ranked.busy[0] == busy
    info = nvdispatch.explain(a, b, **kw)
    assert info.strategy == "inplace"
    head = f"engine 'tiled' when the cores are free, {busy!r} when another thread of this process is running"
    assert any(s.startswith(head) for s in info.steps)
    assert any(s.startswith("cores free:") and "engine 'tiled'" in s for s in info.steps)
    assert any(s.startswith("thread busy:") and f"engine {busy!r}" in s for s in info.steps)
    assert "with the cores free tiled" in info.steps[-1] and f"running {busy}" in info.steps[-1]
    (entry,) = numpy_matmul_calibration.calibrations().values()
    assert entry["free"][0] == "tiled" and entry["busy"][0] == busy


def test_both_answers_are_kept_in_the_store_and_read_back(forced, tmp_path):
    a, b, kw, busy, ranked = forced
    kept = cal_store.store().section("matmul")
    (record,) = kept.values()
    assert record["free"]["order"][0] == "tiled" and record["busy"]["order"][0] == busy
    numpy_matmul_calibration.clear()  # (this process forgets: the next plan reads the file)
    nvdispatch.plan_cache.clear()
    again = numpy_matmul.engine_choice(nvdispatch.explain(a, b, **kw).problem).ranking
    assert again.source == "persisted"
    assert again.free == ranked.free and again.busy == ranked.busy
    assert isinstance(_matmul_plan(a, b, kw)[1], ContendedPlan)


@pytest.mark.parametrize("running, side", [(0, "free"), (None, "free"), (1, "busy"), (3, "busy")])
def test_the_plan_runs_the_engine_the_look_says(forced, running, side):
    a, b, kw, busy, _ = forced
    problem = nvdispatch.explain(a, b, **kw).problem
    ran = []
    inner = {"free": numpy_matmul.engine_plan(problem, "tiled"), "busy": numpy_matmul.engine_plan(problem, busy)}
    for name, p in inner.items():
        for attr in ("direct", "execute"):
            real = getattr(p, attr)

            def spied(*args, _real=real, _name=name, **kwargs):
                ran.append(_name)
                return _real(*args, **kwargs)

            setattr(p, attr, spied)
    plan = ContendedPlan(problem, inner["free"], inner["busy"])
    plan._look = lambda: running
    bias = kw["epilog_inputs"]["bias"]
    want, _ = expected(a, b, None, 1, None, Epilog.RELU_BIAS, kw["epilog_inputs"])
    assert_close(plan.direct(a, b, bias), want, "float32")
    assert_close(plan.execute({"a": a, "b": b, "bias": bias, "alpha": 1, "beta": None}), want, "float32")
    assert ran == [side, side]
    assert getattr(plan, f"{side}_calls") == 2 and plan.free_calls + plan.busy_calls == 2


@pytest.mark.parametrize("running", [0, 2])
def test_the_route_logs_which_engine_ran_and_why(forced, monkeypatch, caplog, running):
    a, b, kw, busy, _ = forced
    monkeypatch.setattr(cpu_contention, "probe", lambda: lambda: running)
    want, _ = expected(a, b, None, 1, None, Epilog.RELU_BIAS, kw["epilog_inputs"])
    with caplog.at_level(logging.DEBUG, logger="nvdispatch"):
        for _ in range(2):  # planning, then the cached plan's hot path
            assert_close(nvdispatch.matmul(a, b, **kw), want, "float32")
    if running:
        assert caplog.text.count(f"engine {busy}: {running} other thread(s) of this process running") == 2
    else:
        assert caplog.text.count("engine tiled: no other thread running") == 2


@needs_look
def test_the_plan_takes_the_busy_engine_while_a_thread_spins_and_the_free_one_otherwise(forced):
    a, b, kw, busy, _ = forced
    want, _ = expected(a, b, None, 1, None, Epilog.RELU_BIAS, kw["epilog_inputs"])
    mm, plan = _matmul_plan(a, b, kw)
    assert isinstance(plan, ContendedPlan)
    with _Busy():
        for _ in range(50):
            assert_close(mm.execute(), want, "float32")
            time.sleep(1e-3)
    assert plan.busy_calls >= 1
    _quiet()
    free_before = plan.free_calls
    for _ in range(20):
        assert_close(mm.execute(), want, "float32")
    assert plan.free_calls > free_before


def _assert_one_answer(monkeypatch, tmp_path, own_threads: bool, seconds: float) -> None:
    """A calibration timing ``tiled`` first with the cores free and ``ufunc`` first right after a product
    (``seconds`` a call) keeps one answer: none in the store, no per-call plan. ``own_threads``: ``tiled`` on
    threads of its own (as without NumPy's BLAS pool), else on that pool (skipped where there is none)."""
    monkeypatch.setenv(cal_store.ENV, str(tmp_path))
    if own_threads:
        monkeypatch.setattr(numpy_blas, "pool", lambda: None)
    elif numpy_blas.pool() is None:
        pytest.skip("NumPy's BLAS has no thread pool")
    numpy_matmul_calibration.clear()
    nvdispatch.plan_cache.clear()
    a, b, kw = _operands()
    problem = nvdispatch.explain(a, b, **kw).problem
    if "tiled" not in numpy_matmul.candidates(problem) or cpu_contention.probe_seconds() == 0:
        pytest.skip("no tiled engine or nothing to look at")
    assert (numpy_matmul.engine_plan(problem, "tiled").own_threads > 1) == (own_threads and CPUS > 1)
    monkeypatch.setattr(numpy_matmul_calibration, "_measure", _two_answers("tiled", "ufunc", seconds=seconds))
    try:
        ranked = numpy_matmul.calibrate(problem)
        assert ranked.free is None and ranked.busy is None
        assert "free" not in next(iter(cal_store.store().section("matmul").values()))
        assert not isinstance(_matmul_plan(a, b, kw)[1], ContendedPlan)
    finally:
        numpy_matmul_calibration.clear()
        nvdispatch.plan_cache.clear()


def test_an_engine_on_the_blas_pool_first_with_the_cores_free_keeps_one_answer(monkeypatch, tmp_path):
    """``tiled`` on NumPy's OpenBLAS workers meets their spinning as the BLAS engines do: another engine first right
    after a product is the timings' noise, and the class keeps one answer (the slower setting's ranking)."""
    _assert_one_answer(monkeypatch, tmp_path, own_threads=False, seconds=1.0)


def test_a_class_whose_call_is_too_short_to_look_keeps_one_answer(monkeypatch, tmp_path):
    _assert_one_answer(monkeypatch, tmp_path, own_threads=True, seconds=1e-9)


def test_a_store_of_the_former_format_is_ignored(monkeypatch, tmp_path):
    """A file of format 1 (one order per class) under the current name is read as no calibration, never an
    error."""
    import json

    monkeypatch.setenv(cal_store.ENV, str(tmp_path))
    numpy_matmul_calibration.clear()
    path = cal_store.store().path
    with open(path, "w") as fh:
        json.dump({"format": 1, "key": cal_store.machine_key(), "sections": {"matmul": {}}}, fh)
    cal_store.store().forget()
    a, b, kw = _operands()
    try:
        assert numpy_matmul.engine_choice(nvdispatch.explain(a, b, **kw).problem).ranking.source == "default"
    finally:
        numpy_matmul_calibration.clear()
        nvdispatch.plan_cache.clear()


# -- the busy engine's own spinning worker ---------------------------------------------------------------------
class _Fake:
    """An inner plan whose call takes ``seconds`` of a fake clock; the busy one's leaves a worker spinning."""

    def __init__(self, name, world):
        self.engine, self.world, self.steps = name, world, ()

    def direct(self, *args):
        w = self.world
        w["now"] += 0.03
        w["ran"].append(self.engine)
        if self.engine == "busy":
            w["spins_until"] = w["now"] + 0.1  # (OpenBLAS's worker, after its last call)
        return args

    execute = direct


def _world(monkeypatch, always_running: bool):
    from nvdispatch.executors import numpy_matmul_contended

    world = {"now": 100.0, "ran": [], "spins_until": 100.05}  # (a worker spinning as the loop starts)
    monkeypatch.setattr(numpy_matmul_contended, "_clock", lambda: world["now"])
    plan = ContendedPlan(None, _Fake("free", world), _Fake("busy", world))
    plan._look = lambda: 1 if always_running or world["now"] < world["spins_until"] else 0
    plan._took = lambda busy, why: busy  # (no problem to log)
    return plan, world


def test_a_loop_of_the_call_alone_leaves_the_busy_engine_its_own_worker_spinning_started(monkeypatch):
    """The busy engine's own worker would keep every look busy: the free engine is tried, and kept."""
    from nvdispatch.executors.numpy_matmul_contended import EXPLORE_FIRST

    plan, world = _world(monkeypatch, always_running=False)
    for _ in range(50):
        plan.direct()
    ran = world["ran"]
    assert ran[0] == "busy" and ran[-20:] == ["free"] * 20
    assert ran.count("busy") <= EXPLORE_FIRST + 1 and plan._explore == EXPLORE_FIRST


def test_where_another_thread_keeps_running_the_tries_of_the_free_engine_grow_rare(monkeypatch):
    from nvdispatch.executors.numpy_matmul_contended import EXPLORE_MOST

    plan, world = _world(monkeypatch, always_running=True)
    for _ in range(3000):
        plan.direct()
    ran = world["ran"]
    assert ran.count("busy") > 0.9 * len(ran)
    assert ran[-100:].count("free") <= 10 and plan._explore >= 256
    assert plan._explore <= EXPLORE_MOST


def test_the_calibration_report_names_the_classes_picked_per_call(monkeypatch, tmp_path):
    from nvdispatch.calibration import CalibrationReport, calibrate

    monkeypatch.setenv(cal_store.ENV, str(tmp_path))
    monkeypatch.setattr(numpy_blas, "pool", lambda: None)
    a, b, kw = _operands()
    if "tiled" not in numpy_matmul.candidates(nvdispatch.explain(a, b, **kw).problem):
        pytest.skip("no tiled engine (no compiled extension)")
    monkeypatch.setattr(numpy_matmul_calibration, "_measure", _two_answers("tiled", "ufunc"))
    numpy_matmul_calibration.clear()
    try:
        report = calibrate([(64, 32, 16)], fft=False, quick=True)
    finally:
        numpy_matmul_calibration.clear()
        nvdispatch.plan_cache.clear()
    assert report.per_call and set(report.per_call) <= set(report.matmul)
    assert all(free[0] == "tiled" and busy[0] == "ufunc" for free, busy in report.per_call.values())
    said = f"{len(report.per_call)} class(es) pick their engine per call: tiled with the cores free, ufunc with"
    assert said in str(report)
    assert "per call" not in str(CalibrationReport({}, None, None, 1.0))
