"""Matmul on the CuPy executor.

Strategies: ``native`` (the fused cuBLASLt path shared with the ``"cuda"`` executor — CuPy's stream and
memory pool), then ``inplace`` (``cupy.matmul`` and the epilog as in-place CuPy ops). ``relu_aux`` is
cuBLASLt's bit mask on both strategies (DRELU also takes a boolean mask). Integer matmuls and anything
cuBLASLt cannot take run through ``cupy.matmul``. A plain product (no epilog, no ``c``, no compute or scale type
asked for) is ``plain`` first: ``cupy.matmul`` itself (cuBLAS: the same kernels with less host overhead than a
cuBLASLt call from Python), then ``native`` for autotune to time against it.
"""

from __future__ import annotations

from .._matmul_problem import MatmulProblem


def _native_possible(problem: MatmulProblem) -> tuple[bool, str]:
    from .._cuda import cublaslt, lt_descriptors, lt_setup, runtime

    why = runtime.unavailable() or cublaslt.unavailable()
    if why:
        return False, why
    if problem.result_dtype not in lt_setup.LT_DTYPES or problem.a.dtype not in lt_setup.LT_DTYPES:
        return False, f"cuBLASLt has no {problem.result_dtype} matmul"
    if problem.b.dtype not in lt_setup.LT_DTYPES:
        return False, f"cuBLASLt has no {problem.b.dtype} operand"
    if 0 in (problem.m, problem.n, problem.k) or 0 in problem.batch_shape:
        return False, "zero-size matmul"
    orientation, _, why = lt_descriptors.probe(problem)
    return orientation is not None, why


def decline(problem: MatmulProblem) -> str | None:
    if problem.quantization is not None:
        return "CuPy has no FP8 matmul (the cuda executor runs FP8 on compute capability 8.9+)"
    if "bfloat16" in (problem.a.dtype, problem.b.dtype):
        return "CuPy has no bfloat16"
    if problem.epilog.activation == "gelu" and not problem.result_dtype.startswith("float"):
        return f"GELU needs a floating dtype, not {problem.result_dtype}"
    return None


def plain_product(problem: MatmulProblem) -> bool:
    """Whether ``cupy.matmul`` computes ``problem`` as asked: no epilog, no ``c``, and no compute or scale type
    asked for (it has no such choice; a compute type CuPy's own convention chose it applies itself). The cuda
    executor leaves these to this one."""
    explicit = problem.explicit_compute_type
    return not problem.epilog.steps and problem.c is None and explicit is None and problem.options.scale_type is None


def strategies(problem: MatmulProblem) -> tuple[str, ...]:
    ok, _ = _native_possible(problem)
    if plain_product(problem):
        return ("plain", "native") if ok else ("plain",)
    return ("native", "inplace") if ok else ("inplace",)


def plan(problem: MatmulProblem, strategy: str, tuning=None):
    from .._cuda import lt_inplace, lt_matmul

    if strategy == "native":
        return lt_matmul.LtMatmulPlan(problem, tuning=tuning)
    if strategy == "plain":
        return _plain_plan(problem)
    ok, why = _native_possible(problem)
    return lt_inplace.InplacePlan(problem, "" if ok else why, via="xp")


def _plain_plan(problem: MatmulProblem):
    """Strategy ``plain``: ``cupy.matmul`` (the unfused plan's CuPy path, which has no epilog steps to run here);
    its direct call is ``cupy.matmul`` itself where no cast is needed."""
    from .._cuda import lt_inplace

    plan = lt_inplace.InplacePlan(problem, "", via="xp")
    plan.strategy = "plain"
    plan.needs_release = False  # holds nothing to free: calls need not pin it
    plan.steps = ("cupy.matmul (cuBLAS: the same kernels as cuBLASLt's, less host overhead per call)",)
    if problem.a.dtype == problem.b.dtype == problem.result_dtype:
        plan.direct = plan.xp.mod.matmul
    return plan
