"""Autotuning a cuBLASLt plan that has no operands yet: on scratch device buffers, on a private stream.

A plan made while a program is compiled (a matmul staged into ``jax.jit``) has placeholders, not memory, for
its operands. :func:`autotune_on_scratch` gives it memory of its own for as long as the timing takes: a buffer
per operand and per output, of the spans its problem's strides and :func:`~.lt_setup.output_layouts` describe,
allocated with ``cudaMallocAsync`` on a stream created for the purpose (no framework's allocator or stream is
involved), filled with finite values of each dtype (a repeated pseudo-random pattern in ``[-1, 1)``: GEMM
timings depend on the data through power draw and clocks, so zeros would flatter every candidate alike), then
:func:`.lt_autotune.autotune` times the candidates there, at most ``max_candidates`` of them and
screening for at most ``budget`` seconds, and checks the winner's result against the heuristic's first
answer's there (:mod:`.lt_result_check`). Everything is given back before it returns, the workspace the
launches took for the private stream included; the plan keeps the winner (and the plan cache's record of it).
"""

from __future__ import annotations

import ctypes
import logging
import math
import sys

import numpy as np

from .._strides import c_strides
from . import lt_autotune, runtime
from .arrays import DeviceView
from .lt_result_check import result_check
from .lt_setup import output_layouts

__all__ = ["autotune_on_scratch", "pattern"]

#: cudaStreamNonBlocking: the private stream does not wait on the legacy default stream
_NON_BLOCKING = 1
#: bytes of the host pattern a buffer is filled from (the device doubles it by copies up to the buffer's size)
_PATTERN_BYTES = 1 << 20
_log = logging.getLogger("nvdispatch")


def pattern(dtype: str, nbytes: int, seed: int = 0) -> bytes:
    """``nbytes`` of finite values of ``dtype``: uniform in ``[-1, 1)`` for floating and complex dtypes
    (bfloat16: float32's upper halves), random bytes otherwise (integers, ReLU bit masks)."""
    rng = np.random.default_rng(seed)
    if dtype == "bfloat16":
        half = rng.uniform(-1, 1, (nbytes + 1) // 2).astype(np.float32)
        return (half.view(np.uint32) >> 16).astype(np.uint16).tobytes()[:nbytes]
    dt = np.dtype(dtype)
    if dt.kind in "fc":
        count = -(-nbytes // dt.itemsize)
        parts = 2 if dt.kind == "c" else 1
        values = rng.uniform(-1, 1, count * parts).astype(np.dtype(f"f{dt.itemsize // parts}"))
        return values.tobytes()[:nbytes]
    return rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()


def _span_bytes(sig) -> int:
    """Bytes a strided operand of signature ``sig`` spans (C order where its strides are not given)."""
    itemsize = 2 if sig.dtype == "bfloat16" else np.dtype(sig.dtype).itemsize
    shape = tuple(int(d) for d in sig.shape)
    if any(d == 0 for d in shape):
        return itemsize
    strides = sig.strides
    if strides is None:
        return itemsize * math.prod(shape)
    return itemsize * (1 + sum((d - 1) * abs(int(st)) for d, st in zip(shape, strides)))


def _fill(rt, ptr: int, nbytes: int, dtype: str, stream: int, seed: int) -> None:
    """Fill ``nbytes`` at ``ptr`` with :func:`pattern`: one host copy, then doubling copies on the device."""
    first = min(nbytes, _PATTERN_BYTES)
    host = ctypes.create_string_buffer(pattern(dtype, first, seed), first)
    runtime.check(rt.cudaMemcpyAsync(ptr, ctypes.addressof(host), first,
                                     rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync")
    runtime.check(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")  # (the host buffer is local)
    done = first
    while done < nbytes:
        step = min(done, nbytes - done)
        runtime.check(rt.cudaMemcpyAsync(ptr + done, ptr, step, rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice, stream),
                      "cudaMemcpyAsync")
        done += step


def _view(ptr: int, sig) -> DeviceView:
    shape = tuple(int(d) for d in sig.shape)
    strides = c_strides(shape) if sig.strides is None else tuple(int(st) for st in sig.strides)
    return DeviceView(ptr, sig.dtype, shape, strides)


def autotune_on_scratch(plan, alpha=1, beta=None, *, iterations: int = 3, max_candidates: int | None = None,
                        budget: float | None = None) -> list[tuple[str, float]]:
    """Time ``plan``'s candidates (see :func:`.lt_autotune.autotune`) on scratch buffers of its problem's
    operands and outputs, launched as ``plan.execute_into(..., alpha, beta)``; the plan keeps the fastest.
    Returns ``[(label, seconds)]``. Raises what allocating or launching raises (the plan then keeps the
    algorithm it had)."""
    rt = runtime.cudart()
    p = plan.problem
    device = int(plan.device_index)
    previous = runtime.current_device()
    runtime.check(rt.cudaSetDevice(device), "cudaSetDevice")
    stream = int(runtime.check(rt.cudaStreamCreateWithFlags(_NON_BLOCKING), "cudaStreamCreateWithFlags"))
    buffers: list[int] = []
    try:
        sigs = [("a", p.a), ("b", p.b), *([("c", p.c)] if p.c is not None else []), *p.inputs]
        pointers, outputs = {}, {}
        for seed, (name, sig) in enumerate(sigs):
            nbytes = _span_bytes(sig)
            ptr = runtime.malloc_async(nbytes, stream)
            buffers.append(ptr)
            _fill(rt, ptr, nbytes, sig.dtype, stream, seed)
            pointers[name] = ptr
        for name, (shape, dtype) in output_layouts(p, plan.setup).items():
            itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
            outputs[name] = ptr = runtime.malloc_async(itemsize * max(math.prod(shape), 1), stream)
            buffers.append(ptr)

        def launch(result) -> None:  # the trial algorithm without telling listeners: only the winner is announced
            plan.launch.algo = result
            plan.execute_into(pointers, outputs, stream, alpha, beta)

        limit = p.plan_preferences.limit
        out_shape, out_dtype = output_layouts(p, plan.setup)["out"]
        views = {name: _view(pointers[name], sig) for name, sig in sigs}
        check = result_check(p, lambda: DeviceView(outputs["out"], out_dtype, out_shape, c_strides(out_shape)),
                             out_shape, views, stream, alpha, beta)
        timed = lt_autotune.autotune(plan, launch, stream, iterations, limit, max_candidates=max_candidates,
                                     budget=budget, busy_wait="torch" in sys.modules, check=check)
        runtime.check(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        return timed
    finally:
        workspace = plan.launch.workspaces.pop(stream, None)
        if workspace is not None:
            workspace.release()
        for ptr in buffers:
            runtime.free_async(ptr, stream)
        runtime.check(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        runtime.check(rt.cudaStreamDestroy(stream), "cudaStreamDestroy")
        runtime.check(rt.cudaSetDevice(previous), "cudaSetDevice")
