"""The built-in executors: their names and where they live (imported on first use).

These are the executors below the route. The Dask executor (``executors/dask*.py``) sits above the public front,
whose functions its tasks call on each block; the package registers it by name (``nvdispatch/__init__.py``).

Which executors serve a framework by default is the framework adapter's ``default_executors``
(:mod:`nvdispatch._adapters`); a new executor module is made known by name with :func:`register_executor`.
"""

from __future__ import annotations

import functools
import importlib
import threading

from .._adapters import default_executors
from .._tunings import register_kind
from ..errors import InvalidArgumentError
from .base import Executor, ModularExecutor, Plan

__all__ = [
    "Executor",
    "ModularExecutor",
    "Plan",
    "BUILTIN",
    "TUNING_KINDS",
    "builtin",
    "default_names",
    "register_executor",
]

#: name → "module:Class" of each built-in executor (imported on first use; the package adds "dask")
BUILTIN: dict[str, str] = {
    "numpy": "nvdispatch.executors.numpy:NumpyExecutor",
    "torch": "nvdispatch.executors.torch:TorchExecutor",
    "cupy": "nvdispatch.executors.cupy:CupyExecutor",
    "cuda": "nvdispatch.executors.cuda:CudaExecutor",
}

#: tuning kind → "module:Class" of the plan class that makes tunings of that kind and checks them (its
#: ``validate_tuning``; imported when a tunings file holds the kind: see nvdispatch._tunings)
TUNING_KINDS: dict[str, str] = {
    "numpy-blocks": "nvdispatch.executors.numpy_matmul:NumpyMatmulPlan",
    "numpy-panels": "nvdispatch.executors.numpy_matmul_panels:PanelPlan",
    "cublaslt-algo": "nvdispatch._cuda.lt_plan_base:LtPlanBase",
    "timed-choice": "nvdispatch.executors.timed_choice:TimedChoicePlan",
}


def _tuning_owner(target: str):
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


for _kind, _target in TUNING_KINDS.items():
    register_kind(_kind, functools.partial(_tuning_owner, _target))

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


def register_executor(name: str, target: str) -> None:
    """Make executor ``name`` known, created on first use from ``target`` (``"package.module:Class"``).

    Framework adapters name the executors serving their arrays in ``default_executors``; this is how a new
    executor module becomes one of those names (and selectable with ``set_backend(name)``).
    """
    if not isinstance(target, str) or ":" not in target:
        raise InvalidArgumentError("target", "'package.module:Class'", repr(target))
    with _lock:
        BUILTIN[name] = target
        _instances.pop(name, None)


def default_names(framework: str, device_kind: str) -> tuple[str, ...]:
    """The executors tried by default for ``framework``'s arrays on a ``device_kind`` device."""
    return default_executors(framework, device_kind)
