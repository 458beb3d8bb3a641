"""What every benchmark script shares: a progress bar, an output folder that exists, a plot that never
crashes a finished run. The extras are optional (``pip install 'nvdispatch[bench]'``): without tqdm the loops
run without a bar, without matplotlib the JSON is written and the plot is skipped with a message."""

from __future__ import annotations

import os
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
