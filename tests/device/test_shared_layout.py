"""The bank model behind the per-exchange shared-memory padding (pure Python, no kernels)."""

from __future__ import annotations

import pytest

from nvdispatch.device.fft_config import radix_plan
from nvdispatch.device.shared_layout import HERMITIAN_PADDING, Padding, _exchange_cost, exchange_paddings


def test_padding_arithmetic_and_constant_offsets():
    p = Padding(shift=8, slots=16)
    assert p.apply(255) == 255 and p.apply(256) == 272
    assert eval(p.expr("i"), {"i": 300}) == p.apply(300)
    assert p.constant_offset("base", max_residue=31, offset=256) == "base + 272"
    assert p.constant_offset("base", max_residue=255, offset=1) is None


@pytest.mark.parametrize("size,ept", [(64, 8), (128, 16), (256, 16), (512, 8), (1024, 16), (4096, 16)])
def test_power_of_two_exchanges_are_conflict_free(size, ept):
    radices = tuple(radix_plan(size, ept))
    threads = size // ept
    warps = max(1, threads // 32)
    for index, padding in enumerate(exchange_paddings(size, ept, radices, 4)):
        accesses = ept // radices[index] * radices[index] + ept // radices[index + 1] * radices[index + 1]
        ideal = accesses * warps
        assert _exchange_cost(padding, size, ept, list(radices), index, 4) == ideal
        assert _exchange_cost(padding, size, ept, list(radices), index, 4) <= _exchange_cost(
            HERMITIAN_PADDING, size, ept, list(radices), index, 4
        )
