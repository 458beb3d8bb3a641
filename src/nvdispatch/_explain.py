"""``nvdispatch.explain``: what a call would do (executor, strategy, steps), without running it."""

from __future__ import annotations

from ._dispatch import Explanation

__all__ = ["explain"]


def explain(*args, **kwargs) -> Explanation:
    """Explain a call without running it.

    ``explain(a, b, c=None, *, epilog=..., epilog_inputs=..., ...)`` explains ``matmul`` with those
    arguments; ``explain(func, *args, **kwargs)`` explains any nvdispatch function (e.g.
    ``explain(nvdispatch.fft.rfft, x, n=64)``).

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> e = nvdispatch.explain(np.ones((4, 3)), np.ones((3, 2)), epilog="RELU")
    >>> e.executor, e.strategy
    ('numpy', 'inplace')
    """
    if args and callable(args[0]) and hasattr(args[0], "__nvdispatch_explain__"):
        return args[0].__nvdispatch_explain__(*args[1:], **kwargs)
    from .linalg import explain_matmul

    return explain_matmul(*args, **kwargs)
