"""A setting of the JAX integration read per trace: a block's value (a context variable), else an environment
variable, else the default; a value outside its choices is a typed error naming the variable."""

from __future__ import annotations

import contextvars
import os

from ..errors import InvalidArgumentError

__all__ = ["block_or_env"]


def block_or_env(block: contextvars.ContextVar, env: str, default: str, choices) -> str:
    """``block``'s value where a block set it, else ``$env`` (stripped, lower case; empty: ``default``).

    Examples
    --------
    >>> import contextvars
    >>> var = contextvars.ContextVar("example", default=None)
    >>> block_or_env(var, "NVDISPATCH_EXAMPLE_UNSET", "auto", ("auto", "off"))
    'auto'
    """
    asked = block.get()
    if asked is not None:
        return asked
    value = os.environ.get(env, default).strip().lower() or default
    if value not in choices:
        raise InvalidArgumentError(env, f"one of {', '.join(choices)}", repr(value))
    return value
