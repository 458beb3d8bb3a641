"""Calibrating the CPU executor for this machine: an explicit step, run once, kept between processes.

Which engine fuses a matmul epilog fastest, and from what size pocketfft's threads pay off, are measured
(``executors/numpy_matmul_calibration``, ``executors/numpy_fft_workers``) and kept in the user's cache
directory (``executors/cpu_calibration_store``). A process never measures on a caller's call: a problem class
not measured yet runs on a safe default order, ``explain()`` says so, and the class is noted so that the next
:func:`calibrate` (or ``python -m nvdispatch calibrate``) measures it with the standard set.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ._explain import explain
from .executors import numpy_fft_workers, numpy_matmul, numpy_matmul_calibration
from .executors.cpu_calibration_store import store
from .executors.cpu_threads import CPUS

__all__ = ["calibrate", "CalibrationReport", "STANDARD_SIZES"]

#: the standard set: square products of these sizes (one per size bucket of the calibration's classes) ...
STANDARD_SIZES = (16, 32, 64, 128, 256, 512, 1024, 2048)
#: ... in these dtypes, with these epilogs (the linear layers the CPU engines fuse)
_DTYPES = ("float32", "float64")
_EPILOGS = ("RELU_BIAS", "GELU_BIAS", "BIAS")
_QUICK_EPILOGS = ("RELU_BIAS", "BIAS")


@dataclasses.dataclass
class CalibrationReport:
    """What :func:`calibrate` measured: the engine order of each matmul class (class -> engines, fastest
    first), the FFT threads threshold (work from which pocketfft runs on every core), where it is kept (None:
    this process only), how long it took and how busy the machine was."""

    matmul: dict[str, tuple[str, ...]]
    fft_min_work: float | None
    path: str | None
    seconds: float
    load: float | None = None  # the system's load average (1 minute) at the end, where the OS says
    fft_skipped: str | None = None  # why the FFT threads threshold was not measured (asked for, but no SciPy)
    #: the classes whose engine is picked per call (class -> (engines with the cores free, with another thread of
    #: the process running), fastest first): those whose first engines differ between the two
    per_call: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"CPU calibration: {len(self.matmul)} matmul problem classes in {self.seconds:.1f} s"]
        if self.load is not None and self.load > 0.5 * CPUS:
            lines.append(
                f"  note: the machine was busy (load average {self.load:.1f} on {CPUS} cores): other work weighs on "
                "the timings; calibrate again when it is quiet"
            )
        pairs = collections.Counter((free[0], busy[0]) for free, busy in self.per_call.values())
        for (free, busy), count in sorted(pairs.items()):
            lines.append(f"  {count} class(es) pick their engine per call: {free} with the cores free, {busy} with "
                         "another thread of the process running")  # fmt: skip
        if self.fft_min_work is not None:
            lines.append(f"  pocketfft threads from work {self.fft_min_work:.3g}")
        if self.fft_skipped is not None:
            lines.append(f"  FFT threads threshold not measured: {self.fft_skipped}")
        lines.append(f"  kept in {self.path}" if self.path else "  not kept (NVDISPATCH_CACHE_DIR is empty)")
        return "\n".join(lines)


def calibrate(
    shapes: Iterable[Sequence[int]] | None = None,
    *,
    fft: bool = True,
    quick: bool = False,
    progress: Callable[[Iterable, str, int], Iterable] | None = None,
) -> CalibrationReport:
    """Measure the CPU executor's engine orders (and the FFT threads threshold) on this machine and keep them
    in the user's cache directory for every later process (``NVDISPATCH_CACHE_DIR`` chooses another
    directory; ``""`` keeps them in this process only).

    Parameters
    ----------
    shapes
        ``(m, k, n)`` products to calibrate (a linear layer ``act(x @ w + bias)``, ``x`` m x k, in float32 and
        float64, for the bias, RELU and GELU epilogs) instead of the standard set (square products of
        :data:`STANDARD_SIZES`). The problem classes that ran on the default order before (this process's,
        and those earlier processes noted) are calibrated first either way.
    fft
        Whether to measure the FFT threads threshold too.
    quick
        Calibrate less: float32 only, the bias and RELU epilogs, sizes up to 1024 (the pending classes all).
    progress
        ``progress(iterable, description, total)`` wraps each loop (e.g. a tqdm bar); None: no progress shown.

    Returns
    -------
    CalibrationReport

    Examples
    --------
    >>> from nvdispatch.calibration import calibrate
    >>> report = calibrate([(64, 32, 16)], fft=False, quick=True)
    >>> sorted(set(len(order) > 0 for order in report.matmul.values()))
    [True]
    """
    start = time.perf_counter()
    show = progress or (lambda it, desc, total: it)
    _import_torch_if_installed()  # (the Torch engine is ranked only in processes that imported Torch)
    jobs = [*_pending_jobs(), *_standard_jobs(shapes, quick)]
    done: dict[str, tuple[str, ...]] = {}
    per_call: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for make in show(jobs, "matmul engines", len(jobs)):
        problem = make()
        if problem is None:
            continue
        name = repr(numpy_matmul_calibration.problem_class(problem))
        if name not in done:
            ranked = numpy_matmul.calibrate(problem)
            done[name] = ranked.order
            if ranked.free and ranked.busy:
                per_call[name] = (ranked.free, ranked.busy)
    min_work = fft_skipped = None
    if fft and not _scipy_installed():
        fft_skipped = (
            "SciPy is not installed: the CPU FFT is NumPy's, on one thread "
            "(pip install 'nvdispatch[scipy]' for pocketfft's threads)"
        )
    elif fft:
        min_work = numpy_fft_workers.calibrate(lambda it: show(it, "fft threads", len(it))).min_work
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return CalibrationReport(done, min_work, store().path, time.perf_counter() - start, load, fft_skipped, per_call)


def _scipy_installed() -> bool:
    """Whether SciPy is there: the FFT threads threshold is that of its pocketfft (``scipy.fft``)."""
    import importlib.util

    return importlib.util.find_spec("scipy") is not None


def _import_torch_if_installed() -> None:
    import importlib.util

    try:
        if importlib.util.find_spec("torch") is not None:
            import torch  # noqa: F401
    except ImportError:  # (a broken install: ranked without it)
        pass


def _standard_jobs(shapes: Iterable[Sequence[int]] | None, quick: bool):
    standard = [(s, s, s) for s in STANDARD_SIZES if not quick or s <= 1024]
    sizes = standard if shapes is None else [tuple(int(d) for d in s) for s in shapes]
    for m, k, n in sizes:
        for dtype in _DTYPES[:1] if quick else _DTYPES:
            for epilog in _QUICK_EPILOGS if quick else _EPILOGS:
                recipe = {"a": [dtype, [m, k], "c"], "b": [dtype, [k, n], "c"], "c": None, "epilog": epilog,
                          "inputs": {"bias": [dtype, [n], "c"]}}  # fmt: skip
                yield lambda recipe=recipe: _problem(recipe)


def _pending_jobs():
    for recipe in numpy_matmul_calibration.pending().values():
        yield lambda recipe=recipe: _problem(recipe)


def _problem(recipe: dict[str, Any]):
    """The NumPy executor's problem of a recipe (``numpy_matmul_calibration.recipe``); None when it cannot be
    rebuilt (a damaged recipe, or a call the NumPy executor does not take)."""
    try:
        a, b = _array(recipe["a"]), _array(recipe["b"])
        c = _array(recipe["c"]) if recipe.get("c") else None
        inputs = {name: _array(sig) for name, sig in (recipe.get("inputs") or {}).items()}
        beta = 1 if c is not None else None
        got = explain(a, b, c, beta=beta, epilog=recipe["epilog"], epilog_inputs=inputs or None)
    except Exception:  # noqa: BLE001 - a recipe from disk that no longer makes a call is skipped
        return None
    return got.problem if got.executor == "numpy" else None


def _array(sig) -> np.ndarray:
    dtype, shape, layout = sig
    x = np.zeros(tuple(int(d) for d in shape), dtype=np.dtype(dtype))
    if layout == "f":
        return np.asfortranarray(x)
    if layout == "strided" and x.ndim >= 2:
        return np.zeros((*x.shape[:-1], 2 * x.shape[-1]), x.dtype)[..., ::2]
    return x
