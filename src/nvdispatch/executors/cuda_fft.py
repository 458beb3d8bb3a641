"""FFT on the raw ``"cuda"`` executor: cuFFT called directly (ctypes, located with cuda-pathfinder) for
Torch, CuPy, ``__cuda_array_interface__`` (Numba...) and DLPack device arrays.

The transform is described to cuFFT with its advanced data layout (``inembed/istride/idist``), so strided
inputs, batches along any side of the transformed axes, and up to 3 transformed axes run without a copy.
The plan is made once (shared plan cache; bound to the device it was made on) and queued on the caller's
stream (``stream=`` or the operand framework's current stream); nothing synchronizes.

Padding/trimming by ``n``/``s``, ``hfft``/``ihfft`` and real input to a complex transform (promotion) run with
an array pass around the cuFFT plan of the prepared problem (:mod:`.cuda_fft_prepared`: CuPy's or Torch's array
operations on zero-copy views, else framework-free passes of CUDA runtime copies and cuBLAS scal), for every operand
in CUDA memory; a Torch tensor or CuPy array is left to its
framework's own FFT unless the user asked for this executor. The executor declines, with the reason shown by
``explain()``/``NoExecutorError``, what cuFFT cannot express: more than 3 axes, layouts whose transformed axes
are not nested in memory order, and outer-batch launches that would start a real array at an element not
aligned to its complex type (the Torch/CuPy executors, tried next by default, run those).

cuFFT requires every input and output pointer aligned to the transform's complex type (8 bytes in single, 16 in
double precision; CUFFT_INVALID_VALUE otherwise). Results are allocated aligned; an input need not be: a real
view of complex data (Torch's ``z.imag``, NumPy/CuPy's ``z.view(float)[..., 1::2]``) starts one real element
into a complex one. Where the input's pointer is not aligned, its span is first copied, as it lies, into an
aligned scratch buffer (the plan's layout describes the copy too), on the caller's stream.

Normalisation other than none is one scaling pass over the result (as Torch and CuPy do). cuFFT's C2R
overwrites its input, so C2R plans first copy the input into a scratch buffer: inputs are never modified.
"""

from __future__ import annotations

import itertools
import math

from .._adapter_registry import adapter_named
from .._backends import is_requested
from .._compiled import hotpath
from .._fft_problem import FFTProblem
from .._strides import c_strides
from ..errors import ExecutorUnavailableError, PlanStateError
from . import builtin
from .cuda_fft_prepared import PreparedFFTPlan, decline_prepared, preparation

_SINGLE = {"complex64": True, "complex128": False}
#: how many outer-batch launches we accept for layouts cuFFT cannot batch in one call
_MAX_LOOP = 64


def layout(p: FFTProblem):
    """The cuFFT advanced layout of ``p`` as it lies, or a string saying why there is none (for what an array
    pass prepares, see :func:`.cuda_fft_prepared.preparation`: the layout of its ``core``)."""
    if p.func in ("hfft", "ihfft"):
        return "hfft/ihfft need an array pass around cuFFT"
    if p.needs_resize:
        return "padding/trimming by n/s needs an array pass around cuFFT"
    if p.kind in ("c2c", "c2r") and p.dtype not in _SINGLE:
        return f"real {p.dtype} input to a complex transform is promoted by an array pass around cuFFT"
    if len(p.axes) > 3:
        return "cuFFT transforms at most 3 axes at once"
    shape = p.shape
    strides = p.strides if p.strides is not None else c_strides(shape)
    if any(st <= 0 for d, st in zip(shape, strides) if d > 1):
        return "zero or negative strides"
    out_shape = p.out_shape
    ostr = c_strides(out_shape)
    order = sorted(p.axes)  # transformed axes in position order
    if p.kind != "c2c" and order[-1] != p.axes[-1]:
        return "the halved axis of a real transform must be the innermost transformed axis for cuFFT"
    rank = len(order)
    n = [p.lengths[p.axes.index(a)] for a in order]
    # input nesting: stride[a_k] == stride[a_{k+1}] * inembed[k+1]
    inembed, onembed = [shape[order[0]]], [out_shape[order[0]]]
    for k in range(rank - 1):
        a, b = order[k], order[k + 1]
        if strides[a] % strides[b] or strides[a] // strides[b] < shape[b]:
            return "the transformed axes are not nested in memory order (transposed input)"
        inembed.append(strides[a] // strides[b])
        onembed.append(ostr[a] // ostr[b])
    istride, ostride = strides[order[-1]], ostr[order[-1]]
    # batch: the other axes with extent > 1, collapsed into groups of equal-stride runs
    groups = []  # [count, istride, ostride]
    for d in range(len(shape)):
        if d in p.axes or shape[d] == 1:
            continue
        if groups and groups[-1][1] == strides[d] * shape[d] and groups[-1][2] == ostr[d] * out_shape[d]:
            g = groups[-1]
            groups[-1] = [g[0] * shape[d], strides[d], ostr[d]]
        else:
            groups.append([shape[d], strides[d], ostr[d]])
    if groups:
        inner = max(range(len(groups)), key=lambda i: groups[i][0])
        batch, idist, odist = groups[inner]
        loops = [g for i, g in enumerate(groups) if i != inner]
    else:
        batch, idist, odist, loops = 1, 1, 1, []
    if math.prod(g[0] for g in loops) > _MAX_LOOP:
        return "the batch axes cannot be expressed as one cuFFT batch (too many launches)"
    # each launch's pointers must be aligned to the complex type: a real side's launch offsets must be even
    if (p.kind == "r2c" and any(g[1] % 2 for g in loops)) or (p.kind == "c2r" and any(g[2] % 2 for g in loops)):
        return "an outer-batch launch would start at a real element not aligned to a complex one (cuFFT requires it)"
    return {
        "n": n,
        "inembed": inembed,
        "istride": istride,
        "idist": idist,
        "onembed": onembed,
        "ostride": ostride,
        "odist": odist,
        "batch": batch,
        "loops": loops,
        "span": 1 + sum((d - 1) * s for d, s in zip(shape, strides) if d > 0),
    }


def input_alignment(p: FFTProblem) -> int:
    """The byte alignment cuFFT requires of ``p``'s input pointer: its complex type's size (for real input too)."""
    return 8 if p.compute_dtype == "complex64" else 16


def misaligned(ptr: int, alignment: int) -> bool:
    """Whether an input at ``ptr`` must be copied to aligned scratch before cuFFT may read it."""
    return ptr % alignment != 0


def decline(problem: FFTProblem) -> str | None:
    if problem.long_double:
        return "long double is computed on the CPU only (NumPy executor, scipy.fft's pocketfft)"
    if problem.autograd:
        return "autograd records this call; a raw cuFFT result would carry no graph (torch.fft keeps it)"
    from .._cuda import cufft

    why = cufft.unavailable()
    if why:
        return why
    if problem.empty:
        return None  # an empty result, no cuFFT plan (EmptyFFTPlan)
    prep = preparation(problem)
    lay = layout(problem if prep is None else prep.core)
    if isinstance(lay, str):
        return lay
    if prep is not None:
        from .._cuda.xp import namespace_for

        return decline_prepared(problem, is_requested(builtin("cuda")), namespace_for(problem.framework))
    return None


def strategies(problem: FFTProblem) -> tuple[str, ...]:
    return ("cufft",)


def plan(problem: FFTProblem, strategy: str, tuning=None):
    if problem.empty:
        return EmptyFFTPlan(problem, strategy)
    prep = preparation(problem)
    if prep is not None:
        return PreparedFFTPlan(problem, strategy, prep, CudaFFTPlan(prep.core, strategy, direct=False))
    return CudaFFTPlan(problem, strategy)


class EmptyFFTPlan:
    """A transform of a zero-size input (cuFFT cannot plan a zero batch): allocates the empty result."""

    workspace_bytes = 0

    def __init__(self, problem: FFTProblem, strategy: str):
        self.problem = problem
        self.strategy = strategy
        self.steps = ("zero-size input: an empty result, no transform", problem.describe())
        self.supports_out = False

    def execute(self, operands, stream=None):
        from .._cuda import arrays, runtime, streams

        p = self.problem
        dev = p.device.index if p.device.index is not None else runtime.current_device()
        s = streams.stream_pointer(stream, p.framework, dev)
        out, _ = arrays.empty(arrays.result_kind(operands["x"], p.framework), p.out_shape, p.result_dtype, dev, s)
        return out

    def release(self) -> None:
        pass


class CudaFFTPlan:
    """A cuFFT plan for one problem; ``execute`` allocates the result in the caller's type and queues
    the transform (and the normalisation, if any) on the stream."""

    #: ``configure(lib, handle)`` run before cuFFT makes the plan (subclasses set JIT callbacks there)
    _configure = None

    def __init__(self, problem: FFTProblem, strategy: str, *, direct: bool = True):
        """``direct``: whether to make the Plan protocol's direct call (a plan run by another's execute needs none)."""
        from .._cuda import cufft, runtime

        self.problem = p = problem
        self.strategy = strategy
        lay = layout(p)
        self.layout = lay
        rt = runtime.cudart()
        dev = p.device.index if p.device.index is not None else runtime.current_device()
        self.device_index = dev
        cur = runtime.current_device()
        if cur != dev:
            runtime.check(rt.cudaSetDevice(dev), "cudaSetDevice")
        try:
            self.cufft = cufft.CufftPlan(
                p.kind,
                _SINGLE[p.compute_dtype],
                lay["n"],
                lay["inembed"],
                lay["istride"],
                lay["idist"],
                lay["onembed"],
                lay["ostride"],
                lay["odist"],
                lay["batch"],
                self._configure,
            )
        finally:
            if cur != dev:
                rt.cudaSetDevice(cur)
        # in-place C2C (operands["out"] is the input) when input and output layouts coincide
        self.supports_out = p.kind == "c2c" and (p.strides is None or tuple(p.strides) == c_strides(p.shape))
        self.direction = cufft.FORWARD if p.direction == "forward" else cufft.INVERSE
        self.scale = p.scale()
        self.in_item = 8 if p.dtype in ("complex64", "float64") else (16 if p.dtype == "complex128" else 4)
        self.alignment = input_alignment(p)
        self.span_bytes = lay["span"] * self.in_item
        self.out_item = {"complex64": 8, "complex128": 16, "float32": 4, "float64": 8}[p.result_dtype]
        self.loop_offsets = [
            (sum(i * g[1] for i, g in zip(idx, lay["loops"])), sum(i * g[2] for i, g in zip(idx, lay["loops"])))
            for idx in itertools.product(*(range(g[0]) for g in lay["loops"]))
        ] or [(0, 0)]
        type_name = {0x29: "C2C", 0x69: "Z2Z", 0x2A: "R2C", 0x6A: "D2Z", 0x2C: "C2R", 0x6C: "Z2D"}[self.cufft.type]
        #: the cuFFT plan and launch, in words (a plan running this one from its own execute shows them)
        self.cufft_steps = (
            f"cufftMakePlanMany64 {type_name} n={lay['n']} batch={lay['batch']} "
            f"istride={lay['istride']} idist={lay['idist']} (device {dev}, workspace {self.cufft.workspace_bytes} B)",
            f"cufftExec{type_name} on the caller's stream"
            + (f", {len(self.loop_offsets)} launches" if lay["loops"] else ""),
        )
        steps = list(self.cufft_steps)
        if p.kind == "c2r":
            steps.insert(1, "copy the input to scratch (cuFFT C2R overwrites its input)")
        else:
            steps.insert(1, f"an input not {self.alignment}-byte aligned is first copied to aligned scratch")
        if self.scale != 1.0:
            steps.append(f"scale by {self.scale:.6g} (norm={p.norm!r})")
        self.steps = (*steps, p.describe())
        self.direct = self._direct_call() if direct else None

    def _direct_call(self):
        """The Plan protocol's direct call, ``direct(x)``: ``execute({"x": x}, None)`` for the common call (an
        operand whose adapter makes results like itself, the current stream, one launch, no scratch copy), where
        a small transform's GPU time is of the order of a launch's host cost. Compiled where the extension is
        built (``_hotpath_cufft.c``), else :class:`_Launch`; None for other plans."""
        from .._cuda import cufft as cufft_lib
        from .._cuda import runtime

        p = self.problem
        if p.kind == "c2r" or len(self.loop_offsets) != 1 or p.strides is None:
            return None
        adapter = adapter_named(p.framework)
        made = None if adapter is None else adapter.result_maker(p.out_shape, p.result_dtype)
        if made is None:
            return None
        scale = None if self.scale == 1.0 else float(self.scale)
        idx = self.device_index
        launch = _Launch(
            self.cufft,
            made,
            adapter.data_ptr_reader(),
            adapter.current_stream_getter(idx),
            idx,
            self.direction,
            scale,
            alignment=self.alignment,
            span_bytes=self.span_bytes,
            framework=p.framework,
        )
        compiled = hotpath()
        if compiled is None:
            return launch
        ints = (
            cufft_lib.address(self.cufft.exec_name),
            cufft_lib.address("cufftSetStream"),
            self.direction if p.kind == "c2c" else 0,
            idx,
            self.alignment,
        )
        return compiled.make_cufft_direct(
            ints, self.cufft, *made, launch.pointer, launch.stream, runtime.bind_context, scale, cufft_lib.check, launch
        )

    def execute(self, operands, stream=None):
        if stream is None and self.direct is not None and len(operands) == 1:
            return self.direct(operands["x"])
        from .._cuda import arrays, runtime, streams

        p = self.problem
        x = operands["x"]
        fw = p.framework
        runtime.bind_context(self.device_index)
        s = streams.stream_pointer(stream, fw, self.device_index)
        v = arrays.view(x, fw)
        in_ptr = v.ptr
        if p.strides is None and tuple(v.strides) != c_strides(v.shape):
            raise PlanStateError(
                "x", f"the C-contiguous strides the plan was made for {c_strides(v.shape)}", str(v.strides)
            )
        out = operands.get("out")
        kind = arrays.result_kind(x, fw)
        if out is None:
            out, out_ptr = arrays.empty(kind, p.out_shape, p.result_dtype, self.device_index, s)
        else:
            out_ptr = arrays.view(out, fw).ptr
        self.launch(in_ptr, out_ptr, s)
        if self.scale != 1.0:
            _scale(out, fw, kind, self.scale, s, self.device_index)
        return out

    def launch(self, in_ptr: int, out_ptr: int, s: int, fresh: bool = False) -> None:
        """Queue the unnormalised transform of the input at ``in_ptr`` into ``out_ptr`` on stream ``s`` (every
        outer-batch launch). The input is first copied, as it lies, to aligned scratch where C2R would overwrite it
        (unless ``fresh``: scratch of the caller's, cuFFT's to overwrite) or cuFFT would reject its alignment."""
        tmp = None
        if (self.problem.kind == "c2r" and not fresh) or misaligned(in_ptr, self.alignment):
            # C2R overwrites its input; cuFFT rejects an unaligned one: the span as it lies, in aligned scratch
            tmp = staged_input(in_ptr, self.span_bytes, self.problem.framework, self.device_index, s)
            in_ptr = tmp.ptr
        for ioff, ooff in self.loop_offsets:
            self.cufft.execute(in_ptr + ioff * self.in_item, out_ptr + ooff * self.out_item, s, self.direction)
        if tmp is not None:
            tmp.release()  # stream-ordered: reused only after the transform

    @property
    def workspace_bytes(self) -> int:
        """cuFFT's work area for this plan (the plan cache bounds it)."""
        return int(self.cufft.workspace_bytes or 0) if self.cufft.handle is not None else 0

    def release(self) -> None:
        # cuFFT frees the plan's workspace at once: let work queued with it finish first
        if self.cufft.handle is not None and self.cufft.stream is not None:
            from .._cuda import runtime

            try:
                runtime.cudart().cudaStreamSynchronize(self.cufft.stream)
            except Exception:  # noqa: BLE001
                pass
        self.cufft.destroy()


class _Launch:
    """A :class:`CudaFFTPlan`'s direct call in Python (and the compiled one's fallback): the device's context
    bound, the result made as the operand's adapter says (``made``: ``(maker, args, kwargs)``, see
    ``Adapter.result_maker``), one launch on the current stream, the normalisation as one in-place multiply.
    It refers to the cuFFT plan, not to the :class:`CudaFFTPlan` (no reference cycle)."""

    __slots__ = (
        "cufft", "maker", "args", "kwargs", "pointer", "stream", "device", "direction", "scale",
        "alignment", "span_bytes", "framework",
    )  # fmt: skip

    def __init__(
        self,
        cufft,
        made,
        pointer,
        stream,
        device: int,
        direction: int,
        scale: float | None,
        *,
        alignment: int = 1,
        span_bytes: int = 0,
        framework: str | None = None,
    ):
        """``alignment``: what cuFFT requires of the input pointer; an input not aligned so is copied (its
        ``span_bytes``) to scratch of ``framework``'s allocator first (the compiled call hands such inputs here)."""
        self.cufft = cufft
        self.maker, self.args, self.kwargs = made
        self.pointer, self.stream, self.device, self.direction, self.scale = pointer, stream, device, direction, scale
        self.alignment, self.span_bytes, self.framework = alignment, span_bytes, framework

    def __call__(self, x):
        from .._cuda.runtime import bind_context

        bind_context(self.device)
        maker = self.maker
        out = (getattr(x, maker) if maker.__class__ is str else maker)(*self.args, **self.kwargs)
        in_ptr, stream = self.pointer(x), int(self.stream())
        if misaligned(in_ptr, self.alignment):
            tmp = staged_input(in_ptr, self.span_bytes, self.framework, self.device, stream)
            try:
                self.cufft.execute(tmp.ptr, self.pointer(out), stream, self.direction)
            finally:
                tmp.release()  # stream-ordered: reused only after the transform
        else:
            self.cufft.execute(in_ptr, self.pointer(out), stream, self.direction)
        if self.scale is not None:
            out *= self.scale  # on the current stream, where the transform was queued
        return out


def staged_input(ptr: int, nbytes: int, fw, device_index: int, stream: int):
    """``nbytes`` from device address ``ptr`` copied, as they lie, into new scratch (aligned as the allocator aligns
    every buffer, at least 256 bytes), on ``stream``; the caller releases it after queueing the work that reads it."""
    from .._cuda import memory, runtime

    tmp = memory.scratch(nbytes, fw, device_index, stream)
    rt = runtime.cudart()
    runtime.check(
        rt.cudaMemcpyAsync(tmp.ptr, ptr, nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpyAsync",
    )
    return tmp


def _scale(out, fw, kind, factor, stream, device_index):
    """Multiply ``out`` by ``factor`` in place, on ``stream``, with Torch or CuPy (whichever can view it)."""
    from .._cuda import xp as xpmod

    name = kind if kind in ("torch", "cupy") else xpmod.namespace_for(fw)
    if name is None:
        raise ExecutorUnavailableError("norm", "torch or cupy to scale the result on the GPU", "neither installed")
    from .._cuda.streams import current_stream

    arr = xpmod.as_xp(out, kind if kind in ("torch", "cupy") else fw, name)
    on_current = current_stream(name, device_index) == stream
    if name == "torch":
        import torch

        if on_current:
            arr.mul_(factor)
        else:
            dev = torch.device("cuda", device_index)
            with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=dev)):
                arr.mul_(factor)
    else:
        import cupy

        if on_current:
            arr *= factor
        else:
            with cupy.cuda.ExternalStream(stream):
                arr *= factor
