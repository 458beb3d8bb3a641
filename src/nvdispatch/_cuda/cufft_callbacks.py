"""cuFFT LTO (JIT) callbacks made from the user's Python prolog/epilog with numba-cuda.

cuFFT (11.3+, CUDA 12.6U2+) links a load and a store callback given as LTO-IR into the kernels it makes
for a plan (``cufftXtSetJITCallback``, called between ``cufftCreate`` and the plan's making). The callback
has cuFFT's C signature::

    T    load (void *data_in,  unsigned long long offset, void *caller_info, void *shared)
    void store(void *data_out, unsigned long long offset, T element, void *caller_info, void *shared)

so a small wrapper is generated around the user's ``f(value, index, *data)``: it rebuilds the data arrays
from a table of device pointers (``caller_info``, one ``uint64`` per array, refreshed before a launch
when the arrays change) with ``carray`` and their planned shapes, calls ``f`` (inlined), and converts the
result to ``T``. ``offset`` is the element's offset from the start of the input (output) buffer, which is
the logical flat index because this path takes C-contiguous operands only. The store wrapper multiplies
by the norm's factor before the epilog. numba-cuda compiles the wrapper to LTO-IR under the default
symbol name cuFFT looks up (as nvmath-python does).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

__all__ = ["unavailable", "configure_callbacks", "compile_callback", "CallerInfo"]

_SNIPPET = {"float32": "Real", "float64": "DoubleReal", "complex64": "Complex", "complex128": "DoubleComplex"}
_MANGLED = {"float32": "f", "float64": "d", "complex64": "6float2", "complex128": "7double2"}
#: cufftXtCallbackType
LOAD = {"complex64": 0, "complex128": 1, "float32": 2, "float64": 3}
STORE = {"complex64": 4, "complex128": 5, "float32": 6, "float64": 7}


@functools.lru_cache(maxsize=1)
def _entry():
    """(cufftXtSetJITCallback or its cuFFT 11.3-11.4 name, cuFFT version) or (None, why)."""
    from . import cufft

    why = cufft.unavailable()
    if why:
        return None, why
    lib = cufft.library()
    version = ctypes.c_int(0)
    try:
        lib.cufftGetVersion(ctypes.byref(version))
    except AttributeError:
        pass
    for name in ("cufftXtSetJITCallback", "__cufftXtSetJITCallback_12_7"):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes = [
                ctypes.c_int,
                ctypes.c_char_p,
                ctypes.c_void_p,
                ctypes.c_size_t,
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_void_p),
            ]
            fn.restype = ctypes.c_int
            return (fn, version.value), None
    return None, f"the installed cuFFT ({version.value}) has no LTO callbacks (cufftXtSetJITCallback, cuFFT >= 11.3)"


def unavailable() -> str | None:
    """Why cuFFT LTO callbacks cannot be used here (no cuFFT, a cuFFT without them, no numba-cuda), or None."""
    entry, why = _entry()
    if entry is None:
        return why
    try:
        import numba.cuda  # noqa: F401
    except ImportError:
        return "numba-cuda is not installed (it compiles the callbacks to LTO-IR)"
    from ..device.simulator_compat import simulator_active

    if simulator_active():
        return "Numba's CUDA simulator is active (no LTO-IR)"
    return None


def _symbol(phase: str, dtype: str, version: int) -> str:
    snippet = _SNIPPET[dtype]
    insert = "" if phase == "Load" else _MANGLED[dtype]
    offset = "m" if version < 11300 else "y"  # size_t before cuFFT 11.3, unsigned long long since
    return f"_Z{16 + len(phase) + len(snippet)}cufftJITCallback{phase}{snippet}Pv{offset}{insert}S_S_"


def _pointer_cast(numba_dtype):
    """A device intrinsic turning a uint64 address into a typed pointer (for ``carray``)."""
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    ptr_t = types.CPointer(numba_dtype)

    @intrinsic
    def cast(typingctx, address):
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(ptr_t))

        return ptr_t(types.uint64), codegen

    return cast


def compile_callback(function, phase: str, element_dtype: str, data_layouts, scale: float = 1.0) -> bytes:
    """LTO-IR of the cuFFT ``phase`` ("Load"/"Store") callback calling ``function(value, index, *data)``.

    ``data_layouts`` are the data arrays' ``DataLayout`` (C-contiguous; dtype and shape are baked in).
    """
    import numpy as np
    from numba import cuda
    from numba.cuda import types
    from numba.cuda.np.numpy_support import carray, from_dtype

    from ..device.fft_callback_kernel import device_function

    elem = from_dtype(np.dtype(element_dtype))
    namespace: dict[str, Any] = {
        "carray": carray,
        "USER": device_function(function),
        "CAST": np.dtype(element_dtype).type,
        "INDEX": np.int64,
        "SCALE": np.finfo(np.dtype(element_dtype)).dtype.type(scale),
    }
    lines = []
    for k, layout in enumerate(data_layouts):
        namespace[f"PTR{k}"] = _pointer_cast(from_dtype(np.dtype(layout.dtype)))
        namespace[f"SHAPE{k}"] = tuple(int(e) for e in layout.shape)
        lines.append(f"    d{k} = carray(PTR{k}(info[{k}]), SHAPE{k})")
    data = "".join(f", d{k}" for k in range(len(data_layouts)))
    if phase == "Load":
        header = "def callback(data, offset, info, shared):"
        lines.append(f"    return CAST(USER(data[offset], INDEX(offset){data}))")
        sig = elem(types.CPointer(elem), types.uint64, types.CPointer(types.uint64), types.CPointer(elem))
    else:
        header = "def callback(data, offset, element, info, shared):"
        value = "element * SCALE" if scale != 1.0 else "element"
        lines.append(f"    data[offset] = CAST(USER({value}, INDEX(offset){data}))")
        sig = types.void(types.CPointer(elem), types.uint64, elem, types.CPointer(types.uint64), types.CPointer(elem))
    exec(compile("\n".join([header, *lines]) + "\n", f"<nvdispatch cuFFT {phase} callback>", "exec"), namespace)  # noqa: S102
    (_, version), _ = _entry()
    cc = cuda.get_current_device().compute_capability
    ltoir, _ = cuda.compile(
        namespace["callback"],
        sig,
        device=True,
        abi="c",
        abi_info={"abi_name": _symbol(phase, element_dtype, version)},
        output="ltoir",
        cc=cc,
        opt=True,
    )
    return bytes(ltoir)


class CallerInfo:
    """The device table of data-array pointers a callback reads (``caller_info``); refreshed in stream
    order when the arrays change between launches."""

    def __init__(self, count: int):
        from . import runtime

        self.count = count
        self.ptr = 0
        self._host = (ctypes.c_uint64 * max(count, 1))()
        self._last: tuple[int, ...] | None = None
        if count:
            self.ptr = runtime.check(runtime.cudart().cudaMalloc(8 * count), "cudaMalloc")
            self.ptr = int(self.ptr)

    def bind(self, pointers: tuple[int, ...], stream: int) -> None:
        if not self.count or pointers == self._last:
            return
        from . import runtime

        for k, p in enumerate(pointers):
            self._host[k] = p
        rt = runtime.cudart()
        runtime.check(
            rt.cudaMemcpyAsync(
                self.ptr, ctypes.addressof(self._host), 8 * self.count, rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream
            ),
            "cudaMemcpyAsync",
        )
        # pageable source: the copy is staged before cudaMemcpyAsync returns, the host table may change after
        self._last = pointers

    def free(self) -> None:
        if self.ptr:
            from . import runtime

            try:
                rt = runtime.cudart()
                rt.cudaDeviceSynchronize()
                rt.cudaFree(self.ptr)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass
            self.ptr = 0


def configure_callbacks(load: tuple[bytes, str, int] | None, store: tuple[bytes, str, int] | None):
    """A ``configure(lib, handle)`` for :class:`~nvdispatch._cuda.cufft.CufftPlan` that sets the callbacks;
    each is ``(ltoir, element dtype, caller_info device pointer)``."""
    (set_jit, _), why = _entry()

    def configure(lib, handle):
        for table, cb in ((LOAD, load), (STORE, store)):
            if cb is None:
                continue
            ltoir, dtype, info = cb
            buf = ctypes.create_string_buffer(ltoir, len(ltoir))
            infos = (ctypes.c_void_p * 1)(info or None)
            status = set_jit(handle, None, ctypes.cast(buf, ctypes.c_void_p), len(ltoir), table[dtype], infos)
            if status != 0:
                from . import cufft

                cufft.check(status, "cufftXtSetJITCallback")

    return configure
