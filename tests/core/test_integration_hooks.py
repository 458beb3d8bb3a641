"""The joints between the public functions and the framework integrations (nvdispatch._integration_hooks):
every announced entry point reaches every installed integration, whatever the order, and the takers are looked up
once per class."""

from __future__ import annotations

import numpy as np

import nvdispatch
import nvdispatch.fft
from nvdispatch import _integration_hooks as hooks


class Recorder:
    name = "recorder"

    def __init__(self):
        self.marked, self.asked, self.taken = {}, [], []

    def claims(self, cls):
        self.asked.append(cls)
        return cls is Marker

    def mark(self, name, function):
        self.marked[name] = function

    def take(self, operation, *arguments):
        self.taken.append(operation)
        return NotImplemented


class Marker:
    pass


def test_entry_points_reach_integrations_installed_before_and_after(monkeypatch):
    monkeypatch.setattr(hooks, "_entries", dict(hooks._entries))
    monkeypatch.setattr(hooks, "_installed", hooks._installed)
    monkeypatch.setattr(hooks, "_takers", {})
    rec = Recorder()
    hooks.install(rec)
    assert rec.marked["matmul"] is nvdispatch.matmul and rec.marked["rfft2"] is nvdispatch.fft.rfft2
    late = lambda x: x  # noqa: E731
    assert hooks.announce("late", late) is late and rec.marked["late"] is late
    assert rec in hooks.integrations()


def test_takers_are_found_once_per_class(monkeypatch):
    monkeypatch.setattr(hooks, "_installed", ())
    monkeypatch.setattr(hooks, "_takers", {})
    rec = Recorder()
    hooks.install(rec)
    assert hooks.taker_for(np.ones(2)) is None and hooks.taker_for(np.ones(3)) is None
    assert hooks.taker_for(Marker()) == rec.take
    assert rec.asked.count(np.ndarray) == 1 and rec.asked.count(Marker) == 1


def test_the_torch_integration_is_installed_and_marks_every_transform():
    names = {i.name for i in hooks.integrations()}
    assert "torch" in names
    for name in ("matmul", "fft", "ifft", "fftn", "ifftn", "rfft", "irfft", "rfftn", "irfftn", "hfft", "ihfft",
                 "fft2", "ifft2", "rfft2", "irfft2", "convolve"):  # fmt: skip
        function = nvdispatch.matmul if name == "matmul" else getattr(nvdispatch.fft, name)
        assert callable(getattr(function, "_torchdynamo_inline", None)), name
