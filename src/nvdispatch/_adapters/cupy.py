"""CuPy arrays on CUDA devices (CuPy's current stream and memory pool)."""

from __future__ import annotations

import contextlib
import operator
import os
import sys
from typing import Any

from .._adapter_registry import adapter_for
from .._cuda.arrays import DeviceView, storage_shape
from .._cuda.streams import stream_pointer
from .._memory import CUDA, CUPY_ARRAY
from .._precision import PrecisionConvention
from ..errors import UnsupportedDtypeError
from .base import Adapter, Device, OperandInfo

__all__ = ["CupyAdapter", "cupy_major", "float32_compute_type_reader"]

#: CuPy's compute types (``cupy._core._routines_linalg.COMPUTE_TYPE_*``) that change a float32 or complex64
#: product, and the cuBLAS compute type CuPy then runs it with (any other: COMPUTE_32F)
_CUPY_PEDANTIC, _CUPY_TF32 = 2, 7
_FLOAT32_COMPUTE = {_CUPY_PEDANTIC: "COMPUTE_32F_PEDANTIC", _CUPY_TF32: "COMPUTE_32F_FAST_TF32"}


def float32_compute_type_reader():
    """A function giving CuPy's compute type for float32 (and complex64) products, read as CuPy's matmul reads it:
    ``cupy._core._routines_linalg.get_compute_type``, which takes ``CUPY_TF32`` from the environment at the first
    product of the dtype and keeps it (``set_compute_type`` changes it). Where that function is missing, the
    environment itself, on every call."""
    import numpy as np

    try:
        from cupy._core import _routines_linalg as linalg

        get = linalg.get_compute_type
    except (ImportError, AttributeError):
        return lambda: _CUPY_TF32 if _tf32_env() else 1
    float32 = np.dtype("float32")
    return lambda: get(float32)


def _tf32_env() -> bool:
    try:
        return int(os.getenv("CUPY_TF32", "0")) > 0
    except ValueError:
        return False


_MEMORY = frozenset({CUPY_ARRAY, CUDA})


def cupy_major() -> int:
    """The major version of the CuPy imported (0 where it cannot be read)."""
    version = getattr(sys.modules.get("cupy"), "__version__", "")
    digits = str(version).partition(".")[0]
    return int(digits) if digits.isdigit() else 0


class CupyAdapter(Adapter):
    name = "cupy"
    default_executors = {"cuda": ("cuda", "cupy")}

    def claims(self, cls: type) -> bool:
        cupy = sys.modules.get("cupy")
        return cupy is not None and issubclass(cls, cupy.ndarray)

    def info(self, name: str, x: Any) -> OperandInfo:
        itemsize = x.itemsize or 1
        strides = tuple(s // itemsize for s in x.strides)
        device = Device("cuda", int(x.device.id))
        return OperandInfo(x, self.name, device, x.dtype.name, tuple(x.shape), strides, memory=_MEMORY)

    #: (dtype, shape, strides, device ordinal), read in C
    signature = operator.attrgetter("dtype", "shape", "strides", "device.id")

    def device(self, x) -> Device:
        return Device("cuda", int(x.device.id))

    # -- precision conventions ---------------------------------------------------------------------------
    @property
    def precision_key(self):
        """CuPy's compute type for float32 products."""
        key = self.__dict__.get("_precision_key")
        if key is None:
            key = self.__dict__["_precision_key"] = float32_compute_type_reader()
        return key

    def precision_convention(self, device: Device) -> PrecisionConvention:
        """Float32 and complex64 products as CuPy computes them: TF32 where its compute type says so (``CUPY_TF32=1``
        in the environment when CuPy first multiplied float32 arrays, or ``set_compute_type``), pedantic float32
        where it asks for that, else float32."""
        compute_type = self.precision_key()
        float32 = _FLOAT32_COMPUTE.get(compute_type)
        env = os.environ.get("CUPY_TF32")
        shown = "unset" if env is None else repr(env)
        return PrecisionConvention(float32, f"CuPy compute type {_cupy_name(compute_type)} (CUPY_TF32 {shown})")

    def cast(self, x, dtype: str):
        return x.astype(dtype)

    def fft_promotion(self, kind: str, dtype: str, one_axis: bool = False) -> tuple[str, str] | None:
        """``cupy.fft``'s rule for float16 (``_output_dtype`` there): computed in float32, the result complex64.
        A real (C2R) result is float32, except that CuPy 14 and later cast a real result of one named axis
        (``irfft``, ``hfft``; ``irfftn``/``irfft2`` given ``axes`` of one entry; ``_compat_caster`` there) back to
        ``result_type(float16, 1.0)``, float16. Booleans and integers: float64, CuPy's default floating dtype, as
        the shared rule gives them."""
        if dtype != "float16":
            return None
        if kind != "c2r":
            return "float32", "complex64"
        return "float32", ("float16" if one_axis and cupy_major() >= 14 else "float32")

    def data_ptr(self, x) -> int:
        return x.data.ptr

    def data_ptr_reader(self):
        return operator.attrgetter("data.ptr")  # a C call, no Python frame (see _hotpath_cufft.c)

    # -- streams -----------------------------------------------------------------------------------------
    def current_stream(self, device_index: int | None) -> int:
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)

    def current_stream_getter(self, device_index: int):
        import cupy

        get = cupy.cuda.get_current_stream  # the current device's: what current_stream reads
        return lambda: get().ptr

    def stream_handle(self, stream: Any) -> int | None:
        ptr = getattr(stream, "ptr", None)  # cupy.cuda.Stream / ExternalStream (and look-alikes)
        return ptr if isinstance(ptr, int) and not isinstance(ptr, bool) else None

    def stream_context(self, stream: int, device_index: int | None):
        import cupy

        if stream == self.current_stream(device_index):
            return contextlib.nullcontext()
        return cupy.cuda.ExternalStream(stream)

    def native_stream_context(self, stream: Any, device_index: int | None):
        if stream is None:
            return contextlib.nullcontext()
        import cupy

        if isinstance(stream, cupy.cuda.Stream):
            return stream

        return cupy.cuda.ExternalStream(stream_pointer(stream, "cupy"))

    # -- memory ------------------------------------------------------------------------------------------
    def empty(self, shape, dtype: str, device_index: int, stream: int, order: str = "C"):
        import cupy

        shape = tuple(int(s) for s in shape)
        tshape = storage_shape(shape, order)
        arr = cupy.empty(tshape, dtype=dtype)
        if tshape is not shape:
            arr = cupy.swapaxes(arr, -1, -2)
        return arr, arr.data.ptr

    def scratch(self, nbytes: int, device_index: int, stream: int):
        import cupy

        if cupy.cuda.get_current_stream().ptr == stream:
            mem = cupy.cuda.alloc(nbytes)
        else:
            with cupy.cuda.ExternalStream(stream):
                mem = cupy.cuda.alloc(nbytes)
        return mem.ptr, mem

    # -- devices named by the caller ---------------------------------------------------------------------
    device_string_rank = 2

    def native_device(self, device):
        cupy = sys.modules.get("cupy")
        if cupy is not None and isinstance(device, cupy.cuda.Device):
            return device
        if isinstance(device, str) and device.startswith("cuda") and self.device_ops_available():
            import cupy

            return cupy.cuda.Device(int(device.split(":")[1]) if ":" in device else 0)
        return None

    def from_host_values(self, values, dtype, device):
        import cupy
        import numpy as np

        dt = np.dtype("float64" if dtype is None else dtype)
        if dt.kind != "f":
            raise UnsupportedDtypeError("dtype", "a real floating dtype", str(dtype))
        with device:
            return cupy.asarray(values.astype(dt))

    # -- array operations ------------------------------------------------------------------------------------
    can_roll = can_copy_into = True

    def roll(self, x, shifts, axes):
        import cupy

        return cupy.roll(x, shifts, axes) if axes else x.copy()

    # -- results ---------------------------------------------------------------------------------------------
    result_kinds = ("cupy",)

    def result_kind(self, x) -> str:
        return "cupy"

    def result_maker(self, shape, dtype: str):
        import cupy

        return cupy.empty, (tuple(int(d) for d in shape),), {"dtype": dtype}  # the current device's pool

    def device_view(self, x):
        isz = x.itemsize or 1
        return DeviceView(x.data.ptr, x.dtype.name, x.shape, tuple(s // isz for s in x.strides), x)

    def result_view(self, kind, base, shape, strides_elems, offset_elems=0):
        import cupy

        isz = base.itemsize
        mem = base.data + offset_elems * isz
        return cupy.ndarray(shape, base.dtype, mem, tuple(s * isz for s in strides_elems))

    # -- device helpers ------------------------------------------------------------------------------------
    def device_ops_available(self) -> bool:
        import importlib.util

        try:
            return importlib.util.find_spec("cupy") is not None
        except (ImportError, ValueError):
            return False

    def device_ops(self):
        return CupyDeviceOps()

    def view_device_array(self, x):
        import cupy

        if hasattr(x, "__cuda_array_interface__"):
            return cupy.asarray(x)
        return cupy.from_dlpack(x)

    # -- conversion --------------------------------------------------------------------------------------
    def coerce(self, x):
        import cupy

        if isinstance(x, cupy.ndarray):
            return x
        if hasattr(x, "__cuda_array_interface__"):
            return cupy.asarray(x)

        ad = adapter_for(x)
        if ad is None:
            return cupy.asarray(x)
        if ad.device(x).kind == "cuda":  # zero-copy through DLPack
            return cupy.from_dlpack(ad.export(x))
        return cupy.asarray(ad.to_numpy(x))

    def to_numpy(self, x):
        return x.get()


def _cupy_name(compute_type) -> str:
    try:
        from cupy._core import _routines_linalg as linalg

        return str(linalg.compute_type_to_str(compute_type))
    except (ImportError, AttributeError):
        return str(compute_type)


#: dtypes CuPy has no type for, and the unsigned ints of their size that hold their bits
_STORAGE = {"float8_e4m3fn": "uint8", "float8_e5m2": "uint8", "bfloat16": "uint16"}


class CupyDeviceOps:
    """The few array operations the GPU plans need, on CuPy arrays (see ``nvdispatch._cuda.xp``)."""

    name = "cupy"

    def __init__(self):
        import cupy

        self.mod = cupy

    # -- layout and dtype ------------------------------------------------------------------------------
    def astype(self, x, dtype: str):
        return x.astype(dtype)

    def contiguous(self, x, shape=None):
        """A C-contiguous copy of ``x`` broadcast to ``shape`` (always a new array when shape is given)."""
        y = self.mod.broadcast_to(x, shape) if shape is not None else x
        return self.mod.ascontiguousarray(y) if shape is None else y.copy(order="C")

    def copy_into(self, dst, src) -> None:
        dst[...] = src

    def conj_(self, x) -> None:
        """Conjugate complex ``x`` in place."""
        self.mod.conjugate(x, out=x)

    def swap_last(self, x):
        return self.mod.swapaxes(x, -1, -2)

    def conj(self, x):
        """A new array of ``x``'s complex conjugates (its memory holds them)."""
        return self.mod.conj(x)

    def memory(self, x):
        """``x``'s memory as it lies: ``x`` (CuPy has no lazy views of other values)."""
        return x

    def empty(self, shape, dtype: str, device_index: int | None = None):
        """A new array on the current device; dtypes CuPy lacks (FP8, bfloat16) as unsigned ints holding the
        bits."""
        return self.mod.empty(tuple(shape), dtype=_STORAGE.get(dtype, dtype))

    def zeros(self, shape, dtype: str, device_index: int | None = None):
        """A new array of zero bits (+0 in every floating format), stored as :meth:`empty` stores it."""
        return self.mod.zeros(tuple(shape), dtype=_STORAGE.get(dtype, dtype))

    def full(self, shape, value, dtype: str, device_index: int | None = None):
        return self.mod.full(tuple(shape), value, dtype=dtype)

    def synchronize(self, device_index: int | None = None) -> None:
        """Wait for the work queued on the current stream."""
        self.mod.cuda.get_current_stream().synchronize()

    def data_ptr(self, x) -> int:
        return x.data.ptr

    # -- relu bit masks (cuBLASLt's RELU_AUX format) ---------------------------------------------------
    def pack_mask(self, mask, ld_bits: int):
        """Pack a boolean mask (..., cols, rows) into cuBLASLt's bit mask (see ``TorchDeviceOps.pack_mask``)."""
        rows = mask.shape[-1]
        pad = ld_bits - rows
        mod = self.mod
        m = mask.astype(mod.uint8)
        if pad:
            m = mod.concatenate([m, mod.zeros((*m.shape[:-1], pad), mod.uint8)], axis=-1)
        m = m.reshape(*m.shape[:-1], ld_bits // 8, 8)
        shifts = mod.arange(8, dtype=mod.uint8)
        return mod.ascontiguousarray((m << shifts).sum(-1, dtype=mod.uint8))

    def unpack_mask(self, bits, rows: int):
        """The inverse of :meth:`pack_mask`: a boolean (..., cols, rows) mask."""
        cp = self.mod
        shifts = cp.arange(8, dtype=cp.uint8)
        m = (bits[..., None] >> shifts) & 1
        return m.reshape(*bits.shape[:-1], bits.shape[-1] * 8)[..., :rows].astype(cp.bool_)

    # -- epilog steps in place (the vocabulary of nvdispatch._epilog.apply_steps) --------------------
    def epilog_ops(self):
        from .._epilog_cupy import CUPY_INPLACE

        return CUPY_INPLACE
