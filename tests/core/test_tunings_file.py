"""Tunings files: versioned, structured keys, each entry checked by the plan class of its kind, written
atomically with the file's mode kept; a bad entry, a bad file or a bad tuning never breaks calls."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import stat
import warnings

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors, plan_cache
from nvdispatch._plan_cache import PlanCache
from nvdispatch._route import choice_key, plan_key
from nvdispatch._tunings import STRATEGY_CHOICE, TUNINGS_FORMAT, key_json, key_text
from nvdispatch.errors import TuningsWarning
from nvdispatch.executors import TUNING_KINDS, builtin
from nvdispatch.executors.cpu_threads import CPUS


@pytest.fixture(autouse=True)
def _fresh():
    plan_cache.clear()
    plan_cache.clear_tunings()
    yield
    plan_cache.clear()
    plan_cache.clear_tunings()


def _write(path, rows, fmt=TUNINGS_FORMAT, version=nvdispatch.__version__):
    data = {"format": fmt, "tunings": rows}
    if version is not None:
        data["nvdispatch"] = version
    path.write_text(json.dumps(data))
    return path


A, B, BIAS = np.ones((8, 4)), np.ones((4, 3)), np.ones(3)
KW = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": BIAS}}


_PROBLEM = nvdispatch.explain(A, B, **KW).problem  # (the autouse fixture clears the plan explain() made)


def _keys():
    """The JSON forms of the plan key (strategy inplace) and the choice key of matmul(A, B, RELU_BIAS) on the
    NumPy executor."""
    problem, ex = _PROBLEM, builtin("numpy")
    return key_json(plan_key(ex, "matmul", problem, "inplace")), key_json(choice_key(ex, "matmul", problem))


def _warnings_of(fn):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in record if issubclass(w.category, TuningsWarning)]


def _want():
    return np.maximum(A @ B + BIAS, 0)


# -- entries ------------------------------------------------------------------------------------------------
def test_meaningful_but_wrong_entries_are_skipped_with_a_warning_naming_each(tmp_path):
    pkey, ckey = _keys()
    rows = [
        {"key": pkey, "kind": "numpy-blocks", "tuning": {"block_bytes": 4096, "threads": 1}},  # good
        {"key": ckey, "kind": STRATEGY_CHOICE, "tuning": {"strategy": "warp_speed"}},
        {"key": pkey, "kind": "numpy-blocks", "tuning": {"block_bytes": 4096, "threads": 10**12}},
        {"key": pkey, "kind": "numpy-panels", "tuning": {"panel_bytes": -5, "threads": 1}},
        {"key": pkey, "kind": "numpy-blocks", "tuning": {"threads": "many"}},
        {"key": pkey, "kind": "numpy-blocks", "tuning": {"threads": True}},  # a bool is not an int
        {"key": pkey, "kind": "numpy-blocks", "tuning": {"block_bytes": 1, "warp": 9}},
        {"key": pkey, "kind": "turbo", "tuning": {}},
        {"key": pkey, "kind": "cublaslt-algo", "tuning": {"env": {}, "data": [1], "ws": 0}},
        {"key": ckey, "kind": STRATEGY_CHOICE, "tuning": "fast"},
        {"kind": "numpy-blocks", "tuning": {}},
        "not an object",
    ]
    applied, messages = _warnings_of(lambda: plan_cache.load(_write(tmp_path / "t.json", rows)))
    assert applied == 1 and plan_cache.stats()["tunings"] == 1
    assert len(messages) == len(rows) - 1
    for i, why in [
        (1, "warp_speed"),
        (2, f"an int from 1 to {4 * CPUS}"),
        (3, "'panel_bytes'"),
        (4, "'many'"),
        (5, "a boolean True"),
        (6, "unknown field 'warp'"),
        (7, "'turbo' is not one this nvdispatch makes"),
        (8, "field 'env'"),
        (9, "expected an object"),
        (10, "field 'key' is missing"),
        (11, "expected an object"),
    ]:
        message = messages[i - 1]
        assert f"entry {i}" in message and why in message, (i, message)
    assert "matmul/numpy/inplace" in messages[1]  # the entry named by its key too
    np.testing.assert_allclose(nvdispatch.matmul(A, B, **KW), _want())
    explanation = nvdispatch.explain(A, B, **KW)
    assert "1000000000000" not in " ".join(explanation.steps)


def test_a_tuning_that_passes_its_file_check_but_not_its_plan_is_dropped_and_the_call_runs_untuned(tmp_path):
    pkey, _ = _keys()
    # kind null: a user executor's, unchecked at load; the NumPy plan checks what it is handed
    rows = [{"key": pkey, "kind": None, "tuning": {"block_bytes": 4096, "threads": 10**12}}]
    assert plan_cache.load(_write(tmp_path / "t.json", rows)) == 1
    ex, problem = builtin("numpy"), _PROBLEM
    with pytest.warns(TuningsWarning, match="could not be applied.*tuning.*threads"):
        plan = nvdispatch._route.get_plan(ex, "matmul", problem, "inplace")
    assert getattr(plan, "threads", 1) <= CPUS  # planned untuned
    assert plan_cache.stats()["tunings"] == 0  # dropped
    np.testing.assert_allclose(nvdispatch.matmul(A, B, **KW), _want())


def test_a_factory_that_cannot_apply_a_tuning_drops_it():
    cache = PlanCache()
    cache.record_tuning("k", {"block_bytes": 1})

    def factory(tuning):
        if tuning is not None:
            raise ValueError("no such block size")
        return "plan"

    with pytest.warns(TuningsWarning, match="could not be applied"):
        assert cache.get_or_create("k", factory) == "plan"
    assert cache.tuning_for("k") is None


def test_a_loaded_strategy_choice_and_plan_tuning_apply(tmp_path):
    pkey, ckey = _keys()
    rows = [
        {"key": ckey, "kind": STRATEGY_CHOICE, "tuning": {"strategy": "inplace", "plan": None}},
        {"key": pkey, "kind": "numpy-blocks", "tuning": {"block_bytes": 0, "threads": 1}},
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plan_cache.load(_write(tmp_path / "t.json", rows)) == 2
    assert nvdispatch.explain(A, B, **KW).strategy == "inplace"
    plan = nvdispatch._route.get_plan(builtin("numpy"), "matmul", _PROBLEM, "inplace")
    assert plan.threads == 1 and plan.block_rows == A.shape[0]  # block_bytes 0: the whole result at once
    np.testing.assert_allclose(nvdispatch.matmul(A, B, **KW), _want())


def test_clear_tunings_unloads(tmp_path):
    default = nvdispatch.explain(A, B, **KW).strategy  # the calibrated first choice (this box's)
    assert default != "plain"
    _, ckey = _keys()
    plan_cache.load(
        _write(tmp_path / "t.json", [{"key": ckey, "kind": STRATEGY_CHOICE, "tuning": {"strategy": "plain"}}])
    )
    assert nvdispatch.explain(A, B, **KW).strategy == "plain"
    plan_cache.clear()
    assert plan_cache.has_tunings()  # clear() keeps tunings
    plan_cache.clear_tunings()
    assert not plan_cache.has_tunings() and plan_cache.tunings() == {}
    assert nvdispatch.explain(A, B, **KW).strategy == default


# -- files ----------------------------------------------------------------------------------------------------
def test_a_missing_file_a_directory_or_deep_json_is_a_tunings_file_error_keeping_the_cause(tmp_path):
    cases = [
        (tmp_path / "missing.json", FileNotFoundError, "No such file"),
        (tmp_path, IsADirectoryError, "directory"),
    ]
    deep = tmp_path / "deep.json"
    deep.write_text('{"format": "nvdispatch-tunings/3", "tunings": ' + "[" * 100_000 + "]" * 100_000 + "}")
    cases.append((deep, RecursionError, "nested too deeply"))
    huge = tmp_path / "huge_int.json"
    huge.write_text('{"format": "nvdispatch-tunings/3", "tunings": [' + "9" * 5000 + "]}")
    cases.append((huge, ValueError, "JSON"))
    bad_utf8 = tmp_path / "bad.json"
    bad_utf8.write_bytes(b'{"format": "\xff"}')
    cases.append((bad_utf8, UnicodeDecodeError, "JSON"))
    for path, cause, text in cases:
        with pytest.raises(errors.TuningsFileError, match=text) as info:
            plan_cache.load(path)
        assert isinstance(info.value.__cause__, cause), (path, info.value.__cause__)
        assert info.value.argument == "path" and str(path) in str(info.value)
    with pytest.raises(errors.TuningsFileError, match="path"):
        plan_cache.load(None)
    assert plan_cache.stats()["tunings"] == 0


def test_another_format_or_no_tunings_is_a_typed_error(tmp_path):
    with pytest.raises(errors.TuningsFileError, match="format"):
        plan_cache.load(_write(tmp_path / "future.json", [], fmt="nvdispatch-tunings/99"))
    (tmp_path / "no_tunings.json").write_text(json.dumps({"format": TUNINGS_FORMAT}))
    with pytest.raises(errors.TuningsFileError, match="'tunings'"):
        plan_cache.load(tmp_path / "no_tunings.json")
    (tmp_path / "not_json.json").write_text("{")
    with pytest.raises(errors.TuningsFileError, match="JSON"):
        plan_cache.load(tmp_path / "not_json.json")
    (tmp_path / "other.json").write_text('{"format": "other"}')
    with pytest.raises(errors.InvalidArgumentError, match="path"):  # TuningsFileError is one
        plan_cache.load(tmp_path / "other.json")
    assert plan_cache.stats()["tunings"] == 0


def test_files_of_the_repr_keyed_formats_load_with_a_warning_and_apply_nothing(tmp_path):
    pkey, _ = _keys()
    for fmt, version in [("nvdispatch-tunings/2", nvdispatch.__version__), ("nvdispatch-tunings/1", None)]:
        path = _write(tmp_path / "old.json", {repr(pkey): {"threads": 1}, "x": {}}, fmt=fmt, version=version)
        with pytest.warns(TuningsWarning, match=f"{fmt}.*repr text.*2 entries are skipped.*tune again"):
            assert plan_cache.load(path) == 0
    assert plan_cache.stats()["tunings"] == 0


def test_a_file_from_another_version_warns(tmp_path):
    path = _write(tmp_path / "other.json", [{"key": ["k"], "kind": None, "tuning": {"threads": 2}}], version="0.0.1")
    with pytest.warns(TuningsWarning, match="0.0.1"):
        assert plan_cache.load(path) == 1
    path = _write(tmp_path / "unknown.json", [], version=None)
    with pytest.warns(TuningsWarning, match="unknown version"):
        assert plan_cache.load(path) == 0


def test_save_round_trip_and_atomicity(tmp_path, monkeypatch):
    path = tmp_path / "tuned.json"
    cache = PlanCache()
    cache.record_tuning("k1", {"threads": 1})
    assert cache.save(path) == 1
    good = path.read_text()
    data = json.loads(good)
    assert data["format"] == TUNINGS_FORMAT and data["nvdispatch"] == nvdispatch.__version__
    assert data["tunings"] == [{"key": "k1", "kind": None, "tuning": {"threads": 1}}]

    cache.record_tuning("k2", {"threads": 2})

    def failing_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk full"):
        cache.save(path)
    monkeypatch.undo()
    assert path.read_text() == good  # the previous file is intact
    assert [p.name for p in tmp_path.iterdir()] == ["tuned.json"]  # no temporary left behind
    fresh = PlanCache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fresh.load(path) == 1
    assert fresh.tuning_for("k1") == {"threads": 1}
    with pytest.raises(errors.TuningsFileError, match="directory"):
        cache.save(tmp_path)


def test_save_keeps_the_files_mode_and_new_files_get_the_umasks(tmp_path):
    cache = PlanCache()
    cache.record_tuning("k", {"threads": 1})
    kept = tmp_path / "kept.json"
    kept.write_text("{}")
    for mode in (0o644, 0o640, 0o600):
        os.chmod(kept, mode)
        cache.save(kept)
        assert stat.S_IMODE(os.stat(kept).st_mode) == mode
    old = os.umask(0o027)
    try:
        cache.save(tmp_path / "new.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "new.json").st_mode) == 0o640  # 0o666 less the umask
    link = tmp_path / "link.json"
    link.symlink_to(kept)
    cache.save(link)
    assert link.is_symlink() and json.loads(kept.read_text())["format"] == TUNINGS_FORMAT


def test_autotuned_choices_round_trip_through_a_file_without_warnings(tmp_path):
    rng = np.random.default_rng(0)
    a, b, bias = rng.standard_normal((256, 64)), rng.standard_normal((64, 128)), np.ones(128)
    with nvdispatch.Matmul(a, b) as mm:
        mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        mm.autotune(iterations=1)
        chosen = mm.strategy
        problem = mm._problem
    path = tmp_path / "tuned.json"
    saved = plan_cache.save(path)
    kinds = {row["kind"] for row in json.loads(path.read_text())["tunings"]}
    assert STRATEGY_CHOICE in kinds and kinds <= {STRATEGY_CHOICE, *TUNING_KINDS}
    fresh = PlanCache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fresh.load(path) == saved
    assert fresh.tuning_for(choice_key(builtin("numpy"), "matmul", problem))["strategy"] == chosen


# -- keys and kinds --------------------------------------------------------------------------------------------
def test_keys_have_one_defined_json_form():
    problem = nvdispatch.explain(A, B, **KW, options={"compute_type": "COMPUTE_64F"}).problem
    form = key_json(("matmul", "numpy", "inplace", problem))
    assert form[:3] == ["matmul", "numpy", "inplace"]
    assert form[3]["@"] == "MatmulProblem" and form[3]["a"] == {
        "@": "ArraySig",
        "dtype": "float64",
        "shape": [8, 4],
        "strides": [4, 1],
        "chunks": None,
    }
    assert form[3]["options"]["compute_type"] == {"@": "ComputeType", "name": "COMPUTE_64F"}
    assert form[3]["epilog"]["epilog"] == {"@": "Epilog", "name": "RELU_BIAS"}
    assert key_json((True, 1, 1.5, None, frozenset({2, 1}))) == [True, 1, 1.5, None, {"@": "set", "items": [1, 2]}]
    assert len({json.dumps(key_json((x,))) for x in (1, True, 1.0)}) == 3  # equal in Python, not in JSON
    assert json.loads(key_text(("matmul", problem))) == key_json(("matmul", problem))
    assert key_text((np.ndarray, 1)) is None and key_text(("x", float("nan"))) is None  # no JSON form: never saved


def test_keys_are_not_serialised_on_a_miss_while_no_tunings_are_known(monkeypatch):
    import nvdispatch._tunings as tunings

    def forbidden(key):
        raise AssertionError("a key was serialised")

    monkeypatch.setattr(tunings, "key_json", forbidden)
    monkeypatch.setattr(tunings, "_text_of", forbidden)
    np.testing.assert_allclose(nvdispatch.matmul(A, B, **KW), _want())
    assert plan_cache.stats()["misses"] >= 1


def _tuning_classes() -> list[tuple[str, str]]:
    """(module, class) of every class under src/nvdispatch that defines ``tuning()``."""
    src = pathlib.Path(nvdispatch.__file__).parent
    found = []
    for path in src.rglob("*.py"):
        module = "nvdispatch." + ".".join(path.relative_to(src).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "tuning":
                    last = item.body[-1]
                    value = last.value if isinstance(last, ast.Return) else None
                    untuned = isinstance(last, ast.Return) and (value is None or ast.unparse(value) == "None")
                    if not (len(item.body) == 1 and untuned):  # `return None`: nothing to tune
                        found.append((module.removesuffix(".__init__"), node.name))
    return found


def test_every_plan_with_a_tuning_has_a_registered_kind_whose_class_validates_it():
    import importlib

    classes = _tuning_classes()
    assert len(classes) >= 4
    for module, name in classes:
        cls = getattr(importlib.import_module(module), name)
        if name == "CheckedPlan":  # a user executor's plan, seen through the contract: its tunings are its own
            assert getattr(cls, "tuning_kind", None) is None
            continue
        kind = getattr(cls, "tuning_kind", None)
        assert kind in TUNING_KINDS, (module, name)
        owner = nvdispatch._tunings._validator(kind)[0]
        assert owner is not None, (kind, nvdispatch._tunings._validator(kind)[1])
    for kind in TUNING_KINDS:
        validate, why = nvdispatch._tunings._validator(kind)
        assert validate is not None, why
        assert validate("not an object")  # every validator refuses a non-object
