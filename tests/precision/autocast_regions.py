"""An autocast region for the precision tests, also for CUDA where no GPU is."""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")


@contextlib.contextmanager
def autocast_region(device_type, dtype):
    """``torch.autocast(device_type, dtype)``, also for CUDA where no GPU is (``torch.autocast`` turns itself off
    there; the thread's autocast state is what nvdispatch reads)."""
    if device_type != "cuda" or torch.cuda.is_available():
        with torch.autocast(device_type, dtype=dtype):
            yield
        return
    saved = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", saved[0])
        torch.set_autocast_dtype("cuda", saved[1])
