"""The route of repeated calls on lazy conjugate views whose memory an executor reads (a Torch CUDA ``x.mH``), checked
on the CPU with Torch CPU tensors described as CUDA ones are (the adapter's ``info_conjugated``/``info``
patched) and user executors standing in for the ``cuda`` one:

* where the plan folds the conjugation in, the call key (the views' signatures name the conjugation) keeps it, and
  a repeated call runs it from the cache, handed the caller's views as they are (no detection, selection or copy:
  the plans read them by their memory, as the cuBLASLt plans do, ``xp.memory``);
* where the plan was made on copies of the views' values (an executor that does not fold, a negative view), the
  call key finds it behind a ``CopyingPlan``, which makes the copies anew at each call (the plan itself, handed the
  views, would read their memory: the conjugates);
* what the Torch adapter's signature keys on a device (meta tensors stand for CUDA ones here).

Transforms of such views (a plan made on copies) likewise. Values against a NumPy complex128 oracle, the views'
bases changed in place between calls. The host cost this
saves on the GPU: ``benchmarks/probes/conj_fold.py``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import nvdispatch
from nvdispatch import linalg
from nvdispatch._backends import _unregister_all
from nvdispatch.executors.base import Executor

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _clean():
    _unregister_all()
    nvdispatch.plan_cache.clear()
    yield
    _unregister_all()
    nvdispatch.plan_cache.clear()


@pytest.fixture
def described_by_memory(monkeypatch):
    """CPU conjugate views described as CUDA ones: by their memory where the executor folds (``info_conjugated``),
    else as a copy of their values (``info``: ``materialized``)."""
    from nvdispatch._adapters import torch as torch_adapter

    cls = torch_adapter.TorchAdapter
    info = cls.info

    def info_conjugated(self, name, x):
        if not x.is_conj() or x.is_neg():
            return None
        return dataclasses.replace(info(self, name, x.conj()), conjugated=True)

    def info_copied(self, name, x):
        if not (x.is_conj() or x.is_neg()):
            return info(self, name, x)
        view = x.resolve_conj().resolve_neg()
        return dataclasses.replace(info(self, name, view), array=view, materialized=True)

    monkeypatch.setattr(cls, "info_conjugated", info_conjugated)
    monkeypatch.setattr(cls, "info", info_copied)


@pytest.fixture
def full_paths(monkeypatch):
    """How many calls took the route's full path (detect, select, plan) rather than a cached plan."""
    seen = []
    inner = linalg._plan_and_run

    def counted(*args):
        seen.append(1)
        return inner(*args)

    monkeypatch.setattr(linalg, "_plan_and_run", counted)
    return seen


def _memory(x):
    """What a plan reading ``x`` by its pointer reads: its memory (a conjugate view's bit cleared)."""
    return x.conj() if x.is_conj() else x


class Folding(Executor):
    """A stand-in for the ``cuda`` executor: reads each operand by its memory, applying the conjugation the problem
    marks (cuBLASLt's op C) where ``folds``; records the plans it makes and the operands each call hands it."""

    def __init__(self, folds=True):
        self.name = "folding"
        self.folds = folds
        self.plans = 0
        self.handed: list[tuple[bool, bool]] = []  # (a.is_conj(), b.is_conj()) per call

    def decline(self, op, problem, *, coerce=False):
        return None if op == "matmul" and problem.framework == "torch" else "only Torch matmuls"

    def strategies(self, op, problem):
        return ("native",)

    def folds_conjugates(self, op, problem, strategy):
        return self.folds

    def plan(self, op, problem, strategy, tuning=None):
        ex = self
        ex.plans += 1

        class _Plan:
            steps = ("memory reads",)

            def __init__(self):
                self.strategy = strategy

            def execute(self, operands, stream=None):
                a, b = operands["a"], operands["b"]
                ex.handed.append((a.is_conj(), b.is_conj()))
                ma, mb = _memory(a), _memory(b)
                va = ma.conj() if problem.a.conj else ma  # op C on the memory; else the memory as it is
                vb = mb.conj() if problem.b.conj else mb
                out = torch.matmul(va.resolve_conj(), vb.resolve_conj())
                if "bias" in operands:
                    out = out + operands["bias"]
                return out

            def release(self):
                pass

        return _Plan()


def _complex(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.complex(torch.randn(*shape, generator=g, dtype=torch.float64),
                         torch.randn(*shape, generator=g, dtype=torch.float64))  # fmt: skip


def _values(x) -> np.ndarray:
    return x.resolve_conj().numpy()


@pytest.mark.parametrize("epilog", [None, "BIAS"])
@pytest.mark.parametrize("which", ["a", "b", "both"])
def test_a_folded_plan_serves_the_repeats_from_the_cache(described_by_memory, full_paths, which, epilog):
    x, y = _complex(5, 4, seed=1), _complex(3, 5, seed=2)
    a = x.mH if which in ("a", "both") else _complex(4, 5, seed=3)
    b = y.mH if which in ("b", "both") else _complex(5, 3, seed=4)
    inputs = {"bias": _complex(3, seed=5)} if epilog else None
    ex = Folding()
    with nvdispatch.set_backend(ex, only=True):
        for i in range(4):
            got = nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=inputs)
            want = _values(a) @ _values(b) + (0 if inputs is None else inputs["bias"].numpy())
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12, err_msg=f"call {i}")
            x.mul_(0.5 + 1j)  # the views' values change in place: a cached plan reads them live
            y.mul_(1 - 0.25j)
    assert len(full_paths) == 1 and ex.plans == 1
    conj = (which in ("a", "both"), which in ("b", "both"))
    assert ex.handed[0] == (False, False)  # planned: the views' memory (infos' arrays)
    assert ex.handed[1:] == [conj] * 3  # the cache's hits: the caller's views themselves, read by their memory


@pytest.mark.parametrize("which", ["a", "both"])
def test_a_plan_made_on_copies_serves_the_repeats_copying_anew(described_by_memory, full_paths, which):
    x, y = _complex(5, 4, seed=6), _complex(3, 5, seed=7)
    a = x.mH
    b = y.mH if which == "both" else _complex(5, 3, seed=8)
    ex = Folding(folds=False)  # prepared again on copies of the values
    with nvdispatch.set_backend(ex, only=True):
        for i in range(3):
            got = nvdispatch.matmul(a, b, epilog="BIAS", epilog_inputs={"bias": _complex(3, seed=9)})
            want = _values(a) @ _values(b) + _complex(3, seed=9).numpy()
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12, err_msg=f"call {i}")
            x.mul_(0.5 + 1j)
            y.mul_(1 - 0.25j)
    assert len(full_paths) == 1  # the repeats: the key's CopyingPlan
    assert ex.plans == 1
    assert ex.handed == [(False, False)] * 3  # copies of the values, made anew at each call, never the views


def test_a_negative_view_is_copied_every_call(described_by_memory, full_paths):
    # (on the CPU its key names the negation, and the CopyingPlan copies it; on a device it has no key: the full
    # path copies it)
    x = _complex(4, 5, seed=10)
    b = _complex(5, 3, seed=11)
    ex = Folding()
    with nvdispatch.set_backend(ex, only=True):
        for _ in range(2):
            a = torch._neg_view(x)
            np.testing.assert_allclose(nvdispatch.matmul(a, b, epilog="BIAS", epilog_inputs={"bias": b[0]}).numpy(),
                                       -x.numpy() @ b.numpy() + b[0].numpy(), rtol=1e-12)  # fmt: skip
    assert len(full_paths) == 1


def test_the_torch_signature_of_device_views():
    from nvdispatch._adapters.torch import TorchAdapter

    z = torch.empty(4, 3, dtype=torch.complex64, device="meta")  # stands for a CUDA tensor: not is_cpu
    sig = TorchAdapter.signature
    assert sig(z.mH) != sig(z.T) and sig(z.conj()) != sig(z)  # the conjugation is part of the key
    with pytest.raises(TypeError):
        sig(torch._neg_view(z))  # copied per call: no key
    w = torch.empty(4, 3, dtype=torch.complex64, device="meta", requires_grad=True)
    with pytest.raises(TypeError):
        sig(w.mH)  # autograd records it: copied per call
    with torch.no_grad():
        assert sig(w.mH) != sig(w.T)


@pytest.mark.parametrize("func", ["fft", "ifft", "fft2"])
def test_an_fft_of_a_view_copied_per_call_copies_anew_from_the_cache(described_by_memory, monkeypatch, func):
    from nvdispatch.fft import _route

    calls = []
    inner = _route.run_stateless
    monkeypatch.setattr(_route, "run_stateless", lambda *args: calls.append(1) or inner(*args))
    x = _complex(4, 8, seed=12)
    for i in range(3):
        a = x.conj()
        want = getattr(np.fft, func)(np.conj(x.numpy()))
        np.testing.assert_allclose(getattr(nvdispatch.fft, func)(a).numpy(), want, rtol=1e-12, atol=1e-12,
                                   err_msg=f"call {i}")  # fmt: skip
        x.mul_(0.5 + 1j)
    assert len(calls) == 1  # the repeats: the key's CopyingPlan, which copies the view's values anew


@pytest.mark.parametrize("folds", [True, False])
def test_a_prepared_call_on_a_view_copied_per_call_copies_each_time(described_by_memory, folds):
    # linalg.prepare_call (the fused MLP's chain): a plan made on copies of a view's values may not be handed the
    # view itself; the call then takes the public path (which keys, and folds where the executor does)
    x, b, bias = _complex(5, 4, seed=13), _complex(5, 3, seed=14), _complex(3, seed=15)
    ex = Folding(folds=folds)
    with nvdispatch.set_backend(ex, only=True):
        hold, call = linalg.prepare_call(x.mH, b, "BIAS", {"bias": bias})
        try:
            for i in range(3):
                a = x.mH
                want = _values(a) @ b.numpy() + bias.numpy()
                np.testing.assert_allclose(call(a, b, bias).numpy(), want, rtol=1e-12, atol=1e-12, err_msg=f"call {i}")
                x.mul_(0.5 + 1j)
        finally:
            hold.close()


def test_an_autotune_choosing_another_strategy_reaches_the_calls_served_by_a_copying_plan(described_by_memory):
    # a stateless call on a view copied per call runs its key's CopyingPlan; once Matmul.autotune records another
    # strategy for the problem, that key is forgotten, and the next call runs the recorded choice
    import time

    class TwoStrategies(Folding):
        def __init__(self):
            super().__init__(folds=False)
            self.ran: list[str] = []

        def strategies(self, op, problem):
            return ("native", "other")

        def plan(self, op, problem, strategy, tuning=None):
            inner = super().plan(op, problem, strategy, tuning)
            run, ex = inner.execute, self

            def execute(operands, stream=None):
                ex.ran.append(strategy)
                if strategy == "native":
                    time.sleep(0.005)  # the slower one: the autotune keeps "other"
                return run(operands, stream)

            inner.execute = execute
            return inner

    x = _complex(5, 4, seed=12)
    a, b, bias = x.mH, _complex(5, 3, seed=13), _complex(3, seed=14)
    ex = TwoStrategies()
    with nvdispatch.set_backend(ex, only=True):
        for _ in range(2):
            nvdispatch.matmul(a, b, epilog="BIAS", epilog_inputs={"bias": bias})
        assert ex.ran == ["native", "native"]  # the first strategy, the repeat from the CopyingPlan
        with nvdispatch.Matmul(a, b) as mm:
            mm.plan(epilog="BIAS", epilog_inputs={"bias": bias})
            mm.autotune(iterations=3)
            assert mm.strategy == "other"
        ex.ran.clear()
        got = nvdispatch.matmul(a, b, epilog="BIAS", epilog_inputs={"bias": bias})
        nvdispatch.matmul(a, b, epilog="BIAS", epilog_inputs={"bias": bias})
    assert ex.ran == ["other", "other"]
    np.testing.assert_allclose(got.numpy(), _values(a) @ _values(b) + bias.numpy(), rtol=1e-12, atol=1e-12)
