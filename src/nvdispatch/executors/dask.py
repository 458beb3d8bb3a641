"""The Dask executor (``"dask"``): ``dask.array.Array`` operands, computed lazily, block by block.

Dask is the engine: calls return Dask arrays whose graphs run each block through ``nvdispatch``'s own route
on the worker holding it, so the chunks' framework (NumPy, CuPy, Torch) picks the block executor there,
with that worker's plan cache. The caller's backend state (``set_backend``/``skip_backend``, global and
registered backends) is carried into the graph as a value. Operations: ``executors/dask_matmul.py``,
``executors/dask_fft.py``, ``executors/dask_fft_convolve.py``.

Under ``set_backend("dask", coerce=True)`` plain operands are wrapped as single-block Dask arrays.

Examples
--------
>>> import dask.array as da, numpy as np, nvdispatch
>>> a = da.ones((4, 6), chunks=2); b = da.ones((6, 3), chunks=3)
>>> r = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": np.full(3, -1.0)})  # lazy
>>> r.chunks, r.compute(scheduler="sync")[0].tolist()
(((2, 2), (3,)), [5.0, 5.0, 5.0])
>>> y = nvdispatch.fft.fft(da.ones((4, 8), chunks=(2, 4)), axis=1)  # axis 1 chunked: rechunked whole (tiny: 1 block)
>>> y.chunks, float(y[0, 0].compute(scheduler="sync").real)
(((4,), (8,)), 8.0)
>>> nvdispatch.fft.rfftfreq(8, chunks=2).compute().tolist()
[0.0, 0.125, 0.25, 0.375, 0.5]
"""

from __future__ import annotations

from .._memory import DASK_ARRAY
from .._plan_cache import plan_cache
from .base import ModularExecutor
from .dask_fft import freq
from .dask_graph import wrap


class DaskExecutor(ModularExecutor):
    name = "dask"
    memory = frozenset({DASK_ARRAY})
    device_kinds = frozenset({"cpu", "cuda"})

    def unavailable(self) -> str | None:
        try:
            import dask.array  # noqa: F401
        except ImportError:
            return "dask is not installed (pip install 'nvdispatch[dask]')"
        return None

    def coerce_operand(self, array):
        return wrap(array)

    def frequencies(self, n: int, d, real: bool, chunks, like):
        """``fftfreq``/``rfftfreq(n, d, chunks=chunks)`` as a lazy Dask array of blocks like ``like`` (see
        :func:`.dask_fft.freq`)."""
        return freq(n, d, real, chunks, like)


def worker_plan_cache_stats() -> dict[str, int]:
    """This process's plan-cache statistics; for Dask workers: ``client.run(worker_plan_cache_stats)``."""
    return plan_cache.stats()
