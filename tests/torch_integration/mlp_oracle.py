"""The float64 NumPy oracle of an MLP chain (``h_i = act(h_{i-1} @ W_i^T + b_i)``, no activation after the last
layer, weights stored as Linear's ``(out, in)``): its output and the gradients of ``sum(y * g)``."""

from __future__ import annotations

import math

import numpy as np

_C = math.sqrt(2 / math.pi)


def activation(z: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(act(z), act'(z))`` for ``"relu"`` or ``"gelu"`` (the tanh approximation)."""
    if name == "relu":
        return np.maximum(z, 0), (z > 0).astype(np.float64)
    t = np.tanh(_C * (z + 0.044715 * z**3))
    return 0.5 * z * (1 + t), 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _C * (1 + 3 * 0.044715 * z * z)


def forward(x, ws, bs, name: str) -> np.ndarray:
    """The chain's output."""
    h = x
    for i, (w, b) in enumerate(zip(ws, bs)):
        z = h @ w.T + b
        h = activation(z, name)[0] if i < len(ws) - 1 else z
    return h


def chain(x, ws, bs, g, name: str):
    """``(y, dx, dWs, dbs)`` of ``sum(y * g)``."""
    hs, derivs, h = [x], [], x
    for i, (w, b) in enumerate(zip(ws, bs)):
        z = h @ w.T + b
        if i < len(ws) - 1:
            h, d = activation(z, name)
            hs.append(h)
            derivs.append(d)
        else:
            h = z
    dz, dws, dbs = g, [None] * len(ws), [None] * len(ws)
    for i in range(len(ws) - 1, -1, -1):
        dws[i], dbs[i] = dz.T @ hs[i], dz.sum(0)
        dh = dz @ ws[i]
        dz = dh * derivs[i - 1] if i else dh
    return h, dz, dws, dbs
