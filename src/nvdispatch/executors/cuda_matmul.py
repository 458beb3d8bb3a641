"""Matmul on the raw ``"cuda"`` executor: cuBLASLt with every epilog fused into one ``cublasLtMatmul``.

Strategies: ``native`` (the epilog in cuBLASLt's epilogue: bias of either orientation, ReLU/GELU, aux
outputs, DRELU/DGELU, bias gradients; see :mod:`nvdispatch._cuda.lt_setup` for how a row-major problem is
described to cuBLASLt) and ``inplace`` (cuBLASLt's plain matmul, then the epilog in place through CuPy or
Torch ops) — only used where cuBLASLt has no fused kernel for the case, and ``explain()`` then says why.

Plain matmuls (no epilog, no ``c``) of Torch tensors and CuPy arrays are declined so ``torch.matmul`` /
``cupy.matmul`` (same cuBLAS kernels, less host overhead) runs them (see :data:`PLAIN_TO_FRAMEWORK`; CuPy's only
where no ``compute_type``/``scale_type`` is asked for, which ``cupy.matmul`` could not apply). Small 2-D
BIAS/RELU_BIAS/GELU_BIAS products of Torch tensors with a bias along N (at most :data:`HOST_BOUND_MNK`
multiply-adds) are host-bound: their GPU time is below the host cost of a launch. They run here where the
compiled extension is built: our plan's direct call (``_hotpath_lt.c``) launches the algorithm it planned
once, where Torch's ``_addmm_activation`` asks cuBLASLt's heuristic on every call, so ours costs less host time
(``benchmarks/gpu_matmul_bench.py --host-only`` measures both). Without the extension they are declined to
Torch's fused entry, which then costs less than our Python direct call. Neither is declined when the user asked
for this executor with ``set_backend("cuda")`` or ``set_global_backend("cuda")``.
"""

from __future__ import annotations

from .._backends import is_requested
from .._compiled import hotpath
from .._epilog import INPUTS
from .._matmul_problem import MatmulProblem
from .._memory import CUPY_ARRAY, TORCH_TENSOR
from . import builtin
from .torch_addmm import can_fuse

#: memory kinds whose framework's own matmul runs plain products: the same cuBLAS kernels, with less host time per
#: call than a cuBLASLt call from here
PLAIN_TO_FRAMEWORK = frozenset({TORCH_TENSOR, CUPY_ARRAY})
#: Torch problems up to this m*n*k whose epilog Torch fuses into cuBLASLt itself are left to Torch where the
#: extension is not built (host-bound: their GPU time is below a launch's host cost; see
#: ``benchmarks/gpu_matmul_bench.py --host-only``)
HOST_BOUND_MNK = 256**3


def _lt():
    from .._cuda import cublaslt, lt_descriptors, lt_setup, xp

    return cublaslt, lt_setup, lt_descriptors, xp


def _requested() -> bool:
    """Whether the user asked for this executor (then it runs plain matmuls too)."""
    return is_requested(builtin("cuda"))


def decline(problem: MatmulProblem) -> str | None:
    if problem.autograd:
        return "autograd records this call; a raw cuBLASLt result would carry no graph (Torch's ops keep it)"
    cublaslt, lt_setup, lt_descriptors, xp = _lt()
    why = cublaslt.unavailable()
    if why:
        return why
    if problem.quantization is not None:
        from .._cuda import lt_fp8

        return lt_fp8.decline(problem)
    dt = problem.result_dtype
    if dt not in lt_setup.LT_DTYPES:
        return f"cuBLASLt matmul takes float16/bfloat16/float32/float64/complex64/complex128, not {dt}"
    for name in ("a", "b"):
        if getattr(problem, name).dtype not in lt_setup.LT_DTYPES:
            return f"{name} is {getattr(problem, name).dtype}; cuBLASLt needs floating operands"
    if _zero_size(problem):
        if problem.memory & PLAIN_TO_FRAMEWORK and not _bits_read(problem):
            return "zero-size matmul: left to the framework"
        if xp.namespace_for(problem.framework) is None:
            return "a zero-size matmul is run with CuPy or Torch ops, and neither is installed"
        return None
    plain = not problem.epilog.steps and problem.c is None
    if CUPY_ARRAY in problem.memory:  # cupy.matmul has no compute-type choice: a product asking for one stays here
        from .cupy_matmul import plain_product

        plain = plain_product(problem)
    small_fused = TORCH_TENSOR in problem.memory and _torch_fuses_small(problem) and hotpath() is None
    if problem.memory & PLAIN_TO_FRAMEWORK and (plain or small_fused) and not _requested():
        if plain:
            return f"plain matmul: {problem.framework}'s own matmul runs the same kernels with less host overhead"
        return (
            f"host-bound ({problem.m}x{problem.n}x{problem.k}): Torch's addmm/_addmm_activation runs the same fused "
            "cuBLASLt epilogue with less host overhead than our direct call in Python (the compiled extension, "
            "nvdispatch._hotpath, is not built)"
        )
    if xp.namespace_for(problem.framework) is None:
        orientation, _, why_not = lt_descriptors.probe(problem)
        if orientation is None:
            return f"{why_not}, and the unfused fallback needs CuPy or Torch"
    return None


def _torch_fuses_small(problem: MatmulProblem) -> bool:
    return problem.m * problem.n * problem.k <= HOST_BOUND_MNK and can_fuse(problem)


def _bits_read(problem: MatmulProblem) -> bool:
    """Whether a zero-size call reads a cuBLASLt bit mask (K == 0 with a non-empty result): the framework's
    executors take boolean masks only (an empty result they take with any mask), so it stays here, where the
    inplace plan unpacks the bits."""
    return 0 not in problem.result_shape and any(
        INPUTS[name].mask_of is not None and sig.dtype == "uint8" for name, sig in problem.inputs
    )


def _zero_size(problem: MatmulProblem) -> bool:
    return 0 in (problem.m, problem.n, problem.k) or 0 in problem.batch_shape


#: the epilogs a plan may read a conjugated operand under (cuBLASLt's op C): those that do not reduce over ``a`` or
#: ``b`` themselves (BGRADA/BGRADB would sum the operand as its memory holds it, natively or in the inplace plan's
#: operations); complex products take no other
CONJ_FOLDING_EPILOGS = frozenset({"DEFAULT", "BIAS"})


def folds_conjugates(problem: MatmulProblem, strategy: str) -> bool:
    """Whether ``strategy``'s plan reads ``problem``'s operands marked ``conj`` conjugating them: a non-empty, non-FP8
    product without a reducing epilog, whose ``cublasLtMatmul`` (the ``native`` plan's, or the unfused one the
    ``inplace`` plan adds the bias after, where cuBLASLt has no fused kernel: a complex BIAS, say) reads such an
    operand with op C where its layout is a transposed one (``a.mH``, ``b.mH``) and conjugates it in the copy it
    makes otherwise (:func:`nvdispatch._cuda.lt_setup.setup`). Zero-size products, built by CuPy/Torch operations,
    take copies of the values instead (the route makes them)."""
    return (
        strategy in ("native", "inplace")
        and problem.quantization is None
        and not problem.autograd
        and not _zero_size(problem)
        and problem.epilog.epilog.name in CONJ_FOLDING_EPILOGS
    )


def strategies(problem: MatmulProblem) -> tuple[str, ...]:
    if problem.quantization is not None:
        return ("native",)  # one cublasLtMatmul on FP8 tensor cores (decline sent the rest elsewhere)
    if _zero_size(problem):
        return ("inplace",)  # cuBLASLt takes no empty matrices: CuPy/Torch ops build the (empty or c-only) result
    _, _, lt_descriptors, xp = _lt()
    orientation, _, _ = lt_descriptors.probe(problem)
    fallback = ("inplace",) if problem.epilog.steps and xp.namespace_for(problem.framework) else ()
    return ("native", *fallback) if orientation is not None else fallback


def plan(problem: MatmulProblem, strategy: str, tuning=None):
    if problem.quantization is not None:
        from .._cuda import lt_fp8

        return lt_fp8.Fp8LtPlan(problem, tuning=tuning)
    from .._cuda.lt_descriptors import probe
    from .._cuda.lt_inplace import InplacePlan
    from .._cuda.lt_matmul import LtMatmulPlan

    if _zero_size(problem):
        return InplacePlan(problem, "zero-size matmul (cuBLASLt takes no empty matrices)", via="xp")
    if strategy == "native":
        return LtMatmulPlan(problem, tuning=tuning)
    orientation, _, why = probe(problem)
    return InplacePlan(problem, why if orientation is None else "", via="lt")
