"""The engines the NumPy executor can fuse a linear-layer epilog with, beside its blocked in-place pass.

A linear-layer call is ``act(alpha * a @ b + beta * c + bias)`` with ``act`` none, RELU or GELU (tanh form)
on real floating operands (float32/float64). Each engine below computes it into one result array, without
full-size temporaries; it serves the strategy (``nvdispatch._epilog.STRATEGIES``) in brackets:

``blas`` (strategy ``native``)
    BLAS ``gemm`` (``scipy.linalg.blas``) with ``beta = 1`` into a result pre-filled with the bias (or
    ``c``): the bias add rides in the GEMM's own write of the result. 2-D operands.
``torch`` (strategy ``framework_fused``, in processes that have imported Torch)
    Torch's ``addmm`` (bias + GEMM in one call, Torch's BLAS) on zero-copy Torch views of the NumPy operands,
    where Torch is installed; the result is a NumPy view of Torch's output. The activation follows in place
    with the executor's own step (Torch's CPU ``_addmm_activation`` is the same addmm and a separate activation
    pass, and its GELU is the erf form where nvdispatch's is the tanh form). 2-D operands.
``panels`` (strategy ``inplace``, see ``numpy_matmul_panels``)
    ``np.matmul`` panel of rows by panel of rows, each panel sized to a core's cache and finished (alpha,
    ``beta * c``, bias, activation) at once while in cache, panels shared out over the cores with BLAS held
    to one thread each. 2-D operands, any layout NumPy takes.
``sweep`` (strategy ``inplace``, where the compiled extension ``nvdispatch._hotpath`` is built)
    ``np.matmul`` into the result (the BLAS's own threads), then the bias and the activation (none or RELU) in
    one compiled sweep over it (``_hotpath_epilog.c``): one read and one write of each element after the
    product, where in-place ufuncs make one pass per step. Any batch, as ``np.matmul``.
``gemm`` (strategy ``inplace``, where the extension is built and NumPy's BLAS is an OpenBLAS, ``numpy_blas``)
    NumPy's own BLAS ``gemm``, called from C with ``beta = 1`` into a result that is already zero (a large
    ``np.zeros`` is memory the kernel hands over zeroed as the product first writes it, where ``np.matmul``'s
    ``beta = 0`` makes the BLAS clear the result in a pass of its own first), then bias and activation (none or
    RELU) in the compiled sweep, in the same C call: the bias and activation's pass replaces the clearing
    pass. 2-D operands, C- or F-contiguous (else ``ufunc``).
``tiled`` (strategy ``inplace``, where the extension is built)
    nvdispatch's own blocked GEMM (``_hotpath_tiled.c``): ``b`` packed once per call in panels of columns,
    ``a`` in strips of rows, each tile of the result kept in registers over the whole of ``k``, then alpha, the
    bias and the activation (none or RELU) applied to it as it is stored: the result is written once and never
    read back, and nothing clears it first. Kernels for AVX-512 and AVX2 + FMA, picked at run time (a portable
    C one elsewhere); the rows shared out over the process's cores on the workers of NumPy's OpenBLAS
    (``numpy_blas.pool``: as many as it runs now; a worker still spinning after ``np.matmul`` takes its share at
    once), or where NumPy's BLAS has no such pool, on threads started and joined by the call. 2-D real
    operands, C- or F-contiguous (else ``ufunc``); with ``beta * c``, ``ufunc``.
``ufunc`` (strategy ``inplace`` for results of one block)
    ``np.matmul`` into the result, then ``alpha``, ``beta * c``, the bias and the activation as in-place
    ufuncs over the whole result, with a direct call for the hot path of small repeated calls (larger
    results get the blocked pass of ``numpy_matmul``).

Which one is fastest depends on the machine (BLAS build, core type, cache sizes): the executor picks by a
short calibration per problem class (``numpy_matmul_calibration``). An engine that cannot take a particular
call's arrays (a layout BLAS cannot read without a copy, a read-only array Torch cannot view) runs it with
``ufunc`` instead, which takes everything; results agree within rounding.
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np

from .._compiled import hotpath
from .._epilog_numpy import NumpyEpilogOps
from .._matmul_problem import MatmulProblem, scalar_value
from . import cpu_caches, numpy_blas
from .cpu_threads import CPUS

__all__ = [
    "ENGINES",
    "STRATEGY_OF",
    "SWEEP_ACTIVATIONS",
    "available",
    "applicable",
    "EnginePlan",
    "sweep_kernel",
    "gemm_kernel",
    "tiled_kernel",
    "tiled_isa",
    "cblas_operand",
    "swept",
]

#: every engine, and the strategy each serves
STRATEGY_OF = {
    "gemm": "inplace",
    "sweep": "inplace",
    "blas": "native",
    "torch": "framework_fused",
    "panels": "inplace",
    "tiled": "inplace",
    "ufunc": "inplace",
}
ENGINES = tuple(STRATEGY_OF)
_OPS = NumpyEpilogOps(inplace=True)  # the executor's own step vocabulary: RELU keeps NaN, GELU tanh form
_ACTIVATIONS = {"relu": _OPS.relu_, "gelu": _OPS.gelu_}
_LINEAR_STEPS = {(): None, ("add_bias",): None, ("relu",): "relu", ("gelu",): "gelu"}
_LINEAR_STEPS.update({("add_bias", "relu"): "relu", ("add_bias", "gelu"): "gelu"})
#: the activations and dtypes the compiled sweep handles
SWEEP_ACTIVATIONS = (None, "relu")
_SWEEP_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
#: the result dtypes engines take (complex: ``gemm`` and ``ufunc`` alone, see ``applicable``)
_ENGINE_DTYPES = ("float32", "float64", "complex64", "complex128")


def available() -> tuple[str, ...]:
    """The engines this process has: the compiled sweep where the extension is built, SciPy's BLAS where SciPy
    is installed, Torch's where the process has imported Torch (importing it costs seconds and a second thread
    pool: nvdispatch never does so just to try an engine)."""
    have = ["ufunc", "panels"]
    if sweep_kernel() is not None:
        have.append("sweep")
    if gemm_kernel("float32") is not None:
        have.append("gemm")
    if tiled_kernel() is not None:
        have.append("tiled")
    if _installed("scipy"):
        have.append("blas")
    if sys.modules.get("torch") is not None:
        have.append("torch")
    return tuple(have)


def sweep_kernel():
    """The compiled bias + activation sweep (``_hotpath.bias_activation``), or None where it is not built."""
    return getattr(hotpath(), "bias_activation", None)


def gemm_kernel(dtype: str):
    """``(kernel, gemm address, ilp64, kind)``: the compiled product + sweep (``_hotpath.gemm_bias_activation``)
    and NumPy's BLAS's cblas gemm for ``dtype`` (``numpy_blas.gemm``), or None where either is missing."""
    kernel = getattr(hotpath(), "gemm_bias_activation", None)
    found = None if kernel is None else numpy_blas.gemm(dtype)
    if found is None:
        return None
    return kernel, *found, numpy_blas.GEMM_KINDS[dtype][1]


def tiled_kernel():
    """The compiled tiled GEMM (``_hotpath.tiled_gemm``), or None where the extension is not built."""
    return getattr(hotpath(), "tiled_gemm", None)


def tiled_isa() -> str | None:
    """The kernel the tiled GEMM runs on this processor (``"avx512"``, ``"avx2"`` or ``"portable"``), or None."""
    isas = getattr(hotpath(), "tiled_isas", None)
    return None if isas is None else isas()[0]


#: the packed panels of ``b`` the tiled GEMM keeps in a core's cache at a time, where the OS does not say its size
_TILED_BLOCK_BYTES = 256 << 10


def tiled_block_bytes() -> int:
    """Bytes of packed ``b`` the tiled GEMM runs every strip of ``a`` past at a time: three quarters of a core's
    private cache (the rest for the strip of ``a`` and the lines of the tiles going out, which only pass)."""
    cache = cpu_caches.private_cache_bytes()
    return cache * 3 // 4 if cache else _TILED_BLOCK_BYTES


def _installed(name: str) -> bool:
    if name in sys.modules:
        return sys.modules[name] is not None  # None: the import is blocked
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def applicable(problem: MatmulProblem) -> tuple[str, ...]:
    """The engines that can run ``problem`` (empty for epilogs beyond a linear layer, mixed dtypes...); complex
    results (bias or none: activations are not defined on them) only ``gemm`` and ``ufunc``."""
    p = problem
    if p.result_dtype not in _ENGINE_DTYPES or p.a.dtype != p.result_dtype or p.b.dtype != p.result_dtype:
        return ()
    if tuple(p.epilog.steps) not in _LINEAR_STEPS or p.epilog.outputs:
        return ()
    names = tuple(name for name, _ in p.inputs)
    if names not in ((), ("bias",)) or (names and p.input_sigs["bias"].dtype != p.result_dtype):
        return ()
    if p.bias_axis == "m" or (names and len(p.input_sigs["bias"].shape) > 2):
        return ("ufunc",)
    if p.c is not None and p.c.dtype != p.result_dtype:
        return ()
    if p.m * p.n * p.k == 0:
        return ("ufunc",)  # nothing to multiply: BLAS and Torch add nothing but checks
    two_d = not p.batch_shape or all(d == 1 for d in p.batch_shape)
    sweeps = _LINEAR_STEPS[tuple(p.epilog.steps)] in SWEEP_ACTIVATIONS
    has = available()
    if np.dtype(p.result_dtype).kind == "c":
        gemm = two_d and "gemm" in has and gemm_kernel(p.result_dtype) is not None
        return ("gemm", "ufunc") if gemm else ("ufunc",)
    # (``panels``, ``gemm``: 2-D, as BLAS and Torch; ``sweep``: any batch, ``tiled``: 2-D, for the activations
    # they apply)
    return tuple(
        e
        for e in has
        if e == "ufunc" or (e == "sweep" and sweeps) or (two_d and (sweeps or e != "tiled") and e != "sweep")
    )


def plan(problem: MatmulProblem, engine: str) -> EnginePlan:
    return EnginePlan(problem, engine)


class EnginePlan:
    """A linear-layer matmul run by one engine. ``execute`` returns the result (no aux outputs)."""

    needs_release = False  # holds nothing to free: calls need not pin it (see the plan cache)
    notes: tuple[str, ...] = ()  # lines ``explain()`` shows after the steps (the engine ranking followed)

    def __init__(self, problem: MatmulProblem, engine: str):
        self.problem = problem
        self.engine = engine
        self.strategy = STRATEGY_OF[engine]
        self.dtype = np.dtype(problem.result_dtype)
        self.activation = _LINEAR_STEPS[tuple(problem.epilog.steps)]
        self.shape = problem.promoted_shape
        self.run = getattr(self, f"_{engine}")
        if engine == "blas":
            from scipy.linalg import blas

            self.gemm = blas.sgemm if self.dtype == np.float32 else blas.dgemm
        elif engine == "torch":
            import torch

            self.torch = torch
        elif engine == "sweep":
            self.sweep = sweep_kernel()
        elif engine == "gemm":
            self.gemm_call = gemm_kernel(self.dtype.name)
        elif engine == "tiled":
            self.tiled = tiled_kernel()
            self.isa = tiled_isa()
            self.pool = numpy_blas.pool()
            # (the calibration times engines running threads of their own apart; on the BLAS's pool, they are its)
            self.own_threads = 1 if self.pool is not None else CPUS
            self.block_bytes = tiled_block_bytes()
        # the Plan protocol's direct call (alpha 1, no c, the caller's arrays): direct(a, b[, bias])
        plain_2d = problem.c is None and not problem.a_vector and not problem.b_vector and len(self.shape) == 2
        self.direct = None
        if plain_2d and "bias" in problem.input_sigs:
            direct = {"ufunc": _ufunc_direct, "sweep": self._sweep_direct, "gemm": self._gemm_direct}.get(engine)
            direct = self._tiled_direct if engine == "tiled" else direct
            self.direct = self._direct_bias if direct is None else direct(self.dtype, self.activation)
        elif plain_2d and not problem.inputs:
            self.direct = self._direct_plain

    @property
    def steps(self) -> tuple[str, ...]:
        return (*self._describe(), *self.notes)

    def _describe(self) -> tuple[str, ...]:
        p = self.problem
        gemm = {
            "ufunc": "np.matmul into the result",
            "sweep": "np.matmul into the result",
            "blas": "BLAS gemm (scipy.linalg.blas) with beta=1 into the result pre-filled with bias/c",
            "torch": "torch.addmm on zero-copy Torch views of the NumPy arrays",
            "gemm": "NumPy's own BLAS gemm called from C, "
            + ("beta into a copy of c" if p.c is not None else "beta=1 into a zeroed result (no clearing pass)"),
            "tiled": "np.matmul into the result (the tiled GEMM takes no c)"
            if p.c is not None
            else f"nvdispatch's blocked GEMM ({getattr(self, 'isa', None)} kernel, up to {CPUS} threads: "
            + ("NumPy's OpenBLAS workers)" if getattr(self, "pool", None) is not None else "its own)"),
        }[self.engine]
        steps = [f"alpha * a @ b{' + beta * c' if p.c is not None else ''} via {gemm} (engine {self.engine!r})"]
        fused = ("add_bias",) if self.engine in ("blas", "torch") and p.c is None else ()
        for step in p.epilog.steps:
            where = "fused in the GEMM call" if step in fused else "in place over the whole result"
            if self.engine == "sweep" or (self.engine == "gemm" and step != "gelu"):
                where = "in one compiled sweep over the result with the other steps"
                where += ", in the same C call as the product" if self.engine == "gemm" else ""
            elif self.engine == "tiled" and p.c is None:
                where = "on each tile of the product in registers, as it is stored"
            steps.append(f"{step} ({where})")
        return tuple(steps)

    def release(self) -> None:
        pass

    def tuning(self):
        return None

    # -- execution ----------------------------------------------------------------------------------------
    def _direct_bias(self, a, b, bias):
        return self.run(_native(a), _native(b), _native(bias).reshape(1, -1), None, 1, 0)

    def _direct_plain(self, a, b):
        return self.run(_native(a), _native(b), None, None, 1, 0)

    def execute(self, operands, stream=None):
        p = self.problem
        a, b = _native(operands["a"]), _native(operands["b"])
        if p.a_vector:
            a = a[np.newaxis, :] if a.ndim == 1 else np.expand_dims(a, -2)
        if p.b_vector:
            b = b[:, np.newaxis] if b.ndim == 1 else np.expand_dims(b, -1)
        alpha = scalar_value(operands.get("alpha", 1))
        c = _native(operands.get("c"))
        beta = 0
        if c is not None:
            beta = operands.get("beta")
            beta = 1 if beta is None else scalar_value(beta)
            c = np.broadcast_to(c, p.result_shape).reshape(self.shape)
        bias = _native(operands.get("bias"))
        if bias is not None:
            bias = np.asarray(bias)
            bias = bias.reshape(1, -1) if bias.ndim == 1 else bias
        if len(self.shape) != 2 and self.engine not in ("ufunc", "sweep"):  # batch of one: 2-D views
            a, b = a.reshape(a.shape[-2:]), b.reshape(b.shape[-2:])
            c = None if c is None else c.reshape(self.shape[-2:])
            bias = None if bias is None else bias.reshape(bias.shape[-2:])
            return p.squeeze(self.run(a, b, bias, c, alpha, beta).reshape(self.shape))
        return p.squeeze(self.run(a, b, bias, c, alpha, beta))

    def _finish(self, out, act):
        if act is not None:
            _ACTIVATIONS[act](out)
        return out

    def _scaled_product(self, a, b, c, alpha, beta):
        """``alpha a @ b + beta c`` into a new result (the epilog not applied yet)."""
        out = np.matmul(a, b, out=np.empty(self.shape if a.ndim + b.ndim > 4 else self.shape[-2:], self.dtype))
        if alpha != 1:
            np.multiply(out, alpha, out=out, casting="unsafe")
        if c is not None and beta != 0:
            np.add(out, c if beta == 1 else np.multiply(c, beta), out=out, casting="unsafe")
        return out

    def _ufunc(self, a, b, bias, c, alpha, beta):
        out = self._scaled_product(a, b, c, alpha, beta)
        if bias is not None:
            np.add(out, bias, out=out)
        return self._finish(out, self.activation)

    def _sweep(self, a, b, bias, c, alpha, beta):
        out = self._scaled_product(a, b, c, alpha, beta)
        return swept(self.sweep, out, bias, self.activation == "relu")

    def _sweep_direct(self, dtype: np.dtype, activation: str | None):
        """The ``sweep`` engine's hot path for ``act(a @ b + bias)``: the product, then one compiled sweep."""
        matmul, sweep, relu = np.matmul, self.sweep, activation == "relu"

        def direct(a, b, bias):
            return swept(sweep, matmul(a, b), bias, relu)

        return direct

    def _gemm(self, a, b, bias, c, alpha, beta):
        """NumPy's BLAS gemm and the sweep in one C call (see the module notes); ``ufunc`` for layouts the BLAS
        cannot read as they lie, and sizes beyond its integers."""
        ta, lda = cblas_operand(a, self.dtype)
        tb, ldb = cblas_operand(b, self.dtype)
        if lda is None or ldb is None:
            return self._ufunc(a, b, bias, c, alpha, beta)
        kernel, address, ilp64, kind = self.gemm_call
        m, k = a.shape
        n = b.shape[1]
        if c is not None and beta != 0:
            out = np.empty((m, n), self.dtype)
            out[...] = c
        else:
            out, beta = np.zeros((m, n), self.dtype), 1.0  # already zero: beta = 1 spares the BLAS its clearing
        swept_bias = None
        if bias is not None and bias.size == n and bias.dtype == self.dtype:
            swept_bias = np.ascontiguousarray(bias)
        # (RELU in the sweep only where the bias is added there too: it must come after the bias)
        relu = self.activation == "relu" and (bias is None or swept_bias is not None)
        at = None if swept_bias is None else swept_bias.__array_interface__["data"][0]
        try:
            scalars = _scalar(alpha, kind), _scalar(beta, kind)
        except TypeError:  # a complex alpha/beta for a real result: NumPy's casting rules, by the ufuncs
            return self._ufunc(a, b, bias, c, alpha, beta)
        try:
            kernel(address, ilp64, kind, ta, tb, m, n, k, scalars[0], a.__array_interface__["data"][0], lda,
                   b.__array_interface__["data"][0], ldb, scalars[1], out.__array_interface__["data"][0], n, at,
                   relu, m)  # fmt: skip
        except OverflowError:  # sizes beyond a 32-bit BLAS's integers
            return self._ufunc(a, b, bias, c, alpha, beta)
        if bias is not None and swept_bias is None:
            np.add(out, bias, out=out)
            return self._finish(out, self.activation)
        return out if relu else self._finish(out, self.activation)

    def _gemm_direct(self, dtype: np.dtype, activation: str | None):
        """The ``gemm`` engine's hot path for ``act(a @ b + bias)``."""
        run = self._gemm

        def direct(a, b, bias):
            return run(a, b, bias, None, 1, 0)

        return direct

    def _tiled(self, a, b, bias, c, alpha, beta):
        """The compiled tiled GEMM with the epilog per register tile (see the module notes); ``ufunc`` for
        ``beta * c``, layouts it cannot read as they lie, a bias that is not ``n`` values of the result's dtype
        and complex scalars."""
        ta, lda = cblas_operand(a, self.dtype)
        tb, ldb = cblas_operand(b, self.dtype)
        if lda is None or ldb is None or (c is not None and beta != 0):
            return self._ufunc(a, b, bias, c, alpha, beta)
        if bias is not None:
            if bias.size != b.shape[1] or bias.dtype != self.dtype:
                return self._ufunc(a, b, bias, c, alpha, beta)
            bias = np.ascontiguousarray(bias)
        try:
            alpha = _scalar(alpha, 0)
        except TypeError:  # a complex alpha for a real result: NumPy's casting rules, by the ufuncs
            return self._ufunc(a, b, bias, c, alpha, beta)
        m, k = a.shape
        n = b.shape[1]
        out = np.empty((m, n), self.dtype)
        self.tiled(
            self.dtype == np.float64, None, ta, tb, m, n, k, alpha, a.__array_interface__["data"][0], lda,
            b.__array_interface__["data"][0], ldb, out.__array_interface__["data"][0], n,
            None if bias is None else bias.__array_interface__["data"][0], self.activation == "relu", CPUS,
            self.block_bytes, self.pool,
        )  # fmt: skip
        return out

    def _tiled_direct(self, dtype: np.dtype, activation: str | None):
        """The ``tiled`` engine's hot path for ``act(a @ b + bias)``."""
        run = self._tiled

        def direct(a, b, bias):
            return run(a, b, bias, None, 1, 0)

        return direct

    def _blas(self, a, b, bias, c, alpha, beta):
        # row-major out = a @ b is column-major out.T = b.T @ a.T: BLAS reads each operand as it lies when it
        # is C- or F-contiguous (transposed flag), and writes into out.T (F-contiguous) in place.
        bt, trans_a = _fortran_operand(b)
        at, trans_b = _fortran_operand(a)
        if bt is None or at is None:
            return self._ufunc(a, b, bias, c, alpha, beta)
        out = np.empty((a.shape[0], b.shape[1]), self.dtype)
        if c is not None and beta != 0:
            out[...] = c
            gemm_beta = beta
        elif bias is not None:
            out[...] = bias
            gemm_beta, bias = 1.0, None
        else:
            gemm_beta = 0.0
        r = self.gemm(alpha, bt, at, beta=gemm_beta, c=out.T, trans_a=trans_a, trans_b=trans_b, overwrite_c=1)
        if r.base is not out and not np.shares_memory(r, out):  # BLAS wrote a copy: keep its result
            out = r.T
        if bias is not None:
            np.add(out, bias, out=out)
        return self._finish(out, self.activation)

    def _torch(self, a, b, bias, c, alpha, beta):
        torch = self.torch
        if not (a.flags.writeable and b.flags.writeable) or (bias is not None and not bias.flags.writeable):
            return self._ufunc(a, b, bias, c, alpha, beta)  # Torch cannot view read-only memory
        try:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            tbias = None if bias is None else torch.from_numpy(bias if bias.flags.c_contiguous else bias.copy())
        except (ValueError, RuntimeError, TypeError):  # negative strides...
            return self._ufunc(a, b, bias, c, alpha, beta)
        act = self.activation
        if c is not None and beta != 0:
            r = torch.addmm(torch.from_numpy(np.array(c, order="C")), ta, tb, beta=beta, alpha=alpha)
            if tbias is not None:
                r.add_(tbias)
        elif tbias is not None:
            r = torch.addmm(tbias, ta, tb, alpha=alpha)
        else:
            r = torch.mm(ta, tb)
            if alpha != 1:
                r.mul_(alpha)
        return self._finish(r.numpy(), act)


def _ufunc_direct(dtype: np.dtype, activation: str | None):
    """The ``ufunc`` engine's hot path for ``act(a @ b + bias)``: three ufunc calls and nothing else
    (small repeated calls are bound by call overhead, not arithmetic)."""
    matmul, add = np.matmul, np.add
    if activation == "relu":
        maximum, zero = np.maximum, dtype.type(0)  # as the step vocabulary's relu_: NaN stays NaN

        def direct(a, b, bias):
            out = matmul(a, b)
            add(out, bias, out=out)
            maximum(out, zero, out=out)
            return out

    else:
        act = _ACTIVATIONS.get(activation)

        def direct(a, b, bias):
            out = matmul(a, b)
            add(out, bias, out=out)
            if act is not None:
                act(out)
            return out

    return direct


def swept(sweep, out: np.ndarray, bias, relu: bool) -> np.ndarray:
    """``out`` with ``act(out + bias)`` applied in place by the compiled sweep (``out`` C-contiguous float32 or
    float64; bias None or ``n`` values of its dtype in any shape), by NumPy's in-place ufuncs where the sweep
    cannot read the arrays as they are (another layout, dtype or bias size)."""
    if not out.flags.c_contiguous or out.dtype not in _SWEEP_DTYPES or out.size == 0:
        return _ufunc_finish(out, bias, relu)
    n = out.shape[-1]
    if bias is not None:
        bias = np.asarray(bias)
        if bias.size != n or bias.dtype != out.dtype:
            return _ufunc_finish(out, bias, relu)
        bias = np.ascontiguousarray(bias)
    data = out.__array_interface__["data"][0]
    at = None if bias is None else bias.__array_interface__["data"][0]
    sweep(data, at, out.size // n, n, n, out.dtype == np.float64, relu)
    return out


def _ufunc_finish(out: np.ndarray, bias, relu: bool) -> np.ndarray:
    if bias is not None:
        np.add(out, bias, out=out)
    if relu:
        _OPS.relu_(out)
    return out


def cblas_operand(x, dtype: np.dtype) -> tuple[bool, int | None]:
    """``(transposed, leading dimension)`` of a 2-D operand of ``dtype`` as a row-major cblas call reads it where
    it lies: a C-contiguous array as it is, an F-contiguous one as the transpose of its row-major transpose;
    ``(False, None)`` for other layouts, dtypes and unaligned data (``np.matmul`` does not hand those to BLAS
    either)."""
    if x.dtype != dtype or not x.flags.aligned:
        return False, None
    if x.flags.c_contiguous:
        return False, max(1, x.shape[1])
    if x.flags.f_contiguous:
        return True, max(1, x.shape[0])
    return False, None


def _scalar(value, kind: int):
    """``alpha``/``beta`` as the compiled call takes it: a float for real kinds, a complex for complex ones
    (TypeError for a complex value and a real kind)."""
    if kind >= 2:
        return complex(value)
    if isinstance(value, complex) or np.iscomplexobj(value):
        raise TypeError("a complex scalar for a real result")
    return float(value)


def _fortran_operand(x):
    """``(array BLAS reads as x.T, trans flag)``: x.T itself for C-contiguous x, x transposed by the flag for
    F-contiguous x; (None, 0) for other layouts."""
    if x.flags.c_contiguous:
        return x.T, 0
    if x.flags.f_contiguous:
        return x, 1
    return None, 0


def _native(x):
    """A NumPy view of a CPU DLPack object (zero-copy); NumPy arrays and None pass through."""
    return x if x is None or isinstance(x, np.ndarray) else np.from_dlpack(x)
