"""Autotuning a CPU plan's own knobs (block or panel size, threads) without touching the shared plan until the end.

A cached plan is shared: other threads run it, ``explain()`` describes it. So its knobs are timed on a private
copy, and the outcome is a :class:`TuningProposal`: the timings, a tuned private copy to compare against other
strategies, and ``commit()``, which applies the best setting to the shared plan in one attribute store. The
plan's ``autotune`` proposes and commits at once; ``Matmul.autotune`` proposes for every strategy, compares the
tuned copies and commits all proposals at the end, so an interrupt or error before then leaves every shared
plan as it was.

A plan taking part keeps its knobs in one attribute, ``_setting`` (a tuple), and makes copies of itself with
another setting by ``with_setting``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from . import blas_threads
from .numpy_matmul_calibration import fastest_seconds

__all__ = ["TuningProposal", "propose"]


@dataclasses.dataclass(frozen=True)
class TuningProposal:
    """The best setting found for ``target``; ``plan`` is a private copy set to it."""

    target: Any
    plan: Any
    timings: dict
    before: tuple = ()  # the target's setting when the proposal was made

    def commit(self) -> None:
        """Give ``target`` (the shared plan) the proposed setting, in one step."""
        self.target._setting = self.plan._setting

    def undo(self) -> None:
        """Give ``target`` back the setting it had when the proposal was made (a commit of several proposals
        that did not finish undoes those it made)."""
        self.target._setting = self.before


def propose(
    plan: Any,
    settings: Iterable[tuple[Any, tuple]],
    operands: dict,
    iterations: int,
    own_threads: Callable[[Any], int] | None = None,
) -> TuningProposal:
    """Time ``plan`` with each ``(label, setting)`` (on private copies; the label names its timing) and
    propose the fastest. With ``own_threads`` (the threads a copy runs its own work on), each copy is first
    run once untimed, and one running several is timed after BLAS worker threads left spinning by whatever ran
    before went idle (they would take a core from it)."""
    timings: dict = {}
    best = None
    for name, setting in settings:
        trial = plan.with_setting(setting)
        if own_threads is not None:
            if own_threads(trial) > 1:
                blas_threads.let_workers_sleep()
            trial.execute(operands)  # warm-up
        t = fastest_seconds(lambda trial=trial: trial.execute(operands), iterations)
        timings[name] = t
        if best is None or t < best[1]:
            best = (trial, t)
    return TuningProposal(plan, best[0] if best else plan.with_setting(plan._setting), timings, plan._setting)
