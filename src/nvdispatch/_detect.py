"""Operand detection: which framework owns an array, on which device, with which dtype/shape/strides.

The answer comes from the framework adapters (:mod:`nvdispatch._adapters`), looked up once per array
class, never importing a framework just to ask.
"""

from __future__ import annotations

from typing import Any

from ._adapters import CPU, Device, OperandInfo, adapter_for, framework_names
from .errors import MixedOperandsError, UnsupportedOperandError, describe

__all__ = ["Device", "OperandInfo", "detect", "common_placement", "CPU"]


def detect(name: str, x: Any) -> OperandInfo:
    """Describe operand ``x`` (called ``name`` in error messages).

    Raises
    ------
    UnsupportedOperandError
        When ``x`` is no array any framework or protocol recognises.
    """
    ad = adapter_for(x)
    if ad is not None:
        return ad.info(name, x)
    hint = (
        "wrap it with numpy.asarray (or the array constructor of your framework)"
        if isinstance(x, (list, tuple, int, float, complex))
        else ""
    )
    raise UnsupportedOperandError(name, f"an array of a registered framework ({framework_names()})", describe(x), hint)


def common_placement(infos: dict[str, OperandInfo]) -> tuple[str, Device]:
    """The one framework and device shared by all operands in ``infos``; a typed error naming both otherwise."""
    if not infos:
        raise UnsupportedOperandError("operands", "at least one array", "none (every operand was None)")
    first_name, first = next(iter(infos.items()))
    for name, info in infos.items():
        if info.framework != first.framework:
            raise MixedOperandsError(
                name,
                f"an array of the same framework as {first_name} ({first.framework})",
                f"a {info.framework} array",
                "convert one of them, or use set_backend(..., coerce=True)",
            )
        if info.device != first.device and None not in (info.device.index, first.device.index):
            raise MixedOperandsError(
                name, f"an array on the same device as {first_name} ({first.device})", f"one on {info.device}"
            )
        if info.device.kind != first.device.kind:
            raise MixedOperandsError(
                name, f"an array on the same device as {first_name} ({first.device})", f"one on {info.device}"
            )
    return first.framework, first.device
