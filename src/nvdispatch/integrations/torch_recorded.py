"""The plan a repeated Torch matmul that autograd records runs: the ``nvdispatch::matmul`` operator's formula
around the plan of the same call unrecorded.

A call autograd records goes through the operator (its backward formula runs nvdispatch's backward epilogs). Its
first call reaches the route's miss path, which offers it to the Torch integration with its call key; a call key
holds each operand's autograd state and grad mode, so it is a recorded call's own. There the integration keeps a
:class:`RecordedMatmulPlan` under that key, and the call's repeats find it as every cached call finds its plan
(the compiled front's call-key memo, the route's hit): its ``direct`` call applies :class:`RecordedMatmul`, an
autograd Function with the operator's formula, whose forward runs the unrecorded call's plan (its direct call where
it has one). Neither the route's miss path nor the public function is taken again.

Kept only where the key fixes every argument of the operator but the arrays (:func:`keeps`): alpha the int 1; no
``c``, ``beta``, options, preferences or quantization scales; at most one epilog input; no autocast region (whose
casts the operator's autocast kernel makes); no lazy conjugate/negative view on a device (whose values the
unrecorded call copies anew each time). Other recorded calls take the operator's full path every time.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch

from .. import linalg
from .._adapters import adapter_for
from .._plan_cache import plan_cache
from .torch_autograd import matmul_context, matmul_grads
from .torch_layouts import conform, dense
from .torch_reentry import inside_kernel

__all__ = ["RecordedMatmul", "RecordedMatmulPlan", "keeps", "acquire"]

_INPUTS = ("bias", "relu_aux", "gelu_aux")


def keeps(a, b, alpha, c, beta, inputs: dict, options, preferences, scales) -> bool:
    """Whether a recorded call with these arguments may be served by a :class:`RecordedMatmulPlan` kept under its
    key (see the module notes)."""
    if alpha.__class__ is not int or alpha != 1 or c is not None or beta is not None or len(inputs) > 1:
        return False
    if not a.is_cpu and any(x.is_conj() or x.is_neg() for x in (a, b)):
        return False  # a lazy view on a device: the unrecorded plan is made on a copy of its values, per call
    if options is not None or preferences is not None or scales is not None:
        return False
    device_type = a.device.type
    return not (device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type))


class _Context:
    """What :func:`~.torch_autograd.matmul_grads` reads of a call: the same for every call a plan serves."""

    __slots__ = ("problem", "names", "alpha", "beta", "shapes", "dtypes")


class RecordedMatmulPlan:
    """The operator's formula around ``hold.plan`` (the plan of the call unrecorded, held until :meth:`release`):
    ``layout`` is the call's ``(problem, output specs)``, ``epilog`` the operator's epilog name (a GELU call
    keeps its pre-activation: GELU_AUX), ``public`` the caller's, ``input_name`` the epilog input's name (or
    None). The Plan protocol: ``direct(a, b[, x])``, ``execute(operands, stream)``, ``strategy``, ``steps``,
    ``release``."""

    def __init__(self, hold, layout, epilog: str, public: str, input_name: str | None, a, b, x):
        inner = hold.plan
        self._hold = hold
        self.plan = inner
        self.problem = getattr(inner, "problem", None)
        self.strategy = inner.strategy
        self.steps = ("autograd: the nvdispatch::matmul operator's formula", *getattr(inner, "steps", ()))
        self.needs_release = getattr(inner, "needs_release", True)
        self.workspace_bytes = 0  # the inner plan's are counted where it is cached itself
        problem, specs = layout
        self._specs = specs
        self._problem = problem
        self._inner_direct = getattr(inner, "direct", None)
        self._input_name = input_name
        self._epilog = epilog
        #: the outputs the caller gets: the result alone (also where the operator keeps the pre-activation), or
        #: the result and the aux dict of the epilog's outputs
        self._aux_names = () if epilog != public else tuple(s.name for s in specs[1:])
        ctx = self.context = _Context()
        matmul_context(ctx, problem, specs, a, b, None, x if input_name == "bias" else None, 1, None)
        # the epilog input's place among the inputs matmul_grads tells apart (a, b, c, bias, relu_aux, gelu_aux),
        # and among the saved tensors (a, b, c, result, pre-activation, relu_aux, gelu_aux) where it is saved
        self._need_slot = None if input_name is None else 3 + _INPUTS.index(input_name)
        self._saved_slot = {"relu_aux": 5, "gelu_aux": 6}.get(input_name)

    # -- the Plan protocol ----------------------------------------------------------------------------------
    def direct(self, a, b, x=None):
        if inside_kernel():  # an operator's real kernel runs the call: the plan, without a formula
            return self._public(self._run(a, b, x, None))
        outs = _apply(self, None, a, b, x)
        if outs.__class__ is not tuple:
            return outs
        return self._public(outs)

    def execute(self, operands: dict[str, Any], stream: Any = None) -> Any:
        a, b = operands["a"], operands["b"]
        x = None if self._input_name is None else operands[self._input_name]
        if inside_kernel():
            return self._public(self._run(a, b, x, stream))
        if stream is None:
            return self.direct(a, b, x)
        # autograd records the forward's stream: make the call's current around it
        with adapter_for(a).native_stream_context(stream if a.is_cuda else None, max(a.get_device(), 0)):
            outs = _apply(self, stream, a, b, x)
        return outs if outs.__class__ is not tuple else self._public(outs)

    def release(self) -> None:
        """Let go of the unrecorded call's plan."""
        self._hold.close()

    # -- the forward ------------------------------------------------------------------------------------
    def _run(self, a, b, x, stream) -> tuple:
        """The outputs of the unrecorded call's plan on these operands, in the operator's layouts."""
        direct = self._inner_direct
        if direct is not None and stream is None:
            r = direct(a, b) if x is None else direct(a, b, x)
        else:
            operands = {"a": a, "b": b, "alpha": 1, "beta": None}
            if x is not None:
                operands[self._input_name] = x
            r = self.plan.execute(operands, stream)
        if r.__class__ is not tuple:
            return (dense(r, a),)
        specs, p = self._specs, self._problem
        aux = r[1]
        return (conform(r[0], specs[0], p, a), *(conform(aux[s.name], s, p, a) for s in specs[1:]))

    def _public(self, outs: tuple):
        """The caller's result from the operator's outputs."""
        if not self._aux_names:
            return outs[0]
        return outs[0], dict(zip(self._aux_names, outs[1:]))

    def __repr__(self) -> str:
        return f"<RecordedMatmulPlan {self._epilog} of {self.plan!r}>"


def _forward(ctx, plan, stream, a, b, x):
    outs = plan._run(a, b, x, stream)
    ctx.plan = plan
    saved = [a, b, None, outs[0], None, None, None]
    names = plan.context.names
    if "gelu_aux" in names:
        saved[4] = outs[names.index("gelu_aux")]
    if plan._saved_slot is not None:
        saved[plan._saved_slot] = x
    ctx.save_for_backward(*saved)
    return outs[0] if len(outs) == 1 else outs


def _backward(ctx, *grads):
    plan = ctx.plan
    _, _, need_a, need_b, need_x = ctx.needs_input_grad
    slot = plan._need_slot
    needs = [need_a, need_b, False, False, False, False]
    if slot is not None:
        needs[slot] = need_x
    ga, gb, _, gbias, ggelu = matmul_grads(plan.context, ctx.saved_tensors, grads, needs)
    gx = gbias if slot == 3 else ggelu if slot == 5 else None
    return None, None, ga, gb, gx


#: ``nvdispatch::matmul``'s formula on a call a :class:`RecordedMatmulPlan` serves: ``apply(plan, stream, a, b,
#: x)`` -> the result (a tensor) or the operator's outputs (a tuple). Named as the operator's own eager Function
#: (``grad_fn``: ``nvdispatch_matmulBackward``), whose formula it is.
RecordedMatmul = type(
    "nvdispatch_matmul",
    (torch.autograd.Function,),
    {"forward": staticmethod(_forward), "backward": staticmethod(_backward), "__module__": __name__},
)


def _native_apply():
    """``apply`` of :data:`RecordedMatmul` without ``Function.apply``'s Python steps where functorch transforms are
    not active (binding arguments to ``forward``'s signature where ``setup_context`` is defined, which it is not
    here; dead functorch wrappers unwrapped, done here too): Torch's native ``apply``. ``Function.apply`` itself
    where this Torch lacks one of them (private API)."""
    try:
        native = torch._C._FunctionBase.__dict__["apply"].__get__(RecordedMatmul, RecordedMatmul)
        transforms_active = torch._C._are_functorch_transforms_active
        unwrap = torch._C._functorch.unwrap_if_dead
    except (AttributeError, KeyError):
        return RecordedMatmul.apply
    python = RecordedMatmul.apply

    def apply(plan, stream, a, b, x):
        if transforms_active():
            return python(plan, stream, a, b, x)
        return native(plan, stream, unwrap(a), unwrap(b), None if x is None else unwrap(x))

    return apply


_apply = _native_apply()


def acquire(call_key: Hashable, a, b, input_name: str | None, x, epilog: str, public: str, layout) -> Any:
    """The :class:`RecordedMatmulPlan` kept under ``call_key`` (made now on a miss), pinned until
    ``plan_cache.let_go``."""

    def make(_tuning):
        inputs = None if input_name is None else {input_name: x.detach()}
        with torch.no_grad():
            hold = linalg.hold_call_plan(a.detach(), b.detach(), epilog, inputs)
        try:
            return RecordedMatmulPlan(hold, layout, epilog, public, input_name, a, b, x)
        except BaseException:
            hold.close()
            raise

    return plan_cache.acquire_or_create(call_key, make)
