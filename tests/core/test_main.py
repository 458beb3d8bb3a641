"""``python -m nvdispatch``: --version, a validated --shape with help, install hints for missing extras."""

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
    import nvdispatch.__main__ as demo

    monkeypatch.setattr(demo, "_version", lambda mod: None if mod == "torch" else "1.0")
    monkeypatch.setattr(demo, "_gpus", lambda: [])
    main(["--shape", "2", "2", "2"])
    assert "torch          not installed (pip install 'nvdispatch[torch]')" in capsys.readouterr().out
