"""The FP8 formats: their dtype names and ranges, the result types an FP8 matmul may ask for, and the checks of the
matmul options naming them (``options.result_type``, ``options.operand_types``). What an FP8 call is and how it is
validated: :mod:`nvdispatch._fp8`."""

from __future__ import annotations

from .errors import InvalidArgumentError

__all__ = ["FP8_DTYPES", "FP8_MAX", "RESULT_TYPES", "is_fp8", "check_result_type", "check_operand_types"]

#: largest finite value of each FP8 format (results saturate to it)
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
FP8_DTYPES = tuple(FP8_MAX)
RESULT_TYPES = ("float8_e4m3fn", "float8_e5m2", "bfloat16", "float16", "float32")


def is_fp8(dtype: str) -> bool:
    return dtype in FP8_MAX


def check_result_type(value) -> str | None:
    """Normalise ``options.result_type`` (a dtype name, NumPy/Torch dtype) or raise."""
    if value is None:
        return None
    name = str(value).removeprefix("torch.")
    if not isinstance(value, str):
        name = getattr(value, "name", name)
    if name not in RESULT_TYPES:
        raise InvalidArgumentError("options.result_type", f"one of {RESULT_TYPES}", repr(value))
    return name


def check_operand_types(value) -> tuple[tuple[str, str], ...] | None:
    """Normalise ``options.operand_types`` ({"a"/"b": FP8 dtype name}) to a hashable tuple, or raise."""
    if value is None:
        return None
    items = value.items() if isinstance(value, dict) else value
    try:
        pairs = tuple((str(k), str(v).removeprefix("torch.")) for k, v in items)
    except (TypeError, ValueError):
        raise InvalidArgumentError("options.operand_types", "a dict like {'a': 'float8_e4m3fn'}", repr(value)) from None
    for k, v in pairs:
        if k not in ("a", "b"):
            raise InvalidArgumentError("options.operand_types", "keys 'a' and/or 'b'", repr(k))
        if v not in FP8_DTYPES:
            raise InvalidArgumentError(f"options.operand_types[{k!r}]", f"one of {FP8_DTYPES}", repr(v))
    return tuple(sorted(pairs))
