"""Which epilog each GEMM of a fused MLP chain runs, forward and backward: framework-free, shared by the Torch
and JAX chains (:mod:`.torch_mlp`, :mod:`.jax_mlp`).

A chain of ``L`` linear layers ``h_i = act(h_{i-1} @ W_i + b_i)`` (the last without activation) owns both halves
of each activation's backward, so every GEMM carries its elementwise work in its epilog:

* forward, hidden layer: ``RELU_BIAS`` or ``RELU_AUX_BIAS`` (the mask kept for a ``DRELU`` backward) /
  ``GELU_AUX_BIAS`` (the pre-activation kept for ``DGELU``); output layer: ``BIAS``;
* backward, every layer: ``dW_i, db_i`` from one ``BGRADB`` GEMM (``h_{i-1}^T @ dz_i`` and the column sums of
  ``dz_i``);
* backward, the upstream gradient ``dz_{i-1} = (dz_i @ W_i^T) * act'(z_{i-1})``: one ``DGELU`` GEMM taking layer
  ``i-1``'s ``gelu_aux``; for ReLU either one ``DRELU`` GEMM taking its ``relu_aux``, or a plain GEMM whose result
  is masked by ``h_{i-1} > 0`` afterwards (``relu_backward="mask"``: where cuBLASLt runs ``DRELU`` as a separate
  epilogue kernel, the framework's own elementwise mask is cheaper); for the first layer ``dx`` from a plain GEMM.

Examples
--------
>>> from nvdispatch.integrations.mlp_epilogs import chain_epilogs
>>> [(layer.forward, layer.aux, layer.derivative) for layer in chain_epilogs(3, "gelu")]
[('GELU_AUX_BIAS', 'gelu_aux', 'DGELU'), ('GELU_AUX_BIAS', 'gelu_aux', 'DGELU'), ('BIAS', None, None)]
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgumentError, describe

__all__ = ["ACTIVATIONS", "RELU_BACKWARDS", "WEIGHT_GRADIENT", "LayerEpilogs", "chain_epilogs", "check_activation"]

ACTIVATIONS = ("relu", "gelu")
#: how a ReLU chain applies the activation's derivative in its backward: "mask" (plain GEMM, then ``h > 0``) or
#: "drelu" (the ``DRELU`` epilog on the mask its forward kept)
RELU_BACKWARDS = ("mask", "drelu")
#: the epilog of each layer's weight-gradient GEMM ``h_{i-1}^T @ dz_i``: its bias gradient comes with it (weights
#: stored ``(in, out)``; the Torch chain's ``(out, in)`` weights take ``dz_i^T @ h_{i-1}`` with ``BGRADA``)
WEIGHT_GRADIENT = "BGRADB"


@dataclass(frozen=True)
class LayerEpilogs:
    """The epilogs of one layer of a chain.

    ``forward``: the epilog of its forward GEMM (bias input ``bias``); ``aux``: the auxiliary output of that GEMM
    kept for the backward (``"relu_aux"``/``"gelu_aux"``, None when none); ``derivative``: how the backward applies
    this layer's activation derivative to the product ``dz_{i+1} @ W_{i+1}^T`` — the epilog of that GEMM
    (``"DGELU"``/``"DRELU"``, taking ``aux``), ``"mask"`` (a plain GEMM, then zero where this layer's output is
    not positive), or None for the output layer (no activation)."""

    forward: str
    aux: str | None
    derivative: str | None

    @property
    def backward_epilog(self) -> str:
        """The epilog of the GEMM ``dz_{i+1} @ W_{i+1}^T`` that yields this layer's ``dz_i`` (``DEFAULT`` where the
        derivative is a mask applied afterwards, or there is none)."""
        return self.derivative if self.derivative in ("DGELU", "DRELU") else "DEFAULT"


def check_activation(activation: object, relu_backward: object = "mask") -> tuple[str, str]:
    """``(activation, relu_backward)`` validated: :class:`~nvdispatch.errors.InvalidArgumentError` naming the
    argument otherwise."""
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise InvalidArgumentError("activation", "'relu' or 'gelu'", describe(activation))
    if not isinstance(relu_backward, str) or relu_backward not in RELU_BACKWARDS:
        raise InvalidArgumentError("relu_backward", "'mask' or 'drelu'", describe(relu_backward))
    return activation, relu_backward


def chain_epilogs(layers: int, activation: str, relu_backward: str = "mask") -> tuple[LayerEpilogs, ...]:
    """The epilogs of each of ``layers`` layers of a chain with ``activation`` between them (see the module notes).

    Examples
    --------
    >>> from nvdispatch.integrations.mlp_epilogs import chain_epilogs
    >>> [(layer.forward, layer.derivative) for layer in chain_epilogs(2, "relu")]
    [('RELU_BIAS', 'mask'), ('BIAS', None)]
    >>> chain_epilogs(2, "relu", "drelu")[0]
    LayerEpilogs(forward='RELU_AUX_BIAS', aux='relu_aux', derivative='DRELU')
    """
    check_activation(activation, relu_backward)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise InvalidArgumentError("layers", "a positive int", describe(layers))
    if activation == "gelu":
        hidden = LayerEpilogs("GELU_AUX_BIAS", "gelu_aux", "DGELU")
    elif relu_backward == "drelu":
        hidden = LayerEpilogs("RELU_AUX_BIAS", "relu_aux", "DRELU")
    else:
        hidden = LayerEpilogs("RELU_BIAS", None, "mask")
    return (hidden,) * (layers - 1) + (LayerEpilogs("BIAS", None, None),)
