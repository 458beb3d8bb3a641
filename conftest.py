"""Shared test set-up for tests/ and conformance/: GPU detection without importing any framework, the
`gpu` marker's skip, and a private CPU calibration cache for the session."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import sys
import tempfile

import pytest

# The CPU calibration persists in the user's cache directory: the suite (and every process it starts) keeps its
# own in a temporary directory instead, so that it neither reads a calibration that makes its runs differ from
# machine to machine nor writes into the real cache. Set before nvdispatch is imported.
_CACHE_DIR = tempfile.mkdtemp(prefix="nvdispatch-test-cache-")
os.environ["NVDISPATCH_CACHE_DIR"] = _CACHE_DIR


def pytest_unconfigure(config):
    os.environ["NVDISPATCH_CACHE_DIR"] = ""  # (what processes write at exit goes nowhere from here on)
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)


#: the directory holding the nvdispatch these tests import (found without importing it): the checkout's src/ in
#: development, site-packages where the tests of an unpacked sdist run against an installed copy. Subprocesses
#: put it first on PYTHONPATH so that they run the same copy.
NVDISPATCH_PATH = os.path.dirname(os.path.dirname(importlib.util.find_spec("nvdispatch").origin))


def _cuda_device_count() -> int:
    """Ask the CUDA driver directly (no framework import) how many GPUs this process sees."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    if lib.cuInit(0) != 0:
        return 0
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


HAS_GPU = _cuda_device_count() > 0


@pytest.fixture(autouse=True)
def _no_tunings_left_behind():
    """Tuned choices are process-wide state (autotuning records them): one test's may not change what the tests
    after it see (which plans are kept, which strategy is chosen), so they are forgotten after every test."""
    yield
    cache = sys.modules.get("nvdispatch._plan_cache")  # (not imported here where the test did not)
    if cache is not None and cache.plan_cache.has_tunings():
        cache.plan_cache.clear_tunings()

# Device-side Numba code runs under Numba's CUDA simulator where no GPU exists. The variable must be set
# before numba.cuda is first imported, so it is set here, at collection start.
if not HAS_GPU:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# -- Dask (tests/dask): one 2-process LocalCluster for the session, and the schedulers -----------------------
@pytest.fixture(scope="session")
def dask_client():
    """A ``distributed.LocalCluster`` of 2 worker processes (1 thread each, small memory, no dashboard)."""
    distributed = pytest.importorskip("distributed")
    import cloudpickle
    import dask_reference  # tests/dask: the helpers run on the workers too, shipped by value

    cloudpickle.register_pickle_by_value(dask_reference)
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            memory_limit="1GiB",
            dashboard_address=None,
            silence_logs=40,
        ) as cluster,
        # not the default scheduler: the tests that want the cluster use this client by name, the others compute
        # as they would alone
        distributed.Client(cluster, set_as_default=False) as client,
    ):
        yield client


@pytest.fixture(params=["sync", "distributed"])
def dask_compute(request):
    """``dask_compute(*arrays)``: on the synchronous scheduler, or on the session's LocalCluster."""
    dask = pytest.importorskip("dask")
    if request.param == "sync":
        return lambda *xs: dask.compute(*xs, scheduler="sync")
    client = request.getfixturevalue("dask_client")
    return lambda *xs: client.compute(list(xs), sync=True)


# -- the FFT entry: the compiled front or the Python route --------------------------------------------------------
@pytest.fixture(params=["compiled", "python"])
def fft_front(request, monkeypatch):
    """The public transforms' entry: the compiled front, or the Python route an install without it runs."""
    from nvdispatch.fft import _route, _transforms

    if request.param == "compiled" and _route.transform_front is _route.call_transform:
        pytest.skip("the extension is not built here")
    if request.param == "python":
        monkeypatch.setattr(_transforms, "transform_front", _route.call_transform)
    return request.param


# -- the matmul entry: the compiled front or the Python route ------------------------------------------------------
@pytest.fixture(params=["compiled", "python"])
def matmul_front(request, monkeypatch):
    """Each test on both fronts of ``nvdispatch.matmul`` (the compiled hit and the Python route), from the default
    backends and empty caches (plans, call-key signatures and memos); the caches are emptied again after it."""
    import nvdispatch
    from nvdispatch import linalg
    from nvdispatch._adapters import call_key_classes

    if request.param == "compiled" and linalg._front is linalg._route:
        pytest.skip("the extension is not built here")
    if request.param == "python":
        monkeypatch.setattr(linalg, "_front", linalg._route)
    nvdispatch.reset_backends()
    nvdispatch.plan_cache.clear()
    call_key_classes.clear()
    yield request.param
    nvdispatch.reset_backends()
    nvdispatch.plan_cache.clear()


# -- the matmul route: how many calls took the full path ---------------------------------------------------------
@pytest.fixture
def full_paths(monkeypatch):
    """``full_paths[0]``: how many ``nvdispatch.matmul`` calls took the full path (detect, validate, select)
    instead of finding their plan by their call key (plan-cache misses do not show it: the problem key hits);
    set it to 0 to count from there."""
    from nvdispatch import linalg

    count = [0]
    full = linalg._plan_and_run

    def counting(*args):
        count[0] += 1
        return full(*args)

    monkeypatch.setattr(linalg, "_plan_and_run", counting)
    return count
