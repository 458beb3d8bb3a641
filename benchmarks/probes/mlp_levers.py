# ruff: noqa: B023 - the step closures are timed at once, inside the loop
"""GPU probe (issue #31, not a benchmark of record): the levers of FusedMLP's training step, each against the
current default, in one process, on the 4-layer bf16 MLP of ``compiled_mlp_bench.py`` (batch 8192, the same step:
forward, ``out.float().square().mean()``, backward).

Per width and activation, every configuration below is set up from scratch (plan cache, tuned choices and the
backward-form choices cleared; the lever's options set), then its step timed with CUDA events (median of
``--repeats`` samples of ``--steps`` back-to-back steps) in the modes asked for: ``eager``; ``graphed``
(``torch.cuda.make_graphed_callables``: forward and backward each one CUDA-graph replay, no host cost: the step's
GPU time, what ``reduce-overhead`` tends to once its host cost is hidden); ``r-o`` and ``compile``
(``torch.compile``, ``mode="reduce-overhead"`` / default; the ``--configs-compiled`` configurations only, the goal's
modes). Also: the host's time to queue a step (no synchronisation inside: near the step's time where the host is
the bound), the kernels of the eager step (torch.profiler: GPU µs and launches per step), the gradients' largest
relative error against the plain Torch model's, the backward forms chosen (``output:`` the top layer's bias
gradient, ``layer:`` a hidden layer's backward), and each autotuned GEMM's timing (the heuristic's first algorithm
against the one kept).

Configurations (FusedMLP unless named ``torch``):

``torch``            the plain Torch model (``F.linear`` + activation), the reference of every ratio
``default``          FusedMLP as it is (backward forms timed one call at a time)
``gpu-choice``       the backward forms timed on their GPU time (``choice_repeat=8``: 8 calls back to back per sample
                     instead of 1, so the host's launch cost no longer counts)
``one-pass``         every backward form forced to the one-pass kernel (derivative + bias gradient in one pass)
``epilogue``         every backward form forced to the epilogue one (mask or DGELU, then BGRADA)
``drelu``            ReLU only: ``relu_backward="drelu"`` (forward RELU_AUX_BIAS, backward on its bit mask), GPU
                     choice
``gelu-split``       GELU only: ``gelu_forward="split"`` (BIAS GEMM + Torch's GELU instead of GELU_AUX_BIAS)
``autotune``         ``autotune="auto"``: each GEMM site's cuBLASLt algorithm timed once per problem
``all``              ``autotune`` + ``gpu-choice``
``all-split``        GELU only: ``all`` + ``gelu-split``
``default-again``    ``default`` once more at the end: how far the same configuration drifts within the run

Printed: per width and activation one table (ms per step; ``x torch`` columns: the configuration's time over the
Torch model's in the same mode; ``best/torch``: the best FusedMLP compiled mode over the best Torch mode, the
issue's ratio, where measured), the kernels of ``torch``, ``default`` and ``all`` side by side, and the autotuned
GEMMs. ``--json PATH`` writes everything.

    python benchmarks/probes/mlp_levers.py                       # the lead's run: widths 1024 4096, relu gelu
    python benchmarks/probes/mlp_levers.py --widths 1024 --activations relu --configs torch default all
"""

from __future__ import annotations

import copy
import json
import os
import re
import statistics
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import compiled_mlp_bench as B  # noqa: E402
from _bench import parser, progress, require_cuda_torch  # noqa: E402

CONFIGS = ("torch", "default", "gpu-choice", "one-pass", "epilogue", "drelu", "gelu-split", "autotune", "all",
           "all-split", "default-again")  # fmt: skip
#: what each configuration sets: options (mlp_options), a forced form, the model
LEVERS = {
    "default": {},
    "gpu-choice": {"options": {"choice_repeat": 8}},
    "one-pass": {"force": "one-pass"},
    "epilogue": {"force": "epilogue"},
    "drelu": {"model": "drelu", "options": {"choice_repeat": 8}, "only": "relu"},
    "gelu-split": {"options": {"gelu_forward": "split"}, "only": "gelu"},
    "autotune": {"options": {"autotune": "auto"}},
    "all": {"options": {"autotune": "auto", "choice_repeat": 8}},
    "all-split": {"options": {"autotune": "auto", "choice_repeat": 8, "gelu_forward": "split"}, "only": "gelu"},
    "default-again": {},
}
#: configurations also timed compiled (the goal's modes), unless --configs-compiled says otherwise
COMPILED = ("torch", "default", "gpu-choice", "all")
MODES = ("eager", "graphed", "r-o", "compile")
_TORCH_MODE = {"eager": None, "graphed": "graphed", "r-o": "reduce-overhead", "compile": "default"}


class Setup:
    """Puts the library in a configuration's state and back (every choice and plan cleared both ways)."""

    def __init__(self, torch):
        import nvdispatch
        from nvdispatch.integrations import lt_tune_once, mlp_options
        from nvdispatch.integrations import torch_activation_grad as one_pass

        self.torch, self.cache, self.options, self.one_pass = torch, nvdispatch.plan_cache, mlp_options, one_pass
        self.choose, self.chosen = one_pass.choose, one_pass.chosen
        self.tuned: list[tuple[str, str]] = []
        tune_once = lt_tune_once.tune_once

        def recording(plan, *args, **kwargs):
            got = tune_once(plan, *args, **kwargs)
            self.tuned.append((kwargs.get("who", "?"), got))
            return got

        lt_tune_once.tune_once = recording

    def clear(self):
        self.torch.cuda.synchronize()
        self.cache.clear()
        self.cache.clear_tunings()
        self.one_pass.forget_choices()
        self.one_pass.choose, self.one_pass.chosen = self.choose, self.chosen
        self.options.set_mlp_options(autotune=None, gelu_forward=None, autotune_budget=None, choice_repeat=None)

    def apply(self, lever: dict, budget: float):
        self.clear()
        self.tuned.clear()
        if lever.get("options"):
            self.options.set_mlp_options(**lever["options"], autotune_budget=budget)
        forced = lever.get("force")
        if forced:
            self.one_pass.chosen = lambda key: None
            self.one_pass.choose = lambda key, forms, device: forced if forced in forms else next(iter(forms))


def grad_error(torch, reference, model) -> float:
    pairs = zip(reference, B._weights(model))
    return max(float((p - q).abs().max() / p.abs().max().clamp_min(1e-30)) for p, q in pairs)


def measure(torch, model, mode: str, x, args) -> dict:
    """One mode of one model: ``{"ms": median, "samples": [...]}`` or ``{"error": ...}``."""
    out: dict = {}
    try:
        torch._dynamo.reset()
        m = copy.deepcopy(model) if mode == "graphed" else model  # make_graphed_callables patches its module
        t0 = time.perf_counter()
        step = B.make_step(torch, m, _TORCH_MODE[mode], x)
        step(x)
        torch.cuda.synchronize()
        out["first_step_s"] = time.perf_counter() - t0
        samples = B.time_step(torch, step, x, args.steps, args.repeats, args.warmup)
        out["samples_ms"] = [s * 1e3 for s in samples]
        out["ms"] = statistics.median(samples) * 1e3
        hosts = []
        for _ in range(3):  # the host's time to queue the steps (no synchronisation inside): ~ms where host-bound
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            for _ in range(args.steps):
                step(x)
            hosts.append((time.perf_counter() - t1) / args.steps)
        torch.cuda.synchronize()
        out["host_ms"] = statistics.median(hosts) * 1e3
        if mode == "eager":
            from _profile import kernel_table

            total, rows = kernel_table(lambda: step(x), 3, 70)
            out["gpu_us"], out["launches"] = total, sum(r[1] for r in rows)
            out["kernels"] = [[round(us, 1), n, name] for us, n, name in rows]
    except Exception as exc:  # noqa: BLE001 - one mode failing must not end the run
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc(limit=6)
    return out


def _short(name: str) -> str:
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"at::native::", "", name)
    return name[:58]


def run(torch, width: int, activation: str, args, setup: Setup) -> dict:
    plain, fused, _, drelu = B.make_models(torch, width, 4, activation, torch.bfloat16)
    x = torch.randn(args.batch, width, device="cuda", dtype=torch.bfloat16)
    result: dict = {"width": width, "activation": activation, "configs": {}}
    reference = None
    names = [c for c in args.configs if LEVERS.get(c, {}).get("only", activation) == activation]
    for name in progress(names, f"{activation} {width}"):
        entry = result["configs"][name] = {}
        if name == "torch":
            setup.clear()
            model = plain
        else:
            lever = LEVERS[name]
            setup.apply(lever, args.budget)
            model = drelu if lever.get("model") == "drelu" else fused
        modes = [m for m in args.modes if m in ("eager", "graphed") or name in args.configs_compiled]
        for mode in modes:
            entry[mode] = measure(torch, model, mode, x, args)
            if mode == "eager" and "ms" in entry[mode]:
                if name == "torch":
                    reference = [g.clone() for g in B._weights(model)]
                elif reference is not None:
                    entry["grad_rel_err"] = grad_error(torch, reference, model)
        if name != "torch":
            entry["choices"] = sorted({f"{key[0]}:{label}" for key, label in setup.one_pass.choices().items()})
            entry["tuned"] = list(setup.tuned)
    setup.clear()
    return result


def _ms(entry: dict, mode: str):
    got = entry.get(mode, {})
    return got.get("ms")


def report(result: dict) -> None:
    configs = result["configs"]
    torch_entry = configs.get("torch", {})
    print(f"\n=== width {result['width']}, {result['activation']} (ms per step; xT: over the Torch model's same mode)")
    head = f"{'config':<14}" + "".join(f"{m:>9}{'xT':>7}" for m in MODES) + f"{'GPU us':>8}{'kern':>6}" \
        f"{'best/T':>8}  {'grad err':>8}  choices"  # fmt: skip
    print(head)
    torch_best = [v for v in (_ms(torch_entry, m) for m in ("eager", "r-o", "compile")) if v is not None]
    for name, entry in configs.items():
        cells = ""
        for mode in MODES:
            ms, ref = _ms(entry, mode), _ms(torch_entry, mode)
            if ms is None:
                err = entry.get(mode, {}).get("error")
                cells += f"{'ERR' if err else '-':>9}{'':>7}"
            else:
                cells += f"{ms:9.3f}" + (f"{ms / ref:7.3f}" if ref and name != "torch" else f"{'':>7}")
        eager = entry.get("eager", {})
        gpu = f"{eager['gpu_us']:8.0f}{eager['launches']:6d}" if "gpu_us" in eager else f"{'-':>8}{'-':>6}"
        compiled = [v for v in (_ms(entry, m) for m in ("r-o", "compile")) if v is not None]
        ratio = f"{min(compiled) / min(torch_best):8.3f}" if compiled and torch_best and name != "torch" else \
            f"{'':>8}"  # fmt: skip
        err = f"{entry['grad_rel_err']:8.1e}" if "grad_rel_err" in entry else f"{'':>8}"
        print(f"{name:<14}{cells}{gpu}{ratio}  {err}  {','.join(entry.get('choices', []))}")
    print("host time to queue a step, ms (close to the step's time: host-bound):")
    print(f"  {'config':<14}" + "".join(f"{m:>9}" for m in MODES))
    for name, entry in configs.items():
        cells = "".join(f"{entry[m]['host_ms']:9.3f}" if "host_ms" in entry.get(m, {}) else f"{'-':>9}" for m in MODES)
        print(f"  {name:<14}{cells}")
    for name, entry in configs.items():
        for mode in MODES:
            if "error" in entry.get(mode, {}):
                print(f"  {name} {mode}: {entry[mode]['error'][:160]}")
    shown = [n for n in ("torch", "default", "gpu-choice", "all", "all-split") if "kernels" in configs.get(n, {})
             .get("eager", {})]  # fmt: skip
    if shown:
        print("kernels of the eager step, us per step (launches):")
        tables = {n: {k[2]: (k[0], k[1]) for k in configs[n]["eager"]["kernels"]} for n in shown}
        names = sorted({k for t in tables.values() for k in t}, key=lambda k: -max(t.get(k, (0, 0))[0]
                                                                                   for t in tables.values()))
        print(f"  {'kernel':<58}" + "".join(f"{n:>14}" for n in shown))
        for k in names[:22]:
            cells = "".join(f"{tables[n][k][0]:9.1f} ({tables[n][k][1]:2d})" if k in tables[n] else f"{'':>14}"
                            for n in shown)  # fmt: skip
            print(f"  {_short(k):<58}{cells}")
    for name in ("autotune", "all", "all-split"):
        tuned = configs.get(name, {}).get("tuned")
        if not tuned:
            continue
        print(f"autotuned GEMMs ({name}):")
        for who, outcome in tuned:
            m = re.search(r"\((\d+) candidates; kept (.*), ([\d.]+) us; the heuristic's first ([\d.]+) us\)", outcome)
            site = who.split("GEMM ", 1)[-1]
            if m:
                kept, first = float(m.group(3)), float(m.group(4))
                print(f"  {site:<34} {first:8.1f} -> {kept:8.1f} us ({kept / first:5.3f}) {m.group(2)[:50]}")
            else:
                print(f"  {site:<34} {outcome[:90]}")
        break  # one list: the later configurations take the same choices


def main() -> None:
    ap = parser(__doc__, out=False)
    ap.add_argument("--widths", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--activations", nargs="+", default=["relu", "gelu"], choices=["relu", "gelu"])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--configs-compiled", nargs="*", default=list(COMPILED), choices=CONFIGS,
                    help="configurations also timed in the r-o and compile modes (default: %(default)s)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=10, help="steps per timed sample (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=5, help="samples per mode, median reported (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0.5,
                    help="seconds of autotune screening per GEMM problem (default: %(default)s)")
    ap.add_argument("--json", metavar="PATH", help="write every figure there")
    ap.add_argument("--keep-tunings", action="store_true",
                    help="autotune with the GPU's tunings file in NVDISPATCH_CACHE_DIR (default: a fresh folder, so "
                         "every GEMM is timed in this run and its gain listed)")
    args = ap.parse_args()
    if not args.keep_tunings:
        os.environ["NVDISPATCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="mlp_levers_")
    torch = require_cuda_torch()
    import nvdispatch

    setup = Setup(torch)
    t0 = time.perf_counter()
    results = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, nvdispatch {nvdispatch.__version__}, "
          f"batch {args.batch}, {args.steps} steps x {args.repeats}", flush=True)  # fmt: skip
    for width in args.widths:
        for activation in args.activations:
            results.append(run(torch, width, activation, args, setup))
            report(results[-1])
            print(f"({time.perf_counter() - t0:.0f} s so far)", flush=True)
            if args.json:  # after every width and activation: a run cut short keeps what it measured
                with open(args.json, "w") as f:
                    json.dump({"device": torch.cuda.get_device_name(), "args": vars(args), "results": results}, f,
                              indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
