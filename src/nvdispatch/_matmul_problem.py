"""What a matmul call asks for, validated once: options, compute types, PEP 465 shapes, dtypes and
epilog inputs. The resulting :class:`MatmulProblem` is immutable and holds no arrays, so it is the
plan-cache key (plus executor and strategy)."""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from ._adapter_registry import adapter_named
from ._detect import Device, OperandInfo
from ._epilog import STRATEGIES, EpilogSpec, Shapes, validate_inputs
from ._fp8_types import check_operand_types, check_result_type
from ._memory import common_memory
from ._precision import PrecisionConvention
from ._shapes import broadcast_shapes, is_symbolic
from ._tunings import OMIT_AT_DEFAULT
from .errors import (
    EpilogInputError,
    InvalidArgumentError,
    OutOfMemoryError,
    ShapeMismatchError,
    UnsupportedDtypeError,
    describe,
    expect_bool,
)

__all__ = [
    "ComputeType",
    "MatmulOptions",
    "MatmulPlanPreferences",
    "MatmulProblem",
    "ArraySig",
    "build_problem",
    "as_options",
    "as_preferences",
    "dict_form_key",
    "count",
    "check_scalar",
    "scalar_key",
    "scalar_always_valid",
    "scalar_value",
    "MATMUL_DTYPES",
]


class ComputeType(enum.IntEnum):
    """cuBLAS compute types (values as ``cublasComputeType_t``), for ``MatmulOptions.compute_type``.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> a = np.ones((4, 3), np.float32)
    >>> y = nvdispatch.matmul(a, a.T, options={"compute_type": nvdispatch.ComputeType.COMPUTE_32F_FAST_TF32})
    >>> y.tolist()[0]
    [3.0, 3.0, 3.0, 3.0]
    """

    COMPUTE_16F = 64
    COMPUTE_16F_PEDANTIC = 65
    COMPUTE_32F = 68
    COMPUTE_32F_PEDANTIC = 69
    COMPUTE_32F_FAST_16F = 74
    COMPUTE_32F_FAST_16BF = 75
    COMPUTE_32F_FAST_TF32 = 77
    COMPUTE_64F = 70
    COMPUTE_64F_PEDANTIC = 71
    COMPUTE_32I = 72
    COMPUTE_32I_PEDANTIC = 73


#: which compute types each result dtype admits (cuBLASLt's table); CPU executors compute at least as
#: precisely as requested
_COMPUTE_FOR_DTYPE = {
    "float16": {"COMPUTE_16F", "COMPUTE_16F_PEDANTIC", "COMPUTE_32F", "COMPUTE_32F_PEDANTIC"},
    "bfloat16": {"COMPUTE_32F", "COMPUTE_32F_PEDANTIC"},
    "float32": {
        "COMPUTE_32F",
        "COMPUTE_32F_PEDANTIC",
        "COMPUTE_32F_FAST_16F",
        "COMPUTE_32F_FAST_16BF",
        "COMPUTE_32F_FAST_TF32",
    },
    "complex64": {
        "COMPUTE_32F",
        "COMPUTE_32F_PEDANTIC",
        "COMPUTE_32F_FAST_16F",
        "COMPUTE_32F_FAST_16BF",
        "COMPUTE_32F_FAST_TF32",
    },
    "float64": {"COMPUTE_64F", "COMPUTE_64F_PEDANTIC"},
    "complex128": {"COMPUTE_64F", "COMPUTE_64F_PEDANTIC"},
}
_INT_COMPUTE = {"COMPUTE_32I", "COMPUTE_32I_PEDANTIC"}
#: each floating dtype's own compute type (where no compute type is asked for)
_OWN_COMPUTE = {
    "float16": "COMPUTE_32F",
    "bfloat16": "COMPUTE_32F",
    "float32": "COMPUTE_32F",
    "complex64": "COMPUTE_32F",
    "float64": "COMPUTE_64F",
    "complex128": "COMPUTE_64F",
}

MATMUL_DTYPES = (
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
)
_FLOATING = {"float16", "bfloat16", "float32", "float64"}
_COMPLEX = {"complex64", "complex128"}


@dataclass(frozen=True)
class MatmulOptions:
    """Options of a matmul.

    Attributes
    ----------
    compute_type : ComputeType, optional
        Accumulation precision (cuBLASLt semantics; e.g. ``COMPUTE_32F_FAST_16F`` lets float32 inputs run
        on fp16 tensor cores). Default: the dtype's natural one. CPU executors compute at least as
        precisely as asked.
    scale_type : str, optional
        dtype of ``alpha``/``beta`` (default: the compute type's).
    bgrad_axis : {"n", "m"}
        Orientation of the bias gradient of DRELU_BGRAD/DGELU_BGRAD: ``"n"`` (default, the
        neural-network convention) sums the result over M giving ``(..., n)``; ``"m"`` sums over N
        giving ``(..., m, 1)``.
    result_type : str, optional
        FP8 matmuls: the result dtype (``float8_e4m3fn``, ``float8_e5m2``, ``bfloat16``, ``float16``,
        ``float32``); see :mod:`nvdispatch._fp8`.
    result_amax : bool
        FP8 matmuls with an FP8 result: also return ``aux["result_amax"]``, ``max(abs(result))`` before the d scale.
    operand_types : dict, optional
        FP8 matmuls of CuPy/raw CUDA operands: ``{"a": "float8_e4m3fn", ...}`` for ``uint8`` arrays holding FP8.
    fast_accumulation : bool
        FP8 matmuls: let cuBLASLt's FP8 kernels accumulate partial sums in the tensor cores' faster, less
        precise mode (``CUBLASLT_MATMUL_DESC_FAST_ACCUM``; ``torch._scaled_mm(use_fast_accum=True)``): faster,
        usual for forward passes. The reference path always accumulates in float32.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> opts = nvdispatch.MatmulOptions(compute_type="COMPUTE_32F", bgrad_axis="n")  # or the same as a dict
    >>> opts.compute_type
    <ComputeType.COMPUTE_32F: 68>
    >>> y = nvdispatch.matmul(np.ones((4, 3), np.float32), np.ones((3, 2), np.float32), options=opts)
    """

    compute_type: ComputeType | None = None
    scale_type: str | None = None
    bgrad_axis: str = "n"
    result_type: str | None = None
    result_amax: bool = False
    operand_types: Any = None
    fast_accumulation: bool = False

    def __post_init__(self):
        if self.compute_type is not None:
            object.__setattr__(self, "compute_type", _compute_type(self.compute_type))
        if not isinstance(self.bgrad_axis, str) or self.bgrad_axis not in ("n", "m"):
            raise InvalidArgumentError("options.bgrad_axis", "'n' or 'm'", describe(self.bgrad_axis))
        if self.scale_type is not None:
            name = _scale_dtype_name(self.scale_type)
            if name not in _FLOATING | _COMPLEX | {"int32"}:
                raise InvalidArgumentError(
                    "options.scale_type", "a float, complex or int32 dtype", describe(self.scale_type)
                )
            object.__setattr__(self, "scale_type", name)
        object.__setattr__(self, "result_type", check_result_type(self.result_type))
        object.__setattr__(self, "operand_types", check_operand_types(self.operand_types))
        object.__setattr__(self, "result_amax", expect_bool("options.result_amax", self.result_amax))
        object.__setattr__(self, "fast_accumulation", expect_bool("options.fast_accumulation", self.fast_accumulation))


def count(argument: str, value: Any, least: int, allow_none: bool = False) -> int | None:
    """``value`` as an int ``>= least`` (Python's or NumPy's integers; not a bool, not a float), or
    :class:`InvalidArgumentError` naming ``argument``."""
    if value is None and allow_none:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)) and value >= least:
        return int(value)
    expected = f"{'None or ' if allow_none else ''}an int >= {least}"
    raise InvalidArgumentError(argument, expected, describe(value))


def _compute_type(value: Any) -> ComputeType:
    """A :class:`ComputeType` from one, its name or its integer value (not a bool, not a float)."""
    try:
        if isinstance(value, str):
            return ComputeType[value]
        if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
            return ComputeType(int(value))
    except (KeyError, ValueError):
        pass
    raise InvalidArgumentError(
        "options.compute_type", f"a ComputeType ({', '.join(c.name for c in ComputeType)})", describe(value)
    )


def _scale_dtype_name(value: Any) -> str | None:
    """The dtype name ``value`` (a name such as ``"float32"`` or ``"f4"``, a NumPy dtype or type, a Torch
    dtype) stands for; None for a number (which NumPy would take as a dtype: ``np.dtype(1.0)``)."""
    if isinstance(value, (bool, np.bool_, numbers.Number)):
        return None
    if isinstance(value, str) and value != "bfloat16":
        try:
            return np.dtype(value).name
        except TypeError:
            return value
    return _dtype_name(value)


@dataclass(frozen=True)
class MatmulPlanPreferences:
    """Planning preferences.

    Attributes
    ----------
    strategy : str, optional
        Force an epilog fusion strategy (``"native"``, ``"framework_fused"``, ``"inplace"``, ``"plain"``)
        instead of the planner's first choice; a strategy the executor cannot run is an error.
    limit : int
        How many candidates ``Matmul.autotune()`` times (default 8): on the ``cuda``/``cupy`` executors the
        cuBLASLt heuristic's top ``limit`` algorithms (each also tried at smaller workspace limits and as
        split-K variants, see ``_cuda/lt_autotune.py``); on the NumPy executor the first ``limit`` of its
        block-size × thread-count configurations. The Torch executor has nothing to tune and ignores it.
    max_workspace_bytes : int, optional
        Upper bound on the workspace cuBLASLt may use (default 32 MiB, NVIDIA's figure for Hopper): the
        heuristic (planning and autotuning alike) offers only algorithms within it, and a plan never holds
        more. 0 asks for algorithms without a workspace. The CPU executors use no workspace and ignore it.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> a, b = np.ones((4, 3)), np.ones((3, 2))
    >>> prefs = nvdispatch.MatmulPlanPreferences(strategy="plain")  # or {"strategy": "plain"}
    >>> nvdispatch.explain(a, b, epilog="RELU", preferences=prefs).strategy
    'plain'
    """

    strategy: str | None = None
    limit: int = 8
    max_workspace_bytes: int | None = None

    def __post_init__(self):
        if self.strategy is not None and (not isinstance(self.strategy, str) or self.strategy not in STRATEGIES):
            raise InvalidArgumentError("preferences.strategy", f"one of {STRATEGIES}", describe(self.strategy))
        object.__setattr__(self, "limit", count("preferences.limit", self.limit, 1))
        ws = count("preferences.max_workspace_bytes", self.max_workspace_bytes, 0, allow_none=True)
        object.__setattr__(self, "max_workspace_bytes", ws)

    def for_plan(self) -> MatmulPlanPreferences | None:
        """What of these preferences shapes a plan (``limit``, ``max_workspace_bytes``; the strategy is chosen
        apart), as the :class:`MatmulProblem` field; None when they are the defaults."""
        if self.limit == _DEFAULT_LIMIT and self.max_workspace_bytes is None:
            return None
        return MatmulPlanPreferences(None, self.limit, self.max_workspace_bytes)


_DEFAULT_LIMIT = 8


def _as_dataclass(cls, value, argument):
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        names = [f.name for f in fields(cls)]
        unknown = [key for key in value if key not in names]
        if unknown:
            shown = ", ".join(repr(key) for key in unknown)
            raise InvalidArgumentError(argument, f"keys among {names}", f"unknown key(s) {shown}")
        return cls(**value)
    raise InvalidArgumentError(argument, f"a {cls.__name__} or a dict", describe(value))


def dict_form_key(value: dict) -> tuple:
    """A call key's part for the dict form of ``options``/``preferences``: its items, each value with its
    class, so values that compare equal but validate apart (``0`` and ``False``, ``70`` and ``70.0``) never
    share a key. ``TypeError`` for an unhashable value (such a call takes the full path)."""
    return (dict, frozenset((key, v.__class__, v) for key, v in value.items()))


def compute_type_note(problem: MatmulProblem, how: str) -> tuple[str, ...]:
    """The plan step an executor that does not apply ``options.compute_type`` shows in ``explain()``:
    ``(note,)`` when the caller asked for one, else ``()`` (a compute type a framework's convention chose is that
    framework's own ops' already). ``how`` says what it computes with instead."""
    ct = problem.explicit_compute_type
    return () if ct is None else (f"options.compute_type {ct.name} not applied: {how}",)


def as_options(value) -> MatmulOptions:
    return _as_dataclass(MatmulOptions, value, "options")


def as_preferences(value) -> MatmulPlanPreferences:
    return _as_dataclass(MatmulPlanPreferences, value, "preferences")


_DEFAULT_PREFERENCES = MatmulPlanPreferences()


def _dtype_name(dtype) -> str:
    if isinstance(dtype, str):
        return dtype
    s = str(dtype)
    if s.startswith("torch."):
        return s[6:]
    try:
        return np.dtype(dtype).name
    except TypeError:
        return s


@dataclass(frozen=True)
class ArraySig:
    """An operand as far as planning cares: dtype, shape, strides (elements)."""

    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    #: a chunked (Dask) operand's layout, else None
    chunks: Any = None
    #: whether the operand's memory holds the conjugates of its values (``OperandInfo.conjugated``): its executor
    #: conjugates as it reads it (cuBLASLt's op C); left out of saved tunings' keys while False
    conj: bool = field(default=False, metadata={OMIT_AT_DEFAULT: True})

    @classmethod
    def of(cls, info: OperandInfo) -> ArraySig:
        return cls(info.dtype, info.shape, info.strides, info.chunks, info.conjugated)


@dataclass(frozen=True)
class MatmulProblem:
    """A validated matmul call. Shapes with the ``p`` prefix are after PEP 465 promotion of 1-D operands."""

    framework: str
    device: Device
    a: ArraySig
    b: ArraySig
    c: ArraySig | None
    result_dtype: str
    batch_shape: tuple[int, ...]
    m: int
    n: int
    k: int
    a_vector: bool
    b_vector: bool
    result_shape: tuple[int, ...]
    epilog: EpilogSpec
    #: "n" or "m" where a bias is given, else None
    bias_axis: str | None
    inputs: tuple[tuple[str, ArraySig], ...]
    options: MatmulOptions
    #: autograd records this call (Torch operands requiring grad): executors must keep the graph
    autograd: bool = False
    #: FP8 matmuls: types, scale kinds and amax (an :class:`nvdispatch._fp8.Fp8Spec`), else None
    quantization: Any = None
    #: plan-shaping preferences (autotune ``limit``, ``max_workspace_bytes``); None: the defaults
    preferences: MatmulPlanPreferences | None = None
    #: the memory kinds every operand's view is (``OperandInfo.memory``): what executors accept them by
    memory: frozenset[str] = field(default=frozenset(), repr=False)
    #: the framework convention that chose the compute type (``options.compute_type``, set where it asks for
    #: another than the dtype's own) or the result dtype (an autocast region), as ``explain()`` gives it; None:
    #: the caller's ``compute_type``, or no convention (see :mod:`nvdispatch._precision`)
    precision: str | None = field(default=None, repr=False)
    #: the operands cast to the result dtype before the call runs, where an autocast region applies (a tuple of
    #: names, maybe empty); None: none applies
    autocast: tuple[str, ...] | None = field(default=None, repr=False)

    @property
    def explicit_compute_type(self) -> ComputeType | None:
        """The compute type the caller asked for in ``options`` (None: none, or one a convention chose)."""
        return self.options.compute_type if self.precision is None else None

    @property
    def precision_note(self) -> str:
        """The compute type the call runs with and what chose it, as ``explain()`` says it."""
        ct = self.options.compute_type
        name = ct.name if ct is not None else _OWN_COMPUTE.get(self.result_dtype)
        head = f"compute type {name}" if name is not None else f"{self.result_dtype} arithmetic"
        if self.autocast is not None:
            return f"{head}, result {self.result_dtype}: {self.precision}"
        if self.precision is not None:
            return f"{head}: {self.precision}"
        if ct is not None:
            return f"{head}: options.compute_type"
        return f"{head}: the {self.result_dtype} default (no precision convention applies)"

    @property
    def plan_preferences(self) -> MatmulPlanPreferences:
        """The plan-shaping preferences, defaults filled in."""
        return self.preferences or _DEFAULT_PREFERENCES

    @property
    def promoted_shape(self) -> tuple[int, ...]:
        return (*self.batch_shape, self.m, self.n)

    @property
    def input_sigs(self) -> dict[str, ArraySig]:
        return dict(self.inputs)

    def squeeze(self, x):
        """Drop the axes PEP 465 added for 1-D operands from a promoted ``(..., m, n)`` array (any framework). A
        1-D @ 1-D product is ``x[0, 0]``, as the framework indexes it: a NumPy scalar (as ``numpy.matmul`` gives),
        a 0-d Torch/CuPy array."""
        if self.a_vector and self.b_vector:
            return x[0, 0]
        if self.a_vector:
            return x[..., 0, :]
        if self.b_vector:
            return x[..., 0]
        return x


def promote_dtypes(x: str, y: str, argument: str = "b", framework: str | None = None) -> str:
    """Result dtype of ``x`` and ``y``: the rule of the operands' ``framework`` where its adapter has one
    (``Adapter.promote_types``: Torch's ``torch.promote_types``, JAX's ``jax.numpy.promote_types``, so a mixed
    product has the dtype the framework's own arithmetic gives it), else NumPy's, with bfloat16 as Torch
    promotes it."""
    if x == y:
        return x
    rule = getattr(adapter_named(framework), "promote_types", None) if framework is not None else None
    if rule is not None:
        return rule(x, y, argument)
    if "bfloat16" in (x, y):
        other = y if x == "bfloat16" else x
        if other in ("float16",):
            return "float32"
        if other.startswith(("int", "uint")) or other == "bool":
            return "bfloat16"
        return other  # float32, float64, complex
    try:
        return np.result_type(np.dtype(x), np.dtype(y)).name
    except TypeError:
        raise UnsupportedDtypeError(argument, f"a dtype compatible with {x}", y) from None


def check_scalar(name: str, value: Any, result_dtype: str) -> None:
    """Raise :class:`InvalidArgumentError` naming ``name`` unless ``value`` (a Python, NumPy or 0-d array
    scalar) can scale a ``result_dtype`` result: real for a real result; for an integer result, an integer
    within its range; for a floating result, a number a float can hold (not an int beyond ~1.8e308)."""
    if is_symbolic(value):  # a traced program's size-derived number (real), never converted (see _shapes)
        if result_dtype in _FLOATING | _COMPLEX:
            return
        raise InvalidArgumentError(name, f"a concrete number for a {result_dtype} result", describe(value))
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()
    if not isinstance(value, numbers.Number) or isinstance(value, bool):
        raise InvalidArgumentError(name, "a real or complex scalar", describe(value))
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
        if result_dtype not in _COMPLEX and value.imag != 0:
            raise InvalidArgumentError(name, f"a real scalar for a {result_dtype} result", repr(value))
        value = value.real
    if result_dtype in _FLOATING | _COMPLEX:
        try:
            float(value)
        except OverflowError:
            raise InvalidArgumentError(
                name, f"a number a float can hold, for a {result_dtype} result", f"an int of {value.bit_length()} bits"
            ) from None
        return
    if isinstance(value, float) and not value.is_integer():
        raise InvalidArgumentError(name, f"an integral scalar for an integer ({result_dtype}) result", repr(value))
    info = np.iinfo(result_dtype)
    if not info.min <= value <= info.max:
        raise InvalidArgumentError(
            name, f"an integer from {info.min} to {info.max} (the range of the {result_dtype} result)", repr(value)
        )


def scalar_key(value: Any) -> Any:
    """What a call key holds of a scalar (``alpha``, ``beta``): its class, for whose values
    :func:`scalar_always_valid` answers; a Python int other than 1 with its value, since an int of any size
    is one class and whether it fits the result is its value's."""
    cls = value.__class__
    return cls if cls is not int or value == 1 else (int, value)


def scalar_always_valid(value: Any, result_dtype: str) -> bool:
    """Whether every scalar with ``value``'s :func:`scalar_key` is valid for a ``result_dtype`` result (so a
    call key holding it may skip :func:`check_scalar`); ``value`` itself was checked."""
    cls = value.__class__
    integer_result = result_dtype not in _FLOATING | _COMPLEX
    if cls is complex or issubclass(cls, np.complexfloating):
        return result_dtype in _COMPLEX
    if cls is int:
        return True  # keyed by its value (1 fits every result)
    if issubclass(cls, np.integer):  # every value of the class must fit
        if not integer_result:
            return True
        have, want = np.iinfo(cls), np.iinfo(result_dtype)
        return want.min <= have.min and have.max <= want.max
    return not integer_result


def scalar_value(value: Any):
    """A Python number from a Python/NumPy scalar or 0-d array."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        return value.item()
    return value


def _broadcast(shapes: list[tuple[int, ...]], names: list[str]) -> tuple[int, ...]:
    try:
        return broadcast_shapes(*shapes)
    except ValueError:
        raise ShapeMismatchError(
            names[-1], f"batch dimensions broadcastable with {names[0]}'s {shapes[0]}", str(shapes[-1])
        ) from None


#: bytes per element of the dtypes NumPy does not know
_ITEMSIZES = {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    itemsize = _ITEMSIZES.get(dtype) or np.dtype(dtype).itemsize
    return math.prod(shape) * itemsize


def _check_addressable(infos: dict[str, OperandInfo], result_shape: tuple[int, ...], result_dtype: str) -> None:
    """Operands and a result whose bytes no address space holds (broadcast or expanded views claiming 2**62
    rows, say): :class:`ShapeMismatchError` naming the operand, :class:`OutOfMemoryError` for the result. Chunked
    (Dask) operands are left to their blocks."""
    if any(info.chunks is not None for info in infos.values()):
        return
    for name, info in infos.items():
        nbytes = _nbytes(info.shape, info.dtype)
        if nbytes > sys.maxsize:
            raise ShapeMismatchError(
                name,
                f"an array of at most {sys.maxsize} bytes (its shape's element count times its item size)",
                f"shape {info.shape} of {info.dtype}: {nbytes} bytes",
            )
    nbytes = _nbytes(result_shape, result_dtype)
    if nbytes > sys.maxsize:
        shapes = " and ".join(f"{name} of shape {infos[name].shape}" for name in ("a", "b"))
        raise OutOfMemoryError(
            "memory",
            f"a result that fits in memory (at most {sys.maxsize} bytes)",
            f"a {result_shape} {result_dtype} result of {nbytes} bytes, from {shapes}",
        )


def _check_dtype(name: str, dtype: str) -> None:
    if dtype not in MATMUL_DTYPES and dtype != "bool":
        raise UnsupportedDtypeError(name, f"a numeric or boolean dtype ({', '.join(MATMUL_DTYPES)}, bool)", dtype)


def _check_boolean_product(spec: EpilogSpec, alpha: Any, beta: Any) -> None:
    """A boolean product (both operands boolean: ``numpy.matmul``'s logical OR of ANDs, a boolean result) takes
    no epilog and no scaling: ``alpha`` 1, ``beta`` 0, 1 or None (``+ c`` is a logical OR, as NumPy adds booleans).
    """
    if spec.steps or spec.outputs or spec.inputs:
        raise UnsupportedDtypeError("epilog", f"a numeric result for {spec.epilog.name}", "a bool product")
    for name, value, allowed in (("alpha", alpha, (1,)), ("beta", beta, (0, 1))):
        if value is None:
            continue
        ok = isinstance(value, numbers.Number) or getattr(value, "ndim", None) == 0
        if not ok or isinstance(value, bool) or scalar_value(value) not in allowed:  # a bool is no scalar here
            want = "1" if name == "alpha" else "0, 1 or None"
            raise InvalidArgumentError(name, f"{want} for a bool product (no scaling of booleans)", repr(value))


def build_problem(
    framework: str,
    device: Device,
    infos: dict[str, OperandInfo],
    spec: EpilogSpec,
    options: MatmulOptions,
    alpha: Any,
    beta: Any,
    extra_inputs: tuple[str, ...] = (),
    convention: PrecisionConvention | None = None,
    autocast: tuple[str, ...] | None = None,
) -> MatmulProblem:
    """Validate a matmul call and describe it. ``infos`` holds a, b, optional c and the epilog inputs.

    ``convention``: the operands' framework's precision convention (read where ``options.compute_type`` is
    None), which chooses the compute type; ``autocast``: the operands the caller cast for its autocast region
    (``infos`` describes them cast), None where no region applies."""
    a, b = infos["a"], infos["b"]
    for name in ("a", "b"):
        info = infos[name]
        if info.ndim == 0:  # a shape error, as NumPy's (and fft's of a 0-d array)
            raise ShapeMismatchError(name, "an array with at least 1 dimension", "a 0-d array")
        _check_dtype(name, info.dtype)
    result_dtype = promote_dtypes(a.dtype, b.dtype, "b", framework)
    a_vec, b_vec = a.ndim == 1, b.ndim == 1
    pa = (1, *a.shape) if a_vec else a.shape
    pb = (*b.shape, 1) if b_vec else b.shape
    m, k = pa[-2], pa[-1]
    k2, n = pb[-2], pb[-1]
    if k != k2:
        raise ShapeMismatchError("b", f"{k} rows to match a's last dimension (a is {a.shape})", f"shape {b.shape}")
    batch = _broadcast([pa[:-2], pb[:-2]], ["a", "b"])
    result_shape = (*batch, *(() if a_vec else (m,)), *(() if b_vec else (n,)))
    _check_addressable(infos, result_shape, result_dtype)
    if result_dtype == "bool":
        _check_boolean_product(spec, alpha, beta)

    c_sig = None
    if "c" in infos:
        c = infos["c"]
        _check_dtype("c", c.dtype)
        if promote_dtypes(result_dtype, c.dtype, "c", framework) != result_dtype:
            raise UnsupportedDtypeError("c", f"a dtype that does not widen the result ({result_dtype})", c.dtype)
        try:
            ok = broadcast_shapes(c.shape, result_shape) == tuple(result_shape)
        except ValueError:
            ok = False
        if not ok:
            raise ShapeMismatchError("c", f"a shape broadcastable to the result's {result_shape}", str(c.shape))
        c_sig = ArraySig.of(c)

    if result_dtype != "bool":
        check_scalar("alpha", alpha, result_dtype)
        if beta is not None:
            check_scalar("beta", beta, result_dtype)
    if beta is not None:
        if c_sig is None and scalar_value(beta) != 0:
            raise InvalidArgumentError("beta", "0 or None when c is not given", repr(beta))

    ct = options.compute_type
    if ct is not None:
        allowed = _COMPUTE_FOR_DTYPE.get(result_dtype, _INT_COMPUTE if result_dtype == "int32" else set())
        if result_dtype in ("int8", "int32") and ct.name in _INT_COMPUTE:
            pass
        elif ct.name not in allowed:
            raise InvalidArgumentError(
                "options.compute_type",
                f"one of {sorted(allowed) or 'none'} for {result_dtype} operands",
                ct.name,
            )

    precision = None
    if convention is not None and autocast is not None:
        cast = f"{', '.join(autocast)} cast to" if autocast else "operands already in"
        precision = f"{convention.autocast_reason}: {cast} {result_dtype}"
    elif convention is not None and ct is None:
        name, precision = convention.for_result(result_dtype)
        if name is not None and name != _OWN_COMPUTE.get(result_dtype):
            options = dataclasses.replace(options, compute_type=ComputeType[name])

    if spec.real_only and result_dtype in _COMPLEX:
        raise UnsupportedDtypeError(
            "epilog", f"a real dtype for {spec.epilog.name} (activations are not defined on complex)", result_dtype
        )
    if spec.float_only and result_dtype not in _FLOATING:
        raise UnsupportedDtypeError("epilog", f"a floating dtype for {spec.epilog.name}", result_dtype)

    given = set(extra_inputs)
    missing = [n for n in spec.inputs if n not in given]
    unexpected = sorted(given - set(spec.inputs))
    if missing:
        raise EpilogInputError("epilog_inputs", f"{list(spec.inputs)} for {spec.epilog.name}", f"no {missing[0]!r}")
    if unexpected:
        raise EpilogInputError(
            "epilog_inputs",
            f"only {list(spec.inputs) or 'no inputs'} for {spec.epilog.name}",
            f"unexpected {unexpected}",
        )

    shapes = Shapes(result_dtype, tuple(result_shape), tuple(batch), m, n)
    bias_axis = validate_inputs(spec, infos, shapes)
    inputs = tuple((name, ArraySig.of(infos[name])) for name in spec.inputs)

    return MatmulProblem(
        framework=framework,
        device=device,
        a=ArraySig.of(a),
        b=ArraySig.of(b),
        c=c_sig,
        result_dtype=result_dtype,
        batch_shape=batch,
        m=m,
        n=n,
        k=k,
        a_vector=a_vec,
        b_vector=b_vec,
        result_shape=result_shape,
        epilog=spec,
        bias_axis=bias_axis,
        inputs=inputs,
        options=options,
        autograd=any(info.autograd for info in infos.values()),
        precision=precision or None,
        autocast=autocast if precision else None,
        memory=common_memory(infos.values(), framework),
    )
