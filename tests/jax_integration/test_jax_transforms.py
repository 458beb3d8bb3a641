"""The JAX transformation set on ``nvdispatch.matmul`` and every ``nvdispatch.fft`` function, as JAX's own test
suite checks its operations (CPU).

Derivatives with ``jax.test_util.check_grads``: forward (``jax.jvp``) and reverse (``jax.vjp``) mode, first and
second order, against central finite differences in float64 (independent of any differentiation rule); values,
tangents and cotangents against ``jax.numpy.fft`` / ``jnp.matmul`` (JAX's own rules), and values against NumPy in
float64. Then the transformations composed: ``jit``, ``vmap`` (any ``in_axes``/``out_axes``, nested, of ``grad``
and of ``jvp``), ``grad`` of ``jit`` and ``jit`` of ``grad``, ``jacfwd`` = ``jacrev``, ``hessian``,
``linearize``, ``checkpoint``, ``lax.scan``, ``eval_shape``, donated and sharded inputs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import nvdispatch
from nvdispatch.errors import InvalidArgumentError

fft = nvdispatch.fft

#: (function, input kind, keyword arguments): every transform, with n/s padding and trimming, axes and norms
FFT_CASES = [
    ("fft", "c", {}),
    ("fft", "c", {"n": 4, "norm": "ortho"}),  # trimmed
    ("fft", "r", {"n": 9, "axis": 0, "norm": "forward"}),  # padded, real input
    ("ifft", "c", {}),
    ("ifft", "c", {"n": 8, "axis": -2, "norm": "forward"}),
    ("fftn", "c", {"s": (3, 7), "axes": (1, 0)}),
    ("ifftn", "c", {"axes": (0,), "norm": "ortho"}),
    ("rfft", "r", {}),
    ("rfft", "r", {"n": 7, "norm": "ortho"}),  # odd, padded
    ("rfft", "r", {"n": 4, "axis": 0}),  # trimmed
    ("irfft", "c", {}),
    ("irfft", "c", {"n": 7, "norm": "forward"}),
    ("irfft", "c", {"n": 4, "axis": 0, "norm": "ortho"}),
    ("rfftn", "r", {}),
    ("rfftn", "r", {"axes": (1, 0), "s": (4, 6)}),  # the halved axis not the innermost
    ("irfftn", "c", {}),
    ("irfftn", "c", {"axes": (1, 0), "s": (3, 5), "norm": "ortho"}),
    ("hfft", "c", {}),
    ("hfft", "c", {"n": 7, "norm": "ortho"}),
    ("ihfft", "r", {}),
    ("ihfft", "r", {"n": 5, "axis": 0, "norm": "forward"}),
    ("fft2", "c", {}),
    ("ifft2", "c", {"s": (5, 3)}),
    ("rfft2", "r", {"norm": "forward"}),
    ("irfft2", "c", {"s": (4, 5)}),
]
FFT_IDS = [f"{c[0]}-{i}" for i, c in enumerate(FFT_CASES)]
SHAPE = (5, 6)


def _signal(kind: str, shape=SHAPE, dtype="float64", seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return jnp.asarray(x.astype(np.complex128 if kind == "c" else np.float64).astype(
        np.result_type(dtype, np.complex64) if kind == "c" else dtype))


def _ours(func, kw):
    return functools.partial(getattr(fft, func), **kw)


def _jax(func, kw):
    return functools.partial(getattr(jnp.fft, func), **kw)


def _close(got, want, rtol=1e-10, atol=1e-10):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol, atol=atol)


# -- derivatives of every transform --------------------------------------------------------------------------
@pytest.mark.parametrize("func, kind, kw", FFT_CASES, ids=FFT_IDS)
def test_check_grads_of_every_transform(x64, func, kind, kw):
    """Forward and reverse mode against finite differences; to second order for every third case (each order
    compiles again)."""
    order = 2 if FFT_CASES.index((func, kind, kw)) % 3 == 0 else 1
    check_grads(jax.jit(_ours(func, kw)), (_signal(kind),), order=order, modes=("fwd", "rev"))


@pytest.mark.parametrize("func, kind, kw", FFT_CASES, ids=FFT_IDS)
def test_jvp_and_vjp_match_jax_numpy_fft(x64, func, kind, kw):
    x, t = _signal(kind, seed=1), _signal(kind, seed=2)
    ours, theirs = jax.jit(_ours(func, kw)), _jax(func, kw)
    y, dy = jax.jvp(ours, (x,), (t,))
    want_y, want_dy = jax.jvp(theirs, (x,), (t,))
    _close(y, getattr(np.fft, func)(np.asarray(x), **kw))  # the NumPy float64 oracle
    _close(y, want_y)
    _close(dy, want_dy)
    assert y.dtype == want_y.dtype and dy.dtype == want_dy.dtype
    ct = _signal("c" if jnp.iscomplexobj(y) else "r", y.shape, seed=3)
    (got,) = jax.vjp(ours, x)[1](ct)
    (want,) = jax.vjp(theirs, x)[1](ct)
    _close(got, want)
    assert got.dtype == x.dtype


@pytest.mark.parametrize("func, kind, kw", FFT_CASES[1::2], ids=FFT_IDS[1::2])
def test_linear_transpose_matches_jax_numpy_fft(x64, func, kind, kw):
    """A transform is a linear function: ``jax.linear_transpose`` gives its transpose (JAX's own FFT tests
    transpose ``irfft`` so)."""
    x = _signal(kind, seed=13)
    y = jnp.fft.__dict__[func](x, **kw)
    ct = _signal("c" if jnp.iscomplexobj(y) else "r", y.shape, seed=14)
    (got,) = jax.jit(jax.linear_transpose(_ours(func, kw), x))(ct)
    (want,) = jax.linear_transpose(_jax(func, kw), x)(ct)
    _close(got, want)
    assert got.dtype == x.dtype


@pytest.mark.parametrize("func, kind, kw", FFT_CASES[::3], ids=FFT_IDS[::3])
def test_single_precision_values_and_tangents(func, kind, kw):
    """float32/complex64 (no x64): the result's dtype is JAX's, values and tangents within single precision."""
    x, t = _signal(kind, dtype="float32", seed=4), _signal(kind, dtype="float32", seed=5)
    y, dy = jax.jit(lambda x, t: jax.jvp(_ours(func, kw), (x,), (t,)))(x, t)
    want_y, want_dy = jax.jvp(_jax(func, kw), (x,), (t,))
    assert y.dtype == want_y.dtype == np.result_type(want_y.dtype, np.float32)
    scale = float(np.max(np.abs(np.asarray(want_y)))) + 1.0
    _close(y, want_y, rtol=1e-4, atol=1e-5 * scale)
    _close(dy, want_dy, rtol=1e-4, atol=1e-5 * scale)
    double = getattr(np.fft, func)(np.asarray(x).astype(np.complex128 if kind == "c" else np.float64), **kw)
    _close(y, double, rtol=1e-4, atol=1e-5 * scale)


def test_more_than_three_axes_forward_and_reverse(x64):
    x = _signal("r", (2, 3, 2, 4), seed=6)
    check_grads(jax.jit(lambda v: fft.rfftn(v, axes=(3, 0, 1, 2))), (x,), order=1, modes=("fwd", "rev"))
    check_grads(jax.jit(lambda v: fft.ifftn(v.astype(jnp.complex128), s=(3, 2, 2, 5))), (x,), order=1, modes=("fwd", "rev"))


@pytest.mark.parametrize("real_filter", [True, False])
def test_convolve_forward_and_reverse(x64, real_filter):
    x = _signal("r", (3, 8), seed=7)
    rng = np.random.default_rng(8)
    h = rng.standard_normal(5) + (0 if real_filter else 1j * rng.standard_normal(5))
    h = jnp.asarray(h)
    check_grads(jax.jit(lambda x, h: fft.convolve(x, h, n=8)), (x, h), order=2, modes=("fwd", "rev"))
    want = np.fft.irfft(np.fft.rfft(np.asarray(x), n=8) * np.asarray(h), n=8)
    if real_filter:
        _close(jax.jit(lambda x, h: fft.convolve(x, h, n=8))(x, h), want)


def test_shifts_and_frequencies_are_differentiable(x64):
    x = _signal("c", seed=9)
    for shift in (fft.fftshift, fft.ifftshift):
        check_grads(jax.jit(lambda v, shift=shift: shift(fft.fft(v), axes=(0,))), (x,), order=1, modes=("fwd", "rev"))
    d = jnp.asarray(0.25)
    check_grads(lambda d: fft.fftfreq(6, d=d), (d,), order=1, modes=("fwd", "rev"))
    check_grads(lambda d: fft.rfftfreq(7, d=d), (d,), order=1, modes=("fwd", "rev"))
    _close(jax.jit(lambda d: fft.rfftfreq(7, d=d))(d), np.fft.rfftfreq(7, d=0.25))


# -- matmul ------------------------------------------------------------------------------------------------------
#: epilogs with a derivative, and the jnp form of what they compute (the forward-mode oracle besides finite
#: differences)
MATMUL_EPILOGS = [
    "DEFAULT", "RELU", "GELU", "BIAS", "RELU_BIAS", "GELU_BIAS", "RELU_AUX", "RELU_AUX_BIAS", "GELU_AUX",
    "GELU_AUX_BIAS", "DRELU", "DRELU_BGRAD", "DGELU", "DGELU_BGRAD", "BGRADA", "BGRADB",
]


SECOND_ORDER = ("DEFAULT", "RELU_BIAS", "GELU_AUX_BIAS", "DRELU_BGRAD", "DGELU_BGRAD", "BGRADA", "BGRADB")


def _gelu(z):
    return 0.5 * z * (1 + jnp.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))


def _matmul_case(epilog: str, seed=0, batch=()):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((*batch, 4, 3)), rng.standard_normal((3, 5))
    floats, fixed = {"a": jnp.asarray(a), "b": jnp.asarray(b)}, {}
    if "BIAS" in epilog and "BGRAD" not in epilog:
        floats["bias"] = jnp.asarray(rng.standard_normal(5))
    if epilog.startswith("DRELU"):
        fixed["relu_aux"] = jnp.asarray(rng.random((*batch, 4, 5)) > 0.4)
    if epilog.startswith("DGELU"):
        floats["gelu_aux"] = jnp.asarray(rng.standard_normal((*batch, 4, 5)))
    return floats, fixed


def _matmul_fn(epilog: str, fixed: dict, **kw):
    names = ("bias", "gelu_aux")

    def f(a, b, *inputs):
        given = dict(zip([n for n in names if n in _INPUT_ORDER[epilog]], inputs), **fixed)
        return nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=given or None, **kw)

    return f


_INPUT_ORDER = {e: (("bias",) if "BIAS" in e and "BGRAD" not in e else ()) + (("gelu_aux",) if e.startswith("DGELU") else ())
                for e in MATMUL_EPILOGS}


def _reference(epilog: str, fixed: dict):
    """The jnp form of ``epilog`` (result and float auxiliary outputs)."""

    def f(a, b, *inputs):
        given = dict(zip(_INPUT_ORDER[epilog], inputs))
        z = a @ b + given.get("bias", 0)
        if epilog.startswith("DRELU"):
            y = jnp.where(fixed["relu_aux"], z, 0)
        elif epilog.startswith("DGELU"):
            y = z * jax.grad(lambda v: jnp.sum(_gelu(v)))(given["gelu_aux"])
        elif "RELU" in epilog:
            y = jnp.maximum(z, 0)
        elif "GELU" in epilog:
            y = _gelu(z)
        else:
            y = z
        aux = {}
        if "GELU_AUX" in epilog:
            aux["gelu_aux"] = z
        if epilog.endswith("_BGRAD"):
            aux[epilog.lower()] = jnp.sum(y, axis=-2)
        if epilog == "BGRADA":
            aux["bgrada"] = jnp.sum(a, axis=-1)
        if epilog == "BGRADB":
            aux["bgradb"] = jnp.sum(b, axis=-2)
        return y, aux

    return f


def _float_outputs(out):
    """The float outputs of a matmul (the ReLU mask has no derivative)."""
    if isinstance(out, tuple):
        y, aux = out
        return (y, {k: v for k, v in aux.items() if k != "relu_aux"})
    return out


@pytest.mark.parametrize("epilog", MATMUL_EPILOGS)
def test_check_grads_of_every_epilog(x64, epilog):
    floats, fixed = _matmul_case(epilog)
    f = _matmul_fn(epilog, fixed)
    g = jax.jit(lambda *xs: _float_outputs(f(*xs)))
    args = tuple(floats[n] for n in ("a", "b", *_INPUT_ORDER[epilog]))
    order = 2 if epilog in SECOND_ORDER else 1  # each order compiles again
    check_grads(g, args, order=order, modes=("fwd", "rev"))


@pytest.mark.parametrize("epilog", MATMUL_EPILOGS)
def test_jvp_and_vjp_match_jax_numpy(x64, epilog):
    floats, fixed = _matmul_case(epilog, seed=1)
    args = tuple(floats[n] for n in ("a", "b", *_INPUT_ORDER[epilog]))
    rng = np.random.default_rng(2)
    tangents = tuple(jnp.asarray(rng.standard_normal(x.shape)) for x in args)
    ours = jax.jit(lambda *xs: _float_outputs(_matmul_fn(epilog, fixed)(*xs)))
    ref = _reference(epilog, fixed)

    def theirs(*xs):
        y, aux = ref(*xs)
        return (y, aux) if isinstance(ours(*args), tuple) else y

    y, dy = jax.jvp(ours, args, tangents)
    want_y, want_dy = jax.jvp(theirs, args, tangents)
    for got, want in zip(jax.tree.leaves((y, dy)), jax.tree.leaves((want_y, want_dy))):
        _close(got, want, rtol=1e-9, atol=1e-9)
    ct = jax.tree.map(lambda v: jnp.asarray(rng.standard_normal(v.shape)), y)
    for got, want in zip(jax.vjp(ours, *args)[1](ct), jax.vjp(theirs, *args)[1](ct)):
        _close(got, want, rtol=1e-9, atol=1e-9)


def test_c_alpha_beta_and_transposed_reads_forward_and_reverse(x64):
    rng = np.random.default_rng(3)
    a, b, c = (jnp.asarray(rng.standard_normal(s)) for s in ((2, 4, 3), (3, 5), (4, 5)))
    bias = jnp.asarray(rng.standard_normal(5))

    def f(a, b, c, bias):
        return nvdispatch.matmul(a, b, c, alpha=0.5, beta=2.0, epilog="GELU_BIAS", epilog_inputs={"bias": bias})

    check_grads(jax.jit(f), (a, b, c, bias), order=2, modes=("fwd", "rev"))
    # products of transposed operands (the backward's own calls) as a user writes them
    check_grads(jax.jit(lambda a, b: nvdispatch.matmul(a.T, b.T)), (b, a[0]), order=1, modes=("fwd", "rev"))
    # vector operands (PEP 465)
    check_grads(jax.jit(lambda v, b: nvdispatch.matmul(v, b)), (a[0, 0], b), order=1, modes=("fwd", "rev"))
    check_grads(jax.jit(lambda a, v: nvdispatch.matmul(a, v)), (a, b[:, 0]), order=1, modes=("fwd", "rev"))


def test_bias_along_m_forward_and_reverse(x64):
    rng = np.random.default_rng(4)
    a, b, bias = (jnp.asarray(rng.standard_normal(s)) for s in ((4, 3), (3, 5), (4, 1)))
    check_grads(
        jax.jit(lambda a, b, bias: nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})),
        (a, b, bias), order=2, modes=("fwd", "rev"),
    )


#: (epilog, the operand transposed): the calls linear in one operand, the others constants of the function
LINEAR_CASES = [
    ("DEFAULT", "a"), ("DEFAULT", "b"), ("BIAS", "bias"), ("BIAS", "b"), ("BGRADB", "b"), ("BGRADA", "a"),
    ("DRELU", "a"), ("DRELU_BGRAD", "b"), ("DGELU", "b"), ("DGELU_BGRAD", "a"),
]


@pytest.mark.parametrize("epilog, name", LINEAR_CASES)
def test_linear_transpose_of_a_matmul(x64, epilog, name):
    """A call linear in one operand (the others, the mask and the pre-activation constants) transposes: as
    ``jax.linear_transpose`` of the same function in ``jnp``, under ``jit``, batched, and under ``vmap``."""
    floats, fixed = _matmul_case(epilog, seed=17, batch=(2,))
    order = ("a", "b", *_INPUT_ORDER[epilog])
    at = order.index(name)

    def linear(fn):
        return lambda x: _float_outputs(fn(*(x if i == at else floats[n] for i, n in enumerate(order))))

    ours, theirs = linear(_matmul_fn(epilog, fixed)), linear(_reference(epilog, fixed))
    x = floats[name]
    y = jax.eval_shape(ours, x)
    rng = np.random.default_rng(18)
    ct = jax.tree.map(lambda v: jnp.asarray(rng.standard_normal(v.shape)), y)
    want = jax.linear_transpose(theirs if isinstance(y, tuple) else lambda x: theirs(x)[0], x)(ct)
    _close(jax.jit(jax.linear_transpose(ours, x))(ct), want, 1e-12, 1e-12)
    _close(jax.linear_transpose(ours, x)(ct), want, 1e-12, 1e-12)
    # per-example cotangents: vmap of the transpose
    cts = jax.tree.map(lambda v: jnp.stack([v, -2 * v]), ct)
    got = jax.jit(jax.vmap(jax.linear_transpose(ours, x)))(cts)
    _close(got, jax.tree.map(lambda v: jnp.stack([v, -2 * v]), want), 1e-12, 1e-12)


def test_linear_transpose_of_transposed_reads_and_c(x64):
    rng = np.random.default_rng(19)
    a, b, c = (jnp.asarray(rng.standard_normal(s)) for s in ((3, 4), (5, 3), (4, 5)))
    ct = jnp.asarray(rng.standard_normal((4, 5)))
    for fn, ref, x in (
        (lambda b: nvdispatch.matmul(a.T, b.T), lambda b: a.T @ b.T, b),
        (lambda a: nvdispatch.matmul(a.T, b.T, alpha=0.5), lambda a: 0.5 * a.T @ b.T, a),
        (lambda c: nvdispatch.matmul(a.T, b.T, c, beta=2.0), lambda c: 2.0 * c, c),
    ):
        _close(jax.jit(jax.linear_transpose(fn, x))(ct), jax.linear_transpose(ref, x)(ct), 1e-12, 1e-12)


def test_linear_transpose_of_what_is_not_linear_is_refused_naming_the_operand(x64):
    a, b = jnp.ones((3, 4)), jnp.ones((4, 2))
    with pytest.raises(InvalidArgumentError, match="linear") as info:
        jax.linear_transpose(lambda b: nvdispatch.matmul(a, b, epilog="GELU"), b)(jnp.ones((3, 2)))
    assert info.value.argument == "b"
    with pytest.raises(InvalidArgumentError, match="linear") as info:  # a product of two unknowns
        jax.linear_transpose(lambda a, b: nvdispatch.matmul(a, b), a, b)(jnp.ones((3, 2)))
    assert info.value.argument == "a"
    aux = jnp.ones((3, 2))
    with pytest.raises(InvalidArgumentError) as info:  # DGELU is not linear in its pre-activation
        jax.linear_transpose(
            lambda g: nvdispatch.matmul(a, b, epilog="DGELU", epilog_inputs={"gelu_aux": g}), aux
        )(jnp.ones((3, 2)))
    assert info.value.argument == "epilog_inputs['gelu_aux']"


@pytest.mark.parametrize(
    "argnums, backward",
    [
        (0, [("DEFAULT", False, True)]),  # a's gradient dz b^T alone
        (1, [("DEFAULT", True, False)]),  # b's: a^T dz
        (2, [("BGRADB", True, False)]),  # the bias's: out of the product that carries its sum
        ((1, 2), [("BGRADB", True, False)]),
        ((0, 1, 2), [("BGRADB", True, False), ("DEFAULT", False, True)]),
    ],
)
def test_the_backward_stages_only_the_gradients_asked_for(monkeypatch, argnums, backward):
    from nvdispatch.integrations import jax_matmul

    seen, kernel = [], jax_matmul.matmul_kernel
    monkeypatch.setattr(
        jax_matmul,
        "matmul_kernel",
        lambda call, ops: seen.append((call.epilog, call.transpose_a, call.transpose_b)) or kernel(call, ops),
    )
    rng = np.random.default_rng(20)
    a, b, bias = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((4, 3), (3, 5), (5,)))

    def loss(a, b, bias):
        return jnp.sum(nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}) ** 2)

    jax.make_jaxpr(jax.grad(loss, argnums=argnums))(a, b, bias)
    assert seen == [("RELU_BIAS", False, False), *backward]
    got = jax.jit(jax.grad(loss, argnums=argnums))(a, b, bias)
    want = jax.grad(lambda a, b, bias: jnp.sum(jax.nn.relu(a @ b + bias) ** 2), argnums=argnums)(a, b, bias)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_complex_and_half_precision_products(x64):
    rng = np.random.default_rng(16)
    a, b = (jnp.asarray(rng.standard_normal(s) + 1j * rng.standard_normal(s)) for s in ((3, 4), (4, 2)))
    check_grads(jax.jit(nvdispatch.matmul), (a, b), order=2, modes=("fwd", "rev"))  # JAX's complex convention
    a16, b16 = a.real.astype(jnp.bfloat16), b.real.astype(jnp.bfloat16)
    y, dy = jax.jit(lambda a, b: jax.jvp(lambda a: nvdispatch.matmul(a, b, epilog="GELU"), (a,), (a,)))(a16, b16)
    assert y.dtype == dy.dtype == jnp.bfloat16
    wide = [np.asarray(v, np.float64) for v in (a16, b16)]
    z = wide[0] @ wide[1]
    want = np.asarray(jax.jvp(_gelu, (jnp.asarray(z),), (jnp.asarray(z),))[1])
    np.testing.assert_allclose(np.asarray(dy, np.float64), want, rtol=3e-2, atol=3e-2)


def test_integer_products_have_float0_tangents():
    a, b = jnp.arange(6, dtype=jnp.int32).reshape(2, 3), jnp.ones((3, 2), jnp.int32)
    y, dy = jax.jvp(lambda a: nvdispatch.matmul(a, b), (a,), (np.zeros(a.shape, jax.dtypes.float0),))
    _close(y, np.asarray(a) @ np.asarray(b), 0, 0)
    assert dy.dtype == jax.dtypes.float0


def test_hessian_jacfwd_jacrev_linearize(x64):
    rng = np.random.default_rng(5)
    a, b, bias = (jnp.asarray(rng.standard_normal(s)) for s in ((4, 3), (3, 2), (2,)))

    def loss(b, nv):
        f = nvdispatch.matmul if nv else lambda a, b, **kw: _gelu(a @ b + kw["epilog_inputs"]["bias"])
        return jnp.sum(f(a, b, epilog="GELU_BIAS", epilog_inputs={"bias": bias}) ** 2)

    want = jax.hessian(loss)(b, False)
    _close(jax.jit(jax.hessian(loss), static_argnums=1)(b, True), want, 1e-9, 1e-9)  # jacfwd of jacrev
    _close(jax.jit(jax.jacrev(jax.jacfwd(loss)), static_argnums=1)(b, True), want, 1e-9, 1e-9)

    def layer(b):
        return nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})

    _close(jax.jit(jax.jacfwd(layer))(b), jax.jit(jax.jacrev(layer))(b), 1e-12, 1e-12)
    y, lin = jax.linearize(layer, b)
    t = jnp.asarray(rng.standard_normal(b.shape))
    _close(lin(t), jax.jvp(layer, (b,), (t,))[1], 1e-12, 1e-12)
    # the linearized function transposes
    (ct,) = jax.linear_transpose(lin, b)(jnp.ones_like(y))
    _close(ct, jax.grad(lambda b: jnp.sum(layer(b)))(b), 1e-12, 1e-12)
    # and FFTs: jacfwd = jacrev, linearize, hessian of a real loss
    x = _signal("r", (6,), seed=10)
    def spec(v):
        y = fft.rfft(v, n=8, norm="ortho")
        return jnp.stack([jnp.real(y), jnp.imag(y)])

    _close(jax.jit(jax.jacfwd(spec))(x), jax.jit(jax.jacrev(spec))(x), 1e-12, 1e-12)
    power = lambda v: jnp.sum(jnp.abs(fft.fft(v)) ** 2)  # noqa: E731
    _close(jax.jit(jax.hessian(power))(x), 2 * 6 * np.eye(6), 1e-9, 1e-9)  # Parseval: |F x|^2 = n |x|^2


# -- composed transformations -----------------------------------------------------------------------------------
def test_vmap_in_and_out_axes_nested_and_of_derivatives(x64):
    x = _signal("c", (3, 4, 6), seed=11)
    want = np.fft.fft(np.asarray(x), axis=0)
    # the batch axis last, the transformed axis in front
    _close(jax.vmap(lambda v: fft.fft(v, axis=0), in_axes=2, out_axes=2)(x), want)
    _close(jax.vmap(jax.vmap(lambda v: fft.fft(v), in_axes=1, out_axes=1), in_axes=2, out_axes=2)(x), want)
    _close(jax.jit(jax.vmap(lambda v: fft.rfft(v.real, n=8), in_axes=1))(x),
           np.moveaxis(np.fft.rfft(np.asarray(x).real, n=8), 1, 0))
    # vmap of jvp, jvp of vmap, vmap of grad, grad of vmap
    t = _signal("c", (3, 4, 6), seed=12)
    f = functools.partial(fft.ifft, n=5, norm="ortho")
    g = functools.partial(jnp.fft.ifft, n=5, norm="ortho")
    _close(jax.vmap(lambda x, t: jax.jvp(f, (x,), (t,))[1], in_axes=(1, 1))(x, t),
           jax.vmap(lambda x, t: jax.jvp(g, (x,), (t,))[1], in_axes=(1, 1))(x, t))
    _close(jax.jvp(jax.vmap(f, in_axes=2, out_axes=0), (x,), (t,))[1],
           jax.jvp(jax.vmap(g, in_axes=2, out_axes=0), (x,), (t,))[1])
    loss = lambda h: lambda v: jnp.sum(jnp.abs(h(v)) ** 2)  # noqa: E731
    _close(jax.vmap(jax.grad(loss(f)), in_axes=1, out_axes=1)(x), jax.vmap(jax.grad(loss(g)), in_axes=1, out_axes=1)(x))
    _close(jax.grad(lambda v: loss(f)(jax.vmap(f, 2)(v)))(x), jax.grad(lambda v: loss(g)(jax.vmap(g, 2)(v)))(x))


def test_vmap_of_matmul_derivatives_over_any_operand(x64):
    rng = np.random.default_rng(13)
    a, b, bias = (jnp.asarray(rng.standard_normal(s)) for s in ((6, 4, 3), (3, 5), (5,)))
    ta = jnp.asarray(rng.standard_normal(a.shape))

    def ours(a, b, bias):
        return nvdispatch.matmul(a, b, epilog="GELU_BIAS", epilog_inputs={"bias": bias})

    def ref(a, b, bias):
        return _gelu(a @ b + bias)

    for fn in (ours, ref):
        fn.per_example_jvp = jax.vmap(lambda a, t, fn=fn: jax.jvp(lambda a: fn(a, b, bias), (a,), (t,))[1])(a, ta)
        # per-example weight gradients (b shared, a batched along axis 1) and a tangent batched alone
        fn.per_example_grad = jax.vmap(jax.grad(lambda b, a, fn=fn: jnp.sum(fn(a, b, bias) ** 2)), in_axes=(None, 1))(
            b, jnp.moveaxis(a, 0, 1))
        fn.tangent_only = jax.vmap(lambda t, fn=fn: jax.jvp(lambda a: fn(a, b, bias), (a[0],), (t,))[1])(ta)
        fn.nested = jax.vmap(jax.vmap(lambda a, bias, fn=fn: fn(a, b, bias), in_axes=(0, None)), in_axes=(None, 0))(
            a[:2], jnp.stack([bias, -bias, 2 * bias]))
        fn.hvp = jax.vmap(lambda bias, fn=fn: jax.jvp(jax.grad(lambda b: jnp.sum(fn(a, b, bias) ** 2)), (b,),
                                                      (jnp.ones_like(b),))[1])(jnp.stack([bias, 2 * bias]))
    for name in ("per_example_jvp", "per_example_grad", "tangent_only", "nested", "hvp"):
        _close(getattr(ours, name), getattr(ref, name), 1e-9, 1e-9)


def test_jit_of_grad_grad_of_jit_checkpoint_and_scan(x64):
    rng = np.random.default_rng(14)
    w, x = jnp.asarray(rng.standard_normal((4, 4)) / 2), jnp.asarray(rng.standard_normal((3, 4)))

    def step(h, w, mm):
        return mm(h, w, epilog="RELU_BIAS", epilog_inputs={"bias": jnp.full(4, 0.1)})

    def jnp_mm(h, w, **kw):
        return jnp.maximum(h @ w + kw["epilog_inputs"]["bias"], 0)

    def net(w, mm, remat=False):
        layer = jax.checkpoint(step, static_argnums=(2,)) if remat else step

        def body(h, _):
            return layer(h, w, mm), jnp.sum(jnp.abs(fft.rfft(h) if mm is nvdispatch.matmul else jnp.fft.rfft(h)))

        h, spectra = jax.lax.scan(body, x, None, length=3)
        return jnp.sum(h**2) + jnp.sum(spectra)

    want = jax.grad(net)(w, jnp_mm)
    _close(jax.jit(jax.grad(net), static_argnums=1)(w, nvdispatch.matmul), want, 1e-9, 1e-9)
    _close(jax.grad(jax.jit(net, static_argnums=1))(w, nvdispatch.matmul), want, 1e-9, 1e-9)
    _close(jax.grad(net)(w, nvdispatch.matmul, True), want, 1e-9, 1e-9)
    t = jnp.asarray(rng.standard_normal(w.shape))
    _close(jax.jvp(lambda w: net(w, nvdispatch.matmul, True), (w,), (t,))[1],
           jax.jvp(lambda w: net(w, jnp_mm), (w,), (t,))[1], 1e-9, 1e-9)


def test_eval_shape_gives_shapes_without_running():
    a, b = jax.ShapeDtypeStruct((7, 4, 3), jnp.float32), jax.ShapeDtypeStruct((3, 5), jnp.float32)
    y, aux = jax.eval_shape(lambda a, b: nvdispatch.matmul(a, b, epilog="GELU_AUX"), a, b)
    assert (y.shape, y.dtype, aux["gelu_aux"].shape) == ((7, 4, 5), jnp.float32, (7, 4, 5))
    got = jax.eval_shape(lambda x: fft.irfftn(x, s=(6, 9)), jax.ShapeDtypeStruct((6, 5), jnp.complex64))
    assert (got.shape, got.dtype) == ((6, 9), jnp.float32)
    grads = jax.eval_shape(jax.grad(lambda a, b: jnp.sum(nvdispatch.matmul(a, b)), argnums=(0, 1)), a, b)
    assert [g.shape for g in grads] == [(7, 4, 3), (3, 5)]


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")  # donation is advice to XLA
def test_donated_and_sharded_inputs(x64):
    rng = np.random.default_rng(15)
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((3, 5))
    x = rng.standard_normal((4, 6)) + 1j * rng.standard_normal((4, 6))
    donated = jax.jit(lambda a, b: nvdispatch.matmul(a, b), donate_argnums=(0, 1))
    _close(donated(jnp.asarray(a), jnp.asarray(b)), a @ b)
    _close(jax.jit(fft.ifft, donate_argnums=0)(jnp.asarray(x)), np.fft.ifft(x))
    mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:1]), ("data",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    sa, sx = jax.device_put(a, rows), jax.device_put(x, rows)
    _close(jax.jit(lambda a: nvdispatch.matmul(a, b))(sa), a @ b)
    _close(jax.jit(lambda x: fft.fft(x))(sx), np.fft.fft(x))
    _close(jax.grad(lambda a: jnp.sum(nvdispatch.matmul(a, b)))(sa), np.ones((4, 5)) @ b.T)


def test_what_cannot_be_traced_is_refused_naming_the_argument():
    with pytest.raises(InvalidArgumentError, match="device"):
        jax.jit(lambda d: fft.fftfreq(4, d=d, device=jax.devices("cpu")[0]))(1.0)
    with pytest.raises(InvalidArgumentError, match="stream"):
        jax.jvp(lambda v: fft.fft(v, stream=0), (jnp.ones(4, jnp.complex64),), (jnp.ones(4, jnp.complex64),))
    with pytest.raises(InvalidArgumentError, match="alpha"):
        jax.jvp(lambda s: nvdispatch.matmul(jnp.ones((2, 2)), jnp.ones((2, 2)), alpha=s), (1.0,), (1.0,))
    with pytest.raises(InvalidArgumentError, match="beta"):
        jax.jit(lambda s: nvdispatch.matmul(jnp.ones((2, 2)), jnp.ones((2, 2)), jnp.ones((2, 2)), beta=s))(1.0)
    x = jnp.ones((4, 6))
    for shift in (fft.fftshift, fft.ifftshift):
        for axes in (lambda ax: ax, lambda ax: (ax,)):
            with pytest.raises(InvalidArgumentError, match="axes.*static"):
                jax.jit(lambda x, ax, shift=shift, axes=axes: shift(x, axes=axes(ax)))(x, 0)


# -- the same on the GPU (XLA's GPU device: cuFFT and cuBLASLt plans on XLA's buffers) ------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("func, kind, kw", FFT_CASES[::2], ids=FFT_IDS[::2])
def test_gpu_transforms_forward_and_reverse(x64, func, kind, kw):
    test_jvp_and_vjp_match_jax_numpy_fft(x64, func, kind, kw)
    check_grads(jax.jit(_ours(func, kw)), (_signal(kind),), order=1, modes=("fwd", "rev"))


@pytest.mark.gpu
@pytest.mark.parametrize("epilog", MATMUL_EPILOGS)
def test_gpu_epilogs_forward_and_reverse(x64, epilog):
    test_jvp_and_vjp_match_jax_numpy(x64, epilog)


@pytest.mark.gpu
def test_gpu_composed_transformations(x64):
    test_hessian_jacfwd_jacrev_linearize(x64)
    test_vmap_of_matmul_derivatives_over_any_operand(x64)
    test_jit_of_grad_grad_of_jit_checkpoint_and_scan(x64)
