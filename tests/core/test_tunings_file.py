"""Tunings files: versioned, validated entry by entry, unloadable, written atomically; a bad entry never
breaks calls."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors, plan_cache
from nvdispatch._plan_cache import TUNINGS_FORMAT, PlanCache, TuningsWarning
from nvdispatch._route import choice_key, plan_key


@pytest.fixture(autouse=True)
def _fresh():
    plan_cache.clear()
    plan_cache.clear_tunings()
    yield
    plan_cache.clear()
    plan_cache.clear_tunings()


def _write(path, tunings, fmt=TUNINGS_FORMAT, version=nvdispatch.__version__):
    data = {"format": fmt, "tunings": tunings}
    if version is not None:
        data["nvdispatch"] = version
    path.write_text(json.dumps(data))
    return path


def _keys(a, b, bias):
    """The plan and choice keys of matmul(a, b, RELU_BIAS) on the NumPy executor (strategy inplace)."""
    e = nvdispatch.explain(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    ex = nvdispatch.executors.builtin("numpy")
    return repr(plan_key(ex, "matmul", e.problem, "inplace")), repr(choice_key(ex, "matmul", e.problem))


def test_bad_entries_are_skipped_with_a_warning_naming_them(tmp_path):
    a, b, bias = np.ones((8, 4)), np.ones((4, 3)), np.ones(3)
    pkey, ckey = _keys(a, b, bias)
    path = _write(
        tmp_path / "t.json",
        {
            pkey: {"block_bytes": 4096, "threads": 1},  # good
            ckey: "fast",  # wrong type: was AttributeError on every call of this shape
            "('matmul', 'numpy', 'x')": {"threads": "many"},  # wrong field type: was ValueError
            "": {},
        },
    )
    with pytest.warns(TuningsWarning) as record:
        applied = plan_cache.load(path)
    assert applied == 1
    text = " ".join(str(w.message) for w in record)
    assert repr(ckey) in text and "'threads'" in text and "entry ''" in text
    assert plan_cache.stats()["tunings"] == 1
    got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    np.testing.assert_allclose(got, np.maximum(a @ b + bias, 0))


def test_a_tuning_the_executor_cannot_apply_is_dropped_and_the_call_runs_untuned():
    cache = PlanCache()
    cache.record_tuning("k", {"block_bytes": 1})

    def factory(tuning):
        if tuning is not None:
            raise ValueError("no such block size")
        return "plan"

    with pytest.warns(TuningsWarning, match="could not be applied"):
        assert cache.get_or_create("k", factory) == "plan"
    assert cache.tuning_for("k") is None


def test_another_format_or_no_tunings_is_a_typed_error(tmp_path):
    with pytest.raises(errors.TuningsFileError, match="format"):
        plan_cache.load(_write(tmp_path / "future.json", {}, fmt="nvdispatch-tunings/99"))
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


def test_a_file_from_another_version_warns(tmp_path):
    path = _write(tmp_path / "old.json", {"('matmul', 'numpy', 'x')": {"threads": 2}}, version="0.0.1")
    with pytest.warns(TuningsWarning, match="0.0.1"):
        assert plan_cache.load(path) == 1
    path = _write(tmp_path / "v1.json", {}, fmt="nvdispatch-tunings/1", version=None)
    with pytest.warns(TuningsWarning, match="unknown version"):
        assert plan_cache.load(path) == 0


def test_clear_tunings_unloads(tmp_path):
    a, b, bias = np.ones((8, 4)), np.ones((4, 3)), np.ones(3)
    kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}}
    default = nvdispatch.explain(a, b, **kw).strategy  # the calibrated first choice (this box's)
    assert default != "plain"
    pkey, ckey = _keys(a, b, bias)
    plan_cache.load(_write(tmp_path / "t.json", {ckey: {"strategy": "plain", "plan": None}}))
    assert nvdispatch.explain(a, b, **kw).strategy == "plain"
    plan_cache.clear()
    assert plan_cache.has_tunings()  # clear() keeps tunings
    plan_cache.clear_tunings()
    assert not plan_cache.has_tunings() and plan_cache.tunings() == {}
    assert nvdispatch.explain(a, b, **kw).strategy == default


def test_save_round_trip_and_atomicity(tmp_path, monkeypatch):
    path = tmp_path / "tuned.json"
    cache = PlanCache()
    cache.record_tuning("k1", {"threads": 1})
    assert cache.save(path) == 1
    good = path.read_text()
    data = json.loads(good)
    assert data["format"] == TUNINGS_FORMAT and data["nvdispatch"] == nvdispatch.__version__

    cache.record_tuning("k2", {"threads": 2})
    real_dump = json.dump

    def failing_dump(obj, fh, **kw):
        fh.write('{"format": "nvdispatch-tunings/2", "tun')  # part-way...
        raise OSError("disk full")

    monkeypatch.setattr(json, "dump", failing_dump)
    with pytest.raises(OSError, match="disk full"):
        cache.save(path)
    monkeypatch.setattr(json, "dump", real_dump)
    assert path.read_text() == good  # the previous file is intact
    assert [p.name for p in tmp_path.iterdir()] == ["tuned.json"]  # no temporary left behind
    fresh = PlanCache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fresh.load(path) == 1
