"""The launch sequence of every cuBLASLt plan, regular and FP8: one ``cublasLtMatmul`` queued on the caller's
stream, with no host synchronisation.

A :class:`LtLaunch` holds what launches share: the descriptors, the algorithm in use (the heuristic's first
answer, a recorded or an autotuned one), a workspace per stream and which operand is cuBLASLt's A. A call

1. runs the plan's algorithm where every pointer is 256-byte aligned, else the heuristic's first answer for
   the pointers' alignment (memoised by the descriptors);
2. takes the algorithm's workspace on the stream: the plan's own for that stream (allocated once per stream with
   ``cudaMallocAsync``, grown when an algorithm needs more, given back in stream order), or, while the stream is
   being captured into a CUDA graph, one for this launch alone from the caller's allocator (the graph's memory
   pool), given back once the launch is queued;
3. sets the epilogue's pointers (bias, aux, scales, amax) on the descriptor where they changed since the last
   launch, and launches — both under one lock, so threads sharing the plan never launch with each other's
   pointers;
4. raises the library's error for a failed status.
"""

from __future__ import annotations

import ctypes
import threading

from .._plan_cache import plan_cache
from . import cublaslt as lt
from . import memory
from .stream_clock import capturing

__all__ = ["alignment", "LtLaunch"]


def alignment(ptr: int) -> int:
    """The largest power of two (at most 256) dividing ``ptr``: the alignment the heuristic is asked for."""
    return 256 if ptr % 256 == 0 else (ptr & -ptr) or 256


class LtLaunch:
    """The launch sequence (see the module docstring) of one plan's descriptors ``core`` on ``handle``.

    ``a_first``: whether cuBLASLt's A is our operand ``a`` (else ``b``: the row orientation, ``D^T = B^T A^T``),
    computed once by the plan. ``kind`` names the plan's kernels in errors ("FP8"; "" for the regular ones);
    pointers aligned to fewer than ``min_alignment`` bytes have no algorithm (FP8 kernels need 16).
    """

    def __init__(
        self, core, handle: int, device_index: int, algo, *, a_first: bool, kind: str = "", min_alignment: int = 1
    ):
        self.core = core
        self.handle = handle
        self.device_index = device_index
        #: the algorithm 256-byte-aligned launches run (a ``HeuristicResult``)
        self.algo = algo
        self.a_first = a_first
        self.min_alignment = min_alignment
        self._what = f"cublasLtMatmul ({kind})" if kind else "cublasLtMatmul"
        self._library = f"{kind} cuBLASLt" if kind else "cuBLASLt"
        #: stream -> its workspace (``memory.Scratch``)
        self.workspaces: dict[int, object] = {}
        self._lock = threading.Lock()
        self._pointers: tuple = ()  # the (attribute, pointer) pairs the descriptor holds
        #: the plan this launch is part of (a weak reference, set by it): told to the plan cache when a
        #: workspace grows, so the cache's byte bound counts it
        self.owner = None

    def __call__(
        self,
        ptr_a: int,
        ptr_b: int,
        ptr_c: int,
        ptr_d: int,
        alpha: int,
        beta: int,
        stream: int,
        pointers: tuple = (),
        allocator: str = "",
    ) -> None:
        """Queue ``D = alpha op(A) op(B) + beta C`` on ``stream``: ``ptr_a``/``ptr_b`` are our operands ``a``
        and ``b``, ``alpha``/``beta`` host pointers in the scale type, ``pointers`` the descriptor's pointer
        attributes as ``(attribute, pointer)`` pairs, ``allocator`` the framework whose allocator gives the
        workspace of a launch under stream capture ("" or one without: ``cudaMallocAsync``)."""
        algo = self.algo
        mixed = ptr_a | ptr_b | ptr_c | ptr_d
        if mixed & 255:
            algo = self.algorithm_for(alignment(mixed))
        ws_size = algo.workspaceSize
        ws_ptr, own = 0, None
        if ws_size:
            if capturing(stream):
                own = memory.scratch(ws_size, allocator, self.device_index, stream)
                ws_ptr = own.ptr
            else:
                ws_ptr = self.workspace(stream, ws_size)
        first, second = (ptr_a, ptr_b) if self.a_first else (ptr_b, ptr_a)
        core = self.core
        with self._lock:
            if pointers != self._pointers:
                for attr, ptr in pointers:
                    core.desc.set_ptr(attr, ptr)
                self._pointers = pointers
            status = lt.matmul_call()(
                self.handle,
                core.desc.ptr,
                alpha,
                first,
                core.a.ptr,
                second,
                core.b.ptr,
                beta,
                ptr_c,
                core.c.ptr,
                ptr_d,
                core.d.ptr,
                ctypes.addressof(algo.algo),
                ws_ptr,
                ws_size,
                stream,
            )
        if own is not None:
            own.release()
        if status:
            lt.check(status, self._what)

    def algorithm_for(self, align: int):
        """The heuristic's first algorithm for operands aligned to ``align`` bytes (raises where it has none)."""
        found = self.core.algorithms(self.handle, align) if align >= self.min_alignment else []
        if not found:
            raise lt.CublasLtError(f"no {self._library} algorithm for {align}-byte aligned operands", 15)
        return found[0]

    def workspace(self, stream: int, nbytes: int) -> int:
        """The pointer of ``stream``'s workspace, at least ``nbytes``. It comes from ``cudaMallocAsync``, never from
        a framework's pool: the plan holds it across calls, and a framework may route every allocation into a CUDA
        graph's private pool (Torch's CUDA-graph trees warm a graph up that way), where memory held past the call
        is an allocation the graph does not own."""
        ws = self.workspaces.get(stream)
        if ws is None or ws.nbytes < nbytes:
            if ws is not None:
                ws.release()
            ws = self.workspaces[stream] = memory.scratch(nbytes, "", self.device_index, stream)
            plan = self.owner() if self.owner is not None else None
            if plan is not None:
                plan_cache.resized(plan)
        return ws.ptr

    @property
    def workspace_bytes(self) -> int:
        """Bytes of the workspaces held, and at least what the algorithm needs before its first launch."""
        held = sum(int(w.nbytes) for w in list(self.workspaces.values()))
        return max(held, int(getattr(self.algo, "workspaceSize", 0) or 0))

    def release(self) -> None:
        """Give the workspaces back in stream order (safe while launches using them are queued)."""
        ws, self.workspaces = self.workspaces, {}
        for w in ws.values():
            w.release()
