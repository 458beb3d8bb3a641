"""The Torch integration's light part: which calls go through the ``nvdispatch::`` operators, and what Dynamo
traces in place of a public function. Nothing of Torch is imported here; :mod:`.torch_ops` (which registers the
operators) is imported the first time a call needs it.

* **Compiled programs.** Each public entry point is marked for Dynamo (``function._torchdynamo_inline``, the
  attribute through which Dynamo traces a wrapper's own version of a function): Dynamo traces
  ``torch_ops.ENTRIES[name]`` instead of the eager route, which calls the operators (one node each in the
  graph, with fake kernels and autograd formulas). Marking costs nothing when Dynamo is not tracing.
* **Eager calls.** On a call's full path (:mod:`nvdispatch._integration_hooks`), a Torch call goes through the
  operators when autograd records it (an operand requires grad and grad mode is on: the operators' backward
  formulas run nvdispatch's own backward epilogs) or when Torch traces a program without Dynamo
  (``torch.export`` in its default, non-strict mode: operands are fake tensors). Every other eager call keeps
  the route as it is: its cached path is never touched, so its host cost is unchanged. Calls with ``stream=``
  keep the route too (autograd then records the Torch executor's ops, as before the operators existed), and so
  do calls under a coercing backend (``set_backend(..., coerce=True)``: the caller asked another framework).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from .._backends import any_coercing
from .torch_reentry import inside_kernel

__all__ = ["TorchIntegration"]


def _traced(name: str) -> Callable[..., Any]:
    def traced(*args, **kwargs):
        from . import torch_ops  # registers the operators (Dynamo runs imports for real)

        return torch_ops.ENTRIES[name](*args, **kwargs)

    traced.__name__ = traced.__qualname__ = f"{name}_under_torch_compile"
    return traced


def _tensor_operands(operation: str, arguments: tuple) -> list | None:
    """The tensor operands of a call (None when one is not a Torch tensor, or a stream is given: the route's)."""
    torch = sys.modules["torch"]
    if operation == "matmul":
        a, b, c, _, _, _, inputs, _, _, stream, scales = arguments
        operands = [a, b] + ([c] if c is not None else [])
        if isinstance(inputs, dict):
            operands += [v for v in inputs.values() if v is not None]
        if isinstance(scales, dict):
            operands += [v for v in scales.values() if isinstance(v, torch.Tensor)]
    elif operation == "fft":
        operands, stream = [arguments[1]], arguments[-1]
    else:  # convolve
        operands, stream = [arguments[0], arguments[1]], arguments[-1]
    if stream is not None or not all(isinstance(x, torch.Tensor) for x in operands):
        return None
    return operands


class TorchIntegration:
    """Torch tensors: the operators of :mod:`.torch_ops` under ``torch.compile``, ``torch.export`` and autograd."""

    name = "torch"
    _ops = None  # nvdispatch.integrations.torch_ops, once imported

    def claims(self, cls: type) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and issubclass(cls, torch.Tensor)

    def mark(self, name: str, function: Callable[..., Any]) -> None:
        function._torchdynamo_inline = _traced(name)

    def take(self, operation: str, *arguments: Any) -> Any:
        """The result of an eager call that must go through the operators, else ``NotImplemented``."""
        if inside_kernel():
            return NotImplemented
        operands = _tensor_operands(operation, arguments)
        if operands is None:
            return NotImplemented
        torch = sys.modules["torch"]
        recorded = torch.is_grad_enabled() and any(x.requires_grad for x in operands)
        if not recorded and not torch.compiler.is_compiling():
            return NotImplemented
        if recorded and any_coercing():  # the caller asked another framework to run it: its result, as before
            return NotImplemented
        ops = self._ops
        if ops is None:
            from . import torch_ops as ops  # registers the operators

            self._ops = ops
        return ops.take(operation, arguments)
