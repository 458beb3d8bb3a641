"""The raw cuda executor's prepared FFTs with no array framework (neither CuPy nor Torch: a Numba- or JAX-only user):
the framework-free input and output passes (``nvdispatch._cuda.raw_passes``) run end to end on the host, their
device primitives (``nvdispatch._cuda.raw_calls``: cudaMallocAsync/cudaFreeAsync, cudaMemsetAsync,
cudaMemcpy2DAsync/cudaMemcpy3DAsync, cublasSscal/cublasDscal) replaced by host-memory implementations that follow
the documented CUDA semantics (pitches and widths in bytes, heights in rows, slices of ``ysize`` rows; cuBLAS
``n``/``incx`` in elements) and check their preconditions; cuFFT stood in for by NumPy's unnormalised transforms.
Every result is compared with numpy.fft; every byte a primitive writes must lie in scratch or in the result (the
input is never written). The same passes on a GPU: test_cuda_fft_raw_passes_gpu.py."""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import replace

import numpy as np
import pytest
from fft_reference import assert_close, expected_dtype, make, reference
from test_cuda_fft_prepared import CASES, IDS, HostCufft, _host_array, problem

from nvdispatch._cuda import cufft, raw_calls, raw_passes, xp
from nvdispatch._fft_problem import NORMS
from nvdispatch.executors import cuda_fft
from nvdispatch.executors.cuda_fft_prepared import RAW, PreparedFFTPlan, decline_prepared, preparation


class HostCalls:
    """``raw_calls`` on host memory, with CUDA's preconditions asserted and every write bounds-checked."""

    def __init__(self):
        self.buffers: dict[int, np.ndarray] = {}  # live scratch, by pointer
        self.results: list[np.ndarray] = []  # results handed out (writable too)
        self.freed: list[int] = []
        self.calls: list[tuple] = []

    # -- memory ----------------------------------------------------------------------------------------------------
    def alloc(self, nbytes, stream):
        assert nbytes > 0
        buf = np.full(nbytes + 256, 0xFF, np.uint8)  # poisoned: 0xFF bytes read as NaN
        off = (-buf.ctypes.data) % 256  # cudaMallocAsync's alignment
        ptr = buf.ctypes.data + off
        self.buffers[ptr] = buf[off : off + nbytes]
        return ptr

    def free(self, ptr, stream):
        assert ptr in self.buffers, "freed a pointer not allocated"
        self.freed.append(ptr)
        del self.buffers[ptr]

    def _writable(self, ptr, nbytes):
        for arr in [*self.buffers.values(), *self.results]:
            lo = arr.ctypes.data
            if lo <= ptr and ptr + nbytes <= lo + arr.nbytes:
                return
        raise AssertionError(f"write of {nbytes} bytes at {ptr:#x} outside scratch and results")

    # -- the primitives --------------------------------------------------------------------------------------------
    def memset_zero(self, ptr, nbytes, stream):
        self.calls.append(("memset", nbytes))
        self._writable(ptr, nbytes)
        ctypes.memset(ptr, 0, nbytes)

    def copy2d(self, dst, dpitch, src, spitch, width, height, stream):
        self.calls.append(("copy2d", width, height))
        assert width > 0 and height > 0
        assert dpitch >= width and spitch >= width, "cudaErrorInvalidPitchValue"
        assert max(dpitch, spitch) <= raw_passes.MAX_PITCH
        for i in range(height):
            self._writable(dst + i * dpitch, width)
            ctypes.memmove(dst + i * dpitch, src + i * spitch, width)

    def copy3d(self, dst, dpitch, dheight, src, spitch, sheight, width, height, depth, stream):
        self.calls.append(("copy3d", width, height, depth))
        assert width > 0 and height > 0 and depth > 0
        assert dpitch >= width and spitch >= width, "cudaErrorInvalidPitchValue"
        assert dheight >= height and sheight >= height
        for k, i in itertools.product(range(depth), range(height)):
            d, s = dst + (k * dheight + i) * dpitch, src + (k * sheight + i) * spitch
            self._writable(d, width)
            ctypes.memmove(d, s, width)

    def scal(self, real_dtype, n, alpha, ptr, incx, stream, device_index):
        self.calls.append(("scal", real_dtype, n, alpha, incx))
        assert real_dtype in ("float32", "float64") and 0 < n <= raw_calls.INT_MAX and incx > 0
        size = np.dtype(real_dtype).itemsize
        self._writable(ptr, ((n - 1) * incx + 1) * size)
        x = _host_array(ptr, (n,), real_dtype, (incx,))
        x *= np.dtype(real_dtype).type(alpha)  # cublas?scal: alpha in the vector's precision


@pytest.fixture
def host_raw(monkeypatch):
    """The prepared plan's device calls on host memory, with neither CuPy nor Torch (``namespace_for`` is None): the
    framework-free passes run, on :class:`HostCalls`."""
    from nvdispatch._cuda import arrays, runtime, streams

    calls = HostCalls()

    def view(x, framework):
        return arrays.DeviceView(x.ctypes.data, x.dtype.name, x.shape, tuple(s // x.itemsize for s in x.strides), x)

    def empty(kind, shape, dtype, device_index, stream):
        out = np.empty(shape, dtype)
        out[...] = np.nan
        calls.results.append(out)
        return out, out.ctypes.data

    def no_framework(*a, **k):
        raise AssertionError("the raw passes use no array framework")

    monkeypatch.setattr(arrays, "view", view)
    monkeypatch.setattr(arrays, "empty", empty)
    monkeypatch.setattr(arrays, "result_kind", lambda x, fw: "cai")
    monkeypatch.setattr(runtime, "bind_context", lambda device: None)
    monkeypatch.setattr(streams, "stream_pointer", lambda stream, fw, device: 0)
    monkeypatch.setattr(streams, "framework_stream", no_framework)
    monkeypatch.setattr(xp, "namespace_for", lambda framework: None)
    monkeypatch.setattr(xp, "Xp", no_framework)
    monkeypatch.setattr(xp, "as_xp", no_framework)
    monkeypatch.setattr(raw_calls, "unavailable", lambda: None)
    for name in ("alloc", "free", "memset_zero", "copy2d", "copy3d", "scal"):
        monkeypatch.setattr(raw_calls, name, getattr(calls, name))
    return calls


def run_raw(calls, x, func, norm=None, **kw):
    """The prepared plan's execute with the raw passes; checks it against numpy.fft and the input unchanged."""
    dtype = x.dtype.name
    before = x.copy()
    p = problem(x, func, norm=norm, **kw)
    prep = preparation(p)
    assert prep is not None
    inner = HostCufft(prep.core)
    plan = PreparedFFTPlan(p, "cufft", prep, inner)
    assert plan.helper == RAW
    got = plan.execute({"x": x})
    assert got.dtype == expected_dtype(func, dtype) and got.shape == p.out_shape
    assert_close(got, reference(func, before, norm=norm, **kw), dtype)
    np.testing.assert_array_equal(x, before)  # the input is only read
    assert inner.fresh == [prep.staged]
    assert not calls.buffers, "scratch not freed"
    return plan, got


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_raw_passes_give_numpy_fft(host_raw, case, norm):
    func, shape, dtype, kw = case
    run_raw(host_raw, make(shape, dtype), func, norm=norm, **kw)


def _layouts(shape, dtype):
    """``x`` of ``shape`` laid out several ways: C-contiguous, strided, transposed storage, Fortran order, a real
    view one element into complex data (misaligned), an offset slice."""
    yield "contiguous", make(shape, dtype)
    yield "strided", make(tuple(2 * d + 1 for d in shape), dtype)[tuple(slice(1, None, 2) for _ in shape)]
    yield "transposed", np.ascontiguousarray(make(shape[::-1], dtype)).T
    yield "fortran", np.asfortranarray(make(shape, dtype))
    big = make((*shape[:-1], shape[-1] + 3), dtype)
    yield "offset", big[..., 2 : 2 + shape[-1]]
    if dtype in ("float32", "float64"):
        z = make(shape, "complex64" if dtype == "float32" else "complex128")
        yield "imag-view", z.imag  # starts one real element into a complex one


LAYOUT_CASES = [
    ("fft", (5, 6, 9), "float32", {}),
    ("fft", (5, 6, 9), "float64", {"axis": 1}),
    ("ifft", (5, 6, 9), "float64", {"axis": 0, "n": 7}),
    ("fftn", (4, 6, 9), "float32", {"axes": (-2, -1)}),  # fft2
    ("fftn", (4, 6, 9), "complex64", {"s": (8, 5), "axes": (-2, -1)}),
    ("ifftn", (4, 6, 9), "complex128", {"s": (3, 12, 4), "axes": (0, 1, 2)}),
    ("rfft", (4, 6, 9), "float64", {"n": 14}),
    ("rfftn", (4, 6, 9), "float32", {"s": (5, 4), "axes": (0, 1)}),
    ("irfft", (4, 6, 9), "float32", {"axis": 1}),
    ("irfft", (4, 6, 9), "complex64", {"n": 20, "axis": 0}),
    ("irfftn", (4, 6, 9), "complex128", {"s": (7, 10), "axes": (1, 2)}),
    ("hfft", (4, 6, 9), "complex64", {"axis": 1}),
    ("hfft", (4, 6, 9), "float64", {"n": 12}),
    ("ihfft", (4, 6, 9), "float32", {"axis": 0}),
    ("ihfft", (4, 6, 9), "float64", {"n": 5, "axis": 2}),
]


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(LAYOUT_CASES)])
def test_raw_passes_on_strided_transposed_and_batched_inputs(host_raw, case, norm):
    func, shape, dtype, kw = case
    for name, x in _layouts(shape, dtype):
        try:
            run_raw(host_raw, x, func, norm=norm, **kw)
        except AssertionError as exc:
            raise AssertionError(f"layout {name}: {exc}") from exc


def test_a_contiguous_input_is_copied_in_one_call(host_raw):
    x = make((8, 20), "float32")
    run_raw(host_raw, x, "fft")  # widened: one 2-D copy of 160 rows of one real element, into zeroed scratch
    assert [c[0] for c in host_raw.calls] == ["memset", "copy2d"]
    assert host_raw.calls[1] == ("copy2d", 4, 160)
    host_raw.calls.clear()
    run_raw(host_raw, make((8, 20), "complex64"), "fft", n=12)  # trimmed: 8 rows of 12 complex elements
    assert host_raw.calls == [("copy2d", 96, 8)]
    host_raw.calls.clear()
    run_raw(host_raw, make((8, 20), "complex128"), "hfft", norm="ortho")  # conj: imaginary parts by -1, then scale
    assert host_raw.calls[0] == ("copy2d", 16 * 20 * 8, 1)  # all of x, as it lies
    assert host_raw.calls[1] == ("scal", "float64", 8 * 20, -1.0, 2)
    assert host_raw.calls[2][:3] == ("scal", "float64", 8 * 38) and host_raw.calls[2][4] == 1
    host_raw.calls.clear()
    run_raw(host_raw, make((8, 20), "float32"), "ihfft", norm="forward")  # R2C of x itself; conj only (scale 1)
    assert host_raw.calls == [("scal", "float32", 8 * 11, -1.0, 2)]
    host_raw.calls.clear()
    run_raw(host_raw, make((8, 20), "float32"), "ihfft")  # conj and the scale: real parts by s, imaginary by -s
    assert host_raw.calls == [("scal", "float32", 8 * 11, 1 / 20, 2), ("scal", "float32", 8 * 11, -1 / 20, 2)]


def test_copies_per_layout(host_raw):
    x = make((4, 6, 9), "float32")  # padded along the middle axis: 4 slices of 54 rows of one real element
    run_raw(host_raw, x, "fft", n=12, axis=1)
    assert [c for c in host_raw.calls if c[0] != "memset"] == [("copy3d", 4, 54, 4)], host_raw.calls  # one call
    host_raw.calls.clear()
    x = np.ascontiguousarray(make((9, 6, 4), "float64")).T  # transposed: 2-D copies along the longest axis
    run_raw(host_raw, x, "fft", n=12)
    assert [c for c in host_raw.calls if c[0] != "memset"] == [("copy2d", 8, 9)] * 24, host_raw.calls


def test_copy_geometry():
    g = raw_passes.copy_geometry((4, 5), (40, 8), (40, 8), 8)  # contiguous to contiguous: one run
    assert (g.width, g.rows, g.slices, g.loops, g.copies) == (160, None, None, (), 1)
    g = raw_passes.copy_geometry((4, 5), (40, 8), (64, 8), 8)  # padded rows: one 2-D copy
    assert (g.width, g.rows, g.copies) == (40, (4, 40, 64), 1)
    g = raw_passes.copy_geometry((3, 4, 5), (160, 40, 4), (480, 120, 8), 4)  # widened, padded: 3-D
    assert g.copies == 1 and g.slices is not None
    g = raw_passes.copy_geometry((3, 0, 5), (160, 40, 4), (480, 120, 8), 4)
    assert g.empty and g.copies == 0
    g = raw_passes.copy_geometry((2, 3, 4, 5), (8, 16, 48, 192), (480, 160, 40, 8), 8)  # fully transposed
    assert g.copies == 2 * 3 * 4 and g.width == 8 and g.rows == (5, 192, 8)
    g = raw_passes.copy_geometry((4, 5), (4, 2**31), (40, 8), 4)  # a pitch too big for one copy: loops
    assert g.rows == (4, 4, 40) and g.copies == 5


def test_geometry_is_what_the_copy_does():
    """The geometry's copy calls, run on host memory, move each element of the region to its place."""
    rng = np.random.default_rng(0)
    for shape, perm in [((3, 4, 5), (0, 1, 2)), ((3, 4, 5), (2, 0, 1)), ((2, 3, 4, 5), (3, 1, 0, 2)), ((7,), (0,))]:
        src = np.ascontiguousarray(rng.standard_normal(np.array(shape)[list(perm)])).transpose(np.argsort(perm))
        region = tuple(max(1, d - 1) for d in shape)
        for widen in (False, True):
            dst = np.zeros(shape, np.complex128 if widen else np.float64)
            geom = raw_passes.copy_geometry(region, src.strides, dst.strides, 8)
            calls = HostCalls()
            calls.results.append(dst)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(raw_calls, "copy2d", calls.copy2d)
                mp.setattr(raw_calls, "copy3d", calls.copy3d)
                raw_passes.strided_copy(geom, dst.ctypes.data, src.ctypes.data, 0)
            want = np.zeros_like(dst)
            sl = tuple(slice(0, r) for r in region)
            want[sl] = src[sl]
            np.testing.assert_array_equal(dst, want)


def test_scale_and_conj_chunks_counts_above_int_max(monkeypatch):
    seen = []
    monkeypatch.setattr(raw_calls, "scal", lambda dt, n, a, ptr, inc, s, d: seen.append((n, ptr, inc)))
    raw_passes.scale_and_conj(1000, raw_calls.INT_MAX + 5, "complex64", 1.0, True, 0, 0)  # imaginary parts only
    assert seen == [(raw_calls.INT_MAX, 1004, 2), (5, 1004 + raw_calls.INT_MAX * 8, 2)]


def test_decline_without_a_framework(monkeypatch):
    p = problem(make((4, 8), "float32"), "fft", n=12)
    monkeypatch.setattr(raw_calls, "unavailable", lambda: None)
    assert decline_prepared(p, requested=False, helper=None) is None  # the raw passes run it
    monkeypatch.setattr(raw_calls, "unavailable", lambda: "libcublas was not found")
    why = decline_prepared(p, requested=False, helper=None)
    assert "neither CuPy nor Torch" in why and "libcublas was not found" in why and "padding" in why
    monkeypatch.setattr(raw_calls, "unavailable", lambda: None)
    monkeypatch.setattr(raw_passes, "MAX_COPIES", 3)
    x = np.ascontiguousarray(make((9, 6, 4), "float64")).T
    why = decline_prepared(problem(x, "fft", n=12), requested=True, helper=None)  # 4 copies
    assert "4 copy calls" in why and "more than 3" in why
    neg = replace(problem(make((4, 8), "complex64"), "hfft"), strides=(8, -1))
    assert "negative" in decline_prepared(neg, requested=True, helper=None)
    half = replace(p, result_dtype="complex32")  # a half-precision result (Torch's, were no helper there)
    assert "single and double precision only" in decline_prepared(half, requested=True, helper=None)


def test_jax_arrays_keep_their_own_route_unless_cuda_is_asked_for(monkeypatch):
    """Without CuPy/Torch, JAX's own operations around cuFFT run these (verified on GPUs); set_backend("cuda")
    runs them here, with the raw passes."""
    monkeypatch.setattr(raw_calls, "unavailable", lambda: None)
    p = replace(problem(make((4, 8), "float32"), "fft", n=12), framework="jax")
    assert "JAX's own operations" in decline_prepared(p, requested=False, helper=None)
    assert decline_prepared(p, requested=True, helper=None) is None
    assert decline_prepared(p, requested=False, helper="cupy") is None


def test_the_executor_offers_prepared_problems_without_a_framework(monkeypatch):
    monkeypatch.setattr(cufft, "unavailable", lambda: None)
    monkeypatch.setattr(xp, "namespace_for", lambda framework: None)
    monkeypatch.setattr(raw_calls, "unavailable", lambda: None)
    for func, dtype, kw in [("fft", "float32", {}), ("hfft", "complex64", {}), ("ihfft", "float64", {}),
                            ("fft", "complex64", {"n": 100}), ("fftn", "float64", {"axes": (-2, -1)})]:  # fmt: skip
        assert cuda_fft.decline(problem(make((8, 20), dtype), func, **kw)) is None, (func, dtype)
    monkeypatch.setattr(raw_calls, "unavailable", lambda: "libcublas was not found")
    assert "libcublas was not found" in cuda_fft.decline(problem(make((8, 20), "float32"), "fft"))


def test_a_plan_without_any_pass_helper_says_why(monkeypatch):
    from nvdispatch.errors import ExecutorUnavailableError

    monkeypatch.setattr(xp, "namespace_for", lambda framework: None)
    monkeypatch.setattr(raw_calls, "unavailable", lambda: "no CUDA device")
    p = problem(make((6, 20), "float32"), "fft")
    prep = preparation(p)
    with pytest.raises(ExecutorUnavailableError, match="no CUDA device"):
        PreparedFFTPlan(p, "cufft", prep, HostCufft(prep.core))


def test_explain_names_the_raw_passes(host_raw):
    x = np.ascontiguousarray(make((11, 6), "float32")).T
    p = problem(x, "hfft", n=30, norm="ortho")
    prep = preparation(p)
    plan = PreparedFFTPlan(p, "cufft", prep, HostCufft(prep.core))
    text = " ".join(plan.steps)
    for words in ("raw device passes", "no array framework", "cudaMemcpy", "cuBLAS ?scal", "widened to complex64",
                  "zero-padded", "never written", "real parts of zeroed complex scratch"):  # fmt: skip
        assert words in text, (words, text)


def test_stays_off_the_raw_passes_where_a_framework_helps(host_raw, monkeypatch):
    """With CuPy or Torch usable, their array operations run the passes, as before."""
    from test_cuda_fft_prepared import NumpyOps

    monkeypatch.setattr(xp, "namespace_for", lambda framework: "cupy")
    monkeypatch.setattr(xp, "Xp", lambda name: NumpyOps())
    p = problem(make((6, 20), "float32"), "fft")
    prep = preparation(p)
    plan = PreparedFFTPlan(p, "cufft", prep, HostCufft(prep.core))
    assert plan.helper == "cupy" and "raw device passes" not in " ".join(plan.steps)


def test_tiny_and_single_element_inputs(host_raw):
    for shape, func, kw in [((1,), "fft", {}), ((1, 1), "fft", {"n": 4}), ((3, 1), "ifft", {"axis": 0}),
                            ((1, 5), "hfft", {}), ((2, 1), "ihfft", {"n": 3})]:  # fmt: skip
        for dtype in ("float32", "complex128"):
            if func == "ihfft" and dtype.startswith("complex"):
                continue
            if preparation(problem(make(shape, dtype), func, **kw)) is None:
                continue
            run_raw(host_raw, make(shape, dtype), func, norm="ortho", **kw)


# -- the primitives' own calls, with the CUDA runtime and cuBLAS recorded instead of run --------------------------------
def test_the_runtime_calls_are_made_as_documented(monkeypatch):
    """``raw_calls`` hands cuda-bindings' runtime the documented arguments (its real structs, built here on the CPU)."""
    rt = pytest.importorskip("cuda.bindings.runtime")
    from nvdispatch._cuda import runtime

    seen = []

    class Recorder:
        def __getattr__(self, name):
            real = getattr(rt, name)
            if name not in ("cudaMemsetAsync", "cudaMemcpy2DAsync", "cudaMemcpy3DAsync"):
                return real
            return lambda *args: seen.append((name, args)) or (rt.cudaError_t.cudaSuccess,)

    monkeypatch.setattr(runtime, "cudart", lambda: Recorder())
    raw_calls.memset_zero(4096, 800, 7)
    raw_calls.copy2d(4096, 16, 8192, 40, 8, 25, 7)
    raw_calls.copy3d(4096, 16, 30, 8192, 40, 25, 8, 25, 3, 7)
    d2d = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    assert seen[0] == ("cudaMemsetAsync", (4096, 0, 800, 7))
    assert seen[1] == ("cudaMemcpy2DAsync", (4096, 16, 8192, 40, 8, 25, d2d, 7))
    name, (p, stream) = seen[2]
    assert name == "cudaMemcpy3DAsync" and stream == 7 and p.kind == d2d
    assert (int(p.srcPtr.ptr), p.srcPtr.pitch, p.srcPtr.ysize) == (8192, 40, 25)
    assert (int(p.dstPtr.ptr), p.dstPtr.pitch, p.dstPtr.ysize) == (4096, 16, 30)
    assert (p.extent.width, p.extent.height, p.extent.depth) == (8, 25, 3)
    assert (p.srcPos.x, p.srcPos.y, p.srcPos.z, p.dstPos.x, p.dstPos.y, p.dstPos.z) == (0,) * 6


def test_the_cublas_calls_are_made_as_documented(monkeypatch):
    """``scal``: the device's handle, cublasSetStream to the caller's stream, then cublas?scal with ``alpha`` by
    host pointer."""
    seen = []

    class FakeCublas:
        def cublasCreate_v2(self, ref):
            ref._obj.value = 0xABC
            return 0

        def cublasSetStream_v2(self, h, stream):
            seen.append(("stream", h, stream))
            return 0

        def _scal(self, name, ctype):
            def call(h, n, alpha, ptr, incx):
                seen.append((name, h, n, ctypes.cast(alpha, ctypes.POINTER(ctype)).contents.value, ptr, incx))
                return 0

            return call

        def __getattr__(self, name):
            return self._scal(name, ctypes.c_float if name.startswith("cublasS") else ctypes.c_double)

    from nvdispatch._cuda import runtime

    class Rt:
        def cudaGetDevice(self):
            return (0, 0)

    monkeypatch.setattr(raw_calls, "_lib", lambda: FakeCublas())
    monkeypatch.setattr(runtime, "cudart", lambda: Rt())
    monkeypatch.setattr(runtime, "check", lambda result, what: result[1])
    monkeypatch.setattr(raw_calls, "_handles", {})
    raw_calls.scal("float32", 10, -1.0, 4100, 2, 5, 0)
    raw_calls.scal("float64", 3, 0.25, 8192, 1, 6, 0)
    assert seen == [("stream", 0xABC, 5), ("cublasSscal_v2", 0xABC, 10, -1.0, 4100, 2),
                    ("stream", 0xABC, 6), ("cublasDscal_v2", 0xABC, 3, 0.25, 8192, 1)]  # fmt: skip
    monkeypatch.setattr(FakeCublas, "cublasSetStream_v2", lambda self, h, s: 7, raising=False)
    with pytest.raises(raw_calls.CublasError, match="cublasSetStream failed: CUBLAS_STATUS_INVALID_VALUE"):
        raw_calls.scal("float32", 1, 2.0, 4096, 1, 0, 0)
