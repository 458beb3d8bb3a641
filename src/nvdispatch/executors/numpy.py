"""The NumPy executor: host memory (NumPy arrays, and the NumPy views adapters hand out of other frameworks'
host arrays) on the CPU."""

from __future__ import annotations

from .._adapters import adapter_named
from .._memory import HOST
from .base import ModularExecutor


class NumpyExecutor(ModularExecutor):
    name = "numpy"
    memory = frozenset({HOST})
    device_kinds = frozenset({"cpu"})

    def coerce_operand(self, array):
        """Bring any operand to a NumPy array (copying device memory to the host)."""
        return adapter_named("numpy").coerce(array)
