"""Generate the Python source of one block GEMM ``c = alpha * a @ b + beta * c`` on shared-memory tiles.

Thread ``tid`` of the block owns the C elements ``(ri + u * tr, cj + v * tc)`` for ``ri = tid % tr``,
``cj = tid // tr``: consecutive threads touch consecutive rows, so column-major A and C are read without bank
conflicts and B is broadcast. The k loop keeps a ``tm x tn`` accumulator tile in registers; every index and
trip count is a constant of the configuration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GemmLayout", "choose_layout", "generate_gemm_source", "FUNCTION_NAME"]

FUNCTION_NAME = "gemm_impl"
#: Statements of the k loop beyond which it is not unrolled.
UNROLL_LIMIT = 4096


@dataclass(frozen=True)
class GemmLayout:
    """How the block's threads tile C: ``tr x tc`` thread grid, ``tm x tn`` elements per thread."""

    threads: int
    tr: int
    tc: int

    def tile(self, m: int, n: int) -> tuple[int, int]:
        return math.ceil(m / self.tr), math.ceil(n / self.tc)


def choose_layout(m: int, n: int, threads: int) -> GemmLayout:
    """The thread grid that needs the fewest shared-memory loads per multiply-add."""
    best, best_score = None, None
    for tr in range(1, threads + 1):
        if threads % tr:
            continue
        tc = threads // tr
        tm, tn = math.ceil(m / tr), math.ceil(n / tc)
        idle = max(0, tr - m) * tc + max(0, tc - n) * tr
        score = ((tm + tn) / (tm * tn), idle, -min(tr, 32))
        if best_score is None or score < best_score:
            best, best_score = GemmLayout(threads, tr, tc), score
    assert best is not None
    return best


def generate_gemm_source(
    m: int,
    n: int,
    k: int,
    layout: GemmLayout,
    arrangement: tuple[str, str, str],
    block_dim: tuple[int, int, int],
    real: bool = True,
    checks: tuple[str, ...] = (),
) -> str:
    """Source of ``gemm_impl(_self, alpha, a, b, beta, c)`` (uses globals ``VT``, ``ZERO`` and ``IDX``);
    ``checks`` are statements run first (see :mod:`.launch_checks`)."""
    tm, tn = layout.tile(m, n)
    tr, tc = layout.tr, layout.tc

    def at(name: str, order: str, row: str, col: str) -> str:
        # Unsigned indices: Numba then emits no negative-index wraparound code.
        row, col = f"IDX({row})", f"IDX({col})"
        return f"{name}[{row}, {col}]" if order == "row_major" else f"{name}[{col}, {row}]"

    lines = [f"def {FUNCTION_NAME}(_self, alpha, a, b, beta, c):"]
    emit = lines.append
    for statement in checks:
        emit("    " + statement)
    bx, by = block_dim[0], block_dim[1]
    emit(f"    tid = cuda.threadIdx.x + cuda.threadIdx.y * {bx} + cuda.threadIdx.z * {bx * by}")
    emit(f"    ri = tid % {tr}")
    emit(f"    cj = tid // {tr}")
    rows = [f"ri + {u * tr}" for u in range(tm)]
    cols = [f"cj + {v * tc}" for v in range(tn)]
    row_ok = [u * tr + tr <= m for u in range(tm)]  # statically in range for every thread
    col_ok = [v * tc + tc <= n for v in range(tn)]
    for u in range(tm):
        for v in range(tn):
            emit(f"    acc_{u}_{v} = ZERO")
    # Small k: unroll completely (constant indices, loads scheduled early); large k: a counted loop.
    unrolled = k * (tm + tn + tm * tn) <= UNROLL_LIMIT
    steps = [str(p) for p in range(k)] if unrolled else ["p"]
    indent = "    " if unrolled else "        "
    if not unrolled:
        emit(f"    for p in range({k}):")
    for p in steps:
        for u in range(tm):
            guard = "" if row_ok[u] else f" if {rows[u]} < {m} else ZERO"
            row = rows[u] if row_ok[u] else f"min({rows[u]}, {m - 1})"
            emit(f"{indent}a_{u} = {at('a', arrangement[0], row, p)}{guard}")
        for v in range(tn):
            guard = "" if col_ok[v] else f" if {cols[v]} < {n} else ZERO"
            col = cols[v] if col_ok[v] else f"min({cols[v]}, {n - 1})"
            emit(f"{indent}b_{v} = {at('b', arrangement[1], p, col)}{guard}")
        for u in range(tm):
            for v in range(tn):
                update = f"cuda.fma(a_{u}, b_{v}, acc_{u}_{v})" if real else f"acc_{u}_{v} + a_{u} * b_{v}"
                emit(f"{indent}acc_{u}_{v} = {update}")
    emit("    al = VT(alpha)")
    emit("    be = VT(beta)")
    for u in range(tm):
        for v in range(tn):
            target = at("c", arrangement[2], rows[u], cols[v])
            conditions = [f"{rows[u]} < {m}"] * (not row_ok[u]) + [f"{cols[v]} < {n}"] * (not col_ok[v])
            indent = "    "
            if conditions:
                emit(f"    if {' and '.join(conditions)}:")
                indent = "        "
            emit(f"{indent}{target} = al * acc_{u}_{v} + be * {target}")
    emit("    return")
    return "\n".join(lines) + "\n"
