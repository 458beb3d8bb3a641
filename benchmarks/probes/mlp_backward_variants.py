# ruff: noqa: B023 - the closures are timed at once, inside the loop
"""GPU probe (not a benchmark of record): per-kernel times of the backward variants of one 4096-wide bf16 MLP
layer (batch 8192): plain / DRELU / DRELU_BGRAD / DGELU / DGELU_BGRAD GEMMs, BGRADA vs plain wgrad, Torch's
elementwise ops, and nvdispatch.device.activation_grad's one-pass kernels. Prints a table; usage:
python benchmarks/probes/mlp_backward_variants.py [--autotune] [--width 4096]"""
import argparse
import sys

sys.path.insert(0, "benchmarks")

import torch
from _profile import kernel_table

import nvdispatch
from nvdispatch._cuda.lt_matmul import LtMatmulPlan

ap = argparse.ArgumentParser()
ap.add_argument("--width", type=int, default=4096)
ap.add_argument("--batch", type=int, default=8192)
ap.add_argument("--autotune", nargs="*", default=[], help="labels to autotune: fwd-gelu dgrad dgelu-bgrad wgrad")
args = ap.parse_args()
M, N = args.batch, args.width
bf = torch.bfloat16
torch.manual_seed(0)
x = torch.randn(M, N, device="cuda", dtype=bf)
w = torch.randn(N, N, device="cuda", dtype=bf) / 64
b = torch.randn(N, device="cuda", dtype=bf)
dz = torch.randn(M, N, device="cuda", dtype=bf)


def prof(label, fn, n=5):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    total, rows = kernel_table(fn, n, name_width=100)
    print(f"{label:34s} {total:8.1f} us | " + " ; ".join(f"{us:.1f}x{count} {name[:70]}" for us, count, name in rows),
          flush=True)


mm = nvdispatch.matmul
h_relu, bits = mm(x, w.mT, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": b})
h_gelu, extra = mm(x, w.mT, epilog="GELU_AUX_BIAS", epilog_inputs={"bias": b})
zaux = extra["gelu_aux"]
print("gelu_aux", zaux.shape, zaux.stride(), "bits", bits["relu_aux"].shape, bits["relu_aux"].stride())
relu_aux = bits["relu_aux"]
prof("fwd torch F.linear", lambda: torch.nn.functional.linear(x, w, b))
prof("fwd torch linear+gelu", lambda: torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b), approximate="tanh"))
prof("fwd BIAS", lambda: mm(x, w.mT, epilog="BIAS", epilog_inputs={"bias": b}))
prof("fwd RELU_BIAS", lambda: mm(x, w.mT, epilog="RELU_BIAS", epilog_inputs={"bias": b}))
prof("fwd RELU_AUX_BIAS", lambda: mm(x, w.mT, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": b}))
prof("fwd GELU_AUX_BIAS", lambda: mm(x, w.mT, epilog="GELU_AUX_BIAS", epilog_inputs={"bias": b}))
prof("fwd GELU_BIAS", lambda: mm(x, w.mT, epilog="GELU_BIAS", epilog_inputs={"bias": b}))
prof("dgrad plain", lambda: mm(dz, w))
prof("dgrad torch mm", lambda: dz @ w)
prof("dgrad DRELU", lambda: mm(dz, w, epilog="DRELU", epilog_inputs={"relu_aux": relu_aux}))
prof("dgrad DRELU_BGRAD", lambda: mm(dz, w, epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": relu_aux}))
prof("dgrad DGELU", lambda: mm(dz, w, epilog="DGELU", epilog_inputs={"gelu_aux": zaux}))
prof("dgrad DGELU_BGRAD", lambda: mm(dz, w, epilog="DGELU_BGRAD", epilog_inputs={"gelu_aux": zaux}))
prof("wgrad BGRADA", lambda: mm(dz.mT, x, epilog="BGRADA"))
prof("wgrad plain", lambda: mm(dz.mT, x))
prof("torch threshold_backward", lambda: torch.ops.aten.threshold_backward(dz, h_relu, 0))
prof("torch gelu_backward", lambda: torch.ops.aten.gelu_backward(dz, zaux, approximate="tanh"))
prof("torch sum(0)", lambda: dz.sum(0))
try:
    from numba import cuda

    from nvdispatch.device import activation_grad as A

    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)

    def nb(t):
        return cuda.as_cuda_array(t.view(torch.int64), sync=False)

    grid, thr, rows = A.launch_shape(M, N)
    part = torch.empty(rows, N, device="cuda", dtype=torch.float32)
    sums = torch.empty(N, device="cuda", dtype=bf)
    out = torch.empty(M, N, device="cuda", dtype=bf)
    zd = zaux.contiguous()
    args_ = {"relu": (nb(dz), nb(h_relu)), "gelu": (nb(dz), nb(zd)), "none": (nb(dz), nb(dz)),
             "relu_bits": (nb(dz), cuda.as_cuda_array(relu_aux.contiguous(), sync=False))}
    pn, sn, on = cuda.as_cuda_array(part, sync=False), cuda.as_cuda_array(sums.view(torch.int16), sync=False), nb(out)
    for kind in A.KINDS:
        g_, s_ = args_[kind]
        prof(f"numba one-pass {kind}", lambda: A.launch(kind, g_, s_, on, pn, sn, stream))
    A.launch("relu", *args_["relu"], on, pn, sn, stream)
    torch.cuda.synchronize()
    ref = torch.ops.aten.threshold_backward(dz, h_relu, 0)
    print("relu check", torch.equal(out, ref), float((sums.float() - ref.float().sum(0)).abs().max()))
    A.launch("relu_bits", *args_["relu_bits"], on, pn, sn, stream)
    torch.cuda.synchronize()
    ref = torch.ops.aten.threshold_backward(dz, h_relu, 0)
    print("relu_bits check", torch.equal(out, ref), float((sums.float() - ref.float().sum(0)).abs().max()))
    A.launch("gelu", *args_["gelu"], on, pn, sn, stream)
    torch.cuda.synchronize()
    ref = torch.ops.aten.gelu_backward(dz.float(), zd.float(), approximate="tanh")
    print("gelu check", float((out.float() - ref).abs().max()), float((sums.float() - ref.sum(0)).abs().max()))
except Exception:  # noqa: BLE001
    import traceback
    traceback.print_exc()
if args.autotune:
    from jax_mlp_bench import strided_tensor  # noqa: F401  (benchmarks/ on sys.path)
    tunable = {
        "fwd-gelu": ("fwd GELU_AUX_BIAS", lambda: mm(x, w.mT, epilog="GELU_AUX_BIAS", epilog_inputs={"bias": b})),
        "dgrad": ("dgrad plain", lambda: mm(dz, w)),
        "dgelu-bgrad": ("dgrad DGELU_BGRAD", lambda: mm(dz, w, epilog="DGELU_BGRAD", epilog_inputs={"gelu_aux": zaux})),
        "wgrad": ("wgrad plain", lambda: mm(dz.mT, x)),
    }
    for label, fn in (tunable[k] for k in args.autotune):
        seen = {}
        orig = LtMatmulPlan._execute

        def watched(self, *a, **k):
            seen[id(self)] = self
            return orig(self, *a, **k)

        LtMatmulPlan._execute = watched
        fn()
        torch.cuda.synchronize()
        LtMatmulPlan._execute = orig
        for plan in seen.values():
            p = plan.problem
            sigs = [("a", p.a), ("b", p.b), *([("c", p.c)] if p.c is not None else []), *p.inputs]
            res = plan.autotune({n: strided_tensor(s, x.device) for n, s in sigs}, iterations=5)
            print("  tuned", label, sorted(r[1] * 1e6 for r in res)[:3] if res else None, flush=True)
        prof(f"{label} (tuned)", fn)
