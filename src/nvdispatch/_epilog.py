"""The epilog table: what every epilog needs, returns and does, as data.

An epilog ``F`` turns a matmul into ``F(alpha * a @ b + beta * c)``. Each row of :data:`EPILOGS` says what one
epilog needs (inputs), what it returns besides the result (outputs), what it does (the ordered steps) and how
it may run (``backward``, ``fusable``). Inputs and outputs have handlers (:data:`INPUTS`, :data:`OUTPUTS`:
validate when the call is checked, prepare before execution), steps are looked up in :data:`STEPS` and run
through a framework's step vocabulary (``_epilog_numpy``, ``_epilog_torch``, ``_epilog_cupy``), so adding an
epilog is one row, and adding a framework one vocabulary.

Semantics (those of cuBLASLt's epilogues, in row-major terms; result ``d`` of shape ``(..., m, n)``):

========================  ===========================================================================
``BIAS``                  ``d + bias``; bias along N (``(n,)`` / ``(..., 1, n)``) or along M (``(..., m, 1)``)
``RELU`` / ``GELU``       ``relu(d)`` / ``gelu(d)``, GELU being the tanh approximation
``*_BIAS``                the activation applied after the bias
``*_AUX``                 also return the activation's auxiliary: ``relu_aux`` (where ``d > 0``) or
                          ``gelu_aux`` (the pre-activation ``d``)
``DRELU`` / ``DGELU``     backward: ``d * relu'(relu_aux)`` / ``d * gelu'(gelu_aux)``, taking the aux of
                          the forward call
``DRELU_BGRAD`` ...       as DRELU/DGELU, and return the bias gradient (``drelu_bgrad`` /
                          ``dgelu_bgrad``): the result summed over M (shape ``(n,)``, the bias-along-N
                          convention) or, with ``options.bgrad_axis="m"``, over N (shape ``(m, 1)``)
``BGRADA`` / ``BGRADB``   plain matmul, and return ``a`` summed over K (``bgrada``, shape ``(..., m)``)
                          / ``b`` summed over K (``bgradb``, shape ``(..., n)``)
========================  ===========================================================================

The same answer on every executor, where libraries differ (each held by a cross-executor test):

* ``alpha`` and ``beta`` scale the product and ``c`` only: the bias is added after them,
  ``F(alpha * a @ b + beta * c + bias)``, which is what cuBLASLt computes (its epilogue adds the bias to the
  scaled result "before applying the final post-processing").
* NaN propagates through RELU: ``relu(x) = max(x, 0)`` is NaN where ``x`` is NaN, as cuBLASLt's RELU
  epilogue (``tests/matmul/test_epilog_traps.py`` checks it on a GPU), ``torch.relu``, Torch's
  ``_addmm_activation`` and NumPy's ``maximum`` all give natively, so no executor spends a pass on it.
  ``relu_aux`` is ``x > 0`` (False at NaN) on the CPU executors; the cuBLASLt executors return cuBLASLt's own
  bit at NaN and at an exact zero, where it is set (so DRELU passes the gradient at ``x == 0`` on the GPU and
  not on the CPU: both are subgradients of ReLU).
* DRELU passes the upstream gradient where the mask is set and gives 0 elsewhere, even where that gradient
  is inf or NaN (as Torch's relu backward; a multiplication by the mask would give NaN there).
* GELU is the tanh approximation everywhere (Torch's CPU ``_addmm_activation`` computes the erf form, so
  it is not used for GELU on the CPU).
* Reductions (bias gradients) of float16/bfloat16 data accumulate in float32 and round once at the end.

The formats of ``relu_aux`` differ per executor (the CPU ones use a boolean mask of the result's shape;
cuBLASLt uses a bit mask); each executor's backward epilogs accept the format its forward ones return.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._shapes import broadcast_shapes
from .errors import EpilogInputError, InvalidArgumentError

__all__ = [
    "Epilog",
    "EpilogSpec",
    "EpilogInput",
    "EpilogOutput",
    "Shapes",
    "Step",
    "EPILOGS",
    "INPUTS",
    "OUTPUTS",
    "STEPS",
    "STRATEGIES",
    "spec_of",
    "prepare_inputs",
    "declined_mask_format",
    "validate_inputs",
    "finish_outputs",
    "apply_steps",
    "output_of_kind",
    "gelu_tanh",
    "gelu_tanh_grad",
]


class Epilog(enum.IntEnum):
    """The cuBLASLt epilogues (values as ``cublasLtEpilogue_t``); ``matmul(..., epilog=...)`` also takes the names.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> y, aux = nvdispatch.matmul(np.eye(2), -np.ones((2, 2)), epilog=nvdispatch.Epilog.RELU_AUX)
    >>> y.tolist(), sorted(aux)
    ([[0.0, 0.0], [0.0, 0.0]], ['relu_aux'])
    """

    DEFAULT = 1
    RELU = 2
    RELU_AUX = 130
    BIAS = 4
    RELU_BIAS = 6
    RELU_AUX_BIAS = 134
    DRELU = 136
    DRELU_BGRAD = 152
    GELU = 32
    GELU_AUX = 160
    GELU_BIAS = 36
    GELU_AUX_BIAS = 164
    DGELU = 192
    DGELU_BGRAD = 208
    BGRADA = 256
    BGRADB = 512


#: fusion strategies, best first: one fused kernel of the executor's library; a fused op of the
#: framework (e.g. ``torch._addmm_activation``); the matmul followed by one in-place pass over its
#: output; separate framework ops
STRATEGIES = ("native", "framework_fused", "inplace", "plain")


# -- GELU: the one definition ---------------------------------------------------------------------------------
#: GELU's tanh approximation, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``: its two constants
GELU_K = math.sqrt(2.0 / math.pi)
GELU_C = 0.044715


def gelu_tanh(x, xp=np, out=None):
    """GELU (tanh approximation) of ``x`` with the array namespace ``xp`` (NumPy, CuPy or Torch), into ``out``
    when given (``out`` may be ``x``). One temporary of ``x``'s size."""
    t = xp.multiply(x, x)
    xp.multiply(t, GELU_C, out=t)
    xp.add(t, 1.0, out=t)
    xp.multiply(t, x, out=t)
    xp.multiply(t, GELU_K, out=t)
    xp.tanh(t, out=t)
    xp.add(t, 1.0, out=t)
    r = xp.multiply(x, 0.5, out=out)
    return xp.multiply(r, t, out=r)


def gelu_tanh_grad(x, xp=np):
    """The derivative of :func:`gelu_tanh` at ``x`` (a new array of ``x``'s dtype)."""
    t = xp.tanh(GELU_K * (x + GELU_C * x * x * x))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * x * x)


# -- steps: what each one does, through a framework's vocabulary ``ops`` ---------------------------------------
@dataclass(frozen=True)
class Step:
    """One step of an epilog: ``run(ops, d, env)`` through a framework's vocabulary ``ops`` (``env`` holds
    ``inputs``, ``a``, ``b``, ``bgrad_axis``). Without ``output`` it returns the new result, or None when ``ops``
    changed ``d`` in place; with one, what it returns is that auxiliary output (``"bias_gradient"``: the
    epilog's output of that kind)."""

    name: str
    run: Callable[[Any, Any, dict], Any]
    output: str | None = None
    #: reads the operands (a/b), not the result: executors that finish the result in blocks run it once
    on_operands: bool = False


def _bias_gradient(ops, d, env):
    return ops.sum(d, -2, False) if env["bgrad_axis"] == "n" else ops.sum(d, -1, True)


STEPS: dict[str, Step] = {
    s.name: s
    for s in (
        Step("add_bias", lambda ops, d, env: ops.add_(d, env["inputs"]["bias"])),
        Step("relu", lambda ops, d, env: ops.relu_(d)),
        Step("save_relu_mask", lambda ops, d, env: ops.positive_mask(d), output="relu_aux"),
        Step("gelu", lambda ops, d, env: ops.gelu_(d)),
        Step("save_pre_activation", lambda ops, d, env: ops.copy(d), output="gelu_aux"),
        Step("drelu", lambda ops, d, env: ops.mask_(d, env["inputs"]["relu_aux"])),
        Step("dgelu", lambda ops, d, env: ops.mul_(d, ops.gelu_grad(env["inputs"]["gelu_aux"]))),
        Step("bgrad_result", _bias_gradient, output="bias_gradient"),
        Step("bgrad_a", lambda ops, d, env: ops.sum(env["a"], -1, False), output="bgrada", on_operands=True),
        Step("bgrad_b", lambda ops, d, env: ops.sum(env["b"], -2, False), output="bgradb", on_operands=True),
    )
}


# -- inputs and outputs: their handlers ------------------------------------------------------------------------
@dataclass(frozen=True)
class EpilogInput:
    """An epilog input. ``validate(info, shapes)`` checks it when the call is validated (raising
    :class:`~nvdispatch.errors.EpilogInputError`) and returns the bias orientation for a bias (else None);
    ``prepare(x, problem)`` shapes it to broadcast against the promoted ``(..., m, n)`` result (any framework).
    ``like_result``: it has the result's shape (executors that work in blocks slice it like the result).
    ``mask_of``: the forward epilog family that returns it as a mask (boolean on the CPU executors, bits on
    cuBLASLt)."""

    name: str
    validate: Callable[[Any, Any], str | None]
    prepare: Callable[[Any, Any], Any]
    like_result: bool
    mask_of: str | None = None


@dataclass(frozen=True)
class EpilogOutput:
    """An auxiliary output. ``kind``: ``"mask"`` (boolean, the result's shape on the CPU executors),
    ``"pre_activation"`` (the result's dtype and shape), ``"bias_gradient"`` (a reduction of the result) or
    ``"operand_sum"`` (a reduction of ``a`` or ``b``)."""

    name: str
    kind: str

    @property
    def like_result(self) -> bool:
        return self.kind in ("mask", "pre_activation")


@dataclass(frozen=True)
class Shapes:
    """What input validation needs to know of the call."""

    result_dtype: str
    result_shape: tuple[int, ...]
    batch: tuple[int, ...]
    m: int
    n: int


def _argument(name: str) -> str:
    return f"epilog_inputs[{name!r}]"


def _validate_bias(info, sh: Shapes) -> str:
    axis = _bias_axis(tuple(info.shape), sh)
    if not (info.dtype == sh.result_dtype or (sh.result_dtype in ("float16", "bfloat16") and info.dtype == "float32")):
        raise EpilogInputError(_argument("bias"), f"dtype {sh.result_dtype} (the result's)", info.dtype)
    return axis


def _bias_axis(shape: tuple[int, ...], sh: Shapes) -> str:
    """``"n"`` or ``"m"``: which axis of the result a bias of ``shape`` lies along."""
    arg, batch, m, n = _argument("bias"), sh.batch, sh.m, sh.n
    if len(shape) == 1:
        if shape[0] == n:
            return "n"
        hint = f"for a bias along M give shape ({m}, 1)" if shape[0] == m else ""
        raise EpilogInputError(arg, f"shape ({n},), (1, {n}) or ({m}, 1)", str(shape), hint)
    if len(shape) < 2 or len(shape) > len(batch) + 2:
        raise EpilogInputError(
            arg, f"shape ({n},), (..., 1, {n}) or (..., {m}, 1) with batch dims broadcastable to {batch}", str(shape)
        )
    try:
        if broadcast_shapes(shape[:-2], batch) != tuple(batch):
            raise ValueError
    except ValueError:
        raise EpilogInputError(arg, f"batch dimensions broadcastable to {batch}", str(shape)) from None
    if shape[-2:] == (1, n):
        return "n"
    if shape[-2:] == (m, 1):
        return "m"
    raise EpilogInputError(arg, f"shape ({n},), (..., 1, {n}) or (..., {m}, 1)", str(shape))


def _validate_gelu_aux(info, sh: Shapes) -> None:
    if info.dtype != sh.result_dtype:
        raise EpilogInputError(_argument("gelu_aux"), f"dtype {sh.result_dtype} (as GELU_AUX returned it)", info.dtype)
    if tuple(info.shape) != tuple(sh.result_shape):
        raise EpilogInputError(_argument("gelu_aux"), f"shape {sh.result_shape} (the result's)", str(tuple(info.shape)))


def _validate_relu_aux(info, sh: Shapes) -> None:
    """A boolean mask of the result's shape (CPU executors) or cuBLASLt's uint8 bit mask, in either orientation
    (its layout is checked by the cuda executor; see ``_cuda/lt_setup.py``)."""
    arg = _argument("relu_aux")
    if info.dtype == "bool":
        if tuple(info.shape) != tuple(sh.result_shape):
            raise EpilogInputError(arg, f"shape {sh.result_shape} (the result's)", str(tuple(info.shape)))
    elif info.dtype != "uint8":
        raise EpilogInputError(arg, "the mask RELU_AUX returned (bool, or uint8 bit mask)", info.dtype)


def _prepare_bias(x, p):
    return x.reshape(1, -1) if x.ndim == 1 else x


def _prepare_like_result(x, p):
    return x.reshape(p.promoted_shape)


def _prepare_mask(x, p):
    """A boolean mask shaped like the result; cuBLASLt's uint8 bits reach an executor that takes booleans only
    where the result is empty (see :func:`declined_mask_format`): then an empty boolean mask of the result's
    shape, whatever the bits' orientation and padding."""
    if str(x.dtype).endswith("uint8"):
        return (x.reshape(-1)[:0] != 0).reshape(p.promoted_shape)
    return x.reshape(p.promoted_shape)


INPUTS: dict[str, EpilogInput] = {
    i.name: i
    for i in (
        EpilogInput("bias", _validate_bias, _prepare_bias, like_result=False),
        EpilogInput("relu_aux", _validate_relu_aux, _prepare_mask, like_result=True, mask_of="RELU_AUX"),
        EpilogInput("gelu_aux", _validate_gelu_aux, _prepare_like_result, like_result=True),
    )
}

OUTPUTS: dict[str, EpilogOutput] = {
    o.name: o
    for o in (
        EpilogOutput("relu_aux", "mask"),
        EpilogOutput("gelu_aux", "pre_activation"),
        EpilogOutput("drelu_bgrad", "bias_gradient"),
        EpilogOutput("dgelu_bgrad", "bias_gradient"),
        EpilogOutput("bgrada", "operand_sum"),
        EpilogOutput("bgradb", "operand_sum"),
    )
}


def validate_inputs(spec: EpilogSpec, infos: dict, shapes: Shapes) -> str | None:
    """Check each of ``spec``'s inputs (``infos``: name -> operand info) with its handler; returns the bias
    orientation (``"n"``/``"m"``) where the epilog takes a bias, else None."""
    bias_axis = None
    for name in spec.inputs:
        axis = INPUTS[name].validate(infos[name], shapes)
        if axis is not None:
            bias_axis = axis
    return bias_axis


def declined_mask_format(problem, executor: str) -> str | None:
    """Why an executor that takes masks as booleans (the CPU ones) declines ``problem`` (a mask in another
    format, e.g. cuBLASLt's bits), or None. An empty result reads no mask element: any format is taken (a
    zero-size call with the bits of a cuBLASLt RELU_AUX, which cuBLASLt itself cannot run, goes to these
    executors)."""
    if 0 in problem.result_shape:
        return None
    for name, sig in problem.inputs:
        forward = INPUTS[name].mask_of
        if forward is not None and sig.dtype != "bool":
            return f"the {executor} executor takes {name} as the boolean mask its {forward} returns"
    return None


def prepare_inputs(problem, operands: dict, convert: Callable[[Any], Any] = lambda x: x) -> dict:
    """The epilog inputs of ``operands``, each ``convert``-ed (e.g. to the executor's array type) and shaped by its
    handler to broadcast against the promoted result."""
    return {name: INPUTS[name].prepare(convert(operands[name]), problem) for name, _ in problem.inputs}


def finish_outputs(problem, aux: dict) -> dict:
    """Drop the axes PEP 465 added for 1-D operands from the outputs of the result's shape."""
    if problem.a_vector or problem.b_vector:
        for name, value in aux.items():
            if OUTPUTS[name].like_result:
                aux[name] = problem.squeeze(value)
    return aux


# -- the table ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EpilogSpec:
    """One row of the epilog table."""

    epilog: Epilog
    #: names of the required ``epilog_inputs`` (handlers in :data:`INPUTS`)
    inputs: tuple[str, ...]
    #: names of the auxiliary outputs, returned as ``(result, {name: array})`` (handlers in :data:`OUTPUTS`)
    outputs: tuple[str, ...]
    #: the steps applied to the matmul result, in order (see :data:`STEPS`)
    steps: tuple[str, ...]
    #: activation family ("relu"/"gelu") for forward or backward epilogs, else None
    activation: str | None = None
    #: a backward epilog (takes a forward call's aux and gives the gradient wrt the pre-activation)
    backward: bool = False
    #: a linear layer's forward epilog (bias, then an optional activation, no aux): what frameworks' fused
    #: linear ops (``torch.addmm`` / ``torch._addmm_activation``) compute
    fusable: bool = False

    @property
    def has_bias(self) -> bool:
        return "bias" in self.inputs

    @property
    def real_only(self) -> bool:
        """Whether the math needs an ordered (real) dtype: activations do, a plain bias does not."""
        return self.activation is not None

    @property
    def float_only(self) -> bool:
        """Whether the math needs a floating dtype (GELU and its gradient)."""
        return self.activation == "gelu"


E = Epilog
_BIAS = ("bias",)
_rows = [
    EpilogSpec(E.DEFAULT, (), (), ()),
    EpilogSpec(E.RELU, (), (), ("relu",), "relu"),
    EpilogSpec(E.RELU_AUX, (), ("relu_aux",), ("save_relu_mask", "relu"), "relu"),
    EpilogSpec(E.BIAS, _BIAS, (), ("add_bias",), fusable=True),
    EpilogSpec(E.RELU_BIAS, _BIAS, (), ("add_bias", "relu"), "relu", fusable=True),
    EpilogSpec(E.RELU_AUX_BIAS, _BIAS, ("relu_aux",), ("add_bias", "save_relu_mask", "relu"), "relu"),
    EpilogSpec(E.GELU, (), (), ("gelu",), "gelu"),
    EpilogSpec(E.GELU_AUX, (), ("gelu_aux",), ("save_pre_activation", "gelu"), "gelu"),
    EpilogSpec(E.GELU_BIAS, _BIAS, (), ("add_bias", "gelu"), "gelu", fusable=True),
    EpilogSpec(E.GELU_AUX_BIAS, _BIAS, ("gelu_aux",), ("add_bias", "save_pre_activation", "gelu"), "gelu"),
    EpilogSpec(E.DRELU, ("relu_aux",), (), ("drelu",), "relu", backward=True),
    EpilogSpec(E.DRELU_BGRAD, ("relu_aux",), ("drelu_bgrad",), ("drelu", "bgrad_result"), "relu", backward=True),
    EpilogSpec(E.DGELU, ("gelu_aux",), (), ("dgelu",), "gelu", backward=True),
    EpilogSpec(E.DGELU_BGRAD, ("gelu_aux",), ("dgelu_bgrad",), ("dgelu", "bgrad_result"), "gelu", backward=True),
    EpilogSpec(E.BGRADA, (), ("bgrada",), ("bgrad_a",)),
    EpilogSpec(E.BGRADB, (), ("bgradb",), ("bgrad_b",)),
]

#: the epilog table
EPILOGS: dict[Epilog, EpilogSpec] = {row.epilog: row for row in _rows}
_BY_NAME: dict[str, EpilogSpec] = {row.epilog.name: row for row in _rows}


def spec_of(epilog) -> EpilogSpec:
    """The table row for ``epilog`` (an :class:`Epilog`, its name, or ``None`` for DEFAULT)."""
    if epilog is None:
        return EPILOGS[Epilog.DEFAULT]
    if isinstance(epilog, str):
        row = _BY_NAME.get(epilog.upper())
        if row is not None:
            return row
    else:
        try:
            return EPILOGS[Epilog(epilog)]
        except (ValueError, TypeError):
            pass
    raise InvalidArgumentError("epilog", f"an Epilog ({', '.join(e.name for e in Epilog)})", repr(epilog))


def apply_steps(spec: EpilogSpec, d, inputs: dict, ops, *, a=None, b=None, bgrad_axis: str = "n", which: str = "all"):
    """Apply ``spec``'s steps to ``d`` through the step vocabulary ``ops``; returns ``(result, aux)``.

    ``ops`` is one framework's vocabulary (``add_``, ``relu_``, ``positive_mask``, ``gelu_``, ``copy``, ``mask_``,
    ``mul_``, ``gelu_grad``, ``sum``): its elementwise methods either modify ``d`` in place and return None (an
    in-place vocabulary) or return the new array (an out-of-place one, e.g. for autograd). Inputs must already
    broadcast against ``d`` (:func:`prepare_inputs`). ``which``: ``"all"`` steps, only those on the ``"result"``, or
    only those on the ``"operands"`` (a/b; executors that finish the result in blocks run these once).
    """
    aux: dict = {}
    env = {"inputs": inputs, "a": a, "b": b, "bgrad_axis": bgrad_axis}
    for name in spec.steps:
        step = STEPS[name]
        if which != "all" and step.on_operands != (which == "operands"):
            continue
        got = step.run(ops, d, env)
        if step.output is not None:
            aux[output_of_kind(spec, step.output) if step.output == "bias_gradient" else step.output] = got
        elif got is not None:
            d = got
    return d, aux


def output_of_kind(spec: EpilogSpec, kind: str) -> str | None:
    """The name of ``spec``'s output of ``kind`` (see :class:`EpilogOutput`), or None."""
    return next((o for o in spec.outputs if OUTPUTS[o].kind == kind), None)
