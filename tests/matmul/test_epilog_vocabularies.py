"""Every framework's step vocabulary (``_epilog_numpy``, ``_epilog_torch``, ``_epilog_cupy``), in each of its modes,
runs every epilog's steps to the test tree's oracle, NaN/inf traps included. The CuPy vocabulary runs here with
NumPy standing in for CuPy (the same calls exist in both), so its logic is checked without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from matmul_reference import epilog_reference

from nvdispatch import Epilog, _epilog_cupy
from nvdispatch._epilog import INPUTS, apply_steps, spec_of
from nvdispatch._epilog_numpy import NumpyEpilogOps

torch = pytest.importorskip("torch")

M, N, K = 6, 5, 3


def _case(epilog: Epilog, dtype: str, seed: int):
    rng = np.random.default_rng(seed)
    d = rng.uniform(-3, 3, (2, M, N))
    d[0, 0, :3] = [np.nan, np.inf, -np.inf]  # the traps: NaN through RELU, inf upstream gradients
    inputs = {}
    if "bias" in spec_of(epilog).inputs:
        inputs["bias"] = rng.uniform(-1, 1, (1, N))
    if "relu_aux" in spec_of(epilog).inputs:
        inputs["relu_aux"] = rng.random((2, M, N)) > 0.5
        inputs["relu_aux"][0, 0, :3] = False
    if "gelu_aux" in spec_of(epilog).inputs:
        inputs["gelu_aux"] = rng.uniform(-3, 3, (2, M, N))
    a, b = rng.uniform(-1, 1, (2, M, K)), rng.uniform(-1, 1, (2, K, N))
    cast = lambda x: x if x.dtype == bool else x.astype(dtype)  # noqa: E731
    return cast(d), {k: cast(v) for k, v in inputs.items()}, cast(a), cast(b)


def _numpy(inplace):
    return lambda x: x, NumpyEpilogOps(inplace), lambda x: x


def _torch(inplace):
    from nvdispatch._epilog_torch import TorchEpilogOps

    return torch.from_numpy, TorchEpilogOps(inplace), lambda x: x.numpy()


def _cupy_on_numpy(monkeypatch):
    monkeypatch.setattr(_epilog_cupy, "_cupy", lambda: np)
    return lambda x: x, _epilog_cupy.CupyEpilogOps(), lambda x: x


VOCABULARIES = ["numpy-inplace", "numpy-plain", "torch-inplace", "torch-plain", "cupy(numpy)-inplace"]


@pytest.mark.parametrize("vocabulary", VOCABULARIES)
@pytest.mark.parametrize("epilog", [e for e in Epilog if spec_of(e).steps], ids=lambda e: e.name)
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_vocabulary_gives_the_oracle(vocabulary, epilog, dtype, monkeypatch):
    spec = spec_of(epilog)
    d, inputs, a, b = _case(epilog, dtype, int(epilog))
    if vocabulary.startswith("cupy"):
        to, ops, back = _cupy_on_numpy(monkeypatch)
    else:
        to, ops, back = (_numpy if vocabulary.startswith("numpy") else _torch)(vocabulary.endswith("inplace"))
    x = to(d.copy())
    prepared = {name: to(value) for name, value in inputs.items()}
    out, aux = apply_steps(spec, x, prepared, ops, a=to(a), b=to(b), bgrad_axis="n")
    wide = {name: v if v.dtype == bool else v.astype(np.float64) for name, v in inputs.items()}
    want, want_aux = epilog_reference(
        epilog.name, d.astype(np.float64), wide, a=a.astype(np.float64), b=b.astype(np.float64)
    )
    tol = {"float64": 1e-12, "float32": 1e-5, "float16": 4e-3}[dtype]
    got = back(out).astype(np.float64)
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=tol, atol=tol * 4)
    np.testing.assert_array_equal(got[~finite], want[~finite])  # inf stays inf, NaN only where the oracle has it
    assert set(aux) == set(spec.outputs)
    for name, value in aux.items():
        g, w = back(value), want_aux[name]
        if g.dtype == bool:
            np.testing.assert_array_equal(g, w, err_msg=name)
        else:
            assert g.dtype == np.dtype(dtype), f"{name} comes back as {g.dtype}"
            ok = np.isfinite(w)
            np.testing.assert_allclose(g.astype(np.float64)[ok], w[ok], rtol=tol * 4, atol=tol * 16, err_msg=name)


def test_input_handlers_prepare_for_broadcasting_against_the_promoted_result():
    class P:
        promoted_shape = (2, M, N)

    assert INPUTS["bias"].prepare(np.ones(N), P).shape == (1, N)
    assert INPUTS["bias"].prepare(np.ones((2, M, 1)), P).shape == (2, M, 1)
    assert INPUTS["relu_aux"].prepare(np.ones(2 * M * N, bool), P).shape == (2, M, N)
    assert INPUTS["relu_aux"].mask_of == "RELU_AUX" and INPUTS["gelu_aux"].mask_of is None
