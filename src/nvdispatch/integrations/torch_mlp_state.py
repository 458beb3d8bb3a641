"""A :class:`~.torch_mlp.FusedMLP`'s checkpoints and the ``torch.nn.Sequential`` it stands for.

A FusedMLP keeps layer ``i``'s parameters under ``weights.{i}`` and ``biases.{i}``; the ``Sequential`` of
``Linear, act, Linear, ...`` that :meth:`~.torch_mlp.FusedMLP.from_sequential` takes keeps them under
``{2i}.weight`` and ``{2i}.bias`` (the activations sit at the odd indices and hold nothing). Loading accepts
both: a load-state-dict pre-hook renames a Sequential's keys to the FusedMLP's before Torch reads them, and a
post-hook renames them back in what Torch reports (missing keys, size mismatches), so a strict load of a
Sequential checkpoint fails naming that checkpoint's own keys. The other way, :func:`sequential_of` builds the
Sequential over the FusedMLP's own parameters, whose ``state_dict()`` is a plain Torch checkpoint.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence

import torch

__all__ = ["accept_sequential_keys", "activation_module", "report_sequential_keys", "sequential_of"]

log = logging.getLogger("nvdispatch")

_PENDING = "_nvdispatch_sequential_loads"  # the instance attribute a load's pre-hook leaves for its post-hook


def _key_names(prefix: str, layers: int) -> dict[str, str]:
    """The Sequential's key -> the FusedMLP's key, for every parameter of ``layers`` layers under ``prefix``."""
    names = {}
    for i in range(layers):
        names[f"{prefix}{2 * i}.weight"] = f"{prefix}weights.{i}"
        names[f"{prefix}{2 * i}.bias"] = f"{prefix}biases.{i}"
    return names


def accept_sequential_keys(
    module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
) -> None:
    """Load-state-dict pre-hook: rename a Sequential checkpoint's keys under ``prefix`` to the FusedMLP's.

    A key is renamed only where the FusedMLP's own key is absent: a checkpoint holding both forms of one
    parameter keeps the Sequential's as it is, which Torch then reports as unexpected. When the checkpoint holds
    no key of the FusedMLP's form under ``prefix``, :func:`report_sequential_keys` names what Torch reports by
    the Sequential's keys.
    """
    names = _key_names(prefix, len(module.weights))
    found = [key for key in names if key in state_dict]
    if not found:
        return
    own = set(names.values())
    sequential_form = not any(key in own for key in state_dict)
    renamed = [key for key in found if names[key] not in state_dict]
    for key in renamed:
        state_dict[names[key]] = state_dict.pop(key)
    log.debug("FusedMLP at %r: %d of a Sequential checkpoint's keys loaded as its own", prefix, len(renamed))
    if sequential_form:
        module.__dict__.setdefault(_PENDING, []).append((names, error_msgs, len(error_msgs)))


def report_sequential_keys(module, incompatible_keys) -> None:
    """Load-state-dict post-hook: the keys of a Sequential checkpoint's load, as that checkpoint names them."""
    pending = module.__dict__.pop(_PENDING, None)
    if not pending:
        return
    for names, error_msgs, first_message in pending:
        back = {fused: sequential for sequential, fused in names.items()}
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


def sequential_of(weights: Sequence, biases: Sequence, activation: str, training: bool) -> torch.nn.Sequential:
    """``Linear, act, Linear, ..., Linear`` over ``weights[i]`` (``(out, in)``) and ``biases[i]`` themselves."""
    modules = []
    for i, (weight, bias) in enumerate(zip(weights, biases)):
        if i:
            modules.append(activation_module(activation))
        fan_out, fan_in = weight.shape
        linear = torch.nn.Linear(fan_in, fan_out, device="meta", dtype=weight.dtype)  # no storage made
        linear.weight, linear.bias = weight, bias
        modules.append(linear)
    return torch.nn.Sequential(*modules).train(training)
