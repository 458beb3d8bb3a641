"""What every benchmark script shares: its command line (``--help``, ``--out DIR``), one line and exit status 2
where the hardware or a package it needs is missing, a progress bar, an output folder that exists, a plot that
never crashes a finished run, a measure of the load other processes put on the machine meanwhile. The extras are
optional (``pip install 'nvdispatch[bench]'``): without tqdm the loops run without a bar, without matplotlib the
JSON is written and the plot is skipped with a message."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

try:
    from tqdm import tqdm
except ImportError:
    tqdm = None

_HINT = "pip install 'nvdispatch[bench]'"
_told: set[str] = set()

#: where the scripts write their JSON and PNG unless ``--out`` says otherwise
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
#: exit status of a benchmark that cannot run on this machine (a GPU or a package it needs is missing)
CANNOT_RUN = 2


def parser(doc: str, *, out: bool = True) -> argparse.ArgumentParser:
    """The script's argument parser: ``doc`` (its module docstring) as the help text and, with ``out``, the
    ``--out DIR`` option (default ``benchmarks/results``)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if out:
        ap.add_argument(
            "--out", metavar="DIR", default=RESULTS, help="folder for the JSON and the plot (default: %(default)s)"
        )
    return ap


def cannot_run(reason: str) -> NoReturn:
    """Say in one line what this machine lacks for the script, and exit with status ``CANNOT_RUN``."""
    print(f"{os.path.basename(sys.argv[0])}: cannot run here: {reason}", file=sys.stderr, flush=True)
    sys.exit(CANNOT_RUN)


def require(module: str, install: str) -> Any:
    """``module`` imported, or ``cannot_run`` naming ``install`` (what provides it)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        cannot_run(f"needs {module} ({install})")


def require_cuda_torch() -> Any:
    """Torch with a CUDA GPU it can use, or ``cannot_run`` saying which is missing."""
    torch = require("torch", "pip install 'nvdispatch[torch]' with a CUDA build of Torch")
    if not torch.cuda.is_available():
        cannot_run(f"needs an NVIDIA GPU and a CUDA build of Torch (torch {torch.__version__} finds no CUDA device)")
    return torch


def require_numba_gpu() -> Any:
    """``numba.cuda`` on a real GPU (not the simulator), or ``cannot_run`` saying which is missing."""
    cuda = require("numba.cuda", "pip install 'nvdispatch[numba]'")
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or not cuda.is_available():
        cannot_run("needs an NVIDIA GPU for Numba's CUDA target (none found, or the CUDA simulator is on)")
    return cuda


def _tell_once(what: str, message: str) -> None:
    if what not in _told:
        _told.add(what)
        print(message, flush=True)


def progress(iterable: Iterable, desc: str, total: int | None = None) -> Iterable:
    """``iterable`` with a tqdm progress bar (on stderr), or unchanged when tqdm is not installed."""
    if tqdm is None:
        _tell_once("tqdm", f"tqdm is not installed: no progress bars ({_HINT})")
        return iterable
    return tqdm(iterable, desc=desc, total=total, leave=False)


class ForeignLoad:
    """``with ForeignLoad() as load:`` ... then ``load.share``: the CPU time other processes used meanwhile, in
    cores (0.5: half a core busy on average), from ``/proc/stat`` less this process's own time; None where
    ``/proc/stat`` is unreadable. Same-run ratios hold up under steady load, not under load that comes and goes:
    a share well above 0 says the figures are not a quiet box's."""

    share: float | None = None

    def __enter__(self) -> ForeignLoad:
        self._start = (_busy_seconds(), _own_seconds(), time.perf_counter())
        return self

    def __exit__(self, *exc) -> None:
        busy, own, wall = self._start
        now = _busy_seconds()
        if busy is not None and now is not None:
            self.share = max(0.0, (now - busy) - (_own_seconds() - own)) / max(time.perf_counter() - wall, 1e-9)


def wait_for_quiet(limit_seconds: float, max_share: float = 0.1, window: float = 0.5) -> bool:
    """Wait (up to ``limit_seconds``) for a ``window`` in which other processes use at most ``max_share`` of a
    core; True once one is seen, False at the limit (or where ``/proc/stat`` is unreadable)."""
    deadline = time.perf_counter() + limit_seconds
    while time.perf_counter() < deadline:
        with ForeignLoad() as load:
            time.sleep(window)
        if load.share is None:
            return False
        if load.share <= max_share:
            return True
    return False


def _busy_seconds() -> float | None:
    try:
        with open("/proc/stat") as fh:
            ticks = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def output_dir(path: str | os.PathLike) -> str:
    """Create ``path`` (and its parents) if missing; return it."""
    os.makedirs(path, exist_ok=True)
    return os.fspath(path)


def save_plot(draw: Callable[[Any], Any], path: str | os.PathLike, dpi: int = 110) -> bool:
    """Call ``draw(plt)`` and save the current figure to ``path``; without matplotlib, say so and return False.

    ``draw`` receives ``matplotlib.pyplot`` (Agg backend) and makes one figure. A plot that fails for any other
    reason is reported too: the results are already on disk, so a finished run never ends in a traceback.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot {os.fspath(path)!r}, the JSON has the results ({_HINT})")
        return False
    try:
        draw(plt)
        plt.gcf().savefig(path, dpi=dpi)
    except Exception as exc:  # noqa: BLE001 - the measurements are saved already
        print(f"plot {os.fspath(path)!r} failed: {type(exc).__name__}: {exc}")
        return False
    finally:
        plt.close("all")
    print(f"wrote {os.fspath(path)}")
    return True


def cuda_event_seconds(fn: Callable[[], Any], torch: Any, reps: int, inner: int, warmup: int, busy_cycles: int = 0):
    """Median seconds per call of ``fn``: ``inner`` calls between two CUDA events on the current stream, median
    of ``reps``. With ``busy_cycles`` (per call) the calls are queued while the GPU is held busy
    (``torch.cuda._sleep``), so the events measure the GPU, not the host's per-call cost."""
    import statistics

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if busy_cycles:
            torch.cuda._sleep(busy_cycles * inner)
        start.record()
        for _ in range(inner):
            fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e-3 / inner)
    return statistics.median(samples)


def gemm_shapes(text: str) -> list[tuple[int, int, int]]:
    """argparse type of a ``--shapes`` option: ``MxNxK,MxNxK,...`` of positive integers."""
    try:
        shapes = [tuple(int(x) for x in item.lower().split("x")) for item in text.split(",") if item]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise argparse.ArgumentTypeError(f"shapes as MxNxK,MxNxK... of positive ints, not {text!r}")
    return shapes
