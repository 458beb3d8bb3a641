"""Shared fixtures of the Dask tests: one 2-process LocalCluster for the session, and the schedulers."""

from __future__ import annotations

import pytest

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="session")
def client():
    """A ``distributed.LocalCluster`` of 2 worker processes (1 thread each, small memory, no dashboard)."""
    import dask_reference

    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            memory_limit="1GiB",
            dashboard_address=None,
            silence_logs=40,
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        # the test helpers run on the workers too: ship them by value (the workers cannot import tests/)
        import cloudpickle

        cloudpickle.register_pickle_by_value(dask_reference)
        yield c


@pytest.fixture(params=["sync", "distributed"])
def compute(request):
    """``compute(*arrays)``: on the synchronous scheduler, or on the session's LocalCluster."""
    if request.param == "sync":
        return lambda *xs: dask.compute(*xs, scheduler="sync")
    c = request.getfixturevalue("client")
    return lambda *xs: c.compute(list(xs), sync=True)
