"""nvdispatch.matmul on Dask arrays against the tests' float64 oracle: random chunkings (uneven, one-element,
chunked K), every epilog, both bias orientations, batched and broadcast operands, alpha/beta/c; on the
synchronous scheduler and on a 2-process LocalCluster."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from dask_reference import chunking, close, matmul_reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nvdispatch
from nvdispatch import Epilog

EPILOGS = [e.name for e in Epilog]
BIAS = {"BIAS", "RELU_BIAS", "RELU_AUX_BIAS", "GELU_BIAS", "GELU_AUX_BIAS"}


@st.composite
def cases(draw):
    epilog = draw(st.sampled_from(EPILOGS))
    dtype = draw(st.sampled_from(["float64", "float32"]))
    m, k, n = (draw(st.integers(1, 7)) for _ in range(3))
    batch = draw(st.sampled_from([(), (2,), (3,)]))
    a_batch = batch if not batch else draw(st.sampled_from([batch, (1,), ()]))
    b_batch = batch if not batch else draw(st.sampled_from([batch, (1,)]))
    if batch and not a_batch and b_batch != batch:
        a_batch = batch
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    a = rng.standard_normal((*a_batch, m, k)).astype(dtype)
    b = rng.standard_normal((*b_batch, k, n)).astype(dtype)
    out_batch = tuple(np.broadcast_shapes(a_batch, b_batch))
    k_chunks = draw(chunking(k))  # shared by a and b, or refined when b's differ
    A = da.from_array(a, chunks=(*(draw(chunking(s, 2)) for s in a_batch), draw(chunking(m)), k_chunks))
    b_k = k_chunks if draw(st.booleans()) else draw(chunking(k))
    B = da.from_array(b, chunks=(*(draw(chunking(s, 2)) for s in b_batch), b_k, draw(chunking(n))))
    budget = draw(st.sampled_from(["128MiB", "1B"]))  # Dask's chunk-size: "1B" forces the K tree
    kwargs: dict = {"epilog": epilog}
    ref_inputs: dict = {}
    if epilog in BIAS:
        along = draw(st.sampled_from(["n", "n1", "m"]))
        shape = {"n": (n,), "n1": (*out_batch[:1], 1, n), "m": (*out_batch[:1], m, 1)}[along]
        bias = rng.standard_normal(shape).astype(dtype)
        ref_inputs["bias"] = bias
        plain = budget != "1B" and draw(st.booleans())  # plain operands broadcast up to chunk-size too
        kwargs["epilog_inputs"] = {"bias": bias if plain else da.from_array(bias, chunks=1)}
    if epilog.startswith("DRELU"):
        mask = rng.random((*out_batch, m, n)) > 0.5
        ref_inputs["relu_aux"] = mask
        kwargs["epilog_inputs"] = {"relu_aux": da.from_array(mask, chunks=tuple(draw(chunking(s)) for s in mask.shape))}
    if epilog.startswith("DGELU"):
        pre = rng.standard_normal((*out_batch, m, n)).astype(dtype)
        ref_inputs["gelu_aux"] = pre
        kwargs["epilog_inputs"] = {"gelu_aux": da.from_array(pre, chunks=2)}
    c = None
    if draw(st.booleans()):
        c = rng.standard_normal(draw(st.sampled_from([(*out_batch, m, n), (n,), (m, 1)]))).astype(dtype)
        kwargs["beta"] = draw(st.sampled_from([1.0, 0.5]))
    alpha = draw(st.sampled_from([1.0, -2.0]))
    bgrad_axis = draw(st.sampled_from(["n", "m"]))
    if epilog.endswith("_BGRAD"):
        kwargs["options"] = {"bgrad_axis": bgrad_axis}
    return a, b, A, B, c, alpha, kwargs, ref_inputs, bgrad_axis, budget


def _check(case, dask_compute):
    a, b, A, B, c, alpha, kwargs, ref_inputs, bgrad_axis, budget = case
    a0, b0 = a.copy(), b.copy()
    C = None if c is None else da.from_array(c, chunks=1)
    with dask.config.set({"array.chunk-size": budget}):  # read when the graph is built
        got = nvdispatch.matmul(A, B, C, alpha=alpha, **kwargs)
    want, want_aux = matmul_reference(a, b, c, alpha, kwargs.get("beta"), kwargs["epilog"], ref_inputs, bgrad_axis)
    if want_aux:
        result, aux = got
        assert set(aux) == set(want_aux)
        names = sorted(aux)
        values = dask_compute(result, *(aux[k] for k in names))
        close(values[0], want, a.dtype)
        for name, value in zip(names, values[1:]):
            if want_aux[name].dtype == bool:
                np.testing.assert_array_equal(value, want_aux[name], err_msg=name)
            else:
                close(value, want_aux[name], a.dtype, name)
        assert aux[names[0]].dtype == values[1].dtype
    else:
        assert isinstance(got, da.Array)
        (result,) = dask_compute(got)
        close(result, want, a.dtype)
        assert got.dtype == result.dtype == a.dtype
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)


@settings(max_examples=60, deadline=None)
@given(cases())
def test_matmul_sync(case):
    _check(case, lambda *xs: dask.compute(*xs, scheduler="sync"))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_matmul_local_cluster(case, dask_client):
    _check(case, lambda *xs: dask_client.compute(list(xs), sync=True))


def test_result_is_lazy_and_chunked_like_the_operands(dask_compute):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((10, 6)), rng.standard_normal((6, 8))
    bias = rng.standard_normal(8)
    A, B = da.from_array(a, chunks=(4, 6)), da.from_array(b, chunks=(6, 3))
    r = nvdispatch.matmul(A, B, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias})
    assert r.chunks == ((4, 4, 2), (3, 3, 2))
    # K unchunked: one fused block call per output block (plus nothing but the operands' own tasks)
    layer = r.dask.layers[r.name]
    from nvdispatch.executors.dask_tasks import matmul_block

    calls = [v for v in dict(layer).values() if isinstance(v, tuple) and v and v[0] is matmul_block]
    assert len(calls) == 9
    (got,) = dask_compute(r)
    close(got, np.maximum(a @ b + bias, 0), "float64")


def _tasks(r, fn):
    return [v for v in dict(r.dask.layers[r.name]).values() if isinstance(v, tuple) and v and v[0] is fn]


@pytest.mark.parametrize("k_blocks, adds", [(2, 0), (5, 1), (11, 4)])
def test_chunked_k_partials_tree_summed_into_the_fused_call(k_blocks, adds, dask_compute):
    """Panels over the K budget: one block call per K-chunk; the K-1 partials tree-summed 4 at a time into
    the last (fused) call's c."""
    from nvdispatch.executors.dask_tasks import add_blocks, concat_blocks, matmul_block

    rng = np.random.default_rng(7)
    k = 3 * k_blocks
    a, b, c = rng.standard_normal((6, k)), rng.standard_normal((k, 5)), rng.standard_normal((6, 5))
    bias = rng.standard_normal(5)
    A, B = da.from_array(a, chunks=(3, 3)), da.from_array(b, chunks=(3, 5))
    C = da.from_array(c, chunks=(2, 5))
    with dask.config.set({"array.chunk-size": "100B"}):
        r = nvdispatch.matmul(A, B, C, alpha=-2.0, beta=0.5, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias})
    calls, sums = _tasks(r, matmul_block), _tasks(r, add_blocks)
    assert (len(calls), len(sums)) == (2 * k_blocks, 2 * adds)  # 2 output blocks (C rechunked to A's rows)
    assert not _tasks(r, concat_blocks)
    (got,) = dask_compute(r)
    close(got, np.maximum(-2.0 * (a @ b) + 0.5 * c + bias, 0), "float64")


@pytest.mark.parametrize("batch", [(), (2,)])
def test_chunked_k_concatenated_one_fused_call_per_block(batch, dask_compute):
    """Panels within the K budget and smaller than the partial products: one concat task per block row of a
    and block column of b, one fused call per output block, no sums."""
    from nvdispatch.executors.dask_tasks import add_blocks, concat_blocks, matmul_block

    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((*batch, 9, 8)), rng.standard_normal((8, 10))
    c, bias = rng.standard_normal((9, 10)), rng.standard_normal((9, 1))  # bias along M
    A = da.from_array(a, chunks=(*(1 for _ in batch), 3, (2, 3, 1, 2)))  # K in 4 uneven chunks
    B = da.from_array(b, chunks=((2, 3, 1, 2), (4, 4, 2)))
    r = nvdispatch.matmul(A, B, c, alpha=3.0, beta=-1.0, epilog="GELU_BIAS", epilog_inputs={"bias": bias})
    nbatch = 2 if batch else 1
    assert len(_tasks(r, matmul_block)) == nbatch * 3 * 3  # output blocks
    assert len(_tasks(r, concat_blocks)) == nbatch * 3 + 3  # a's block rows (per batch block), b's block columns
    assert not _tasks(r, add_blocks)
    (got,) = dask_compute(r)
    want, _ = matmul_reference(a, b, c, 3.0, -1.0, "GELU_BIAS", {"bias": bias})
    close(got, want, "float64")


def _k_line(e):
    (line,) = [s for s in e.steps if s.startswith("K in ")]
    return line


def test_k_budget_boundary_and_explain():
    """a 8×8 in 4×2 blocks, b 8×8 in 2×4: the largest block's panels are 4·8 + 8·4 float64 = 512 B; a and b
    once (1 KiB) are fewer bytes than the 3 partial products of the 8×8 result (1.5 KiB)."""
    rng = np.random.default_rng(10)
    a, b = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    A, B = da.from_array(a, chunks=(4, 2)), da.from_array(b, chunks=(2, 4))
    want = np.maximum(a @ b + 1.0, 0)
    for budget, concatenated in (("512B", True), ("511B", False)):
        with dask.config.set({"array.chunk-size": budget}):
            line = _k_line(nvdispatch.explain(A, B, epilog="RELU_BIAS", epilog_inputs={"bias": np.ones(8)}))
            r = nvdispatch.matmul(A, B, epilog="RELU_BIAS", epilog_inputs={"bias": np.ones(8)})
        if concatenated:
            assert line.startswith("K in 4 chunks concatenated per block (panels 512 B <= array.chunk-size 512 B;")
            assert "one fused block call per output block" in line and "no partial products" in line
        else:
            assert line == "K in 4 chunks tree-reduced (panels 512 B > array.chunk-size 511 B: too large to " + (
                "concatenate per block)"
            )
        close(r.compute(scheduler="sync"), want, "float64")  # the config was read when the graph was built


def test_k_tree_kept_where_the_panels_outweigh_the_partial_products():
    """a 16×12 in 4 K-chunks times b 12×2: the panels (a and b once, 1.69 kiB) outweigh the 3 partial
    products of the 16×2 result (768 B), whatever the budget."""
    from nvdispatch.executors.dask_tasks import concat_blocks

    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((16, 12)), rng.standard_normal((12, 2))
    A, B = da.from_array(a, chunks=(8, 3)), da.from_array(b, chunks=3)
    line = _k_line(nvdispatch.explain(A, B))
    assert line.startswith("K in 4 chunks tree-reduced (panels 0.94 kiB <= array.chunk-size 128.00 MiB, but 1.69 kiB")
    assert line.endswith("of partial products: concatenating copies more)")
    r = nvdispatch.matmul(A, B)
    assert not _tasks(r, concat_blocks)
    close(r.compute(scheduler="sync"), a @ b, "float64")


def test_vectors_and_alpha_beta_c(dask_compute):
    rng = np.random.default_rng(2)
    a, b, v = rng.standard_normal((5, 7)), rng.standard_normal((7, 4)), rng.standard_normal(7)
    A, B, V = da.from_array(a, chunks=(2, 3)), da.from_array(b, chunks=(3, 2)), da.from_array(v, chunks=3)
    c = rng.standard_normal(4)
    got = dask_compute(
        nvdispatch.matmul(V, B),
        nvdispatch.matmul(A, V),
        nvdispatch.matmul(V, V),
        nvdispatch.matmul(V, B, c, alpha=2.0, beta=-1.0),
    )
    close(got[0], v @ b, "float64")
    close(got[1], a @ v, "float64")
    close(got[2], v @ v, "float64")
    close(got[3], 2 * (v @ b) - c, "float64")


def test_integer_and_complex_dtypes_kept(dask_compute):
    rng = np.random.default_rng(3)
    a = rng.integers(-5, 5, (6, 5)).astype(np.int32)
    b = rng.integers(-5, 5, (5, 4)).astype(np.int32)
    r = nvdispatch.matmul(da.from_array(a, chunks=2), da.from_array(b, chunks=2))
    assert r.dtype == np.int32
    (got,) = dask_compute(r)
    np.testing.assert_array_equal(got, a @ b)
    ca = (rng.standard_normal((4, 3)) + 1j * rng.standard_normal((4, 3))).astype(np.complex64)
    r = nvdispatch.matmul(da.from_array(ca, chunks=2), da.from_array(ca.T.copy(), chunks=2), alpha=1j)
    (got,) = dask_compute(r)
    assert got.dtype == np.complex64
    close(got, 1j * (ca.astype(np.complex128) @ ca.T), "complex64")


def test_stateful_matmul_with_dask_operands(dask_compute):
    rng = np.random.default_rng(4)
    a, b, bias = rng.standard_normal((8, 6)), rng.standard_normal((6, 5)), rng.standard_normal((8, 1))
    A, B = da.from_array(a, chunks=3), da.from_array(b, chunks=2)
    with nvdispatch.Matmul(A, B) as mm:
        mm.plan(epilog="GELU_BIAS", epilog_inputs={"bias": bias})
        assert mm.executor == "dask"
        first = mm.execute()
        a2 = rng.standard_normal((8, 6))
        mm.reset_operands(a=da.from_array(a2, chunks=3))
        second = mm.execute()
    want1, _ = matmul_reference(a, b, epilog="GELU_BIAS", inputs={"bias": bias})
    want2, _ = matmul_reference(a2, b, epilog="GELU_BIAS", inputs={"bias": bias})
    got1, got2 = dask_compute(first, second)
    close(got1, want1, "float64")
    close(got2, want2, "float64")


def test_forward_aux_feeds_backward(dask_compute):
    """RELU_AUX's mask and GELU_AUX's pre-activation, as Dask arrays, go back into DRELU/DGELU."""
    rng = np.random.default_rng(5)
    a, b, g = rng.standard_normal((9, 4)), rng.standard_normal((4, 7)), rng.standard_normal((9, 5))
    w = rng.standard_normal((5, 7))
    A, B = da.from_array(a, chunks=(4, 2)), da.from_array(b, chunks=(2, 3))
    G, W = da.from_array(g, chunks=(4, 5)), da.from_array(w, chunks=(5, 3))
    for fwd, bwd, name in (("RELU_AUX", "DRELU_BGRAD", "relu_aux"), ("GELU_AUX", "DGELU_BGRAD", "gelu_aux")):
        _, aux = nvdispatch.matmul(A, B, epilog=fwd)
        assert aux[name].chunks == ((4, 4, 1), (3, 3, 1))
        dx, grads = nvdispatch.matmul(G, W, epilog=bwd, epilog_inputs={name: aux[name]})
        _, ref_aux = matmul_reference(a, b, epilog=fwd)
        want, want_aux = matmul_reference(g, w, epilog=bwd, inputs={name: ref_aux[name]})
        got, got_grad = dask_compute(dx, grads[bwd[:5].lower() + "_bgrad"])
        close(got, want, "float64")
        close(got_grad, want_aux[bwd[:5].lower() + "_bgrad"], "float64")


def test_explain_says_dask_and_the_block_call():
    rng = np.random.default_rng(6)
    A = da.from_array(rng.standard_normal((8, 6)), chunks=(4, 3))
    B = da.from_array(rng.standard_normal((6, 4)), chunks=(2, 4))
    e = nvdispatch.explain(A, B, epilog="RELU_BIAS", epilog_inputs={"bias": np.ones(4)})
    assert e.executor == "dask"
    text = str(e)
    assert "rechunk a along axis 1" in text and "rechunk b along axis 0" in text
    assert "first block: executor 'numpy'" in text
    assert "K in 4 chunks concatenated per block" in text  # K refined to 2, 1, 1, 2
    assert "first block step: alpha * a @ b via" in text  # the whole K in one call, no c
    with dask.config.set({"array.chunk-size": "100B"}):  # the panels, 2 · 4·6 float64, are 384 B
        text = str(nvdispatch.explain(A, B, epilog="RELU_BIAS", epilog_inputs={"bias": np.ones(4)}))
    assert "K in 4 chunks tree-reduced" in text and "after the K-sum" in text
    assert "first block step: alpha * a @ b + beta * c via" in text  # the last K-chunk, the partial sum as c


def test_backend_state_is_carried_into_the_tasks(dask_client):
    """The caller's skip_backend/set_backend hold inside the tasks, on the workers too."""
    rng = np.random.default_rng(7)
    A = da.from_array(rng.standard_normal((6, 4)), chunks=3)
    B = da.from_array(rng.standard_normal((4, 6)), chunks=3)
    with nvdispatch.skip_backend("numpy"):
        r = nvdispatch.matmul(A, B)  # the graph is built here; the numpy executor is skipped in its tasks
    with pytest.raises(nvdispatch.errors.NoExecutorError):
        r.compute(scheduler="sync")
    with pytest.raises(nvdispatch.errors.NoExecutorError):
        dask_client.compute(r, sync=True)
    with nvdispatch.set_backend("numpy", only=True), nvdispatch.set_backend("dask", only=True):
        r = nvdispatch.matmul(A, B)  # dask takes the call; its blocks may use numpy only
    close(dask_client.compute(r, sync=True), A.compute() @ B.compute(), "float64")
    with nvdispatch.skip_backend("dask"), pytest.raises(nvdispatch.errors.NoExecutorError):
        nvdispatch.matmul(A, B)


def test_worker_plan_caches_are_hit(dask_client):
    from nvdispatch.executors.dask import worker_plan_cache_stats

    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((64, 16)).astype(np.float32), rng.standard_normal((16, 64)).astype(np.float32)
    before = dask_client.run(worker_plan_cache_stats)
    r = nvdispatch.matmul(da.from_array(a, chunks=8), da.from_array(b, chunks=8), epilog="RELU")
    close(dask_client.compute(r, sync=True), np.maximum(a.astype(np.float64) @ b, 0), "float32")
    after = dask_client.run(worker_plan_cache_stats)
    hits = sum(s["hits"] for s in after.values()) - sum(s["hits"] for s in before.values())
    assert hits > 0  # 64 blocks of one shape: each worker plans it once and finds it afterwards
    assert all(s["size"] >= 1 for s in after.values())
