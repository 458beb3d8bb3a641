"""The CPU calibration kept between processes (nvdispatch.executors.cpu_calibration_store and the rankings over
it): where it lives, what keys it, what invalidates it, damaged files, concurrent writers, the explicit
calibration step and what explain() says of the order's origin. No timings are asserted."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import nvdispatch
from nvdispatch.executors import cpu_calibration_store as cal_store
from nvdispatch.executors import numpy_fft_workers, numpy_matmul, numpy_matmul_calibration

_KW = {"epilog": "RELU_BIAS"}


def _fake_measure(rep, candidates, make_plan):
    """Seconds per engine without timing anything (these tests are about keeping rankings, not making them):
    the default order reversed, so that a measured ranking shows; one setting only (no engine's own threads)."""
    seconds = {e: 1.0 + i for i, e in enumerate(reversed(numpy_matmul_calibration.default_order(candidates)))}
    return seconds, None, None


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A fresh cache directory for the test (and the process's rankings forgotten before and after)."""
    monkeypatch.setenv(cal_store.ENV, str(tmp_path))
    monkeypatch.setattr(numpy_matmul_calibration, "_measure", _fake_measure)
    _forget()
    yield tmp_path
    _forget()


def _forget():
    numpy_matmul_calibration.clear()
    numpy_fft_workers.clear()
    nvdispatch.plan_cache.clear()


def _operands(m=40, k=8, n=12, dtype=np.float32):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    return a, b, {**_KW, "epilog_inputs": {"bias": rng.standard_normal(n).astype(dtype)}}


def _files(folder):
    return sorted(p for p in os.listdir(folder) if p.endswith(".json"))


def test_the_suite_keeps_its_calibration_out_of_the_users_cache():
    import platformdirs

    where = os.environ[cal_store.ENV]
    assert where and os.path.isdir(where)
    assert cal_store.directory() == os.path.abspath(where)
    assert not os.path.abspath(where).startswith(platformdirs.user_cache_dir("nvdispatch", appauthor=False))


def test_the_default_directory_is_platformdirs_user_cache(monkeypatch):
    import platformdirs

    monkeypatch.delenv(cal_store.ENV)
    assert cal_store.directory() == platformdirs.user_cache_dir("nvdispatch", appauthor=False)


def test_an_empty_variable_keeps_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv(cal_store.ENV, "")
    monkeypatch.setattr(numpy_matmul_calibration, "_measure", _fake_measure)
    _forget()
    try:
        a, b, kw = _operands()
        assert cal_store.store().path is None
        ranked = numpy_matmul.calibrate(nvdispatch.explain(a, b, **kw).problem)
        assert ranked.source == "fresh" and ranked.where is None
        assert "not kept" in ranked.describe()
        numpy_matmul_calibration._flush_pending()
        assert not os.listdir(tmp_path)
    finally:
        _forget()


def test_calibration_is_kept_and_read_back_by_another_process(cache):
    a, b, kw = _operands()
    first = nvdispatch.explain(a, b, **kw)
    assert "the default order" in first.steps[-1] and "python -m nvdispatch calibrate" in first.steps[-1]
    assert not _files(cache)  # planning writes nothing (the pending class is written at exit)
    ranked = numpy_matmul.calibrate(first.problem)
    (name,) = _files(cache)
    data = json.loads((cache / name).read_text())
    assert data["key"] == cal_store.machine_key() and data["format"] == cal_store.FORMAT
    (entry,) = data["sections"]["matmul"].values()
    assert tuple(entry["order"]) == ranked.order
    code = (
        "import numpy as np, nvdispatch\n"
        "rng = np.random.default_rng(0)\n"
        "a = rng.standard_normal((40, 8)).astype(np.float32); b = rng.standard_normal((8, 12)).astype(np.float32)\n"
        "bias = rng.standard_normal(12).astype(np.float32)\n"
        "e = nvdispatch.explain(a, b, epilog='RELU_BIAS', epilog_inputs={'bias': bias})\n"
        "print(e.strategy); print(e.steps[-1])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    strategy, note = out.stdout.strip().splitlines()
    offered = [e for e in ranked.order if e != "torch"]  # (that process did not import Torch)
    assert "calibrated on this machine" in note and " > ".join(offered) in note
    assert strategy == numpy_matmul.engines.STRATEGY_OF[offered[0]]


def test_an_uncalibrated_class_is_noted_for_the_next_calibrate(cache, monkeypatch):
    from nvdispatch import calibration

    monkeypatch.setattr(calibration, "_import_torch_if_installed", lambda: None)
    a, b, kw = _operands(m=300, k=20, n=30)
    nvdispatch.explain(a, b, **kw)
    pending = numpy_matmul_calibration.pending()
    (recipe,) = pending.values()
    assert recipe["a"] == ["float32", [300, 20], "c"] and recipe["epilog"] == "RELU_BIAS"
    numpy_matmul_calibration._flush_pending()  # (what the process does at exit)
    (name,) = _files(cache)
    kept = json.loads((cache / name).read_text())["sections"]["matmul_pending"]
    assert kept == pending
    report = calibration.calibrate(shapes=[], fft=False)  # the pending classes only
    assert list(report.matmul) == [recipe["class"]]
    assert not numpy_matmul_calibration.pending()
    assert not json.loads((cache / name).read_text())["sections"]["matmul_pending"]


@pytest.mark.parametrize(
    "change",
    [
        lambda key: key.update(cpu="another CPU"),
        lambda key: key.update(cores=key["cores"] + 1),
        lambda key: key["blas"].update(threads={"OMP_NUM_THREADS": "1"}),
        lambda key: key["versions"].update(numpy="0.0"),
        lambda key: key["versions"].update(scipy=None),
        lambda key: key["versions"].update(torch="9.9"),
        lambda key: key["versions"].update(nvdispatch="0.0.1"),
    ],
    ids=["cpu", "cores", "blas threads", "numpy", "scipy", "torch", "nvdispatch"],
)
def test_a_calibration_made_for_another_machine_or_software_is_not_used(cache, monkeypatch, change):
    a, b, kw = _operands()
    numpy_matmul.calibrate(nvdispatch.explain(a, b, **kw).problem)
    key = json.loads(json.dumps(cal_store.machine_key()))
    change(key)
    monkeypatch.setattr(cal_store, "_key", lambda: key)
    monkeypatch.setattr(cal_store, "_current", None)
    _forget()
    assert "the default order" in nvdispatch.explain(a, b, **kw).steps[-1]
    numpy_matmul.calibrate(nvdispatch.explain(a, b, **kw).problem)
    assert len(_files(cache)) == 2  # each key its own file: neither overwrites the other


def test_a_file_with_the_same_name_but_another_key_is_ignored(cache, caplog):
    kept = cal_store.store()
    other = {**kept.key, "cpu": "not this one"}
    with open(kept.path, "w") as fh:
        json.dump({"format": cal_store.FORMAT, "key": other, "sections": {"matmul": {}}}, fh)
    kept.forget()
    with caplog.at_level(logging.DEBUG, logger="nvdispatch"):
        assert kept.get("matmul", "x") is None
    assert "made for another format, machine or software" in caplog.text


@pytest.mark.parametrize(
    "content",
    [b"", b"{not json", b"\xff\xfe\x00", b"[]", b'{"format": 999}', b"null", b"[" * 100000,
     json.dumps({"format": 1, "key": "KEY", "sections": []}).encode(),
     json.dumps({"format": 1, "key": "KEY", "sections": {"matmul": 3}}).encode(),
     json.dumps({"format": 1, "key": "KEY", "sections": {"matmul": {"c": {"order": "ab"}}}}).encode(),
     json.dumps({"format": 1, "key": "KEY", "sections": {"matmul": {"c": {"order": ["warp"]}}}}).encode()],
    ids=["empty", "truncated", "binary", "list", "format", "null", "deep", "sections", "section", "order", "names"],
)  # fmt: skip
def test_a_damaged_file_is_never_an_error(cache, caplog, content):
    kept = cal_store.store()
    os.makedirs(cache, exist_ok=True)
    text = content.replace(b'"KEY"', json.dumps(kept.key).encode())
    a, b, kw = _operands()
    problem = nvdispatch.explain(a, b, **kw).problem
    if b'"c"' in content:  # a damaged entry under this very class's name
        text = text.replace(b'"c"', json.dumps(repr(numpy_matmul_calibration.problem_class(problem))).encode())
    with open(kept.path, "wb") as fh:
        fh.write(text)
    _forget()
    with caplog.at_level(logging.DEBUG, logger="nvdispatch"):
        got = nvdispatch.explain(a, b, **kw)
        np.testing.assert_allclose(nvdispatch.matmul(a, b, **kw), np.maximum(a @ b + kw["epilog_inputs"]["bias"], 0),
                                   rtol=1e-5, atol=1e-5)  # fmt: skip
    assert "the default order" in got.steps[-1]
    ranked = numpy_matmul.calibrate(problem)  # and the next write replaces the file
    data = json.loads(open(kept.path).read())
    assert data["key"] == kept.key and tuple(next(iter(data["sections"]["matmul"].values()))["order"]) == ranked.order


def test_an_unwritable_directory_keeps_the_calibration_for_the_process_only(monkeypatch, tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv(cal_store.ENV, str(blocked / "sub"))
    monkeypatch.setattr(numpy_matmul_calibration, "_measure", _fake_measure)
    _forget()
    try:
        a, b, kw = _operands()
        with caplog.at_level(logging.DEBUG, logger="nvdispatch"):
            ranked = numpy_matmul.calibrate(nvdispatch.explain(a, b, **kw).problem)
        assert "cannot write" in caplog.text
        nvdispatch.plan_cache.clear()
        assert " > ".join(ranked.order) in nvdispatch.explain(a, b, **kw).steps[-1]
    finally:
        _forget()


def test_writes_are_atomic(cache, monkeypatch):
    kept = cal_store.store()
    kept.update("matmul", {"one": {"order": ["ufunc"]}})
    before = open(kept.path).read()

    def failing_dump(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(cal_store.json, "dump", failing_dump)
    assert kept.update("matmul", {"two": {"order": ["blas"]}}) is False
    assert open(kept.path).read() == before  # the old file, whole
    assert [p for p in os.listdir(cache) if p.endswith(".tmp")] == []  # no temporary left behind


_WRITER = """
import os, sys, time
from nvdispatch.executors import cpu_calibration_store as s
folder, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kept = s.store()
while not os.path.exists(os.path.join(folder, "go")):
    time.sleep(0.001)
for i in range(first, first + count):
    kept.update("matmul", {f"class {i}": {"order": ["ufunc", "blas"], "seconds": {"ufunc": i}}})
"""


def test_several_processes_writing_at_once_lose_nothing(cache):
    env = {**os.environ, cal_store.ENV: str(cache)}
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(cache), str(100 * w), "15"], env=env) for w in range(4)
    ]
    (cache / "go").write_text("")
    for w in writers:
        assert w.wait(120) == 0
    kept = cal_store.CalibrationStore(str(cache), cal_store.machine_key())
    names = set(kept.section("matmul"))
    assert names == {f"class {100 * w + i}" for w in range(4) for i in range(15)}


def test_the_key_names_what_decides_the_calibration():
    key = cal_store.machine_key()
    assert set(key) >= {"cpu", "cores", "blas", "versions", "python", "format"}
    assert key["versions"]["numpy"] == np.__version__ and key["versions"]["nvdispatch"] == nvdispatch.__version__
    import scipy

    assert key["versions"]["scipy"] == scipy.__version__
    assert cal_store._version("surely_not_a_module_here") is None
    assert json.loads(json.dumps(key)) == key


def test_versions_are_read_without_importing(monkeypatch):
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs Torch installed")
    code = (
        "import sys, importlib.metadata; from nvdispatch.executors import cpu_calibration_store as s\n"
        "v = s._version('torch'); print(v, 'torch' in sys.modules)\n"
        "print(importlib.metadata.version('torch'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [out[2], "False", out[2]]


def test_the_fft_threshold_is_kept_with_the_rest(cache, monkeypatch):
    monkeypatch.setattr(numpy_fft_workers, "_time_both", lambda fn, x: (1.0, 0.5))
    monkeypatch.setattr(numpy_fft_workers, "CPUS", 2)
    got = numpy_fft_workers.calibrate()
    (name,) = _files(cache)
    assert json.loads((cache / name).read_text())["sections"]["fft"]["threads"]["min_work"] == got.min_work
