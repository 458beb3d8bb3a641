"""The contract between the core and an executor, enforced at the boundary of the one route.

The built-in executors (``nvdispatch.executors.*``) are trusted and called directly. Every other executor —
one a user registers or passes to ``set_backend`` — goes through the functions below, which the route
(:mod:`nvdispatch._route`) calls in place of the executor's own methods:

* :func:`decline` / :func:`strategies` check what the executor answers (a reason string or None; a non-empty
  sequence of strategy names) and turn a call the executor's signature cannot take into a typed error;
* :func:`plan` checks the plan it returns (an object with ``execute``) and wraps it in a :class:`CheckedPlan`,
  which checks every result (an array nvdispatch recognises, of the problem's shape and dtype; for an epilog
  with outputs a ``(result, aux)`` pair with exactly the epilog's aux keys);
* a matmul epilog the executor does not declare in ``fused_epilogs`` is not its business: it sees the
  problem without the epilog (:func:`problem_for`) and the core applies the epilog's steps to the result,
  with the array operations of the result's memory kind (NumPy's on host memory, Torch's on Torch tensors,
  CuPy's on CuPy arrays).

Every breach raises :class:`~nvdispatch.errors.ExecutorContractError` naming the executor and the method.
The protocol itself is documented in :mod:`nvdispatch.executors.base`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ._detect import detect
from ._epilog import OUTPUTS, apply_steps, finish_outputs, prepare_inputs, spec_of
from ._memory import CUPY_ARRAY, HOST, TORCH_TENSOR
from ._plan_cache import workspace_bytes_of
from .errors import ExecutorContractError, NvdispatchError, describe

__all__ = ["trusted", "problem_for", "decline", "strategies", "plan", "CheckedPlan"]


def trusted(executor: Any) -> bool:
    """Whether ``executor`` is one of nvdispatch's own (called without checks)."""
    return type(executor).__module__.startswith("nvdispatch.executors.")


def _name(executor: Any) -> str:
    return repr(getattr(executor, "name", type(executor).__name__))


def _fuses(executor: Any, epilog_name: str) -> bool:
    fused = getattr(executor, "fused_epilogs", frozenset())
    return fused == "all" or epilog_name in fused


def problem_for(executor: Any, op: str, problem: Any) -> Any:
    """The problem ``executor`` is asked about: ``problem`` itself, or for a matmul whose epilog the executor
    does not fuse, the same matmul without the epilog (the core applies it)."""
    if op != "matmul" or trusted(executor) or not problem.epilog.steps:
        return problem
    if _fuses(executor, problem.epilog.epilog.name):
        return problem
    return dataclasses.replace(problem, epilog=spec_of(None), bias_axis=None, inputs=())


def decline(executor: Any, op: str, problem: Any, coerce: bool) -> str | None:
    """``executor.decline(op, problem, coerce=coerce)``, checked."""
    if trusted(executor):
        return executor.decline(op, problem, coerce=coerce)
    if (
        op == "matmul"
        and problem.epilog.steps
        and not problem.memory & _EPILOG_OPS.keys()
        and not _fuses(executor, problem.epilog.epilog.name)
    ):
        return (
            f"does not fuse {problem.epilog.epilog.name} (not in its fused_epilogs), and nvdispatch applies "
            f"epilogs itself only to results in {', '.join(sorted(_EPILOG_OPS))} memory"
        )
    try:
        reason = executor.decline(op, problem_for(executor, op, problem), coerce=coerce)
    except TypeError as exc:
        raise ExecutorContractError(
            f"executor {_name(executor)}: decline()",
            "the signature decline(op, problem, *, coerce=False)",
            f"a call that raised TypeError: {exc}",
        ) from exc
    if reason is not None and not isinstance(reason, str):
        raise ExecutorContractError(
            f"executor {_name(executor)}: decline()", "None (takes the call) or a reason string", describe(reason)
        )
    return reason


def strategies(executor: Any, op: str, problem: Any) -> tuple[str, ...]:
    """``executor.strategies(op, problem)`` as a non-empty tuple of names, checked."""
    if trusted(executor):
        return tuple(executor.strategies(op, problem))
    got = executor.strategies(op, problem_for(executor, op, problem))
    names = tuple(got) if isinstance(got, (tuple, list)) else None
    if not names or not all(isinstance(s, str) for s in names):
        raise ExecutorContractError(
            f"executor {_name(executor)}: strategies()",
            "a non-empty tuple of strategy names, best first (it did not decline the call)",
            describe(got) if names is None else repr(got),
        )
    return names


def plan(executor: Any, op: str, problem: Any, strategy: str, tuning: Any = None) -> Any:
    """``executor.plan(...)``, checked and (for a user executor) wrapped in a :class:`CheckedPlan`."""
    if trusted(executor):
        return executor.plan(op, problem, strategy, tuning)
    inner = problem_for(executor, op, problem)
    made = executor.plan(op, inner, strategy, tuning)
    if not callable(getattr(made, "execute", None)):
        raise ExecutorContractError(
            f"executor {_name(executor)}: plan()",
            "a plan: an object with execute(operands, stream) (see nvdispatch.executors.base.Plan)",
            describe(made),
        )
    return CheckedPlan(executor, op, problem, inner, made, strategy)


class CheckedPlan:
    """A user executor's plan, seen through the contract: the core's epilog steps (where the executor does not
    fuse the epilog) and a check of every result."""

    direct = None  # no direct call: every call goes through execute and its checks

    def __init__(self, executor: Any, op: str, problem: Any, inner: Any, plan: Any, strategy: str):
        self.executor_name = _name(executor)
        self.op, self.problem, self.inner, self.plan = op, problem, inner, plan
        self.strategy = getattr(plan, "strategy", strategy)
        self.core_epilog = inner is not problem
        steps = tuple(getattr(plan, "steps", ()) or ())
        if self.core_epilog:
            steps += tuple(
                f"{s} (applied by nvdispatch: executor {self.executor_name} does not fuse "
                f"{problem.epilog.epilog.name})"
                for s in problem.epilog.steps
            )
        self.steps = steps

    def execute(self, operands: Mapping[str, Any], stream: Any = None) -> Any:
        if self.core_epilog:
            inner_ops = {k: v for k, v in operands.items() if k not in dict(self.problem.inputs)}
            result = self._checked(self.plan.execute(inner_ops, stream), self.inner)
            return self._apply_epilog(result, operands)
        return self._checked(self.plan.execute(operands, stream), self.problem)

    @property
    def workspace_bytes(self) -> int:
        """The user plan's workspace bytes (the plan cache bounds them)."""
        return workspace_bytes_of(self.plan)

    def release(self) -> None:
        release = getattr(self.plan, "release", None)
        if release is not None:
            release()

    def tuning(self) -> Any:
        tuning = getattr(self.plan, "tuning", None)
        return tuning() if callable(tuning) else None

    # -- checks --------------------------------------------------------------------------------------------
    def _fail(self, expected: str, got: str) -> None:
        raise ExecutorContractError(f"executor {self.executor_name}: plan.execute()", expected, got)

    def _checked(self, result: Any, problem: Any) -> Any:
        outputs = problem.epilog.outputs if self.op == "matmul" else ()
        if outputs:
            if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], Mapping)):
                self._fail(f"(result, aux) with aux a dict of {list(outputs)} for {problem.epilog.epilog.name}",
                           describe(result))
            out, aux = result
            if set(aux) != set(outputs):
                self._fail(f"aux keys {sorted(outputs)}", f"aux keys {sorted(aux)}")
            for name, value in aux.items():
                shape = problem.result_shape if OUTPUTS[name].kind == "pre_activation" else None
                self._check_array(value, f"aux[{name!r}]", shape, None)
        else:
            out = result
        shape = problem.result_shape if self.op == "matmul" else getattr(problem, "out_shape", None)
        self._check_array(out, "the result", shape, getattr(problem, "result_dtype", None))
        return result

    def _check_array(self, value: Any, what: str, shape: tuple | None, dtype: str | None) -> None:
        try:
            info = detect(what, value)
        except NvdispatchError:
            self._fail(f"{what}: an array nvdispatch recognises", describe(value))
        if shape is not None and tuple(info.shape) != tuple(shape):
            self._fail(f"{what} of shape {tuple(shape)}", f"shape {tuple(info.shape)}")
        if dtype is not None and info.dtype != dtype:
            self._fail(f"{what} of dtype {dtype}", f"dtype {info.dtype}")

    # -- the core's epilog ---------------------------------------------------------------------------------
    def _apply_epilog(self, result: Any, operands: Mapping[str, Any]) -> Any:
        p = self.problem
        ops = _ops_for(result)
        d = result.reshape(p.promoted_shape)
        a, b = operands["a"], operands["b"]
        if p.a_vector:
            a = a.reshape(1, -1)
        if p.b_vector:
            b = b.reshape(-1, 1)
        inputs = prepare_inputs(p, operands)
        d, aux = apply_steps(p.epilog, d, inputs, ops, a=a, b=b, bgrad_axis=p.options.bgrad_axis)
        out = p.squeeze(d)
        return (out, finish_outputs(p, aux)) if p.epilog.outputs else out


def _numpy_ops() -> Any:
    from ._epilog_numpy import NumpyEpilogOps

    return NumpyEpilogOps(inplace=False)


def _torch_ops() -> Any:
    from ._epilog_torch import TORCH_PLAIN

    return TORCH_PLAIN


def _cupy_ops() -> Any:
    from ._epilog_cupy import CUPY_INPLACE

    return CUPY_INPLACE  # in place on the executor's fresh result


#: memory kind -> its epilog step vocabulary (out of place where one exists), for the epilogs the core applies
_EPILOG_OPS = {HOST: _numpy_ops, TORCH_TENSOR: _torch_ops, CUPY_ARRAY: _cupy_ops}


def _ops_for(result: Any) -> Any:
    """The epilog step vocabulary of ``result``'s memory kind."""
    memory = detect("result", result).memory
    return next(ops for kind, ops in _EPILOG_OPS.items() if kind in memory)()
