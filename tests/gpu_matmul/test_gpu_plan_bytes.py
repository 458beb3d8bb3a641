"""The plan cache's byte bound counts a cuBLASLt plan's workspaces as they grow (run on a GPU machine)."""

from __future__ import annotations

import pytest

import nvdispatch
from nvdispatch import plan_cache

pytestmark = pytest.mark.gpu


def test_a_second_streams_workspace_counts_towards_the_bound_at_once():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    plan_cache.clear()
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.float32)
    bias = torch.randn(1024, device="cuda")
    kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}}
    with nvdispatch.set_backend("cuda", only=True):
        nvdispatch.matmul(a, a, **kw)
        before = plan_cache.nbytes
        plans = plan_cache.plans()
        held = [p.workspace_bytes for p in plans]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())  # (a, bias and the first call are queued there: Torch's rule)
        with torch.cuda.stream(side):
            got = nvdispatch.matmul(a, a, **kw)
        side.synchronize()
    grew = sum(p.workspace_bytes for p in plans) - sum(held)
    assert plan_cache.nbytes == before + grew  # counted when allocated, not at the next insertion
    torch.testing.assert_close(got, torch.relu(a @ a + bias), rtol=1e-2, atol=1e-2)
