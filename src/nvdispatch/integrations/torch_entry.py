"""The Torch integration's light part: which calls go through the ``nvdispatch::`` operators, and what Dynamo
traces in place of a public function. Nothing of Torch is imported here; :mod:`.torch_ops` (which registers the
operators) is imported the first time a call needs it.

* **Compiled programs.** Each public entry point is marked for Dynamo (``function._torchdynamo_inline``, the
  attribute through which Dynamo traces a wrapper's own version of a function): Dynamo traces
  ``torch_ops.ENTRIES[name]`` instead of the eager route, which calls the operators (one node each in the
  graph, with fake kernels and autograd formulas). Marking costs nothing when Dynamo is not tracing.
* **Eager calls.** On a call's full path (:mod:`nvdispatch._traced`: a call the route's caches serve is never
  offered), a Torch call goes through the operators when autograd records it (an operand requires grad and grad
  mode is on: the operators' backward formulas run nvdispatch's own backward epilogs) or when Torch traces a
  program without Dynamo (``torch.export`` in its default, non-strict mode: operands are fake tensors), and when an
  operand is a meta tensor (the operators' meta kernels: the result's shape, dtype and strides). Every other
  eager call keeps the route as it is: its cached path is never touched, so its host cost is unchanged. Calls with
  ``stream=`` keep the route too (autograd then records the Torch executor's ops, as before the operators
  existed), and so do calls under a coercing backend (``set_backend(..., coerce=True)``: the caller asked another
  framework). A recorded matmul's repeats reach the operator's formula from the route's hit (the plan the
  integration keeps under the call's key, :mod:`.torch_recorded`), not through this handler.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from .._backends import any_coercing
from .._traced import add_entry_marker, register_traced
from .torch_reentry import inside_kernel

__all__ = ["install_torch", "mark"]

_ops = None  # nvdispatch.integrations.torch_ops, once imported


def _torch_ops():
    global _ops
    if _ops is None:
        from . import torch_ops  # registers the operators

        _ops = torch_ops
    return _ops


def _traced(name: str) -> Callable[..., Any]:
    def traced(*args, **kwargs):
        from . import torch_ops  # registers the operators (Dynamo runs imports for real)

        return torch_ops.ENTRIES[name](*args, **kwargs)

    traced.__name__ = traced.__qualname__ = f"{name}_under_torch_compile"
    return traced


def mark(name: str, function: Callable[..., Any]) -> None:
    """Have Dynamo trace the Torch operators' version of public function ``name`` in its place."""
    function._torchdynamo_inline = _traced(name)


def _taken(operands: list, stream) -> bool:
    """Whether an eager call on ``operands`` goes through the operators (see the module notes)."""
    torch = sys.modules["torch"]
    if inside_kernel() or stream is not None or not all(isinstance(x, torch.Tensor) for x in operands):
        return False
    if torch._C._are_functorch_transforms_active() or torch.autograd.forward_ad._current_level >= 0:
        return True  # torch.func transforms, forward-mode AD: the operators' batching rules and formulas
    if any(x.is_meta for x in operands):
        return True  # no executor computes on meta tensors: the operators' meta kernels give the result's layout
    recorded = torch.is_grad_enabled() and any(x.requires_grad for x in operands)
    if recorded:
        return not any_coercing()  # under a coercing backend the caller asked another framework: its result
    return torch.compiler.is_compiling()


def _take_matmul(
    a, b, c=None, *, alpha, beta, epilog, epilog_inputs, options, preferences, stream, quantization_scales,
    call_key=None,
):  # fmt: skip
    operands = [x for x in (a, b, c) if x is not None]
    if isinstance(epilog_inputs, dict):
        operands += [v for v in epilog_inputs.values() if v is not None]
    if isinstance(quantization_scales, dict):
        operands += [v for v in quantization_scales.values() if hasattr(v, "requires_grad")]
    if not _taken(operands, stream):
        return NotImplemented
    return _torch_ops().call_matmul(
        a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, quantization_scales, call_key
    )


def _take_fft(func, x, *, n, axis, s, axes, norm, stream):
    if not _taken([x], stream):
        return NotImplemented
    return _torch_ops().call_fft(func, x, n, axis, s, axes, norm)


def _take_convolve(x, h, *, n, axis, stream):
    if not _taken([x, h], stream):
        return NotImplemented
    return _torch_ops().call_convolve(x, h, n, axis)


def install_torch() -> None:
    """Install the Torch handlers and mark the entry points for Dynamo (done when nvdispatch is imported)."""
    for operation, handler in (("matmul", _take_matmul), ("fft", _take_fft), ("fft_convolve", _take_convolve)):
        register_traced("torch", operation, handler, all_arrays=True)
    add_entry_marker(mark)
