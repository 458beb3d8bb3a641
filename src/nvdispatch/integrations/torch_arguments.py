"""The public functions' arguments as ``nvdispatch::`` operator arguments, and back.

Operator schemas take tensors, numbers and strings. What the public functions take besides (options and
preferences as a dict or dataclass, an epilog as an :class:`~nvdispatch.Epilog` or a name, quantization scales
as numbers or tensors) travels as strings of Python literals: the ``encode_*`` functions are plain Python that
Dynamo traces (they run once, at trace time, and their results are constants of the graph); ``decode`` turns a
string back into what the public function takes. Values are checked by the public function (at trace time by
the fake kernel, which builds the same problem); here only what the operators' schemas need.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
from typing import Any

from .._epilog import Epilog
from .torch_errors import describe, refuse

__all__ = ["encode", "decode", "epilog_name", "epilog_inputs", "EPILOG_INPUT_NAMES", "SCALE_NAMES"]

#: the epilog inputs an operator takes, in its schema's order
EPILOG_INPUT_NAMES = ("bias", "relu_aux", "gelu_aux")
#: FP8 quantization scales: device scales of a, b and d travel as tensors, numbers (any of a..d) as literals
SCALE_NAMES = ("a", "b", "c", "d")
_EPILOG_NAMES = {e.value: e.name for e in Epilog}


def _literal(value: Any) -> Any:
    """``value`` as a Python literal the public function takes back (enums by name, dtypes by name)."""
    if isinstance(value, enum.Enum):
        return value.name
    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return value
    if isinstance(value, dict):
        return tuple(sorted((str(k), _literal(v)) for k, v in value.items()))
    if isinstance(value, (tuple, list)):
        return tuple(_literal(v) for v in value)
    if isinstance(value, type):  # numpy.float32 and the like
        return value.__name__
    name = str(value)  # torch.float32, numpy.dtype('float32')
    return name[6:] if name.startswith("torch.") else name


def encode(value: Any, argument: str) -> str:
    """``options`` / ``preferences`` (None, a dict or a dataclass) as one string; a typed error naming
    ``argument`` for anything else."""
    if value is None:
        return ""
    if isinstance(value, dict):
        items = list(value.items())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    else:
        refuse("InvalidArgumentError", argument, "a dict or an nvdispatch options dataclass", describe(value))
    return repr(tuple((str(k), _literal(v)) for k, v in items))


def decode(text: str) -> dict[str, Any] | None:
    """The dict :func:`encode` wrote, None for the empty string. Pairs of pairs (a dict value) stay tuples of
    pairs, which the public functions accept where they take a dict of names."""
    if not text:
        return None
    return dict(ast.literal_eval(text))


def epilog_name(epilog: Any) -> str:
    """The name of ``epilog`` (an :class:`Epilog`, its name or value, or None); a typed error for anything else."""
    if epilog is None:
        return "DEFAULT"
    if isinstance(epilog, Epilog):
        return epilog.name
    if isinstance(epilog, str) and epilog.upper() in _EPILOG_NAMES.values():
        return epilog.upper()
    if isinstance(epilog, int) and not isinstance(epilog, bool) and epilog in _EPILOG_NAMES:
        return _EPILOG_NAMES[epilog]
    refuse("InvalidArgumentError", "epilog", f"an Epilog ({', '.join(_EPILOG_NAMES.values())})", repr(epilog))


def epilog_inputs(inputs: Any) -> tuple[Any, Any, Any]:
    """``(bias, relu_aux, gelu_aux)`` of ``epilog_inputs`` (None where absent), as the public function checks them."""
    if inputs is None:
        return None, None, None
    if not isinstance(inputs, dict):
        refuse("EpilogInputError", "epilog_inputs", "a dict of named arrays", describe(inputs))
    for key, value in inputs.items():
        if key not in EPILOG_INPUT_NAMES:
            expected = f"keys among {', '.join(map(repr, EPILOG_INPUT_NAMES))}"
            refuse("EpilogInputError", "epilog_inputs", expected, f"unexpected key {key!r}")
        if value is None:
            refuse("EpilogInputError", f"epilog_inputs[{key!r}]", "an array", "None")
    return inputs.get("bias"), inputs.get("relu_aux"), inputs.get("gelu_aux")
