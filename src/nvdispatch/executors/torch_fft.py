"""FFT through ``torch.fft`` for Torch tensors on the CPU and on CUDA devices.

On CUDA the transform is queued on the tensor's current stream, or on ``stream=`` when given; Torch keeps
its own cuFFT plan cache per device, so the plan here only holds the resolved call. Nothing synchronizes.

The result is C-contiguous, as the ``nvdispatch::fft`` operator's (:mod:`nvdispatch.integrations.torch_layouts`)
and every other executor's: ``torch.fft`` lays its result out after the input's strides and the transformed
axes (a transform along a leading axis, or of a transposed tensor, comes back strided), and how depends on the
device and build (MKL or pocketfft on the CPU, cuFFT), so the plan copies where its layout differs.
"""

from __future__ import annotations

import functools

from .._fft_problem import FFTProblem
from .._strides import c_strides
from .torch import stream_context


def decline(problem: FFTProblem) -> str | None:
    if problem.long_double:
        return "long double is computed on the CPU only (NumPy executor, scipy.fft's pocketfft)"
    return None


def strategies(problem: FFTProblem) -> tuple[str, ...]:
    return ("torch.fft",)


def plan(problem: FFTProblem, strategy: str, tuning=None):
    return TorchFFTPlan(problem, strategy)


class TorchFFTPlan:
    needs_release = False  # holds nothing to free: calls need not pin it (see the plan cache)

    def __init__(self, problem: FFTProblem, strategy: str):
        import torch

        self.problem = problem
        self.strategy = strategy
        self.fn = getattr(torch.fft, problem.func)
        p = problem
        if p.ndim_api:
            self.kwargs = {"s": p.lengths, "dim": p.axes, "norm": p.norm}
        else:
            self.kwargs = {"n": p.lengths[0], "dim": p.axes[0], "norm": p.norm}
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        on = "the tensor's current stream (or stream=)" if p.device.kind == "cuda" else "the CPU"
        self.steps = (f"torch.fft.{p.func}(x, {args}) on {on}", p.describe())
        self.direct = _direct_call(self.fn, p, self.kwargs)

    def execute(self, operands, stream=None):
        x = operands["x"]
        if self.problem.empty:  # torch.fft (MKL on the CPU) rejects zero-size batches
            return _empty_result(x, self.problem)
        with stream_context(stream, self.problem.device):
            out = self.fn(x, **self.kwargs)
            # torch.fft.ihfft returns a lazily conjugated view; materialise it so callers get a plain tensor
            out = out.resolve_conj() if out.is_conj() else out
            return out.contiguous()

    def release(self) -> None:
        pass


def _direct_call(fn, p: FFTProblem, kwargs: dict):
    """The Plan protocol's direct call, ``direct(x)``: ``execute({"x": x}, None)`` without its steps, the lengths
    left out where they are the input's (a C2C or R2C transform that pads or trims nothing): torch.fft then skips
    their handling. None for an empty problem (``execute`` makes the result) and for ``ihfft``, whose result
    ``execute`` materialises. Nothing here refers to the plan (no reference cycle)."""
    if p.empty or p.func in ("hfft", "ihfft"):
        return None
    if p.kind in ("c2c", "r2c") and not p.needs_resize:
        kwargs = {k: v for k, v in kwargs.items() if k not in ("s", "n")}
    call = functools.partial(fn, **kwargs)
    if _dense_result(p):
        return call
    return lambda x: call(x).contiguous()


def _dense_result(p: FFTProblem) -> bool:
    """Whether ``torch.fft`` gives a C-contiguous result for operands of ``p``'s layout (no copy needed): a
    C-contiguous operand transformed along its trailing axes, in order (extents of 1 have no stride to keep)."""
    trailing = tuple(range(len(p.shape) - len(p.axes), len(p.shape)))
    if tuple(p.axes) != trailing:
        return False
    return p.strides is None or all(s == c for s, c, e in zip(p.strides, c_strides(p.shape), p.shape) if e > 1)


def _empty_result(x, p: FFTProblem):
    """The empty result of a transform of a zero-size tensor (connected to ``x``'s graph under autograd)."""
    import torch

    out = torch.zeros(p.out_shape, dtype=getattr(torch, p.result_dtype), device=x.device)
    if x.requires_grad and torch.is_grad_enabled():
        out = out + (x.real if x.is_complex() else x).sum() * 0
    return out
