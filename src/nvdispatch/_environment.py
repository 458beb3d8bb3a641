"""What nvdispatch finds where it runs: its own build, the frameworks and GPUs present, the executors it can use.

:func:`show_config` prints it (what a bug report should carry); ``python -m nvdispatch`` starts with the same
report, then runs its demo on what was found.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import importlib.util
import os
import platform
import sys
from typing import TextIO

from ._compiled import hotpath
from ._version import __version__
from .errors import InvalidArgumentError
from .executors import BUILTIN, builtin
from .executors.cpu_calibration_store import store

__all__ = ["Environment", "environment", "show_config"]

#: the modules reported, in order
MODULES = ("numpy", "scipy", "torch", "cupy", "jax", "cuda.bindings", "numba", "dask", "distributed", "dask_cuda")
#: module -> the extra that installs it (shown next to a framework that is missing)
EXTRA = {"scipy": "scipy", "torch": "torch", "cupy": "cupy", "jax": "jax", "cuda.bindings": "cuda", "numba": "numba",
         "dask": "dask", "distributed": "dask"}  # fmt: skip
#: module -> the package that installs it, where no extra does
PACKAGE = {"dask_cuda": "dask-cuda"}


def gpus() -> list[str]:
    """``cuda:i <name>`` of each GPU the CUDA driver reports; empty where there is no driver or no GPU."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return []
    if lib.cuInit(0) != 0:
        return []
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    names = []
    for i in range(count.value):
        dev = ctypes.c_int(0)
        lib.cuDeviceGet(ctypes.byref(dev), i)
        buf = ctypes.create_string_buffer(256)
        lib.cuDeviceGetName(buf, 256, dev)
        names.append(f"cuda:{i} {buf.value.decode()}")
    return names


def version(module: str) -> str | None:
    """``module``'s version (``"installed"`` where it has none, ``"broken (Error)"`` where importing it fails);
    None where it is not installed."""
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except ModuleNotFoundError:  # the parent package of a dotted name is missing
        return None
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a broken install is reported, not fatal
        return f"broken ({type(exc).__name__})"
    return getattr(mod, "__version__", "installed")


def executor_status(name: str) -> str:
    """``"available"``, or why the built-in executor ``name`` cannot run here."""
    ex = builtin(name)
    if ex is None:
        return "not in this build"
    why = getattr(ex, "unavailable", lambda: None)()
    return "available" if why is None else f"unavailable: {why}"


def _compiled_route() -> str:
    if hotpath() is not None:
        return "compiled (nvdispatch._hotpath)"
    if os.environ.get("NVDISPATCH_PURE_PYTHON"):
        return "Python (NVDISPATCH_PURE_PYTHON is set)"
    return "Python (the optional extension nvdispatch._hotpath is not built: no C compiler at install time)"


@dataclasses.dataclass(frozen=True)
class Environment:
    """What :func:`environment` found: ``frameworks`` maps each module of :data:`MODULES` to its version (None:
    not installed), ``gpus`` the GPUs (``cuda:i <name>``), ``executors`` each built-in executor to its status."""

    nvdispatch: str
    python: str
    platform: str
    route: str
    calibration: str
    frameworks: dict[str, str | None]
    gpus: list[str]
    executors: dict[str, str]

    def __str__(self) -> str:
        lines = [
            f"nvdispatch {self.nvdispatch} on Python {self.python} ({self.platform})",
            f"repeated calls: {self.route}",
            f"CPU calibration: {self.calibration}",
            "",
            "frameworks:",
        ]
        for mod, ver in self.frameworks.items():
            missing = f"not installed (pip install 'nvdispatch[{EXTRA[mod]}]')" if mod in EXTRA else \
                f"not installed (pip install {PACKAGE.get(mod, mod)})"  # fmt: skip
            lines.append(f"  {mod:14s} {ver or missing}")
        lines += ["", "GPUs: " + (", ".join(self.gpus) if self.gpus else "none found"), "", "executors:"]
        lines += [f"  {name:6s} {status}" for name, status in self.executors.items()]
        return "\n".join(lines)


def environment() -> Environment:
    """What nvdispatch finds in this process: see :class:`Environment` (``str()`` of it is the report that
    :func:`show_config` prints)."""
    path = store().path
    if not path:
        calibration = "kept for this process only (NVDISPATCH_CACHE_DIR is empty)"
    elif os.path.exists(path):
        calibration = f"kept in {path}"
    else:
        calibration = f"none yet (python -m nvdispatch calibrate measures it, to be kept in {path})"
    return Environment(
        nvdispatch=__version__,
        python=sys.version.split()[0],
        platform=f"{platform.system()} {platform.machine()}",
        route=_compiled_route(),
        calibration=calibration,
        frameworks={mod: version(mod) for mod in MODULES},
        gpus=gpus(),
        executors={name: executor_status(name) for name in BUILTIN},
    )


def show_config(file: TextIO | None = None) -> None:
    """Print what nvdispatch finds here: its version and build (whether repeated calls take the compiled
    extension), where the CPU calibration is kept, the frameworks installed (with the extra that installs each
    missing one), the GPUs and the executors available. It imports each framework installed (to read its
    version) and asks the CUDA driver, where there is one, for its GPUs.

    Parameters
    ----------
    file
        Where to write the report: an open text stream (default ``sys.stdout``).

    Raises
    ------
    InvalidArgumentError
        When ``file`` has no ``write`` method.

    Examples
    --------
    >>> import nvdispatch
    >>> nvdispatch.show_config()  # doctest: +ELLIPSIS
    nvdispatch ... on Python ...
    repeated calls: ...
    frameworks:
      numpy          ...
    GPUs: ...
    executors:
      numpy  available
    ...
    """
    if file is None:
        file = sys.stdout
    elif not callable(getattr(file, "write", None)):
        raise InvalidArgumentError("file", "an open text stream (with a write method) or None", type(file).__name__)
    print(environment(), file=file)
