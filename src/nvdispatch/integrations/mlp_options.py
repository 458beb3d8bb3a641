"""Process-wide options of the fused MLP chain's kernels (:mod:`.torch_mlp_ops`), for measuring and choosing how
its GEMMs run: each an environment variable, overridden for the process by :func:`set_mlp_options`.

Process-wide, not a context block: the chain's backward runs on autograd's device thread, which a context
variable set around the step does not reach. An option is read where the kernels prepare a GEMM site or choose a
backward form, which happens once per problem (the chain's plan in the plan cache keeps what was prepared): a
change takes effect for problems prepared after it, so set options before the first step (or clear the plan
cache, and with ``plan_cache.clear_tunings()`` the autotuned choices, to prepare again).

``autotune`` (``NVDISPATCH_MLP_AUTOTUNE``): ``"off"`` (default), ``"auto"`` or ``"always"``
    Whether each GEMM site's cuBLASLt algorithm is autotuned when the site is first prepared (not while a CUDA
    graph is being captured): :func:`.lt_tune_once.tune_once`, the candidates timed on scratch buffers of the
    problem's shapes, once per problem and machine (kept in the plan cache's tunings and the GPU's tunings file);
    ``"auto"`` tunes products of at least :data:`.lt_tune_once.MIN_FLOP` operations, ``"always"`` every one.
``autotune_budget`` (``NVDISPATCH_MLP_AUTOTUNE_BUDGET``): seconds of screening per problem (default
    :data:`.lt_tune_once.BUDGET_SECONDS`).
``choice_repeat`` (``NVDISPATCH_MLP_CHOICE_REPEAT``): calls per timed sample of the backward-form choice (default 1)
    The one-pass backward's forms are timed once per problem (:func:`.torch_activation_grad.choose`): 1 times one
    call from an idle stream (its host launch cost included, as an eager step pays it); more fill the stream's
    queue, so a sample is the form's GPU time, what a step replayed from a CUDA graph (``reduce-overhead``) pays.
``gelu_forward`` (``NVDISPATCH_MLP_GELU_FORWARD``): ``"epilogue"`` (default) or ``"split"``
    How a GELU chain's hidden layers run forward when the backward needs their pre-activations: one
    ``GELU_AUX_BIAS`` GEMM writing both the output and the pre-activation, or a ``BIAS`` GEMM writing the
    pre-activation and the framework's GELU (tanh) writing the output from it (the form plain Torch runs; it can
    be the faster where cuBLASLt's aux-output kernels are slower than its plain ones).

Examples
--------
>>> from nvdispatch.integrations.mlp_options import mlp_options, set_mlp_options
>>> before = set_mlp_options(gelu_forward="split")
>>> mlp_options()["gelu_forward"]
'split'
>>> _ = set_mlp_options(**before)
"""

from __future__ import annotations

import logging
import os

from ..errors import InvalidArgumentError, describe
from .lt_tune_once import BUDGET_SECONDS

__all__ = ["AUTOTUNE_MODES", "GELU_FORWARDS", "mlp_options", "set_mlp_options", "autotune_mode", "autotune_budget",
           "choice_repeat", "gelu_forward"]  # fmt: skip

log = logging.getLogger("nvdispatch")

AUTOTUNE_MODES = ("off", "auto", "always")
GELU_FORWARDS = ("epilogue", "split")
_ENV = {"autotune": "NVDISPATCH_MLP_AUTOTUNE", "autotune_budget": "NVDISPATCH_MLP_AUTOTUNE_BUDGET",
        "choice_repeat": "NVDISPATCH_MLP_CHOICE_REPEAT", "gelu_forward": "NVDISPATCH_MLP_GELU_FORWARD"}  # fmt: skip
#: the options set for the process (None: the environment variable's, else the default)
_set: dict[str, object] = {"autotune": None, "autotune_budget": None, "choice_repeat": None, "gelu_forward": None}


def _choice(name: str, choices: tuple[str, ...], default: str) -> str:
    value = _set[name]
    if value is not None:
        return value  # type: ignore[return-value]
    env = os.environ.get(_ENV[name], "").strip().lower() or default
    if env not in choices:
        raise InvalidArgumentError(_ENV[name], f"one of {', '.join(choices)}", repr(env))
    return env


def autotune_mode() -> str:
    """The ``autotune`` option: ``"off"``, ``"auto"`` or ``"always"``."""
    return _choice("autotune", AUTOTUNE_MODES, "off")


def autotune_budget() -> float:
    """The ``autotune_budget`` option: seconds of screening per problem."""
    value = _set["autotune_budget"]
    if value is not None:
        return float(value)  # type: ignore[arg-type]
    env = os.environ.get(_ENV["autotune_budget"], "").strip()
    if not env:
        return BUDGET_SECONDS
    try:
        budget = float(env)
    except ValueError:
        budget = -1.0
    if not budget > 0:
        raise InvalidArgumentError(_ENV["autotune_budget"], "a positive number of seconds", repr(env))
    return budget


def choice_repeat() -> int:
    """The ``choice_repeat`` option: calls per timed sample of the backward-form choice."""
    value = _set["choice_repeat"]
    if value is not None:
        return int(value)  # type: ignore[call-overload]
    env = os.environ.get(_ENV["choice_repeat"], "").strip()
    if not env:
        return 1
    try:
        repeat = int(env)
    except ValueError:
        repeat = 0
    if repeat < 1:
        raise InvalidArgumentError(_ENV["choice_repeat"], "a positive int", repr(env))
    return repeat


def gelu_forward() -> str:
    """The ``gelu_forward`` option: ``"epilogue"`` or ``"split"``."""
    return _choice("gelu_forward", GELU_FORWARDS, "epilogue")


def mlp_options() -> dict[str, object]:
    """Every option's value now."""
    return {"autotune": autotune_mode(), "autotune_budget": autotune_budget(), "choice_repeat": choice_repeat(),
            "gelu_forward": gelu_forward()}


def set_mlp_options(**options) -> dict[str, object]:
    """Set options for the process (a value of None: back to the environment variable's, else the default); returns
    what was set before, to pass back. A name or value not taken is a typed error naming it, and nothing is set.

    Raises
    ------
    InvalidArgumentError
        Naming an unknown option or a value outside its choices.
    """
    checked = {}
    for name, value in options.items():
        if name not in _set:
            raise InvalidArgumentError(name, f"one of the options {', '.join(_set)}", "an unknown option")
        if value is None:
            checked[name] = None
        elif name == "autotune_budget":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InvalidArgumentError(name, "a positive number of seconds", describe(value))
            checked[name] = float(value)
        elif name == "choice_repeat":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(name, "a positive int", describe(value))
            checked[name] = value
        else:
            choices = AUTOTUNE_MODES if name == "autotune" else GELU_FORWARDS
            if not isinstance(value, str) or value not in choices:
                raise InvalidArgumentError(name, f"one of {', '.join(choices)}", describe(value))
            checked[name] = value
    before = {name: _set[name] for name in checked}
    _set.update(checked)
    if checked:
        log.debug("fused MLP options set: %s", checked)
    return before
