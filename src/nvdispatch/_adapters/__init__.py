"""The framework adapters, registered: one module per framework or protocol, and the registry's functions
(:mod:`nvdispatch._adapter_registry`, which imports no adapter, so the layers below look adapters up there).

Adding a framework is one adapter file (a subclass of :class:`~nvdispatch._adapters.base.Adapter`, see its
module for the interface and the memory kinds) and one registration: a line in the list at the end of this
module for a built-in one, or for any other::

    from nvdispatch._adapters import register_adapter
    register_adapter(MyAdapter())

Its ``default_executors`` say which executors run its arrays by default (``register_executor`` adds a
new one by name); they accept its arrays by the memory kinds of the views its ``info`` hands out.
"""

from __future__ import annotations

from .._adapter_registry import (
    adapter_for,
    adapter_for_class,
    adapter_for_result_kind,
    adapter_named,
    adapters,
    call_key_classes,
    default_executors,
    framework_names,
    register_adapter,
    unregister_adapter,
)
from .array_api_strict import ArrayApiStrictAdapter
from .base import CPU, Adapter, Device, OperandInfo
from .cai import CaiAdapter
from .cupy import CupyAdapter
from .dask import DaskAdapter
from .dlpack import DlpackAdapter
from .jax import JaxAdapter, JaxTracerAdapter
from .numpy import NumpyAdapter
from .torch import TorchAdapter

__all__ = [
    "Adapter",
    "Device",
    "OperandInfo",
    "CPU",
    "register_adapter",
    "unregister_adapter",
    "adapter_for",
    "adapter_for_class",
    "adapter_named",
    "adapter_for_result_kind",
    "adapters",
    "framework_names",
    "default_executors",
    "call_key_classes",
]

for _ad in (DlpackAdapter(), CaiAdapter()):
    register_adapter(_ad, protocol=True)
for _ad in (
    NumpyAdapter(),
    TorchAdapter(),
    CupyAdapter(),
    DaskAdapter(),
    JaxAdapter(),
    JaxTracerAdapter(),
    ArrayApiStrictAdapter(),
):
    register_adapter(_ad)
del _ad
