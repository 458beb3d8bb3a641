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


def test_torch_notes_how_it_applies_a_compute_type():
    torch = pytest.importorskip("torch")
    t = torch.ones(4, 3)
    e = nvdispatch.explain(t, t.T, epilog="RELU", options={"compute_type": "COMPUTE_32F_FAST_TF32"})
    assert e.executor == "torch"  # float32: Torch's own precision setting, raised to at least the one asked
    assert any(
        s.startswith("options.compute_type COMPUTE_32F_FAST_TF32: Torch's own matmul, its float32") for s in e.steps
    )
    h = t.to(torch.float16)  # Torch has no setting for a float16 product's accumulation: noted as not applied
    e = nvdispatch.explain(h, h.T, options={"compute_type": "COMPUTE_16F"})
    assert any("compute_type COMPUTE_16F not applied" in s for s in e.steps)


def test_explain_shows_its_parameters():
    import inspect

    params = inspect.signature(nvdispatch.explain).parameters
    assert {"epilog", "epilog_inputs", "options", "preferences", "stream"} <= set(params)
    assert "Examples" in nvdispatch.explain.__doc__


def test_a_requested_backend_that_declines_says_so(caplog):
    from nvdispatch._cuda import runtime

    if runtime.unavailable() is None:
        pytest.skip("a GPU is present: the cuda executor takes the call")
    a = np.ones((3, 3))
    nvdispatch.plan_cache.clear()
    with caplog.at_level("INFO", logger="nvdispatch"), nvdispatch.set_backend("cuda"):
        e = nvdispatch.explain(a, a)
        nvdispatch.matmul(a, a + 1)
    assert e.executor == "numpy" and e.declined and e.declined[0][0] == "cuda"
    assert "declined by cuda" in str(e)
    assert any("backend 'cuda' was asked for but declined" in r.getMessage() for r in caplog.records)
    with pytest.raises(nvdispatch.errors.NoExecutorError, match="cuda"):
        with nvdispatch.set_backend("cuda", only=True):
            nvdispatch.matmul(a, a + 2)
