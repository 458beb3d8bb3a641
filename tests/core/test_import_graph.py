"""The package's module graph, read from the source with ``ast``: imports point down the layers, never round.

* **No import cycles**, imports inside functions included (DESIGN.md, "Layers"): every ``import`` and
  ``from ... import`` of an nvdispatch module anywhere in a module, relative ones resolved as Python does. A name
  imported from a package that is a submodule of it (``from . import linalg``) is that module; any other name
  (``from . import errors_helper_function``) is the package itself. The compiled extension (``_hotpath``) is a
  leaf: it imports nothing of ours. A cycle is printed as the chain of imports closing it, each with its line.
* **No private names across modules**: a module does not import another module's ``_private`` name (``from .a
  import _x``) nor reach for one through a module (``a._x``), except from its own package's ``_internal`` module,
  the place a package shares its helpers.
"""

from __future__ import annotations

import ast
import importlib.machinery
import pathlib
from collections import deque

import nvdispatch

SRC = pathlib.Path(nvdispatch.__file__).parent
PACKAGE = "nvdispatch"


def _modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> source file, for every ``.py`` file of the package."""
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = (PACKAGE, *path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _extensions() -> set[str]:
    """Dotted names of the compiled extensions: built ones, and those whose C source is in the tree (so an
    unbuilt tree reads the same)."""
    found = set()
    for path in SRC.rglob("*"):
        stem = None
        if path.suffix == ".c":
            stem = path.stem
        else:
            stem = next((path.name[: -len(s)] for s in importlib.machinery.EXTENSION_SUFFIXES if path.name.endswith(s)), None)
        if stem:
            found.add(".".join((PACKAGE, *path.parent.relative_to(SRC).parts, stem)))
    return found


MODULES = _modules()
EXTENSIONS = _extensions()


class Import:
    """One imported name: the module it comes from and the name (None: the module itself is imported)."""

    def __init__(self, module: str, name: str | None, line: int):
        self.module, self.name, self.line = module, name, line


def _imports(module: str, tree: ast.Module) -> list[Import]:
    """Every nvdispatch import in ``tree`` (the source of ``module``), at any depth, resolved to absolute names."""
    is_package = MODULES[module].name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [Import(a.name, None, node.lineno) for a in node.names if _ours(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if _ours(base):
                out += [Import(base, a.name, node.lineno) for a in node.names]
    return out


def _ours(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


def _target(imp: Import) -> str:
    """The module an import depends on: the submodule a name is, else the module it is taken from (for a dotted
    name not among our modules, its nearest enclosing one)."""
    if imp.name is not None:
        full = f"{imp.module}.{imp.name}"
        if full in MODULES or full in EXTENSIONS:
            return full
    name = imp.module
    while name not in MODULES and name not in EXTENSIONS and "." in name:
        name = name.rpartition(".")[0]
    return name


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: line of the first such import}; extensions are leaves."""
    graph: dict[str, dict[str, int]] = {m: {} for m in (*MODULES, *EXTENSIONS)}
    for module, path in MODULES.items():
        for imp in _imports(module, ast.parse(path.read_text(), str(path))):
            target = _target(imp)
            if target != module and target in graph:
                graph[module].setdefault(target, imp.line)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return components


def shortest_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """A shortest cycle through the first module of ``component`` (breadth first), closing on that module."""
    members, start = set(component), component[0]
    came_from = {start: None}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in graph[v]:
            if w == start:
                path = [v]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if w in members and w not in came_from:
                came_from[w] = v
                queue.append(w)
    return component


def describe_cycle(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    def path(m):
        return MODULES[m].relative_to(SRC.parent) if m in MODULES else m

    return "\n".join(f"    {path(a)}:{graph[a][b]}  imports {b}" for a, b in zip(cycle, cycle[1:]))


def test_the_graph_sees_every_module_and_imports_inside_functions():
    graph = import_graph()
    assert "nvdispatch._route" in graph and "nvdispatch.fft._route" in graph
    assert any(m.endswith("._hotpath") for m in EXTENSIONS)  # its C source is in the tree
    tree = ast.parse("def f():\n    from ..errors import describe\n    from . import runtime, view\n")
    resolved = [_target(i) for i in _imports("nvdispatch._cuda.arrays", tree)]
    # inside a function: counted; a submodule: itself; another name: the module it is taken from
    assert resolved == ["nvdispatch.errors", "nvdispatch._cuda.runtime", "nvdispatch._cuda"]
    tree = ast.parse("from . import _hotpath\n")
    assert [_target(i) for i in _imports("nvdispatch._compiled", tree)] == ["nvdispatch._hotpath"]  # a leaf


def test_no_import_cycles():
    graph = import_graph()
    cycles = [shortest_cycle(graph, c) for c in strongly_connected(graph)]
    report = "\n".join(
        f"  a cycle among {len(c)} modules ({', '.join(c[:6])}{', ...' if len(c) > 6 else ''}), for example:\n"
        + describe_cycle(graph, cyc)
        for c, cyc in zip(strongly_connected(graph), cycles)
    )
    assert not cycles, f"import cycles (imports inside functions count):\n{report}"


def test_cycle_detection_reports_a_cycle():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}}
    (component,) = strongly_connected(graph)
    assert component == ["a", "b", "c"]
    assert shortest_cycle(graph, component) == ["a", "b", "c", "a"]


# -- private names ---------------------------------------------------------------------------------------------
def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _shares_with(importer: str, module: str) -> bool:
    """Whether ``importer`` may take ``module``'s private names: ``module`` is the ``_internal`` module of a
    package ``importer`` belongs to."""
    package, _, last = module.rpartition(".")
    return last == "_internal" and importer.startswith(package + ".")


def private_imports(module: str, source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for each private name of another nvdispatch module that ``source`` (of ``module``) uses."""
    tree = ast.parse(source)
    found = []
    bound: dict[str, str] = {}  # local name -> the nvdispatch module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _ours(a.name):
                    bound[a.asname or a.name.partition(".")[0]] = a.name if a.asname else a.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom):
            for imp in _imports(module, ast.Module(body=[node], type_ignores=[])):
                full = f"{imp.module}.{imp.name}"
                alias = next(a.asname or a.name for a in node.names if a.name == imp.name)
                if full in MODULES or full in EXTENSIONS:
                    bound[alias] = full
                elif _private(imp.name) and imp.module != module and not _shares_with(module, imp.module):
                    found.append((node.lineno, f"from {imp.module} import {imp.name}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = _dotted(node.value, bound)
            if owner is None or owner == module or f"{owner}.{node.attr}" in MODULES:
                continue
            if f"{owner}.{node.attr}" in EXTENSIONS or _shares_with(module, owner):
                continue
            found.append((node.lineno, f"{owner}.{node.attr}"))
    return sorted(set(found))


def _dotted(node: ast.AST, bound: dict[str, str]) -> str | None:
    """The nvdispatch module an expression names (``cufft``, ``nvdispatch._cuda.cufft``), or None."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _dotted(node.value, bound)
        if owner is not None and f"{owner}.{node.attr}" in MODULES:
            return f"{owner}.{node.attr}"
    return None


def test_no_private_names_across_modules():
    offences = [
        f"  {path.relative_to(SRC.parent)}:{line}: {what}"
        for module, path in MODULES.items()
        for line, what in private_imports(module, path.read_text())
    ]
    assert not offences, (
        "private names used across modules (make them public where they are part of the module's interface, or "
        "share them through the package's _internal module):\n" + "\n".join(offences)
    )


def test_private_name_rule():
    source = (
        "from . import cufft\n"
        "from .arrays import _span, view\n"
        "from ._internal import _shared\n"
        "import nvdispatch._cuda.runtime as rt\n"
        "def f():\n"
        "    from ..executors.cuda_fft import _layout\n"
        "    return cufft._lib(), rt._cudart, cufft.load, _span\n"
    )
    found = [what for _, what in private_imports("nvdispatch._cuda.cufft_callbacks", source)]
    assert found == [
        "from nvdispatch._cuda.arrays import _span",
        "from nvdispatch.executors.cuda_fft import _layout",
        "nvdispatch._cuda.cufft._lib",
        "nvdispatch._cuda.runtime._cudart",
    ]
    assert not private_imports("nvdispatch.fft._route", "from ._internal import _x\nfrom .._internal import _y\n")
    assert private_imports("nvdispatch.fft._route", "from .._cuda._internal import _x\n")  # another package's
