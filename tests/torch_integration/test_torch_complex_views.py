"""Genuinely complex operands through the ``nvdispatch::`` operators, eagerly, under ``torch.compile(fullgraph=True)``
(static and ``dynamic=True``) and ``torch.export``: nonzero imaginary parts, and the lazy views Torch hands out
(conjugate views, negative views such as ``z.conj().imag``, ``torch._neg_view``), strided and transposed layouts,
each transform in the three norms. Values against ``numpy.fft`` and NumPy products in complex128; gradients
(upstream gradients that are lazy views too) against ``torch.autograd`` of ``torch.fft`` and ``torch.matmul`` in
double precision. A real-valued complex input cannot tell a conjugation apart from none: these can."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch

torch = pytest.importorskip("torch")

BACKEND = "aot_eager"
MODES = ["eager", "static", "dynamic"]
NORMS = ("backward", "ortho", "forward")
COMPLEX_INPUT = ("fft", "ifft", "fftn", "ifftn", "irfft", "irfftn", "hfft", "fft2", "ifft2", "irfft2")
REAL_INPUT = ("rfft", "rfftn", "ihfft", "rfft2")
TRANSFORMS = COMPLEX_INPUT + REAL_INPUT


def _complex(*shape, dtype=torch.complex128, seed=0):
    g = torch.Generator().manual_seed(seed)
    parts = torch.randn(2, *shape, generator=g, dtype=torch.float64)
    return torch.complex(parts[0], parts[1]).to(dtype)


def _run(fn, mode):
    if mode == "eager":
        return fn
    return torch.compile(fn, backend=BACKEND, fullgraph=True, dynamic=mode == "dynamic")


def _numpy(x: torch.Tensor) -> np.ndarray:
    """The values ``x`` stands for (its lazy conjugation and negation applied), in double precision."""
    x = x.detach().resolve_conj().resolve_neg().numpy()
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def _close(got, want, tol, what):
    got = _numpy(got)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()), err_msg=what)


# -- fft -------------------------------------------------------------------------------------------------------------
#: lazy views and layouts of a complex (6, 8) signal: complex transforms take them as they are, the real-input ones
#: take a real view made from them (``.imag`` of a conjugate view is a negative view)
VIEWS = {
    "plain": lambda z: z,
    "conj": lambda z: z.conj(),
    "neg": lambda z: torch._neg_view(z),
    "strided": lambda z: z[::2, 1::2],
    "transposed": lambda z: z.t(),
    "conj-transposed": lambda z: z.conj().t(),
    "conj-strided": lambda z: z.conj()[:, 1::2],
}


def _real_view(v: torch.Tensor) -> torch.Tensor:
    return v.imag if v.is_complex() else v


def every_transform_of_every_view(views: dict, inner: torch.Tensor) -> dict:
    """Each transform of each view (the norm changing from view to view: each transform meets the three) and of
    views made inside the compiled function from ``inner``."""
    F = nvdispatch.fft
    out = {}
    for i, (name, v) in enumerate(views.items()):
        for j, func in enumerate(TRANSFORMS):
            x = _real_view(v) if func in REAL_INPUT else v
            out[name, func] = getattr(F, func)(x, norm=NORMS[(i + j) % 3])
    made = inner.conj().t()
    out["inner", "hfft"] = F.hfft(made, n=9, norm="ortho")
    out["inner", "ifftn"] = F.ifftn(made, s=(3, 10), norm="forward")
    out["inner", "ihfft"] = F.ihfft(made.imag, axis=0)
    out["inner", "irfft2"] = F.irfft2(torch._neg_view(inner), s=(5, 7))
    out["inner", "fft-out"] = F.fft(inner.conj(), out=torch.empty_like(inner))
    return out


def numpy_of_every_view(views: dict, inner: np.ndarray) -> dict:
    f = np.fft
    out = {}
    for i, (name, v) in enumerate(views.items()):
        for j, func in enumerate(TRANSFORMS):
            x = v.imag if func in REAL_INPUT else v
            out[name, func] = getattr(f, func)(x, norm=NORMS[(i + j) % 3])
    made = inner.conj().T
    out["inner", "hfft"] = f.hfft(made, n=9, norm="ortho")
    out["inner", "ifftn"] = f.ifftn(made, s=(3, 10), axes=(0, 1), norm="forward")
    out["inner", "ihfft"] = f.ihfft(made.imag, axis=0)
    out["inner", "irfft2"] = f.irfft2(-inner, s=(5, 7))
    out["inner", "fft-out"] = f.fft(inner.conj())
    return out


#: both precisions eagerly, one in each kind of graph (the views' handling does not depend on the precision)
MODE_DTYPES = [("eager", "complex128"), ("eager", "complex64"), ("static", "complex128"), ("dynamic", "complex64")]


@pytest.mark.parametrize(("mode", "dtype"), MODE_DTYPES)
def test_every_transform_of_lazy_views_strides_and_norms(mode, dtype):
    z = _complex(6, 8, dtype=getattr(torch, dtype))
    views = {name: make(z) for name, make in VIEWS.items()}
    assert views["conj"].is_conj() and views["neg"].is_neg() and views["conj"].imag.is_neg()
    got = _run(every_transform_of_every_view, mode)(views, _complex(4, 6, dtype=z.dtype, seed=1))
    want = numpy_of_every_view({k: _numpy(v) for k, v in views.items()}, _numpy(_complex(4, 6, seed=1)))
    tol = 1e-12 if dtype == "complex128" else 2e-5
    assert got.keys() == want.keys()
    for key, w in want.items():
        _close(got[key], w, tol, str(key))
        single = dtype == "complex64"
        assert got[key].dtype == {
            (True, True): torch.complex64, (True, False): torch.float32,
            (False, True): torch.complex128, (False, False): torch.float64,
        }[single, np.iscomplexobj(w)], key  # fmt: skip


#: upstream gradients as Torch's autograd hands them to a backward formula
GRAD_VIEWS = {
    "conj": lambda w: w.conj() if w.is_complex() else w,
    "neg": lambda w: torch._neg_view(w) if w.is_complex() else -w,
    "conj-column-major": lambda w: w.mT.contiguous().mT.conj() if w.is_complex() else w.mT.contiguous().mT,
}


def _transform_all(module, z):
    """Each transform of a conjugate view of ``z`` (real-input ones: its negative imaginary part), norms rotating."""
    zc = z.conj()
    return [
        getattr(module, func)(zc.imag if func in REAL_INPUT else zc[:, 1:].t(), norm=NORMS[j % 3])
        for j, func in enumerate(TRANSFORMS)
    ]


@pytest.mark.parametrize("mode", MODES)
def test_gradients_through_lazy_views_against_torch_fft(mode):
    z = _complex(6, 8).requires_grad_()
    ours = _run(lambda z: _transform_all(nvdispatch.fft, z), mode)(z)
    ref_z = z.detach().clone().requires_grad_()
    reference = _transform_all(torch.fft, ref_z)
    upstream = []
    for k, r in enumerate(reference):
        w = _complex(*r.shape, seed=10 + k)
        view = list(GRAD_VIEWS.values())[k % len(GRAD_VIEWS)]
        upstream.append(view(w if r.is_complex() else w.real.contiguous()))
    (got,) = torch.autograd.grad(ours, z, upstream)
    (want,) = torch.autograd.grad(reference, ref_z, upstream)
    for func, o, r in zip(TRANSFORMS, ours, reference):
        _close(o, _numpy(r), 1e-12, func)
    _close(got, _numpy(want), 1e-11, "dz")


# -- matmul ----------------------------------------------------------------------------------------------------------
#: (a's shape, b's shape): 2-D, batched (one side, both sides, broadcast) and vectors
SHAPES = [((5, 4), (4, 6)), ((2, 5, 4), (4, 6)), ((3, 5, 4), (3, 4, 6)), ((2, 1, 5, 4), (3, 4, 6)), ((4,), (4, 6)),
          ((5, 4), (4,))]  # fmt: skip
OPERAND_VIEWS = {
    "plain": lambda x: x,
    "conj": lambda x: x.conj(),
    "neg": lambda x: torch._neg_view(x),
    "conj-column-major": lambda x: x.mT.contiguous().mT.conj() if x.dim() > 1 else x.conj(),
    "adjoint-of-adjoint": lambda x: x.mH.contiguous().mH if x.dim() > 1 else x.conj().resolve_conj().conj(),
    "strided": lambda x: x.repeat_interleave(2, dim=-1)[..., ::2],
}


def _pairs(views):
    """Each view of ``a`` with two views of ``b``: every view on both sides, the conjugate with each other view."""
    items = list(views.items())
    return [(x, items[(i + 1) % len(items)]) for i, x in enumerate(items)] + [(items[1], x) for x in items]


def products(operands, views):
    """Every pairing of operand views of ``a`` and ``b`` and ``alpha * conj(a) @ b + beta * conj(c)``, for each
    ``(a, b, c)`` of ``operands`` (one compiled graph for all)."""
    out = {}
    for k, (a, b, c) in enumerate(operands):
        for (an, av), (bn, bv) in _pairs(views):
            out[k, an, bn] = nvdispatch.matmul(av(a), bv(b))
        out[k, "abc"] = nvdispatch.matmul(a.conj(), b, c.conj(), alpha=1 - 2j, beta=0.5j)
    return out


def numpy_products(operands, views):
    out = {}
    for k, (a, b, c) in enumerate(operands):
        for (an, av), (bn, bv) in _pairs(views):
            out[k, an, bn] = _numpy(av(a)) @ _numpy(bv(b))
        out[k, "abc"] = (1 - 2j) * (_numpy(a).conj() @ _numpy(b)) + 0.5j * _numpy(c).conj()
    return out


def _operands(dtype, shapes=SHAPES):
    operands = []
    for k, (sa, sb) in enumerate(shapes):
        a, b = _complex(*sa, dtype=dtype, seed=k), _complex(*sb, dtype=dtype, seed=20 + k)
        operands.append((a, b, _complex(*torch.matmul(a, b).shape, dtype=dtype, seed=40 + k)))
    return operands


@pytest.mark.parametrize(("mode", "dtype"), MODE_DTYPES)
def test_complex_products_of_lazy_views(mode, dtype):
    dt = getattr(torch, dtype)
    operands = _operands(dt)
    got = _run(products, mode)(operands, OPERAND_VIEWS)
    want = numpy_products(operands, OPERAND_VIEWS)
    tol = 1e-12 if dtype == "complex128" else 2e-5
    assert got.keys() == want.keys()
    for key, w in want.items():
        assert got[key].dtype == dt, key
        _close(got[key], w, tol, f"{SHAPES[key[0]]} {key[1:]}")


def _loss_terms(mm, operands):
    """Products of conjugate, negative and column-major views of each ``a`` and ``b`` (all differentiable)."""
    terms = []
    for a, b, c in operands:
        ac, bn = a.conj(), torch._neg_view(b)
        terms += [
            mm(ac, b),
            mm(a, bn),
            mm(a.mT.contiguous().mT.conj(), b.conj()),
            mm(ac, bn, c.conj(), alpha=2 + 1j, beta=-0.5j),
        ]
    return terms


def _reference_mm(a, b, c=None, alpha=1, beta=None):
    product = torch.matmul(a, b)
    return product if c is None else alpha * product + beta * c


@pytest.mark.parametrize(("mode", "dtype"), MODE_DTYPES)
def test_complex_product_gradients_against_torch_matmul(mode, dtype):
    dt = getattr(torch, dtype)
    operands = _operands(dt, SHAPES[:4])
    leaves = [[x.clone().requires_grad_() for x in abc] for abc in operands]
    ours = _run(lambda ops: _loss_terms(nvdispatch.matmul, ops), mode)(leaves)
    ref_leaves = [[x.clone().requires_grad_() for x in abc] for abc in operands]
    reference = _loss_terms(_reference_mm, ref_leaves)
    views = [*GRAD_VIEWS.values(), lambda w: w]
    upstream = [views[j % len(views)](_complex(*r.shape, dtype=dt, seed=60 + j)) for j, r in enumerate(reference)]
    flat, ref_flat = [x for abc in leaves for x in abc], [x for abc in ref_leaves for x in abc]
    got = torch.autograd.grad(ours, flat, upstream)
    want = torch.autograd.grad(reference, ref_flat, upstream)
    tol = 1e-12 if dtype == "complex128" else 2e-5
    for j, (o, r) in enumerate(zip(ours, reference)):
        _close(o, _numpy(r), tol, f"{SHAPES[j // 4]} term {j % 4}")
    for j, (g, w) in enumerate(zip(got, want)):
        _close(g, _numpy(w), tol * 10, f"{SHAPES[j // 3]} d{'abc'[j % 3]}")


# -- torch.export ----------------------------------------------------------------------------------------------------
class Spectral(torch.nn.Module):
    """A complex weight applied to conjugate and negative views, and transforms of the results."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(_complex(8, 8, seed=5))

    def forward(self, z):
        zc = z.conj()
        h = nvdispatch.matmul(zc, self.w.conj())
        F = nvdispatch.fft
        return [
            F.hfft(zc, norm="ortho"),
            F.fft(zc.mT, norm="forward"),
            F.ifft(torch._neg_view(z)),
            F.irfft(zc[:, ::2]),
            F.ihfft(zc.imag, norm="forward"),
            h,
            F.fft2(h.conj(), norm="ortho"),
            nvdispatch.matmul(z, self.w.mH),
        ]


def _spectral_numpy(model, z):
    f, z, w = np.fft, _numpy(z), _numpy(model.w)
    zc = z.conj()
    h = zc @ w.conj()
    return [f.hfft(zc, norm="ortho"), f.fft(zc.T, norm="forward"), f.ifft(-z), f.irfft(zc[:, ::2]),
            f.ihfft(zc.imag, norm="forward"), h, f.fft2(h.conj(), norm="ortho"), z @ w.conj().T]  # fmt: skip


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_export_of_complex_views_runs_right_for_other_inputs_and_batches(strict):
    model = Spectral()
    batch = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(model, (_complex(6, 8),), strict=strict, dynamic_shapes=({0: batch},))
    for z in (_complex(6, 8, seed=1), _complex(9, 8, seed=2).conj(), _complex(3, 16, seed=3)[:, ::2]):
        for k, (g, w) in enumerate(zip(ep.module()(z), _spectral_numpy(model, z))):
            _close(g, w, 1e-12, f"output {k} of a {z.shape} input (conj={z.is_conj()})")


# -- CUDA (GPU machine) ----------------------------------------------------------------------------------------------
def _inductor_drops_negation() -> bool:
    """Whether Torch's inductor reads the real part of a negative view as the base's (``torch._neg_view(z).imag``
    compiled returns ``z.imag``; pure Torch, Torch 2.11 and 2.13): any consumer of it, ``torch.fft.rfft``
    included, then sees the wrong values."""
    z = _complex(2, 3)
    got = torch.compile(lambda z: torch._neg_view(z).imag * 1.0, fullgraph=True)(z)
    return not torch.equal(got, -z.imag)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with CUDA")
@pytest.mark.parametrize("mode", ["eager", "inductor"])
def test_lazy_views_on_cuda(mode):
    run = (lambda fn: fn) if mode == "eager" else (lambda fn: torch.compile(fn, fullgraph=True))
    z = _complex(6, 8)
    views = {name: make(z.cuda()) for name, make in VIEWS.items()}
    got = run(every_transform_of_every_view)(views, _complex(4, 6, seed=1).cuda())
    want = numpy_of_every_view({k: _numpy(v.cpu()) for k, v in views.items()}, _numpy(_complex(4, 6, seed=1)))
    for key, w in want.items():
        if mode == "inductor" and key[0] == "neg" and key[1] in REAL_INPUT and _inductor_drops_negation():
            continue  # Torch's own transforms of it are as wrong under inductor (see _inductor_drops_negation)
        _close(got[key].cpu(), w, 1e-12, str(key))
    operands = _operands(torch.complex128)
    got = run(products)([tuple(x.cuda() for x in abc) for abc in operands], OPERAND_VIEWS)
    for key, w in numpy_products(operands, OPERAND_VIEWS).items():
        _close(got[key].cpu(), w, 1e-12, f"{SHAPES[key[0]]} {key[1:]}")


#: lazy views a call alternates with the plain tensor (of the same layout where the view keeps it)
ALTERNATING = {
    "conj": lambda z: z.conj(),
    "neg": lambda z: torch._neg_view(z),
    "conj-transposed": lambda z: z.conj().t(),
    "conj-slice": lambda z: z.conj()[1:, ::2],
    "conj-imag": lambda z: z.conj().imag,
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with CUDA")
@pytest.mark.parametrize("backend", [None, "cuda", "torch"])
def test_alternating_lazy_views_on_cuda(backend):
    """A plain CUDA tensor and its lazy views in turn, three times over (the plain calls' keys, their memo and the
    compiled front warm), through the default executor and each one named: every call gets its own view's values,
    the input untouched; stateful objects read a lazy view's values as they are at each execute."""
    import contextlib

    z, w = _complex(6, 8).cuda(), _complex(8, 6, seed=1).cuda()
    before = z.clone()
    scope = contextlib.nullcontext() if backend is None else nvdispatch.set_backend(backend, only=True)
    with scope:
        for _ in range(3):
            for name, make in ALTERNATING.items():
                for what, x in (("plain", make(z).resolve_conj().resolve_neg()), (name, make(z))):
                    if x.is_complex() or backend != "cuda":  # the cuda executor takes no real input to a c2c
                        _close(nvdispatch.fft.fft(x).cpu(), np.fft.fft(_numpy(x.cpu())), 1e-12, f"fft of {what}")
                    else:
                        _close(nvdispatch.fft.rfft(x).cpu(), np.fft.rfft(_numpy(x.cpu())), 1e-12, f"rfft of {what}")
                    if x.is_complex():
                        b = w[: x.shape[-1]]
                        want = _numpy(x.cpu()) @ _numpy(b.cpu())
                        _close(nvdispatch.matmul(x, b).cpu(), want, 1e-12, f"{what} @ plain")
                        a = w.t()[:, : x.shape[0]]
                        _close(
                            nvdispatch.matmul(a, x).cpu(), _numpy(a.cpu()) @ _numpy(x.cpu()), 1e-12, f"plain @ {what}"
                        )
        zc = z.conj()
        with nvdispatch.fft.FFT(zc, axes=(1,)) as f, nvdispatch.Matmul(zc, w.conj()) as mm:
            f.plan()
            mm.plan()
            for k in range(2):
                _close(f.execute().cpu(), np.fft.fft(_numpy(zc.cpu()), axis=1), 1e-12, f"stateful fft, execute {k}")
                _close(mm.execute().cpu(), _numpy(zc.cpu()) @ _numpy(w.conj().cpu()), 1e-12, f"stateful matmul {k}")
                z.mul_(1 + 1j)  # the view's values change in place between executes
                before.mul_(1 + 1j)
    assert torch.equal(z, before)
