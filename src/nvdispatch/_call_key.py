"""Call keys: the cheap signature of a call that the plan cache is asked first, for matmul and fft alike.

A call key holds what the plan of a call depends on and nothing that costs much to read: the operation and
its arguments other than arrays (epilog, options, axes, norm... as given), the scalars' keys (their class; a
Python int's value too, ``_matmul_problem.scalar_key``), the signature of each array (its adapter's
``signature``: dtype, shape, strides, device...), the backend state (``_backends.registry``:
``current_state().key``, ``global_key``) and, for a matmul, the reading of the framework's precision settings
(its adapter's ``precision_key``: TF32 switches, autocast regions, JAX's default precision; see
:mod:`nvdispatch._precision`; where the adapter has ``precision_key_of``, the reading for the first operand's
device: a Torch CPU call's key does not hold the CUDA TF32 switch), so the call after a setting changed finds
another plan. A call whose key is cached runs that plan; any other takes the full path (detect, validate, select,
plan), which keeps the plan under the key when every call with that key validates and selects the same way. A
call with an argument that cannot be part of a key (an unhashable value, an array whose class has no signature)
has no key: it takes the full path every time.

Per array class, :func:`class_keys` gives the adapter's functions the route needs (:class:`ClassKeys`), looked
up once per class. The commonest matmuls (a plain product; a bias alone; alpha 1, no ``c``, options or scales)
have short keys, ``(form, signature(a), signature(b)[, signature(bias)])``: their *form* (every part of the
key but the signatures) is also what the call-key memo (:mod:`nvdispatch._call_key_memo`) remembers plan
handles under for classes with a guard. The compiled front (``_hotpath.c``) builds exactly these short keys and
forms, from the fields of :class:`ClassKeys` and the backend registry's attributes. A transform's key is
``(form, signature(x))`` with its form from :func:`fft_form`; a transform also has an *any-length key*
(:func:`any_length_key`: the form, the operand's dtype and rank), under which the plan serving every extent of
the operand is kept where the executor has one.

A call key is never ``repr()``-ed or otherwise serialised: it is hashed once per lookup.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import fields
from typing import Any, NamedTuple

import numpy as np

from ._adapters import Adapter, adapter_for_class, call_key_classes
from ._backends import registry
from ._call_key_memo import CallKeyMemo
from ._fp8 import MatmulQuantizationScales
from ._matmul_problem import dict_form_key, scalar_key

__all__ = [
    "ClassKeys",
    "class_keys",
    "SCALARS",
    "short_form",
    "call_state",
    "short_key",
    "long_key",
    "fft_form",
    "any_length_key",
    "int_seq",
]

_SCALE_NAMES = tuple(f.name for f in fields(MatmulQuantizationScales))


class ClassKeys(NamedTuple):
    """What the route uses of an array class's adapter (the compiled front reads its first three fields,
    ``precision`` and ``precision_of``, by position).

    ``plain``
        no view and no wrap: a cached call passes the caller's arrays to the plan and returns its result as
        it is (the calls the compiled front serves);
    ``signature``
        the adapter's signature function for the class; None: calls with these arrays have no key;
    ``memo``
        the :class:`~nvdispatch._call_key_memo.CallKeyMemo` of the adapter's guard, or None;
    ``view``
        the adapter's ``view`` (the view of an array executors receive), or None where that is the array;
    ``wraps``
        whether results go back through the adapter's ``wrap``;
    ``adapter``
        the adapter itself (its ``wrap``, ``check_stream``), or None where no adapter claims the class;
    ``precision``
        the adapter's ``precision_key`` (a reading of its framework's precision settings, part of every matmul
        key), or None where the framework has no precision convention;
    ``rank_signature``
        the adapter's ``rank_signature_for`` the class (dtype and rank: the part of the key of plans serving
        every extent, see :func:`any_length_key`), or None;
    ``precision_of``
        the adapter's ``precision_key_of``: the reading for a call whose first operand is the argument (only the
        settings a product on its device depends on), which matmul keys hold in place of ``precision()``; or None.
    """

    plain: bool
    signature: Callable[[Any], Hashable] | None
    memo: CallKeyMemo | None
    view: Callable[[Any], Any] | None
    wraps: bool
    adapter: Adapter | None
    precision: Callable[[], Hashable] | None
    rank_signature: Callable[[Any], Hashable] | None
    precision_of: Callable[[Any], Hashable] | None = None


def _class_keys_of(adapter: Adapter | None, cls: type) -> ClassKeys:
    sig = None if adapter is None else adapter.signature_for(cls)
    guard = None if sig is None else adapter.guard_for(cls)
    view = None if adapter is None else adapter.view
    wraps = adapter is not None and adapter.wraps
    memo = None if guard is None else CallKeyMemo(guard)
    precision = None if sig is None else adapter.precision_key
    ranked = None if sig is None else adapter.rank_signature_for(cls)
    precision_of = None if sig is None else adapter.precision_key_of
    return ClassKeys(view is None and not wraps, sig, memo, view, wraps, adapter, precision, ranked, precision_of)


def class_keys(cls: type) -> ClassKeys:
    """The :class:`ClassKeys` of array class ``cls`` (cached in ``_adapters.call_key_classes``, which the
    adapter registry clears when adapters change)."""
    entry = call_key_classes.get(cls)
    if entry is None:
        entry = call_key_classes[cls] = _class_keys_of(adapter_for_class(cls), cls)
    return entry


def _concrete_subclasses(cls: type) -> set[type]:
    subs = set(cls.__subclasses__())
    return {c for c in subs if not c.__subclasses__()} | {d for c in subs for d in _concrete_subclasses(c)}


#: scalar classes a call key may hold (it holds the class, not the value): Python's and NumPy's numbers
SCALARS = frozenset({int, float, complex} | {c for c in _concrete_subclasses(np.number) if c is not np.timedelta64})


_current_state = registry.current_state  # (bound once: a ContextVar's get)


def _signature(entry: ClassKeys, cls: type, x) -> Any:
    """``x``'s part of a key whose first array is of class ``cls``: its signature; for an array of another
    class (a Torch ``Parameter`` beside plain tensors), that class and its own signature. None when its class
    has no signature (the call has no key)."""
    other = x.__class__
    if other is cls:
        return entry.signature(x)
    own = _signature_of(other)
    return None if own is None else (other, own(x))


def _signature_of(cls: type):
    """The signature function of array class ``cls`` (its :class:`ClassKeys`, looked up once per class)."""
    entry = call_key_classes.get(cls)
    return (entry if entry is not None else class_keys(cls))[1]


def call_state(entry: ClassKeys) -> tuple:
    """What of a matmul call's key is not its arrays' but chooses its plan now: the backend state and the
    framework's precision settings (for keys that prepared calls of class ``entry`` are kept under).

    Examples
    --------
    >>> import numpy as np
    >>> len(call_state(class_keys(np.ndarray)))
    3
    """
    read = entry[6]
    return _current_state().key, registry.global_key, None if read is None else read()


def short_form(entry: ClassKeys, a, b, alpha, epilog, epilog_inputs):
    """``(form, arrays, key)`` of a short-form matmul (no ``c``, ``beta``, options, preferences or scales; no
    epilog inputs or a bias alone; operands sharing ``entry``'s signature function): the key, :func:`short_key`
    of the form and the arrays, is None for a class with a memo, which looks the form up first; ``(None, None,
    None)`` for another form."""
    alpha_key = alpha.__class__
    if alpha_key not in SCALARS:
        return None, None, None
    if alpha_key is int and alpha != 1:
        alpha_key = scalar_key(alpha)  # (the commonest alpha, 1 or a float, is keyed by its class)
    cls = a.__class__
    sig = entry[1]
    # the framework's precision settings (for a's device where the adapter reads them so; None: it has no
    # convention), read on every call
    read_of, read = entry[8], entry[6]
    precision = read_of(a) if read_of is not None else None if read is None else read()
    if epilog_inputs is None:
        if b.__class__ is cls:
            classes = cls
        elif _signature_of(b.__class__) is sig:  # a Parameter beside a tensor, say
            classes = (cls, b.__class__)
        else:
            return None, None, None
        form = (classes, epilog, alpha_key, _current_state().key, registry.global_key, precision)
        return form, (a, b), (None if entry[2] is not None else (form, sig(a), sig(b)))
    if epilog_inputs.__class__ is dict and len(epilog_inputs) == 1 and "bias" in epilog_inputs:
        bias = epilog_inputs["bias"]
        if b.__class__ is cls is bias.__class__:
            classes = cls
        elif _signature_of(b.__class__) is sig is _signature_of(bias.__class__):  # Parameters beside tensors
            classes = (cls, b.__class__, bias.__class__)
        else:
            return None, None, None
        form = (classes, epilog, "bias", alpha_key, _current_state().key, registry.global_key, precision)
        return form, (a, b, bias), (None if entry[2] is not None else (form, sig(a), sig(b), sig(bias)))
    return None, None, None


def short_key(form: tuple, entry: ClassKeys, arrays: tuple) -> tuple:
    """The key of a short form: the form and each array's signature (they all share ``entry``'s)."""
    sig = entry.signature
    if len(arrays) == 2:
        return form, sig(arrays[0]), sig(arrays[1])
    return form, sig(arrays[0]), sig(arrays[1]), sig(arrays[2])


def long_key(entry, a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, scales):
    """The key of a matmul of another form than the short ones (``c``/``beta``, options, preferences, epilog
    inputs other than a bias alone, operands of more than one class, FP8 scales): the operands' signatures, the
    scalars' classes, the epilog, options, preferences, scales, backend state and precision settings; None when
    the call does not qualify (it takes the full path)."""
    if alpha.__class__ not in SCALARS:
        return None
    cls = a.__class__
    if scales is not None:
        scales = _scales_key(entry, cls, scales)
        if scales is None:
            return None
    if c is None:
        if beta is not None:
            return None
        c_sig = None
    elif beta is not None and beta.__class__ not in SCALARS:
        return None
    else:
        c_sig = (_signature(entry, cls, c), scalar_key(beta))
    if epilog_inputs is None:
        inputs = None
    elif epilog_inputs.__class__ is dict:
        inputs = tuple((name, _signature(entry, cls, value)) for name, value in epilog_inputs.items())
    else:
        return None
    if options.__class__ is dict:  # the documented dict form (unhashable values: TypeError)
        options = dict_form_key(options)
    if preferences.__class__ is dict:
        preferences = dict_form_key(preferences)
    b_sig = _signature(entry, cls, b)
    if b_sig is None or (c_sig is not None and c_sig[0] is None) or (inputs and any(s is None for _, s in inputs)):
        return None
    return (
        "matmul",
        cls,
        entry.signature(a),
        b_sig,
        epilog,
        inputs,
        scalar_key(alpha),
        c_sig,
        options,
        preferences,
        scales,
        _current_state().key,
        registry.global_key,
        _precision(entry, a),
    )


def _precision(entry: ClassKeys, a) -> Hashable:
    """The reading of the framework's precision settings a matmul key with first operand ``a`` holds."""
    if entry.precision_of is not None:
        return entry.precision_of(a)
    return None if entry.precision is None else entry.precision()


def _scales_key(entry, cls, scales):
    """FP8 scales' part of a key: each given scale's name with a Python number's class (its value checked
    here as planning checks it: finite, non-zero) or an array's signature; None where the call must take the
    full path (an unknown form or name, a bad value: the full path reports it)."""
    if scales.__class__ is dict:
        items = scales.items()
    elif scales.__class__ is MatmulQuantizationScales:
        items = ((name, getattr(scales, name)) for name in _SCALE_NAMES)
    else:
        return None
    parts = []
    for name, value in items:
        if name not in _SCALE_NAMES:
            return None
        if value is None:
            continue
        if value.__class__ is float or value.__class__ is int:
            if value == 0 or not math.isfinite(value):
                return None
            parts.append((name, value.__class__))
        else:
            signature = _signature(entry, cls, value)
            if signature is None:
                return None
            parts.append((name, signature))
    return tuple(sorted(parts))


def int_seq(v):
    """``v`` as a key part: None, an int, or a tuple of ints; False when it is anything else (arrays of
    axes, ...): such calls are validated in full every time instead of growing the cache."""
    if v is None or v.__class__ is int:
        return v
    if v.__class__ in (tuple, list) and all(e.__class__ is int for e in v):
        return tuple(v)
    return False


def fft_form(func: str, x, n, axis, s, axes, norm):
    """The form of a transform's key (every part but the signature: the key is ``(form, signature(x))``, and the
    memo looks handles up by form); None for a call without a key."""
    if s is not None:
        s = int_seq(s)
    if axes is not None:
        axes = int_seq(axes)
    if s is False or axes is False:
        return None
    return ("fft", func, x.__class__, n, axis, s, axes, norm, _current_state().key, registry.global_key)


#: the middle of an any-length key (a call key is ``(form, signature)``: the two never meet)
_ANY_LENGTH = "any length"


def any_length_key(form: tuple, rank_signature: Hashable) -> tuple:
    """The key of the plan serving every extent of the operands of one ``rank_signature`` (dtype and rank,
    :attr:`ClassKeys.rank_signature`) for a transform's ``form``: of the length the form gives (``n``/``s``), else
    of the operand's own (an ``s`` keeping an extent, -1, has no such plan)."""
    return (form, _ANY_LENGTH, rank_signature)
