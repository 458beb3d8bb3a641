"""ctypes bindings of the few cuFFT calls nvdispatch needs (cuda-bindings has no cuFFT module).

The library is located with cuda-pathfinder (``load_library("cufft")``). Plans use the advanced data
layout (``cufftMakePlanMany64``) so strided, batched and multi-axis transforms run without copies, and
cuFFT's own workspace allocation (held by the plan, on the plan's device).
"""

from __future__ import annotations

import ctypes
import functools

from ..errors import CufftError, PlanStateError
from .libs import library_unavailable, load_library

__all__ = ["unavailable", "version", "library", "address", "check", "CufftPlan", "TYPES", "FORWARD", "INVERSE"]

FORWARD, INVERSE = -1, 1
#: (kind, single precision?) -> cufftType
TYPES = {
    ("c2c", True): 0x29,
    ("r2c", True): 0x2A,
    ("c2r", True): 0x2C,
    ("c2c", False): 0x69,
    ("r2c", False): 0x6A,
    ("c2r", False): 0x6C,
}
_EXEC = {0x29: "cufftExecC2C", 0x69: "cufftExecZ2Z", 0x2A: "cufftExecR2C", 0x6A: "cufftExecD2Z"}
_EXEC.update({0x2C: "cufftExecC2R", 0x6C: "cufftExecZ2D"})
def unavailable() -> str | None:
    return library_unavailable("cufft")


@functools.lru_cache(maxsize=1)
def version() -> int:
    """``cufftGetVersion`` (0 where the library does not say)."""
    value = ctypes.c_int(0)
    try:
        library().cufftGetVersion(ctypes.byref(value))
    except AttributeError:
        return 0
    return int(value.value)


@functools.lru_cache(maxsize=1)
def library():
    """The loaded cuFFT library, its functions' argument types declared (loaded once)."""
    lib = load_library("cufft")
    vp, i64p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_longlong)
    lib.cufftCreate.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.cufftDestroy.argtypes = [ctypes.c_int]
    lib.cufftSetStream.argtypes = [ctypes.c_int, vp]
    lib.cufftMakePlanMany64.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        i64p,
        i64p,
        ctypes.c_longlong,
        ctypes.c_longlong,
        i64p,
        ctypes.c_longlong,
        ctypes.c_longlong,
        ctypes.c_int,
        ctypes.c_longlong,
        ctypes.POINTER(ctypes.c_size_t),
    ]
    for name in ("cufftExecC2C", "cufftExecZ2Z"):
        getattr(lib, name).argtypes = [ctypes.c_int, vp, vp, ctypes.c_int]
    for name in ("cufftExecR2C", "cufftExecD2Z", "cufftExecC2R", "cufftExecZ2D"):
        getattr(lib, name).argtypes = [ctypes.c_int, vp, vp]
    return lib


def address(name: str) -> int:
    """The address of cuFFT's function ``name`` (what the compiled launch calls)."""
    return ctypes.cast(getattr(library(), name), ctypes.c_void_p).value


def check(status: int, what: str) -> None:
    """:class:`CufftError` naming ``what`` unless ``status`` is ``CUFFT_SUCCESS``."""
    if status != 0:
        raise CufftError(what, status)


class CufftPlan:
    """A cuFFT plan for one advanced layout. ``execute(in_ptr, out_ptr, stream)`` queues it on ``stream``.

    ``handle`` is cuFFT's (None once destroyed), ``exec_name`` the ``cufftExec*`` function its type takes, and
    ``stream`` the stream the handle is set to (None before the first launch): every launch, the compiled one
    included (``_hotpath_cufft.c``), sets the handle's stream through it."""

    def __init__(self, kind, single, n, inembed, istride, idist, onembed, ostride, odist, batch, configure=None):
        """``configure(lib, handle)``, when given, runs between ``cufftCreate`` and the plan's making (where
        cuFFT takes JIT callbacks)."""
        lib = library()
        self._lib = lib
        self.type = TYPES[(kind, single)]
        self.kind = kind
        h = ctypes.c_int(0)
        check(lib.cufftCreate(ctypes.byref(h)), "cufftCreate")
        self.handle = h.value
        arr = ctypes.c_longlong * len(n)
        work = ctypes.c_size_t(0)
        try:
            if configure is not None:
                configure(lib, self.handle)
            check(
                lib.cufftMakePlanMany64(
                    self.handle,
                    len(n),
                    arr(*n),
                    arr(*inembed),
                    istride,
                    idist,
                    arr(*onembed),
                    ostride,
                    odist,
                    self.type,
                    batch,
                    ctypes.byref(work),
                ),
                "cufftMakePlanMany64",
            )
        except Exception:
            lib.cufftDestroy(self.handle)
            self.handle = None
            raise
        self.workspace_bytes = work.value
        self.exec_name = _EXEC[self.type]
        self._exec = getattr(lib, self.exec_name)
        self.stream = None

    def execute(self, in_ptr: int, out_ptr: int, stream: int, direction: int = FORWARD) -> None:
        if self.handle is None:
            raise PlanStateError("plan", "a live cuFFT plan", "one already destroyed (used after release)")
        if stream != self.stream:
            check(self._lib.cufftSetStream(self.handle, stream), "cufftSetStream")
            self.stream = stream
        if self.kind == "c2c":
            check(self._exec(self.handle, in_ptr, out_ptr, direction), "cufftExec")
        else:
            check(self._exec(self.handle, in_ptr, out_ptr), "cufftExec")

    def destroy(self) -> None:
        if self.handle is not None:
            try:
                self._lib.cufftDestroy(self.handle)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass
            self.handle = None

    def __del__(self):
        self.destroy()
