"""FP8 matmul, validated once: dtypes, result types, per-tensor quantization scales and amax.

An FP8 matmul computes, with ``a`` and ``b`` stored as ``float8_e4m3fn``/``float8_e5m2``::

    t   = epilog(alpha * scale_a * scale_b * (a @ b) + beta * scale_c * c + bias)   # in float32
    amax = max(|t|)                     # options={"result_amax": True}: returned as aux["result_amax"]
    d   = quantise(scale_d * t)         # FP8 results: scaled, saturated to the format's range, rounded

(cuBLASLt's FP8 semantics; the ``"cuda"`` executor runs it on FP8 tensor cores, the Torch executor's
reference path — :mod:`nvdispatch._fp8_reference` — anywhere else.)

Rules (those of cuBLASLt on Hopper and Ada, so every executor takes the same calls):

* ``a`` and ``b`` are both FP8; ``float8_e5m2 x float8_e5m2`` is not allowed.
* ``options={"result_type": ...}``: ``float8_e4m3fn`` (default: ``a``'s type), ``float8_e5m2`` (only when one
  operand is e5m2), ``bfloat16``, ``float16`` or ``float32``.
* ``c`` (optional) and ``bias`` have the *companion type*: the result type for bf16/fp16 results, ``float32``
  c with a ``bfloat16`` bias for fp32 results, and ``bfloat16`` (or ``float16``) c/bias for FP8 results.
* ``quantization_scales={"a": ..., "b": ..., "c": ..., "d": ...}`` (a dict or :class:`MatmulQuantizationScales`),
  each a Python number or a one-element ``float32`` array on the operands' device; missing ones are 1. ``d``
  only for FP8 results; ``c`` only as a Python number (cuBLASLt scales only FP8 matrices on the device).
  Numbers must be finite and non-zero; device scales are not read (that would synchronise the host).
* ``result_amax`` only for FP8 results.
* ``options={"fast_accumulation": True}``: cuBLASLt's fast FP8 accumulation (faster, less precise; the
  reference path accumulates in float32 regardless).

CuPy and raw ``__cuda_array_interface__`` operands have no FP8 dtype: pass their bytes as ``uint8`` arrays and
say what they hold with ``options={"operand_types": {"a": "float8_e4m3fn", "b": "float8_e4m3fn"}}``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

from ._detect import OperandInfo, detect
from ._fp8_types import FP8_DTYPES, RESULT_TYPES, is_fp8
from ._matmul_problem import ArraySig, build_problem
from .errors import (
    EpilogInputError,
    InvalidArgumentError,
    MixedOperandsError,
    ShapeMismatchError,
    UnsupportedDtypeError,
    describe,
)

__all__ = [
    "MatmulQuantizationScales",
    "Fp8Spec",
    "build_fp8_problem",
    "scale_values",
]

#: epilogs cuBLASLt fuses into FP8 matmuls (forward ones; backward epilogs take no FP8 operands)
FP8_EPILOGS = (
    "DEFAULT",
    "RELU",
    "RELU_AUX",
    "BIAS",
    "RELU_BIAS",
    "RELU_AUX_BIAS",
    "GELU",
    "GELU_AUX",
    "GELU_BIAS",
    "GELU_AUX_BIAS",
)
_SCALE_NAMES = ("a", "b", "c", "d")


@dataclass(frozen=True)
class MatmulQuantizationScales:
    """Per-tensor quantization scales of an FP8 matmul (nvmath-python's ``MatmulQuantizationScales``).

    Each is a Python number or a one-element ``float32`` array (shape ``()`` or ``(1,)``) on the operands'
    device; ``None`` means 1.

    Examples
    --------
    >>> from nvdispatch import MatmulQuantizationScales
    >>> MatmulQuantizationScales(a=0.5, b=2.0).d is None
    True
    """

    a: Any = None
    b: Any = None
    c: Any = None
    d: Any = None


@dataclass(frozen=True)
class Fp8Spec:
    """The FP8 part of a matmul problem (hashable: part of the plan key; scale *values* are not)."""

    a_type: str
    b_type: str
    result_type: str
    #: dtype of c, of the bias and of the float32 -> result step before quantisation ("companion type")
    c_type: str
    bias_type: str
    #: (name, "host" | "device") of every scale given
    scales: tuple[tuple[str, str], ...]
    amax: bool
    #: operands given as uint8 storage whose FP8 type was declared in options.operand_types
    storage: tuple[str, ...] = ()
    #: options.fast_accumulation: cuBLASLt's fast FP8 accumulation mode
    fast_accum: bool = False

    def scale_kind(self, name: str) -> str | None:
        return dict(self.scales).get(name)

    @property
    def fp8_result(self) -> bool:
        return is_fp8(self.result_type)

    def describe(self) -> str:
        scales = ", ".join(f"{n}: {k}" for n, k in self.scales) or "none"
        return (
            f"FP8 {self.a_type} x {self.b_type} -> {self.result_type} (c/bias {self.c_type}/{self.bias_type}; "
            f"scales {scales}{'; amax' if self.amax else ''}{'; fast accumulation' if self.fast_accum else ''})"
        )


def wants_fp8(infos: dict[str, OperandInfo], options, scales) -> bool:
    """Whether a call is an FP8 matmul (or asks for FP8-only features, which then get a clear error)."""
    return (
        scales is not None
        or getattr(options, "result_type", None) is not None
        or getattr(options, "result_amax", False)
        or getattr(options, "fast_accumulation", False)
        or getattr(options, "operand_types", None) is not None
        or is_fp8(infos["a"].dtype)
        or is_fp8(infos["b"].dtype)
    )


# -- scales ---------------------------------------------------------------------------------------------
def _scales_dict(scales) -> dict[str, Any]:
    if scales is None:
        return {}
    if isinstance(scales, MatmulQuantizationScales):
        # the scales themselves: dataclasses.asdict would deep-copy every device tensor on every call
        return {k: v for k in _SCALE_NAMES if (v := getattr(scales, k)) is not None}
    if not isinstance(scales, dict):
        raise InvalidArgumentError(
            "quantization_scales",
            "a dict with keys among 'a', 'b', 'c', 'd' or a MatmulQuantizationScales",
            describe(scales),
        )
    unknown = sorted(set(scales) - set(_SCALE_NAMES))
    if unknown:
        raise InvalidArgumentError("quantization_scales", "keys among 'a', 'b', 'c', 'd'", f"unknown key(s) {unknown}")
    return {k: v for k, v in scales.items() if v is not None}


def _scale_kind(name: str, value, framework: str, device) -> str:
    arg = f"quantization_scales[{name!r}]"
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        v = float(value)
        if not math.isfinite(v) or v == 0:
            raise InvalidArgumentError(arg, "a finite, non-zero scale", repr(value))
        return "host"
    if isinstance(value, bool) or not (hasattr(value, "shape") and hasattr(value, "dtype")):
        raise InvalidArgumentError(arg, "a Python number or a one-element float32 array", describe(value))
    info = detect(arg, value)
    if tuple(info.shape) not in ((), (1,)):
        raise ShapeMismatchError(arg, "a one-element array of shape () or (1,)", f"shape {tuple(info.shape)}")
    if info.dtype != "float32":
        raise UnsupportedDtypeError(arg, "float32 (cuBLASLt's FP8 scale type)", info.dtype)
    if (
        info.framework != framework
        or info.device.kind != device.kind
        or (None not in (info.device.index, device.index) and info.device.index != device.index)
    ):
        raise MixedOperandsError(
            arg, f"a {framework} array on {device} (the operands' device)", f"a {info.framework} array on {info.device}"
        )
    if info.device.kind == "cpu":  # reading a host array costs nothing: check its value too
        v = float(value.reshape(()).item()) if hasattr(value, "reshape") else float(value)
        if not math.isfinite(v) or v == 0:
            raise InvalidArgumentError(arg, "a finite, non-zero scale", repr(v))
    return "device"


def scale_values(scales) -> dict[str, Any]:
    """The per-call scale values (already validated at planning) keyed by "a".."d"."""
    return _scales_dict(scales)


# -- the problem ----------------------------------------------------------------------------------------
def _companion(result: str, c_dtype: str | None, bias_dtype: str | None) -> tuple[str, str]:
    """(c type, bias type) cuBLASLt pairs with ``result``."""
    if result in ("bfloat16", "float16"):
        return result, result
    if result == "float32":
        return "float32", "bfloat16"
    # FP8 result: C and bias are bfloat16, or float16 when the caller gives float16 ones
    c_type = "float16" if (c_dtype == "float16" or (c_dtype is None and bias_dtype == "float16")) else "bfloat16"
    return c_type, c_type


def build_fp8_problem(framework, device, infos, spec, options, alpha, beta, extra_inputs, scales):
    """Validate an FP8 matmul call and describe it as a :class:`~nvdispatch._matmul_problem.MatmulProblem`
    whose ``quantization`` is an :class:`Fp8Spec` (``result_dtype`` is the result type)."""
    declared = dict(getattr(options, "operand_types", None) or ())
    types, storage = {}, []
    for name in ("a", "b"):
        info = infos[name]
        if name in declared:
            if info.dtype not in ("uint8", declared[name]):
                raise UnsupportedDtypeError(
                    name, f"uint8 storage (or {declared[name]}) for the declared {declared[name]}", info.dtype
                )
            types[name] = declared[name]
            if info.dtype == "uint8":
                storage.append(name)
        else:
            types[name] = info.dtype
    a_type, b_type = types["a"], types["b"]
    if not is_fp8(a_type) and not is_fp8(b_type):
        what = "quantization_scales" if scales is not None else "options"
        raise UnsupportedDtypeError(
            what,
            f"FP8 operands ({' or '.join(FP8_DTYPES)}) for FP8 options and quantization scales",
            f"a {a_type} and b {b_type}",
            "result_type, result_amax, fast_accumulation, operand_types and quantization_scales apply to FP8 "
            "matmuls",
        )
    for name, t in (("a", a_type), ("b", b_type)):
        if not is_fp8(t):
            other = "b" if name == "a" else "a"
            raise UnsupportedDtypeError(
                name, f"an FP8 dtype like {other} ({' or '.join(FP8_DTYPES)}; cuBLASLt mixes no FP8 with {t})", t
            )
    if a_type == b_type == "float8_e5m2":
        raise UnsupportedDtypeError("b", "float8_e4m3fn when a is float8_e5m2 (no e5m2 x e5m2 FP8 kernel)", b_type)
    if spec.epilog.name not in FP8_EPILOGS:
        raise UnsupportedDtypeError(
            "epilog", f"one of {FP8_EPILOGS} for FP8 operands (backward epilogs take no FP8)", spec.epilog.name
        )
    ct = getattr(options, "compute_type", None)
    if ct is not None and ct.name != "COMPUTE_32F":
        raise InvalidArgumentError("options.compute_type", "COMPUTE_32F (or None) for FP8 operands", ct.name)
    if getattr(options, "scale_type", None) not in (None, "float32"):
        raise InvalidArgumentError("options.scale_type", "float32 (or None) for FP8 operands", options.scale_type)

    c_info = infos.get("c")
    bias_info = infos.get("bias")
    result = getattr(options, "result_type", None)
    if result is None:  # nvmath's default: c's type when c is given, else a's
        result = c_info.dtype if c_info is not None and c_info.dtype in RESULT_TYPES else a_type
    if result == "float8_e5m2" and "float8_e5m2" not in (a_type, b_type):
        raise UnsupportedDtypeError(
            "options.result_type", "float8_e4m3fn, bfloat16, float16 or float32 for e4m3 x e4m3 operands", result
        )
    c_type, bias_type = _companion(result, c_info.dtype if c_info else None, bias_info.dtype if bias_info else None)
    if c_info is not None and c_info.dtype != c_type:
        allowed = "bfloat16 or float16" if is_fp8(result) else c_type
        raise UnsupportedDtypeError("c", f"{allowed} for an FP8 matmul with a {result} result", c_info.dtype)
    if bias_info is not None and bias_info.dtype != bias_type:
        raise EpilogInputError(
            "epilog_inputs['bias']", f"dtype {bias_type} (cuBLASLt's bias type for a {result} result)", bias_info.dtype
        )
    amax = bool(getattr(options, "result_amax", False))
    if amax and not is_fp8(result):
        raise InvalidArgumentError(
            "options.result_amax", "True only with an FP8 result_type (amax drives the next FP8 scale)", result
        )

    values = _scales_dict(scales)
    kinds = []
    for name in _SCALE_NAMES:
        if name not in values:
            continue
        if name == "d" and not is_fp8(result):
            raise InvalidArgumentError(
                "quantization_scales['d']", "no d scale unless the result is FP8 (scales apply to FP8 matrices)", result
            )
        if name == "c" and c_info is None:
            raise InvalidArgumentError("quantization_scales['c']", "no c scale when c is not given", "a c scale")
        kind = _scale_kind(name, values[name], framework, device)
        if name == "c" and kind == "device":
            raise InvalidArgumentError(
                "quantization_scales['c']",
                f"a Python number (c is {c_type}; device scales apply to FP8 matrices)",
                "a device array",
            )
        kinds.append((name, kind))

    # shapes, scalars and epilog inputs as for any matmul: run the common checks on companion-typed stand-ins
    stand_in = dict(infos)
    for name in ("a", "b", "bias"):
        if name in stand_in:
            stand_in[name] = dataclasses.replace(stand_in[name], dtype=c_type)
    opts = options
    if ct is not None or getattr(options, "scale_type", None) is not None:
        opts = dataclasses.replace(options, compute_type=None, scale_type=None)
    problem = build_problem(framework, device, stand_in, spec, opts, alpha, beta, extra_inputs)
    inputs = tuple((n, ArraySig.of(infos[n])) for n, _ in problem.inputs)
    fast = bool(getattr(options, "fast_accumulation", False))
    fp8 = Fp8Spec(a_type, b_type, result, c_type, bias_type, tuple(kinds), amax, tuple(storage), fast)
    return dataclasses.replace(
        problem,
        a=ArraySig(a_type, infos["a"].shape, infos["a"].strides),
        b=ArraySig(b_type, infos["b"].shape, infos["b"].strides),
        result_dtype=result,
        inputs=inputs,
        quantization=fp8,
    )
