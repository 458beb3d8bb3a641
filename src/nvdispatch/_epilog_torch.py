"""The epilog step vocabulary (see ``_epilog.apply_steps``) on Torch tensors, CPU or CUDA.

One vocabulary, two modes: in place (``TORCH_INPLACE``) and out of place (``TORCH_PLAIN``: each step a separate
Torch op returning a new tensor; strategy ``plain``, and any call autograd records, since in-place steps would
overwrite tensors autograd saved). Shared by the Torch executor and the GPU executors' unfused fallback on
Torch tensors. Both modes give the semantics documented in ``_epilog``.
"""

from __future__ import annotations

from ._epilog import gelu_tanh_grad

__all__ = ["TorchEpilogOps", "TORCH_INPLACE", "TORCH_PLAIN", "relu_inplace", "nan_to_zero_"]


def _torch():
    import torch

    return torch


_INF = float("inf")
#: integer dtypes of the floating ones' sizes (masks are applied to the bits: exact zeros, whatever the value)
_BITS = {2: "int16", 4: "int32", 8: "int64"}


def nan_to_zero_(d):
    """NaN -> 0 in ``d``, in place, infinities kept; returns ``d``."""
    return d.nan_to_num_(nan=0.0, posinf=_INF, neginf=-_INF) if d.is_floating_point() else d


def relu_inplace(d):
    """``d = relu(d)`` in place with NaN -> 0 (as cuBLASLt's RELU epilogue); returns ``d``. Torch's ReLU and
    clamp keep NaN and its fmax is not vectorised on the CPU, so: clamp, then NaN -> 0."""
    return nan_to_zero_(d.clamp_min_(0))


class TorchEpilogOps:
    """The epilog steps on tensors; ``inplace`` says whether elementwise steps write into ``d``. Every step returns
    the result (``d`` itself in place)."""

    def __init__(self, inplace: bool):
        self.inplace = inplace

    def add_(self, d, x):
        x = x.to(d.dtype)
        return d.add_(x) if self.inplace else d + x

    def relu_(self, d):
        if self.inplace:
            return relu_inplace(d)
        if not d.is_floating_point():
            return d.clamp_min(0)
        return _torch().relu(d).nan_to_num(nan=0.0, posinf=_INF)  # NaN -> 0; autograd knows both ops

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
