"""A JAX primitive of several results that is linear in some operands: the tangents of a staged call.

Its value, abstract evaluation, forward-mode rule, transpose and batching rule are the caller's; the lowering
evaluates the value as JAX operations (the staged products inside it lower as their own calls)."""

from __future__ import annotations

from collections.abc import Callable

from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir


def linear_primitive(
    name: str, values: Callable, abstract: Callable, jvp: Callable, transpose: Callable, batched: Callable
) -> Primitive:
    """The registered primitive ``name`` (``multiple_results``) with these rules."""
    p = Primitive(name)
    p.multiple_results = True
    p.def_impl(values)
    p.def_abstract_eval(abstract)
    mlir.register_lowering(p, mlir.lower_fun(values, multiple_results=True))
    ad.primitive_jvps[p] = jvp
    ad.primitive_transposes[p] = transpose
    batching.primitive_batchers[p] = batched
    return p
