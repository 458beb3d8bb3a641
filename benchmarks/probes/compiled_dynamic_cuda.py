"""Checks on CUDA what the CPU tests of the issue 31/29 audit check on the CPU: under
``torch.compile(fullgraph=True, dynamic=True)`` FFT lengths and matmul ``alpha``/``beta`` computed from symbolic
sizes keep one graph over several sizes (values against NumPy float64), the backward of such a graph too
(gradients against Torch float64 autograd), ``fftfreq`` with a CUDA device compiles with the eager values, and
errors found while Torch traces come out as their own ``nvdispatch.errors`` class. Prints one line per check and
exits non-zero if any fails. Not a benchmark: no timings.

    python benchmarks/probes/compiled_dynamic_cuda.py            # on a GPU machine with the [torch] extra
    python benchmarks/probes/compiled_dynamic_cuda.py --device cpu   # the same checks on the CPU
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from torch._dynamo.utils import counters

import nvdispatch
from nvdispatch.errors import EpilogInputError, InvalidArgumentError

F = nvdispatch.fft


def _one_graph(fn, calls, backend):
    """Compile ``fn`` (fullgraph, dynamic) and run it on each argument tuple of ``calls``: (results, graphs)."""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=True)
    return [compiled(*args) for args in calls], counters["stats"]["unique_graphs"]


def check_fft_lengths(device, backend):
    def fn(x):
        rows, cols = x.shape
        return F.irfftn(F.rfft2(x, s=(rows + 1, 2 * cols)), s=(rows, cols)), F.fft(x, n=cols + 3)

    xs = [(torch.randn(r, c, dtype=torch.float64, device=device),) for r, c in ((5, 6), (7, 9), (4, 12))]
    outs, graphs = _one_graph(fn, xs, backend)
    for (x,), (y, z) in zip(xs, outs):
        xn = x.cpu().numpy()
        rows, cols = xn.shape
        want = np.fft.irfftn(np.fft.rfft2(xn, s=(rows + 1, 2 * cols)), s=(rows, cols), axes=(0, 1))
        np.testing.assert_allclose(y.cpu().numpy(), want, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(z.cpu().numpy(), np.fft.fft(xn, n=cols + 3), rtol=1e-9, atol=1e-9)
    assert graphs == 1, f"{graphs} graphs"


def check_symbolic_scalars_and_backward(device, backend):
    def fn(q, k, v):
        s = nvdispatch.matmul(q, k.mT, alpha=q.shape[-1] ** -0.5)
        return nvdispatch.matmul(torch.softmax(s, -1), v, epilog="RELU").sum()

    def ref(q, k, v):
        return torch.relu(torch.softmax(q @ k.mT * q.shape[-1] ** -0.5, -1) @ v).sum()

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=True)
    for length, d in ((5, 4), (7, 8), (3, 6)):
        q, k, v = (torch.randn(2, length, d, dtype=torch.float64, device=device, requires_grad=True) for _ in range(3))
        got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
        want = torch.autograd.grad(ref(q, k, v), (q, k, v))
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.cpu().numpy(), w.cpu().numpy(), rtol=1e-8, atol=1e-8)
    assert counters["stats"]["unique_graphs"] == 1, f"{counters['stats']['unique_graphs']} graphs"


def check_fftfreq(device, backend):
    def fn(x):
        return F.fftfreq(x.shape[-1], d=0.25, device=x.device) * x[0]

    xs = [(torch.randn(2, n, dtype=torch.float64, device=device),) for n in (6, 9)]
    outs, graphs = _one_graph(fn, xs, backend)
    for (x,), got in zip(xs, outs):
        assert torch.equal(got, fn(x))
    assert graphs == 1, f"{graphs} graphs"


def check_typed_errors(device, backend):
    a, bad = torch.randn(4, 3, device=device), []
    for call, error, argument in (
        (lambda a: nvdispatch.fft.fft(a, prolog=lambda v, i: v), nvdispatch.errors.CallbackError, "prolog"),
        (lambda a: nvdispatch.matmul(a, a.T, epilog="BIAS", epilog_inputs={"bias": a}), EpilogInputError,
         "epilog_inputs['bias']"),
        (lambda a: nvdispatch.fft.fft(a, norm="nope"), InvalidArgumentError, "norm"),
    ):  # fmt: skip
        torch._dynamo.reset()
        try:
            torch.compile(call, backend=backend, fullgraph=True)(a)
        except error as e:
            assert e.argument == argument, e.argument
        except Exception as e:  # noqa: BLE001 -- say which class arrived instead (Torch 2.11: Dynamo's wrappers)
            bad.append(f"{argument}: {type(e).__module__}.{type(e).__name__} instead of {error.__name__}")
        else:
            bad.append(f"{argument}: no {error.__name__}")
    assert not bad, f"Torch {torch.__version__}: " + "; ".join(bad)


CHECKS = [check_fft_lengths, check_symbolic_scalars_and_backward, check_fftfreq, check_typed_errors]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="torch device to check on (default: cuda)")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (default: inductor)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, device {args.device}, backend {args.backend}")
    failed = 0
    for check in CHECKS:
        try:
            check(args.device, args.backend)
            print(f"ok    {check.__name__}")
        except Exception as e:  # noqa: BLE001 -- a probe reports every check
            failed += 1
            print(f"FAIL  {check.__name__}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
