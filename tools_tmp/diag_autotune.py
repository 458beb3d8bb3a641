import sys
import time

sys.path.insert(0, "benchmarks")
import gpu_matmul_bench as gmb
import torch

import nvdispatch
from nvdispatch._cuda import lt_autotune

for (m, n, k, dt, ep) in [(512, 512, 512, "float32", None), (1024, 512, 2048, "tf32", "RELU_BIAS"), (4096, 4096, 4096, "tf32", None)]:
    tf32 = dt == "tf32"
    t = torch.float32 if tf32 else getattr(torch, dt)
    a = torch.randn(m, k, device="cuda", dtype=t); b = torch.randn(k, n, device="cuda", dtype=t); bias = torch.randn(n, device="cuda", dtype=t)
    opts = {"compute_type": "COMPUTE_32F_FAST_TF32"} if tf32 else None
    kw = {"epilog": ep, "epilog_inputs": {"bias": bias}} if ep else {}
    with nvdispatch.set_backend("cuda"):
        mm = nvdispatch.Matmul(a, b, options=opts).plan(**kw)
        plan = mm._plan; ops = mm._operands(); sp = torch.cuda.current_stream().cuda_stream
        heur = gmb.gpu_time(lambda: plan.execute(ops), torch)
        gs = lt_autotune.gpu_seconds(lambda: plan.execute(ops, sp), sp, 0, 3)
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(100): plan.execute(ops, sp)
        host = (time.perf_counter() - t0) / 100; torch.cuda.synchronize()
        timings = plan.autotune(ops, 3)
        tuned = gmb.gpu_time(lambda: plan.execute(ops), torch)
    best = sorted(timings, key=lambda x: x[1])[:4]
    print(f"{m}x{n}x{k} {dt} {ep}: bench-timer heur {heur*1e6:.1f} us, gpu_seconds heur {gs*1e6:.1f} us, host/launch {host*1e6:.1f} us, hold {lt_autotune._HOLD[0]*1e3:.1f} ms; tuned (bench timer) {tuned*1e6:.1f} us; first cand {timings[0][0]} {timings[0][1]*1e6:.1f}; best {[(l, round(x*1e6,1)) for l, x in best]}", flush=True)
    mm.free()
