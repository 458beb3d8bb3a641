"""FFT problems the raw ``"cuda"`` executor runs with an array pass around cuFFT: real input to a complex
transform, ``hfft``/``ihfft``, and padding/trimming by ``n``/``s``.

cuFFT transforms data of the plan's extents and type, unnormalised. What numpy.fft asks beyond that is done
around the plan, as Torch's and CuPy's own FFTs do:

* an input pass into fresh C-contiguous scratch of the transform's extents and type (the array pass's
  stream-ordered pool, on the caller's stream): the kept part of ``x`` (the first ``min(m, n)`` elements along
  each transformed axis) copied in and the rest zero (padding; trimming keeps a prefix), real input widened to
  complex (numpy.fft's promotion: float32 → complex64, float64 → complex128), and for ``hfft`` conjugated:
  ``hfft(x, n)`` is the C2R transform of ``conj(x)``, scaled as a *forward* transform (numpy.fft's
  ``hfft(x, n, norm) == irfft(conj(x), n, norm=<the opposite>)``); the scratch is cuFFT's to overwrite (C2R
  does), so the input is never written;
* the transform, as the plan of that prepared problem (:func:`preparation`'s ``core``; one cuFFT plan, made
  once and kept in the plan cache like any other);
* an output pass over the result in place: for ``ihfft`` conjugated (``ihfft(x) == conj(rfft(x))`` scaled as
  an *inverse* transform), and the norm's factor (the problem's own :meth:`FFTProblem.scale`).

The passes are array operations of CuPy or Torch, whichever is installed (:mod:`nvdispatch._cuda.xp`), on
zero-copy views of the device memory (``__cuda_array_interface__`` views of the pointers the executor reads):
operands known only by ``__cuda_array_interface__`` or DLPack, and JAX GPU arrays, are prepared the same way.
Where neither framework can (a Numba-only user, say), the same passes run on raw pointers with no framework
(:mod:`nvdispatch._cuda.raw_passes`, helper ``"raw"``): scratch from ``cudaMallocAsync``, ``cudaMemsetAsync``,
strided ``cudaMemcpy2DAsync``/``cudaMemcpy3DAsync`` copies that also widen real to complex, and cuBLAS's
``?scal`` for the conjugation and the scale; without libcublas (or for layouts too scattered for a bounded
number of copies) the executor declines (``explain()`` says why). JAX arrays without CuPy or Torch keep the route
they had, JAX's own operations around cuFFT (as inside ``jax.jit``), unless the user asked for this executor. The
executor also declines when the operand is a Torch tensor or a CuPy array that the user did not send here: that
framework's own FFT runs the same cuFFT work in one call (``set_backend("cuda")`` runs it here).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any

from .._fft_problem import FFTProblem
from .._memory import CUPY_ARRAY, TORCH_TENSOR
from .._strides import c_strides

__all__ = [
    "Preparation",
    "preparation",
    "decline_prepared",
    "input_geometry",
    "stage",
    "finish",
    "PreparedFFTPlan",
    "RAW",
]

_log = logging.getLogger("nvdispatch")

_COMPLEX = frozenset({"complex64", "complex128"})
_ITEMSIZE = {"float16": 2, "float32": 4, "float64": 8, "complex32": 4, "complex64": 8, "complex128": 16}
#: what the framework-free passes (cuBLAS S/D scal) take
_RAW_DTYPES = frozenset({"float32", "float64", "complex64", "complex128"})
#: the function whose cuFFT transform a prepared one runs (hfft: C2R of conj(x); ihfft: R2C, then conjugated)
_CORE_FUNC = {"hfft": "irfft", "ihfft": "rfft"}
#: memory kinds whose framework's own FFT does these passes itself, in the same call
_FRAMEWORK_FFT = frozenset({TORCH_TENSOR, CUPY_ARRAY})
#: the helper name of the framework-free passes (:mod:`nvdispatch._cuda.raw_passes`)
RAW = "raw"


def _by(helper: str) -> str:
    """Who runs a pass, in words (``explain()``)."""
    if helper == RAW:
        return "raw device passes (no array framework: cudaMemsetAsync, cudaMemcpy2DAsync/3DAsync, cuBLAS ?scal)"
    return f"{helper}'s array operations"


@dataclass(frozen=True)
class Preparation:
    """How a problem is brought to one cuFFT can run as it is.

    ``core``: the problem of the cuFFT transform (the staged scratch's shape, C-contiguous strides and dtype when
    ``staged``); ``region``: per axis of ``x``, the extent copied into the scratch (``x``'s own for untransformed
    axes); ``pad``: some transformed axis is longer than what is copied (the scratch is zeroed first); ``widen``:
    real input copied into complex scratch; ``conj_input``/``conj_output``: ``hfft``/``ihfft``."""

    core: FFTProblem
    staged: bool
    region: tuple[int, ...]
    pad: bool
    widen: bool
    conj_input: bool
    conj_output: bool

    def input_steps(self, problem: FFTProblem, helper: str) -> list[str]:
        """The input pass, in words (``explain()``)."""
        if not self.staged:
            return []
        what = []
        if self.widen:
            what.append(f"real {problem.dtype} widened to {self.core.dtype}")
        old, new = problem.shape, self.core.shape
        resized = [(a, old[a], new[a]) for a in problem.axes if old[a] != new[a]]
        if resized:
            what.append(
                "; ".join(f"axis {a} {'zero-padded' if n > m else 'trimmed'} from {m} to {n}" for a, m, n in resized)
            )
        if self.conj_input:
            what.append("conjugated (hfft is the C2R transform of conj(x), scaled as a forward transform)")
        return [
            f"x copied into C-contiguous {self.core.dtype}{list(self.core.shape)} scratch by {_by(helper)} "
            f"on the caller's stream ({', '.join(what)}); x itself is never written"
        ]

    def output_steps(self, problem: FFTProblem, helper: str) -> list[str]:
        """The output pass, in words (``explain()``)."""
        steps = []
        if self.conj_output:
            steps.append(f"the result conjugated in place by {_by(helper)} (ihfft is conj(rfft(x)), scaled as an "
                         "inverse transform)")  # fmt: skip
        scale = problem.scale()
        if scale != 1.0:
            steps.append(f"scale by {scale:.6g} (norm={problem.norm!r})")
        return steps


def preparation(p: FFTProblem) -> Preparation | None:
    """How ``p`` is prepared for cuFFT, or None where cuFFT runs it as it is (a complex or R2C transform of the
    operand's own extents, no ``hfft``/``ihfft``)."""
    widen = p.kind != "r2c" and p.dtype not in _COMPLEX
    resize = p.needs_resize
    conj_input, conj_output = p.func == "hfft", p.func == "ihfft"
    if not (widen or resize or conj_input or conj_output):
        return None
    staged = widen or resize or conj_input
    func = _CORE_FUNC.get(p.func, p.func)
    if not staged:  # ihfft of x's own extents: cuFFT's R2C reads x where it lies
        return Preparation(replace(p, func=func), False, tuple(p.shape), False, False, False, conj_output)
    wanted = dict(zip(p.axes, p.in_lengths))
    shape = tuple(wanted.get(d, m) for d, m in enumerate(p.shape))
    region = tuple(min(m, wanted.get(d, m)) for d, m in enumerate(p.shape))
    dtype = p.dtype if p.kind == "r2c" else p.compute_dtype
    core = replace(p, func=func, dtype=dtype, shape=shape, strides=c_strides(shape))
    pad = region != shape
    return Preparation(core, True, region, pad, widen, conj_input, conj_output)


def decline_prepared(p: FFTProblem, requested: bool, helper: str | None) -> str | None:
    """Why the executor leaves prepared problem ``p`` to another, or None. ``requested``: the user asked for this
    executor (``set_backend``); ``helper``: the framework whose array operations would run the passes (None:
    neither CuPy nor Torch can, so the framework-free passes of :mod:`nvdispatch._cuda.raw_passes` would)."""
    what = _what(p)
    if p.memory & _FRAMEWORK_FFT and not requested:
        return (f"{what}: {p.framework}'s own FFT runs the same cuFFT work in one call (set_backend('cuda') runs it "
                "here, with an array pass around cuFFT)")  # fmt: skip
    if p.strides is not None and any(st <= 0 for d, st in zip(p.shape, p.strides) if d > 1):
        return f"{what}: zero or negative strides"
    route = _own_route(p.framework) if helper is None and not requested else None
    if route:
        return (f"{what}: without CuPy or Torch, {route} (set_backend('cuda') runs it here, with the framework-free "
                "passes around cuFFT)")  # fmt: skip
    if helper is None:
        from .._cuda import raw_calls, raw_passes

        why = raw_calls.unavailable()
        if why:
            return (f"{what} needs an array pass around cuFFT: neither CuPy nor Torch is installed, and the "
                    f"framework-free passes cannot run ({why})")  # fmt: skip
        prep = preparation(p)
        dtypes = {p.dtype, p.result_dtype} | ({prep.core.dtype} if prep is not None else set())
        if not dtypes <= _RAW_DTYPES:
            return f"{what}: the framework-free passes take single and double precision only, not {sorted(dtypes)}"
        if prep is not None and prep.staged:
            g = input_geometry(p, prep, p.strides if p.strides is not None else c_strides(p.shape))
            if g.copies > raw_passes.MAX_COPIES:
                return (f"{what}: without CuPy or Torch the input pass would take {g.copies} copy calls for this "
                        f"layout (more than {raw_passes.MAX_COPIES})")  # fmt: skip
    return None


def _own_route(framework: str) -> str | None:
    """The framework's own route for prepared FFTs without CuPy/Torch (the adapter's ``prepared_fft_route``)."""
    from .._adapter_registry import adapter_named

    ad = adapter_named(framework)
    return None if ad is None else ad.prepared_fft_route


def input_geometry(p: FFTProblem, prep: Preparation, strides: tuple[int, ...]):
    """The framework-free input pass's copy (:class:`nvdispatch._cuda.raw_passes.CopyGeometry`): ``prep.region``
    of ``x`` (element ``strides``) into the C-contiguous scratch of ``prep.core``, a real element into the real part
    of a complex one where ``prep.widen``."""
    from .._cuda.raw_passes import copy_geometry

    isz = _ITEMSIZE[p.dtype]
    osz = _ITEMSIZE[prep.core.dtype]
    src = tuple(st * isz for st in strides)
    dst = tuple(st * osz for st in c_strides(prep.core.shape))
    return copy_geometry(tuple(prep.region), src, dst, isz)


def _what(p: FFTProblem) -> str:
    parts = []
    if p.func in _CORE_FUNC:
        parts.append(p.func)
    if p.kind != "r2c" and p.dtype not in _COMPLEX:
        parts.append(f"real {p.dtype} input to a complex transform")
    if p.needs_resize:
        parts.append("padding/trimming by n/s")
    return ", ".join(parts)


def stage(ops: Any, src: Any, prep: Preparation, device_index: int | None = None) -> Any:
    """The input pass: a new array of ``ops``' framework (``nvdispatch._cuda.xp.Xp``'s device operations, or any
    object with ``empty``, ``zeros``, ``copy_into`` and ``conj_``) holding ``src`` (``x`` viewed by that framework)
    as ``prep.core`` takes it. ``src`` is only read."""
    core = prep.core
    buf = (ops.zeros if prep.pad else ops.empty)(core.shape, core.dtype, device_index)
    region = tuple(slice(0, r) for r in prep.region)
    ops.copy_into(buf[region] if prep.pad else buf, src[region])  # widens real to complex where buf is complex
    if prep.conj_input:
        ops.conj_(buf)
    return buf


def finish(ops: Any, out: Any, prep: Preparation, scale: float) -> None:
    """The output pass, in place on ``out`` (the result viewed by ``ops``' framework)."""
    if prep.conj_output:
        ops.conj_(out)
    if scale != 1.0:
        out *= scale


class PreparedFFTPlan:
    """A prepared problem's plan: the input pass, the cuFFT plan of ``prep.core`` (``inner``, a ``CudaFFTPlan``
    made once), the output pass; the result allocated in the caller's type."""

    def __init__(self, problem: FFTProblem, strategy: str, prep: Preparation, inner: Any):
        from .._cuda.xp import Xp, namespace_for

        self.problem = problem
        self.strategy = strategy
        self.prep = prep
        self.inner = inner
        self.device_index = inner.device_index
        self.helper = namespace_for(problem.framework)
        if self.helper is None:  # neither CuPy nor Torch: the framework-free passes, where they can run
            from .._cuda import raw_calls

            why = raw_calls.unavailable()
            if why:  # the executor declines such problems; a plan asked for all the same says why
                from ..errors import ExecutorUnavailableError

                raise ExecutorUnavailableError(
                    "x", f"CuPy, Torch or the framework-free passes for the array pass of {_what(problem)}", why
                )
            self.helper, self.ops = RAW, None
        else:
            self.ops = Xp(self.helper)
        self.scale = problem.scale()
        self.supports_out = False
        self.direct = None
        copies = ()
        if self.helper == RAW and prep.staged:
            strides = problem.strides if problem.strides is not None else c_strides(problem.shape)
            g = input_geometry(problem, prep, strides)
            widened = " (real elements into the real parts of zeroed complex scratch)" if prep.widen else ""
            copies = (f"the kept region of x copied by {g.describe()} for its layout{widened}",)
        self.steps = (
            *prep.input_steps(problem, self.helper),
            *copies,
            *inner.cufft_steps,
            *prep.output_steps(problem, self.helper),
            problem.describe(),
        )
        _log.debug("fft %s: the cuda executor prepares it for cuFFT's %s plan with %s: %s",
                   problem.func, prep.core.kind, _by(self.helper), "; ".join(self.steps[:-1]))  # fmt: skip

    def execute(self, operands, stream=None):
        from .._cuda import arrays, runtime, streams

        p, prep, inner, ops, helper = self.problem, self.prep, self.inner, self.ops, self.helper
        fw, dev = p.framework, self.device_index
        x = operands["x"]
        runtime.bind_context(dev)
        s = streams.stream_pointer(stream, fw, dev)
        v = arrays.view(x, fw)
        kind = arrays.result_kind(x, fw)
        if helper == RAW:
            return self._execute_raw(v, kind, s)
        with streams.framework_stream(helper, s, dev):
            if prep.staged:
                buf = stage(ops, _viewed(v.ptr, v.shape, v.dtype, v.strides, v, helper), prep, dev)
                in_ptr = ops.data_ptr(buf)
            else:
                if p.strides is None and tuple(v.strides) != c_strides(v.shape):
                    from ..errors import PlanStateError

                    raise PlanStateError(
                        "x", f"the C-contiguous strides the plan was made for {c_strides(v.shape)}", str(v.strides)
                    )
                buf, in_ptr = None, v.ptr
            out, out_ptr = arrays.empty(kind, p.out_shape, p.result_dtype, dev, s)
            inner.launch(in_ptr, out_ptr, s, fresh=buf is not None)
            del buf  # stream-ordered: its memory is reused only after the transform
            if prep.conj_output or self.scale != 1.0:
                finish(ops, _viewed(out_ptr, p.out_shape, p.result_dtype, None, out, helper), prep, self.scale)
        return out

    def _execute_raw(self, v, kind: str, s: int):
        """``execute`` with the framework-free passes (:mod:`nvdispatch._cuda.raw_passes`) on raw pointers."""
        from .._cuda import arrays, raw_calls, raw_passes

        p, prep, inner, dev = self.problem, self.prep, self.inner, self.device_index
        if prep.staged:
            core = prep.core
            count = math.prod(core.shape)
            nbytes = count * _ITEMSIZE[core.dtype]
            geometry = input_geometry(p, prep, tuple(v.strides))
            buf = raw_calls.alloc(nbytes, s)
            try:
                if prep.pad or prep.widen:  # the padding, and the imaginary parts of widened real input
                    raw_calls.memset_zero(buf, nbytes, s)
                raw_passes.strided_copy(geometry, buf, v.ptr, s)
                if prep.conj_input and not prep.widen:  # a widened real input is its own conjugate
                    raw_passes.scale_and_conj(buf, count, core.dtype, 1.0, True, s, dev)
                out, out_ptr = arrays.empty(kind, p.out_shape, p.result_dtype, dev, s)
                inner.launch(buf, out_ptr, s, fresh=True)
            finally:
                raw_calls.free(buf, s)  # stream-ordered: its memory is reused only after the transform
        else:
            if p.strides is None and tuple(v.strides) != c_strides(v.shape):
                from ..errors import PlanStateError

                raise PlanStateError(
                    "x", f"the C-contiguous strides the plan was made for {c_strides(v.shape)}", str(v.strides)
                )
            out, out_ptr = arrays.empty(kind, p.out_shape, p.result_dtype, dev, s)
            inner.launch(v.ptr, out_ptr, s, fresh=False)
        if prep.conj_output or self.scale != 1.0:
            raw_passes.scale_and_conj(out_ptr, math.prod(p.out_shape), p.result_dtype, self.scale, prep.conj_output,
                                      s, dev)  # fmt: skip
        return out

    @property
    def workspace_bytes(self) -> int:
        return self.inner.workspace_bytes

    def release(self) -> None:
        self.inner.release()


def _viewed(ptr: int, shape, dtype: str, strides, owner: Any, helper: str):
    """A zero-copy array of ``helper``'s framework over device memory at ``ptr`` (``strides`` in elements, None:
    C-contiguous), through ``__cuda_array_interface__`` (no stream named: the work is ordered on the caller's
    stream by the caller); it keeps ``owner`` alive."""
    from .._cuda.arrays import CudaArray
    from .._cuda.xp import as_xp

    return as_xp(CudaArray(shape, dtype, strides, base=owner, ptr=ptr), "cai", helper)
