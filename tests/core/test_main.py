"""``python -m nvdispatch``: --version, a validated --shape with help, install hints for missing extras, warm
medians that say they are not a benchmark."""

from __future__ import annotations

import pytest

import nvdispatch
from nvdispatch.__main__ import _parser, main


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"nvdispatch {nvdispatch.__version__}"


def test_shape_has_help():
    assert "M x K" in _parser().format_help()


@pytest.mark.parametrize("bad", [["0", "2", "3"], ["-1", "2", "3"], ["a", "2", "3"], ["2.5", "2", "3"], ["2", "3"]])
def test_bad_shape_is_a_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--shape", *bad])
    assert stop.value.code == 2
    assert "--shape" in capsys.readouterr().err


def test_small_shape_runs(capsys):
    assert main(["--shape", "3", "5", "2"]) == 0
    assert "x 3x5, w 5x2" in capsys.readouterr().out


def test_missing_framework_names_its_extra(monkeypatch, capsys):
    import nvdispatch._environment as environment

    monkeypatch.setattr(environment, "version", lambda mod: None if mod == "torch" else "1.0")
    monkeypatch.setattr(environment, "gpus", lambda: [])
    main(["--shape", "2", "2", "2"])
    assert "torch          not installed (pip install 'nvdispatch[torch]')" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["4", "0", "x"])
def test_fewer_than_five_repeats_is_a_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--repeats", bad])
    assert stop.value.code == 2
    assert "--repeats" in capsys.readouterr().err


@pytest.mark.parametrize("command", [[], ["demo"]], ids=["default", "demo-command"])
def test_demo_reports_warm_medians_and_says_it_is_no_benchmark(command, capsys):
    assert main([*command, "--shape", "4", "3", "2", "--repeats", "5"]) == 0
    out = capsys.readouterr().out
    assert "median of 5 warm calls" in out and "not a benchmark" in out
    assert "[numpy on cpu] ok" in out and "warm median" in out
    # explained after the timed calls: each path's plan is in the cache by then
    assert "plan cached: False" not in out and "plan cached: True" in out


def test_warm_median_times_only_the_calls_after_warmup():
    from nvdispatch._demo import warm_median_seconds

    calls = []
    seconds, last = warm_median_seconds(lambda: calls.append(None) or len(calls), repeats=5, warmup=2)
    assert len(calls) == 7 and last == 7 and seconds >= 0
