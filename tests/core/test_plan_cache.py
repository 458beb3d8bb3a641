"""The shared plan cache: reuse, statistics, bound, clear, save/load of tuned choices, thread safety."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

import nvdispatch
from nvdispatch import Epilog, plan_cache
from nvdispatch._plan_cache import PlanCache
from tests.matmul.matmul_reference import gelu

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _fresh():
    old = plan_cache.maxsize
    plan_cache.clear()
    yield
    plan_cache.maxsize = old
    plan_cache.clear()


def test_repeated_stateless_call_reuses_the_plan():
    a, b = np.ones((4, 3)), np.ones((3, 2))
    bias = np.ones(2)
    nvdispatch.matmul(a, b, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias})
    s1 = plan_cache.stats()
    nvdispatch.matmul(a, b, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias})
    s2 = plan_cache.stats()
    assert s2["hits"] == s1["hits"] + 1 and s2["misses"] == s1["misses"] and s2["size"] == s1["size"]
    assert nvdispatch.explain(a, b, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias}).cached


def test_keys_distinguish_everything_that_changes_a_plan():
    a = np.ones((4, 3))
    nvdispatch.matmul(a, np.ones((3, 2)))
    nvdispatch.matmul(a, np.ones((3, 5)))  # shape
    nvdispatch.matmul(a.astype(np.float32), np.ones((3, 2), np.float32))  # dtype
    nvdispatch.matmul(np.asfortranarray(a), np.ones((3, 2)))  # strides
    nvdispatch.matmul(a, np.ones((3, 2)), epilog="RELU")  # epilog
    nvdispatch.matmul(a, np.ones((3, 2)), epilog="RELU", options={"bgrad_axis": "m"})  # options
    nvdispatch.matmul(a, np.ones((3, 2)), epilog="RELU", preferences={"strategy": "plain"})  # strategy
    nvdispatch.matmul(torch.ones(4, 3, dtype=torch.float64), torch.ones(3, 2, dtype=torch.float64))  # executor
    assert plan_cache.stats()["hits"] == 0


def test_bounded_lru_evicts_oldest_and_releases():
    cache = PlanCache(maxsize=2)
    released = []

    class P:
        def __init__(self, n):
            self.n = n

        def release(self):
            released.append(self.n)

    for n in range(3):
        cache.put(n, P(n))
    assert cache.get(0) is None and cache.get(2).n == 2
    assert released == [0]
    cache.get(1)  # 1 becomes most recent
    cache.put(3, P(3))
    assert cache.get(2) is None and released == [0, 2]
    cache.maxsize = 1
    assert len(cache) == 1 and cache.stats()["evictions"] == 3
    cache.clear()
    stats = cache.stats()
    assert {k: stats[k] for k in ("hits", "misses", "size", "maxsize", "evictions")} == {
        "hits": 0, "misses": 0, "size": 0, "maxsize": 1, "evictions": 0
    }


def test_size_zero_disables_caching():
    plan_cache.maxsize = 0
    nvdispatch.matmul(np.ones((2, 2)), np.ones((2, 2)), epilog="RELU")
    assert plan_cache.stats()["size"] == 0


def test_save_and_load_tuned_choices(tmp_path):
    a = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
    bias = np.ones(128, np.float32)
    mm = nvdispatch.Matmul(a, b)
    mm.plan(epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias})
    timings = mm.autotune(iterations=2)
    assert set(timings) >= {"inplace", "plain"}  # and the engines this machine has (native, framework_fused)
    path = tmp_path / "tuned.json"
    assert plan_cache.save(path) >= 1
    fresh = PlanCache()
    assert fresh.load(path) >= 1
    from nvdispatch._route import choice_key

    key = choice_key(mm._selection.executor, "matmul", mm._problem)
    assert fresh.tuning_for(key)["strategy"] == mm.strategy
    with pytest.raises(nvdispatch.errors.InvalidArgumentError, match="path"):
        bad = tmp_path / "bad.json"
        bad.write_text('{"format": "other"}')
        fresh.load(bad)


def test_sixteen_threads_hammering_mixed_calls():
    plan_cache.maxsize = 8  # force evictions while threads run
    rng = np.random.default_rng(0)
    shapes = [(m, k, n) for m in (1, 3, 8) for k in (2, 5) for n in (1, 4, 7)]
    errors = []

    def worker(seed):
        r = random.Random(seed)
        try:
            for _ in range(60):
                m, k, n = r.choice(shapes)
                a = rng.standard_normal((m, k))
                b = rng.standard_normal((k, n))
                bias = rng.standard_normal(n)
                kind = r.randrange(4)
                if kind == 0:
                    got, want = nvdispatch.matmul(a, b), a @ b
                elif kind == 1:
                    got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
                    want = np.maximum(a @ b + bias, 0)
                elif kind == 2:
                    got = nvdispatch.matmul(torch.from_numpy(a), torch.from_numpy(b), alpha=2.0).numpy()
                    want = 2 * a @ b
                else:
                    got, aux = nvdispatch.matmul(a, b, epilog="GELU_AUX")
                    want = gelu(a @ b)
                    np.testing.assert_allclose(aux["gelu_aux"], a @ b, rtol=1e-12)
                np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert plan_cache.stats()["size"] <= 8


def test_a_plan_held_under_two_keys_is_one_entry_released_once():
    cache = PlanCache(maxsize=2)
    released = []

    class P:
        def release(self):
            released.append(self)

    p = P()
    cache.put("full", p)
    cache.put("alias", p)
    assert cache.stats()["size"] == 1 and cache.stats()["keys"] == 2
    cache.put("other", P())  # two plans: nothing evicted
    assert released == [] and cache.get("alias") is p and cache.get("full") is p
    cache.get("other")
    cache.put("more", P())  # evicts p (least recent), with both its keys: one eviction
    assert released == [p] and cache.stats()["evictions"] == 1
    assert cache.get("full") is None and cache.get("alias") is None
    cache.clear()
    assert released.count(p) == 1


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_hot_path_reuses_plans_and_stays_right(framework):
    conv = (lambda x: x) if framework == "numpy" else torch.from_numpy
    rng = np.random.default_rng(0)
    a, b, bias = rng.standard_normal((6, 4)), rng.standard_normal((4, 3)), rng.standard_normal(3)
    for alpha in (1, 2, 0.5, -1.5):
        got = nvdispatch.matmul(conv(a), conv(b), alpha=alpha, epilog="GELU_BIAS", epilog_inputs={"bias": conv(bias)})
        want = gelu(alpha * a @ b + bias)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
    hits = plan_cache.stats()["hits"]
    nvdispatch.matmul(conv(a), conv(b), epilog="GELU_BIAS", epilog_inputs={"bias": conv(bias)})
    assert plan_cache.stats()["hits"] == hits + 1
    # a call that differs in shape is validated again, not run with the old plan
    with pytest.raises(nvdispatch.errors.EpilogInputError):
        nvdispatch.matmul(conv(a), conv(b), epilog="GELU_BIAS", epilog_inputs={"bias": conv(bias[:2])})


def test_hot_path_never_accepts_an_alpha_the_full_path_would_reject():
    a = np.ones((2, 2), np.int32)
    assert nvdispatch.matmul(a, a, alpha=2.0)[0, 0] == 4
    with pytest.raises(nvdispatch.errors.InvalidArgumentError, match="alpha"):
        nvdispatch.matmul(a, a, alpha=2.5)


def test_forgetting_a_plans_other_keys_keeps_the_plan_under_the_one_kept():
    released = []

    class Plan:
        def release(self):
            released.append(self)

    cache, plan, other = PlanCache(), Plan(), Plan()
    for key in ("plan key", "call key 1", "call key 2"):
        cache.put(key, plan)
    cache.put("another", other)
    cache.forget_keys_but(plan, "plan key")
    assert cache.get("plan key") is plan and cache.get("another") is other
    assert not cache.contains("call key 1") and not cache.contains("call key 2")
    assert len(cache) == 2 and not released
    cache.forget_keys_but(Plan(), "plan key")  # not cached: nothing to do
    assert cache.get("plan key") is plan
