"""The ``nvdispatch.fft`` functions inside ``jax.jit``, under ``jax.grad`` and ``jax.vmap``.

A transform whose operand is a JAX tracer reaches :func:`traced_fft` (installed by ``nvdispatch.integrations``;
``fft2``/``rfft2``... arrive as their n-D forms, integer input already promoted to JAX's default float type). It
validates the call with the eager route's problem builder (``_fft_problem.build_fft_problem`` on the abstract
value: the result's shape and dtype are the problem's) and stages it as XLA operations around unnormalised
transforms (:func:`~.jax_fft_kernel.fft_kernel`, nvdispatch's executors on XLA's buffers):

* the input padded or trimmed to the transform's sizes, real input to a complex transform made complex; the
  kernel transforms the axes where they are (cuFFT's advanced layout reads strided axes) unless a real
  transform's halved axis is not the innermost of its axes or there are more than three axes: then they are
  moved last (in the order of ``axes``) and back, split into transforms of at most three;
* ``hfft`` as ``irfft`` of the conjugate, ``ihfft`` as the conjugate of ``rfft`` (what ``numpy.fft`` does);
* the scaling of ``norm`` as one multiplication (XLA fuses it with its neighbours).

Derivatives: the kernel is a JAX primitive of nvdispatch's; a transform is linear, so its JVP is the transform of
the tangent and its transpose is a transform again (the transposes of ``jax.lax.fft``: a complex transform is its
own transpose; ``rfft``'s is the real part of a complex transform of the zero-padded cotangent; ``irfft``'s the
conjugate of a weighted ``rfft``); it batches with the batch axis in front and lowers to the kernel. So forward
mode (``jax.jvp``, ``jax.jacfwd``), reverse mode (``jax.grad``, ``jax.vjp``), ``jax.linear_transpose`` and their
compositions, to any order, run on nvdispatch's transforms; everything around the kernel is differentiated by
JAX. :func:`traced_convolve` composes the transforms and the multiplication as ``nvdispatch.fft.convolve``
defines them; :func:`traced_shift` and :func:`traced_freq` are XLA operations. What cannot be staged
(``stream``, ``out``, prolog/epilog callbacks) raises at trace time, naming the argument.

Concrete JAX arrays on a GPU are read by the ``cuda`` executor through DLPack; what it does not take as it is (real
input to a complex transform, ``hfft``/``ihfft``, padding or trimming by ``n``/``s``, a halved axis that is not the
innermost, more than three axes: its CuPy and Torch peers run these for their own arrays, and JAX has none) runs
here eagerly, the same XLA operations around the same kernel as inside ``jax.jit`` (:func:`eager_fft`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .._backends import get_state
from .._detect import CPU, OperandInfo, detect
from .._fft_convolve import build_convolve_problem
from .._fft_problem import FFTProblem, build_fft_problem
from .._memory import plain_memory
from .._route import Explanation, log, select
from .._strides import c_strides
from ..errors import InvalidArgumentError, NoExecutorError, UnsupportedOperandError, describe
from .jax_fft_kernel import FFTCall, fft_kernel

__all__ = ["traced_fft", "eager_fft", "explain_eager_fft", "traced_convolve", "traced_shift", "traced_freq"]

#: cuFFT transforms at most this many axes at once
_MAX_AXES = 3


def traced_fft(func: str, x, n=None, axis=-1, s=None, axes=None, norm="backward", stream=None):
    """Stage ``nvdispatch.fft.<func>`` (one of the array API's ten transforms) into the JAX program being traced."""
    _no_stream(stream)
    x = _as_jax("x", x)
    problem = build_fft_problem(func, _abstract(x), "jax", CPU, n, axis, s, axes, norm)
    log.debug("fft: staged into a traced JAX program (%s)", problem.describe())
    return _transform(problem, x)


def eager_fft(func: str, x, n=None, axis=-1, s=None, axes=None, norm="backward", stream=None):
    """``nvdispatch.fft.<func>`` of a concrete JAX array on a GPU that no executor takes as it is: the XLA
    operations of :func:`traced_fft` around the kernel, run now (on XLA's stream; the result a JAX array on
    ``x``'s device; the integration offers it the calls on arrays in CUDA memory). ``NotImplemented`` for any
    other call, which the route runs: a ``stream=`` (XLA's stream is not the caller's), a problem some executor
    takes."""
    if stream is not None:
        return NotImplemented
    info = detect("x", x)
    problem = build_fft_problem(func, info, info.framework, info.device, n, axis, s, axes, norm)
    try:
        select("fft", problem)
    except NoExecutorError as exc:
        log.debug("fft: no executor takes it as it is (%s); JAX's operations around the kernel", exc.hint)
        return _eager_program(problem, get_state())(x)
    return NotImplemented


@functools.lru_cache(maxsize=256)
def _eager_program(p: FFTProblem, state):
    """:func:`_transform` of ``p`` as one compiled XLA program, per problem and backend state (the kernels run
    under ``state``): run op by op, JAX would dispatch each cast, pad and scale on its own, compiling each on
    first sight."""
    return jax.jit(functools.partial(_transform, p, state=state))


def explain_eager_fft(func: str, x, problem: FFTProblem, declined, stream=None):
    """What :func:`eager_fft` does with a call no executor takes as it is (``problem``; ``declined``: each
    executor's reason), as an :class:`~nvdispatch._route.Explanation`; ``NotImplemented`` for a ``stream=``, which
    it leaves to the route."""
    if stream is not None:
        return NotImplemented
    steps = (*_staged_steps(problem), problem.describe())
    return Explanation(func, "jax", "staged", steps, tuple(declined), ("staged",), False, problem)


def _staged_steps(p: FFTProblem) -> list[str]:
    """What :func:`_transform` does with ``p``, in words."""
    steps = []
    if p.kind != "r2c" and not p.dtype.startswith("complex"):
        steps.append(f"x cast to {p.compute_dtype} (real input to a complex transform)")
    if p.needs_resize:
        steps.append(f"x zero-padded/trimmed to {list(p.in_lengths)} along axes {list(p.axes)}")
    if p.func == "hfft":
        steps.append("x conjugated (hfft is irfft's transform of the conjugate)")
    where = "in place (cuFFT's advanced layout)" if _in_place(p) else "with its axes moved last and back"
    steps.append(f"the unnormalised {p.kind} transform of lengths {list(p.lengths)} {where}: the cuda executor's cuFFT "
                 "plan on XLA's stream, as inside jax.jit")  # fmt: skip
    if p.scale() != 1.0:
        steps.append(f"scaled by {p.scale():.6g} (norm={p.norm!r})")
    if p.func == "ihfft":
        steps.append("the result conjugated (ihfft is the conjugate of rfft's transform)")
    return steps


def _in_place(p: FFTProblem) -> bool:
    """Whether the kernel transforms ``p``'s axes where they are (else they are moved last and back)."""
    return len(p.axes) <= _MAX_AXES and (p.kind == "c2c" or p.axes[-1] == max(p.axes))


def _no_stream(stream) -> None:
    if stream is not None:
        raise InvalidArgumentError(
            "stream", "None inside jax.jit/grad/vmap (the call runs on XLA's stream)", describe(stream)
        )


def _as_jax(name: str, x):
    if isinstance(x, (jax.core.Tracer, jax.Array)):
        return x
    if isinstance(x, (np.ndarray, np.generic)):
        return jnp.asarray(x)
    raise UnsupportedOperandError(name, "a JAX array, a tracer or a NumPy array inside jax.jit/grad/vmap", describe(x))


def _abstract(x) -> OperandInfo:
    shape = tuple(int(d) for d in x.shape)
    return OperandInfo(None, "jax", CPU, str(x.dtype), shape, c_strides(shape), memory=plain_memory(CPU))


def _transform(p: FFTProblem, x, state=None):
    """``p`` on ``x``: XLA operations (casts, padding, scaling, conjugation) around unnormalised kernel
    transforms, run under backend ``state`` (default: this thread's)."""
    state = get_state() if state is None else state
    if p.empty:
        return jnp.zeros(p.out_shape, p.result_dtype)
    conj_in = p.func == "hfft"  # hfft(x) = irfft's unnormalised transform of conj(x), scaled as hfft
    conj_out = p.func == "ihfft"  # ihfft(x) = conj of rfft's unnormalised transform, scaled as ihfft
    kind = p.kind
    if kind != "r2c" and not jnp.iscomplexobj(x):
        x = x.astype(p.compute_dtype)
    x = _resize(x, p.axes, p.in_lengths)
    if conj_in:
        x = jnp.conj(x)
    direction = "inverse" if kind == "c2r" else ("forward" if kind == "r2c" else p.direction)
    if _in_place(p):  # cuFFT reads the axes where they are (its advanced layout): no transpose
        where = tuple(a - x.ndim for a in p.axes)
        x = _kernel(FFTCall(kind, direction, p.lengths, where, state), x)
    else:
        x = _moved(p, x, kind, direction, state)
    scale = p.scale()
    if scale != 1.0:
        x = x * jnp.asarray(scale, dtype=jnp.finfo(x.dtype).dtype)
    if conj_out:
        x = jnp.conj(x)
    return x.astype(p.result_dtype)


def _moved(p: FFTProblem, x, kind: str, direction: str, state):
    """``p``'s unnormalised transform with its axes moved last (in the order of ``axes``) and back: more than
    three axes (split into transforms of at most three) or a real transform whose halved axis is not the
    innermost."""
    k = len(p.axes)
    last = tuple(range(x.ndim - k, x.ndim))
    x = jnp.moveaxis(x, p.axes, last)
    lengths = p.lengths
    if kind == "c2c":
        for start in range(0, k, _MAX_AXES):  # separable: any grouping of the axes gives the transform
            group = lengths[start : start + _MAX_AXES]
            x = _kernel(FFTCall("c2c", direction, group, None, state), _trailing(x, k - start, len(group)))
            x = _untrail(x, k - start, len(group))
    elif kind == "r2c":  # the real transform over the last axes (the halved one included), then complex ones
        head, tail = lengths[: max(k - _MAX_AXES, 0)], lengths[max(k - _MAX_AXES, 0) :]
        x = _kernel(FFTCall("r2c", "forward", tail, None, state), x)
        if head:
            head_call = FFTCall("c2c", "forward", head, None, state)
            x = _untrail(_kernel(head_call, _trailing(x, k, len(head))), k, len(head))
    else:  # c2r: complex inverse transforms of the leading axes, then the real one over the last axes
        head, tail = lengths[: max(k - _MAX_AXES, 0)], lengths[max(k - _MAX_AXES, 0) :]
        if head:
            head_call = FFTCall("c2c", "inverse", head, None, state)
            x = _untrail(_kernel(head_call, _trailing(x, k, len(head))), k, len(head))
        x = _kernel(FFTCall("c2r", "inverse", tail, None, state), x)
    return jnp.moveaxis(x, last, p.axes)


def _resize(x, axes, sizes):
    """``x`` zero-padded or trimmed to ``sizes`` along ``axes`` (as ``n``/``s`` ask)."""
    for ax, size in zip(axes, sizes):
        have = x.shape[ax]
        if have > size:
            x = jax.lax.slice_in_dim(x, 0, size, axis=ax)
        elif have < size:
            pad = [(0, 0)] * x.ndim
            pad[ax] = (0, size - have)
            x = jnp.pad(x, pad)
    return x


def _trailing(x, k: int, count: int):
    """``x`` whose last ``k`` axes are the transformed ones, with the first ``count`` of them moved last."""
    start = x.ndim - k
    group = tuple(range(start, start + count))
    return jnp.moveaxis(x, group, tuple(range(x.ndim - count, x.ndim)))


def _untrail(x, k: int, count: int):
    """The inverse of :func:`_trailing`."""
    start = x.ndim - k
    return jnp.moveaxis(x, tuple(range(x.ndim - count, x.ndim)), tuple(range(start, start + count)))


# -- the kernel and its derivatives ------------------------------------------------------------------------------
def _kernel(call: FFTCall, x):
    return _fft_p.bind(x, call=call)


def _transpose(ct, t, *, call: FFTCall):
    """The transpose of the unnormalised transform (``jax.lax.fft``'s rules, JAX's convention for complex
    cotangents: the transpose, not the adjoint)."""
    if call.kind == "c2c":  # the DFT matrix is symmetric
        return [_kernel(call, ct)]
    halved, n = call.negative_axes[-1], call.lengths[-1]
    if call.kind == "r2c":  # x -> T(x)[:n//2+1 along the halved axis]: pad the cotangent back, transform, real part
        full = _resize(ct, (ct.ndim + halved,), (n,))
        spectrum = _kernel(FFTCall("c2c", "forward", call.lengths, call.where, call.state), full)
        return [jnp.real(spectrum).astype(t.aval.dtype)]
    # c2r: the conjugate of rfft(ct) with the half spectrum's interior counted twice
    spectrum = _kernel(FFTCall("r2c", "forward", call.lengths, call.where, call.state), ct)
    half = spectrum.shape[halved]
    weight = np.full(half, 2.0)
    weight[0] = 1.0
    if n % 2 == 0:
        weight[-1] = 1.0
    weight = weight.reshape((half,) + (1,) * (-halved - 1)).astype(np.dtype(ct.dtype).type)
    return [jnp.conj(spectrum * weight).astype(t.aval.dtype)]


def _output_aval(t, *, call: FFTCall):
    problem = call.problem(t.shape, str(t.dtype))
    return jax.core.ShapedArray(problem.out_shape, np.dtype(problem.result_dtype))


def _batched(args, dims, *, call: FFTCall):
    """The transformed axes are counted from the end: the batch axis goes in front."""
    (t,), (dim,) = args, dims
    return _fft_p.bind(jnp.moveaxis(t, dim, 0) if dim else t, call=call), 0


def _run(x, *, call: FFTCall):
    return fft_kernel(call, x)


#: the unnormalised transform ``call`` as a JAX primitive: linear, so its JVP is itself and its transpose
#: :func:`_transpose` (``jax.grad``, ``jax.jvp``, ``jax.linear_transpose``, to any order); it runs (eagerly and
#: compiled) as the kernel
_fft_p = Primitive("nvdispatch_fft")
_fft_p.def_impl(_run)
_fft_p.def_abstract_eval(_output_aval)
mlir.register_lowering(_fft_p, mlir.lower_fun(_run, multiple_results=False))
ad.deflinear2(_fft_p, _transpose)
batching.primitive_batchers[_fft_p] = _batched


# -- convolve, shifts, frequencies ------------------------------------------------------------------------------
def traced_convolve(x, h, n=None, axis=-1, stream=None):
    """Stage ``nvdispatch.fft.convolve(x, h, n=n, axis=axis)``: the forward transform, ``* h`` (in the spectrum's
    dtype), the inverse transform, as the convolve problem defines them."""
    _no_stream(stream)
    x, h = _as_jax("x", x), _as_jax("h", h)
    problem = build_convolve_problem(_abstract(x), _abstract(h), "jax", CPU, n, axis)
    spectrum = _transform(problem.forward, x)
    spectrum = (spectrum * h).astype(problem.forward.result_dtype)
    return _transform(problem.inverse, spectrum)


def traced_shift(x, axes=None, inverse: bool = False):
    """Stage ``fftshift``/``ifftshift``: a roll by half of each axis (``jnp.roll``)."""
    x = _as_jax("x", x)
    ndim = x.ndim
    if axes is None:
        axes_t = tuple(range(ndim))
    else:
        seq = (axes,) if isinstance(axes, int) and not isinstance(axes, bool) else axes
        if isinstance(seq, jax.core.Tracer):
            _axis(seq, ndim)
        if isinstance(seq, (str, bytes)) or not hasattr(seq, "__iter__"):
            raise InvalidArgumentError("axes", "an int, a sequence of ints, or None", describe(axes))
        axes_t = tuple(_axis(a, ndim) for a in seq)
    shifts = tuple(-(x.shape[a] // 2) if inverse else x.shape[a] // 2 for a in axes_t)
    return jnp.roll(x, shifts, axes_t) if axes_t else x


def _axis(value, ndim: int) -> int:
    if isinstance(value, jax.core.Tracer):
        raise InvalidArgumentError("axes", "Python ints (static: the axes shape the program)", describe(value))
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not -ndim <= value < ndim:
        raise InvalidArgumentError("axes", f"axes in [{-ndim}, {ndim}) for a {ndim}-D input", repr(value))
    return int(value) % ndim


def traced_freq(n, d=1.0, dtype=None, device=None, real: bool = False):
    """Stage ``fftfreq``/``rfftfreq`` with a traced sample spacing ``d``."""
    if device is not None:
        raise InvalidArgumentError("device", "None when d is traced (XLA places the result)", describe(device))
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidArgumentError("n", "an int >= 1", repr(n))
    n = int(n)
    if real:
        k = np.arange(n // 2 + 1, dtype=np.float64)
    else:
        k = np.concatenate([np.arange((n - 1) // 2 + 1), np.arange(-(n // 2), 0)]).astype(np.float64)
    out_dtype = jnp.dtype(dtype) if dtype is not None else jnp.result_type(float)
    if out_dtype.kind != "f":
        raise InvalidArgumentError("dtype", "a real floating dtype", repr(dtype))
    return (jnp.asarray(k, out_dtype) / (n * jnp.asarray(d, out_dtype))).astype(out_dtype)

