"""The 14 transforms (``fft``, ``ifft``, ..., ``irfft2``), built by two helpers: one for the 1-D signature
(``a, n, axis, norm, out``), one for the n-D signature (``a, s, axes, norm, out``), each followed by the
keyword-only ``stream`` and callback arguments; each transform gets its name, its docstring (the shared
parameter section between its own summary and example) and its ``nvdispatch.explain`` hook."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

from .. import _fft_callbacks
from .._route import Explanation
from .._typing import Array, ArrayLike, Axes, CallbackData, ElementCallback, Norm, Shape, Stream
from ._route import explain_fft, transform_front

__all__ = [
    "fft",
    "ifft",
    "fftn",
    "ifftn",
    "rfft",
    "irfft",
    "rfftn",
    "irfftn",
    "hfft",
    "ihfft",
    "fft2",
    "ifft2",
    "rfft2",
    "irfft2",
]

_CALLBACK_DOC = """    stream : optional
        GPU stream (ignored on the CPU).
    prolog, epilog : callable, optional
        ``f(value, index, *data)`` applied to every input element as the transform loads it (prolog) and to
        every normalised output element before it is stored (epilog); ``index`` is the element's flat
        C-order position in the logical input (after padding/trimming) or output. Fused on the GPU (a
        generated kernel, or cuFFT LTO callbacks), called on whole arrays elsewhere; see
        :mod:`nvdispatch._fft_callbacks`.
    prolog_data, epilog_data : array or tuple of arrays, optional
        Extra arguments of the prolog/epilog (same framework and device as ``a``).
"""

_ONE_D_DOC = """
    Parameters
    ----------
    a : array or array_like
        NumPy, Torch, CuPy, JAX, ``__cuda_array_interface__`` or DLPack array; lists and scalars become NumPy
        arrays. Integer and boolean input is promoted as the caller's library does (NumPy: float64).
    n : int, optional
        Transform length along ``axis`` (the input is zero-padded or trimmed); positional as in NumPy.
    axis : int, optional
        The axis to transform (default: the last).
    norm : {"backward", "ortho", "forward"} or None, optional
        Scaling (None: "backward").
    out : array, optional
        Where to write the result (NumPy: ``same_kind`` casting; may be the input itself); returned.
"""

_N_D_DOC = """
    Parameters
    ----------
    a : array or array_like
        As for :func:`fft`.
    s : sequence of int, optional
        Transform length per axis in ``axes`` (-1: the input's); without ``axes`` the last ``len(s)`` axes
        (NumPy input: with NumPy 2's DeprecationWarning).
    axes : sequence of int, optional
        Axes to transform (default: all). On NumPy input an axis may repeat (transformed once per entry, as
        ``numpy.fft`` does).
    norm : {"backward", "ortho", "forward"} or None, optional
        Scaling (None: "backward").
    out : array, optional
        Where to write the result; returned.
"""


class OneDimTransform(Protocol):
    """The signature of the 1-D transforms (``fft``, ``ifft``, ``rfft``, ``irfft``, ``hfft``, ``ihfft``)."""

    def __call__(
        self,
        a: ArrayLike,
        n: int | None = None,
        axis: int = -1,
        norm: Norm = "backward",
        out: Array | None = None,
        *,
        stream: Stream = None,
        prolog: ElementCallback | None = None,
        epilog: ElementCallback | None = None,
        prolog_data: CallbackData = None,
        epilog_data: CallbackData = None,
    ) -> Array: ...


class NDimTransform(Protocol):
    """The signature of the n-D transforms (``fftn``, ..., ``irfftn`` and the 2-D forms, whose ``axes``
    default to ``(-2, -1)``)."""

    def __call__(
        self,
        a: ArrayLike,
        s: Shape = None,
        axes: Axes = None,
        norm: Norm = "backward",
        out: Array | None = None,
        *,
        stream: Stream = None,
        prolog: ElementCallback | None = None,
        epilog: ElementCallback | None = None,
        prolog_data: CallbackData = None,
        epilog_data: CallbackData = None,
    ) -> Array: ...


def _one_dim(func: str, summary: str, example: str) -> OneDimTransform:
    """The public 1-D transform ``func``."""

    def transform(
        a: ArrayLike,
        n: int | None = None,
        axis: int = -1,
        norm: Norm = "backward",
        out: Array | None = None,
        *,
        stream: Stream = None,
        prolog: ElementCallback | None = None,
        epilog: ElementCallback | None = None,
        prolog_data: CallbackData = None,
        epilog_data: CallbackData = None,
    ) -> Array:
        return transform_front(
            func, a, n, axis, None, None, norm, out, stream, "numpy", (prolog, epilog, prolog_data, epilog_data)
        )

    return _finish(transform, func, func, summary + "\n" + _ONE_D_DOC, example)


def _n_dim(
    name: str, func: str, summary: str, example: str, default_axes: tuple[int, ...] | None = None
) -> NDimTransform:
    """The public n-D transform ``name``, computing ``func`` (``fft2`` computes ``fftn`` over ``default_axes``)."""

    def transform(
        a: ArrayLike,
        s: Shape = None,
        axes: Axes = default_axes,
        norm: Norm = "backward",
        out: Array | None = None,
        *,
        stream: Stream = None,
        prolog: ElementCallback | None = None,
        epilog: ElementCallback | None = None,
        prolog_data: CallbackData = None,
        epilog_data: CallbackData = None,
    ) -> Array:
        return transform_front(
            func, a, None, -1, s, axes, norm, out, stream, "numpy", (prolog, epilog, prolog_data, epilog_data)
        )

    return _finish(transform, name, func, summary + "\n" + _N_D_DOC, example)


def _finish(transform: Callable[..., Array], name: str, func: str, summary_and_params: str, example: str) -> Any:
    """``transform`` named ``name``, documented, and explained by ``nvdispatch.explain`` as a ``func`` call."""
    transform.__name__ = transform.__qualname__ = name
    transform.__doc__ = summary_and_params + _CALLBACK_DOC + "\n    Examples\n    --------\n" + example
    signature = inspect.signature(transform)

    def explain(*args: Any, **kwargs: Any) -> Explanation:
        arg = signature.bind(*args, **kwargs)
        arg.apply_defaults()
        p = arg.arguments
        callbacks = (p["prolog"], p["epilog"], p["prolog_data"], p["epilog_data"])
        n, axis, s, axes = p.get("n"), p.get("axis", -1), p.get("s"), p.get("axes")
        if any(c is not None for c in callbacks):
            return _fft_callbacks.explain(func, p["a"], n, axis, s, axes, p["norm"], p["stream"], callbacks=callbacks)
        return explain_fft(
            func, p["a"], n=n, axis=axis, s=s, axes=axes, norm=p["norm"], stream=p["stream"], out=p["out"]
        )

    transform.__nvdispatch_explain__ = explain  # type: ignore[attr-defined]
    return transform


fft = _one_dim(
    "fft",
    "One-dimensional discrete Fourier transform of ``a`` along ``axis``; complex, of the input's precision.",
    "    >>> import nvdispatch\n    >>> nvdispatch.fft.fft([1.0, 0.0, 0.0, 0.0], 2).real  # n positional\n"
    "    array([1., 1.])\n",
)
ifft = _one_dim(
    "ifft",
    "One-dimensional inverse DFT (``norm='backward'`` scales by ``1/n``).",
    "    >>> import nvdispatch\n    >>> nvdispatch.fft.ifft([4, 0, 0, 0]).real\n    array([1., 1., 1., 1.])\n",
)
rfft = _one_dim(
    "rfft",
    "DFT of real input: the ``n//2 + 1`` non-negative frequency terms along ``axis``.",
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.rfft(np.ones(4, np.float32))\n"
    "    array([4.+0.j, 0.+0.j, 0.+0.j], dtype=complex64)\n",
)
irfft = _one_dim(
    "irfft",
    "Inverse of :func:`rfft`: real output of length ``n`` (default ``2*(m-1)``) along ``axis``.",
    "    >>> import nvdispatch\n    >>> nvdispatch.fft.irfft([4, 0, 0])\n    array([1., 1., 1., 1.])\n",
)
hfft = _one_dim(
    "hfft",
    "DFT of a Hermitian-symmetric signal given by its first half: real output of length ``n``.",
    "    >>> import nvdispatch\n    >>> nvdispatch.fft.hfft([1, 0, 0])\n    array([1., 1., 1., 1.])\n",
)
ihfft = _one_dim(
    "ihfft",
    "Inverse of :func:`hfft`: the ``n//2 + 1`` terms of the Hermitian spectrum of real input.",
    "    >>> import nvdispatch\n    >>> nvdispatch.fft.ihfft([1.0, 1.0, 1.0, 1.0]).real\n    array([1., 0., 0.])\n",
)
fftn = _n_dim(
    "fftn",
    "fftn",
    "n-dimensional DFT over ``axes``.",
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.fftn(np.ones((2, 2))).real\n"
    "    array([[4., 0.],\n           [0., 0.]])\n",
)
ifftn = _n_dim(
    "ifftn",
    "ifftn",
    "n-dimensional inverse DFT over ``axes``.",
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.ifftn(np.full((2, 2), 4.0)).real\n"
    "    array([[4., 0.],\n           [0., 0.]])\n",
)
rfftn = _n_dim(
    "rfftn",
    "rfftn",
    "n-dimensional DFT of real input; the last axis in ``axes`` is halved to ``s[-1]//2 + 1``.",
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.rfftn(np.ones((2, 4))).shape\n    (2, 3)\n",
)
irfftn = _n_dim(
    "irfftn",
    "irfftn",
    "Inverse of :func:`rfftn`; ``s[-1]`` is the real output length of the last axis (default ``2*(m-1)``).",
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.irfftn(np.ones((2, 3))).shape\n    (2, 4)\n",
)
fft2 = _n_dim(
    "fft2",
    "fftn",
    "Two-dimensional DFT (NumPy's ``fft2``: :func:`fftn` over the last two axes by default).",
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.fft2(np.ones((2, 2))).real\n"
    "    array([[4., 0.],\n           [0., 0.]])\n",
    default_axes=(-2, -1),
)
ifft2 = _n_dim(
    "ifft2",
    "ifftn",
    "Two-dimensional inverse DFT (NumPy's ``ifft2``).",
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.ifft2(np.full((2, 2), 4.0)).real\n"
    "    array([[4., 0.],\n           [0., 0.]])\n",
    default_axes=(-2, -1),
)
rfft2 = _n_dim(
    "rfft2",
    "rfftn",
    "Two-dimensional DFT of real input (NumPy's ``rfft2``).",
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.rfft2(np.ones((2, 4))).shape\n    (2, 3)\n",
    default_axes=(-2, -1),
)
irfft2 = _n_dim(
    "irfft2",
    "irfftn",
    "Inverse of :func:`rfft2` (NumPy's ``irfft2``).",
    "    >>> import numpy as np, nvdispatch\n    >>> nvdispatch.fft.irfft2(np.ones((2, 3))).shape\n    (2, 4)\n",
    default_axes=(-2, -1),
)
