"""``torch.compile(fullgraph=True)`` of functions calling ``nvdispatch.matmul`` (every epilog, biases along N and
M, batched, float32/float16/bfloat16) and every ``nvdispatch.fft`` transform, static and ``dynamic=True``:
0 graph breaks (``fullgraph``), graphs made of ``nvdispatch::`` operators, results against the independent NumPy
float64 oracle. Most compiles use the ``aot_eager`` backend (Dynamo, the fake kernels and AOTAutograd, without
inductor's C++ build, slow on CI's two cores); one model goes through inductor end to end."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch._epilog import EPILOGS
from nvdispatch.errors import InvalidArgumentError, UnsupportedDtypeError
from tests.matmul.matmul_reference import assert_close, expected, to_numpy

torch = pytest.importorskip("torch")

BACKEND = "aot_eager"
M, K, N = 5, 4, 6


def _r(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    if dtype.is_complex:  # an imaginary part of its own: a conjugation shows
        x = torch.complex(x, torch.randn(*shape, generator=g, dtype=torch.float64))
    return x.to(dtype)


def _graphs(fn, *args, dynamic=False):
    """Compile ``fn`` with ``fullgraph=True`` and a backend that keeps the graphs; return (result, graphs)."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    result = torch.compile(fn, backend=keep, fullgraph=True, dynamic=dynamic)(*args)
    return result, graphs


def _targets(graphs) -> list[str]:
    return [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]


# -- matmul: every epilog ------------------------------------------------------------------------------------------
def _epilog_inputs(spec, bias, mask, pre):
    inputs = {}
    if "bias" in spec.inputs:
        inputs["bias"] = bias
    if "relu_aux" in spec.inputs:
        inputs["relu_aux"] = mask
    if "gelu_aux" in spec.inputs:
        inputs["gelu_aux"] = pre
    return inputs


def every_epilog(a, b, a3, bias_n, bias_m, c, mask, pre):
    out = {}
    for spec in EPILOGS.values():
        name = spec.epilog.name
        out[name] = nvdispatch.matmul(a, b, epilog=name, epilog_inputs=_epilog_inputs(spec, bias_n, mask, pre))
        if spec.has_bias:
            out[name + "/m"] = nvdispatch.matmul(a, b, epilog=spec.epilog, epilog_inputs={"bias": bias_m})
            out[name + "/batched"] = nvdispatch.matmul(a3, b, epilog=name, epilog_inputs={"bias": bias_n})
    out["alpha-beta-c"] = nvdispatch.matmul(a, b, c, alpha=2.0, beta=0.5)
    out["bgrad-m"] = nvdispatch.matmul(
        a, b, epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": mask}, options={"bgrad_axis": "m"}
    )
    return out


def _check_every_epilog(out, a, b, a3, bias_n, bias_m, c, mask, pre, dtype):
    for spec in EPILOGS.values():
        name = spec.epilog.name
        calls = [(name, a, _epilog_inputs(spec, bias_n, mask, pre))]
        if spec.has_bias:
            calls += [(name + "/m", a, {"bias": bias_m}), (name + "/batched", a3, {"bias": bias_n})]
        for key, x, inputs in calls:
            got = out[key]
            want, want_aux = expected(x, b, None, 1, None, name, inputs)
            if want_aux:
                got, aux = got
                assert sorted(aux) == sorted(want_aux), key
                for k, v in want_aux.items():
                    assert_close(aux[k], v, dtype if v.dtype != bool else "bool", f"{key} {k}")
            assert_close(got, want, dtype, key)
    assert_close(out["alpha-beta-c"], expected(a, b, c, 2.0, 0.5, None, {})[0], dtype, "alpha-beta-c")
    got, aux = out["bgrad-m"]
    want, want_aux = expected(a, b, None, 1, None, "DRELU_BGRAD", {"relu_aux": mask}, bgrad_axis="m")
    assert_close(got, want, dtype, "bgrad-m")
    assert_close(aux["drelu_bgrad"], want_aux["drelu_bgrad"], dtype, "bgrad-m drelu_bgrad", scale=4)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_every_epilog_compiles_into_one_graph_of_operators(dtype, dynamic):
    dt = getattr(torch, dtype)
    args = (
        _r(M, K, dtype=dt),
        _r(K, N, dtype=dt, seed=1),
        _r(2, M, K, dtype=dt, seed=2),
        _r(N, dtype=dt, seed=3),
        _r(M, 1, dtype=dt, seed=4),
        _r(M, N, dtype=dt, seed=5),
        _r(M, N, seed=6) > 0,
        _r(M, N, dtype=dt, seed=7),
    )
    out, graphs = _graphs(every_epilog, *args, dynamic=dynamic)
    assert len(graphs) == 1
    calls = _targets(graphs).count("nvdispatch.matmul.default")
    assert calls == sum(3 if s.has_bias else 1 for s in EPILOGS.values()) + 2
    _check_every_epilog(out, *args, dtype)


def test_every_epilog_keeps_one_dynamic_graph_over_other_sizes():
    # dynamic=True traced once: other M, K, N (and batch) run the same graph, every epilog and bias orientation
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(every_epilog, backend=BACKEND, fullgraph=True, dynamic=True)
    for m, k, n in ((M, K, N), (7, 3, 9), (4, 8, 5)):
        args = (_r(m, k), _r(k, n, seed=1), _r(2, m, k, seed=2), _r(n, seed=3), _r(m, 1, seed=4), _r(m, n, seed=5),
                _r(m, n, seed=6) > 0, _r(m, n, seed=7))  # fmt: skip
        _check_every_epilog(compiled(*args), *args, "float32")
    assert counters["stats"]["unique_graphs"] == 1


def test_dynamic_shapes_stay_symbolic_for_batch_and_matrix_sizes():
    w, bias = _r(K, N), _r(N)
    compiled = torch.compile(
        lambda x: nvdispatch.matmul(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias}),
        backend=BACKEND,
        fullgraph=True,
        dynamic=True,
    )
    from torch._dynamo.utils import counters

    counters.clear()
    for shape in ((3, 7, K), (4, 9, K), (5, 2, K)):
        x = _r(*shape)
        want = np.maximum(to_numpy(x).astype(np.float64) @ to_numpy(w) + to_numpy(bias), 0)
        np.testing.assert_allclose(compiled(x).numpy(), want, rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1  # one graph for every batch and M


# -- fft: every transform --------------------------------------------------------------------------------------------
def every_transform(x, z, h):
    F = nvdispatch.fft
    return {
        "fft": F.fft(z),
        "ifft": F.ifft(z, 5, 0, "ortho"),
        "fftn": F.fftn(z, s=(4, 10), axes=(0, 1)),
        "ifftn": F.ifftn(z, norm="forward"),
        "rfft": F.rfft(x, n=12),
        "irfft": F.irfft(z, n=9),
        "rfftn": F.rfftn(x),
        "irfftn": F.irfftn(z, s=(6, 10)),
        "hfft": F.hfft(z, n=10, norm="ortho"),
        "ihfft": F.ihfft(x),
        "fft2": F.fft2(x),
        "ifft2": F.ifft2(z, s=(3, 5)),
        "rfft2": F.rfft2(x, norm="ortho"),
        "irfft2": F.irfft2(z),
        "convolve": F.convolve(x, h),
        "int": F.fft(torch.arange(8)),
    }


def numpy_transforms(x, z, h):
    f = np.fft
    return {
        "fft": f.fft(z),
        "ifft": f.ifft(z, 5, 0, "ortho"),
        "fftn": f.fftn(z, s=(4, 10), axes=(0, 1)),
        "ifftn": f.ifftn(z, norm="forward"),
        "rfft": f.rfft(x, n=12),
        "irfft": f.irfft(z, n=9),
        "rfftn": f.rfftn(x),
        "irfftn": f.irfftn(z, s=(6, 10), axes=(0, 1)),
        "hfft": f.hfft(z, n=10, norm="ortho"),
        "ihfft": f.ihfft(x),
        "fft2": f.fft2(x),
        "ifft2": f.ifft2(z, s=(3, 5)),
        "rfft2": f.rfft2(x, norm="ortho"),
        "irfft2": f.irfft2(z),
        "convolve": f.irfft(f.rfft(x) * h, x.shape[-1]),
        "int": f.fft(np.arange(8.0)),
    }


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_every_transform_compiles_into_one_graph_of_operators(dynamic):
    x, z, h = _r(6, 8), _r(6, 8, dtype=torch.complex64, seed=1), _r(5, dtype=torch.complex64, seed=2)
    out, graphs = _graphs(every_transform, x, z, h, dynamic=dynamic)
    assert len(graphs) == 1
    targets = _targets(graphs)
    assert targets.count("nvdispatch.fft.default") == 15 and targets.count("nvdispatch.convolve.default") == 1
    want = numpy_transforms(to_numpy(x).astype(np.float64), to_numpy(z).astype(np.complex128), to_numpy(h))
    for key, w in want.items():
        got = out[key]
        assert str(got.dtype) == ("torch.complex64" if np.iscomplexobj(w) else "torch.float32"), key
        np.testing.assert_allclose(got.numpy(), w, rtol=2e-5, atol=2e-5 * max(1, np.abs(w).max()), err_msg=key)


_CONJUGATING = ["hfft-complex", "ihfft-real", "ifft-real", "fft-real", "irfft-complex", "ifftn-real", "hfft-real"]


@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
@pytest.mark.parametrize("case", _CONJUGATING)
def test_transforms_whose_torch_kernels_conjugate_lazily_compile_right(case, grad):
    # torch.fft conjugates lazily inside hfft (its input), ihfft and ifft of real input (their results); in a
    # compiled graph the operator's kernel runs below functionalization, which excludes the Conjugate key
    func, kind = case.split("-")
    x = _r(3, 4, dtype=torch.complex128 if kind == "complex" else torch.float64, seed=3).requires_grad_(grad)
    for norm in ("backward", "ortho", "forward"):
        fn = lambda x, norm=norm: getattr(nvdispatch.fft, func)(x, norm=norm)  # noqa: E731
        got = torch.compile(fn, backend=BACKEND, fullgraph=True)(x)
        want = getattr(np.fft, func)(x.detach().numpy(), norm=norm)
        np.testing.assert_allclose(got.detach().resolve_conj().numpy(), want, rtol=1e-12, atol=1e-12, err_msg=norm)


def test_out_is_written_inside_a_compiled_function():
    x = _r(6, 8, dtype=torch.complex64)
    out = torch.empty(6, 8, dtype=torch.complex64)
    got = torch.compile(lambda x, out: nvdispatch.fft.fft(x, out=out), backend=BACKEND, fullgraph=True)(x, out)
    assert got is out
    np.testing.assert_allclose(out.numpy(), np.fft.fft(x.numpy()), rtol=1e-5, atol=1e-5)


# -- inductor, end to end --------------------------------------------------------------------------------------------
class FusedModel(torch.nn.Module):
    """Two fused linear layers and a spectral filter, as a user writes them."""

    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(_r(8, 16, seed=10) * 0.3)
        self.b1 = torch.nn.Parameter(_r(16, seed=11))
        self.w2 = torch.nn.Parameter(_r(16, 8, seed=12) * 0.3)
        self.b2 = torch.nn.Parameter(_r(8, seed=13))

    def forward(self, x):
        h = nvdispatch.matmul(x, self.w1, epilog="RELU_BIAS", epilog_inputs={"bias": self.b1})
        y = nvdispatch.matmul(h, self.w2, epilog="GELU_BIAS", epilog_inputs={"bias": self.b2})
        return nvdispatch.fft.irfft(nvdispatch.fft.rfft(y) * 0.5, n=8)


def _reference(model, x):
    p = {k: v.detach().double() for k, v in model.named_parameters()}
    x = x.double().requires_grad_()
    ps = {k: v.requires_grad_() for k, v in p.items()}
    h = torch.relu(x @ ps["w1"] + ps["b1"])
    y = torch.nn.functional.gelu(h @ ps["w2"] + ps["b2"], approximate="tanh")
    out = torch.fft.irfft(torch.fft.rfft(y) * 0.5, n=8)
    return out, x, ps


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_model_trains_through_inductor(dynamic):
    model = FusedModel()
    compiled = torch.compile(model, fullgraph=True, dynamic=dynamic)
    for batch in (4, 7):
        x = _r(batch, 8, seed=batch).requires_grad_()
        out = compiled(x)
        weight = _r(*out.shape, seed=20)
        (out * weight).sum().backward()
        want, xr, ps = _reference(model, x.detach())
        (want * weight.double()).sum().backward()
        np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(x.grad.numpy(), xr.grad.numpy(), rtol=1e-4, atol=1e-5)
        for name, param in model.named_parameters():
            np.testing.assert_allclose(param.grad.numpy(), ps[name].grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
        model.zero_grad()


# -- dynamic=True: lengths taken from the input's sizes stay symbolic ---------------------------------------------
def transforms_of_sized_lengths(x, z):
    """Every transform with ``n``/``s`` computed from the inputs' (symbolic, under ``dynamic=True``) sizes."""
    F = nvdispatch.fft
    rows, cols = x.shape
    return {
        "fft": F.fft(z, n=cols + 2),
        "ifft": F.ifft(z, n=rows - 1, axis=0, norm="ortho"),
        "rfft": F.rfft(x, n=2 * cols),
        "irfft": F.irfft(z, n=2 * cols - 3),
        "hfft": F.hfft(z, n=cols + 1, norm="forward"),
        "ihfft": F.ihfft(x, n=cols - 1),
        "fftn": F.fftn(z, s=(rows + 1, cols)),
        "ifftn": F.ifftn(z, s=(cols, rows), axes=(1, 0)),
        "rfftn": F.rfftn(x, s=(rows, cols + 3)),
        "irfftn": F.irfftn(z, s=(rows, 2 * cols)),
        "fft2": F.fft2(x, s=(rows - 1, cols - 1)),
        "ifft2": F.ifft2(z, s=(2 * rows, cols)),
        "rfft2": F.rfft2(x, s=(rows, cols + 1), norm="ortho"),
        "irfft2": F.irfft2(z, s=(rows, cols + 5)),
        "convolve": F.convolve(x, F.rfft(x[0], n=cols + 4), n=cols + 4),
    }


def numpy_of_sized_lengths(x, z):
    f = np.fft
    rows, cols = x.shape
    return {
        "fft": f.fft(z, n=cols + 2),
        "ifft": f.ifft(z, n=rows - 1, axis=0, norm="ortho"),
        "rfft": f.rfft(x, n=2 * cols),
        "irfft": f.irfft(z, n=2 * cols - 3),
        "hfft": f.hfft(z, n=cols + 1, norm="forward"),
        "ihfft": f.ihfft(x, n=cols - 1),
        "fftn": f.fftn(z, s=(rows + 1, cols), axes=(0, 1)),
        "ifftn": f.ifftn(z, s=(cols, rows), axes=(1, 0)),
        "rfftn": f.rfftn(x, s=(rows, cols + 3), axes=(0, 1)),
        "irfftn": f.irfftn(z, s=(rows, 2 * cols), axes=(0, 1)),
        "fft2": f.fft2(x, s=(rows - 1, cols - 1)),
        "ifft2": f.ifft2(z, s=(2 * rows, cols)),
        "rfft2": f.rfft2(x, s=(rows, cols + 1), norm="ortho"),
        "irfft2": f.irfft2(z, s=(rows, cols + 5)),
        "convolve": f.irfft(f.rfft(x, n=cols + 4) * f.rfft(x[0], n=cols + 4), n=cols + 4),
    }


def test_lengths_computed_from_dynamic_sizes_stay_symbolic_for_every_transform():
    # a length derived from a symbolic size (n=2 * x.shape[-1]) must not fix the graph to the size seen first:
    # one graph serves every size (before: each new size recompiled, dynamic=True or not)
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(transforms_of_sized_lengths, backend=BACKEND, fullgraph=True, dynamic=True)
    for rows, cols in ((5, 6), (7, 9), (4, 12)):
        x = _r(rows, cols, dtype=torch.float64, seed=rows)
        z = _r(rows, cols, dtype=torch.complex128, seed=cols)
        out = compiled(x, z)
        for key, want in numpy_of_sized_lengths(x.numpy(), z.numpy()).items():
            got = out[key]
            assert tuple(got.shape) == want.shape, (key, rows, cols)
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-10, err_msg=f"{key} {rows}x{cols}")
    assert counters["stats"]["unique_graphs"] == 1


# -- FP8 ----------------------------------------------------------------------------------------------------------------
def test_fp8_products_with_scales_amax_and_aux_outputs_compile_into_one_graph():
    # the FP8 path's values are checked against its oracle eagerly (tests/fp8): compiled, the same bits come back
    e4m3 = torch.float8_e4m3fn
    a, b = _r(16, 32).clamp(-4, 4).to(e4m3), _r(32, 16, seed=1).clamp(-4, 4).to(e4m3)
    scale_d, bias = torch.tensor(2.0), _r(16, dtype=torch.bfloat16, seed=2)

    def fp8(a, b, scale_d, bias):
        amaxed = nvdispatch.matmul(a, b, epilog="RELU", quantization_scales={"a": 0.5, "d": scale_d},
                                   options={"result_type": e4m3, "result_amax": True})  # fmt: skip
        aux = nvdispatch.matmul(a, b, epilog="GELU_AUX_BIAS", epilog_inputs={"bias": bias},
                                options={"result_type": torch.bfloat16})  # fmt: skip
        return amaxed, aux

    out, graphs = _graphs(fp8, a, b, scale_d, bias, dynamic=True)
    assert len(graphs) == 1 and _targets(graphs).count("nvdispatch.matmul.default") == 2
    eager = fp8(a, b, scale_d, bias)
    for (got, got_aux), (want, want_aux) in zip(out, eager):
        assert got.dtype == want.dtype and torch.equal(got.float(), want.float())
        assert sorted(got_aux) == sorted(want_aux)
        for k, v in want_aux.items():
            assert got_aux[k].dtype == v.dtype and torch.equal(got_aux[k].float(), v.float()), k


def _spectral_layer(x, w, b, F):
    """A GELU layer, then 2-D and 1-D transforms with lengths from the sizes and a filtered convolution whose
    filter (one row) is broadcast over the rows: ``F`` is ``nvdispatch.fft`` or ``torch.fft``."""
    h = nvdispatch.matmul(x, w, epilog="GELU_BIAS", epilog_inputs={"bias": b}) if F is nvdispatch.fft else (
        torch.nn.functional.gelu(x @ w + b, approximate="tanh"))  # fmt: skip
    rows, cols = x.shape[0], h.shape[1]
    y = F.irfftn(F.rfft2(h, s=(rows + 1, 2 * cols)) * 0.5, s=(rows, cols))
    n = cols + 2
    if F is nvdispatch.fft:
        c = F.convolve(y, F.rfft(y[0], n=n), n=n)
    else:
        c = F.irfft(F.rfft(y, n=n) * F.rfft(y[0], n=n), n=n)
    return (c * c).sum()


def test_backward_through_a_dynamic_graph_keeps_one_graph_and_matches_float64():
    # the backward formulas compare no unrelated symbolic sizes: rows == the filter's length (5, at rows=5) is a
    # size like any other, not a recompile
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(lambda x, w, b: _spectral_layer(x, w, b, nvdispatch.fft), backend=BACKEND, fullgraph=True,
                             dynamic=True)  # fmt: skip
    w, b = _r(4, 6, dtype=torch.float64, seed=1).requires_grad_(), _r(6, dtype=torch.float64, seed=2).requires_grad_()
    for rows in (3, 5, 8):
        x = _r(rows, 4, dtype=torch.float64, seed=rows).requires_grad_()
        got = torch.autograd.grad(compiled(x, w, b), (x, w, b))
        want = torch.autograd.grad(_spectral_layer(x, w, b, torch.fft), (x, w, b))
        for g, r, name in zip(got, want, "xwb"):
            np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-10, atol=1e-10, err_msg=f"{name} rows={rows}")
    assert counters["stats"]["unique_graphs"] == 1


# -- the sample frequencies ----------------------------------------------------------------------------------------
def frequencies(x):
    F = nvdispatch.fft
    n = x.shape[-1]
    return (
        F.fftfreq(n, d=0.25, device=x.device),
        F.rfftfreq(n + 1, device=x.device, dtype=x.dtype),
        F.fftfreq(2 * n - 1, dtype=torch.float32, device=x.device) * 3,
    )


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_frequencies_on_a_torch_device_compile_with_the_eager_values(dynamic):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(frequencies, backend=BACKEND, fullgraph=True, dynamic=dynamic)
    for n in (6, 9, 16):
        x = _r(2, n, dtype=torch.float64)
        got = compiled(x)
        want = (np.fft.fftfreq(n, 0.25), np.fft.rfftfreq(n + 1), np.fft.fftfreq(2 * n - 1).astype(np.float32) * 3)
        for g, e, w in zip(got, frequencies(x), want):
            assert g.dtype == e.dtype and torch.equal(g, e)  # the eager function's dtype and bits
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-6 if g.dtype == torch.float32 else 1e-15)
    if dynamic:
        assert counters["stats"]["unique_graphs"] == 1


def test_frequencies_refuse_bad_arguments_at_trace_time_and_numpy_ones_break_the_graph():
    x = _r(2, 4)
    for call, error, argument in (
        (lambda x: nvdispatch.fft.fftfreq(0, device=x.device), InvalidArgumentError, "n"),
        (lambda x: nvdispatch.fft.rfftfreq(4, d=0.0, device=x.device), InvalidArgumentError, "d"),
        (lambda x: nvdispatch.fft.fftfreq(4, dtype=torch.int32, device=x.device), UnsupportedDtypeError, "dtype"),
    ):
        torch._dynamo.reset()
        with pytest.raises(error) as err:
            torch.compile(call, backend=BACKEND, fullgraph=True)(x)
        assert err.value.argument == argument
    torch._dynamo.reset()
    with pytest.raises(Exception, match="graph_break"):  # a NumPy result (no device): not a graph's value
        torch.compile(lambda x: x * torch.as_tensor(nvdispatch.fft.fftfreq(4)), backend=BACKEND, fullgraph=True)(x)


# -- scalars computed from dynamic sizes -----------------------------------------------------------------------------
def _scaled_attention(q, k, v, c, matmul):
    """``relu(softmax(q k^T / sqrt(d)) v + c / L)``: alpha and beta computed from the (symbolic) sizes."""
    s = matmul(q, k.mT, alpha=q.shape[-1] ** -0.5)
    return matmul(torch.softmax(s, -1), v, c, beta=1.0 / q.shape[-2], epilog="RELU")


def _torch_matmul(a, b, c=None, *, alpha=1.0, beta=None, epilog=None):
    out = alpha * (a @ b) + (0 if c is None else beta * c)
    return torch.relu(out) if epilog == "RELU" else out


def test_alpha_and_beta_computed_from_dynamic_sizes_stay_symbolic():
    # alpha=q.shape[-1] ** -0.5 is a symbolic float under dynamic=True: taken as it is (one graph for every size;
    # before, a typed error), forward and backward
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(lambda q, k, v, c: _scaled_attention(q, k, v, c, nvdispatch.matmul), backend=BACKEND,
                             fullgraph=True, dynamic=True)  # fmt: skip
    for length, d in ((5, 4), (7, 8), (3, 6)):
        q, k, v, c = (_r(2, length, d, dtype=torch.float64, seed=s).requires_grad_() for s in range(4))
        out = compiled(q, k, v, c)
        qn, kn, vn, cn = (t.detach().numpy() for t in (q, k, v, c))
        s = qn @ kn.transpose(0, 2, 1) / np.sqrt(d)
        p = np.exp(s - s.max(-1, keepdims=True))
        want = np.maximum((p / p.sum(-1, keepdims=True)) @ vn + cn / length, 0)
        np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-10, atol=1e-10)
        got = torch.autograd.grad(out.sum(), (q, k, v, c))
        ref = torch.autograd.grad(_scaled_attention(q, k, v, c, _torch_matmul).sum(), (q, k, v, c))
        for g, r in zip(got, ref):
            np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-9, atol=1e-9)
    assert counters["stats"]["unique_graphs"] == 1
