"""Soak run: threads + asyncio tasks + timed KeyboardInterrupts + plan-cache churn, all at once.

Run by tests/soak/test_soak.py in a subprocess (interrupts and any state they might corrupt stay in it);
run it by hand for longer: ``python tests/soak/soak.py --seconds 120``. Prints one JSON summary line.

Every result is checked against a float64 NumPy reference. Plans that must not run once released are
booby-trapped (``release()`` marks them; executing a marked plan is recorded as a violation): the poisoning
executor's (tests/core/poisoning.py, part of the calls; its plans report workspace bytes, so the byte bound
is exercised too) and any default NumPy plan class that needs releasing. The NumPy plans declare that
release frees nothing (``needs_release = False``): calls run them unpinned, and every result of theirs is
still checked while the cache evicts them. A sampler thread checks the cache bounds while everything runs.
"""

from __future__ import annotations

import _thread
import argparse
import asyncio
import faulthandler
import json
import os
import random
import signal
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "core"))

from poisoning import VIOLATIONS, PoisoningExecutor  # noqa: E402

import nvdispatch  # noqa: E402
from nvdispatch import plan_cache  # noqa: E402
from nvdispatch.executors import numpy_fft, numpy_matmul, numpy_matmul_engines  # noqa: E402

MAX_PLANS = (2, 3, 5, 8)
MAX_BYTES = 5 * 1000  # poisoned plans report 1000 bytes each


def _trap(cls) -> None:
    """Mark plans of ``cls`` on release; executing a marked plan is a violation (not for classes whose
    release frees nothing: those may run after it)."""
    if getattr(cls, "needs_release", True) is False:
        return
    real_release, real_execute = cls.release, cls.execute

    def release(self):
        self.soak_released = True
        if getattr(self, "direct", None) is not None:  # the hot path's direct call is trapped too
            self.direct = lambda *args: VIOLATIONS.append(f"{cls.__name__}.direct called after release")
        real_release(self)

    def execute(self, operands, stream=None):
        if getattr(self, "soak_released", False):
            VIOLATIONS.append(f"{cls.__name__} executed after release")
        return real_execute(self, operands, stream)

    cls.release, cls.execute = release, execute


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.calls = 0
        self.wrong: list[str] = []
        self.errors: list[str] = []
        self.bound_violations: list[str] = []
        self.interrupts_sent = 0
        self.interrupts_caught = 0
        self.leaked_state: list[str] = []

    def ok(self, n=1):
        with self.lock:
            self.calls += n

    def fail(self, what: str):
        with self.lock:
            if len(self.wrong) < 20:
                self.wrong.append(what)


def _close(got, want, tol=1e-9) -> bool:
    got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    return got.shape == want.shape and np.allclose(got, want, rtol=tol, atol=tol)


def one_call(r: random.Random, rng: np.random.Generator, poison: PoisoningExecutor, stats: Stats) -> None:
    """One random call (stateless or stateful, matmul or FFT, default or under a backend), checked."""
    import torch

    m, k, n = r.choice((1, 3, 8)), r.choice((2, 5)), r.choice((1, 4, 7))
    a, b, bias = rng.standard_normal((m, k)), rng.standard_normal((k, n)), rng.standard_normal(n)
    kind = r.randrange(9)
    if kind == 0:
        ok = _close(nvdispatch.matmul(a, b), a @ b)
    elif kind == 1:
        got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        ok = _close(got, np.maximum(a @ b + bias, 0))
    elif kind == 2:
        ok = _close(nvdispatch.matmul(torch.from_numpy(a), torch.from_numpy(b), alpha=2.0), 2 * a @ b)
    elif kind == 3:
        with nvdispatch.set_backend(poison, only=True):
            ok = _close(nvdispatch.matmul(a, b, epilog="RELU"), np.maximum(a @ b, 0))
    elif kind == 4:
        with nvdispatch.set_backend("torch", coerce=True):
            ok = _close(nvdispatch.matmul(a, b), a @ b)
    elif kind == 5:
        x = rng.standard_normal((m, 8)) + 1j * rng.standard_normal((m, 8))
        ok = _close(nvdispatch.fft.fft(x), np.fft.fft(x))
    elif kind == 6:
        x = rng.standard_normal((m, 6))
        ok = _close(nvdispatch.fft.rfft(torch.from_numpy(x)), np.fft.rfft(x))
    elif kind == 7:
        with nvdispatch.Matmul(a, b) as mm:
            mm.plan(epilog="GELU_BIAS", epilog_inputs={"bias": bias})
            first = _close(mm.execute(), nvdispatch._epilog.gelu_tanh(a @ b + bias))
            a2 = np.asfortranarray(rng.standard_normal((m, k)))
            mm.reset_operands(a=a2)
            ok = first and _close(mm.execute(), nvdispatch._epilog.gelu_tanh(a2 @ b + bias))
    else:
        x = rng.standard_normal((4, m + 1)) + 0j
        with nvdispatch.set_backend(poison if r.random() < 0.5 else "numpy", only=True):
            f = nvdispatch.fft.FFT(x, axes=(0,)).plan()
        try:
            ok = _close(f.execute(), np.fft.fft(x, axis=0)) and _close(
                f.execute(direction="inverse"), np.fft.ifft(x, axis=0)
            )
        finally:
            f.free()
    if ok:
        stats.ok()
    else:
        stats.fail(f"kind {kind} with m, k, n = {m}, {k}, {n}")


def worker(seed: int, deadline: float, poison, stats: Stats) -> None:
    r, rng = random.Random(seed), np.random.default_rng(seed)
    while time.monotonic() < deadline:
        try:
            one_call(r, rng, poison, stats)
        except Exception as exc:  # noqa: BLE001
            import traceback

            with stats.lock:
                stats.errors.append(f"thread {seed}: {type(exc).__name__}: {exc}"[:300])
                stats.errors.append(traceback.format_exc()[-1500:])
            return
    if not _backend_state_is_default_here():
        stats.leaked_state.append(f"thread {seed}")


def tasks(seed: int, deadline: float, poison, stats: Stats) -> None:
    """Many asyncio tasks, each inside its own set_backend context, interleaving at awaits."""

    async def task(i: int):
        r, rng = random.Random(seed * 1000 + i), np.random.default_rng(seed * 1000 + i)
        backend = (poison, "numpy", "torch")[i % 3]
        while time.monotonic() < deadline:
            with nvdispatch.set_backend(backend, coerce=backend == "torch", only=True):
                a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
                await asyncio.sleep(0)
                got = nvdispatch.matmul(a, b)
                await asyncio.sleep(r.random() * 0.002)
                want_torch = backend == "torch"
                if (hasattr(got, "numpy") != want_torch) or not _close(got, a @ b):
                    stats.fail(f"task {i} under {backend}: {type(got).__name__}")
                else:
                    stats.ok()
        if not _backend_state_is_default_here():
            stats.leaked_state.append(f"task {i}")

    async def main():
        await asyncio.gather(*(task(i) for i in range(24)))

    try:
        asyncio.run(main())
    except Exception as exc:  # noqa: BLE001
        stats.errors.append(f"asyncio: {type(exc).__name__}: {exc}"[:300])


def churn(seed: int, deadline: float, stats: Stats) -> None:
    """Resize and clear the cache at random; check its bounds from one consistent stats() snapshot."""
    r = random.Random(seed)
    while time.monotonic() < deadline:
        op = r.random()
        if op < 0.4:
            plan_cache.maxsize = r.choice(MAX_PLANS)
        elif op < 0.5:
            plan_cache.clear()
        s = plan_cache.stats()
        if s["size"] > s["maxsize"] or s["bytes"] > s["max_bytes"] or s["size"] > s["keys"]:
            stats.bound_violations.append(str({k: s[k] for k in ("size", "keys", "maxsize", "bytes", "max_bytes")}))
        time.sleep(r.random() * 0.003)


def interrupter(seed: int, deadline: float, stats: Stats) -> None:
    r = random.Random(seed)
    while time.monotonic() < deadline - 0.2:
        time.sleep(0.002 + r.random() * 0.02)
        _thread.interrupt_main()
        stats.interrupts_sent += 1


def _backend_state_is_default_here() -> bool:
    """No backend context active in this thread/task."""
    state = nvdispatch.get_state()
    return not state.local and not state.skipped


def run(seconds: float, seed: int, n_threads: int) -> dict:
    import torch

    torch.set_num_threads(1)
    _trap(numpy_matmul.NumpyMatmulPlan)
    _trap(numpy_matmul_engines.EnginePlan)
    _trap(numpy_fft.NumpyFFTPlan)
    poison = PoisoningExecutor(nbytes=1000)
    plan_cache.maxsize, plan_cache.max_bytes = 3, MAX_BYTES
    stats = Stats()
    # warm-up: every lazy import happens now, before interrupts start (a KeyboardInterrupt inside importlib's
    # own locking can leave a module lock held: a CPython limitation, not one of nvdispatch's)
    warm_r, warm_rng = random.Random(seed), np.random.default_rng(seed)
    for _ in range(60):
        one_call(warm_r, warm_rng, poison, stats)
    a, b, bias = warm_rng.standard_normal((64, 8)), warm_rng.standard_normal((8, 16)), warm_rng.standard_normal(16)
    with nvdispatch.Matmul(a, b) as mm:
        mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias}).autotune(iterations=1)
    asyncio.run(asyncio.sleep(0))
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=worker, args=(seed + i, deadline, poison, stats)) for i in range(n_threads)]
    threads += [
        threading.Thread(target=tasks, args=(seed + 100, deadline, poison, stats)),
        threading.Thread(target=churn, args=(seed + 200, deadline, stats)),
        threading.Thread(target=interrupter, args=(seed + 300, deadline, stats)),
    ]
    # the main thread takes the KeyboardInterrupts, in the middle of whatever it is doing. The SIGINT handler
    # disarms itself when it raises and the loop re-arms inside its try, so no interrupt escapes the soak's
    # own bookkeeping (between `except` and `try`); everywhere inside the calls they land at random.
    armed = [False]

    def on_interrupt(signum, frame):
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_interrupt)
    for t in threads:
        t.start()
    r, rng = random.Random(seed + 400), np.random.default_rng(seed + 400)
    try:
        while True:
            try:
                armed[0] = True
                while time.monotonic() < deadline:
                    one_call(r, rng, poison, stats)
                    if r.random() < 0.02:  # autotune now and then: an interrupt must not leave trial settings
                        a, b = rng.standard_normal((64, 8)), rng.standard_normal((8, 16))
                        bias = rng.standard_normal(16)
                        with nvdispatch.Matmul(a, b) as mm:
                            mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
                            mm.autotune(iterations=1)
                            if not _close(mm.execute(), np.maximum(a @ b + bias, 0)):
                                stats.fail("autotuned Matmul")
                armed[0] = False
                break
            except KeyboardInterrupt:
                stats.interrupts_caught += 1
            except Exception as exc:  # noqa: BLE001
                armed[0] = False
                stats.errors.append(f"main: {type(exc).__name__}: {exc}"[:300])
                break
        for t in threads:
            t.join()
    finally:
        armed[0] = False
        signal.signal(signal.SIGINT, previous)
    if not _backend_state_is_default_here():
        stats.leaked_state.append("main thread")
    # every plan still pinned must be one an interrupt cut off between pin and let-go
    in_use = plan_cache.stats()["in_use"]
    plan_cache.clear()
    after = plan_cache.stats()
    # a call after all that is still right (the hot path included)
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((3, 4))
    final_ok = _close(nvdispatch.matmul(a, b), a @ b) and _close(nvdispatch.matmul(a, b), a @ b)
    return {
        "seconds": seconds,
        "calls": stats.calls,
        "wrong": stats.wrong,
        "errors": stats.errors,
        "violations": VIOLATIONS[:20],
        "bound_violations": stats.bound_violations[:20],
        "interrupts_sent": stats.interrupts_sent,
        "interrupts_caught": stats.interrupts_caught,
        "leaked_state": stats.leaked_state,
        "in_use_before_clear": in_use,
        "in_use_after_clear": after["in_use"],
        "poisoned_plans": len(poison.plans),
        "poisoned_plans_released": sum(1 for p in poison.plans if p.released),
        "final_call_ok": bool(final_ok),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=6)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.seconds + 40, exit=True)  # stuck: print every thread's stack
    print(json.dumps(run(args.seconds, args.seed, args.threads)))


if __name__ == "__main__":
    main()
