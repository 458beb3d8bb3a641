"""Torch's float32 matmul precision, as nvdispatch reads and keeps it: per device type, and raised for a call.

Torch decides how a float32 product is computed from global settings: ``torch.set_float32_matmul_precision``
(``"highest"``, ``"high"``, ``"medium"``), the legacy ``torch.backends.cuda.matmul.allow_tf32`` and, since Torch
2.9, ``torch.backends.fp32_precision`` with its per-backend children (``torch.backends.cuda.matmul.fp32_precision``,
``torch.backends.mkldnn.matmul.fp32_precision``: ``"ieee"``, ``"tf32"``, ``"bf16"``; ``"none"`` inherits the
parent's). On CUDA, ``"tf32"`` (``"high"`` and ``"medium"``) runs cuBLAS on TF32 tensor cores; on the CPU,
``"bf16"`` (``"medium"``) runs oneDNN in bfloat16 where the CPU has bfloat16 arithmetic (AVX512-BF16, AMX), and
complex64 products stay in float32 there.

Torch's own ops read these settings when they run. nvdispatch's Torch executor computes with those ops, so a plan
whose compute type asks for more precision than Torch's setting gives now (a caller's ``compute_type``, or a
``Matmul`` planned under another setting) runs under :func:`at_least`, which raises the setting for the call.
It only ever raises it (a thread of the process running Torch's own matmul meanwhile gets at least the precision
it asked for, never less) and gives it back when the last such call ends.
"""

from __future__ import annotations

import functools
import sys
import threading

__all__ = ["backend_of", "fp32_precision", "level", "wanted_level", "at_least", "settled_level", "cpu_bf16"]

#: the precision levels of a float32 product, lowest first; the setting that names each
_LEVEL = {"bf16": 1, "tf32": 2, "ieee": 3}
_SETTING = {1: "bf16", 2: "tf32", 3: "ieee"}
#: the level a compute type needs of Torch (float16 inputs keep TF32's mantissa: Torch's bfloat16 is below it)
_NEEDS = {
    "COMPUTE_32F_FAST_16BF": 1,
    "COMPUTE_32F_FAST_16F": 2,
    "COMPUTE_32F_FAST_TF32": 2,
}


def backend_of(device_kind: str) -> str:
    """The Torch backend whose matmul precision governs float32 products on ``device_kind``."""
    return "cuda" if device_kind == "cuda" else "mkldnn"


def fp32_precision(backend: str) -> str:
    """Torch's float32 matmul precision of ``backend`` (``"cuda"``, ``"mkldnn"``) now: ``"ieee"``, ``"tf32"`` or
    ``"bf16"``, inherited from its parents where unset (``"none"``)."""
    C = sys.modules["torch"]._C
    for b, op in ((backend, "matmul"), (backend, "all"), ("generic", "all")):
        value = C._get_fp32_precision_getter(b, op)
        if value != "none":
            return value
    return "ieee"


@functools.cache
def cpu_bf16() -> bool:
    """Whether Torch's CPU matmul has bfloat16 arithmetic here (oneDNN on AVX512-BF16/AMX; asked once)."""
    torch = sys.modules["torch"]
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def level(device_kind: str) -> int:
    """The precision level (1 bfloat16, 2 TF32, 3 float32) Torch computes float32 products with on
    ``device_kind`` now."""
    value = fp32_precision(backend_of(device_kind))
    if device_kind != "cuda" and (value == "tf32" or (value == "bf16" and not cpu_bf16())):
        return 3  # Torch's CPU matmul has no TF32 ("tf32" computes float32); bfloat16 only where the CPU has it
    return _LEVEL.get(value, 3)


def wanted_level(compute_type: str | None) -> int:
    """The level a float32 product computed with ``compute_type`` (a ``ComputeType`` name; None: the dtype's own,
    float32) needs of Torch."""
    return _NEEDS.get(compute_type, 3) if compute_type is not None else 3


_lock = threading.Lock()
#: backend -> [calls inside, the setting before the first, the level held]
_raised: dict[str, list] = {}
#: counts the raises made (each counted before the setting changes): see :func:`settled_level`
_generation = 0


def settled_level(device_kind: str) -> int:
    """:func:`level`, where no call holds a setting raised (the common case); 0 where one does or began to while it
    was read (then :func:`at_least` reads it under its lock). ``torch.get_float32_matmul_precision()``, one getter,
    is not asked: it refuses to answer where the two APIs were set apart, and answers for both backends at once."""
    if _raised:
        return 0
    generation = _generation
    found = level(device_kind)
    # a setting read while a raise began since is not the caller's
    return found if not _raised and _generation == generation else 0


class _AtLeast:
    """The context :func:`at_least` returns: decides under the lock whether the setting must be raised, so that a
    call never reads a level another call raised and is about to give back."""

    __slots__ = ("_kind", "_want", "_entry")

    def __init__(self, device_kind: str, want: int):
        self._kind, self._want, self._entry = device_kind, want, None

    def __enter__(self) -> None:
        backend = backend_of(self._kind)
        with _lock:
            entry = _raised.get(backend)
            if entry is None:
                if level(self._kind) >= self._want:
                    return
                C = sys.modules["torch"]._C
                entry = _raised[backend] = [0, C._get_fp32_precision_getter(backend, "matmul"), 0]
            if self._want > entry[2]:
                global _generation
                _generation += 1
                sys.modules["torch"]._C._set_fp32_precision_setter(backend, "matmul", _SETTING[self._want])
                entry[2] = self._want
            entry[0] += 1
            self._entry = (backend, entry)

    def __exit__(self, *exc: object) -> None:
        held = self._entry
        if held is None:
            return
        self._entry = None
        backend, entry = held
        with _lock:
            entry[0] -= 1
            if entry[0] == 0:
                sys.modules["torch"]._C._set_fp32_precision_setter(backend, "matmul", entry[1])
                del _raised[backend]


def at_least(device_kind: str, compute_type: str | None) -> _AtLeast:
    """A context in which Torch computes float32 products on ``device_kind`` at least as precisely as
    ``compute_type`` asks: its setting is raised for the call where it is lower when the call starts (and given
    back when the last such call ends); left alone where it is not.

    Examples
    --------
    >>> import torch
    >>> from nvdispatch._adapters.torch_precision import at_least, fp32_precision
    >>> torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    >>> with at_least("cpu", "COMPUTE_32F"):
    ...     inside = fp32_precision("mkldnn")
    >>> inside in ("ieee", "bf16"), fp32_precision("mkldnn")   # "bf16" inside where the CPU has no bfloat16
    (True, 'bf16')
    >>> torch.backends.mkldnn.matmul.fp32_precision = "none"
    """
    return _AtLeast(device_kind, wanted_level(compute_type))
