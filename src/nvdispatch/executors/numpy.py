"""The NumPy executor: NumPy arrays (and CPU DLPack objects) on the CPU."""

from __future__ import annotations

import numpy as np

from .base import ModularExecutor


class NumpyExecutor(ModularExecutor):
    name = "numpy"
    frameworks = frozenset({"numpy", "dlpack"})
    device_kinds = frozenset({"cpu"})

    def coerce_operand(self, array):
        """Bring any operand to a NumPy array (copying device memory to the host)."""
        if isinstance(array, np.ndarray):
            return array
        mod = type(array).__module__.split(".")[0]
        if mod == "torch":
            return array.detach().cpu().numpy()
        if mod == "cupy":
            return array.get()
        return np.from_dlpack(array) if hasattr(array, "__dlpack__") else np.asarray(array)
