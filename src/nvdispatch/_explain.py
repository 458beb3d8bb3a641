"""``nvdispatch.explain``: what a call would do (executor, strategy, steps), without running it."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, overload

from ._route import Explanation
from .linalg import explain_matmul

__all__ = ["explain"]


@overload
def explain(
    a: Any,
    b: Any,
    c: Any = None,
    *,
    alpha: Any = 1,
    beta: Any = None,
    epilog: Any = None,
    epilog_inputs: Mapping[str, Any] | None = None,
    options: Any = None,
    preferences: Any = None,
    stream: Any = None,
    quantization_scales: Any = None,
) -> Explanation: ...


@overload
def explain(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Explanation: ...


def explain(*args: Any, **kwargs: Any) -> Explanation:
    """Explain a call without running it: the executor and strategy it takes, the plan's steps, and which
    executors declined and why.

    ``explain(a, b, c=None, *, alpha=1, beta=None, epilog=None, epilog_inputs=None, options=None,
    preferences=None, stream=None, quantization_scales=None)`` explains :func:`nvdispatch.matmul` with those arguments;
    ``explain(func, /, *args, **kwargs)`` explains any nvdispatch function called as ``func(*args, **kwargs)``
    (e.g. ``explain(nvdispatch.fft.rfft, x, n=64)``).

    Returns
    -------
    Explanation
        ``operation``, ``executor``, ``strategy``, ``steps``, ``declined`` (``(executor, reason)`` pairs),
        ``strategies`` (all the executor could run), ``cached`` (whether the plan was in the cache);
        ``str()`` of it is a readable report.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> e = nvdispatch.explain(np.ones((4, 3)), np.ones((3, 2)), epilog="RELU")
    >>> e.executor, e.strategy
    ('numpy', 'inplace')
    >>> nvdispatch.explain(nvdispatch.fft.rfft, np.ones(64)).operation
    'rfft'
    """
    if args and callable(args[0]) and hasattr(args[0], "__nvdispatch_explain__"):
        return args[0].__nvdispatch_explain__(*args[1:], **kwargs)

    return explain_matmul(*args, **kwargs)


# help() and inspect show the matmul form's parameters (the common one) rather than (*args, **kwargs)
explain.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        inspect.Parameter("a_or_func", inspect.Parameter.POSITIONAL_ONLY, annotation="Array | Callable[..., Any]"),
        inspect.Parameter("b", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation="Array | None"),
        inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation="Array | None"),
        *(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
            for name, default, annotation in (
                ("alpha", 1, "Any"),
                ("beta", None, "Any"),
                ("epilog", None, "Epilog | str | None"),
                ("epilog_inputs", None, "Mapping[str, Array] | None"),
                ("options", None, "MatmulOptions | Mapping[str, Any] | None"),
                ("preferences", None, "MatmulPlanPreferences | Mapping[str, Any] | None"),
                ("stream", None, "Any"),
                ("quantization_scales", None, "MatmulQuantizationScales | Mapping[str, Any] | None"),
            )
        ),
    ],
    return_annotation="Explanation",
)
