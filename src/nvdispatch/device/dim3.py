"""The three-component launch dimension returned as ``block_dim``."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Dim3"]


class Dim3(NamedTuple):
    """A CUDA ``dim3``: usable directly as the block part of a Numba launch configuration.

    Examples
    --------
    >>> from nvdispatch.device import Dim3
    >>> Dim3(64, 2, 1)
    Dim3(x=64, y=2, z=1)
    >>> Dim3(64, 2).count
    128
    """

    x: int
    y: int = 1
    z: int = 1

    @property
    def count(self) -> int:
        """Number of threads described by this dimension."""
        return self.x * self.y * self.z
