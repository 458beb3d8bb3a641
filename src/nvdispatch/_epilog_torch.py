"""The epilog step vocabulary (see ``_epilog.apply_inplace``) on Torch tensors, CPU or CUDA.

Shared by the Torch executor and the GPU executors' unfused fallback on Torch tensors.
"""

from __future__ import annotations

import math

__all__ = ["TorchEpilogOps", "TorchPlainOps", "TORCH_INPLACE", "TORCH_PLAIN"]

#: GELU tanh-approximation constants, as in ``_epilog``
_K = math.sqrt(2.0 / math.pi)
_C = 0.044715


class TorchEpilogOps:
    """The epilog step vocabulary on tensors, in place."""

    @staticmethod
    def add_(d, x):
        d.add_(x.to(d.dtype))

    @staticmethod
    def relu_(d):
        d.clamp_min_(0)

    @staticmethod
    def positive_mask(d):
        return d > 0

    @staticmethod
    def gelu_(d):
        import torch

        d.copy_(torch.nn.functional.gelu(d, approximate="tanh"))

    @staticmethod
    def copy(d):
        return d.clone()

    @staticmethod
    def mask_(d, mask):
        d.mul_(mask)

    @staticmethod
    def mul_(d, x):
        d.mul_(x)

    @staticmethod
    def gelu_grad(x):
        import torch

        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        t = torch.tanh(_K * (xf + _C * xf**3))
        g = 0.5 * (1.0 + t) + 0.5 * xf * (1.0 - t * t) * _K * (1.0 + 3.0 * _C * xf * xf)
        return g.to(x.dtype)

    @staticmethod
    def sum(x, axis, keepdims):
        return x.sum(dim=axis, keepdim=keepdims)


class TorchPlainOps(TorchEpilogOps):
    """Out-of-place variants, each step a separate Torch op returning a new tensor: strategy ``plain``, and
    any call that autograd records (in-place steps would overwrite tensors autograd saved)."""

    @staticmethod
    def add_(d, x):
        return d + x.to(d.dtype)

    @staticmethod
    def relu_(d):
        import torch

        return torch.relu(d) if d.dtype.is_floating_point else d.clamp_min(0)

    @staticmethod
    def gelu_(d):
        import torch

        return torch.nn.functional.gelu(d, approximate="tanh")

    @staticmethod
    def mask_(d, mask):
        return d * mask

    @staticmethod
    def mul_(d, x):
        return d * x


TORCH_INPLACE = TorchEpilogOps()
TORCH_PLAIN = TorchPlainOps()
