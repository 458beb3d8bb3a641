"""A float64 emulation of an FP8 matmul, written here independently of the library: dequantise the FP8
operands (exact in float64), multiply, scale, add c and bias, apply the activation, take amax, scale by d,
saturate to the FP8 range. Rounding to the result type is left to the comparison (:func:`assert_matches`),
which allows one unit in the last place of the result type plus float32 accumulation error."""

from __future__ import annotations

import math

import numpy as np

FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
#: one unit in the last place, relative (2 ** -mantissa bits), and the smallest subnormal
ULP = {
    "float8_e4m3fn": (2.0**-3, 2.0**-9),
    "float8_e5m2": (2.0**-2, 2.0**-16),
    "bfloat16": (2.0**-7, 2.0**-133),
    "float16": (2.0**-10, 2.0**-24),
    "float32": (2.0**-20, 2.0**-149),
}


def f64(x) -> np.ndarray:
    """A Torch tensor (any dtype, FP8 included) as a float64 NumPy array."""
    import torch

    return x.detach().cpu().to(dtype=torch.float32).numpy().astype(np.float64)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def emulate(a, b, *, alpha=1.0, scales=None, c=None, beta=1.0, bias=None, epilog="DEFAULT", result_type="float32"):
    """(t, amax, d_unrounded, abs_sum): the pre-scale result ``t``, its amax, ``scale_d * t`` saturated for FP8
    results (not rounded), and ``|alpha sa sb| |a| @ |b|`` (for the accumulation tolerance)."""
    scales = {
        k: float(np.asarray(f64(v) if hasattr(v, "detach") else v).reshape(())) for k, v in (scales or {}).items()
    }
    A, B = f64(a), f64(b)
    factor = alpha * scales.get("a", 1.0) * scales.get("b", 1.0)
    t = factor * (A @ B)
    abs_sum = abs(factor) * (np.abs(A) @ np.abs(B))
    if c is not None:
        t = t + beta * scales.get("c", 1.0) * f64(c)
    if bias is not None:
        bb = f64(bias)
        t = t + (bb.reshape(1, -1) if bb.ndim == 1 else bb)
    pre = t
    if "RELU" in epilog:
        t = np.maximum(t, 0.0)
    elif "GELU" in epilog:
        t = gelu_tanh(t)
    amax = float(np.max(np.abs(t))) if t.size else 0.0
    d = t
    if result_type in FP8_MAX:
        d = np.clip(t * scales.get("d", 1.0), -FP8_MAX[result_type], FP8_MAX[result_type])
    return t, amax, d, abs_sum, pre


#: accumulation error allowance relative to sum |a||b|: float32 (CPU reference), and Hopper's FP8 tensor
#: cores, which accumulate with fewer bits than float32 between cuBLASLt's promotions (measured on the H200:
#: up to ~2**-14; a layout or scale mistake gives errors of order 1)
ACC_FP32 = 64 * 2.0**-24
ACC_FP8_TENSOR_CORES = 2.0**-12
#: ... and in the fast accumulation mode, which never promotes partial sums (measured on the H200: past 2**-12
#: on 3 of 131072 elements of a K = 1024 product)
ACC_FP8_FAST = 2.0**-10


def assert_matches(
    result, want: np.ndarray, abs_sum: np.ndarray, result_type: str, extra_scale: float = 1.0, acc_eps: float = ACC_FP32
):
    """``result`` (a tensor of ``result_type``) equals ``want`` up to one ulp of the result type and the
    accumulation error of the product (``abs_sum * acc_eps``, times ``extra_scale``)."""
    got = f64(result)
    assert got.shape == want.shape, (got.shape, want.shape)
    rel, tiny = ULP[result_type]
    acc = acc_eps * abs_sum * extra_scale
    bound = rel * np.abs(want) + tiny + acc * (1 + rel)
    err = np.abs(got - want)
    bad = ~(err <= bound)
    assert not bad.any(), (
        f"{int(bad.sum())} of {bad.size} elements off (worst {float(np.max(err - bound)):.3g} beyond the bound); "
        f"first: got {got[bad][:4]}, want {want[bad][:4]}"
    )
