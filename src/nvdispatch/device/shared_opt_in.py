"""Kernels whose dynamic shared memory goes beyond the 48 KiB a launch gets by default.

CUDA launches a kernel with more than 48 KiB of dynamic shared memory only after the kernel opted in
(``cudaFuncAttributeMaxDynamicSharedMemorySize``), up to what the GPU has (227 KiB on compute capability
9.0). Numba has no call for it: :func:`allow_shared_memory` sets the attribute on the compiled kernel of one
signature, in the current context. Under the simulator there is nothing to set.
"""

from __future__ import annotations

from .fft_config import DEFAULT_SHARED_MEMORY
from .simulator_compat import simulator_active

__all__ = ["needs_opt_in", "allow_shared_memory"]


def needs_opt_in(shared_bytes: int) -> bool:
    """Whether a launch with ``shared_bytes`` of dynamic shared memory needs the kernel to opt in.

    Examples
    --------
    >>> from nvdispatch.device import needs_opt_in
    >>> needs_opt_in(48 * 1024), needs_opt_in(64 * 1024)
    (False, True)
    """
    return shared_bytes > DEFAULT_SHARED_MEMORY


def allow_shared_memory(dispatcher, argtypes: tuple, shared_bytes: int) -> None:
    """Let ``dispatcher``'s kernel for ``argtypes`` (compiled first if it is not) launch with ``shared_bytes``
    of dynamic shared memory in the current context. Raises what the driver says when the GPU has less.

    Examples
    --------
    A kernel running a 16384-point float32 Block FFT (69632 bytes of shared memory)::

        f = nvdispatch.device.FFT(16384, np.float32, "c2c", "Block", direction="forward")
        argtypes = (numba.cuda.types.Array(numba.cuda.types.complex64, 2, "C"),)
        nvdispatch.device.allow_shared_memory(kernel, argtypes, f.shared_memory_size)
        kernel[blocks, f.block_dim, stream, f.shared_memory_size](data)
    """
    if simulator_active() or not needs_opt_in(shared_bytes):
        return
    from cuda.bindings import driver as binding
    from numba.cuda.cudadrv.driver import driver

    kernel = dispatcher.compile(tuple(argtypes))
    cufunc = kernel._codelibrary.get_cufunc()
    attribute = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attribute, int(shared_bytes), cufunc.handle, cufunc.device.id)
