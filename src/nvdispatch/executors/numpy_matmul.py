"""Matmul with fused epilogs on the CPU through NumPy.

Strategy ``inplace`` (the default): the product is computed block of rows by block of rows into the
result, and each block gets ``alpha``/``beta * c`` and the epilog while it is still in cache. No
full-size temporary is made beyond what the epilog must return (aux outputs). Strategy ``plain``:
separate NumPy expressions, as a user would write them.
"""

from __future__ import annotations

import time

import numpy as np

from .._epilog import NUMPY_OPS, apply_inplace
from .._matmul_problem import MatmulProblem, scalar_value

#: bytes of result rows handled per block by default (fits L2 alongside the operands' panels)
DEFAULT_BLOCK_BYTES = 1 << 20
_BLOCK_CHOICES = (0, 1 << 18, 1 << 20, 1 << 22)  # 0: the whole result at once


def decline(problem: MatmulProblem) -> str | None:
    if problem.result_dtype == "bfloat16" or "bfloat16" in (problem.a.dtype, problem.b.dtype):
        return "NumPy has no bfloat16"
    for name, sig in problem.inputs:
        if name == "relu_aux" and sig.dtype != "bool":
            return "the NumPy executor takes relu_aux as the boolean mask its RELU_AUX returns"
        if sig.dtype == "bfloat16":
            return "NumPy has no bfloat16"
    return None


def strategies(problem: MatmulProblem) -> tuple[str, ...]:
    if not problem.epilog.steps and problem.c is None:
        return ("plain",)
    return ("inplace", "plain")


def plan(problem: MatmulProblem, strategy: str, tuning=None):
    return NumpyMatmulPlan(problem, strategy, tuning)


def _promote(x, vector_axis):
    """PEP 465: a 1-D operand becomes a matrix (axis 0 for a, axis 1 for b); None: leave as is."""
    return x if vector_axis is None else np.expand_dims(x, vector_axis)


class NumpyMatmulPlan:
    """A planned CPU matmul. ``execute`` returns the result, or ``(result, aux)`` for epilogs with outputs."""

    def __init__(self, problem: MatmulProblem, strategy: str, tuning=None):
        self.problem = problem
        self.strategy = strategy
        self.dtype = np.dtype(problem.result_dtype)
        itemsize = self.dtype.itemsize
        block_bytes = DEFAULT_BLOCK_BYTES if tuning is None else int(tuning.get("block_bytes", 0))
        self.block_rows = self._rows_for(block_bytes, problem.n * itemsize)
        self.elementwise = [s for s in problem.epilog.steps if s not in ("bgrad_a", "bgrad_b")]
        spec = problem.epilog
        self.steps = self._describe(spec)

    def _rows_for(self, block_bytes: int, row_bytes: int) -> int:
        p = self.problem
        if block_bytes == 0 or p.batch_shape or p.m == 0:
            return max(p.m, 1)
        return max(8, min(p.m, block_bytes // max(row_bytes, 1)))

    def _describe(self, spec) -> tuple[str, ...]:
        p = self.problem
        steps = ["np.matmul" + (f" in blocks of {self.block_rows} rows" if self.block_rows < p.m else "")]
        if p.c is not None:
            steps.append("+ beta * c")
        if self.strategy == "inplace":
            steps += [f"{s} (in place, per block)" for s in spec.steps]
        else:
            steps += [f"{s} (separate NumPy op)" for s in spec.steps]
        return tuple(steps)

    def tuning(self):
        return {"block_bytes": self.block_rows * self.problem.n * self.dtype.itemsize}

    def release(self) -> None:
        pass

    # -- execution ------------------------------------------------------------------------------------
    def execute(self, operands, stream=None):
        p = self.problem
        a = _promote(operands["a"], 0 if p.a_vector else None)
        b = _promote(operands["b"], 1 if p.b_vector else None)
        alpha = scalar_value(operands.get("alpha", 1))
        beta = operands.get("beta")
        c = operands.get("c")
        if c is not None:
            beta = 1 if beta is None else scalar_value(beta)
            c = np.broadcast_to(c, p.result_shape).reshape(p.promoted_shape)
        inputs = {name: operands[name] for name, _ in p.inputs}
        for name in ("relu_aux", "gelu_aux"):
            if name in inputs:
                inputs[name] = np.asarray(inputs[name]).reshape(p.promoted_shape)
        if "bias" in inputs:
            bias = np.asarray(inputs["bias"])
            inputs["bias"] = bias.reshape(1, -1) if bias.ndim == 1 else bias
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
        aux = apply_inplace(p.epilog, d, inputs, _PLAIN_OPS, a=a, b=b, bgrad_axis=p.options.bgrad_axis)
        return d, aux

    def _blocked(self, a, b, c, alpha, beta, inputs):
        p = self.problem
        spec = p.epilog
        out = np.empty(p.promoted_shape, dtype=self.dtype)
        aux = {}
        for name in spec.outputs:
            if name == "relu_aux":
                aux[name] = np.empty(p.promoted_shape, dtype=bool)
            elif name == "gelu_aux":
                aux[name] = np.empty(p.promoted_shape, dtype=self.dtype)
        bgrad_name = next((o for o in spec.outputs if o.endswith("_bgrad")), None)
        partial_bgrad = []
        step = self.block_rows
        m = p.m
        bias = inputs.get("bias")
        bias_along_m = p.bias_axis == "m"
        for r0 in range(0, max(m, 1), step):
            r1 = min(r0 + step, m)
            rows = slice(r0, r1)
            o = out[..., rows, :]
            np.matmul(a[..., rows, :], b, out=o)
            if alpha != 1:
                np.multiply(o, alpha, out=o, casting="unsafe")
            if c is not None and beta != 0:
                cb = c[..., rows, :]
                if beta == 1:
                    np.add(o, cb, out=o, casting="unsafe")
                else:
                    np.add(o, np.multiply(cb, beta), out=o, casting="unsafe")
            if not self.elementwise:
                continue
            blk = {}
            if bias is not None:
                blk["bias"] = bias[..., rows, :] if bias_along_m else bias
            for name in ("relu_aux", "gelu_aux"):
                if name in inputs:
                    blk[name] = inputs[name][..., rows, :]
            got = apply_inplace(spec, o, blk, NUMPY_OPS, bgrad_axis=p.options.bgrad_axis)
            for name, value in got.items():
                if name == bgrad_name:
                    partial_bgrad.append(value)
                else:
                    aux[name][..., rows, :] = value
        if bgrad_name is not None:
            if p.options.bgrad_axis == "n":
                total = partial_bgrad[0]
                for part in partial_bgrad[1:]:
                    total = total + part
                aux[bgrad_name] = total.astype(self.dtype, copy=False)
            else:
                aux[bgrad_name] = np.concatenate(partial_bgrad, axis=-2).astype(self.dtype, copy=False)
        if "bgrad_a" in spec.steps:
            aux["bgrada"] = np.sum(a, axis=-1, dtype=self.dtype)
        if "bgrad_b" in spec.steps:
            aux["bgradb"] = np.sum(b, axis=-2, dtype=self.dtype)
        return out, aux

    def _finish(self, out, aux):
        p = self.problem
        squeeze = _squeezer(p)
        result = squeeze(out)
        if not p.epilog.outputs:
            return result
        for name in ("relu_aux", "gelu_aux"):
            if name in aux:
                aux[name] = squeeze(aux[name])
        return result, aux

    # -- autotuning -----------------------------------------------------------------------------------
    def autotune(self, operands, iterations: int = 3):
        """Time the row-block sizes on the real operands and keep the fastest; returns the timings."""
        if self.strategy != "inplace" or self.problem.batch_shape:
            return {}
        timings = {}
        row_bytes = self.problem.n * self.dtype.itemsize
        best = None
        for block_bytes in _BLOCK_CHOICES:
            self.block_rows = self._rows_for(block_bytes, row_bytes)
            samples = []
            for _ in range(max(1, iterations)):
                t0 = time.perf_counter()
                self.execute(operands)
                samples.append(time.perf_counter() - t0)
            t = float(np.median(samples))
            timings[block_bytes] = t
            if best is None or t < best[1]:
                best = (self.block_rows, t)
        self.block_rows = best[0]
        self.steps = self._describe(self.problem.epilog)
        return timings


def _squeezer(p: MatmulProblem):
    if p.a_vector and p.b_vector:
        return lambda x: x[..., 0, 0]
    if p.a_vector:
        return lambda x: x[..., 0, :]
    if p.b_vector:
        return lambda x: x[..., 0]
    return lambda x: x


class _PlainOps:
    """Epilog steps as separate, out-of-place NumPy expressions (strategy ``plain``)."""

    def add_(self, d, x):
        d[...] = d + x

    def relu_(self, d):
        d[...] = np.maximum(d, 0)

    def positive_mask(self, d):
        return d > 0

    def gelu_(self, d):
        from .._epilog import gelu_tanh

        d[...] = gelu_tanh(d)

    def copy(self, d):
        return d.copy()

    def mask_(self, d, mask):
        d[...] = d * mask

    def mul_(self, d, x):
        d[...] = d * x

    def gelu_grad(self, x):
        return NUMPY_OPS.gelu_grad(x)

    def sum(self, x, axis, keepdims):
        return np.sum(x, axis=axis, keepdims=keepdims)


_PLAIN_OPS = _PlainOps()
