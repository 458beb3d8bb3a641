"""``torch.export`` of a module calling ``nvdispatch.matmul`` and ``nvdispatch.fft``: strict (Dynamo) and
non-strict (the default: Python runs on fake tensors) exports hold the ``nvdispatch::`` operators, run, take
other batch sizes with a dynamic dimension, and survive ``torch.export.save``/``load``."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import nvdispatch

torch = pytest.importorskip("torch")


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(6, 8, generator=g) * 0.4)
        self.b = torch.nn.Parameter(torch.randn(8, generator=g))

    def forward(self, x):
        h, aux = nvdispatch.matmul(x, self.w, epilog="GELU_AUX_BIAS", epilog_inputs={"bias": self.b})
        spectrum = nvdispatch.fft.rfft(h)
        return nvdispatch.fft.irfft(spectrum * 0.5, n=8) + aux["gelu_aux"]


def _oracle(model, x):
    w, b = (p.detach().double().numpy() for p in (model.w, model.b))
    t = x.double().numpy() @ w + b
    h = 0.5 * t * (1 + np.tanh(np.sqrt(2 / np.pi) * (t + 0.044715 * t**3)))
    return np.fft.irfft(np.fft.rfft(h) * 0.5, n=8) + t


def _operators(ep) -> set[str]:
    return {str(n.target) for n in ep.graph.nodes if n.op == "call_function" and "nvdispatch" in str(n.target)}


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_export_holds_the_operators_and_runs(strict):
    model, x = Layer(), torch.randn(4, 6)
    ep = torch.export.export(model, (x,), strict=strict)
    assert _operators(ep) == {"nvdispatch.matmul.default", "nvdispatch.fft.default"}
    np.testing.assert_allclose(ep.module()(x).detach().numpy(), _oracle(model, x), rtol=1e-5, atol=1e-5)


def test_export_with_a_dynamic_batch_saves_loads_and_runs():
    model = Layer()
    batch = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(model, (torch.randn(4, 6),), dynamic_shapes={"x": {0: batch}})
    buffer = io.BytesIO()
    torch.export.save(ep, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer)
    for rows in (2, 9, 33):
        x = torch.randn(rows, 6)
        np.testing.assert_allclose(loaded.module()(x).detach().numpy(), _oracle(model, x), rtol=1e-5, atol=1e-5)


def test_gelu_keeps_its_pre_activation_only_where_autograd_records():
    # GELU's backward formula needs the pre-activation: a call that autograd records (parameters requiring grad,
    # grad mode on) runs as GELU_AUX_BIAS and keeps it; under no_grad the graph holds the epilog asked for
    class Gelu(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b = torch.nn.Parameter(torch.randn(6, 8)), torch.nn.Parameter(torch.randn(8))

        def forward(self, x):
            return nvdispatch.matmul(x, self.w, epilog="GELU_BIAS", epilog_inputs={"bias": self.b})

    def epilogs(ep):
        return [n.args[12] for n in ep.graph.nodes if str(n.target) == "nvdispatch.matmul.default"]

    model, x = Gelu(), torch.randn(3, 6)
    assert epilogs(torch.export.export(model, (x,))) == ["GELU_AUX_BIAS"]
    with torch.no_grad():
        assert epilogs(torch.export.export(model, (x,))) == ["GELU_BIAS"]


def test_a_saved_export_loads_in_a_process_that_registers_the_operators(tmp_path):
    model, x = Layer(), torch.randn(5, 6)
    torch.export.save(torch.export.export(model, (x,)), tmp_path / "layer.pt2")
    torch.save(x, tmp_path / "x.pt")
    np.save(tmp_path / "want.npy", _oracle(model, x))
    code = textwrap.dedent(
        f"""
        import numpy as np, torch
        import nvdispatch.integrations.torch_ops
        program = torch.export.load({str(tmp_path / "layer.pt2")!r})
        got = program.module()(torch.load({str(tmp_path / "x.pt")!r})).detach().numpy()
        np.testing.assert_allclose(got, np.load({str(tmp_path / "want.npy")!r}), rtol=1e-5, atol=1e-5)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


class EveryTransform(torch.nn.Module):
    """Every ``nvdispatch.fft`` transform and ``convolve`` (the calls of the compile tests)."""

    def forward(self, x, z, h):
        from .test_torch_compile import every_transform

        return every_transform(x, z, h)


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_export_of_every_transform_and_convolve_with_a_dynamic_batch_runs(strict):
    from .test_torch_compile import numpy_transforms

    g = torch.Generator().manual_seed(3)

    def operands(rows):
        x = torch.randn(rows, 8, generator=g)
        z = torch.complex(torch.randn(rows, 8, generator=g), torch.randn(rows, 8, generator=g))
        return x, z, torch.complex(torch.randn(5, generator=g), torch.randn(5, generator=g))

    rows = torch.export.Dim("rows", min=2, max=64)
    ep = torch.export.export(EveryTransform(), operands(6), strict=strict,
                             dynamic_shapes={"x": {0: rows}, "z": {0: rows}, "h": None})  # fmt: skip
    assert _operators(ep) == {"nvdispatch.fft.default", "nvdispatch.convolve.default"}
    for n in (6, 3, 11):
        x, z, h = operands(n)
        got = ep.module()(x, z, h)
        want = numpy_transforms(x.double().numpy(), z.numpy().astype(np.complex128), h.numpy().astype(np.complex128))
        for key, w in want.items():
            np.testing.assert_allclose(got[key].numpy(), w, rtol=2e-5, atol=2e-5 * max(1, np.abs(w).max()),
                                       err_msg=f"{key} rows={n}")  # fmt: skip
