# ruff: noqa: B023 - the closures are timed at once, inside the loop
"""GPU probe (not a benchmark of record): per-kernel GPU time of one training step of the 4-layer bf16 MLP of
compiled_mlp_bench.py, plain Torch eagerly against FusedMLP eagerly, and CUDA-event step times (median of 3 x 10
steps), with FusedMLP's backward choices (one-pass kernel or epilogue) and its gradients' error against Torch's.
python benchmarks/probes/mlp_step_profile.py relu,gelu 4096"""
import logging
import sys

sys.path.insert(0, "benchmarks")

import compiled_mlp_bench as B  # noqa: E402
import torch  # noqa: E402
from _profile import kernel_table, step_us  # noqa: E402

logging.basicConfig(level=logging.WARNING)
logging.getLogger("nvdispatch").setLevel(logging.DEBUG if "-v" in sys.argv else logging.WARNING)


def kernels(step, x, n=3):
    return kernel_table(lambda: step(x), n)


def show(label, res):
    tot, rows = res
    print(f"== {label}: GPU {tot:.1f} us/step", flush=True)
    for us, cnt, name in rows[:16]:
        print(f"   {us:8.1f} us {cnt:3d}x  {name}")


def timed(step, x):
    return step_us(step, x)


from nvdispatch.integrations import torch_activation_grad as one_pass  # noqa: E402

for width in map(int, sys.argv[2:]):
    for act in sys.argv[1].split(","):
        plain, fused, _, _ = B.make_models(torch, width, 4, act, torch.bfloat16)
        x = torch.randn(8192, width, device="cuda", dtype=torch.bfloat16)
        tstep, fstep = B.make_step(torch, plain, None), B.make_step(torch, fused, None)
        for _ in range(3):
            tstep(x)
            fstep(x)
        torch.cuda.synchronize()
        print(f"choices {act} {width}:", one_pass.choices())
        ref = [g.clone() for g in B._weights(plain)]
        err = max(float((p - q).abs().max() / p.abs().max()) for p, q in zip(ref, B._weights(fused)))
        berr = max(float((p.grad.float() - q.grad.float()).abs().max() / p.grad.float().abs().max())
                   for p, q in zip([la.bias for la in plain.layers], fused.biases))
        print(f"grad rel err vs torch eager: weights {err:.2e}, biases {berr:.2e}")
        tt, ft = timed(tstep, x), timed(fstep, x)
        print(f"step {act} {width}: torch eager {tt:.1f} us, fused eager {ft:.1f} us, ratio {ft / tt:.4f}", flush=True)
        show(f"torch {act} {width}", kernels(tstep, x))
        show(f"fused {act} {width}", kernels(fstep, x))
        choose, chosen = one_pass.choose, one_pass.chosen
        one_pass.chosen = lambda key: None
        for forced in ("epilogue", "epilogue-bgrad", "one-pass"):
            one_pass.choose = lambda key, forms, device: forced if forced in forms else "epilogue"
            fstep(x)
            torch.cuda.synchronize()
            err = max(float((p - q).abs().max() / p.abs().max()) for p, q in zip(ref, B._weights(fused)))
            berr = max(float((p.grad.float() - q.grad.float()).abs().max() / p.grad.float().abs().max())
                       for p, q in zip([la.bias for la in plain.layers], fused.biases))
            print(f"   forced {forced}: fused eager {timed(fstep, x):.1f} us/step, grad rel err weights {err:.2e}, "
                  f"biases {berr:.2e}")
        one_pass.choose, one_pass.chosen = choose, chosen
        one_pass.forget_choices()
