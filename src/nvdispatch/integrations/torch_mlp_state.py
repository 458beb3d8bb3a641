"""Checkpoints of earlier :class:`~.torch_mlp.FusedMLP` layouts.

A FusedMLP is the ``torch.nn.Sequential`` of ``Linear, act, Linear, ...`` it replaces, so it keeps layer ``i``'s
parameters under ``{2i}.weight`` and ``{2i}.bias`` (the activations sit at the odd indices and hold nothing), and
a Sequential's checkpoint loads as it is. Earlier FusedMLPs kept them under ``weights.{i}`` and ``biases.{i}``;
their checkpoints load too: a load-state-dict pre-hook renames those keys to the Sequential's before Torch reads
them, and a post-hook renames them back in what Torch reports (missing keys, size mismatches), so a strict load
of such a checkpoint fails naming that checkpoint's own keys. An optimizer's checkpoint holds no keys, only the
parameters' order, which was every weight, then every bias: :func:`earlier_optimizer_state` puts it in the
Sequential's order.
"""

from __future__ import annotations

import copy
import functools
import logging
import re

import torch

from ..errors import InvalidArgumentError

__all__ = ["accept_fused_keys", "activation_module", "earlier_optimizer_state", "report_fused_keys"]

log = logging.getLogger("nvdispatch")

_PENDING = "_nvdispatch_fused_loads"  # the instance attribute a load's pre-hook leaves for its post-hook


def _key_names(prefix: str, layers: int) -> dict[str, str]:
    """The earlier FusedMLP's key -> the Sequential's, for every parameter of ``layers`` layers under ``prefix``."""
    names = {}
    for i in range(layers):
        names[f"{prefix}weights.{i}"] = f"{prefix}{2 * i}.weight"
        names[f"{prefix}biases.{i}"] = f"{prefix}{2 * i}.bias"
    return names


def accept_fused_keys(
    module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
) -> None:
    """Load-state-dict pre-hook: rename an earlier FusedMLP checkpoint's keys under ``prefix`` to the Sequential's.

    A key is renamed only where the Sequential's own key is absent: a checkpoint holding both forms of one
    parameter keeps the earlier form as it is, which Torch then reports as unexpected. When the checkpoint holds
    no key of the Sequential's form under ``prefix``, :func:`report_fused_keys` names what Torch reports by the
    earlier keys.
    """
    names = _key_names(prefix, (len(module) + 1) // 2)
    found = [key for key in names if key in state_dict]
    if not found:
        return
    own = set(names.values())
    earlier_form = not any(key in own for key in state_dict)
    renamed = [key for key in found if names[key] not in state_dict]
    for key in renamed:
        state_dict[names[key]] = state_dict.pop(key)
    log.debug("FusedMLP at %r: %d keys of an earlier FusedMLP checkpoint loaded as the Sequential's", prefix,
              len(renamed))  # fmt: skip
    if earlier_form:
        module.__dict__.setdefault(_PENDING, []).append((names, error_msgs, len(error_msgs)))


def report_fused_keys(module, incompatible_keys) -> None:
    """Load-state-dict post-hook: the keys of an earlier FusedMLP checkpoint's load, as that checkpoint names them."""
    pending = module.__dict__.pop(_PENDING, None)
    if not pending:
        return
    for names, error_msgs, first_message in pending:
        back = {sequential: earlier for earlier, sequential in names.items()}
        missing = incompatible_keys.missing_keys
        missing[:] = [back.get(key, key) for key in missing]
        pattern = re.compile("|".join(rf"(?<![\w.]){re.escape(key)}(?![\w.])" for key in back))
        rename = functools.partial(_renamed, back)
        for i in range(first_message, len(error_msgs)):
            error_msgs[i] = pattern.sub(rename, error_msgs[i])


def _renamed(back: dict[str, str], match: re.Match) -> str:
    return back[match.group(0)]


def activation_module(activation: str) -> torch.nn.Module:
    """The Torch module computing FusedMLP's ``activation`` (GELU: the tanh approximation)."""
    return torch.nn.ReLU() if activation == "relu" else torch.nn.GELU(approximate="tanh")


def earlier_optimizer_state(state_dict: dict, layers: int) -> dict:
    """An optimizer's ``state_dict()`` made over an earlier FusedMLP's ``parameters()`` (every weight, then every
    bias: ``weights.0``, ..., ``biases.0``, ...), as one made over the Sequential's order (layer by layer, weight
    then bias), which today's FusedMLP lists. ``state_dict`` is not modified.

    Parameters
    ----------
    state_dict : dict
        ``optimizer.state_dict()`` of an optimizer with one parameter group over the earlier model's
        ``parameters()``.
    layers : int
        The model's Linear layers (``len(widths) - 1``).

    Raises
    ------
    InvalidArgumentError
        When ``state_dict`` is not an optimizer's state dict with one group of ``2 * layers`` parameters.

    Examples
    --------
    >>> import torch
    >>> from nvdispatch.integrations.torch_mlp import FusedMLP
    >>> from nvdispatch.integrations.torch_mlp_state import earlier_optimizer_state
    >>> mlp = FusedMLP([4, 8, 2])
    >>> earlier = torch.optim.SGD([*mlp.weights, *mlp.biases], lr=0.1).state_dict()  # an earlier FusedMLP's order
    >>> earlier["param_groups"][0]["params"]
    [0, 1, 2, 3]
    >>> state = earlier_optimizer_state(earlier, layers=2)
    >>> state["param_groups"][0]["params"]
    [0, 2, 1, 3]
    >>> torch.optim.SGD(mlp.parameters(), lr=0.1).load_state_dict(state)
    """
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise InvalidArgumentError("layers", "a positive int", repr(layers))
    groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
    if not isinstance(groups, list) or len(groups) != 1 or len(groups[0].get("params", ())) != 2 * layers:
        found = "not an optimizer's state dict" if not isinstance(groups, list) else \
            f"{len(groups)} groups of {[len(g.get('params', ())) for g in groups]} parameters"  # fmt: skip
        raise InvalidArgumentError("state_dict", f"an optimizer's state dict, one group of {2 * layers} parameters",
                                   found)  # fmt: skip
    earlier = groups[0]["params"]
    ordered = [pid for layer in range(layers) for pid in (earlier[layer], earlier[layers + layer])]
    converted = copy.copy(state_dict)
    converted["param_groups"] = [{**groups[0], "params": ordered}]
    return converted
