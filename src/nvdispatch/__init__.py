"""nvdispatch: one Pythonic front door to NVIDIA's fastest math for whatever array type you hold.

>>> import numpy as np, nvdispatch
>>> nvdispatch.matmul(np.eye(2), np.ones((2, 2))).tolist()
[[1.0, 1.0], [1.0, 1.0]]
"""

from __future__ import annotations

from . import errors, integrations  # noqa: F401 - integrations installs the JAX and Torch ones (imports neither)
from ._backends import (
    get_state,
    register_backend,
    reset_backends,
    set_backend,
    set_global_backend,
    set_state,
    skip_backend,
    unregister_backend,
)
from ._environment import show_config
from ._epilog import Epilog
from ._explain import explain
from ._fp8 import MatmulQuantizationScales
from ._matmul_problem import ComputeType, MatmulOptions, MatmulPlanPreferences
from ._plan_cache import plan_cache
from ._version import __version__ as __version__
from .executors import register_executor
from .linalg import Matmul, matmul

# the Dask executor sits above the public front (its tasks call it on each block): registered here, by name, so
# nothing below it imports it
register_executor("dask", "nvdispatch.executors.dask:DaskExecutor")

__all__ = [
    "matmul",
    "Matmul",
    "Epilog",
    "ComputeType",
    "MatmulOptions",
    "MatmulPlanPreferences",
    "MatmulQuantizationScales",
    "explain",
    "plan_cache",
    "set_backend",
    "set_global_backend",
    "register_backend",
    "unregister_backend",
    "skip_backend",
    "get_state",
    "set_state",
    "reset_backends",
    "show_config",
    "errors",
    "fft",
    "CudaArray",
]
# ``nvdispatch.device`` (kernels for Numba) is public too but not in ``__all__``: it needs the [numba] extra, and
# ``from nvdispatch import *`` must work on a base install.


def __getattr__(name):
    # submodules with heavier imports load on first use
    if name in ("fft", "device"):
        import importlib

        return importlib.import_module(f"nvdispatch.{name}")
    if name == "CudaArray":  # the result type of callers known only by __cuda_array_interface__/DLPack
        from ._cuda.arrays import CudaArray

        return CudaArray
    raise AttributeError(f"module 'nvdispatch' has no attribute {name!r}")
