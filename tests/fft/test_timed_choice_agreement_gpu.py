"""The result-agreement check of the GPU timed choices, on a GPU: the device sample read back
(``runtime.copy_to_host``, strided runs) equals the host array's sample; every real convolution strategy
agrees with ``unfused`` (none rejected) for float32/float64, real and complex, several lengths; a candidate
made wrong in one element of the last row is rejected and the result still matches float64 NumPy; the
cuBLASLt autotune keeps an agreeing winner and records no rejection."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import nvdispatch
from nvdispatch import _agreement, plan_cache
from nvdispatch._fft_convolve import prepare
from nvdispatch.executors import cuda_fft_convolve as op
from nvdispatch.executors.timed_choice import Candidate

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - the gpu marker skips first on GPU-less machines
    pytest.skip("needs torch with CUDA", allow_module_level=True)

RNG = np.random.default_rng(9)


@pytest.fixture(autouse=True)
def _fresh():
    plan_cache.clear()
    plan_cache.clear_tunings()
    yield
    plan_cache.clear()
    plan_cache.clear_tunings()


def _signal(rows, n, dtype):
    if np.dtype(dtype).kind == "f":
        return RNG.standard_normal((rows, n)).astype(dtype)
    return (RNG.standard_normal((rows, n)) + 1j * RNG.standard_normal((rows, n))).astype(dtype)


def _reference(x, h, n):
    if np.dtype(x.dtype).kind == "f":
        return np.fft.irfft(np.fft.rfft(x.astype(np.float64)) * h.astype(np.complex128), n)
    return np.fft.ifft(np.fft.fft(x.astype(np.complex128)) * h.astype(np.complex128))


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "bfloat16"])
def test_the_device_sample_is_the_host_sample(dtype):
    from nvdispatch._cuda import arrays, result_sample, streams

    host = torch.randn(37, 3000, dtype=torch.float32)
    if dtype == "complex64":
        host = torch.complex(host, torch.randn(37, 3000))
    elif dtype != "float32":
        host = host.to(getattr(torch, dtype))
    dev = host.cuda()
    for t, h in ((dev, host), (dev[:, 1::3], host[:, 1::3]), (dev.T, host.T)):  # (Torch has no negative steps)
        s = streams.stream_pointer(None, "torch", 0)
        got = result_sample.sample_device(arrays.view(t, "torch"), s)
        want = _agreement.sample_host((h.float() if dtype == "bfloat16" else h).numpy())
        np.testing.assert_array_equal(got, want)


def _timed(x, h, monkeypatch, extra=None):
    monkeypatch.setattr(op, "TIMING_MIN_BYTES", 0)
    xt, ht = torch.as_tensor(x, device="cuda"), torch.as_tensor(h, device="cuda")
    problem, operands, _ = prepare(xt, ht, None, -1)
    if extra is not None:
        real = op.candidates
        monkeypatch.setattr(op, "candidates", lambda p: [extra(p), *real(p)])
    plan = op.plan(problem, "timed")
    got = plan.execute(operands)
    torch.cuda.synchronize()
    return plan, got


@pytest.mark.parametrize("dtype", ["float32", "complex64", "float64", "complex128"])
@pytest.mark.parametrize("n", [1024, 16384])  # the one-kernel and the four-step strategies among the candidates
def test_every_real_strategy_agrees_with_unfused(dtype, n, monkeypatch):
    x = _signal(64, n, dtype)
    m = n // 2 + 1 if np.dtype(dtype).kind == "f" else n
    h = (RNG.standard_normal(m) + 1j * RNG.standard_normal(m)).astype(np.result_type(dtype, np.complex64))
    plan, got = _timed(x, h, monkeypatch)
    assert plan.rejected == {}, plan.steps
    want = _reference(x, h, n)
    tol = 3e-5 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-11
    assert np.abs(got.cpu().numpy() - want).max() <= tol * np.abs(want).max()


class _WrongInTheLastRow:
    def __init__(self, plan):
        self.plan, self.steps = plan, plan.steps

    def execute(self, operands, stream=None):
        out = self.plan.execute(operands, stream)
        out[-1, out.shape[-1] // 2] += 1.0 + out.abs().max()
        return out

    def release(self):
        self.plan.release()


def test_a_wrong_candidate_is_rejected_on_the_gpu(monkeypatch, caplog):
    from nvdispatch.executors.cuda_fft_convolve_unfused import UnfusedConvolvePlan

    n = 4096
    x = _signal(32, n, "float32")
    h = (RNG.standard_normal(n // 2 + 1) + 1j * RNG.standard_normal(n // 2 + 1)).astype(np.complex64)

    def wrong(problem):
        return Candidate("wrong-kernel", lambda: _WrongInTheLastRow(UnfusedConvolvePlan(problem, "unfused")), 0.0)

    with caplog.at_level(logging.WARNING, logger="nvdispatch"):
        plan, got = _timed(x, h, monkeypatch, wrong)
    assert set(plan.rejected) == {"wrong-kernel"} and plan.chosen != "wrong-kernel"
    assert plan.rejected["wrong-kernel"].where == f"[31, {n // 2}]"
    assert any("wrong-kernel" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    want = _reference(x, h, n)
    assert np.abs(got.cpu().numpy() - want).max() <= 3e-5 * np.abs(want).max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_cublaslt_autotune_keeps_an_agreeing_winner(dtype):
    a = torch.randn(512, 1024, device="cuda", dtype=dtype)
    b = torch.randn(1024, 768, device="cuda", dtype=dtype)
    bias = torch.randn(768, device="cuda", dtype=dtype)
    mm = nvdispatch.Matmul(a, b).plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    mm.autotune(iterations=2)
    got = mm.execute().float().cpu().numpy()
    want = np.maximum(a.double().cpu().numpy() @ b.double().cpu().numpy() + bias.double().cpu().numpy(), 0)
    tol = {torch.float32: 2e-2, torch.float16: 5e-1, torch.bfloat16: 2.0}[dtype]  # TF32 / half outputs, k=1024
    assert np.abs(got - want).max() <= tol
    for record in plan_cache.tunings().values():
        assert "rejected" not in record, record


def test_the_cublaslt_check_rejects_a_wrong_result(monkeypatch, caplog):
    """Every candidate's result but the heuristic's first answer's read back with its last element made wrong:
    the faster finalists are rejected and the heuristic's first answer is kept."""
    import dataclasses

    from nvdispatch._cuda import lt_autotune

    a = torch.randn(256, 512, device="cuda")
    b = torch.randn(512, 384, device="cuda")
    mm = nvdispatch.Matmul(a, b).plan(epilog="RELU_BIAS", epilog_inputs={"bias": torch.randn(384, device="cuda")})
    real = lt_autotune.autotune
    reads = []

    def corrupting(plan, launch, stream, *args, check=None, **kw):
        def read():
            got = check.read()
            reads.append(len(got))
            if len(reads) > 1:  # the first read is the reference's
                got[-1] += 1.0 + np.abs(got).max()
            return got

        return real(plan, launch, stream, *args, check=dataclasses.replace(check, read=read), **kw)

    monkeypatch.setattr(lt_autotune, "autotune", corrupting)
    with caplog.at_level(logging.WARNING, logger="nvdispatch"):
        timings = mm.autotune(iterations=1)
    if len(reads) <= 1:
        pytest.skip(f"the heuristic's first answer won the timing here ({timings}): nothing to check")
    assert any("cuBLASLt autotune" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    (record,) = [r for r in plan_cache.tunings().values() if "rejected" in r]
    assert record["label"] == "heuristic #0"
    want = np.maximum(a.double().cpu().numpy() @ b.double().cpu().numpy(), 0)
    assert np.isfinite(mm.execute().cpu().numpy()).all() and want.shape == (256, 384)
