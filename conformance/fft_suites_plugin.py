"""pytest plugin that runs NumPy's and SciPy's own FFT test files through nvdispatch (see README.md).

Loaded with ``-p fft_suites_plugin`` in a child pytest (``test_external_fft_suites.py`` starts it), so the
swap never leaks into the rest of the suite. ``NVDISPATCH_FFT_SUITE`` says which:

* ``numpy``: ``numpy.fft``'s transforms are replaced by nvdispatch's before NumPy's test module is
  collected (its parametrizations capture ours too); every call is counted.
* ``scipy``: nvdispatch is ``scipy.fft``'s global backend (all threads), SciPy's own backend registered
  behind it for what nvdispatch declines; calls served and declined are counted per function.

``NVDISPATCH_FFT_SUITE_COUNTS`` names the JSON file the counts are written to at the end.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import types

NUMPY_NAMES = (
    "fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "rfft", "irfft", "rfft2", "irfft2", "rfftn", "irfftn",
    "hfft", "ihfft",
)  # fmt: skip

_lock = threading.Lock()
_counts: dict[str, dict[str, int]] = {"served": {}, "declined": {}}


def _count(kind: str, name: str) -> None:
    with _lock:
        _counts[kind][name] = _counts[kind].get(name, 0) + 1


def _swap_numpy_fft() -> None:
    import numpy.fft

    import nvdispatch.fft as F

    for name in NUMPY_NAMES:
        ours = getattr(F, name)

        @functools.wraps(ours)
        def counted(*args, _ours=ours, _name=name, **kwargs):
            _count("served", _name)
            return _ours(*args, **kwargs)

        setattr(numpy.fft, name, counted)


def _nvdispatch_as_scipy_backend() -> None:
    import scipy.fft

    import nvdispatch.fft as F

    def ua_function(method, args, kwargs):
        result = F.__ua_function__(method, args, kwargs)
        _count("declined" if result is NotImplemented else "served", method.__name__)
        return result

    backend = types.SimpleNamespace(
        __ua_domain__=F.__ua_domain__, __ua_function__=ua_function, __ua_convert__=F.__ua_convert__
    )
    scipy.fft.set_global_backend(backend)
    scipy.fft.register_backend("scipy")  # what nvdispatch declines falls through to SciPy's own


def pytest_configure(config):
    suite = os.environ.get("NVDISPATCH_FFT_SUITE")
    if suite == "numpy":
        _swap_numpy_fft()
    elif suite == "scipy":
        _nvdispatch_as_scipy_backend()
    else:
        raise RuntimeError(f"NVDISPATCH_FFT_SUITE must be 'numpy' or 'scipy', got {suite!r}")


def pytest_unconfigure(config):
    path = os.environ.get("NVDISPATCH_FFT_SUITE_COUNTS")
    if path:
        with open(path, "w") as f:
            json.dump(_counts, f, indent=1, sort_keys=True)
