"""Conformance: Torch's own test inputs (the OpInfo database that Torch's ``test_ops.py`` runs, shipped in the
wheel as ``torch.testing._internal.common_methods_invocations.op_db``) through nvdispatch, with Torch's own op
as the oracle.

For every ``torch.fft`` transform and shift and the matmul family (``matmul``, ``__rmatmul__``, ``mm``, ``bmm``,
``mv``, ``addmm``, ``addmv``, ``baddbmm``, ``nn.functional.linear``), each CPU sample input in each dtype Torch
supports that nvdispatch takes goes to the public nvdispatch function (Torch's ``dim`` as ``axis``/``axes``,
``addmm``'s ``input``/``beta``/``alpha`` as ``c``/``beta``/``alpha``, ``linear``'s bias as the ``BIAS`` epilog)
and must give Torch's values (dtype-appropriate tolerance), dtype and shape, as a Torch tensor on the input's
device, leaving the inputs unchanged; where Torch raises, nvdispatch must raise a typed ``NvdispatchError``.
Also: the samples made non-contiguous and (complex) as conjugate views, Torch's error inputs, and
``torch.autograd.gradcheck`` through nvdispatch's Torch operators on every float64/complex128 sample.

The sample lists are made once per session at collection, under a fixed seed. conformance/README.md lists
what is not offered, with the reason.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

import nvdispatch
import nvdispatch.fft as F
from nvdispatch import errors

torch = pytest.importorskip("torch")
# the OpInfo database needs Torch's test helpers (and their `expecttest` dependency: the [test] extra)
opinfo = pytest.importorskip("torch.testing._internal.common_methods_invocations")

FFT_1D = ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")
FFT_ND = ("fftn", "ifftn", "rfftn", "irfftn", "fft2", "ifft2", "rfft2", "irfft2")
SHIFTS = ("fftshift", "ifftshift")
MATMULS = ("matmul", "__rmatmul__", "mm", "bmm", "mv", "addmm", "addmv", "baddbmm", "nn.functional.linear")

#: Torch OpInfos with no nvdispatch counterpart (conformance/README.md gives each reason)
NOT_OFFERED = {
    "fft.hfft2": "not in the array API's fft extension, nor in numpy.fft",
    "fft.hfftn": "not in the array API's fft extension, nor in numpy.fft",
    "fft.ihfft2": "not in the array API's fft extension, nor in numpy.fft",
    "fft.ihfftn": "not in the array API's fft extension, nor in numpy.fft",
}

#: the dtypes tried, where Torch's CPU op supports them (Torch's FFTs take no float16/bfloat16 on the CPU)
DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128, torch.float16, torch.bfloat16,
          torch.int64, torch.int32, torch.uint8, torch.bool)  # fmt: skip
#: normwise relative tolerance of the reduced-precision products (a few units in the last place: the two
#: libraries round a product and a bias or ``c`` in different orders)
HALF_RTOL = {torch.float16: 4e-3, torch.bfloat16: 3.2e-2}


def _opinfos() -> dict[str, Any]:
    wanted = {f"fft.{f}" for f in FFT_1D + FFT_ND + SHIFTS} | set(MATMULS) | set(NOT_OFFERED)
    return {op.name: op for op in opinfo.op_db if op.name in wanted and op.variant_test_name == ""}


OPINFOS = _opinfos()


@functools.cache
def samples(name: str, dtype, requires_grad: bool = False) -> list:
    """The OpInfo's CPU sample inputs of ``dtype`` (the same every session: a fixed seed). Its generator is
    called directly: ``OpInfo.sample_inputs`` wraps it in an iterator that walks the call stack per item."""
    op = OPINFOS[name]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return list(op.sample_inputs_func(op, "cpu", dtype, requires_grad))


@functools.cache
def error_inputs(name: str) -> list:
    """The OpInfo's CPU error inputs (none where it has no error generator)."""
    op = OPINFOS[name]
    return [] if op.error_inputs_func is None else list(op.error_inputs_func(op, "cpu"))


def _cases(dtypes=DTYPES, grad: bool = False) -> list:
    out = []
    for name, op in sorted(OPINFOS.items()):
        if name in NOT_OFFERED:
            continue
        supported = op.supported_dtypes("cpu")
        for dtype in dtypes:
            if dtype in supported:
                for i in range(len(samples(name, dtype, grad))):
                    out.append(pytest.param(name, dtype, i, id=f"{name}-{str(dtype)[6:]}-{i}"))
    return out


# -- the mapping of a Torch call onto nvdispatch's ------------------------------------------------------------------
def _axes(dim):
    return (dim,) if isinstance(dim, int) else dim


def call_nvdispatch(name: str, sample) -> Any:
    """``name``'s OpInfo sample through the public nvdispatch function."""
    x, args, kw = sample.input, sample.args, sample.kwargs
    if name.startswith("fft."):
        func = name[4:]
        if func in SHIFTS:
            return getattr(F, func)(x, **({"axes": kw["dim"]} if "dim" in kw else {}))
        mapped = {"norm": kw["norm"]} if "norm" in kw else {}
        if func in FFT_1D:
            mapped.update({k: kw[t] for k, t in (("n", "n"), ("axis", "dim")) if t in kw})
        else:
            mapped.update({k: (_axes(kw[t]) if k == "axes" else kw[t]) for k, t in (("s", "s"), ("axes", "dim"))
                           if t in kw})  # fmt: skip
        assert set(kw) <= {"n", "s", "dim", "norm"} and not args, (name, kw, args)
        return getattr(F, func)(x, **mapped)
    if name in ("matmul", "mm", "bmm", "mv"):
        return nvdispatch.matmul(x, args[0])
    if name == "__rmatmul__":
        return nvdispatch.matmul(args[0], x)
    if name in ("addmm", "addmv", "baddbmm"):
        return nvdispatch.matmul(args[0], args[1], x, alpha=kw.get("alpha", 1), beta=kw.get("beta", 1))
    if name == "nn.functional.linear":
        weight, bias = args[0], (args[1] if len(args) > 1 else kw.get("bias"))
        if bias is None:
            return nvdispatch.matmul(x, weight.mT)
        return nvdispatch.matmul(x, weight.mT, epilog="BIAS", epilog_inputs={"bias": bias})
    raise AssertionError(f"no mapping for {name}")


def _non_integral_scale_of_an_integer_product(name: str, sample) -> bool:
    if name not in ("addmm", "addmv", "baddbmm") or sample.input.dtype.is_floating_point or sample.input.is_complex():
        return False
    return any(isinstance(v, float) and not v.is_integer() for v in sample.kwargs.values())


#: samples outside nvdispatch's documented domain: (test, the typed error nvdispatch raises, why)
OUTSIDE = [
    (_non_integral_scale_of_an_integer_product, errors.InvalidArgumentError,
     "an integer product with a non-integral alpha/beta: Torch truncates the scalar to an integer (0.6 -> 0)"),
]  # fmt: skip


def _tensors(sample) -> list:
    values = [sample.input, *sample.args, *sample.kwargs.values()]
    return [v for v in values if isinstance(v, torch.Tensor)]


def _check(name: str, sample) -> None:
    """nvdispatch against Torch on one sample: values, dtype, shape, type, device, inputs unchanged."""
    inputs = _tensors(sample)
    before = [t.clone() for t in inputs]
    for outside, error, _ in OUTSIDE:
        if outside(name, sample):
            with pytest.raises(error):
                call_nvdispatch(name, sample)
            return
    try:
        want = OPINFOS[name](sample.input, *sample.args, **sample.kwargs)
    except Exception as torch_error:  # Torch refuses it: so must nvdispatch, with a typed error
        with pytest.raises(errors.NvdispatchError):
            call_nvdispatch(name, sample)
        pytest.skip(f"Torch raises {type(torch_error).__name__} (nvdispatch a typed error)")  # counted apart
    got = call_nvdispatch(name, sample)
    assert isinstance(got, torch.Tensor), type(got)
    assert got.device == sample.input.device
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    got, want = got.resolve_conj().resolve_neg(), want.resolve_conj().resolve_neg()
    if want.dtype in HALF_RTOL:
        rtol = HALF_RTOL[want.dtype]
        scale = float(want.float().abs().max()) if want.numel() else 0.0
        torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=rtol * max(scale, 1.0))
    else:
        torch.testing.assert_close(got, want, equal_nan=True)
    for t, b in zip(inputs, before):
        assert torch.equal(t.resolve_conj().resolve_neg(), b.resolve_conj().resolve_neg()), "an input changed"


# -- forward ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "dtype", "index"), _cases())
def test_sample_gives_torchs_result(name, dtype, index):
    _check(name, samples(name, dtype)[index])


VIEW_DTYPES = (torch.float32, torch.complex64)


@pytest.mark.parametrize(("name", "dtype", "index"), _cases(VIEW_DTYPES))
def test_noncontiguous_sample_gives_torchs_result(name, dtype, index):
    _check(name, samples(name, dtype)[index].noncontiguous())


@pytest.mark.parametrize(("name", "dtype", "index"), _cases((torch.complex64,)))
def test_conjugate_view_sample_gives_torchs_result(name, dtype, index):
    # the lazy conjugate (and its negative-bit imaginary part) Torch hands out as views: the bits must be honoured
    sample = samples(name, dtype)[index]
    _check(name, sample.transform(lambda t: t.conj() if isinstance(t, torch.Tensor) and t.is_complex() else t))


def _error_cases() -> list:
    out = []
    for name in sorted(OPINFOS):
        if name not in NOT_OFFERED:
            out += [pytest.param(name, i, id=f"{name}-{i}") for i in range(len(error_inputs(name)))]
    return out


@pytest.mark.parametrize(("name", "index"), _error_cases())
def test_torchs_error_inputs_raise_typed_errors(name, index):
    error = error_inputs(name)[index]
    with pytest.raises(error.error_type):  # Torch's own error on it, read off Torch
        OPINFOS[name](error.sample_input.input, *error.sample_input.args, **error.sample_input.kwargs)
    with pytest.raises(errors.NvdispatchError) as info:
        call_nvdispatch(name, error.sample_input)
    # the builtin class Torch raises is one nvdispatch's error derives from too (an axis error: IndexError)
    assert isinstance(info.value, error.error_type), (type(info.value).__mro__, error.error_type)


def test_not_offered_is_still_not_offered():
    # strict: once nvdispatch offers one of them, it must join the suite (and leave NOT_OFFERED)
    for name in NOT_OFFERED:
        assert not hasattr(F, name[4:]), name


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(n for n in OPINFOS if n not in NOT_OFFERED))
def test_samples_on_cuda_give_torchs_results(name):
    supported = OPINFOS[name].supported_dtypes("cuda")
    for dtype in (torch.float32, torch.float64, torch.complex64, torch.complex128, torch.float16, torch.bfloat16):
        if dtype in supported:
            for sample in samples(name, dtype):
                _check(name, sample.transform(lambda t: t.cuda() if isinstance(t, torch.Tensor) else t))


# -- autograd ---------------------------------------------------------------------------------------------------------
GRAD_DTYPES = (torch.float64, torch.complex128)
#: samples with at most this many input elements get the whole Jacobian checked
SMALL = 32


@pytest.mark.parametrize(("name", "dtype", "index"), _cases(GRAD_DTYPES, grad=True))
def test_gradcheck_through_the_operators(name, dtype, index):
    """Backward formulas against finite differences of nvdispatch's own forward (every norm, n/s padding and
    trimming, the halved axis of the real transforms): the whole Jacobian of the small samples, one random
    projection of it (gradcheck's fast mode) for the others."""
    sample = samples(name, dtype, True)[index]
    leaves = [t for t in _tensors(sample) if t.requires_grad]
    if not leaves:
        pytest.skip("no input of this sample requires grad")

    def function(*values):
        swap = dict(zip(map(id, leaves), values))
        put = lambda v: swap.get(id(v), v)  # noqa: E731  (SampleInput.transform would run under no_grad)
        args, kwargs = tuple(map(put, sample.args)), {k: put(v) for k, v in sample.kwargs.items()}
        return call_nvdispatch(name, opinfo.SampleInput(put(sample.input), args=args, kwargs=kwargs))

    small = sum(t.numel() for t in leaves) <= SMALL
    assert torch.autograd.gradcheck(function, leaves, fast_mode=not small, check_batched_grad=False)


def fft_operator_args(name: str, sample) -> tuple:
    """The ``nvdispatch::fft`` operator's arguments for transform ``name``'s sample (``fft2`` as ``fftn`` over the
    last two axes)."""
    func, kw = name[4:], sample.kwargs
    norm = kw.get("norm") or "backward"
    if func in FFT_1D:
        return (sample.input, func, kw.get("n"), kw.get("dim", -1), None, None, norm)
    axes = _axes(kw["dim"]) if "dim" in kw else ((-2, -1) if func.endswith("2") else None)
    s = kw.get("s")
    return (sample.input, func.replace("2", "n"), None, -1, None if s is None else list(s),
            None if axes is None else list(axes), norm)  # fmt: skip


#: every fourth float64/complex128 transform sample (opcheck runs each several ways: a few tenths of a second)
_OPCHECK = [p for p in _cases(GRAD_DTYPES, grad=True) if p.values[0].startswith("fft.")
            and p.values[0][4:] not in SHIFTS and p.values[2] % 4 == 0]  # fmt: skip


@pytest.mark.parametrize(("name", "dtype", "index"), _OPCHECK)
def test_fft_operator_passes_opcheck(name, dtype, index):
    """The operator on Torch's samples: schema, autograd registration, the fake kernel against the real one
    (shape, dtype, strides, conjugate bit) and AOT dispatch with dynamic shapes (the kernel below
    functionalization)."""
    from nvdispatch.integrations import torch_ops

    torch.library.opcheck(torch_ops.fft_op, fft_operator_args(name, samples(name, dtype, True)[index]))
