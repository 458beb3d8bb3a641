"""Matmul with epilogs through Torch ops, on CPU or CUDA tensors.

Strategies: ``framework_fused`` (``torch.addmm`` / ``torch._addmm_activation``: bias and ReLU/GELU fused by
Torch, on CUDA into the cuBLASLt epilogue; its ReLU keeps NaN, as every executor's, see ``_epilog``) for 2-D
problems with a bias along N; ``inplace`` (the product, then in-place ops on it); ``plain`` (separate out-of-place ops).
"""

from __future__ import annotations

from .._adapters import adapter_named
from .._compiled import hotpath
from .._epilog import apply_steps, declined_mask_format, finish_outputs, prepare_inputs
from .._epilog_torch import TORCH_INPLACE, TORCH_PLAIN
from .._matmul_problem import MatmulProblem, compute_type_note, scalar_value
from .._precision import AUTOCAST_DTYPES
from .cuda_matmul import decline as cuda_decline
from .torch import stream_context
from .torch_addmm import can_fuse

_NO_TORCH_MATMUL = {"uint16", "uint32", "uint64", "bool"}


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def _recorded(*tensors) -> bool:
    """Whether autograd records an op on ``tensors`` (one requires grad and grad mode is on)."""
    import torch

    return any(t.requires_grad for t in tensors) and torch.is_grad_enabled()


def _torch_matmul():
    import torch

    return torch.matmul


def _fused_bias_op(name: str):
    import functools

    import torch

    if name == "BIAS":
        return torch.addmm
    if name == "RELU_BIAS":
        return torch._addmm_activation  # use_gelu=False is its default: no partial in the per-call path
    return functools.partial(torch._addmm_activation, use_gelu=True)


def _bias_last(fused):
    """``direct(a, b, bias)`` calling ``fused(bias, a, b)``: compiled where the extension is built (a cached call
    then runs Torch's op with no Python frame between), else a lambda."""
    compiled = hotpath()
    return (lambda a, b, bias: fused(bias, a, b)) if compiled is None else compiled.make_bias_last(fused)


def _activation_after_addmm(name: str):
    """The fused-bias epilog as autograd records it: ``_addmm_activation`` has no derivative, so the bias
    stays fused in ``torch.addmm`` (which has one) and this activation follows it, as in ``relu(linear(x))``;
    None for BIAS."""
    import torch

    if name == "BIAS":
        return None
    if name == "RELU_BIAS":
        return torch.relu
    import functools

    return functools.partial(torch.nn.functional.gelu, approximate="tanh")  # cuBLASLt's GELU is the tanh form


def decline(problem: MatmulProblem) -> str | None:
    if problem.quantization is not None:
        return None  # FP8: the reference path (nvdispatch._fp8_reference) runs on the CPU and any GPU
    dt = problem.result_dtype
    if dt in _NO_TORCH_MATMUL:
        return f"torch has no {dt} matmul"
    if problem.device.kind == "cuda" and not dt.startswith(("float", "bfloat", "complex")):
        return f"torch has no {dt} matmul on CUDA"
    return declined_mask_format(problem, "Torch")


def strategies(problem: MatmulProblem) -> tuple[str, ...]:
    if problem.quantization is not None:
        return ("plain",)
    if not problem.epilog.steps and problem.c is None:
        return ("plain",)
    fused = ("framework_fused",) if can_fuse(problem) else ()
    return (*fused, "inplace", "plain")


def plan(problem: MatmulProblem, strategy: str, tuning=None):
    if problem.quantization is not None:
        from .._fp8_reference import Fp8ReferencePlan

        return Fp8ReferencePlan(problem, _fp8_why_not_cublaslt(problem))
    return TorchMatmulPlan(problem, strategy)


def _fp8_why_not_cublaslt(problem: MatmulProblem) -> str:
    if problem.device.kind != "cuda":
        return "the operands are on the CPU"
    return cuda_decline(problem) or "the torch executor was chosen (set_backend)"


class TorchMatmulPlan:
    needs_release = False  # holds nothing to free: calls need not pin it (see the plan cache)
    #: Torch's ops read Torch's float32 precision setting when they run (a Matmul keeps its plan()'s: see linalg)
    reads_framework_precision = True

    def __init__(self, problem: MatmulProblem, strategy: str):
        self.problem = problem
        self.strategy = strategy
        self.dtype = _torch_dtype(problem.result_dtype)
        name = problem.epilog.epilog.name
        if strategy == "framework_fused" and problem.autograd and name != "BIAS":
            act = "relu" if name == "RELU_BIAS" else "gelu tanh"
            self.steps = (f"torch.addmm: bias fused by Torch, then {act} (autograd records both)",)
        elif strategy == "framework_fused":
            self.steps = {
                "BIAS": ("torch.addmm: bias fused by Torch",),
                "RELU_BIAS": ("torch._addmm_activation(relu): bias and activation fused by Torch",),
            }.get(name, ("torch._addmm_activation(gelu tanh): bias and activation fused by Torch",))
        else:
            how = "in place" if strategy == "inplace" else "separate Torch op"
            self.steps = ("torch.matmul", *(f"{s} ({how})" for s in problem.epilog.steps))
        explicit = problem.explicit_compute_type
        # Torch's float32 precision setting can be raised for a call (never lowered: see _adapters.torch_precision)
        floor = explicit.name if explicit is not None and problem.result_dtype == "float32" else None
        if floor is None:
            self.steps += compute_type_note(problem, "Torch's own matmul precision (torch.backends settings)")
        else:
            self.steps += (
                f"options.compute_type {floor}: Torch's own matmul, its float32 precision setting raised to at "
                "least that for the call where lower (never lowered: it may compute more precisely)",
            )
        # The Plan protocol's direct call (alpha 1, the current stream, no cast needed): ``direct(a, b)`` is
        # torch.matmul for a plain product; ``direct(a, b, bias)`` the Torch-fused bias epilog (1-D bias).
        plain = not problem.epilog.steps and problem.c is None
        same = problem.a.dtype == problem.b.dtype == problem.result_dtype
        self.direct = _torch_matmul() if plain and same else None
        self.fused_bias = None
        self._bias_only = name == "BIAS"
        if strategy == "framework_fused" and same and len(dict(problem.inputs)["bias"].shape) == 1:
            fused = self.fused_bias = _fused_bias_op(name)
            act = _activation_after_addmm(name)
            if problem.autograd and act is not None:  # calls keyed as recorded ones (grad mode is in the key)
                addmm = _fused_bias_op("BIAS")
                self.direct = lambda a, b, bias: act(addmm(bias, a, b))
            else:
                self.direct = _bias_last(fused)
        # a compute type the caller chose wins over an autocast region: Torch's ops must not recast the operands
        # and Torch's float32 precision setting must not compute it less precisely than asked
        self._as_asked = None
        if explicit is not None and {problem.a.dtype, problem.b.dtype} <= AUTOCAST_DTYPES:
            self._as_asked = adapter_named("torch").as_planned(problem.device, floor)
            self.direct = self.fused_bias = None
            self.steps += ("outside any autocast region (options.compute_type was given)",)

    def release(self) -> None:
        pass

    def execute(self, operands, stream=None):
        if self._as_asked is not None:
            return self._as_asked(self._execute, operands, stream)
        return self._execute(operands, stream)

    def _execute(self, operands, stream):
        fused = self.fused_bias
        if fused is not None and stream is None and operands.get("alpha", 1) == 1:
            a, b, bias = operands["a"], operands["b"], operands["bias"]
            # _addmm_activation has no derivative: a call autograd records takes _run's path
            if self._bias_only or not _recorded(a, b, bias):
                return fused(bias, a, b)
        with stream_context(stream, self.problem.device):
            return self._run(operands)

    def _run(self, operands):
        import torch

        p = self.problem
        a = operands["a"].to(self.dtype)
        b = operands["b"].to(self.dtype)
        if p.a_vector:
            a = a.unsqueeze(0)
        if p.b_vector:
            b = b.unsqueeze(-1)
        alpha = scalar_value(operands.get("alpha", 1))
        inputs = {name: operands[name] for name, _ in p.inputs}
        # autograd records this call: no in-place steps, and no _addmm_activation (it has no derivative)
        recorded = _recorded(a, b, *inputs.values())
        if self.strategy == "framework_fused":
            bias = inputs["bias"].reshape(-1)
            name = p.epilog.epilog.name
            act = _activation_after_addmm(name) if recorded else None
            if act is None:
                return _fused_bias_op(name)(bias, a, b, alpha=alpha)
            return act(torch.addmm(bias, a, b, alpha=alpha))
        c = operands.get("c")
        beta = operands.get("beta")
        if c is not None:
            beta = 1 if beta is None else scalar_value(beta)
            c = c.to(self.dtype).broadcast_to(p.result_shape).reshape(p.promoted_shape)
        if c is not None and beta != 0 and a.ndim == 2 and b.ndim == 2 and p.result_dtype != "bool":
            out = torch.addmm(c, a, b, beta=beta, alpha=alpha)
        else:
            out = torch.matmul(a, b)
            if alpha != 1:
                out = out * alpha
            if c is not None and beta != 0:
                out = out + beta * c
        inputs = prepare_inputs(p, inputs)
        ops = TORCH_INPLACE if self.strategy == "inplace" and not recorded else TORCH_PLAIN
        out, aux = apply_steps(p.epilog, out, inputs, ops, a=a, b=b, bgrad_axis=p.options.bgrad_axis)
        result = p.squeeze(out)
        if not p.epilog.outputs:
            return result
        return result, finish_outputs(p, aux)
