"""What every benchmark script shares: a progress bar, an output folder that exists, a plot that never crashes a
finished run, a measure of the load other processes put on the machine meanwhile. The extras are optional (``pip
install 'nvdispatch[bench]'``): without tqdm the loops run without a bar, without matplotlib the JSON is written
and the plot is skipped with a message."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

try:
    from tqdm import tqdm
except ImportError:
    tqdm = None

_HINT = "pip install 'nvdispatch[bench]'"
_told: set[str] = set()


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
