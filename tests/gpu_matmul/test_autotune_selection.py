"""How cuBLASLt autotune chooses among its candidates (screening, then finalists timed in turns), on the CPU:
candidates, timer and record are stand-ins, so only the selection logic of ``lt_autotune.autotune`` runs."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from nvdispatch._cuda import lt_autotune

#: the busy_wait argument of each timing (the stand-in timer's record)
_busy_waits: list[bool] = []


class _Plan:
    core = handle = None
    device_index = 0

    def __init__(self):
        self.algorithm = "original"


def _setup(monkeypatch, screen: dict, refined: dict, fail: tuple = (), order: list | None = None):
    """Candidates named by ``screen``'s keys (in order); a candidate's first sample is ``screen[name]``, every
    later one ``refined[name]`` (a callable: of the sample's number, 2 for the first after screening). ``order``
    collects the names of the samples taken."""
    names = list(screen)
    sampled: dict[str, int] = {}
    recorded = []
    _busy_waits.clear()
    monkeypatch.setattr(lt_autotune, "candidates", lambda core, handle, limit: [(n, n) for n in names])

    def gpu_seconds(launch, stream, device_index, iterations=3, burst=lt_autotune._BURST, busy_wait=True):
        _busy_waits.append(busy_wait)
        name = launch()
        if name in fail:
            raise RuntimeError("this algorithm failed")
        count = sampled[name] = sampled.get(name, 0) + 1
        if order is not None:
            order.append(name)
        if count == 1:
            return screen[name]
        return refined[name](count) if callable(refined[name]) else refined[name]

    monkeypatch.setattr(lt_autotune, "gpu_seconds", gpu_seconds)
    monkeypatch.setattr(lt_autotune, "record", lambda plan, r, label, seconds, rejected=None: recorded.append((label, seconds)))
    return sampled, recorded


def test_a_candidate_lucky_once_is_not_chosen_on_that_luck(monkeypatch):
    # "lucky" screened fastest, but its samples in turns are slower than "steady"'s
    screen = {"heuristic #0": 10.0, "lucky": 5.0, "steady": 6.0} | {f"slow {i}": 20.0 + i for i in range(10)}
    refined = {"heuristic #0": 10.0, "lucky": 9.0, "steady": 6.0} | {f"slow {i}": 20.0 + i for i in range(10)}
    sampled, recorded = _setup(monkeypatch, screen, refined)
    plan = _Plan()
    times = dict(lt_autotune.autotune(plan, lambda r: r, stream=0, iterations=3))
    assert plan.algorithm == "steady" and recorded == [("steady", 6.0)]
    assert times["lucky"] == 9.0 and times["heuristic #0"] == 10.0  # finalists report their median
    finalists = {n for n, count in sampled.items() if count > 1}
    assert finalists == {"heuristic #0", "lucky", "steady", *[f"slow {i}" for i in range(lt_autotune.FINALISTS - 2)]}
    confirmed = lt_autotune.CONFIRM_ROUNDS  # the challenger and the baseline: fresh samples in turns
    assert sampled["heuristic #0"] == sampled["steady"] == 4 + confirmed
    assert all(sampled[n] == 4 for n in finalists - {"heuristic #0", "steady"})  # one screening sample, 3 in turns
    assert times["slow 9"] == 29.0 and sampled["slow 9"] == 1  # screened out: its one sample


def test_few_candidates_are_all_finalists(monkeypatch):
    screen = {"heuristic #0": 3.0, "b": 2.0}
    sampled, recorded = _setup(monkeypatch, screen, screen)
    plan = _Plan()
    lt_autotune.autotune(plan, lambda r: r, stream=0, iterations=2)
    confirmed = lt_autotune.CONFIRM_ROUNDS
    assert sampled == {"heuristic #0": 2 + confirmed, "b": 2 + confirmed} and plan.algorithm == "b"


def test_failing_candidates_are_skipped_and_all_failing_keeps_the_algorithm(monkeypatch):
    screen = {"heuristic #0": 3.0, "broken": 1.0} | {f"c{i}": 4.0 + i for i in range(8)}
    _, recorded = _setup(monkeypatch, screen, screen, fail=("broken",))
    plan = _Plan()
    times = dict(lt_autotune.autotune(plan, lambda r: r, stream=0, iterations=1))
    assert times["broken"] == math.inf and plan.algorithm == "heuristic #0"
    _, recorded = _setup(monkeypatch, {"x": 1.0}, {"x": 1.0}, fail=("x",))
    plan = _Plan()
    assert lt_autotune.autotune(plan, lambda r: r, stream=0) == [("x", math.inf)]
    assert plan.algorithm == "original" and recorded == []


def test_interrupted_autotune_leaves_the_plan_as_it_was(monkeypatch):
    screen = {"heuristic #0": 3.0} | {f"c{i}": 4.0 + i for i in range(8)}
    _setup(monkeypatch, screen, screen)
    calls = []

    def launch(r):
        calls.append(r)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return r

    plan = _Plan()
    with pytest.raises(KeyboardInterrupt):
        lt_autotune.autotune(plan, launch, stream=0)
    assert plan.algorithm == "original"


def test_autotune_says_at_debug_what_it_searched_and_kept(monkeypatch, caplog):
    screen = {"heuristic #0": 3e-6, "heuristic #0 tile 21 cluster 5": 2e-6, "heuristic #1 swizzle 1": 4e-6}
    _setup(monkeypatch, screen, screen)
    with caplog.at_level(logging.DEBUG, logger="nvdispatch"):
        lt_autotune.autotune(_Plan(), lambda r: r, stream=0, iterations=1)
    (message,) = [r.getMessage() for r in caplog.records if "autotune" in r.getMessage()]
    assert "3 of 3 candidates screened (2 in the neighbourhood), 3 finalists" in message
    assert "kept heuristic #0 tile 21 cluster 5 (2.00 us; the heuristic's first answer 3.00 us)" in message


def test_at_most_max_candidates_are_timed_in_their_order(monkeypatch):
    screen = {"heuristic #0": 3.0} | {f"c{i}": 2.0 - i / 100 for i in range(20)}
    sampled, _ = _setup(monkeypatch, screen, screen)
    plan = _Plan()
    times = lt_autotune.autotune(plan, lambda r: r, stream=0, iterations=1, max_candidates=10, busy_wait=False)
    assert [name for name, _ in times] == ["heuristic #0", *[f"c{i}" for i in range(9)]]
    assert set(sampled) == {name for name, _ in times} and plan.algorithm == "c8"
    assert _busy_waits and not any(_busy_waits)  # no busy-wait asked for: none


def test_screening_stops_when_its_budget_is_spent(monkeypatch):
    screen = {"heuristic #0": 3.0} | {f"c{i}": 2.0 - i / 100 for i in range(20)}
    sampled, _ = _setup(monkeypatch, screen, screen)
    clock = iter(range(1000))
    monkeypatch.setattr(lt_autotune.time, "perf_counter", lambda: float(next(clock)))
    plan = _Plan()
    times = dict(lt_autotune.autotune(plan, lambda r: r, stream=0, iterations=1, budget=4.5))
    screened = [name for name, t in times.items() if math.isfinite(t)]
    assert screened == ["heuristic #0", "c0", "c1", "c2", "c3"]  # then the clock said 5 s had passed
    assert times["c19"] == math.inf and "c19" not in sampled and plan.algorithm == "c3"


# -- the challenger confirmed against the baseline on fresh samples -----------------------------------------
def _rounds(values: list[float], first: int):
    """A refined-sample callable: sample number ``first`` gives ``values[0]``, the next ``values[1]``, ..."""
    return lambda count: values[max(0, count - first)]


def _finalists_then(monkeypatch, baseline, challenger, *, others: int = 10, iterations: int = 3, order=None):
    """The baseline and a challenger (its finalist median below the baseline's), ``others`` slower candidates;
    ``baseline``/``challenger``: their seconds in each confirmation round (after one screening sample and
    ``iterations`` in turns)."""
    screen = {"heuristic #0": 10.0, "challenger": 8.0} | {f"slow {i}": 20.0 + i for i in range(others)}
    refined = {"heuristic #0": _rounds([10.0] * iterations + baseline, 2),
               "challenger": _rounds([8.0] * iterations + challenger, 2)}
    refined |= {f"slow {i}": 20.0 + i for i in range(others)}
    return _setup(monkeypatch, screen, refined, order=order)


def test_a_challenger_equal_within_noise_does_not_replace_the_baseline(monkeypatch, caplog):
    # the finalists' medians said 8 against 10 (the fastest of several noisy medians); fresh rounds say equal
    rounds = lt_autotune.CONFIRM_ROUNDS
    baseline = [10.0 + 0.01 * (i % 3) for i in range(rounds)]
    challenger = [10.0 + 0.01 * ((i + 1) % 3) for i in range(rounds)]
    sampled, recorded = _finalists_then(monkeypatch, baseline, challenger)
    plan = _Plan()
    with caplog.at_level(logging.DEBUG, logger="nvdispatch"):
        times = dict(lt_autotune.autotune(plan, lambda r: r, stream=0, iterations=3))
    assert plan.algorithm == "heuristic #0" and recorded == [("heuristic #0", 10.01)]
    assert times["heuristic #0"] == 10.01  # its median in the confirmation
    (message,) = [r.getMessage() for r in caplog.records if "autotune" in r.getMessage()]
    assert "challenger not confirmed" in message and "the baseline kept" in message


def test_a_challenger_faster_by_less_than_the_least_gain_is_not_kept(monkeypatch):
    rounds = lt_autotune.CONFIRM_ROUNDS
    gain = lt_autotune.MIN_GAIN / 2  # faster in every round, by half the least gain
    _, recorded = _finalists_then(monkeypatch, [10.0] * rounds, [10.0 * (1 - gain)] * rounds)
    plan = _Plan()
    lt_autotune.autotune(plan, lambda r: r, stream=0, iterations=3)
    assert plan.algorithm == "heuristic #0" and recorded[0][0] == "heuristic #0"


def test_a_challenger_that_loses_rounds_is_not_kept_for_its_median(monkeypatch):
    rounds = lt_autotune.CONFIRM_ROUNDS
    lost = rounds - lt_autotune.CONFIRM_WINS + 1  # one round more than it may lose
    challenger = [12.0] * lost + [8.0] * (rounds - lost)  # a median 20% below the baseline's
    _, recorded = _finalists_then(monkeypatch, [10.0] * rounds, challenger)
    plan = _Plan()
    lt_autotune.autotune(plan, lambda r: r, stream=0, iterations=3)
    assert plan.algorithm == "heuristic #0" and recorded[0][0] == "heuristic #0"


def test_a_confirmed_challenger_is_kept_with_its_confirmation_median(monkeypatch, caplog):
    rounds = lt_autotune.CONFIRM_ROUNDS
    lost = rounds - lt_autotune.CONFIRM_WINS  # it may lose this many rounds (one disturbed round)
    challenger = [11.0] * lost + [9.0] * (rounds - lost)
    order: list[str] = []
    _, recorded = _finalists_then(monkeypatch, [10.0] * rounds, challenger, order=order)
    plan = _Plan()
    with caplog.at_level(logging.DEBUG, logger="nvdispatch"):
        times = dict(lt_autotune.autotune(plan, lambda r: r, stream=0, iterations=3))
    assert plan.algorithm == "challenger" and recorded == [("challenger", 9.0)]
    assert times["challenger"] == 9.0 and times["heuristic #0"] == 10.0
    duel = order[-2 * rounds:]  # the confirmation: in turns, the order alternating
    assert duel[:4] == ["heuristic #0", "challenger", "challenger", "heuristic #0"]
    assert sorted(set(duel)) == ["challenger", "heuristic #0"] and duel.count("challenger") == rounds
    (message,) = [r.getMessage() for r in caplog.records if "autotune" in r.getMessage()]
    assert f"confirmed over {rounds} rounds, median ratio 0.900" in message


def test_a_challenger_failing_in_its_confirmation_is_not_kept(monkeypatch):
    rounds = lt_autotune.CONFIRM_ROUNDS
    _, recorded = _finalists_then(monkeypatch, [10.0] * rounds, [math.inf] * 2 + [5.0] * (rounds - 2))
    plan = _Plan()
    lt_autotune.autotune(plan, lambda r: r, stream=0, iterations=3)
    assert plan.algorithm == "heuristic #0" and recorded[0][0] == "heuristic #0"


def test_the_baseline_wins_outright_without_a_confirmation(monkeypatch):
    screen = {"heuristic #0": 5.0} | {f"c{i}": 6.0 + i for i in range(9)}
    sampled, recorded = _setup(monkeypatch, screen, screen)
    lt_autotune.autotune(_Plan(), lambda r: r, stream=0, iterations=3)
    assert sampled["heuristic #0"] == 4 and recorded == [("heuristic #0", 5.0)]


@pytest.mark.parametrize(
    "ratios, kept",
    [
        ([0.9] * 7, True),
        ([0.97] * 7, True),  # exactly the least gain
        ([0.98] * 7, False),  # faster every round, by less than the least gain
        ([1.2, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9], True),  # one round lost
        ([1.2, 1.2, 0.9, 0.9, 0.9, 0.9, 0.9], False),  # two lost
        ([0.9] * 5, False),  # two rounds without a ratio (a failure) count as lost
        ([], False),
    ],
)
def test_the_confirmation_rule(ratios, kept):
    assert lt_autotune.keeps_challenger(ratios) is kept


def test_the_baseline_is_the_plans_own_heuristic_answer(monkeypatch):
    """Candidate 0 is the algorithm an untuned plan runs (the heuristic asked for one answer), also where the
    heuristic asked for several puts another first."""
    from types import SimpleNamespace

    def result(tag: int, workspace: int = 0):
        algo = SimpleNamespace(data=(tag,) * 8)
        return SimpleNamespace(algo=algo, workspaceSize=workspace)

    class Core:
        max_workspace = 0

        def algorithms(self, handle, alignment, count=1):
            return [result(1)] if count == 1 else [result(2), result(1), result(3)]

        def related(self):
            return []

    monkeypatch.setattr(lt_autotune, "_variant", lambda base, **knobs: None)  # no split-K
    monkeypatch.setattr(lt_autotune, "_neighbourhood", lambda seeds, answers: iter(()))
    got = lt_autotune.candidates(Core(), handle=0, limit=3)
    assert [(label, r.algo.data[0]) for label, r in got] == [
        ("heuristic #0", 1), ("heuristic #0 of 3", 2), ("heuristic #2", 3)
    ]


# -- the winner's result checked against the heuristic's first answer's ------------------------------------
def _checked(monkeypatch, screen: dict, results: dict, read_fails: tuple = ()):
    """``results[name]``: the sample the result of candidate ``name`` reads back as."""
    sampled, recorded = _setup(monkeypatch, screen, screen)
    latest: list = []

    def launch(r):
        latest[:] = [r]
        return r

    def read():
        if latest[0] in read_fails:
            raise RuntimeError("an illegal address")
        return np.array(results[latest[0]])

    check = lt_autotune.ResultSample(read, lambda expected: 1e-3, (2, 3), "matmul(the test's problem)")
    return launch, check, recorded


def test_a_winner_wrong_in_one_element_is_rejected_for_the_next_fastest(monkeypatch, caplog):
    right = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    wrong = right[:-1] + [6.5]  # the last row's last element
    screen = {"heuristic #0": 10.0, "fast but wrong": 5.0, "close": 6.0}
    results = {"heuristic #0": right, "fast but wrong": wrong, "close": [v + 1e-4 for v in right]}
    launch, check, recorded = _checked(monkeypatch, screen, results)
    plan = _Plan()
    with caplog.at_level(logging.WARNING, logger="nvdispatch"):
        times = dict(lt_autotune.autotune(plan, launch, stream=0, iterations=2, check=check))
    assert plan.algorithm == "close" and recorded == [("close", 6.0)]
    assert times["fast but wrong"] == math.inf
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "fast but wrong" in warning and "matmul(the test's problem)" in warning and "[1, 2]" in warning


def test_when_every_faster_one_is_wrong_the_heuristics_first_is_kept(monkeypatch):
    right = [1.0, 2.0]
    screen = {"heuristic #0": 10.0, "wrong a": 5.0, "wrong b": 6.0}
    results = {"heuristic #0": right, "wrong a": [1.0, 3.0], "wrong b": [np.nan, 2.0]}
    launch, check, recorded = _checked(monkeypatch, screen, results)
    plan = _Plan()
    lt_autotune.autotune(plan, launch, stream=0, iterations=1, check=check)
    assert plan.algorithm == "heuristic #0" and recorded == [("heuristic #0", 10.0)]


def test_a_reference_that_cannot_be_read_keeps_the_plans_algorithm(monkeypatch, caplog):
    screen = {"heuristic #0": 10.0, "fast": 5.0}
    launch, check, recorded = _checked(monkeypatch, screen, {"fast": [1.0]}, read_fails=("heuristic #0",))
    plan = _Plan()
    with caplog.at_level(logging.WARNING, logger="nvdispatch"):
        lt_autotune.autotune(plan, launch, stream=0, iterations=1, check=check)
    assert plan.algorithm == "original" and recorded == []
    assert any("could not be checked" in r.getMessage() for r in caplog.records)


def test_the_heuristics_first_winning_needs_no_check(monkeypatch):
    screen = {"heuristic #0": 1.0, "slower": 5.0}
    launch, check, recorded = _checked(monkeypatch, screen, {}, read_fails=("heuristic #0", "slower"))
    plan = _Plan()
    lt_autotune.autotune(plan, launch, stream=0, iterations=1, check=check)
    assert plan.algorithm == "heuristic #0"
