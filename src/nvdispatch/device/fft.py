"""Block- and thread-level FFTs callable inside ``@numba.cuda.jit`` kernels (a cuFFTDx-style API)."""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import numpy as np

from .dim3 import Dim3
from .errors import DeviceConfigurationError, UnsupportedConfigurationError
from .fft_config import FFTConfig, valid_elements_per_thread, valid_sizes
from .fft_source import FUNCTION_NAME, generate_fft_source
from .kernel_object import KernelObject, compile_device_source
from .launch_checks import checks_enabled, fft_checks
from .precision import complex_of, normalize_precision

__all__ = ["FFT", "fft", "valid"]

_KNOBS = ("size", "elements_per_thread", "ffts_per_block", "precision", "fft_type", "direction", "execution")


class FFT(KernelObject):
    """One FFT configuration, callable in a kernel as ``FFT(thread_data, shared_mem)``.

    Parameters
    ----------
    size : int
        Transform length: ``2**a * 3**b * 5**c * 7**d``, at most 16384 (Block) or 64 (Thread).
    precision : numpy floating type or str
        ``np.float32`` or ``np.float64``.
    fft_type : {"c2c", "r2c", "c2r"}
    execution : {"Block", "Thread"}
        ``"Block"``: the threads ``threadIdx.x`` of a block cooperate on one FFT, ``threadIdx.y`` selects the
        FFT among ``ffts_per_block``. ``"Thread"``: each thread computes a whole FFT in its registers.
    direction : {"forward", "inverse"}, optional
        Required for c2c; r2c is forward and c2r inverse. Inverse transforms are unnormalised.
    elements_per_thread, ffts_per_block : int or "suggested", optional
        Block execution knobs. ``valid("elements_per_thread")`` lists the accepted values.
    sm : optional
        Accepted for nvmath-python compatibility and ignored (the generated code suits every GPU).
    real_fft_options : dict, optional
        Only cuFFTDx's default ``{"complex_layout": "natural", "real_mode": "normal"}`` is implemented.

    Attributes
    ----------
    value_type, input_type, output_type : numba type
        Complex type of ``thread_data``; types of the input and output elements.
    storage_size : int
        Length of the ``thread_data`` local array (in ``value_type`` elements).
    stride : int
        Distance between consecutive elements a thread holds (Block: ``size // elements_per_thread``).
    block_dim : Dim3
        Block dimensions to launch with. ``shared_memory_size`` is the dynamic shared memory in bytes; above
        48 KiB (Block FFTs longer than 8192 points in float32, 4096 in float64) the kernel must opt in before it
        is launched: ``nvdispatch.device.allow_shared_memory(kernel, argtypes, f.shared_memory_size)``.
    files : list
        Files to link (empty: the code is generated Numba, nothing to link).

    Notes
    -----
    The per-thread data layout follows cuFFTDx: thread ``t`` holds element ``t + i * stride`` in slot ``i``;
    see :mod:`nvdispatch.device.fft_source` for r2c/c2r. Every thread of the block must make the call
    (Block execution synchronises the block).

    Examples
    --------
    >>> import numpy as np
    >>> from nvdispatch.device import FFT
    >>> f = FFT(size=128, precision=np.float32, fft_type="c2c", execution="Block",
    ...         direction="forward", elements_per_thread=2, ffts_per_block=1)
    >>> f.block_dim, f.stride, f.storage_size
    (Dim3(x=64, y=1, z=1), 64, 2)
    """

    constant_attributes: ClassVar[tuple[str, ...]] = (
        "size",
        "storage_size",
        "stride",
        "elements_per_thread",
        "ffts_per_block",
        "shared_memory_size",
        "block_dim",
        "value_type",
        "input_type",
        "output_type",
    )

    def __init__(
        self,
        size: int,
        precision: Any,
        fft_type: str,
        execution: str,
        direction: str | None = None,
        ffts_per_block: int | str | None = "suggested",
        elements_per_thread: int | str | None = "suggested",
        sm: Any = None,
        real_fft_options: dict | None = None,
    ):
        _check_real_fft_options(real_fft_options)
        self._config = FFTConfig.build(
            fft_type=fft_type,
            size=size,
            precision=precision,
            direction=direction,
            execution=execution,
            elements_per_thread=elements_per_thread,
            ffts_per_block=ffts_per_block,
        )
        self._checks = self._launch_checks() if checks_enabled() else ()
        self._numba_key = self._config.key + ("_checked" if self._checks else "")
        self._implementation = _compiled(self._config, self._checks)
        self._finish_setup()

    # -- the knobs ----------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return self._config.size

    @property
    def precision(self) -> type[np.floating]:
        return self._config.precision

    @property
    def fft_type(self) -> str:
        return self._config.fft_type

    @property
    def direction(self) -> str:
        return self._config.direction

    @property
    def execution(self) -> str:
        return self._config.execution

    @property
    def elements_per_thread(self) -> int:
        return self._config.elements_per_thread

    @property
    def ffts_per_block(self) -> int:
        return self._config.ffts_per_block

    # -- what follows from them ---------------------------------------------------------------------------
    @property
    def value_type(self):
        from numba.np.numpy_support import from_dtype

        return from_dtype(np.dtype(complex_of(self.precision)))

    @property
    def input_type(self):
        from numba.np.numpy_support import from_dtype

        return from_dtype(np.dtype(self.precision)) if self.fft_type == "r2c" else self.value_type

    @property
    def output_type(self):
        from numba.np.numpy_support import from_dtype

        return from_dtype(np.dtype(self.precision)) if self.fft_type == "c2r" else self.value_type

    @property
    def stride(self) -> int:
        return self._config.threads_per_fft if self.execution == "Block" else 1

    @property
    def storage_size(self) -> int:
        if self.execution == "Thread":
            return self.size if self.fft_type == "c2c" else self.size // 2 + 1
        ept = self.elements_per_thread
        return ept if self.fft_type == "c2c" else ept // 2 + 1

    @property
    def block_dim(self) -> Dim3:
        if self.execution == "Thread":
            return Dim3(1, 1, 1)
        return Dim3(self._config.threads_per_fft, self.ffts_per_block, 1)

    @property
    def shared_memory_size(self) -> int:
        if self.execution == "Thread" or self._config.threads_per_fft == 1:
            return 0
        real_bytes = np.dtype(self.precision).itemsize
        reals = self.ffts_per_block * self._config.shared_stride
        # Whole complex values: the kernel declares the buffer with the complex value_type.
        return (reals + reals % 2) * real_bytes

    @property
    def files(self) -> list:
        return []

    @property
    def source(self) -> str:
        """The generated Python source of this configuration (for inspection)."""
        return self._implementation_source()

    def _implementation_source(self) -> str:
        return generate_fft_source(self._config, self._checks)[0]

    def _launch_checks(self) -> tuple[str, ...]:
        return tuple(
            fft_checks(
                execution=self.execution,
                threads_per_fft=self._config.threads_per_fft,
                ffts_per_block=self.ffts_per_block,
                storage_size=self.storage_size,
                shared_bytes=self.shared_memory_size,
                value_type=np.dtype(complex_of(self.precision)).name,
            )
        )

    def valid(self, *knobs: str) -> list[Any]:
        """Values (or, for several knobs, tuples of values) accepted for ``knobs`` at this size.

        Examples
        --------
        >>> from nvdispatch.device import FFT
        >>> FFT(size=16, precision="float32", fft_type="c2c", execution="Block", direction="forward"
        ...     ).valid("elements_per_thread")
        [2, 4, 8, 16]
        """
        return valid(*knobs, size=self.size, fft_type=self.fft_type, execution=self.execution)

    def __repr__(self) -> str:
        c = self._config
        return (
            f"FFT(size={c.size}, precision={np.dtype(c.precision).name}, fft_type={c.fft_type!r}, "
            f"direction={c.direction!r}, execution={c.execution!r}, elements_per_thread="
            f"{c.elements_per_thread}, ffts_per_block={c.ffts_per_block})"
        )


def fft(
    *,
    fft_type: str,
    size: int,
    precision: Any,
    direction: str | None = None,
    execution: str = "Block",
    elements_per_thread: int | str | None = "suggested",
    ffts_per_block: int | str | None = "suggested",
    compiler: str | None = "numba",
    sm: Any = None,
    real_fft_options: dict | None = None,
) -> FFT:
    """Build a device FFT (the nvmath-python ``nvmath.device.fft`` call style).

    Parameters are those of :class:`FFT`; ``compiler`` must be ``"numba"`` (or None).

    Examples
    --------
    >>> import numpy as np
    >>> from nvdispatch.device import fft
    >>> FFT_fwd = fft(fft_type="c2c", size=128, precision=np.float32, direction="forward",
    ...               ffts_per_block=1, elements_per_thread=2, execution="Block", compiler="numba")
    >>> FFT_fwd.shared_memory_size, FFT_fwd.files
    (2816, [])
    """
    if compiler not in ("numba", None):
        raise DeviceConfigurationError("compiler", ["numba", None], compiler)
    return FFT(
        size=size,
        precision=precision,
        fft_type=fft_type,
        execution=execution,
        direction=direction,
        ffts_per_block=ffts_per_block,
        elements_per_thread=elements_per_thread,
        sm=sm,
        real_fft_options=real_fft_options,
    )


def _check_real_fft_options(options: dict | None) -> None:
    """Only cuFFTDx's default real-FFT layout (natural complex layout, normal mode) is implemented."""
    default = {"complex_layout": "natural", "real_mode": "normal"}
    if options is None:
        return
    if not isinstance(options, dict) or any(options.get(k, v) != v for k, v in default.items()):
        raise UnsupportedConfigurationError("real_fft_options", f"None or {default}", options)
    unknown = set(options) - set(default)
    if unknown:
        raise DeviceConfigurationError("real_fft_options", f"keys among {sorted(default)}", options)


def valid(
    *knobs: str, size: int, fft_type: str = "c2c", execution: str = "Block", precision: Any = np.float32
) -> list[Any]:
    """Valid values of one knob, or tuples of values of several knobs, for a given size.

    Examples
    --------
    >>> from nvdispatch.device import valid
    >>> valid("elements_per_thread", size=64)
    [2, 4, 8, 16, 32]
    >>> valid("elements_per_thread", "ffts_per_block", size=4, execution="Block")[:3]
    [(2, 1), (2, 2), (2, 3)]
    """
    for knob in knobs:
        if knob not in _KNOBS:
            raise DeviceConfigurationError("knobs", _KNOBS, knob)
    if knobs == ("size",):
        return valid_sizes(execution, normalize_precision(precision))
    ept_options = [size] if execution == "Thread" else valid_elements_per_thread(size, fft_type)
    rows = []
    for ept in ept_options:
        threads = 1 if execution == "Thread" else size // ept
        for fpb in range(1, 1024 // threads + 1) if execution == "Block" else [1]:
            rows.append({"elements_per_thread": ept, "ffts_per_block": fpb, "size": size})
    if any(k not in ("elements_per_thread", "ffts_per_block", "size") for k in knobs):
        raise DeviceConfigurationError("knobs", ["size", "elements_per_thread", "ffts_per_block"], knobs)
    if len(knobs) == 1:
        return sorted({row[knobs[0]] for row in rows})
    return sorted({tuple(row[k] for k in knobs) for row in rows})


@functools.lru_cache(maxsize=256)
def _compiled(config: FFTConfig, checks: tuple[str, ...] = ()):
    source, constants = generate_fft_source(config, checks)
    return compile_device_source(source, constants, FUNCTION_NAME)
