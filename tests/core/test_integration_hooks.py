"""The joints between the public functions and the framework integrations (nvdispatch._traced): every announced
entry point reaches every installed entry marker, whatever the order; a handler offered every call of a framework's
arrays may decline it, and placeholders of a traced program go to their staging handler first."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
import nvdispatch.fft
from nvdispatch import _traced


def test_entry_points_reach_markers_installed_before_and_after(monkeypatch):
    monkeypatch.setattr(_traced, "_entries", dict(_traced._entries))
    monkeypatch.setattr(_traced, "_markers", _traced._markers)
    marked = {}
    _traced.add_entry_marker(lambda name, fn: marked.__setitem__(name, fn))
    assert marked["matmul"] is nvdispatch.matmul and marked["rfft2"] is nvdispatch.fft.rfft2
    late = lambda x: x  # noqa: E731
    assert _traced.announce("late", late) is late and marked["late"] is late


def test_a_handler_offered_every_call_may_decline_it(monkeypatch):
    monkeypatch.setattr(_traced, "_offered", {})
    seen = []

    def handler(a, b, c=None, **kwargs):
        seen.append(kwargs["epilog"])
        return "taken" if kwargs["epilog"] == "RELU" else NotImplemented

    _traced.register_traced("numpy", "matmul", handler, all_arrays=True)
    a = np.ones((2, 2))
    assert _traced.traced_handler("matmul", (a, None)) is handler
    assert _traced.traced_handler("fft", (a,)) is None
    nvdispatch.plan_cache.clear()  # the offer is made on the route's miss path
    assert nvdispatch.matmul(a, a + 1, epilog="RELU") == "taken"
    np.testing.assert_allclose(nvdispatch.matmul(a, a + 2, epilog="GELU"), nvdispatch.matmul(a, a + 2, epilog="GELU"))
    assert seen[:2] == ["RELU", "GELU"]
    _traced.unregister_traced("numpy", "matmul")
    assert _traced.traced_handler("matmul", (a,)) is None


def test_the_torch_integration_marks_every_transform():
    pytest.importorskip("torch")
    for name in ("matmul", "fft", "ifft", "fftn", "ifftn", "rfft", "irfft", "rfftn", "irfftn", "hfft", "ihfft",
                 "fft2", "ifft2", "rfft2", "irfft2", "convolve"):  # fmt: skip
        function = nvdispatch.matmul if name == "matmul" else getattr(nvdispatch.fft, name)
        assert callable(getattr(function, "_torchdynamo_inline", None)), name
    assert ("torch", "matmul") in _traced._offered
