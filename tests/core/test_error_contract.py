"""One error contract on every executor: out of memory is ``errors.OutOfMemoryError`` (a ``MemoryError``),
zero-size inputs give empty results, read-only/broadcast in-place FFT targets are refused at plan time."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors, plan_cache
from nvdispatch._execute import out_of_memory
from nvdispatch.executors import builtin
from nvdispatch.executors.base import Executor

torch = pytest.importorskip("torch")

NUMPY = (lambda x: x, "numpy")
TORCH = (torch.from_numpy, "torch")


@pytest.fixture(autouse=True)
def _fresh():
    plan_cache.clear()
    yield
    plan_cache.clear()


# -- out of memory ------------------------------------------------------------------------------------------
def _huge_pair(conv):
    """Broadcast operands (no memory) whose matmul result needs ~2 PiB: every allocator refuses it."""
    a = np.broadcast_to(np.ones((1, 1, 64, 64)), (2**18, 1, 64, 64))
    b = np.broadcast_to(np.ones((1, 1, 64, 64)), (1, 2**18, 64, 64))
    if conv is torch.from_numpy:
        return torch.ones(1, 1, 64, 64, dtype=torch.float64).expand(2**18, 1, 64, 64), torch.ones(
            1, 1, 64, 64, dtype=torch.float64
        ).expand(1, 2**18, 64, 64)
    return a, b


@pytest.mark.parametrize("framework", [NUMPY, TORCH], ids=lambda f: f[1])
def test_real_host_out_of_memory_is_typed(framework):
    conv, _ = framework
    a, b = _huge_pair(conv)
    with pytest.raises(errors.OutOfMemoryError) as info:
        nvdispatch.matmul(a, b)
    assert isinstance(info.value, MemoryError) and isinstance(info.value, errors.NvdispatchError)
    assert info.value.__cause__ is not None and info.value.argument == "memory"
    x = np.broadcast_to(np.ones(1, np.complex128), (2**48,))
    x = torch.ones(1, dtype=torch.complex128).expand(2**48) if conv is torch.from_numpy else x
    with pytest.raises(errors.OutOfMemoryError):
        nvdispatch.fft.fft(x)


@pytest.mark.parametrize("framework", [NUMPY, TORCH], ids=lambda f: f[1])
def test_operands_and_results_beyond_the_address_space_are_typed_before_anything_runs(framework):
    """Views claiming more bytes than any address space (broadcast / expanded rows): the result is an
    OutOfMemoryError (a MemoryError) naming the operands, an operand a ShapeMismatchError naming it; not
    NumPy's "array is too big" nor Torch's "Storage size calculation overflowed" (#27.7)."""
    conv, name = framework
    rows = np.broadcast_to(np.int8(1), (2**62, 1))
    if name == "torch":
        rows = torch.ones(1, 1, dtype=torch.int8).expand(2**62, 1)
    b = conv(np.ones((1, 4), np.int8))
    for call in (
        lambda: nvdispatch.matmul(rows, b),
        lambda: nvdispatch.explain(rows, b),
        lambda: nvdispatch.Matmul(rows, b),
        lambda: nvdispatch.matmul(rows, b, epilog="RELU"),
    ):
        with pytest.raises(errors.OutOfMemoryError, match=r"a of shape \(4611686018427387904, 1\) and b") as info:
            call()
        assert isinstance(info.value, MemoryError) and info.value.argument == "memory"
    if name == "torch":
        wide = torch.ones(1, 1).expand(2**62, 1)  # 2**64 bytes of float32: no Torch storage can describe it
        with pytest.raises(errors.ShapeMismatchError, match="a: expected an array of at most") as info:
            nvdispatch.matmul(wide, torch.ones(1, 1))
        assert info.value.argument == "a"


class _FakeCupyOOM(MemoryError):
    pass


_FakeCupyOOM.__name__ = _FakeCupyOOM.__qualname__ = "OutOfMemoryError"
_FakeCupyOOM.__module__ = "cupy.cuda.memory"


def _framework_ooms():
    from nvdispatch._cuda.cublaslt import CublasLtError

    return {
        "numpy": MemoryError("Unable to allocate 8.00 GiB for an array"),
        "torch-cuda": torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
        "torch-cpu": RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"),
        "cupy": _FakeCupyOOM("Out of memory allocating 8,589,934,592 bytes"),
        "cuda-runtime": RuntimeError("cudaMallocAsync failed: cudaErrorMemoryAllocation"),
        "cufft": RuntimeError("cufftMakePlanMany64 failed: CUFFT_ALLOC_FAILED"),
        "cublaslt": CublasLtError("cublasLtMatmul", 3),
    }


class _OOMExecutor(Executor):
    """The NumPy executor, but its allocator 'runs out' (at plan or at execute time) with ``exc``."""

    name = "oom"

    def __init__(self, exc, when):
        self.inner, self.exc, self.when = builtin("numpy"), exc, when

    def decline(self, op, problem, *, coerce=False):
        return self.inner.decline(op, problem, coerce=coerce)

    def strategies(self, op, problem):
        return self.inner.strategies(op, problem)

    def plan(self, op, problem, strategy, tuning=None):
        if self.when == "plan":
            raise self.exc
        plan = self.inner.plan(op, problem, strategy, tuning)
        exc = self.exc

        class Plan:
            steps, strategy = plan.steps, plan.strategy

            def execute(self, operands, stream=None):
                raise exc

            def release(self):
                pass

        return Plan()


@pytest.mark.parametrize("when", ["plan", "execute"])
@pytest.mark.parametrize("kind", sorted(_framework_ooms()))
def test_every_frameworks_out_of_memory_becomes_one_type(kind, when):
    exc = _framework_ooms()[kind]
    with nvdispatch.set_backend(_OOMExecutor(exc, when), only=True):
        with pytest.raises(errors.OutOfMemoryError) as info:
            nvdispatch.matmul(np.ones((2, 2)), np.ones((2, 2)))
        assert info.value.__cause__ is exc
        with pytest.raises(MemoryError):
            nvdispatch.fft.fft(np.ones(4, np.complex64))
        mm = nvdispatch.Matmul(np.ones((2, 2)), np.ones((2, 2)))
        with pytest.raises(errors.OutOfMemoryError):
            mm.plan().execute()


def test_other_errors_are_left_alone():
    assert out_of_memory(RuntimeError("cublasLtMatmul failed: CUBLAS_STATUS_INVALID_VALUE")) is None
    assert out_of_memory(ValueError("out of memory")) is None  # only RuntimeErrors are read
    assert out_of_memory(KeyboardInterrupt()) is None


def test_out_of_memory_error_pickles():
    import pickle

    err = out_of_memory(MemoryError("x"))
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is errors.OutOfMemoryError and back.argument == "memory" and back.got == err.got


# -- zero-size inputs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("framework", [NUMPY, TORCH], ids=lambda f: f[1])
@pytest.mark.parametrize(
    "func, dtype, shape, kw, out_shape",
    [
        ("fft", np.complex64, (0, 4), {}, (0, 4)),
        ("ifft", np.complex128, (0, 5), {"n": 8}, (0, 8)),
        ("rfft", np.float32, (0, 4), {}, (0, 3)),
        ("irfft", np.complex64, (3, 0, 4), {}, (3, 0, 6)),
        ("fftn", np.complex64, (0, 4, 4), {"axes": (1, 2)}, (0, 4, 4)),
        ("rfftn", np.float64, (2, 0, 4, 4), {"axes": (2, 3)}, (2, 0, 4, 3)),
        ("hfft", np.complex64, (0, 3), {}, (0, 4)),
    ],
)
def test_zero_size_fft_gives_an_empty_result(framework, func, dtype, shape, kw, out_shape):
    conv, _ = framework
    x = np.ones(shape, dtype)
    want = getattr(np.fft, func)(x, **kw)
    got = getattr(nvdispatch.fft, func)(conv(x), **kw)
    assert tuple(got.shape) == want.shape == out_shape
    assert np.dtype(str(got.dtype).removeprefix("torch.")).kind == want.dtype.kind


@pytest.mark.parametrize("framework", [NUMPY, TORCH], ids=lambda f: f[1])
def test_zero_size_stateful_fft_and_matmul(framework):
    conv, _ = framework
    f = nvdispatch.fft.FFT(conv(np.ones((0, 4), np.complex64)), axes=(1,)).plan()
    assert tuple(f.execute().shape) == (0, 4) and tuple(f.execute(direction="inverse").shape) == (0, 4)
    for a_shape, b_shape in [((0, 3), (3, 2)), ((2, 0), (0, 2)), ((0, 2, 3), (3, 2)), ((2, 3), (3, 0))]:
        a, b = np.ones(a_shape), np.ones(b_shape)
        got = nvdispatch.Matmul(conv(a), conv(b)).plan().execute()
        np.testing.assert_array_equal(np.asarray(got), a @ b)
        got, aux = nvdispatch.matmul(
            conv(a), conv(b), epilog="RELU_AUX_BIAS", epilog_inputs={"bias": conv(np.ones(b_shape[-1]))}
        )
        np.testing.assert_array_equal(np.asarray(got), np.maximum(a @ b + 1, 0))


# -- in-place FFT targets -----------------------------------------------------------------------------------
def test_inplace_fft_refuses_a_read_only_or_broadcast_operand_at_plan_time():
    x = np.ones((4, 8), np.complex64)
    ro = x.copy()
    ro.flags.writeable = False
    for bad, why in [
        (ro, "read-only"),
        (np.broadcast_to(np.ones(8, np.complex64), (4, 8)), "read-only"),  # NumPy marks broadcasts read-only
        (np.lib.stride_tricks.as_strided(x, (4, 8), (0, 8)), "overlap"),  # writable, but rows alias
        (torch.ones(8, dtype=torch.complex64).expand(4, 8), "overlap"),
        (torch.ones(4, 8, dtype=torch.complex64, requires_grad=True), "requires grad"),
    ]:
        with pytest.raises(errors.InvalidArgumentError, match=why) as info:
            nvdispatch.fft.FFT(bad, axes=(1,), options={"inplace": True})
        assert info.value.argument == "x"
    f = nvdispatch.fft.FFT(x.copy(), axes=(1,), options={"inplace": True}).plan()
    with pytest.raises(errors.InvalidArgumentError, match="read-only"):
        f.reset_operand(ro)
    y = x.copy()
    f.reset_operand(y)
    assert f.execute() is y
    np.testing.assert_allclose(y, np.fft.fft(x, axis=1), rtol=1e-6)
    # out of place, the same operands are fine (never written)
    np.testing.assert_allclose(nvdispatch.fft.FFT(ro, axes=(1,)).plan().execute(), np.fft.fft(x, axis=1), rtol=1e-6)
