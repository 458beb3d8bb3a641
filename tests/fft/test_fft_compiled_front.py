"""The transforms' cached hit compiled (src/nvdispatch/_hotpath_fft.c) and the cuFFT launch compiled
(_hotpath_cufft.c): repeated calls served exactly as the Python route (``fft._route.call_transform``) serves
them, every other call handed to that route; results against numpy.fft in float64. Each public-API test runs on
both fronts where the extension is built (the Python route alone is what an install without a compiler runs)."""

from __future__ import annotations

import copy
import gc
import logging
import sys

import numpy as np
import pytest

import nvdispatch
import nvdispatch.fft as F
from nvdispatch import errors
from nvdispatch._adapters import call_key_classes
from nvdispatch._compiled import hotpath
from nvdispatch.executors import cuda_fft, numpy_fft
from nvdispatch.fft import _route, _stateful

COMPILED = _route.transform_front is not _route.call_transform
NONE4 = (None, None, None, None)


@pytest.fixture(autouse=True)
def fresh():
    nvdispatch.reset_backends()
    nvdispatch.plan_cache.clear()
    call_key_classes.clear()  # signatures and memos: each test starts afresh
    yield
    nvdispatch.reset_backends()
    nvdispatch.plan_cache.clear()


@pytest.fixture
def counted(monkeypatch):
    """A compiled front made from the route's own parts but whose route counts the calls handed to it."""
    if not COMPILED:
        pytest.skip("the extension is not built here")
    parts = copy.copy(_route.FRONT_PARTS)
    handed = []

    def route(*args):
        handed.append(args)
        return _route.call_transform(*args)

    parts.route = route
    made = hotpath().make_fft_front(parts)

    def call(func, a, n=None, axis=-1, s=None, axes=None, norm="backward", out=None, stream=None, callbacks=NONE4):
        return made(func, a, n, axis, s, axes, norm, out, stream, "numpy", callbacks)

    call.handed = handed
    return call


def _x(shape=(16, 16), dtype=np.complex64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _close(got, want, dtype):
    single = np.dtype(dtype) in (np.complex64, np.float32)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4 if single else 1e-10, atol=1e-4 if single else 1e-10)


def _oracle(func, x, **kw):
    return getattr(np.fft, func)(np.asarray(x).astype(np.complex128 if x.dtype.kind == "c" else np.float64), **kw)


# -- the hit and what it serves -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "func, dtype, kw",
    [
        ("fft", np.complex64, {}),
        ("fft", np.complex128, {"axis": 0, "norm": "ortho"}),
        ("ifft", np.complex64, {"n": 16}),
        ("rfft", np.float32, {}),
        ("irfft", np.complex128, {"norm": "forward"}),
        ("fftn", np.complex64, {"axes": (0, 1)}),
        ("ifftn", np.complex128, {"axes": (1,)}),
        ("rfftn", np.float64, {"axes": (-2, -1)}),
    ],
)
def test_repeated_numpy_calls_are_served_by_the_front_with_numpy_results(counted, func, dtype, kw):
    x = _x(dtype=dtype)
    for i in range(4):
        _close(counted(func, x, **kw), _oracle(func, x, **kw), dtype)
        assert len(counted.handed) == 1, f"call {i}: only the first (the miss) goes to the route"


def test_repeated_torch_calls_are_served_through_the_memo(counted):
    torch = pytest.importorskip("torch")
    x = _x()
    t = torch.from_numpy(x.copy())
    for _ in range(4):
        got = counted("fftn", t, axes=(-2, -1))
        assert isinstance(got, torch.Tensor)
        _close(got.numpy(), np.fft.fft2(x.astype(np.complex128)), np.complex64)
    # the miss plans, the next call's key finds the plan and the memo learns its handle; then the front serves
    assert len(counted.handed) == 2
    assert t.numpy().tobytes() == x.tobytes()  # the input is never written


@pytest.mark.parametrize(
    "func, dtype, kw",
    [
        ("rfft", np.float64, {}),
        ("rfft", np.float32, {"norm": "ortho"}),
        ("fft", np.complex128, {"axis": 0}),
        ("irfft", np.complex64, {"n": 40}),  # a given length: the plan pads or trims each operand to it
        ("ihfft", np.float64, {"norm": "forward"}),
    ],
)
def test_new_lengths_are_served_by_the_front_from_the_plan_of_every_extent(counted, func, dtype, kw):
    for n in (16, 17, 2, 3, 30, 1000, 1001, 97):
        x = _x((n,), dtype, seed=n)
        _close(counted(func, x, **kw), _oracle(func, x, **kw), dtype)
        assert len(counted.handed) == 1, f"length {n}: only the first length goes to the route"
    assert x.tobytes() == _x((97,), dtype, seed=97).tobytes()  # the input is never written


def test_operands_the_plan_of_every_extent_does_not_serve_go_to_the_route(counted):
    counted("rfft", _x((16,), np.float64))
    one = _x((1,), np.float64)  # an extent below 2: the route's plan of its own
    _close(counted("rfft", one), np.fft.rfft(one), np.float64)
    assert len(counted.handed) == 2
    batch = _x((4, 16), np.float64)  # another rank: another key, planned by the route, then a repeated call
    for _ in range(3):
        _close(counted("rfft", batch), np.fft.rfft(batch), np.float64)
    assert len(counted.handed) == 3
    single = _x((20,), np.float32)  # another dtype: its own plan of every extent
    _close(counted("rfft", single), np.fft.rfft(single.astype(np.float64)), np.float32)
    assert len(counted.handed) == 4
    with pytest.raises(errors.InvalidArgumentError):  # an empty operand: the route's typed error
        counted("rfft", np.empty(0))


def test_any_length_hits_hold_no_references_they_did_not_hold_before(counted):
    xs, norm = [_x((n,), np.float64, seed=n) for n in (16, 17, 18)], "ortho"
    counted("rfft", xs[0], norm=norm)
    gc.collect()
    before = [sys.getrefcount(x) for x in xs] + [sys.getrefcount(norm)]
    for _ in range(100):
        for x in xs:
            counted("rfft", x, norm=norm)
    del x  # the loop's own reference
    gc.collect()
    assert [sys.getrefcount(x) for x in xs] + [sys.getrefcount(norm)] == before
    assert len(counted.handed) == 1


def test_the_fronts_any_length_hit_is_logged_by_its_key(counted, caplog):
    counted("rfft", _x((16,), np.float64))
    with caplog.at_level(logging.DEBUG, logger="nvdispatch"):
        counted("rfft", _x((31,), np.float64))
    assert len(counted.handed) == 1
    assert "plan cache hit (any-length key): plan NumpyAnyLengthFFTPlan" in caplog.text


def test_a_plan_without_a_direct_call_runs_execute(counted):
    torch = pytest.importorskip("torch")
    x = _x(dtype=np.float64)
    t = torch.from_numpy(x.copy())
    counted("ihfft", t)
    assert nvdispatch.explain(F.ihfft, t).executor == "torch"
    for _ in range(3):
        got = counted("ihfft", t)
        assert not got.is_conj()
        _close(got.numpy(), np.fft.ihfft(x), np.float64)
    assert len(counted.handed) == 2


@pytest.mark.parametrize(
    "change",
    ["dtype", "shape", "strides", "norm", "axes", "axis", "n", "axes_list", "s", "out", "stream", "callbacks",
     "backend"],
)  # fmt: skip
def test_every_mismatch_goes_to_the_route_and_gets_its_own_result(counted, change):
    x = _x((16, 16))
    counted("fftn", x, axes=(0, 1))
    counted("fftn", x, axes=(0, 1))
    assert len(counted.handed) == 1
    y, kw, want = x, {"axes": (0, 1)}, None
    if change == "dtype":
        y = x.astype(np.complex128)
    elif change == "shape":
        y = _x((8, 16))
    elif change == "strides":
        y = _x((16, 32))[:, ::2]
    elif change == "norm":
        kw["norm"] = "ortho"
    elif change == "axes":
        kw["axes"] = (1,)
    elif change == "axis":
        kw = {"axis": 0}
    elif change == "n":
        kw = {"n": 16}
    elif change == "axes_list":
        kw["axes"] = [0, 1]
    elif change == "s":
        kw["s"] = (16, 16)
    elif change == "out":
        kw["out"] = np.empty((16, 16), np.complex64)
    elif change == "stream":
        kw["stream"] = 0
    elif change == "callbacks":
        kw["callbacks"] = (lambda v, i: v * 2, None, None, None)
        want = np.fft.fft2(2 * x.astype(np.complex128))
    func = "fft" if change in ("axis", "n") else "fftn"
    if change == "backend":
        with nvdispatch.set_backend("numpy", coerce=True):
            got = counted(func, y, **kw)
    elif change == "stream":  # no stream on the CPU: the route's typed error
        with pytest.raises(errors.InvalidArgumentError, match="stream"):
            counted(func, y, **kw)
        assert len(counted.handed) == 2
        return
    else:
        got = counted(func, y, **kw)
    assert len(counted.handed) == 2, "the changed call is the route's"
    if want is None:
        call_kw = {k: v for k, v in kw.items() if k not in ("out", "stream")}
        want = _oracle(func, y, **call_kw)
    _close(got, want, y.dtype)
    if change == "out":
        assert got is kw["out"]


def test_an_unhashable_argument_gets_the_routes_typed_error(counted):
    x = _x()
    counted("fft", x)
    with pytest.raises(errors.InvalidArgumentError, match="n"):
        counted("fft", x, n=[16])


def test_bad_input_after_served_calls_still_gets_its_typed_error(counted):
    x = _x()
    for _ in range(2):
        counted("fft", x)
    with pytest.raises(errors.InvalidArgumentError, match="norm"):
        counted("fft", x, norm="sideways")
    with pytest.raises(errors.InvalidArgumentError):
        counted("fft", x, axis=5)


@pytest.mark.parametrize("raised, expected", [(MemoryError, errors.OutOfMemoryError), (ValueError, ValueError)])
def test_an_error_in_a_served_plans_run_propagates_as_the_route_raises_it(counted, monkeypatch, raised, expected):
    x = _x()
    counted("fft", x)

    def fail(self, x):
        raise raised("out of memory" if raised is MemoryError else "boom")

    monkeypatch.setattr(numpy_fft.NumpyFFTPlan, "direct", fail)
    with pytest.raises(expected):
        counted("fft", x)
    assert len(counted.handed) == 1, "the hit ran the plan (and raised), not the route"


def _pins():
    return sum(len(e.users) for e in nvdispatch.plan_cache._lru)  # noqa: SLF001


def test_a_pinned_plan_is_let_go_after_every_served_call_and_every_failed_one(counted, monkeypatch):
    torch = pytest.importorskip("torch")
    from nvdispatch.executors import torch_fft

    monkeypatch.setattr(torch_fft.TorchFFTPlan, "needs_release", True)  # pinned by calls, as GPU plans are
    t = torch.from_numpy(_x())
    for _ in range(4):
        _close(counted("fft", t).numpy(), np.fft.fft(t.numpy().astype(np.complex128)), np.complex64)
        assert _pins() == 0
    assert len(counted.handed) == 2
    assert not any(e.pinless for e in nvdispatch.plan_cache._lru)  # noqa: SLF001
    (entry,) = list(nvdispatch.plan_cache._lru)  # noqa: SLF001

    def fail(x):
        raise RuntimeError("boom")

    monkeypatch.setattr(entry.plan, "direct", fail)
    with pytest.raises(RuntimeError, match="boom"):
        counted("fft", t)
    assert _pins() == 0 and len(counted.handed) == 2


def test_served_calls_hold_no_references_they_did_not_hold_before(counted):
    x, axes, norm = _x(), (0, 1), "ortho"
    for _ in range(3):
        counted("fftn", x, axes=axes, norm=norm)
    gc.collect()
    before = [sys.getrefcount(x), sys.getrefcount(axes), sys.getrefcount(norm)]
    for _ in range(200):
        counted("fftn", x, axes=axes, norm=norm)
    gc.collect()
    assert [sys.getrefcount(x), sys.getrefcount(axes), sys.getrefcount(norm)] == before
    assert len(counted.handed) == 1


def test_the_front_is_made_from_one_object_with_documented_attributes():
    if not COMPILED:
        pytest.skip("the extension is not built here")

    class Parts:
        pass

    with pytest.raises(AttributeError):
        hotpath().make_fft_front(Parts())
    front = hotpath().make_fft_front(_route.FRONT_PARTS)
    with pytest.raises(TypeError, match="11 arguments"):
        front("fft", _x())


# -- the public transforms, on either front --------------------------------------------------------------------


@pytest.mark.parametrize("name, kw", [("fft", {}), ("fft2", {}), ("rfft2", {}), ("ifft2", {"norm": "ortho"})])
def test_public_transforms_on_either_front_give_numpy_results(fft_front, name, kw):
    x = _x(dtype=np.float64 if name == "rfft2" else np.complex128)
    for _ in range(3):
        _close(getattr(F, name)(x, **kw), getattr(np.fft, name)(x, **kw), x.dtype)


def test_public_repeated_calls_on_the_compiled_front_skip_the_python_hit(fft_front, monkeypatch):
    runs = []
    real = _route._run
    monkeypatch.setattr(_route, "_run", lambda *a, **k: runs.append(a[0]) or real(*a, **k))
    x = _x()
    for _ in range(3):
        _close(F.fft2(x), np.fft.fft2(x.astype(np.complex128)), np.complex64)
    assert len(runs) == (1 if fft_front == "compiled" else 3)


def test_backend_state_changes_are_seen_by_repeated_calls(fft_front):
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(_x())
    for _ in range(3):
        F.fft(t)
    assert nvdispatch.explain(F.fft, t).executor == "torch"
    with nvdispatch.set_backend("numpy", coerce=True):
        assert nvdispatch.explain(F.fft, t).executor == "numpy"
        for _ in range(3):
            got = F.fft(t)
            _close(np.asarray(got), np.fft.fft(t.numpy().astype(np.complex128)), np.complex64)
    _close(F.fft(t).numpy(), np.fft.fft(t.numpy().astype(np.complex128)), np.complex64)


# -- the stateful FFT's execute() ------------------------------------------------------------------------------


def _no_checks(monkeypatch):
    """Count the checks execute() runs beside the plan's direct call."""
    counted = []
    real = _stateful.coerce_operands
    monkeypatch.setattr(_stateful, "coerce_operands", lambda *a: counted.append(1) or real(*a))
    return counted


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_fft_execute_with_no_arguments_runs_the_direct_call(monkeypatch, framework):
    x = _x()
    op = x
    if framework == "torch":
        torch = pytest.importorskip("torch")
        op = torch.from_numpy(x.copy())
    checks = _no_checks(monkeypatch)
    with F.FFT(op, axes=(0, 1)) as f:
        f.plan()
        for _ in range(3):
            _close(np.asarray(f.execute()), np.fft.fft2(x.astype(np.complex128)), np.complex64)
        assert not checks
        _close(np.asarray(f.execute(direction="inverse")), np.fft.ifft2(x.astype(np.complex128)), np.complex64)
        assert checks  # an argument: the full checks


def test_fft_execute_follows_reset_operand_and_free():
    x, y = _x(seed=1), _x(seed=2)
    f = F.FFT(x, axes=(0, 1)).plan()
    _close(f.execute(), np.fft.fft2(x.astype(np.complex128)), np.complex64)
    f.reset_operand(y)
    _close(f.execute(), np.fft.fft2(y.astype(np.complex128)), np.complex64)
    z = _x((16, 32), seed=3)[:, ::2]  # other strides: planned again
    f.reset_operand(z)
    _close(f.execute(), np.fft.fft2(z.astype(np.complex128)), np.complex64)
    f.reset_operand(None)
    with pytest.raises(errors.PlanStateError):
        f.execute()
    f.free()
    with pytest.raises(errors.PlanStateError):
        f.execute()


def test_fft_execute_refuses_a_call_autograd_records_after_planning():
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(_x())
    with F.FFT(t) as f:
        f.plan()
        f.execute()
        t.requires_grad_(True)
        with pytest.raises(errors.PlanStateError, match="autograd"):
            f.execute()
        t.requires_grad_(False)
        _close(f.execute().numpy(), np.fft.fft2(t.numpy().astype(np.complex128)), np.complex64)


@pytest.mark.parametrize("options", [{"inplace": True}, {"norm": "ortho"}])
def test_fft_execute_keeps_its_semantics_where_it_takes_the_checks(options):
    x = _x()
    want = np.fft.fft2(x.astype(np.complex128), norm=options.get("norm"))
    op = x.copy()
    with F.FFT(op, options=options) as f:
        got = f.plan().execute()
    _close(got, want, np.complex64)
    if options and options.get("inplace"):
        assert got is op


# -- the cuFFT launch, compiled: probes stand in for cuFFT where no GPU is -------------------------------------


class _Cufft:
    """What the launch reads of a CufftPlan: handle (None once destroyed) and stream."""

    def __init__(self, handle=5):
        self.handle, self.stream = handle, None


def _launch_parts(direction=-1, scale=None, handle=5, alignment=8):
    h = hotpath()
    cuf, bound, streams, fell = _Cufft(handle), [], [7], []
    ints = (
        h.CUFFT_EXEC_C2C_PROBE if direction else h.CUFFT_EXEC_REAL_PROBE,
        h.CUFFT_SET_STREAM_PROBE,
        direction,
        0,
        alignment,
    )

    def check(status, what):
        raise errors.CufftError(what, status)

    made = h.make_cufft_direct(
        ints, cuf, np.empty, ((4,),), {"dtype": "complex64"}, lambda a: a.ctypes.data, lambda: streams[0],
        bound.append, scale, check, lambda x: fell.append(x) or "fallback",
    )  # fmt: skip
    return made, cuf, bound, streams, fell


def test_the_compiled_cufft_launch_passes_handle_pointers_stream_and_direction():
    if not COMPILED:
        pytest.skip("the extension is not built here")
    h = hotpath()
    made, cuf, bound, streams, _ = _launch_parts(direction=1)
    x = np.ones(4, np.complex64)
    _, _, (_, _), set_calls = h.probe_cufft_record()
    out = made(x)
    (handle, inp, outp, direction), _, (shandle, stream), set_after = h.probe_cufft_record()
    assert (handle, inp, outp, direction) == (5, x.ctypes.data, out.ctypes.data, 3)
    assert out.shape == (4,) and out.dtype == np.complex64
    assert (shandle, stream, set_after - set_calls, cuf.stream) == (5, 7, 1, 7)
    made(x)
    assert h.probe_cufft_record()[3] == set_after, "the same stream is not set again"
    streams[0] = 9
    made(x)
    assert h.probe_cufft_record()[2] == (5, 9) and cuf.stream == 9
    cuf.stream = None  # the Python launch set another stream meanwhile: the compiled one sets its own again
    made(x)
    assert h.probe_cufft_record()[3] == set_after + 2
    assert bound in ([], [0])  # bound once per thread (earlier tests of this thread may have bound it)


def test_the_compiled_cufft_launch_of_a_real_transform_scales_and_reports_errors():
    if not COMPILED:
        pytest.skip("the extension is not built here")
    h = hotpath()
    made, cuf, _, _, fell = _launch_parts(direction=0, scale=0.5)
    x = np.ones(4, np.complex64)
    out = made(x)
    assert h.probe_cufft_record()[0][3] == 0 and out.dtype == np.complex64
    cuf.handle = 13  # the probe fails this handle's launch: cuFFT's error, raised by check
    with pytest.raises(errors.CufftError, match="cufftExec"):
        made(x)
    cuf.handle = None  # destroyed: the Python launch (which raises the plan's error) serves the call
    assert made(x) == "fallback" and fell == [x]


def test_the_compiled_cufft_launch_validates_what_it_is_made_from():
    if not COMPILED:
        pytest.skip("the extension is not built here")
    h = hotpath()
    good = (h.CUFFT_EXEC_C2C_PROBE, h.CUFFT_SET_STREAM_PROBE, -1, 0, 8)
    rest = (_Cufft(), "new_empty", (), {}, id, int, id, None, id, id)
    for ints in (good[:4], (0, *good[1:]), (*good[:2], 2, 0, 8), (*good[:3], -1, 8), (*good[:4], 0)):
        with pytest.raises((TypeError, ValueError)):
            h.make_cufft_direct(ints, *rest)
    with pytest.raises(TypeError, match="scale"):
        h.make_cufft_direct(good, *rest[:7], 2, *rest[8:])


def _misaligned_real_view(dtype=np.complex128):
    """The imaginary parts of complex data as a real view: it starts one real element into a complex one."""
    z = np.zeros((3, 4), dtype)
    return z.view(z.real.dtype)[:, 1::2]


def test_the_compiled_cufft_launch_hands_a_misaligned_input_to_the_python_call():
    """cuFFT rejects an input pointer not aligned to the complex type (CUFFT_INVALID_VALUE): the compiled call
    launches nothing for it, the Python call (which stages it in aligned scratch) serves it."""
    if not COMPILED:
        pytest.skip("the extension is not built here")
    h = hotpath()
    made, _, _, _, fell = _launch_parts(direction=0, alignment=16)
    x = _misaligned_real_view()
    assert x.ctypes.data % 16 == 8
    calls = h.probe_cufft_record()[1]
    assert made(x) == "fallback" and fell == [x]
    assert h.probe_cufft_record()[1] == calls, "no cuFFT launch for a misaligned input"
    aligned = np.ones(4, np.complex128)
    made(aligned)
    assert h.probe_cufft_record()[1] == calls + 1 and fell == [x]


def test_the_python_cufft_launch_stages_a_misaligned_input_in_aligned_scratch(monkeypatch):
    launches, staged = [], []

    class Cufft:
        def execute(self, inp, outp, stream, direction):
            launches.append((inp, outp, stream, direction))

    class Scratch:
        ptr = 4096

        def release(self):
            staged.append("released")

    def fake_staged(ptr, nbytes, fw, device, stream):
        staged.append((ptr, nbytes, fw, device, stream))
        return Scratch()

    monkeypatch.setattr(cuda_fft, "staged_input", fake_staged)
    launch = cuda_fft._Launch(
        Cufft(), (np.zeros, ((3,),), {"dtype": "complex128"}), lambda a: a.ctypes.data, lambda: 11, 0, 0, None,
        alignment=16, span_bytes=88, framework="cupy",
    )  # fmt: skip
    import nvdispatch._cuda.runtime as runtime

    runtime._bound.device = 0  # noqa: SLF001 - this thread counts as bound: no CUDA call where no GPU is
    x = _misaligned_real_view()
    out = launch(x)
    assert staged == [(x.ctypes.data, 88, "cupy", 0, 11), "released"]
    assert launches == [(4096, out.ctypes.data, 11, 0)]
    y = np.ones((3, 4))  # aligned: no copy
    out = launch(y)
    assert launches[-1] == (y.ctypes.data, out.ctypes.data, 11, 0) and len(staged) == 2


def test_the_python_cufft_launch_takes_the_same_steps():
    launches = []

    class Cufft:
        def execute(self, inp, outp, stream, direction):
            launches.append((inp, outp, stream, direction))

    launch = cuda_fft._Launch(
        Cufft(), (np.zeros, ((3,),), {"dtype": "complex64"}), lambda a: a.ctypes.data, lambda: 11, 0, 1, 0.25
    )
    import nvdispatch._cuda.runtime as runtime

    runtime._bound.device = 0  # noqa: SLF001 - this thread counts as bound: no CUDA call where no GPU is
    x = np.ones(3, np.complex64)
    out = launch(x)
    assert launches == [(x.ctypes.data, out.ctypes.data, 11, 1)]
    assert out.shape == (3,)


def test_fft_execute_pins_a_pinned_plan_for_the_call_only(monkeypatch):
    monkeypatch.setattr(numpy_fft.NumpyFFTPlan, "needs_release", True)  # pinned by calls, as GPU plans are
    x = _x()
    with F.FFT(x, axes=(0, 1)) as f:
        f.plan()
        held = _pins()  # the object's hold
        assert held
        for _ in range(3):
            _close(f.execute(), np.fft.fft2(x.astype(np.complex128)), np.complex64)
            assert _pins() == held

        def fail(self, x):
            raise MemoryError("out of memory")

        monkeypatch.setattr(numpy_fft.NumpyFFTPlan, "direct", fail)
        f.plan()  # its ready call is the failing one now
        held = _pins()
        with pytest.raises(errors.OutOfMemoryError):
            f.execute()
        assert _pins() == held
