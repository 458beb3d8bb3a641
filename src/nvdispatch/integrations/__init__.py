"""Framework integrations: nvdispatch inside compiled programs.

:mod:`.torch_entry` joins Torch: ``torch.compile`` (Dynamo) traces nvdispatch's public functions as
``torch.library`` operators in the ``nvdispatch::`` namespace (:mod:`.torch_ops`), ``torch.export`` records
them, and eager calls that autograd records run through them (fused backward formulas, :mod:`.torch_autograd`).

Installing costs nothing: no framework is imported here; the operators are registered the first time Torch
needs them (an eager call autograd records, or Dynamo tracing a call). Nothing below this package imports
it: the public functions announce themselves to :mod:`nvdispatch._integration_hooks`, which shows them to the
integrations installed here.
"""

from __future__ import annotations

from .._integration_hooks import install
from .torch_entry import TorchIntegration

__all__ = ["TorchIntegration"]

install(TorchIntegration())
