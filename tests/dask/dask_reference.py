"""The tests' own float64 oracle: each epilog as a plain NumPy expression, written here, not imported from
nvdispatch (an error in the library's epilog table must turn these tests red). Also chunking strategies."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

_K = math.sqrt(2.0 / math.pi)


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(_K * (x + 0.044715 * x**3)))


def gelu_grad(x):
    t = np.tanh(_K * (x + 0.044715 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _K * (1.0 + 3 * 0.044715 * x * x)


def matmul_reference(a, b, c=None, alpha=1.0, beta=None, epilog="DEFAULT", inputs=None, bgrad_axis="n"):
    """``(result, aux)`` in float64 for 2-D/batched ``a``, ``b`` (NumPy arrays)."""
    inputs = inputs or {}
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    d = alpha * (a64 @ b64)
    if c is not None:
        d = d + (1.0 if beta is None else beta) * c.astype(np.float64)
    bias = inputs.get("bias")
    if bias is not None:
        d = d + bias.astype(np.float64)
    aux = {}
    if epilog in ("RELU", "RELU_BIAS"):
        d = np.maximum(d, 0)
    elif epilog in ("RELU_AUX", "RELU_AUX_BIAS"):
        aux["relu_aux"] = d > 0
        d = np.maximum(d, 0)
    elif epilog in ("GELU", "GELU_BIAS"):
        d = gelu(d)
    elif epilog in ("GELU_AUX", "GELU_AUX_BIAS"):
        aux["gelu_aux"] = d.copy()
        d = gelu(d)
    elif epilog in ("DRELU", "DRELU_BGRAD"):
        d = d * inputs["relu_aux"]
    elif epilog in ("DGELU", "DGELU_BGRAD"):
        d = d * gelu_grad(inputs["gelu_aux"].astype(np.float64))
    elif epilog == "BGRADA":
        aux["bgrada"] = a64.sum(axis=-1)
    elif epilog == "BGRADB":
        aux["bgradb"] = b64.sum(axis=-2)
    if epilog.endswith("_BGRAD"):
        name = "drelu_bgrad" if epilog.startswith("DRELU") else "dgelu_bgrad"
        aux[name] = d.sum(axis=-2) if bgrad_axis == "n" else d.sum(axis=-1, keepdims=True)
    return d, aux


@st.composite
def chunking(draw, length: int, max_blocks: int = 4):
    """A random chunking of an axis: uneven blocks, one-element blocks, or the whole axis."""
    if length <= 1:
        return (length,)
    n = draw(st.integers(1, min(max_blocks, length)))
    cuts = sorted(draw(st.sets(st.integers(1, length - 1), min_size=n - 1, max_size=n - 1)))
    edges = [0, *cuts, length]
    return tuple(b - a for a, b in zip(edges, edges[1:]))


def close(got, want, dtype, what="result"):
    tol = {"float32": 2e-4, "float64": 1e-10, "complex64": 2e-4, "complex128": 1e-10}.get(str(dtype), 0)
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=what)


def slow_copy(x, seconds: float):
    """A block task that takes a while (so a worker can be killed while tasks are in flight)."""
    import time

    time.sleep(seconds)
    return x.copy()


def exit_soon():
    """End this (worker) process abruptly a moment after returning, as a crash would."""
    import os
    import threading

    threading.Timer(0.05, os._exit, (1,)).start()
