"""What runs inside the Dask executor's tasks, on the workers: nvdispatch's own route on each block, under
the backend state of the call that built the graph.

Everything here is a module-level function or a small frozen dataclass, so graphs pickle by reference and
carry values only: the caller's backend state (:class:`CarriedState`), the call's scalars and options. No
plan, handle or executor instance enters a graph: each worker finds its plans in its own plan cache.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .. import fft
from .._backends import BackendState, Candidate, get_state, registry, resolve_backend, set_state
from ..errors import BackendError
from ..linalg import matmul
from . import BUILTIN, builtin

__all__ = [
    "CarriedState",
    "carry_state",
    "applied",
    "MatmulBlockCall",
    "FFTBlockCall",
    "matmul_block",
    "fft_block",
    "concat_blocks",
    "add_blocks",
    "add_blocks_wide",
    "cast_to",
    "pick",
    "pick_aux",
    "freq_block",
]

#: the executor whose tasks these are: never carried into them (its blocks are plain arrays)
_SELF = "dask"


# -- the caller's backend state, carried as a value -------------------------------------------------------------
@dataclass(frozen=True)
class CarriedState:
    """The caller's backend choices, picklable: ``(backend, coerce, only)`` outermost first, and the
    skipped backends. Built-in executors travel by name; user executors as themselves (they must pickle)."""

    chosen: tuple[tuple[Any, bool, bool], ...] = ()
    skipped: tuple[Any, ...] = ()


def _ref(executor: Any) -> Any:
    name = getattr(executor, "name", None)
    return name if name in BUILTIN and builtin(name) is executor else executor


def carry_state() -> CarriedState:
    """The calling context's backend state, without the Dask executor itself, as a picklable value.

    The caller's ``set_backend``/``skip_backend`` contexts (``nvdispatch.get_state()``) come first, then the
    process's global and registered backends (in the order the registry tries them), so a worker resolves
    block calls as the caller would have, whatever its own global state.
    """
    # the order a call tries them in (contexts innermost first, then the global and registered backends),
    # reversed: a carried state lists its contexts outermost first, so the process-wide ones go outermost
    chosen = [(c.executor, c.coerce, c.only) for c in reversed(registry.order())]
    state = get_state()
    kept = tuple((_ref(e), co, on) for e, co, on in chosen if getattr(e, "name", None) != _SELF)
    skipped = tuple(_ref(e) for e in state.skipped if getattr(e, "name", None) != _SELF)
    users = [r for r, _, _ in kept if not isinstance(r, str)] + [r for r in skipped if not isinstance(r, str)]
    if users:
        try:
            pickle.dumps(users)
        except Exception as exc:  # noqa: BLE001 - whatever stops pickling stops Dask too
            raise BackendError(
                "backend",
                "backends that can be carried into Dask tasks (picklable executors)",
                f"{users[0]!r}, which does not pickle ({exc})",
                "register the executor by name on the workers, or make it picklable",
            ) from None
    return CarriedState(kept, skipped)


@contextlib.contextmanager
def applied(state: CarriedState) -> Iterator[None]:
    """Run the body under ``state`` (``nvdispatch.set_state`` of the caller's backends, resolved here)."""
    if not state.chosen and not state.skipped:
        yield
        return

    local = tuple(Candidate(resolve_backend(ref), coerce, only) for ref, coerce, only in state.chosen)
    skipped = tuple(resolve_backend(ref) for ref in state.skipped)
    with set_state(BackendState(local, skipped)):
        yield


# -- block calls -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MatmulBlockCall:
    """One block's ``nvdispatch.matmul`` arguments other than arrays."""

    alpha: Any
    beta: Any
    epilog: Any
    options: Any
    state: CarriedState


def matmul_block(call: MatmulBlockCall, a, b, c=None, bias=None, relu_aux=None, gelu_aux=None):
    """``nvdispatch.matmul`` on one block (array, or ``(array, aux)`` for epilogs with outputs)."""
    inputs = {k: v for k, v in (("bias", bias), ("relu_aux", relu_aux), ("gelu_aux", gelu_aux)) if v is not None}
    with applied(call.state):
        return matmul(
            a,
            b,
            c,
            alpha=call.alpha,
            beta=call.beta if c is not None else None,
            epilog=call.epilog,
            epilog_inputs=inputs or None,
            options=call.options,
        )


@dataclass(frozen=True)
class FFTBlockCall:
    """One block's ``nvdispatch.fft.<func>`` call: the function name and its keyword arguments."""

    func: str
    kwargs: tuple[tuple[str, Any], ...]
    state: CarriedState


def fft_block(call: FFTBlockCall, x):
    """``nvdispatch.fft.<func>`` on one block whose transformed axes are whole."""
    with applied(call.state):
        return getattr(fft, call.func)(x, **dict(call.kwargs))


def concat_blocks(axis: int, *blocks):
    """The blocks joined along ``axis`` (a K panel), in their own namespace; one block is returned as it is."""
    if len(blocks) == 1:
        return blocks[0]
    import array_api_compat

    return array_api_compat.array_namespace(*blocks).concat(blocks, axis=axis)


def add_blocks(*parts):
    """The sum of partial blocks (one node of a tree reduction); the inputs are left as they are."""
    total = parts[0] + parts[1] if len(parts) > 1 else parts[0]
    for p in parts[2:]:
        total += p
    return total


#: dtypes whose reductions accumulate in float32 (as every executor's, see ``nvdispatch._epilog``)
_HALF = ("float16", "bfloat16")


def _wide(x):
    """``x`` in float32 where it is float16/bfloat16, else ``x`` itself."""
    if str(x.dtype).rsplit(".", 1)[-1] not in _HALF:
        return x
    import array_api_compat

    xp = array_api_compat.array_namespace(x)
    return xp.astype(x, xp.float32)


def add_blocks_wide(*parts):
    """:func:`add_blocks` accumulating float16/bfloat16 partials in float32 (the sum comes back float32; the
    reduction's last node casts it once with :func:`cast_to`)."""
    total = _wide(parts[0])
    total = total + _wide(parts[1]) if len(parts) > 1 else total
    for p in parts[2:]:
        total += _wide(p)
    return total


def cast_to(x, dtype: str):
    """``x`` as the dtype named ``dtype`` of its own namespace (``x`` itself where it already is)."""
    import array_api_compat

    xp = array_api_compat.array_namespace(x)
    target = getattr(xp, dtype)
    return x if x.dtype == target else xp.astype(x, target)


def pick(result, index: int):
    return result[index]


def pick_aux(result, name: str):
    return result[1][name]


def freq_block(start: int, stop: int, n: int, d: float, real: bool, meta):
    """Entries ``start:stop`` of ``fftfreq(n, d)`` (``rfftfreq`` when ``real``) as an array like ``meta``."""
    import array_api_compat
    import numpy as np

    k = np.arange(start, stop, dtype=np.float64)
    if not real:
        k = np.where(k <= (n - 1) // 2, k, k - n)
    values = k / (n * float(d))
    xp = array_api_compat.array_namespace(meta)
    return xp.asarray(
        values.astype(str(meta.dtype).removeprefix("torch.")), dtype=meta.dtype, device=array_api_compat.device(meta)
    )
