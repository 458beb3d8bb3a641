"""The raw cuda executor's prepared transforms (real input to a complex transform, hfft/ihfft, padding and trimming
by n/s) without a GPU: what it offers, the prepared problem cuFFT runs, and the input and output passes around it,
checked end to end against numpy.fft with NumPy standing in for the device framework and for cuFFT's unnormalised
transforms. The GPU runs the same passes with CuPy/Torch and cuFFT (test_cuda_fft_prepared_gpu.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from fft_reference import assert_close, expected_dtype, make, reference

from nvdispatch._cuda import cufft, xp
from nvdispatch._detect import Device, detect
from nvdispatch._fft_problem import NORMS, build_fft_problem
from nvdispatch._memory import CUDA, CUPY_ARRAY, TORCH_TENSOR
from nvdispatch.executors import cuda_fft
from nvdispatch.executors.cuda_fft_prepared import decline_prepared, finish, preparation, stage

GPU = Device("cuda", 0)
PLAIN = frozenset({CUDA})  # how __cuda_array_interface__/DLPack/JAX GPU operands are handed over


def problem(x, func, memory=PLAIN, framework="cuda_array_interface", **kw):
    p = build_fft_problem(func, detect("x", x), framework, GPU, **kw)
    return replace(p, memory=memory)


class NumpyOps:
    """NumPy standing in for the device framework's operations the passes use (``nvdispatch._cuda.xp.Xp``)."""

    def empty(self, shape, dtype, device_index=None):
        out = np.empty(shape, dtype)
        out[...] = np.nan  # poisoned: an element the pass fails to write shows up in the comparison
        return out

    def zeros(self, shape, dtype, device_index=None):
        return np.zeros(shape, dtype)

    def copy_into(self, dst, src):
        dst[...] = src

    def conj_(self, x):
        np.conjugate(x, out=x)

    def data_ptr(self, x):
        return x.ctypes.data


def unnormalised(core, data):
    """What cuFFT computes for the prepared problem ``core``: C2C in its direction, R2C forward, C2R inverse, all
    unnormalised."""
    if core.kind == "c2c":
        if core.direction == "forward":
            return np.fft.fftn(data, axes=core.axes, norm="backward")
        return np.fft.ifftn(data, axes=core.axes, norm="forward")
    if core.kind == "r2c":
        return np.fft.rfftn(data, axes=core.axes, norm="backward")
    return np.fft.irfftn(data, s=core.lengths, axes=core.axes, norm="forward")


def run_prepared(p, x):
    """The prepared plan's sequence (input pass, cuFFT, output pass) on the host."""
    prep = preparation(p)
    ops = NumpyOps()
    data = stage(ops, x, prep) if prep.staged else x
    assert data.shape == prep.core.shape and data.dtype == np.dtype(prep.core.dtype)
    out = np.empty(p.out_shape, p.result_dtype)
    out[...] = unnormalised(prep.core, data)
    finish(ops, out, prep, p.scale())
    return out


# func, shape, dtype, kwargs of nvdispatch.fft / numpy.fft
CASES = [
    ("fft", (6, 20), "float32", {}),
    ("fft", (6, 20), "float64", {"axis": 0}),
    ("ifft", (4, 9, 5), "float32", {"axis": 1}),
    ("fftn", (6, 8, 5), "float64", {"axes": (0, 2)}),
    ("fftn", (6, 8), "float32", {}),
    ("ifftn", (6, 8, 5), "float32", {"axes": (1, 2)}),
    ("fft", (6, 20), "complex64", {"n": 27}),
    ("fft", (6, 20), "complex128", {"n": 11, "axis": 1}),
    ("fft", (6, 20), "float32", {"n": 32, "axis": 0}),
    ("ifft", (6, 20), "complex64", {"n": 7}),
    ("fftn", (6, 8, 5), "complex128", {"s": (9, 4), "axes": (0, 1)}),
    ("fftn", (6, 8, 5), "float64", {"s": (3, 8, 12), "axes": (0, 1, 2)}),
    ("ifftn", (6, 8), "complex64", {"s": (10, 3), "axes": (0, 1)}),
    ("rfft", (6, 20), "float32", {"n": 33}),
    ("rfft", (6, 20), "float64", {"n": 8, "axis": 0}),
    ("rfftn", (6, 8, 5), "float32", {"s": (7, 6), "axes": (0, 2)}),
    ("irfft", (6, 11), "complex64", {"n": 30}),
    ("irfft", (6, 11), "complex128", {"n": 9}),
    ("irfft", (6, 11), "float32", {}),
    ("irfftn", (6, 8, 5), "complex64", {"s": (4, 12), "axes": (0, 2)}),
    ("irfftn", (6, 8, 5), "float64", {"axes": (1, 2)}),
    ("hfft", (6, 11), "complex64", {}),
    ("hfft", (6, 11), "complex128", {"n": 31, "axis": 1}),
    ("hfft", (11, 6), "complex64", {"n": 7, "axis": 0}),
    ("hfft", (6, 11), "float32", {}),
    ("ihfft", (6, 20), "float32", {}),
    ("ihfft", (6, 21), "float64", {"n": 30}),
    ("ihfft", (20, 6), "float32", {"n": 9, "axis": 0}),
]
IDS = [f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(CASES)]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_passes_around_the_unnormalised_transform_give_numpy_fft(case, norm):
    func, shape, dtype, kw = case
    x = make(shape, dtype)
    before = x.copy()
    p = problem(x, func, norm=norm, **kw)
    assert preparation(p) is not None
    got = run_prepared(p, x)
    assert got.dtype == expected_dtype(func, dtype)
    assert_close(got, reference(func, x, norm=norm, **kw), dtype)
    np.testing.assert_array_equal(x, before)  # the input is only read


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_prepared_problem_has_a_cufft_layout(case):
    """What cuFFT runs after the input pass is a transform it expresses directly (one plan, at most a few
    launches), where the problem as it lies is not."""
    func, shape, dtype, kw = case
    p = problem(make(shape, dtype), func, **kw)
    assert isinstance(cuda_fft.layout(p), str)
    core = preparation(p).core
    assert isinstance(cuda_fft.layout(core), dict), cuda_fft.layout(core)
    assert core.func not in ("hfft", "ihfft") and not core.needs_resize
    assert core.dtype in ("complex64", "complex128") or core.kind == "r2c"


def test_the_prepared_problem():
    x = make((6, 20), "float32")
    prep = preparation(problem(x, "fft", n=32))
    core = prep.core
    assert (core.func, core.kind, core.dtype, core.shape, core.strides) == ("fft", "c2c", "complex64", (6, 32), (32, 1))
    assert prep.staged and prep.widen and prep.pad and prep.region == (6, 20)
    assert (core.out_shape, core.result_dtype) == ((6, 32), "complex64")

    prep = preparation(problem(make((6, 20), "complex128"), "fftn", s=(4, 25), axes=(1, 0)))
    assert prep.core.shape == (25, 4) and prep.region == (6, 4) and prep.pad and not prep.widen

    prep = preparation(problem(make((6, 11), "complex64"), "hfft", n=8))  # C2R of conj(x)[..., :5]
    assert (prep.core.func, prep.core.kind, prep.core.shape, prep.region) == ("irfft", "c2r", (6, 5), (6, 5))
    assert prep.conj_input and not prep.pad and prep.core.out_shape == (6, 8)

    prep = preparation(problem(make((6, 20), "float64"), "ihfft"))  # R2C reads x where it lies, then conj
    assert not prep.staged and prep.conj_output and prep.core.func == "rfft" and prep.core.shape == (6, 20)
    assert prep.core.strides == (20, 1) and prep.core.result_dtype == "complex128"

    prep = preparation(problem(make((6, 20), "float32"), "rfft", n=12))  # a real scratch: R2C of the trimmed x
    assert prep.core.dtype == "float32" and prep.core.shape == (6, 12) and not prep.pad


def test_transforms_cufft_runs_as_they_are_need_no_preparation():
    for func, dtype, kw in [("fft", "complex64", {}), ("rfft", "float32", {}), ("irfft", "complex128", {"n": 20}),
                            ("ifftn", "complex64", {"s": (6, 20)})]:  # fmt: skip
        assert preparation(problem(make((6, 11 if func == "irfft" else 20), dtype), func, **kw)) is None


def test_strided_input_is_gathered_into_contiguous_scratch():
    base = make((12, 40), "float64")
    x = base[::2, 1::2]  # a strided view
    p = problem(x, "fft", n=25)
    assert p.strides != (20, 1)
    assert preparation(p).core.strides == (25, 1)
    assert_close(run_prepared(p, x), reference("fft", x, n=25), "float64")


def test_offered_to_plain_cuda_memory_left_to_the_frameworks_own_fft(monkeypatch):
    from nvdispatch._cuda import raw_calls

    p = problem(make((4, 8), "float32"), "fft", n=12)
    assert decline_prepared(p, requested=False, helper="cupy") is None
    assert decline_prepared(p, requested=False, helper="torch") is None
    monkeypatch.setattr(raw_calls, "unavailable", lambda: "no CUDA device")  # nor the framework-free passes
    why = decline_prepared(p, requested=False, helper=None)
    assert "neither CuPy nor Torch" in why and "padding" in why and "no CUDA device" in why
    for kind, fw in ((TORCH_TENSOR, "torch"), (CUPY_ARRAY, "cupy")):
        own = replace(p, memory=frozenset({kind, CUDA}), framework=fw)
        why = decline_prepared(own, requested=False, helper=fw)
        assert why is not None and f"{fw}'s own FFT" in why and "set_backend('cuda')" in why
        assert decline_prepared(own, requested=True, helper=fw) is None  # asked for: it runs here
    neg = replace(problem(make((4, 8), "complex64"), "hfft"), strides=(8, -1))
    assert "negative" in decline_prepared(neg, requested=True, helper="cupy")


def test_the_executor_offers_the_cases_it_declined(monkeypatch):
    """With cuFFT and a device framework present (stood in for here), the executor's decline takes real input,
    hfft/ihfft and n/s for operands in plain CUDA memory; without CuPy/Torch (nor the framework-free passes:
    test_cuda_fft_raw_passes.py) it says why."""
    from nvdispatch._cuda import raw_calls

    monkeypatch.setattr(cufft, "unavailable", lambda: None)
    monkeypatch.setattr(xp, "namespace_for", lambda framework: "cupy")
    calls = [
        ("fft", "float32", {}),
        ("fft2", "float64", None),
        ("fftn", "float32", {"axes": (0, 1)}),
        ("ifft", "float64", {}),
        ("hfft", "complex64", {}),
        ("ihfft", "float32", {}),
        ("fft", "complex64", {"n": 100}),
        ("ifftn", "complex128", {"s": (3, 50)}),
        ("irfft", "complex64", {"n": 7}),
    ]
    for func, dtype, kw in calls:
        if kw is None:  # fft2: fftn over the last two axes
            func, kw = "fftn", {"axes": (-2, -1)}
        p = problem(make((8, 20), dtype), func, **kw)
        assert cuda_fft.decline(p) is None, (func, dtype, kw)
    monkeypatch.setattr(xp, "namespace_for", lambda framework: None)
    monkeypatch.setattr(raw_calls, "unavailable", lambda: "libcublas was not found")
    assert "neither CuPy nor Torch" in cuda_fft.decline(problem(make((8, 20), "float32"), "fft"))
    # what cuFFT cannot express stays declined, prepared or not
    assert "at most 3" in cuda_fft.decline(problem(make((2, 3, 4, 5), "float32"), "fftn"))
    assert "innermost" in cuda_fft.decline(problem(make((6, 8), "float32"), "rfftn", axes=(1, 0), s=(4, 9)))


def test_explain_names_the_passes():
    p = problem(make((6, 11), "float32"), "hfft", n=30, norm="ortho")
    prep = preparation(p)
    text = " ".join(prep.input_steps(p, "cupy") + prep.output_steps(p, "cupy"))
    for words in ("widened to complex64", "axis 1 zero-padded from 11 to 16", "conjugated", "cupy's array operations",
                  "never written", f"scale by {1 / np.sqrt(30):.6g}"):  # fmt: skip
        assert words in text, (words, text)
    p = problem(make((6, 20), "float32"), "ihfft", n=8)
    prep = preparation(p)
    text = " ".join(prep.input_steps(p, "torch") + prep.output_steps(p, "torch"))
    assert "axis 1 trimmed from 20 to 8" in text and "result conjugated" in text and "scale by 0.125" in text


# -- the plan's execute, its device pieces stood in for by host memory ---------------------------------------------
def _host_array(ptr, shape, dtype, strides):
    """The host memory at ``ptr`` as a NumPy array (``strides`` in elements): what a device pointer stands for here."""
    import ctypes

    dt = np.dtype(dtype)
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    base = np.frombuffer((ctypes.c_char * (span * dt.itemsize)).from_address(ptr), dt, count=span)
    return np.lib.stride_tricks.as_strided(base, shape, tuple(s * dt.itemsize for s in strides))


class HostCufft:
    """Stands in for the ``CudaFFTPlan`` of the prepared problem: ``launch`` reads and writes by pointer, as cuFFT
    does, and scribbles over a C2R input afterwards (cuFFT's C2R overwrites it)."""

    def __init__(self, core):
        self.problem, self.device_index, self.cufft_steps, self.workspace_bytes = core, 0, ("cuFFT stand-in",), 0
        self.fresh = []

    def launch(self, in_ptr, out_ptr, s, fresh=False):
        from nvdispatch._strides import c_strides

        c = self.problem
        data = _host_array(in_ptr, c.shape, c.dtype, c.strides or c_strides(c.shape))
        out = _host_array(out_ptr, c.out_shape, c.result_dtype, c_strides(c.out_shape))
        out[...] = unnormalised(c, data)
        if c.kind == "c2r":
            data[...] = np.nan
        self.fresh.append(fresh)

    def release(self):
        pass


@pytest.fixture
def host_device(monkeypatch):
    """The plan's device calls on host memory: views by pointer, results from NumPy, no context or stream."""
    import contextlib

    from nvdispatch._cuda import arrays, runtime, streams

    def view(x, framework):
        return arrays.DeviceView(x.ctypes.data, x.dtype.name, x.shape, tuple(s // x.itemsize for s in x.strides), x)

    def empty(kind, shape, dtype, device_index, stream):
        out = np.empty(shape, dtype)
        out[...] = np.nan
        return out, out.ctypes.data

    def as_xp(x, framework, helper):
        cai = x.__cuda_array_interface__
        isz = np.dtype(cai["typestr"]).itemsize
        strides = tuple(s // isz for s in cai["strides"])
        return _host_array(cai["data"][0], cai["shape"], cai["typestr"], strides)

    monkeypatch.setattr(arrays, "view", view)
    monkeypatch.setattr(arrays, "empty", empty)
    monkeypatch.setattr(arrays, "result_kind", lambda x, fw: "cai")
    monkeypatch.setattr(runtime, "bind_context", lambda device: None)
    monkeypatch.setattr(streams, "stream_pointer", lambda stream, fw, device: 0)
    monkeypatch.setattr(streams, "framework_stream", lambda helper, s, device: contextlib.nullcontext())
    monkeypatch.setattr(xp, "namespace_for", lambda framework: "numpy stand-in")
    monkeypatch.setattr(xp, "Xp", lambda name: NumpyOps())
    monkeypatch.setattr(xp, "as_xp", as_xp)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("case", CASES[::2] + [CASES[-2]], ids=IDS[::2] + [IDS[-2]])
def test_the_plans_execute_by_pointer(host_device, case, norm):
    """The plan's own execute: the input viewed by pointer and staged, cuFFT's launch on the scratch (cuFFT may
    overwrite it) or on x where it lies (ihfft), the output pass on the result viewed by pointer."""
    from nvdispatch.executors.cuda_fft_prepared import PreparedFFTPlan

    func, shape, dtype, kw = case
    x = make(tuple(2 * d for d in shape), dtype)[tuple(slice(None, None, 2) for _ in shape)]  # strided
    before = x.copy()
    p = problem(x, func, norm=norm, **kw)
    prep = preparation(p)
    inner = HostCufft(prep.core)
    plan = PreparedFFTPlan(p, "cufft", prep, inner)
    got = plan.execute({"x": x})
    assert got.dtype == expected_dtype(func, dtype) and got.shape == p.out_shape
    assert_close(got, reference(func, before, norm=norm, **kw), dtype)
    np.testing.assert_array_equal(x, before)
    assert inner.fresh == [prep.staged]
    assert plan.steps[-1] == p.describe() and "cuFFT stand-in" in plan.steps
