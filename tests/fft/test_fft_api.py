"""nvdispatch.fft API: typed errors, explain(), frequencies and shifts, the stateful FFT."""

from __future__ import annotations

import inspect
import pickle

import numpy as np
import pytest
from fft_reference import assert_close, make

import nvdispatch
import nvdispatch.fft as F
from nvdispatch.errors import (
    AxisError,
    InvalidArgumentError,
    MixedOperandsError,
    PlanStateError,
    ShapeMismatchError,
    UnsupportedDtypeError,
    UnsupportedOperandError,
)
from nvdispatch.fft import _transforms

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None


@pytest.mark.parametrize(
    "call, err, arg",
    [
        (lambda x: F.fft(x, n=0), InvalidArgumentError, "n"),
        (lambda x: F.fft(x, n=-3), InvalidArgumentError, "n"),
        (lambda x: F.fft(x, n=2.5), InvalidArgumentError, "n"),
        (lambda x: F.fft(x, axis=2), InvalidArgumentError, "axis"),
        (lambda x: F.fft(x, norm="none"), InvalidArgumentError, "norm"),
        (lambda x: F.fftn(x, s=(4, 4, 4), axes=None), ShapeMismatchError, "s"),
        (lambda x: F.fftn(x, s=(4,), axes=(0, 1)), ShapeMismatchError, "s"),
        (lambda x: F.fftn(x, s=(0, 4), axes=(0, 1)), InvalidArgumentError, "s"),
        (lambda x: F.fftn(x, axes=(0, -3)), InvalidArgumentError, "axes"),
        (lambda x: F.fftn(x, axes=(5,)), InvalidArgumentError, "axes"),
        (lambda x: F.rfftn(x.real, axes=()), InvalidArgumentError, "axes"),
        (lambda x: F.rfft(x), UnsupportedDtypeError, "x"),
        (lambda x: F.fft(x.astype(np.str_)), UnsupportedDtypeError, "x"),
        (lambda x: F.fft(x, out=np.empty((4, 6), np.float64)), UnsupportedDtypeError, "out"),
        (lambda x: F.fft(x, out=np.empty((4, 5), np.complex64)), ShapeMismatchError, "out"),
        (lambda x: F.fft(x, out=[0] * 6), UnsupportedOperandError, "out"),
        (lambda x: F.irfft(x[:, :1]), InvalidArgumentError, "n"),
        (lambda x: F.fft([object()]), UnsupportedOperandError, "x"),
    ],
)
def test_typed_errors_name_the_argument(call, err, arg):
    x = make((4, 6), "complex64")
    with pytest.raises(err) as info:
        call(x)
    assert info.value.argument == arg
    assert str(info.value).startswith(f"{arg}: expected")


_AXIS_ERRORS = [
    ("fft axis", lambda xp, x: xp.fft(x, None, 2)),
    ("fft 0-d", lambda xp, x: xp.fft(x[0, 0])),
    ("rfft 0-d", lambda xp, x: xp.rfft(x.real[0, 0])),
    ("fftn axes", lambda xp, x: xp.fftn(x, None, (0, -3))),
    ("irfftn axes", lambda xp, x: xp.irfftn(x, None, (5,))),
    ("fftshift axes", lambda xp, x: xp.fftshift(x, axes=2)),
]


@pytest.mark.parametrize("framework", ["numpy", "torch"])
@pytest.mark.parametrize("call", [c[1] for c in _AXIS_ERRORS], ids=[c[0] for c in _AXIS_ERRORS])
def test_an_axis_out_of_range_is_an_index_error_as_in_numpy_and_torch(call, framework):
    x = make((4, 6), "complex64")
    if framework == "torch":
        if torch is None:
            pytest.skip("needs torch")
        x = torch.from_numpy(x)
        with pytest.raises(IndexError):  # Torch's own error, read off Torch
            call(_TorchFFT, x)
    else:
        with pytest.raises(IndexError):  # NumPy's own error, read off NumPy
            call(np.fft, x)
    with pytest.raises(AxisError) as info:
        call(F, x)
    assert isinstance(info.value, IndexError) and isinstance(info.value, ValueError)


class _TorchFFT:
    """``torch.fft`` under the positional signature of ``numpy.fft``."""

    @staticmethod
    def fft(x, n=None, axis=-1):
        return torch.fft.fft(x, n, axis)

    @staticmethod
    def rfft(x, n=None, axis=-1):
        return torch.fft.rfft(x, n, axis)

    @staticmethod
    def fftn(x, s=None, axes=None):
        return torch.fft.fftn(x, s, axes)

    @staticmethod
    def irfftn(x, s=None, axes=None):
        return torch.fft.irfftn(x, s, axes)

    @staticmethod
    def fftshift(x, axes=None):
        return torch.fft.fftshift(x, axes)


_NONE_OPERANDS = [
    ("fft", lambda: F.fft(None), "x"),
    ("fftn", lambda: F.fftn(None), "x"),
    ("rfft2", lambda: F.rfft2(None), "x"),
    ("fft+out", lambda: F.fft(None, out=np.empty(4, np.complex128)), "x"),
    ("fft+prolog", lambda: F.fft(None, prolog=lambda v, i: v), "x"),
    ("FFT", lambda: F.FFT(None), "x"),
    ("convolve x", lambda: F.convolve(None, np.ones(3)), "x"),
    ("convolve h", lambda: F.convolve(np.ones(4), None), "h"),
    ("fftshift", lambda: F.fftshift(None), "x"),
    ("ifftshift", lambda: F.ifftshift(None), "x"),
    ("explain fft", lambda: nvdispatch.explain(F.fft, None), "x"),
    ("explain fftshift", lambda: nvdispatch.explain(F.fftshift, None), "x"),
    ("explain convolve", lambda: nvdispatch.explain(F.convolve, None, np.ones(3)), "x"),
]


@pytest.mark.parametrize("call, arg", [c[1:] for c in _NONE_OPERANDS], ids=[c[0] for c in _NONE_OPERANDS])
def test_a_none_operand_is_a_typed_error_naming_it(call, arg):
    """fft(None) raised a bare StopIteration, FFT(None)/convolve/fftshift a KeyError (#27)."""
    with pytest.raises(UnsupportedOperandError) as info:
        call()
    assert info.value.argument == arg and "None" in str(info.value)


def test_common_placement_of_no_operands_is_typed():
    from nvdispatch._detect import common_placement

    with pytest.raises(UnsupportedOperandError):
        common_placement({})


def test_zero_d_input():
    with pytest.raises(AxisError):  # no axis to transform: numpy.fft.fft raises an IndexError
        F.fft(np.array(1.0 + 0j))


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_mixed_devices_in_stateful_reset():
    x = make((4, 4), "complex64")
    f = F.FFT(x)
    with pytest.raises(ShapeMismatchError):
        f.reset_operand(torch.from_numpy(x))
    with pytest.raises(MixedOperandsError):
        from nvdispatch._route import detect_all, placement

        placement(detect_all({"x": x, "y": torch.from_numpy(x)}))


def test_precision_and_promotion():
    x32 = make((16,), "float32")
    assert F.fft(x32).dtype == np.complex64  # real input promoted, precision kept
    assert F.rfft(x32).dtype == np.complex64
    assert F.irfft(F.rfft(x32), n=16).dtype == np.float32
    assert F.hfft(make((9,), "complex64")).dtype == np.float32
    assert F.ihfft(x32).dtype == np.complex64
    assert F.fftn(make((4, 4), "complex128")).dtype == np.complex128


def test_padding_trimming_and_axes_order():
    x = make((5, 6, 7), "complex128")
    assert_close(F.fftn(x, s=(8, 3), axes=(2, 0)), np.fft.fftn(x, s=(8, 3), axes=(2, 0)), "complex128")
    y = F.irfftn(x, s=(4, 9), axes=(0, 1))
    assert y.shape == (4, 9, 7)
    assert_close(y, np.fft.irfftn(x, s=(4, 9), axes=(0, 1)), "complex128")
    r = make((5, 6, 7), "float64")
    assert F.rfftn(r, axes=(2, 0)).shape == (3, 6, 7)  # the last axis in axes is halved


def test_explain():
    x = make((8, 32), "float32")
    e = nvdispatch.explain(F.rfft, x, n=64)
    assert e.executor == "numpy" and e.operation == "rfft"
    assert "n=64" in str(e)
    assert e.problem.out_shape == (8, 33)
    for f in (F.fftfreq, F.rfftfreq):
        assert nvdispatch.explain(f, 8).executor == "numpy"
    assert nvdispatch.explain(F.fftshift, x).executor == "numpy"
    with pytest.raises(InvalidArgumentError):
        nvdispatch.explain(F.fft, x, axis=7)


def test_explain_of_a_2d_transform_uses_its_default_axes():
    x = make((2, 3, 4), "complex128")
    for f in (F.fft2, F.ifft2, F.rfft2):
        e = nvdispatch.explain(f, x.real if f is F.rfft2 else x)
        assert e.problem.axes == (1, 2), f.__name__
    assert nvdispatch.explain(F.fftn, x).problem.axes == (0, 1, 2)
    with pytest.raises(TypeError):
        nvdispatch.explain(F.fft, x, bogus=1)  # as the call itself would


_ONE_D = ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")
_N_D = ("fftn", "ifftn", "rfftn", "irfftn", "fft2", "ifft2", "rfft2", "irfft2")


@pytest.mark.parametrize("name", _ONE_D + _N_D)
def test_transform_signatures_match_their_static_protocol(name):
    """Type checkers see the transforms through OneDimTransform/NDimTransform: these must not drift from the
    functions' run-time signatures."""
    protocol = _transforms.OneDimTransform if name in _ONE_D else _transforms.NDimTransform
    static = list(inspect.signature(protocol.__call__).parameters.values())[1:]  # without self
    runtime = list(inspect.signature(getattr(F, name)).parameters.values())
    assert [(p.name, p.kind, p.annotation) for p in static] == [(p.name, p.kind, p.annotation) for p in runtime]
    defaults = {p.name: p.default for p in runtime}
    assert defaults.pop("axes", None) == ((-2, -1) if name.endswith("2") else None)
    assert defaults == {p.name: p.default for p in static if p.name != "axes"}
    assert inspect.signature(getattr(F, name)).return_annotation == "Array"


@pytest.mark.parametrize("name", F.__all__)
def test_public_names_live_in_nvdispatch_fft(name):
    obj = getattr(F, name)
    assert obj.__module__ == "nvdispatch.fft" and obj.__qualname__ == name
    assert pickle.loads(pickle.dumps(obj)) is obj
    assert ">>> " in inspect.getdoc(obj)  # a runnable example


def test_backend_control_and_no_executor():
    x = make((8,), "complex64")
    with nvdispatch.set_backend("numpy", only=True):
        assert nvdispatch.explain(F.fft, x).executor == "numpy"
    with nvdispatch.skip_backend("numpy"):
        with pytest.raises(nvdispatch.errors.NoExecutorError):
            F.fft(x)


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_coerce_torch_to_numpy():
    t = torch.from_numpy(make((8,), "complex64"))
    with nvdispatch.set_backend("numpy", coerce=True):
        y = F.fft(t)
    assert isinstance(y, np.ndarray)
    assert_close(y, np.fft.fft(t.numpy().astype(np.complex128)), "complex64")


def test_freq_and_shift():
    for n in (1, 2, 7, 8):
        np.testing.assert_allclose(F.fftfreq(n, d=0.3), np.fft.fftfreq(n, d=0.3))
        np.testing.assert_allclose(F.rfftfreq(n, d=0.3), np.fft.rfftfreq(n, d=0.3))
    assert F.fftfreq(8, dtype=np.float32).dtype == np.float32
    x = np.arange(30).reshape(5, 6)
    np.testing.assert_array_equal(F.fftshift(x), np.fft.fftshift(x))
    np.testing.assert_array_equal(F.ifftshift(x, axes=(1,)), np.fft.ifftshift(x, axes=(1,)))
    np.testing.assert_array_equal(F.ifftshift(F.fftshift(x, axes=0), axes=0), x)
    with pytest.raises(InvalidArgumentError):
        F.fftfreq(0)
    with pytest.raises(InvalidArgumentError):
        F.fftfreq(4, device="tpu")
    if torch is not None:
        t = F.fftfreq(8, device=torch.device("cpu"), dtype=torch.float32)
        assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
        np.testing.assert_array_equal(F.fftshift(torch.from_numpy(x)).numpy(), np.fft.fftshift(x))


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_stateful_fft(framework):
    if framework == "torch" and torch is None:
        pytest.skip("needs torch")
    wrap = (lambda a: a) if framework == "numpy" else torch.from_numpy
    c = make((6, 10), "complex64")
    with F.FFT(wrap(c), axes=(1,)) as f:
        with pytest.raises(PlanStateError):
            f.execute()
        f.plan()
        assert f.fft_type == "C2C" and f.executor == framework
        assert_close(np.asarray(f.execute()), np.fft.fft(c, axis=1), "complex64")
        assert_close(np.asarray(f.execute(direction="inverse")), np.fft.ifft(c, axis=1), "complex64")
        c2 = make((6, 10), "complex64", seed=3)
        f.reset_operand(wrap(c2))
        assert_close(np.asarray(f.execute()), np.fft.fft(c2, axis=1), "complex64")
        with pytest.raises(ShapeMismatchError):
            f.reset_operand(wrap(make((6, 11), "complex64")))
        with pytest.raises(UnsupportedDtypeError):
            f.reset_operand(wrap(make((6, 10), "complex128")))
    with pytest.raises(PlanStateError):
        f.execute()
    # R2C is forward only, C2R inverse only with last_axis_parity
    r = make((6, 10), "float64")
    f = F.FFT(wrap(r)).plan()
    assert f.fft_type == "R2C"
    assert_close(np.asarray(f.execute()), np.fft.rfftn(r), "float64")
    with pytest.raises(InvalidArgumentError):
        f.execute(direction="inverse")
    h = make((6, 6), "complex128")
    for parity, n in (("even", 10), ("odd", 11)):
        g = F.FFT(wrap(h), options={"fft_type": "C2R", "last_axis_parity": parity}).plan()
        out = np.asarray(g.execute())
        assert out.shape == (6, n) and out.dtype == np.float64
        assert_close(out, np.fft.irfftn(h, s=(6, n), axes=(0, 1)), "float64")
    # in place C2C: the operand holds the result
    ip = c.copy()
    op = wrap(ip)
    with F.FFT(op, options=F.FFTOptions(inplace=True, norm="ortho")) as f:
        res = f.plan().execute()
        assert res is op
    assert_close(ip, np.fft.fftn(c, norm="ortho"), "complex64")


_BAD_OPTIONS = [
    ("inplace", "no"),
    ("inplace", "yes"),
    ("inplace", 1),
    ("inplace", 0),
    ("inplace", None),
    ("inplace", np.array([True])),
    ("fft_type", "c2c"),
    ("fft_type", 2),
    ("fft_type", True),
    ("last_axis_parity", "three"),
    ("last_axis_parity", 1),
    ("last_axis_parity", ["even"]),
    ("norm", "none"),
    ("norm", 1),
    ("norm", np.array(["ortho"])),
]


@pytest.mark.parametrize("field, value", _BAD_OPTIONS, ids=[f"{f}={v!r}" for f, v in _BAD_OPTIONS])
def test_stateful_options_are_validated_by_type(field, value):
    """A truthy non-bool used to be taken as inplace=True, which overwrote the operand (#27)."""
    x = make((4, 4), "complex64")
    before = x.copy()
    with pytest.raises(InvalidArgumentError) as dict_form:
        F.FFT(x, options={field: value})
    assert dict_form.value.argument == f'options["{field}"]'
    with pytest.raises(InvalidArgumentError) as dataclass_form:
        F.FFT(x, options=F.FFTOptions(**{field: value}))
    assert dataclass_form.value.argument == f"options.{field}"
    np.testing.assert_array_equal(x, before)


def test_stateful_options_take_numpy_bools_and_a_none_norm():
    x = make((8,), "complex64")
    expected = np.fft.fft(x.astype(np.complex128))
    opts = F.FFTOptions(inplace=np.bool_(False), norm=None)
    assert opts.inplace is False and opts.norm == "backward"
    with F.FFT(x, options={"inplace": np.True_, "norm": None}) as f:
        assert f.plan().execute() is x
    assert_close(x, expected, "complex64")


@pytest.mark.parametrize("direction", [True, False, 1.0, -1.0, [1], "sideways"])
def test_stateful_direction_must_be_a_name_or_an_int(direction):
    x = make((8,), "complex64")
    with F.FFT(x) as f:
        f.plan()
        with pytest.raises(InvalidArgumentError) as info:
            f.execute(direction=direction)
        assert info.value.argument == "direction"
        assert_close(f.execute(direction=np.int64(1)), np.fft.ifft(x.astype(np.complex128)), "complex64")


@pytest.mark.parametrize("axes", [5, "01", 1.5])
def test_stateful_axes_must_be_a_sequence(axes):
    with pytest.raises(InvalidArgumentError) as info:
        F.FFT(make((4, 4), "complex64"), axes=axes)
    assert info.value.argument == "axes"


def test_stateful_options_errors():
    x = make((4, 4), "complex64")
    with pytest.raises(InvalidArgumentError):
        F.FFT(x, options={"fft_type": "R2R"})
    with pytest.raises(InvalidArgumentError):
        F.FFT(x, options={"last_axis_parity": "three"})
    with pytest.raises(InvalidArgumentError):
        F.FFT(x, options={"bogus": 1})
    with pytest.raises(UnsupportedDtypeError):
        F.FFT(x, options={"fft_type": "R2C"})
    with pytest.raises(InvalidArgumentError):
        F.FFT(x.real.copy(), options={"inplace": True})
    f = F.FFT(x)
    f.plan()
    f.reset_operand(None)
    with pytest.raises(PlanStateError):
        f.execute()
    f.free()
    with pytest.raises(PlanStateError):
        f.plan()
