"""Only the adapters (``src/nvdispatch/_adapters/``) know frameworks: nothing else branches on a framework's name.

The rule, checked on the source's syntax tree: outside ``_adapters/``, no expression that mentions a framework
(a name or attribute called ``framework``/``*_framework``/``framework_*``: ``problem.framework``,
``info.framework``...) is

* compared (``==``, ``!=``, ``in``, ``not in``, ``is``) with a framework's name: a string literal such as
  ``"torch"``, or a tuple/list/set/frozenset of them, or a module-level constant holding one;
* used to index or ``.get`` from a dict literal (or a module-level one) keyed by framework names;
* matched against framework names in a ``match`` statement.

What executors run on is a memory kind (``problem.memory``, see ``nvdispatch._adapters.base``); messages may
show ``problem.framework`` and code may pass it to an adapter lookup (``adapter_named(framework)``). Executor and
backend names (``set_backend("torch")``, ``builtin("numpy")``) are not framework contexts and are not flagged.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import nvdispatch
from nvdispatch._adapters import adapters

SRC = pathlib.Path(nvdispatch.__file__).parent
ADAPTERS = SRC / "_adapters"
#: every registered adapter's name, and frameworks known only through a protocol adapter
NAMES = frozenset(ad.name for ad in adapters()) | {"numba", "cupy", "torch", "jax", "dask", "numpy"}


def _mentions_framework(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        name = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else None
        if name is not None and "framework" in name.lower():
            return True
    return False


def _literal_names(node: ast.AST, constants: dict[str, ast.AST]) -> set[str]:
    """The framework names a literal (or a module constant holding one) spells."""
    if isinstance(node, ast.Name) and node.id in constants:
        return _literal_names(constants[node.id], {})
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_literal_names(e, constants) for e in node.elts)) if node.elts else set()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set", "tuple"):
        return set().union(*(_literal_names(a, constants) for a in node.args)) if node.args else set()
    if isinstance(node, ast.Dict):
        return set().union(*(_literal_names(k, constants) for k in node.keys if k is not None)) if node.keys else set()
    return set()


def _module_constants(tree: ast.Module) -> dict[str, ast.AST]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def framework_branches(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for every branch on a framework's name in ``source`` (see the module docstring)."""
    tree = ast.parse(source)
    constants = _module_constants(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_mentions_framework(s) for s in sides):
                names = set().union(*(_literal_names(s, constants) for s in sides))
                if names:
                    found.append((node.lineno, f"compares a framework with {sorted(names)}"))
        elif isinstance(node, ast.Subscript) and _mentions_framework(node.slice):
            names = _literal_names(node.value, constants)
            if names:
                found.append((node.lineno, f"looks a framework up in a dict keyed by {sorted(names)}"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and _mentions_framework(node.args[0])
        ):
            names = _literal_names(node.func.value, constants)
            if names:
                found.append((node.lineno, f"looks a framework up in a dict keyed by {sorted(names)}"))
        elif isinstance(node, ast.Match) and _mentions_framework(node.subject):
            for case in node.cases:
                for sub in ast.walk(case.pattern):
                    if isinstance(sub, ast.MatchValue) and _literal_names(sub.value, constants):
                        found.append((sub.lineno, "matches a framework against its name"))
    return found


def _sources():
    for path in sorted(SRC.rglob("*.py")):
        if ADAPTERS not in path.parents:
            yield path


def test_nothing_outside_the_adapters_branches_on_a_framework_name():
    offenders = [
        f"{path.relative_to(SRC.parent)}:{line}: {what}"
        for path in _sources()
        for line, what in framework_branches(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, "framework names are the adapters' business:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    "source",
    [
        'if problem.framework == "torch": pass',
        'ok = info.framework in ("numpy", "dlpack")',
        'TORCH = "torch"\nok = p.framework != TORCH',
        'KNOWN = frozenset({"cupy", "torch"})\nok = framework not in KNOWN',
        'OPS = {"numpy": 1, "torch": 2}\nops = OPS[detect(x).framework]',
        'OPS = {"numpy": 1}\nops = OPS.get(framework_of_arr)',
        'match info.framework:\n    case "jax":\n        pass',
    ],
)
def test_the_rule_catches_each_form_of_branch(source):
    assert framework_branches(source)


@pytest.mark.parametrize(
    "source",
    [
        'set_backend("torch")',  # an executor's name
        'inst = builtin("numpy")',
        'BUILTIN = {"numpy": "x"}\ntarget = BUILTIN.get(name)',  # executors by name
        'if executor.name == "dask": pass',
        "ad = adapter_named(problem.framework)",  # asking the adapter is the point
        'msg = f"{problem.framework} arrays"',
        "same = info.framework != first.framework",  # frameworks compared with each other
        'if "torch.Tensor" in problem.memory: pass',  # a memory kind
    ],
)
def test_the_rule_leaves_executor_names_adapter_lookups_and_memory_kinds_alone(source):
    assert not framework_branches(source)
