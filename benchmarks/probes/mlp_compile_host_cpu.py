"""Host time of an MLP training step on the CPU, eager against ``torch.compile``: FusedMLP against the same model in
plain Torch at tiny shapes (the step is host-bound, as a width-1024 bf16 step is on an H200), and where the compiled
FusedMLP step's extra time goes.

A 4-layer float32 MLP (``--width`` wide, batch ``--batch``, one Torch thread), ReLU, the step of
``compiled_mlp_bench.make_step`` (gradients set to None, forward, ``loss = out.float().square().mean()``,
backward). Contenders: ``torch``/``fused`` x ``eager``/``compile``/``compile dynamic`` (``torch.compile(model,
fullgraph=True)``, inductor, static or ``dynamic=True``; the probe fails on a graph break). All are warmed up, then
timed in turns, ``--rounds`` rounds of ``--steps`` steps (the thread's CPU time), medians.

``breakdown``: the compiled FusedMLP step (the eager one, the compiled Torch one) with timers around inductor's
graph calls, the ``nvdispatch::`` operator calls inside them and the kernels' bodies, medians per step; one call
timed apart (no grad): the forward and backward kernel called directly, through the public operator
(``mlp_forward``/``mlp_backward``: ``register_autograd``'s Python autograd kernel, redispatch) and through the kernel
operator where the tree has one. ``graphs``: the saved tensors and the backward graph's inputs and outputs of each
compiled model (AOTAutograd's forward/backward graphs).

``--trees SRC_A SRC_B``: the measurement in child processes under each nvdispatch source tree (``PYTHONPATH``),
alternately, ``--repeats`` times each (before/after a change, in one run); medians per tree. Inductor's FX-graph and
AOTAutograd caches are off: their keys hold the traced program, not the operators' registrations, so a graph
cached under one tree would run its operator calls under another.

    python benchmarks/probes/mlp_compile_host_cpu.py [--width 16] [--batch 16] [--rounds 15] [--steps 100]
    python benchmarks/probes/mlp_compile_host_cpu.py --trees /work/main/src src --repeats 3 --out before_after.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from tqdm import tqdm

CONTENDERS = ("torch eager", "torch compile", "torch compile dynamic",
              "fused eager", "fused compile", "fused compile dynamic")  # fmt: skip
OPERATORS = ("mlp_forward", "mlp_backward", "mlp_forward_kernel", "mlp_backward_kernel")


def _models(torch, width: int, layers: int = 4):
    from nvdispatch.integrations.torch_mlp import FusedMLP

    torch.manual_seed(0)
    plain = torch.nn.Sequential()
    for i in range(layers):
        plain.append(torch.nn.Linear(width, width))
        if i < layers - 1:
            plain.append(torch.nn.ReLU())
    fused = FusedMLP([width] * (layers + 1))
    with torch.no_grad():
        for linear, w, b in zip(plain[::2], fused.weights, fused.biases):
            w.copy_(linear.weight)  # the same (out, in) layout
            b.copy_(linear.bias)
    return plain, fused


def _step(torch, model, mode: str):
    fn = model if mode == "eager" else torch.compile(model, fullgraph=True, dynamic=mode == "compile dynamic")
    params = list(model.parameters())

    def step(x):
        for p in params:
            p.grad = None
        loss = fn(x).float().square().mean()
        loss.backward()

    return step


def _timed(fn, steps: int) -> float:
    t0 = time.thread_time()
    for _ in range(steps):
        fn()
    return (time.thread_time() - t0) / steps * 1e6


def measure(args) -> dict:
    import torch
    import torch._functorch.config
    import torch._inductor.config

    torch.set_num_threads(1)
    # traced afresh: a cached graph of another tree (or registration) would run that tree's operator calls
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    x = torch.randn(args.batch, args.width)
    steps, graph_breaks = {}, {}
    reference = None
    for name in CONTENDERS:
        kind, mode = name.split(" ", 1)
        plain, fused = _models(torch, args.width)
        model = plain if kind == "torch" else fused
        torch._dynamo.utils.counters.clear()
        step = steps[name] = _step(torch, model, mode)
        for _ in range(5):
            step(x)
        graph_breaks[name] = sum(torch._dynamo.utils.counters["graph_break"].values())
        if graph_breaks[name]:
            raise RuntimeError(f"{name}: {graph_breaks[name]} graph breaks")
        grads = [p.grad.clone() for p in model.parameters()]
        if reference is None:
            reference = grads
        else:  # the same (out, in) weights; FusedMLP's parameters weight after weight, or as Torch's
            same = [g.shape for g in grads] == [g.shape for g in reference]
            order = grads if kind == "torch" or same else [g for pair in zip(grads[:4], grads[4:]) for g in pair]
            torch.testing.assert_close(order, reference, rtol=1e-4, atol=1e-5)
    samples = {name: [] for name in steps}
    for _ in tqdm(range(args.rounds), desc="rounds", disable=args.child):
        for name, step in steps.items():
            samples[name].append(_timed(lambda step=step: step(x), args.steps))
    us = {name: statistics.median(s) for name, s in samples.items()}
    out = {"us_per_step": us, "graph_breaks": graph_breaks}
    out["ratios"] = {
        "fused compile / fused eager": us["fused compile"] / us["fused eager"],
        "torch compile / torch eager": us["torch compile"] / us["torch eager"],
        "fused compile / torch compile": us["fused compile"] / us["torch compile"],
        "fused eager / torch eager": us["fused eager"] / us["torch eager"],
    }
    out["breakdown"] = breakdown(torch, args, x)
    out["operator_call"] = operator_call(torch, args.width, x)
    out["graphs"] = {kind: graphs(torch, kind, args.width, x) for kind in ("torch", "fused")}
    return out


def breakdown(torch, args, x) -> dict:
    """Per step of FusedMLP eager and compiled, and of the compiled Torch model: time inside inductor's graph
    calls, inside the nvdispatch operator calls, inside the kernels' bodies (``_forward``/``_backward``), and the
    whole step; medians."""
    from torch._inductor import output_code

    from nvdispatch.integrations import torch_mlp_ops as ops

    acc: dict[str, float] = {}
    clock = time.thread_time  # CPU time: a timer open while another process runs counts none of it

    def timer(label, fn):
        def run(*a, **k):
            t0 = clock()
            try:
                return fn(*a, **k)
            finally:
                acc[label] = acc.get(label, 0.0) + clock() - t0

        return run

    saved = [(output_code.CompiledFxGraph, "__call__", output_code.CompiledFxGraph.__call__),
             (ops, "_forward", ops._forward), (ops, "_backward", ops._backward)]  # fmt: skip
    packets = [getattr(torch.ops.nvdispatch, name) for name in OPERATORS if hasattr(torch.ops.nvdispatch, name)]
    saved += [(packet, "default", packet.default) for packet in packets]
    result = {}
    try:
        for kind, mode in (("fused", "eager"), ("fused", "compile"), ("torch", "compile")):
            plain, fused = _models(torch, args.width)
            step = _step(torch, fused if kind == "fused" else plain, mode)
            for _ in range(5):  # compiled before the timers go in (traced on the operators as they are)
                step(x)
            output_code.CompiledFxGraph.__call__ = timer("inside inductor graphs", saved[0][2])
            ops._forward, ops._backward = timer("kernel bodies", saved[1][2]), timer("kernel bodies", saved[2][2])
            for packet, _, default in saved[3:]:
                packet.default = timer("operator calls", default)  # inductor's code looks it up per call
            rows: dict[str, list[float]] = {}
            for _ in range(args.rounds):
                acc.clear()
                total = _timed(lambda step=step: step(x), args.steps)
                rows.setdefault("step", []).append(total)
                for label, seconds in acc.items():
                    rows.setdefault(label, []).append(seconds / args.steps * 1e6)
            result[f"{kind} {mode}"] = {label: statistics.median(v) for label, v in rows.items()}
            for owner, attr, value in saved:
                setattr(owner, attr, value)
    finally:
        for owner, attr, value in saved:
            setattr(owner, attr, value)
    return result


def operator_call(torch, width: int, x) -> dict:
    """µs per call (no grad) of the forward and backward kernels: directly, through the public operator, and
    through the kernel operator where this tree has one."""
    from nvdispatch.integrations import torch_mlp_ops as ops

    _, fused = _models(torch, width)
    ws, bs = list(fused.weights), list(fused.biases)
    form = ("relu", "mask", "out_in")
    with torch.no_grad():
        outputs = ops._forward_kernel(x, ws, bs, *form, True)
        grad = torch.randn_like(outputs[0])
        calls = {
            "forward": (ops._forward_kernel, ops.mlp_forward_op, getattr(ops, "mlp_forward_kernel_op", None),
                        (x, ws, bs, *form, True)),
            "backward": (ops._backward_kernel, ops.mlp_backward_op, getattr(ops, "mlp_backward_kernel_op", None),
                         (grad, x, ws, outputs[1:], [], *form, False)),
        }  # fmt: skip
        out = {}
        for direction, (kernel, public, kernel_op, call_args) in calls.items():
            row = {}
            for label, fn in (("kernel called directly", kernel), ("public operator", public),
                              ("kernel operator", kernel_op)):  # fmt: skip
                if fn is None:
                    continue
                for _ in range(50):
                    fn(*call_args)
                row[label] = statistics.median(
                    _timed(lambda fn=fn, call_args=call_args: fn(*call_args), 2000) for _ in range(9)
                )
            out[direction] = row
    return out


def graphs(torch, kind: str, width: int, x) -> dict:
    """The compiled step's AOTAutograd graphs: tensors saved for the backward, backward inputs and outputs, and the
    ``nvdispatch`` operators each graph calls."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    kept = []

    def keep(gm, _inputs):
        kept.append(gm)
        return make_boxed_func(gm.forward)

    plain, fused = _models(torch, width)
    model = plain if kind == "torch" else fused
    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=keep, bw_compiler=keep, partition_fn=min_cut_rematerialization_partition)
    compiled = torch.compile(model, backend=backend, fullgraph=True)  # inductor's partition, the graphs kept
    compiled(x).float().square().mean().backward()
    forward, backward = kept[:2]

    def placeholders(gm):
        return [n for n in gm.graph.nodes if n.op == "placeholder"]

    def outputs(gm):
        return next(n for n in gm.graph.nodes if n.op == "output").args[0]

    def ops_of(gm):
        return [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "nvdispatch" in str(n.target)]

    n_user = 1  # the model's one output
    return {
        "forward_inputs": len(placeholders(forward)),
        "saved_for_backward": len(outputs(forward)) - n_user,
        "backward_inputs": len(placeholders(backward)),
        "backward_outputs": sum(o is not None for o in outputs(backward)),
        "forward_operators": ops_of(forward),
        "backward_operators": ops_of(backward),
    }


def compare(args) -> dict:
    """``measure`` under each source tree in alternating children; medians of each figure per tree."""
    runs: dict[str, list[dict]] = {tree: [] for tree in args.trees}
    order = [tree for _ in range(args.repeats) for tree in args.trees]
    for tree in tqdm(order, desc="trees"):
        cmd = [sys.executable, __file__, "--child", "--width", str(args.width), "--batch", str(args.batch),
               "--rounds", str(args.rounds), "--steps", str(args.steps)]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        runs[tree].append(json.loads(done.stdout.strip().splitlines()[-1]))

    def median_of(dicts):
        first = dicts[0]
        if isinstance(first, dict):
            return {k: median_of([d[k] for d in dicts]) for k in first if all(k in d for d in dicts)}
        return statistics.median(dicts) if isinstance(first, (int, float)) else first

    return {tree: median_of(results) for tree, results in runs.items()}


def report(result: dict) -> None:
    us = result["us_per_step"]
    for name in CONTENDERS:
        print(f"  {name:24s} {us[name]:8.1f} us/step")
    for label, ratio in result["ratios"].items():
        print(f"  {label:32s} {ratio:.3f}")
    for mode, row in result["breakdown"].items():
        print(f"  {mode} (timers on): " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()))
    for direction, row in result["operator_call"].items():
        print(f"  {direction} call (no grad): " + ", ".join(f"{k} {v:.1f} us" for k, v in row.items()))
    for kind, g in result["graphs"].items():
        print(f"  {kind} graphs: {g}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=15, help="samples per contender, taken in turns")
    ap.add_argument("--steps", type=int, default=100, help="steps per sample")
    ap.add_argument("--trees", nargs="+", metavar="SRC", help="nvdispatch source trees to compare, alternately")
    ap.add_argument("--repeats", type=int, default=3, help="child runs per tree with --trees")
    ap.add_argument("--out", default=None, help="JSON of the figures")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("needs torch: pip install 'nvdispatch[torch]'")
        return 2
    if args.child:
        print(json.dumps(measure(args)))
        return 0
    if args.trees:
        results = {"trees": compare(args), "repeats": args.repeats}
        for tree, result in results["trees"].items():
            print(f"\n{tree} (medians of {args.repeats} runs):")
            report(result)
    else:
        results = measure(args)
        report(results)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"args": vars(args), **results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
