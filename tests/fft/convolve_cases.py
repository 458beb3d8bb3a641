"""The GPU convolution tests' cases, shared with the CPU test that checks each one is offered by the route's
rules (``test_convolve_offers.py``): a case the rules refuse fails there, on the CPU, not on a GPU.

``CASES``: ``(strategy, rows, n, x dtype, filter rows ("one" | "each"))``, few distinct kernels (each compiles
for seconds). ``BEYOND_THE_DEVICE_ENGINE``: ``(rows, n, x dtype, filter rows)`` of lengths the device engine has
no Block FFT for in their precision (double precision stops at 4096 points): the GPU test runs every strategy the
route offers there.
"""

from __future__ import annotations

CASES = [
    ("device-fused", 64, 1024, "complex64", "one"),
    ("device-fused", 17, 64, "float32", "one"),
    ("device-fused", 9, 16384, "complex64", "one"),  # a block beyond 48 KiB of shared memory
    ("device-fused", 5, 4096, "float64", "each"),  # the longest double-precision block (64 KiB), a row per signal
    ("device-fused", 3, 4096, "complex128", "one"),
    ("four-step", 5, 2048, "complex64", "one"),  # 2 x 1024: a thread per column
    ("four-step", 3, 65536, "complex64", "one"),  # 64 x 1024: tiles of columns
    ("four-step", 3, 65536, "float32", "one"),  # two real rows a signal, an odd batch
    ("four-step", 3, 12288, "float64", "one"),  # 12 x 1024
    ("four-step", 2, 12288, "complex128", "one"),
    ("four-step", 2, 1 << 20, "complex64", "one"),  # 1024 x 1024
    ("four-step", 1, 1 << 20, "float32", "one"),
    ("unfused", 16, 1000, "complex64", "each"),
    ("unfused", 9, 4096, "float32", "one"),
    ("unfused", 4, 65536, "complex128", "one"),
    ("unfused", 5, 2048, "float64", "each"),
    ("cufft-lto", 16, 1024, "complex64", "one"),
    ("cufft-lto", 7, 16384, "complex64", "each"),
    ("cufft-lto-load", 7, 16384, "float32", "each"),
    ("cufft-lto-load", 16, 1024, "complex64", "each"),
    ("cufft-lto-load", 7, 16384, "float32", "one"),
]

BEYOND_THE_DEVICE_ENGINE = [
    (5, 8192, "float64", "each"),  # was a device-fused case before double-precision blocks stopped at 4096
    (3, 8192, "complex128", "each"),
]
