"""A setting of the JAX integration read per trace: a block's value (a context variable), else an environment
variable, else the default; a value outside its choices is a typed error naming the variable.

A block's value is also part of JAX's trace cache key (:func:`jax.make_user_context`, where JAX has it), as
``jax_default_matmul_precision`` is: a jitted function called under another setting is traced again, and the
new setting takes effect there. The environment variable is read when a program is traced; JAX does not trace
again for a change of the variable alone."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from typing import Any

from ..errors import InvalidArgumentError, describe

__all__ = ["block_or_env", "setting_block", "trace_key"]


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


def trace_key() -> Any:
    """A new JAX user context (:func:`jax.make_user_context`, default None) for a setting's blocks: its value is
    part of the key of JAX's trace, lowering and compilation caches. None where JAX has no user contexts (or no
    JAX is installed): there a jitted function keeps what its first trace chose.

    Examples
    --------
    >>> key = trace_key()
    >>> key is None or key.value is None
    True
    """
    try:
        import jax
    except ImportError:
        return None
    make = getattr(jax, "make_user_context", None)
    return None if make is None else make(None)


@contextlib.contextmanager
def setting_block(block: contextvars.ContextVar, argument: str, value: object, choices,
                  key: Any = None) -> Iterator[None]:
    """``block`` set to ``value`` (one of ``choices``; else a typed error naming ``argument``) inside the block;
    ``key`` (a :func:`trace_key`, or None) holds ``value`` there too, so that JAX traces again under it."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidArgumentError(argument, f"one of {', '.join(choices)}", describe(value))
    token = block.set(value)
    try:
        with key(value) if key is not None else contextlib.nullcontext():
            yield
    finally:
        block.reset(token)
