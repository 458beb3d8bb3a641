"""Where the CPU executor's calibration is kept between processes: a JSON file in the user's cache directory.

What the CPU calibration measures (which engine fuses a matmul epilog fastest, when pocketfft's threads pay
off) is decided by the machine and the software on it, not by the process. So it is measured once
(``python -m nvdispatch calibrate``, or :func:`nvdispatch.calibration.calibrate`) and kept here, in
``platformdirs.user_cache_dir("nvdispatch")``, or in the directory ``NVDISPATCH_CACHE_DIR`` names
(``NVDISPATCH_CACHE_DIR=""``: nothing is read or written, every process starts from the defaults).

**Keyed by what decides it** (:func:`machine_key`): the CPU (model, cores this process may use, private cache
size, the SIMD extensions NumPy found), NumPy's BLAS (build, version, the thread count the environment asks
of it), the versions of Python, NumPy, SciPy, Torch and nvdispatch and whether nvdispatch's compiled extension
is built (it brings an engine of its own). The file's name carries a digest
of the key and the file holds the key itself: a file of another key, of another format, or one that cannot be
read or parsed is ignored (a DEBUG log line says why; never an error), and the next write replaces it.

**Writes** merge with what is on disk (another process may have added entries meanwhile) under an advisory
lock (``fcntl.flock`` where there is one) and land atomically: a temporary file in the same directory, then
``os.replace``. Readers never lock: they see the old file or the new one, whole. A write that fails (read-only
or full disk) is logged at DEBUG and changes nothing but this process's view.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import platform
import re
import sys
import tempfile
import threading
from typing import Any

from .._compiled import hotpath
from . import cpu_caches
from .cpu_threads import CPUS

__all__ = ["ENV", "FORMAT", "directory", "machine_key", "CalibrationStore", "store"]

#: the environment variable naming the cache directory ("" switches persistence off)
ENV = "NVDISPATCH_CACHE_DIR"
#: the layout of the file; a file of another format is ignored (2: a matmul class may keep its engine orders with
#: the cores free and with another thread busy beside the one order)
FORMAT = 2
_PREFIX = "cpu-calibration-"
_log = logging.getLogger("nvdispatch")


def directory() -> str | None:
    """The directory the calibration is kept in, or None when persistence is off (``NVDISPATCH_CACHE_DIR=""``,
    or no ``platformdirs``)."""
    chosen = os.environ.get(ENV)
    if chosen is not None:
        return os.path.abspath(os.path.expanduser(chosen)) if chosen else None
    try:
        import platformdirs
    except ImportError:  # a dependency, but an environment may lack it: then nothing persists
        _log.debug("CPU calibration: platformdirs is not installed; the calibration is not kept on disk")
        return None
    return platformdirs.user_cache_dir("nvdispatch", appauthor=False)


def machine_key() -> dict[str, Any]:
    """What decides the CPU calibration on this machine, as a JSON-able dict (the store's key)."""
    return {
        "format": FORMAT,
        "cpu": _cpu_model(),
        "machine": platform.machine(),
        "cores": CPUS,
        "private_cache_bytes": cpu_caches.private_cache_bytes(),
        "simd": _numpy_simd(),
        "blas": _numpy_blas(),
        "python": "{}.{}".format(*sys.version_info[:2]),
        "versions": {name: _version(name) for name in ("numpy", "scipy", "torch", "nvdispatch")},
        "compiled": hotpath() is not None,
    }


class CalibrationStore:
    """The calibration entries of one key, in one directory (None: kept in memory only). Sections (``matmul``,
    ``fft``, ...) map names to JSON-able entries. Thread-safe. ``prefix`` starts the file's name and ``what``
    names the store in log lines (another measurement kept the same way: the GPU's autotuned algorithms)."""

    def __init__(self, where: str | None, key: dict[str, Any], prefix: str = _PREFIX, what: str = "CPU calibration"):
        self.directory = where
        self.key = key
        self.what = what
        self._prefix = prefix
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        self.path = os.path.join(where, f"{prefix}{digest}.json") if where else None
        self._lock = threading.Lock()
        self._sections: dict[str, dict[str, Any]] | None = None
        self.chosen: str | None = None  # the NVDISPATCH_CACHE_DIR it was made for (see store())

    def __repr__(self) -> str:
        return f"<CalibrationStore {self.path or '(in memory only)'}>"

    def section(self, name: str) -> dict[str, Any]:
        """A copy of section ``name`` as this process sees it (read from disk on first use)."""
        with self._lock:
            return dict(self._loaded().get(name, {}))

    def get(self, section: str, name: str) -> Any:
        """The entry ``name`` of ``section``, or None."""
        with self._lock:
            return self._loaded().get(section, {}).get(name)

    def update(self, section: str, entries: dict[str, Any], drop: dict[str, list[str]] | None = None) -> bool:
        """Add (or replace) ``entries`` in ``section`` and remove the names ``drop`` gives per section, for this
        process and on disk; True when written."""
        entries = json.loads(json.dumps(entries))  # JSON-able, and a copy
        drop = drop or {}

        def apply(sections: dict[str, dict[str, Any]]) -> None:
            sections.setdefault(section, {}).update(entries)
            for name, gone in drop.items():
                for k in gone:
                    sections.get(name, {}).pop(k, None)

        with self._lock:
            apply(self._loaded())
            if self.path is None:
                return False
            try:
                with _file_lock(self.path + ".lock"):
                    on_disk = self._read() or {}
                    apply(on_disk)
                    _write_atomically(self.path, {"format": FORMAT, "key": self.key, "sections": on_disk}, self._prefix)
            except OSError as exc:
                _log.debug("%s: cannot write %s (%s); kept for this process only", self.what, self.path, exc)
                return False
            self._sections = on_disk  # (with what other processes added meanwhile)
            return True

    def forget(self) -> None:
        """Drop this process's view (the next read goes to the disk again)."""
        with self._lock:
            self._sections = None

    def _loaded(self) -> dict[str, dict[str, Any]]:
        if self._sections is None:
            self._sections = self._read() or {}
        return self._sections

    def _read(self) -> dict[str, dict[str, Any]] | None:
        """The sections on disk, or None (no file, another key or format, a damaged file: logged)."""
        if self.path is None:
            return None
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as exc:
            _log.debug("%s: ignoring %s, which cannot be read (%s)", self.what, self.path, exc)
            return None
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != self.key:
            _log.debug("%s: ignoring %s, made for another format, machine or software", self.what, self.path)
            return None
        sections = data.get("sections")
        if not isinstance(sections, dict) or not all(isinstance(v, dict) for v in sections.values()):
            _log.debug("%s: ignoring %s, whose sections are damaged", self.what, self.path)
            return None
        return sections


_current: CalibrationStore | None = None
_current_lock = threading.Lock()


def store() -> CalibrationStore:
    """The process's store: in :func:`directory` (``NVDISPATCH_CACHE_DIR`` is read on each call, so a change
    takes effect), for :func:`machine_key`."""
    global _current
    chosen = os.environ.get(ENV)
    got = _current
    if got is None or got.chosen != chosen:
        with _current_lock:
            got = _current
            if got is None or got.chosen != chosen:
                got = CalibrationStore(directory(), _key())
                got.chosen = chosen
                _current = got
    return got


@functools.cache
def _key() -> dict[str, Any]:
    return machine_key()


# -- the key's parts ---------------------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith(("model name", "Processor", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _numpy_config() -> dict:
    import numpy as np

    try:
        return np.show_config(mode="dicts") or {}
    except (TypeError, ValueError, AttributeError, ImportError):  # NumPy < 1.25: no dicts
        return {}


def _numpy_simd() -> list[str]:
    return sorted(_numpy_config().get("SIMD Extensions", {}).get("found", []) or [])


def _numpy_blas() -> dict[str, Any]:
    """NumPy's BLAS as its build says (the core type an OpenBLAS picks at run time follows from the CPU, keyed
    apart), and the thread count the environment asks of it."""
    blas = _numpy_config().get("Build Dependencies", {}).get("blas", {})
    threads = {v: os.environ.get(v) for v in _THREAD_VARIABLES if os.environ.get(v)}
    return {k: blas.get(k) for k in ("name", "version", "openblas configuration")} | {"threads": threads}


#: environment variables that set a BLAS's thread count
_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_VERSION = re.compile(r"^(?:__version__|version)\s*(?::\s*str\s*)?=\s*['\"]([^'\"]+)['\"]", re.M)


def _version(name: str) -> str | None:
    """``name``'s version without importing it: the module's ``__version__`` when already imported, else
    its ``version.py``; else a fingerprint of its ``__init__`` (size and time: any reinstall changes it);
    None when not installed."""
    module = sys.modules.get(name)
    if module is not None and isinstance(getattr(module, "__version__", None), str):
        return module.__version__
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    here = os.path.dirname(spec.origin)
    try:
        with open(os.path.join(here, "version.py"), encoding="utf-8") as fh:
            found = _VERSION.search(fh.read())
        if found:
            return found.group(1)
    except OSError:
        pass
    try:
        st = os.stat(spec.origin)
    except OSError:
        return None
    return f"installed {st.st_size}:{st.st_mtime_ns}"


# -- files -------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _file_lock(path: str):
    """An exclusive advisory lock on ``path`` (created) between processes, where ``fcntl`` exists."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        import fcntl
    except ImportError:  # (Windows) no lock: writes stay atomic, a concurrent writer's entries may be lost
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (closing releases the lock)


def _write_atomically(path: str, data: dict, prefix: str = _PREFIX) -> None:
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{prefix}", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
