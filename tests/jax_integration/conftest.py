"""The JAX integration tests share the float64 oracles of the matmul and FFT tests (tests/matmul,
tests/fft), and a fixture turning on JAX's 64-bit types where a test needs float64."""

from __future__ import annotations

import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("matmul", "fft"):
    _path = os.path.join(_HERE, "..", _sub)
    if _path not in sys.path:
        sys.path.insert(0, _path)

pytest.importorskip("jax")
pytest.importorskip("jax.experimental.buffer_callback")


@pytest.fixture
def x64():
    """JAX with float64 (jax_enable_x64) for the duration of a test."""
    import jax

    enable = getattr(jax, "enable_x64", None)
    if enable is None:  # JAX before enable_x64 became public
        from jax.experimental import enable_x64 as enable
    with enable(True):
        yield


@pytest.fixture(autouse=True)
def _placed(request):
    """Tests not marked ``gpu`` run on JAX's CPU device even where a GPU is JAX's default (the H200); the
    ``gpu`` ones on the GPU."""
    import jax

    kind = "gpu" if request.node.get_closest_marker("gpu") else "cpu"
    try:
        device = jax.devices(kind)[0]
    except RuntimeError:
        pytest.skip(f"JAX has no {kind} device")
    with jax.default_device(device):
        yield device
