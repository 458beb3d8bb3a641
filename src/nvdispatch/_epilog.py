"""The epilog table and the fusion planner.

An epilog ``F`` turns a matmul into ``F(alpha * a @ b + beta * c)``. Each row of :data:`EPILOGS` says, as
data, what one epilog needs (inputs), what it returns besides the result (outputs) and what it does
(the ordered elementwise steps). The NumPy reference (:func:`reference`) and every executor's in-place
pass (:func:`apply_inplace`) are written once against these rows.

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

The formats of ``relu_aux`` differ per executor (the CPU ones use a boolean mask of the result's shape;
cuBLASLt uses a bit mask); each executor's backward epilogs accept the format its forward ones return.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Epilog",
    "EpilogSpec",
    "EPILOGS",
    "STRATEGIES",
    "spec_of",
    "reference",
    "apply_inplace",
    "apply_steps",
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


@dataclass(frozen=True)
class EpilogSpec:
    """One row of the epilog table."""

    epilog: Epilog
    #: names of the required ``epilog_inputs``
    inputs: tuple[str, ...]
    #: names of the auxiliary outputs, returned as ``(result, {name: array})``
    outputs: tuple[str, ...]
    #: the elementwise steps applied to the matmul result, in order
    steps: tuple[str, ...]
    #: activation family ("relu"/"gelu") for forward or backward epilogs, else None
    activation: str | None = None

    @property
    def has_bias(self) -> bool:
        return "bias" in self.inputs

    @property
    def is_backward(self) -> bool:
        return self.epilog in (Epilog.DRELU, Epilog.DRELU_BGRAD, Epilog.DGELU, Epilog.DGELU_BGRAD)

    @property
    def real_only(self) -> bool:
        """Whether the math needs an ordered (real) dtype: activations do, a plain bias does not."""
        return self.activation is not None

    @property
    def float_only(self) -> bool:
        """Whether the math needs a floating dtype (GELU and its gradient)."""
        return self.activation == "gelu"


E = Epilog
_rows = [
    EpilogSpec(E.DEFAULT, (), (), ()),
    EpilogSpec(E.RELU, (), (), ("relu",), "relu"),
    EpilogSpec(E.RELU_AUX, (), ("relu_aux",), ("save_relu_mask", "relu"), "relu"),
    EpilogSpec(E.BIAS, ("bias",), (), ("add_bias",)),
    EpilogSpec(E.RELU_BIAS, ("bias",), (), ("add_bias", "relu"), "relu"),
    EpilogSpec(E.RELU_AUX_BIAS, ("bias",), ("relu_aux",), ("add_bias", "save_relu_mask", "relu"), "relu"),
    EpilogSpec(E.GELU, (), (), ("gelu",), "gelu"),
    EpilogSpec(E.GELU_AUX, (), ("gelu_aux",), ("save_pre_activation", "gelu"), "gelu"),
    EpilogSpec(E.GELU_BIAS, ("bias",), (), ("add_bias", "gelu"), "gelu"),
    EpilogSpec(E.GELU_AUX_BIAS, ("bias",), ("gelu_aux",), ("add_bias", "save_pre_activation", "gelu"), "gelu"),
    EpilogSpec(E.DRELU, ("relu_aux",), (), ("drelu",), "relu"),
    EpilogSpec(E.DRELU_BGRAD, ("relu_aux",), ("drelu_bgrad",), ("drelu", "bgrad_result"), "relu"),
    EpilogSpec(E.DGELU, ("gelu_aux",), (), ("dgelu",), "gelu"),
    EpilogSpec(E.DGELU_BGRAD, ("gelu_aux",), ("dgelu_bgrad",), ("dgelu", "bgrad_result"), "gelu"),
    EpilogSpec(E.BGRADA, (), ("bgrada",), ("bgrad_a",)),
    EpilogSpec(E.BGRADB, (), ("bgradb",), ("bgrad_b",)),
]

#: the epilog table
EPILOGS: dict[Epilog, EpilogSpec] = {row.epilog: row for row in _rows}


def spec_of(epilog) -> EpilogSpec:
    """The table row for ``epilog`` (an :class:`Epilog`, its name, or ``None`` for DEFAULT)."""
    from .errors import InvalidArgumentError

    if epilog is None:
        return EPILOGS[Epilog.DEFAULT]
    if isinstance(epilog, str):
        try:
            return EPILOGS[Epilog[epilog.upper()]]
        except KeyError:
            pass
    else:
        try:
            return EPILOGS[Epilog(epilog)]
        except (ValueError, TypeError):
            pass
    raise InvalidArgumentError("epilog", f"an Epilog ({', '.join(e.name for e in Epilog)})", repr(epilog))


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + _GELU_C * x**3)))


def gelu_tanh_grad(x: np.ndarray) -> np.ndarray:
    """Derivative of :func:`gelu_tanh`."""
    t = np.tanh(_SQRT_2_OVER_PI * (x + _GELU_C * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * x * x)


def reference(spec: EpilogSpec, d: np.ndarray, inputs: dict, a=None, b=None, bgrad_axis: str = "n"):
    """The NumPy reference of an epilog applied to ``d`` (not modified); returns ``(result, aux)``.

    ``d`` holds ``alpha * a @ b + beta * c`` with 1-D operands already promoted (shape ``(..., m, n)``).
    """
    d = np.array(d, copy=True)
    aux = apply_inplace(spec, d, inputs, NUMPY_OPS, a=a, b=b, bgrad_axis=bgrad_axis)
    return d, aux


def apply_steps(spec: EpilogSpec, d, inputs: dict, ops, *, a=None, b=None, bgrad_axis: str = "n"):
    """Apply ``spec``'s steps to ``d`` through the array ops ``ops``; returns ``(result, aux)``.

    ``ops`` is a small adapter (see :class:`NumpyEpilogOps`) so the same step list runs on every
    framework. Its elementwise methods either modify ``d`` in place and return None (in-place
    vocabularies) or return the new array (out-of-place ones, e.g. for autograd). ``bias``/aux inputs
    must already broadcast against ``d``.
    """
    aux: dict = {}
    for step in spec.steps:
        new = None
        if step == "add_bias":
            new = ops.add_(d, inputs["bias"])
        elif step == "relu":
            new = ops.relu_(d)
        elif step == "save_relu_mask":
            aux["relu_aux"] = ops.positive_mask(d)
        elif step == "gelu":
            new = ops.gelu_(d)
        elif step == "save_pre_activation":
            aux["gelu_aux"] = ops.copy(d)
        elif step == "drelu":
            new = ops.mask_(d, inputs["relu_aux"])
        elif step == "dgelu":
            new = ops.mul_(d, ops.gelu_grad(inputs["gelu_aux"]))
        elif step == "bgrad_result":
            name = spec.outputs[0]
            aux[name] = ops.sum(d, -2, False) if bgrad_axis == "n" else ops.sum(d, -1, True)
        elif step == "bgrad_a":
            aux["bgrada"] = ops.sum(a, -1, False)
        elif step == "bgrad_b":
            aux["bgradb"] = ops.sum(b, -2, False)
        else:  # pragma: no cover - the table and this loop are written together
            raise AssertionError(f"unknown epilog step {step!r}")
        if new is not None:
            d = new
    return d, aux


def apply_inplace(spec: EpilogSpec, d, inputs: dict, ops, *, a=None, b=None, bgrad_axis: str = "n") -> dict:
    """:func:`apply_steps` with an in-place vocabulary: ``d`` is modified, the aux outputs returned."""
    return apply_steps(spec, d, inputs, ops, a=a, b=b, bgrad_axis=bgrad_axis)[1]


class NumpyEpilogOps:
    """The epilog step vocabulary on NumPy arrays, in place and without full-size temporaries
    beyond what the step itself must return."""

    @staticmethod
    def add_(d, x):
        np.add(d, x, out=d)

    @staticmethod
    def relu_(d):
        np.maximum(d, 0, out=d)

    @staticmethod
    def positive_mask(d):
        return np.greater(d, 0)

    @staticmethod
    def gelu_(d):
        # 0.5 d (1 + tanh(k (d + c d^3))) with one temporary of d's size
        t = np.multiply(d, d)
        np.multiply(t, _GELU_C, out=t)
        np.add(t, 1.0, out=t)
        np.multiply(t, d, out=t)
        np.multiply(t, _SQRT_2_OVER_PI, out=t)
        np.tanh(t, out=t)
        np.add(t, 1.0, out=t)
        np.multiply(d, 0.5, out=d)
        np.multiply(d, t, out=d)

    @staticmethod
    def copy(d):
        return d.copy()

    @staticmethod
    def mask_(d, mask):
        np.multiply(d, mask, out=d, casting="unsafe")

    @staticmethod
    def mul_(d, x):
        np.multiply(d, x, out=d, casting="unsafe")

    @staticmethod
    def gelu_grad(x):
        return gelu_tanh_grad(x.astype(np.result_type(x, np.float32), copy=False))

    @staticmethod
    def sum(x, axis, keepdims):
        return np.sum(x, axis=axis, keepdims=keepdims)


NUMPY_OPS = NumpyEpilogOps()
