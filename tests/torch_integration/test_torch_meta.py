"""Meta tensors (shape inference, models built with ``torch.device("meta")``): no executor computes on them, so
the ``nvdispatch::`` operators' meta kernels answer, eagerly and from the public functions, with the layout the
real kernels give on the CPU (shape, dtype and strides of every output), as Torch's own ops do on meta tensors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import nvdispatch  # noqa: E402
from nvdispatch.integrations import torch_ops  # noqa: E402, F401 - registers the operators

from .torch_cases import convolve_cases, fft_cases, matmul_cases  # noqa: E402

OPS = {"matmul": matmul_cases, "fft": fft_cases, "convolve": convolve_cases}


def _meta(value):
    return value.to("meta") if isinstance(value, torch.Tensor) else value


def _layouts(result):
    outs = result if isinstance(result, (tuple, list)) else (result,)
    return [(tuple(t.shape), t.dtype, t.stride()) if isinstance(t, torch.Tensor) else t for t in outs]


CASES = [(op, case_id, args) for op, cases in OPS.items() for case_id, args in cases("cpu")]


@pytest.mark.parametrize(("op", "case_id", "args"), CASES, ids=[f"{op}-{case_id}" for op, case_id, _ in CASES])
def test_the_operators_meta_kernels_give_the_cpu_kernels_layout(op, case_id, args):
    operator = getattr(torch.ops.nvdispatch, op).default
    want = operator(*args)
    got = operator(*(_meta(a) for a in args))
    assert all(t.is_meta for t in (got if isinstance(got, (tuple, list)) else (got,)) if isinstance(t, torch.Tensor))
    assert _layouts(got) == _layouts(want)


def _public_calls():
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    w = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(5, generator=torch.Generator().manual_seed(2))
    h = torch.fft.rfft(torch.randn(8, generator=torch.Generator().manual_seed(3)))
    return [
        ("matmul", lambda a, b: nvdispatch.matmul(a, b), (x, w.mT)),
        ("matmul RELU_AUX_BIAS", lambda a, b, c: nvdispatch.matmul(a, b, epilog="RELU_AUX_BIAS",
                                                                   epilog_inputs={"bias": c}), (x, w.mT, bias)),
        ("rfft", lambda a: nvdispatch.fft.rfft(a, n=10), (x,)),
        ("fft2", lambda a: nvdispatch.fft.fft2(a), (x,)),
        ("irfft", lambda a: nvdispatch.fft.irfft(a, axis=0), (x.to(torch.complex64),)),
        ("convolve", lambda a, b: nvdispatch.fft.convolve(a, b), (x, h.to(torch.complex64))),
    ]  # fmt: skip


@pytest.mark.parametrize("name", [name for name, _, _ in _public_calls()])
def test_public_functions_on_meta_tensors_give_the_layout_of_the_cpu_result(name):
    _, call, args = next(c for c in _public_calls() if c[0] == name)
    want = call(*args)
    for _ in range(2):  # the CPU call's cached route must not serve the meta call, nor the other way round
        got = call(*(a.to("meta") for a in args))
        flat = [got] if isinstance(got, torch.Tensor) else [got[0], *got[1].values()]
        assert all(t.is_meta for t in flat)
        ref = [want] if isinstance(want, torch.Tensor) else [want[0], *want[1].values()]
        assert _layouts(flat) == _layouts(ref)
        again = call(*args)
        assert not (again[0] if isinstance(again, tuple) else again).is_meta
