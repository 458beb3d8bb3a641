"""A regular cuBLASLt plan's direct call — the Plan protocol's ``direct(a, b[, x])`` for the common forms: alpha
1, no c, the current stream, operands read in place, at most one epilogue input ``x`` (the bias, or the aux a
DRELU/DGELU epilogue reads, in cuBLASLt's layout) and at most one extra output (the aux of a ``*_AUX``
epilogue, the bias gradient of a BGRAD one) — and the Python side of its compiled form (``_hotpath_lt.c``'s
``make_lt_direct``): when that form serves and what it is handed. The Python form is the plan's own
(``LtMatmulPlan.python_direct``); the compiled one hands it the calls it does not serve.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import weakref

from .._compiled import hotpath
from .._matmul_problem import MatmulProblem
from . import cublaslt as lt
from .arrays import make_view, result_maker
from .lt_aux import aux_output_layout, bias_gradient_layout
from .lt_setup import LtSetup
from .stream_clock import capture_query_address, capturing

__all__ = ["serves", "plain", "input_attribute", "extra_output", "compiled_direct", "launch_workspace"]

_log = logging.getLogger("nvdispatch")

#: the epilogue inputs a direct call takes as its third array
_INPUTS = ((), ("bias",), ("relu_aux",), ("gelu_aux",))


def serves(p: MatmulProblem, s: LtSetup, strategy: str, needs_helper: bool) -> bool:
    """Whether plans of ``p`` set up as ``s`` have a direct call (``needs_helper``: a call copies or converts
    something through CuPy/Torch first, which the direct call does not). An epilogue input or output needs the
    fused (``"native"``) strategy; one with an output, operands that are matrices (a 1-D operand's PEP 465 axes
    are dropped from outputs by the execute path)."""
    names = tuple(p.input_sigs)
    if needs_helper or s.lt_a.copy or s.lt_b.copy or s.c_mode != "none" or names not in _INPUTS:
        return False
    if names and (strategy != "native" or s.aux_in not in (None, "direct")):
        return False
    if p.epilog.outputs:
        return strategy == "native" and len(p.epilog.outputs) == 1 and not (p.a_vector or p.b_vector)
    return not (s.bgrad or s.aux_out)


def plain(p: MatmulProblem) -> bool:
    """Whether the direct call of ``p``'s plans is the plain one (no epilogue input but a bias, no extra output),
    which the Python direct call runs itself; the others run the plan's execute path there."""
    return tuple(p.input_sigs) in ((), ("bias",)) and not p.epilog.outputs


def input_attribute(p: MatmulProblem) -> int:
    """The descriptor's pointer attribute the direct call's third array sets: the bias's or the aux input's;
    -1 where the epilogue takes none."""
    names = tuple(p.input_sigs)
    if not names:
        return -1
    return lt.DESC_BIAS_POINTER if names == ("bias",) else lt.DESC_EPILOGUE_AUX_POINTER


def extra_output(p: MatmulProblem, s: LtSetup):
    """``(name, attribute, shape, dtype, view)`` of the epilogue's extra output (the bias gradient, written where
    the bias pointer points, or the aux), as :mod:`.lt_aux` lays it out; None where it writes none."""
    if s.bgrad:
        return (s.bgrad, lt.DESC_BIAS_POINTER, *bias_gradient_layout(p, s))
    if s.aux_out:
        return (p.epilog.outputs[0], lt.DESC_EPILOGUE_AUX_POINTER, *aux_output_layout(p, s))
    return None


def launch_workspace(launch, nbytes: int, stream: int) -> int | None:
    """The workspace of a compiled direct call's launch on ``stream``: ``launch``'s own for the stream (an
    :class:`~.lt_launch.LtLaunch`), or None while the stream is being captured into a CUDA graph (the Python
    path then takes one from the graph's pool for the launch alone)."""
    if capturing(stream):
        return None
    return launch.workspace(stream, nbytes)


def _workspace_call(launch, nbytes: int, query: int | None):
    """``workspace_fn`` of ``make_lt_direct`` for an algorithm needing ``nbytes`` of workspace (None where it
    needs none): ``launch.workspace`` where the compiled call asks the driver about a capture itself (``query``:
    the address it asks with), else :func:`launch_workspace`."""
    if not nbytes:
        return None
    if query:
        return functools.partial(launch.workspace, nbytes=nbytes)
    return functools.partial(launch_workspace, launch, nbytes)


def compiled_direct(
    core, handle: int, algo, *, one: int, zero: int, keep: tuple, a_first: bool, problem: MatmulProblem,
    setup: LtSetup, kind: str, order: str, launch, current_stream, fallback,
):  # fmt: skip
    """The direct call compiled, or None (logged at DEBUG) where the extension is not built, the result is not
    made C-ordered by operand ``a`` itself (``kind``: the result kind, ``order`` the result's storage order;
    the adapter's ``result_maker`` says how) or the algorithm needs a workspace and there is no ``launch`` (the
    plan's :class:`~.lt_launch.LtLaunch`, whose workspace for the stream the call takes; under a stream
    capture the call goes to ``fallback``).

    It launches ``algo`` on descriptors of its own (``core``: it sets the epilogue's pointers there, under its
    own lock) with the host scalars 1 and 0 at ``one``/``zero`` (``keep`` holds what owns them, the
    descriptors and the algorithm alive as long as the call), and hands calls whose pointers are not 256-byte
    aligned to ``fallback`` (a bound method, held weakly)."""
    p, s = problem, setup
    why = _declined(algo, order, launch)
    compiled = hotpath()
    if why is None and compiled is None:
        why = "the compiled extension is not built"
    made = None if why else result_maker(p.framework, p.result_shape, p.result_dtype)
    if why is None and (made is None or not isinstance(made[0], str)):
        why = f"{p.framework} operands do not make their results themselves"
    out = extra = None
    if why is None:
        out = extra_output(p, s)
        extra = None if out is None else _extra_maker(p, kind, out)
        if out is not None and extra is None:
            why = f"{p.framework} operands do not make the epilogue's output themselves"
    if why is not None:
        _log.debug("cuBLASLt direct call of %s in Python: %s", p.epilog.epilog.name, why)
        return None
    query = capture_query_address() if algo.workspaceSize else None
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
        input_attribute(p),
        -1 if out is None else out[1],
        int(algo.workspaceSize),
        query or 0,
    )
    maker, args, kwargs = made
    workspace = None if launch is None else _workspace_call(launch, int(algo.workspaceSize), query)
    return compiled.make_lt_direct(
        ints,
        (core, algo, keep),
        maker,
        args,
        kwargs,
        extra,
        workspace,
        current_stream,
        lt.check,
        weakref.WeakMethod(fallback),
    )


def _declined(algo, order: str, launch) -> str | None:
    """Why the compiled form cannot serve the plan (None: it can)."""
    if order != "C":
        return "the result is stored column-major (a view of a transposed buffer)"
    if algo.workspaceSize and launch is None:
        return "the algorithm needs a workspace and the plan has none to lend"
    return None


def _extra_maker(p: MatmulProblem, kind: str, extra: tuple):
    """``(name, args, kwargs, view)`` of the extra output for ``make_lt_direct``: made as the result is (the
    same method of operand a), seen through ``view`` (None: as made); None where the adapter has no maker."""
    name, _, shape, dtype, view = extra
    made = result_maker(p.framework, shape, dtype)
    if made is None or not isinstance(made[0], str):
        return None
    see = None
    if view is not None:
        view_shape, view_strides = view

        def see(buffer):
            return make_view(kind, buffer, view_shape, view_strides)

    return name, made[1], made[2], see
