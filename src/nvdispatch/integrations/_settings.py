"""A setting of the JAX integration read per trace: a block's value (a context variable), else an environment
variable, else the default; a value outside its choices is a typed error naming the variable."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

from ..errors import InvalidArgumentError, describe

__all__ = ["block_or_env", "setting_block"]


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


@contextlib.contextmanager
def setting_block(block: contextvars.ContextVar, argument: str, value: object, choices) -> Iterator[None]:
    """``block`` set to ``value`` (one of ``choices``; else a typed error naming ``argument``) inside the block."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidArgumentError(argument, f"one of {', '.join(choices)}", describe(value))
    token = block.set(value)
    try:
        yield
    finally:
        block.reset(token)
