"""The backward of a fused MLP's hidden layer on Torch CUDA tensors in one memory pass
(:mod:`nvdispatch.device.activation_grad`): the activation's derivative applied to a GEMM's result and the column
sums of what comes out (the layer's bias gradient) — so the layer's weight-gradient GEMM needs no bias-gradient
epilogue (cuBLASLt runs ``BGRADA``/``BGRADB`` as an extra reduction kernel over the same ``(m, n)`` tensor).

:func:`one_pass_reason` says why the pass cannot run on given tensors (not CUDA bfloat16, not C-contiguous, a width
not a multiple of 4, numba-cuda missing or its simulator active), :func:`activation_backward` runs it on the
current Torch stream by the problem's plan from the plan cache (its launches prepared once: capturable into a
CUDA graph once made, launches only, no synchronisation), and
:func:`choose` times it against the epilogue form once per problem (see there).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable

import torch

from .._plan_cache import plan_cache
from ..errors import NvdispatchError
from ..executors.cuda_numba import numba_reason
from . import mlp_options

__all__ = [
    "activation_backward", "plan_for", "one_pass_reason", "choose", "chosen", "choices", "forget_choices", "ROUNDS",
]  # fmt: skip

log = logging.getLogger("nvdispatch")

#: timed rounds per form when choosing (after one warm-up call each)
ROUNDS = 3
_CHOICES: dict[tuple, str] = {}


def one_pass_reason(g: torch.Tensor, saved: torch.Tensor | None) -> str | None:
    """Why the one-pass kernels cannot take ``g`` and the saved tensor (``h`` or ``z`` of ``g``'s shape, a ReLU bit
    mask in cuBLASLt's row format, or None), or None.

    Examples
    --------
    >>> import torch
    >>> from nvdispatch.integrations.torch_activation_grad import one_pass_reason
    >>> one_pass_reason(torch.zeros(4, 8, dtype=torch.bfloat16), None)
    'g is not a CUDA tensor'
    """
    bits = saved is not None and saved.dtype == torch.uint8
    for name, t in (("g", g), ("saved", saved)):
        if t is None:
            continue
        if t.is_neg() or t.is_conj():  # the kernels read the memory, which holds the values unnegated
            return f"{name} is a lazy {'negative' if t.is_neg() else 'conjugate'} view"
        if t.device.type != "cuda" or t.device != g.device:
            return f"{name} is not a CUDA tensor" if t.device.type != "cuda" else f"{name} is on another device"
        if t.dim() != 2 or not t.is_contiguous():
            return f"{name} is not a C-contiguous matrix"
        if t is saved and bits:
            if t.shape[0] != g.shape[0] or t.shape[1] * 8 < g.shape[1]:
                return f"the mask's shape {tuple(t.shape)} does not cover g's {tuple(g.shape)}"
            continue
        if t.dtype != torch.bfloat16:
            return f"{name} is {t.dtype}, the kernels take bfloat16"
        if t.shape != g.shape:
            return f"{name} is not of g's shape"
        if t.data_ptr() % 8:
            return f"{name} is not 8-byte aligned"
    if g.shape[1] % 4:
        return f"the width {g.shape[1]} is not a multiple of 4"
    return numba_reason()  # before nvdispatch.device is imported: it needs numba-cuda


def activation_backward(
    kind: str, g: torch.Tensor, saved: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(dz, db)``: ``dz = g * act'(...)`` from ``saved`` (``kind`` ``"relu"``: the layer's output ``h``;
    ``"relu_bits"``: cuBLASLt's ReLU bit mask; ``"gelu"``: the pre-activation ``z``) and ``db = dz.sum(0)``;
    ``kind="none"``: ``(None, g.sum(0))``. Inputs as :func:`one_pass_reason` accepts; queued on the current
    stream of ``g``'s device by the problem's plan (:class:`~nvdispatch.executors.cuda_activation_grad.
    ActivationGradPlan`, kept in the plan cache: a repeated problem prepares nothing again)."""
    m, n = g.shape
    index = g.device.index if g.device.index is not None else torch.cuda.current_device()
    saved_shape = tuple(saved.shape) if kind == "relu_bits" else None
    plan = plan_for(kind, m, n, saved_shape, index)
    try:
        dz = None if kind == "none" else torch.empty_like(g)
        partials = torch.empty((plan.partial_rows, n), device=g.device, dtype=torch.float32)
        sums = torch.empty((n,), device=g.device, dtype=torch.bfloat16)
        gp = g.data_ptr()
        plan(
            torch.cuda.current_stream(g.device).cuda_stream, gp, gp if saved is None else saved.data_ptr(),
            gp if dz is None else dz.data_ptr(), partials.data_ptr(), sums.data_ptr(),
        )  # fmt: skip
    finally:
        plan_cache.let_go(plan)
    return dz, sums


def plan_for(kind: str, m: int, n: int, saved_shape: tuple[int, ...] | None, index: int):
    """The plan of the ``(m, n)`` problem of ``kind`` on GPU ``index`` (``saved_shape``: the mask's, for
    ``"relu_bits"``) from the plan cache, made there on its first call; pinned until ``plan_cache.let_go``."""
    from ..executors import cuda_activation_grad as executor

    key = executor.key(kind, m, n, saved_shape, index)
    plan = plan_cache.acquire(key)
    if plan is None:
        several = torch.cuda.device_count() > 1
        plan = plan_cache.acquire_or_create(
            key, lambda _tuning: executor.ActivationGradPlan(kind, m, n, saved_shape, index, several)
        )
    return plan


def chosen(key: tuple) -> str | None:
    """The form :func:`choose` recorded for problem ``key``, or None."""
    return _CHOICES.get(key)


def choices() -> dict[tuple, str]:
    """The forms :func:`choose` recorded, by problem key (a copy)."""
    return dict(_CHOICES)


def forget_choices() -> None:
    """Forget every recorded choice (the next call of each problem times its forms again)."""
    _CHOICES.clear()


def choose(key: tuple, forms: dict[str, Callable[[], object]], device: torch.device) -> str:
    """The fastest of ``forms`` (label -> a call running one form of the same work on the current stream) for
    problem ``key``: timed once per process (CUDA events around each sample of ``choice_repeat`` calls back to
    back, :mod:`.mlp_options`; one warm-up call each, then :data:`ROUNDS` rounds in turns, lowest median wins;
    ties: the first form), then recorded. A form other than the first that raises here is left out (logged). A
    single form is recorded untimed. While the stream is being captured into a CUDA graph nothing can be timed:
    the first form is returned, not recorded."""
    got = _CHOICES.get(key)
    if got is not None:
        return got
    forms = dict(forms)
    labels = list(forms)
    if len(labels) > 1 and device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return labels[0]
    for label in labels[1:]:  # the first form always runs; another that cannot here is left out
        try:
            forms[label]()
        except NvdispatchError as exc:  # a combination the library does not take here (e.g. a *_BGRAD epilogue)
            log.debug("fused MLP backward %s: form %s left out (%s)", key, label, exc)
            del forms[label]
        except Exception as exc:  # noqa: BLE001 - an optional faster form must not fail the training step
            log.warning("fused MLP backward %s: form %s failed and is left out: %r", key, label, exc)
            del forms[label]
    labels = list(forms)
    if len(labels) == 1:
        _CHOICES[key] = labels[0]
        return labels[0]
    stream = torch.cuda.current_stream(device)
    repeat = mlp_options.choice_repeat()
    forms[labels[0]]()
    times: dict[str, list[float]] = {label: [] for label in labels}
    for _ in range(ROUNDS):
        for label in labels:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(repeat):
                forms[label]()
            stop.record(stream)
            stop.synchronize()
            times[label].append(start.elapsed_time(stop) * 1e-3 / repeat)
    medians = {label: statistics.median(t) for label, t in times.items()}
    best = min(labels, key=lambda label: (medians[label], labels.index(label)))
    _CHOICES[key] = best
    log.debug("fused MLP backward %s: %s chosen (median seconds %s)", key, best, medians)
    return best
