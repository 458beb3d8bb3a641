"""``api_from_all``: a Sphinx directive that documents every name in a module's ``__all__``.

``.. api-from-all:: nvdispatch.fft`` (in a reStructuredText page) expands to one autodoc entry per public name
(``autofunction``, ``autoclass``, ``autodata`` or, for a submodule, a link to its page), in ``__all__``'s order,
so the reference follows the code without a list to keep up to date. ``:skip:`` names entries documented
elsewhere.
"""

from __future__ import annotations

import importlib
import inspect
import types

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles


def _entry(module: str, name: str, obj) -> list[str]:
    """reStructuredText documenting ``module.name``."""
    target = f"{module}.{name}"
    if isinstance(obj, types.ModuleType):
        return [f"``{target}``: see :mod:`{obj.__name__}`.", ""]
    if inspect.isclass(obj):
        return [f".. autoclass:: {target}", ""]
    if callable(obj):
        return [f".. autofunction:: {target}", ""]
    return [f".. autodata:: {target}", "   :annotation:", ""]


class ApiFromAll(SphinxDirective):
    required_arguments = 1
    option_spec = {"skip": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        module_name = self.arguments[0]
        module = importlib.import_module(module_name)
        skip = set((self.options.get("skip") or "").split())
        lines: list[str] = []
        for name in module.__all__:
            if name not in skip:
                lines += _entry(module_name, name, getattr(module, name))
        container = nodes.container()
        content = StringList(lines, source=self.get_source_info()[0])
        nested_parse_with_titles(self.state, content, container)
        return container.children


def setup(app):
    app.add_directive("api-from-all", ApiFromAll)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
