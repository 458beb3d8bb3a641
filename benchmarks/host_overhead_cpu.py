"""Host overhead of cached CPU calls: nvdispatch against the library call it dispatches to, same operands.

Cases (each a repeated call whose plan is cached, timed per call): an 8×8 float32 NumPy matmul, plain and
RELU_BIAS (against ``np.matmul`` and ``np.maximum(a @ b + bias, 0)`` / ``np.matmul`` alone), a 16×16
float32 Torch CPU matmul, plain and RELU_BIAS (against ``torch.matmul`` and ``torch._addmm_activation`` /
``torch.matmul``), the same two by a planned ``Matmul``'s ``execute``, the same RELU_BIAS with ``nn.Parameter``
weight and bias under autograd (against ``torch.relu(torch.addmm(...))``), a 64-point complex64 fft of a NumPy
array and of a Torch CPU tensor (against ``np.fft.fft`` / ``torch.fft.fft``), and 16×16 complex64
``fft``/``fft2`` and the stateful ``FFT.execute`` of NumPy arrays and Torch CPU tensors (against ``numpy.fft`` /
``torch.fft``).
Contenders are interleaved round by round; each sample is the calling thread's CPU time
(``time.thread_time``) over ``--number`` calls, so time the shared machine gives to other processes is not
counted. We report the median per-call time and its ratio to the peer.

    python benchmarks/host_overhead_cpu.py [--rounds 41] [--number 2000] [--out benchmarks/results] [--quick]
    python benchmarks/host_overhead_cpu.py --compare SRC_A SRC_B   # two nvdispatch source trees, alternately

``--compare`` runs this script on each source tree (``PYTHONPATH=SRC``) in alternating child processes,
several times, and reports each case's median ratio per tree: a before/after comparison from one run.
Writes ``host_overhead_cpu.json`` (and a PNG with matplotlib).
"""

from __future__ import annotations

import _host_overhead as host_overhead
import numpy as np


def _cases(nvd):
    rng = np.random.default_rng(0)
    a8, b8 = (rng.standard_normal((8, 8), dtype=np.float32) for _ in range(2))
    bias8 = rng.standard_normal(8, dtype=np.float32)
    x64 = (rng.standard_normal(64) + 1j * rng.standard_normal(64)).astype(np.complex64)
    relu = {"epilog": nvd.Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias8}}
    cases = {
        "numpy 8x8 matmul": (lambda: nvd.matmul(a8, b8), lambda: np.matmul(a8, b8)),
        "numpy 8x8 RELU_BIAS": (lambda: nvd.matmul(a8, b8, **relu), lambda: np.matmul(a8, b8)),
        "numpy 8x8 RELU_BIAS vs expression": (
            lambda: nvd.matmul(a8, b8, **relu),
            lambda: np.maximum(a8 @ b8 + bias8, 0),
        ),
        "fft 64 complex64": (lambda: nvd.fft.fft(x64), lambda: np.fft.fft(x64)),
    }
    x16 = (rng.standard_normal((16, 16)) + 1j * rng.standard_normal((16, 16))).astype(np.complex64)
    fx16 = nvd.fft.FFT(x16, axes=(0, 1)).plan()
    cases["numpy fft2 16x16 complex64"] = (lambda: nvd.fft.fft2(x16), lambda: np.fft.fft2(x16))
    cases["numpy fft 16x16 complex64"] = (lambda: nvd.fft.fft(x16), lambda: np.fft.fft(x16))
    cases["numpy FFT.execute 16x16 vs fft2"] = (fx16.execute, lambda: np.fft.fft2(x16))
    checks = [
        (nvd.fft.fft2(x16), np.fft.fft2(x16)),
        (fx16.execute(), np.fft.fft2(x16)),
        (nvd.matmul(a8, b8), a8 @ b8),
        (nvd.matmul(a8, b8, **relu), np.maximum(a8 @ b8 + bias8, 0)),
        (nvd.fft.fft(x64), np.fft.fft(x64)),
    ]
    try:
        import torch

        ta, tb = (torch.from_numpy(rng.standard_normal((16, 16), dtype=np.float32)) for _ in range(2))
        tbias = torch.from_numpy(rng.standard_normal(16, dtype=np.float32))
        trelu = {"epilog": nvd.Epilog.RELU_BIAS, "epilog_inputs": {"bias": tbias}}
        cases["torch cpu 16x16 matmul"] = (lambda: nvd.matmul(ta, tb), lambda: torch.matmul(ta, tb))
        # the stateless linear layer: against Torch's own fused call, and against a plain product (the
        # ratio #10 sets a goal for, measured on CUDA tensors by gpu_matmul_bench.py --host-only)
        cases["torch cpu 16x16 RELU_BIAS"] = (
            lambda: nvd.matmul(ta, tb, **trelu),
            lambda: torch._addmm_activation(tbias, ta, tb),
        )
        cases["torch cpu 16x16 RELU_BIAS vs matmul"] = (
            lambda: nvd.matmul(ta, tb, **trelu),
            lambda: torch.matmul(ta, tb),
        )
        # the stateful object's execute, planned once: against the same Torch calls
        tmm = nvd.Matmul(ta, tb).plan()
        tmm_relu = nvd.Matmul(ta, tb).plan(**trelu)
        cases["torch cpu 16x16 Matmul.execute"] = (tmm.execute, lambda: torch.matmul(ta, tb))
        cases["torch cpu 16x16 Matmul.execute RELU_BIAS"] = (
            tmm_relu.execute,
            lambda: torch._addmm_activation(tbias, ta, tb),
        )
        checks.append((tmm_relu.execute().numpy(), torch.relu(ta @ tb + tbias).numpy()))
        # a training step's linear layer: nn.Parameter weight and bias beside plain activations, autograd on,
        # against what a Torch model runs (relu(addmm), both recorded)
        pw, pbias = torch.nn.Parameter(tb.clone()), torch.nn.Parameter(tbias.clone())
        prelu = {"epilog": nvd.Epilog.RELU_BIAS, "epilog_inputs": {"bias": pbias}}
        cases["torch cpu 16x16 RELU_BIAS, Parameters, autograd"] = (
            lambda: nvd.matmul(ta, pw, **prelu),
            lambda: torch.relu(torch.addmm(pbias, ta, pw)),
        )
        checks.append((nvd.matmul(ta, pw, **prelu).detach().numpy(), torch.relu(ta @ tb + tbias).numpy()))
        tx64 = torch.from_numpy(x64)
        cases["torch cpu fft 64 complex64"] = (lambda: nvd.fft.fft(tx64), lambda: torch.fft.fft(tx64))
        checks.append((nvd.fft.fft(tx64).numpy(), np.fft.fft(x64)))
        tx16 = torch.from_numpy(x16)
        ftx16 = nvd.fft.FFT(tx16, axes=(0, 1)).plan()
        cases["torch cpu fft2 16x16 complex64"] = (lambda: nvd.fft.fft2(tx16), lambda: torch.fft.fft2(tx16))
        cases["torch cpu fft 16x16 complex64"] = (lambda: nvd.fft.fft(tx16), lambda: torch.fft.fft(tx16))
        cases["torch cpu FFT.execute 16x16 vs fft2"] = (ftx16.execute, lambda: torch.fft.fft2(tx16))
        checks.append((nvd.fft.fft2(tx16).numpy(), np.fft.fft2(x16)))
        checks.append((ftx16.execute().numpy(), np.fft.fft2(x16)))
        checks.append((nvd.matmul(ta, tb).numpy(), (ta @ tb).numpy()))
        checks.append((nvd.matmul(ta, tb, **trelu).numpy(), torch.relu(ta @ tb + tbias).numpy()))
    except ImportError:
        print("torch is not installed: the Torch case is skipped")
    for got, want in checks:
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
    return cases


def measure(rounds: int, number: int) -> dict:
    import nvdispatch

    return host_overhead.measure(_cases(nvdispatch), rounds, number, warmup=50, desc="host overhead")


def main(argv=None) -> None:
    ap = host_overhead.parser(__doc__, __file__, rounds=41, number=2000, repeats=5)
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.number, args.repeats = 3, 50, 1
    host_overhead.run(args, __file__, measure, "host_overhead_cpu", "ratio", "per-call time / peer's")


if __name__ == "__main__":
    main()
