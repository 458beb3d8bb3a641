"""What the staged kernels share: running a callback over XLA's buffers, and finding the plan for them.

A staged call is one :func:`jax.experimental.buffer_callback` per platform (:func:`jax.lax.platform_dependent`
picks the branch when XLA compiles for a platform): the callback receives XLA's input and output buffers (NumPy
views on the CPU, device memory with ``__cuda_array_interface__`` and XLA's stream on the GPU) and fills the
outputs in place, so nothing is copied on the way in or out of the program and nothing waits on the host.
Under :func:`jax.vmap` the callback is called once with the batch axis added in front of every operand
(``vmap_method="expand_dims"``): the kernels take their operands' shapes from the buffers at run time.

:class:`PlanFinder` is the per-kernel memo from run-time shapes to the cached plan of the ``cuda`` executor
(through the shared plan cache: re-tracing or re-running the same shapes finds the same plan).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from .._backends import candidates, set_state
from .._plan_cache import plan_cache
from .._route import acquire_plan, log, plan_key
from ..errors import ExecutorUnavailableError, NoExecutorError
from ..executors import builtin

__all__ = ["stage", "device_pointer", "device_index", "PlanFinder"]


def stage(callback: Callable[..., None], result_avals, *args):
    """``callback(ctx, outputs, *inputs)`` staged on ``args`` (JAX values) with outputs ``result_avals`` (a
    tuple of :class:`jax.ShapeDtypeStruct`); returns the outputs as a tuple of JAX values."""
    try:
        from jax.experimental.buffer_callback import buffer_callback
    except ImportError:
        import jax

        raise ExecutorUnavailableError(
            "jax", "a JAX with jax.experimental.buffer_callback (a newer jax)", f"jax {jax.__version__}"
        ) from None
    return tuple(buffer_callback(callback, tuple(result_avals), vmap_method="expand_dims")(*args))


def device_pointer(buffer) -> int:
    """The device address of an XLA GPU buffer."""
    return int(buffer.__cuda_array_interface__["data"][0])


def device_index(buffer) -> int:
    """The CUDA ordinal of the device an XLA GPU buffer lives on."""
    get = getattr(buffer, "__dlpack_device__", None)
    if get is not None:
        return int(get()[1])
    from .._cuda import runtime

    return runtime.current_device()


class PlanFinder:
    """The ``cuda`` executor's plan for each problem a kernel meets (one per run-time shape and device), found
    by a handle into the shared plan cache after the first time (no problem hashed per call)."""

    def __init__(self, operation: str, state) -> None:
        self.operation = operation
        self.state = state
        self._known: dict[Hashable, tuple[Any, Any, tuple]] = {}  # key -> (problem, executor, (plan key, handle))

    def acquire(self, key: Hashable, problem_of: Callable[[], Any], strategy: str):
        """``(plan, problem)``: the plan for the problem ``problem_of()`` builds (remembered under ``key``),
        pinned until ``plan_cache.let_go(plan)``."""
        known = self._known.get(key)
        if known is not None:
            problem, executor, (pkey, handle) = known
            plan = None if handle is None else plan_cache.acquire_handle(*handle)
            if plan is not None:
                return plan, problem
        else:
            problem = problem_of()
            executor = self._executor(problem)
            offered = executor.strategies(self.operation, problem)
            if strategy not in offered:
                raise NoExecutorError(
                    "backend",
                    f"the 'cuda' executor's {strategy!r} plan for this {self.operation} (writing XLA's buffers)",
                    f"strategies {offered} only",
                    "cuBLASLt has no fused kernel for this case on this GPU: stage the epilog with jax.numpy instead",
                )
            pkey = plan_key(executor, self.operation, problem, strategy)
            log.debug("%s staged in a JAX program: %s", self.operation, problem)
        plan = acquire_plan(executor, self.operation, problem, strategy)
        if len(self._known) < 64:
            self._known[key] = (problem, executor, (pkey, plan_cache.handle(pkey)))
        return plan, problem

    def _executor(self, problem):
        """The ``cuda`` executor, where the backend state traced with the call lets it run ``problem``."""
        cuda = builtin("cuda")
        with set_state(self.state):
            allowed = any(c.executor is cuda for c in candidates(problem.framework, "cuda"))
        why = cuda.decline(self.operation, problem, coerce=False) if allowed else None
        if not allowed or why:
            raise NoExecutorError(
                "backend",
                f"the 'cuda' executor for this {self.operation} (inside jax.jit on a GPU nvdispatch runs its "
                "cuBLASLt/cuFFT plans on XLA's buffers)",
                why or "a backend state that excludes it (set_backend/skip_backend when the function was traced)",
            )
        return cuda
