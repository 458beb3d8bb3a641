"""Host time of an MLP training step on the CPU: ``FusedMLP`` against the same model in plain Torch.

A 4-layer float32 MLP (``--width`` wide, batch ``--batch``, small: the step is host-bound, as a width-1024 bf16
step is on an H200), ReLU and GELU(tanh), one training step = zeroed gradients, forward,
``loss = out.square().mean()``, backward. Cases: :class:`nvdispatch.integrations.torch_mlp.FusedMLP` eagerly
against ``F.linear`` + activation eagerly, and both under ``torch.compile(fullgraph=True)`` (inductor, no CUDA
graphs on the CPU). Torch runs on one thread, so each sample (the calling thread's CPU time over ``--number``
steps, contenders interleaved round by round) holds all of a step's work. The nvdispatch figures include what
nvdispatch's CPU executors compute for the fused epilogs, which differ from cuBLASLt's (GELU's derivative is
several Torch ops there): compare trees with ``--compare`` for nvdispatch's own host work.

    python benchmarks/mlp_host_cpu.py [--rounds 15] [--number 50] [--out benchmarks/results] [--quick]
    python benchmarks/mlp_host_cpu.py --compare SRC_BEFORE SRC_AFTER   # two source trees, alternately

Writes ``mlp_host_cpu.json`` (and a PNG with matplotlib).
"""

from __future__ import annotations

import _host_overhead as host_overhead
from _bench import require


def _cases(width: int, batch: int, layers: int = 4) -> dict:
    import torch

    from nvdispatch.integrations.torch_mlp import FusedMLP

    torch.set_num_threads(1)
    cases = {}
    for activation in ("relu", "gelu"):
        torch.manual_seed(0)
        plain = torch.nn.Sequential()
        for i in range(layers):
            plain.append(torch.nn.Linear(width, width))
            if i < layers - 1:
                plain.append(torch.nn.ReLU() if activation == "relu" else torch.nn.GELU(approximate="tanh"))
        fused = FusedMLP([width] * (layers + 1), activation=activation)
        with torch.no_grad():
            for linear, w, b in zip(plain[::2], fused.weights, fused.biases):
                w.copy_(linear.weight)  # the same (out, in) layout
                b.copy_(linear.bias)
        x = torch.randn(batch, width)
        want = plain(x)
        torch.testing.assert_close(fused(x), want, rtol=1e-4, atol=1e-4)
        for mode in ("eager", "compile"):

            def step_of(model, mode=mode, x=x):
                fn = torch.compile(model, fullgraph=True) if mode == "compile" else model
                params = list(model.parameters())

                def step():
                    for p in params:
                        p.grad = None
                    fn(x).square().mean().backward()

                return step

            cases[f"{activation} {mode} {width}x{batch}"] = (step_of(fused), step_of(plain))
    return cases


def main(argv=None) -> None:
    ap = host_overhead.parser(__doc__, __file__, rounds=15, number=50, repeats=3, unit="steps")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args(argv)
    require("torch", "pip install 'nvdispatch[torch]'")  # else one line and exit status 2
    if args.quick:
        args.rounds, args.number, args.repeats = 3, 5, 1

    def measure(rounds: int, number: int) -> dict:
        cases = _cases(args.width, args.batch)
        return host_overhead.measure(cases, rounds, number, warmup=10, desc="MLP steps")

    host_overhead.run(args, __file__, measure, "mlp_host_cpu", "ratio", "step time / plain Torch's")


if __name__ == "__main__":
    main()
