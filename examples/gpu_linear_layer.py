"""A fused linear layer on the GPU: ``relu(x @ w + bias)`` in one cuBLASLt call, forward and backward.

Runs with CuPy arrays or Torch CUDA tensors (whichever is installed); skips politely without a GPU.
The bias has the neural-network shape ``(n,)`` — cuBLASLt fuses it natively because nvdispatch describes
the row-major problem to cuBLASLt in its transposed column-major form.

Needs: an NVIDIA GPU, ``pip install 'nvdispatch[cuda]'`` and one of ``nvdispatch[cupy]`` / ``nvdispatch[torch]``.
Without them it says what is missing and exits with status 0 (nothing to run here, nothing failed).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import nvdispatch
from nvdispatch import Epilog
from nvdispatch.executors import builtin


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    why = builtin("cuda").unavailable()  # None where our cuBLASLt executor can run
    if why:
        print(f"skipped: needs an NVIDIA GPU and the [cuda] extra: {why}")
        return 0
    try:
        import cupy as xp

        def to_host(x):
            return x.get()
    except ImportError:
        try:
            import torch
        except ImportError:
            print("skipped: needs pip install 'nvdispatch[cupy]' or 'nvdispatch[torch]'")
            return 0

        class xp:  # the three calls below, on torch
            float32 = torch.float32

            @staticmethod
            def asarray(x):
                return torch.as_tensor(x, device="cuda")

        def to_host(x):
            return x.cpu().numpy()

    rng = np.random.default_rng(0)
    batch, d_in, d_out = 256, 128, 64
    x = xp.asarray(rng.standard_normal((batch, d_in), dtype=np.float32))
    w = xp.asarray(rng.standard_normal((d_in, d_out), dtype=np.float32) / np.float32(np.sqrt(d_in)))
    bias = xp.asarray(rng.standard_normal(d_out, dtype=np.float32))

    print(nvdispatch.explain(x, w, epilog=Epilog.RELU_AUX_BIAS, epilog_inputs={"bias": bias}))
    y, aux = nvdispatch.matmul(x, w, epilog=Epilog.RELU_AUX_BIAS, epilog_inputs={"bias": bias})

    # backward: dL/d(pre-activation) = dy * relu'(pre), and its column sums are dL/dbias — one call
    dy = xp.asarray(rng.standard_normal((batch, d_out), dtype=np.float32))
    eye = xp.asarray(np.eye(d_out, dtype=np.float32))
    grad, g = nvdispatch.matmul(dy, eye, epilog=Epilog.DRELU_BGRAD, epilog_inputs={"relu_aux": aux["relu_aux"]})

    pre = to_host(x) @ to_host(w) + to_host(bias)
    assert np.allclose(to_host(y), np.maximum(pre, 0), atol=1e-3)
    want = to_host(dy) * (pre > 0)
    assert np.allclose(to_host(grad), want, atol=1e-3)
    assert np.allclose(to_host(g["drelu_bgrad"]), want.sum(0), atol=1e-2)
    print("fused forward + backward match NumPy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
