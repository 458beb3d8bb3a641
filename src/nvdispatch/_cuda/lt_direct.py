"""A regular cuBLASLt plan's direct call — the Plan protocol's ``direct(a, b[, bias])`` for the commonest form:
alpha 1, no c, the current stream, operands read in place, at most a bias, no aux input or output — and the
Python side of its compiled form (``_hotpath_lt.c``'s ``make_lt_direct``): when that form serves and what it is
handed. The Python form is the plan's own (``LtMatmulPlan.python_direct``); the compiled one hands it the calls
it does not serve.
"""

from __future__ import annotations

import ctypes
import weakref

from .._compiled import hotpath
from .._matmul_problem import MatmulProblem
from . import cublaslt as lt
from .lt_setup import LtSetup

__all__ = ["serves", "compiled_direct"]


def serves(p: MatmulProblem, s: LtSetup, strategy: str, needs_helper: bool) -> bool:
    """Whether plans of ``p`` set up as ``s`` have a direct call (``needs_helper``: a call copies or converts
    something through CuPy/Torch first, which the direct call does not)."""
    names = tuple(p.input_sigs)
    return not (
        needs_helper
        or s.lt_a.copy
        or s.lt_b.copy
        or s.c_mode != "none"
        or s.bgrad
        or s.aux_out
        or s.aux_in
        or p.epilog.outputs
        or names not in ((), ("bias",))
        or (names and strategy != "native")
    )


def compiled_direct(
    core, handle: int, algo, *, one: int, zero: int, keep: tuple, a_first: bool, bias: bool, result, current_stream,
    fallback,
):  # fmt: skip
    """The direct call compiled, or None where the extension is not built, the result is not made by operand
    ``a`` itself untransposed (``result``: ``(kind, args, kwargs, transposed)`` of
    :func:`.arrays.result_from_operand`, or None) or the algorithm needs a workspace.

    It launches ``algo`` on descriptors of its own (``core``: it sets the bias pointer there, under its own
    lock) with the host scalars 1 and 0 at ``one``/``zero`` (``keep`` holds what owns them, the descriptors
    and the algorithm alive as long as the call), and hands calls whose pointers are not 256-byte aligned to
    ``fallback`` (a bound method, held weakly)."""
    compiled = hotpath()
    if compiled is None or result is None or result[3] or algo.workspaceSize:
        return None
    ints = (
        lt.address("cublasLtMatmul"),
        lt.address("cublasLtMatmulDescSetAttribute"),
        handle,
        core.desc.ptr,
        core.a.ptr,
        core.b.ptr,
        core.c.ptr,
        core.d.ptr,
        ctypes.addressof(algo.algo),
        one,
        zero,
        int(a_first),
        lt.DESC_BIAS_POINTER if bias else -1,
    )
    _, args, kwargs, _ = result
    return compiled.make_lt_direct(
        ints, (core, algo, keep), args, kwargs, current_stream, lt.check, weakref.WeakMethod(fallback)
    )
