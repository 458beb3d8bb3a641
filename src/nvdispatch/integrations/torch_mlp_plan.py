"""The prepared plan of one fused-MLP operator call (:mod:`.torch_mlp_ops`): each GEMM of the chain's forward or
backward prepared once per problem, so a step runs the plans' direct calls (on CUDA: one compiled cuBLASLt
launch each, handed only the operands; the result allocated like operand ``a``) without a call key per GEMM.

A :class:`MlpChainPlan` is kept in the one plan cache under a key of the operator call: the kernel's name and
string arguments, the backend state and Torch's precision settings as every matmul key holds them
(:func:`nvdispatch._call_key.call_state`), and the signature of every tensor argument (dtype, shape, strides,
device, autograd state). A repeated call finds it behind Torch's tensor guard, as a repeated ``matmul`` finds
its plan (the tensor class's call-key memo): one native check of every tensor, no signature read or hashed. So
a change of backend, precision setting or shape takes another plan, and eviction or ``plan_cache.clear()`` drops
it (its GEMMs' holds closed when the last call running it lets go).

The plan starts empty; the kernel's first run fills it: each GEMM *site* (which GEMM of which layer, and its
epilog) is prepared where the run first reaches it (:func:`nvdispatch.linalg.prepare_call`: the plan
``matmul`` would run now, held while the chain plan lives). The kernels' control flow stays theirs: a backward
form chosen later (:mod:`.torch_activation_grad`) prepares its GEMMs when it first runs.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import Any

import torch

from .. import linalg
from .._call_key import call_state, class_keys
from .._plan_cache import plan_cache
from . import lt_tune_once, mlp_options
from . import torch_layouts as layouts

__all__ = ["MlpChainPlan", "acquire", "let_go"]

log = logging.getLogger("nvdispatch")
#: tuning key -> where the ``autotune`` option's choice came from (what a later site of the problem reports)
_OUTCOMES: dict = {}


class MlpChainPlan:
    """The prepared GEMMs of one operator call's problem (see the module notes). The Plan protocol's
    ``release``, ``strategy``, ``steps``; :meth:`gemm` runs one site.

    Examples
    --------
    >>> import torch
    >>> plan = MlpChainPlan("example")
    >>> a, b = torch.ones(2, 3), torch.ones(3, 4)
    >>> plan.gemm(("forward", 0, "BIAS"), a, b, "BIAS", "bias", torch.zeros(4))[0, 0].item()
    3.0
    >>> plan.sites
    (('forward', 0, 'BIAS'),)
    >>> plan.release()
    """

    needs_release = True
    workspace_bytes = 0  # the GEMMs' plans are counted where they are cached themselves
    strategy = "prepared chain"

    def __init__(self, what: str):
        self.what = what
        #: site -> (call, whether its result needs making dense): filled as the kernel's first runs reach them
        self._calls: dict[Hashable, tuple[Any, bool]] = {}
        self._holds: list[Any] = []
        #: small per-problem values the kernels compute once (the backward choices' keys)
        self.memo: dict[Hashable, Any] = {}
        #: site -> where its cuBLASLt algorithm came from, for the sites the ``autotune`` option tuned
        self.tuned: dict[Hashable, str] = {}
        #: kept in the plan cache (else the call that made it releases it)
        self.cached = True

    @property
    def sites(self) -> tuple:
        """The GEMM sites prepared so far, in the order first run."""
        return tuple(self._calls)

    def call_of(self, site: Hashable):
        """The call prepared for ``site`` (None before its first run): on CUDA the GEMM plan's direct call."""
        got = self._calls.get(site)
        return None if got is None else got[0]

    @property
    def steps(self) -> tuple[str, ...]:
        return tuple(f"{site}: {hold.plan!r}" for site, hold in zip(self._calls, self._holds))

    def gemm(self, site: Hashable, a, b, epilog: str = "DEFAULT", name: str | None = None, x=None):
        """``matmul(a, b, epilog=epilog, epilog_inputs={name: x})`` by the call prepared for ``site`` (prepared
        now on its first run); the result C-contiguous (see :func:`.torch_layouts.dense`), or ``(result,
        {output: array})`` for an epilog with an extra output, which the caller lays out."""
        got = self._calls.get(site)
        if got is None:
            return self._first(site, a, b, epilog, name, x)
        call, make_dense = got
        r = call(a, b) if x is None else call(a, b, x)
        if not make_dense:
            return r
        if r.__class__ is tuple:
            return layouts.dense(r[0], a), r[1]
        return layouts.dense(r, a)

    def _first(self, site, a, b, epilog: str, name: str | None, x):
        inputs = None if name is None else {name: x}
        hold, call = linalg.prepare_call(a, b, epilog, inputs)
        if self._autotune(site, hold.plan, a):  # the tuned plan's direct call is a new one: prepare it again
            old = hold
            hold, call = linalg.prepare_call(a, b, epilog, inputs)
            old.close()
        try:
            r = call(a, b) if x is None else call(a, b, x)
        except BaseException:
            hold.close()
            raise
        t = r[0] if r.__class__ is tuple else r
        # a plan's results are laid out alike on every run: where the first came dense, none needs making so
        make_dense = not (isinstance(t, torch.Tensor) and t.is_contiguous() and not t.storage_offset())
        self._holds.append(hold)
        self._calls[site] = (call, make_dense)
        log.debug("%s: GEMM %s prepared: %r", self.what, site, hold.plan)
        if not make_dense:
            return r
        return (layouts.dense(t, a), r[1]) if r.__class__ is tuple else layouts.dense(t, a)

    def _autotune(self, site, plan, a) -> bool:
        """Autotune ``plan`` as the ``autotune`` option says (see the module notes); whether it was tuned."""
        mode = mlp_options.autotune_mode()
        problem = getattr(plan, "problem", None)
        if mode == "off" or problem is None or not hasattr(problem, "m"):
            return False
        if not (isinstance(a, torch.Tensor) and a.is_cuda) or torch.cuda.is_current_stream_capturing():
            return False
        if not lt_tune_once.wants_timing(problem, mode):
            return False
        outcome = lt_tune_once.tune_once(plan, outcomes=_OUTCOMES, who=f"{self.what} GEMM {site}",
                                         budget=mlp_options.autotune_budget())  # fmt: skip
        self.tuned[site] = outcome
        log.debug("%s: GEMM %s: cuBLASLt algorithm %s", self.what, site, outcome)
        return True

    def release(self) -> None:
        """Let go of every GEMM's plan."""
        holds, self._holds = self._holds, []
        self._calls = {}
        for hold in holds:
            hold.close()

    def __repr__(self) -> str:
        return f"<MlpChainPlan {self.what}: {len(self._calls)} GEMMs>"


def acquire(what: str, form: tuple, tensors: tuple) -> MlpChainPlan:
    """The :class:`MlpChainPlan` of an operator call (``what``: the operator's name, ``form`` its other arguments
    and the length of each tensor list, ``tensors`` every tensor argument), pinned until :func:`let_go`: found
    by the tensors' guard, else by its key, else made (empty) and cached."""
    entry = class_keys(tensors[0].__class__)
    form = (what, form, *call_state(entry))
    memo = entry.memo
    if memo is not None:
        for check, handle, epoch in memo.handles.get(form, ()):
            if check(*tensors):
                plan = plan_cache.acquire_handle(handle, epoch)
                if plan is not None:
                    return plan
                break
    sig = entry.signature
    if sig is None:  # no key for these tensors: a plan for this call alone
        plan = MlpChainPlan(what)
        plan.cached = False
        return plan
    key = (form, *[sig(t) for t in tensors])
    plan = plan_cache.acquire(key)
    if plan is None:
        plan = plan_cache.acquire_or_create(key, lambda _tuning: MlpChainPlan(what))
    if memo is not None:
        memo.remember(form, tensors, plan_cache.handle(key))
    return plan


def let_go(plan: MlpChainPlan) -> None:
    """End the use :func:`acquire` began."""
    if plan.cached:
        plan_cache.let_go(plan)
    else:
        plan.release()
