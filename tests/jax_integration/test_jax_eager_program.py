"""The eager JAX route of transforms no executor takes as they are (JAX GPU arrays: real input to a complex
transform, hfft/ihfft, padding) runs one compiled XLA program per problem and backend state, not JAX's operations
one by one. Its XLA part is the same on the CPU, which these tests use; NumPy float64 is the oracle."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch

jax = pytest.importorskip("jax")
jnp = jax.numpy

from nvdispatch._detect import detect  # noqa: E402
from nvdispatch._fft_problem import build_fft_problem  # noqa: E402
from nvdispatch.integrations import jax_fft  # noqa: E402

X = np.random.default_rng(5).standard_normal((8, 40)).astype(np.float32)
Z = (X + 1j * X[::-1]).astype(np.complex64)


@pytest.mark.parametrize(
    ("func", "data", "n", "norm"),
    [("fft", X, 48, "ortho"), ("ifft", X, 30, "backward"), ("hfft", Z, None, "forward"), ("ihfft", X, 50, "ortho")],
)
def test_one_program_per_problem_matches_numpy(func, data, n, norm):
    with jax.default_device(jax.devices("cpu")[0]):
        x = jnp.asarray(data)
        info = detect("x", x)
        problem = build_fft_problem(func, info, info.framework, info.device, n, -1, None, None, norm)
        program = jax_fft._eager_program(problem, nvdispatch.get_state())
        got = program(x)
        assert jax_fft._eager_program(problem, nvdispatch.get_state()) is program  # compiled once, then reused
    want = getattr(np.fft, func)(data.astype(np.complex128 if data.dtype.kind == "c" else np.float64), n=n, norm=norm)
    assert got.shape == want.shape and np.dtype(got.dtype) == np.dtype(problem.result_dtype)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    np.testing.assert_array_equal(np.asarray(x), data)  # input untouched


def test_a_backend_state_change_gets_its_own_program():
    with jax.default_device(jax.devices("cpu")[0]):
        x = jnp.asarray(X)
        info = detect("x", x)
        problem = build_fft_problem("fft", info, info.framework, info.device, 64, -1, None, None, "backward")
        outer = jax_fft._eager_program(problem, nvdispatch.get_state())
        with nvdispatch.skip_backend("numpy"):
            inner = jax_fft._eager_program(problem, nvdispatch.get_state())
    assert inner is not outer
