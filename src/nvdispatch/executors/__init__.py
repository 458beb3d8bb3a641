"""The built-in executors: their names, where they live, and which ones serve a framework by default.

Adding a framework is one executor module plus one line in each table below.
"""

from __future__ import annotations

import importlib
import threading

from .base import Executor, ModularExecutor, Plan

__all__ = ["Executor", "ModularExecutor", "Plan", "BUILTIN", "builtin", "default_names"]

#: name → "module:Class" of each built-in executor (imported on first use)
BUILTIN: dict[str, str] = {
    "numpy": "nvdispatch.executors.numpy:NumpyExecutor",
    "torch": "nvdispatch.executors.torch:TorchExecutor",
    "cupy": "nvdispatch.executors.cupy:CupyExecutor",
    "cuda": "nvdispatch.executors.cuda:CudaExecutor",
}

#: (framework, device kind) → built-in executors tried by default, in order
DEFAULTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("numpy", "cpu"): ("numpy",),
    ("dlpack", "cpu"): ("numpy",),
    ("torch", "cpu"): ("torch",),
    ("torch", "cuda"): ("cuda", "torch"),
    ("cupy", "cuda"): ("cuda", "cupy"),
    ("cuda_array_interface", "cuda"): ("cuda",),
    ("dlpack", "cuda"): ("cuda",),
}

_instances: dict[str, Executor] = {}
_lock = threading.Lock()


def builtin(name: str) -> Executor | None:
    """The (single, lazily created) instance of built-in executor ``name``; None if no such name."""
    inst = _instances.get(name)
    if inst is not None:
        return inst
    target = BUILTIN.get(name)
    if target is None:
        return None
    with _lock:
        inst = _instances.get(name)
        if inst is None:
            module, cls = target.split(":")
            try:
                inst = getattr(importlib.import_module(module), cls)()
            except ModuleNotFoundError as exc:
                if exc.name != module:
                    raise
                return None  # this build of nvdispatch has no such executor yet
            _instances[name] = inst
    return inst


def default_names(framework: str, device_kind: str) -> tuple[str, ...]:
    return DEFAULTS.get((framework, device_kind), ())
