"""Device-side FFT and GEMM for ``@numba.cuda.jit`` kernels (cuFFTDx / cuBLASDx style), simulator-ready.

``fft(...)`` / ``FFT(...)`` and ``matmul(...)`` / ``Matmul(...)`` return objects that a kernel calls like a
device function (``FFT(thread_data, shared_mem)``, ``MM(alpha, a, b, beta, c)``). Their code is generated
per configuration as Numba Python: fully unrolled butterflies with constant twiddles and Stockham exchanges
through shared memory; nothing needs linking (``files`` is empty).

Importing this package under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) makes GPU-valid kernels run
there unchanged (``link=[]``, ``cuda.shared.array(shape=(0,), ...)``); see
:mod:`nvdispatch.device.simulator_compat`.

Examples
--------
>>> import numpy as np
>>> from nvdispatch.device import fft
>>> F = fft(fft_type="c2c", size=64, precision=np.float32, direction="forward", execution="Block",
...         elements_per_thread=8, ffts_per_block=2)
>>> F.block_dim
Dim3(x=8, y=2, z=1)
"""

from __future__ import annotations

try:
    import numba.cuda  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "nvdispatch.device needs Numba's CUDA target: pip install 'nvdispatch[numba]' (numba and numba-cuda)"
    ) from exc

from . import simulator_compat as _simulator_compat  # noqa: E402

_simulator_compat.install()

from .dim3 import Dim3  # noqa: E402
from .errors import DeviceConfigurationError, DeviceLaunchError, UnsupportedConfigurationError  # noqa: E402
from .fft import FFT, fft, valid  # noqa: E402
from .matmul import Matmul, matmul  # noqa: E402
from .shared_opt_in import allow_shared_memory, needs_opt_in  # noqa: E402

__all__ = [
    "FFT",
    "Matmul",
    "Dim3",
    "allow_shared_memory",
    "needs_opt_in",
    "DeviceConfigurationError",
    "DeviceLaunchError",
    "UnsupportedConfigurationError",
    "fft",
    "matmul",
    "valid",
]
