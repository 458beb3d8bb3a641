"""The epilog step vocabulary (see ``_epilog.apply_steps``) on Torch tensors, CPU or CUDA.

One vocabulary, two modes: in place (``TORCH_INPLACE``) and out of place (``TORCH_PLAIN``: each step a separate
Torch op returning a new tensor; strategy ``plain``, and any call autograd records, since in-place steps would
overwrite tensors autograd saved). Shared by the Torch executor and the GPU executors' unfused fallback on
Torch tensors. Both modes give the semantics documented in ``_epilog``.
"""

from __future__ import annotations

from ._epilog import gelu_tanh_grad

__all__ = ["TorchEpilogOps", "TORCH_INPLACE", "TORCH_PLAIN"]


def _torch():
    import torch

    return torch


#: integer dtypes of the floating ones' sizes (masks are applied to the bits: exact zeros, whatever the value)
_BITS = {2: "int16", 4: "int32", 8: "int64"}


class TorchEpilogOps:
    """The epilog steps on tensors; ``inplace`` says whether elementwise steps write into ``d``. Every step returns
    the result (``d`` itself in place)."""

    def __init__(self, inplace: bool):
        self.inplace = inplace

    def add_(self, d, x):
        x = x.to(d.dtype)
        return d.add_(x) if self.inplace else d + x

    def relu_(self, d):
        # clamp and relu keep NaN, as cuBLASLt's RELU epilogue (see _epilog)
        if self.inplace:
            return d.clamp_min_(0)
        return _torch().relu(d) if d.is_floating_point() else d.clamp_min(0)

    @staticmethod
    def positive_mask(d):
        return d > 0

    def gelu_(self, d):
        # Torch's own kernel of the same tanh approximation (fast, and autograd knows it)
        gelu = _torch().nn.functional.gelu(d, approximate="tanh")
        return d.copy_(gelu) if self.inplace else gelu

    @staticmethod
    def copy(d):
        return d.clone()

    def mask_(self, d, mask):
        # 0 where the mask is clear, whatever d holds there (inf * 0 would be NaN), as Torch's relu backward
        if not self.inplace:
            return _torch().where(mask, d, 0)
        bits = d.view(getattr(_torch(), _BITS[d.element_size()])) if d.is_floating_point() else d
        bits.mul_(mask)  # on the bits: exact zeros (and faster than a float multiply by a bool mask)
        return d

    def mul_(self, d, x):
        return d.mul_(x) if self.inplace else d * x

    @staticmethod
    def gelu_grad(x):
        torch = _torch()
        wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        return gelu_tanh_grad(wide, torch).to(x.dtype)

    @staticmethod
    def sum(x, axis, keepdims):
        torch = _torch()
        if x.dtype in (torch.float16, torch.bfloat16):  # accumulate in float32, round once
            return x.sum(dim=axis, keepdim=keepdims, dtype=torch.float32).to(x.dtype)
        return x.sum(dim=axis, keepdim=keepdims)


TORCH_INPLACE = TorchEpilogOps(inplace=True)
TORCH_PLAIN = TorchEpilogOps(inplace=False)
