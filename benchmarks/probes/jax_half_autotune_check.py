"""Whether the cuBLASLt autotunes of half-precision JAX plans check their results on the GPU: a bfloat16 and a
float16 ``RELU_BIAS`` product staged into ``jax.jit`` through the XLA FFI route (``--route``), autotuned

1. when the program is traced (``NVDISPATCH_JAX_AUTOTUNE="always"``: on scratch buffers), and
2. as ``benchmarks/jax_mlp_bench.py``'s ``autotune_staged`` does after it (``plan.autotune`` on Torch tensors of
   the plan's operands: the plan's problem is a ``"dlpack"`` one, so its check views them by
   ``__cuda_array_interface__``, whose bfloat16 typestr is ``"<V2"``).

Prints one line per (dtype, stage): the WARNINGs logged (before the fix: "the results could not be checked
(the heuristic's first answer failed: data type 'void16' not understood)" in stage 2 for bfloat16), the
tolerance each check computed (finite when the samples were read) and the label the plan kept; then the
program's result against a float64 NumPy product. Exits 1 where a WARNING was logged or a check read nothing.

    python benchmarks/probes/jax_half_autotune_check.py [--size 1024] [--route ffi-graphs]
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import tempfile


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=1024, help="m = n = k (default 1024)")
    p.add_argument("--route", default="ffi-graphs", choices=("ffi", "ffi-graphs"), help="the staged route")
    args = p.parse_args()
    os.environ["NVDISPATCH_CACHE_DIR"] = tempfile.mkdtemp()  # time again: no choice kept by an earlier run

    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    import nvdispatch
    from nvdispatch._cuda import lt_autotune
    from nvdispatch.integrations.jax_autotune import jax_autotune
    from nvdispatch.integrations.jax_ffi import jax_route, staged_plans

    if jax.devices()[0].platform != "gpu":
        print("no JAX GPU here")
        return 2
    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    logging.getLogger("nvdispatch").addHandler(Collect(logging.WARNING))
    tolerances: list[float] = []
    real = lt_autotune._agreeing_best

    def spy(cands, finalists, seconds, launch, check):
        if check is not None:
            checks_tolerance = check.tolerance  # bound now: `check` is rebound to the spying sample below

            def tolerance(expected):
                tolerances.append(checks_tolerance(expected))
                return tolerances[-1]

            check = lt_autotune.ResultSample(check.read, tolerance, check.shape, check.problem)
        return real(cands, finalists, seconds, launch, check)

    lt_autotune._agreeing_best = spy
    failed = False

    def report(dtype, stage, plans):
        nonlocal failed
        kept = [(plan.tuned or {}).get("label", "the heuristic's first answer") for plan in plans]
        read = bool(tolerances) and all(math.isfinite(t) and t > 0 for t in tolerances)
        print(f"{dtype} {stage}: warnings={warnings} tolerances={[f'{t:.3g}' for t in tolerances]} kept={kept}")
        failed |= bool(warnings) or not read
        warnings.clear()
        tolerances.clear()

    n = args.size
    rng = np.random.default_rng(0)
    for dtype in ("bfloat16", "float16"):
        a, b = (jnp.asarray(rng.standard_normal((n, n)) / math.sqrt(n), dtype) for _ in range(2))
        bias = jnp.asarray(rng.standard_normal((1, n)), dtype)
        since = len(staged_plans())
        with jax_route(args.route), jax_autotune("always"):
            f = jax.jit(lambda a, b, bias: nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}))
            program = f.lower(a, b, bias).compile()
        plans = staged_plans()[since:]
        report(dtype, "traced (scratch buffers)", plans)
        for plan in plans:
            pr = plan.problem
            sigs = [("a", pr.a), ("b", pr.b), *pr.inputs]
            operands = {}
            for name, sig in sigs:
                t = torch.randn(tuple(sig.shape), device=f"cuda:{plan.device_index}").to(getattr(torch, sig.dtype))
                operands[name] = t
            plan.autotune(operands, iterations=3)
        torch.cuda.synchronize()
        report(dtype, "plan.autotune on Torch tensors", plans)
        got = np.asarray(program(a, b, bias).astype(jnp.float32), np.float64)
        want = np.maximum(
            np.asarray(a.astype(jnp.float32), np.float64) @ np.asarray(b.astype(jnp.float32), np.float64)
            + np.asarray(bias.astype(jnp.float32), np.float64),
            0,
        )
        err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
        bound = 2.0**-7 if dtype == "bfloat16" else 2.0**-9
        print(f"{dtype} result: max rel. error {err:.3g} (bound {bound:.3g})")
        failed |= not err <= bound
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
