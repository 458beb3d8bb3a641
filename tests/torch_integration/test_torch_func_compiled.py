"""torch.compile of torch.func transforms (grad, vjp, jacrev, jacfwd, hessian, vmap of grad) over nvdispatch's
Torch operators: one program per operator family holds every transform, compiled static and ``dynamic=True`` with
0 graph breaks; values against float64 central differences of a NumPy oracle, and against the eager transforms.
The compiled backward runs nvdispatch's fused backward epilogs (the weight and bias gradient from one GEMM)."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402
from torch.func import grad, hessian, jacfwd, jacrev, vjp, vmap  # noqa: E402

import nvdispatch  # noqa: E402
from nvdispatch import fft as nfft  # noqa: E402
from nvdispatch.integrations.torch_mlp import fused_mlp  # noqa: E402

D = torch.float64
_K, _C = math.sqrt(2 / math.pi), 0.044715


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=D)


# -- the NumPy oracle: forward functions, and their derivatives by central differences -----------------------------
def _np_gelu(t):
    return 0.5 * t * (1 + np.tanh(_K * (t + _C * t**3)))


def _np_gelu_grad(t):
    th = np.tanh(_K * (t + _C * t**3))
    return 0.5 * (1 + th) + 0.5 * t * (1 - th * th) * _K * (1 + 3 * _C * t * t)


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _jac(f, args, argnum, eps=1e-6):
    """The Jacobian of NumPy ``f`` (one array or a tuple) in ``args[argnum]``: ``out.shape + x.shape`` each."""
    x = np.asarray(args[argnum], dtype=np.float64)
    columns = []
    for idx in np.ndindex(x.shape):
        shifted = []
        for sign in (1, -1):
            y = x.copy()
            y[idx] += sign * eps
            shifted.append(_tuple(f(*args[:argnum], y, *args[argnum + 1 :])))
        columns.append([(p - m) / (2 * eps) for p, m in zip(*shifted)])
    outs = [np.stack([c[k] for c in columns], axis=-1) for k in range(len(columns[0]))]
    outs = [o.reshape(*o.shape[:-1], *x.shape) for o in outs]
    return outs if len(outs) > 1 else outs[0]


def _hess(f, x, eps=1e-4):
    """The Hessian of scalar NumPy ``f`` at 1-D ``x`` by second central differences."""
    n = x.size
    h = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            total = 0.0
            for si, sj, w in ((1, 1, 1), (1, -1, -1), (-1, 1, -1), (-1, -1, 1)):
                y = x.copy()
                y[i] += si * eps
                y[j] += sj * eps
                total += w * f(y)
            h[i, j] = total / (4 * eps * eps)
    return h


def _check(got, want, tol):
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _check(g, w, tol)
        return
    g = got.detach().numpy() if isinstance(got, torch.Tensor) else got
    w = want.detach().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    assert g.shape == w.shape, (g.shape, w.shape)
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def _compiled(program, args, dynamic):
    """``program(*args)`` compiled (static: without ``fullgraph``, asserting Dynamo made one graph of it; dynamic:
    ``fullgraph=True``), with the number of frames Dynamo compiled."""
    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.utils.counters.clear()
    out = torch.compile(program, backend=counter, fullgraph=dynamic, dynamic=dynamic)(*args)
    assert counter.frame_count == 1, counter.frame_count
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    return out


# -- matmul ---------------------------------------------------------------------------------------------------------
def _mm(a, b, c=None, **kw):
    return nvdispatch.matmul(a, b, c, **kw)


def _matmul_program(a, w, bias, c, xs, g, ct, w2, b2):
    def loss_relu(a, w, bias):
        return _mm(a, w.mT, epilog="RELU_BIAS", epilog_inputs={"bias": bias}).sin().sum()

    def gelu_aux(a):
        y, aux = _mm(a, w.mT, epilog="GELU_AUX_BIAS", epilog_inputs={"bias": bias})
        return y, aux["gelu_aux"]

    def gelu_c(a):
        return _mm(a, w.mT, c, alpha=0.5, beta=2.0, epilog="GELU_BIAS", epilog_inputs={"bias": bias})

    def dgelu_bgrad(a, g):
        y, aux = _mm(a, w.mT, epilog="DGELU_BGRAD", epilog_inputs={"gelu_aux": g})
        return y, aux["dgelu_bgrad"]

    def loss_gelu(bias):
        return _mm(a, w.mT, epilog="GELU_BIAS", epilog_inputs={"bias": bias}).sin().sum()

    def loss_mlp(w, bias, w2, b2, x):
        return fused_mlp(x, [w, w2], [bias, b2], "gelu").sin().sum()

    _, vjp_fn = vjp(lambda w: _mm(a, w.mT, epilog="BIAS", epilog_inputs={"bias": bias}), w)
    return (
        grad(loss_relu, argnums=(0, 1, 2))(a, w, bias),
        jacrev(gelu_aux)(a),
        jacfwd(gelu_c)(a),
        vjp_fn(ct)[0],
        hessian(loss_gelu)(bias),
        vmap(grad(loss_relu), in_dims=(0, None, None))(xs, w, bias),
        jacrev(dgelu_bgrad, argnums=(0, 1))(a, g),
        vmap(grad(loss_mlp, argnums=(0, 1, 2, 3)), in_dims=(None, None, None, None, 0))(w, bias, w2, b2, xs),
        jacfwd(lambda a: fused_mlp(a, [w, w2], [bias, b2], "relu"))(a),
    )


def _matmul_oracle(a, w, bias, c, xs, g, ct, w2, b2):
    a, w, bias, c, xs, g, ct, w2, b2 = (t.numpy() for t in (a, w, bias, c, xs, g, ct, w2, b2))
    loss_relu = lambda a, w, bias: np.sin(np.maximum(a @ w.T + bias, 0)).sum()  # noqa: E731
    gelu_aux = lambda a: (_np_gelu(a @ w.T + bias), a @ w.T + bias)  # noqa: E731
    gelu_c = lambda a: _np_gelu(0.5 * (a @ w.T) + 2.0 * c + bias)  # noqa: E731

    def dgelu_bgrad(a, g):
        y = (a @ w.T) * _np_gelu_grad(g)
        return y, y.sum(0)

    loss_gelu = lambda bias: np.sin(_np_gelu(a @ w.T + bias)).sum()  # noqa: E731
    loss_mlp = lambda w, bias, w2, b2, x: np.sin(_np_gelu(x @ w.T + bias) @ w2.T + b2).sum()  # noqa: E731
    mlp_relu = lambda a: np.maximum(a @ w.T + bias, 0) @ w2.T + b2  # noqa: E731
    return (
        [_jac(loss_relu, (a, w, bias), k) for k in range(3)],
        _jac(gelu_aux, (a,), 0),
        _jac(gelu_c, (a,), 0),
        np.einsum("ij,ijkl->kl", ct, _jac(lambda w: a @ w.T + bias, (w,), 0)),
        _hess(loss_gelu, bias),
        np.stack([_jac(loss_relu, (x, w, bias), 0) for x in xs]),
        [list(t) for t in zip(_jac(dgelu_bgrad, (a, g), 0), _jac(dgelu_bgrad, (a, g), 1))],
        [np.stack([_jac(loss_mlp, (w, bias, w2, b2, x), k) for x in xs]) for k in range(4)],
        _jac(mlp_relu, (a,), 0),
    )


def _matmul_args():
    return (_rand(3, 5, seed=1), _rand(4, 5, seed=2), _rand(4, seed=3), _rand(3, 4, seed=4), _rand(2, 3, 5, seed=5),
            _rand(3, 4, seed=6), _rand(3, 4, seed=7), _rand(3, 4, seed=18), _rand(3, seed=19))  # fmt: skip


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_transforms_matmul(dynamic):
    """grad, jacrev (aux outputs), jacfwd (alpha/beta/c), vjp, hessian, vmap of grad and a backward epilog's
    Jacobians over nvdispatch.matmul, and per-example gradients and jacfwd through fused_mlp (FusedMLP's
    function), in one compiled program."""
    args = _matmul_args()
    got = _compiled(_matmul_program, args, dynamic)
    _check(got, _matmul_oracle(*args), 1e-6)
    _check(got, _matmul_program(*args), 1e-10)  # the eager transforms


def test_compiled_grad_runs_fused_backward_epilogs():
    """A compiled grad of a Linear-style layer takes the weight and bias gradient from one BGRADA GEMM."""
    graphs = []

    def record(gm, _inputs):
        graphs.append(gm)
        return gm

    a, w, bias = _rand(6, 5, seed=8), _rand(4, 5, seed=9), _rand(4, seed=10)

    def loss(w, bias):
        return _mm(a, w.mT, epilog="RELU_BIAS", epilog_inputs={"bias": bias}).sin().sum()

    got = torch.compile(grad(loss, argnums=(0, 1)), backend=aot_autograd(fw_compiler=record), fullgraph=True)(w, bias)
    _check(got, [_jac(lambda w, b: np.sin(np.maximum(a.numpy() @ w.T + b, 0)).sum(), (w.numpy(), bias.numpy()), k)
                 for k in range(2)], 1e-6)  # fmt: skip
    calls = [n for n in graphs[0].graph.nodes if n.target is torch.ops.nvdispatch.matmul.default]
    assert [n.args[12] for n in calls] == ["RELU_BIAS", "BGRADA"]


# -- fft and convolve -----------------------------------------------------------------------------------------------
def _sq(y):
    return (torch.view_as_real(y) if y.is_complex() else y).pow(2).sum()


def _fft_program(x, zr, x1, h, ct):
    z = torch.view_as_complex(zr)
    _, vjp_fn = vjp(lambda x: nfft.hfft(x.to(torch.complex128) * 1j + x, n=6), x1[:4])
    return (
        grad(lambda x: _sq(nfft.rfft(x, norm="ortho")))(x),
        jacrev(lambda zr: torch.view_as_real(nfft.fftn(torch.view_as_complex(zr), axes=(0, 1))))(zr),
        jacfwd(lambda x: nfft.irfftn(x.to(torch.complex128) * (1 + 2j), s=(4, 6)))(x),
        hessian(lambda x: nfft.convolve(x, h).sin().sum())(x1),
        vjp_fn(ct)[0],
        grad(lambda x: _sq(nfft.ihfft(x) * nfft.ifft2(z)[0, :4]))(x[0]),
        jacfwd(lambda x: torch.view_as_real(nfft.rfftn(x, s=(3, 8), norm="forward")))(x),
    )


def _fft_oracle(x, zr, x1, h, ct):
    x, zr, x1, h, ct = (t.numpy() for t in (x, zr, x1, h, ct))
    real = lambda y: np.stack([y.real, y.imag], -1)  # noqa: E731
    sq = lambda y: (np.abs(y) ** 2).sum()  # noqa: E731
    z = zr[..., 0] + 1j * zr[..., 1]
    hfft = lambda x: np.fft.hfft(x * 1j + x, n=6)  # noqa: E731
    return (
        _jac(lambda x: sq(np.fft.rfft(x, norm="ortho")), (x,), 0),
        _jac(lambda zr: real(np.fft.fftn(zr[..., 0] + 1j * zr[..., 1], axes=(0, 1))), (zr,), 0),
        _jac(lambda x: np.fft.irfftn(x * (1 + 2j), s=(4, 6), axes=(0, 1)), (x,), 0),
        _hess(lambda x: np.sin(np.fft.irfft(np.fft.rfft(x) * h, 8)).sum(), x1),
        np.einsum("i,ij->j", ct, _jac(hfft, (x1[:4],), 0)),
        _jac(lambda x: sq(np.fft.ihfft(x) * np.fft.ifft2(z)[0, :4]), (x[0],), 0),
        _jac(lambda x: real(np.fft.rfftn(x, s=(3, 8), axes=(0, 1), norm="forward")), (x,), 0),
    )


def _fft_args():
    h = torch.complex(_rand(5, seed=13), _rand(5, seed=14))
    return _rand(4, 6, seed=11), _rand(4, 6, 2, seed=12), _rand(8, seed=15), h, _rand(6, seed=16)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_transforms_fft(dynamic):
    """grad, jacrev, jacfwd, hessian and vjp over 1-D, n-D, real, complex and Hermitian transforms (``n``/``s``,
    ``axes``, ``norm``) and ``fft.convolve``, in one compiled program."""
    args = _fft_args()
    got = _compiled(_fft_program, args, dynamic)
    _check(got, _fft_oracle(*args), 1e-6)
    _check(got, _fft_program(*args), 1e-10)


def test_eager_hessian_of_nd_transforms():
    """hessian (forward over reverse mode) of an n-D transform, whose ``s``/``axes`` are lists: eagerly too."""
    x = _rand(3, 4, seed=17)

    def f(x):
        return nfft.irfftn(nfft.rfftn(x, s=(3, 4), axes=[0, 1]) * 1.5, s=[3, 4]).sin().sum()

    want = _hess(lambda v: np.sin(1.5 * v.reshape(3, 4)).sum(), x.numpy().reshape(-1))
    _check(hessian(f)(x).reshape(12, 12), want, 1e-5)


def test_transform_of_a_compiled_function_runs_eagerly():
    """grad/vmap of a torch.compile'd function (which Torch runs eagerly: Dynamo does not trace a transform entered
    outside it) gives the transform's values, as for Torch's own ops."""
    a, w, bias = _rand(3, 5, seed=20), _rand(4, 5, seed=21), _rand(4, seed=22)

    def loss(a):
        return _mm(a, w.mT, epilog="GELU_BIAS", epilog_inputs={"bias": bias}).sin().sum()

    got = grad(torch.compile(loss, backend="aot_eager"))(a)
    _check(got, _jac(lambda a: np.sin(_np_gelu(a @ w.numpy().T + bias.numpy())).sum(), (a.numpy(),), 0), 1e-6)
    got = vmap(torch.compile(lambda x: nfft.rfft(x, norm="ortho"), backend="aot_eager"))(a)
    _check(got, np.fft.rfft(a.numpy(), norm="ortho"), 1e-12)


def test_export_under_transforms():
    """torch.export of vmap over the operators exports the batched calls; under a differentiating transform, which
    Torch exports for no autograd Function, a typed error names the transform (strict and non-strict)."""
    b, bias = _rand(5, 4, seed=23), _rand(4, seed=24)

    class Batched(torch.nn.Module):
        def forward(self, a):
            return vmap(lambda a: _mm(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}))(a)

    class Grad(torch.nn.Module):  # b and bias inputs: Torch's strict export of grad fails on closed-over tensors
        def forward(self, a, b, bias):
            return grad(lambda a: _mm(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}).sum())(a)

    a = _rand(2, 3, 5, seed=25)
    got = torch.export.export(Batched(), (a,)).module()(a)
    _check(got, np.maximum(a.numpy() @ b.numpy() + bias.numpy(), 0), 1e-12)
    for strict in (True, False):
        with pytest.raises(nvdispatch.errors.InvalidArgumentError, match="torch.func.grad"):
            torch.export.export(Grad(), (a[0].clone(), b, bias), strict=strict)
