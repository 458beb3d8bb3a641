"""The adapter registry: which adapter owns an array, looked up once per class; adapters by name and by the kind
of result they create.

It holds adapters and imports none of them: ``nvdispatch._adapters`` registers the built-in ones (and users
theirs, with :func:`register_adapter`). Everything that asks an adapter for something (the route, the GPU
layer's device views, streams and result factories, the adapters asking each other) looks it up here.

Detection follows array-api-compat: an adapter recognises its arrays by class, finding the framework's classes in
``sys.modules`` (a framework that is not imported cannot have made the array, so nothing is ever imported just to
ask). The answer is cached per class. Protocol adapters (``__cuda_array_interface__``, DLPack) come last and may
also look at the instance.
"""

from __future__ import annotations

import threading
from typing import Any

from .errors import InvalidArgumentError, describe

__all__ = [
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

_lock = threading.Lock()
#: framework adapters (claim by class), most recently registered first
_frameworks: tuple[Any, ...] = ()
#: protocol adapters (claim by class or instance), tried after every framework adapter
_protocols: tuple[Any, ...] = ()
_by_name: dict[str, Any] = {}
#: class -> its adapter; None: no framework adapter claims the class (protocols are asked per instance)
_by_class: dict[type, Any] = {}
#: class -> its call-key entry (``nvdispatch._call_key.ClassKeys``: signature, guard memo, view, wrap), filled by
#: the call-key module, cleared here when adapters change (entries hold the old adapter's functions)
call_key_classes: dict[type, Any] = {}
_by_result_kind: dict[str, Any] = {}


def register_adapter(adapter: Any, *, protocol: bool = False) -> Any:
    """Make ``adapter`` answer for the arrays it claims (before the adapters registered earlier).

    ``protocol=True`` registers it among the protocol adapters (``__cuda_array_interface__``, DLPack),
    which are asked only when no framework adapter claims an array. An adapter with the name of a
    registered one replaces it. Returns ``adapter``.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> from nvdispatch.adapters import CPU, HOST, Adapter, OperandInfo, register_adapter, unregister_adapter
    >>> class Boxed:  # a toy framework: a NumPy array in a box
    ...     def __init__(self, values):
    ...         self.values = np.asarray(values)
    >>> class BoxedAdapter(Adapter):
    ...     name, wraps, default_executors = "boxed", True, {"cpu": ("numpy",)}
    ...     def claims(self, cls):
    ...         return issubclass(cls, Boxed)
    ...     def info(self, name, x):
    ...         v = x.values
    ...         strides = tuple(s // v.itemsize for s in v.strides)
    ...         return OperandInfo(v, self.name, CPU, v.dtype.name, v.shape, strides, memory=frozenset({HOST}))
    ...     def wrap(self, result, like):
    ...         return Boxed(result)
    >>> _ = register_adapter(BoxedAdapter())
    >>> nvdispatch.matmul(Boxed(np.eye(2)), Boxed([[1.0, 2.0], [3.0, 4.0]])).values.tolist()
    [[1.0, 2.0], [3.0, 4.0]]
    >>> unregister_adapter("boxed")
    """
    global _frameworks, _protocols
    if not isinstance(getattr(adapter, "name", None), str) or not callable(getattr(adapter, "claims", None)):
        raise InvalidArgumentError("adapter", "an Adapter (with a name and claims())", describe(adapter))
    with _lock:
        _frameworks = tuple(a for a in _frameworks if a.name != adapter.name)
        _protocols = tuple(a for a in _protocols if a.name != adapter.name)
        if protocol:
            _protocols = (adapter, *_protocols)
        else:
            _frameworks = (adapter, *_frameworks)
        _by_name[adapter.name] = adapter
        _by_class.clear()
        call_key_classes.clear()
        _by_result_kind.clear()
    return adapter


def unregister_adapter(name: str) -> None:
    """Forget the adapter called ``name`` (no-op when none is registered).

    Examples
    --------
    >>> from nvdispatch.adapters import adapter_named, unregister_adapter
    >>> unregister_adapter("no such framework")  # nothing registered under that name: nothing to do
    >>> adapter_named("no such framework") is None
    True
    """
    global _frameworks, _protocols
    with _lock:
        _frameworks = tuple(a for a in _frameworks if a.name != name)
        _protocols = tuple(a for a in _protocols if a.name != name)
        _by_name.pop(name, None)
        _by_class.clear()
        call_key_classes.clear()
        _by_result_kind.clear()


def adapter_for_class(cls: type) -> Any:
    """The framework adapter claiming arrays of class ``cls``, or None (cached per class)."""
    try:
        return _by_class[cls]
    except KeyError:
        pass
    found = None
    for ad in _frameworks:
        if ad.claims(cls):
            found = ad
            break
    else:
        for ad in _protocols:
            if ad.claims(cls):
                found = ad
                break
    _by_class[cls] = found
    return found


def adapter_for(x: Any) -> Any:
    """The adapter owning array ``x``, or None when no adapter recognises it."""
    ad = _by_class.get(x.__class__)
    if ad is None:
        ad = adapter_for_class(x.__class__)
        if ad is None:
            for proto in _protocols:
                if proto.claims_instance(x):
                    return proto
    return ad


def adapter_for_result_kind(kind: str) -> Any:
    """The adapter creating GPU results of ``kind`` (``_cuda.arrays.result_kind``); the CAI adapter for
    kinds nobody declares (results exposing ``__cuda_array_interface__``)."""
    ad = _by_result_kind.get(kind)
    if ad is None:
        ad = next((a for a in adapters() if kind in a.result_kinds), _by_name["cuda_array_interface"])
        _by_result_kind[kind] = ad
    return ad


def adapter_named(name: str) -> Any:
    """The registered adapter of framework ``name``, or None."""
    return _by_name.get(name)


def adapters() -> tuple[Any, ...]:
    """Every registered adapter, in the order they are asked (frameworks, the latest registered first, then
    protocols)."""
    return (*_frameworks, *_protocols)


def framework_names() -> str:
    """The registered frameworks and protocols, for messages: ``"numpy, torch, ..."``."""
    return ", ".join(ad.name for ad in adapters())


def default_executors(framework: str, device_kind: str) -> tuple[str, ...]:
    """The executors tried by default for ``framework``'s arrays on a ``device_kind`` device."""
    ad = _by_name.get(framework)
    return () if ad is None else tuple(ad.default_executors.get(device_kind, ()))
