"""``torch.autocast`` for the ``nvdispatch::`` operators: autocast kernels that read the region when they run, so
eager calls and compiled graphs alike follow it as the public functions do.

* ``nvdispatch::matmul``: the operator's tensors are cast by nvdispatch's one autocast rule
  (:func:`nvdispatch._precision.autocast_targets`, through the Torch adapter's
  :func:`~nvdispatch._adapters.torch_autocast.cast_for_region`), the rule ``nvdispatch.matmul``'s own route
  follows in a region (``torch.library.register_autocast`` casts to one fixed dtype; this cast is the region's);
* ``nvdispatch::fft`` / ``nvdispatch::convolve``: cast by the FFT rule (float16/bfloat16 computed in float32, a
  half-precision filter promoted to the spectrum's precision) where Torch's own FFTs follow the region (on the
  CPU; :func:`~nvdispatch._adapters.torch_autocast.fft_cast_for_region`), the rule the public transforms follow.
  For ``nvdispatch::fft`` on the CPU this is what ``torch.library.register_autocast(op, "cpu", torch.float32)``
  would register (Torch's float32 policy); one installer keeps every operator's kernel and the eager autograd
  Function's path (:func:`in_region`) on the same cast.

Each then runs the operator with autocast off on its device type, so its fake kernel and its real one see the cast
tensors, and the real one's public call sees no region (it does not cast again). The kernels live as long as the
operators (installed with them, :mod:`.torch_ops`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._adapters.torch_autocast import cast_for_region, fft_cast_for_region

__all__ = ["install", "in_region", "matmul_cast", "fft_cast", "convolve_cast", "DEVICE_TYPES"]

#: the device types whose regions the operators follow
DEVICE_TYPES = ("cuda", "cpu")
#: the matmul schema's leading tensor arguments, by the operand names of the autocast rule
_MATMUL_NAMES = ("a", "b", "c", "bias", "relu_aux", "gelu_aux")


def matmul_cast(device_type: str, args: tuple) -> tuple:
    """The ``nvdispatch::matmul`` arguments ``args`` with the tensors the region active on ``device_type`` casts
    cast (FP8 products, float64 ones, masks and scales are left as they are)."""
    n = len(_MATMUL_NAMES)
    named = dict(zip(_MATMUL_NAMES, args[:n], strict=True))
    cast = cast_for_region(named, device_type)
    if cast is named:
        return args
    return (*(cast[name] for name in _MATMUL_NAMES), *args[n:])


def fft_cast(device_type: str, args: tuple) -> tuple:
    """The ``nvdispatch::fft`` arguments ``args`` with ``x`` cast as the region active on ``device_type`` casts
    a transform's operand there (as it is where Torch's FFTs ignore the region)."""
    cast = fft_cast_for_region({"x": args[0]}, device_type)
    return args if cast["x"] is args[0] else (cast["x"], *args[1:])


def convolve_cast(device_type: str, args: tuple) -> tuple:
    """The ``nvdispatch::convolve`` arguments ``args`` with ``x`` and the filter ``h`` cast as the region active
    on ``device_type`` casts them (``fft.convolve``'s rule: the composition of Torch's own FFTs there)."""
    named = {"x": args[0], "h": args[1]}
    cast = fft_cast_for_region(named, device_type)
    return args if cast is named else (cast["x"], cast["h"], *args[2:])


def _autocast_key(device_type: str):
    return getattr(torch._C.DispatchKey, "Autocast" + torch._C._dispatch_key_for_device(device_type))


def in_region(device_type: str, cast: Callable[[str, tuple], tuple], fn: Callable, args: tuple):
    """``fn`` on ``args`` cast by ``cast`` for the region active on ``device_type``, run with autocast off there:
    what an autocast kernel does, for eager callers that reach an operator's kernel without the dispatcher (its
    autograd Function)."""
    args = cast(device_type, args)
    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_autocast_key(device_type))):
        return fn(*args)


def _kernel(op, device_type: str, cast: Callable[[str, tuple], tuple]):
    def kernel(*args):
        return in_region(device_type, cast, op, args)

    return kernel


def install(lib: torch.library.Library, name: str, op, cast, device_types=DEVICE_TYPES) -> None:
    """Install ``op``'s (operator ``name`` of ``lib``'s namespace) autocast kernels for ``device_types``: in a
    region, ``cast(device_type, args)`` and the operator run with autocast off. They live as long as ``lib``."""
    for device_type in device_types:
        lib.impl(name, _kernel(op, device_type, cast), _autocast_key(device_type).name)
