"""The public surface carries type hints (PEP 561: py.typed ships in the package) that resolve at run time."""

from __future__ import annotations

import inspect
import pathlib
import typing

import pytest

import nvdispatch
import nvdispatch.fft as F

PUBLIC = [getattr(nvdispatch, n) for n in nvdispatch.__all__ if n not in ("errors", "fft", "device", "plan_cache")]
PUBLIC += [getattr(F, n) for n in F.__all__ if callable(getattr(F, n)) and not n.startswith("_")]


def test_py_typed_ships_in_the_package():
    assert (pathlib.Path(nvdispatch.__file__).parent / "py.typed").exists()


def _functions(obj):
    if inspect.isclass(obj):
        if issubclass(obj, BaseException) or obj.__module__ == "enum":
            return []
        own = [v for k, v in vars(obj).items() if inspect.isfunction(v) and (not k.startswith("_") or k == "__init__")]
        return own
    return [obj] if inspect.isfunction(obj) else []


@pytest.mark.parametrize("obj", PUBLIC, ids=[getattr(o, "__name__", str(o)) for o in PUBLIC])
def test_public_callables_are_annotated(obj):
    for fn in _functions(obj):
        sig = inspect.signature(fn)
        unannotated = [p.name for p in sig.parameters.values() if p.name not in ("self", "cls")
                       and p.annotation is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        assert not unannotated, f"{fn.__qualname__}: {unannotated}"
        assert sig.return_annotation is not inspect.Signature.empty, f"{fn.__qualname__}: no return annotation"
        typing.get_type_hints(fn)  # every annotation resolves
