"""Sphinx configuration of nvdispatch's documentation site.

The source directory is the repository root, so that the Markdown files users read on the repository (README,
CONTRIBUTING, CHANGELOG, benchmarks/README, conformance/README) are the site's pages as they are, their links
between each other intact; ``include_patterns`` keeps everything else out. The API reference (``docs/api/``)
lists each public module's ``__all__`` through the ``api_from_all`` directive (``docs/_ext``), so it follows the
code. Build it (the test suite does, tests/release/test_docs.py) with::

    python -m sphinx -W --keep-going -c docs . docs/_build/html          # the site
    python -m sphinx -W -b doctest -c docs . docs/_build/doctest          # the examples in it
"""

from __future__ import annotations

import ctypes
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "_ext"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))


def _has_gpu() -> bool:
    try:
        return ctypes.CDLL("libcuda.so.1").cuInit(0) == 0
    except OSError:
        return False


if not _has_gpu():  # nvdispatch.device's examples then run under Numba's CUDA simulator
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import nvdispatch  # noqa: E402

project = "nvdispatch"
author = "The nvdispatch developers"
copyright = "the nvdispatch developers, Apache-2.0"
release = version = nvdispatch.__version__

root_doc = "docs/index"
include_patterns = [
    "README.md",
    "CONTRIBUTING.md",
    "CHANGELOG.md",
    "benchmarks/README.md",
    "conformance/README.md",
    "docs/**",
]
exclude_patterns = ["docs/_build/**", "docs/_ext/**"]

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
    "myst_parser",
    "api_from_all",
]

# Markdown (MyST): headings get anchors as GitHub makes them, so the README's "#the-plan-cache" links work
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}

# docstrings are NumPy style (napoleon reads them); signatures show the type hints
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}

# the doctest builder runs every ">>>" example of the pages, the docstrings included
doctest_global_setup = "import numpy as np\nimport nvdispatch"

html_theme = "furo"
html_title = f"nvdispatch {release}"
html_show_sourcelink = False
