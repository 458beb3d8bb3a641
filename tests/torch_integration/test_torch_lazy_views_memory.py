"""Torch's lazy views (``z.conj()``, ``torch._neg_view(z)``, ``z.conj().imag``) wherever a tensor becomes memory
read without Torch: the view an executor reading pointers takes holds the values the tensor stands for (on a
device: a copy, made again for each call, which no call key keeps a plan for), host copies and DLPack exports hold
them too, and calls alternating a tensor and its lazy views — repeated, so the call keys, their memo and the
compiled front serve them — each get their own values. Values against NumPy on the resolved tensors.

The GPU half (the ``cuda`` executor reading CUDA tensors by pointer) is ``test_lazy_views_on_cuda`` and
``test_alternating_lazy_views_on_cuda`` in test_torch_complex_views.py."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import _adapters
from nvdispatch._adapters import Adapter, OperandInfo, adapter_named, register_adapter

torch = pytest.importorskip("torch")


def _complex(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    parts = torch.randn(2, *shape, generator=g, dtype=torch.float64)
    return torch.complex(parts[0], parts[1])


def _values(x) -> np.ndarray:
    """What ``x`` stands for, its lazy bits applied (the oracle's input)."""
    return x.detach().resolve_conj().resolve_neg().numpy().copy()


#: lazy views of a complex (6, 8) tensor, and plain tensors to alternate them with
VIEWS = {
    "plain": lambda z: z,
    "conj": lambda z: z.conj(),
    "neg": lambda z: torch._neg_view(z),
    "conj-transposed": lambda z: z.conj().t(),
    "conj-slice": lambda z: z.conj()[1:, ::2],
    "neg-of-conj": lambda z: torch._neg_view(z.conj()),
}
REAL_VIEWS = {"plain-imag": lambda z: z.imag, "conj-imag": lambda z: z.conj().imag}


def _alternating(z):
    """The plain tensor between each lazy view, twice over (every view meets a warm key of the plain one)."""
    seq = []
    for _ in range(2):
        for name, make in VIEWS.items():
            seq += [("plain", z), (name, make(z))]
    return seq


# -- the adapter: views handed to executors, keys, host copies -------------------------------------------------------
@pytest.mark.parametrize("name", [*VIEWS, *REAL_VIEWS])
def test_a_lazy_view_on_a_device_is_handed_over_as_its_values(name):
    """On a device (``meta`` stands for CUDA here: same branch, no memory) executors may read the view by pointer:
    it is a tensor of the values, made anew for each call: a negative view has no call key; a conjugate view's key
    names the conjugation, and the route keeps under it only a plan that folds the conjugation in (never one made
    on such a copy: ``tests/gpu_matmul/test_conj_fold_route_cpu.py``)."""
    ad = adapter_named("torch")
    x = {**VIEWS, **REAL_VIEWS}[name](_complex(6, 8).to("meta"))
    info = ad.info("x", x)
    lazy = x.is_conj() or x.is_neg()
    assert info.materialized is lazy and (info.array is x) is not lazy
    assert not info.array.is_conj() and not info.array.is_neg()
    assert (info.shape, info.dtype) == (tuple(x.shape), str(x.dtype)[6:])
    assert info.strides == tuple(info.array.stride())
    if x.is_neg():
        with pytest.raises(TypeError):
            ad.signature(x)
    else:
        assert ad.signature(x) is not None
        if x.is_conj():
            assert ad.signature(x) != ad.signature(x.conj())


def test_on_the_cpu_the_torch_executor_takes_the_view_and_the_key_tells_it_apart():
    ad = adapter_named("torch")
    z = _complex(6, 8)
    for make in VIEWS.values():
        v = make(z)
        info = ad.info("x", v)
        assert info.array is v and not info.materialized  # Torch's operations honour the lazy bits
    keys = {name: ad.signature(make(z)) for name, make in VIEWS.items()}
    assert keys["plain"] != keys["conj"] != keys["neg"] != keys["plain"]
    assert keys["neg-of-conj"] not in (keys["conj"], keys["neg"])


@pytest.mark.parametrize("name", [*VIEWS, *REAL_VIEWS])
def test_host_copies_and_dlpack_exports_hold_the_values(name):
    z = _complex(6, 8)
    before = z.clone()
    x = {**VIEWS, **REAL_VIEWS}[name](z)
    want = _values(x)
    ad = adapter_named("torch")
    np.testing.assert_array_equal(ad.to_numpy(x), want)
    np.testing.assert_array_equal(np.from_dlpack(ad.export(x)), want)  # DLPack carries no lazy bit
    assert torch.equal(z, before) and x.is_conj() == ("conj" in name and "imag" not in name)


def test_device_view_refuses_a_lazy_view():
    """The pointer of a lazy view is not its values: a path that would hand one to a pointer-reading executor fails
    loudly instead of computing on the unconjugated memory."""
    ad = adapter_named("torch")
    z = _complex(3, 4)
    assert ad.device_view(z).ptr == z.data_ptr()
    for v in (z.conj(), torch._neg_view(z), z.conj().imag):
        with pytest.raises(nvdispatch.errors.UnsupportedOperandError, match="lazy"):
            ad.device_view(v)


# -- calls alternating plain tensors and lazy views -------------------------------------------------------------------
def _check_fft(seq, tol=1e-12):
    for k, (name, x) in enumerate(seq):
        want = np.fft.fft(_values(x))
        got = nvdispatch.fft.fft(x)
        np.testing.assert_allclose(np.asarray(_values(got) if torch.is_tensor(got) else got), want, rtol=tol,
                                   atol=tol * np.abs(want).max(), err_msg=f"call {k}: {name}")  # fmt: skip


def _check_matmul(z, w, tol=1e-12):
    """Each view of ``z`` times a plain tensor, and a plain tensor times each view of ``w``, the plain product of the
    same shapes between each, twice over."""
    calls = []
    for _ in range(2):
        for name, make in VIEWS.items():
            a = make(z)
            other = _complex(a.shape[-1], 3, seed=5)
            calls += [("plain @ plain", a.resolve_conj().resolve_neg(), other), (f"{name} @ plain", a, other)]
            b = make(w)
            other = _complex(3, b.shape[0], seed=6)
            calls += [("plain @ plain", other, b.resolve_conj().resolve_neg()), (f"plain @ {name}", other, b)]
    for k, (what, a, b) in enumerate(calls):
        want = _values(a) @ _values(b)
        got = nvdispatch.matmul(a, b)
        np.testing.assert_allclose(_values(got) if torch.is_tensor(got) else np.asarray(got), want, rtol=tol,
                                   atol=tol * np.abs(want).max(), err_msg=f"call {k}: {what}")  # fmt: skip


def test_alternating_views_through_the_default_route():
    """The Torch executor on the CPU, its plans kept under the call keys (and, warm, their memo and the compiled
    front): each call gets its own view's values."""
    z = _complex(6, 8)
    before = z.clone()
    _check_fft(_alternating(z))
    _check_matmul(z, _complex(6, 8, seed=1))
    assert torch.equal(z, before)


@pytest.mark.parametrize("backend", ["numpy"])
def test_alternating_views_through_an_executor_reading_host_memory(backend):
    """A coercing backend hands the NumPy executor host copies of Torch tensors: the copies of lazy views hold their
    values (Torch refuses ``numpy()`` on them; DLPack drops the negative bit)."""
    z = _complex(6, 8)
    before = z.clone()
    with nvdispatch.set_backend(backend, coerce=True):
        _check_fft(_alternating(z))
        _check_matmul(z, _complex(6, 8, seed=1))
        _check_fft([(name, make(z)) for name, make in REAL_VIEWS.items()] * 2)
    assert torch.equal(z, before)


# -- stateful objects over a view whose executor takes a copy --------------------------------------------------------
class Negated:
    """A toy framework's lazy view: it stands for ``-base`` (its memory holds ``base``), as Torch's negative view."""

    def __init__(self, base: np.ndarray):
        self.base = base


class NegatedAdapter(Adapter):
    """Hands executors the values as a new host array (``OperandInfo.materialized``), as Torch's adapter hands a
    lazy view on a device over."""

    name = "negated"
    default_executors = {"cpu": ("numpy",)}
    can_copy_into = True

    def claims(self, cls):
        return issubclass(cls, Negated)

    def info(self, name, x):
        values = -x.base
        inner = adapter_named("numpy").info(name, values)
        return OperandInfo(values, self.name, inner.device, inner.dtype, inner.shape, inner.strides,
                           memory=inner.memory, materialized=True)  # fmt: skip

    def copy_into(self, dst, src):
        dst.base[...] = -np.asarray(src)


@pytest.fixture
def negated():
    register_adapter(NegatedAdapter())
    yield Negated
    _adapters.unregister_adapter("negated")


def test_a_stateful_fft_reads_a_materialized_operand_as_it_is_at_each_execute(negated):
    base = _complex(6, 8).numpy().copy()
    x = negated(base)
    with nvdispatch.fft.FFT(x, axes=(1,)) as f:
        f.plan()
        for k in range(3):
            np.testing.assert_allclose(f.execute(), np.fft.fft(-base, axis=1), rtol=1e-12, atol=1e-12)
            base *= 1j + k  # the operand's values change in place between executes
    inplace = negated(_complex(4, 8, seed=2).numpy().copy())
    want = np.fft.fft(-inplace.base, axis=1)
    with nvdispatch.fft.FFT(inplace, axes=(1,), options={"inplace": True}) as f:
        assert f.plan().execute() is inplace
    np.testing.assert_allclose(-inplace.base, want, rtol=1e-12, atol=1e-12)  # the result reached the operand


def test_a_stateful_matmul_reads_materialized_operands_as_they_are_at_each_execute(negated):
    a, b = np.random.default_rng(0).random((5, 4)), np.random.default_rng(1).random((4, 3))
    with nvdispatch.Matmul(negated(a), negated(b)) as mm:
        mm.plan()
        for k in range(3):
            np.testing.assert_allclose(mm.execute(), (-a) @ (-b), rtol=1e-12)
            a += k + 1
            b *= 2
