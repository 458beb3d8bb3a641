"""``torch.autocast`` for the ``nvdispatch::`` operators: autocast kernels that read the region's dtype when they
run (``torch.library.register_autocast`` casts to one fixed dtype), so eager calls and compiled graphs alike follow
the region.

* ``nvdispatch::matmul`` (installed with the operators, :mod:`.torch_ops`): the operator's tensors are cast by
  nvdispatch's one autocast rule (:func:`nvdispatch._precision.autocast_targets`, through the Torch adapter's
  :func:`~nvdispatch._adapters.torch_autocast.cast_for_region`), the rule ``nvdispatch.matmul``'s own route
  follows in a region; then the operator runs with autocast off, so its fake kernel and its real one see the cast
  tensors, and the real one's ``nvdispatch.matmul`` call sees no region (it does not cast again);
* ``nvdispatch::fft`` / ``nvdispatch::convolve``: float16/bfloat16 inputs are cast to float32, as Torch's own FFTs
  do. Not installed by default (:func:`.torch_ops.register_fft_autocast`): the public FFT functions' eager route
  does not follow autocast, and a compiled graph must not compute in another precision than the same call eagerly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._adapters.torch_autocast import cast_for_region

__all__ = ["install", "in_region", "matmul_cast", "fp32_cast", "DEVICE_TYPES"]

#: the device types whose regions the operators follow
DEVICE_TYPES = ("cuda", "cpu")
_HALF = {torch.float16, torch.bfloat16}
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


def fp32_cast(device_type: str, args: tuple) -> tuple:
    """``args`` with float16/bfloat16 tensors cast to float32 (Torch's autocast rule for its FFTs)."""
    return tuple(x.float() if isinstance(x, torch.Tensor) and x.dtype in _HALF else x for x in args)


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
