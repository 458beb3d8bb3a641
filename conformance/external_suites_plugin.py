"""pytest plugin that runs NumPy's and SciPy's own test files through nvdispatch (see README.md).

Loaded with ``-p external_suites_plugin`` in a child pytest (``test_external_suites.py`` starts it), so the
swap never leaks into the rest of the suite. ``NVDISPATCH_SUITE`` says which:

* ``numpy-fft``: ``numpy.fft``'s transforms are replaced by nvdispatch's before NumPy's test module is
  collected (its parametrizations capture ours too); every call is counted.
* ``scipy-fft``: nvdispatch is ``scipy.fft``'s global backend (all threads), SciPy's own backend registered
  behind it for what nvdispatch declines; calls served and declined are counted per function.
* ``numpy-matmul``: ``numpy.matmul`` is replaced before NumPy's ``TestMatmul`` is collected (its class attribute
  ``matmul`` captures ours too). A call within nvdispatch's domain goes to ``nvdispatch.matmul``; a call outside
  it falls through to NumPy's ufunc and is counted as declined, by reason, as SciPy's backend protocol does:
  ``out=`` and the other ufunc keywords (``nvdispatch.matmul`` has none), and the dtypes it does not take
  (bool, long double, object). Calls from nvdispatch's own modules (its NumPy executor, on any thread) go to
  the ufunc.

``NVDISPATCH_SUITE_COUNTS`` names the JSON file the counts are written to at the end;
``NVDISPATCH_SUITE_XFAIL`` (JSON: the end of a node id -> the reason) marks known gaps as strict xfails.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import types

FFT_NAMES = (
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

    for name in FFT_NAMES:
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


class _MatmulThroughNvdispatch:
    """``numpy.matmul`` replaced: nvdispatch serves what is in its domain, NumPy's ufunc the rest (counted).

    A class instance, not a function, so that ``TestMatmul.matmul = np.matmul`` does not bind it as a method.
    """

    def __init__(self, ufunc):
        import numpy as np

        self._ufunc = ufunc
        wide = {np.dtype(np.longdouble), np.dtype(np.clongdouble)}
        self._outside = wide - {np.dtype(np.float64), np.dtype(np.complex128)}  # where long double is wider

    def _declined(self, a, b, args, kwargs) -> str | None:
        import numpy as np

        if args or kwargs:
            return "out= or other ufunc keywords: nvdispatch.matmul has none"
        dtype = np.result_type(np.asarray(a), np.asarray(b))  # the operands themselves go to nvdispatch
        if dtype.kind in "bO" or dtype in self._outside:
            return f"{dtype}: not a dtype nvdispatch.matmul takes"
        return None

    def __call__(self, a, b, /, *args, **kwargs):
        if sys._getframe(1).f_globals.get("__name__", "").startswith("nvdispatch"):
            return self._ufunc(a, b, *args, **kwargs)  # nvdispatch's NumPy executor at work
        why = self._declined(a, b, args, kwargs)
        if why is not None:
            _count("declined", why)
            return self._ufunc(a, b, *args, **kwargs)
        import nvdispatch

        _count("served", "matmul")
        return nvdispatch.matmul(a, b)

    def __getattr__(self, name):  # the ufunc's attributes (nin, nout, signature, ...)
        return getattr(self._ufunc, name)


def _swap_numpy_matmul() -> None:
    import numpy

    numpy.matmul = _MatmulThroughNvdispatch(numpy.matmul)


_SUITES = {"numpy-fft": _swap_numpy_fft, "scipy-fft": _nvdispatch_as_scipy_backend, "numpy-matmul": _swap_numpy_matmul}


def pytest_configure(config):
    suite = os.environ.get("NVDISPATCH_SUITE")
    if suite not in _SUITES:
        raise RuntimeError(f"NVDISPATCH_SUITE must be one of {sorted(_SUITES)}, got {suite!r}")
    _SUITES[suite]()


def pytest_collection_modifyitems(config, items):
    import pytest

    expected = json.loads(os.environ.get("NVDISPATCH_SUITE_XFAIL") or "{}")
    for item in items:
        for test_id, reason in expected.items():
            if item.nodeid.endswith(test_id):
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


def pytest_unconfigure(config):
    path = os.environ.get("NVDISPATCH_SUITE_COUNTS")
    if path:
        with open(path, "w") as f:
            json.dump(_counts, f, indent=1, sort_keys=True)
