"""What the result-agreement check costs the CPU timed choices that run it: ``Matmul.autotune`` (each strategy's
result compared with ``plain``'s before timing) and the CPU engine calibration (each engine's with ``ufunc``'s).

Each case is timed with the check and without it (``nvdispatch._matmul_agreement.agreeing`` and
``result_sampler`` replaced by pass-throughs in this process), from a cold start each time (plan cache and
tunings cleared, so the autotune plans and times again), interleaved round by round; we report the median
seconds of each and their ratio (with / without) from the same run, and the time spent inside the check itself
(its samples and comparisons, clocked around them) with its median share of the call: on a shared machine the
whole call varies by more than the check costs, so the share is the figure to read. Plain calls never run the
check (it runs only when a choice is made and cached), so a repeated call's host time is that of
``benchmarks/host_overhead_cpu.py``.

    python benchmarks/agreement_cost.py [--rounds 15] [--out benchmarks/results] [--quick]

Writes ``agreement_cost.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import _bench
import numpy as np


def _cases(nvd):
    from nvdispatch.executors import numpy_matmul, numpy_matmul_calibration

    rng = np.random.default_rng(0)
    cases = {}
    for m, k, n in ((64, 64, 64), (256, 256, 256), (1024, 512, 1024)):
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        bias = rng.standard_normal(n, dtype=np.float32)
        kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}}

        def autotune(a=a, b=b, kw=kw):
            nvd.plan_cache.clear()
            nvd.plan_cache.clear_tunings()
            nvd.Matmul(a, b).plan(**kw).autotune(iterations=1)

        cases[f"Matmul.autotune {m}x{k}x{n} float32 RELU_BIAS"] = autotune
        if m == 256:
            problem = nvd.Matmul(a, b).plan(**kw)._problem
            cands = numpy_matmul.candidates(problem)

            def calibrate(problem=problem, cands=cands):
                numpy_matmul_calibration.clear()
                numpy_matmul_calibration.calibrate(problem, cands, numpy_matmul.engine_plan, persist=False)

            cases[f"engine calibration {m}x{k}x{n} float32 RELU_BIAS"] = calibrate
    return cases


def main() -> None:
    ap = _bench.parser(__doc__)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="a smoke test: few rounds")
    args = ap.parse_args()
    rounds = 3 if args.quick else args.rounds

    import nvdispatch as nvd
    from nvdispatch import _matmul_agreement, linalg
    from nvdispatch.executors import numpy_matmul_calibration

    spent = [0.0]  # seconds inside the check (its comparisons and samples) in the current call

    def clocked(fn):
        def run(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t0

        return run

    real = clocked(_matmul_agreement.agreeing)

    def real_sampler(problem, stream):
        return clocked(_matmul_agreement.result_sampler(problem, stream))

    def skip(plans, *a, **k):
        return plans, {}

    def no_sampler(problem, stream):
        return lambda got: None

    def use(check):
        linalg.agreeing = numpy_matmul_calibration.agreeing = real if check else skip
        linalg.result_sampler = numpy_matmul_calibration.result_sampler = real_sampler if check else no_sampler

    cases = _cases(nvd)
    samples = {name: {"with check": [], "without": [], "inside": []} for name in cases}
    for r in _bench.progress(range(rounds), "rounds"):
        for name, fn in cases.items():
            for check in ((True, False) if r % 2 == 0 else (False, True)):
                use(check)
                spent[0] = 0.0
                t0 = time.perf_counter()
                fn()
                samples[name]["with check" if check else "without"].append(time.perf_counter() - t0)
                if check:
                    samples[name]["inside"].append(spent[0])
    use(True)
    results = {}
    for name, got in samples.items():
        on, off = statistics.median(got["with check"]), statistics.median(got["without"])
        inside = statistics.median(got["inside"])
        share = statistics.median(i / t for i, t in zip(got["inside"], got["with check"]))
        results[name] = {
            "with_check_s": on, "without_s": off, "ratio": on / off, "check_s": inside, "check_share": share,
            "rounds": rounds,
        }
        print(f"{name:52s} with {on * 1e3:7.1f} ms  without {off * 1e3:7.1f} ms  ratio {on / off:.3f}  "
              f"inside the check {inside * 1e3:.2f} ms ({share:.2%})")
    out = _bench.output_dir(args.out)
    with open(os.path.join(out, "agreement_cost.json"), "w") as f:
        json.dump({"cases": results, "numpy": np.__version__, "nvdispatch": nvd.__version__}, f, indent=1)


if __name__ == "__main__":
    main()
