"""What the ``nvdispatch::`` operators return, from their inputs' metadata: the one rule their fake kernels
follow and their real kernels hold to.

The problem of a call is built by the public functions' own builders (``build_problem``, ``build_fp8_problem``,
``build_fft_problem``, the convolve problem) on the tensors' metadata, fake or real: shapes and dtypes of the
outputs are theirs, and a call they reject is rejected at trace time with the same typed error.

The public functions' results depend on the executor in places (cuBLASLt returns a column-major result for a
bias along M, ``gelu_aux`` in a padded buffer and ``relu_aux`` as a bit mask; Torch's ops contiguous tensors and
a boolean mask). An operator's outputs must not: a graph is traced once, with fake tensors, and runs under the
backend state current when it runs. So every output has one layout, here:

* C-contiguous (offset 0), with the shape and dtype of the public function's output;
* ``relu_aux``: on the CPU the boolean mask of the result's shape (the CPU executors' format); on CUDA cuBLASLt's
  bit mask in its row orientation, ``uint8`` of shape ``(..., m, ceil(n / 128) * 16)`` (the cuda executor's format
  for a bias along N, which DRELU takes on every GPU executor), its padding bits (columns ``n`` and up) zero:
  cuBLASLt leaves them as the allocator gave them, and an output must not depend on what memory held before;
* bias gradients ``(..., n)``, or ``(..., m, 1)`` with ``bgrad_axis="m"``; ``bgrada`` / ``bgradb`` the operand's
  own batch dimensions and ``(m,)`` / ``(n,)``; ``result_amax`` a 0-d float32 tensor.

:func:`conform` brings a real output to that layout, copying only where the executor's layout differs (a call
without aux outputs needs only :func:`dense`: its result's shape and dtype are the public function's).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from typing import Any

from .._cuda.lt_layout import relu_aux_ld_bits
from .._detect import common_placement, detect
from .._epilog import OUTPUTS, spec_of
from .._fft_conventions import framework_promotion
from .._fft_convolve import ConvolveProblem
from .._fft_convolve import prepare as prepare_convolve
from .._fft_problem import FFTProblem, build_fft_problem
from .._fp8 import build_fp8_problem, wants_fp8
from .._matmul_problem import MatmulProblem, as_options, as_preferences, build_problem

__all__ = [
    "OutputSpec",
    "matmul_problem",
    "matmul_outputs",
    "fft_problem",
    "fft_output",
    "convolve_problem",
    "convolve_output",
    "empty_outputs",
    "conform",
    "dense",
]


@dataclass(frozen=True)
class OutputSpec:
    """One output of an operator: its name (``"result"`` or the public function's aux key), shape, dtype name,
    and kind (``"result"`` or the aux output's kind, see :class:`nvdispatch._epilog.EpilogOutput`)."""

    name: str
    shape: tuple
    dtype: str
    kind: str


# -- problems -------------------------------------------------------------------------------------------------
def matmul_problem(a, b, c, inputs: dict, alpha, beta, epilog: str, options, preferences, scales) -> MatmulProblem:
    """The :class:`MatmulProblem` of a matmul on these tensors (fake or real), validated as ``matmul`` validates it.

    ``scales``: the quantization scales by name; tensors among them are checked at run time only (a fake tensor
    has no value to check), planning sees them as host numbers."""
    named = {"a": a, "b": b, "c": c, **inputs}
    infos = {name: detect(name, x) for name, x in named.items() if x is not None}
    framework, device = common_placement(infos)
    spec = spec_of(epilog)
    opts = as_options(options)
    as_preferences(preferences)  # checked now: a bad preference fails at trace time
    if scales is not None:
        scales = {k: (1.0 if hasattr(v, "shape") else v) for k, v in scales.items()}
    if wants_fp8(infos, opts, scales):
        return build_fp8_problem(framework, device, infos, spec, opts, alpha, beta, tuple(inputs), scales)
    return build_problem(framework, device, infos, spec, opts, alpha, beta, tuple(inputs))


def fft_problem(func: str, x, n, axis: int, s, axes, norm: str) -> FFTProblem:
    """The :class:`FFTProblem` of ``nvdispatch.fft.<func>`` on tensor ``x`` (fake or real). A half-precision
    operand's (Torch's rule, ``framework_promotion``): the transform of its float32/complex64 cast, with the
    caller's ``dtype`` and the half-precision ``result_dtype`` the public function returns (in an autocast region
    Torch's FFTs follow, the float32/complex64 result; the operators' autocast kernels cast before this is asked,
    so it comes up only where a kernel is reached in a region without them)."""
    info = detect("x", x)
    promotion = framework_promotion(func, x, info.dtype)
    if promotion is None:
        return build_fft_problem(func, info, info.framework, info.device, n, axis, s, axes, norm)
    computed = dataclasses.replace(info, dtype=promotion[0])
    p = build_fft_problem(func, computed, info.framework, info.device, n, axis, s, axes, norm)
    if promotion[1] is None:
        return dataclasses.replace(p, dtype=info.dtype)
    return dataclasses.replace(p, dtype=info.dtype, result_dtype=promotion[1])


def convolve_problem(x, h, n, axis: int) -> ConvolveProblem:
    """The :class:`ConvolveProblem` of ``nvdispatch.fft.convolve`` on tensors ``x`` and ``h`` (fake or real)."""
    return prepare_convolve(x, h, n, axis)[0]


# -- outputs --------------------------------------------------------------------------------------------------
def matmul_outputs(p: MatmulProblem) -> tuple[OutputSpec, ...]:
    """The operator's outputs for ``p``: the result, then each aux output in the epilog's order, then
    ``result_amax`` where FP8 options ask for it."""
    outs = [OutputSpec("result", tuple(p.result_shape), p.result_dtype, "result")]
    for name in p.epilog.outputs:
        kind = OUTPUTS[name].kind
        if kind == "mask":
            if p.device.kind == "cuda":
                shape = (*p.batch_shape, p.m, relu_aux_ld_bits(p.n) // 8)
                outs.append(OutputSpec(name, shape, "uint8", kind))
            else:
                outs.append(OutputSpec(name, tuple(p.result_shape), "bool", kind))
        elif kind == "pre_activation":
            outs.append(OutputSpec(name, tuple(p.result_shape), p.result_dtype, kind))
        elif kind == "bias_gradient":
            shape = (*p.batch_shape, p.n) if p.options.bgrad_axis == "n" else (*p.batch_shape, p.m, 1)
            outs.append(OutputSpec(name, shape, p.result_dtype, kind))
        else:  # operand_sum
            src, length = (p.a, p.m) if name == "bgrada" else (p.b, p.n)
            outs.append(OutputSpec(name, (*tuple(src.shape)[:-2], length), p.result_dtype, kind))
    if p.quantization is not None and p.quantization.amax:
        outs.append(OutputSpec("result_amax", (), "float32", "amax"))
    return tuple(outs)


def fft_output(p: FFTProblem) -> OutputSpec:
    return OutputSpec("result", tuple(p.out_shape), p.result_dtype, "result")


def convolve_output(p: ConvolveProblem) -> OutputSpec:
    return OutputSpec("result", tuple(p.inverse.out_shape), p.inverse.result_dtype, "result")


def empty_outputs(specs, like) -> list:
    """New tensors of ``specs`` on ``like``'s device (fake ones inside a fake kernel)."""
    import torch

    return [like.new_empty(s.shape, dtype=getattr(torch, s.dtype)) for s in specs]


# -- real outputs to the layout -------------------------------------------------------------------------------
def dense(t, like=None):
    """``t`` as a C-contiguous tensor at offset 0 (itself when it is so already; strides of size-1 dimensions do
    not matter). An array of another framework (an executor that a coercing backend chose returns its own) comes
    back as a tensor on ``like``'s device."""
    torch = sys.modules["torch"]
    if not isinstance(t, torch.Tensor):
        t = torch.as_tensor(t, device=None if like is None else like.device)
    if t.is_contiguous() and not t.storage_offset():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def conform(t, spec: OutputSpec, p: Any = None, like=None):
    """Real output ``t`` in ``spec``'s layout (``t`` itself when it is so already). ``p``: the matmul problem,
    for relu masks and operand sums whose executor format differs; ``like``: as for :func:`dense`."""
    t = dense(t, like)
    if tuple(t.shape) != spec.shape or str(t.dtype)[6:] != spec.dtype:
        t = dense(_reformat(t, spec, p, sys.modules["torch"]))
    elif spec.kind == "mask" and spec.dtype == "uint8":
        t = _clear_padding(t, p.n)
    return t


def _clear_padding(bits, n: int):
    """cuBLASLt's row-orientation bits (a new tensor, changed in place) with every bit past column ``n`` zero."""
    full, rest = divmod(n, 8)
    if rest:
        bits[..., full].bitwise_and_((1 << rest) - 1)
        full += 1
    if full < bits.shape[-1]:
        bits[..., full:] = 0
    return bits


def _reformat(t, spec: OutputSpec, p, torch):
    """``t`` with ``spec``'s shape and dtype, where an executor returned another format of the same values."""
    if spec.kind == "mask" and spec.dtype == "uint8":
        return _row_bits(t, p, torch)
    if spec.kind == "operand_sum" and t.dim() >= len(spec.shape):
        # cuBLASLt returns the sum for every batch of the call; the operand's own batch dims broadcast
        extra = t.dim() - len(spec.shape)
        t = t[(0,) * extra] if extra else t
        for dim, size in enumerate(spec.shape):
            if t.shape[dim] != size and size == 1:
                t = t.narrow(dim, 0, 1)
    if t.numel() == math.prod(spec.shape) and tuple(t.shape) != spec.shape:
        t = t.reshape(spec.shape)
    if tuple(t.shape) != spec.shape or str(t.dtype)[6:] != spec.dtype:
        raise RuntimeError(
            f"nvdispatch operator output {spec.name!r}: the executor returned {str(t.dtype)[6:]}{list(t.shape)}, "
            f"the operator's layout is {spec.dtype}{list(spec.shape)}"
        )
    return t


def _row_bits(t, p, torch):
    """A relu mask (boolean, or cuBLASLt's bits in its column orientation) as row-orientation bits."""
    from .._adapters.torch import TorchDeviceOps

    ops = TorchDeviceOps()
    m, n = p.m, p.n
    promoted = (*p.batch_shape, m, n)
    if t.dtype == torch.bool:
        mask = t.reshape(promoted)
    else:  # column orientation: a (..., ceil128(m)/8, n) view of a (..., n, ceil128(m)/8) buffer
        mask = ops.unpack_mask(t.transpose(-1, -2).contiguous(), m).transpose(-1, -2)
    return ops.pack_mask(mask.contiguous(), relu_aux_ld_bits(n))
