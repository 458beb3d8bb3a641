"""The NumPy executor: NumPy arrays (and CPU DLPack objects) on the CPU."""

from __future__ import annotations

from .._adapters import adapter_named
from .base import ModularExecutor


class NumpyExecutor(ModularExecutor):
    name = "numpy"
    frameworks = frozenset({"numpy", "dlpack"})
    device_kinds = frozenset({"cpu"})

    def coerce_operand(self, array):
        """Bring any operand to a NumPy array (copying device memory to the host)."""
        return adapter_named("numpy").coerce(array)
