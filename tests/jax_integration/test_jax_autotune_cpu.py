"""Trace-time autotuning of staged GPU matmul plans (nvdispatch/integrations/jax_autotune.py) without a GPU: the
mode (``NVDISPATCH_JAX_AUTOTUNE``, ``jax_autotune``), the size rule, one timing per problem in a process, the
cuBLASLt tunings file (keyed by the GPU's environment, a damaged file or entry ignored, ``NVDISPATCH_CACHE_DIR=""``)
and what ``explain()`` says; cuBLASLt, the GPU's environment and the timing on scratch buffers are fakes. The
FFI route tunes each plan entry once, with the mode it was traced with. On the GPU: test_jax_gpu_autotune.py."""

from __future__ import annotations

import json
import os
import pathlib
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nvdispatch
from nvdispatch import plan_cache
from nvdispatch._cuda import lt_autotune, lt_scratch_autotune
from nvdispatch._detect import Device
from nvdispatch.errors import InvalidArgumentError
from nvdispatch.executors import cuda_tuning_store
from nvdispatch.executors.cpu_calibration_store import CalibrationStore
from nvdispatch.integrations import jax_autotune, jax_ffi
from nvdispatch.integrations.jax_autotune import MIN_FLOP, autotune_mode, tune_staged
from nvdispatch.integrations.jax_autotune import jax_autotune as autotune_in
from nvdispatch.integrations.jax_matmul_kernel import MatmulCall, _device_problem
from nvdispatch.integrations.jax_precision import with_convention

from .test_jax_ffi_cpu import needs_handler, staged, target  # noqa: F401 - the FFI fixtures

ENV = {"gpu": "NVIDIA Fake GPU", "cc": "9.0", "driver": 13000, "cublaslt": 130100}


def _problem(m, n, k, epilog="RELU_BIAS"):
    call = MatmulCall(epilog=epilog)
    arrays = {"a": jnp.ones((m, k)), "b": jnp.ones((k, n))}
    if "BIAS" in epilog:
        arrays["bias"] = jnp.ones((1, n))
    views = {name: () for name in arrays}
    return _device_problem(call, with_convention(call.options, "float32"), arrays, views, Device("cuda", 0))


class FakePlan:
    """What trace-time autotuning uses of a cuBLASLt plan."""

    tuning_kind = lt_autotune.TUNING_KIND
    validate_tuning = staticmethod(lt_autotune.validate_choice)
    strategy = "native"
    device_index = 0

    def __init__(self, problem):
        self.problem = problem
        self.tuned = None
        self.algorithm = "heuristic #0"


def _result(tag: int):
    return SimpleNamespace(algo=SimpleNamespace(data=[tag, 0, 0, 0, 0, 0, 0, 7]), workspaceSize=1024)


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    """A fake GPU environment, cuBLASLt check and scratch timing; a fresh process's state; the tunings file in a
    temporary NVDISPATCH_CACHE_DIR."""
    env = dict(ENV)
    seen = SimpleNamespace(timed=[], env=env, fail=None)
    monkeypatch.setattr(lt_autotune, "environment", lambda device_index: seen.env)
    monkeypatch.setenv("NVDISPATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NVDISPATCH_JAX_AUTOTUNE", raising=False)

    def saved_choice(plan, tuning=None):  # cuBLASLt's check: a record made in this environment is taken
        if not isinstance(tuning, dict) or tuning.get("env") != seen.env:
            return None
        plan.tuned = tuning
        return f"checked {tuning['data'][0]}"

    def on_scratch(plan, alpha=1, beta=None, **bounds):
        if seen.fail is not None:
            raise seen.fail
        seen.timed.append((plan.problem, alpha, beta, bounds))
        plan.algorithm = "tuned"
        lt_autotune.record(plan, _result(5), "heuristic #5 split-K 2", 1.5e-4)
        return [("heuristic #0", 2e-4), ("heuristic #5 split-K 2", 1.5e-4), ("tile 3", float("inf"))]

    monkeypatch.setattr(lt_autotune, "saved_choice", saved_choice)
    monkeypatch.setattr(lt_scratch_autotune, "autotune_on_scratch", on_scratch)
    fresh_process(monkeypatch)
    yield seen
    fresh_process(monkeypatch)


def fresh_process(monkeypatch):
    """What a new process starts with: no recorded tunings, no outcomes, no store read yet."""
    plan_cache.clear_tunings()
    monkeypatch.setattr(jax_autotune, "_outcomes", {})
    monkeypatch.setattr(jax_autotune, "_by_product", {})
    monkeypatch.setattr(cuda_tuning_store, "_stores", {})


def _files(path) -> list[str]:
    return sorted(f for f in os.listdir(path) if f.startswith("cuda-tunings-") and f.endswith(".json"))


# -- the mode -------------------------------------------------------------------------------------------------
def test_the_mode_comes_from_the_environment_and_the_block_wins(monkeypatch):
    monkeypatch.delenv("NVDISPATCH_JAX_AUTOTUNE", raising=False)
    assert autotune_mode() == "auto"
    monkeypatch.setenv("NVDISPATCH_JAX_AUTOTUNE", " OFF ")
    assert autotune_mode() == "off"
    with autotune_in("always"):
        assert autotune_mode() == "always"
    assert autotune_mode() == "off"
    monkeypatch.setenv("NVDISPATCH_JAX_AUTOTUNE", "yes")
    with pytest.raises(InvalidArgumentError, match="NVDISPATCH_JAX_AUTOTUNE.*auto, always, off.*'yes'"):
        autotune_mode()
    for bad in ("fast", True, None):
        with pytest.raises(InvalidArgumentError, match="mode"):
            with autotune_in(bad):
                pass


def _spy_on_staged_modes(monkeypatch) -> list:
    """The autotune mode of every staged call traced from now on, in order."""
    from nvdispatch.integrations import jax_matmul

    seen = []
    real = jax_matmul._staged

    def spy(call, *args):
        seen.append(call.autotune)
        return real(call, *args)

    monkeypatch.setattr(jax_matmul, "_staged", spy)
    return seen


def test_a_staged_call_carries_the_mode_it_was_traced_with(monkeypatch):
    seen = _spy_on_staged_modes(monkeypatch)
    a, b = jnp.ones((4, 3)), jnp.ones((3, 2))
    monkeypatch.setenv("NVDISPATCH_JAX_AUTOTUNE", "off")
    jax.jit(lambda a, b: nvdispatch.matmul(a, b))(a, b)
    with autotune_in("always"):
        jax.jit(lambda a, b: nvdispatch.matmul(a, b, alpha=2.0))(a, b)
    assert seen == ["off", "always"]


@pytest.mark.skipif(not hasattr(jax, "make_user_context"), reason="this JAX has no user contexts in its trace key")
def test_a_function_jitted_earlier_is_traced_again_under_another_mode(monkeypatch):
    seen = _spy_on_staged_modes(monkeypatch)
    monkeypatch.delenv("NVDISPATCH_JAX_AUTOTUNE", raising=False)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)

    def product(a, b):
        return nvdispatch.matmul(a, b)

    f = jax.jit(product)
    got = []
    with autotune_in("off"):
        got += [f(a, b), f(a, b)]  # the second call: JAX's program of the first
    got.append(f(a, b))  # the process's "auto": traced again
    with autotune_in("always"):
        got.append(jax.jit(product)(a, b))  # the same function jitted again: traced again too
    with autotune_in("off"):
        got.append(f(a, b))  # JAX's "off" program again
    assert seen == ["off", "auto", "always"]
    for y in got:
        np.testing.assert_allclose(np.asarray(y, np.float64), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-6)


# -- the rule and one timing per problem ------------------------------------------------------------------------------
def test_off_times_nothing_and_reads_no_file(gpu):
    plan = FakePlan(_problem(2048, 2048, 2048))
    got = tune_staged(plan, "always", 2.0, None)  # timed, and kept on disk
    assert len(gpu.timed) == 1 and gpu.timed[0][1:3] == (2.0, None) and "timed when the program was traced" in got
    plan_cache.clear_tunings()
    fresh = FakePlan(_problem(2048, 2048, 2048))
    assert tune_staged(fresh, "off").startswith("the heuristic's first answer (trace-time autotuning off")
    assert fresh.tuned is None and fresh.algorithm == "heuristic #0" and len(gpu.timed) == 1


def test_auto_skips_products_below_the_threshold_and_always_does_not(gpu):
    small = FakePlan(_problem(512, 512, 512))  # 2.7e8 flop
    assert 2 * 512**3 < MIN_FLOP <= 2 * 1024**3
    assert "below the" in tune_staged(small, "auto") and not gpu.timed and small.tuned is None
    assert "timed when" in tune_staged(small, "always") and len(gpu.timed) == 1
    big = FakePlan(_problem(1024, 1024, 1024))
    assert "timed when" in tune_staged(big, "auto") and len(gpu.timed) == 2


def test_a_problem_is_timed_once_in_a_process(gpu):
    problem = _problem(2048, 1024, 4096)
    first = FakePlan(problem)
    said = tune_staged(first, "auto")
    assert len(gpu.timed) == 1 and first.tuned["label"] == "heuristic #5 split-K 2"
    bounds = gpu.timed[0][3]
    assert bounds == {"iterations": jax_autotune.ITERATIONS, "max_candidates": jax_autotune.MAX_CANDIDATES,
                      "budget": jax_autotune.BUDGET_SECONDS}
    assert tune_staged(first, "auto") == said  # re-traced: the same plan
    again = FakePlan(problem)  # another plan of the same problem (the plan cache let the first go)
    assert tune_staged(again, "auto") == said
    assert len(gpu.timed) == 1 and again.algorithm == "checked 5" and again.tuned == first.tuned
    other = FakePlan(_problem(2048, 1024, 4096, epilog="DEFAULT"))
    tune_staged(other, "auto")
    assert len(gpu.timed) == 2


def test_a_failed_timing_keeps_the_heuristic_and_does_not_raise(gpu):
    gpu.fail = RuntimeError("cudaMallocAsync: out of memory")
    plan = FakePlan(_problem(2048, 2048, 2048))
    got = tune_staged(plan, "auto")
    assert got == ("the heuristic's first answer (trace-time autotuning failed: RuntimeError: cudaMallocAsync: out "
                   "of memory)")
    assert plan.tuned is None and plan.algorithm == "heuristic #0"


# -- the tunings file ----------------------------------------------------------------------------------------------------
def test_a_fresh_process_takes_the_kept_choice_without_timing(gpu, tmp_path, monkeypatch):
    problem = _problem(2048, 1024, 4096)
    tune_staged(FakePlan(problem), "auto")
    (name,) = _files(tmp_path)
    data = json.loads((tmp_path / name).read_text())
    assert data["key"] == {"format": 2, **ENV}
    (entry,) = data["sections"][cuda_tuning_store.SECTION].values()
    assert entry["data"] == [5, 0, 0, 0, 0, 0, 0, 7] and entry["label"] == "heuristic #5 split-K 2"
    fresh_process(monkeypatch)
    plan = FakePlan(problem)
    got = tune_staged(plan, "auto")
    assert len(gpu.timed) == 1 and plan.algorithm == "checked 5"
    assert got == f"autotuned in an earlier process, kept in {tmp_path / name} (heuristic #5 split-K 2)"
    assert plan_cache.tuning_for(lt_autotune.tuning_key(plan)) == entry  # later plans in this process too


def test_choices_kept_before_the_confirmation_rule_are_timed_again(gpu, tmp_path, monkeypatch):
    """A format-1 file's choices won on the finalists' medians alone (on the H100 by 0.03%: noise): another
    key, so a process times the problem again and keeps its choice in a file of its own."""
    problem = _problem(2048, 1024, 4096)
    tune_staged(FakePlan(problem), "auto")
    (name,) = _files(tmp_path)
    data = json.loads((tmp_path / name).read_text())
    data["key"]["format"] = 1  # as the version before wrote it, where it wrote it
    old = pathlib.Path(CalibrationStore(str(tmp_path), data["key"], "cuda-tunings-", "cuBLASLt tunings").path)
    old.write_text(json.dumps(data))
    (tmp_path / name).unlink()
    fresh_process(monkeypatch)
    assert "timed when" in tune_staged(FakePlan(problem), "auto") and len(gpu.timed) == 2
    assert old.exists() and len(_files(tmp_path)) == 2  # the old file left as it was


def test_another_gpu_or_cublaslt_reads_another_file(gpu, tmp_path, monkeypatch):
    problem = _problem(2048, 1024, 4096)
    tune_staged(FakePlan(problem), "auto")
    for change in ({"gpu": "NVIDIA Other GPU"}, {"cublaslt": 130200}):
        gpu.env = {**ENV, **change}
        fresh_process(monkeypatch)
        tune_staged(FakePlan(problem), "auto")
    assert len(gpu.timed) == 3 and len(_files(tmp_path)) == 3


@pytest.mark.parametrize("damage", ["not json {", '{"format": 1, "key": "x"}', "[1, 2]"])
def test_a_damaged_file_is_ignored_and_replaced(gpu, tmp_path, monkeypatch, damage):
    problem = _problem(2048, 1024, 4096)
    tune_staged(FakePlan(problem), "auto")
    (name,) = _files(tmp_path)
    (tmp_path / name).write_text(damage)
    fresh_process(monkeypatch)
    plan = FakePlan(problem)
    assert "timed when" in tune_staged(plan, "auto") and len(gpu.timed) == 2
    data = json.loads((tmp_path / name).read_text())  # written whole again
    assert len(data["sections"][cuda_tuning_store.SECTION]) == 1


@pytest.mark.parametrize("field, value", [("data", [1, 2, 3]), ("ws", -1), ("env", {"gpu": "NVIDIA Other GPU"})])
def test_a_damaged_or_foreign_entry_is_skipped(gpu, tmp_path, monkeypatch, field, value):
    problem = _problem(2048, 1024, 4096)
    tune_staged(FakePlan(problem), "auto")
    (name,) = _files(tmp_path)
    data = json.loads((tmp_path / name).read_text())
    section = data["sections"][cuda_tuning_store.SECTION]
    for entry in section.values():
        entry[field] = {**ENV, **value} if field == "env" else value
    (tmp_path / name).write_text(json.dumps(data))
    fresh_process(monkeypatch)
    plan = FakePlan(problem)
    assert "timed when" in tune_staged(plan, "auto") and len(gpu.timed) == 2 and plan.algorithm == "tuned"


def test_no_cache_directory_keeps_the_choice_for_the_process_only(gpu, tmp_path, monkeypatch):
    monkeypatch.setenv("NVDISPATCH_CACHE_DIR", "")
    problem = _problem(2048, 1024, 4096)
    tune_staged(FakePlan(problem), "auto")
    tune_staged(FakePlan(problem), "auto")
    assert len(gpu.timed) == 1 and not _files(tmp_path)
    fresh_process(monkeypatch)
    tune_staged(FakePlan(problem), "auto")
    assert len(gpu.timed) == 2


# -- explain ------------------------------------------------------------------------------------------------------
def test_explain_says_where_the_algorithm_came_from(gpu, monkeypatch):
    a, b, bias = jnp.ones((2048, 4096)), jnp.ones((4096, 1024)), jnp.ones(1024)

    def compiled():
        return nvdispatch.explain(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}).compiled

    assert compiled().endswith("its cuBLASLt algorithm is autotuned when a program staging it is traced (kept for "
                               "the process and in the cuBLASLt tunings file)")
    monkeypatch.setenv("NVDISPATCH_JAX_AUTOTUNE", "off")
    assert compiled().endswith("its cuBLASLt algorithm: the heuristic's first answer (trace-time autotuning off)")
    monkeypatch.setenv("NVDISPATCH_JAX_AUTOTUNE", "auto")
    tune_staged(FakePlan(_problem(2048, 1024, 4096)), "auto")
    assert compiled().endswith("its cuBLASLt algorithm when last traced: timed when the program was traced (2 "
                               "candidates; kept heuristic #5 split-K 2, 150.0 us; the heuristic's first 200.0 us)")
    small = nvdispatch.explain(jnp.ones((8, 4)), jnp.ones((4, 2))).compiled
    assert small.endswith("the heuristic's first answer (128 flop, below the 1.07e+09 that trace-time autotuning "
                          "starts at)")
    assert nvdispatch.explain(np.ones((4, 3)), np.ones((3, 2))).compiled is None


# -- the FFI route: once per plan entry ------------------------------------------------------------------------------
def _stage_with(a, b, bias, autotune):
    call = MatmulCall(epilog="RELU_BIAS", alpha=2.0)
    names, views = ("a", "b", "bias"), {"a": (), "b": (), "bias": ()}
    arrays = dict(zip(names, (a, b, bias)))

    def problem_for(dev, shapes):
        return _device_problem(call, call.options, arrays, views, Device("cuda", dev), shapes)

    return jax_ffi.stage_matmul(problem_for, call.state, call.alpha, call.beta, "row", names, (a, b, bias),
                                autotune=autotune)


@needs_handler
def test_the_ffi_route_tunes_each_entry_once_with_its_traced_mode(staged, monkeypatch):  # noqa: F811
    calls = []
    monkeypatch.setattr(jax_ffi, "tune_staged", lambda plan, mode, alpha, beta: calls.append((mode, alpha, beta)))
    a, b, bias = jnp.ones((6, 3)), jnp.ones((3, 5)), jnp.ones((1, 5))
    jax.jit(lambda a, b, bias: _stage_with(a, b, bias, "auto"))(a, b, bias)
    jax.clear_caches()
    jax.jit(lambda a, b, bias: _stage_with(a, b, bias, "auto"))(a, b, bias)  # re-traced: the same entry
    assert calls == [("auto", 2.0, None)]
    jax.jit(lambda a, b, bias: _stage_with(a, b, bias, "off"))(a, b, bias)  # another mode: its own entry
    assert calls == [("auto", 2.0, None), ("off", 2.0, None)]


def test_a_plan_that_is_not_cublaslts_keeps_its_algorithm(gpu):
    plan = SimpleNamespace(problem=_problem(2048, 2048, 2048))  # another executor's plan
    assert tune_staged(plan, "always") == "the plan's own algorithm (not a cuBLASLt plan)" and not gpu.timed


def test_a_recorded_choice_cublaslt_refuses_is_timed_again(gpu, monkeypatch):
    problem = _problem(2048, 1024, 4096)
    tune_staged(FakePlan(problem), "auto")
    fresh_process(monkeypatch)

    def refuses(plan, tuning=None):
        raise RuntimeError("cublasLtMatmulAlgoCheck failed")

    monkeypatch.setattr(lt_autotune, "saved_choice", refuses)
    plan = FakePlan(problem)
    assert "timed when" in tune_staged(plan, "auto") and len(gpu.timed) == 2


def test_which_products_each_mode_times():
    small, big = _problem(512, 512, 512), _problem(1024, 1024, 1024)
    assert [jax_autotune.wants_timing(p, mode) for p in (small, big) for mode in ("auto", "always", "off")] == [
        False, True, False, True, True, False]


def _fake_gpu_executor(monkeypatch):
    """The recorder as the ``cuda`` executor and JAX's CPU as GPU 0: the callback route's GPU branch plans on
    fakes while tracing. Returns the recorder."""
    from nvdispatch.integrations import jax_buffers, jax_matmul_kernel

    from .test_jax_ffi_cpu import _Recorder

    rec = _Recorder()
    monkeypatch.setattr(jax_buffers, "builtin", lambda name: rec if name == "cuda" else None)
    monkeypatch.setattr(jax_buffers, "candidates", lambda framework, kind: [SimpleNamespace(executor=rec)])
    monkeypatch.setattr(jax_matmul_kernel, "_jax_has_gpu", lambda: True)
    monkeypatch.setattr(jax_matmul_kernel, "gpu_ordinals", lambda: (0,))
    return rec


def test_the_callback_route_plans_and_tunes_while_tracing_where_its_mode_times(monkeypatch):
    from nvdispatch.integrations import jax_matmul_kernel

    rec = _fake_gpu_executor(monkeypatch)
    tuned = []
    monkeypatch.setattr(jax_matmul_kernel, "tune_staged", lambda plan, mode, alpha, beta: tuned.append(
        (plan.problem.m, plan.problem.n, plan.problem.k, mode, alpha)))
    a, b = jnp.ones((6, 3)), jnp.ones((3, 5))
    plan_cache.clear()
    try:
        with jax_ffi.jax_route("callback"):
            for mode in ("off", "auto", "always"):  # 180 flop: only "always" times it
                with autotune_in(mode):
                    got = jax.jit(lambda a, b: nvdispatch.matmul(a, b, alpha=2.0))(a, b)
                np.testing.assert_allclose(np.asarray(got), 2 * np.asarray(a) @ np.asarray(b))  # (the CPU branch ran)
    finally:
        plan_cache.clear()
    assert tuned == [(6, 5, 3, "always", 2.0)] and len(rec.planned) == 1


@pytest.mark.skipif(not hasattr(jax, "make_user_context"), reason="this JAX has no user contexts in its trace key")
def test_a_function_traced_with_autotuning_off_is_tuned_when_called_with_it_on(monkeypatch):
    from nvdispatch.integrations import jax_matmul_kernel

    _fake_gpu_executor(monkeypatch)
    monkeypatch.setattr(jax_autotune, "MIN_FLOP", 1)  # "auto" times this small product
    monkeypatch.delenv("NVDISPATCH_JAX_AUTOTUNE", raising=False)
    tuned = []
    monkeypatch.setattr(jax_matmul_kernel, "tune_staged", lambda plan, mode, alpha, beta: tuned.append(mode))
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((6, 3)).astype(np.float32), rng.standard_normal((3, 5)).astype(np.float32)
    f = jax.jit(lambda a, b: nvdispatch.matmul(a, b, alpha=2.0))
    got = []
    plan_cache.clear()
    try:
        with jax_ffi.jax_route("callback"):
            with autotune_in("off"):
                got.append(f(a, b))
            assert tuned == []
            got.append(f(a, b))  # tuning on (the process's "auto"): traced again, tuned
            assert tuned == ["auto"]
            with autotune_in("off"):
                got.append(f(a, b))  # JAX's "off" program: nothing traced or tuned
    finally:
        plan_cache.clear()
    assert tuned == ["auto"]
    for y in got:  # (the CPU branch ran)
        np.testing.assert_allclose(np.asarray(y, np.float64), 2 * a.astype(np.float64) @ b, rtol=1e-5, atol=1e-6)
