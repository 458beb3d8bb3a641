"""Torch tensors, on the CPU and on CUDA devices (streams, caching allocator, autograd state)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import operator
import sys
from typing import Any

from .._compiled import hotpath
from .._cuda.arrays import DeviceView, storage_shape
from .._memory import CUDA, TORCH_TENSOR
from .._precision import PrecisionConvention
from .._strides import overlapping
from ..errors import InvalidArgumentError, UnsupportedDtypeError, UnsupportedOperandError, describe
from .base import CPU, Adapter, Device, OperandInfo
from .torch_autocast import autocast_dtype, ffts_follow_region
from .torch_precision import at_least, cpu_bf16, fp32_precision, settled_level, wanted_level

__all__ = ["TorchAdapter", "resolved", "tf32_allowed"]


#: torch.fft's half precision: the operand's dtype -> the dtype the transform computes in
_HALF_FFT_COMPUTE = {"float16": "float32", "complex32": "complex64"}
_ON_CPU = frozenset({TORCH_TENSOR})
#: Torch's CPU precision setting governs float32 products only (its complex64 ones stay in float32)
_FLOAT32_ONLY = frozenset({"float32"})
_ON_CUDA = frozenset({TORCH_TENSOR, CUDA})


def _grad_enabled() -> bool:
    return sys.modules["torch"].is_grad_enabled()


def _functorch_wrapped(x) -> bool:
    global _functorch_wrapped
    _functorch_wrapped = sys.modules["torch"]._C._functorch.is_functorch_wrapped_tensor  # bound once
    return _functorch_wrapped(x)


def tf32_allowed() -> bool:
    """Whether Torch runs float32 products on CUDA on TF32 tensor cores (``torch.backends.cuda.matmul.allow_tf32``,
    set by ``torch.set_float32_matmul_precision("high")`` or ``"medium"``, or ``fp32_precision = "tf32"``)."""
    C = sys.modules["torch"]._C
    try:
        return bool(C._get_cublas_allow_tf32())
    except RuntimeError:  # the legacy and the new switch were set apart; Torch's matmul follows the new one
        return fp32_precision("cuda") == "tf32"


class _Getters:
    """Torch's C getters of the settings a product's precision depends on, bound once (Torch is imported: its
    tensors exist), and the readings built of them."""

    def __init__(self):
        C = sys.modules["torch"]._C
        self.tf32_switch = C._get_cublas_allow_tf32
        self.cpu_getter = C._get_fp32_precision_getter  # the CPU's (oneDNN's) float32 matmul precision
        self.enabled, self.dtype = C.is_autocast_enabled, C.get_autocast_dtype
        enabled = self.enabled
        self.any_autocast = getattr(C, "_is_any_autocast_enabled", None) or (
            lambda: enabled("cuda") or enabled("cpu")
        )

    def tf32(self):
        try:
            return self.tf32_switch()
        except RuntimeError:
            return tf32_allowed()

    def cpu(self):
        return self.cpu_getter("mkldnn", "matmul")

    def with_regions(self, *settings):
        """``settings``, then the active autocast regions' dtypes where any region is active."""
        if not self.any_autocast():
            return settings
        enabled, dtype = self.enabled, self.dtype
        return (*settings, enabled("cuda") and dtype("cuda"), enabled("cpu") and dtype("cpu"))

    def compiled(self, steps, fallback):
        """``fallback`` as one compiled call of ``steps`` where the extension is built (``_hotpath.make_reading``:
        no Python frame per call), the Python reading where an autocast region is active or a getter refuses."""
        compiled = hotpath()
        return fallback if compiled is None else compiled.make_reading(self.any_autocast, steps, fallback)


def _make_precision_key():
    """The Torch adapter's ``precision_key``: the TF32 switch and the CPU's matmul precision (with the active
    autocast regions, where any is); compiled where the extension is built (:meth:`_Getters.compiled`)."""
    g = _Getters()

    def precision_key():
        return g.with_regions(g.tf32(), g.cpu())

    return g.compiled(((g.tf32_switch, ()), (g.cpu_getter, ("mkldnn", "matmul"))), precision_key)


def _make_precision_key_of():
    """The Torch adapter's ``precision_key_of``: for a CUDA tensor the TF32 switch, for any other the CPU's matmul
    precision (each with the active autocast regions, where any is): a product on one device depends on no setting
    of the other. Compiled where the extension is built (:meth:`_Getters.compiled`)."""
    g = _Getters()

    def on_cuda():
        return g.with_regions(g.tf32())

    def on_cpu():
        return g.with_regions(g.cpu())

    compiled = hotpath()
    if compiled is None:
        return lambda x: on_cuda() if x.is_cuda else on_cpu()
    cuda = g.compiled(((g.tf32_switch, ()),), on_cuda)
    cpu = g.compiled(((g.cpu_getter, ("mkldnn", "matmul")),), on_cpu)
    return compiled.make_reading_by("is_cuda", cuda, cpu)


class TorchAdapter(Adapter):
    name = "torch"
    default_executors = {"cpu": ("torch",), "cuda": ("cuda", "torch")}

    def claims(self, cls: type) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and issubclass(cls, torch.Tensor)

    def info(self, name: str, x: Any) -> OperandInfo:
        dev = x.device
        device = CPU if dev.type == "cpu" else Device(dev.type, dev.index if dev.index is not None else 0)
        dtype = str(x.dtype).removeprefix("torch.")
        autograd = bool(x.requires_grad) and _grad_enabled()
        if device is CPU:
            # the Torch executor alone takes CPU tensors as they are: its operations honour lazy views
            return OperandInfo(x, self.name, device, dtype, tuple(x.shape), tuple(x.stride()), autograd, memory=_ON_CPU)
        view = x
        if x.is_conj() or x.is_neg():
            # a lazy conjugate/negative view's memory holds the values it stands for conjugated/negated: an
            # executor reading it by pointer (cuBLASLt, cuFFT) takes them materialised (see `resolved`)
            view = resolved(x)
        return OperandInfo(view, self.name, device, dtype, tuple(view.shape), tuple(view.stride()), autograd,
                           memory=_ON_CUDA, materialized=view is not x)  # fmt: skip

    def info_conjugated(self, name: str, x) -> OperandInfo | None:
        """A complex CUDA tensor that is a lazy conjugate view (``z.conj()``, ``z.mH``; not a negative view too)
        described by its memory: ``x.conj()`` (the same memory, the bit cleared) with ``conjugated=True``, where
        :meth:`info` hands executors a copy of its values. None for every other tensor, and for one autograd
        records (its executors keep the graph on the view as it is)."""
        if x.is_cpu or not x.is_conj() or x.is_neg() or (x.requires_grad and _grad_enabled()):
            return None
        memory = x.conj()  # a view of the same memory without the conjugate bit
        if memory.is_conj() or memory.is_neg() or memory.data_ptr() != x.data_ptr():
            return None
        return dataclasses.replace(self.info(name, memory), conjugated=True)

    @staticmethod
    def signature(x):
        # get_device() (-1 on the CPU) and is_cuda: cheaper to read and hash than a torch.device; size() than shape.
        # is_meta: a meta tensor's get_device() is -1 too, and its calls must not find a CPU tensor's route
        # A torch.func wrapper (vmap's batched tensor, grad's/jvp's tracking tensor) has the sizes of one sample:
        # its key must not find a plain tensor's plan (the Torch integration takes those calls)
        if x.is_conj() or x.is_neg():
            if not x.is_cpu and (x.is_neg() or (x.requires_grad and _grad_enabled())):
                # executors take a copy made per call (see info): no key, the full route each time
                raise TypeError("no call key for a lazy negative (or recorded conjugate) view on a device")
            # on the CPU the plan is the same (Torch's operations honour the view); on a device a conjugate view is
            # described by its memory where the plan folds the conjugation in (info_conjugated), and such a plan
            # alone is kept under the key (one made on a copy of its values is not: the route's _plan_with)
            return (x.dtype, x.size(), x.stride(), x.get_device(), x.is_cuda, x.is_meta,
                    x.requires_grad and _grad_enabled(), _functorch_wrapped(x), x.is_conj(), x.is_neg())  # fmt: skip
        return (x.dtype, x.size(), x.stride(), x.get_device(), x.is_cuda, x.is_meta,
                x.requires_grad and _grad_enabled(), _functorch_wrapped(x))  # fmt: skip

    @staticmethod
    def guard(*tensors):
        # Torch's own tensor guard (the one torch.compile checks its graphs' inputs with): class, dispatch
        # keys (device type, conjugate/negative views, inference mode), dtype, device index, requires_grad,
        # sizes and strides of every tensor in one native call, a third of what reading the signatures
        # costs. Private API: where it is missing or refuses, so do we.
        try:
            from torch._C._dynamo.guards import TensorGuards

            sizes = [list(t.size()) for t in tensors]
            strides = [list(t.stride()) for t in tensors]
            check = TensorGuards(*tensors, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides).check
        except Exception:  # ImportError, or a signature this Torch no longer has
            return None
        if not any(t.requires_grad for t in tensors):
            return check
        # the signature of a tensor that requires grad also holds grad mode (whether autograd records the
        # call), which the tensor guard does not see: that is checked too
        grad_enabled = sys.modules["torch"].is_grad_enabled
        mode = grad_enabled()
        return lambda *arrays: grad_enabled() is mode and check(*arrays)

    # -- precision conventions ---------------------------------------------------------------------------
    @property
    def precision_key(self):
        """TF32 allowed, and the autocast regions active (device type, dtype) where any is."""
        key = self.__dict__.get("_precision_key")
        if key is None:
            key = self.__dict__["_precision_key"] = _make_precision_key()
        return key

    @property
    def precision_key_of(self):
        """:attr:`precision_key` for a call on tensor ``x``: TF32 allowed for a CUDA tensor, the CPU's matmul
        precision for any other, and the autocast regions active where any is."""
        key = self.__dict__.get("_precision_key_of")
        if key is None:
            key = self.__dict__["_precision_key_of"] = _make_precision_key_of()
        return key

    def precision_convention(self, device: Device) -> PrecisionConvention:
        """Float32 products as Torch's own matmul computes them on ``device`` now (see :mod:`.torch_precision`):
        on CUDA on TF32 tensor cores where Torch allows it (``allow_tf32``, ``fp32_precision = "tf32"``); on the
        CPU in bfloat16 where its oneDNN matmul precision is ``"bf16"`` (``set_float32_matmul_precision("medium")``)
        and the CPU has bfloat16 arithmetic. On every device: an active ``torch.autocast`` region's dtype, and
        whether Torch's FFTs follow it there (:func:`.torch_autocast.ffts_follow_region`: the CPU's do)."""
        kind = "cpu" if device.kind == "cpu" else device.kind
        autocast = autocast_dtype(kind)
        why = f"Torch autocast({kind!r}, {autocast})" if autocast is not None else ""
        region = {"autocast": autocast, "autocast_reason": why,
                  "fft_autocast": autocast is not None and ffts_follow_region(kind)}  # fmt: skip
        if kind == "cuda":
            tf32 = tf32_allowed()
            float32 = "COMPUTE_32F_FAST_TF32" if tf32 else None
            return PrecisionConvention(float32, f"Torch allow_tf32={tf32}", **region)
        if kind != "cpu":
            return PrecisionConvention(**region)
        setting = fp32_precision("mkldnn")
        reason = f"Torch CPU matmul fp32_precision={setting!r}"
        if setting != "bf16":
            if setting == "tf32":
                reason += " (float32 on the CPU)"
            return PrecisionConvention(None, reason, governs=_FLOAT32_ONLY, **region)
        if not cpu_bf16():
            reason += " (float32: this CPU has no bfloat16 arithmetic)"
            return PrecisionConvention(None, reason, governs=_FLOAT32_ONLY, **region)
        return PrecisionConvention("COMPUTE_32F_FAST_16BF", reason, governs=_FLOAT32_ONLY, **region)

    def autocast_region(self, x) -> str | None:
        """The dtype of the ``torch.autocast`` region active on tensor ``x``'s device type, or None."""
        return autocast_dtype(x.device.type)

    def as_planned(self, device: Device, float32_compute: str | None):
        """``run(fn, *args)`` outside any autocast region on ``device``, and, for a float32 product planned with
        ``float32_compute`` (None: not a float32 product), with Torch's float32 matmul precision there at least
        that compute type's (raised for the call where it was lowered since the plan was made)."""
        torch = sys.modules["torch"]
        any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (lambda: True)
        autocast, kind = torch.autocast, device.kind

        def outside(fn, *args):
            if not any_autocast():
                return fn(*args)
            with autocast(kind, enabled=False):
                return fn(*args)

        want = None if float32_compute is None else wanted_level(float32_compute)
        if want is None or want <= 1:  # not a float32 product, or one Torch never computes less precisely
            return outside

        def run(fn, *args):
            if settled_level(kind) >= want:  # the common case: nothing to raise
                return outside(fn, *args)
            with at_least(kind, float32_compute):
                return outside(fn, *args)

        return run

    def cast(self, x, dtype: str):
        return x.to(getattr(sys.modules["torch"], dtype))

    def promote_types(self, x: str, y: str, argument: str) -> str:
        """``torch.promote_types``: what Torch's arithmetic gives a mixed pair (int32 with float32 is float32,
        float16 with an integer float16; NumPy would widen both to float64)."""
        torch = sys.modules["torch"]
        try:
            return str(torch.promote_types(getattr(torch, x), getattr(torch, y))).rpartition(".")[2]
        except (AttributeError, TypeError, RuntimeError) as exc:
            raise UnsupportedDtypeError(argument, f"a dtype Torch promotes with {x}", y, str(exc)) from None

    def fft_promotion(self, kind: str, dtype: str, one_axis: bool = False) -> tuple[str, str] | None:
        """torch.fft's rule for half precision (on CUDA; Torch's CPU build refuses it, nvdispatch takes it there
        too): float16 and complex32 operands computed in float32/complex64, a real result in float16, a complex
        one in complex32. bfloat16, which torch.fft does not transform, is refused naming it."""
        compute = _HALF_FFT_COMPUTE.get(dtype)
        if compute is None:
            if dtype == "bfloat16":
                raise UnsupportedDtypeError(
                    "x",
                    "a dtype torch.fft transforms (float16, float32, float64, complex32, complex64, complex128)",
                    dtype,
                    "torch.fft does not transform bfloat16 (outside a torch.autocast region on the CPU, which computes "
                    "it in float32): cast to float32 (or float16) first",
                )
            return None
        if kind == "r2c" and dtype == "complex32":
            return None  # complex input to a real-input transform: the problem builder refuses it
        return compute, ("float16" if kind == "c2r" else "complex32")

    def device(self, x) -> Device:
        dev = x.device
        return CPU if dev.type == "cpu" else Device(dev.type, dev.index if dev.index is not None else 0)

    def data_ptr(self, x) -> int:
        return x.data_ptr()

    def data_ptr_reader(self):
        return operator.methodcaller("data_ptr")  # a C call, no Python frame (see _hotpath_cufft.c)

    # -- streams -----------------------------------------------------------------------------------------
    def current_stream(self, device_index: int | None) -> int:
        import torch

        idx = device_index if device_index is not None else torch.cuda.current_device()
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        return int(raw(idx)) if raw is not None else int(torch.cuda.current_stream(idx).cuda_stream)

    def current_stream_getter(self, device_index: int):
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return functools.partial(raw, device_index)  # a C call, no Python frame (see _hotpath_lt.c)
        return lambda: self.current_stream(device_index)

    def stream_handle(self, stream: Any) -> int | None:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(stream, torch.cuda.Stream):
            return int(stream.cuda_stream)
        return None

    def check_stream(self, stream: Any, x: Any) -> None:
        if x.device.type == "cpu" and isinstance(stream, sys.modules["torch"].cpu.Stream):
            return  # Torch's own CPU streams: its CPU operations run in order anyway
        super().check_stream(stream, x)

    def stream_context(self, stream: int, device_index: int | None):
        import torch

        if stream == self.current_stream(device_index):
            return contextlib.nullcontext()
        dev = torch.device("cuda", device_index if device_index is not None else torch.cuda.current_device())
        return torch.cuda.stream(torch.cuda.ExternalStream(stream, device=dev))

    def native_stream_context(self, stream: Any, device_index: int | None):
        """A context making ``stream`` current for Torch (a no-op for None)."""
        if stream is None:
            return contextlib.nullcontext()
        import torch

        if isinstance(stream, torch.cuda.Stream):
            return torch.cuda.stream(stream)
        ptr = None
        if isinstance(stream, int):
            ptr = stream
        elif hasattr(stream, "__cuda_stream__"):
            ptr = stream.__cuda_stream__()[1]
        elif hasattr(stream, "ptr"):  # CuPy
            ptr = stream.ptr
        if ptr is None:
            raise InvalidArgumentError(
                "stream",
                "a torch.cuda.Stream, a CuPy stream, an object with __cuda_stream__, or an int",
                describe(stream),
            )
        return torch.cuda.stream(torch.cuda.ExternalStream(ptr, device=torch.device("cuda", device_index or 0)))

    # -- memory ------------------------------------------------------------------------------------------
    def empty(self, shape, dtype: str, device_index: int, stream: int, order: str = "C"):
        import torch

        shape = tuple(int(s) for s in shape)
        tshape = storage_shape(shape, order)
        arr = torch.empty(tshape, dtype=getattr(torch, dtype), device=torch.device("cuda", device_index))
        if tshape is not shape:
            arr = arr.transpose(-1, -2)
        return arr, arr.data_ptr()

    def scratch(self, nbytes: int, device_index: int, stream: int):
        import torch

        dev = torch.device("cuda", device_index)
        cur = torch.cuda.current_stream(dev)
        if cur.cuda_stream == stream:
            t = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        else:
            with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=dev)):
                t = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        return t.data_ptr(), t

    # -- devices named by the caller ---------------------------------------------------------------------
    device_string_rank = 1  # "cuda[:N]" means Torch when it is installed, else CuPy

    def native_device(self, device):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(device, torch.device):
            return device
        if isinstance(device, str) and device.startswith("cuda") and _installed("torch"):
            return device
        return None

    def from_host_values(self, values, dtype, device):
        import torch

        dt = torch.float64 if dtype is None else dtype
        if not (isinstance(dt, torch.dtype) and dt.is_floating_point):
            raise UnsupportedDtypeError("dtype", "a real floating torch.dtype", str(dtype))
        return torch.as_tensor(values, dtype=dt, device=device)

    # -- array operations ------------------------------------------------------------------------------------
    can_roll = can_copy_into = True

    def roll(self, x, shifts, axes):
        import torch

        return torch.roll(x, shifts, axes) if axes else x.clone()

    def copy_into(self, dst, src) -> None:
        dst.copy_(src)

    def unwritable(self, x) -> str:
        if x.requires_grad and x.is_leaf and _grad_enabled():
            return "a leaf Torch tensor that requires grad (autograd forbids writing it in place outside no_grad)"
        if overlapping(x.shape, x.stride()):  # Torch refuses to write it (copy_, in-place ops): said up front
            lazy = "a lazy conjugate view" if x.is_conj() else "a lazy negative view" if x.is_neg() else "a tensor"
            return f"{lazy} whose elements overlap (strides {tuple(x.stride())}, an expanded/broadcast view?)"
        return ""

    # -- results ---------------------------------------------------------------------------------------------
    result_kinds = ("torch",)

    def result_kind(self, x) -> str:
        return "torch"

    def device_view(self, x):
        if x.is_conj() or x.is_neg():  # its memory does not hold its values: info() hands executors a copy
            raise UnsupportedOperandError(
                "operand",
                "a tensor whose memory holds its values",
                f"a lazy {'conjugate' if x.is_conj() else 'negative'} view",
                "resolve it first (tensor.resolve_conj().resolve_neg())",
            )
        return DeviceView(x.data_ptr(), str(x.dtype)[6:], tuple(x.shape), tuple(x.stride()), x)

    def result_view(self, kind, base, shape, strides_elems, offset_elems=0):
        return base.as_strided(shape, strides_elems, base.storage_offset() + offset_elems)

    def result_from_operand(self, shape, dtype: str, order: str = "C"):
        import torch

        shape = tuple(int(d) for d in shape)
        storage = storage_shape(shape, order)
        return "torch", (storage,), {"dtype": getattr(torch, dtype)}, storage is not shape

    # -- device helpers ------------------------------------------------------------------------------------
    def device_ops_available(self) -> bool:
        return _installed("torch")

    def device_ops_for_foreign_arrays(self) -> bool:
        if not _installed("torch"):
            return False
        import torch

        return torch.backends.cuda.is_built()  # a CPU-only build cannot view (or compute on) CUDA memory

    def device_ops(self):
        return TorchDeviceOps()

    def view_device_array(self, x):
        import torch

        if hasattr(x, "__cuda_array_interface__"):
            return torch.as_tensor(x, device="cuda")
        return torch.from_dlpack(x)

    # -- conversion --------------------------------------------------------------------------------------
    def coerce(self, x):
        import torch

        if isinstance(x, torch.Tensor):
            return x
        return torch.from_dlpack(x) if hasattr(x, "__dlpack__") else torch.as_tensor(x)

    def to_numpy(self, x):
        return resolved(x.detach().cpu()).numpy()

    def export(self, x):
        # DLPack carries no conjugate/negative bit: Torch refuses to export a conjugate view, and exports a
        # negative view's memory as it lies (the values unnegated)
        return resolved(x.detach())


def resolved(x):
    """``x`` with the values it stands for in its own memory: a lazy conjugate or negative view (``z.conj()``,
    ``torch._neg_view(z)``, ``z.conj().imag``) materialised in a new tensor (``resolve_conj``/``resolve_neg``,
    which autograd records); any other tensor itself. ``x`` is never modified.

    >>> import torch
    >>> z = torch.tensor([1 + 2j])
    >>> v = z.conj()
    >>> r = resolved(v)
    >>> (r.is_conj(), r.tolist(), z.tolist())
    (False, [(1-2j)], [(1+2j)])
    """
    return x.resolve_conj().resolve_neg()


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


class TorchDeviceOps:
    """The few array operations the GPU plans need, on Torch tensors (see ``nvdispatch._cuda.xp``)."""

    name = "torch"

    def __init__(self):
        import torch

        self.mod = torch
        self._devices: dict = {}  # device index -> torch.device (made once: a call's host time counts)

    def _device(self, device_index: int | None):
        dev = self._devices.get(device_index)
        if dev is None:
            dev = "cuda" if device_index is None else self.mod.device("cuda", device_index)
            self._devices[device_index] = dev
        return dev

    # -- layout and dtype ------------------------------------------------------------------------------
    def astype(self, x, dtype: str):
        return x.to(getattr(self.mod, dtype))

    def contiguous(self, x, shape=None):
        """A C-contiguous copy of ``x`` broadcast to ``shape`` (always a new array when shape is given)."""
        y = x.expand(shape) if shape is not None else x
        return y.contiguous() if shape is None else y.clone(memory_format=self.mod.contiguous_format)

    def copy_into(self, dst, src) -> None:
        dst.copy_(src)

    def conj_(self, x) -> None:
        """Conjugate complex ``x`` in place (its values, not Torch's lazy conjugate bit)."""
        x.conj_physical_()

    def swap_last(self, x):
        return x.transpose(-1, -2)

    def conj(self, x):
        """A new tensor of ``x``'s complex conjugates, in its memory (``conj_physical``: not a lazy view)."""
        return self.mod.conj_physical(x)

    def memory(self, x):
        """``x``'s memory as it lies: a lazy conjugate view's bit cleared (the same memory), else ``x``."""
        return x.conj() if x.is_conj() else x

    def empty(self, shape, dtype: str, device_index: int | None = None):
        """A new tensor on CUDA device ``device_index`` (None: the current one)."""
        return self.mod.empty(tuple(shape), dtype=getattr(self.mod, dtype), device=self._device(device_index))

    def zeros(self, shape, dtype: str, device_index: int | None = None):
        """A new tensor of zero bits (+0 in every floating format)."""
        dt, dev = getattr(self.mod, dtype), self._device(device_index)
        if dt.itemsize == 1:  # one-byte formats (FP8) are zeroed as bytes
            return self.mod.zeros(tuple(shape), dtype=self.mod.uint8, device=dev).view(dt)
        return self.mod.zeros(tuple(shape), dtype=dt, device=dev)

    def full(self, shape, value, dtype: str, device_index: int | None = None):
        return self.mod.full(tuple(shape), value, dtype=getattr(self.mod, dtype), device=self._device(device_index))

    def synchronize(self, device_index: int | None = None) -> None:
        """Wait for the work queued on the current stream of ``device_index``."""
        self.mod.cuda.current_stream(device_index).synchronize()

    def data_ptr(self, x) -> int:
        return x.data_ptr()

    # -- relu bit masks (cuBLASLt's RELU_AUX format) ---------------------------------------------------
    def pack_mask(self, mask, ld_bits: int):
        """Pack a boolean mask (..., cols, rows) — ``rows`` being cuBLASLt's row axis, contiguous in the
        mask's bit order — into cuBLASLt's bit mask: uint8 (..., cols, ld_bits // 8), bit ``r % 8`` of byte
        ``r // 8`` set where ``mask[..., c, r]``."""
        rows = mask.shape[-1]
        pad = ld_bits - rows
        mod = self.mod
        m = mask.to(mod.uint8)
        if pad:
            m = mod.nn.functional.pad(m, (0, pad))
        m = m.reshape(*m.shape[:-1], ld_bits // 8, 8)
        shifts = mod.arange(8, device=m.device, dtype=mod.uint8)
        return (m << shifts).sum(-1, dtype=mod.uint8).contiguous()

    def unpack_mask(self, bits, rows: int):
        """The inverse of :meth:`pack_mask`: a boolean (..., cols, rows) mask."""
        torch = self.mod
        shifts = torch.arange(8, device=bits.device, dtype=torch.uint8)
        m = (bits.unsqueeze(-1) >> shifts) & 1
        return m.reshape(*bits.shape[:-1], bits.shape[-1] * 8)[..., :rows].bool()

    # -- epilog steps in place (the vocabulary of nvdispatch._epilog.apply_steps) --------------------
    def epilog_ops(self):
        from .._epilog_torch import TORCH_INPLACE

        return TORCH_INPLACE

    def epilog_ops_fresh(self):
        """The same steps, each writing a new tensor (an activation of a pre-activation kept as it is)."""
        from .._epilog_torch import TORCH_PLAIN

        return TORCH_PLAIN
