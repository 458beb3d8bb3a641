"""Train a two-layer MLP with fused epilogs: forward RELU_AUX_BIAS, backward DRELU_BGRAD.

Every linear layer is one nvdispatch call; the backward pass reuses the ReLU mask the forward pass
returned, and gets the bias gradient from the same call. Runs on NumPy (and on Torch if installed).

Needs: the base install (``pip install -e .``); the Torch run needs ``pip install 'nvdispatch[torch]'``.
"""

from __future__ import annotations

import argparse

import numpy as np

import nvdispatch
from nvdispatch import Epilog


def train(xp_array, steps: int = 60, lr: float = 0.05) -> list[float]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 16))
    true_w = rng.standard_normal((16, 1))
    y = np.tanh(x @ true_w)
    w1, b1 = rng.standard_normal((16, 32)) * 0.3, np.zeros(32)
    w2 = rng.standard_normal((32, 1)) * 0.3
    x, y, w1, b1, w2 = (xp_array(v) for v in (x, y, w1, b1, w2))
    losses = []
    for _ in range(steps):
        # forward: h = relu(x @ w1 + b1), keeping the mask for the backward pass
        h, aux = nvdispatch.matmul(x, w1, epilog=Epilog.RELU_AUX_BIAS, epilog_inputs={"bias": b1})
        pred = nvdispatch.matmul(h, w2)
        err = pred - y
        losses.append(float((err**2).mean()))
        # backward: dpred -> dw2, then dz = (dpred @ w2.T) * relu'(.) and db1 in one call
        dpred = err * (2.0 / err.shape[0])
        dw2 = nvdispatch.matmul(h.T, dpred)
        dz, grads = nvdispatch.matmul(
            dpred, w2.T, epilog=Epilog.DRELU_BGRAD, epilog_inputs={"relu_aux": aux["relu_aux"]}
        )
        dw1 = nvdispatch.matmul(x.T, dz)
        w1 = w1 - lr * dw1
        b1 = b1 - lr * grads["drelu_bgrad"]
        w2 = w2 - lr * dw2
    return losses


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60, help="training steps (default: %(default)s)")
    args = ap.parse_args()
    losses = train(lambda v: v, steps=args.steps)
    print(f"numpy: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    assert losses[-1] < 0.5 * losses[0], "training did not converge"
    try:
        import torch
    except ImportError:
        torch = None
        print("Torch run skipped: it needs pip install 'nvdispatch[torch]'")
    if torch is not None:
        t_losses = train(torch.from_numpy, steps=args.steps)
        print(f"torch: loss {t_losses[0]:.4f} -> {t_losses[-1]:.4f}")
        assert np.allclose(losses, t_losses, rtol=1e-9), "NumPy and Torch executors disagree"
