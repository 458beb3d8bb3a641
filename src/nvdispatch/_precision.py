"""Precision conventions: what a framework's own settings ask of a matmul whose caller gives no ``compute_type``.

Frameworks decide the precision of a product from global settings their users rely on: Torch's
``torch.backends.cuda.matmul.allow_tf32`` (``torch.set_float32_matmul_precision``) and its ``torch.autocast``
regions, JAX's ``jax_default_matmul_precision``, CuPy's ``CUPY_TF32``. Each framework's adapter reads its own
settings (only adapters know frameworks) and reports them as a :class:`PrecisionConvention`
(``Adapter.precision_convention(device)``); the matmul problem builder turns that into the call's compute type
and the route casts operands where an autocast region asks for it. Each adapter also gives a cheap reading of
those settings (``Adapter.precision_key``) that every call key of its arrays holds, so the call after a setting
changed finds another plan. An explicit ``options.compute_type`` always wins: the convention is then not read.

This module holds what is common to every framework: the convention an adapter reports and the autocast rules
(which operands of a matmul a region casts: the route's calls, the stateful ``Matmul`` and the Torch operators'
autocast kernels all apply this one rule; and what a region casts for a transform, where the framework's own FFTs
follow regions: the eager transforms, ``fft.convolve`` and the FFT operators' autocast kernels apply that one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "PrecisionConvention",
    "AUTOCAST_DTYPES",
    "GOVERNED_BY_FLOAT32",
    "FFT_AUTOCAST",
    "FILTER_AUTOCAST",
    "autocast_targets",
    "fft_autocast_target",
]

#: the dtypes an autocast region casts (Torch's rule: floating point, not float64)
AUTOCAST_DTYPES = frozenset({"float16", "bfloat16", "float32"})
#: result dtypes whose compute type a convention's ``float32`` entry governs (TF32 and its kin)
GOVERNED_BY_FLOAT32 = frozenset({"float32", "complex64"})
#: what a region casts for a transform where the framework's FFTs follow regions (Torch's float32 cast policy, which
#: its CPU autocast applies to every ``torch.fft`` transform): half-precision real input computed in float32. Other
#: dtypes stay: float32 is the target already, float64 is never autocast, and complex32 is not the "floating point"
#: autocast casts (Torch leaves it as it is)
FFT_AUTOCAST = {"float16": "float32", "bfloat16": "float32"}
#: what a region casts for ``fft.convolve``'s filter spectrum ``h``: in the composition ``irfft(rfft(x) * h)`` of
#: Torch's own ops, the product with the float32-computed spectrum promotes a half-precision ``h`` to it
FILTER_AUTOCAST = {**FFT_AUTOCAST, "complex32": "complex64"}


@dataclass(frozen=True)
class PrecisionConvention:
    """What a framework's settings ask of a matmul on one device, now.

    Attributes
    ----------
    float32 : str or None
        The compute type (a ``ComputeType`` name) asked of float32 and complex64 products, e.g.
        ``"COMPUTE_32F_FAST_TF32"``; None: nothing beyond their own (``COMPUTE_32F``).
    reason : str
        The setting that decided ``float32``, as ``explain()`` says it (``"Torch allow_tf32=True"``).
    autocast : str or None
        The dtype an active autocast region computes products in (Torch's ``torch.autocast``), else None.
    autocast_reason : str
        The region, as ``explain()`` says it (``"Torch autocast('cuda', bfloat16)"``).
    governs : frozenset of str
        The result dtypes ``float32`` applies to (float32 and complex64; Torch's CPU setting: float32 only).
    fft_autocast : bool
        Whether the region (``autocast``) also applies to the framework's own FFTs on this device, which then
        compute half-precision input in float32 (:data:`FFT_AUTOCAST`). Torch: on the CPU (its autocast lists every
        ``torch.fft`` transform under its float32 policy); not on CUDA, where its FFTs ignore regions.
    """

    float32: str | None = None
    reason: str = ""
    autocast: str | None = None
    autocast_reason: str = ""
    governs: frozenset[str] = GOVERNED_BY_FLOAT32
    fft_autocast: bool = False

    def for_result(self, result_dtype: str) -> tuple[str | None, str | None]:
        """``(compute type name or None, why)`` for a product with a ``result_dtype`` result (after any autocast
        cast): the compute type asked (None: the dtype's own) and the reason ``explain()`` gives; ``why`` is None
        where the convention says nothing of that dtype."""
        if result_dtype in self.governs:
            return self.float32, self.reason
        return None, None


def autocast_targets(autocast: str | None, dtypes: Mapping[str, str]) -> dict[str, str] | None:
    """Torch autocast's rule for a matmul, by operand name (``a``, ``b``, ``c``, ``bias``, ``relu_aux``,
    ``gelu_aux``) and dtype name: ``{name: dtype}`` of the operands to cast, as ``torch.matmul``, ``torch.addmm``
    and ``F.linear`` cast theirs in a region computing in ``autocast``; None where the region does not apply.

    It applies when both factors are floating point but not float64 (float16, bfloat16, float32); then every such
    operand (``c``, the bias and a GELU pre-activation too) is cast to ``autocast`` (those already in it stay),
    while float64 operands, boolean/bit masks, integers and complex numbers are left as they are. Torch raises for
    a float64 factor beside a cast one; here a call with a float64 factor is not autocast at all (it computes in
    float64).

    Examples
    --------
    >>> autocast_targets("bfloat16", {"a": "float32", "b": "float32", "bias": "float32", "relu_aux": "uint8"})
    {'a': 'bfloat16', 'b': 'bfloat16', 'bias': 'bfloat16'}
    >>> autocast_targets("bfloat16", {"a": "float64", "b": "float64"}) is None
    True
    """
    if autocast is None or dtypes.get("a") not in AUTOCAST_DTYPES or dtypes.get("b") not in AUTOCAST_DTYPES:
        return None
    return {name: autocast for name, dt in dtypes.items() if dt in AUTOCAST_DTYPES and dt != autocast}


def fft_autocast_target(convention: PrecisionConvention | None, dtype: str, rule: Mapping[str, str] = FFT_AUTOCAST):
    """The dtype a transform's operand of ``dtype`` is cast to first in the autocast region ``convention`` reports,
    where the framework's FFTs follow it (``convention.fft_autocast``); None: it is transformed as it is. ``rule``:
    :data:`FFT_AUTOCAST` (a transform's operand), :data:`FILTER_AUTOCAST` (``fft.convolve``'s filter).

    Examples
    --------
    >>> region = PrecisionConvention(autocast="bfloat16", fft_autocast=True)
    >>> fft_autocast_target(region, "float16"), fft_autocast_target(region, "float32")
    ('float32', None)
    >>> fft_autocast_target(PrecisionConvention(autocast="bfloat16"), "float16") is None  # FFTs ignore it there
    True
    """
    if convention is None or not convention.fft_autocast or convention.autocast is None:
        return None
    return rule.get(dtype)
