"""The ``nvdispatch::`` Torch operators: ``torch.library.opcheck`` on every operator (schema, autograd registration,
fake tensor against the real kernel, AOT dispatch with dynamic shapes), and their fake kernels against their real
kernels (shapes, dtypes, strides, storage offsets) over every epilog, transform and layout of ``torch_cases``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from nvdispatch.integrations import torch_ops  # noqa: E402  (registers the operators)

from .torch_cases import convolve_cases, fft_cases, fp8_cases, matmul_cases  # noqa: E402

OPS = {"matmul": torch_ops.matmul_op, "fft": torch_ops.fft_op, "convolve": torch_ops.convolve_op}
#: the fake kernel against the real one (CrossRefFakeMode: sizes, strides, storage offset, dtype, aliasing)
FAKE_ONLY = ("test_schema", "test_faketensor")


def _ids(cases):
    return [name for name, _ in cases]


@pytest.mark.parametrize("args", [a for _, a in matmul_cases()], ids=_ids(matmul_cases()))
def test_matmul_fake_kernel_matches_the_real_one(args):
    torch.library.opcheck(OPS["matmul"], args, test_utils=FAKE_ONLY)


@pytest.mark.parametrize("args", [a for _, a in fp8_cases()], ids=_ids(fp8_cases()))
def test_fp8_matmul_passes_opcheck(args):
    # opcheck's schema test compares inputs with allclose, which Torch has no float8 kernel for: the same check
    # (inputs unchanged, outputs aliasing none of them) is made on the bytes here
    torch.library.opcheck(OPS["matmul"], args, test_utils=("test_autograd_registration", "test_faketensor",
                                                           "test_aot_dispatch_dynamic"))  # fmt: skip
    tensors = [x for x in args if isinstance(x, torch.Tensor)]
    before = [x.view(torch.uint8).clone() if x.element_size() == 1 else x.clone() for x in tensors]
    outs = OPS["matmul"](*args)
    for x, b in zip(tensors, before):
        assert torch.equal(x.view(torch.uint8) if x.element_size() == 1 else x, b)
    storages = {x.untyped_storage().data_ptr() for x in tensors}
    assert not any(o.untyped_storage().data_ptr() in storages for o in outs)


@pytest.mark.parametrize("args", [a for _, a in fft_cases()], ids=_ids(fft_cases()))
def test_fft_fake_kernel_matches_the_real_one(args):
    torch.library.opcheck(OPS["fft"], args, test_utils=FAKE_ONLY)


_FULL = [c for c in matmul_cases(grad=True) if c[0] in (
    "RELU_BIAS", "GELU_AUX_BIAS-bias-m", "BIAS-batched", "DRELU_BGRAD", "DGELU", "BGRADA", "BGRADB", "RELU_AUX",
    "alpha-beta-c", "a-vector", "b-vector", "complex64", "float16-f32-bias",
)]  # fmt: skip


@pytest.mark.parametrize("args", [a for _, a in _FULL], ids=_ids(_FULL))
def test_matmul_passes_opcheck(args):
    torch.library.opcheck(OPS["matmul"], args)


_FFT_FULL = [c for c in fft_cases(grad=True) if c[0].endswith(("-n5-axis0-ortho", "-s[5, 10]-axes[0, 2]"))]


@pytest.mark.parametrize("args", [a for _, a in _FFT_FULL], ids=_ids(_FFT_FULL))
def test_fft_passes_opcheck(args):
    torch.library.opcheck(OPS["fft"], args)


@pytest.mark.parametrize(("func", "dtype"), [("ifft", torch.float64), ("fft", torch.float64), ("hfft", torch.complex128),
                                           ("ihfft", torch.float64), ("ifftn", torch.float64)])  # fmt: skip
def test_transforms_torch_conjugates_lazily_pass_opcheck(func, dtype):
    # torch.fft returns conjugate views (ifft of real input, ihfft) or conjugates its input lazily (hfft): the
    # operator's output is a plain tensor (as its fake kernel says), right below functionalization too
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 2, generator=g, dtype=torch.float64)
    x = (torch.view_as_complex(x) if dtype.is_complex else x[..., 0].contiguous()).requires_grad_()
    one_d = func in ("ifft", "fft", "hfft", "ihfft")
    torch.library.opcheck(OPS["fft"], (x, func, None, -1, None, [0, 1] if not one_d else None, "ortho"))


@pytest.mark.parametrize("args", [a for _, a in convolve_cases(grad=True)], ids=_ids(convolve_cases()))
def test_convolve_passes_opcheck(args):
    torch.library.opcheck(OPS["convolve"], args)


def test_operators_are_functional_and_documented():
    for name, op in OPS.items():
        schema = op._schema
        assert str(schema.name) == f"nvdispatch::{name}"
        assert not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def test_autocast_rules_follow_torchs_own():
    # in a process of its own: the operators' autocast kernels are installed with them, on import
    code = textwrap.dedent(
        """
        import torch
        from nvdispatch.integrations import torch_ops

        a, b, bias = torch.randn(8, 4), torch.randn(4, 6), torch.randn(6)

        def f(a, b, bias):
            return torch_ops.matmul_op(a, b, None, bias, *[None] * 6, 1, None, "RELU_BIAS", "", "", "")[0]

        assert f(a, b, bias).dtype == torch.float32  # outside a region: as given
        with torch.autocast("cpu", dtype=torch.bfloat16):
            eager = f(a, b, bias)
            compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(a, b, bias)
            spectrum = torch_ops.fft_op(a.to(torch.bfloat16), "rfft", None, -1, None, None, "backward")
            own = torch.relu(torch.addmm(bias, a, b))
        assert eager.dtype == compiled.dtype == own.dtype == torch.bfloat16, (eager.dtype, compiled.dtype)
        assert spectrum.dtype == torch.complex64
        torch.testing.assert_close(eager.float(), own.float(), rtol=2e-2, atol=2e-2)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("n", [6, 8, 13, 128, 130])
def test_cublaslt_relu_bits_come_out_with_zero_padding_whatever_memory_held(n):
    # cuBLASLt writes the bits of columns < n only: the rest of its (m, ceil128(n)/8) buffer is what the allocator
    # handed out, and the operator's outputs must not depend on it (eager and traced calls compare them bitwise)
    from types import SimpleNamespace

    from nvdispatch._adapters.torch import TorchDeviceOps
    from nvdispatch._cuda.lt_layout import relu_aux_ld_bits
    from nvdispatch.integrations import torch_layouts

    m, ld = 5, relu_aux_ld_bits(n)
    mask = torch.rand(m, n, generator=torch.Generator().manual_seed(n)) > 0.5
    ops = TorchDeviceOps()
    clean = ops.pack_mask(mask, ld)
    garbage = torch.randint(0, 256, clean.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    valid = ops.pack_mask(torch.ones(m, n, dtype=torch.bool), ld)
    dirty = clean | (garbage & ~valid)
    assert n % 128 == 0 or not torch.equal(dirty, clean)
    spec = torch_layouts.OutputSpec("relu_aux", tuple(clean.shape), "uint8", "mask")
    got = torch_layouts.conform(dirty.clone(), spec, SimpleNamespace(n=n, m=m))
    assert torch.equal(got, clean)
    assert torch.equal(ops.unpack_mask(got, n), mask)


def _transposed(x):
    """``x``'s values in a transposed layout (first and last axes swapped in memory): a strided view."""
    return x.transpose(0, -1).contiguous().transpose(0, -1) if x.dim() > 1 else x


def _public_fft(x, func, n, axis, s, axes, norm):
    import nvdispatch.fft as F

    one_d = func in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")
    return getattr(F, func)(x, n, axis, norm) if one_d else getattr(F, func)(x, s, axes, norm)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_the_public_functions_give_the_operators_layout(layout):
    """An eager call of the public function, one through the operator (what autograd records and torch.compile
    traces) and one compiled give the same tensor: values, shape, dtype and C-contiguous strides (the fake
    kernel's). torch.fft would give a strided result along a leading axis or of a transposed tensor (torch.matmul
    a contiguous one), laid out after the device and build (MKL, pocketfft, cuFFT): no layout to promise."""
    import nvdispatch
    import nvdispatch.fft as F

    lay = _transposed if layout == "transposed" else (lambda x: x)
    for name, (x, *rest) in fft_cases():
        x = lay(x)
        got, want = _public_fft(x, *rest), OPS["fft"](x, *rest)
        assert got.stride() == want.stride() and got.is_contiguous(), name
        torch.testing.assert_close(got, want, msg=name)
    for name, (x, h, n, axis) in convolve_cases():
        got, want = F.convolve(lay(x), lay(h), n=n, axis=axis), OPS["convolve"](lay(x), lay(h), n, axis)
        assert got.stride() == want.stride() and got.is_contiguous(), name
        torch.testing.assert_close(got, want, msg=name)
    for name, args in matmul_cases():
        if name not in ("DEFAULT", "RELU_BIAS", "GELU_AUX_BIAS-bias-m", "BIAS-batched", "batched-both", "alpha-beta-c"):
            continue
        a, b, c, bias, relu_aux, gelu_aux, *_, alpha, beta, epilog, _o, _p, _h = args
        a, b = lay(a), lay(b)
        inputs = {k: v for k, v in (("bias", bias), ("relu_aux", relu_aux), ("gelu_aux", gelu_aux)) if v is not None}
        got = nvdispatch.matmul(a, b, c, alpha=alpha, beta=beta, epilog=epilog, epilog_inputs=inputs or None)
        got = got[0] if isinstance(got, tuple) else got
        want = OPS["matmul"](a, b, *args[2:])[0]
        assert got.stride() == want.stride() and got.is_contiguous(), name
        torch.testing.assert_close(got, want, msg=name)
    x = lay(torch.randn(6, 8, dtype=torch.complex64))
    compiled = torch.compile(lambda t: (F.fft(t, axis=0), F.fftn(t), F.ifft2(t)), fullgraph=True, backend="eager")
    for got, want in zip((F.fft(x, axis=0), F.fftn(x), F.ifft2(x)), compiled(x)):
        assert got.stride() == want.stride() and got.is_contiguous()
        torch.testing.assert_close(got, want)
