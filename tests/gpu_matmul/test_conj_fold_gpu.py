"""On the GPU (``-m gpu``): a complex Torch CUDA operand that is a lazy conjugate view (``x.mH``, ``x.conj()``) read
by cuBLASLt with op C (or, where its layout is not a transposed one, conjugated in the copy the plan makes) instead of
copied by the adapter on every call. Values against a NumPy complex128 oracle, complex64 and complex128, ``a.mH``,
``b.mH``, both, with and without a bias and ``c``, batched; what ``explain()`` says; conjugate and plain calls in
turn (no plan serves the other); the stateful ``Matmul`` and executors that do not fold (Torch's) as before; inputs
never modified. The layout arithmetic is checked without a GPU in ``test_conj_fold_cpu.py``."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import nvdispatch

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with CUDA"),
]

DTYPES = [torch.complex64, torch.complex128]


def _complex(*shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    parts = torch.randn(2, *shape, generator=g, dtype=torch.float64)
    return torch.complex(parts[0], parts[1]).to(dtype).cuda()


def _numpy(x) -> np.ndarray:
    return x.detach().cpu().resolve_conj().resolve_neg().numpy().astype(np.complex128)


def _close(got, want, dtype, what=""):
    tol = 2e-5 if dtype == torch.complex64 else 1e-12
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(_numpy(got), want, rtol=tol, atol=tol * scale, err_msg=what)


def _operands(which, dtype, m=48, k=64, n=40, batch=()):
    """``(a, b, bases)``: ``a`` (m, k) and ``b`` (k, n), ``which`` of them ("a", "b", "both", "a-conj": a
    non-transposed conjugate view, "none") lazy conjugate views of the contiguous ``bases``."""
    x = _complex(*batch, k, m, dtype=dtype, seed=1)
    y = _complex(*batch, n, k, dtype=dtype, seed=2)
    a = x.mH if which in ("a", "both") else _complex(*batch, m, k, dtype=dtype, seed=3)
    b = y.mH if which in ("b", "both") else _complex(*batch, k, n, dtype=dtype, seed=4)
    if which == "a-conj":
        x = _complex(*batch, m, k, dtype=dtype, seed=5)
        a = x.conj()
    return a, b, (x, y)


@pytest.mark.parametrize("epilog", [None, "BIAS"])
@pytest.mark.parametrize("which", ["a", "b", "both", "a-conj"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_conjugate_views_are_read_by_cublaslt(dtype, which, epilog):
    a, b, bases = _operands(which, dtype)
    inputs = {"bias": _complex(40, dtype=dtype, seed=6)} if epilog else None
    before = [t.clone() for t in bases]
    want = _numpy(a) @ _numpy(b) + (0 if inputs is None else _numpy(inputs["bias"]))
    with nvdispatch.set_backend("cuda", only=True):  # plain products too (else left to torch.matmul)
        e = nvdispatch.linalg.explain_matmul(a, b, epilog=epilog, epilog_inputs=inputs)
        for i in range(3):
            _close(nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=inputs), want, dtype, f"call {i}")
    assert e.executor == "cuda"
    steps = " ".join(e.steps)
    # (no fused complex BIAS kernel: the inplace plan, whose unfused cuBLASLt GEMM folds the conjugation the same way)
    if which in ("a", "b", "both"):  # transposed layouts: op C, no copy
        assert "=C" in steps and "copy" not in steps, steps
        assert e.problem.a.conj == (which in ("a", "both")) and e.problem.b.conj == (which in ("b", "both"))
    else:  # a row-major conjugate view: copied, conjugating
        assert "its memory holds their conjugates" in steps, steps
    assert all(torch.equal(t, u) for t, u in zip(bases, before))
    assert a.is_conj() == (which in ("a", "both", "a-conj")) and b.is_conj() == (which in ("b", "both"))


@pytest.mark.parametrize("epilog", [None, "BIAS"])
@pytest.mark.parametrize("which", ["a", "b", "both", "a-conj"])
def test_repeated_calls_run_the_cached_plan_on_the_views_values_as_they_are(monkeypatch, which, epilog):
    # the views' signatures name the conjugation: the call key keeps the folded plan, and repeats run it at once (no
    # detection, selection or copy), reading the views' memory as it is at each call
    from nvdispatch import linalg

    full = []
    inner = linalg._plan_and_run
    monkeypatch.setattr(linalg, "_plan_and_run", lambda *args: full.append(1) or inner(*args))
    dtype = torch.complex128
    a, b, bases = _operands(which, dtype)
    inputs = {"bias": _complex(40, dtype=dtype, seed=12)} if epilog else None
    with nvdispatch.set_backend("cuda", only=True):
        for i in range(4):
            want = _numpy(a) @ _numpy(b) + (0 if inputs is None else _numpy(inputs["bias"]))
            _close(nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=inputs), want, dtype, f"call {i}")
            for t in bases:
                t.mul_(0.5 - 1j)
    assert len(full) <= 1  # the first call plans (a compiled front may plan without this function); repeats never


@pytest.mark.parametrize("dtype", DTYPES)
def test_conjugate_views_with_c_and_a_batch(dtype):
    a, b, _ = _operands("both", dtype, batch=(3,))
    c = _complex(3, 48, 40, dtype=dtype, seed=7)
    alpha, beta = 0.5 - 0.25j, 2.0 + 1.0j
    want = alpha * (_numpy(a) @ _numpy(b)) + beta * _numpy(c)
    with nvdispatch.set_backend("cuda", only=True):
        got = nvdispatch.matmul(a, b, c, alpha=alpha, beta=beta)
    _close(got, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_conjugate_and_plain_calls_in_turn_get_their_own_values(dtype):
    # x.mH and x.T share memory and strides: only the conjugation tells them apart, so no plan may serve both
    x = _complex(64, 48, dtype=dtype, seed=8)
    b = _complex(64, 40, dtype=dtype, seed=9)
    bias = _complex(40, dtype=dtype, seed=10)
    with nvdispatch.set_backend("cuda", only=True):
        for _ in range(3):
            for a in (x.mH, x.T, x.T.contiguous().conj(), x.T.contiguous()):
                want = _numpy(a) @ _numpy(b) + _numpy(bias)
                got = nvdispatch.matmul(a, b, epilog="BIAS", epilog_inputs={"bias": bias})
                _close(got, want, dtype, f"conjugate view: {a.is_conj()}, strides {a.stride()}")
                _close(nvdispatch.matmul(a, b), _numpy(a) @ _numpy(b), dtype)


@pytest.mark.parametrize("backend", [None, "torch"])
def test_executors_that_do_not_fold_get_the_values(backend):
    a, b, _ = _operands("both", torch.complex128)
    scope = contextlib.nullcontext() if backend is None else nvdispatch.set_backend(backend, only=True)
    with scope:
        e = nvdispatch.linalg.explain_matmul(a, b)  # a plain product: left to torch.matmul by default
        _close(nvdispatch.matmul(a, b), _numpy(a) @ _numpy(b), torch.complex128)
    assert e.executor == "torch" and not (e.problem.a.conj or e.problem.b.conj)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_stateful_matmul_reads_conjugate_views_as_they_are_at_each_execute(dtype):
    a, b, (x, _) = _operands("a", dtype)
    bias = _complex(40, dtype=dtype, seed=11)
    with nvdispatch.Matmul(a, b) as mm:
        mm.plan(epilog="BIAS", epilog_inputs={"bias": bias})
        for _ in range(2):
            _close(mm.execute(), _numpy(a) @ _numpy(b) + _numpy(bias), dtype)
            x.mul_(1 - 1j)  # the view's values change in place between executes
        plain = a.resolve_conj()
        mm.reset_operands(a=plain)
        _close(mm.execute(), _numpy(plain) @ _numpy(b) + _numpy(bias), dtype)
        mm.reset_operands(a=a)
        _close(mm.execute(), _numpy(a) @ _numpy(b) + _numpy(bias), dtype)
