"""What nvdispatch needs to know of an array framework: the :class:`Adapter` protocol, the memory kinds
executors accept, and the :class:`Device` / :class:`OperandInfo` descriptions adapters produce.

Executors never see a framework: an adapter hands each operand to them as a *view* of its memory
(``OperandInfo.array``) and says which *memory kinds* that view is (``OperandInfo.memory``: ``"host"``,
``"cuda"``, a framework's own, see :mod:`nvdispatch._memory`); an executor declares the kinds it accepts. An
executor returns its result as the kind it received; the route then hands it to the operand's adapter
(:meth:`Adapter.wrap`), which returns it as the caller's type on the caller's device.

An adapter answers, for arrays of one framework (or one protocol such as ``__cuda_array_interface__``):

``claims(cls)`` / ``claims_instance(x)``
    detection (by class, looked up once per class; protocol adapters may also look at the instance);
``info(name, x)``
    the full description (:class:`OperandInfo`: the view, its memory kinds, framework, device with its
    index, dtype, shape, strides). A view read by pointer holds the values ``x`` stands for: where ``x``'s
    memory does not (a lazy conjugate or negative view), the view is a copy (``OperandInfo.materialized``) and
    ``signature`` gives such an ``x`` no key (raises ``TypeError``) or one apart from the plain array's;
``signature(x)`` (optional)
    a cheap hashable summary of what a plan depends on (dtype, shape, strides, device...), for the
    plan-cache key of repeated calls; without one, every call takes the full path;
``view(x)`` (optional)
    the view :meth:`info` hands out, without describing it (for repeated calls); None: ``x`` itself;
``wrap(result, like)`` (optional, with ``wraps = True``)
    an executor's result (of the view's kind) as the caller's type, on the device of ``like``;
``check_stream(stream, x)``
    refuse a ``stream=`` that is not a stream of this framework for ``x``'s device;
``precision_key()``, ``precision_key_of(x)``, ``precision_convention(device)`` (optional)
    the framework's matmul precision settings (TF32, autocast, default matmul precision): a cheap hashable
    reading that call keys hold (``precision_key_of``: the part a call on ``x``'s device depends on), and what they
    ask of a product on ``device``
    (:class:`~nvdispatch._precision.PrecisionConvention`); ``cast(x, dtype)`` casts an operand where an
    autocast region asks for it; ``autocast_region(x)``: the dtype of the autocast region active on ``x``'s device
    (a cheap reading: the FFTs read the convention only inside one, for the half-precision operands it may cast);
``fft_promotion(kind, dtype, one_axis)`` (optional)
    the dtypes the framework's own FFTs compute in and return where they widen an operand (Torch's half
    precision: float16/complex32 computed in float32/complex64, the result cast back);
``promote_types(x, y, argument)`` (optional)
    the dtype the framework's own arithmetic gives a mixed ``x``/``y`` pair (dtype names), or a typed error
    naming ``argument`` where it has none; without it, NumPy's rule;
``guard(*arrays)`` (optional)
    one native check that arrays still have the signatures these had, where reading several signatures
    costs more than the rest of a cached call (see :mod:`nvdispatch._call_key_memo`);
``device(x)``, ``data_ptr(x)``
    where the data lives;
``current_stream(device_index)``, ``stream_context(stream, device_index)``
    the framework's current CUDA stream (a raw handle), and a context making a raw stream current;
``empty(shape, dtype, device_index, stream, order)``
    a new array of this framework (with its pointer), on the stream's pool;
``coerce(x)``, ``to_numpy(x)``, ``export(x)``
    converting a foreign array into this framework, this framework's array to NumPy (host copy), and
    this framework's array into something other frameworks can import (DLPack/CAI);
``native_device(device)``, ``from_host_values(values, dtype, device)``
    devices named by the caller (``fftfreq(device=)``);
``roll(x, shifts, axes)``, ``copy_into(dst, src)``, ``unwritable(x)``
    the array operations ``fftshift`` and in-place results need (adapters without them go through the view).
``traced_framework``
    set on adapters of placeholders of a program being traced (JAX tracers): calls on them are staged by
    that framework's integration instead of run (see :mod:`nvdispatch._traced`).

Only adapters branch on a framework; everything else asks them (see ``nvdispatch._adapters``; CONTRIBUTING.md's
"Adding a framework" says which methods are required).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._precision import PrecisionConvention

from .._cuda.streams import stream_pointer
from ..errors import InvalidArgumentError, describe

__all__ = ["Adapter", "Device", "OperandInfo", "CPU"]


@dataclass(frozen=True)
class Device:
    """Where an array lives: ``kind`` is ``"cpu"`` or ``"cuda"``; ``index`` is the CUDA ordinal."""

    kind: str
    index: int | None = None

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


CPU = Device("cpu")


@dataclass(frozen=True)
class OperandInfo:
    """What dispatch needs to know of one operand. ``array`` is the view of its memory executors receive
    (``x`` itself for most frameworks), ``memory`` the kinds of memory that view is (see the module
    docstring); ``strides`` are in elements (None where unknown)."""

    array: Any
    framework: str
    device: Device
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    #: whether autograd records operations on this operand now (a Torch tensor requiring grad, grad enabled)
    autograd: bool = False
    #: how a chunked (Dask) array is cut (an ``_adapters.dask.DaskLayout``); None for plain arrays
    chunks: Any = None
    #: the memory kinds ``array`` is, as executors accept them (``HOST``, ``CUDA``, a framework's own)
    memory: frozenset[str] = frozenset()
    #: whether ``array`` is a copy holding the values the operand stands for (a lazy view materialised: Torch's
    #: conjugate and negative views on a device), made when the operand was detected: a stateful object
    #: detects the operand again at each execution (the values may have changed since), and results written
    #: into ``array`` do not reach the operand
    materialized: bool = False
    #: whether ``array``'s memory holds the conjugates of the operand's values (a lazy conjugate view described
    #: by its memory, :meth:`Adapter.info_conjugated`): only where a caller asked, to fold the conjugation into its
    #: operation (a matmul's cuBLAS op C); never from :meth:`Adapter.info`
    conjugated: bool = False

    @property
    def ndim(self) -> int:
        return len(self.shape)


class Adapter:
    """Base class of framework adapters (see the module docstring). Subclass it, fill in what your
    framework supports, and register an instance with :func:`nvdispatch._adapters.register_adapter`."""

    #: the framework name used in problems, ``explain()`` and error messages
    name: str = "adapter"
    #: device kind -> built-in (or registered) executor names tried by default for this framework, in order
    default_executors: Mapping[str, tuple[str, ...]] = {}
    #: whether executors' results must go through :meth:`wrap` before the caller gets them (the views it hands
    #: out are not the caller's type)
    wraps: bool = False
    #: for placeholders of a program being traced (JAX tracers): the framework whose integration stages
    #: calls on them (``nvdispatch._traced``); None for arrays holding memory
    traced_framework: str | None = None

    # -- detection ---------------------------------------------------------------------------------------
    def claims(self, cls: type) -> bool:
        """Whether arrays of class ``cls`` belong to this framework (never import a framework to ask:
        look it up in ``sys.modules``)."""
        return False

    def claims_instance(self, x: Any) -> bool:
        """For protocol adapters: whether ``x`` (of a class nobody claims) speaks this protocol."""
        return False

    def info(self, name: str, x: Any) -> OperandInfo:
        """Describe operand ``x`` (called ``name`` in error messages)."""
        raise NotImplementedError

    #: ``signature(x)``: what a plan depends on of ``x`` (dtype, shape, strides, device, autograd...), as
    #: a cheap hashable value; None (the default): calls with these arrays take the full route every time
    signature: Callable[[Any], Hashable] | None = None

    def signature_for(self, cls: type) -> Callable[[Any], Hashable] | None:
        """The signature function for arrays of class ``cls`` (a subclass may need the full route)."""
        return self.signature

    def rank_signature_for(self, cls: type) -> Callable[[Any], Hashable] | None:
        """For arrays of class ``cls``: ``rank_signature(x)``, the part of ``x``'s signature a plan serving every
        shape of one rank depends on (dtype and number of dimensions: everything the adapter's :meth:`info`
        reads but the shape and strides), or None (the default) where detection depends on more."""
        return None

    #: ``view(x)``: the view of ``x``'s memory that :meth:`info` hands out (``OperandInfo.array``), for repeated
    #: calls, which skip :meth:`info`; None (the default): the view is ``x`` itself
    view: Callable[[Any], Any] | None = None

    #: ``guard(*arrays)``: a function ``check(*arrays) -> bool``, true exactly when arrays have the same
    #: signatures as ``arrays`` had (cheaper than reading them), or None where it cannot make one; None (the
    #: default): calls read the signatures every time
    guard: Callable[..., Callable[..., bool] | None] | None = None

    def guard_for(self, cls: type) -> Callable[..., Callable[..., bool] | None] | None:
        """The guard factory for arrays of class ``cls`` (only where :meth:`signature_for` gives one)."""
        return self.guard

    # -- precision conventions ---------------------------------------------------------------------------
    #: ``precision_key()``: a cheap hashable reading of every framework setting :meth:`precision_convention`
    #: depends on, read on each call and held by its call key (a changed setting: another key, another plan);
    #: None (the default): the framework has no precision convention
    precision_key: Callable[[], Hashable] | None = None
    #: ``precision_key_of(x)`` (optional): the reading of the settings a product whose first operand is ``x``
    #: depends on (those of ``x``'s device only: Torch's CUDA TF32 switch for a CUDA tensor, its CPU matmul
    #: precision for a CPU one), hashable and cheap; matmul call keys hold it in place of ``precision_key()``
    #: where an adapter has it, so a setting of another device neither costs a read nor re-plans the call
    precision_key_of: Callable[[Any], Hashable] | None = None

    def precision_convention(self, device: Device) -> PrecisionConvention | None:
        """What the framework's settings ask of a matmul on ``device`` now, where the caller gives no
        ``compute_type`` (see :mod:`nvdispatch._precision`); None: nothing (each dtype's own compute type)."""
        return None

    def info_conjugated(self, name: str, x: Any) -> OperandInfo | None:
        """``x`` described by its own memory where that holds the conjugates of its values (a lazy conjugate view
        that :meth:`info` would hand over as a copy): :class:`OperandInfo` with ``conjugated=True``, whose ``array``
        is that memory unconjugated, for a caller that folds the conjugation into its operation instead of copying
        (the matmul route, where its executor can: cuBLASLt's op C). None (the default, and for every other
        array): take :meth:`info`."""
        return None

    def autocast_region(self, x: Any) -> str | None:
        """The dtype (name) of the framework's autocast region active on array ``x``'s device in this thread
        (Torch's ``torch.autocast``), None outside one; cheap (read by every half-precision transform, which reads
        :meth:`precision_convention` only inside a region, see
        :func:`nvdispatch._fft_conventions.autocast_promotion`). None (the default): the framework has none."""
        return None

    def as_planned(self, device: Device, float32_compute: str | None) -> Callable[..., Any] | None:
        """``run(fn, *args)``: ``fn(*args)`` with the precision a stateful object's ``plan()`` chose kept: outside
        the framework's autocast regions on ``device``, and, for a float32 product planned with compute type
        ``float32_compute`` (a name; None: not a float32 product), with the framework's own matmul at least that
        precise where its executor computes with it; None where the framework has no such settings."""
        return None

    def cast(self, x: Any, dtype: str) -> Any:
        """``x`` (an array of this framework) converted to ``dtype``, as the framework's autocast casts operands
        (autograd records it)."""
        raise NotImplementedError(f"{self.name} arrays cannot be cast")

    def fft_promotion(self, kind: str, dtype: str, one_axis: bool = False) -> tuple[str, str] | None:
        """Where this framework's FFTs compute an operand of ``dtype`` in a wider dtype, for a transform of ``kind``
        (``"c2c"``, ``"r2c"``, ``"c2r"``): ``(the dtype the operand is cast to, the dtype the result is cast back
        to)``, the result's dtype being the framework's; None (the default): the operand is transformed as it is
        (the problem builder names a dtype no transform takes). ``one_axis``: the call names exactly one axis (a
        1-D transform, or an n-D one given ``axes`` of one entry), where a framework's rule tells these apart
        (CuPy 14's real results). Arrays of this framework support :meth:`cast` where this gives a promotion."""
        return None

    # -- placement ---------------------------------------------------------------------------------------
    def device(self, x: Any) -> Device:
        return self.info("x", x).device

    def data_ptr(self, x: Any) -> int:
        """The address of ``x``'s first element."""
        raise NotImplementedError(f"{self.name} arrays expose no data pointer")

    def data_ptr_reader(self) -> Callable[[Any], int]:
        """A function of an array giving its :meth:`data_ptr`, read once by a plan and called on every launch
        (optional: where the framework allows, a function with no Python frame, such as an
        ``operator.methodcaller``); :meth:`data_ptr` by default."""
        return self.data_ptr

    # -- streams (CUDA) ----------------------------------------------------------------------------------
    def current_stream(self, device_index: int | None) -> int:
        """The framework's current stream on ``device_index`` as a raw handle (0: the legacy default)."""
        return 0

    def current_stream_getter(self, device_index: int):
        """A cheap callable giving :meth:`current_stream` for ``device_index``, or None when that is
        always the legacy default stream ``0``."""
        return None

    def stream_handle(self, stream: Any) -> int | None:
        """The raw handle of ``stream`` when it is this framework's stream object, else None."""
        return None

    def stream_context(self, stream: int, device_index: int | None):
        """A context making raw ``stream`` the framework's current stream (so its allocations and ops are
        ordered on it); a no-op for frameworks without streams."""
        return contextlib.nullcontext()

    def check_stream(self, stream: Any, x: Any) -> None:
        """Raise :class:`~nvdispatch.errors.InvalidArgumentError` naming ``stream`` unless ``stream`` (not None) is
        a stream this framework's array ``x`` can run on: on a CUDA device a stream object or handle (see
        ``nvdispatch._cuda.streams``); on the CPU none, unless the framework has CPU streams of its own (an
        adapter then accepts them)."""
        device = self.device(x)
        if device.kind != "cuda":
            raise InvalidArgumentError(
                "stream", f"None: {self.name} arrays on {device} run on no stream", describe(stream)
            )

        stream_pointer(stream, self.name, device.index)

    def native_stream_context(self, stream: Any, device_index: int | None):
        """Like :meth:`stream_context` for a ``stream=`` argument as the user passed it (this framework's
        stream object, a ``__cuda_stream__`` object, a raw int), or None (nothing to do)."""
        if stream is None:
            return contextlib.nullcontext()

        return self.stream_context(stream_pointer(stream, self.name, device_index), device_index)

    # -- memory ------------------------------------------------------------------------------------------
    def empty(self, shape, dtype: str, device_index: int, stream: int, order: str = "C"):
        """A new uninitialised array of this framework and its pointer: ``(array, ptr)``."""
        raise NotImplementedError(f"{self.name} cannot allocate device arrays")

    def scratch(self, nbytes: int, device_index: int, stream: int):
        """``(ptr, owner)`` of ``nbytes`` bytes from the framework's stream-ordered allocator for work on raw
        ``stream`` (``owner`` keeps them alive), or None: nvdispatch allocates them itself."""
        return None

    # -- array operations the front-ends need (fftshift, in-place FFT results) --------------------------------
    #: whether :meth:`roll` / :meth:`copy_into` work on this framework's arrays
    can_roll = False
    can_copy_into = False

    def roll(self, x: Any, shifts: tuple[int, ...], axes: tuple[int, ...]) -> Any:
        """``x`` rolled by ``shifts`` along ``axes`` (a copy of ``x`` when ``axes`` is empty)."""
        raise NotImplementedError(f"{self.name} arrays cannot be rolled")

    def copy_into(self, dst: Any, src: Any) -> None:
        """Write ``src`` into ``dst`` (an array of this framework)."""
        dst[...] = src

    def unwritable(self, x: Any) -> str:
        """Why ``x`` may not be written in place (read-only, immutable...), or ``""`` when it may."""
        return ""

    # -- devices named by the caller (fftfreq's ``device=``) ----------------------------------------------
    #: order among adapters for a device given as a string ("cpu", "cuda:1"): lowest first
    device_string_rank = 9

    def native_device(self, device: Any) -> Any | None:
        """``device`` as this framework's device object when it names one of this framework's devices (its
        device class, or a string it takes), else None."""
        return None

    def from_host_values(self, values, dtype: Any, device: Any) -> Any:
        """A new array of this framework on ``device`` holding ``values`` (float64 NumPy) cast to ``dtype``
        (None: float64), which must be a real floating dtype (``UnsupportedDtypeError`` otherwise)."""
        raise NotImplementedError(f"{self.name} cannot create arrays from host values")

    # -- results on CUDA devices (kinds: what the GPU executors create results as) ----------------------------
    #: the result kinds this adapter creates (``_cuda.arrays.result_kind``)
    result_kinds: tuple[str, ...] = ()

    def result_kind(self, x: Any) -> str:
        """The kind of result to create for a caller whose operand is ``x``."""
        return "cai"

    def device_view(self, x: Any):
        """A ``_cuda.arrays.DeviceView`` of this framework's device array ``x``, or None (protocol adapters:
        the protocol is read)."""
        return None

    def empty_result(self, kind: str, shape, dtype: str, device_index: int, stream: int, order: str = "C"):
        """``(array, ptr)``: a new array of result kind ``kind``."""
        return self.empty(shape, dtype, device_index, stream, order)

    def as_result(self, kind: str, arr: Any, framework_of_arr: str) -> Any:
        """``arr`` (a Torch tensor or CuPy array made by a helper) as a result of ``kind``, zero-copy."""
        return self.view_device_array(arr)

    def result_view(self, kind: str, base: Any, shape, strides_elems, offset_elems: int = 0) -> Any:
        """A view of ``base`` (a result of ``kind``) with the given shape and element strides."""
        raise NotImplementedError(f"{self.name} cannot make views of its results")

    def result_from_operand(self, shape, dtype: str, order: str = "C"):
        """How an operand of this framework makes a result like itself (its device, its framework's allocator on
        the current stream) without being told the device: ``(kind, args, kwargs, transposed)``, the result
        being ``operand.new_empty(*args, **kwargs)`` (C-ordered storage), seen with its last two axes swapped
        where ``transposed`` (``order="F"``); None (the default): results come from :meth:`empty_result`."""
        return None

    def result_maker(self, shape, dtype: str) -> tuple | None:
        """How a plan makes, per call, a C-ordered result of ``shape`` and ``dtype`` like the operand (its device,
        the framework's allocator on its current stream): ``(maker, args, kwargs)``, the result being
        ``operand.<maker>(*args, **kwargs)`` where ``maker`` is a str, else ``maker(*args, **kwargs)``; None
        where results come from :meth:`empty_result` only. By default the operand's ``new_empty`` as
        :meth:`result_from_operand` says."""
        made = self.result_from_operand(shape, dtype)
        if made is None or made[3]:
            return None
        return "new_empty", made[1], made[2]

    # -- device helpers (layout copies, casts, fallback epilogs of the GPU plans) -----------------------------
    #: where the ``cuda`` executor's prepared FFTs of this framework's arrays (real input to a complex transform,
    #: hfft/ihfft, n/s) run when no CuPy/Torch helper can do their array passes and the user did not ask for that
    #: executor, in words (the executor declines them to it); None: the executor runs them with its
    #: framework-free passes
    prepared_fft_route: str | None = None

    def device_ops_available(self) -> bool:
        """Whether :meth:`device_ops` can work here (the framework installed)."""
        return False

    def device_ops_for_foreign_arrays(self) -> bool:
        """Whether :meth:`device_ops` can also work on other owners' CUDA arrays here (viewed zero-copy by
        :meth:`view_device_array`): installed with CUDA support."""
        return self.device_ops_available()

    def device_ops(self):
        """The helper object the GPU plans use on this framework's device arrays (see ``_cuda.xp.Xp``)."""
        raise NotImplementedError(f"{self.name} has no device helpers")

    def view_device_array(self, x: Any) -> Any:
        """A zero-copy array of this framework viewing device array ``x`` (CAI or DLPack)."""
        raise NotImplementedError(f"{self.name} cannot view foreign device arrays")

    # -- conversion --------------------------------------------------------------------------------------
    def coerce(self, x: Any) -> Any:
        """Convert a foreign operand ``x`` into this framework (used under ``set_backend(coerce=True)``)."""
        raise NotImplementedError(f"cannot convert operands into {self.name} arrays")

    def to_numpy(self, x: Any):
        """``x`` (an array of this framework) as a NumPy array on the host (a copy from a device)."""
        import numpy as np

        return np.from_dlpack(x) if hasattr(x, "__dlpack__") else np.asarray(x)

    def export(self, x: Any) -> Any:
        """``x`` as an object other frameworks can import through DLPack / CAI (e.g. detached from autograd)."""
        return x

    def wrap(self, result: Any, like: Any) -> Any:
        """Present an executor's ``result`` (of the kind of the views this adapter hands out: a NumPy array for
        host views) as the type of the caller's operand ``like``, on ``like``'s device. Called only where
        :attr:`wraps` is true."""
        return result

    def __repr__(self) -> str:
        return f"<nvdispatch adapter {self.name!r}>"
