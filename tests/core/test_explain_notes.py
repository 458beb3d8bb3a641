"""explain() tells what a call will not do as asked: a compute_type the CPU executors do not apply."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch


def test_numpy_notes_an_ignored_compute_type():
    a = np.ones((4, 3), np.float32)
    e = nvdispatch.explain(a, a.T, options={"compute_type": nvdispatch.ComputeType.COMPUTE_32F_FAST_16F})
    assert any("compute_type COMPUTE_32F_FAST_16F not applied" in s and "float32" in s for s in e.steps)
    assert not any("compute_type" in s for s in nvdispatch.explain(a, a.T).steps)


def test_torch_notes_an_ignored_compute_type():
    torch = pytest.importorskip("torch")
    t = torch.ones(4, 3)
    e = nvdispatch.explain(t, t.T, epilog="RELU", options={"compute_type": "COMPUTE_32F_FAST_TF32"})
    assert e.executor == "torch"
    assert any("compute_type COMPUTE_32F_FAST_TF32 not applied" in s for s in e.steps)


def test_explain_shows_its_parameters():
    import inspect

    params = inspect.signature(nvdispatch.explain).parameters
    assert {"epilog", "epilog_inputs", "options", "preferences", "stream"} <= set(params)
    assert "Examples" in nvdispatch.explain.__doc__
