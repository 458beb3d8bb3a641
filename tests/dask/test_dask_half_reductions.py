"""Bias gradients of float16 data on the Dask executor accumulate in float32 across blocks and round once at the
end (issue 15 item 2, as every executor's reductions): each block's partial sum is exact here, so the result
must be exactly float16(the float64 total), where a float16 tree sum of the partials drifts by several ulps."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

import nvdispatch

ROWS = 64  # one block per row: 64 partials, each an integer in [500, 1024) (exact in float16)
VALUES = np.random.default_rng(0).integers(500, 1024, ROWS).astype(np.float16)
TOTAL = np.float16(VALUES.astype(np.float64).sum())  # 49064, rounded once to 49056 (float16 ulp there: 32)


def _case(epilog: str, bgrad_axis: str):
    """``(a, b, epilog_inputs, options, aux name, expected)`` with the reduced axis chunked one element a block."""
    col = VALUES.reshape(-1, 1)
    if epilog in ("DRELU_BGRAD", "DGELU_BGRAD"):
        if bgrad_axis == "n":  # summed over M: M chunked
            a, b = da.from_array(col, chunks=(1, 1)), da.from_array(np.ones((1, 2), np.float16))
            shape, chunks, want = (ROWS, 2), (1, 2), np.full(2, TOTAL)
        else:  # summed over N: N chunked
            a, b = da.from_array(np.ones((2, 1), np.float16)), da.from_array(col.T, chunks=(1, 1))
            shape, chunks, want = (2, ROWS), (2, 1), np.full((2, 1), TOTAL)
        if epilog == "DRELU_BGRAD":
            aux = {"relu_aux": da.ones(shape, dtype=bool, chunks=chunks)}
        else:  # gelu'(8) = 1 in float32
            aux = {"gelu_aux": da.full(shape, 8.0, dtype=np.float16, chunks=chunks)}
        return a, b, aux, {"bgrad_axis": bgrad_axis}, epilog.lower(), want
    if epilog == "BGRADA":  # a summed over K: K chunked
        a = da.from_array(np.stack([VALUES, VALUES[::-1]]), chunks=(2, 1))
        b = da.from_array(np.ones((ROWS, 3), np.float16), chunks=(1, 3))
        return a, b, {}, None, "bgrada", np.full(2, TOTAL)
    a = da.from_array(np.ones((3, ROWS), np.float16), chunks=(3, 1))  # BGRADB: b summed over K
    b = da.from_array(np.stack([VALUES, VALUES[::-1]], axis=1), chunks=(1, 2))
    return a, b, {}, None, "bgradb", np.full(2, TOTAL)


#: Dask's chunk-size, which decides whether a chunked K is concatenated per block (one call on the whole K,
#: summed by the block executor in float32) or tree-reduced ("1B": K-partials summed here, in float32)
K_FORMS = pytest.mark.parametrize("budget", ["128MiB", "1B"], ids=["K concatenated", "K tree"])


@K_FORMS
@pytest.mark.parametrize(
    "epilog, bgrad_axis",
    [("DRELU_BGRAD", "n"), ("DRELU_BGRAD", "m"), ("DGELU_BGRAD", "n"), ("BGRADA", "n"), ("BGRADB", "n")],
)
def test_float16_bias_gradient_partials_accumulate_in_float32(epilog, bgrad_axis, budget):
    a, b, inputs, options, name, want = _case(epilog, bgrad_axis)
    with dask.config.set({"array.chunk-size": budget}):
        _, aux = nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=inputs or None, options=options)
    assert aux[name].dtype == np.float16
    (got,) = da.compute(aux[name], scheduler="sync")
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want)


@K_FORMS
def test_float16_k_partials_accumulate_in_float32(budget):
    """K in 65 one-element chunks: 64 exact partial products summed in float32 and rounded once (the last
    K-chunk adds 0), or one call on the concatenated K; either way exactly float16(the float64 total)."""
    a = da.from_array(np.tile(np.append(VALUES, np.float16(0)), (4, 1)), chunks=(1, 1))
    b = da.from_array(np.ones((ROWS + 1, 2), np.float16), chunks=(1, 2))
    with dask.config.set({"array.chunk-size": budget}):
        r = nvdispatch.matmul(a, b, epilog="RELU")
        assert ("concatenated" if budget == "128MiB" else "tree-reduced") in str(nvdispatch.explain(a, b))
    got = r.compute(scheduler="sync")
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, np.full((4, 2), TOTAL))
