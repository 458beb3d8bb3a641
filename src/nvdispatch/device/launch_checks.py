"""Checks of how a kernel uses a device FFT or GEMM: the launch's block dimensions, the shared memory it
passes, the size of ``thread_data`` and of the GEMM tiles.

A launch that breaks one of these does not fail by itself: too few threads leave part of the transform
undone (a silently wrong result), too little shared memory or a short ``thread_data`` indexes out of bounds.
The generated device function therefore starts with a few comparisons that raise
:class:`~nvdispatch.device.errors.DeviceLaunchError` naming the argument at fault.

* Under Numba's CUDA simulator they are always on, and the message says what came.
* On a GPU they are compiled in only while ``NVDISPATCH_DEVICE_DEBUG=1`` is set in the environment when the
  FFT/GEMM object is created (they cost a few instructions per call), and Numba reports an exception raised
  on the device only for kernels compiled with ``@cuda.jit(debug=True, opt=False)``; the message then
  carries the expected value but not the one that came (device code cannot format strings). The dynamic
  shared-memory size is not visible to device code (its array has length 0), so on a GPU only a static shared
  array passed as ``shared_mem`` is checked.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .simulator_compat import simulator_active

__all__ = ["DEBUG_VARIABLE", "checks_enabled", "fft_checks", "gemm_checks"]

#: set to 1 to compile the launch checks into GPU kernels too
DEBUG_VARIABLE = "NVDISPATCH_DEVICE_DEBUG"


def checks_enabled() -> bool:
    """Whether objects created now get the launch checks: always under the simulator, on a GPU in debug mode.

    Examples
    --------
    >>> checks_enabled()  # the tests run under the simulator where no GPU is present
    True
    """
    return simulator_active() or os.environ.get(DEBUG_VARIABLE, "").strip() not in ("", "0")


def _fail(argument: str, expected: str, label: str, value_expr: str) -> str:
    """A ``raise`` statement; the offending value (``value_expr``, shown as ``label = value``) only where the
    code can format it (the simulator)."""
    got = f'"{label} = " + str({value_expr})' if simulator_active() else repr(f"a different {label}")
    return f"raise DeviceLaunchError({argument!r}, {expected!r}, {got})"


def fft_checks(
    *, execution: str, threads_per_fft: int, ffts_per_block: int, storage_size: int, shared_bytes: int,
    value_type: str,
) -> list[str]:
    """Statements checking a device FFT call ``FFT(thread_data, shared_mem)``."""
    lines = [
        f"if thread_data.shape[0] < {storage_size}:",
        "    " + _fail("thread_data", f"at least FFT.storage_size = {storage_size} elements of {value_type}",
                       "len(thread_data)", "thread_data.shape[0]"),
    ]
    if execution != "Block":
        return lines
    lines += [
        f"if cuda.blockDim.x != {threads_per_fft}:",
        "    " + _fail("block_dim", f"x == {threads_per_fft} (launch with FFT.block_dim)", "blockDim.x",
                       "cuda.blockDim.x"),
        f"if cuda.blockDim.y > {ffts_per_block}:",
        "    " + _fail("block_dim", f"y <= ffts_per_block = {ffts_per_block} (launch with FFT.block_dim)",
                       "blockDim.y", "cuda.blockDim.y"),
        "if cuda.blockDim.z != 1:",
        "    " + _fail("block_dim", "z == 1 (launch with FFT.block_dim)", "blockDim.z", "cuda.blockDim.z"),
    ]
    if shared_bytes:
        expected = f"at least FFT.shared_memory_size = {shared_bytes} bytes (the launch's 4th parameter)"
        # On a GPU a dynamic shared array has length 0: only a static one can be measured there.
        measurable = "" if simulator_active() else "shared_mem.shape[0] != 0 and "
        lines += [
            "if shared_mem is None:",
            "    " + _fail("shared_mem", expected, "shared_mem", "shared_mem"),
            f"if {measurable}shared_mem.shape[0] * shared_mem.itemsize < {shared_bytes}:",
            "    " + _fail("shared_mem", expected, "bytes", "shared_mem.shape[0] * shared_mem.itemsize"),
        ]
    return lines


def gemm_checks(
    *, block_dim: Sequence[int], a_shape: Sequence[int], b_shape: Sequence[int], c_shape: Sequence[int]
) -> list[str]:
    """Statements checking a device GEMM call ``MM(alpha, a, b, beta, c)``: the block's dimensions and the
    tiles' shapes (as stored: ``(rows, cols)`` row-major, ``(cols, rows)`` column-major)."""
    bx, by, bz = block_dim
    lines = [
        f"if cuda.blockDim.x != {bx} or cuda.blockDim.y != {by} or cuda.blockDim.z != {bz}:",
        "    " + _fail("block_dim", f"({bx}, {by}, {bz}) (launch with MM.block_dim)", "blockDim",
                       "(cuda.blockDim.x, cuda.blockDim.y, cuda.blockDim.z)"),
    ]
    for name, (rows, cols) in (("a", a_shape), ("b", b_shape), ("c", c_shape)):
        lines += [
            f"if {name}.shape[0] < {rows} or {name}.shape[1] < {cols}:",
            "    " + _fail(name, f"a shared tile of at least {rows} x {cols} elements as stored (MM.{name}_dim, "
                          "transposed for column-major)", "shape", f"{name}.shape"),
        ]
    return lines
