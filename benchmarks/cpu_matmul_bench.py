"""CPU matmul benchmarks: fused RELU_BIAS against NumPy and Torch, and the dispatch overhead of a tiny call.

The fused comparison (issue #30 item 6): ``nvdispatch.matmul(a, b, epilog=RELU_BIAS)`` in float32, 8192x1024x256
by default, against ``np.matmul`` alone (the product without any epilog: the floor) and Torch's own fused CPU op
``torch._addmm_activation``; beside them every engine the NumPy executor has, each called as the route's hot
path calls it (the default order's first engine among them), the naive NumPy and Torch expressions and an
autotuned ``Matmul``. The route call runs as calibrated for this machine: the class is calibrated in this
process first (``--keep`` keeps the result in the user's cache too), and the JSON records the ranking. Where
the calibration kept two answers (one engine with the cores free, another with another thread of the process
running), the route picks per call, and the JSON and the printout count which engine each timed setting ran.

All contenders run in one process, interleaved round by round, and we report medians and ratios from the
same run (the machine is noisy; ratios are what carry over), twice: interleaved call by call (each call finds
the previous contender's BLAS threads still spinning, as in a program mixing them), and *settled* (each timed
call after a pause and one untimed call of its own: a loop of that call alone). The machine may be shared:
each round waits (briefly) for a quiet moment and records the CPU other processes used meanwhile; rounds go
on (up to 3x ``--rounds``, or 3 minutes) until ``--rounds`` of them were left alone (at most
``--max-foreign`` cores of others' load), and the medians are over those when there are enough of them; the
JSON says which. Writes JSON and a PNG.

    python benchmarks/cpu_matmul_bench.py [--rounds 31] [--out benchmarks/results] [--quick] [--keep]

Needs ``pip install 'nvdispatch[bench]'`` for the plot and progress bars (the JSON is written without them);
Torch, when installed, is timed too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
import timeit

import numpy as np
from _bench import ForeignLoad, output_dir, progress, save_plot, wait_for_quiet

try:  # imported up front: the NumPy executor's Torch engine is a candidate only in processes using Torch
    import torch  # noqa: F401
except ImportError:
    pass

import nvdispatch
from nvdispatch import Epilog
from nvdispatch.executors import numpy_matmul, numpy_matmul_calibration
from nvdispatch.executors.numpy_matmul_contended import ContendedPlan
from nvdispatch.executors.numpy_matmul_engines import STRATEGY_OF
from nvdispatch.executors.numpy_matmul_panels import PanelPlan

NVD = "nvdispatch.matmul RELU_BIAS"
NP = "np.matmul alone"
TORCH_FUSED = "torch._addmm_activation"


def _timed_rounds(
    contenders: dict,
    rounds: int,
    settle: float,
    patience: float,
    max_foreign: float,
    what: str,
    quiet_wait: float = 2.0,
):
    """Median seconds per contender over rounds (interleaved: one call of each per round, in an order shuffled
    each round). The machine may be
    shared: each round waits briefly for a quiet moment, rounds go on (up to 3x, or ``patience`` seconds) until
    ``rounds`` of them saw at most ``max_foreign`` cores of others' load, and those count when there are enough.
    ``settle`` > 0: each timed call follows a pause of that long and one untimed call of the same contender,
    so that no contender finds another's threads still busy (OpenBLAS's spin ~0.1 s after each call).
    ``quiet_wait``: how long each round waits at most for the quiet moment (0: not at all, ``--quick``)."""
    samples = {name: [] for name in contenders}
    shuffle = random.Random(0)
    loads, quiet = [], []  # per round: cores other processes used meanwhile; the rounds they left alone
    give_up = time.perf_counter() + patience
    for i in progress(range(3 * rounds), f"{what} (up to 3x the rounds, for quiet ones)"):
        if quiet_wait:
            wait_for_quiet(quiet_wait)
        order = list(contenders.items())
        shuffle.shuffle(order)  # each round in another order: what ran before a contender (busy threads) varies
        with ForeignLoad() as load:
            for name, fn in order:
                if settle:
                    time.sleep(settle)
                    fn()
                t0 = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
        loads.append(load.share)
        if load.share is not None and load.share <= max_foreign:
            quiet.append(i)
        if len(quiet) >= rounds or (i + 1 >= rounds and time.perf_counter() > give_up):
            break
    kept = quiet if len(quiet) >= max(5, rounds // 3) else list(range(len(loads)))
    return {
        "median_seconds": {name: statistics.median(v[i] for i in kept) for name, v in samples.items()},
        "samples": {name: [v[i] for i in kept] for name, v in samples.items()},
        "foreign_cores_per_round": loads,
        "kept": {"count": len(kept), "of": len(loads), "max_foreign_cores": max_foreign, "quiet_only": kept == quiet},
    }


def _processor() -> str:
    """The CPU's model name as the OS gives it (``/proc/cpuinfo`` on Linux), else Python's guess."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ratios(seconds: dict, base: str) -> dict:
    return {name: t / seconds[base] for name, t in seconds.items()}


def _paired(samples: dict, base: str) -> dict:
    """Per contender: the median over rounds of its time / ``base``'s time in the same round (pairs within a
    round share the machine's load of that moment, which a ratio of medians over rounds does not), and the
    quartiles of those ratios."""
    got = {}
    for name, times in samples.items():
        ratios = [t / b for t, b in zip(times, samples[base])]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        got[name] = {"median": statistics.median(ratios), "quartiles": [q[0], q[2]], "rounds": len(ratios)}
    return got


class _ContendedPlans:
    """``with _ContendedPlans() as made:`` the per-call choosing plans (``ContendedPlan``) made meanwhile, in
    ``made`` (the route holds its plan in the plan cache: this is how the benchmark reads its counts)."""

    def __enter__(self) -> list:
        self.made, self.init = [], ContendedPlan.__init__
        made, init = self.made, self.init

        def recording(plan, *args, **kwargs):
            init(plan, *args, **kwargs)
            made.append(plan)

        ContendedPlan.__init__ = recording
        return self.made

    def __exit__(self, *exc) -> None:
        ContendedPlan.__init__ = self.init


def _choices(plans: list) -> dict:
    """Calls each engine of the route's per-call choice took so far (empty where it has none)."""
    if not plans:
        return {}
    p = plans[-1]
    return {f"{p.engine} (cores free)": p.free_calls, f"{p.busy_engine} (another thread running)": p.busy_calls}


def _less(now: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in now.items()}


def fused_relu_bias(
    rounds: int,
    m: int = 8192,
    n: int = 1024,
    k: int = 256,
    patience: float = 180.0,
    quick: bool = False,
    max_foreign: float = 0.15,
    settle: float = 0.15,
    keep: bool = False,
    goal_only: bool = False,
) -> dict:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    kwargs = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
    numpy_matmul_calibration.clear()
    nvdispatch.plan_cache.clear()
    problem = nvdispatch.explain(a, b, **kwargs).problem
    default_order = numpy_matmul.engine_order(problem)
    t0 = time.perf_counter()
    ranking = numpy_matmul.calibrate(problem, persist=keep)  # the explicit calibration step, for this class
    calibration_seconds = time.perf_counter() - t0
    nvdispatch.plan_cache.clear()
    default = nvdispatch.explain(a, b, **kwargs)
    mm = nvdispatch.Matmul(a, b)
    mm.plan(**kwargs)
    tuned = mm.autotune(iterations=1 if quick else 5)
    # the autotune's choice is recorded for stateless calls of this problem too (it wins over the class ranking):
    # forget it, so that the route is timed as calibrated (the Matmul keeps the plan it holds)
    nvdispatch.plan_cache.clear_tunings()
    nvdispatch.plan_cache.clear()
    with _ContendedPlans() as route_plans:
        nvdispatch.explain(a, b, **kwargs)  # (the route's plan, made now and cached)
    contenders = {NP: lambda: np.matmul(a, b), NVD: lambda: nvdispatch.matmul(a, b, **kwargs)}
    try:
        import torch

        ta, tb, tbias = (torch.from_numpy(v) for v in (a, b, bias))
        contenders[TORCH_FUSED] = lambda: torch._addmm_activation(tbias, ta, tb)
        contenders["torch relu(addmm)"] = lambda: torch.relu(torch.addmm(tbias, ta, tb))
    except ImportError:
        pass
    contenders["numpy naive maximum(a@b+bias, 0)"] = lambda: np.maximum(a @ b + bias, 0)
    contenders["nvdispatch.Matmul (autotuned)"] = mm.execute
    engines = {}
    ops = {"a": a, "b": b, "bias": bias, "alpha": 1, "beta": None}
    for engine in ranking.order:  # each engine's plan on its own, called as the route's hot path calls it
        plan = numpy_matmul.engine_plan(problem, engine)
        name = f"engine {engine} (strategy {STRATEGY_OF[engine]})"
        engines[name] = {"engine": engine, "steps": list(plan.steps), "tuning": plan.tuning()}
        direct = plan.direct
        contenders[name] = (lambda f=direct: f(a, b, bias)) if direct else (lambda plan=plan: plan.execute(ops))
    panels = PanelPlan(problem)
    panel_timings = panels.autotune(ops, iterations=1 if quick else 5)
    engines["engine panels (autotuned)"] = {"engine": "panels", "steps": list(panels.steps), "tuning": panels.tuning()}
    contenders["engine panels (autotuned)"] = lambda: panels.direct(a, b, bias)
    if goal_only:  # the goal's three, and the engines alone (which engine the route runs, against the others)
        contenders = {
            name: fn for name, fn in contenders.items() if name in (NP, NVD, TORCH_FUSED) or name.startswith("engine ")
        }
    want = np.maximum(a @ b + bias, 0)
    assert np.allclose(nvdispatch.matmul(a, b, **kwargs), want, rtol=1e-4, atol=1e-4)
    for fn in contenders.values():  # warm-up
        fn()
    wait = 0.0 if quick else 2.0
    start = _choices(route_plans)
    mixed = _timed_rounds(contenders, rounds, 0.0, patience, max_foreign, "fused RELU_BIAS, interleaved", wait)
    after_mixed = _choices(route_plans)
    settled = _timed_rounds(
        contenders, max(3, rounds // 2), settle, patience, max_foreign, "fused RELU_BIAS, settled", wait
    )
    route_choices = None
    if route_plans:  # (the untimed calls included: the settled rounds' one before each timed call)
        route_choices = {"interleaved": _less(after_mixed, start), "settled": _less(_choices(route_plans), after_mixed)}
    med = mixed["median_seconds"]
    base = med[NP]
    paired = _paired(mixed["samples"], NP)
    paired_torch = _paired(mixed["samples"], TORCH_FUSED) if TORCH_FUSED in med else None
    return {
        "shape": {"m": m, "n": n, "k": k, "dtype": "float32"},
        "median_seconds": med,
        "ratio_to_np_matmul": {name: t / base for name, t in med.items()},
        "ratio_to_torch_addmm_activation": (
            {name: t / med[TORCH_FUSED] for name, t in med.items()} if TORCH_FUSED in med else None
        ),
        "median_of_ratios_to_np_matmul": paired,
        "median_of_ratios_to_torch_addmm_activation": paired_torch,
        "goals": {
            "nvdispatch / np.matmul, median of per-round ratios (goal <= 1.1)": paired[NVD]["median"],
            "nvdispatch / torch._addmm_activation, median of per-round ratios (goal <= 1.0)": (
                paired_torch[NVD]["median"] if paired_torch else None
            ),
            "nvdispatch / np.matmul (goal <= 1.1)": med[NVD] / base,
            "nvdispatch / torch._addmm_activation (goal <= 1.0)": med[NVD] / med[TORCH_FUSED]
            if TORCH_FUSED in med
            else None,
        },
        "rounds": {k: v for k, v in mixed.items() if k != "median_seconds"},
        "settled": {
            "what": f"each timed call after a {settle} s pause and one untimed call: a loop of that call alone",
            "ratio_to_np_matmul": _ratios(settled["median_seconds"], NP),
            "median_of_ratios_to_np_matmul": _paired(settled["samples"], NP),
            **settled,
        },
        "engines": engines,
        "calibration": {
            "picked": default.strategy,
            "picked_engine": ranking.order[0],
            "engine_order": list(ranking.order),
            "default_order": list(default_order),
            "source": ranking.source,
            "strategies": list(default.strategies),
            "seconds": calibration_seconds,
            "measured_seconds_per_call": ranking.seconds,
            "order_with_the_cores_free": None if ranking.free is None else list(ranking.free),
            "order_with_another_thread_running": None if ranking.busy is None else list(ranking.busy),
        },
        "route_choices_per_call": route_choices,
        "autotune_choice": {
            "strategy": mm.strategy,
            "plan": mm._plan.tuning(),
            "timings": {str(k): v for k, v in tuned.items()},
        },
        "panels_autotune": {
            "kept": panels.tuning(),
            "timings": {f"panel_bytes={k[0]} threads={k[1]}": v for k, v in panel_timings.items()},
        },
        "plan": str(nvdispatch.explain(a, b, **kwargs)),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def dispatch_overhead(rounds: int, size: int = 8, number: int = 20000) -> dict:
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((size, size), dtype=np.float32)
    bias = np.random.default_rng(2).standard_normal(size, dtype=np.float32)
    kwargs = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
    nvdispatch.matmul(a, b)
    nvdispatch.matmul(a, b, **kwargs)
    contenders = {
        "np.matmul": lambda: np.matmul(a, b),
        "nvdispatch.matmul": lambda: nvdispatch.matmul(a, b),
        "nvdispatch.matmul RELU_BIAS": lambda: nvdispatch.matmul(a, b, **kwargs),
    }
    samples = {name: [] for name in contenders}
    for _ in progress(range(rounds), "dispatch overhead"):
        for name, fn in contenders.items():
            samples[name].append(timeit.timeit(fn, number=number) / number)
    med = {name: statistics.median(v) for name, v in samples.items()}
    return {
        "shape": {"m": size, "n": size, "k": size, "dtype": "float32"},
        "median_seconds_per_call": med,
        "nvdispatch_us_per_call": med["nvdispatch.matmul"] * 1e6,
        "overhead_us_over_np_matmul": (med["nvdispatch.matmul"] - med["np.matmul"]) * 1e6,
        "ratio_to_np_matmul": med["nvdispatch.matmul"] / med["np.matmul"],
        "relu_bias_ratio_to_np_matmul": med["nvdispatch.matmul RELU_BIAS"] / med["np.matmul"],
        "relu_bias_strategy": nvdispatch.explain(a, b, **kwargs).strategy,
    }


def plot(results: dict, plt) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 6), gridspec_kw={"width_ratios": [3, 1]})
    f = results["fused_relu_bias"]
    paired = "median_of_ratios_to_np_matmul" in f  # (runs before paired ratios: ratios of medians)
    ratios = f["ratio_to_np_matmul"]
    if paired:
        ratios = {n: r["median"] for n, r in f["median_of_ratios_to_np_matmul"].items()}
    names = list(ratios)
    cal = results["fused_relu_bias"]["calibration"]
    engine, picked = cal["picked_engine"], {cal["picked_engine"]}
    if cal.get("order_with_the_cores_free"):  # (two answers: the route picks per call)
        free, busy = cal["order_with_the_cores_free"][0], cal["order_with_another_thread_running"][0]
        engine, picked = f"{free} / {busy} per call", {free, busy}

    def color(name: str) -> str:
        if name == NVD or any(name.startswith(f"engine {e} ") for e in picked):
            return "#76b900"
        return "#b0d080" if "nvdispatch" in name or "engine" in name else "#888"

    colors = [color(n) for n in names]
    settled = f["settled"]["ratio_to_np_matmul"]
    if paired:
        settled = {n: r["median"] for n, r in f["settled"]["median_of_ratios_to_np_matmul"].items()}
    y = range(len(names))
    ax1.barh([i - 0.2 for i in y], [ratios[n] for n in names], height=0.4, color=colors)
    ax1.barh([i + 0.2 for i in y], [settled[n] for n in names], height=0.4, color=colors, hatch="//", alpha=0.6)
    from matplotlib.patches import Patch

    handles = [Patch(facecolor="#ccc", label="interleaved"), Patch(facecolor="#eee", hatch="//", label="settled")]
    ax1.set_yticks(list(y), names)
    ax1.invert_yaxis()
    ax1.axvline(1.0, color="k", lw=0.8)
    goal = ax1.axvline(1.1, color="r", lw=0.8, ls="--", label="goal 1.1x")
    torch_fused = results["fused_relu_bias"]["median_seconds"].get(TORCH_FUSED)
    if torch_fused:
        ax1.axvline(ratios[TORCH_FUSED], color="#ee4c2c", lw=0.8, ls=":", label="torch._addmm_activation")
    what = "median over rounds of time / np.matmul's in the same round" if paired else "time / np.matmul alone"
    ax1.set_xlabel(f"{what} (lower is better; settled: a loop of that call alone)")
    s = results["fused_relu_bias"]["shape"]
    ax1.set_title(f"RELU_BIAS fp32 {s['m']}x{s['n']}x{s['k']}, CPU (dark green: the route, calibrated: {engine})")
    ax1.legend(handles=[*handles, goal])
    o = results["dispatch_overhead"]["median_seconds_per_call"]
    ax2.bar(
        [n.replace("nvdispatch.matmul", "nvd") for n in o],
        [v * 1e6 for v in o.values()],
        color=["#888", "#76b900", "#76b900"],
    )
    ax2.axhline(2.5 * o["np.matmul"] * 1e6, color="r", lw=0.8, ls="--", label="goal 2.5x np.matmul")
    ax2.set_ylabel("us per call")
    ax2.set_title("8x8 float32 call")
    ax2.legend()
    fig.tight_layout()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--max-foreign", type=float, default=0.15, help="others' load (cores) a kept round may see")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and few calls: checks the script runs")
    parser.add_argument("--keep", action="store_true", help="keep the calibration made here in the user's cache")
    parser.add_argument("--shape", type=int, nargs=3, metavar=("M", "N", "K"), help="default: 8192 1024 256")
    parser.add_argument("--name", default="cpu_matmul", help="the results' file name, without .json/.png")
    parser.add_argument(
        "--goal-only",
        action="store_true",
        help="time only np.matmul, the route, Torch's fused op and the engines alone (more rounds in the same time)",
    )
    args = parser.parse_args()
    out = output_dir(args.out)
    fused = {"m": 64, "n": 32, "k": 16} if args.quick else {}
    if args.shape:
        fused = dict(zip("mnk", args.shape))
    results = {
        "machine": {
            "processor": _processor(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
        },
        "fused_relu_bias": fused_relu_bias(
            args.rounds,
            **fused,
            patience=0 if args.quick else 180.0,
            max_foreign=args.max_foreign,
            settle=0.0 if args.quick else 0.15,
            quick=args.quick,
            keep=args.keep,
            goal_only=args.goal_only,
        ),
        "dispatch_overhead": dispatch_overhead(max(5, args.rounds // 3), number=100 if args.quick else 20000),
    }
    with open(os.path.join(out, f"{args.name}.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    save_plot(lambda plt: plot(results, plt), os.path.join(out, f"{args.name}.png"))
    f = results["fused_relu_bias"]
    print(json.dumps({k: round(v, 3) for k, v in f["ratio_to_np_matmul"].items()}, indent=1))
    print("median of per-round ratios to np.matmul [quartiles]:")
    for name, r in f["median_of_ratios_to_np_matmul"].items():
        print(f"  {name}: {r['median']:.3f} [{r['quartiles'][0]:.3f}, {r['quartiles'][1]:.3f}]")
    for goal, ratio in f["goals"].items():
        print(f"{goal}: {ratio:.3f}" if ratio is not None else f"{goal}: (no Torch)")
    o = results["dispatch_overhead"]
    print(f"8x8: nvdispatch {o['nvdispatch_us_per_call']:.2f} us/call, {o['ratio_to_np_matmul']:.2f}x np.matmul")
    print(f"8x8 RELU_BIAS: {o['relu_bias_ratio_to_np_matmul']:.2f}x np.matmul (strategy {o['relu_bias_strategy']})")
    c = f["calibration"]
    print(f"calibration picked {c['picked']}, engine {c['picked_engine']} (engines {c['engine_order']})")
    if c["order_with_the_cores_free"]:
        print(f"  with the cores free {c['order_with_the_cores_free']}, "
              f"with another thread running {c['order_with_another_thread_running']}")  # fmt: skip
    if f["route_choices_per_call"]:
        for setting, counts in f["route_choices_per_call"].items():
            print(f"route's calls, {setting}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    kept = f["rounds"]["kept"]
    print(f"rounds kept: {kept['count']} of {kept['of']} (quiet rounds only: {kept['quiet_only']})")
    print(f"processor: {results['machine']['processor']}, load average at the end: {f['load_average']}")
    print("settled (a loop of each call alone):")
    print(json.dumps({k: round(v, 3) for k, v in f["settled"]["ratio_to_np_matmul"].items()}, indent=1))
    print("settled, median of per-round ratios:")
    for name, r in f["settled"]["median_of_ratios_to_np_matmul"].items():
        print(f"  {name}: {r['median']:.3f}")


if __name__ == "__main__":
    main()
