"""A pytest plugin that makes nvdispatch SciPy's global ``scipy.fft`` backend for the whole run, SciPy's own
backend registered behind it (what nvdispatch declines, SciPy serves): ``pytest -p _scipy_fft_backend_plugin``
with this folder on ``sys.path`` (benchmarks/scipy_signal_bench.py does it)."""

from __future__ import annotations


def pytest_configure(config):
    import scipy.fft

    import nvdispatch.fft

    scipy.fft.set_global_backend(nvdispatch.fft)
    scipy.fft.register_backend("scipy")
