"""``stream=`` on CPU calls (issue #27.4): a stream that is not one of the operands' framework is an
``InvalidArgumentError`` naming ``stream``, at every entry point that takes one; ``None`` and a framework's own
CPU streams (``torch.cpu.Stream``) pass."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch.errors import InvalidArgumentError

A = np.arange(6.0).reshape(2, 3)
B = np.arange(12.0).reshape(3, 4)
X = np.arange(8.0).astype(np.complex128)
BAD = ["x", 3.5, object(), -1, 0, True]

ENTRY_POINTS = {
    "matmul": lambda s: nvdispatch.matmul(A, B, stream=s),
    "matmul, bias epilog": lambda s: nvdispatch.matmul(A, B, epilog="BIAS", epilog_inputs={"bias": B[0]}, stream=s),
    "Matmul()": lambda s: nvdispatch.Matmul(A, B, stream=s),
    "Matmul.plan": lambda s: nvdispatch.Matmul(A, B).plan(stream=s),
    "Matmul.execute": lambda s: nvdispatch.Matmul(A, B).plan().execute(stream=s),
    "Matmul.autotune": lambda s: nvdispatch.Matmul(A, B).plan().autotune(1, stream=s),
    "explain": lambda s: nvdispatch.explain(A, B, stream=s),
    "fft": lambda s: nvdispatch.fft.fft(X, stream=s),
    "rfftn": lambda s: nvdispatch.fft.rfftn(A, stream=s),
    "explain fft": lambda s: nvdispatch.explain(nvdispatch.fft.fft, X, stream=s),
    "FFT()": lambda s: nvdispatch.fft.FFT(X, stream=s),
    "FFT.execute": lambda s: nvdispatch.fft.FFT(X).plan().execute(stream=s),
    "convolve": lambda s: nvdispatch.fft.convolve(A, np.ones(2), stream=s),
    "callbacks": lambda s: nvdispatch.fft.fft(X, epilog=lambda v, i: v, stream=s),
}


@pytest.mark.parametrize("stream", BAD, ids=repr)
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_stream_that_is_no_stream_of_the_operands_framework_is_refused(entry, stream):
    with pytest.raises(InvalidArgumentError) as info:
        ENTRY_POINTS[entry](stream)
    assert info.value.argument == "stream" and "numpy arrays on cpu run on no stream" in str(info.value)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_none_is_every_entry_points_default_stream(entry):
    for _ in range(2):  # the planned call and the cached one
        ENTRY_POINTS[entry](None)


def test_repeated_calls_check_the_stream_too():
    for _ in range(3):
        nvdispatch.matmul(A, B)
        nvdispatch.fft.fft(X)
    with pytest.raises(InvalidArgumentError, match="stream"):
        nvdispatch.matmul(A, B, stream="x")
    with pytest.raises(InvalidArgumentError, match="stream"):
        nvdispatch.fft.fft(X, stream="x")


def test_torch_cpu_tensors_take_torchs_own_cpu_streams_only():
    torch = pytest.importorskip("torch")
    a, b = torch.from_numpy(A), torch.from_numpy(B)
    for _ in range(2):
        got = nvdispatch.matmul(a, b, stream=torch.cpu.current_stream())
        np.testing.assert_allclose(got.numpy(), A @ B)
    with pytest.raises(InvalidArgumentError, match="stream"):
        nvdispatch.matmul(a, b, stream=7)
    with pytest.raises(InvalidArgumentError, match="stream"):
        nvdispatch.fft.fft(torch.from_numpy(X), stream="x")
