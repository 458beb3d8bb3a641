"""Where autotuned cuBLASLt algorithms are kept between processes: a JSON file per GPU in the user's cache
directory, beside the CPU calibration and kept the same way (:mod:`.cpu_calibration_store`: ``NVDISPATCH_CACHE_DIR``
chooses the directory, ``""`` keeps nothing; merged writes under a lock, atomic replacement; a damaged file or
one of another key is ignored, never an error).

**Keyed by what decides the choice**: the file's key is the GPU's environment (name, compute capability, driver
and cuBLASLt versions: :func:`~nvdispatch._cuda.lt_autotune.environment`), so another GPU, driver or cuBLASLt
reads another file; each entry is named by the text of the plan's tuning key
(:func:`~nvdispatch._cuda.lt_autotune.tuning_key`: plan class, strategy, the whole problem). An entry is a record
of :func:`~nvdispatch._cuda.lt_autotune.record`; one that does not validate, or that was made in another
environment, is skipped (a DEBUG line says so), and cuBLASLt checks the algorithm again before a plan takes it.
"""

from __future__ import annotations

import logging
from typing import Any

from .._cuda import lt_autotune
from .._tunings import key_text
from .cpu_calibration_store import ENV, CalibrationStore, directory

__all__ = ["ENV", "SECTION", "store_for", "lookup", "keep"]

#: the file's section holding cuBLASLt choices
SECTION = lt_autotune.TUNING_KIND
#: 2: choices the confirmation rule kept (``lt_autotune.keeps_challenger``); format 1's files, whose choices won on
#: the finalists' medians alone (some by 0.03%, within noise), are another key: ignored, timed again
_FORMAT = 2
_PREFIX = "cuda-tunings-"
_log = logging.getLogger("nvdispatch")
_stores: dict[tuple, CalibrationStore] = {}


def store_for(env: dict[str, Any]) -> CalibrationStore:
    """The store of a GPU environment (``lt_autotune.environment(device)``), in the directory
    ``NVDISPATCH_CACHE_DIR`` names now (read on each call)."""
    where = directory()
    key = {"format": _FORMAT, **env}
    memo = (where, tuple(sorted(key.items())))
    got = _stores.get(memo)
    if got is None:
        got = _stores[memo] = CalibrationStore(where, key, _PREFIX, "cuBLASLt tunings")
    return got


def _name(plan) -> str | None:
    return key_text(lt_autotune.tuning_key(plan))


def lookup(plan) -> tuple[dict | None, str]:
    """``(choice, where)``: the kept record for ``plan`` (validated, made in this environment) and the file it
    came from; ``(None, why)`` where there is none."""
    env = lt_autotune.environment(plan.device_index)
    store = store_for(env)
    if store.path is None:
        return None, f"nothing is kept on disk ({ENV}='')"
    name = _name(plan)
    if name is None:
        return None, "the problem has no persistable key"
    choice = store.get(SECTION, name)
    if choice is None:
        return None, f"no entry in {store.path}"
    why = lt_autotune.validate_choice(choice)
    if why is None and choice.get("env") != env:
        why = "made on another GPU, driver or cuBLASLt"
    if why is not None:
        _log.debug("cuBLASLt tunings: skipping the entry for %s in %s: %s", plan.problem, store.path, why)
        return None, f"a damaged entry in {store.path} ({why})"
    return choice, store.path


def keep(plan, choice: dict) -> str | None:
    """Write ``choice`` (a record of ``lt_autotune.record``) for ``plan``; returns the file, or None where
    nothing was written (persistence off, an unwritable directory: logged)."""
    name = _name(plan)
    if name is None:
        return None
    store = store_for(lt_autotune.environment(plan.device_index))
    return store.path if store.update(SECTION, {name: choice}) else None
