# ruff: noqa: B023 - the lambdas are timed at once, inside the loop
"""GPU matmul benchmark: fused epilogs (nvdispatch / cuBLASLt) vs the plain matmul, Torch unfused,
``torch._addmm_activation`` and nvmath-python's ``Matmul``; plus host overhead of a cached call (also of the
epilogs with an aux input or output, against their Python path and the nearest Torch ops).

Kernel times use CUDA events around ``REPS`` back-to-back launches queued while the GPU is held busy by
``torch.cuda._sleep`` (so the host's Python overhead is hidden and the events measure the GPU), median of
``ROUNDS``. Run on the GPU machine:  python benchmarks/gpu_matmul_bench.py [--out DIR] [--host-only]
(``--host-only``: only the host overhead of cached calls, into DIR/gpu_matmul_host.json); ``--plot JSON`` draws
the PNG of a written JSON again (anywhere).
Needs an NVIDIA GPU, ``pip install 'nvdispatch[torch,cuda,bench]'``; CuPy and nvmath-python are timed when
installed.
"""

from __future__ import annotations

import json
import statistics
import time

from _bench import cuda_event_seconds, output_dir, parser, progress, require_cuda_torch, save_plot

SHAPES = [(16384, 4096, 512), (4096, 4096, 4096), (8192, 8192, 1024), (1024, 512, 2048)]
DTYPES = ["float16", "bfloat16", "float32"]
EPILOGS = ["RELU_BIAS", "GELU_BIAS", "BIAS", "GELU_AUX_BIAS"]
REPS, ROUNDS = 20, 5


def gpu_time(fn, torch) -> float:
    """Median seconds per call of fn() measured by CUDA events, host overhead hidden: ROUNDS rounds of REPS
    calls queued behind ~10 ms of GPU busy-wait (read at call time: autotune_bench lowers them)."""
    return cuda_event_seconds(fn, torch, reps=ROUNDS, inner=REPS, warmup=1, busy_cycles=20_000_000 // REPS)


def run(out_dir: str) -> None:
    import torch

    import nvdispatch
    from nvdispatch import Epilog

    try:
        from nvmath.linalg.advanced import Matmul as NvMatmul
        from nvmath.linalg.advanced import MatmulEpilog
    except Exception as exc:  # noqa: BLE001
        NvMatmul = None
        print("nvmath unavailable:", exc)
    out_dir = output_dir(out_dir)
    results = {"shapes": SHAPES, "cells": [], "device": torch.cuda.get_device_name()}
    F = torch.nn.functional
    cells = [(shape, dtype) for shape in SHAPES for dtype in DTYPES]
    for (m, n, k), dtype in progress(cells, "shapes x dtypes"):
        dt = getattr(torch, dtype)
        a = torch.randn(m, k, device="cuda", dtype=dt)
        b = torch.randn(k, n, device="cuda", dtype=dt)
        bias = torch.randn(n, device="cuda", dtype=dt)
        bias_m = torch.randn(m, 1, device="cuda", dtype=dt)
        plain = gpu_time(lambda: torch.matmul(a, b), torch)
        for ep in EPILOGS:
            cell = {"m": m, "n": n, "k": k, "dtype": dtype, "epilog": ep, "plain_matmul": plain}
            mm = nvdispatch.Matmul(a, b)
            mm.plan(epilog=Epilog[ep], epilog_inputs={"bias": bias})
            cell["strategy"] = f"{mm.executor}/{mm.strategy}"
            cell["nvdispatch"] = gpu_time(mm.execute, torch)
            try:
                mm.autotune(iterations=5)
                cell["nvdispatch_tuned"] = gpu_time(mm.execute, torch)
            except Exception as exc:  # noqa: BLE001
                cell["autotune_error"] = repr(exc)
            act = {"RELU_BIAS": torch.relu, "GELU_BIAS": lambda x: F.gelu(x, approximate="tanh")}
            if ep == "BIAS":
                cell["torch_unfused"] = gpu_time(lambda: a @ b + bias, torch)
                cell["torch_addmm"] = gpu_time(lambda: torch.addmm(bias, a, b), torch)
            elif ep == "GELU_AUX_BIAS":

                def unfused():
                    pre = a @ b + bias
                    return F.gelu(pre, approximate="tanh"), pre

                cell["torch_unfused"] = gpu_time(unfused, torch)
            else:
                f = act[ep]
                cell["torch_unfused"] = gpu_time(lambda: f(a @ b + bias), torch)
                g = ep == "GELU_BIAS"
                cell["torch_addmm_activation"] = gpu_time(
                    lambda: torch._addmm_activation(bias, a, b, use_gelu=g), torch
                )
            if NvMatmul is not None:
                try:
                    nm = NvMatmul(a, b)
                    nm.plan(epilog=getattr(MatmulEpilog, ep), epilog_inputs={"bias": bias_m})
                    cell["nvmath"] = gpu_time(nm.execute, torch)
                    nm.free()
                except Exception as exc:  # noqa: BLE001
                    cell["nvmath_error"] = repr(exc)[:200]
            best = min(cell["nvdispatch"], cell.get("nvdispatch_tuned", 1e9))
            cell["ratio_vs_plain"] = best / plain
            if "nvmath" in cell:
                cell["ratio_vs_nvmath"] = best / cell["nvmath"]
            results["cells"].append(cell)
            print(
                f"{m}x{n}x{k} {dtype:9s} {ep:14s} plain {plain * 1e6:8.1f} us  nvd {best * 1e6:8.1f} "
                f"x{cell['ratio_vs_plain']:.3f}  nvmath {cell.get('nvmath', float('nan')) * 1e6:8.1f} "
                f"x{cell.get('ratio_vs_nvmath', float('nan')):.3f}  torch-unfused "
                f"{cell['torch_unfused'] * 1e6:8.1f}  [{cell['strategy']}]",
                flush=True,
            )
            mm.free()
        a = b = bias = bias_m = None
        nvdispatch.plan_cache.clear()
        torch.cuda.empty_cache()
    results["host_overhead"] = host_overhead(torch, nvdispatch)
    with open(f"{out_dir}/gpu_matmul_bench.json", "w") as fh:
        json.dump(results, fh, indent=1)


def host_times(cases: dict, torch, n: int = 300, rounds: int = 60) -> dict:
    """Median host seconds per call of each case. Rounds are short (``n`` calls, synchronised between rounds
    outside the timing, so the launch queue never fills and GPU time never shows) and the cases take turns
    round by round, so their ratios come from the same moments of the machine."""
    for fn in cases.values():
        for _ in range(200):
            fn()
    samples: dict = {name: [] for name in cases}
    for _ in progress(range(rounds), "host rounds"):
        for name, fn in cases.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - t0) / n)
    torch.cuda.synchronize()
    return {name: statistics.median(v) for name, v in samples.items()}


#: epilogs with an aux input or an extra output: a fused MLP's forward (RELU_AUX_BIAS) and backward (BGRADB, DRELU)
AUX_EPILOGS = ("RELU_AUX_BIAS", "BGRADB", "DRELU")


class _CountingLaunch:
    """A plan's Python launch sequence, counting its launches."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def aux_epilog_cases(torch, nvdispatch, a, b, bias) -> tuple[dict, dict]:
    """Host cases of :data:`AUX_EPILOGS` on cached 16x16 calls: nvdispatch's call (the compiled direct call where
    the extension is built), the same call with its plan's direct call switched off (the Python path: what every
    such call took before the compiled form served them), and the nearest Torch ops computing the same outputs.
    Also ``(checks)``: for each epilog whether the switched-off plan is the one the call runs, and its route."""
    y, aux = nvdispatch.matmul(a, b, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias})
    mask = y > 0
    kwargs = {
        "RELU_AUX_BIAS": {"epilog": "RELU_AUX_BIAS", "epilog_inputs": {"bias": bias}},
        "BGRADB": {"epilog": "BGRADB"},
        "DRELU": {"epilog": "DRELU", "epilog_inputs": {"relu_aux": aux["relu_aux"]}},
    }

    def relu_aux_bias():
        z = torch._addmm_activation(bias, a, b)
        return z, z > 0

    peers = {
        "RELU_AUX_BIAS": relu_aux_bias,
        "BGRADB": lambda: (torch.matmul(a, b), b.sum(0)),
        "DRELU": lambda: torch.matmul(a, b).mul_(mask),
    }
    cases: dict = {}
    checks: dict = {}
    for name in AUX_EPILOGS:
        kw = kwargs[name]
        mm = nvdispatch.Matmul(a, b)
        mm.plan(**kw)
        plan = mm._plan
        call = lambda kw=kw: nvdispatch.matmul(a, b, **kw)

        def python_path(call=call, plan=plan):
            direct, plan.direct = plan.direct, None
            try:
                return call()
            finally:
                plan.direct = direct

        launch = getattr(plan, "launch", None)  # a cuBLASLt plan's (another executor's plan has none)
        compiled_calls = same_plan = False
        if launch is not None:
            plan.launch = counting = _CountingLaunch(launch)
            try:
                call()
                compiled_calls = counting.calls == 0
                python_path()
                same_plan = counting.calls == (0 if compiled_calls else 1) + 1
            finally:
                plan.launch = launch
        cases[f"nvdispatch.matmul {name} (torch)"] = call
        cases[f"nvdispatch.matmul {name}, Python path forced"] = python_path
        cases[f"{name}: nearest Torch ops"] = peers[name]
        checks[f"{name}: the call runs the compiled direct call"] = compiled_calls
        checks[f"{name}: the forced Python path runs on the call's plan"] = same_plan
        checks[f"{name}: route"] = str(nvdispatch.explain(a, b, **kw)).splitlines()[:2]
        algorithm = getattr(plan, "algorithm", None)
        checks[f"{name}: algorithm workspace bytes"] = int(getattr(algorithm, "workspaceSize", 0) or 0)
    return cases, checks


def host_overhead(torch, nvdispatch) -> dict:
    """Host time of cached 16x16 calls (the GPU part, ~2.6 us, is never the limit)."""
    from nvdispatch import linalg
    from nvdispatch._call_key import class_keys
    from nvdispatch.linalg import _prepare

    a = torch.randn(16, 16, device="cuda")
    b = torch.randn(16, 16, device="cuda")
    bias = torch.randn(16, device="cuda")
    relu_bias = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}}
    pw, pbias = torch.nn.Parameter(b.clone()), torch.nn.Parameter(bias.clone())
    mm = nvdispatch.Matmul(a, b)
    mm.plan(**relu_bias)
    with nvdispatch.set_backend("cuda"):  # cuBLASLt asked for by name (the default without the extension is Torch's op)
        lt = nvdispatch.Matmul(a, b)
        lt.plan(**relu_bias)
    lt_plan, lt_ops = lt._plan, lt._operands()
    cases = {
        "torch.matmul": lambda: torch.matmul(a, b),
        "torch._addmm_activation": lambda: torch._addmm_activation(bias, a, b),
        "nvdispatch.matmul plain (torch)": lambda: nvdispatch.matmul(a, b),
        "nvdispatch.matmul RELU_BIAS (torch)": lambda: nvdispatch.matmul(
            a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}
        ),
        # a training step's linear layer: nn.Parameter weight and bias, autograd recording
        "nvdispatch.matmul RELU_BIAS, Parameters, autograd": lambda: nvdispatch.matmul(
            a, pw, epilog="RELU_BIAS", epilog_inputs={"bias": pbias}
        ),
        "torch.relu(torch.addmm), Parameters, autograd": lambda: torch.relu(torch.addmm(pbias, a, pw)),
        "Matmul.execute RELU_BIAS (default route)": mm.execute,
        "Matmul.execute RELU_BIAS (cuBLASLt)": lt.execute,
        "cuBLASLt plan.execute alone": lambda: lt_plan.execute(lt_ops),
        "cuBLASLt plan.direct alone": lambda: lt_plan.direct(a, b, bias),  # compiled where the extension is
        "cuBLASLt plan, Python direct call": lambda: lt_plan.python_direct(a, b, bias),
        "core _prepare (detect+validate+select)": lambda: _prepare(a, b, None, 1, None, "RELU_BIAS", {"bias": bias},
                                                                   None, None),
    }
    if linalg._front is not linalg._route:  # the memo hit compiled: the same calls through the Python route
        cases["Python route, plain (torch)"] = lambda: linalg._route(a, b, None, 1, None, None, None, None, None,
                                                                     None, None)
        cases["Python route, RELU_BIAS (torch)"] = lambda: linalg._route(
            a, b, None, 1, None, "RELU_BIAS", {"bias": bias}, None, None, None, None
        )
    if torch.cuda.get_device_capability() >= (8, 9):  # FP8, device scales as delayed scaling keeps them
        e4m3 = torch.float8_e4m3fn
        a8, b8 = a.to(e4m3), b.t().to(e4m3).contiguous().t()  # b column-major, as _scaled_mm needs
        bias16 = bias.to(torch.bfloat16)
        sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(2.0, device="cuda")
        fp8kw = {
            "epilog": "RELU_BIAS",
            "epilog_inputs": {"bias": bias16},
            "quantization_scales": {"a": sa, "b": sb},
            "options": {"result_type": "bfloat16"},
        }
        cases["nvdispatch.matmul FP8 RELU_BIAS, device scales"] = lambda: nvdispatch.matmul(a8, b8, **fp8kw)
        cases["torch.relu(torch._scaled_mm(bias=))"] = lambda: torch.relu(
            torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, bias=bias16, out_dtype=torch.bfloat16)
        )
    aux_cases, aux_checks = aux_epilog_cases(torch, nvdispatch, a, b, bias)
    cases.update(aux_cases)
    try:
        import cupy

        ca, cb, cbias = cupy.asarray(a), cupy.asarray(b), cupy.asarray(bias)
        cases["cupy.matmul"] = lambda: cupy.matmul(ca, cb)
        cases["nvdispatch.matmul plain (cupy)"] = lambda: nvdispatch.matmul(ca, cb)
        cases["nvdispatch.matmul RELU_BIAS (cupy, cuBLASLt)"] = lambda: nvdispatch.matmul(
            ca, cb, epilog="RELU_BIAS", epilog_inputs={"bias": cbias}
        )
    except Exception as exc:  # noqa: BLE001
        print("cupy unavailable:", exc)
    out: dict = host_times(cases, torch)
    out["compiled_front"] = linalg._front is not linalg._route  # nvdispatch/_hotpath.c built and loaded
    out["compiled_direct"] = type(lt_plan.direct).__name__ == "builtin_function_or_method"  # _hotpath_lt.c
    # Torch's precision settings read by one compiled call (_hotpath_reading.c), as the front reads them per call
    out["compiled_reading"] = type(class_keys(torch.Tensor).precision).__name__ == "builtin_function_or_method"
    out["routes"] = {
        "RELU_BIAS (torch)": str(nvdispatch.explain(a, b, **relu_bias)).splitlines()[:2],
        "Matmul RELU_BIAS (default route)": [f"executor {mm.executor!r}, strategy {mm.strategy!r}"],
        "Matmul (cuBLASLt)": list(lt_plan.steps),
    }
    base = out["torch.matmul"]
    for key in list(cases):
        if key.startswith(("nvdispatch", "Matmul", "cuBLASLt", "torch._", "Python route")):
            out[f"ratio {key} / torch.matmul"] = out[key] / base
    out["ratio Parameters autograd / torch.relu(torch.addmm)"] = (
        out["nvdispatch.matmul RELU_BIAS, Parameters, autograd"] / out["torch.relu(torch.addmm), Parameters, autograd"]
    )
    if "torch.relu(torch._scaled_mm(bias=))" in out:
        out["ratio FP8 RELU_BIAS / torch.relu(torch._scaled_mm(bias=))"] = (
            out["nvdispatch.matmul FP8 RELU_BIAS, device scales"] / out["torch.relu(torch._scaled_mm(bias=))"]
        )
    if "cupy.matmul" in out:
        out["ratio nvdispatch RELU_BIAS (cupy) / cupy.matmul"] = (
            out["nvdispatch.matmul RELU_BIAS (cupy, cuBLASLt)"] / out["cupy.matmul"]
        )
        out["ratio nvdispatch plain (cupy) / cupy.matmul"] = out["nvdispatch.matmul plain (cupy)"] / out["cupy.matmul"]
    out.update(aux_checks)
    for name in AUX_EPILOGS:
        own, peer = out[f"nvdispatch.matmul {name} (torch)"], out[f"{name}: nearest Torch ops"]
        out[f"ratio {name} nvdispatch / nearest Torch ops"] = own / peer
        out[f"ratio {name} nvdispatch / its Python path"] = own / out[f"nvdispatch.matmul {name}, Python path forced"]
    for key, v in out.items():
        print(f"{key:60s} {v * 1e6 if isinstance(v, float) and 'ratio' not in key else v}")
    return out


def plot(path: str) -> None:
    with open(path) as fh:
        data = json.load(fh)
    save_plot(lambda plt: _draw(data, plt), path.replace(".json", ".png"), dpi=130)


def _draw(data: dict, plt) -> None:
    cells = data["cells"]
    labels = [f"{c['m']}x{c['n']}x{c['k']}\n{c['dtype']}\n{c['epilog']}" for c in cells]
    fig, ax = plt.subplots(figsize=(max(12, len(cells) * 0.45), 6))
    xs = range(len(cells))
    for key, color in (("ratio_vs_plain", "tab:blue"), ("ratio_vs_nvmath", "tab:green")):
        ax.scatter(xs, [c.get(key, float("nan")) for c in cells], label=key.replace("_", " "), color=color, s=18)
    ax.scatter(
        xs,
        [c["torch_unfused"] / c["plain_matmul"] for c in cells],
        label="torch unfused vs plain",
        color="tab:red",
        s=10,
    )
    ax.axhline(1.03, color="tab:blue", ls="--", lw=0.8)
    ax.axhline(1.0, color="tab:green", ls=":", lw=0.8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=90, fontsize=5)
    ax.set_ylabel("time ratio (lower is better)")
    ax.set_title(f"nvdispatch fused cuBLASLt epilogs on {data.get('device', 'GPU')}")
    ax.legend()
    fig.tight_layout()


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--host-only", action="store_true", help="only the host overhead of cached calls")
    ap.add_argument("--plot", metavar="JSON", help="only draw the PNG of a written JSON (runs anywhere)")
    args = ap.parse_args(argv)
    if args.plot:
        plot(args.plot)
        return
    torch = require_cuda_torch()
    if args.host_only:
        import nvdispatch

        with open(f"{output_dir(args.out)}/gpu_matmul_host.json", "w") as fh:
            json.dump(host_overhead(torch, nvdispatch), fh, indent=1)
    else:
        run(args.out)


if __name__ == "__main__":
    main()
