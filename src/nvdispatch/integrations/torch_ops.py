"""The ``nvdispatch::`` Torch operators, and the functions that call them in place of the public functions.

Importing this module registers the operators (``torch.library.Library``: a schema, one kernel for every device,
a fake kernel, an autograd formula); :mod:`.torch_entry` imports it the first time Torch needs them.

``nvdispatch::matmul(a, b, c, bias, relu_aux, gelu_aux, scale_a, scale_b, scale_c, scale_d, alpha, beta, epilog,
options, preferences, host_scales) -> Tensor[]``
    :func:`nvdispatch.matmul`: every epilog, ``alpha``/``beta``/``c``, FP8 with scales (device scales as tensors,
    numbers in ``host_scales``) and ``result_amax``. Returns the result, then the epilog's aux outputs in its
    order, then ``result_amax`` where asked. ``options``/``preferences``/``host_scales`` are strings of literals
    (:mod:`.torch_arguments`).
``nvdispatch::fft(x, func, n, axis, s, axes, norm) -> Tensor``
    ``nvdispatch.fft.<func>`` for ``func`` among ``fft, ifft, rfft, irfft, hfft, ihfft`` (``n``, ``axis``) and
    ``fftn, ifftn, rfftn, irfftn`` (``s``, ``axes``); ``fft2`` & co. are the n-D ones over ``axes=(-2, -1)``.
``nvdispatch::convolve(x, h, n, axis) -> Tensor``
    :func:`nvdispatch.fft.convolve`.

Real kernels call the public function on the real tensors, under :func:`.torch_reentry.in_kernel` so that it
takes the route (the executors the backend state selects when the kernel runs), and hold the outputs to
:mod:`.torch_layouts`; fake kernels build the same problem on the fake tensors. Autograd formulas:
:mod:`.torch_autograd`.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any

import torch
from torch import Tensor

from .. import fft as fft_module
from .. import linalg
from .._epilog import EPILOGS
from .._plan_cache import plan_cache
from . import torch_autocast, torch_autograd, torch_func, torch_jvp, torch_recorded
from . import torch_layouts as layouts
from .torch_arguments import SCALE_NAMES, decode, encode, epilog_inputs, epilog_name
from .torch_errors import describe, fake_kernel, refuse
from .torch_reentry import in_kernel

__all__ = [
    "matmul_op",
    "fft_op",
    "convolve_op",
    "ENTRIES",
    "call_matmul",
    "call_fft",
    "call_convolve",
]

_INPUT_NAMES = ("bias", "relu_aux", "gelu_aux")
#: epilog name -> its aux outputs' names, in the order the operator returns them
_OUTPUT_NAMES = {spec.epilog.name: spec.outputs for spec in EPILOGS.values()}
#: epilogs whose backward needs the pre-activation: the operator keeps it (as their *_AUX form) when autograd records
_KEEP_PRE_ACTIVATION = {"GELU": "GELU_AUX", "GELU_BIAS": "GELU_AUX_BIAS"}
_FP8 = {torch.float8_e4m3fn, torch.float8_e5m2}
_ONE_D = ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")
_N_D = ("fftn", "ifftn", "rfftn", "irfftn")
_CACHE_SIZE = 256


# -- the operators ---------------------------------------------------------------------------------------------
_LIB = torch.library.Library("nvdispatch", "DEF")  # kept: the registrations live as long as this module
_LIB.define(
    "matmul(Tensor a, Tensor b, Tensor? c, Tensor? bias, Tensor? relu_aux, Tensor? gelu_aux, Tensor? scale_a, "
    "Tensor? scale_b, Tensor? scale_c, Tensor? scale_d, Scalar alpha, Scalar? beta, str epilog, str options, "
    "str preferences, str host_scales) -> Tensor[]"
)
_LIB.define("fft(Tensor x, str func, SymInt? n, int axis, SymInt[]? s, int[]? axes, str norm) -> Tensor")
_LIB.define("convolve(Tensor x, Tensor h, SymInt? n, int axis) -> Tensor")


def _named(bias, relu_aux, gelu_aux) -> dict[str, Tensor]:
    return {k: v for k, v in zip(_INPUT_NAMES, (bias, relu_aux, gelu_aux)) if v is not None}


def _scales(tensors, host_scales: str) -> dict[str, Any] | None:
    scales = {k: v for k, v in zip(SCALE_NAMES, tensors) if v is not None}
    scales.update(decode(host_scales) or {})
    return scales or None


_layout_cache: dict[tuple, tuple] = {}


def _tensor_key(x):
    return None if x is None else (x.dtype, x.shape, x.stride(), x.get_device())


def matmul_layout(a, b, c, inputs, alpha, beta, epilog, options, preferences, scales):
    """``(problem, output specs)`` of a matmul operator call on these tensors (kept per metadata for real ones)."""
    try:
        key = (
            *(_tensor_key(x) for x in (a, b, c)),
            tuple((k, _tensor_key(v)) for k, v in inputs.items()),
            tuple((k, _tensor_key(v) if isinstance(v, Tensor) else v) for k, v in (scales or {}).items()),
            alpha.__class__,
            beta.__class__,
            epilog,
            repr(options),
            repr(preferences),
        )
        found = _layout_cache.get(key)
    except TypeError:  # symbolic sizes (a fake kernel under dynamic shapes): not kept
        key = found = None
    if found is not None:
        return found
    problem = layouts.matmul_problem(a, b, c, inputs, alpha, beta, epilog, options, preferences, scales)
    found = (problem, layouts.matmul_outputs(problem))
    if key is not None:
        if len(_layout_cache) >= _CACHE_SIZE:
            _layout_cache.clear()
        _layout_cache[key] = found
    return found


# Dynamo never traces matmul_layout into a graph (kernels, fake kernels, batching rules and formulas call it, which
# Dynamo does not trace). Where a compiled frame falls back to eager (torch.func.grad(torch.compile(f)): Torch runs
# f eagerly), Dynamo tries each frame that runs, and would compile this one on its own, guarding on the cache that
# the frame then fills ("Guard failed on the same frame it was created"): its frames are skipped (no cost per call).
_skip_frames = getattr(getattr(torch._dynamo, "decorators", None), "skip", None)
if _skip_frames is not None:
    _skip_frames(matmul_layout)


def _matmul_kernel(
    a,
    b,
    c,
    bias,
    relu_aux,
    gelu_aux,
    scale_a,
    scale_b,
    scale_c,
    scale_d,
    alpha,
    beta,
    epilog,
    options,
    preferences,
    host_scales,
):
    inputs = _named(bias, relu_aux, gelu_aux)
    scales = _scales((scale_a, scale_b, scale_c, scale_d), host_scales)
    opts, prefs = decode(options), decode(preferences)
    with in_kernel():
        r = linalg.matmul(
            a,
            b,
            c,
            alpha=alpha,
            beta=beta,
            epilog=epilog,
            epilog_inputs=inputs or None,
            options=opts,
            preferences=prefs,
            quantization_scales=scales,
        )
    if not isinstance(r, tuple):
        return [layouts.dense(r, a)]
    problem, specs = matmul_layout(a, b, c, inputs, alpha, beta, epilog, opts, prefs, scales)
    outputs = [r[0], *(r[1][s.name] for s in specs[1:])]
    return [layouts.conform(t, s, problem, a) for t, s in zip(outputs, specs)]


def _matmul_fake(
    a,
    b,
    c,
    bias,
    relu_aux,
    gelu_aux,
    scale_a,
    scale_b,
    scale_c,
    scale_d,
    alpha,
    beta,
    epilog,
    options,
    preferences,
    host_scales,
):
    inputs = _named(bias, relu_aux, gelu_aux)
    scales = _scales((scale_a, scale_b, scale_c, scale_d), host_scales)
    _, specs = matmul_layout(a, b, c, inputs, alpha, beta, epilog, decode(options), decode(preferences), scales)
    return layouts.empty_outputs(specs, a)


def _fft_kernel(x, func, n, axis, s, axes, norm):
    with in_kernel():
        if func in _ONE_D:
            y = getattr(fft_module, func)(x, n, axis, norm)
        else:
            y = getattr(fft_module, func)(x, s, axes, norm)
        # torch.fft's ifft of real input is a lazily conjugated view: the operator's output is a plain tensor
        return layouts.dense(y, x).resolve_conj()


def _fft_fake(x, func, n, axis, s, axes, norm):
    return layouts.empty_outputs([layouts.fft_output(layouts.fft_problem(func, x, n, axis, s, axes, norm))], x)[0]


def _convolve_kernel(x, h, n, axis):
    with in_kernel():
        y = fft_module.convolve(x, h, n=n, axis=axis)
    return layouts.dense(y, x)


def _convolve_fake(x, h, n, axis):
    return layouts.empty_outputs([layouts.convolve_output(layouts.convolve_problem(x, h, n, axis))], x)[0]


for _name, _kernel, _fake in (
    ("matmul", _matmul_kernel, _matmul_fake),
    ("fft", _fft_kernel, _fft_fake),
    ("convolve", _convolve_kernel, _convolve_fake),
):
    # one kernel for every device: the public function dispatches by the operands' device itself
    _LIB.impl(_name, _kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"nvdispatch::{_name}", fake_kernel(_fake), lib=_LIB)
    # meta tensors (shape inference, models built on "meta") get the result's layout; Torch releases before 2.13
    # register the fake kernel for Meta themselves, and refuse a second Meta kernel
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"nvdispatch::{_name}", "Meta"):
        _LIB.impl(_name, _fake, "Meta")
del _name, _kernel, _fake

matmul_op = torch.ops.nvdispatch.matmul.default
fft_op = torch.ops.nvdispatch.fft.default
convolve_op = torch.ops.nvdispatch.convolve.default
#: in an autocast region each operator computes as its public function does there (one rule each, see torch_autocast)
_AUTOCAST_CASTS = {"matmul": torch_autocast.matmul_cast, "fft": torch_autocast.fft_cast,
                   "convolve": torch_autocast.convolve_cast}  # fmt: skip
torch_autocast.install(_LIB, "matmul", matmul_op, _AUTOCAST_CASTS["matmul"])
torch_autocast.install(_LIB, "fft", fft_op, _AUTOCAST_CASTS["fft"])
torch_autocast.install(_LIB, "convolve", convolve_op, _AUTOCAST_CASTS["convolve"])
#: the operators' autograd formulas, registered on them, and as autograd Functions for eager calls (the same
#: formulas without the dispatcher's Python autograd kernel: a recorded eager call costs a fraction as much)
_functions = torch_autograd.register(
    _LIB, {"matmul": _matmul_kernel, "fft": _fft_kernel, "convolve": _convolve_kernel}, matmul_layout
)
#: torch.func: the operators' batching rules, and their formulas (backward and jvp) as Functions for transforms
torch_func.register_batching_rules(_LIB, matmul_layout)
torch_jvp.install(matmul_layout)


# -- the calls: public arguments -> operators -> public results -------------------------------------------------
_OPS = {"matmul": matmul_op, "fft": fft_op, "convolve": convolve_op}


def _call(name: str, *args):
    """Operator ``name`` on ``args``: under a ``torch.func`` transform (eager or traced) through
    :func:`.torch_func.call`; the operator itself while Torch traces a program (one node of its graph); eagerly (a
    call autograd records) its real kernel and formula as an autograd Function, without the dispatcher's Python
    autograd kernel."""
    if torch_func.transforms_active():  # torch.func: the formulas (with a jvp) as a Function with a vmap rule
        return torch_func.call(name, *args)
    if torch.compiler.is_compiling() or args[0].is_meta:  # (the route refused operands on mixed devices)
        return _OPS[name](*args)  # traced: one node; meta tensors: the operator's meta kernel
    # the operator's autocast kernel, which the Function does not pass through
    device_type = args[0].device.type
    if device_type in torch_autocast.DEVICE_TYPES and torch.is_autocast_enabled(device_type):
        return torch_autocast.in_region(device_type, _AUTOCAST_CASTS[name], _functions[name].apply, args)
    return _functions[name].apply(*args)


def _number(value: Any, argument: str):
    """A Python number for the operator's schema (NumPy scalars too; a 0-d tensor is read eagerly only). A traced
    program's symbolic number (``alpha=x.shape[-1] ** -0.5`` under ``dynamic=True``) stays symbolic."""
    if value is None or (isinstance(value, (int, float, complex, torch.SymInt, torch.SymFloat))
                         and not isinstance(value, bool)):  # fmt: skip
        return value
    if isinstance(value, Tensor):
        if torch.compiler.is_compiling():
            refuse(
                "InvalidArgumentError",
                argument,
                "a Python number inside torch.compile/torch.export (a tensor is read on the host)",
                describe(value),
            )
        return value.item()
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return value.item()
    refuse("InvalidArgumentError", argument, "a real or complex scalar", describe(value))


def _split_scales(scales) -> tuple[list, str]:
    """The quantization scales as operator arguments: tensors by name (a, b, c, d), numbers as literals."""
    if scales is None:
        return [None] * 4, ""
    items = scales.items() if isinstance(scales, dict) else ((k, getattr(scales, k, None)) for k in SCALE_NAMES)
    tensors: dict[str, Tensor] = {}
    numbers: dict[str, Any] = {}
    for name, value in items:
        if name not in SCALE_NAMES:
            refuse(
                "InvalidArgumentError",
                "quantization_scales",
                "keys among 'a', 'b', 'c', 'd'",
                f"unknown key(s) [{name!r}]",
            )
        if isinstance(value, Tensor):
            tensors[name] = value
        elif value is not None:
            numbers[name] = value
    return [tensors.get(k) for k in SCALE_NAMES], encode(numbers, "quantization_scales") if numbers else ""


def call_matmul(a, b, c, alpha, beta, epilog, inputs, options, preferences, scales, call_key=None):
    """``nvdispatch.matmul`` through ``nvdispatch::matmul``: the public function's result (with its aux dict).
    ``call_key``: the call's key in the plan cache (None: it has none); a call autograd records keeps a
    :class:`~.torch_recorded.RecordedMatmulPlan` under it where it can, which serves its repeats."""
    name = epilog_name(epilog)
    bias, relu_aux, gelu_aux = epilog_inputs(inputs)
    scale_tensors, host_scales = _split_scales(scales)
    operands = [x for x in (a, b, c, bias, relu_aux, gelu_aux) if x is not None]
    recorded = torch.is_grad_enabled() and any(x.requires_grad for x in operands)
    if recorded and (a.dtype in _FP8 or b.dtype in _FP8):
        refuse(
            "UnsupportedDtypeError",
            "a" if a.dtype in _FP8 else "b",
            "no FP8 operands in a call autograd records (FP8 matmuls have no derivative here)",
            str(a.dtype if a.dtype in _FP8 else b.dtype),
            "run it under torch.no_grad(), or detach the operands that require grad",
        )
    transformed = torch_func.transforms_active()  # torch.func: its jvp needs the pre-activation too
    op_epilog = _KEEP_PRE_ACTIVATION.get(name, name) if recorded or transformed else name
    if recorded and call_key is not None and not transformed and not torch.compiler.is_compiling():
        named = _named(bias, relu_aux, gelu_aux)
        if torch_recorded.keeps(a, b, alpha, c, beta, named, options, preferences, scales):
            return _run_recorded(call_key, a, b, named, op_epilog, name)
    outs = _call(
        "matmul",
        a,
        b,
        c,
        bias,
        relu_aux,
        gelu_aux,
        *scale_tensors,
        _number(alpha, "alpha"),
        _number(beta, "beta"),
        op_epilog,
        encode(options, "options"),
        encode(preferences, "preferences"),
        host_scales,
    )
    if op_epilog != name:  # the kept pre-activation is the backward formula's, not the caller's
        return outs[0]
    names = _OUTPUT_NAMES[name]
    if len(outs) > len(names) + 1:
        names = (*names, "result_amax")
    if not names:
        return outs[0]
    return outs[0], dict(zip(names, outs[1:]))


def _run_recorded(call_key, a, b, named: dict, op_epilog: str, name: str):
    """A recorded call by the :class:`~.torch_recorded.RecordedMatmulPlan` kept under its key (see
    :func:`call_matmul`); through the operator where another plan is cached there."""
    input_name, x = next(iter(named.items()), (None, None))
    layout = matmul_layout(a, b, None, named, 1, None, op_epilog, None, None, None)
    plan = torch_recorded.acquire(call_key, a, b, input_name, x, op_epilog, name, layout)
    try:
        if isinstance(plan, torch_recorded.RecordedMatmulPlan):
            return plan.direct(a, b) if x is None else plan.direct(a, b, x)
    finally:
        plan_cache.let_go(plan)
    outs = _call("matmul", a, b, None, *(named.get(k) for k in _INPUT_NAMES), *([None] * 4), 1, None, op_epilog,
                 "", "", "")  # fmt: skip
    if op_epilog != name or len(outs) == 1:
        return outs[0]
    return outs[0], dict(zip(_OUTPUT_NAMES[name], outs[1:]))


def _int_or_none(value: Any, argument: str, expected: str = "an int (or None)"):
    """``value`` as an int (a symbolic one stays symbolic). Eagerly NumPy integers are taken as the public
    functions take them; Dynamo traces a NumPy scalar as an array, which is refused naming the argument."""
    if value is None or (isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool)):
        return value
    if not torch.compiler.is_compiling() and not isinstance(value, (bool, float, complex, str, bytes)):
        try:
            return operator.index(value)
        except TypeError:
            pass
    refuse("InvalidArgumentError", argument, expected, describe(value),
           "inside torch.compile pass a Python int (int(value)): Dynamo traces NumPy scalars as arrays")  # fmt: skip


def _int(value: Any, argument: str):
    if value is None:
        refuse("InvalidArgumentError", argument, "an int", "None")
    return _int_or_none(value, argument, "an int")


def _ints(value: Any, argument: str, none_as: int | None = None):
    """A sequence of ints as a list (None entries as ``none_as``); None stays None."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        refuse("InvalidArgumentError", argument, "a sequence of ints (or None)", repr(value))
    out = []
    for v in value:
        if v is None and none_as is not None:
            v = none_as
        out.append(_int_or_none(v, argument))
    return out


def call_fft(func: str, x, n=None, axis=-1, s=None, axes=None, norm="backward"):
    """``nvdispatch.fft.<func>`` through ``nvdispatch::fft``. Integer and boolean input becomes Torch's default
    floating dtype first, as ``torch.fft`` (and the public function on Torch tensors) does."""
    if not (x.is_floating_point() or x.is_complex()):
        x = x.to(torch.get_default_dtype())
    axis = _int(axis, "axis")
    norm = "backward" if norm is None else norm
    if not isinstance(norm, str):
        refuse("InvalidArgumentError", "norm", "'backward', 'ortho' or 'forward'", repr(norm))
    return _call("fft", x, func, _int_or_none(n, "n"), axis, _ints(s, "s", none_as=-1), _ints(axes, "axes"), norm)


def call_convolve(x, h, n=None, axis=-1):
    """``nvdispatch.fft.convolve`` through ``nvdispatch::convolve``."""
    axis = _int(axis, "axis")
    return _call("convolve", x, h, _int_or_none(n, "n"), axis)


# -- what Dynamo traces in place of each public function --------------------------------------------------------
def _no_stream(stream) -> None:
    if stream is not None:
        refuse(
            "InvalidArgumentError",
            "stream",
            "None inside torch.compile/torch.export: the operators run on the current stream",
            describe(stream),
            "make the stream current around the compiled call (with torch.cuda.stream(s): ...)",
        )


def _no_callbacks(prolog, epilog, prolog_data, epilog_data) -> None:
    for argument, value in (
        ("prolog", prolog),
        ("epilog", epilog),
        ("prolog_data", prolog_data),
        ("epilog_data", epilog_data),
    ):
        if value is not None:
            refuse(
                "CallbackError",
                argument,
                "no FFT callback inside torch.compile/torch.export: a Python callback cannot be captured in a graph",
                describe(value),
                "call the transform outside the compiled region, or write the callback's math as Torch ops "
                "around the transform",
            )


def _broadcast(out) -> bool:
    """Whether ``out`` is a broadcast (expanded) view, whose elements overlap and which Torch refuses to write: a
    stride 0 along an extent other than 1 (a test Dynamo traces on symbolic sizes too, where sorting strides, as
    :func:`~nvdispatch._strides.overlapping` does for the eager route, is not traced)."""
    return any(n != 1 and st == 0 for n, st in zip(out.shape, out.stride()))


def _write(result, out):
    """``result`` written into ``out`` (returned), as the public functions' ``out=`` does."""
    if out is None:
        return result
    if not isinstance(out, Tensor):
        refuse("InvalidArgumentError", "out", "a Torch tensor to write the result into", describe(out))
    if out.shape != result.shape:
        refuse("ShapeMismatchError", "out", f"shape {tuple(result.shape)}", f"shape {tuple(out.shape)}")
    if _broadcast(out):
        refuse("InvalidArgumentError", "out", "an array the result can be written into (no overlapping elements)",
               f"a tensor whose elements overlap (strides {tuple(out.stride())}, an expanded/broadcast view?)",
               "pass a fresh array, or use the result")  # fmt: skip
    out.copy_(result)
    return out


def _outside_region(a, out):
    """For a transform given ``out=`` inside an autocast region on ``a``'s device type, ``torch.autocast(device_type,
    enabled=False)``: Torch autocasts no call given ``out=``, so it runs as outside the region (the operator's
    autocast kernel does not run), as the public function's route runs it. A null context for every other call."""
    device_type = a.device.type
    if out is None or device_type not in torch_autocast.DEVICE_TYPES or not torch.is_autocast_enabled(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False)


def _all_tensors(*xs) -> bool:
    return all(x is None or isinstance(x, Tensor) for x in xs)


def _matmul_entry(fallback):
    def matmul(
        a,
        b,
        c=None,
        *,
        alpha=1,
        beta=None,
        epilog=None,
        epilog_inputs=None,
        options=None,
        preferences=None,
        stream=None,
        quantization_scales=None,
    ):
        inputs = tuple(epilog_inputs.values()) if isinstance(epilog_inputs, dict) else ()
        if not (isinstance(a, Tensor) and isinstance(b, Tensor) and _all_tensors(c, *inputs)):
            return fallback(
                a,
                b,
                c,
                alpha=alpha,
                beta=beta,
                epilog=epilog,
                epilog_inputs=epilog_inputs,
                options=options,
                preferences=preferences,
                stream=stream,
                quantization_scales=quantization_scales,
            )
        _no_stream(stream)
        return call_matmul(a, b, c, alpha, beta, epilog, epilog_inputs, options, preferences, quantization_scales)

    return matmul


def _fft_1d_entry(func: str, fallback):
    def transform(
        a,
        n=None,
        axis=-1,
        norm="backward",
        out=None,
        *,
        stream=None,
        prolog=None,
        epilog=None,
        prolog_data=None,
        epilog_data=None,
    ):
        if not isinstance(a, Tensor):
            return fallback(
                a,
                n,
                axis,
                norm,
                out,
                stream=stream,
                prolog=prolog,
                epilog=epilog,
                prolog_data=prolog_data,
                epilog_data=epilog_data,
            )
        _no_callbacks(prolog, epilog, prolog_data, epilog_data)
        _no_stream(stream)
        with _outside_region(a, out):
            return _write(call_fft(func, a, n=n, axis=axis, norm=norm), out)

    return transform


def _fft_nd_entry(func: str, fallback, default_axes):
    def transform(
        a,
        s=None,
        axes=default_axes,
        norm="backward",
        out=None,
        *,
        stream=None,
        prolog=None,
        epilog=None,
        prolog_data=None,
        epilog_data=None,
    ):
        if not isinstance(a, Tensor):
            return fallback(
                a,
                s,
                axes,
                norm,
                out,
                stream=stream,
                prolog=prolog,
                epilog=epilog,
                prolog_data=prolog_data,
                epilog_data=epilog_data,
            )
        _no_callbacks(prolog, epilog, prolog_data, epilog_data)
        _no_stream(stream)
        with _outside_region(a, out):
            return _write(call_fft(func, a, s=s, axes=axes, norm=norm), out)

    return transform


def _convolve_entry(fallback):
    def convolve(x, h, /, *, n=None, axis=-1, stream=None):
        if not (isinstance(x, Tensor) and isinstance(h, Tensor)):
            return fallback(x, h, n=n, axis=axis, stream=stream)
        _no_stream(stream)
        return call_convolve(x, h, n, axis)

    return convolve


def _on_torch(device) -> bool:
    """Whether ``fftfreq``'s ``device`` asks for a Torch tensor (the Torch adapter's ``native_device`` rule: a
    ``torch.device``, or a ``"cuda[:N]"`` string; ``"cpu"`` and None ask for NumPy)."""
    return isinstance(device, torch.device) or (isinstance(device, str) and device.startswith("cuda"))


def _freq_entry(real: bool, fallback):
    """``fftfreq``/``rfftfreq`` for a Torch device as Torch ops (what the public function computes: the
    integer frequencies divided by ``n * d`` in float64, cast to ``dtype``), so that ``n`` may be a symbolic
    size; other devices, spacings that are not Python numbers and ``chunks`` take the public function."""

    def freq(n, /, *, d=1.0, dtype=None, device=None, chunks=None):
        if chunks is not None or not _on_torch(device) or isinstance(d, bool) or not isinstance(d, (int, float)):
            return fallback(n, d=d, dtype=dtype, device=device, chunks=chunks)
        if isinstance(n, bool) or not isinstance(n, (int, torch.SymInt)):
            refuse("InvalidArgumentError", "n", "an int >= 1", repr(n))
        if n < 1:
            refuse("InvalidArgumentError", "n", "an int >= 1", repr(n))
        if d == 0:
            refuse("InvalidArgumentError", "d", "a non-zero sample spacing", repr(d))
        dt = torch.float64 if dtype is None else dtype
        if not (isinstance(dt, torch.dtype) and dt.is_floating_point):
            refuse("UnsupportedDtypeError", "dtype", "a real floating torch.dtype", str(dtype))
        if real:
            k = torch.arange(n // 2 + 1, dtype=torch.float64, device=device)
        else:
            k = torch.cat([torch.arange((n - 1) // 2 + 1, dtype=torch.float64, device=device),
                           torch.arange(-(n // 2), 0, dtype=torch.float64, device=device)])  # fmt: skip
        return (k / (n * float(d))).to(dt)

    return freq


def _eager(fn):
    """``fn`` called where Dynamo cannot take the call into the graph (operands that are not Torch tensors): a
    graph break, so the call runs eagerly (an error under ``fullgraph=True``)."""

    def call(*args, **kwargs):
        torch._dynamo.graph_break()
        return fn(*args, **kwargs)

    return call


def _entries() -> dict[str, Any]:
    entries: dict[str, Any] = {"matmul": _matmul_entry(_eager(linalg.matmul))}
    for func in _ONE_D:
        entries[func] = _fft_1d_entry(func, _eager(getattr(fft_module, func)))
    for func in _N_D:
        entries[func] = _fft_nd_entry(func, _eager(getattr(fft_module, func)), None)
        entries[func[:-1] + "2"] = _fft_nd_entry(func, _eager(getattr(fft_module, func[:-1] + "2")), (-2, -1))
    entries["convolve"] = _convolve_entry(_eager(fft_module.convolve))
    entries["fftfreq"] = _freq_entry(False, _eager(fft_module.fftfreq))
    entries["rfftfreq"] = _freq_entry(True, _eager(fft_module.rfftfreq))
    return entries


#: public function name -> the function Dynamo traces in its place
ENTRIES = _entries()
