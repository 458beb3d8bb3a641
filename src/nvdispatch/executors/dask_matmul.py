"""Matmul on Dask arrays: a lazy graph of block matmuls, each run by nvdispatch's own route on the worker.

For output block ``(batch..., i, j)`` and K cut into chunks ``0..K-1``, one of two forms, by memory:

* **K concatenated**, a rule on memory alone, when both hold:

  - the largest block's two K panels (``a``'s block row ``m_blk × K`` and ``b``'s block column ``K × n_blk``,
    batch blocks included) together fit in Dask's own ``array.chunk-size`` (``dask.config``, read at each
    call; 128 MiB by default), the size Dask itself lets one task hold;
  - the panels, ``a`` and ``b`` once in all, are no more bytes than the tree's partial products, ``K-1``
    result-sized arrays: what each form writes, and at most moves between workers (a panel gathers blocks
    from wherever they are; a partial product goes to its block's sum).

  Then one concat task per panel (each block row of ``a`` and block column of ``b`` built once, shared by
  the blocks that read it) and ONE fused call per output block on the whole K, as with K in one chunk: no
  partial products, no sums, no ``c`` copy.
* **K tree-reduced** otherwise (chunked K works for any size):

  - K-chunks ``0..K-2`` give partial products ``alpha * a[i,k] @ b[k,j]`` (the first adds ``beta * c``),
    summed by a tree reduction (``split_every`` at a time); float16/bfloat16 partials are summed in float32
    and the sum rounded once to the result dtype (a float16 sum would round at every add);
  - the last K-chunk is the block's one fused call: ``matmul(a[i,K-1], b[K-1,j], c=<partial sum>, beta=1,
    alpha, epilog, bias/aux blocks)``, so the epilog sees the whole K-sum, once per block, fused wherever
    the block executor fuses ``c`` and the epilog (one cuBLASLt launch on the GPU).

With K in one chunk the fused call is the block's only call.

Bias along N is sliced per block column, along M per block row, batched biases per batch block. Operands
whose chunks do not meet (K of ``a`` vs ``b``, batch axes) are rechunked to the common refinement of their
block boundaries (``explain()`` lists each rechunk). Auxiliary outputs come back as Dask arrays: ``relu_aux``
and ``gelu_aux`` chunked like the result, bias gradients (``*_BGRAD``) and ``BGRADA``/``BGRADB`` tree-reduced
over the blocks that share them (float16/bfloat16 partials accumulated in float32, rounded once at the end).
"""

from __future__ import annotations

import itertools
import logging
import math
from typing import Any

from .._epilog import Epilog
from .._explain import explain
from .._matmul_problem import ArraySig, MatmulOptions, MatmulProblem
from ..errors import ShapeMismatchError
from . import dask_graph as G
from . import dask_tasks as T

#: partial products added per node of the K reduction
SPLIT_EVERY = 4
_log = logging.getLogger("nvdispatch")


def decline(problem: MatmulProblem) -> str | None:
    return None


def strategies(problem: MatmulProblem) -> tuple[str, ...]:
    return ("blockwise",)


def plan(problem: MatmulProblem, strategy: str, tuning=None):
    return DaskMatmulPlan(problem)


def k_budget() -> int:
    """The bytes one block call may hold in K panels: Dask's ``array.chunk-size`` (``dask.config``)."""
    import dask.config
    from dask.utils import parse_bytes

    return parse_bytes(dask.config.get("array.chunk-size"))


def _bytes(n: int) -> str:
    from dask.utils import format_bytes

    return format_bytes(n)


def _chunks(sig: ArraySig | None):
    if sig is None:
        return None
    if sig.chunks is not None:
        return sig.chunks.chunks
    return tuple((s,) for s in sig.shape)  # a plain operand: wrapped as one block


def _chunk_layout(p: MatmulProblem):
    """The chunk layout of the problem's first Dask operand; None when none is (plain operands under coerce)."""
    return next((s.chunks for s in (p.a, p.b, p.c, *(s for _, s in p.inputs)) if s is not None and s.chunks), None)


def block_lines(explain_block) -> list[str]:
    """``explain`` lines of one block call, run under the caller's backend state (as the workers will)."""
    try:
        e = explain_block(T.carry_state())
    except Exception as exc:  # noqa: BLE001 - e.g. the chunk library is missing on this (client) machine
        return [f"first block: not explained on this machine ({type(exc).__name__}: {exc})"]
    lines = [f"first block: executor {e.executor!r}, strategy {e.strategy!r}"]
    return lines + [f"first block step: {s}" for s in e.steps]


class DaskMatmulPlan:
    """The block decomposition of one Dask matmul (from the operands' chunks); ``execute`` builds the graph."""

    strategy = "blockwise"

    def __init__(self, p: MatmulProblem):
        self.problem = p
        layout = _chunk_layout(p)
        self.chunk_framework = "numpy" if layout is None else layout.chunk_framework
        self.chunk_meta = None if layout is None else layout.meta
        self.notes: list[str] = []
        ca, cb = _chunks(p.a), _chunks(p.b)
        self.pa_shape = (1, *p.a.shape) if p.a_vector else tuple(p.a.shape)
        self.pb_shape = (*p.b.shape, 1) if p.b_vector else tuple(p.b.shape)
        pa = ((1,), *ca) if p.a_vector else ca
        pb = (*cb, (1,)) if p.b_vector else cb
        nb = len(p.batch_shape)
        batch = []
        for d in range(nb):
            own = []
            for shape, chunks in ((self.pa_shape, pa), (self.pb_shape, pb)):
                lead = nb - (len(shape) - 2)
                if d >= lead and shape[d - lead] != 1:
                    own.append(chunks[d - lead])
            batch.append(G.refine(*own) if own else (p.batch_shape[d],))
        self.k_chunks = G.refine(pa[-1], pb[-2])
        self.out_chunks = (*batch, pa[-2], pb[-1])
        a_target = (*G.broadcast_target(self.pa_shape[:-2], tuple(batch)), pa[-2], self.k_chunks)
        b_target = (*G.broadcast_target(self.pb_shape[:-2], tuple(batch)), self.k_chunks, pb[-1])
        self.targets: dict[str, Any] = {"a": a_target, "b": b_target}
        self._note("a", pa, a_target)
        self._note("b", pb, b_target)
        whole_k = (sum(self.k_chunks),)
        #: the largest output block's two K panels (a's block row, b's block column), in bytes
        self.panel_bytes = G.largest_block_bytes((*a_target[:-1], whole_k), p.a.dtype) + G.largest_block_bytes(
            (*b_target[:-2], whole_k, b_target[-1]), p.b.dtype
        )
        #: what each form writes (and at most moves between workers): every panel once (a and b whole), or
        #: the tree's K-1 partial products of every output block
        self.panels_total = (math.prod(self.pa_shape) * G.itemsize(p.a.dtype)) + (
            math.prod(self.pb_shape) * G.itemsize(p.b.dtype)
        )
        self.partials_total = (len(self.k_chunks) - 1) * math.prod(sum(c) for c in self.out_chunks) * G.itemsize(
            p.result_dtype
        )
        self.promoted_shapes = {"a": self.pa_shape, "b": self.pb_shape}
        vectors = p.a_vector or p.b_vector
        for name, sig in (("c", p.c), *p.inputs):
            if sig is None:
                continue
            shape = tuple(sig.shape)
            if name != "bias" and vectors:
                shape = p.promoted_shape  # c and aux inputs are broadcast to the result and promoted
            arg = name if name == "c" else f"epilog_inputs[{name!r}]"
            if name == "relu_aux" and sig.dtype == "uint8":  # a block executor's bit mask: block for block
                own = _chunks(sig)
                if len(own) != len(self.out_chunks) or len(own[-1]) != len(self.out_chunks[-1]):
                    raise ShapeMismatchError(
                        arg,
                        f"the relu_aux a Dask RELU_AUX call returned for this result ({len(self.out_chunks[-1])} "
                        "blocks along the last axis)",
                        f"{len(own[-1])} blocks along the last axis",
                    )
                target = (*self.out_chunks[:-1], own[-1])
            else:
                target = G.broadcast_target(shape, self.out_chunks)
            self.targets[name] = target
            self.promoted_shapes[name] = shape
            if name == "bias" or not vectors:
                self._note(arg, _chunks(sig), target)

    def k_form(self) -> tuple[bool, str]:
        """``(whether K is concatenated per block, why)`` for K in several chunks: concatenated when the largest
        block's two K panels fit in Dask's ``array.chunk-size`` (read now, so a ``dask.config.set`` holds for
        cached plans too) and the panels are no more bytes than the partial products they replace."""
        nk = len(self.k_chunks)
        budget = k_budget()
        fits = f"panels {_bytes(self.panel_bytes)} {'<=' if self.panel_bytes <= budget else '>'} array.chunk-size "
        fits += _bytes(budget)
        if self.panel_bytes > budget:
            return False, f"K in {nk} chunks tree-reduced ({fits}: too large to concatenate per block)"
        bytes_ = f"{_bytes(self.panels_total)} of panels vs {_bytes(self.partials_total)} of partial products"
        if self.panels_total > self.partials_total:
            return False, f"K in {nk} chunks tree-reduced ({fits}, but {bytes_}: concatenating copies more)"
        return True, f"K in {nk} chunks concatenated per block ({fits}; {bytes_})"

    def concatenates_k(self) -> bool:
        return len(self.k_chunks) > 1 and self.k_form()[0]

    @property
    def steps(self) -> tuple[str, ...]:
        """The decomposition, then the first output block's call as a worker would run it."""
        concat = self.concatenates_k()
        return (*self._describe(concat), *block_lines(lambda state: self.explain_block(state, concat)))

    def _note(self, operand: str, chunks, target) -> None:
        for axis, (was, now) in enumerate(zip(chunks, target)):
            if tuple(was) != tuple(now):
                self.notes.append(
                    f"rechunk {operand} along axis {axis} from {G.describe_chunks(was)} to {G.describe_chunks(now)} "
                    "so its blocks meet the other operands'"
                )

    # -- explain ----------------------------------------------------------------------------------------------
    def _describe(self, concat: bool) -> tuple[str, ...]:
        p = self.problem
        grid = " × ".join(str(len(c)) for c in self.out_chunks)
        nk = len(self.k_chunks)
        spec = p.epilog
        epilog = spec.epilog.name
        steps = [f"Dask graph of {grid} output blocks (chunks {self.out_chunks}), K in {nk} chunk(s)"]
        steps += self.notes
        fused = (
            f"one fused block call per output block: nvdispatch.matmul(a, b{', c' if p.c else ''}, "
            f"epilog={epilog}) on the worker"
        )
        if nk == 1:
            steps.append(fused)
        elif concat:
            steps.append(
                f"{self.k_form()[1]}: one concat task per block row of a and block column of b (each built once, "
                f"shared by the blocks that read it), then {fused}, on the whole K: no partial products, no sums"
            )
        else:
            steps.append(self.k_form()[1])
            steps.append(
                f"per output block: K-chunks 1..{nk - 1} as partial products alpha·a@b"
                f"{' (+ beta·c in the first)' if p.c else ''}, tree-summed {SPLIT_EVERY} at a time"
                f"{' in float32 (rounded once)' if p.result_dtype in ('float16', 'bfloat16') else ''}; K-chunk {nk} "
                f"is the block's one fused call matmul(a, b, c=<partial sum>, beta=1, epilog={epilog}), so the "
                "epilog runs once per block, after the K-sum"
            )
        if p.bias_axis:
            steps.append(f"bias along {p.bias_axis.upper()} sliced to each output block")
        for name in spec.outputs:
            if name.endswith("_bgrad"):
                over = "M (block rows)" if p.options.bgrad_axis == "n" else "N (block columns)"
                steps.append(f"{name}: per-block partial sums tree-reduced over {over}")
            elif name in ("bgrada", "bgradb") and nk > 1 and not concat:
                steps.append(f"{name}: per-K-chunk partial sums (from the block calls) tree-reduced over K")
            elif name in ("bgrada", "bgradb"):
                steps.append(f"{name}: from the block calls of one block {'column' if name == 'bgrada' else 'row'}")
            else:
                steps.append(f"{name}: a Dask array of the blocks' {name}, chunked like the result")
        steps.append(
            f"block calls run {self.chunk_framework} blocks through nvdispatch.matmul on each worker "
            "(executor chosen there, under the caller's backend state; plans from the worker's cache)"
        )
        return tuple(steps)

    def explain_block(self, state: T.CarriedState, concat: bool = False):
        """The explanation of the first output block's fused call, as a worker would run it (on the whole K
        when ``concat``)."""
        p = self.problem
        shapes = {
            name: tuple(c[0] if size != 1 else 1 for c, size in zip(self.targets[name], self.promoted_shapes[name]))
            for name in self.targets
        }
        k = sum(self.k_chunks) if concat else self.k_chunks[-1]
        shapes["a"] = (*shapes["a"][:-1], k)
        shapes["b"] = (*shapes["b"][:-2], k, shapes["b"][-1])
        sigs = {"a": p.a, "b": p.b, "c": p.c, **dict(p.inputs)}
        blocks = {n: G.empty_block(self.chunk_meta, s, sigs[n].dtype) for n, s in shapes.items()}
        c = blocks.pop("c", None)
        tree = len(self.k_chunks) > 1 and not concat
        if c is None and tree:
            c = G.empty_block(self.chunk_meta, tuple(x[0] for x in self.out_chunks), p.result_dtype)
        a, b = blocks.pop("a"), blocks.pop("b")
        with T.applied(state):
            return explain(
                a,
                b,
                c,
                alpha=1,
                beta=1 if c is not None else None,
                epilog=p.epilog.epilog,
                epilog_inputs=blocks or None,
                options=p.options,
            )

    def release(self) -> None:
        pass

    # -- the graph -------------------------------------------------------------------------------------------
    def _operand(self, name: str, x):
        import dask.array as da

        p = self.problem
        x = G.wrap(x)
        if name == "a" and p.a_vector:
            x = x[None, :]
        elif name == "b" and p.b_vector:
            x = x[:, None]
        elif name not in ("a", "b", "bias") and (p.a_vector or p.b_vector):
            x = da.broadcast_to(x, p.result_shape)
            x = (
                x[..., None, :]
                if p.a_vector and not p.b_vector
                else x[..., None]
                if p.b_vector and not p.a_vector
                else x[..., None, None]
            )
        target = self.targets[name]
        if name == "relu_aux" and x.dtype == "uint8":  # a bit mask: its last axis stays as the blocks made it
            if tuple(x.chunks[:-1]) == tuple(target[:-1]):
                return x
            return G.rechunk(x, dict(enumerate(target[:-1])))
        return x if tuple(x.chunks) == tuple(target) else G.rechunk(x, target)

    def execute(self, operands, stream=None):
        p = self.problem
        spec = p.epilog
        state = T.carry_state()
        arrays = {n: self._operand(n, operands[n]) for n in self.targets if operands.get(n) is not None}
        A, B = arrays["a"], arrays["b"]
        C = arrays.get("c")
        inputs = [(n, arrays.get(n)) for n in ("bias", "relu_aux", "gelu_aux")]
        alpha, beta = operands.get("alpha", 1), operands.get("beta")
        concat = self.concatenates_k()
        tok = G.token(*(x.name for x in arrays.values()), alpha, beta, spec.epilog, p.options, state, concat)
        core, res = f"nvdispatch-matmul-blocks-{tok}", f"nvdispatch-matmul-{tok}"
        ep, bgrad_ab = spec.epilog, None
        if ep in (Epilog.BGRADA, Epilog.BGRADB):
            ep, bgrad_ab = None, spec.epilog
        # default options travel as None: block calls without c then take the route's cached fast path
        options = None if p.options == MatmulOptions() else p.options
        full = T.MatmulBlockCall(alpha, beta if C is not None else None, ep, options, state)
        summed = T.MatmulBlockCall(alpha, 1, ep, options, state)
        nb = len(p.batch_shape)
        nk = len(self.k_chunks)
        grid = [range(len(c)) for c in self.out_chunks]
        dsk: dict = {}
        if concat:  # one K step per block, on the panels
            a_block, b_block = self._panels(dsk, core, A, B, nk)
            nk = 1
        else:

            def a_block(bidx, i, k):
                return G.block_of(A.name, A.shape, (*bidx, i, k))

            def b_block(bidx, k, j):
                return G.block_of(B.name, B.shape, (*bidx, k, j))

        aux_parts: dict[str, dict] = {}  # output name -> {aux block index: [keys of partial values]}

        def part_call(first: bool, with_grad):
            return T.MatmulBlockCall(alpha, beta if first and C is not None else None, with_grad, options, state)

        for idx in itertools.product(*grid):
            bidx, i, j = idx[:nb], idx[-2], idx[-1]
            grad_here = self._grad_block(bgrad_ab, bidx, i, j)
            c_key = G.block_of(C.name, C.shape, idx) if C is not None else None
            parts = []
            for k in range(nk):
                a_key, b_key = a_block(bidx, i, k), b_block(bidx, k, j)
                if k < nk - 1:
                    key = (f"{core}-partial", *idx, k)
                    dsk[key] = (T.matmul_block, part_call(k == 0, grad_here), a_key, b_key, c_key if k == 0 else None)
                    if grad_here is not None:
                        self._collect(aux_parts, dsk, key, grad_here, bidx, i, j, k)
                        dsk[(f"{core}-product", *idx, k)] = (T.pick, key, 0)
                        key = (f"{core}-product", *idx, k)
                    parts.append(key)
                    continue
                others = [G.block_of(x.name, x.shape, idx) if x is not None else None for _, x in inputs]
                if parts:
                    c_in = self._partial_sum(dsk, f"{core}-sum", idx, parts)
                    call = summed if grad_here is None else T.MatmulBlockCall(alpha, 1, grad_here, options, state)
                else:
                    c_in = c_key
                    call = (
                        full
                        if grad_here is None
                        else T.MatmulBlockCall(alpha, beta if C is not None else None, grad_here, options, state)
                    )
                dsk[(core, *idx)] = (T.matmul_block, call, a_key, b_key, c_in, *others)
                if grad_here is not None:
                    self._collect(aux_parts, dsk, (core, *idx), grad_here, bidx, i, j, k)
        _log.debug(
            "dask matmul %s: %s output blocks, K in %d chunk(s)%s, %d tasks of block calls and sums",
            res,
            "x".join(str(len(c)) for c in self.out_chunks),
            len(self.k_chunks),
            " concatenated per block" if concat else "",
            len(dsk),
        )
        tupled = bool(spec.outputs) and bgrad_ab is None
        res_dsk = dict(dsk)
        for idx in itertools.product(*grid):
            if tupled or self._grad_block(bgrad_ab, idx[:nb], idx[-2], idx[-1]) is not None:
                res_dsk[(res, *idx)] = (T.pick, (core, *idx), 0)
            else:
                res_dsk[(res, *idx)] = (core, *idx)
        deps = [x for x in arrays.values()]
        meta_like = getattr(A, "_meta", None)
        result = G.new_array(
            res, res_dsk, deps, self.out_chunks, G.meta_of(meta_like, len(self.out_chunks), p.result_dtype)
        )
        out = p.squeeze(result)
        if not spec.outputs:
            return out
        aux = {}
        for name in spec.outputs:
            if name in ("relu_aux", "gelu_aux"):
                aux[name] = p.squeeze(self._block_aux(name, result, res, grid, meta_like, core))
            elif name.endswith("_bgrad"):
                aux[name] = self._bgrad(name, result, res, grid, meta_like, core)
            else:
                aux[name] = self._reduced(name, aux_parts[name], result, meta_like, tok)
        return out, aux

    @staticmethod
    def _panels(dsk: dict, core: str, A, B, nk: int):
        """``(a_block, b_block)``: the keys of the K panels meeting an output block (``k`` is always 0), each
        panel's concat task added to ``dsk`` the first time a block reads it."""

        def a_block(bidx, i, k):
            first = G.block_of(A.name, A.shape, (*bidx, i, 0))
            key = (f"{core}-a-panel", *first[1:-1])
            if key not in dsk:
                parts = [(*first[:-1], kk) for kk in range(nk)]
                dsk[key] = (T.concat_blocks, -1, *parts)
            return key

        def b_block(bidx, k, j):
            first = G.block_of(B.name, B.shape, (*bidx, 0, j))
            key = (f"{core}-b-panel", *first[1:-2], first[-1])
            if key not in dsk:
                parts = [(*first[:-2], kk, first[-1]) for kk in range(nk)]
                dsk[key] = (T.concat_blocks, -2, *parts)
            return key

        return a_block, b_block

    # -- auxiliary outputs -----------------------------------------------------------------------------------
    def _grad_block(self, bgrad_ab, bidx, i, j):
        """BGRADA/BGRADB where this output block is the one computing it for its a (b) blocks, else None."""
        if bgrad_ab is None:
            return None
        nb = len(self.problem.batch_shape)
        shape, along = (self.pa_shape, j) if bgrad_ab == Epilog.BGRADA else (self.pb_shape, i)
        lead = nb - (len(shape) - 2)
        first = all(bidx[d] == 0 for d in range(nb) if d < lead or shape[d - lead] == 1)
        return bgrad_ab if along == 0 and first else None

    def _collect(self, aux_parts, dsk, key, which, bidx, i, j, k):
        nb = len(self.problem.batch_shape)
        name = "bgrada" if which == Epilog.BGRADA else "bgradb"
        shape = self.pa_shape if which == Epilog.BGRADA else self.pb_shape
        lead = nb - (len(shape) - 2)
        own = tuple(0 if shape[d - lead] == 1 else bidx[d] for d in range(lead, nb))
        index = (*own, i) if which == Epilog.BGRADA else (*own, j)
        pkey = (f"{key[0]}-{name}", *key[1:])
        dsk[pkey] = (T.pick_aux, key, name)
        aux_parts.setdefault(name, {}).setdefault(index, []).append(pkey)

    def _reduced(self, name, parts: dict, result, meta_like, tok):
        p = self.problem
        target = self.targets["a"] if name == "bgrada" else self.targets["b"]
        chunks = (*target[:-2], target[-2] if name == "bgrada" else target[-1])
        out = f"nvdispatch-matmul-{name}-{tok}"
        dsk: dict = {}
        for index, keys in parts.items():
            dsk[(out, *index)] = self._partial_sum(dsk, f"{out}-sum", index, keys)
        return G.new_array(out, dsk, [result], chunks, G.meta_of(meta_like, len(chunks), p.result_dtype))

    def _partial_sum(self, dsk: dict, prefix: str, index: tuple, keys: list):
        """Graph nodes summing the partials ``keys`` (K-partial products, bias gradients); float16/bfloat16
        partials are accumulated in float32 and the total rounded once to the result dtype (as every executor's
        reductions)."""
        dtype = self.problem.result_dtype
        if dtype not in ("float16", "bfloat16") or len(keys) == 1:
            return G.tree_sum(dsk, prefix, index, keys, SPLIT_EVERY, T.add_blocks)
        total = G.tree_sum(dsk, f"{prefix}-wide", index, keys, SPLIT_EVERY, T.add_blocks_wide)
        return (T.cast_to, total, dtype)

    def _block_aux(self, name, result, res, grid, meta_like, core):
        p = self.problem
        out = f"{res}-{name}"
        dsk = {(out, *idx): (T.pick_aux, (core, *idx), name) for idx in itertools.product(*grid)}
        chunks, dtype = self.out_chunks, p.result_dtype
        if name == "relu_aux":
            dtype = "bool"
            if self.problem.device.kind != "cpu":  # the block executor's own format (cuBLASLt: a bit mask)
                dtype = "uint8"
                chunks = (*chunks[:-1], (math.nan,) * len(chunks[-1]))
        return G.new_array(out, dsk, [result], chunks, G.meta_of(meta_like, len(chunks), dtype))

    def _bgrad(self, name, result, res, grid, meta_like, core):
        p = self.problem
        nb = len(p.batch_shape)
        out = f"{res}-{name}"
        picks: dict[tuple, list] = {}
        dsk: dict = {}
        for idx in itertools.product(*grid):
            key = (f"{out}-part", *idx)
            dsk[key] = (T.pick_aux, (core, *idx), name)
            bidx, i, j = idx[:nb], idx[-2], idx[-1]
            picks.setdefault((*bidx, j) if p.options.bgrad_axis == "n" else (*bidx, i, 0), []).append(key)
        for index, keys in picks.items():
            dsk[(out, *index)] = self._partial_sum(dsk, f"{out}-sum", index, keys)
        batch = self.out_chunks[:nb]
        chunks = (*batch, self.out_chunks[-1]) if p.options.bgrad_axis == "n" else (*batch, self.out_chunks[-2], (1,))
        return G.new_array(out, dsk, [result], chunks, G.meta_of(meta_like, len(chunks), p.result_dtype))
