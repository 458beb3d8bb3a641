"""A plan that runs the fastest of several candidate plans, found by timing each once.

An executor that has more than one way to run a problem and no model it trusts on every device (the GPU
convolution: one generated kernel, the four-step kernels, cuFFT with a multiply, cuFFT with callbacks)
offers the strategy ``"timed"``, whose plan is a :class:`TimedChoicePlan` over candidate plans in the order
of the executor's cost model:

* made with a tuning recorded for this problem on this machine (by an earlier timing, or loaded with
  ``plan_cache.load``): only that candidate is planned, and runs;
* made with ``time_it=False`` (a problem too small for the choice to matter): the model's first runs;
* otherwise every candidate is planned (one that fails to plan is left out, with the reason in ``steps``),
  and the **first call** times them on its own operands and stream: each candidate once to warm up, then
  :data:`ROUNDS` rounds in rotating order of bursts of back-to-back calls (about :data:`SAMPLE_SECONDS` a
  burst), through the executor's clock (CUDA events). The lowest median wins (ties: the model's order); the
  others are released, and the choice is recorded for ``plan_cache.save`` (kind :data:`TUNING_KIND`, under
  the executor's tuning key and, through :meth:`TimedChoicePlan.tuning`, the plan's key). Later calls go
  straight to the winner. While the stream is being captured into a CUDA graph the executor's clock is
  None: the call runs the model's first and the timing waits for a later call.

With a ``check`` (:class:`~nvdispatch._agreement.ResultCheck`), the first call first runs the reference
candidate and every other once on its operands, and leaves out (before timing) each whose result disagrees
with the reference's on the check's sample beyond the check's tolerance: a WARNING names it, the problem
and the error, and ``steps`` show it as rejected. Where the reference itself cannot plan or run, no
candidate can be checked: the choice is not timed, the model's first candidate that planned runs (as for a
problem too small to time, so the check never makes a call fail that would have run), with a WARNING.

``steps`` (what ``explain()`` shows) say which candidate runs and why: the timings, the recorded tuning, or
the model's estimates, then the executor's ``notes`` (the convolution's: the strategies it does not offer for
the problem, and why).
"""

from __future__ import annotations

import logging
import statistics
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .._agreement import Rejection, ResultCheck, disagreement, position, warn
from .._plan_cache import plan_cache, workspace_bytes_of
from .._tunings import a_string, check_object, require_valid
from ..errors import PlanStateError

__all__ = ["TUNING_KIND", "ROUNDS", "SAMPLE_SECONDS", "Candidate", "Clock", "TimedChoicePlan", "fastest"]

TUNING_KIND = "timed-choice"
#: timed rounds per candidate (after a warm-up call)
ROUNDS = 5
#: the GPU time one timed burst of calls aims at: long enough that the host's latency before the burst's first
#: launch (the start event is recorded before it) and the GPU's clock ramp after a wait are a small share of it
SAMPLE_SECONDS = 1e-2
MAX_BURST = 64

_log = logging.getLogger("nvdispatch")


@dataclass(frozen=True)
class Candidate:
    """One way to run the problem: ``make()`` plans it; ``model`` is the cost model's estimate (a number
    ordering the candidates, shown by ``explain()``), ``detail`` how the model got it."""

    label: str
    make: Callable[[], Any]
    model: float
    detail: str = ""


class Clock(Protocol):
    def sample(self, run: Callable[[], Any], calls: int) -> float:
        """Seconds the device takes for ``calls`` back-to-back ``run()`` calls."""


def fastest(medians: Mapping[str, float], order: list[str]) -> str:
    """The label of the lowest median; ties go to the earlier label of ``order`` (the model's).

    Examples
    --------
    >>> fastest({"a": 2.0, "b": 1.0, "c": 1.0}, ["a", "b", "c"])
    'b'
    """
    return min(medians, key=lambda label: (medians[label], order.index(label)))


def _timings_check(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"expected an object of microseconds by candidate, got {type(value).__name__}"
    for label, us in value.items():
        if isinstance(us, bool) or not isinstance(us, (int, float)) or not us >= 0:
            return f"{label!r}: expected a number of microseconds >= 0, got {us!r}"
    return None


def _environment_check(value: Any) -> str | None:
    if not isinstance(value, dict) or not all(
        isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value.values()
    ):
        return f"expected an object of strings and numbers, got {value!r}"
    return None


def _microseconds(medians: Mapping[str, float]) -> str:
    return ", ".join(f"{label} {seconds * 1e6:.1f}" for label, seconds in medians.items())


class TimedChoicePlan:
    """See the module docstring. ``clock_for(operands, stream)`` returns the :class:`Clock` to time a call
    on, or None when it cannot be timed now; ``environment`` is what a recorded choice must have been made
    on (a JSON object of strings and numbers: the device, driver and library versions); ``notes`` end ``steps``
    (before the problem's description)."""

    tuning_kind = TUNING_KIND

    def __init__(
        self,
        problem: Any,
        strategy: str,
        candidates: list[Candidate],
        *,
        environment: dict[str, Any],
        clock_for: Callable[[dict, Any], Clock | None],
        tuning_key: Any = None,
        tuning: Any = None,
        time_it: bool = True,
        why_not_timed: str = "",
        check: ResultCheck | None = None,
        notes: tuple[str, ...] = (),
    ):
        if not candidates:
            raise ValueError("a timed choice needs at least one candidate")
        self.problem, self.strategy = problem, strategy
        self.candidates = {c.label: c for c in candidates}
        self.environment = dict(environment)
        self._clock_for = clock_for
        self._tuning_key = tuning_key
        self._lock = threading.Lock()
        self._plans: dict[str, Any] = {}
        self._failed: dict[str, str] = {}
        self._errors: dict[str, BaseException] = {}
        self.why_not_timed = why_not_timed
        self._check = check
        self.notes = tuple(notes)
        self.rejected: dict[str, Rejection] = {}
        self._record: dict[str, Any] | None = None
        self._run: Callable[[dict, Any], Any] | None = None
        self.chosen: str | None = None
        self._chosen_steps: tuple[str, ...] = ()  # kept: ``steps`` reads them after a release too
        self.how = ""  # "timed" | "recorded" | "model" once chosen
        self.medians: dict[str, float] = {}
        if tuning is not None:
            require_valid(type(self), tuning)
        known = tuning if self._applies(tuning) else None
        if known is None and tuning_key is not None:
            recorded = plan_cache.tuning_for(tuning_key)
            known = recorded if self._applies(recorded) else None
        if known is not None:
            self._adopt(known["choice"], "recorded", record=known)
        elif not time_it:
            self._adopt(candidates[0].label, "model")
        else:
            for c in candidates:
                self._plan(c.label)
            if not self._plans:
                raise next(iter(self._errors.values()))

    # -- choosing -----------------------------------------------------------------------------------------
    def _applies(self, value: Any) -> bool:
        return (
            isinstance(value, dict)
            and self.validate_tuning(value) is None
            and value["env"] == self.environment
            and value["choice"] in self.candidates
        )

    def _plan(self, label: str) -> Any | None:
        if label in self._plans:
            return self._plans[label]
        try:
            plan = self.candidates[label].make()
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot plan here is left out
            lines = str(exc).strip().splitlines()
            self._failed[label] = f"{type(exc).__name__}: {lines[0] if lines else ''}"
            self._errors[label] = exc
            _log.debug("timed choice: candidate %s left out (%s)", label, self._failed[label])
            return None
        self._plans[label] = plan
        return plan

    def _adopt(self, label: str, how: str, record: dict | None = None) -> None:
        plan = self._plan(label)
        if plan is None:
            raise self._errors[label]
        self.chosen, self.how, self._record = label, how, record
        self._chosen_steps = tuple(plan.steps)
        if record is not None:
            self.medians = {k: v * 1e-6 for k, v in record.get("us", {}).items()}
        self._run = plan.execute

    def _time(self, clock: Clock, operands: dict, stream: Any) -> dict[str, float]:
        labels = list(self._plans)
        bursts: dict[str, int] = {}
        errors: dict[str, BaseException] = {}
        for label in labels:
            run = self._runner(label, operands, stream)
            try:
                clock.sample(run, 1)  # warm-up: first-call costs (module loads, workspaces)
                once = clock.sample(run, 1)
            except (KeyboardInterrupt, SystemExit, MemoryError):
                raise
            except Exception as exc:  # noqa: BLE001 - a candidate failing on these operands is left out
                errors[label] = exc
                self._failed[label] = f"failed when timed: {type(exc).__name__}: {exc}"
                continue
            bursts[label] = max(1, min(MAX_BURST, round(SAMPLE_SECONDS / max(once, 1e-9))))
        live = [label for label in labels if label in bursts]
        if not live:
            raise next(iter(errors.values()))
        samples: dict[str, list[float]] = {label: [] for label in live}
        for r in range(ROUNDS):
            k = r % len(live)
            for label in live[k:] + live[:k]:
                burst = bursts[label]
                samples[label].append(clock.sample(self._runner(label, operands, stream), burst) / burst)
        return {label: statistics.median(samples[label]) for label in live}

    def _runner(self, label: str, operands: dict, stream: Any) -> Callable[[], Any]:
        execute = self._plans[label].execute
        return lambda: execute(operands, stream)

    def _agreeing(self, operands: dict, stream: Any) -> bool:
        """Leave out the candidates whose result disagrees with the reference's (see the module docstring);
        False when the reference cannot run (then nothing can be checked)."""
        check = self._check
        if check is None or list(self._plans) == [check.reference]:
            return True
        ref = check.reference
        try:
            if ref not in self._plans:
                why = self._failed.get(ref, "not a candidate")
                raise LookupError(f"the reference {ref} did not plan ({why})")
            expected = check.sample(self._plans[ref].execute(operands, stream), stream)
            tolerance = check.tolerance(expected, operands, stream)
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except Exception as exc:  # noqa: BLE001 - documented rule: unchecked, the model's first runs
            self.why_not_timed = f"the results could not be checked: the reference {ref} failed: {exc}"
            _log.warning("timed choice for %s: %s; the model's first runs", self.problem.describe(),
                         self.why_not_timed)
            return False
        for label in [k for k in self._plans if k != ref]:
            try:
                got = check.sample(self._plans[label].execute(operands, stream), stream)
            except (KeyboardInterrupt, SystemExit, MemoryError):
                raise
            except Exception as exc:  # noqa: BLE001 - a candidate failing on these operands is left out
                self._failed[label] = f"failed when checked: {type(exc).__name__}: {exc}"
                self._plans.pop(label).release()
                continue
            bad = disagreement(expected, got, tolerance)
            if bad is not None:
                where = position(check.shape, bad[1]) if check.shape else f"sample element {bad[1]}"
                rejection = Rejection(label, ref, bad[0], tolerance, where)
                self.rejected[label] = rejection
                warn("timed choice", self.problem.describe(), rejection)
                self._plans.pop(label).release()
        return True

    def _choose(self, operands: dict, stream: Any) -> bool:
        """Time the candidates and adopt the fastest; False when the clock says not now."""
        clock = self._clock_for(operands, stream)
        if clock is None:
            return False
        if not self._agreeing(operands, stream):
            first = next(label for label in self.candidates if label in self._plans)
            self._adopt(first, "model")
            for label in [k for k in self._plans if k != first]:
                self._plans.pop(label).release()
            return True
        medians = self._time(clock, operands, stream)
        order = list(self.candidates)
        chosen = fastest(medians, order)
        record = {
            "choice": chosen,
            "us": {label: round(seconds * 1e6, 3) for label, seconds in medians.items()},
            "env": self.environment,
        }
        self._adopt(chosen, "timed", record=record)
        self.medians = dict(medians)
        for label in [k for k in self._plans if k != chosen]:
            self._plans.pop(label).release()
        if self._tuning_key is not None:
            plan_cache.record_tuning(self._tuning_key, record, TUNING_KIND)
        _log.debug("timed choice for %s: %s (%s)", self.problem, chosen, _microseconds(medians))
        return True

    # -- the plan protocol ----------------------------------------------------------------------------------
    def execute(self, operands: dict, stream: Any = None) -> Any:
        run = self._run
        if run is None:
            if not self._plans:
                raise PlanStateError("plan", "a live timed-choice plan", "one already released")
            with self._lock:
                if self._run is None and not self._choose(operands, stream):
                    first = next(iter(self._plans.values()))
                    return first.execute(operands, stream)
            run = self._run
        return run(operands, stream)

    def tuning(self) -> dict[str, Any] | None:
        """The timing that chose the candidate (recorded or loaded), None while untimed or chosen by the model."""
        return self._record

    @staticmethod
    def validate_tuning(value: Any) -> str | None:
        return check_object(
            value,
            {"choice": a_string(), "us": _timings_check, "env": _environment_check},
            required=("choice", "env"),
        )

    @property
    def workspace_bytes(self) -> int:
        return sum(workspace_bytes_of(p) for p in list(self._plans.values()))

    @property
    def steps(self) -> tuple[str, ...]:
        model = "model (time / HBM floor): " + ", ".join(
            f"{c.label} {c.model:.1f}" + (f" [{c.detail}]" if c.detail else "") for c in self.candidates.values()
        )
        if self.chosen is None and not self._plans:
            lines = [f"timed choice among {', '.join(self.candidates)}: released before a call chose one", model]
        elif self.chosen is None:
            labels = list(self._plans)
            first = self._plans[labels[0]]
            head = (
                f"timed choice among {', '.join(labels)}: the first call times each on its operands and stream "
                f"(CUDA events, median of {ROUNDS} rounds) and keeps the fastest; until then {labels[0]} runs"
            )
            lines = [head, model, *list(first.steps)[:-1]]
        else:
            if self.how == "timed":
                head = (
                    f"chose {self.chosen}: the fastest when timed here (median us per call: "
                    f"{_microseconds(self.medians)})"
                )
            elif self.how == "recorded":
                head = (
                    f"chose {self.chosen} by a timing recorded on this machine (median us per call: "
                    f"{_microseconds(self.medians)})"
                )
            else:
                head = f"chose {self.chosen}, the model's first ({self.why_not_timed})"
            lines = [head, model, *self._chosen_steps[:-1]]
        lines += [f"left out {label}: {why}" for label, why in self._failed.items()]
        lines += [f"rejected {label}: {r.reason()}" for label, r in self.rejected.items()]
        return (*lines, *self.notes, self.problem.describe())

    def release(self) -> None:
        for plan in list(self._plans.values()):
            plan.release()
        self._plans.clear()
        self._run = None
