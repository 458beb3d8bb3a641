"""What folding a Torch CUDA conjugate view into cuBLASLt's op C saves, against the copy per call it replaces.

``nvdispatch.matmul(a, b, epilog="BIAS", ...)`` with ``a = x.mH``, ``b = y.mH`` or both (lazy conjugate views of
contiguous complex tensors) runs on the ``"cuda"`` executor: since commit 6eaac23 cuBLASLt reads such an operand
with op C; before, the Torch adapter copied its values on every call. For each shape, dtype and case this probe
times, in one process and on the same operands: ``fold`` (the route as it is), ``copy`` (the same route with the
adapter's ``info_conjugated`` switched off: a copy of the values per call, which the call key's ``CopyingPlan``
makes; before it, and before such views had a call key, every call took the full route), and Torch's own
``torch.matmul(a, b) + bias`` (which folds the conjugation into cuBLAS itself). GPU time per call by CUDA events
(the median of bursts, the calls queued behind a busy GPU so the host's cost is hidden) and host time per call (wall
clock of a synchronised loop), with the share of calls that took the route's full path (detect, select, plan)
instead of the cached plan (each route should take it once: the call key keeps the folded plan, or the CopyingPlan);
the largest error of each against a complex128 product on the GPU. It also says which plan ran (``explain()``'s
``op(A)=``/``op(B)=``). One line per measurement; ``--out`` writes the JSON.

    python benchmarks/probes/conj_fold.py [--shapes 256x256x256,2048x2048x2048] [--dtypes complex64 complex128]
        [--cases a b both] [--reps 7] [--out DIR]

Needs an NVIDIA GPU and Torch with CUDA.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _bench import cuda_event_seconds, gemm_shapes, output_dir, parser, require_cuda_torch  # noqa: E402


def host_seconds(torch, fn, calls: int) -> tuple[float, float]:
    """Wall-clock seconds per call of ``calls`` synchronised-at-the-end calls (after one warm-up call), and the share
    of them that took the route's full path (detect, select, plan: ``linalg._plan_and_run``) rather than a cached
    plan."""
    from nvdispatch import linalg

    fn()
    torch.cuda.synchronize()
    full = []
    inner = linalg._plan_and_run

    def counted(*args):
        full.append(1)
        return inner(*args)

    linalg._plan_and_run = counted
    try:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / calls
    finally:
        linalg._plan_and_run = inner
    return seconds, len(full) / calls


@contextlib.contextmanager
def copies_per_call():
    """The route as before the fold: the Torch adapter offers no conjugate view by its memory."""
    from nvdispatch._adapters.torch import TorchAdapter

    saved = TorchAdapter.info_conjugated
    TorchAdapter.info_conjugated = lambda self, name, x: None
    try:
        yield
    finally:
        TorchAdapter.info_conjugated = saved


def operands(torch, case: str, m: int, n: int, k: int, dtype, g):
    def rand(*shape):
        return torch.complex(
            torch.randn(*shape, device="cuda", dtype=torch.float64, generator=g),
            torch.randn(*shape, device="cuda", dtype=torch.float64, generator=g),
        ).to(dtype)

    a = rand(k, m).mH if case in ("a", "both") else rand(m, k)
    b = rand(n, k).mH if case in ("b", "both") else rand(k, n)
    return a, b, rand(n)


def measure(torch, nvdispatch, a, b, bias, reps: int) -> dict:
    """``{route: (gpu seconds, host seconds, largest relative error)}`` of ``a @ b + bias`` by each route, and the
    ops ``explain()`` names for the ``fold`` route."""
    want = a.resolve_conj().to(torch.complex128) @ b.resolve_conj().to(torch.complex128) + bias
    scale = max(float(want.abs().max()), 1.0)
    steps = " ".join(nvdispatch.linalg.explain_matmul(a, b, epilog="BIAS", epilog_inputs={"bias": bias}).steps)
    ops = " ".join(w.rstrip(",") for w in steps.split() if w.startswith("op("))

    def ours():
        return nvdispatch.matmul(a, b, epilog="BIAS", epilog_inputs={"bias": bias})

    def theirs():
        return torch.matmul(a, b) + bias

    out = {"ops": ops}
    routes = (
        ("fold", ours, contextlib.nullcontext),
        ("copy", ours, copies_per_call),
        ("torch", theirs, contextlib.nullcontext),
    )
    for name, fn, scope in routes:
        with scope():
            err = float((fn().to(torch.complex128) - want).abs().max()) / scale
            once = cuda_event_seconds(fn, torch, reps=1, inner=1, warmup=2)
            inner = max(1, min(200, round(2e-2 / max(once, 1e-6))))
            gpu = cuda_event_seconds(fn, torch, reps=reps, inner=inner, warmup=0, busy_cycles=2_000_000)
            host, full = host_seconds(torch, fn, max(10, inner))
        out[name] = (gpu, host, err, full)
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--shapes", type=gemm_shapes, default=gemm_shapes("256x256x256,2048x2048x2048"),
                    help="MxNxK,... (default: 256x256x256,2048x2048x2048)")  # fmt: skip
    ap.add_argument("--dtypes", nargs="+", default=["complex64", "complex128"], choices=["complex64", "complex128"])
    ap.add_argument("--cases", nargs="+", default=["a", "b", "both"], choices=["a", "b", "both"],
                    help="which operands are conjugate views (x.mH)")  # fmt: skip
    ap.add_argument("--reps", type=int, default=7, help="bursts per GPU timing (default: %(default)s)")
    args = ap.parse_args()
    torch = require_cuda_torch()
    import nvdispatch

    g = torch.Generator(device="cuda").manual_seed(0)
    records = []
    with nvdispatch.set_backend("cuda", only=True):
        for m, n, k in args.shapes:
            for dtype_name in args.dtypes:
                for case in args.cases:
                    a, b, bias = operands(torch, case, m, n, k, getattr(torch, dtype_name), g)
                    got = measure(torch, nvdispatch, a, b, bias, args.reps)
                    for route in ("fold", "copy", "torch"):
                        gpu, host, err, full = got[route]
                        ops = got["ops"] if route == "fold" else ""
                        records.append({"m": m, "n": n, "k": k, "dtype": dtype_name, "case": case, "route": route,
                                        "gpu_s": gpu, "host_s": host, "max_rel_err": err, "full_path_share": full,
                                        "ops": ops})  # fmt: skip
                        print(f"{m}x{n}x{k} {dtype_name:10s} {case:4s} {route:5s} gpu {gpu * 1e6:9.1f} us  "
                              f"host {host * 1e6:9.1f} us  full path {full:4.0%}  err {err:.1e}  {ops}",
                              flush=True)  # fmt: skip
    path = os.path.join(output_dir(args.out), "conj_fold.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
