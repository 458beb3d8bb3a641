"""The plan of one problem of the one-pass activation backward (:mod:`nvdispatch.device.activation_grad`: a
hidden layer's ``dz = g * act'(...)`` and its bias gradient, two Numba kernels) on device memory: its launches
described and prepared once (:class:`~nvdispatch.executors.cuda_numba_launch.StepLauncher`: ``cuLaunchKernel``
with the parameters packed when the plan is made, else Numba's launch of the same steps), so a call hands the
operands' device pointers and the stream only. Launches only, on the caller's stream: a call can be captured into
a CUDA graph.

A problem is its form (``kind``), its ``(m, n)``, the mask's shape (``"relu_bits"``) and the GPU; operands are
bfloat16 bit patterns as the kernels take them (see the device module), given by address.

Examples
--------
>>> key("relu", 128, 64, None, 0)
('activation_grad', 'relu', 128, 64, None, 0)
"""

from __future__ import annotations

import logging
import warnings

from .cuda_numba_launch import StepLauncher

__all__ = ["ActivationGradPlan", "key"]

_log = logging.getLogger("nvdispatch")


def key(kind: str, m: int, n: int, saved_shape: tuple[int, ...] | None, device_index: int) -> tuple:
    """The plan-cache key of a problem (``saved_shape``: the mask's, for ``"relu_bits"``; else None)."""
    return ("activation_grad", kind, m, n, saved_shape, device_index)


class ActivationGradPlan:
    """``plan(stream, g, saved, dz, partials, sums)``: queue the problem's two launches on ``stream`` (a raw
    handle) with the operands at these device addresses (``saved``/``dz`` unread for ``"none"``: pass ``g``'s).
    ``partial_rows``: the rows of the float32 ``partials`` scratch (by ``n``). The Plan protocol's
    ``release``, ``strategy``, ``steps``; nothing to free."""

    needs_release = False
    workspace_bytes = 0
    strategy = "one-pass"

    def __init__(self, kind: str, m: int, n: int, saved_shape: tuple[int, ...] | None, device_index: int,
                 several: bool):  # fmt: skip
        from ..device import activation_grad as kernels

        self.kind, self.shape, self.saved_shape = kind, (m, n), saved_shape
        self.device_index = device_index
        self.partial_rows = kernels.launch_shape(m, n)[2]
        what = f"fused MLP backward one-pass {kind} ({m}, {n})"
        self.launcher = StepLauncher(
            kernels.steps(kind, m, n, saved_shape), len(kernels.OPERANDS), device_index, several, what
        )
        derivative = "column sums only" if kind == "none" else f"dz = g * {kind}'"
        self.steps = (
            f"{derivative} and per-block column sums ({self.partial_rows} partial rows, float32), then the partial "
            "rows added in a fixed order into the bias gradient (bfloat16): two Numba kernels on the caller's stream",
            self.launcher.how,
        )

    @property
    def prepared(self) -> bool:
        """Whether the launches go through ``cuLaunchKernel`` (else through Numba)."""
        return self.launcher.prepared

    def __call__(self, stream: int, g: int, saved: int, dz: int, partials: int, sums: int) -> None:
        if self.launcher.prepared:
            self.launcher(stream, (g, saved, dz, partials, sums))
            return
        from numba.core.errors import NumbaPerformanceWarning

        with warnings.catch_warnings():
            # Numba warns of a grid smaller than twice the SM count (the column sums' always is): not the user's
            warnings.simplefilter("ignore", NumbaPerformanceWarning)
            self.launcher(stream, (g, saved, dz, partials, sums))

    def release(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<ActivationGradPlan {self.kind} {self.shape}: {self.launcher.how}>"
