"""Where the Stockham exchanges put each element in shared memory: padding per exchange, by a bank model.

An exchange writes the outputs of one pass and reads the inputs of the next. Element ``i`` of an FFT goes to
slot ``pad(i) = i + (i >> shift) * slots`` of each (real, imaginary) plane. For every exchange the padding
with the fewest shared-memory wavefronts is chosen by counting, for each warp and each access, the largest
number of distinct addresses that fall into one bank (32 four-byte banks; eight-byte values in half-warp
phases over 16 bank pairs). The choice depends only on the size, the elements per thread and the element
width, so it is made once per configuration.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["Padding", "HERMITIAN_PADDING", "exchange_paddings", "plane_length"]

_BANKS = 32


@dataclass(frozen=True)
class Padding:
    """``slots`` padding slots after every ``2**shift`` elements."""

    shift: int
    slots: int

    def apply(self, index: int) -> int:
        return index + (index >> self.shift) * self.slots

    def expr(self, index_expr: str) -> str:
        """Generated-code expression of the padded slot of ``index_expr``."""
        scaled = f"(({index_expr}) >> {self.shift})" + ("" if self.slots == 1 else f" * {self.slots}")
        return f"({index_expr}) + {scaled}"

    def constant_offset(self, padded_base: str, max_residue: int, offset: int) -> str | None:
        """``pad(x + offset)`` as ``pad(x) + constant``, exact when ``x % 2**shift <= max_residue``."""
        group = 1 << self.shift
        if offset % group + max_residue < group:
            return f"{padded_base} + {self.apply(offset)}"
        return None


#: Padding of the c2r half-spectrum exchange (contiguous accesses).
HERMITIAN_PADDING = Padding(4, 1)
_CANDIDATES = tuple(Padding(s, k) for s in range(2, 9) for k in (1, 2, 4, 8, 16) if k < (1 << s))


def _wavefronts(addresses: list[int], itemsize: int) -> int:
    if itemsize <= 4:
        phases, banks = [addresses], _BANKS
    else:
        phases, banks = [addresses[:16], addresses[16:]], _BANKS // 2
    total = 0
    for phase in phases:
        if not phase:
            continue
        per_bank: dict[int, set[int]] = {}
        for a in phase:
            per_bank.setdefault(a % banks, set()).add(a)
        total += max(len(v) for v in per_bank.values())
    return total


def _exchange_cost(
    padding: Padding, size: int, ept: int, radices: list[int], index: int, itemsize: int
) -> int:
    threads = size // ept
    ffts_in_warp = max(1, _BANKS // threads)
    lanes = [(lane % threads, lane // threads) for lane in range(min(_BANKS, threads * ffts_in_warp))]
    span = 1
    for r in radices[:index]:
        span *= r
    radix, next_radix = radices[index], radices[index + 1]
    patterns = []
    for b in range(ept // radix):
        for r in range(radix):
            patterns.append(
                lambda t, b=b, r=r: (
                    ((t + b * threads) // span) * span * radix + (t + b * threads) % span + r * span
                )
            )
    for b in range(ept // next_radix):
        for r in range(next_radix):
            patterns.append(lambda t, b=b, r=r: t + b * threads + r * (size // next_radix))
    cost = 0
    for first in range(0, threads, _BANKS) if threads >= _BANKS else [0]:
        for pattern in patterns:
            if threads >= _BANKS:
                addresses = [padding.apply(pattern(first + lane)) for lane in range(_BANKS)]
            else:  # FFT y of the warp starts y * threads banks further (see shared_fft_stride)
                addresses = [y * threads + padding.apply(pattern(t)) for t, y in lanes]
            cost += _wavefronts(addresses, itemsize)
    return cost


@functools.lru_cache(maxsize=512)
def exchange_paddings(size: int, ept: int, radices: tuple[int, ...], itemsize: int) -> tuple[Padding, ...]:
    """The cheapest padding of each exchange (ties: less memory, then the usual one slot per 16)."""
    chosen = []
    for index in range(len(radices) - 1):

        def key(p: Padding, index=index) -> tuple[int, int, int]:
            cost = _exchange_cost(p, size, ept, list(radices), index, itemsize)
            return cost, p.apply(size - 1), p != HERMITIAN_PADDING

        chosen.append(min(_CANDIDATES, key=key))
    return tuple(chosen)


def plane_length(size: int, paddings: tuple[Padding, ...]) -> int:
    """Reals in one plane: room for the largest padded index of every exchange and the c2r exchange."""
    return max(p.apply(size - 1) for p in (*paddings, HERMITIAN_PADDING)) + 1
