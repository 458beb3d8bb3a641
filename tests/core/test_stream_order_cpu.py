"""The ordering of the raw ``cuda`` executor's device work with the streams its operands' producers and its results'
consumers run on, checked on the CPU with stand-ins that record what would reach the CUDA runtime:

* a JAX GPU array is read only once XLA has written it (JAX computes on streams of its own, unordered with the ones
  nvdispatch launches on: a float16 input cast to float32 for the call, read by the cuFFT input pass before XLA's
  cast kernel ran, gave an all-zero result under load), and never through JAX's ``__cuda_array_interface__``, which
  neither waits nor names a stream;
* a ``__cuda_array_interface__`` v3 producer's ``"stream"`` is synchronised on before its data is read;
* a result handed to a DLPack consumer (JAX's ``from_dlpack`` above all) is complete first unless the consumer reads
  on the stream that wrote it or asks for no synchronisation: DLPack's ``stream=None`` included;
* views of a result, and results made by the CuPy/Torch helpers, carry the stream they were written on.

The GPU check: ``benchmarks/probes/jax_stream_order.py``."""

from __future__ import annotations

import numpy as np
import pytest

from nvdispatch._adapter_registry import adapter_named
from nvdispatch._adapters import cai as cai_adapter
from nvdispatch._adapters.jax import JaxAdapter
from nvdispatch._cuda import arrays, runtime
from nvdispatch._cuda.arrays import CudaArray, DeviceView, same_stream


@pytest.fixture
def syncs(monkeypatch):
    """The streams the host would wait for (``runtime.synchronize``), in order; a device for every pointer."""
    seen: list[int] = []
    monkeypatch.setattr(runtime, "synchronize", seen.append)
    monkeypatch.setattr(runtime, "pointer_device", lambda ptr: 0)
    return seen


class FakeJaxGpuArray:
    """What the JAX adapter reads of a GPU ``jax.Array``, recording the order of the reads; its CUDA array
    interface (JAX's, which does not wait for the array to be written) must not be read at all."""

    def __init__(self, shape=(3, 4), dtype="float32", ptr=0x7000):
        self.shape, self.dtype, self._ptr = shape, np.dtype(dtype), ptr
        self.events: list[str] = []

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA, device 0

    def block_until_ready(self):
        self.events.append("ready")
        return self

    def unsafe_buffer_pointer(self):
        self.events.append("pointer")
        return self._ptr

    @property
    def __cuda_array_interface__(self):
        raise AssertionError("JAX's __cuda_array_interface__ neither waits for the array nor names its stream")


# -- JAX operands ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "float32", "bfloat16", "complex64"])
def test_a_jax_gpu_array_is_read_once_xla_has_written_it(dtype):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
        import ml_dtypes

        dtype = ml_dtypes.bfloat16
    x = FakeJaxGpuArray((3, 5), dtype)
    v = arrays.view(x, "jax")  # every executor's read of an operand (FFT passes, cuFFT, callbacks, Numba kernels)
    assert x.events == ["ready", "pointer"]
    assert (v.ptr, v.shape, v.strides, v.owner) == (0x7000, (3, 5), (5, 1), x)
    assert v.dtype == np.dtype(dtype).name


def test_the_pointer_read_of_cached_plans_waits_too():
    x = FakeJaxGpuArray()
    assert JaxAdapter().data_ptr(x) == 0x7000 and x.events == ["ready", "pointer"]
    assert arrays.pointer_getter("jax")(x) == 0x7000  # the matmul plans' per-call pointer read


def test_a_jax_cpu_array_has_no_device_view():
    jnp = pytest.importorskip("jax.numpy")
    assert JaxAdapter().device_view(jnp.ones(3)) is None


# -- CUDA array interface producers ----------------------------------------------------------------------------------
class CaiProducer:
    def __init__(self, stream):
        self.__cuda_array_interface__ = {
            "shape": (2, 3), "typestr": "<f4", "data": (0x5000, False), "version": 3, "strides": None,
            "stream": stream,
        }  # fmt: skip


@pytest.mark.parametrize(("stream", "waits"), [(None, []), (1, [1]), (2, [2]), (0x9000, [0x9000])])
def test_a_cai_producers_stream_is_synchronised_before_its_data_is_read(syncs, stream, waits):
    v = arrays.view(CaiProducer(stream), "cuda_array_interface")
    assert syncs == waits and v.ptr == 0x5000 and v.strides == (3, 1)


# -- results handed to DLPack consumers ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("consumer", "producer", "needs_wait"),
    [
        (None, 0, True),  # DLPack's default; JAX passes None where its client names no stream, then reads unordered
        (None, 0x9000, True),
        (-1, 0x9000, False),  # the consumer asks for no synchronisation
        (0x9000, 0x9000, False),  # the stream that wrote it
        (1, 0, False),  # the legacy default stream, by DLPack's name and by CUDA's handle
        (0, 0, False),
        (2, 0, True),  # the per-thread default stream is another stream
        (0xA000, 0, True),  # XLA's stream for external ready events, Torch's or CuPy's current stream
        (0xA000, 0x9000, True),
    ],
)
def test_a_result_is_complete_before_a_consumer_on_another_stream_imports_it(syncs, consumer, producer, needs_wait):
    assert same_stream(consumer, producer) is not needs_wait
    r = CudaArray((4, 2), "complex64", stream=producer, base=object(), ptr=0x6000)
    capsule = r.__dlpack__(stream=consumer)
    assert capsule is not None
    assert syncs == ([producer] if needs_wait else [])


def test_views_of_a_result_keep_the_stream_it_was_written_on(syncs):
    r = CudaArray((4, 2), "float32", stream=0x9000, base=object(), ptr=0x6000)
    v = r.view_as((2,), (1,), 2)
    assert v.ptr == 0x6000 + 8
    v.__dlpack__(stream=0xA000)
    assert syncs == [0x9000]


def test_a_helpers_result_carries_the_helpers_current_stream(monkeypatch, syncs):
    class Helper:
        def current_stream(self, index):
            assert index == 0
            return 0x9000

        def device(self, arr):
            return type("D", (), {"index": 0})()

    made = object()
    monkeypatch.setattr(cai_adapter, "adapter_named", lambda name: Helper() if name == "helper" else None)
    monkeypatch.setattr(cai_adapter, "view", lambda arr, fw: DeviceView(0x6000, "float32", (2,), (1,), arr))
    r = adapter_named("cuda_array_interface").as_result("cai", made, "helper")
    assert r._base is made and r.ptr == 0x6000
    r.__dlpack__(stream=0xA000)
    assert syncs == [0x9000]


# -- the helper's operations of a cuBLASLt plan run on the stream the launch does --------------------------------
@pytest.mark.parametrize(
    ("framework", "current", "helper", "launched_on", "helper_on"),
    [
        ("jax", None, "torch", 0, ("torch", 0)),  # no stream of JAX's own: the legacy default stream for both
        ("cuda_array_interface", None, "cupy", 0, ("cupy", 0)),
        ("torch", 0x9000, "torch", 0x9000, None),  # the framework's current stream is its helper's already
        ("cupy", 0x9000, "cupy", 0x9000, None),
        ("jax", None, None, 0, None),  # no helper: nothing else runs
    ],
)
def test_a_cublaslt_plans_copies_run_on_its_launch_stream(monkeypatch, framework, current, helper, launched_on,
                                                          helper_on):  # fmt: skip
    import contextlib

    from nvdispatch._cuda import lt_plan_base

    entered = []

    @contextlib.contextmanager
    def framework_stream(name, stream, device_index):
        entered.append((name, stream))
        yield

    monkeypatch.setattr(lt_plan_base, "framework_stream", framework_stream)
    plan = lt_plan_base.LtPlanBase.__new__(lt_plan_base.LtPlanBase)
    plan.framework, plan.device_index = framework, 0
    plan._current_stream = None if current is None else (lambda: current)
    plan._xp = None if helper is None else type("Ops", (), {"name": helper})()
    launched = []
    plan._execute = lambda operands, sp: launched.append(sp) or "result"
    assert plan.execute({"a": 1, "b": 2}) == "result"
    assert launched == [launched_on]
    assert entered == ([] if helper_on is None else [helper_on])
