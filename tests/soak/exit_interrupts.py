"""Interrupts in backend contexts' entries and exits: where a KeyboardInterrupt can leave one active.

Backend contexts (``set_backend``, ``skip_backend``) are entered and left in a ``with`` statement and under
``contextlib.ExitStack``. A ``KeyboardInterrupt`` is injected at every point where a real Ctrl-C can land, one
point per run: a function's entry (``sys.settrace`` 'call' events: the interpreter checks for a pending
signal there) and the return of a C call (``sys.setprofile`` 'c_return' events: it checks after each call),
in nvdispatch's frames and, apart, in contextlib's. Then timers (``setitimer``) interrupt runs at random.
After each run, a context still active is a leak, counted by where the interrupt landed (a timer's by the
frame its handler ran in).

Run by tests/soak/test_exit_interrupts.py; by hand: ``python tests/soak/exit_interrupts.py --timer-runs 2000``.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import sys

import nvdispatch

SET, SKIP = nvdispatch.set_backend("numpy"), nvdispatch.skip_backend("torch")  # made once: only entries/exits run


def with_statements() -> None:
    with SET:
        with SKIP:
            pass


def exit_stack() -> None:
    with contextlib.ExitStack() as stack:
        stack.enter_context(SET)
        stack.enter_context(SKIP)


SCENARIOS = {"with": with_statements, "ExitStack": exit_stack}


def _leaked() -> bool:
    state = nvdispatch.get_state()
    return bool(state.local or state.skipped)


def _where(frame) -> str:
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}:{frame.f_lineno}"


def _interrupted_at(scenario, files: tuple[str, ...], event: str, n: int) -> str | None:
    """Run ``scenario`` with a KeyboardInterrupt at its ``n``-th ``event`` point in ``files``; where it landed
    (None: there are fewer points)."""
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
        return None

    def profiler(frame, what, arg):
        if what == "c_return" and hit(frame):
            raise KeyboardInterrupt

    try:
        if event == "call":
            sys.settrace(tracer)
        else:
            sys.setprofile(profiler)
        scenario()
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    return landed[0]


def injected(scenario, files: tuple[str, ...], event: str) -> tuple[int, dict[str, int]]:
    """Run ``scenario`` once per ``event`` point in ``files`` ('call' or 'c_return'), interrupted there; returns
    the number of points and the leaks by point."""
    leaks: collections.Counter = collections.Counter()
    n = 0
    while True:
        n += 1
        landed = _interrupted_at(scenario, files, event, n)
        if landed is None:
            return n - 1, dict(leaks)
        if _leaked():
            leaks[landed] += 1
            nvdispatch.reset_backends()


def timed(scenario, runs: int, seed: int) -> tuple[int, dict[str, int]]:
    """``runs`` runs of 30 scenarios, each interrupted by a timer after 1-60 us; returns how many were
    interrupted and the leaks by the function the interrupt landed in."""
    r = random.Random(seed)
    armed, landed = [False], [None]

    def handler(signum, frame):
        if armed[0]:
            armed[0] = False
            landed[0] = _where(frame).rsplit(":", 1)[0]
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, handler)
    leaks: collections.Counter = collections.Counter()
    interrupted = 0
    try:
        for _ in range(runs):
            try:
                armed[0] = True
                signal.setitimer(signal.ITIMER_REAL, r.uniform(1e-6, 60e-6))
                for _ in range(30):
                    scenario()
            except KeyboardInterrupt:
                interrupted += 1
            finally:
                armed[0] = False
                signal.setitimer(signal.ITIMER_REAL, 0)
            if _leaked():
                leaks[landed[0]] += 1
                nvdispatch.reset_backends()
    finally:
        signal.signal(signal.SIGALRM, previous)
    return interrupted, dict(leaks)


def run(timer_runs: int, seed: int) -> dict:
    for scenario in SCENARIOS.values():  # warm-up: no lazy import is interrupted
        scenario()
    report = {}
    for name, scenario in SCENARIOS.items():
        for label, files in (("nvdispatch", (f"{os.sep}nvdispatch{os.sep}",)), ("contextlib", ("contextlib.py",))):
            for event in ("call", "c_return"):
                points, leaks = injected(scenario, files, event)
                report[f"{name}/{label}/{event}"] = {"points": points, "leaks": leaks}
        interrupted, leaks = timed(scenario, timer_runs, seed)
        report[f"{name}/timers"] = {"runs": timer_runs, "interrupted": interrupted, "leaks": leaks}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timer-runs", type=int, default=2000, help="runs interrupted by timers, per scenario")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(run(args.timer_runs, args.seed)))


if __name__ == "__main__":
    main()
