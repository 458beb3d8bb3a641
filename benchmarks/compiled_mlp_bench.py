# ruff: noqa: B023 - the step closures are timed at once, inside the loop
"""Compiled MLP training steps: plain Torch against the same model on nvdispatch's fused epilogs (GPU).

A 4-layer MLP (``width -> width`` linear layers, the activation between them, none after the last), bf16, one
training step = forward, ``loss = out.float().square().mean()``, backward (gradients of every weight and bias; the
input requires none). Contenders, each in this one process on the same weights and input:

* ``torch eager`` / ``torch compile`` / ``torch reduce-overhead``: ``F.linear`` + ReLU/GELU(tanh), eagerly, through
  inductor, and through inductor with CUDA graphs (``mode="reduce-overhead"``);
* ``nvdispatch fused compile`` / ``nvdispatch fused reduce-overhead`` / ``nvdispatch fused eager``:
  :class:`nvdispatch.integrations.torch_mlp.FusedMLP`, the chain one autograd node (two operators in a compiled
  graph), its weights in ``torch.nn.Linear``'s ``(out, in)`` layout and its GEMMs Linear's forms: forward
  ``h @ W^T`` with ``RELU_BIAS``/``GELU_AUX_BIAS``, backward ``dz^T @ h`` with ``BGRADA`` (weight and bias
  gradients) and, for the layer below, ``dz @ W`` with ``DGELU`` or (ReLU, ``relu_backward="mask"``, the default)
  plain, masked by the saved output (on CUDA bf16 each layer's form timed once, against a plain GEMM and one
  pass that applies the derivative and writes the bias gradient, the weight-gradient GEMM then plain);
* ``nvdispatch fused drelu compile`` / ``nvdispatch fused drelu reduce-overhead`` (ReLU models only): the same
  with ``relu_backward="drelu"`` (forward ``RELU_AUX_BIAS``, backward ``DRELU`` GEMMs on its bit masks);
* ``torch graphed`` / ``nvdispatch fused graphed``: each model through ``torch.cuda.make_graphed_callables`` (its
  forward and backward each one CUDA graph replay, no inductor): Torch's own whole-network CUDA-graph API, the
  lowest host cost either model can have; reported beside the goal's ratio (``ratio_with_graphed``);
* ``nvdispatch by hand eager`` / ``compile`` / ``reduce-overhead``: the same step written by hand on the public
  ``nvdispatch.matmul`` epilogs, no autograd (``_mlp_by_hand.py``: forward ``RELU_BIAS``/``GELU_AUX_BIAS``, backward
  ``BGRADA`` weight and bias gradients and ``DGELU`` or the mask for the layer below), the issue's "step written by
  hand"; compiled with ``fullgraph=True``, under ``reduce-overhead`` the whole step is one CUDA graph.
  ``nvdispatch-sums by hand ...``: the bias gradients as Torch sums (inductor folds them into the passes that make
  the gradients) beside plain weight-gradient GEMMs. ``torch by hand ...``: the same step in plain Torch ops, its
  by-hand reference. The nvdispatch ones count in the goal's ratio (``ratio_goal``); also reported alone
  (``ratio_by_hand``: best nvdispatch by-hand compiled step over the best Torch mode; ``ratio_by_hand_peer``: over
  the best Torch by-hand step);
* ``torch func compile`` / ``reduce-overhead`` and ``nvdispatch fused func compile`` / ``reduce-overhead``: each
  model's step as a function of its parameters (``torch.func.grad_and_value`` over ``functional_call`` and the
  loss, ``_mlp_functional.py``) compiled whole, ``fullgraph=True``: the backward inside the compiled program, one
  CUDA graph per step under ``reduce-overhead``, for both models alike. FusedMLP's counts in the goal's ratio; also
  reported alone (``ratio_functional``: best FusedMLP functional step over the best Torch functional step;
  ``ratio_functional_to_best_torch``: over the best Torch mode of the goal);
* ``nvdispatch ops compile``: the model written with ``nvdispatch.matmul(x, w.mT, epilog="RELU_BIAS"/"GELU_BIAS")``
  per layer, ``w`` in Linear's layout (each layer's backward: the activation's derivative, one BGRADB GEMM and one
  GEMM).

All models hold the same weights, each in Linear's ``(out, in)`` layout (copied as they are from the Torch model).

Times: CUDA events around ``--steps`` back-to-back steps, median of ``--repeats``. Goals (issue #31): the best
nvdispatch compiled step (FusedMLP through autograd, FusedMLP's functional step, or the step by hand) <= 0.8x the best
Torch mode (eager, compile, reduce-overhead of the plain model) at width 1024 and <= 0.97x at 4096
(``ratio_goal``); beside it ``ratio_whole_step_peer``, the same compilation on both sides (each side's best step
compiled whole); a ``reduce-overhead`` step
of a small MLP (width 256, batch ``--small-batch``) within 1.02x of the plain Torch model's. Also: eager host time of
cached 16x16 calls (nvdispatch against Torch's own op, best of five loops), the ratios the CPU benchmark
(``host_overhead_cpu.py``) reports on the CPU.

    python benchmarks/compiled_mlp_bench.py                                   # the H200 run (a few minutes)
    python benchmarks/compiled_mlp_bench.py --quick                           # smoke test: small, few steps

Results are written after every configuration (a run cut short keeps what it measured): ``compiled_mlp_bench.json``
and ``compiled_mlp_bench.png``. Without a CUDA GPU it prints one line and exits with status 2.
"""

from __future__ import annotations

import copy
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback

import _mlp_by_hand
import _mlp_functional
from _bench import output_dir, parser, progress, require_cuda_torch, save_plot

TORCH_MODES = ("torch eager", "torch compile", "torch reduce-overhead")
#: whole-network CUDA graphs through ``torch.cuda.make_graphed_callables``: outside the goal's modes, compared apart
GRAPHED = ("torch graphed", "nvdispatch fused graphed")
#: the step written by hand (no autograd, ``_mlp_by_hand.py``), compiled whole: not among Torch's modes of the goal
BY_HAND = ("nvdispatch by hand eager", "nvdispatch by hand compile", "nvdispatch by hand reduce-overhead",
           "nvdispatch-sums by hand eager", "nvdispatch-sums by hand compile",
           "nvdispatch-sums by hand reduce-overhead",
           "torch by hand eager", "torch by hand compile", "torch by hand reduce-overhead")  # fmt: skip
#: each model's step as a function of its parameters (``torch.func``, ``_mlp_functional.py``), compiled whole: not
#: among Torch's modes of the goal
FUNCTIONAL = ("torch func compile", "torch func reduce-overhead", "nvdispatch fused func compile",
              "nvdispatch fused func reduce-overhead")  # fmt: skip
NVD_MODES = ("nvdispatch fused compile", "nvdispatch fused reduce-overhead", "nvdispatch fused eager",
             "nvdispatch ops compile", "nvdispatch fused drelu compile",
             "nvdispatch fused drelu reduce-overhead")  # fmt: skip
#: the contenders the goals compare with the best Torch mode: FusedMLP compiled, either ReLU backward
NVD_COMPILED = ("nvdispatch fused compile", "nvdispatch fused reduce-overhead", "nvdispatch fused drelu compile",
                "nvdispatch fused drelu reduce-overhead")  # fmt: skip
#: contenders that differ from others only for ReLU models
RELU_ONLY = ("nvdispatch fused drelu compile", "nvdispatch fused drelu reduce-overhead")
GOALS = {1024: 0.8, 4096: 0.97}


# -- the models -------------------------------------------------------------------------------------------------------
def make_models(torch, width: int, layers: int, activation: str, dtype):
    """(Torch model, FusedMLP, per-layer nvdispatch model, FusedMLP with ``relu_backward="drelu"``) holding the
    same weights."""
    import torch.nn.functional as F

    import nvdispatch
    from nvdispatch.integrations.torch_mlp import FusedMLP

    act = torch.relu if activation == "relu" else (lambda h: F.gelu(h, approximate="tanh"))
    epilog = "RELU_BIAS" if activation == "relu" else "GELU_BIAS"

    class TorchMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(
                [torch.nn.Linear(width, width, device="cuda", dtype=dtype) for _ in range(layers)]
            )

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i < layers - 1:
                    x = act(x)
            return x

    class OpsMLP(torch.nn.Module):
        def __init__(self, weights, biases):
            super().__init__()
            self.weights = torch.nn.ParameterList([torch.nn.Parameter(w.detach().clone()) for w in weights])
            self.biases = torch.nn.ParameterList([torch.nn.Parameter(b.detach().clone()) for b in biases])

        def forward(self, x):
            for i, (w, b) in enumerate(zip(self.weights, self.biases)):
                e = epilog if i < layers - 1 else "BIAS"
                x = nvdispatch.matmul(x, w.mT, epilog=e, epilog_inputs={"bias": b})  # Linear's h @ W^T
            return x

    torch.manual_seed(0)
    plain = TorchMLP()
    fused = FusedMLP([width] * (layers + 1), activation=activation, device="cuda", dtype=dtype)
    with torch.no_grad():
        for layer, w, b in zip(plain.layers, fused.weights, fused.biases):
            w.copy_(layer.weight)  # the same (out, in) layout
            b.copy_(layer.bias)
    ops = OpsMLP(list(fused.weights), list(fused.biases))
    drelu = FusedMLP([width] * (layers + 1), activation=activation, relu_backward="drelu", device="cuda", dtype=dtype)
    with torch.no_grad():
        for p, q in zip(drelu.parameters(), fused.parameters()):
            p.copy_(q)
    return plain, fused, ops, drelu


def make_step(torch, model, mode: str | None, sample=None):
    """One training step of ``model`` (``mode``: None eagerly, ``"graphed"`` through
    ``torch.cuda.make_graphed_callables`` on ``sample`` (it patches ``model``), ``"<version> by hand[ <mode>]"``
    the step written by hand (``_mlp_by_hand``), else torch.compile's mode)."""
    if mode is not None and mode.startswith("func "):
        return _mlp_functional.make_step(torch, model, mode.removeprefix("func "))
    if mode is not None and " by hand" in mode:
        which, _, compiled = mode.partition(" by hand")
        compiled = {"": None, "compile": "default"}.get(compiled.strip(), compiled.strip())
        return _mlp_by_hand.make_step(torch, model, which, compiled)
    if mode == "graphed":
        fn = torch.cuda.make_graphed_callables(model, (sample,))
    else:
        fn = model if mode is None else torch.compile(model, mode=None if mode == "default" else mode)
    params = list(model.parameters())
    graphs = mode == "reduce-overhead"

    def step(x):
        for p in params:
            p.grad = None
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        loss = fn(x).float().square().mean()
        loss.backward()
        return loss

    return step


def time_step(torch, step, x, steps: int, repeats: int, warmup: int) -> list[float]:
    """Seconds per step: CUDA events around ``steps`` back-to-back steps, ``repeats`` samples (after ``warmup``)."""
    for _ in range(warmup):
        step(x)
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            step(x)
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e-3 / steps)
    return samples


def _weights(model):
    if hasattr(model, "layers"):
        return [layer.weight.grad.float() for layer in model.layers]
    return [w.grad.float() for w in model.weights]  # the same (out, in) layout


# -- one configuration ------------------------------------------------------------------------------------------------
def run_config(torch, width, activation, batch, layers, args, modes) -> dict:
    dtype = torch.bfloat16
    plain, fused, ops, drelu = make_models(torch, width, layers, activation, dtype)
    x = torch.randn(batch, width, device="cuda", dtype=dtype)
    contenders = {
        "torch eager": (plain, None),
        "torch compile": (plain, "default"),
        "torch reduce-overhead": (plain, "reduce-overhead"),
        "nvdispatch fused compile": (fused, "default"),
        "nvdispatch fused reduce-overhead": (fused, "reduce-overhead"),
        "nvdispatch fused eager": (fused, None),
        "nvdispatch ops compile": (ops, "default"),
        "nvdispatch fused drelu compile": (drelu, "default"),
        "nvdispatch fused drelu reduce-overhead": (drelu, "reduce-overhead"),
        "torch graphed": (plain, "graphed"),
        "nvdispatch fused graphed": (fused, "graphed"),
        **{name: (fused, name.replace(" eager", "")) for name in BY_HAND},
        "torch func compile": (plain, "func default"),
        "torch func reduce-overhead": (plain, "func reduce-overhead"),
        "nvdispatch fused func compile": (fused, "func default"),
        "nvdispatch fused func reduce-overhead": (fused, "func reduce-overhead"),
    }
    if activation != "relu":
        modes = set(modes) - set(RELU_ONLY)
    out = {"width": width, "activation": activation, "batch": batch, "layers": layers, "contenders": {}}
    reference = None
    for name in progress([n for n in contenders if n in modes], f"{activation} width {width}"):
        model, mode = contenders[name]
        entry = out["contenders"][name] = {}
        torch._dynamo.reset()
        try:
            if mode == "graphed" or name in BY_HAND or name in FUNCTIONAL:
                model = copy.deepcopy(model)  # graphing patches the module; the other steps set .grad themselves
            t0 = time.perf_counter()
            step = make_step(torch, model, mode, x)
            step(x)  # compiles
            torch.cuda.synchronize()
            entry["first_step_seconds"] = time.perf_counter() - t0
            if name == "torch eager":
                reference = [g.clone() for g in _weights(model)]
            elif reference is not None:
                entry["grad_rel_error_vs_torch_eager"] = max(
                    float((p - q).abs().max() / p.abs().max().clamp_min(1e-30))
                    for p, q in zip(reference, _weights(model))
                )
            samples = time_step(torch, step, x, args.steps, args.repeats, args.warmup)
            entry["samples"] = samples
            entry["seconds"] = statistics.median(samples)
        except Exception as exc:  # noqa: BLE001 - one contender failing must not end the run
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc(limit=8)
            print(f"  {name}: {entry['error'][:200]}", flush=True)
    out.update(ratios(out["contenders"], width))
    return out


def ratios(contenders: dict, width: int) -> dict:
    """The figures of one configuration from its contenders' seconds: ``best`` (the best Torch mode of the goal and
    the best FusedMLP autograd step compiled), ``ratio_nvdispatch_to_best_torch`` (those two),
    ``ratio_goal``/``goal_met`` (the best nvdispatch compiled step of any kind, autograd, functional or by hand,
    over the best Torch mode: the issue's measure), ``ratio_whole_step_peer`` (the best nvdispatch step compiled
    whole over the best Torch step compiled whole: the same compilation on both sides), and the families' own
    ratios (``ratio_functional``, ``ratio_functional_to_best_torch``, ``ratio_by_hand``, ``ratio_by_hand_eager``,
    ``ratio_by_hand_peer``, ``ratio_with_graphed``)."""
    seconds = {n: e["seconds"] for n, e in contenders.items() if "seconds" in e}

    def best_of(names):
        times = {n: seconds[n] for n in names if n in seconds}
        return min(times.items(), key=lambda item: item[1]) if times else None

    compiled_by_hand = [n for n in BY_HAND if not n.endswith("eager")]
    families = {
        "torch": best_of(TORCH_MODES),
        "nvdispatch compiled": best_of(NVD_COMPILED),
        "nvdispatch functional": best_of([n for n in FUNCTIONAL if n.startswith("nvdispatch")]),
        "torch functional": best_of([n for n in FUNCTIONAL if n.startswith("torch")]),
        "nvdispatch by hand": best_of([n for n in compiled_by_hand if n.startswith("nvdispatch")]),
        "torch by hand": best_of([n for n in compiled_by_hand if n.startswith("torch")]),
        "nvdispatch whole step": best_of([n for n in (*FUNCTIONAL, *compiled_by_hand) if n.startswith("nvdispatch")]),
        "torch whole step": best_of([n for n in (*FUNCTIONAL, *compiled_by_hand) if n.startswith("torch")]),
    }
    out = {"best": {k: {"contender": v[0], "seconds": v[1]} for k, v in families.items() if v}}

    def ratio(key, ours, theirs):
        if families[ours] and families[theirs]:
            out[key] = families[ours][1] / families[theirs][1]

    ratio("ratio_nvdispatch_to_best_torch", "nvdispatch compiled", "torch")
    ratio("ratio_functional", "nvdispatch functional", "torch functional")
    ratio("ratio_functional_to_best_torch", "nvdispatch functional", "torch")
    ratio("ratio_by_hand", "nvdispatch by hand", "torch")
    ratio("ratio_by_hand_peer", "nvdispatch by hand", "torch by hand")
    ratio("ratio_whole_step_peer", "nvdispatch whole step", "torch whole step")
    if families["torch"] and "nvdispatch by hand eager" in seconds:
        out["ratio_by_hand_eager"] = seconds["nvdispatch by hand eager"] / families["torch"][1]
    nvd_any = [families[k][1] for k in ("nvdispatch compiled", "nvdispatch whole step") if families[k]]
    if nvd_any and families["torch"]:
        out["ratio_goal"] = min(nvd_any) / families["torch"][1]
        if width in GOALS:
            out["goal"], out["goal_met"] = GOALS[width], out["ratio_goal"] <= GOALS[width]
    graphed = [seconds.get(n) for n in GRAPHED]
    if None not in graphed and families["torch"] and families["nvdispatch compiled"]:
        out["ratio_with_graphed"] = min(families["nvdispatch compiled"][1], graphed[1]) / min(
            families["torch"][1], graphed[0]
        )
    return out


def run_small(torch, args) -> dict:
    """A reduce-overhead step of a small MLP (width 256): FusedMLP against the plain Torch model."""
    out = {"width": 256, "batch": args.small_batch, "layers": args.layers, "contenders": {}}
    plain, fused, _, _ = make_models(torch, 256, args.layers, "relu", torch.bfloat16)
    x = torch.randn(args.small_batch, 256, device="cuda", dtype=torch.bfloat16)
    pairs = [("torch reduce-overhead", plain), ("nvdispatch fused reduce-overhead", fused)]
    for name, model in progress(pairs, "small"):
        entry = out["contenders"][name] = {}
        torch._dynamo.reset()
        try:
            step = make_step(torch, model, "reduce-overhead")
            samples = time_step(torch, step, x, args.steps * 5, args.repeats, args.warmup + 3)
            entry["samples"], entry["seconds"] = samples, statistics.median(samples)
        except Exception as exc:  # noqa: BLE001
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc(limit=8)
    c = out["contenders"]
    if all("seconds" in c[n] for n in c):
        out["ratio"] = c["nvdispatch fused reduce-overhead"]["seconds"] / c["torch reduce-overhead"]["seconds"]
        out["goal"], out["goal_met"] = 1.02, out["ratio"] <= 1.02
    return out


def run_host(torch, number: int) -> dict:
    """Eager host time per cached 16x16 call on CUDA tensors: best of five loops of ``number`` calls."""
    import nvdispatch

    a, b = (torch.randn(16, 16, device="cuda") for _ in range(2))
    bias = torch.randn(16, device="cuda")
    z = torch.randn(16, 16, device="cuda", dtype=torch.complex64)
    w, pb = torch.nn.Parameter(b.clone()), torch.nn.Parameter(bias.clone())
    relu = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}}
    precorded = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": pb}}
    cases = {
        "matmul": (lambda: nvdispatch.matmul(a, b), lambda: torch.matmul(a, b)),
        "RELU_BIAS": (lambda: nvdispatch.matmul(a, b, **relu), lambda: torch._addmm_activation(bias, a, b)),
        "fft2": (lambda: nvdispatch.fft.fft2(z), lambda: torch.fft.fft2(z)),
        "RELU_BIAS, Parameters, autograd": (
            lambda: nvdispatch.matmul(a, w, **precorded),
            lambda: torch.relu(torch.addmm(pb, a, w)),
        ),
    }
    out = {}
    for name, (ours, peer) in progress(list(cases.items()), "host"):
        timings = {}
        for who, fn in (("nvdispatch", ours), ("torch", peer)):
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
            best = math.inf
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(number):
                    fn()
                torch.cuda.synchronize()
                best = min(best, (time.perf_counter() - t0) / number)
            timings[who] = best
        out[name] = {**timings, "ratio": timings["nvdispatch"] / timings["torch"]}
    return out


# -- output ---------------------------------------------------------------------------------------------------------
def plot(results: dict, path: str) -> None:
    configs = results["configs"]

    def draw(plt):
        fig, axes = plt.subplots(1, max(len(configs), 1), figsize=(4.2 * max(len(configs), 1), 4.2), squeeze=False)
        for ax, cfg in zip(axes[0], configs):
            everyone = (*TORCH_MODES, *NVD_MODES, *GRAPHED, *BY_HAND, *FUNCTIONAL)
            names = [n for n in everyone if "seconds" in cfg["contenders"].get(n, {})]
            times = [cfg["contenders"][n]["seconds"] * 1e3 for n in names]
            colors = ["tab:gray" if n.startswith("torch") else "tab:green" for n in names]
            ax.barh(range(len(names)), times, color=colors)
            ax.set_yticks(range(len(names)), names, fontsize=7)
            ax.invert_yaxis()
            title = f"{cfg['activation']} width {cfg['width']}"
            if cfg.get("ratio_goal"):
                title += f"\nbest nvd / best torch mode {cfg['ratio_goal']:.2f}x"
            if cfg.get("ratio_whole_step_peer"):
                title += f"\nwhole step / torch whole step {cfg['ratio_whole_step_peer']:.2f}x"
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("ms per training step")
        fig.suptitle(f"4-layer bf16 MLP training step, batch {results['batch']} ({results['device']})", fontsize=10)
        fig.tight_layout()

    save_plot(draw, path)


def summary(results: dict) -> None:
    for cfg in results["configs"]:
        print(f"{cfg['activation']} width {cfg['width']}:")
        for name, entry in cfg["contenders"].items():
            error = entry.get("error", "")[:80]
            shown = f"{entry['seconds'] * 1e3:8.3f} ms" if "seconds" in entry else f"error {error}"
            print(f"  {name:34s} {shown}")
        shown = (
            ("ratio_goal", "best nvdispatch compiled step (any kind) / best Torch mode (the goal)"),
            ("ratio_nvdispatch_to_best_torch", "best FusedMLP autograd step compiled / best Torch mode"),
            ("ratio_functional_to_best_torch", "best FusedMLP functional step / best Torch mode"),
            ("ratio_by_hand", "best nvdispatch by-hand compiled step / best Torch mode"),
            ("ratio_by_hand_eager", "nvdispatch by-hand eager step / best Torch mode"),
            ("ratio_whole_step_peer", "best nvdispatch whole step / best Torch whole step (same compilation)"),
            ("ratio_functional", "best FusedMLP functional step / best Torch functional step"),
            ("ratio_by_hand_peer", "best nvdispatch by-hand compiled step / best Torch by-hand step"),
            ("ratio_with_graphed", "autograd steps, CUDA-graphed modules included on both sides"),
        )
        for key, label in shown:
            if key in cfg:
                met = f" (goal <= {cfg['goal']}: {'met' if cfg['goal_met'] else 'NOT met'})" if key == "ratio_goal" \
                    and "goal" in cfg else ""  # fmt: skip
                print(f"  {label}: {cfg[key]:.3f}{met}")
    small = results.get("small_mlp")
    if small and "ratio" in small:
        print(f"small MLP reduce-overhead step nvdispatch / Torch: {small['ratio']:.3f} (goal <= 1.02)")
    for name, h in results.get("host", {}).items():
        print(f"host 16x16 {name}: nvdispatch {h['nvdispatch'] * 1e6:.1f} us, torch {h['torch'] * 1e6:.1f} us, "
              f"ratio {h['ratio']:.2f}")  # fmt: skip


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--widths", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--activations", nargs="+", default=["relu", "gelu"], choices=["relu", "gelu"])
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--small-batch", type=int, default=256, help="batch of the width-256 reduce-overhead step")
    ap.add_argument("--steps", type=int, default=10, help="steps between two CUDA events")
    ap.add_argument("--repeats", type=int, default=7, help="samples per contender (the median is reported)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--host-number", type=int, default=2000, help="calls per host-time loop")
    everyone = [*TORCH_MODES, *NVD_MODES, *GRAPHED, *BY_HAND, *FUNCTIONAL]
    ap.add_argument("--contenders", nargs="+", default=everyone, choices=everyone)
    ap.add_argument("--skip", nargs="*", default=[], choices=["mlp", "small", "host"], help="parts not to run")
    ap.add_argument("--quick", action="store_true", help="smoke test: width 256, batch 512, few steps")
    args = ap.parse_args(argv)
    torch = require_cuda_torch()  # else one line and exit status 2
    if args.quick:
        args.widths, args.batch, args.steps, args.repeats, args.warmup, args.host_number = [256], 512, 2, 3, 1, 100
    import nvdispatch

    out_dir = output_dir(args.out)
    path = os.path.join(out_dir, "compiled_mlp_bench.json")
    results = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "nvdispatch": nvdispatch.__version__,
        "python": platform.python_version(),
        "batch": args.batch,
        "steps": args.steps,
        "repeats": args.repeats,
        "configs": [],
        "goals": {"ratio_to_best_torch": GOALS, "small_reduce_overhead": 1.02},
    }

    def save():
        with open(path, "w") as fh:
            json.dump(results, fh, indent=1)

    if "mlp" not in args.skip:
        for width in args.widths:
            for activation in args.activations:
                results["configs"].append(
                    run_config(torch, width, activation, args.batch, args.layers, args, set(args.contenders))
                )
                save()
    if "small" not in args.skip:
        results["small_mlp"] = run_small(torch, args)
        save()
    if "host" not in args.skip:
        try:
            results["host"] = run_host(torch, args.host_number)
        except Exception as exc:  # noqa: BLE001
            results["host_error"] = f"{type(exc).__name__}: {exc}"
        save()
    print(f"wrote {path}")
    plot(results, os.path.join(out_dir, "compiled_mlp_bench.png"))
    summary(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
