"""The FP8 reference path: Torch's float8 dtypes on the CPU or any CUDA GPU, for where cuBLASLt's FP8 kernels
cannot run (no GPU, compute capability < 8.9, a case cuBLASLt's heuristic declines).

It follows cuBLASLt's FP8 semantics step by step (see :mod:`nvdispatch._fp8`): dequantise both operands to
float32 (exact), one float32 matmul, ``alpha * scale_a * scale_b``, ``+ beta * scale_c * c``, the epilog
(bias, ReLU or tanh-GELU) in float32, amax of that, then ``* scale_d``, saturation to the FP8 range and
round-to-nearest-even into the result type. Results agree with the cuBLASLt path to within one rounding of
the result type (accumulation order differs).
"""

from __future__ import annotations

from ._epilog_torch import TORCH_PLAIN
from ._fp8 import Fp8Spec
from ._fp8_types import FP8_MAX, is_fp8
from ._matmul_problem import MatmulProblem, scalar_value

__all__ = ["Fp8ReferencePlan"]


class Fp8ReferencePlan:
    """An FP8 matmul through Torch ops (strategy ``"plain"``: separate framework ops)."""

    needs_release = False  # holds nothing to free: calls need not pin it (see the plan cache)

    strategy = "plain"

    def __init__(self, problem: MatmulProblem, why: str = ""):
        import torch

        self.problem = p = problem
        q: Fp8Spec = p.quantization
        self.q = q
        self._torch = torch
        self._rt = getattr(torch, q.result_type)
        self._types = {"a": getattr(torch, q.a_type), "b": getattr(torch, q.b_type)}
        epi = p.epilog.epilog.name
        steps = [
            f"FP8 reference path (Torch on {p.device}): {q.describe()}",
            "dequantise a and b to float32 (exact), one float32 torch.matmul"
            + (
                " (fast accumulation is a cuBLASLt kernel mode: the reference accumulates in float32)"
                if q.fast_accum
                else ""
            ),
            "x alpha * scale_a * scale_b" + (" + beta * scale_c * c" if p.c is not None else ""),
        ]
        if epi != "DEFAULT":
            steps.append(f"epilog {epi} in float32 (" + ", ".join(p.epilog.steps) + ")")
        if q.amax:
            steps.append("result_amax = max(|t|) before the d scale")
        if is_fp8(q.result_type):
            steps.append(f"x scale_d, saturate to +-{FP8_MAX[q.result_type]:g}, round to {q.result_type}")
        else:
            steps.append(f"round to {q.result_type}")
        if why:
            steps.append(f"not cuBLASLt's FP8 kernels: {why}")
        self.steps = tuple(steps)

    def release(self) -> None:
        pass

    def execute(self, operands, stream=None):
        from .executors.torch import stream_context

        with stream_context(stream, self.problem.device):
            return self._run(operands)

    def _scale(self, scales: dict, name: str):
        """A Python float, or a 0-d float32 tensor (device scales stay on the device: no synchronisation)."""
        value = scales.get(name)
        if value is None:
            return 1.0
        if self.q.scale_kind(name) == "host":
            return float(value)
        return value.reshape(())

    def _run(self, operands):
        torch = self._torch
        p, q = self.problem, self.q
        f32 = torch.float32
        scales = operands.get("quantization_scales") or {}
        a, b = operands["a"], operands["b"]
        if "a" in q.storage:
            a = a.view(self._types["a"])
        if "b" in q.storage:
            b = b.view(self._types["b"])
        a = a.to(f32)
        b = b.to(f32)
        if p.a_vector:
            a = a.unsqueeze(0)
        if p.b_vector:
            b = b.unsqueeze(-1)
        t = torch.matmul(a, b)
        factor = float(scalar_value(operands.get("alpha", 1)))
        for name in ("a", "b"):
            s = self._scale(scales, name)
            if isinstance(s, float):
                factor *= s
            else:
                t = t * s
        if factor != 1.0:
            t = t * factor
        c = operands.get("c")
        if c is not None:
            beta = operands.get("beta")
            beta = 1.0 if beta is None else float(scalar_value(beta))
            beta *= float(scales.get("c", 1.0))
            if beta != 0:
                t = t + beta * c.to(f32).broadcast_to(p.result_shape).reshape(p.promoted_shape)
        aux = {}
        epi = p.epilog.epilog.name
        if "BIAS" in epi:
            bias = operands["bias"].to(f32)
            t = t + (bias.reshape(1, -1) if bias.ndim == 1 else bias)
        if "RELU" in epi:
            if "AUX" in epi:
                aux["relu_aux"] = p.squeeze(t > 0)
            t = TORCH_PLAIN.relu_(t)  # NaN stays NaN, as every executor (see _epilog)
        elif "GELU" in epi:
            if "AUX" in epi:
                aux["gelu_aux"] = p.squeeze(self._quantise(t))
            t = torch.nn.functional.gelu(t, approximate="tanh")
        if q.amax:
            aux["result_amax"] = t.abs().amax() if t.numel() else torch.zeros((), dtype=f32, device=t.device)
        if is_fp8(q.result_type):
            d = self._scale(scales, "d")
            t = t * d if not (isinstance(d, float) and d == 1.0) else t
        out = p.squeeze(self._quantise(t))
        if not aux:
            return out
        return out, aux

    def _quantise(self, t):
        """Round float32 ``t`` to the result type, saturating FP8 (NaN stays NaN)."""
        rt = self.q.result_type
        if is_fp8(rt):
            limit = FP8_MAX[rt]
            t = t.clamp(-limit, limit)
        return t.to(self._rt)
