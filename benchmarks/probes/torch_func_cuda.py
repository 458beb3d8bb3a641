"""torch.func over nvdispatch's Torch operators on CUDA: vmap (one fused call per vmapped call: the cuBLASLt and
cuFFT launches counted with torch.profiler), grad/jacrev/jacfwd, per-example gradients, against Torch's float64
math on the same device. Prints one line per check with its max error and launch counts, and exits 1 on a
mismatch.

    python benchmarks/probes/torch_func_cuda.py [--dtype float32] [--batch 64] [--device cpu]

(``--device cpu`` checks the values only: it counts no launches.)
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch.func import grad, jacfwd, jacrev, vmap
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

    def check(name, got, want, count=None):
        nonlocal failed
        got = got if isinstance(got, (tuple, list)) else (got,)
        want = want if isinstance(want, (tuple, list)) else (want,)
        err = max(((wide(gg) - wide(ww)).abs().max() / wide(ww).abs().max().clamp_min(1)).item()
                  for gg, ww in zip(got, want))  # fmt: skip
        ok = err <= tol
        failed |= not ok
        print(f"{name:40s} rel err {err:.2e} {'ok' if ok else 'MISMATCH'}" + ("" if count is None else
              f"  CUDA launches {count}"))  # fmt: skip

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
    small = [x[:8, :16], w[:16, :8], bias[:8]]
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
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
