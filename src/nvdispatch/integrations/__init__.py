"""Integrations with compiled and transformed programs, above the public front.

JAX: ``nvdispatch.matmul`` and the ``nvdispatch.fft`` functions work inside ``jax.jit``, under ``jax.grad``
and ``jax.vmap``. The public functions find traced operands (``nvdispatch._traced``) and hand the call to the
handlers installed here, which stage it into the traced program (:mod:`.jax_matmul`, :mod:`.jax_fft`). Nothing
here imports JAX: a handler's module is imported the first time a tracer reaches it (JAX is loaded by then).

Torch: ``torch.compile`` (Dynamo) traces the public functions as ``torch.library`` operators in the ``nvdispatch::``
namespace (:mod:`.torch_ops`), ``torch.export`` records them, and eager calls that autograd records run through them
(fused backward formulas, :mod:`.torch_autograd`); :mod:`.torch_entry` says which calls and marks the entry points
for Dynamo. Nothing of Torch is imported here either: the operators are registered the first time Torch needs them.
"""

from __future__ import annotations

from .._traced import register_compiled_note, register_traced
from .torch_entry import install_torch

__all__ = ["install_jax", "install_torch"]


def _jax_matmul(*args, **kwargs):
    from .jax_matmul import traced_matmul

    return traced_matmul(*args, **kwargs)


def _jax_fft(*args, **kwargs):
    from .jax_fft import traced_fft

    return traced_fft(*args, **kwargs)


#: DLPack's device type of CUDA memory (kDLCUDA)
_DLPACK_CUDA = 2


def _in_cuda_memory(x) -> bool:
    """Whether ``x`` (a concrete JAX array) lies in CUDA device memory, by DLPack (no JAX imported here)."""
    try:
        return x.__dlpack_device__()[0] == _DLPACK_CUDA
    except Exception:  # noqa: BLE001 - an array DLPack cannot describe (sharded over devices): the route's
        return False


def _jax_eager_fft(func, x, *args, **kwargs):
    """Offered every transform of a concrete JAX array that the route's caches miss: those in CUDA memory go to
    :func:`.jax_fft.eager_fft` (JAX is loaded by then); the others stay with the route."""
    if not _in_cuda_memory(x):
        return NotImplemented
    from .jax_fft import eager_fft

    return eager_fft(func, x, *args, **kwargs)


def _jax_eager_fft_explain(func, x, *args, **kwargs):
    """``explain()`` of a transform no executor takes as it is: what :func:`_jax_eager_fft` runs, for JAX arrays
    in CUDA memory."""
    if not _in_cuda_memory(x):
        return NotImplemented
    from .jax_fft import explain_eager_fft

    return explain_eager_fft(func, x, *args, **kwargs)


def _jax_convolve(*args, **kwargs):
    from .jax_fft import traced_convolve

    return traced_convolve(*args, **kwargs)


def _jax_shift(*args, **kwargs):
    from .jax_fft import traced_shift

    return traced_shift(*args, **kwargs)


def _jax_freq(*args, **kwargs):
    from .jax_fft import traced_freq

    return traced_freq(*args, **kwargs)


def _jax_matmul_note(problem) -> str:
    from .jax_autotune import explain_line
    from .jax_ffi import route

    name, why = route()
    return f"inside jax.jit on a GPU this matmul is staged through the {name!r} route ({why}); {explain_line(problem)}"


def install_jax() -> None:
    """Install the JAX handlers (done when nvdispatch is imported)."""
    register_compiled_note("jax", "matmul", _jax_matmul_note)
    for operation, handler in (
        ("matmul", _jax_matmul),
        ("fft", _jax_fft),
        ("fft_convolve", _jax_convolve),
        ("fft_shift", _jax_shift),
        ("fft_freq", _jax_freq),
    ):
        register_traced("jax", operation, handler)
    # concrete GPU arrays whose transform no executor takes as it is: the staged operations, run eagerly
    register_traced("jax", "fft", _jax_eager_fft, all_arrays=True)
    register_traced("jax", "fft_explain", _jax_eager_fft_explain, all_arrays=True)


install_jax()
install_torch()
