"""Matmul with fused epilogs on the CPU through NumPy.

Strategy ``inplace``: the product into the result, then ``alpha``/``beta * c`` and the epilog in place, in
one of three ways as calibrated per problem class: this module's pass (one ``np.matmul``, then the epilog block
of rows by block of rows, every epilog) or, for linear layers, the compiled sweep of ``numpy_matmul_engines``
(one ``np.matmul``, then bias and RELU in one pass) or the row panels of ``numpy_matmul_panels`` (each panel of
rows multiplied and finished at once while in cache). No full-size temporary is made beyond what the
epilog must return (aux outputs). Strategy ``plain``: separate NumPy expressions, as a user would write them.
The other strategies' engines are in ``numpy_matmul_engines``; which strategy is the default is the
calibration's call (``numpy_matmul_calibration``).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import math

import numpy as np

from .._epilog import INPUTS, OUTPUTS, STEPS, apply_steps, declined_mask_format, finish_outputs, output_of_kind
from .._epilog_numpy import NumpyEpilogOps, accumulator_dtype
from .._matmul_problem import MatmulProblem, compute_type_note, scalar_value
from .._tunings import an_int, check_object, require_valid
from . import numpy_matmul_calibration as calibration
from . import numpy_matmul_engines as engines
from .cpu_autotune import TuningProposal, propose
from .cpu_calibration_store import store
from .cpu_threads import CPUS, pool
from .numpy_matmul_contended import ContendedPlan
from .numpy_matmul_panels import PanelPlan

_log = logging.getLogger("nvdispatch")

#: bytes of result rows finished per block by default (a block stays in L2 through all epilog steps)
DEFAULT_BLOCK_BYTES = 1 << 18
_BLOCK_CHOICES = (1 << 16, 1 << 18, 1 << 20, 0)  # 0: the whole result at once
#: results at least this large get their epilog pass on all cores
_THREADED_BYTES = 1 << 22
_BF16 = "bfloat16"
_CPUS = CPUS


def _pool():
    return pool("cpu", _CPUS - 1)


def decline(problem: MatmulProblem) -> str | None:
    if problem.quantization is not None:
        return "NumPy has no FP8 matmul (Torch tensors run the FP8 reference path on the CPU)"
    if _widened(problem) and not _numpy_has_bfloat16():
        return "NumPy has no bfloat16 (none is registered with it: ml_dtypes, which JAX imports, registers one)"
    return declined_mask_format(problem, "NumPy")


def _numpy_has_bfloat16() -> bool:
    try:
        np.dtype(_BF16)
    except TypeError:
        return False
    return True


def _widened(problem: MatmulProblem) -> bool:
    """bfloat16 anywhere in the call (host arrays of ml_dtypes' bfloat16, e.g. JAX's on the CPU): computed in
    float32 by the ``plain`` strategy and rounded to bfloat16 once at the end, as Torch's and XLA's CPU kernels
    accumulate it (NumPy's ufuncs on ml_dtypes' type round every step and have no BLAS)."""
    sigs = (problem.a, problem.b, problem.c, *(sig for _, sig in problem.inputs))
    return problem.result_dtype == _BF16 or any(sig is not None and sig.dtype == _BF16 for sig in sigs)


def strategies(problem: MatmulProblem) -> tuple[str, ...]:
    """``plain`` alone for a bare product (and for bfloat16, see :func:`_widened`); else the strategies of the
    engines this machine has for the epilog (``native``: BLAS gemm with beta=1, ``framework_fused``: Torch's addmm
    family, ``inplace``: the row-panel engine or this module's pass, see ``numpy_matmul_engines``), fastest first
    as ranked for the problem's class (:func:`engine_choice`), then ``plain``."""
    if (not problem.epilog.steps and problem.c is None) or _widened(problem):
        return ("plain",)
    ranked = dict.fromkeys(engines.STRATEGY_OF[e] for e in engine_choice(problem).order)
    return (*ranked, "plain")


@dataclasses.dataclass(frozen=True)
class EngineChoice:
    """The engines that can run a problem, fastest first (``ufunc`` stands for this module's ``inplace``
    pass: the whole-result ufuncs for one block, the blocked pass beyond), and the class ranking it follows."""

    order: tuple[str, ...]
    ranking: calibration.Ranking


_choices: dict[MatmulProblem, tuple[tuple, EngineChoice]] = {}
_MAX_CHOICES = 1024


def engine_choice(problem: MatmulProblem) -> EngineChoice:
    """:class:`EngineChoice` for ``problem``, worked out once per problem (``strategies`` and ``plan`` both
    ask) and again only when a calibration changed the rankings. A query: never measures."""
    stamp = (calibration.generation(), store().path)
    got = _choices.get(problem)
    if got is not None and got[0] == stamp:
        return got[1]
    ranked = calibration.ranking(problem, candidates(problem))
    choice = EngineChoice(ranked.order, ranked)
    if len(_choices) >= _MAX_CHOICES:
        _choices.clear()
    _choices[problem] = (stamp, choice)
    return choice


def engine_order(problem: MatmulProblem) -> tuple[str, ...]:
    """The engines that can run ``problem``, fastest first (see :func:`engine_choice`)."""
    return engine_choice(problem).order


def candidates(problem: MatmulProblem) -> tuple[str, ...]:
    """The engines that can run ``problem`` (``ufunc`` always, last)."""
    usable = engines.applicable(problem)
    return tuple(e for e in engines.ENGINES if e in usable and e != "ufunc") + ("ufunc",)


def calibrate(problem: MatmulProblem, persist: bool = True) -> calibration.Ranking:
    """Measure the engines for ``problem``'s class now, and keep the ranking (``persist``): the explicit
    calibration step (``nvdispatch.calibration.calibrate`` runs it over a standard set and the pending classes)."""
    return calibration.calibrate(problem, candidates(problem), engine_plan, persist)


def engine_plan(problem: MatmulProblem, engine: str):
    """A plan of ``problem`` run by ``engine`` (as the calibration times each)."""
    if engine == "panels":
        return PanelPlan(problem)
    if engine == "ufunc":
        return _inplace_pass(problem, "inplace", None)
    return engines.plan(problem, engine)


def plan(problem: MatmulProblem, strategy: str, tuning=None):
    if strategy in ("native", "framework_fused"):
        made = engines.plan(problem, "blas" if strategy == "native" else "torch")
    elif strategy == "inplace" and not tuning and (both := _contended_engines(problem)) is not None:
        made = ContendedPlan(problem, engine_plan(problem, both[0]), engine_plan(problem, both[1]))
    elif strategy == "inplace" and (inplace := _inplace_engine(problem, tuning)) != "ufunc":
        made = PanelPlan(problem, tuning) if inplace == "panels" else engines.plan(problem, inplace)
    else:
        made = _inplace_pass(problem, strategy, tuning)
    ranked = None
    if strategy != "plain" and problem.m * problem.n * problem.k:
        ranked = engine_choice(problem).ranking
        if ranked.source != "only":
            made.notes = (ranked.describe(),)  # (the plans' steps end with their notes)
    if _log.isEnabledFor(logging.DEBUG):
        engine = getattr(made, "engine", "blocked pass")
        if isinstance(made, ContendedPlan):
            engine = f"{made.engine} with the cores free, {made.busy_engine} with another thread running"
        source = "" if ranked is None else f", ranking {ranked.source}: {' > '.join(ranked.order)}"
        _log.debug("numpy matmul plan %dx%dx%d %s: strategy %s, engine %s%s", problem.m, problem.n, problem.k,
                   problem.result_dtype, strategy, engine, source)  # fmt: skip
    return made


def _inplace_engine(problem: MatmulProblem, tuning) -> str:
    """``sweep``, ``panels`` or ``ufunc`` (this module's pass) for strategy ``inplace``: as a loaded tuning says
    (``sweep`` has no knobs), else whichever the ranking puts first."""
    if tuning:
        return "panels" if "panel_bytes" in tuning else "ufunc"
    return next(e for e in engine_choice(problem).order if engines.STRATEGY_OF[e] == "inplace")


def _contended_engines(problem: MatmulProblem) -> tuple[str, str] | None:
    """The ``inplace`` engines the ranking puts first with the cores free and with another thread of the process
    busy, where it keeps both orders and they differ; else None (one engine, no look at the threads per call)."""
    ranked = engine_choice(problem).ranking
    if not ranked.free or not ranked.busy:
        return None
    free, busy = (next(e for e in order if engines.STRATEGY_OF[e] == "inplace") for order in (ranked.free, ranked.busy))
    return None if free == busy else (free, busy)


def _inplace_pass(problem: MatmulProblem, strategy: str, tuning):
    one_block = math.prod(problem.promoted_shape) * np.dtype(problem.result_dtype).itemsize <= DEFAULT_BLOCK_BYTES
    if strategy == "inplace" and not tuning and one_block and "ufunc" in engines.applicable(problem):
        return engines.plan(problem, "ufunc")  # one block: the whole-result pass, with a direct hot-path call
    return NumpyMatmulPlan(problem, strategy, tuning)


def _promote(x, vector_axis):
    """PEP 465: a 1-D operand becomes a matrix (axis 0 for a, axis 1 for b); None: leave as is."""
    x = _native(x)
    return x if vector_axis is None else np.expand_dims(x, vector_axis)


def _native(x):
    """A NumPy view of a CPU DLPack object (zero-copy); NumPy arrays pass through."""
    return x if isinstance(x, np.ndarray) or x is None else np.from_dlpack(x)


def _product_of(p: MatmulProblem):
    """The cheapest NumPy call giving ``np.matmul``'s exact result for ``p``'s operands: ``ndarray.dot`` for two
    real or integer matrices — the same BLAS call (or the same exact loop) without the ufunc machinery's cost
    per call, bitwise equal in every layout (tests/matmul/test_numpy_direct.py) — else np.matmul
    (batches broadcast only there; complex outer products, k = 1, round differently through dot)."""
    two_d = not p.batch_shape and len(p.a.shape) == 2 and len(p.b.shape) == 2
    real = all(np.dtype(sig.dtype).kind in "biuf" for sig in (p.a, p.b))
    return np.ndarray.dot if two_d and real else np.matmul


class NumpyMatmulPlan:
    """A planned CPU matmul. ``execute`` returns the result, or ``(result, aux)`` for epilogs with outputs."""

    needs_release = False  # holds nothing to free: calls need not pin it (see the plan cache)
    notes: tuple[str, ...] = ()  # lines ``explain()`` shows after the steps (the engine ranking followed)
    tuning_kind = "numpy-blocks"

    @staticmethod
    def validate_tuning(value) -> str | None:
        """Why ``value`` is no tuning of this plan (``{"block_bytes": int >= 0, "threads": 1 to 4 a core}``)."""
        return check_object(value, {"block_bytes": an_int(0, 1 << 62), "threads": an_int(1, 4 * _CPUS)})

    def __init__(self, problem: MatmulProblem, strategy: str, tuning=None):
        if tuning is not None:
            require_valid(self, tuning)
        self.problem = problem
        self.strategy = strategy
        #: the dtype computed in; the result is rounded to ``result_dtype`` (bfloat16) at the end, if it differs
        self.widened = _widened(problem)
        self.result_dtype = np.dtype(problem.result_dtype)
        self.dtype = np.dtype(np.float32) if self.result_dtype.name == _BF16 else self.result_dtype
        itemsize = self.dtype.itemsize
        tuning = tuning or {}
        block_rows = self._rows_for(int(tuning.get("block_bytes", DEFAULT_BLOCK_BYTES)), problem.n * itemsize)
        big = math.prod(problem.promoted_shape) * itemsize >= _THREADED_BYTES
        #: the knobs, in one attribute (autotune's commit replaces it at once): (block_rows, threads)
        self._setting = (block_rows, int(tuning.get("threads", _CPUS if big else 1)))
        self.elementwise = [s for s in problem.epilog.steps if not STEPS[s].on_operands]
        self.operand_steps = len(self.elementwise) < len(problem.epilog.steps)
        self._prepare = tuple((name, INPUTS[name].prepare) for name, _ in problem.inputs)
        self.ops = NumpyEpilogOps(inplace=strategy == "inplace", dtype=self.dtype)
        spec = problem.epilog
        #: the Plan protocol's direct call (alpha 1, no c): a plain product is one np.matmul (a 1-D @ 1-D product
        #: a NumPy scalar, as numpy.matmul gives it), where NumPy's promotion gives the problem's result dtype (a
        #: framework promoting otherwise, e.g. JAX's float16 with int32, is cast by execute)
        same = not self.widened and np.result_type(np.dtype(problem.a.dtype), np.dtype(problem.b.dtype)) == self.dtype
        plain = not spec.steps and not spec.outputs and problem.c is None and same
        vector = problem.a_vector or problem.b_vector
        self.direct = (np.matmul if vector else _product_of(problem)) if plain else None

    @property
    def block_rows(self) -> int:
        return self._setting[0]

    @property
    def threads(self) -> int:
        return self._setting[1]

    @property
    def steps(self) -> tuple[str, ...]:
        return (*self._describe_with(self.problem.epilog, *self._setting), *self.notes)

    def with_setting(self, setting: tuple[int, int]) -> NumpyMatmulPlan:
        """A private copy of this plan with knobs ``(block_rows, threads)``."""
        trial = copy.copy(self)
        trial._setting = tuple(setting)
        return trial

    def _rows_for(self, block_bytes: int, row_bytes: int) -> int:
        p = self.problem
        if block_bytes == 0 or p.m == 0:
            return max(p.m, 1)
        return max(1, min(p.m, block_bytes // max(row_bytes, 1)))

    def _describe_with(self, spec, block_rows: int, threads: int) -> tuple[str, ...]:
        p = self.problem
        steps = ["np.matmul into the result"]
        if p.c is not None:
            steps.append("+ beta * c")
        if self.strategy == "inplace":
            where = f"in place, per block of {block_rows} rows while in cache, on {threads} thread(s)"
            steps += [f"{s} ({where})" for s in spec.steps]
        else:
            steps += [f"{s} (separate NumPy op)" for s in spec.steps]
        steps += compute_type_note(p, f"NumPy computes in {p.result_dtype}, at least as precise as asked")
        return tuple(steps)

    def tuning(self):
        return {"block_bytes": self.block_rows * self.problem.n * self.dtype.itemsize, "threads": self.threads}

    def release(self) -> None:
        pass

    # -- execution ------------------------------------------------------------------------------------
    def execute(self, operands, stream=None):
        p = self.problem
        if self.widened:
            operands = {k: self._widen(v) for k, v in operands.items()}
        a = _promote(operands["a"], 0 if p.a_vector else None)
        b = _promote(operands["b"], 1 if p.b_vector else None)
        alpha = scalar_value(operands.get("alpha", 1))
        beta = operands.get("beta")
        c = _native(operands.get("c"))
        if c is not None:
            beta = 1 if beta is None else scalar_value(beta)
            c = np.broadcast_to(c, p.result_shape).reshape(p.promoted_shape)
        inputs = {name: prepare(np.asarray(_native(operands[name])), p) for name, prepare in self._prepare}
        if self.strategy == "plain":
            out, aux = self._plain(a, b, c, alpha, beta, inputs)
        else:
            out, aux = self._blocked(a, b, c, alpha, beta, inputs)
        return self._finish(out, aux)

    def _plain(self, a, b, c, alpha, beta, inputs):
        p = self.problem
        d = np.matmul(a, b).astype(self.dtype, copy=False)
        if alpha != 1:
            d = (alpha * d).astype(self.dtype, copy=False)
        if c is not None and beta != 0:
            d = (d + beta * c).astype(self.dtype, copy=False)
        d, aux = apply_steps(p.epilog, d, inputs, self.ops, a=a, b=b, bgrad_axis=p.options.bgrad_axis)
        return d.astype(self.dtype, copy=False), aux

    def _blocked(self, a, b, c, alpha, beta, inputs):
        p = self.problem
        spec = p.epilog
        out = np.matmul(a, b, out=np.empty(p.promoted_shape, dtype=self.dtype))
        aux = {}
        if self.operand_steps:  # the steps that read a/b (BGRADA/BGRADB), once
            aux.update(apply_steps(spec, out, inputs, self.ops, a=a, b=b, which="operands")[1])
        if c is not None and beta != 0:
            c = np.broadcast_to(c, p.promoted_shape)
        if alpha == 1 and (c is None or beta == 0) and not self.elementwise:
            return out, aux
        if out.nbytes <= self.block_rows * p.n * self.dtype.itemsize:
            # the whole result is one block: finish it in one go, without the block machinery
            if alpha != 1:
                np.multiply(out, alpha, out=out, casting="unsafe")
            if c is not None and beta != 0:
                np.add(out, c if beta == 1 else np.multiply(c, beta), out=out, casting="unsafe")
            if self.elementwise:  # (BGRADA/BGRADB have none; their outputs are made above)
                out, got = apply_steps(spec, out, inputs, self.ops, bgrad_axis=p.options.bgrad_axis, which="result")
                aux.update(got)
            return out, aux
        for name in spec.outputs:
            kind = OUTPUTS[name].kind
            if OUTPUTS[name].like_result:
                aux[name] = np.empty(p.promoted_shape, dtype=bool if kind == "mask" else self.dtype)
        bgrad = output_of_kind(spec, "bias_gradient")
        blocks = list(self._row_blocks(inputs))

        def run(chunk):
            """Finish the blocks in ``chunk`` (alpha, beta*c, epilog) while each is in cache."""
            partial = []
            for index, rows in chunk:
                o = out[index][rows]
                if alpha != 1:
                    np.multiply(o, alpha, out=o, casting="unsafe")
                if c is not None and beta != 0:
                    cb = c[index][rows]
                    np.add(o, cb if beta == 1 else np.multiply(cb, beta), out=o, casting="unsafe")
                if not self.elementwise:
                    continue
                blk = {}
                if "bias" in inputs:
                    bias = inputs["bias"]
                    if p.bias_axis == "m":
                        bias = bias[index][rows]
                    elif bias.ndim > 2:
                        bias = bias[index]
                    blk["bias"] = bias
                for name, value in inputs.items():
                    if INPUTS[name].like_result:
                        blk[name] = value[index][rows]
                got = apply_steps(spec, o, blk, self.ops, bgrad_axis=p.options.bgrad_axis, which="result")[1]
                for name, value in got.items():
                    if name == bgrad:
                        partial.append((index, rows, value))
                    else:
                        aux[name][index][rows] = value
            return partial

        parts = self._run_blocks(run, blocks)
        if bgrad is not None:
            aux[bgrad] = self._gather_bgrad(parts)
        return out, aux

    def _row_blocks(self, inputs):
        """(index, rows) pairs covering the result in blocks of about ``block_rows`` rows: row blocks of
        each matrix when matrices are large, groups of whole matrices along the last batch axis when
        they are small, or the whole result at once when it fits one block."""
        p = self.problem
        bias = inputs.get("bias")
        if bias is not None and (bias.ndim > 2 or p.bias_axis == "m"):
            inputs["bias"] = np.broadcast_to(bias, (*p.batch_shape, *bias.shape[-2:]))
        step = self.block_rows
        if not p.batch_shape or math.prod(p.batch_shape) == 1:
            if step >= p.m:
                yield (), Ellipsis
                return
        elif step < p.m:
            for index in np.ndindex(*p.batch_shape):
                for r0 in range(0, p.m, step):
                    yield index, slice(r0, min(r0 + step, p.m))
            return
        if not p.batch_shape or math.prod(p.batch_shape) == 1:
            lead = (0,) * len(p.batch_shape)
            for r0 in range(0, p.m, step):
                yield lead, slice(r0, min(r0 + step, p.m))
            return
        per = max(1, step // max(p.m, 1))
        last = p.batch_shape[-1]
        for outer in np.ndindex(*p.batch_shape[:-1]):
            for j0 in range(0, last, per):
                yield (*outer, slice(j0, min(j0 + per, last))), Ellipsis

    def _run_blocks(self, run, blocks):
        """Run ``run`` over the blocks, on several threads when the work is large enough to gain."""
        workers = min(self.threads, len(blocks))
        if workers <= 1:
            return run(blocks)
        per = -(-len(blocks) // workers)
        chunks = [blocks[i : i + per] for i in range(0, len(blocks), per)]
        parts = []
        for got in _pool().run(run, chunks):
            parts.extend(got)
        return parts

    def _gather_bgrad(self, parts):
        p = self.problem
        if p.options.bgrad_axis == "n":
            # the blocks' partial sums are added in float32 at least (float16 data), rounded once
            total = np.zeros((*p.batch_shape, p.n), dtype=accumulator_dtype(self.dtype) or self.dtype)
            for index, _, value in parts:
                total[index] += value
            return total.astype(self.dtype, copy=False)
        full = np.empty((*p.batch_shape, p.m, 1), dtype=self.dtype)
        for index, rows, value in parts:
            full[index][rows] = value
        return full

    @staticmethod
    def _widen(x):
        """A bfloat16 array in float32 (other operands and scalars as they are)."""
        dtype = getattr(x, "dtype", None)
        return x.astype(np.float32) if dtype is not None and dtype.name == _BF16 else x

    def _finish(self, out, aux):
        p = self.problem
        if self.widened:  # rounded once, to the result's dtype; masks stay boolean
            out = out.astype(self.result_dtype)
            aux = {k: v.astype(self.result_dtype) if v.dtype == self.dtype else v for k, v in aux.items()}
        result = p.squeeze(out)
        if not p.epilog.outputs:
            return result
        return result, finish_outputs(p, aux)

    # -- autotuning -----------------------------------------------------------------------------------
    def propose_tuning(self, operands, iterations: int = 3) -> TuningProposal | None:
        """Time block sizes x thread counts (the first ``preferences.limit`` of them) on the real operands, on
        private copies of this plan, and propose the fastest (``cpu_autotune``); None for strategy ``plain``
        (no knobs)."""
        if self.strategy != "inplace":
            return None
        row_bytes = self.problem.n * self.dtype.itemsize
        configs = itertools.product(_BLOCK_CHOICES, sorted({1, _CPUS}))
        settings = [
            ((block_bytes, threads), (self._rows_for(block_bytes, row_bytes), threads))
            for block_bytes, threads in itertools.islice(configs, self.problem.plan_preferences.limit)
        ]
        return propose(self, settings, operands, iterations)

    def autotune(self, operands, iterations: int = 3):
        """:meth:`propose_tuning` and commit the proposal to this plan at once; returns the timings."""
        proposal = self.propose_tuning(operands, iterations)
        if proposal is None:
            return {}
        proposal.commit()
        return proposal.timings
