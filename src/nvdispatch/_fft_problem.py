"""The FFT *problem*: an immutable, hashable description of one FFT call (the plan-cache key).

Front-end (``nvdispatch.fft``) arguments are validated here against the array-API fft extension
(2024.12) and resolved to concrete, non-negative ``axes`` and per-axis transform ``lengths``:

* 1-D functions (``fft, ifft, rfft, irfft, hfft, ihfft``): ``n`` must be ``None`` or an int >= 1;
  ``axis`` an int in ``[-N, N)``. ``irfft``/``hfft`` default ``n`` is ``2 * (m - 1)``.
* n-D functions (``fftn, ifftn, rfftn, irfftn``): ``axes=None`` means every axis, or the last ``len(s)``
  axes when ``s`` is given (as NumPy, SciPy, Torch and CuPy do; the standard leaves it open); ``s`` must
  have one entry per axis; ``s[i] == -1`` keeps the input size. Duplicate axes (implementation-defined in
  the standard) are rejected here; ``nvdispatch.fft`` runs them NumPy's way (one transform per entry) for
  NumPy input. For ``irfftn`` the last entry of ``s`` is the output length of the last axis in ``axes``
  (default ``2 * (m - 1)``).
* ``norm`` is ``"backward"``, ``"ortho"`` or ``"forward"``.

Dtypes: the standard asks complex floating input for ``fft/ifft/fftn/ifftn/irfft/irfftn/hfft`` and real
floating input for ``rfft/rfftn/ihfft``. nvdispatch is friendlier on one side: real floating input to a
complex transform is promoted to the complex dtype of the same precision (as NumPy does), and NumPy's
long double (``float128``/``complex256``, served by ``scipy.fft``'s pocketfft) is taken. Integer, boolean
and half-precision inputs reach this module already promoted by ``nvdispatch.fft`` (NumPy's/SciPy's/the
framework's rules, see ``_fft_conventions``); anything else, and complex input to real-input transforms,
raises :class:`~nvdispatch.errors.UnsupportedDtypeError`. Precision is kept: ``float32``/``complex64`` in
gives ``complex64``/``float32`` out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._detect import Device
from ._shapes import as_size
from .errors import AxisError, InvalidArgumentError, ShapeMismatchError, UnsupportedDtypeError

__all__ = ["FFTProblem", "build_fft_problem", "result_layout", "result_dtype", "FUNCS", "NORMS"]

NORMS = ("backward", "ortho", "forward")

#: function → (kind, direction, n-D?)
FUNCS: dict[str, tuple[str, str, bool]] = {
    "fft": ("c2c", "forward", False),
    "ifft": ("c2c", "inverse", False),
    "fftn": ("c2c", "forward", True),
    "ifftn": ("c2c", "inverse", True),
    "rfft": ("r2c", "forward", False),
    "rfftn": ("r2c", "forward", True),
    "irfft": ("c2r", "inverse", False),
    "irfftn": ("c2r", "inverse", True),
    "hfft": ("c2r", "forward", False),  # Hermitian input, real output
    "ihfft": ("r2c", "inverse", False),  # real input, Hermitian (half) output
}

_REAL = {"float32": "complex64", "float64": "complex128", "float128": "complex256"}
_COMPLEX = {"complex64": "float32", "complex128": "float64", "complex256": "float128"}
#: NumPy's long double (x86-64/aarch64 Linux): only the NumPy executor (scipy.fft's pocketfft) runs it
LONG_DOUBLE = frozenset({"float128", "complex256"})


@dataclass(frozen=True)
class FFTProblem:
    """One FFT call, resolved. ``lengths[i]`` is the logical transform length along ``axes[i]``
    (for c2r transforms: the *output* length of the last axis)."""

    framework: str
    device: Device
    func: str
    kind: str  # "c2c" | "r2c" | "c2r"
    direction: str  # "forward" | "inverse"
    dtype: str  # input dtype
    compute_dtype: str  # complex dtype of the transform
    result_dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    axes: tuple[int, ...]
    lengths: tuple[int, ...]
    norm: str
    ndim_api: bool  # called through an n-D function (s/axes) rather than a 1-D one (n/axis)
    autograd: bool = False  # autograd records this call (a Torch tensor requiring grad)
    chunks: Any = None  # a chunked (Dask) operand's layout, else None
    #: the memory kinds the operand's view is (``OperandInfo.memory``): what executors accept it by
    memory: frozenset[str] = field(default=frozenset(), repr=False)

    @property
    def real_dtype(self) -> str:
        return _COMPLEX[self.compute_dtype]

    @property
    def long_double(self) -> bool:
        """Whether the transform runs in long double (which only CPU pocketfft implements)."""
        return self.compute_dtype in LONG_DOUBLE

    @property
    def in_lengths(self) -> tuple[int, ...]:
        """The extent each transformed axis must have on input (after padding/trimming)."""
        if self.kind == "c2r":
            return (*self.lengths[:-1], self.lengths[-1] // 2 + 1)
        return self.lengths

    @property
    def out_shape(self) -> tuple[int, ...]:
        shape = list(self.shape)
        for ax, n in zip(self.axes, self.lengths):
            shape[ax] = n
        if self.kind == "r2c":
            shape[self.axes[-1]] = self.lengths[-1] // 2 + 1
        return tuple(shape)

    @property
    def empty(self) -> bool:
        """Whether the input has no elements (a zero-length batch axis): the result is empty too."""
        return 0 in self.shape

    @property
    def needs_resize(self) -> bool:
        """Whether the input must be zero-padded or trimmed along some axis."""
        return any(self.shape[a] != n for a, n in zip(self.axes, self.in_lengths))

    def scale(self) -> float:
        """The factor the unnormalised transform's output must be multiplied by for ``norm``."""
        total = 1
        for n in self.lengths:
            total *= n
        inverse_like = self.direction == "inverse"
        if self.norm == "ortho":
            return 1.0 / total**0.5
        if (self.norm == "backward") == inverse_like:
            return 1.0 / total
        return 1.0

    def describe(self) -> str:
        args = f"s={self.lengths}, axes={self.axes}" if self.ndim_api else f"n={self.lengths[0]}, axis={self.axes[0]}"
        return (
            f"{self.func}({self.dtype}{list(self.shape)}, {args}, norm={self.norm!r}) -> "
            f"{self.result_dtype}{list(self.out_shape)}"
        )


def _as_int(value, argument: str) -> int:
    if isinstance(value, bool):
        raise InvalidArgumentError(argument, "an int", repr(value))
    try:
        return as_size(value)  # a traced program's symbolic length stays symbolic
    except TypeError:
        raise InvalidArgumentError(argument, "an int", repr(value)) from None


def normalize_axis(value, ndim: int, argument: str) -> int:
    ax = _as_int(value, argument)
    if not -ndim <= ax < ndim:
        raise AxisError(argument, f"an axis in [{-ndim}, {ndim}) for a {ndim}-D input", repr(value))
    return ax % ndim


def check_norm(norm) -> str:
    if norm is None:
        return "backward"
    if norm not in NORMS:
        raise InvalidArgumentError("norm", "'backward', 'ortho' or 'forward'", repr(norm))
    return norm


def _dtypes(func: str, kind: str, dtype: str) -> tuple[str, str]:
    """(compute complex dtype, result dtype) for ``func`` on ``dtype``; typed error when not accepted."""
    if kind == "r2c":
        if dtype not in _REAL:
            hint = "take the real part first" if dtype in _COMPLEX else ""
            raise UnsupportedDtypeError(
                "x", f"a real floating dtype (float32, float64, long double) for {func}", dtype, hint
            )
        return _REAL[dtype], _REAL[dtype]
    if dtype in _COMPLEX:
        cdt = dtype
    elif dtype in _REAL:
        cdt = _REAL[dtype]  # friendly promotion of real input
    else:
        raise UnsupportedDtypeError(
            "x",
            f"a floating dtype (complex64, complex128, or float32/float64 promoted to complex) for {func}",
            dtype,
            "cast integers and booleans to a floating dtype first" if dtype not in ("float16", "bfloat16") else "",
        )
    return cdt, (_COMPLEX[cdt] if kind == "c2r" else cdt)


def resolve_axes(func: str, shape: tuple[int, ...], n=None, axis=-1, s=None, axes=None):
    """Validate ``n/axis`` (1-D) or ``s/axes`` (n-D) and return ``(axes, sizes)`` with ``sizes[i]`` the
    requested length (``None``: default) along ``axes[i]``."""
    kind, _, nd = FUNCS[func]
    ndim = len(shape)
    if not nd:
        if ndim == 0:  # no axis to transform: an axis error, as in NumPy, SciPy and Torch
            raise AxisError("x", f"an array of at least 1 dimension for {func}", "a 0-d array")
        ax = normalize_axis(axis, ndim, "axis")
        if n is not None:
            n = _as_int(n, "n")
            if n < 1:
                raise InvalidArgumentError(
                    "n", "an int >= 1 (or None)", repr(n), f"Invalid number of FFT data points ({n}) specified"
                )
        return (ax,), (n,)
    if axes is None and s is not None:
        # NumPy, SciPy, Torch and CuPy: s alone applies to the last len(s) axes
        if isinstance(s, (str, bytes)) or not hasattr(s, "__len__"):
            raise InvalidArgumentError("s", "a sequence of ints (or None)", repr(s))
        if len(s) > ndim:
            raise ShapeMismatchError("s", f"at most {ndim} sizes for a {ndim}-D input (no axes given)", repr(s))
        axes = tuple(range(ndim - len(s), ndim))
    if axes is None:
        if ndim == 0:
            raise ShapeMismatchError("x", f"an array of at least 1 dimension for {func}", "a 0-d array")
        return tuple(range(ndim)), (None,) * ndim
    if isinstance(axes, (str, bytes)) or not hasattr(axes, "__iter__"):
        raise InvalidArgumentError("axes", "a sequence of ints (or None)", repr(axes))
    axes_t = tuple(normalize_axis(a, ndim, "axes") for a in axes)
    if not axes_t:
        raise InvalidArgumentError("axes", "at least one axis", repr(axes))
    if len(set(axes_t)) != len(axes_t):
        raise InvalidArgumentError("axes", "distinct axes", repr(tuple(axes)))
    if s is None:
        return axes_t, (None,) * len(axes_t)
    if isinstance(s, (str, bytes)) or not hasattr(s, "__iter__"):
        raise InvalidArgumentError("s", "a sequence of ints (or None)", repr(s))
    s_t = tuple(-1 if v is None else _as_int(v, "s") for v in s)
    if len(s_t) != len(axes_t):
        raise ShapeMismatchError("s", f"{len(axes_t)} sizes, one per entry of axes", f"{len(s_t)}: {tuple(s)}")
    for v in s_t:
        if v < 1 and v != -1:
            raise InvalidArgumentError("s", "sizes >= 1 (or -1 to keep an axis' size)", repr(tuple(s)))
    return axes_t, tuple(None if v == -1 else v for v in s_t)


def _lengths(func: str, shape: tuple[int, ...], axes: tuple[int, ...], sizes: tuple) -> tuple[int, ...]:
    """The transform length along each of ``axes`` (a size of None: the function's default)."""
    kind, _, nd = FUNCS[func]
    lengths = []
    for i, (ax, size) in enumerate(zip(axes, sizes)):
        m = shape[ax]
        last = i == len(axes) - 1
        if size is None:
            if kind == "c2r" and last:
                size = 2 * (m - 1)
                if size < 1:
                    arg = "n" if not nd else "s"
                    raise InvalidArgumentError(
                        arg,
                        f"an explicit output length: {func}'s default 2*(m-1) is not positive",
                        f"an input of length {m} along axis {ax}",
                    )
            else:
                size = m
                if size < 1:
                    raise ShapeMismatchError(
                        "x",
                        f"a non-empty axis {ax} to transform",
                        f"shape {shape}",
                        "Invalid number of FFT data points (0) specified",
                    )
        lengths.append(size)
    return tuple(lengths)


def result_layout(func: str, shape: tuple[int, ...], n=None, axis=-1, s=None, axes=None):
    """``(result shape, transformed axes)`` of ``func`` on an input of ``shape`` (the arguments validated as
    for a call)."""
    axes_t, sizes = resolve_axes(func, shape, n, axis, s, axes)
    lengths = _lengths(func, shape, axes_t, sizes)
    out = list(shape)
    for ax, length in zip(axes_t, lengths):
        out[ax] = length
    if FUNCS[func][0] == "r2c":
        out[axes_t[-1]] = lengths[-1] // 2 + 1
    return tuple(out), axes_t


def result_dtype(func: str, dtype: str) -> str:
    """The dtype of ``func``'s result on input of ``dtype`` (typed error when the input is not accepted)."""
    return _dtypes(func, FUNCS[func][0], dtype)[1]


def build_fft_problem(func: str, info, framework: str, device: Device, n=None, axis=-1, s=None, axes=None, norm=None):
    """The :class:`FFTProblem` of ``func`` on the operand described by ``info`` (an ``OperandInfo``)."""
    kind, direction, nd = FUNCS[func]
    norm = check_norm(norm)
    compute, result = _dtypes(func, kind, info.dtype)
    shape = tuple(info.shape)
    axes_t, sizes = resolve_axes(func, shape, n, axis, s, axes)
    lengths = _lengths(func, shape, axes_t, sizes)
    strides = tuple(info.strides) if info.strides is not None else None
    return FFTProblem(
        framework,
        device,
        func,
        kind,
        direction,
        info.dtype,
        compute,
        result,
        shape,
        strides,
        axes_t,
        lengths,
        norm,
        nd,
        getattr(info, "autograd", False),
        getattr(info, "chunks", None),
        info.memory,
    )
