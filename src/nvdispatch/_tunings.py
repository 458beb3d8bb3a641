"""Tuned choices: what autotuning found, kept for later plans and carried to other processes in files.

A *tuning* is a JSON value a plan reports (``plan.tuning()``) and takes back when it is made again
(``executor.plan(op, problem, strategy, tuning)``); ``Matmul.autotune`` also records which strategy won
(kind :data:`STRATEGY_CHOICE`). Every tuning has a *kind*, named by the class that makes and applies it
(its ``tuning_kind``), and that class alone knows what a valid one is: its static
``validate_tuning(value)`` returns why a value is wrong, or None. :func:`register_kind` makes a kind known
(the built-in plan classes are registered by ``nvdispatch.executors``, imported only when a file holds
their kind). Plans without a ``tuning_kind`` (a user executor's) are saved with kind ``null``: their
executor checks what it is handed.

Keys. A tuning is known under the plan-cache key of what it tunes: a tuple of strings, numbers and frozen
dataclasses such as ``MatmulProblem``. :func:`key_json` gives a key's JSON form, defined as:

* ``None``, booleans, integers, strings and finite floats are themselves; tuples and lists are arrays;
* a dataclass is an object of its fields, plus ``"@"``: its class name (a field whose metadata holds
  :data:`OMIT_AT_DEFAULT` is left out while it has its default, so that one added later leaves the forms of the
  keys that do not use it as they were);
* an enum member is ``{"@": <enum class name>, "name": <member name>}``;
* a set is ``{"@": "set", "items": [...]}`` and a dict ``{"@": "dict", "items": [[key, value], ...]}``,
  items ordered by their canonical text;

and a key's *text* is that form written canonically (sorted object keys, no spaces). A key holding anything
else (a class, a function: the call keys of the hot path) has no JSON form and is never saved.

Files (:data:`TUNINGS_FORMAT`)::

    {"format": "nvdispatch-tunings/3", "nvdispatch": "0.1.0",
     "tunings": [{"key": [...], "kind": "numpy-blocks", "tuning": {"block_bytes": 262144, "threads": 1}}]}

Loading reads the whole file first: a missing, unreadable or malformed file raises
:class:`~nvdispatch.errors.TuningsFileError` (the underlying error is its ``__cause__``) and applies
nothing. Then each entry is checked on its own — its shape, its kind (one this nvdispatch knows) and its
value (by the kind's validator) — and a bad one is skipped with a :class:`~nvdispatch.errors.TuningsWarning`
naming it. Files of the formats before 3 keyed their entries by Python ``repr`` text, which this version no
longer reads: they load with a warning saying so, and apply nothing (tune again and save). A tuning that
passes its check but still fails when its plan is made is dropped with a warning, and the plan is made
untuned, so a damaged file never breaks calls.

Saving writes a temporary file beside the target and renames it over the target when complete: an error
part-way leaves the previous file as it was. The file keeps the target's permission bits; a new one gets
those of any new file (``0o666`` less the umask).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import numbers
import os
import secrets
import stat
import threading
import warnings
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from ._epilog import STRATEGIES
from ._version import __version__
from .errors import InvalidArgumentError, TuningsFileError, TuningsWarning

__all__ = [
    "Tunings",
    "TUNINGS_FORMAT",
    "STRATEGY_CHOICE",
    "register_kind",
    "key_json",
    "key_text",
    "OMIT_AT_DEFAULT",
    "check_object",
    "an_int",
    "a_string",
    "a_number",
    "strings_by_name",
    "ints",
    "an_object",
    "anything",
    "require_valid",
]

#: the ``"format"`` field of the files :meth:`Tunings.save` writes
TUNINGS_FORMAT = "nvdispatch-tunings/3"
#: formats of earlier versions: recognised (a warning says why nothing applies), not read
_REPR_KEYED_FORMATS = ("nvdispatch-tunings/1", "nvdispatch-tunings/2")
#: the kind of ``Matmul.autotune``'s record of the strategy that won
STRATEGY_CHOICE = "strategy-choice"

Check = Callable[[Any], "str | None"]


# -- kinds --------------------------------------------------------------------------------------------------
_kinds: dict[str, Callable[[], Any]] = {}


def register_kind(kind: str, owner: Callable[[], Any]) -> None:
    """Make tunings of ``kind`` known: ``owner()`` returns the class that makes them (called when a tuning of
    the kind is checked, so its module is imported only then); its ``validate_tuning(value)`` checks them."""
    _kinds[kind] = owner


def _validator(kind: str | None) -> tuple[Check | None, str]:
    """``(validate_tuning, '')`` of ``kind``'s class, or ``(None, why it cannot be checked)``."""
    owner = _kinds.get(kind) if isinstance(kind, str) else None
    if owner is None:
        known = ", ".join(sorted(_kinds)) or "none"
        return None, f"its kind {kind!r} is not one this nvdispatch makes (known: {known})"
    try:
        return owner().validate_tuning, ""
    except (ImportError, AttributeError) as exc:
        return None, f"its kind {kind!r} cannot be checked here ({type(exc).__name__}: {exc})"


class StrategyChoice:
    """The strategy ``Matmul.autotune`` chose for a problem (recorded under the dispatcher's choice key):
    ``{"strategy": name, "plan": the chosen plan's tuning, for the record, "rejected": {strategy: why}}`` (the
    strategies left out because their results disagreed with the reference's; ``explain()`` shows them)."""

    tuning_kind = STRATEGY_CHOICE

    @staticmethod
    def validate_tuning(value: Any) -> str | None:
        return check_object(
            value,
            {"strategy": a_string(STRATEGIES), "plan": anything, "rejected": strings_by_name()},
            required=("strategy",),
        )



register_kind(STRATEGY_CHOICE, lambda: StrategyChoice)


# -- checks plan classes compose their validators of --------------------------------------------------------
def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    for cls, name in names.items():
        if isinstance(value, cls):
            return f"{name} {_short(value)}"
    if isinstance(value, numbers.Number):
        return f"the number {_short(value)}"
    return type(value).__name__


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def anything(value: Any) -> str | None:
    """Any JSON value."""
    return None


def an_int(lo: int, hi: int | None = None) -> Check:
    """An integer (not a boolean) from ``lo`` to ``hi`` (inclusive; no upper bound when None)."""
    span = f"an int >= {lo}" if hi is None else f"an int from {lo} to {hi}"

    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            return f"expected {span}, got {_json_type(value)}"
        return None

    return check


def a_string(choices: Iterable[str] | None = None) -> Check:
    """A string (one of ``choices`` where given)."""
    options = tuple(choices) if choices is not None else None

    def check(value: Any) -> str | None:
        if not isinstance(value, str) or (options is not None and value not in options):
            return f"expected {'a string' if options is None else f'one of {list(options)}'}, got {_json_type(value)}"
        return None

    return check


def strings_by_name() -> Check:
    """An object whose values are strings (e.g. why each candidate was rejected, by its name)."""

    def check(value: Any) -> str | None:
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            return f"expected an object of strings, got {_json_type(value)}"
        return None

    return check


def a_number(optional: bool = False) -> Check:
    """A number (not a boolean); ``None`` too when ``optional``."""

    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected a number{' or null' if optional else ''}, got {_json_type(value)}"
        return None

    return check


def ints(length: int, lo: int, hi: int) -> Check:
    """An array of exactly ``length`` integers, each from ``lo`` to ``hi``."""
    item = an_int(lo, hi)

    def check(value: Any) -> str | None:
        if not isinstance(value, list) or len(value) != length:
            return f"expected an array of {length} ints, got {_json_type(value)}"
        for i, x in enumerate(value):
            why = item(x)
            if why:
                return f"item {i}: {why}"
        return None

    return check


def an_object(fields: Mapping[str, Check], required: Iterable[str] = ()) -> Check:
    """A JSON object checked by :func:`check_object`."""
    return lambda value: check_object(value, fields, required)


def check_object(value: Any, fields: Mapping[str, Check], required: Iterable[str] = ()) -> str | None:
    """Why ``value`` is not a JSON object of (only) ``fields``, each passing its check, with the ``required``
    ones present; None when it is."""
    if not isinstance(value, dict):
        return f"expected an object, got {_json_type(value)}"
    for name in required:
        if name not in value:
            return f"field {name!r} is missing"
    for name, v in value.items():
        check = fields.get(name)
        if check is None:
            return f"unknown field {name!r} (expected {sorted(fields)})"
        why = check(v)
        if why:
            return f"field {name!r}: {why}"
    return None


def require_valid(owner: Any, tuning: Any) -> None:
    """Raise :class:`~nvdispatch.errors.InvalidArgumentError` naming ``tuning`` when ``owner``'s
    ``validate_tuning`` finds it wrong: a plan handed a tuning checks it before applying it (the plan cache
    then drops it with a warning and plans untuned)."""
    why = owner.validate_tuning(tuning)
    if why:
        raise InvalidArgumentError("tuning", f"a {owner.tuning_kind} tuning", why)


# -- keys -----------------------------------------------------------------------------------------------------
#: a dataclass field's metadata key (``field(default=..., metadata={OMIT_AT_DEFAULT: True})``): :func:`key_json`
#: leaves the field out while it has its default
OMIT_AT_DEFAULT = "nvdispatch_key_omit_at_default"


def key_json(key: Any) -> Any:
    """The JSON form of a plan-cache key (see the module's docstring); ``TypeError`` when it has none."""
    if key is None or isinstance(key, (bool, str)):
        return key
    if isinstance(key, enum.Enum):
        return {"@": type(key).__name__, "name": key.name}
    if isinstance(key, numbers.Integral):
        return int(key)
    if isinstance(key, float):
        if not math.isfinite(key):
            raise TypeError(f"the float {key!r} has no JSON form")
        return key
    if isinstance(key, (tuple, list)):
        return [key_json(x) for x in key]
    if dataclasses.is_dataclass(key) and not isinstance(key, type):
        form = {"@": type(key).__name__}
        for f in dataclasses.fields(key):
            value = getattr(key, f.name)
            if f.metadata.get(OMIT_AT_DEFAULT) and value == f.default:
                continue
            form[f.name] = key_json(value)
        return form
    if isinstance(key, (set, frozenset)):
        return {"@": "set", "items": sorted((key_json(x) for x in key), key=_canonical)}
    if isinstance(key, dict):
        items = [[key_json(k), key_json(v)] for k, v in key.items()]
        return {"@": "dict", "items": sorted(items, key=_canonical)}
    raise TypeError(f"a {type(key).__module__}.{type(key).__qualname__} has no JSON form")


def _canonical(form: Any) -> str:
    return json.dumps(form, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@functools.lru_cache(maxsize=1024)
def _text_of(key: Hashable) -> str:
    return _canonical(key_json(key))


def key_text(key: Hashable) -> str | None:
    """The canonical text of ``key``'s JSON form, or None when it has none. Memoised by key equality, as
    the plan cache tells keys apart (so ``(1,)`` and ``(1.0,)``, one key there, have one text here)."""
    try:
        return _text_of(key)
    except TypeError:  # no JSON form, or unhashable
        return None


def _summary(form: Any) -> str:
    """A short name for a key's JSON form in messages: its leading plain parts (``matmul/numpy/inplace``)."""
    if isinstance(form, list):
        parts = [str(x) for x in form if isinstance(x, (str, int)) and not isinstance(x, bool)]
        if parts:
            return "/".join(parts)
    return _short(form)


# -- the store --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Entry:
    key: Any  # the JSON form
    kind: str | None
    value: Any


class Tunings:
    """The tuned choices one plan cache knows (recorded by autotuning or loaded from files), by key.

    Examples
    --------
    >>> from nvdispatch._tunings import Tunings
    >>> t = Tunings()
    >>> t.record(("matmul", "mine", "inplace"), {"threads": 2})
    >>> t.get(("matmul", "mine", "inplace"))
    {'threads': 2}
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def record(self, key: Hashable, value: Any, kind: str | None = None) -> None:
        """Remember ``value`` (of ``kind``) for ``key``; a key without a JSON form is not remembered."""
        text = key_text(key)
        if text is not None:
            with self._lock:
                self._entries[text] = _Entry(key_json(key), kind, value)

    def concern(self, op: str) -> bool:
        """Whether a tuning known is keyed by operation ``op``: its key starts with ``op`` (a plan key) or with
        ``"choice"`` and ``op`` (a strategy choice)."""
        with self._lock:
            keys = [e.key for e in self._entries.values()]
        return any(
            isinstance(k, list) and k and (k[0] == op or (k[0] == "choice" and len(k) > 1 and k[1] == op)) for k in keys
        )

    def get(self, key: Hashable) -> Any | None:
        """The tuning known for ``key``, or None (no work at all while none is known)."""
        if not self._entries:
            return None
        text = key_text(key)
        entry = self._entries.get(text) if text is not None else None
        return None if entry is None else entry.value

    def drop(self, key: Hashable) -> None:
        text = key_text(key)
        with self._lock:
            self._entries.pop(text, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def by_text(self) -> dict[str, Any]:
        """A copy of the tunings known, by key text."""
        with self._lock:
            return {text: e.value for text, e in self._entries.items()}

    def build(self, key: Hashable, factory: Callable[[Any], Any]) -> Any:
        """``factory(tuning)`` with the tuning known for ``key``; one the factory cannot apply is dropped with a
        :class:`~nvdispatch.errors.TuningsWarning`, and the plan made untuned."""
        tuning = self.get(key)
        if tuning is None:
            return factory(None)
        try:
            return factory(tuning)
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except Exception as exc:  # noqa: BLE001 - a stale or damaged tuning must not break calls
            text = key_text(key)
            entry = self._entries.get(text) if text is not None else None
            name = _summary(entry.key) if entry is not None else _short(key)
            warnings.warn(
                f"the tuning known for {name} could not be applied ({type(exc).__name__}: {exc}); dropped, "
                "planning untuned",
                TuningsWarning,
                stacklevel=4,
            )
            self.drop(key)
            return factory(None)

    # -- files ------------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, plans: Iterable[tuple[Hashable, Any]] = ()) -> int:
        """Write the tunings known and those of ``plans`` (``(key, plan)`` pairs: each plan's ``tuning()``,
        of its ``tuning_kind``) to ``path``; returns how many entries were written."""
        with self._lock:
            entries = dict(self._entries)
        for key, plan in plans:
            get = getattr(plan, "tuning", None)
            value = get() if callable(get) else None
            text = key_text(key) if value is not None else None
            if text is not None:
                entries[text] = _Entry(key_json(key), getattr(plan, "tuning_kind", None), value)
        rows = [
            json.dumps({"key": e.key, "kind": e.kind, "tuning": e.value}, sort_keys=True)
            for _, e in sorted(entries.items())
        ]
        head = json.dumps({"format": TUNINGS_FORMAT, "nvdispatch": __version__})[:-1]
        body = ",\n".join(rows)  # one entry a line
        _write_atomically(os.fspath(path), f'{head}, "tunings": [\n{body}\n]}}\n')
        return len(rows)

    def load(self, path: str | os.PathLike) -> int:
        """Read a file written by :meth:`save` and remember its valid entries; returns how many."""
        data = _read(path)
        where = f"plan_cache.load({os.fspath(path)!r})"
        fmt = data["format"]
        if fmt in _REPR_KEYED_FORMATS:
            count = len(data["tunings"]) if isinstance(data.get("tunings"), (dict, list)) else 0
            warnings.warn(
                f"{where}: format {fmt!r} keyed its entries by Python repr text, which nvdispatch {__version__} "
                f"no longer reads; its {count} entries are skipped: tune again and save with this version "
                f"(format {TUNINGS_FORMAT!r})",
                TuningsWarning,
                stacklevel=3,
            )
            return 0
        if not isinstance(data.get("tunings"), list):
            raise TuningsFileError("path", "a tunings file with a 'tunings' array", f"{os.fspath(path)} without one")
        saved_by = data.get("nvdispatch")
        if saved_by != __version__:
            warnings.warn(
                f"{where}: saved by nvdispatch {saved_by or 'of an unknown version'}, this is {__version__}: plan "
                "keys may differ between versions, so entries may not apply",
                TuningsWarning,
                stacklevel=3,
            )
        accepted: dict[str, _Entry] = {}
        for i, row in enumerate(data["tunings"]):
            entry, why = _entry_of(row)
            if entry is None:
                name = f"entry {i}" + (f" ({_summary(row['key'])})" if isinstance(row, dict) and "key" in row else "")
                warnings.warn(f"{where}: {name} skipped: {why}", TuningsWarning, stacklevel=3)
            else:
                accepted[_canonical(entry.key)] = entry
        with self._lock:
            self._entries.update(accepted)
        return len(accepted)


def _entry_of(row: Any) -> tuple[_Entry | None, str]:
    """The entry a file's row holds, or ``(None, why not)``."""
    why = check_object(row, {"key": anything, "kind": anything, "tuning": anything}, required=("key", "tuning"))
    if why:
        return None, why
    kind = row.get("kind")
    if kind is not None:
        validate, why = _validator(kind)
        if validate is None:
            return None, why
        why = validate(row["tuning"])
        if why:
            return None, f"its {kind} tuning is not valid: {why}"
    return _Entry(row["key"], kind, row["tuning"]), ""


def _read(path: str | os.PathLike) -> dict:
    """The JSON object in the tunings file at ``path``, with a string ``format``; TuningsFileError if none."""
    shown = os.fspath(path) if isinstance(path, (str, os.PathLike)) else repr(path)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise TuningsFileError(
            "path", "a readable tunings file written by plan_cache.save()", f"{shown} ({exc.strerror or exc})"
        ) from exc
    except (ValueError, RecursionError) as exc:  # not JSON, bad UTF-8, an integer too long, nested too deeply
        what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise TuningsFileError("path", "a JSON file written by plan_cache.save()", f"{shown} ({what})") from exc
    except TypeError as exc:  # not a path at all
        raise TuningsFileError("path", "a path (str or os.PathLike)", shown) from exc
    if not isinstance(data, dict) or not isinstance(data.get("format"), str):
        raise TuningsFileError("path", "a file written by plan_cache.save()", f"{shown} (no 'format' field)")
    fmt = data["format"]
    if fmt != TUNINGS_FORMAT and fmt not in _REPR_KEYED_FORMATS:
        raise TuningsFileError(
            "path",
            f"a tunings file of format {TUNINGS_FORMAT!r}",
            f"{shown} of format {fmt!r}",
            "it was written by another nvdispatch version; tune again and save with this one",
        )
    return data


def _write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed over it (the target's mode kept; a new file
    gets the umask's, as any new file)."""
    target = os.path.realpath(path)  # through a symbolic link: the link stays, its target is replaced
    if os.path.isdir(target):
        raise TuningsFileError("path", "a file path to write the tunings to", f"{path} (a directory)")
    folder, name = os.path.split(target)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = None
    while True:
        tmp = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
        try:  # O_EXCL: never another's file; mode 0o666 less the umask, as any new file
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
