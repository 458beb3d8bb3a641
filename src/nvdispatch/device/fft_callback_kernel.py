"""Generated kernels: load -> prolog -> block FFT -> (multiply by a filter -> block FFT) -> epilog -> store.

One launch transforms a batch of rows. The prolog and epilog are the user's Python functions compiled by
Numba as device functions and inlined into the kernel (``value`` a scalar, ``index`` an int64); the FFTs
are :class:`nvdispatch.device.FFT` Block configurations (sizes up to ``MAX_SIZE``), whose per-thread layout
(thread ``t`` holds element ``t + i * stride`` in slot ``i``) the load and store follow, so nothing but
the transform itself goes through shared memory.

Operands, as the kernel sees them (2-D, one transform per row; ``rows`` = ``x.shape[0]``):

* ``x``: ``(rows, m_in)``. ``m_in`` may differ from the transform's input length: missing elements are
  zeros (padding), extra ones are not read (trimming).
* ``out``: ``(rows, n_out)``.
* ``h`` (convolution only): ``(k, n_mid)``, the filter multiplied into the spectrum between the two FFTs
  (``n_mid`` = ``n`` for c2c, ``n // 2 + 1`` for real signals): row ``row % k`` for transform ``row`` (one
  row for all: ``k = 1``; the four-step convolution's ``k`` rows of a permuted filter), or with
  ``filter_per_row`` row ``row`` (``k = rows``).
* then the prolog's data arrays, then the epilog's, passed through to the callbacks unchanged.

With ``pairs`` (a c2c convolution without callbacks) ``x`` and ``out`` are real and transform ``r`` is the
complex signal ``x[2r] + i x[2r + 1]`` (zero for a missing last row): with ``h`` the Hermitian completion of a
real signal's half-spectrum filter (:func:`nvdispatch.device.fft_filter.launch_permute` into one row), the real
and imaginary parts of the result are the two rows' ``irfft(rfft(x) * h, n)``, stored to ``out[2r]`` and
``out[2r + 1]``: one complex transform for two real ones.

``index`` is ``row * n_in + k`` for the prolog and ``row * n_out + k`` for the epilog: the flat C-order
position in the logical input/output of the whole batch (see :mod:`nvdispatch._fft_callbacks`). The epilog
receives the output multiplied by ``scale`` (the norm). Kernels are compiled lazily by Numba (or eagerly by
:meth:`CallbackKernel.compile`), one per configuration and callback pair.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .fft import FFT
from .fft_config import is_smooth, max_block_size
from .kernel_steps import ArrayArg, KernelStep
from .shared_opt_in import allow_shared_memory
from .simulator_compat import simulator_active

__all__ = [
    "KernelSpec",
    "CallbackKernel",
    "build_callback_kernel",
    "convolution_kernel",
    "device_function",
    "covers",
    "launch_bounds",
]

KERNEL_NAME = "fft_callback_kernel"


@dataclass(frozen=True)
class KernelSpec:
    """Everything the generated source depends on (the callbacks themselves are passed separately)."""

    fft_type: str  # of the first FFT: "c2c" | "r2c" | "c2r"
    size: int
    precision: str  # "float32" | "float64"
    direction: str
    m_in: int  # the extent of x's rows
    prolog_args: int | None = None  # number of prolog data arrays; None: no prolog
    epilog_args: int | None = None
    scale: float = 1.0  # applied to the output before the epilog
    convolve: bool = False  # a second FFT (the inverse) after multiplying by h
    filter_per_row: bool = False  # h has one row per transform (else one row for all)
    mid_scale: float = 1.0  # applied with h between the two FFTs
    promote: bool = False  # real x read by a complex transform (converted on load)
    elements_per_thread: int | str = "suggested"
    ffts_per_block: int | str = "suggested"
    pairs: bool = False  # real x and out; rows 2r and 2r + 1 are one complex c2c transform (see the module doc)

    @property
    def n_in(self) -> int:
        return self.size // 2 + 1 if self.fft_type == "c2r" else self.size

    @property
    def last_type(self) -> str:
        if not self.convolve:
            return self.fft_type
        return "c2r" if self.fft_type == "r2c" else "c2c"

    @property
    def n_out(self) -> int:
        return self.size // 2 + 1 if self.last_type == "r2c" else self.size


def launch_bounds(threads: int) -> dict:
    """``cuda.jit`` options bounding the launch to at most ``threads`` a block (the compiler then keeps the
    registers within what so many threads may have). Nothing under the simulator (which has no such option)."""
    if simulator_active():
        return {}
    return {"launch_bounds": threads}


def covers(size: int, precision: str = "float32") -> bool:
    """Whether the device engine has a Block FFT of this length in ``precision`` (2**a 3**b 5**c 7**d, from 2
    to :func:`~nvdispatch.device.fft_config.max_block_size`)."""
    return 2 <= size <= max_block_size(precision) and is_smooth(size)


def length_reason(size: int, precision: str = "float32") -> str | None:
    """Why the device engine has no Block FFT of this length in ``precision``, or None (:func:`covers`)."""
    if covers(size, precision):
        return None
    limit = max_block_size(precision)
    return f"n={size} is not a device-engine length in {precision} (2**a 3**b 5**c 7**d, 2..{limit})"


def device_function(fn):
    """``fn`` as a Numba CUDA device function, inlined where it is called (``forceinline`` when available)."""
    from numba import cuda

    if getattr(fn, "__nvdispatch_device__", False):
        return fn
    try:
        compiled = cuda.jit(device=True, forceinline=True)(fn)
    except TypeError:  # older numba-cuda, or the simulator
        compiled = cuda.jit(device=True)(fn)
    return compiled


class _Lines:
    def __init__(self):
        self.lines: list[str] = []
        self.depth = 1

    def __call__(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)


def _range_test(lo: int, hi: int, limit: int, k: str) -> str | None | bool:
    """For k in [lo, hi]: True if always < limit, False if never, else the test ``k < limit``."""
    if hi < limit:
        return True
    if lo >= limit:
        return False
    return f"{k} < {limit}"


def _slots(w: _Lines, ept: int, stride: int, limit: int, half: bool):
    """The register slots of a row's load or store loop that hold an element ``k < limit``: writes
    ``k{i} = t + lo``, opens ``if k{i} < limit:`` where that is not always so, and yields ``(i, lo, hi, k)``
    for the caller to write the slot's lines (inside that ``if``). ``half``: only the first ``ept//2 + 1``
    slots (the Hermitian half of a c2r input or an r2c output)."""
    for i in range(ept):
        lo, hi = i * stride, i * stride + stride - 1
        k = f"k{i}"
        used = _range_test(lo, hi, limit, k)
        if half and i >= ept // 2 + 1:
            used = False
        if used is False:
            continue
        w(f"{k} = t + {lo}")
        if used is not True:
            w(f"if {used}:")
            w.depth += 1
        yield i, lo, hi, k
        if used is not True:
            w.depth -= 1


def generate_source(spec: KernelSpec, first: FFT, second: FFT | None) -> str:
    """The Python source of the kernel (globals: see :func:`build_callback_kernel`)."""
    n, ept, stride, fpb = spec.size, first.elements_per_thread, first.stride, first.ffts_per_block
    pargs = [f"p{i}" for i in range(spec.prolog_args or 0)]
    eargs = [f"e{i}" for i in range(spec.epilog_args or 0)]
    params = ["x", "out", *(["h"] if spec.convolve else []), *pargs, *eargs]
    w = _Lines()
    w("thread_data = cuda.local.array(STORAGE, VALUE)")
    w("shared_mem = cuda.shared.array(0, VALUE)")
    w("reals = thread_data.view(REAL)")
    w("t = cuda.threadIdx.x")
    w(f"row = cuda.blockIdx.x * {fpb} + cuda.threadIdx.y")
    if spec.pairs:
        w("a = 2 * INDEX(row)")
        w("active = a < x.shape[0]")
        w("second = a + 1 < x.shape[0]")
    else:
        w("active = row < x.shape[0]")
    w("if active:")
    w.depth += 1
    w(f"base = INDEX(row) * {spec.n_in}")
    kind = spec.fft_type
    for i, lo, hi, k in _slots(w, ept, stride, spec.n_in, kind == "c2r"):  # c2r: slots past n//2 are not input
        read = _range_test(lo, hi, spec.m_in, k)
        if spec.pairs:
            guard = "" if read is True else f" if {read} else RZERO"
            w(f"reals[{2 * i}] = x[a, {k}]{guard}" if read is not False else f"reals[{2 * i}] = RZERO")
            second = f"x[a + 1, {k}] if second else RZERO"
            if read is False:
                second = "RZERO"
            elif read is not True:
                second = f"x[a + 1, {k}] if second and {read} else RZERO"
            w(f"reals[{2 * i + 1}] = {second}")
            continue
        zero = "RZERO" if kind == "r2c" else "ZERO"
        load = f"CPLX(x[row, {k}])" if spec.promote else f"x[row, {k}]"
        if read is True:
            w(f"v = {load}")
        elif read is False:
            w(f"v = {zero}")
        else:
            w(f"v = {load} if {read} else {zero}")
        if spec.prolog_args is not None:
            w(f"v = PROLOG(v, base + {k}{''.join(', ' + a for a in pargs)})")
        w(f"{'reals' if kind == 'r2c' else 'thread_data'}[{i}] = v")
    w.depth -= 1
    w("else:")  # idle rows of the last block transform zeros (defined values, no NaN arithmetic)
    w.depth += 1
    w("for i in range(STORAGE):")
    w("    thread_data[i] = ZERO")
    w.depth -= 1
    w("FIRST(thread_data, shared_mem)")
    if spec.convolve:
        n_mid = n // 2 + 1 if kind == "r2c" else n
        slots = ept // 2 + 1 if kind == "r2c" else ept
        w("if active:")
        w.depth += 1
        w(f"hrow = {'row' if spec.filter_per_row else 'row % h.shape[0]'}")  # h's rows repeat along the batch
        for i in range(min(slots, ept)):
            lo, hi = i * stride, i * stride + stride - 1
            used = _range_test(lo, hi, n_mid, "k")
            if used is False:
                continue
            cond = "" if used is True else f"if t + {lo} < {n_mid}: "
            mid = " * MID" if spec.mid_scale != 1.0 else ""
            w(f"{cond}thread_data[{i}] = thread_data[{i}] * h[hrow, t + {lo}]{mid}")
        w.depth -= 1
        w("SECOND(thread_data, shared_mem)")
    last = spec.last_type
    w("if active:")
    w.depth += 1
    w(f"base = INDEX(row) * {spec.n_out}")
    for i, _, _, k in _slots(w, ept, stride, spec.n_out, last == "r2c"):
        if spec.pairs:
            scale = " * SCALE" if spec.scale != 1.0 else ""
            w(f"out[a, {k}] = reals[{2 * i}]{scale}")
            w("if second:")
            w(f"    out[a + 1, {k}] = reals[{2 * i + 1}]{scale}")
            continue
        value = f"reals[{i}]" if last == "c2r" else f"thread_data[{i}]"
        w(f"v = {value}" + (" * SCALE" if spec.scale != 1.0 else ""))
        if spec.epilog_args is not None:
            w(f"v = EPILOG(v, base + {k}{''.join(', ' + a for a in eargs)})")
        w(f"out[row, {k}] = v")
    w.depth -= 1
    return f"def {KERNEL_NAME}({', '.join(params)}):\n" + "\n".join(w.lines) + "\n"


class CallbackKernel:
    """A generated kernel with its launch configuration. ``launch(x, out, h, pdata, edata, stream)``."""

    def __init__(self, spec: KernelSpec, prolog=None, epilog=None):
        from numba import cuda
        from numba.np.numpy_support import from_dtype

        real = np.dtype(spec.precision).type
        first = FFT(
            size=spec.size,
            precision=real,
            fft_type=spec.fft_type,
            execution="Block",
            direction=spec.direction,
            elements_per_thread=spec.elements_per_thread,
            ffts_per_block=spec.ffts_per_block,
        )
        second = None
        if spec.convolve:
            second = FFT(
                size=spec.size,
                precision=real,
                fft_type=spec.last_type,
                execution="Block",
                direction="inverse" if spec.direction == "forward" else "forward",
                elements_per_thread=first.elements_per_thread,
                ffts_per_block=first.ffts_per_block,
            )
        callbacks = spec.prolog_args is not None or spec.epilog_args is not None
        if spec.pairs and (spec.fft_type != "c2c" or not spec.convolve or callbacks or spec.filter_per_row):
            raise ValueError("pairs: a c2c convolution with one filter row and no callbacks")
        self.spec, self.first, self.second = spec, first, second
        self.source = generate_source(spec, first, second)
        cplx = np.dtype(np.result_type(real, np.complex64))
        namespace: dict[str, Any] = {
            "cuda": cuda,
            "math": math,
            "STORAGE": first.storage_size if second is None else max(first.storage_size, second.storage_size),
            "VALUE": from_dtype(cplx),
            "REAL": real,
            "INDEX": np.int64,
            "ZERO": cplx.type(0),
            "CPLX": cplx.type,
            "RZERO": real(0),
            "SCALE": real(spec.scale),
            "MID": real(spec.mid_scale),
            "FIRST": first,
            "SECOND": second,
            "PROLOG": None if prolog is None else device_function(prolog),
            "EPILOG": None if epilog is None else device_function(epilog),
        }
        code = compile(self.source, f"<nvdispatch generated {KERNEL_NAME} {first._numba_key}>", "exec")
        exec(code, namespace)  # noqa: S102 - generated by this module
        self.python_function = namespace[KERNEL_NAME]
        self.block_dim = tuple(first.block_dim)
        self.kernel = cuda.jit(**launch_bounds(math.prod(self.block_dim)))(self.python_function)
        self.ffts_per_block = first.ffts_per_block
        self.shared_memory_size = max(first.shared_memory_size, second.shared_memory_size if second else 0)

    def grid(self, rows: int) -> int:
        """Blocks for ``rows`` rows of ``x`` (with ``pairs``, two rows a transform)."""
        transforms = (rows + 1) // 2 if self.spec.pairs else rows
        return max(1, -(-transforms // self.ffts_per_block))

    def compile(self, argtypes) -> None:
        """Compile now for these Numba argument types (raises what Numba says if a callback cannot); a kernel
        of more than 48 KiB of shared memory opts in to it here (launches need these argument types then)."""
        if not simulator_active():
            self.kernel.compile(tuple(argtypes))
            allow_shared_memory(self.kernel, tuple(argtypes), self.shared_memory_size)

    def convolution_step(self, x: ArrayArg, out: ArrayArg, h: ArrayArg) -> KernelStep:
        """The launch of a convolution kernel (no callbacks) over the rows of ``x``."""
        return KernelStep(self.kernel, (self.grid(x.shape[0]),), self.block_dim, self.shared_memory_size, (x, out, h))

    def launch(self, x, out, h=None, prolog_data=(), epilog_data=(), stream=0) -> None:
        args = [x, out, *([h] if self.spec.convolve else []), *prolog_data, *epilog_data]
        self.kernel[self.grid(x.shape[0]), self.block_dim, stream, self.shared_memory_size](*args)


def build_callback_kernel(spec: KernelSpec, prolog=None, epilog=None) -> CallbackKernel:
    """The kernel for ``spec`` with these callbacks (plain Python functions, or Numba device functions)."""
    return CallbackKernel(spec, prolog, epilog)


@functools.lru_cache(maxsize=64)
def convolution_kernel(spec: KernelSpec) -> CallbackKernel:
    """The callback-free kernel of ``spec`` (a convolution's), made once per process: plans of any batch
    share it, and Numba compiles it once per argument types."""
    return CallbackKernel(spec)
