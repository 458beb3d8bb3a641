"""Block-level GEMM callable inside ``@numba.cuda.jit`` kernels (a cuBLASDx-style API)."""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import numpy as np

from .dim3 import Dim3
from .errors import DeviceConfigurationError
from .gemm_source import FUNCTION_NAME, choose_layout, generate_gemm_source
from .kernel_object import KernelObject, compile_device_source
from .launch_checks import checks_enabled, gemm_checks
from .precision import complex_of, normalize_precision

__all__ = ["Matmul", "matmul"]

ARRANGEMENTS = ("col_major", "row_major")
DATA_TYPES = ("real", "complex")
MAX_THREADS = 1024


class Matmul(KernelObject):
    """A block GEMM ``C = alpha * A @ B + beta * C`` on tiles in shared memory.

    Parameters
    ----------
    size : (m, n, k)
        A is ``m x k``, B is ``k x n``, C is ``m x n``.
    precision : numpy floating type or str
        ``np.float32`` or ``np.float64`` (of the real and imaginary parts for complex data).
    data_type : {"real", "complex"}
    arrangement : (str, str, str), optional
        ``"col_major"`` (default, as cuBLASDx) or ``"row_major"`` for A, B and C. A column-major operand of
        logical shape ``(r, s)`` is passed as a 2-D array of shape ``(s, r)`` (``cuda.shared.array`` is
        row-major), exactly like nvmath-python's examples; a row-major one as ``(r, s)``.
    block_size : int, optional
        Threads per block (1-D). Alternatively ``block_dim``; default: suggested from the tile size.
    block_dim : tuple of int, optional
        Block shape (x, y, z); the threads are linearised x-fastest.
    execution : {"Block"}
    alpha, beta : optional
        Recorded as attributes for nvmath-python compatibility; the kernel passes the values it uses.

    Attributes
    ----------
    a_dim, b_dim, c_dim : tuple of int
        Logical shapes ``(m, k)``, ``(k, n)``, ``(m, n)``.
    a_value_type, b_value_type, c_value_type, value_type : numba type
    block_dim : Dim3
    shared_memory_size : int
        Bytes needed to hold A, B and C in shared memory.
    files : list
        Always empty (the code is generated Numba).

    Examples
    --------
    >>> import numpy as np
    >>> from nvdispatch.device import Matmul
    >>> MM = Matmul(size=(32, 16, 8), precision=np.float32, block_size=64)
    >>> MM.a_dim, MM.c_dim, MM.block_dim
    ((32, 8), (32, 16), Dim3(x=64, y=1, z=1))
    """

    constant_attributes: ClassVar[tuple[str, ...]] = (
        "m",
        "n",
        "k",
        "a_dim",
        "b_dim",
        "c_dim",
        "block_size",
        "shared_memory_size",
        "block_dim",
        "size",
        "value_type",
        "a_value_type",
        "b_value_type",
        "c_value_type",
    )

    def __init__(
        self,
        size: tuple[int, int, int],
        precision: Any,
        data_type: str = "real",
        arrangement: tuple[str, str, str] | None = None,
        block_size: int | None = None,
        block_dim: tuple[int, ...] | None = None,
        execution: str = "Block",
        alpha: Any = None,
        beta: Any = None,
    ):
        self.m, self.n, self.k = _check_size(size)
        self.size = (self.m, self.n, self.k)
        self.precision = normalize_precision(precision)
        if data_type not in DATA_TYPES:
            raise DeviceConfigurationError("data_type", DATA_TYPES, data_type)
        self.data_type = data_type
        if execution != "Block":
            raise DeviceConfigurationError("execution", ["Block"], execution)
        self.execution = execution
        arrangement = tuple(arrangement) if arrangement is not None else ("col_major",) * 3
        if len(arrangement) != 3 or any(x not in ARRANGEMENTS for x in arrangement):
            raise DeviceConfigurationError("arrangement", f"3 values among {ARRANGEMENTS}", arrangement)
        self.arrangement = arrangement
        self.block_dim = _check_block(block_size, block_dim, self.m, self.n)
        self.block_size = self.block_dim.count
        self.alpha, self.beta = alpha, beta
        self._checks = self._launch_checks() if checks_enabled() else ()
        self._numba_key = (
            f"gemm_{self.m}x{self.n}x{self.k}_{np.dtype(self.numpy_value_type).name}_"
            f"{'_'.join(a[0] for a in arrangement)}_{'x'.join(map(str, self.block_dim))}"
            + ("_checked" if self._checks else "")
        )
        self._implementation = _compiled(
            self.m, self.n, self.k, self.numpy_value_type, arrangement, tuple(self.block_dim), self._checks
        )
        self._finish_setup()

    def _launch_checks(self) -> tuple[str, ...]:
        def stored(dims: tuple[int, int], order: str) -> tuple[int, int]:
            return dims if order == "row_major" else dims[::-1]

        a, b, c = self.arrangement
        return tuple(
            gemm_checks(
                block_dim=tuple(self.block_dim),
                a_shape=stored((self.m, self.k), a),
                b_shape=stored((self.k, self.n), b),
                c_shape=stored((self.m, self.n), c),
            )
        )

    @property
    def numpy_value_type(self) -> type[np.generic]:
        return complex_of(self.precision) if self.data_type == "complex" else self.precision

    @property
    def value_type(self):
        from numba.np.numpy_support import from_dtype

        return from_dtype(np.dtype(self.numpy_value_type))

    a_value_type = b_value_type = c_value_type = value_type

    @property
    def a_dim(self) -> tuple[int, int]:
        return (self.m, self.k)

    @property
    def b_dim(self) -> tuple[int, int]:
        return (self.k, self.n)

    @property
    def c_dim(self) -> tuple[int, int]:
        return (self.m, self.n)

    @property
    def shared_memory_size(self) -> int:
        itemsize = np.dtype(self.numpy_value_type).itemsize
        return (self.m * self.k + self.k * self.n + self.m * self.n) * itemsize

    @property
    def files(self) -> list:
        return []

    def __repr__(self) -> str:
        return (
            f"Matmul(size={self.size}, precision={np.dtype(self.precision).name}, data_type="
            f"{self.data_type!r}, arrangement={self.arrangement}, block_dim={tuple(self.block_dim)})"
        )


def matmul(
    *,
    size: tuple[int, int, int],
    precision: Any,
    data_type: str = "real",
    arrangement: tuple[str, str, str] | None = None,
    block_size: int | None = None,
    block_dim: tuple[int, ...] | None = None,
    execution: str = "Block",
    compiler: str | None = "numba",
    alpha: Any = None,
    beta: Any = None,
) -> Matmul:
    """Build a block GEMM (the nvmath-python ``nvmath.device.matmul`` call style); see :class:`Matmul`.

    Examples
    --------
    >>> import numpy as np
    >>> from nvdispatch.device import matmul
    >>> MM = matmul(size=(16, 16, 16), precision=np.float64, data_type="complex", block_size=64,
    ...             compiler="numba")
    >>> MM.value_type, MM.shared_memory_size
    (complex128, 12288)
    """
    if compiler not in ("numba", None):
        raise DeviceConfigurationError("compiler", ["numba", None], compiler)
    return Matmul(
        size,
        precision,
        data_type=data_type,
        arrangement=arrangement,
        block_size=block_size,
        block_dim=block_dim,
        execution=execution,
        alpha=alpha,
        beta=beta,
    )


def _check_size(size: Any) -> tuple[int, int, int]:
    ok = isinstance(size, (tuple, list)) and len(size) == 3
    ok = ok and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in size)
    if not ok:
        raise DeviceConfigurationError("size", "a tuple (m, n, k) of positive integers", size)
    return int(size[0]), int(size[1]), int(size[2])


def _check_block(block_size: Any, block_dim: Any, m: int, n: int) -> Dim3:
    if block_size is not None and block_dim is not None:
        raise DeviceConfigurationError(
            "block_dim", "only one of block_size and block_dim", (block_size, block_dim)
        )
    if block_dim is not None:
        dims = tuple(block_dim) if isinstance(block_dim, (tuple, list, Dim3)) else (block_dim,)
        ok = 1 <= len(dims) <= 3 and all(isinstance(v, (int, np.integer)) and v >= 1 for v in dims)
        if not ok or int(np.prod(dims)) > MAX_THREADS:
            raise DeviceConfigurationError(
                "block_dim", f"1 to 3 positive integers, product <= {MAX_THREADS}", block_dim
            )
        return Dim3(*(int(v) for v in dims))
    if block_size is None:
        block_size = min(256, max(32, (m * n // 16) // 32 * 32))
    if not isinstance(block_size, (int, np.integer)) or not 1 <= block_size <= MAX_THREADS:
        raise DeviceConfigurationError("block_size", f"an integer in [1, {MAX_THREADS}]", block_size)
    return Dim3(int(block_size), 1, 1)


@functools.lru_cache(maxsize=256)
def _compiled(m, n, k, value_type, arrangement, block_dim, checks: tuple[str, ...] = ()):
    layout = choose_layout(m, n, block_dim[0] * block_dim[1] * block_dim[2])
    real = not np.issubdtype(value_type, np.complexfloating)
    source = generate_gemm_source(m, n, k, layout, arrangement, block_dim, real=real, checks=checks)
    return compile_device_source(
        source, {"VT": value_type, "ZERO": value_type(0), "IDX": np.uint64}, FUNCTION_NAME
    )
