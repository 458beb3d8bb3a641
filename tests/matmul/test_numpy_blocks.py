"""The NumPy executor's block machinery: results are the same however the result is cut into blocks
(row blocks of one matrix, groups of small matrices, the whole at once) and on one or several threads."""

from __future__ import annotations

import numpy as np
import pytest
from matmul_reference import expected

import nvdispatch
from nvdispatch import Epilog
from nvdispatch._epilog import spec_of
from nvdispatch.executors.numpy_matmul import NumpyMatmulPlan

CASES = [
    # (a shape, b shape, bias shape or None)
    ((37, 6), (6, 9), (9,)),
    ((37, 6), (6, 9), (37, 1)),
    ((4, 11, 6), (6, 9), (9,)),
    ((4, 11, 6), (4, 6, 9), (4, 1, 9)),
    ((2, 3, 11, 6), (6, 9), (3, 11, 1)),
    ((6,), (6, 9), (9,)),
]


@pytest.mark.parametrize("epilog", list(Epilog), ids=lambda e: e.name)
@pytest.mark.parametrize("a_shape,b_shape,bias_shape", CASES)
@pytest.mark.parametrize("block_bytes,threads", [(8 * 9 * 2, 1), (8 * 9 * 5, 2), (8 * 9 * 11 * 2, 2), (0, 1)])
@pytest.mark.parametrize("bgrad_axis", ["n", "m"])
def test_blocks_and_threads_do_not_change_results(
    epilog, a_shape, b_shape, bias_shape, block_bytes, threads, bgrad_axis
):
    spec = spec_of(epilog)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    result_shape = np.matmul(a, b).shape
    inputs = {}
    if spec.has_bias:
        inputs["bias"] = rng.standard_normal(bias_shape)
    if "relu_aux" in spec.inputs:
        inputs["relu_aux"] = rng.standard_normal(result_shape) > 0
    if "gelu_aux" in spec.inputs:
        inputs["gelu_aux"] = rng.standard_normal(result_shape)
    c = rng.standard_normal(result_shape[-1:])
    mm = nvdispatch.Matmul(a, b, c, alpha=0.5, beta=2.0, options={"bgrad_axis": bgrad_axis})
    mm.plan(epilog=epilog, epilog_inputs=inputs or None, preferences={"strategy": "inplace"} if spec.steps else None)
    plan = NumpyMatmulPlan(mm._problem, mm.strategy, {"block_bytes": block_bytes, "threads": threads})
    got = plan.execute(mm._operands())
    want, want_aux = expected(a, b, c, 0.5, 2.0, epilog, inputs, bgrad_axis)
    if spec.outputs:
        got, aux = got
        for name in spec.outputs:
            np.testing.assert_allclose(
                np.asarray(aux[name], dtype=float),
                np.asarray(want_aux[name], dtype=float),
                rtol=1e-12,
                atol=1e-12,
                err_msg=name,
            )
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
