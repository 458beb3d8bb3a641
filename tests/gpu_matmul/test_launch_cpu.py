"""The one launch sequence of the cuBLASLt plans (``_cuda/lt_launch.py``), and the regular and FP8 plans that share
it, run on the CPU against stand-ins of cuBLASLt that record what they are handed: which pointers reach
``cublasLtMatmul`` in which order for each orientation, when the descriptor's pointers are set, which algorithm
an alignment gets, workspaces per stream, errors, threads. The arrays are CPU tensors (their pointers are real);
no kernel runs, so values are checked on the GPU (``test_gpu_matmul.py``, ``tests/fp8/test_fp8_gpu.py``)."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import threading

import numpy as np
import pytest

from nvdispatch._compiled import hotpath
from nvdispatch._cuda import cublaslt as lt
from nvdispatch._cuda import lt_autotune, lt_descriptors, lt_launch, lt_plan_base
from nvdispatch._cuda.lt_launch import LtLaunch, alignment
from nvdispatch.errors import CublasLtError

torch = pytest.importorskip("torch")
_ids = itertools.count(0x1000, 0x100)


class FakeDesc:
    """A matmul descriptor: its attributes as a dict."""

    def __init__(self, compute=68, scale=0):
        self.ptr = next(_ids)
        self.attrs: dict[int, int] = {}
        self.sets = 0
        DESCS[self.ptr] = self

    def _set(self, attr, value):
        self.attrs[attr] = value
        self.sets += 1

    set_i8 = set_i32 = set_i64 = set_ptr = _set


class FakeLayout:
    def __init__(self, dtype, rows, cols, ld, batch=1, batch_stride=0):
        self.ptr = next(_ids)
        self.args = (dtype, rows, cols, ld, batch, batch_stride)
        FAKE_LAYOUTS[self.ptr] = self.args


class FakePreference:
    def __init__(self, max_workspace, alignment=256):
        self.alignment = alignment


def result(workspace=0, tag=0):
    r = lt.HeuristicResult()
    r.algo.data[0] = tag
    r.workspaceSize = workspace
    return r


DESCS: dict[int, FakeDesc] = {}
FAKE_LAYOUTS: dict[int, tuple] = {}


class Recorder:
    """``cublasLtMatmul``: records its 16 arguments, the descriptor's attributes and the algorithm's tag
    (``algo.data[0]``) at the call; returns ``status``."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.attrs: list[dict] = []
        self.tags: list[int] = []
        self.status = 0
        self.lock = threading.Lock()
        self.capturing: set[int] = set()  # the streams a CUDA graph capture is under way on

    def __call__(self, *args):
        assert len(args) == 16
        with self.lock:
            self.calls.append(args)
            self.attrs.append(dict(DESCS[args[1]].attrs))
            self.tags.append(ctypes.cast(args[12], ctypes.POINTER(lt.Algo)).contents.data[0])
        return self.status


@pytest.fixture
def fake_lt(monkeypatch):
    """cuBLASLt replaced by stand-ins: descriptors, layouts, a heuristic answering one algorithm per alignment
    (``algo.data[0]`` is the alignment it was asked for), the launch recorder; device 0, no CUDA streams."""
    rec = Recorder()
    monkeypatch.setattr(lt, "Desc", FakeDesc)
    monkeypatch.setattr(lt, "Layout", FakeLayout)
    monkeypatch.setattr(lt, "Preference", FakePreference)
    monkeypatch.setattr(lt, "heuristic", lambda h, desc, a, b, c, d, pref, count: [result(tag=pref.alignment)])
    monkeypatch.setattr(lt, "handle", lambda index: 77)
    monkeypatch.setattr(lt, "matmul_call", lambda: rec)
    monkeypatch.setattr(lt_launch, "capturing", lambda stream: stream in rec.capturing)
    monkeypatch.setattr(lt_autotune, "saved_choice", lambda plan, tuning=None: None)
    monkeypatch.setattr(lt_descriptors, "device_index", lambda p: 0)
    monkeypatch.setattr(lt_plan_base, "device_index", lambda p: 0)
    monkeypatch.setattr(lt_plan_base, "current_stream_getter", lambda framework, index: None)
    monkeypatch.setattr(lt_plan_base, "framework_stream", lambda *args: contextlib.nullcontext())
    hp = hotpath()
    if hp is not None:  # the compiled direct call launches the extension's probes, never a library
        addresses = {"cublasLtMatmul": hp.LT_LAUNCH_PROBE, "cublasLtMatmulDescSetAttribute": hp.LT_SET_ATTRIBUTE_PROBE}
        monkeypatch.setattr(lt, "address", addresses.__getitem__)
    from nvdispatch import plan_cache

    plan_cache.clear()  # the probes' memos hold answers of the real cuBLASLt elsewhere
    yield rec
    plan_cache.clear()


class FakeCore:
    """Descriptors whose heuristic answers ``algos_by_alignment[alignment]`` (default: one algorithm tagged with
    the alignment) and records what it was asked."""

    def __init__(self, algos_by_alignment=None):
        self.desc = FakeDesc()
        self.a, self.b, self.c, self.d = (FakeLayout(0, 1, 1, 1) for _ in range(4))
        self.asked: list[int] = []
        self.by_alignment = algos_by_alignment or {}

    def algorithms(self, handle, alignment, count=1):
        self.asked.append(alignment)
        return self.by_alignment.get(alignment, [result(tag=alignment)])


# -- the launch sequence -------------------------------------------------------------------------------------
@pytest.mark.parametrize("a_first", [False, True])
def test_one_launch_with_the_operands_in_cublaslts_order(fake_lt, a_first):
    core = FakeCore()
    launch = LtLaunch(core, 77, 0, result(tag=1), a_first=a_first)
    launch(0x10000, 0x20000, 0x30000, 0x40000, 11, 12, 99)
    (call,) = fake_lt.calls
    A, B = (0x10000, 0x20000) if a_first else (0x20000, 0x10000)  # the row orientation: D^T = B^T A^T
    assert call[:12] == (
        77,
        core.desc.ptr,
        11,
        A,
        core.a.ptr,
        B,
        core.b.ptr,
        12,
        0x30000,
        core.c.ptr,
        0x40000,
        core.d.ptr,
    )
    assert fake_lt.tags == [1]  # the plan's algorithm
    assert call[13:] == (0, 0, 99)  # no workspace, the stream
    assert core.asked == []


def test_descriptor_pointers_are_set_when_they_change_only(fake_lt):
    core = FakeCore()
    launch = LtLaunch(core, 77, 0, result(), a_first=False)
    bias1, bias2 = ((lt.DESC_BIAS_POINTER, 0x50000),), ((lt.DESC_BIAS_POINTER, 0x60000),)
    for pointers in (bias1, bias1, bias2, bias2, bias1):
        launch(0x10000, 0x20000, 0x30000, 0x30000, 1, 2, 0, pointers)
    assert core.desc.sets == 3
    assert [a[lt.DESC_BIAS_POINTER] for a in fake_lt.attrs] == [0x50000, 0x50000, 0x60000, 0x60000, 0x50000]
    both = ((lt.DESC_BIAS_POINTER, 0x70000), (lt.DESC_EPILOGUE_AUX_POINTER, 0x80000))
    launch(0x10000, 0x20000, 0x30000, 0x30000, 1, 2, 0, both)
    assert fake_lt.attrs[-1] == {lt.DESC_BIAS_POINTER: 0x70000, lt.DESC_EPILOGUE_AUX_POINTER: 0x80000}


def test_pointers_not_256_byte_aligned_run_the_heuristics_answer_for_their_alignment(fake_lt):
    assert [alignment(p) for p in (0, 256, 512, 16, 0x10008, 4, 2)] == [256, 256, 256, 16, 8, 4, 2]
    core = FakeCore()
    launch = LtLaunch(core, 77, 0, result(tag=256), a_first=True)
    launch(0x10000 + 16, 0x20000, 0x30000, 0x30000, 1, 2, 0)
    launch(0x10000, 0x20000, 0x30000 + 8, 0x30000 + 8, 1, 2, 0)
    assert fake_lt.tags == [16, 8] and core.asked == [16, 8]
    assert launch.algo.algo.data[0] == 256  # the plan's own algorithm is kept for aligned calls


def test_no_algorithm_for_an_alignment_is_a_typed_error_and_nothing_launches(fake_lt):
    core = FakeCore({8: []})
    launch = LtLaunch(core, 77, 0, result(), a_first=True)
    with pytest.raises(CublasLtError, match="no cuBLASLt algorithm for 8-byte aligned operands"):
        launch(0x10008, 0x20000, 0x30000, 0x30000, 1, 2, 0)
    fp8 = LtLaunch(FakeCore(), 77, 0, result(), a_first=True, kind="FP8", min_alignment=16)
    with pytest.raises(CublasLtError, match="no FP8 cuBLASLt algorithm for 8-byte aligned operands"):
        fp8(0x10008, 0x20000, 0x30000, 0x30000, 1, 2, 0)
    assert fp8.core.asked == [] and fake_lt.calls == []  # FP8 kernels take no 8-byte alignment: not even asked


def test_a_failed_launch_raises_the_librarys_error_naming_the_call(fake_lt):
    fake_lt.status = 7
    for kind, what in (("", "cublasLtMatmul"), ("FP8", r"cublasLtMatmul \(FP8\)")):
        launch = LtLaunch(FakeCore(), 77, 0, result(), a_first=True, kind=kind)
        with pytest.raises(CublasLtError, match=what):
            launch(0x10000, 0x20000, 0x30000, 0x30000, 1, 2, 0)


def test_a_workspace_per_stream_grown_when_an_algorithm_needs_more_and_released(fake_lt, monkeypatch):
    from nvdispatch._cuda import memory

    made, released = [], []

    class Scratch:
        def __init__(self, nbytes, framework, device_index, stream):
            self.ptr, self.nbytes = next(_ids), nbytes
            made.append((nbytes, framework, stream))

        def release(self):
            released.append(self.nbytes)

    monkeypatch.setattr(memory, "scratch", Scratch)
    core = FakeCore({16: [result(workspace=4096, tag=16)]})
    launch = LtLaunch(core, 77, 0, result(workspace=1024), a_first=True)
    assert launch.workspace_bytes == 1024  # what the algorithm needs, before the first launch allocates it
    launch(0x10000, 0x20000, 0x30000, 0x30000, 1, 2, 5, allocator="torch")
    launch(0x10000, 0x20000, 0x30000, 0x30000, 1, 2, 5, allocator="torch")
    launch(0x10000, 0x20000, 0x30000, 0x30000, 1, 2, 6, allocator="torch")
    launch(0x10010, 0x20000, 0x30000, 0x30000, 1, 2, 5, allocator="torch")  # its algorithm needs 4096
    assert made == [(1024, "", 5), (1024, "", 6), (4096, "", 5)] and released == [1024]  # cudaMallocAsync
    ws_args = [(c[13], c[14]) for c in fake_lt.calls]
    assert ws_args[0][1] == ws_args[1][1] == 1024 and ws_args[0][0] == ws_args[1][0] != ws_args[2][0]
    assert ws_args[3][1] == 4096
    assert launch.workspace_bytes == 1024 + 4096
    launch.release()
    assert sorted(released) == [1024, 1024, 4096] and launch.workspace_bytes == 1024


def test_a_launch_under_stream_capture_takes_a_workspace_of_its_own_from_the_callers_pool(fake_lt, monkeypatch):
    # a graph must never read memory the plan may give back (an evicted plan releases its workspaces while the
    # graph still replays), and a plan must hold nothing from a graph's private pool past the call: under capture
    # the launch takes its workspace from the caller's allocator (the graph's pool) and gives it back at once
    from nvdispatch._cuda import memory

    made, released = [], []

    class Scratch:
        def __init__(self, nbytes, framework, device_index, stream):
            self.ptr, self.nbytes, self.framework = next(_ids), nbytes, framework
            made.append((nbytes, framework, stream))

        def release(self):
            released.append((self.nbytes, self.framework))

    monkeypatch.setattr(memory, "scratch", Scratch)
    launch = LtLaunch(FakeCore(), 77, 0, result(workspace=1024), a_first=True)
    launch(0x10000, 0x20000, 0x30000, 0x30000, 1, 2, 5, allocator="torch")  # warm-up: the plan's own
    fake_lt.capturing.update({5, 7})
    launch(0x10000, 0x20000, 0x30000, 0x30000, 1, 2, 5, allocator="torch")
    launch(0x10000, 0x20000, 0x30000, 0x30000, 1, 2, 7, allocator="torch")
    assert made == [(1024, "", 5), (1024, "torch", 5), (1024, "torch", 7)]
    assert released == [(1024, "torch"), (1024, "torch")] and list(launch.workspaces) == [5]
    ws = [c[13] for c in fake_lt.calls]
    assert ws[0] == launch.workspaces[5].ptr and len(set(ws)) == 3  # the captured launches used their own
    fake_lt.capturing.clear()
    launch(0x10000, 0x20000, 0x30000, 0x30000, 1, 2, 5, allocator="torch")
    assert fake_lt.calls[-1][13] == ws[0] and len(made) == 3


def test_threads_never_launch_with_each_others_pointers(fake_lt):
    core = FakeCore()
    launch = LtLaunch(core, 77, 0, result(), a_first=True)

    def run(i):
        for _ in range(300):
            launch(0x100000 * (i + 1), 0x20000, 0x30000, 0x30000, 1, 2, 0, ((lt.DESC_BIAS_POINTER, 0x1000 * (i + 1)),))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake_lt.calls) == 1200
    for call, attrs in zip(fake_lt.calls, fake_lt.attrs):
        assert attrs[lt.DESC_BIAS_POINTER] == call[3] // 0x100  # each launch with its own bias pointer


# -- the plans on it -------------------------------------------------------------------------------------
def _problem(a, b, epilog=None, inputs=None, options=None):
    from nvdispatch._epilog import spec_of
    from nvdispatch._matmul_problem import as_options, build_problem
    from nvdispatch._route import detect_all, placement

    inputs = inputs or {}
    infos = detect_all({"a": a, "b": b, "c": None, **inputs})
    fw, dev = placement(infos)
    return build_problem(fw, dev, infos, spec_of(epilog), as_options(options), 1, None, tuple(inputs))


@pytest.mark.parametrize("bias_shape,orientation", [((12,), "row"), ((8, 1), "col")])
def test_the_regular_plan_hands_its_operands_in_its_orientations_order(fake_lt, bias_shape, orientation):
    from nvdispatch._cuda.lt_matmul import LtMatmulPlan

    a, b, bias = torch.zeros(8, 4), torch.zeros(4, 12), torch.zeros(bias_shape)
    p = _problem(a, b, "RELU_BIAS", {"bias": bias})
    plan = LtMatmulPlan(p)
    assert plan.setup.orientation == orientation and plan.launch.a_first == (orientation == "col")
    out = plan.execute({"a": a, "b": b, "bias": bias}, stream=0)
    A, B = (a, b) if orientation == "col" else (b, a)
    call = fake_lt.calls[-1]
    assert (call[3], call[5]) == (A.data_ptr(), B.data_ptr())
    assert call[8] == call[10] == out.data_ptr() and out.shape == (8, 12) and out.dtype == torch.float32
    assert fake_lt.attrs[-1][lt.DESC_BIAS_POINTER] == bias.data_ptr()
    assert out.stride() == ((1, 8) if orientation == "col" else (12, 1))  # the col orientation: an F-ordered result
    if orientation == "row":  # the Python direct call: the same launch
        got = plan.python_direct(a, b, bias)
        assert fake_lt.calls[-1][3:6:2] == (b.data_ptr(), a.data_ptr()) and fake_lt.calls[-1][10] == got.data_ptr()


class FakeTensor:
    """What the compiled direct call reads of a Torch tensor (``data_ptr()``, ``new_empty``), 256-byte aligned."""

    def __init__(self, shape=None, dtype=None):
        self.ptr, self.shape, self.dtype = next(_ids) * 0x100, shape, dtype

    def data_ptr(self):
        return self.ptr

    def new_empty(self, shape, *, dtype=None):
        return FakeTensor(shape, dtype)


def test_the_regular_plans_compiled_direct_call_is_handed_its_operand_order(fake_lt):
    from nvdispatch._cuda.lt_matmul import LtMatmulPlan

    hp = hotpath()
    if hp is None:
        pytest.skip("the extension is not built here")
    a, b, bias = torch.zeros(64, 32), torch.zeros(32, 48), torch.zeros(48)
    plan = LtMatmulPlan(_problem(a, b, "RELU_BIAS", {"bias": bias}))
    assert type(plan.direct).__name__ == "builtin_function_or_method"
    fa, fb, fbias = FakeTensor(), FakeTensor(), FakeTensor()
    out = plan.direct(fa, fb, fbias)
    calls, _, attr, _ = hp.probe_record()
    assert (calls[3], calls[5], calls[8], calls[10]) == (fb.ptr, fa.ptr, out.ptr, out.ptr)  # D^T = B^T A^T
    assert attr[1:] == (lt.DESC_BIAS_POINTER, fbias.ptr) and (out.shape, out.dtype) == ((64, 48), torch.float32)
    assert fake_lt.calls == []  # nothing went through the Python launch
    plan.algorithm = result(tag=3)  # autotune's way: the compiled call holds its algorithm, so it is made anew
    plan.direct(fa, fb, fbias)
    assert ctypes.cast(hp.probe_record()[0][12], ctypes.POINTER(lt.Algo)).contents.data[0] == 3


class CpuTorchOps:
    """Torch's device helpers allocating on the CPU (the FP8 plan's buffers, here)."""

    def __new__(cls, name):
        from nvdispatch._adapters.torch import TorchDeviceOps

        class Ops(TorchDeviceOps):
            def _device(self, device_index):
                return "cpu"

            def synchronize(self, device_index=None):
                pass

        return Ops()


@pytest.mark.parametrize("bias_shape,orientation", [((48,), "row"), ((32, 1), "col")])
@pytest.mark.parametrize("b_layout", ["col", "row"])
def test_the_fp8_plan_computes_its_operand_order_once_and_launches_through_the_same_sequence(
    fake_lt, monkeypatch, bias_shape, orientation, b_layout
):
    from nvdispatch._cuda.lt_fp8 import Fp8LtPlan
    from nvdispatch._epilog import spec_of
    from nvdispatch._fp8 import build_fp8_problem
    from nvdispatch._matmul_problem import as_options
    from nvdispatch._route import detect_all, placement

    monkeypatch.setattr(lt_plan_base, "Xp", CpuTorchOps)
    f8 = torch.float8_e4m3fn
    a = torch.zeros(32, 64, dtype=f8)
    b = torch.zeros(48, 64, dtype=f8).t() if b_layout == "col" else torch.zeros(64, 48, dtype=f8)
    bias = torch.zeros(bias_shape, dtype=torch.bfloat16)
    sa = torch.tensor([0.5])
    scales = {"a": sa, "b": 0.25}
    infos = detect_all({"a": a, "b": b, "bias": bias})
    fw, dev = placement(infos)
    opts = as_options({"result_type": "bfloat16", "fast_accumulation": True})
    p = build_fp8_problem(fw, dev, infos, spec_of("RELU_BIAS"), opts, 1, None, ("bias",), scales)
    plan = Fp8LtPlan(p)
    assert plan.setup.orientation == orientation and plan.launch.a_first == (orientation == "col")
    assert plan.core.desc.attrs[lt.DESC_FAST_ACCUM] == 1
    out = plan.execute({"a": a, "b": b, "bias": bias, "quantization_scales": scales}, stream=0)
    call, attrs = fake_lt.calls[-1], fake_lt.attrs[-1]
    at_a, at_b = (3, 5) if orientation == "col" else (5, 3)  # the row orientation: cuBLASLt's A is our b
    assert call[at_a] == a.data_ptr()
    # b is read in place where it is column-major, else transposed into a buffer of the TN layout first
    assert (call[at_b] == b.data_ptr()) == (b_layout == "col")
    assert out.dtype == torch.bfloat16 and out.shape == (32, 48)
    assert call[8] == call[10] == out.data_ptr()
    assert attrs[lt.DESC_BIAS_POINTER] == bias.data_ptr() and attrs[lt.DESC_A_SCALE_POINTER] == sa.data_ptr()
    alpha = np.frombuffer((ctypes.c_float * 2).from_address(call[2]), np.float32)
    assert alpha.tolist() == [0.25, 0.0]  # b's host scale folded into alpha, beta 0


# -- FP8: every pointer 16-byte aligned (cuBLAS 12.9.1+ refuses a misaligned scale: NOT_SUPPORTED) ---------------
def _fp8_plan(a, b, bias=None, scales=None, result_type="bfloat16", epilog=None):
    from nvdispatch._cuda.lt_fp8 import Fp8LtPlan
    from nvdispatch._epilog import spec_of
    from nvdispatch._fp8 import build_fp8_problem
    from nvdispatch._matmul_problem import as_options
    from nvdispatch._route import detect_all, placement

    inputs = {} if bias is None else {"bias": bias}
    infos = detect_all({"a": a, "b": b, **inputs})
    fw, dev = placement(infos)
    opts = as_options({"result_type": result_type})
    epilog = epilog or ("BIAS" if bias is not None else None)
    return Fp8LtPlan(build_fp8_problem(fw, dev, infos, spec_of(epilog), opts, 1, None, tuple(inputs), scales))


def _snapshots(monkeypatch, rec, read):
    """``cublasLtMatmul`` recording ``read(args, attrs)`` at each call (the bytes its pointers hold then)."""
    seen = []

    def call(*args):
        seen.append(read(args, DESCS[args[1]].attrs))
        return rec(*args)

    monkeypatch.setattr(lt, "matmul_call", lambda: call)
    return seen


def test_fp8_scales_and_a_bias_not_16_byte_aligned_are_handed_as_aligned_copies(fake_lt, monkeypatch):
    # a per-sample scale (scales[i], vmapped scales) sits 4 bytes from its neighbour: each call copies it into a
    # fresh buffer; an aligned scale is handed as it is
    monkeypatch.setattr(lt_plan_base, "Xp", CpuTorchOps)
    f8 = torch.float8_e4m3fn
    a, b = torch.zeros(32, 64, dtype=f8), torch.zeros(48, 64, dtype=f8).t()
    scales = torch.tensor([0.5, 2.0, 4.0, 8.0])
    bias = torch.arange(50, dtype=torch.bfloat16)[1:49]  # 2 bytes into its storage
    f32 = lambda ptr: ctypes.c_float.from_address(ptr).value  # noqa: E731

    def read(args, attrs):
        sa, sd, bp = (attrs.get(k) for k in (lt.DESC_A_SCALE_POINTER, lt.DESC_D_SCALE_POINTER, lt.DESC_BIAS_POINTER))
        return sa, sd, bp, f32(sa), sd and f32(sd), bp and ctypes.string_at(bp, 48 * 2)

    seen = _snapshots(monkeypatch, fake_lt, read)
    for i in (1, 2, 3):
        given = {"a": scales[i], "d": scales[4 - i]}
        plan = _fp8_plan(a, b, bias, given, result_type="float8_e4m3fn")
        plan.execute({"a": a, "b": b, "bias": bias, "quantization_scales": given}, stream=0)
        sa, sd, bp, va, vd, bias_bytes = seen[-1]
        assert sa % 16 == 0 and sd % 16 == 0 and bp % 16 == 0
        assert (sa, sd, bp) != (scales[i].data_ptr(), scales[4 - i].data_ptr(), bias.data_ptr())
        assert (va, vd) == (float(scales[i]), float(scales[4 - i]))  # the copies hold the values
        assert bias_bytes == bias.contiguous().view(torch.uint8).numpy().tobytes()
    own = torch.tensor(0.5)  # its own storage: aligned, read in place
    plan = _fp8_plan(a, b, None, {"a": own})
    plan.execute({"a": a, "b": b, "quantization_scales": {"a": own}}, stream=0)
    assert fake_lt.attrs[-1][lt.DESC_A_SCALE_POINTER] == own.data_ptr()


def test_fp8_operands_at_an_odd_offset_run_the_plans_variant_that_copies_them(fake_lt, monkeypatch):
    # a layout cuBLASLt's FP8 kernels take (rows 80 bytes apart) at a pointer they do not (1 byte into its
    # storage): the call runs the plan's variant copying that operand (made once); aligned calls the plan itself
    monkeypatch.setattr(lt_plan_base, "Xp", CpuTorchOps)
    f8 = torch.float8_e4m3fn
    g = torch.Generator().manual_seed(3)
    big_a, big_b = torch.randn(32, 80, generator=g).to(f8), torch.randn(48, 80, generator=g).to(f8)
    layouts = {}

    def read(args, attrs):  # the row orientation: cuBLASLt's A is our b (args[3]), its B our a (args[5])
        b_ptr, a_ptr = args[3], args[5]
        layouts["a"], layouts["b"] = FAKE_LAYOUTS[args[6]], FAKE_LAYOUTS[args[4]]
        lda, ldb = layouts["a"][3], layouts["b"][3]
        return a_ptr, b_ptr, ctypes.string_at(a_ptr, 32 * lda), ctypes.string_at(b_ptr, 48 * ldb), lda, ldb

    seen = _snapshots(monkeypatch, fake_lt, read)
    a, b = big_a[:, 1:65], big_b[:, 1:65].t()  # (32, 64) row-major and (64, 48) column-major, lead 80
    plan = _fp8_plan(a, b)
    assert not plan.setup.a_copy and not plan.setup.b_copy and plan.setup.lda == 80
    for ops in ({"a": a, "b": b}, {"a": a, "b": big_b[:, :64].t()}, {"a": big_a[:, 16:80], "b": b}):
        plan.execute(ops, stream=0)
        a_ptr, b_ptr, a_bytes, b_bytes, lda, ldb = seen[-1]
        assert a_ptr % 16 == 0 and b_ptr % 16 == 0
        want_a = ops["a"].contiguous().view(torch.uint8).numpy()
        want_b = ops["b"].t().contiguous().view(torch.uint8).numpy()  # b's columns, K contiguous
        got_a = np.frombuffer(a_bytes, np.uint8).reshape(32, lda)[:, :64]
        got_b = np.frombuffer(b_bytes, np.uint8).reshape(48, ldb)[:, :64]
        np.testing.assert_array_equal(got_a, want_a)
        np.testing.assert_array_equal(got_b, want_b)
        misaligned = {n for n in "ab" if ops[n].data_ptr() % 16}
        assert (a_ptr == ops["a"].data_ptr()) == ("a" not in misaligned)
        assert (b_ptr == ops["b"].data_ptr()) == ("b" not in misaligned)
        assert (lda == 80) == ("a" not in misaligned) and (ldb == 80) == ("b" not in misaligned)
    assert sorted(plan._variants) == [("a",), ("a", "b"), ("b",)]
    plan.execute({"a": big_a[:, 16:80], "b": big_b[:, 16:80].t()}, stream=0)  # both aligned: the plan itself
    assert seen[-1][:2] == (big_a[:, 16:80].data_ptr(), big_b[:, 16:80].data_ptr())
    plan.release()
    assert plan._variants == {}


def test_a_launch_cublaslt_refuses_says_the_fp8_problem_and_each_pointers_alignment(fake_lt, monkeypatch):
    monkeypatch.setattr(lt_plan_base, "Xp", CpuTorchOps)
    f8 = torch.float8_e4m3fn
    a, b = torch.zeros(32, 64, dtype=f8), torch.zeros(48, 64, dtype=f8).t()
    sa = torch.tensor(0.5)
    plan = _fp8_plan(a, b, None, {"a": sa})
    fake_lt.status = 15
    with pytest.raises(CublasLtError, match="CUBLAS_STATUS_NOT_SUPPORTED") as err:
        plan.execute({"a": a, "b": b, "quantization_scales": {"a": sa}}, stream=0)
    message = str(err.value)
    assert "FP8 float8_e4m3fn x float8_e4m3fn -> bfloat16" in message and "lda 64, ldb 64" in message
    assert f"scale_a {alignment(sa.data_ptr())}" in message and "16-byte aligned" in message


# -- FP8: the related form autotune times too -------------------------------------------------------------
def _fp8_problem(epilog, bias_shape=None, scales=None, fast=False):
    from nvdispatch._epilog import spec_of
    from nvdispatch._fp8 import build_fp8_problem
    from nvdispatch._matmul_problem import as_options
    from nvdispatch._route import detect_all, placement

    f8 = torch.float8_e4m3fn
    a, b = torch.zeros(32, 64, dtype=f8), torch.zeros(48, 64, dtype=f8).t()
    inputs = {} if bias_shape is None else {"bias": torch.zeros(bias_shape, dtype=torch.bfloat16)}
    infos = detect_all({"a": a, "b": b, **inputs})
    fw, dev = placement(infos)
    opts = as_options({"result_type": "bfloat16", "fast_accumulation": fast})
    return build_fp8_problem(fw, dev, infos, spec_of(epilog), opts, 1, None, tuple(inputs), scales)


def test_fp8_descriptors_relate_the_bias_only_form_with_device_scales(fake_lt):
    from nvdispatch._cuda.lt_fp8 import Fp8Descriptors
    from nvdispatch._cuda.lt_fp8_layout import fp8_layout

    p = _fp8_problem("RELU_BIAS", (48,), {"a": 0.5, "b": 2.0}, fast=True)
    own = Fp8Descriptors(p, fp8_layout(p), 1 << 20)
    assert own.desc.attrs[lt.DESC_EPILOGUE] == 6 and lt.DESC_A_SCALE_POINTER not in own.desc.attrs
    ((label, form),) = own.related()
    assert label == "bias form with device scales"
    attrs = form.desc.attrs  # torch._scaled_mm(bias=)'s form: the bias epilogue, scales by pointer
    assert attrs[lt.DESC_EPILOGUE] == 4 and attrs[lt.DESC_FAST_ACCUM] == 1
    assert attrs[lt.DESC_A_SCALE_POINTER] and attrs[lt.DESC_B_SCALE_POINTER] and lt.DESC_BIAS_DATA_TYPE in attrs
    assert form.a.args == own.a.args and form.b.args == own.b.args and form.d.args == own.d.args
    p = _fp8_problem("RELU", None, {"a": torch.tensor(0.5), "b": torch.tensor(2.0)})
    ((label, form),) = Fp8Descriptors(p, fp8_layout(p), 1 << 20).related()
    assert label == "plain form with device scales" and lt.DESC_EPILOGUE not in form.desc.attrs
    p = _fp8_problem("BIAS", (48,), {"a": torch.tensor(0.5), "b": torch.tensor(2.0)})
    assert Fp8Descriptors(p, fp8_layout(p), 1 << 20).related() == []  # that form is its own


def test_autotune_candidates_take_the_related_forms_answers_its_descriptor_accepts(fake_lt, monkeypatch):
    import types

    from nvdispatch._cuda.lt_fp8 import Fp8Descriptors
    from nvdispatch._cuda.lt_fp8_layout import fp8_layout

    def heuristic(h, desc, a, b, c, d, pref, count):  # two answers per epilogue, tagged epilogue * 10 + rank
        return [result(tag=desc.attrs.get(lt.DESC_EPILOGUE, 1) * 10 + i) for i in range(2)]

    def check(handle, desc, a, b, c, d, algo_ref, result_ref):  # this descriptor rejects the answer tagged 41
        result_ref._obj.state = 1 if algo_ref._obj.data[0] == 41 else 0
        return 0

    refuse = lambda *args: 1  # noqa: E731 - no configuration knobs: no split-K variants, no neighbourhood
    fns = types.SimpleNamespace(check=check, config_set=refuse, config_get=refuse, capability=refuse)
    monkeypatch.setattr(lt, "heuristic", heuristic)
    monkeypatch.setattr(lt_autotune, "_fns", lambda: fns)
    p = _fp8_problem("RELU_BIAS", (48,), {"a": 0.5, "b": 2.0})
    core = Fp8Descriptors(p, fp8_layout(p), 1 << 20)
    labels = {label: int(r.algo.data[0]) for label, r in lt_autotune.candidates(core, 77, limit=2)}
    assert labels == {"heuristic #0": 60, "heuristic #1": 61, "heuristic #0 of the bias form with device scales": 40}


def test_a_workspace_that_grows_is_counted_by_the_plan_cache_at_once(fake_lt, monkeypatch):
    import weakref

    from nvdispatch._cuda import memory
    from nvdispatch._plan_cache import PlanCache

    class Scratch:
        def __init__(self, nbytes, framework, device_index, stream):
            self.ptr, self.nbytes = next(_ids), nbytes

        def release(self):
            pass

    class Plan:  # a cuBLASLt plan as the cache sees it: its launch's workspace bytes
        def __init__(self):
            self.launch = LtLaunch(FakeCore(), 77, 0, result(workspace=1024), a_first=True)
            self.launch.owner = weakref.ref(self)

        @property
        def workspace_bytes(self):
            return self.launch.workspace_bytes

        def release(self):
            self.launch.release()

    from nvdispatch._cuda import lt_launch

    cache = PlanCache(maxsize=8, max_bytes=2500)
    monkeypatch.setattr(lt_launch, "plan_cache", cache)  # the shared cache, as the launch module holds it
    monkeypatch.setattr(memory, "scratch", Scratch)
    first, second = Plan(), Plan()
    cache.put("first", first)
    cache.put("second", second)
    assert cache.nbytes == 2048  # what each algorithm needs, counted when cached
    second.launch(0x10000, 0x20000, 0x30000, 0x30000, 1, 2, 5, allocator="torch")
    assert cache.nbytes == 2048  # the first stream's workspace is what was counted
    second.launch(0x10000, 0x20000, 0x30000, 0x30000, 1, 2, 6, allocator="torch")  # a second stream: 1024 more
    assert not cache.contains("first") and cache.nbytes == 2048  # over the bound: the least recent plan went


# -- the compiled direct call of epilogues with an aux input or an extra output ------------------------------
class StridedFake(FakeTensor):
    """A :class:`FakeTensor` that makes views (``as_strided``), as the aux outputs' layouts need."""

    def __init__(self, shape=None, dtype=None, strides=None, base=None):
        super().__init__(shape, dtype)
        self.strides, self.base = strides, base

    def new_empty(self, shape, *, dtype=None):
        return StridedFake(tuple(shape), dtype)

    def storage_offset(self):
        return 0

    def as_strided(self, shape, strides, offset=0):
        assert offset == 0
        return StridedFake(tuple(shape), self.dtype, tuple(strides), self)

    def stride(self):
        return self.strides if self.strides is not None else _c_strides(self.shape)


def _c_strides(shape):
    from nvdispatch._strides import c_strides

    return tuple(c_strides(tuple(shape)))


def _cpu_empty(kind, shape, dtype, device_index, stream, order="C"):
    t = torch.empty(tuple(shape), dtype=getattr(torch, dtype))
    return t, t.data_ptr()


def _aux_case(epilog, bias_shape=(48,)):
    """``(problem operands, plan inputs)`` of a 64x32 @ 32x48 float32 product with ``epilog``'s input."""
    from nvdispatch._epilog import spec_of

    a, b = torch.zeros(64, 32), torch.zeros(32, 48)
    names = spec_of(epilog).inputs
    inputs = {}
    if names == ("bias",):
        inputs["bias"] = torch.zeros(bias_shape)
    elif names == ("relu_aux",):  # cuBLASLt's bit mask of the row orientation: read in place
        inputs["relu_aux"] = torch.zeros(64, 128 // 8, dtype=torch.uint8)
    elif names == ("gelu_aux",):
        inputs["gelu_aux"] = torch.zeros(64, 48)
    return a, b, inputs


SERVED = [
    "RELU_AUX",
    "RELU_AUX_BIAS",
    "GELU_AUX",
    "GELU_AUX_BIAS",
    "BGRADA",
    "BGRADB",
    "DRELU",
    "DRELU_BGRAD",
    "DGELU",
    "DGELU_BGRAD",
]


@pytest.mark.parametrize("epilog", SERVED)
def test_the_compiled_direct_call_of_aux_and_bias_gradient_epilogues_gives_the_python_paths_layout(
    fake_lt, monkeypatch, epilog
):
    from nvdispatch._cuda import lt_aux, lt_direct
    from nvdispatch._cuda.lt_matmul import LtMatmulPlan

    hp = hotpath()
    if hp is None:
        pytest.skip("the extension is not built here")
    monkeypatch.setattr(lt_aux, "empty", _cpu_empty)
    a, b, inputs = _aux_case(epilog)
    plan = LtMatmulPlan(_problem(a, b, epilog, inputs))
    assert lt_direct.serves(plan.problem, plan.setup, plan.strategy, plan._needs_xp)
    assert type(plan.direct).__name__ == "builtin_function_or_method"  # the compiled form
    want = plan.python_direct(a, b, *inputs.values())  # the Python path (through the recorder)
    py_call, py_attrs = fake_lt.calls[-1], fake_lt.attrs[-1]
    fa, fb = StridedFake(), StridedFake()
    fx = [StridedFake() for _ in inputs]
    got = plan.direct(fa, fb, *fx)
    calls, _, _, _ = hp.probe_record()
    values = hp.probe_values()
    assert len(fake_lt.calls) == 1  # the compiled call launched through the probe, not the Python launch
    w_out, w_aux = want if isinstance(want, tuple) else (want, None)
    g_out, g_aux = got if isinstance(got, tuple) else (got, None)
    assert (tuple(g_out.shape), g_out.dtype) == (tuple(w_out.shape), w_out.dtype)
    assert (calls[3], calls[5], calls[8], calls[10]) == (fb.ptr, fa.ptr, g_out.ptr, g_out.ptr)
    assert (py_call[3], py_call[5]) == (b.data_ptr(), a.data_ptr())  # the same orientation
    if w_aux is None:
        assert g_aux is None
    else:
        assert list(g_aux) == list(w_aux)
        w, g = next(iter(w_aux.values())), next(iter(g_aux.values()))
        assert tuple(g.shape) == tuple(w.shape) and g.dtype == w.dtype and tuple(g.stride()) == tuple(w.stride())
        buffer = g.base if g.base is not None else g
        attr = lt.DESC_BIAS_POINTER if plan.setup.bgrad else lt.DESC_EPILOGUE_AUX_POINTER
        assert values[attr] == buffer.ptr and attr in py_attrs
    if inputs:
        attr = lt.DESC_BIAS_POINTER if "bias" in inputs else lt.DESC_EPILOGUE_AUX_POINTER
        assert values[attr] == fx[0].ptr and py_attrs[attr] == next(iter(inputs.values())).data_ptr()


def test_an_epilogue_output_in_the_col_orientation_is_the_transposed_view_python_gives(fake_lt, monkeypatch):
    from nvdispatch._cuda import lt_aux
    from nvdispatch._cuda.lt_matmul import LtMatmulPlan

    monkeypatch.setattr(lt_aux, "empty", _cpu_empty)
    a, b, bias = torch.zeros(64, 32), torch.zeros(32, 48), torch.zeros(64, 1)  # bias along M: the col orientation
    plan = LtMatmulPlan(_problem(a, b, "RELU_AUX_BIAS", {"bias": bias}))
    assert plan.setup.orientation == "col"
    assert plan.direct is None  # an F-ordered result: the compiled form does not make it, execute runs it
    out, aux = plan.execute({"a": a, "b": b, "bias": bias}, stream=0)
    assert out.stride() == (1, 64) and tuple(aux["relu_aux"].shape) == (128 // 8, 48)


def test_a_workspace_algorithm_runs_compiled_on_the_plans_workspace_and_in_python_under_capture(fake_lt, monkeypatch):
    from nvdispatch._cuda import lt_direct, memory
    from nvdispatch._cuda.lt_matmul import LtMatmulPlan

    hp = hotpath()
    if hp is None:
        pytest.skip("the extension is not built here")

    class Scratch:
        def __init__(self, nbytes, framework, device_index, stream):
            self.nbytes, self.ptr = nbytes, 0x7000000 + stream * 0x100000

        def release(self):
            pass

    monkeypatch.setattr(memory, "scratch", Scratch)
    monkeypatch.setattr(lt, "heuristic", lambda h, desc, a, b, c, d, pref, count: [result(4096, pref.alignment)])
    monkeypatch.setattr(lt_direct, "capturing", lambda stream: stream in fake_lt.capturing)
    monkeypatch.setattr(lt_direct, "capture_query_address", lambda: None)  # the Python side asks (the stand-in)
    a, b, bias = torch.zeros(64, 32), torch.zeros(32, 48), torch.zeros(48)
    plan = LtMatmulPlan(_problem(a, b, "RELU_BIAS", {"bias": bias}))
    assert type(plan.direct).__name__ == "builtin_function_or_method"
    fa, fb, fbias = FakeTensor(), FakeTensor(), FakeTensor()
    plan.direct(fa, fb, fbias)
    calls = hp.probe_record()[0]
    assert (calls[13], calls[14], calls[15]) == (0x7000000, 4096, 0) and plan.launch.workspaces[0].ptr == 0x7000000
    fake_lt.capturing.add(0)
    monkeypatch.setattr(memory, "scratch", lambda nbytes, fw, idx, stream: Scratch(nbytes, fw, idx, 5))
    out = plan.direct(a, b, bias)  # under capture: the Python call, a workspace of its own
    assert fake_lt.calls[-1][13] == 0x7000000 + 5 * 0x100000 and fake_lt.calls[-1][10] == out.data_ptr()


def test_what_the_direct_call_serves():
    from nvdispatch._cuda.lt_direct import serves
    from nvdispatch._cuda.lt_setup import setup

    def served(a, b, epilog=None, inputs=None, strategy="native", orientation="row"):
        p = _problem(a, b, epilog, inputs)
        return serves(p, setup(p, orientation), strategy, False)

    a, b = torch.zeros(64, 32), torch.zeros(32, 48)
    mask = torch.zeros(64, 16, dtype=torch.uint8)
    assert (
        served(a, b)
        and served(a, b, "RELU_AUX")
        and served(a, b, "BGRADB")
        and served(a, b, "DRELU", {"relu_aux": mask})
    )
    assert served(a, b, "DGELU_BGRAD", {"gelu_aux": torch.zeros(64, 48)})
    assert not served(a, b, "RELU_AUX", strategy="inplace")  # the output comes from the unfused path
    assert not served(a, b, "DRELU", {"relu_aux": mask}, strategy="inplace")
    assert not served(a, b, "DRELU", {"relu_aux": torch.zeros(64, 48, dtype=torch.bool)})  # packed first
    assert not served(torch.zeros(32), b, "RELU_AUX")  # a 1-D operand: its axis dropped from the outputs
    assert served(torch.zeros(32), b, "RELU_BIAS", {"bias": torch.zeros(48)})
