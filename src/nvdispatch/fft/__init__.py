"""``nvdispatch.fft``: the array-API fft extension (2024.12) on every executor, a stateful :class:`FFT`,
and the ``scipy.fft`` backend protocol.

Functions (signatures as the standard writes them; ``stream=`` is an nvdispatch extra for GPU arrays):
``fft, ifft, fftn, ifftn, rfft, irfft, rfftn, irfftn, hfft, ihfft, fftfreq, rfftfreq, fftshift, ifftshift``.

Executors: NumPy arrays go to ``scipy.fft`` on all cores (``numpy.fft`` without SciPy); Torch tensors to
``torch.fft``; CuPy arrays to cuFFT (raw ``"cuda"`` executor, else ``cupy.fft`` with plans kept in the
shared plan cache); ``__cuda_array_interface__``/DLPack device arrays to the raw ``"cuda"`` executor.
``nvdispatch.set_backend`` and friends choose among them; ``nvdispatch.explain(nvdispatch.fft.rfft, x, n=64)``
says what a call would do.

Signatures are the array API's, widened to NumPy's: ``n``/``s``, ``axis``/``axes``, ``norm`` may be given
positionally, ``out=`` receives the result, ``fft2``/``ifft2``/``rfft2``/``irfft2`` exist. On NumPy input
every call ``numpy.fft`` accepts gives its result, dtype included (array-likes, integer/boolean/float16
input, long double, repeated axes, ``s`` without ``axes``; see ``nvdispatch._fft_conventions``). On other
frameworks the same arguments behave that framework's way (Torch: integers → its default float dtype).

Dtype rules (see ``nvdispatch._fft_problem``): precision is kept; real floating input to the complex
transforms (``fft``, ``ifft``, ``fftn``, ``ifftn``, ``irfft``, ``irfftn``, ``hfft``) is promoted to the
complex dtype of the same precision; complex input to ``rfft``/``rfftn``/``ihfft`` raises
``UnsupportedDtypeError``.

As a SciPy backend::

    import scipy.fft, nvdispatch.fft
    with scipy.fft.set_backend(nvdispatch.fft):
        y = scipy.fft.fft(x)          # NumPy, Torch or CuPy x

SciPy's ``overwrite_x`` and ``workers`` keywords are accepted (nvdispatch never overwrites its input, and on
the CPU runs each transform shape on one thread or on all cores, whichever it measured faster); integer input
is promoted as SciPy does. Whatever nvdispatch cannot serve returns ``NotImplemented`` so SciPy falls through
to its next backend: transforms it does not implement (``dct``, ``dst``, ``fht``, ...), a precomputed ``plan=``,
and any call an executor refuses (dtype, argument, layout).
SciPy's own ``scipy/fft/tests/test_basic.py`` passes whole under this backend (``conformance/``). As the
global backend (``scipy.fft.set_global_backend(nvdispatch.fft)``), which replaces SciPy's own, register SciPy's
again (``scipy.fft.register_backend("scipy")``) so that it serves what nvdispatch declines.

Examples
--------
>>> import numpy as np, nvdispatch
>>> x = np.arange(8, dtype=np.float32)
>>> nvdispatch.fft.rfft(x).dtype
dtype('complex64')
>>> bool(np.allclose(nvdispatch.fft.irfft(nvdispatch.fft.rfft(x), n=8), x, atol=1e-5))
True
"""

from __future__ import annotations

from .._traced import announce
from ._convolve import convolve
from ._frequencies import fftfreq, fftshift, ifftshift, rfftfreq
from ._route import explain_fft
from ._scipy_backend import __ua_convert__ as __ua_convert__
from ._scipy_backend import __ua_domain__ as __ua_domain__
from ._scipy_backend import __ua_function__ as __ua_function__
from ._stateful import FFT, FFTOptions
from ._transforms import fft, fft2, fftn, hfft, ifft, ifft2, ifftn, ihfft, irfft, irfft2, irfftn, rfft, rfft2, rfftn

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
    "fftfreq",
    "rfftfreq",
    "fftshift",
    "ifftshift",
    "convolve",
    "FFT",
    "FFTOptions",
    "explain_fft",
]


def _public(obj) -> None:
    """Give a public object, and the functions of a public class, this module's name: pickles, ``help()``
    and the documentation name them where users import them, wherever they are defined in the package."""
    obj.__module__ = __name__
    for member in vars(obj).values() if isinstance(obj, type) else ():
        member = member.fget if isinstance(member, property) else member
        if callable(member) and hasattr(member, "__module__"):
            member.__module__ = __name__


for _name in __all__:
    _public(globals()[_name])
# the transforms and the frequencies: framework integrations may mark them for compilers
for _name in __all__[:16] + ["convolve"]:
    announce(_name, globals()[_name])
del _name
