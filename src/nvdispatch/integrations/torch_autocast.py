"""``torch.autocast`` rules for the ``nvdispatch::`` operators, ready for the precision conventions of issue #29.

Inside an autocast region Torch runs its own matmuls in the region's dtype (``torch.get_autocast_dtype``: float16
or bfloat16) and its FFTs in float32. :func:`register` gives the operators the same rules, as autocast kernels that
read the region's dtype when they run (``torch.library.register_autocast`` casts to one fixed dtype), so eager
calls and compiled graphs alike follow them:

* ``nvdispatch::matmul``: floating ``a``, ``b``, ``c``, ``bias`` and ``gelu_aux`` are cast to the region's dtype
  (FP8 calls are left as they are: their types are the caller's choice);
* ``nvdispatch::fft`` / ``nvdispatch::convolve``: float16/bfloat16 inputs are cast to float32.

Not registered by default: the public functions' own eager route does not follow autocast yet, and a compiled
graph must not compute in another precision than the same call made eagerly. The switch belongs with the route's
change.
"""

from __future__ import annotations

import torch

__all__ = ["register"]

_FP8 = {torch.float8_e4m3fn, torch.float8_e5m2}
_HALF = {torch.float16, torch.bfloat16}
#: positions of the matmul schema's arguments cast to the region's dtype: a, b, c, bias, gelu_aux
_MATMUL_CAST = (0, 1, 2, 3, 5)


def _kernel(op, device_type: str, cast):
    key = torch._C.DispatchKeySet(
        getattr(torch._C.DispatchKey, "Autocast" + torch._C._dispatch_key_for_device(device_type))
    )

    def kernel(*args):
        with torch._C._ExcludeDispatchKeyGuard(key):
            return op(*cast(device_type, args))

    return kernel


def _matmul_cast(device_type: str, args: tuple) -> tuple:
    a, b = args[0], args[1]
    if a.dtype in _FP8 or b.dtype in _FP8:
        return args
    dtype = torch.get_autocast_dtype(device_type)
    out = list(args)
    for i in _MATMUL_CAST:
        x = out[i]
        if x is not None and x.is_floating_point() and x.dtype != dtype:
            out[i] = x.to(dtype)
    return tuple(out)


def _fp32_cast(device_type: str, args: tuple) -> tuple:
    return tuple(x.float() if isinstance(x, torch.Tensor) and x.dtype in _HALF else x for x in args)


_libraries: list = []  # the registrations live as long as their library


def register(device_types=("cuda", "cpu")) -> torch.library.Library:
    """Install the autocast kernels for ``device_types``, for the rest of the process; returns the library holding
    them (keep it referenced)."""
    from . import torch_ops  # the operators must exist

    lib = torch.library.Library("nvdispatch", "IMPL")
    for device_type in device_types:
        key = "Autocast" + torch._C._dispatch_key_for_device(device_type)
        lib.impl("matmul", _kernel(torch_ops.matmul_op, device_type, _matmul_cast), key)
        lib.impl("fft", _kernel(torch_ops.fft_op, device_type, _fp32_cast), key)
        lib.impl("convolve", _kernel(torch_ops.convolve_op, device_type, _fp32_cast), key)
    _libraries.append(lib)
    return lib
