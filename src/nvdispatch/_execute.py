"""The run step of the route: a pinned plan runs on the operands' views and its result goes back to the caller
through the operands' adapter; memory exhaustion has one error type.

A call pins its plan in the plan cache from lookup to return (:meth:`PlanCache.acquire` ...
:meth:`PlanCache.let_go`), so an eviction or ``plan_cache.clear()`` meanwhile cannot release it under the
call. Executors receive the views adapters hand out (``OperandInfo.array``: a NumPy view of a JAX array's host
memory, say) and return results of that kind; :func:`run` gives the result to the adapter's ``wrap`` where it
has one (``wraps``), which returns it as the caller's type on the caller's device. Whatever framework ran out
of memory (NumPy's ``MemoryError``, ``torch.OutOfMemoryError`` or Torch's CPU allocator's ``RuntimeError``,
CuPy's ``OutOfMemoryError``, a CUDA/cuFFT/cuBLASLt allocation failure), the caller gets
:class:`nvdispatch.errors.OutOfMemoryError` (a ``MemoryError``) with the original as its ``__cause__``.
"""

from __future__ import annotations

from typing import Any

from ._plan_cache import plan_cache
from .errors import OutOfMemoryError

__all__ = ["run", "run_direct", "wrap_result", "out_of_memory", "raise_if_out_of_memory"]

#: lower-case fragments of the messages frameworks and CUDA libraries give when memory runs out
_OOM_MESSAGES = (
    "out of memory",
    "not enough memory",
    "can't allocate memory",
    "cannot allocate memory",
    "memory allocation failed",
    "failed to allocate",
    "cudaerrormemoryallocation",
    "cuda_error_out_of_memory",
    "cufft_alloc_failed",
    "cublas_status_alloc_failed",
)


def out_of_memory(exc: BaseException) -> OutOfMemoryError | None:
    """The :class:`OutOfMemoryError` to raise for ``exc``, or None when ``exc`` is no memory exhaustion."""
    if isinstance(exc, OutOfMemoryError) or not isinstance(exc, Exception):
        return None
    oom = isinstance(exc, MemoryError) or any(c.__name__ == "OutOfMemoryError" for c in type(exc).__mro__)
    if not oom and isinstance(exc, RuntimeError):
        text = str(exc).lower()
        oom = any(m in text for m in _OOM_MESSAGES)
    if not oom:
        return None
    err = OutOfMemoryError(
        "memory",
        "enough free memory for this call",
        f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}".strip(),
        "free arrays (or plan_cache.clear(), which releases plan workspaces nobody uses) and retry",
    )
    return err


def raise_if_out_of_memory(exc: BaseException) -> None:
    """Raise :class:`OutOfMemoryError` from ``exc`` when ``exc`` means memory ran out; else return."""
    err = out_of_memory(exc)
    if err is not None:
        raise err from exc


def wrap_result(result: Any, adapter: Any, like: Any) -> Any:
    """``result`` (an array, or ``(array, aux dict)``) as ``adapter`` returns results for the caller's ``like``."""
    if result.__class__ is tuple:
        out, aux = result
        return adapter.wrap(out, like), {k: adapter.wrap(v, like) for k, v in aux.items()}
    return adapter.wrap(result, like)


def run(
    plan: Any,
    operands: dict[str, Any] | None,
    stream: Any = None,
    direct_args: tuple | None = None,
    wrap: tuple[Any, Any] | None = None,
    pinned: bool = True,
) -> Any:
    """Run ``plan`` (pinned by the caller) on ``operands`` (views, as executors take them):
    ``plan.execute(operands, stream)``, or its direct call ``plan.direct(*direct_args)`` when those are given
    (the Plan protocol's); let go of the plan when done (``pinned``; a plan the cache does not pin needs none);
    ``wrap``: ``(adapter, like)`` where the result goes back through the adapter."""
    try:
        if direct_args is not None:
            result = plan.direct(*direct_args)
        else:
            result = plan.execute(operands, stream)
    except Exception as exc:
        raise_if_out_of_memory(exc)
        raise
    finally:
        if pinned:
            plan_cache.let_go(plan)
    return result if wrap is None else wrap_result(result, *wrap)


def run_direct(plan: Any, args: tuple, pinned: bool = True) -> Any:
    """:func:`run` of a plan's direct call on arrays that need no view and a result that needs no wrap: the
    commonest cached call (the compiled front runs the same in C)."""
    try:
        return plan.direct(*args)
    except Exception as exc:
        raise_if_out_of_memory(exc)
        raise
    finally:
        if pinned:
            plan_cache.let_go(plan)
