"""torch.func over nvdispatch's Torch operators on CUDA: vmap (one fused call per vmapped call: the cuBLASLt and
cuFFT launches counted with torch.profiler), grad/jacrev/jacfwd, per-example gradients, against Torch's float64
math on the same device; the same transforms compiled (``torch.compile(fullgraph=True)``, static and
``dynamic=True``), FusedMLP under vmap/grad, and vmapped FP8 scales (compute capability 8.9+). Prints one line per
check with its max error and launch counts, and exits 1 on a mismatch.

    python benchmarks/probes/torch_func_cuda.py [--dtype float32] [--batch 64] [--device cpu] [--backend inductor]
    python benchmarks/probes/torch_func_cuda.py --fp8-only     # vmapped FP8 scales and misaligned FP8 pointers

(``--device cpu`` checks the values only: it counts no launches.)
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.nn.functional as F
from torch.func import grad, hessian, jacfwd, jacrev, vmap
from torch.profiler import ProfilerActivity, profile

import nvdispatch


def wide(v):
    """``v`` in float64 (complex128 for complex ``v``)."""
    return v.to(torch.complex128) if v.is_complex() else v.double()


def launches(run) -> int | None:
    """CUDA kernel launches of one ``run()`` (after a warm-up call); None on the CPU."""
    run()
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--backend", default="inductor", help="torch.compile backend of the compiled checks")
    parser.add_argument("--fp8-only", action="store_true", help="run the FP8 checks alone (scales, alignment)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA device (--device cpu checks the values on the CPU)")
        return 2
    dt, dev, n = getattr(torch, args.dtype), args.device, args.batch
    tol = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1}[args.dtype]
    g = torch.Generator(device=dev).manual_seed(0)
    a, w, bias = (torch.randn(*s, generator=g, device=dev) for s in ((n, 64, 128), (128, 256), (256,)))
    x, t = torch.randn(n, 128, generator=g, device=dev), torch.randn(n, 256, generator=g, device=dev)
    sig = torch.randn(n, 4096, generator=g, device=dev)
    failed = False

    def check(name, got, want, count=None, within=None):
        """``within``: this check's tolerance (the result type's rounding), else the --dtype's."""
        nonlocal failed
        got = got if isinstance(got, (tuple, list)) else (got,)
        want = want if isinstance(want, (tuple, list)) else (want,)
        err = max(((wide(gg) - wide(ww)).abs().max() / wide(ww).abs().max().clamp_min(1)).item()
                  for gg, ww in zip(got, want))  # fmt: skip
        ok = err <= (tol if within is None else within)
        failed |= not ok
        print(f"{name:40s} rel err {err:.2e} {'ok' if ok else 'MISMATCH'}" + ("" if count is None else
              f"  CUDA launches {count}"))  # fmt: skip

    if args.fp8_only:
        fp8_checks(check, g, dev)
        return 1 if failed else 0
    lo = lambda *xs: [v.to(dt) for v in xs]  # noqa: E731
    a_, w_, b_ = lo(a, w, bias)
    f = lambda a: nvdispatch.matmul(a, w_, epilog="RELU_BIAS", epilog_inputs={"bias": b_})  # noqa: E731
    check("vmap matmul RELU_BIAS", vmap(f)(a_), torch.relu(a.double() @ w.double() + bias.double()),
          launches(lambda: vmap(f)(a_)))  # fmt: skip
    y, aux = vmap(lambda a: nvdispatch.matmul(a, w_, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": b_}))(a_)
    check("vmap matmul RELU_AUX_BIAS (packed mask)", y, torch.relu(a.double() @ w.double() + bias.double()))

    def loss(impl):
        def fn(w, b, x, t):
            if impl == "nv":
                y = nvdispatch.matmul(x, w, epilog="GELU_BIAS", epilog_inputs={"bias": b})
            else:
                y = F.gelu(x @ w + b, approximate="tanh")
            return ((y - t) ** 2).sum()

        return fn

    dims = (None, None, 0, 0)
    xs = [v.double() for v in (w, bias, x, t)]
    pe = vmap(grad(loss("nv"), argnums=(0, 1)), in_dims=dims)
    want = vmap(grad(loss("ref"), argnums=(0, 1)), in_dims=dims)(*xs)
    check("vmap(grad) per-example GELU_BIAS", pe(*lo(w, bias, x, t)), want, launches(lambda: pe(*lo(w, bias, x, t))))
    small = [x[:8, :16].clone(), w[:16, :8].clone(), bias[:8].clone()]  # not views: see README (jacfwd, dynamic)
    fn = lambda x, w, b: nvdispatch.matmul(x, w, epilog="GELU_BIAS", epilog_inputs={"bias": b})  # noqa: E731
    rf = lambda x, w, b: F.gelu(x @ w + b, approximate="tanh")  # noqa: E731
    dsmall = [v.double() for v in small]
    for tr in (jacrev, jacfwd):
        check(f"{tr.__name__} matmul GELU_BIAS", tr(fn, argnums=(0, 1, 2))(*lo(*small)),
              tr(rf, argnums=(0, 1, 2))(*dsmall))  # fmt: skip
    s32 = sig.float()
    rfft = lambda v: nvdispatch.fft.rfft(v, norm="ortho")  # noqa: E731
    check("vmap fft.rfft", vmap(rfft, in_dims=1, out_dims=1)(s32.T), torch.fft.rfft(sig.double(), norm="ortho").T,
          launches(lambda: vmap(rfft, in_dims=1, out_dims=1)(s32.T)))  # fmt: skip
    h = torch.fft.rfft(torch.randn(4096, generator=g, device=dev)).to(torch.complex64)
    conv = lambda v: nvdispatch.fft.convolve(v, h)  # noqa: E731
    check("vmap fft.convolve", vmap(conv)(s32), torch.fft.irfft(torch.fft.rfft(sig.double()) * h, 4096),
          launches(lambda: vmap(conv)(s32)))  # fmt: skip

    # -- compiled transforms (0 graph breaks: fullgraph=True) --------------------------------------------------------
    def hess_loss(b):
        return nvdispatch.matmul(small[0].to(dt), small[1].to(dt), epilog="GELU_BIAS", epilog_inputs={"bias": b}).sum()

    def hess_ref(b):
        return F.gelu(dsmall[0] @ dsmall[1] + b, approximate="tanh").sum()

    spec = lambda v: torch.view_as_real(nvdispatch.fft.rfft(v, norm="ortho")).pow(2).sum()  # noqa: E731
    spec_ref = lambda v: torch.view_as_real(torch.fft.rfft(v, norm="ortho")).pow(2).sum()  # noqa: E731
    for dynamic in (False, True):
        torch._dynamo.reset()
        comp = lambda fn, dynamic=dynamic: torch.compile(fn, fullgraph=True, dynamic=dynamic,  # noqa: E731
                                                         backend=args.backend)  # fmt: skip
        tag = f"compiled{' dynamic' if dynamic else ''}"
        cpe = comp(pe)
        check(f"{tag} vmap(grad) per-example", cpe(*lo(w, bias, x, t)), want,
              launches(lambda cpe=cpe: cpe(*lo(w, bias, x, t))))  # fmt: skip
        check(f"{tag} jacfwd matmul GELU_BIAS", comp(jacfwd(fn))(*lo(*small)), jacfwd(rf)(*dsmall))
        check(f"{tag} hessian matmul GELU_BIAS", comp(hessian(hess_loss))(small[2].to(dt)),
              hessian(hess_ref)(dsmall[2]))  # fmt: skip
        check(f"{tag} grad fft.rfft", comp(grad(spec))(s32[0]), grad(spec_ref)(sig[0].double()))
    # -- FusedMLP under transforms -----------------------------------------------------------------------------------
    from torch.func import functional_call

    from nvdispatch.integrations.torch_mlp import FusedMLP

    torch.manual_seed(0)
    mlp = FusedMLP([128, 256, 64], activation="gelu", device=dev, dtype=dt)
    seq = copy.deepcopy(mlp.to_sequential()).double()  # a float64 copy (to_sequential shares the modules)
    params = {k: v.detach() for k, v in mlp.named_parameters()}
    dparams = {k: v.double() for k, v in params.items()}
    mlp_loss = lambda m: lambda p, x: functional_call(m, p, (x,)).pow(2).sum()  # noqa: E731
    check("vmap FusedMLP", vmap(mlp)(x.to(dt)[:, None]), seq(x.double()[:, None]))
    per = vmap(grad(mlp_loss(mlp)), in_dims=(None, 0))
    check("vmap(grad) FusedMLP per-example", list(per(params, x.to(dt)).values()),
          list(vmap(grad(mlp_loss(seq)), in_dims=(None, 0))(dparams, x.double()).values()),
          launches(lambda: per(params, x.to(dt))))  # fmt: skip
    fp8_checks(check, g, dev)
    return 1 if failed else 0


#: tolerances of FP8 checks by result type: float32 results of exact FP8 products summed by the tensor cores, whose
#: FP8 accumulator keeps fewer bits than float32 (as the GPU tests' 2**-10); bf16's and e4m3's rounding
FP8_TOL = {"float32": 2**-10, "bfloat16": 2**-8, "float8_e4m3fn": 2**-3}


def fp8_checks(check, g, dev) -> None:
    """Vmapped FP8 scales, and the misaligned pointers they hand cuBLASLt: a per-sample scale ``sa[i]`` is 4 bytes
    from its neighbour (cuBLAS 12.9.1+ refuses FP8 scale pointers not 16-byte aligned: NOT_SUPPORTED); the same
    for a direct call with ``sa[1]``, a d scale, a bias and operands at odd offsets into their storage."""
    if dev == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        print("vmap FP8 per-sample scale_a                skipped: needs CUDA compute capability 8.9+")
        return
    f8 = torch.float8_e4m3fn
    q = torch.randn(8, 64, 128, generator=g, device=dev).to(f8)
    w8 = torch.randn(256, 128, generator=g, device=dev).to(f8).t()  # column-major (TN)
    sa = torch.rand(8, generator=g, device=dev) + 0.5
    sd = torch.rand(8, generator=g, device=dev) * 0.1 + 0.05
    if dev == "cuda":  # (on the CPU Torch's reference path runs these: values only)
        from nvdispatch._cuda import cublaslt

        print(f"  (cuBLASLt {cublaslt.version()}; sa[1] is {sa[1].data_ptr() % 16} bytes past a 16-byte "
              f"boundary)")  # fmt: skip
    product = q.double() @ w8.double()

    def fp8(q, sa):
        return nvdispatch.matmul(q, w8, quantization_scales={"a": sa}, options={"result_type": "bfloat16"})

    want8 = sa.double()[:, None, None] * product
    bf = FP8_TOL["bfloat16"]
    check("vmap FP8 per-sample scale_a", vmap(fp8)(q, sa), want8, launches(lambda: vmap(fp8)(q, sa)), bf)
    check("FP8 scale_a = sa[1] (a 4-byte offset)", fp8(q[1], sa[1]), want8[1], within=bf)

    def fp8_d(q, sa, sd):  # FP8 result: per-sample d scale and amax
        return nvdispatch.matmul(q, w8, quantization_scales={"a": sa, "d": sd},
                                 options={"result_type": "float8_e4m3fn", "result_amax": True})  # fmt: skip

    y, aux = vmap(fp8_d)(q, sa, sd)
    t = sa.double()[:, None, None] * product
    check("vmap FP8 per-sample scale_a, scale_d, amax", (y.double(), aux["result_amax"]),
          ((sd.double()[:, None, None] * t).clamp(-448, 448), t.abs().amax((1, 2))),
          within=FP8_TOL["float8_e4m3fn"])  # fmt: skip
    bias_pool = torch.randn(257, generator=g, device=dev).to(torch.bfloat16)
    bias = bias_pool[1:]  # 2 bytes into its storage
    got = nvdispatch.matmul(q[2], w8, epilog="BIAS", epilog_inputs={"bias": bias}, quantization_scales={"a": sa[3]},
                            options={"result_type": "bfloat16"})  # fmt: skip
    check("FP8 bias at a 2-byte offset", got, sa[3].double() * product[2] + bias.double(), within=bf)
    big_a = torch.randn(64, 160, generator=g, device=dev).to(f8)
    big_b = torch.randn(256, 160, generator=g, device=dev).to(f8)
    a_odd, b_odd = big_a[:, 1:129], big_b[:, 3:131].t()  # rows 160 bytes apart, 1 and 3 bytes into their storage
    got = nvdispatch.matmul(a_odd, b_odd, options={"result_type": "float32"})
    check("FP8 a, b at odd offsets (lead 160)", got, a_odd.double() @ b_odd.double(), within=FP8_TOL["float32"])


if __name__ == "__main__":
    sys.exit(main())
