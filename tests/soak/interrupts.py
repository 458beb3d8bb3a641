"""Interrupt soak: KeyboardInterrupts injected into calls, autotunes, backend contexts and the epilog pool.

Each phase runs its workload many times, each run interrupted once:

* at one *point* where a real Ctrl-C can land, swept over the workload's points: a function's entry
  (``sys.settrace`` 'call' events) or the return of a C call (``sys.setprofile`` 'c_return' events), in
  nvdispatch's frames (and, for the epilog pool, in ``concurrent.futures``' and ``threading``'s, where a
  submission can be cut);
* by a timer (``setitimer``) after a random delay within the workload's duration.

After every run it checks: no hang (each run and each check runs under a watchdog: a stuck one dumps every
thread's stack and ends the process with the report so far), no backend context left active, no plan the
cache shares changed by an interrupted run (its tuning and its steps, as ``explain()`` shows them), and the
workload's next, uninterrupted, result right against a float64 NumPy reference.

Phases (``--phase``): ``calls`` (stateless and stateful matmul, fft, under backends, NumPy and Torch),
``autotune`` (``Matmul.autotune``), ``contexts`` (``set_backend``/``skip_backend`` in ``with`` and
``contextlib.ExitStack``, calls inside), ``epilog_pool`` (CPU matmuls whose epilog runs on the shared thread
pool). Run by tests/soak/test_interrupts.py, a phase per process; by hand:
``python tests/soak/interrupts.py --phase calls --seconds 30``. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import random
import signal
import sys
import threading
import time

import numpy as np

import nvdispatch
from nvdispatch import plan_cache

NVDISPATCH = f"{os.sep}nvdispatch{os.sep}"


class Report:
    def __init__(self, phase: str):
        self.data = {
            "phase": phase,
            "runs": 0,
            "interrupted": 0,
            "points": 0,
            "points_swept": 0,
            "wrong": [],
            "errors": [],
            "leaked_state": [],
            "plans_changed": [],
            "tunings_recorded": [],
            "pins_left": [],
            "hang": None,
        }

    def add(self, field: str, what: str) -> None:
        if len(self.data[field]) < 20:
            self.data[field].append(what)

    def emit(self) -> None:
        print(json.dumps(self.data), flush=True)


def _autotune_done(fn) -> bool:
    """Whether an interrupted autotune of ``fn.matmul`` had passed its commit point (its choice recorded and
    adopted by the Matmul, every tuning it recorded its own): then the interrupt only ended a finished call,
    and what it recorded is the autotune's whole result, not a part left behind."""
    mm = getattr(fn, "matmul", None)
    recorded = list(plan_cache.tunings().values())
    choices = [t for t in recorded if isinstance(t, dict) and "strategy" in t]
    return mm is not None and len(choices) == 1 and choices[0]["strategy"] == mm._strategy


class Watchdog:
    """Ends the process with the report when a guarded block runs longer than ``seconds``."""

    def __init__(self, report: Report, seconds: float):
        self.report, self.seconds = report, seconds
        self._what, self._deadline = None, None
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="soak-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def guard(self, what: str):
        with self._lock:
            self._what, self._deadline = what, time.monotonic() + self.seconds
        try:
            yield
        finally:
            with self._lock:
                self._what = self._deadline = None

    def _watch(self) -> None:
        while True:
            time.sleep(0.05)
            with self._lock:
                what, deadline = self._what, self._deadline
            if deadline is not None and time.monotonic() > deadline:
                self.report.data["hang"] = f"{what}: still running after {self.seconds} s"
                faulthandler.dump_traceback(all_threads=True)
                self.report.emit()
                os._exit(3)


def _where(frame) -> str:
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}:{frame.f_lineno}"


def count_points(fn, files: tuple[str, ...], event: str) -> int:
    """How many ``event`` points ('call' or 'c_return') in ``files`` one run of ``fn`` passes."""
    seen = [0]

    def tracer(frame, what, arg):
        if any(f in frame.f_code.co_filename for f in files):
            seen[0] += 1

    def profiler(frame, what, arg):
        if what == "c_return" and any(f in frame.f_code.co_filename for f in files):
            seen[0] += 1

    try:
        if event == "call":
            sys.settrace(tracer)
        else:
            sys.setprofile(profiler)
        fn()
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    return seen[0]


def run_interrupted_at(fn, files: tuple[str, ...], event: str, n: int) -> str | None:
    """``fn()`` with a KeyboardInterrupt at its ``n``-th ``event`` point in ``files``: where it landed (None if
    it ran to the end)."""
    seen, landed = [0], [None]

    def hit(frame) -> bool:
        if landed[0] is None and any(f in frame.f_code.co_filename for f in files):
            seen[0] += 1
            if seen[0] == n:
                landed[0] = _where(frame)
                return True
        return False

    def tracer(frame, what, arg):
        if hit(frame):
            raise KeyboardInterrupt

    def profiler(frame, what, arg):
        if what == "c_return" and hit(frame):
            raise KeyboardInterrupt

    try:
        try:
            if event == "call":
                sys.settrace(tracer)
            else:
                sys.setprofile(profiler)
            fn()
        finally:
            sys.settrace(None)
            sys.setprofile(None)
    except KeyboardInterrupt:
        if landed[0] is None:
            raise
        return landed[0]
    return None  # it ran to the end (an interrupt landing in a finalizer is ignored, and the run goes on)


def run_timed(fn, delay: float) -> str | None:
    """``fn()`` interrupted by a timer after ``delay`` seconds: the function the interrupt landed in (None if
    it ran to the end first)."""
    armed, landed = [True], [None]

    def handler(signum, frame):
        if armed[0]:
            armed[0] = False
            landed[0] = _where(frame).rsplit(":", 1)[0]
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, delay)
            fn()
        finally:
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    except KeyboardInterrupt:
        return landed[0]
    finally:
        signal.signal(signal.SIGALRM, previous)
    return None


# -- what is checked after each run ------------------------------------------------------------------------
def _close(got, want, tol=1e-9) -> bool:
    got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    return got.shape == want.shape and np.allclose(got, want, rtol=tol, atol=tol)


def backend_state_active() -> bool:
    state = nvdispatch.get_state()
    return bool(state.local or state.skipped)


def shared_plans() -> dict[int, tuple]:
    """What every cached plan shows: id -> (plan, tuning, steps)."""
    out = {}
    for plan in plan_cache.plans():
        tuning = getattr(plan, "tuning", None)
        out[id(plan)] = (plan, tuning() if callable(tuning) else None, tuple(getattr(plan, "steps", ()) or ()))
    return out


def changed_plans(before: dict[int, tuple]) -> list[str]:
    """The plans of ``before`` still cached whose tuning or steps differ now."""
    now = shared_plans()
    out = []
    for key, (plan, tuning, steps) in before.items():
        if key in now and now[key][0] is plan and now[key][1:] != (tuning, steps):
            out.append(f"{type(plan).__name__}: tuning {tuning} -> {now[key][1]}, steps {steps} -> {now[key][2]}")
    return out


# -- workloads ---------------------------------------------------------------------------------------------
class Workloads:
    """Each a function running one workload and returning whether its result is right."""

    def __init__(self, phase: str, seed: int):
        self.rng = np.random.default_rng(seed)
        self.phase = phase

    def calls(self):
        import torch

        rng = self.rng
        a, b, bias = rng.standard_normal((6, 5)), rng.standard_normal((5, 4)), rng.standard_normal(4)
        x = rng.standard_normal((4, 8)) + 1j * rng.standard_normal((4, 8))
        mm = nvdispatch.Matmul(a, b)
        mm.plan(epilog="GELU_BIAS", epilog_inputs={"bias": bias})
        gelu = nvdispatch._epilog.gelu_tanh(a @ b + bias)

        def under_backend():
            with nvdispatch.set_backend("numpy", only=True):
                return _close(nvdispatch.matmul(a, b, epilog="RELU"), np.maximum(a @ b, 0))

        return [
            lambda: _close(nvdispatch.matmul(a, b), a @ b),
            lambda: _close(
                nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}), np.maximum(a @ b + bias, 0)
            ),
            lambda: _close(nvdispatch.matmul(torch.from_numpy(a), torch.from_numpy(b), alpha=2.0), 2 * a @ b),
            lambda: _close(nvdispatch.matmul(a, b, a @ b, beta=0.5), 1.5 * a @ b),
            lambda: _close(nvdispatch.fft.fft(x), np.fft.fft(x)),
            lambda: _close(nvdispatch.fft.rfft(torch.from_numpy(x.real)), np.fft.rfft(x.real)),
            lambda: _close(mm.execute(), gelu),
            under_backend,
        ]

    def autotune(self):
        rng = self.rng
        # a result of several blocks: the NumPy plans have knobs to tune (block size, threads; panels)
        a, b, bias = rng.standard_normal((256, 32)), rng.standard_normal((32, 160)), rng.standard_normal(160)
        want = np.maximum(a @ b + bias, 0)
        mm = nvdispatch.Matmul(a, b)
        # two settings of each plan's knobs (preferences' limit): every step of an autotune, more runs of it
        mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias}, preferences={"limit": 2})

        def tune():
            # the check first, the autotune last: an interrupt that lands after the autotune returned (in a check
            # after it) would find it done, its changes rightly made, and count them as left behind
            ok = _close(mm.execute(), want)
            mm.autotune(iterations=1)
            return ok

        tune.matmul = mm
        return [tune]

    def contexts(self):
        rng = self.rng
        a, b = rng.standard_normal((4, 3)), rng.standard_normal((3, 2))
        numpy_only, skip_torch = nvdispatch.set_backend("numpy", only=True), nvdispatch.skip_backend("torch")

        def nested():
            with numpy_only:
                with skip_torch:
                    return _close(nvdispatch.matmul(a, b), a @ b)

        def stacked():
            with contextlib.ExitStack() as stack:
                stack.enter_context(numpy_only)
                stack.enter_context(skip_torch)
                return _close(nvdispatch.matmul(a, b), a @ b)

        return [nested, stacked]

    def epilog_pool(self):
        rng = self.rng
        # a result of 4 MiB: its epilog pass runs on all cores, through the shared epilog pool
        a, b, bias = rng.standard_normal((256, 64)), rng.standard_normal((64, 2048)), rng.standard_normal(2048)
        want = np.maximum(a @ b + bias, 0)
        kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}, "preferences": {"strategy": "inplace"}}

        def threaded():
            return _close(nvdispatch.matmul(a, b, **kw), want)

        return [threaded]


#: phase -> the frames its interrupts are swept over, a group at a time, first groups first (each given what
#: time is left to it: every point where time allows, else an evenly spread share)
FILES = {
    "calls": [(NVDISPATCH,)],
    "autotune": [(NVDISPATCH,)],
    "contexts": [(NVDISPATCH,)],
    "epilog_pool": [(f"concurrent{os.sep}futures", f"{os.sep}threading.py"), (NVDISPATCH,)],  # the submission first
}


def run(phase: str, seconds: float, seed: int, watchdog_seconds: float, min_interrupts: int = 0) -> dict:
    from nvdispatch.executors import blas_threads

    blas_threads.SETTLE_SECONDS = 0  # autotune's pauses for quiet timings: nothing here is timed
    report = Report(phase)
    dog = Watchdog(report, watchdog_seconds)
    r = random.Random(seed)
    workloads = getattr(Workloads(phase, seed), phase)()
    for fn in workloads:  # warm-up: lazy imports, calibration and plans happen now, not interrupted
        with dog.guard("warm-up"):
            fn()
            fn()
    deadline = time.monotonic() + seconds

    def one(fn, interrupt) -> None:
        """A run of ``fn`` interrupted by ``interrupt(fn)``; then every check."""
        if phase == "autotune":  # each run from an untuned plan, whatever the last one chose
            plan_cache.clear_tunings()
        before = shared_plans()
        users = {key: plan_cache.users(plan) for key, (plan, _, _) in before.items()}
        report.data["runs"] += 1
        try:
            with dog.guard(f"{fn.__qualname__} (interrupted)"):
                landed = interrupt(fn)
        except Exception as exc:  # noqa: BLE001
            report.add("errors", f"{type(exc).__name__}: {exc}"[:300])
            return
        if landed is None:
            return  # it ran to the end: what it changed, it was allowed to
        report.data["interrupted"] += 1
        if backend_state_active() and not landed.startswith("contextlib.py"):
            report.add("leaked_state", f"interrupted at {landed}")
        if backend_state_active():
            nvdispatch.reset_backends()
        done = phase == "autotune" and _autotune_done(fn)
        for what in [] if done else changed_plans(before):  # a finished autotune's changes are its result
            report.add("plans_changed", f"interrupted at {landed}: {what}")
        if phase == "autotune" and plan_cache.has_tunings() and not done:
            report.add("tunings_recorded", f"interrupted at {landed}: {sorted(plan_cache.tunings())[:1]}")
        held = [
            f"{type(plan).__name__} ({users[key]} -> {plan_cache.users(plan)} users)"
            for key, (plan, _, _) in before.items()
            if plan_cache.users(plan) > users[key]
        ]
        if held:  # a call's pin outlived it: the plan is never released (a leak, not a use-after-free)
            report.add("pins_left", f"interrupted at {landed}: {held}")
        try:
            with dog.guard(f"{fn.__qualname__} (after an interrupt at {landed})"):
                ok = fn()
        except Exception as exc:  # noqa: BLE001
            report.add("errors", f"after an interrupt at {landed}: {type(exc).__name__}: {exc}"[:300])
            return
        if not ok:
            report.add("wrong", f"{fn.__qualname__} after an interrupt at {landed}")

    durations = []
    for fn in workloads:
        samples = []
        for _ in range(3):
            t0 = time.perf_counter()
            with dog.guard("timing"):
                fn()
            samples.append(time.perf_counter() - t0)
        durations.append(min(samples))
    # half the time: sweep the points, every one where time allows, else an evenly spread share of them
    sweep_end = time.monotonic() + seconds / 2
    slots = [
        (files, event, i) for files in FILES[phase] for event in ("call", "c_return") for i in range(len(workloads))
    ]
    for left, (files, event, i) in zip(range(len(slots), 0, -1), slots):
        fn, duration = workloads[i], durations[i]
        share = (sweep_end - time.monotonic()) / left
        with dog.guard("counting points"):
            total = count_points(fn, files, event)
        report.data["points"] += total
        affordable = max(1, int(share / (3 * duration + 1e-4)))  # a traced run, and the check after it
        step = max(1.0, total / affordable)
        start = r.uniform(1, step)
        until = time.monotonic() + share
        for n in sorted({int(start + k * step) for k in range(affordable) if start + k * step <= total}):
            if time.monotonic() > until:
                break
            one(fn, lambda f, n=n, files=files, event=event: run_interrupted_at(f, files, event, n))
            report.data["points_swept"] += 1
    # then timers, at random within the workloads' duration; on a slow (loaded) machine beyond the deadline until
    # ``min_interrupts`` landed, for at most ``seconds`` more
    hard_end = deadline + seconds
    while time.monotonic() < deadline or (report.data["interrupted"] < min_interrupts and time.monotonic() < hard_end):
        i = r.randrange(len(workloads))
        delay = r.uniform(1e-6, durations[i])
        one(workloads[i], lambda f, delay=delay: run_timed(f, delay))
    return report.data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=sorted(FILES), required=True)
    parser.add_argument("--seconds", type=float, default=6.0, help="how long to interrupt (half sweep, half timers)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--watchdog", type=float, default=10.0, help="seconds after which a run counts as hung")
    parser.add_argument(
        "--min-interrupts",
        type=int,
        default=0,
        help="keep interrupting past --seconds (at most as long again) until this many landed",
    )
    args = parser.parse_args()
    report = run(args.phase, args.seconds, args.seed, args.watchdog, args.min_interrupts)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
