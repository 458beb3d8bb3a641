"""The CuPy executor (``"cupy"``): CuPy arrays on CUDA devices.

Matmul epilogs go to the same fused cuBLASLt path as the ``"cuda"`` executor (CuPy's current stream or
``stream=``, CuPy's memory pool for results and workspaces); where cuBLASLt cannot fuse, ``cupy.matmul``
plus in-place CuPy ops. Results stay CuPy arrays on the operands' device.
"""

from __future__ import annotations

import contextlib

from .._adapters import adapter_named
from .._cuda.streams import stream_pointer
from .._memory import CUPY_ARRAY
from .base import ModularExecutor


class CupyExecutor(ModularExecutor):
    name = "cupy"
    memory = frozenset({CUPY_ARRAY})
    device_kinds = frozenset({"cuda"})

    def unavailable(self) -> str | None:
        try:
            import cupy  # noqa: F401
        except ImportError:
            return "cupy is not installed (pip install 'nvdispatch[cupy]')"
        except Exception as exc:  # noqa: BLE001 - a CuPy build that cannot find its CUDA
            return f"cupy failed to import ({exc})"
        return None

    def coerce_operand(self, array):
        return adapter_named("cupy").coerce(array)


def stream_context(stream, device=None):
    """A context making ``stream`` CuPy's current stream (a no-op for None): a ``cupy.cuda.Stream`` as it is, any
    other stream (a raw handle, a ``__cuda_stream__`` object, a Torch stream) as a ``cupy.cuda.ExternalStream``."""
    if stream is None:
        return contextlib.nullcontext()
    import cupy

    if isinstance(stream, cupy.cuda.Stream):
        return stream
    return cupy.cuda.ExternalStream(stream_pointer(stream, "cupy"))
