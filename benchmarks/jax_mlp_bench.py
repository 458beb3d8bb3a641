# ruff: noqa: B023 - the closures are run at once, inside the loop that made them
"""JAX benchmark: nvdispatch inside ``jax.jit`` against XLA's own fused GEMMs, on the GPU.

1. ``mlp``: one training step of a 4-layer MLP (bfloat16, batch 8192, widths 1024 and 4096, ReLU and GELU;
   mean-squared loss, ``jax.value_and_grad``, an SGD update, everything in one ``jax.jit``). XLA's model is
   ``act(jnp.dot(h, w) + b)`` (XLA rewrites the bias and activation into cuBLASLt epilogues); nvdispatch's is
   ``nvdispatch.matmul(h, w, epilog="RELU_BIAS"/"GELU_BIAS", epilog_inputs={"bias": b})``, differentiated
   through its custom VJP (backward products with the ``BGRADB`` epilog); and the chain model
   ``nvdispatch.integrations.jax_mlp.fused_mlp`` (``fused_mlp``: one custom VJP over the whole MLP, whose backward
   GEMMs carry the activation derivative in their epilog, ``DGELU``, and the bias gradient, ``BGRADB``; ReLU's
   derivative a mask in XLA, or the ``DRELU`` epilog: ``fused_mlp[drelu]``, see ``--relu-backwards``), on the
   first route. Goal: nvdispatch <= 1.0x XLA.
2. ``fp32``: float32 products at JAX's default matmul precision (plain and ``RELU_BIAS``), nvdispatch vs
   ``jnp``, on issue 29's five shapes (m x n x k): the staged call follows ``jax_default_matmul_precision``.
   First the staged call traced with trace-time autotuning off (``*_untuned_us``, ``ratio_untuned``), timed
   against ``jnp`` before the default one is traced (a plan is shared by the programs staging its problem: once
   the default one has tuned it, the untuned program's calls follow the tuned algorithm), then the default
   (``*_us``, ``ratio``); each program's trace, compile (with trace-time autotuning) and first call in
   ``*_first_call_s``, and what ``explain()`` says of the algorithm in ``explain_compiled``.
3. ``overhead``: a chain of small bfloat16 ``RELU_BIAS`` layers in one program (host-bound): the host cost of
   a staged call against XLA's own GEMM thunk, per call.

Autotuning: nvdispatch autotunes a staged GPU matmul's cuBLASLt plan when the program is traced
(``NVDISPATCH_JAX_AUTOTUNE``, default ``auto``), as XLA tunes its own GEMMs when it compiles; the MLP is then
timed again after autotuning its plans the way ``Matmul.autotune()`` does for an eager call (``*_tuned_ms``).
``--no-autotune``: nvdispatch's plans keep the heuristic's algorithms (trace-time autotuning off, no second
timing, no untuned round in ``fp32``). Set ``NVDISPATCH_CACHE_DIR`` to an empty folder to time the tuning
itself rather than reuse choices an earlier run kept.

Routes: nvdispatch's staged GPU matmuls run through its XLA FFI handler (``ffi``; ``ffi-graphs``: declared
compatible with XLA's command buffers) or a Python buffer callback (``callback``); ``--routes`` names the
contenders (default ``ffi-graphs ffi callback``, in one run: ``nvdispatch`` is the first, ``nvdispatch[ROUTE]`` the
others). On the CPU (``--allow-cpu``) the route does not apply: one contender.

Timing: each contender's program is traced and compiled once under its setting (``jax.jit(f).lower(...)
.compile()``, the route and autotuning blocks around the tracing only) and then called directly, as a user calls
a program: no setting entered around the timed calls, XLA's programs alike. Each measurement queues ``--inner``
calls and waits for the last (``block_until_ready``: the GPU's work included); the median over ``--repeats``
rounds, the variants taken in turns within a round. One process; ratios are from the same run. Writes
``jax_mlp_bench.json`` (written again after each part, so a failure keeps what was measured; a failing cell
records its error) and ``jax_mlp_bench.png`` into ``--out DIR``. Exits with status 2 and one line where JAX (or
a GPU it sees) is missing (``--allow-cpu`` runs it on the CPU at small sizes, to check the script itself).

    python benchmarks/jax_mlp_bench.py --out OUT_DIR
    python benchmarks/jax_mlp_bench.py --replot OUT_DIR/jax_mlp_bench.json --out OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

from _bench import cannot_run, output_dir, parser, progress, require, save_plot

FP32_SHAPES = [(16384, 4096, 512), (4096, 4096, 4096), (8192, 1024, 8192), (2048, 11008, 4096), (1024, 1024, 1024)]
GOAL = {"mlp": 1.0, "fp32": 1.0}


def parse(argv=None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--widths", type=int, nargs="+", default=[1024, 4096], help="MLP widths")
    p.add_argument("--batch", type=int, default=8192, help="MLP batch size")
    p.add_argument("--layers", type=int, default=4, help="MLP layers")
    p.add_argument("--activations", nargs="+", default=["relu", "gelu"], choices=["relu", "gelu"])
    p.add_argument("--repeats", type=int, default=15, help="rounds per measurement (median)")
    p.add_argument("--inner", type=int, default=10, help="calls queued per round")
    p.add_argument("--parts", nargs="+", default=["mlp", "fp32", "overhead"], choices=["mlp", "fp32", "overhead"])
    p.add_argument("--no-autotune", dest="autotune", action="store_false",
                   help="nvdispatch's plans keep the heuristic's algorithms: trace-time autotuning off, no timing "
                        "again after autotuning (XLA autotunes its own GEMMs)")
    p.add_argument("--routes", nargs="+", default=["ffi-graphs", "ffi", "callback"],
                   choices=["ffi", "ffi-graphs", "callback", "auto"],
                   help="nvdispatch's GPU routes to time (the first is 'nvdispatch', the others 'nvdispatch[ROUTE]')")
    p.add_argument("--relu-backwards", nargs="*", default=["mask", "drelu"], choices=["mask", "drelu"],
                   help="the chain model's ReLU backwards to time ('fused_mlp' for the first, 'fused_mlp[drelu]'); "
                        "none: no chain model")
    p.add_argument("--allow-cpu", action="store_true", help="run on the CPU at small sizes (checks the script)")
    p.add_argument("--replot", metavar="JSON", help="only draw the PNG of a results file")
    return p.parse_args(argv)


# -- contenders ---------------------------------------------------------------------------------------------------
def contenders(args) -> dict[str, str]:
    """``{name: route}`` of nvdispatch's contenders: ``nvdispatch`` for the first route, ``nvdispatch[ROUTE]``."""
    return {("nvdispatch" if i == 0 else f"nvdispatch[{r}]"): r for i, r in enumerate(args.routes)}


def chain_contenders(args, activation: str) -> dict[str, str]:
    """``{name: relu_backward}`` of the chain model's contenders: ``fused_mlp`` for the first ReLU backward,
    ``fused_mlp[drelu]``; GELU has one (its backward is ``DGELU``)."""
    backwards = args.relu_backwards if activation == "relu" else args.relu_backwards[:1]
    return {("fused_mlp" if i == 0 else f"fused_mlp[{b}]"): b for i, b in enumerate(backwards)}


def compiled(jitted, args: tuple, route: str | None = None, autotune: str | None = None):
    """``jitted`` traced and compiled for ``args`` once, its matmuls staged (when it traces) through ``route``
    (None: XLA's own program, no setting) and autotuned as ``autotune`` says (None: the process's setting). The
    program is then called directly, as a user calls one: no setting around the timed calls (a function jitted
    again under another setting is traced again; a compiled program keeps what its trace chose)."""
    import contextlib

    from nvdispatch.integrations.jax_autotune import jax_autotune
    from nvdispatch.integrations.jax_ffi import jax_route

    with (jax_route(route) if route else contextlib.nullcontext()), \
            (jax_autotune(autotune) if autotune else contextlib.nullcontext()):
        return jitted.lower(*args).compile()


def first_call(jitted, args: tuple, route: str | None = None, autotune: str | None = None):
    """``(program, seconds)``: :func:`compiled`'s program and the seconds of its trace, compile (with trace-time
    autotuning) and first call, one run."""
    import jax

    t0 = time.perf_counter()
    program = compiled(jitted, args, route, autotune)
    jax.block_until_ready(program(*args))
    return program, time.perf_counter() - t0


# -- timing -----------------------------------------------------------------------------------------------------
def time_in_turns(variants: dict, repeats: int, inner: int) -> dict[str, float]:
    """Median seconds per call of each ``variants[name]() -> value``: ``inner`` calls queued, then waited for."""
    import jax

    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # the order turns each round
            fn = variants[name]
            t0 = time.perf_counter()
            for _ in range(inner):
                out = fn()
            jax.block_until_ready(out)
            samples[name].append((time.perf_counter() - t0) / inner)
    return {name: statistics.median(v) for name, v in samples.items()}


# -- the MLP -------------------------------------------------------------------------------------------------------
def _layers(activation: str):
    """(XLA's layer, nvdispatch's layer): ``act(h @ w + b)``, the last layer without activation."""
    import jax
    import jax.numpy as jnp

    import nvdispatch

    act = jax.nn.relu if activation == "relu" else (lambda z: jax.nn.gelu(z, approximate=True))
    fused = "RELU_BIAS" if activation == "relu" else "GELU_BIAS"

    def xla(h, w, b, last):
        z = jnp.dot(h, w) + b
        return z if last else act(z)

    def ours(h, w, b, last):
        return nvdispatch.matmul(h, w, epilog="BIAS" if last else fused, epilog_inputs={"bias": b})

    return xla, ours


def _chain_model(activation: str, relu_backward: str):
    """The whole MLP as nvdispatch's chain model: ``model(params, x)``."""
    from nvdispatch.integrations.jax_mlp import fused_mlp

    def model(params, x):
        return fused_mlp(x, [w for w, _ in params], [b for _, b in params], activation, relu_backward=relu_backward)

    return model


def _layered(layer):
    """The MLP as a chain of ``layer`` calls: ``model(params, x)``."""

    def model(params, x):
        h = x
        for i, (w, b) in enumerate(params):
            h = layer(h, w, b, i == len(params) - 1)
        return h

    return model


def _train_step(model, lr: float = 1e-3):
    import jax
    import jax.numpy as jnp

    def loss(params, x, y):
        h = model(params, x)
        return jnp.mean((h.astype(jnp.float32) - y.astype(jnp.float32)) ** 2)

    def step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        new = jax.tree_util.tree_map(lambda p, g: (p - lr * g).astype(p.dtype), params, grads)
        return new, value

    return jax.jit(step, donate_argnums=0)


def bench_mlp(args, device, results: dict) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    cells = [(w, act) for w in args.widths for act in args.activations]
    for width, activation in progress(cells, "mlp"):
        cell = {"width": width, "activation": activation, "batch": args.batch, "layers": args.layers}
        try:
            rng = np.random.default_rng(0)
            with jax.default_device(device):
                def params():
                    return [
                        (jnp.asarray(rng.standard_normal((width, width)) / np.sqrt(width), jnp.bfloat16),
                         jnp.asarray(rng.standard_normal(width) * 0.1, jnp.bfloat16))
                        for _ in range(args.layers)
                    ]

                x = jnp.asarray(rng.standard_normal((args.batch, width)), jnp.bfloat16)
                y = jnp.asarray(rng.standard_normal((args.batch, width)), jnp.bfloat16)
                start = params()
                xla_layer, our_layer = _layers(activation)
                from nvdispatch.integrations.jax_ffi import staged_plans

                first_plan = len(staged_plans())  # this cell's FFI plans come after
                ours = contenders(args)
                at = (start, x, y)
                steps = {"xla": compiled(_train_step(_layered(xla_layer)), at)}
                steps.update({name: compiled(_train_step(_layered(our_layer)), at, route)
                              for name, route in ours.items()})
                chains = chain_contenders(args, activation)
                steps.update({name: compiled(_train_step(_chain_model(activation, backward)), at, args.routes[0])
                              for name, backward in chains.items()})
                ours = {**ours, **chains}
                state = {name: jax.tree_util.tree_map(jnp.copy, start) for name in steps}
                losses = {name: [] for name in steps}
                for name, step in steps.items():  # the first losses from the same parameters
                    for _ in range(3):
                        state[name], value = step(state[name], x, y)
                        losses[name].append(float(value))
                cell["losses"] = losses
                cell["loss_rel_diff"] = max(
                    abs(a - b) / max(abs(a), 1e-12) for name in ours for a, b in zip(losses["xla"], losses[name])
                )

                def runner(name):
                    def run():
                        state[name], value = steps[name](state[name], x, y)
                        return value

                    return run

                times = time_in_turns({name: runner(name) for name in steps}, args.repeats, args.inner)
                cell.update({f"{name}_ms": t * 1e3 for name, t in times.items()})
                for name in ours:
                    cell[_ratio_key(name)] = times[name] / times["xla"]
                cell["goal"] = GOAL["mlp"]
                if args.autotune and device.platform != "cpu":  # XLA autotunes its GEMMs when it compiles
                    try:
                        cell["plans_autotuned"] = autotune_staged([runner(name) for name in ours], first_plan)
                        tuned = time_in_turns({name: runner(name) for name in steps}, args.repeats, args.inner)
                        cell["xla_ms_again"] = tuned["xla"] * 1e3
                        for name in ours:
                            cell[f"{name}_tuned_ms"] = tuned[name] * 1e3
                            cell[_ratio_key(name, "_tuned")] = tuned[name] / tuned["xla"]
                    except Exception as exc:  # noqa: BLE001 - the untuned figures stand
                        cell["autotune_error"] = f"{type(exc).__name__}: {exc}"
                        cell["autotune_traceback"] = traceback.format_exc()[-4000:]
        except Exception as exc:  # noqa: BLE001 - one failing cell must not lose the others
            cell["error"] = f"{type(exc).__name__}: {exc}"
            cell["traceback"] = traceback.format_exc()[-4000:]
        results["mlp"].append(cell)
        print(_line("mlp", cell), flush=True)


def strided_tensor(sig, device):
    """A random Torch tensor of an operand signature's (``ArraySig``) dtype, shape and element strides."""
    import torch

    span = 1 + sum((d - 1) * st for d, st in zip(sig.shape, sig.strides) if d > 0)
    dtype = getattr(torch, sig.dtype)
    if dtype.is_floating_point:
        base = torch.randn(span, device=device).to(dtype)
    else:
        base = torch.zeros(span, dtype=dtype, device=device)
    return torch.as_strided(base, sig.shape, sig.strides)


def autotune_staged(runs, since: int = 0) -> int:
    """Autotune, as ``Matmul.autotune()`` does for an eager call, every cuBLASLt plan one run of each staged
    program in ``runs`` launches (the callback route's found by watching ``LtMatmulPlan.execute_into`` for one
    run; the FFI route's are the plans its calls were staged with, ``jax_ffi.staged_plans()[since:]``, whose
    calls follow an autotuned algorithm); the programs' next runs launch the tuned algorithms. Operands: random Torch
    tensors of each plan's shapes, strides and dtypes. Returns how many plans were tuned."""
    import jax
    import torch

    from nvdispatch._cuda.lt_matmul import LtMatmulPlan
    from nvdispatch.integrations.jax_ffi import staged_plans

    seen: dict[int, object] = {id(plan): plan for plan in staged_plans()[since:]}
    original = LtMatmulPlan.execute_into

    def watched(self, *args, **kwargs):
        seen[id(self)] = self
        return original(self, *args, **kwargs)

    LtMatmulPlan.execute_into = watched
    try:
        for run_once in runs:
            jax.block_until_ready(run_once())
    finally:
        LtMatmulPlan.execute_into = original

    for plan in seen.values():
        p = plan.problem
        device = torch.device("cuda", plan.device_index)
        sigs = [("a", p.a), ("b", p.b), *([("c", p.c)] if p.c is not None else []), *p.inputs]
        plan.autotune({name: strided_tensor(sig, device) for name, sig in sigs}, iterations=5)
    torch.cuda.synchronize()
    return len(seen)


# -- float32 at JAX's default precision -------------------------------------------------------------------------
def bench_fp32(args, device, results: dict) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import nvdispatch

    shapes = FP32_SHAPES if not args.allow_cpu else [(256, 128, 64)]
    variants = {
        "plain": (lambda a, b, bias: a @ b, lambda a, b, bias: nvdispatch.matmul(a, b)),
        "RELU_BIAS": (
            lambda a, b, bias: jax.nn.relu(a @ b + bias),
            lambda a, b, bias: nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}),
        ),
    }
    cells = [(shape, kind) for shape in shapes for kind in variants]
    for (m, n, k), kind in progress(cells, "fp32"):
        cell = {"m": m, "n": n, "k": k, "op": kind, "precision": str(jax.config.jax_default_matmul_precision)}
        try:
            rng = np.random.default_rng(1)
            with jax.default_device(device):
                a = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
                b = jnp.asarray(rng.standard_normal((k, n)), jnp.float32)
                bias = jnp.asarray(rng.standard_normal(n), jnp.float32)
                at = (a, b, bias)
                want = np.asarray(a, np.float64)[:64] @ np.asarray(b, np.float64)  # the first 64 rows, float64
                if kind != "plain":
                    want = np.maximum(want + np.asarray(bias, np.float64), 0)
                scale = float(np.abs(want).max())

                def error(program) -> float:
                    return float(np.abs(np.asarray(program(*at))[:64] - want).max()) / scale

                ref, cell["jnp_first_call_s"] = first_call(jax.jit(variants[kind][0]), at)
                cell["jnp_rel_err"] = error(ref)
                if args.autotune and device.platform != "cpu":  # untuned first: a tuned plan is shared
                    name, route = next(iter(contenders(args).items()))
                    untuned, cell[f"{name}_untuned_first_call_s"] = first_call(jax.jit(variants[kind][1]), at, route,
                                                                               autotune="off")
                    cell[f"{name}_untuned_rel_err"] = error(untuned)
                    times = time_in_turns({"jnp": lambda: ref(*at), "untuned": lambda: untuned(*at)},
                                          args.repeats, args.inner)
                    cell["jnp_untuned_round_us"] = times["jnp"] * 1e6
                    cell[f"{name}_untuned_us"] = times["untuned"] * 1e6
                    cell[_ratio_key(name, "_untuned")] = times["untuned"] / times["jnp"]
                ours = {}
                for name, route in contenders(args).items():  # traced under the process's autotuning setting
                    ours[name], cell[f"{name}_first_call_s"] = first_call(jax.jit(variants[kind][1]), at, route)
                    cell[f"{name}_rel_err"] = error(ours[name])
                if device.platform != "cpu":
                    kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}} if kind != "plain" else {}
                    cell["explain_compiled"] = nvdispatch.explain(a, b, **kw).compiled
                timed = {"jnp": lambda: ref(*at)}
                timed.update({name: (lambda program=program: program(*at)) for name, program in ours.items()})
                times = time_in_turns(timed, args.repeats, args.inner)
            cell.update({f"{name}_us": t * 1e6 for name, t in times.items()})
            for name in ours:
                cell[_ratio_key(name)] = times[name] / times["jnp"]
            cell["goal"] = GOAL["fp32"]
        except Exception as exc:  # noqa: BLE001
            cell["error"] = f"{type(exc).__name__}: {exc}"
            cell["traceback"] = traceback.format_exc()[-4000:]
        results["fp32"].append(cell)
        print(_line("fp32", cell), flush=True)


# -- host cost of a staged call ---------------------------------------------------------------------------------------
def bench_overhead(args, device, results: dict) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import nvdispatch

    size, chain = (128, 64) if not args.allow_cpu else (16, 8)
    cell = {"size": size, "calls_per_program": chain}
    try:
        rng = np.random.default_rng(2)
        with jax.default_device(device):
            w = jnp.asarray(rng.standard_normal((size, size)) / np.sqrt(size), jnp.bfloat16)
            bias = jnp.zeros(size, jnp.bfloat16)
            x = jnp.asarray(rng.standard_normal((size, size)), jnp.bfloat16)

            def chained(layer):
                def f(h):
                    for _ in range(chain):
                        h = layer(h)
                    return h

                return jax.jit(f)

            xla = chained(lambda h: jax.nn.relu(jnp.dot(h, w) + bias))
            layer = lambda h: nvdispatch.matmul(h, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias})  # noqa: E731
            xla = compiled(xla, (x,))
            ours = {name: compiled(chained(layer), (x,), route) for name, route in contenders(args).items()}
            jax.block_until_ready((xla(x), *(fn(x) for fn in ours.values())))
            timed = {"xla": lambda: xla(x)}
            timed.update({name: (lambda fn=fn: fn(x)) for name, fn in ours.items()})
            times = time_in_turns(timed, args.repeats, args.inner)
        cell.update({f"{name}_us_per_call": t * 1e6 / chain for name, t in times.items()})
        for name in ours:
            key = "extra_us_per_call" if name == "nvdispatch" else f"extra_us_per_call[{name}]"
            cell[key] = cell[f"{name}_us_per_call"] - cell["xla_us_per_call"]
    except Exception as exc:  # noqa: BLE001
        cell["error"] = f"{type(exc).__name__}: {exc}"
        cell["traceback"] = traceback.format_exc()[-4000:]
    results["overhead"].append(cell)
    print(_line("overhead", cell), flush=True)


def _ratio_key(name: str, suffix: str = "") -> str:
    """``ratio`` (``ratio_tuned``) for the first contender, ``ratio[ROUTE]`` (``ratio_tuned[ROUTE]``) for the other
    routes, ``ratio[NAME]`` for the chain model's contenders (``ratio[fused_mlp]``, ``ratio[fused_mlp[drelu]]``)."""
    if name == "nvdispatch":
        return f"ratio{suffix}"
    if name.startswith("nvdispatch["):
        return f"ratio{suffix}{name[len('nvdispatch'):]}"
    return f"ratio{suffix}[{name}]"


def _others(cell: dict, key: str = "ratio") -> str:
    """The other contenders' ratios of a cell (routes, chain model), as text."""
    got = [f"{k[len(key):]} {v:.3f}" for k, v in cell.items() if k.startswith(key + "[")]
    return f" (others: {', '.join(got)})" if got else ""


# -- output --------------------------------------------------------------------------------------------------------
def _line(part: str, cell: dict) -> str:
    if "error" in cell:
        return f"{part}: {({k: v for k, v in cell.items() if k not in ('error', 'traceback')})} ERROR {cell['error']}"
    if part == "mlp":
        tuned = (f"; autotuned ({cell['plans_autotuned']} plans): {cell['nvdispatch_tuned_ms']:.3f} ms, ratio "
                 f"{cell['ratio_tuned']:.3f}{_others(cell, 'ratio_tuned')}" if "ratio_tuned" in cell else "")
        return (f"mlp width {cell['width']} {cell['activation']}: XLA {cell['xla_ms']:.3f} ms, nvdispatch "
                f"{cell['nvdispatch_ms']:.3f} ms, ratio {cell['ratio']:.3f} (goal <= {cell['goal']})"
                f"{_others(cell)}{tuned}; losses "
                f"agree to {cell['loss_rel_diff']:.1e}")
    if part == "fp32":
        untuned = (f"; untuned {cell['nvdispatch_untuned_us']:.1f} us, ratio {cell['ratio_untuned']:.3f}; first call "
                   f"{cell['nvdispatch_untuned_first_call_s']:.2f} s untuned, {cell['nvdispatch_first_call_s']:.2f} s"
                   if "ratio_untuned" in cell else "")
        return (f"fp32 {cell['op']} {cell['m']}x{cell['n']}x{cell['k']}: jnp {cell['jnp_us']:.1f} us, nvdispatch "
                f"{cell['nvdispatch_us']:.1f} us, ratio {cell['ratio']:.3f}{_others(cell)}{untuned}; rel. error jnp "
                f"{cell['jnp_rel_err']:.1e}, nvdispatch {cell['nvdispatch_rel_err']:.1e}")
    return (f"overhead ({cell['calls_per_program']} {cell['size']}^3 RELU_BIAS per program): XLA "
            f"{cell['xla_us_per_call']:.2f} us/call, nvdispatch {cell['nvdispatch_us_per_call']:.2f} us/call"
            + "".join(f", {k[:-len('_us_per_call')]} {v:.2f} us/call" for k, v in cell.items()
                      if k.startswith("nvdispatch[") and k.endswith("_us_per_call")))


def plot(results: dict, path: str) -> bool:
    def draw(plt):
        rows = [(f"MLP w{c['width']} {c['activation']}", c["ratio"]) for c in results.get("mlp", []) if "ratio" in c]
        rows += [
            (f"MLP w{c['width']} {c['activation']} (autotuned)", c["ratio_tuned"])
            for c in results.get("mlp", [])
            if "ratio_tuned" in c
        ]
        rows += [
            (f"fp32 {c['op']} {c['m']}x{c['n']}x{c['k']}", c["ratio"]) for c in results.get("fp32", []) if "ratio" in c
        ]
        rows += [
            (f"fp32 {c['op']} {c['m']}x{c['n']}x{c['k']} (untuned)", c["ratio_untuned"])
            for c in results.get("fp32", [])
            if "ratio_untuned" in c
        ]
        first = results.get("args", {}).get("routes", ["?"])[0]
        rows = [(f"{label} [{first}]", v) for label, v in rows]
        for c in results.get("mlp", []) + results.get("fp32", []):
            label = (f"MLP w{c['width']} {c['activation']}" if "width" in c
                     else f"fp32 {c['op']} {c['m']}x{c['n']}x{c['k']}")
            rows += [(f"{label} {k[len('ratio'):]}", v) for k, v in c.items() if k.startswith("ratio[")]
        fig, ax = plt.subplots(figsize=(9, 0.45 * max(len(rows), 2) + 1.5))
        labels = [r[0] for r in rows]
        values = [r[1] for r in rows]
        ax.barh(range(len(rows)), values, color=["tab:green" if v <= 1.0 else "tab:red" for v in values])
        ax.set_yticks(range(len(rows)), labels)
        ax.axvline(1.0, color="k", lw=1, ls="--")
        ax.set_xlabel("time ratio, nvdispatch inside jax.jit / XLA (jnp); lower is better")
        ax.set_title(f"JAX on {results.get('device', '?')}")
        ax.invert_yaxis()
        fig.tight_layout()

    return save_plot(draw, path)


def _device(allow_cpu: bool):
    """JAX's first GPU; without one (or without JAX) one line and exit 2; the CPU with ``--allow-cpu``."""
    jax = require("jax", "pip install 'jax[cuda13]' on a machine with an NVIDIA GPU")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if gpus:
        return gpus[0]
    if allow_cpu:
        return jax.devices("cpu")[0]
    cannot_run(f"needs an NVIDIA GPU that JAX sees (jax {jax.__version__} finds none)")


def main(argv=None) -> int:
    args = parse(argv)
    if args.replot:
        with open(args.replot) as fh:
            plot(json.load(fh), os.path.join(output_dir(args.out), "jax_mlp_bench.png"))
        return 0
    device = _device(args.allow_cpu)
    out = output_dir(args.out)
    path = os.path.join(out, "jax_mlp_bench.json")
    if device.platform == "cpu":  # the GPU route does not apply
        args.routes = ["auto"]
    if args.allow_cpu and device.platform == "cpu":
        args.widths, args.batch = [min(w, 64) for w in args.widths], 128
        args.repeats, args.inner = min(args.repeats, 3), min(args.inner, 2)
    import jax

    import nvdispatch

    if not args.autotune:
        os.environ["NVDISPATCH_JAX_AUTOTUNE"] = "off"
    results = {
        "device": getattr(device, "device_kind", str(device)),
        "jax": jax.__version__,
        "nvdispatch": nvdispatch.__version__,
        "args": vars(args),
        "mlp": [],
        "fp32": [],
        "overhead": [],
    }
    parts = {"mlp": bench_mlp, "fp32": bench_fp32, "overhead": bench_overhead}
    for name in args.parts:
        parts[name](args, device, results)
        with open(path, "w") as fh:
            json.dump(results, fh, indent=1)
    print(f"wrote {path}")
    plot(results, os.path.join(out, "jax_mlp_bench.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
