"""The GPU callbacks' own Python, on the CPU: what the device kernels do when XLA calls them with its buffers
and stream, with the ``cuda`` executor replaced by a recorder (its plans' launches are the GPU tests')."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import nvdispatch
from nvdispatch import plan_cache
from nvdispatch._detect import Device
from nvdispatch.errors import NoExecutorError, PlanStateError
from nvdispatch.integrations import jax_buffers, jax_fft_kernel, jax_matmul_kernel
from nvdispatch.integrations.jax_fft_kernel import FFTCall
from nvdispatch.integrations.jax_matmul_kernel import MatmulCall


class _Buffer:
    """What XLA hands a GPU callback: shape, dtype, a device address and the device."""

    def __init__(self, shape, dtype, ptr, device=0):
        self.shape, self.dtype, self._ptr, self._device = tuple(shape), np.dtype(dtype), ptr, device

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self._ptr, False), "version": 3}

    def __dlpack_device__(self):
        return (2, self._device)


class _Recorder:
    """A stand-in for the ``cuda`` executor: its plans record what they are asked to run."""

    name = "cuda"

    def __init__(self, orientation="row", strategies=("native",)):
        self.orientation, self.offered, self.planned, self.runs = orientation, strategies, [], []

    def decline(self, op, problem, *, coerce=False):
        return None

    def strategies(self, op, problem):
        return self.offered

    def plan(self, op, problem, strategy, tuning=None):
        self.planned.append(problem)
        recorder = self

        class Plan:
            setup = SimpleNamespace(orientation=self.orientation)
            steps = ()
            workspace_bytes = 0
            needs_release = False

            def execute_into(self, pointers, outputs, stream, alpha, beta):
                recorder.runs.append(("into", pointers, outputs, stream, alpha, beta))

            def execute(self, operands, stream=None):
                recorder.runs.append(("execute", operands, stream))

            def release(self):
                pass

        Plan.problem = problem
        return Plan()


_Recorder.__module__ = "nvdispatch.executors.test_recorder"  # one of nvdispatch's own: its plans run unwrapped


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(jax_buffers, "builtin", lambda name: rec if name == "cuda" else None)
    monkeypatch.setattr(jax_buffers, "candidates", lambda framework, kind: [SimpleNamespace(executor=rec)])
    plan_cache.clear()
    yield rec
    plan_cache.clear()


def _matmul_callback(epilog="RELU_BIAS", orientation="row"):
    call = MatmulCall(epilog=epilog, alpha=2.0)
    views = {"a": (), "b": ("T",), "bias": ()}
    return jax_matmul_kernel._device_callback(call, call.options, ("a", "b", "bias"), views, orientation, ("out",))


def test_matmul_callback_runs_the_plan_into_xla_buffers_on_xla_stream(recorder):
    callback = _matmul_callback()
    ins = (_Buffer((6, 3), "float32", 0x1000), _Buffer((5, 3), "float32", 0x2000), _Buffer((1, 5), "float32", 0x3000))
    outs = (_Buffer((6, 5), "float32", 0x4000),)
    for _ in range(3):
        callback(SimpleNamespace(stream=0xABC), outs, *ins)
    assert len(recorder.planned) == 1  # planned once, then found by its handle
    problem = recorder.planned[0]
    assert problem.framework == "dlpack" and problem.device == Device("cuda", 0)
    assert (problem.m, problem.n, problem.k) == (6, 5, 3) and problem.b.strides == (1, 3)  # b read transposed
    kind, pointers, outputs, stream, alpha, beta = recorder.runs[-1]
    assert kind == "into" and stream == 0xABC and (alpha, beta) == (2.0, None)
    assert pointers == {"a": 0x1000, "b": 0x2000, "bias": 0x3000} and outputs == {"out": 0x4000}


def test_matmul_callback_plans_again_after_the_cache_lets_go_and_per_shape(recorder):
    callback = _matmul_callback()
    ins = (_Buffer((6, 3), "float32", 1 << 12), _Buffer((5, 3), "float32", 2 << 12), _Buffer((1, 5), "float32", 3 << 12))
    outs = (_Buffer((6, 5), "float32", 4 << 12),)
    callback(SimpleNamespace(stream=1), outs, *ins)
    plan_cache.clear()
    callback(SimpleNamespace(stream=1), outs, *ins)
    assert len(recorder.planned) == 2
    batched = (_Buffer((4, 6, 3), "float32", 1 << 12), _Buffer((1, 5, 3), "float32", 2 << 12), _Buffer((1, 1, 5), "float32", 3 << 12))
    callback(SimpleNamespace(stream=1), (_Buffer((4, 6, 5), "float32", 4 << 12),), *batched)  # under jax.vmap
    assert recorder.planned[-1].batch_shape == (4,)


def test_matmul_callback_refuses_a_plan_of_another_orientation(recorder):
    recorder.orientation = "col"
    ins = (_Buffer((6, 3), "float32", 4096), _Buffer((5, 3), "float32", 8192), _Buffer((1, 5), "float32", 12288))
    with pytest.raises(PlanStateError, match="orientation"):
        _matmul_callback()(SimpleNamespace(stream=1), (_Buffer((6, 5), "float32", 16384),), *ins)


def test_matmul_callback_without_a_fused_plan_says_why(recorder):
    recorder.offered = ("inplace",)
    ins = (_Buffer((6, 3), "float32", 4096), _Buffer((5, 3), "float32", 8192), _Buffer((1, 5), "float32", 12288))
    with pytest.raises(NoExecutorError, match="native"):
        _matmul_callback()(SimpleNamespace(stream=1), (_Buffer((6, 5), "float32", 16384),), *ins)


def test_a_backend_state_excluding_the_cuda_executor_is_refused(recorder, monkeypatch):
    monkeypatch.setattr(jax_buffers, "candidates", lambda framework, kind: [])
    ins = (_Buffer((6, 3), "float32", 4096), _Buffer((5, 3), "float32", 8192), _Buffer((1, 5), "float32", 12288))
    with pytest.raises(NoExecutorError, match="backend state"):
        _matmul_callback()(SimpleNamespace(stream=1), (_Buffer((6, 5), "float32", 16384),), *ins)


def test_fft_callback_transforms_into_xla_output_buffer(recorder):
    recorder.offered = ("cufft",)
    call = FFTCall("r2c", "forward", (8, 6))
    callback = jax_fft_kernel._device_callback(call, "float32")
    x, out = _Buffer((3, 8, 6), "float32", 4096, device=1), _Buffer((3, 8, 4), "complex64", 8192, device=1)
    callback(SimpleNamespace(stream=77), (out,), x)
    problem = recorder.planned[0]
    assert problem.func == "rfftn" and problem.axes == (1, 2) and problem.lengths == (8, 6)
    assert problem.device == Device("cuda", 1) and problem.scale() == 1.0
    kind, operands, stream = recorder.runs[-1]
    assert kind == "execute" and stream == 77 and operands["x"] is x and operands["out"] is out


def test_the_real_cuda_fft_layout_takes_every_kernel_problem():
    from nvdispatch.executors.cuda_fft import layout

    for call, shape, dtype in [
        (FFTCall("c2c", "forward", (5,)), (4, 5), "complex64"),
        (FFTCall("c2c", "inverse", (3, 4, 5)), (2, 3, 4, 5), "complex128"),
        (FFTCall("r2c", "forward", (4, 6)), (2, 4, 6), "float32"),
        (FFTCall("c2r", "inverse", (4, 6)), (2, 4, 4), "complex64"),
    ]:
        assert isinstance(layout(call.problem(shape, dtype, "dlpack", Device("cuda", 0))), dict)


del nvdispatch
