"""The conjugation of a complex matmul operand folded into cuBLASLt's op C, checked where no GPU is: the layout
arithmetic (an operand whose memory holds the conjugates of its values, ``ArraySig.conj``, is read with op C where
its layout is a transposed one, else copied and conjugated), emulated element by element as cuBLASLt reads memory
and compared with a NumPy complex128 oracle; which plans fold (the ``cuda`` executor's ``native`` plan without a
reducing epilog); and the route's safety net: a conjugate view described by its memory never reaches an executor
that does not fold (the CPU path stays as it was). The GPU runs: ``test_conj_fold_gpu.py``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import nvdispatch
from nvdispatch._cuda import lt_layout as L
from nvdispatch._cuda.lt_setup import setup
from nvdispatch._epilog import spec_of
from nvdispatch._matmul_problem import as_options, build_problem
from nvdispatch._route import detect_all, placement
from nvdispatch.executors import cuda_matmul


def _complex(*shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def _problem(a, b, conj=(), epilog=None, inputs=None):
    """The problem of ``a @ b`` (NumPy arrays standing for the operands' memory), those named in ``conj`` marked as
    memory holding the conjugates of their values."""
    inputs = inputs or {}
    infos = detect_all({"a": a, "b": b, **inputs})
    fw, dev = placement(infos)
    p = build_problem(fw, dev, infos, spec_of(epilog), as_options(None), 1, None, tuple(inputs))
    marks = {name: dataclasses.replace(getattr(p, name), conj=True) for name in conj}
    return dataclasses.replace(p, **marks)


def _read(o, memory: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``op(X)`` as cuBLASLt reads it for operand ``o`` of a setup: the column-major ``o.rows x o.cols`` matrix with
    leading dimension ``o.ld`` at the first element of ``memory`` (or of the plan's C-ordered copy of ``values``,
    where ``o.copy``), then op N, T or C."""
    src = np.ascontiguousarray(values) if o.copy else memory
    item = src.itemsize
    mem = np.lib.stride_tricks.as_strided(src, (o.rows, o.cols), (item, o.ld * item))  # element (i, j) at i + j*ld
    return {L.OP_N: mem, L.OP_T: mem.T, L.OP_C: mem.conj().T}[o.op]


def _emulate(p, orientation, memory: dict, values: dict) -> np.ndarray:
    """The ``(m, n)`` product cuBLASLt computes for setup ``setup(p, orientation)``."""
    s = setup(p, orientation)
    lt_a = _read(s.lt_a, memory[s.lt_a.source], values[s.lt_a.source])
    lt_b = _read(s.lt_b, memory[s.lt_b.source], values[s.lt_b.source])
    d = lt_a @ lt_b  # (m_lt, n_lt)
    return d.T if orientation == "row" else d


#: a matmul operand's memory and the values it stands for: ``memory`` holds the conjugates of ``values`` for a lazy
#: conjugate view (``X.mH`` of a contiguous X: a transposed layout; ``X.conj()``: a row-major one)
def _views(kind, shape, seed):
    r, c = shape
    if kind == "plain":
        x = _complex(r, c, seed=seed)
        return x, x, False
    if kind == "mH":  # X (c, r) contiguous; the operand X.mH: memory X.T, values conj(X).T
        x = _complex(c, r, seed=seed)
        return x.T, x.conj().T, True
    if kind == "conj":  # X (r, c) contiguous; the operand X.conj(): memory X, values conj(X)
        x = _complex(r, c, seed=seed)
        return x, x.conj(), True
    if kind == "mH-strided":  # a transposed layout with a padded leading dimension
        x = _complex(c, r + 3, seed=seed)[:, :r]
        return x.T, x.conj().T, True
    raise AssertionError(kind)


KINDS = ["plain", "mH", "conj", "mH-strided"]


@pytest.mark.parametrize("orientation", ["row", "col"])
@pytest.mark.parametrize("b_kind", KINDS)
@pytest.mark.parametrize("a_kind", KINDS)
def test_cublaslt_reads_the_values_of_conjugated_operands(a_kind, b_kind, orientation):
    m, k, n = 5, 4, 3
    a_mem, a_val, a_conj = _views(a_kind, (m, k), 1)
    b_mem, b_val, b_conj = _views(b_kind, (k, n), 2)
    conj = tuple(name for name, flag in (("a", a_conj), ("b", b_conj)) if flag)
    p = _problem(a_mem, b_mem, conj)
    got = _emulate(p, orientation, {"a": a_mem, "b": b_mem}, {"a": a_val, "b": b_val})
    np.testing.assert_allclose(got, a_val @ b_val, rtol=1e-12, atol=1e-12)
    s = setup(p, orientation)
    for o in (s.lt_a, s.lt_b):
        marked = o.source in conj
        assert (o.op == L.OP_C) == (marked and not o.copy)  # op C exactly for a conjugated operand read in place
        assert o.conj_copy == (marked and o.copy)  # the copy of a conjugated operand conjugates
        assert not (o.conj_copy and o.op == L.OP_C)


@pytest.mark.parametrize(("a_kind", "b_kind"), [("mH", "plain"), ("plain", "mH"), ("mH", "mH")])
def test_the_hermitian_transposes_are_read_in_place_with_op_c_in_the_row_orientation(a_kind, b_kind):
    # the row orientation (D^T = B^T A^T, the first tried without a bias along M) reads a.mH and b.mH, column-major
    # memory, as transposed layouts: op C, no copy; the col orientation would copy them (conjugating)
    a_mem, _, a_conj = _views(a_kind, (6, 4), 3)
    b_mem, _, b_conj = _views(b_kind, (4, 2), 4)
    conj = tuple(n for n, f in (("a", a_conj), ("b", b_conj)) if f)
    p = _problem(a_mem, b_mem, conj)
    s = setup(p, "row")
    assert {o.source: o.op for o in (s.lt_a, s.lt_b)} == {n: L.OP_C if n in conj else L.OP_N for n in ("a", "b")}
    assert not s.lt_a.copy and not s.lt_b.copy
    col = setup(p, "col")
    assert all(o.conj_copy for o in (col.lt_a, col.lt_b) if o.source in conj)


@pytest.mark.parametrize("orientation", ["row", "col"])
@pytest.mark.parametrize("which", ["a", "b", "both"])
def test_conjugated_vectors(which, orientation):
    # 1-D operands (PEP 465: a row vector a, a column vector b) whose memory holds their values' conjugates
    m, k, n = 3, 4, 2
    a_mem = _complex(k, seed=13) if which in ("a", "both") else _complex(m, k, seed=13)
    b_mem = _complex(k, seed=14) if which in ("b", "both") else _complex(k, n, seed=14)
    a_val = a_mem.conj() if which in ("a", "both") else a_mem
    b_val = b_mem.conj() if which in ("b", "both") else b_mem
    conj = {"a": ("a",), "b": ("b",), "both": ("a", "b")}[which]
    p = _problem(a_mem, b_mem, conj)
    got = _emulate(p, orientation, {"a": a_mem, "b": b_mem}, {"a": a_val, "b": b_val})
    np.testing.assert_allclose(got.reshape(np.shape(a_val @ b_val)), a_val @ b_val, rtol=1e-12, atol=1e-12)


def test_a_batched_hermitian_transpose_with_a_bias():
    bsz, m, k, n = 3, 4, 5, 2
    x = _complex(bsz, k, m, seed=5)  # a = x.mH: batch stride k*m, memory x^T per batch
    a_mem, a_val = np.swapaxes(x, -1, -2), np.swapaxes(x.conj(), -1, -2)
    b = _complex(k, n, seed=6)
    bias = _complex(n, seed=7)
    p = _problem(a_mem, b, ("a",), "BIAS", {"bias": bias})
    s = setup(p, "row")
    assert s.lt_b.source == "a" and s.lt_b.op == L.OP_C and s.lt_b.batch_stride == k * m and not s.lt_b.copy
    for i in range(bsz):  # the batch, one matrix at a time (batch strides as cuBLASLt steps them)
        got = _emulate(dataclasses.replace(p, batch_shape=(), a=dataclasses.replace(p.a, shape=(m, k),
                                           strides=p.a.strides[-2:])), "row", {"a": a_mem[i], "b": b},
                       {"a": a_val[i], "b": b}) + bias  # fmt: skip
        np.testing.assert_allclose(got, a_val[i] @ b + bias, rtol=1e-12, atol=1e-12)


# -- which plans fold ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("epilog", "strategy", "folds"), [
    (None, "native", True), ("BIAS", "native", True), ("BIAS", "inplace", True), ("BGRADA", "native", False),
    ("BGRADB", "native", False), ("BGRADA", "inplace", False),
])  # fmt: skip
def test_the_cuda_executor_folds_into_its_cublaslt_plans(epilog, strategy, folds):
    # the inplace plan's cuBLASLt GEMM (DEFAULT epilogue, the bias added after it) reads the operands as the native
    # plan's does; a reducing epilog sums an operand as its memory holds it
    a_mem, _, _ = _views("mH", (4, 3), 8)
    inputs = {"bias": _complex(2, seed=9)} if epilog == "BIAS" else None
    p = _problem(a_mem, _complex(3, 2, seed=10), ("a",), epilog, inputs)
    assert cuda_matmul.folds_conjugates(p, strategy) is folds
    empty = _problem(np.zeros((0, 3), complex), _complex(3, 2), ("a",))
    assert cuda_matmul.folds_conjugates(empty, "native") is False  # zero-size: the framework's ops build it


def test_no_executor_folds_unless_it_says_so():
    from nvdispatch.executors import builtin

    p = _problem(*(_views("mH", (4, 3), 11)[0], _complex(3, 2)), ("a",))
    for name in ("numpy", "torch"):
        assert builtin(name).folds_conjugates("matmul", p, "native") is False

    class Duck:  # a user executor without the method
        name = "duck"

    from nvdispatch.linalg import _folds_conjugates

    assert _folds_conjugates(Duck(), p, "native") is False


# -- the route: a conjugate view described by its memory reaches only an executor that folds -----------------------
torch = pytest.importorskip("torch")


def test_the_torch_adapter_describes_cpu_tensors_as_before():
    from nvdispatch._adapters.torch import TorchAdapter

    z = torch.randn(3, 4, dtype=torch.complex64)
    assert TorchAdapter().info_conjugated("a", z.mH) is None  # the CPU executor honours the lazy view
    assert TorchAdapter().info_conjugated("a", z) is None


@pytest.fixture
def folding_on_the_cpu(monkeypatch):
    """The Torch adapter describing CPU conjugate views by their memory, as it describes CUDA ones (the torch
    executor, which does not fold, must then be handed copies of their values)."""
    from nvdispatch._adapters import torch as torch_adapter

    def info_conjugated(self, name, x):
        if not x.is_conj() or x.is_neg():
            return None
        return dataclasses.replace(self.info(name, x.conj()), conjugated=True)

    monkeypatch.setattr(torch_adapter.TorchAdapter, "info_conjugated", info_conjugated)


@pytest.mark.parametrize("epilog", [None, "BIAS"])
@pytest.mark.parametrize("which", ["a", "b", "both"])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_an_executor_that_does_not_fold_gets_the_values(folding_on_the_cpu, dtype, which, epilog):
    g = torch.Generator().manual_seed(12)
    x = torch.randn(4, 5, dtype=dtype, generator=g)
    y = torch.randn(3, 4, dtype=dtype, generator=g)
    a = x.mH if which in ("a", "both") else torch.randn(5, 4, dtype=dtype, generator=g)
    b = y.mH if which in ("b", "both") else torch.randn(4, 3, dtype=dtype, generator=g)
    inputs = {"bias": torch.randn(3, dtype=dtype, generator=g)} if epilog else None
    before = [t.clone() for t in (x, y)]
    explanation = nvdispatch.linalg.explain_matmul(a, b, epilog=epilog, epilog_inputs=inputs)
    assert explanation.executor == "torch" and not (explanation.problem.a.conj or explanation.problem.b.conj)
    for _ in range(2):
        got = nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=inputs)
        want = a.resolve_conj().numpy().astype(np.complex128) @ b.resolve_conj().numpy().astype(np.complex128)
        if inputs:
            want = want + inputs["bias"].numpy()
        tol = 1e-5 if dtype == torch.complex64 else 1e-12
        np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol)
    assert all(torch.equal(t, u) for t, u in zip((x, y), before))


def test_saved_tunings_keys_name_the_conjugation_only_where_there_is_one():
    from nvdispatch._tunings import key_json

    a_mem, _, _ = _views("mH", (4, 3), 15)
    b = _complex(3, 2, seed=16)
    plain, marked = _problem(a_mem, b), _problem(a_mem, b, ("a",))
    assert "conj" not in key_json(plain)["a"]  # the form keys had before the mark existed
    assert key_json(marked)["a"]["conj"] is True and "conj" not in key_json(marked)["b"]
    assert plain != marked and plain.a != marked.a  # two plan-cache keys, never one
