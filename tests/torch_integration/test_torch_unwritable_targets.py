"""Torch tensors nvdispatch is asked to write into and Torch will not write: an expanded (broadcast) tensor, a lazy
conjugate or negative view of one, a leaf that requires grad while grad mode is on. As the in-place target of a
stateful ``FFT`` (``options={"inplace": True}``) or as a transform's ``out=`` (eagerly and under
``torch.compile(fullgraph=True)``), each is refused up front with an ``InvalidArgumentError`` naming ``x`` / ``out``
and saying what came, where Torch's own ``copy_`` RuntimeError ("more than one element of the written-to tensor
refers to a single memory location") used to come out after the transform ran.

On CUDA a lazy view reaches the executors as a copy of its values (``OperandInfo.materialized``), whose strides say
nothing of the caller's overlapping ones: that path is exercised on the CPU too, with the Torch adapter
materialising CPU lazy views as it does CUDA ones (:func:`materialising`), and on a GPU (``-m gpu``). Values against
NumPy's float64 FFTs; inputs never modified."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors
from nvdispatch._strides import overlapping

torch = pytest.importorskip("torch")

from nvdispatch._adapters import torch as torch_adapter  # noqa: E402


def _complex(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    parts = torch.randn(2, *shape, generator=g, dtype=torch.float64)
    return torch.complex(parts[0], parts[1]).to(torch.complex64)


def _numpy(x) -> np.ndarray:
    return x.detach().cpu().resolve_conj().resolve_neg().numpy().astype(np.complex128)


#: in-place targets whose elements overlap: made from a (1, 8) row, or an (8,) / (8, 1) signal
OVERLAPPING = {
    "expanded": lambda z: z.expand(4, 8),
    "expanded-conj": lambda z: z.expand(4, 8).conj(),
    "conj-expanded": lambda z: z.conj().expand(4, 8),
    "expanded-neg": lambda z: torch._neg_view(z.expand(4, 8)),
    "broadcast_to-conj": lambda z: torch.broadcast_to(z, (4, 8)).conj(),
    "expanded-3d-conj": lambda z: z.reshape(8).expand(2, 3, 8).conj(),
    "expanded-conj-transposed": lambda z: z.reshape(8, 1).expand(8, 4).conj().t(),
}


@pytest.fixture(params=["as-on-cpu", "as-on-cuda"])
def materialising(request, monkeypatch):
    """The Torch adapter as it describes CPU tensors, or as it describes CUDA ones: a lazy conjugate/negative view
    handed to executors as a copy of its values (``resolved``, ``materialized=True``)."""
    if request.param == "as-on-cuda":
        describe = torch_adapter.TorchAdapter.info

        def info(self, name, x):
            found = describe(self, name, x)
            if not (x.is_conj() or x.is_neg()):
                return found
            view = torch_adapter.resolved(x)
            return dataclasses.replace(found, array=view, strides=tuple(view.stride()), materialized=True)

        monkeypatch.setattr(torch_adapter.TorchAdapter, "info", info)
    return request.param


@pytest.mark.parametrize(("shape", "strides", "overlaps"), [
    ((4, 8), (8, 1), False), ((4, 8), (1, 4), False), ((4, 8), (0, 1), True), ((1, 8), (0, 1), False),
    ((4, 8), (16, 2), False), ((4, 8), (1, 1), True), ((2, 3, 8), (0, 0, 1), True), ((4, 8), (-8, 1), False),
    ((), (), False), ((0, 8), (0, 1), False),
])  # fmt: skip
def test_overlapping_strides(shape, strides, overlaps):
    assert overlapping(shape, strides) is overlaps


# -- the stateful FFT in place ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("view", list(OVERLAPPING))
def test_an_in_place_fft_over_overlapping_elements_is_refused_naming_x(materialising, view):
    z = _complex(1, 8)
    before = z.clone()
    x = OVERLAPPING[view](z)
    with pytest.raises(errors.InvalidArgumentError, match="overlap") as info:
        nvdispatch.fft.FFT(x, options={"inplace": True})
    assert info.value.argument == "x"
    assert "options.inplace=True" in info.value.expected
    assert "strides" in info.value.got and str(tuple(x.stride())) in info.value.got
    lazy = "conjugate" if x.is_conj() else "negative" if x.is_neg() else None
    if lazy is not None:
        assert f"a lazy {lazy} view" in info.value.got
    assert torch.equal(z, before)


@pytest.mark.parametrize("view", ["expanded", "expanded-conj"])
def test_reset_operand_refuses_an_overlapping_target_and_keeps_its_operand(materialising, view):
    x = _complex(4, 8, seed=1)
    want = np.fft.fftn(_numpy(x))
    with nvdispatch.fft.FFT(x, options={"inplace": True}) as f:
        f.plan()
        z = _complex(1, 8)
        before = z.clone()
        with pytest.raises(errors.InvalidArgumentError, match="overlap") as info:
            f.reset_operand(OVERLAPPING[view](z))
        assert info.value.argument == "x"
        assert f.execute() is x  # still the operand it had
    np.testing.assert_allclose(_numpy(x), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert torch.equal(z, before)


@pytest.mark.parametrize("view", ["conj", "neg", "conj-transposed"])
def test_an_in_place_fft_over_a_lazy_view_that_does_not_overlap_writes_its_values(materialising, view):
    z = _complex(8, 8, seed=2)
    x = {"conj": z.conj(), "neg": torch._neg_view(z), "conj-transposed": z.conj().t()}[view]
    want = np.fft.fftn(_numpy(x), axes=(1,))
    with nvdispatch.fft.FFT(x, axes=(1,), options={"inplace": True}) as f:
        f.plan()
        assert f.execute() is x
    np.testing.assert_allclose(_numpy(x), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_an_in_place_fft_of_a_leaf_that_requires_grad_is_refused_only_where_autograd_forbids_it():
    x = _complex(4, 8).requires_grad_()
    with pytest.raises(errors.InvalidArgumentError, match="requires grad") as info:
        nvdispatch.fft.FFT(x, options={"inplace": True})
    assert info.value.argument == "x"
    with torch.no_grad():  # where Torch writes a leaf in place (an optimizer's update)
        want = np.fft.fftn(_numpy(x))
        with nvdispatch.fft.FFT(x, options={"inplace": True}) as f:
            f.plan()
            f.execute()
    np.testing.assert_allclose(_numpy(x), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


# -- out= ------------------------------------------------------------------------------------------------------------
OUT_VIEWS = ["expanded", "expanded-conj", "expanded-neg", "broadcast_to-conj"]


@pytest.mark.parametrize("view", OUT_VIEWS)
@pytest.mark.parametrize("func", ["fft", "ifft2"])
def test_out_with_overlapping_elements_is_refused_naming_out_before_the_transform(fft_front, materialising, func,
                                                                                  view):  # fmt: skip
    x = _complex(4, 8, seed=3)
    before = x.clone()
    z = torch.zeros(1, 8, dtype=torch.complex64)
    out = OVERLAPPING[view](z)
    with pytest.raises(errors.InvalidArgumentError, match="overlap") as info:
        getattr(nvdispatch.fft, func)(x, out=out)
    assert info.value.argument == "out"
    assert torch.equal(z, torch.zeros(1, 8, dtype=torch.complex64)) and torch.equal(x, before)


def test_out_a_leaf_that_requires_grad_is_refused_with_grad_mode_on_and_written_under_no_grad(fft_front):
    x = _complex(4, 8, seed=4)
    out = torch.zeros(4, 8, dtype=torch.complex64, requires_grad=True)
    with pytest.raises(errors.InvalidArgumentError, match="requires grad") as info:
        nvdispatch.fft.fft(x, out=out)
    assert info.value.argument == "out"
    with torch.no_grad():
        assert nvdispatch.fft.fft(x, out=out) is out
    want = np.fft.fft(_numpy(x))
    np.testing.assert_allclose(_numpy(out), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("view", ["expanded", "expanded-conj"])
def test_compiled_out_with_overlapping_elements_is_refused_naming_out(view, dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, o: nvdispatch.fft.fft(a, out=o), backend="aot_eager", fullgraph=True,
                             dynamic=dynamic)  # fmt: skip
    x = _complex(4, 8, seed=5)
    good = torch.empty(8, 4, dtype=torch.complex64).t()  # transposed: written, not refused
    assert compiled(x, good) is not None
    want = np.fft.fft(_numpy(x))
    np.testing.assert_allclose(_numpy(good), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    z = torch.zeros(1, 8, dtype=torch.complex64)
    with pytest.raises(errors.InvalidArgumentError, match="overlap") as info:
        compiled(x, OVERLAPPING[view](z))
    assert info.value.argument == "out"
    assert torch.equal(z, torch.zeros(1, 8, dtype=torch.complex64))


# -- CUDA (-m gpu) ---------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with CUDA")
@pytest.mark.parametrize("backend", [None, "cuda", "torch"])
def test_overlapping_targets_on_cuda_are_refused_naming_the_argument(backend):
    import contextlib

    scope = contextlib.nullcontext() if backend is None else nvdispatch.set_backend(backend, only=True)
    with scope:
        for view, make in OVERLAPPING.items():
            z = _complex(1, 8).cuda()
            before = z.clone()
            x = make(z)
            with pytest.raises(errors.InvalidArgumentError, match="overlap") as info:
                nvdispatch.fft.FFT(x, options={"inplace": True})
            assert info.value.argument == "x", view
            if x.shape == (4, 8):
                with pytest.raises(errors.InvalidArgumentError, match="overlap") as info:
                    nvdispatch.fft.fft(_complex(4, 8, seed=6).cuda(), out=x)
                assert info.value.argument == "out", view
            assert torch.equal(z, before), view
        x = _complex(8, 8, seed=7).cuda()
        v = x.conj()
        want = np.fft.fftn(_numpy(v), axes=(1,))
        with nvdispatch.fft.FFT(v, axes=(1,), options={"inplace": True}) as f:  # no overlap: written
            f.plan()
            assert f.execute() is v
        np.testing.assert_allclose(_numpy(v), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
