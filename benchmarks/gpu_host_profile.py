"""Where the host time of a cached 16x16 ``nvdispatch.matmul`` goes (GPU machine, Torch tensors).

Times each piece of the stateless RELU_BIAS call on its own (stream look-up, result allocation, pointer
reads, the bare ``cublasLtMatmul`` ctypes call with every argument prepared) next to ``torch.matmul``, and
writes a cProfile listing of the whole call.  Usage:  python benchmarks/gpu_host_profile.py [--out DIR]
Needs an NVIDIA GPU and ``pip install 'nvdispatch[torch,cuda]'``.
"""

from __future__ import annotations

import cProfile
import ctypes
import io
import json
import pstats

from _bench import cuda_event_seconds, output_dir, parser, require_cuda_torch
from gpu_matmul_bench import host_times


def per_call(fn, torch) -> float:
    """Median host seconds per call, measured as ``gpu_matmul_bench.host_times`` measures (short
    synchronised rounds, so the launch queue never fills and the GPU's own time never shows)."""
    return host_times({"call": fn}, torch)["call"]


def gpu_per_call(fn, torch, n: int = 300, rounds: int = 5) -> float:
    """Median GPU seconds per call: CUDA events around ``n`` calls queued behind a busy-wait kernel."""
    return cuda_event_seconds(fn, torch, reps=rounds, inner=n, warmup=1, busy_cycles=20_000_000 // n)


def kernels_per_call(fn, torch, n: int = 10) -> list:
    """Names of the GPU kernels (and memsets/copies) one call launches."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    return [f"{e.key} x{e.count / n:g}" for e in prof.key_averages()]


def main(argv: list[str] | None = None) -> None:
    args = parser(__doc__).parse_args(argv)
    torch = require_cuda_torch()
    out_dir = output_dir(args.out)

    import nvdispatch
    from nvdispatch._cuda import cublaslt as lt
    from nvdispatch._cuda.arrays import empty
    from nvdispatch._cuda.streams import current_stream

    a = torch.randn(16, 16, device="cuda")
    b = torch.randn(16, 16, device="cuda")
    bias = torch.randn(16, device="cuda")
    dev = torch.device("cuda", 0)
    nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    with nvdispatch.set_backend("cuda"):  # the cuBLASLt plan (the default leaves 16x16 to Torch's fused entry)
        mm = nvdispatch.Matmul(a, b)
        mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    plan = mm._plan
    ops = mm._operands()
    sp = current_stream("torch", 0)
    out = torch.empty(16, 16, device="cuda")
    core, algo = plan.core, plan.algorithm
    call = lt.lib().cublasLtMatmul
    alpha = plan._scalar(1, [])
    beta = plan._scalar(0, [])
    algo_ref = ctypes.byref(algo.algo)
    pa, pb, pd = a.data_ptr(), b.data_ptr(), out.data_ptr()

    def bare():
        call(plan.handle, core.desc.ptr, alpha, pa, core.a.ptr, pb, core.b.ptr, beta, pd, core.c.ptr, pd,
             core.d.ptr, algo_ref, 0, 0, sp)

    # the same entry point called without releasing the GIL (PYFUNCTYPE), and ctypes' cost for a 0-argument call
    proto = ctypes.PYFUNCTYPE(call.restype, *call.argtypes)
    call_gil = proto(ctypes.cast(call, ctypes.c_void_p).value)
    version = lt.lib().cublasLtGetVersion

    def bare_gil():
        call_gil(plan.handle, core.desc.ptr, alpha, pa, core.a.ptr, pb, core.b.ptr, beta, pd, core.c.ptr, pd,
                 core.d.ptr, algo_ref, 0, 0, sp)

    raw_stream = torch._C._cuda_getCurrentRawStream
    res = {
        "torch.matmul": per_call(lambda: torch.matmul(a, b), torch),
        "torch.matmul(out=)": per_call(lambda: torch.matmul(a, b, out=out), torch),
        "torch._addmm_activation": per_call(lambda: torch._addmm_activation(bias, a, b), torch),
        "nvdispatch.matmul RELU_BIAS": per_call(
            lambda: nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}), torch
        ),
        "nvdispatch.matmul plain": per_call(lambda: nvdispatch.matmul(a, b), torch),
        "Matmul.execute RELU_BIAS": per_call(mm.execute, torch),
        "plan.execute": per_call(lambda: plan.execute(ops), torch),
        "plan._execute (stream given)": per_call(lambda: plan._execute(ops, sp), torch),
        "bare cublasLtMatmul ctypes call": per_call(bare, torch),
        "bare cublasLtMatmul ctypes call, GIL held": per_call(bare_gil, torch),
        "ctypes cublasLtGetVersion()": per_call(version, torch),
        "current_stream('torch', 0)": per_call(lambda: current_stream("torch", 0), torch),
        "torch._C._cuda_getCurrentRawStream(0)": per_call(lambda: raw_stream(0), torch),
        "arrays.empty torch 16x16": per_call(lambda: empty("torch", (16, 16), "float32", 0, sp), torch),
        "torch.empty((16,16), device=dev)": per_call(lambda: torch.empty((16, 16), device=dev), torch),
        "a.new_empty((16,16))": per_call(lambda: a.new_empty((16, 16)), torch),
        "a.data_ptr()": per_call(a.data_ptr, torch),
        "plan._scalar(1, [])": per_call(lambda: plan._scalar(1, []), torch),
    }
    ws = plan.launch.workspace(sp, 32 << 20, "torch")
    for i, cand in enumerate(core.algorithms(plan.handle, 256, 8)):
        ref = ctypes.byref(cand.algo)

        def cand_call(ref=ref, size=cand.workspaceSize):
            return call(plan.handle, core.desc.ptr, alpha, pa, core.a.ptr, pb, core.b.ptr, beta, pd, core.c.ptr,
                        pd, core.d.ptr, ref, ws, size, sp)

        res[f"candidate {i} host"] = per_call(cand_call, torch)
        res[f"candidate {i} gpu"] = gpu_per_call(cand_call, torch)
        res[f"candidate {i} ws"] = cand.workspaceSize
        res[f"candidate {i} status"] = cand_call()
    for name, fn in (("torch.matmul", lambda: torch.matmul(a, b)),
                     ("torch._addmm_activation", lambda: torch._addmm_activation(bias, a, b)),
                     ("nvdispatch RELU_BIAS", lambda: nvdispatch.matmul(a, b, epilog="RELU_BIAS",
                                                                         epilog_inputs={"bias": bias})),
                     ("bare", bare)):
        res[f"gpu time {name}"] = gpu_per_call(fn, torch)
        res[f"kernels {name}"] = kernels_per_call(fn, torch)
    with open("/proc/self/maps") as fh:
        res["cublasLt libraries"] = sorted({ln.split()[-1] for ln in fh if "cublasLt" in ln})
    res["ratio RELU_BIAS / torch.matmul"] = res["nvdispatch.matmul RELU_BIAS"] / res["torch.matmul"]
    res["ratio plain / torch.matmul"] = res["nvdispatch.matmul plain"] / res["torch.matmul"]
    for key, v in res.items():
        shown = v * 1e6 if isinstance(v, float) and "ratio" not in key else v
        print(f"{key:45s} {shown}")
    with open(f"{out_dir}/gpu_host_profile.json", "w") as fh:
        json.dump(res, fh, indent=1)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20000):  # no progress bar: it would show in the profile
        nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
    with open(f"{out_dir}/gpu_host_profile.txt", "w") as fh:
        fh.write(buf.getvalue())
    print(buf.getvalue()[:4000])


if __name__ == "__main__":
    main()
