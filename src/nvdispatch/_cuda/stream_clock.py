"""Timing work queued on one stream: the clock :class:`~nvdispatch.executors.timed_choice.TimedChoicePlan`
times candidate plans with (CUDA events), and whether a stream can be timed now."""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable
from typing import Any

from . import runtime

__all__ = ["StreamClock", "capturing", "capture_query_address", "clock_for"]


class StreamClock:
    """``sample(run, calls)``: the seconds the device takes for ``calls`` back-to-back ``run()`` calls that
    queue work on ``stream`` (CUDA events around them; waits for the stop event)."""

    def __init__(self, stream: int):
        self.stream = stream

    def sample(self, run: Callable[[], Any], calls: int) -> float:
        with runtime.EventTimer() as timer:
            timer.start(self.stream)
            for _ in range(calls):
                run()
            return timer.stop(self.stream)


def capturing(stream: int) -> bool:
    """Whether ``stream`` is being captured into a CUDA graph (where nothing may synchronise it)."""
    rt = runtime.cudart()
    status = runtime.check(rt.cudaStreamIsCapturing(stream), "cudaStreamIsCapturing")
    return int(getattr(status, "value", status)) != 0


@functools.cache
def capture_query_address() -> int | None:
    """The address of the driver's ``cuStreamIsCapturing`` (what a compiled launch asks :func:`capturing`'s
    question with), or None where the driver library cannot be loaded by its name."""
    name = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
    try:
        return ctypes.cast(ctypes.CDLL(name).cuStreamIsCapturing, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


def clock_for(stream: int) -> StreamClock | None:
    """A :class:`StreamClock` for ``stream``, or None while it is being captured."""
    return None if capturing(stream) else StreamClock(stream)
