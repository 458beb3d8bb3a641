"""The result check of a cuBLASLt autotune of a JAX plan (``_cuda/lt_autotune.py``'s ``_agreeing_best``) reads
and compares its samples for half-precision problems, without a GPU: device memory, cudart and cuBLASLt are
stand-ins (``tests/gpu_matmul``'s; the stand-in ``cublasLtMatmul`` writes the result each candidate is made to
give), the plan a real ``LtMatmulPlan`` of a problem built as the JAX route builds it (``_device_problem``:
framework ``"dlpack"``), with JAX and ml_dtypes imported as in a JAX process.

Two ways tune such a plan: on scratch buffers when the program is traced (``autotune_on_scratch``), and
``plan.autotune(operands)`` on device arrays known by ``__cuda_array_interface__`` (what
``benchmarks/jax_mlp_bench.py`` hands it: Torch tensors; the plan's own results are ``CudaArray``). A bfloat16
array's interface says ``"<V2"`` (Torch's and ml_dtypes' typestr for it: NumPy has no bfloat16 of its own),
which NumPy reads as a 2-byte void, ``void16``: no sample could be read, a WARNING said the results could not be
checked and the plan kept its algorithm (seen on the H100 for every bfloat16 product of the MLP benchmark)."""

from __future__ import annotations

import ctypes
import logging
import math
import re
from types import SimpleNamespace

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from nvdispatch import plan_cache
from nvdispatch._agreement import sample_host
from nvdispatch._cuda import arrays, lt_autotune, runtime
from nvdispatch._cuda import cublaslt as lt
from nvdispatch._cuda.lt_matmul import LtMatmulPlan
from nvdispatch._cuda.lt_scratch_autotune import autotune_on_scratch
from nvdispatch._detect import Device
from nvdispatch.integrations.jax_matmul_kernel import MatmulCall, _device_problem
from nvdispatch.integrations.jax_precision import with_convention
from tests.gpu_matmul.test_launch_cpu import fake_lt, result  # noqa: F401 - the cuBLASLt stand-ins' fixture
from tests.gpu_matmul.test_scratch_autotune_cpu import FakeDevice

#: the interface's typestr of a bfloat16 array (Torch's ``_dtype_to_typestr(torch.bfloat16)`` is the same)
BF16_TYPESTR = np.dtype(ml_dtypes.bfloat16).str
ENV = {"gpu": "NVIDIA Fake GPU", "cc": "9.0", "driver": 13000, "cublaslt": 130100}
M, N, K = 48, 40, 24


class Memory(FakeDevice):
    """The stand-in's device memory, read back by the checks' device-to-host copies (plain and strided)."""

    cudaMemcpyKind = SimpleNamespace(
        cudaMemcpyHostToDevice="H2D", cudaMemcpyDeviceToDevice="D2D", cudaMemcpyDeviceToHost="D2H"
    )

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):
        if kind != "D2H":
            return super().cudaMemcpyAsync(dst, src, nbytes, kind, stream)
        return self.cudaMemcpy2DAsync(dst, nbytes, src, nbytes, nbytes, 1, kind, stream)

    def cudaMemcpy2DAsync(self, dst, dpitch, src, spitch, width, height, kind, stream):
        assert kind == "D2H"
        base, mem = self.allocation(src)
        for row in range(height):
            at = src - base + row * spitch
            assert at + width <= len(mem)
            ctypes.memmove(dst + row * dpitch, bytes(mem[at : at + width]), width)
        return (0,)

    def write(self, ptr: int, values: np.ndarray, dtype: str) -> None:
        raw = _device_bytes(values, dtype)
        base, mem = self.allocation(ptr)
        mem[ptr - base : ptr - base + len(raw)] = raw


def _device_bytes(values, dtype: str) -> bytes:
    host = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    return np.ascontiguousarray(np.asarray(values, np.float32).astype(host)).tobytes()


@pytest.fixture
def device(monkeypatch, fake_lt):  # noqa: F811 - the fixture imported above
    """Stand-in device memory and cudart; two candidates, the second (tag 2) the faster; ``results[tag]`` is
    the (M, N) result the stand-in ``cublasLtMatmul`` writes for the candidate tagged ``tag``."""
    fake = Memory()
    fake.streams.append(0)  # the legacy default stream
    fake.results, fake.dtype = {}, None
    for name, value in (
        ("cudart", lambda: fake),
        ("current_device", lambda: fake.device),
        ("malloc_async", fake.malloc_async),
        ("free_async", fake.free_async),
        ("check", lambda got, what: got[1] if len(got) > 1 else None),
    ):
        monkeypatch.setattr(runtime, name, value)

    def matmul(*args):
        status = fake_lt(*args)
        fake.write(args[10], fake.results[fake_lt.tags[-1]], fake.dtype)  # D, in the row orientation's C order
        return status

    monkeypatch.setattr(lt, "matmul_call", lambda: matmul)
    monkeypatch.setattr(
        lt_autotune,
        "candidates",
        lambda core, handle, limit=0: [("heuristic #0", result(tag=1)), ("heuristic #1", result(tag=2))],
    )
    monkeypatch.setattr(lt_autotune, "gpu_seconds", lambda launch, *args, **kwargs: _timed(launch, fake_lt))
    monkeypatch.setattr(lt_autotune, "environment", lambda device_index: ENV)
    plan_cache.clear_tunings()
    yield fake
    plan_cache.clear_tunings()


def _timed(launch, rec) -> float:
    launch()
    return 1e-3 if rec.tags[-1] == 1 else 5e-4


@pytest.fixture
def checked(monkeypatch):
    """What the checks did: ``(reference sample, tolerance)`` of each, in order."""
    seen = []
    real = lt_autotune._agreeing_best

    def spy(cands, finalists, seconds, launch, check):
        def tolerance(expected):
            seen.append((np.asarray(expected), check.tolerance(expected)))
            return seen[-1][1]

        wrapped = lt_autotune.ResultSample(check.read, tolerance, check.shape, check.problem)
        return real(cands, finalists, seconds, launch, wrapped)

    monkeypatch.setattr(lt_autotune, "_agreeing_best", spy)
    return seen


def _plan(dtype):
    call = MatmulCall(epilog="BIAS")
    ops = {"a": jnp.ones((M, K), dtype), "b": jnp.ones((K, N), dtype), "bias": jnp.ones((1, N), dtype)}
    problem = _device_problem(
        call, with_convention(call.options, dtype), ops, {name: () for name in ops}, Device("cuda", 0)
    )
    assert problem.framework == "dlpack" and problem.result_dtype == dtype
    plan = LtMatmulPlan(problem)
    assert plan.setup.orientation == "row"  # the result C-ordered, as the stand-in writes it
    return plan


class CaiArray:
    """A device array known by ``__cuda_array_interface__`` alone, as a Torch tensor offers it."""

    def __init__(self, fake, values: np.ndarray, dtype: str):
        raw = _device_bytes(values, dtype)
        self.ptr = fake.malloc_async(len(raw), 0)
        fake.memory[self.ptr][:] = raw
        self.shape, self.ndim = values.shape, values.ndim
        typestr = BF16_TYPESTR if dtype == "bfloat16" else np.dtype(dtype).str
        self.__cuda_array_interface__ = {
            "shape": values.shape,
            "typestr": typestr,
            "data": (self.ptr, False),
            "strides": None,
            "version": 2,
        }


def _rounded(values, dtype: str) -> np.ndarray:
    return np.frombuffer(_device_bytes(values, dtype), ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


@pytest.mark.parametrize("wrong", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_autotune_on_device_arrays_checks_a_half_precision_jax_plan(device, checked, caplog, dtype, wrong):
    rng = np.random.default_rng(0)
    host = {name: rng.uniform(-1, 1, shape) for name, shape in (("a", (M, K)), ("b", (K, N)), ("bias", (1, N)))}
    rounded = {name: _rounded(x, dtype).astype(np.float64).reshape(x.shape) for name, x in host.items()}
    oracle = rounded["a"] @ rounded["b"] + rounded["bias"]  # float64, from the operands as the device holds them
    device.dtype = dtype
    device.results = {1: oracle, 2: oracle + (np.eye(M, N) * 4 if wrong else 0)}  # tag 2 wrong on the diagonal
    plan = _plan(dtype)
    with caplog.at_level(logging.WARNING, logger="nvdispatch"):
        timed = plan.autotune({name: CaiArray(device, x, dtype) for name, x in host.items()}, iterations=1, stream=0)
    assert [label for label, _ in timed] == ["heuristic #0", "heuristic #1"]
    ((expected, tolerance),) = checked  # the heuristic's first answer's result, read back
    want = _rounded(oracle, dtype).astype(np.float64).reshape(M, N)
    np.testing.assert_array_equal(expected.astype(np.float64), sample_host(want))
    assert math.isfinite(tolerance) and 0 < tolerance < 1  # its operands' magnitudes read too
    messages = [r.getMessage() for r in caplog.records]
    if wrong:  # compared: the faster candidate is left out, the plan keeps the heuristic's first answer
        (message,) = messages
        assert "candidate heuristic #1 left out" in message and f"{dtype}[{M}, {K}]" in message
        assert re.search(r"by 4(\.\d+)? at \[(\d+), \2\]", message) and plan.tuned["label"] == "heuristic #0"
    else:
        assert messages == [] and plan.tuned["label"] == "heuristic #1"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_autotune_on_scratch_checks_a_half_precision_jax_plan(device, checked, caplog, dtype):
    device.dtype = dtype
    values = np.linspace(-1, 1, M * N).reshape(M, N)
    device.results = {1: values, 2: values}
    plan = _plan(dtype)
    with caplog.at_level(logging.WARNING, logger="nvdispatch"):
        autotune_on_scratch(plan, iterations=1)
    assert [r.getMessage() for r in caplog.records] == []
    ((expected, tolerance),) = checked
    want = _rounded(values, dtype).astype(np.float64).reshape(M, N)
    np.testing.assert_array_equal(expected.astype(np.float64), sample_host(want))
    assert math.isfinite(tolerance) and tolerance > 0 and plan.tuned["label"] == "heuristic #1"


def test_a_bfloat16_interface_array_is_viewed_as_bfloat16(device):
    x = CaiArray(device, np.array([[1.0, -2.0, 0.5]]), "bfloat16")
    got = arrays.view(x, "dlpack")
    assert (got.ptr, got.dtype, got.shape, got.strides) == (x.ptr, "bfloat16", (1, 3), (3, 1))


def test_torch_and_cupy_plans_view_their_bfloat16_arrays_by_their_own_dtype_not_the_interface():
    """A Torch (CuPy) plan's check views its operands and results through the framework's adapter, which names
    the dtype itself (``str(tensor.dtype)``, ``array.dtype.name``), never from the interface's ``"<V2"``."""
    from nvdispatch._adapters.cupy import CupyAdapter

    torch = pytest.importorskip("torch")
    x = torch.zeros(2, 3, dtype=torch.bfloat16)  # the adapter reads pointer, dtype, shape, strides: no GPU needed
    got = arrays.view(x, "torch")
    assert (got.ptr, got.dtype, got.shape, got.strides) == (x.data_ptr(), "bfloat16", (2, 3), (3, 1))
    dt = np.dtype(ml_dtypes.bfloat16)  # a CuPy bfloat16 array's dtype
    cupy_like = SimpleNamespace(data=SimpleNamespace(ptr=4096), dtype=dt, itemsize=2, shape=(2, 3), strides=(6, 2))
    got = CupyAdapter().device_view(cupy_like)
    assert (got.ptr, got.dtype, got.shape, got.strides) == (4096, "bfloat16", (2, 3), (3, 1))
