"""Trace-time autotuning of staged matmuls on the GPU (nvdispatch/integrations/jax_autotune.py): a jitted fp32
matmul of a mid-size problem is timed once when traced (a re-trace, a new program or a new plan of the problem
does not time again), its results stay within TF32's bound of a float64 reference, ``explain()`` says so, a fresh
process takes the choice from the tunings file, ``off`` times nothing, and a function traced with it off is traced
again and tuned where it is called with it on; on both GPU routes.

Run on the H200: ``python3 -m pytest -m gpu tests/jax_integration/test_jax_gpu_autotune.py -q``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import nvdispatch
from nvdispatch import plan_cache
from nvdispatch._cuda import lt_scratch_autotune
from nvdispatch.executors import cuda_tuning_store
from nvdispatch.integrations import jax_autotune, jax_ffi
from nvdispatch.integrations.jax_autotune import jax_autotune as autotune_in

pytestmark = pytest.mark.gpu

M, N, K = 1024, 1536, 2048  # 6.4e9 flop: tuned in "auto"


def _forget(monkeypatch):
    """What a new process starts with (the plan table's entries aside: a new registry)."""
    plan_cache.clear()
    plan_cache.clear_tunings()
    monkeypatch.setattr(jax_autotune, "_outcomes", {})
    monkeypatch.setattr(jax_autotune, "_by_product", {})
    monkeypatch.setattr(cuda_tuning_store, "_stores", {})
    monkeypatch.setattr(jax_ffi, "_registry", jax_ffi._Registry())
    jax.clear_caches()


@pytest.fixture
def timed(monkeypatch, tmp_path):
    """The timings made on scratch buffers, in a fresh state with the tunings file in a temporary directory."""
    monkeypatch.setenv("NVDISPATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NVDISPATCH_JAX_AUTOTUNE", raising=False)
    _forget(monkeypatch)
    seen = []
    real = lt_scratch_autotune.autotune_on_scratch

    def spy(plan, *args, **kwargs):
        got = real(plan, *args, **kwargs)
        seen.append((plan.problem, got))
        return got

    monkeypatch.setattr(lt_scratch_autotune, "autotune_on_scratch", spy)
    yield seen
    plan_cache.clear()
    plan_cache.clear_tunings()


def _operands(seed=0, m=M, n=N, k=K):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32),
            rng.standard_normal(n).astype(np.float32))


def _layer(a, b, bias):
    return nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})


def _check(got, a, b, bias):
    want = np.maximum(a.astype(np.float64) @ b + bias, 0)
    assert np.abs(np.asarray(got, np.float64) - want).max() <= 5e-3 * np.abs(want).max()  # TF32's bound, as jnp's


def _explained(a, b, bias) -> str:
    return nvdispatch.explain(jax.numpy.asarray(a), jax.numpy.asarray(b), epilog="RELU_BIAS",
                              epilog_inputs={"bias": jax.numpy.asarray(bias)}).compiled


@pytest.mark.parametrize("route", ["ffi-graphs", "callback"])
def test_a_jitted_matmul_is_autotuned_once_when_traced(timed, route, caplog):
    a, b, bias = _operands()
    with jax_ffi.jax_route(route), caplog.at_level(logging.DEBUG, logger="nvdispatch"):
        _check(jax.jit(_layer)(a, b, bias), a, b, bias)
    assert len(timed) == 1
    problem, candidates = timed[0]
    assert (problem.m, problem.n, problem.k) == (M, N, K)
    assert sum(np.isfinite(t) for _, t in candidates) > 1 and len(candidates) <= jax_autotune.MAX_CANDIDATES
    messages = [r.getMessage() for r in caplog.records]
    assert any("candidates screened" in m for m in messages) and any("autotuned (timed when the program was traced)" in m for m in messages)
    assert "when last traced: timed when the program was traced" in _explained(a, b, bias)
    with jax_ffi.jax_route(route):
        jax.clear_caches()
        _check(jax.jit(lambda *xs: _layer(*xs))(a, b, bias), a, b, bias)  # re-traced
        plan_cache.clear()  # the plan let go: the next is a new plan of the problem, starting with the choice
        jax.clear_caches()
        a2, b2, bias2 = _operands(seed=1)
        _check(jax.jit(lambda *xs: _layer(*xs))(a2, b2, bias2), a2, b2, bias2)
    assert len(timed) == 1
    if route != "callback":
        assert jax_ffi.staged_plans()[-1].tuning() is not None


@pytest.mark.parametrize("route", ["ffi-graphs", "callback"])
def test_a_function_traced_with_tuning_off_is_tuned_when_called_with_it_on(timed, route):
    a, b, bias = _operands(seed=4)
    f = jax.jit(_layer)
    with jax_ffi.jax_route(route):
        with autotune_in("off"):
            _check(f(a, b, bias), a, b, bias)
        assert timed == []
        _check(f(a, b, bias), a, b, bias)  # the process's "auto": traced again, and tuned
    assert len(timed) == 1 and (timed[0][0].m, timed[0][0].n, timed[0][0].k) == (M, N, K)
    assert "when last traced: timed when the program was traced" in _explained(a, b, bias)
    if route != "callback":
        assert jax_ffi.staged_plans()[-1].tuning() is not None


def test_batched_products_under_vmap_are_tuned_as_their_own_problem(timed):
    a, b, bias = _operands(m=512, n=1024, k=1024)
    stack = np.stack([a, a[::-1]])
    with jax_ffi.jax_route("ffi-graphs"):  # (the callback route's batched shapes are planned, untuned, when run)
        got = jax.jit(jax.vmap(lambda x: _layer(x, b, bias)))(stack)
    for x, y in zip(stack, np.asarray(got)):
        _check(y, x, b, bias)
    assert (2,) in [problem.batch_shape for problem, *_ in timed]


def test_off_times_nothing_and_the_heuristic_computes_the_same_product(timed, monkeypatch):
    a, b, bias = _operands(seed=2)
    with autotune_in("off"):
        _check(jax.jit(_layer)(a, b, bias), a, b, bias)
    assert timed == []
    monkeypatch.setenv("NVDISPATCH_JAX_AUTOTUNE", "off")
    assert _explained(a, b, bias).endswith("the heuristic's first answer (trace-time autotuning off: "
                                           "NVDISPATCH_JAX_AUTOTUNE)")


def test_a_fresh_state_takes_the_kept_choice_without_timing(timed, monkeypatch, tmp_path):
    a, b, bias = _operands(seed=3)
    jax.jit(_layer)(a, b, bias).block_until_ready()
    assert len(timed) == 1
    (name,) = [f for f in os.listdir(tmp_path) if f.startswith("cuda-tunings-") and f.endswith(".json")]
    _forget(monkeypatch)
    _check(jax.jit(lambda *xs: _layer(*xs))(a, b, bias), a, b, bias)
    assert len(timed) == 1
    assert f"kept in {tmp_path / name}" in _explained(a, b, bias)


def test_a_new_process_takes_the_kept_choice_without_timing(tmp_path):
    script = textwrap.dedent(f"""
        import jax, numpy as np, nvdispatch
        from nvdispatch._cuda import lt_scratch_autotune
        timed = []
        real = lt_scratch_autotune.autotune_on_scratch
        lt_scratch_autotune.autotune_on_scratch = lambda *a, **k: timed.append(1) or real(*a, **k)
        rng = np.random.default_rng(0)
        a, b, bias = (rng.standard_normal(s).astype(np.float32) for s in (({M}, {K}), ({K}, {N}), ({N},)))
        f = jax.jit(lambda a, b, bias: nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={{"bias": bias}}))
        f(a, b, bias).block_until_ready()
        print(len(timed))
        print(nvdispatch.explain(*map(jax.numpy.asarray, (a, b)), epilog="RELU_BIAS",
                                 epilog_inputs={{"bias": jax.numpy.asarray(bias)}}).compiled)
    """)
    env = {**os.environ, "NVDISPATCH_CACHE_DIR": str(tmp_path), "NVDISPATCH_JAX_AUTOTUNE": "auto",
           "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    (first_count, first_note), (second_count, second_note) = (run.stdout.strip().splitlines()[-2:] for run in runs)
    assert (first_count, second_count) == ("1", "0")
    assert "timed when the program was traced" in first_note and "autotuned in an earlier process" in second_note
