"""Matmul on the CuPy executor.

Strategies: ``native`` (the fused cuBLASLt path shared with the ``"cuda"`` executor — CuPy's stream and
memory pool), then ``inplace`` (``cupy.matmul`` and the epilog as in-place CuPy ops). ``relu_aux`` is
cuBLASLt's bit mask on both strategies (DRELU also takes a boolean mask). Integer matmuls and anything
cuBLASLt cannot take run through ``cupy.matmul``.
"""

from __future__ import annotations

from .._matmul_problem import MatmulProblem


def _native_possible(problem: MatmulProblem) -> tuple[bool, str]:
    from .._cuda import cublaslt, lt_matmul, runtime

    why = runtime.unavailable() or cublaslt.unavailable()
    if why:
        return False, why
    if problem.result_dtype not in lt_matmul.LT_DTYPES or problem.a.dtype not in lt_matmul.LT_DTYPES:
        return False, f"cuBLASLt has no {problem.result_dtype} matmul"
    if problem.b.dtype not in lt_matmul.LT_DTYPES:
        return False, f"cuBLASLt has no {problem.b.dtype} operand"
    if 0 in (problem.m, problem.n, problem.k) or 0 in problem.batch_shape:
        return False, "zero-size matmul"
    orientation, _, why = lt_matmul.probe(problem)
    return orientation is not None, why


def decline(problem: MatmulProblem) -> str | None:
    if problem.quantization is not None:
        return "CuPy has no FP8 matmul (the cuda executor runs FP8 on compute capability 8.9+)"
    if "bfloat16" in (problem.a.dtype, problem.b.dtype):
        return "CuPy has no bfloat16"
    if problem.epilog.activation == "gelu" and not problem.result_dtype.startswith("float"):
        return f"GELU needs a floating dtype, not {problem.result_dtype}"
    return None


def strategies(problem: MatmulProblem) -> tuple[str, ...]:
    ok, _ = _native_possible(problem)
    return ("native", "inplace") if ok else ("inplace",)


def plan(problem: MatmulProblem, strategy: str, tuning=None):
    from .._cuda import lt_matmul

    if strategy == "native":
        return lt_matmul.LtMatmulPlan(problem, tuning=tuning)
    ok, why = _native_possible(problem)
    return lt_matmul.InplacePlan(problem, "" if ok else why, via="xp")
