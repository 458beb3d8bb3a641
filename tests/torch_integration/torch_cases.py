"""Calls of the ``nvdispatch::`` operators the Torch integration tests share: operator arguments for matmul, fft
and convolve over every epilog, transform and layout worth telling apart, on a given device."""

from __future__ import annotations

import torch

from nvdispatch._epilog import EPILOGS

M, K, N = 5, 4, 6
FFT_1D = ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")
FFT_ND = ("fftn", "ifftn", "rfftn", "irfftn")
REAL_INPUT = ("rfft", "ihfft", "rfftn")


def mm_args(
    a, b, c=None, *, bias=None, relu_aux=None, gelu_aux=None, scales=(None, None, None, None), alpha=1.0,
    beta=None, epilog="DEFAULT", options="", preferences="", host_scales="",
):  # fmt: skip
    """The ``nvdispatch::matmul`` argument tuple of a call."""
    return (a, b, c, bias, relu_aux, gelu_aux, *scales, alpha, beta, epilog, options, preferences, host_scales)


def _randn(*shape, dtype=torch.float32, device="cpu", grad=False, seed=0):
    """Standard normal values; complex ones with an imaginary part of their own (a conjugation shows)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    if dtype.is_complex:
        x = torch.complex(x, torch.randn(*shape, generator=g, dtype=torch.float64))
    x = x.to(dtype).to(device)
    return x.requires_grad_(grad) if grad else x


def relu_mask(shape, device="cpu"):
    """A relu mask in the executor format of ``device`` (the CPU executors' boolean mask)."""
    return _randn(*shape, device=device, seed=7) > 0


def matmul_cases(device="cpu", grad=False) -> list[tuple[str, tuple]]:
    """``(id, operator arguments)``: every epilog on a 2-D product, biases along N and M, batched and 1-D
    operands, alpha/beta/c, bgrad_axis, float64/float16/bfloat16/complex64, FP8 with scales and amax."""

    def r(*shape, dtype=torch.float32, seed=0, g=grad):
        return _randn(*shape, dtype=dtype, device=device, grad=g, seed=seed)

    cases = []
    for spec in EPILOGS.values():
        name = spec.epilog.name
        kw = {}
        if "bias" in spec.inputs:
            kw["bias"] = r(N, seed=3)
        if "relu_aux" in spec.inputs:
            kw["relu_aux"] = relu_mask((M, N), device)
        if "gelu_aux" in spec.inputs:
            kw["gelu_aux"] = r(M, N, seed=4)
        cases.append((name, mm_args(r(M, K), r(K, N, seed=1), epilog=name, **kw)))
        if spec.has_bias:
            cases.append((f"{name}-bias-m", mm_args(r(M, K), r(K, N, seed=1), epilog=name, bias=r(M, 1, seed=3))))
            cases.append((f"{name}-batched", mm_args(r(2, M, K), r(K, N, seed=1), epilog=name, bias=r(N, seed=3))))
    cases += [
        ("batched-both", mm_args(r(3, M, K), r(3, K, N, seed=1), epilog="RELU_AUX")),
        ("batched-broadcast", mm_args(r(2, 1, M, K), r(3, K, N, seed=1), epilog="GELU_AUX")),
        ("a-vector", mm_args(r(K), r(2, K, N, seed=1), epilog="RELU_AUX")),
        ("b-vector", mm_args(r(M, K), r(K, seed=1), epilog="BGRADB")),
        ("vectors", mm_args(r(K), r(K, seed=1))),
        ("alpha-beta-c", mm_args(r(M, K), r(K, N, seed=1), r(M, N, seed=2), alpha=2.0, beta=0.5)),
        ("c-broadcast", mm_args(r(2, M, K), r(K, N, seed=1), r(N, seed=2), beta=-1.0, epilog="GELU_BIAS", bias=r(N))),
        ("bgrad-m", mm_args(r(M, K), r(K, N, seed=1), epilog="DRELU_BGRAD", relu_aux=relu_mask((M, N), device),
                            options="(('bgrad_axis', 'm'),)")),
        ("bgrada-batched", mm_args(r(2, M, K), r(2, K, N, seed=1), epilog="BGRADA")),
        ("float64", mm_args(r(M, K, dtype=torch.float64), r(K, N, dtype=torch.float64, seed=1), epilog="RELU_BIAS",
                            bias=r(N, dtype=torch.float64))),
        ("float16-f32-bias", mm_args(r(M, K, dtype=torch.float16), r(K, N, dtype=torch.float16, seed=1),
                                     epilog="BIAS", bias=r(N, dtype=torch.float32))),
        ("bfloat16", mm_args(r(M, K, dtype=torch.bfloat16), r(K, N, dtype=torch.bfloat16, seed=1),
                             epilog="GELU_AUX_BIAS", bias=r(N, dtype=torch.bfloat16))),
        ("complex64", mm_args(r(M, K, dtype=torch.complex64), r(K, N, dtype=torch.complex64, seed=1),
                              r(M, N, dtype=torch.complex64, seed=2), alpha=1 + 2j, beta=0.5)),
        ("mixed-dtypes", mm_args(r(M, K, dtype=torch.float16), r(K, N, seed=1))),
    ]  # fmt: skip
    return cases


def fp8_cases(device="cpu") -> list[tuple[str, tuple]]:
    """FP8 calls (no autograd): scales as numbers and tensors, amax, aux outputs."""
    e4m3 = torch.float8_e4m3fn

    def f8(*shape, seed=0):
        return _randn(*shape, device=device, seed=seed).clamp(-4, 4).to(e4m3)

    scale = torch.tensor(2.0, device=device)
    return [
        ("fp8-relu-amax", mm_args(f8(16, 32), f8(32, 16, seed=1), epilog="RELU", host_scales="(('a', 0.5),)",
                                  scales=(None, None, None, scale),
                                  options="(('result_type', 'float8_e4m3fn'), ('result_amax', True))")),
        ("fp8-bf16-bias-aux", mm_args(f8(16, 32), f8(32, 16, seed=1), epilog="RELU_AUX_BIAS",
                                      bias=_randn(16, device=device, dtype=torch.bfloat16),
                                      options="(('result_type', 'bfloat16'),)")),
        ("fp8-gelu-aux", mm_args(f8(16, 32), f8(32, 16, seed=1), epilog="GELU_AUX",
                                 options="(('result_type', 'float16'),)", scales=(scale, None, None, None))),
    ]  # fmt: skip


def fft_cases(device="cpu", grad=False) -> list[tuple[str, tuple]]:
    """``(id, operator arguments)``: every transform with default, padded and trimmed lengths, both axes, the
    three norms, float32/float64 and complex inputs (real input to the complex transforms too)."""
    cases = []
    for func in FFT_1D:
        dtype = torch.float32 if func in REAL_INPUT else torch.complex64
        for n, axis, norm in ((None, -1, "backward"), (5, 0, "ortho"), (12, -1, "forward")):
            x = _randn(6, 8, dtype=dtype, device=device, grad=grad)
            cases.append((f"{func}-n{n}-axis{axis}-{norm}", (x, func, n, axis, None, None, norm)))
    for func in FFT_ND:
        dtype = torch.float64 if func in REAL_INPUT else torch.complex128
        for s, axes in ((None, None), ([5, 10], [0, 2]), ([7, -1], None), (None, [1])):
            x = _randn(4, 6, 8, dtype=dtype, device=device, grad=grad)
            cases.append((f"{func}-s{s}-axes{axes}", (x, func, None, -1, s, axes, "backward")))
    x = _randn(6, 8, device=device, grad=grad)
    cases.append(("fft-of-real-input", (x, "fft", None, -1, None, None, "backward")))
    cases.append(("irfftn-of-real-input", (x, "irfftn", None, -1, None, None, "ortho")))
    return cases


def convolve_cases(device="cpu", grad=False) -> list[tuple[str, tuple]]:
    """``(id, operator arguments)`` of ``nvdispatch::convolve``: real and complex signals, real and complex
    filters, one filter row or one per row, padding and another axis."""
    real = _randn(4, 16, device=device, grad=grad)
    cplx = _randn(4, 16, dtype=torch.complex64, device=device, grad=grad, seed=1)
    return [
        ("real-x-real-h", (real, _randn(9, device=device, grad=grad, seed=2), None, -1)),
        ("real-x-complex-h-rows", (real, _randn(4, 9, dtype=torch.complex64, device=device, grad=grad), None, -1)),
        ("complex-x-padded", (cplx, _randn(20, dtype=torch.complex64, device=device, grad=grad), 20, -1)),
        ("real-x-axis0", (real, _randn(3, 1, device=device, grad=grad, seed=3), 5, 0)),
    ]
