"""The version of nvdispatch (one place: the package and the tunings files it writes read it here)."""

__version__ = "0.1.0"
