"""Autotuning the cuBLASLt plans of matmuls staged into JAX programs, when the program is traced.

XLA times the candidates of its own GEMMs when it compiles a program; a matmul nvdispatch stages into
``jax.jit`` does the same with its plan: when the plan is made for the staged call (the XLA FFI route plans
while tracing; the callback route's plan is made then too, for the run to find), its cuBLASLt candidates are
timed on scratch buffers of the problem's shapes on a private stream
(:func:`~nvdispatch._cuda.lt_scratch_autotune.autotune_on_scratch`) and the plan keeps the fastest. A choice
is made once per problem and machine:

* in the process, the plan cache records it (``plan_cache.tunings()``): every later plan of the problem — a
  re-trace, another program, an eager call — starts with it, and nothing is timed again;
* between processes, it is kept in the cuBLASLt tunings file of the GPU (:mod:`nvdispatch.executors.cuda_tuning_store`,
  in ``NVDISPATCH_CACHE_DIR``): a fresh process takes it from there after cuBLASLt checks it.

``NVDISPATCH_JAX_AUTOTUNE`` (or :func:`jax_autotune` around the tracing; the block's mode is part of JAX's trace
cache key, so a function traced with autotuning off is traced again, and tuned, where it is called with it on)
decides, per traced call:

``"auto"`` (the default)
    products of at least :data:`MIN_FLOP` floating-point operations (``2 m n k`` per batch matrix) are tuned;
    smaller ones keep the heuristic's first answer: they run in a few microseconds, where what timing can win
    is within the timing's own noise and the launch's host cost, and the timing (a few milliseconds per
    candidate) would cost more than a long run of calls could win back.
``"always"``
    every staged product is tuned.
``"off"``
    nothing is timed or read from the file: plans start with the heuristic's answer (or a choice recorded in
    this process by ``Matmul.autotune``/``plan_cache.load``, as every plan does).

The timing is bounded: the first :data:`MAX_CANDIDATES` candidates in :mod:`~nvdispatch._cuda.lt_autotune`'s
order (the heuristic's, smaller workspaces, split-K, then the neighbourhood), screening stops after
:data:`BUDGET_SECONDS`, :data:`ITERATIONS` samples of each finalist. The candidates run as the handler launches
the plan (its descriptors, epilogue and bias, the algorithm's own workspace size, 256-byte aligned buffers as
XLA's are). The heuristic's first answer (what an untuned program runs) is kept unless the fastest finalist
beats it on fresh samples, in most rounds and by at least ``lt_autotune.MIN_GAIN``
(:func:`~nvdispatch._cuda.lt_autotune.keeps_challenger`): a kernel equal within the timing's noise no longer
replaces it. What was timed and the winner are logged at DEBUG; ``explain()`` says where a problem's choice came
from (:func:`explain_line`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator

from ..errors import InvalidArgumentError
from . import lt_tune_once
from ._settings import block_or_env, setting_block, trace_key
from .lt_tune_once import BUDGET_SECONDS, ITERATIONS, MAX_CANDIDATES, MIN_FLOP

__all__ = [
    "MODES",
    "MIN_FLOP",
    "MAX_CANDIDATES",
    "BUDGET_SECONDS",
    "ITERATIONS",
    "autotune_mode",
    "jax_autotune",
    "tune_staged",
    "wants_timing",
    "explain_line",
]

MODES = ("auto", "always", "off")

_asked: contextvars.ContextVar[str | None] = contextvars.ContextVar("nvdispatch_jax_autotune", default=None)
#: the block's mode in JAX's trace cache key: a function jitted earlier is traced again under another mode
_trace_key = trace_key()
#: tuning key -> where its choice came from (this process's trace-time outcomes)
_outcomes: dict = {}
#: (m, n, k, batch, dtype, epilog) -> the latest outcome for such a product (what explain() reports)
_by_product: dict = {}


def autotune_mode() -> str:
    """The mode asked for: :func:`jax_autotune`'s inside its block, else ``NVDISPATCH_JAX_AUTOTUNE`` (``"auto"``)."""
    return block_or_env(_asked, "NVDISPATCH_JAX_AUTOTUNE", "auto", MODES)


@contextlib.contextmanager
def jax_autotune(mode: str) -> Iterator[None]:
    """Within the block, matmuls staged into JAX programs traced there are autotuned as ``mode`` says
    (``"auto"``, ``"always"`` or ``"off"``; see the module docstring). The mode is part of JAX's trace cache key:
    a function jitted earlier and called in the block is traced again under it; a compiled program
    (``jax.jit(f).lower(...).compile()``) keeps what its trace chose.

    Examples
    --------
    >>> from nvdispatch.integrations.jax_autotune import autotune_mode, jax_autotune
    >>> with jax_autotune("off"):
    ...     autotune_mode()
    'off'
    """
    with setting_block(_asked, "mode", mode, MODES, _trace_key):
        yield


def wants_timing(problem, mode: str) -> bool:
    """Whether ``mode`` has a plan of ``problem`` timed (where no choice is recorded for it yet)."""
    return mode == "always" or (mode == "auto" and lt_tune_once.flop(problem) >= MIN_FLOP)


def _product(problem) -> tuple:
    return (problem.m, problem.n, problem.k, math.prod(problem.batch_shape), problem.result_dtype,
            problem.epilog.epilog.name)


def _note(problem, outcome: str) -> str:
    _by_product[_product(problem)] = outcome
    return outcome


def tune_staged(plan, mode: str, alpha=1, beta=None) -> str:
    """Autotune ``plan`` (a cuBLASLt plan made for a staged call, launched with ``alpha``/``beta``) as ``mode``
    says, once per problem (see the module docstring; :func:`.lt_tune_once.tune_once`); returns where its
    algorithm came from. Never raises for the timing's sake: a failure is logged and the plan keeps its
    algorithm."""
    from .._cuda import lt_autotune

    problem = plan.problem
    if getattr(plan, "tuning_kind", None) != lt_autotune.TUNING_KIND:
        return _note(problem, "the plan's own algorithm (not a cuBLASLt plan)")
    if mode == "off":
        return _note(problem, "the heuristic's first answer (trace-time autotuning off: NVDISPATCH_JAX_AUTOTUNE)")
    if not wants_timing(problem, mode):
        return _note(problem, f"the heuristic's first answer ({lt_tune_once.flop(problem):.3g} flop, below the "
                              f"{MIN_FLOP:.3g} that trace-time autotuning starts at)")
    return _note(problem, lt_tune_once.tune_once(
        plan, alpha, beta, outcomes=_outcomes, who="jax", timed_as="timed when the program was traced",
        failed_as="trace-time autotuning", budget=BUDGET_SECONDS,
    ))  # fmt: skip


def explain_line(problem) -> str:
    """What ``explain()`` says of the cuBLASLt algorithm of ``problem`` staged into a JAX program on the GPU."""
    try:
        mode = autotune_mode()
    except InvalidArgumentError as exc:
        return f"trace-time autotuning: {exc}"
    seen = _by_product.get(_product(problem)) if problem is not None and hasattr(problem, "epilog") else None
    if seen is not None:
        return f"its cuBLASLt algorithm when last traced: {seen}"
    if mode == "off":
        return "its cuBLASLt algorithm: the heuristic's first answer (trace-time autotuning off)"
    size = lt_tune_once.flop(problem) if problem is not None and hasattr(problem, "m") else None
    if mode == "auto" and size is not None and size < MIN_FLOP:
        return (f"its cuBLASLt algorithm: the heuristic's first answer ({size:.3g} flop, below the "
                f"{MIN_FLOP:.3g} that trace-time autotuning starts at)")
    return ("its cuBLASLt algorithm is autotuned when a program staging it is traced (kept for the process and in "
            "the cuBLASLt tunings file)")
