"""What every cuBLASLt plan is — the regular one (:mod:`.lt_matmul`) and the FP8 one (:mod:`.lt_fp8`): its
descriptors, the one launch sequence (:mod:`.lt_launch`) with the algorithm in use, and on top of them what the
Plan protocol asks of both: ``execute`` on a stream, ``tuning``/``autotune``/``time``, ``workspace_bytes`` and
``release``.
"""

from __future__ import annotations

import weakref

from .._matmul_problem import MatmulProblem
from . import cublaslt as lt
from . import lt_autotune
from .lt_descriptors import device_index
from .lt_launch import LtLaunch
from .streams import current_stream_getter, framework_stream, stream_pointer
from .xp import Xp, namespace_for

__all__ = ["LtPlanBase"]


class LtPlanBase:
    """The shared part of the cuBLASLt plans. A subclass calls :meth:`_start` first, sets its descriptors up,
    calls :meth:`_plan_launch`, and implements ``_execute(operands, stream_pointer)``."""

    tuning_kind = lt_autotune.TUNING_KIND
    validate_tuning = staticmethod(lt_autotune.validate_choice)

    def _start(self, p: MatmulProblem, strategy: str) -> None:
        """The problem's placement: device, framework, its helper namespace (None: neither CuPy nor Torch is
        installed), its current stream."""
        self.problem = p
        self.strategy = strategy
        self.device_index = device_index(p)
        self.framework = p.framework
        xp_name = namespace_for(p.framework)
        self._xp = Xp(xp_name) if xp_name is not None else None
        self._current_stream = current_stream_getter(p.framework, self.device_index)
        #: the recorded autotune choice in use (see :mod:`.lt_autotune`), None while the heuristic's answer runs
        self.tuned = None

    def _plan_launch(self, core, *, a_first: bool, tuning=None, kind: str = "", min_alignment: int = 1) -> None:
        """Ask the heuristic for ``core``'s algorithm (a recorded choice replaces it) and make the launch."""
        self.core = core
        self.handle = lt.handle(self.device_index)
        algos = core.algorithms(self.handle, 256)
        if not algos:
            what = f"no {kind} algorithm" if kind else "no algorithm"
            raise lt.CublasLtError(f"cublasLtMatmulAlgoGetHeuristic ({what})", 15)
        self.launch = LtLaunch(
            core, self.handle, self.device_index, algos[0], a_first=a_first, kind=kind, min_alignment=min_alignment
        )
        self.launch.owner = weakref.ref(self)
        saved = lt_autotune.saved_choice(self, tuning)
        if saved is not None:
            self.launch.algo = saved

    # -- the algorithm ---------------------------------------------------------------------------------
    @property
    def algorithm(self):
        """The ``cublasLtMatmul`` algorithm launches use (the heuristic's first, a saved or an autotuned one)."""
        return self.launch.algo

    @algorithm.setter
    def algorithm(self, algo) -> None:
        self.launch.algo = algo
        self._algorithm_changed()

    def _algorithm_changed(self) -> None:
        """Called when autotune (or a caller) sets another algorithm."""

    def tuning(self):
        """The autotuned (or loaded) algorithm choice in use, None while the heuristic's first answer runs."""
        return self.tuned

    def autotune(self, operands, iterations: int = 3, stream=None):
        """Time the heuristic's candidates, smaller-workspace and split-K variants (see :mod:`.lt_autotune`)
        with CUDA events on ``stream``; keep and record the fastest. Returns ``[(label, seconds)]``."""
        from . import arrays
        from .lt_result_check import result_check

        sp = stream_pointer(stream, self.framework, self.device_index)
        latest: list = []  # the latest launch's result (read by the winner's check)

        def launch(result):
            self.algorithm = result
            got = self.execute(operands, sp)
            latest[:] = [got[0] if isinstance(got, tuple) else got]

        fw = self.framework
        views = {k: arrays.view(v, fw) for k, v in operands.items() if k not in ("alpha", "beta") and _is_array(v)}
        check = result_check(
            self.problem,
            lambda: arrays.view(latest[0], fw),
            tuple(self.problem.result_shape),
            views,
            sp,
            operands.get("alpha", 1),
            operands.get("beta"),
        )
        return lt_autotune.autotune(self, launch, sp, iterations, self.problem.plan_preferences.limit, check=check)

    def time(self, operands, iterations: int = 3, stream=None) -> float:
        """GPU seconds of one call (CUDA events)."""
        sp = stream_pointer(stream, self.framework, self.device_index)
        return lt_autotune.gpu_seconds(lambda: self.execute(operands, sp), sp, self.device_index, iterations)

    # -- execution and memory ----------------------------------------------------------------------------
    def execute(self, operands, stream=None):
        """Queue the matmul on ``stream`` (default: the operands' framework's current stream; the legacy default
        stream for a framework without streams of its own, JAX's or raw CUDA arrays, on which the CuPy/Torch helper
        viewing them then runs its copies too, not on its own current stream)."""
        if stream is None:
            current = self._current_stream
            xp = self._xp
            if current is not None or xp is None or xp.name == self.framework:
                return self._execute(operands, current() if current is not None else 0)
            sp = 0
        else:
            sp = stream if type(stream) is int else stream_pointer(stream, self.framework, self.device_index)
        helper = self._xp.name if self._xp is not None else ""  # the framework's own, or the one viewing its arrays
        with framework_stream(helper, sp, self.device_index):
            return self._execute(operands, sp)

    @property
    def workspace_bytes(self) -> int:
        """Bytes of the workspaces this plan holds (one per stream it ran on), and at least what its algorithm
        needs before the first run allocates it (so the plan cache bounds it from insertion on)."""
        return self.launch.workspace_bytes

    def release(self) -> None:
        """Give workspaces back in stream order (safe while launches using them are queued)."""
        self.launch.release()


def _is_array(value) -> bool:
    return hasattr(value, "shape") and getattr(value, "ndim", 0) > 0
