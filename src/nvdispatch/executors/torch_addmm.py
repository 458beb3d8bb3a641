"""What Torch fuses into one call: ``torch.addmm`` (bias) and ``torch._addmm_activation`` (bias and ReLU/GELU), on
CUDA into the cuBLASLt epilogue. The Torch executor's ``framework_fused`` strategy runs these; the ``"cuda"``
executor leaves the small products of them to Torch where its own direct call is not compiled."""

from __future__ import annotations

from .._matmul_problem import MatmulProblem

__all__ = ["can_fuse"]


def can_fuse(p: MatmulProblem) -> bool:
    """Whether ``torch.addmm`` / ``torch._addmm_activation`` fuse ``p``'s epilog (bias along N, ReLU/GELU): a 2-D
    product of plain matrices, no ``c``, a bias of the result's floating dtype."""
    return (
        p.epilog.fusable
        and not p.batch_shape
        and not p.a_vector
        and not p.b_vector
        and p.c is None
        and p.bias_axis == "n"
        and p.result_dtype.startswith(("float", "bfloat"))
        and dict(p.inputs)["bias"].dtype == p.result_dtype
        # Torch's CPU kernel applies the exact (erf) GELU; only its CUDA one is the tanh form cuBLASLt uses
        and (p.epilog.activation != "gelu" or p.device.kind == "cuda")
    )
