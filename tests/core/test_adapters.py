"""Framework adapters: detection by class (cached, never importing a framework), the registry, CAI devices."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import nvdispatch
from nvdispatch import _adapters
from nvdispatch._adapters import Adapter, OperandInfo, adapter_for, adapter_named, register_adapter
from nvdispatch._detect import detect
from nvdispatch.errors import UnsupportedOperandError


class FakeCai:
    """A device array known only by ``__cuda_array_interface__`` (no memory behind it)."""

    def __init__(self, ptr, shape=(4, 4), typestr="<f4"):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": typestr, "version": 3}


@pytest.fixture
def devices_by_pointer(monkeypatch):
    """Pretend pointers below 1 << 40 live on GPU 0 and the others on GPU 1."""
    monkeypatch.setattr(_adapters.cai, "pointer_device", lambda ptr: 0 if ptr < (1 << 40) else 1)


def test_builtin_adapters_answer_for_their_classes():
    assert adapter_for(np.ones(2)).name == "numpy"
    assert adapter_for(np.float32(1)).name == "numpy"
    assert adapter_for(FakeCai(256)).name == "cuda_array_interface"
    assert adapter_for([1, 2]) is None
    torch = pytest.importorskip("torch")
    assert adapter_for(torch.ones(2)).name == "torch"
    assert adapter_for(torch.nn.Parameter(torch.ones(2))).name == "torch"


def test_detection_never_imports_a_framework():
    before = set(sys.modules)
    detect("a", np.ones(3))
    with pytest.raises(UnsupportedOperandError):
        detect("a", object())
    assert not {"cupy", "jax", "dask"} & (set(sys.modules) - before)


def test_cai_operands_get_their_gpu_from_the_pointer(devices_by_pointer):
    assert detect("a", FakeCai(1 << 20)).device == nvdispatch._detect.Device("cuda", 0)
    assert detect("a", FakeCai(1 << 41)).device == nvdispatch._detect.Device("cuda", 1)
    assert adapter_named("cuda_array_interface").signature(FakeCai(1 << 20)) != adapter_named(
        "cuda_array_interface"
    ).signature(FakeCai(1 << 41))


class Boxed:
    """A toy framework: a NumPy array in a box."""

    def __init__(self, arr):
        self.arr = np.asarray(arr)


class BoxedAdapter(Adapter):
    name = "boxed"
    default_executors = {"cpu": ("numpy",)}

    def claims(self, cls):
        return issubclass(cls, Boxed)

    def info(self, name, x):
        inner = adapter_named("numpy").info(name, x.arr)
        return OperandInfo(x, self.name, inner.device, inner.dtype, inner.shape, inner.strides)


def test_a_registered_adapter_claims_its_class_and_can_be_removed():
    ad = register_adapter(BoxedAdapter())
    try:
        info = detect("x", Boxed(np.ones((2, 3), np.float32)))
        assert (info.framework, info.dtype, info.shape) == ("boxed", "float32", (2, 3))
        assert nvdispatch.executors.default_names("boxed", "cpu") == ("numpy",)
        assert adapter_named("boxed") is ad
    finally:
        _adapters.unregister_adapter("boxed")
    with pytest.raises(UnsupportedOperandError):
        detect("x", Boxed(np.ones(2)))


def test_register_adapter_refuses_what_is_no_adapter():
    with pytest.raises(nvdispatch.errors.InvalidArgumentError, match="adapter"):
        register_adapter(object())


def test_coercion_goes_through_the_adapters():
    torch = pytest.importorskip("torch")
    t = torch.ones((2, 2), dtype=torch.float64, requires_grad=True)
    with nvdispatch.set_backend("numpy", coerce=True):
        out = nvdispatch.matmul(t, t)
    assert isinstance(out, np.ndarray) and out.tolist() == [[2.0, 2.0], [2.0, 2.0]]
    with nvdispatch.set_backend("torch", coerce=True):
        out = nvdispatch.matmul(np.ones((2, 2)), np.ones((2, 2)))
    assert isinstance(out, torch.Tensor)


def test_streams_are_normalised_through_the_adapters():
    from nvdispatch._cuda.streams import current_stream, framework_stream, stream_pointer

    class ProtocolStream:
        def __cuda_stream__(self):
            return (0, 1234)

    class CupyLikeStream:
        ptr = 5678

    assert stream_pointer(ProtocolStream()) == 1234
    assert stream_pointer(CupyLikeStream()) == 5678
    assert stream_pointer(42) == 42
    assert current_stream("cuda_array_interface", 0) == 0 and current_stream("no such framework", 0) == 0
    with framework_stream("cuda_array_interface", 7, 0):
        pass
    with pytest.raises(nvdispatch.errors.InvalidArgumentError, match="stream"):
        stream_pointer(object())


def test_gpu_result_kinds_come_from_the_adapters():
    from nvdispatch._cuda.arrays import result_kind

    assert result_kind(FakeCai(256), "cuda_array_interface") == "cai"
    numba_like = type("DeviceNDArray", (FakeCai,), {"__module__": "numba.cuda.cudadrv.devicearray"})
    assert result_kind(numba_like(256), "cuda_array_interface") == "numba"
    assert _adapters.adapter_for_result_kind("numba").name == "cuda_array_interface"
    torch = pytest.importorskip("torch")
    assert result_kind(torch.ones(1), "torch") == "torch"
    assert _adapters.adapter_for_result_kind("torch").name == "torch"


def test_torch_device_helpers_pack_relu_masks_both_ways():
    torch = pytest.importorskip("torch")
    from nvdispatch._cuda.xp import Xp, namespace_for

    xp = Xp("torch")
    mask = torch.rand(2, 3, 37, generator=torch.Generator().manual_seed(0)) > 0.5
    bits = xp.pack_mask(mask, 128)
    assert bits.shape == (2, 3, 16) and bits.dtype == torch.uint8
    want = np.packbits(mask.numpy(), axis=-1, bitorder="little")
    np.testing.assert_array_equal(bits.numpy()[..., : want.shape[-1]], want)
    assert bool((xp.unpack_mask(bits, 37) == mask).all())
    assert namespace_for("torch") == "torch"


def test_debug_log_names_executor_strategy_and_plan(caplog):
    import logging

    a = np.ones((3, 5))
    nvdispatch.plan_cache.clear()
    with caplog.at_level(logging.DEBUG, logger="nvdispatch"):
        nvdispatch.matmul(a, a.T)
        nvdispatch.matmul(a, a.T)
    text = caplog.text
    assert "executor 'numpy', strategy 'plain'" in text and "miss: planned" in text
    assert "plan cache hit (call key)" in text


@pytest.mark.parametrize(("typestr", "dtype"), [("<V2", "bfloat16"), ("<f2", "float16"), ("<c8", "complex64")])
def test_an_interface_array_is_detected_with_its_dtype_and_element_strides(devices_by_pointer, typestr, dtype):
    """A 2-byte void typestr is bfloat16 (Torch and ml_dtypes describe bfloat16 so; NumPy would say void16)."""
    x = FakeCai(256, shape=(3, 5), typestr=typestr)
    itemsize = np.dtype(typestr).itemsize
    x.__cuda_array_interface__["strides"] = (itemsize, 3 * itemsize)  # column-major
    info = adapter_for(x).info("x", x)
    assert (info.dtype, info.shape, info.strides) == (dtype, (3, 5), (1, 3))


def test_a_device_view_falls_back_to_dlpack_where_the_interface_is_refused(monkeypatch):
    """jaxlib refuses ``__cuda_array_interface__`` for bfloat16 buffers (an error, not a missing attribute): the
    view is then read through DLPack."""
    from nvdispatch._cuda import arrays

    class Refusing:
        @property
        def __cuda_array_interface__(self):
            raise TypeError("__cuda_array_interface__ is not supported for bfloat16 buffers")

        def __dlpack__(self, **kwargs):
            raise AssertionError("stood in for by _dlpack_view")

    seen = []
    monkeypatch.setattr(arrays, "_dlpack_view", lambda x: seen.append(x) or "dlpack view")
    x = Refusing()
    assert arrays.view(x, "jax-like framework") == "dlpack view" and seen == [x]


@pytest.mark.parametrize(("dtype", "shape", "strides"), [("float32", (4, 6), (6, 1)), ("complex128", (3, 5), (1, 3))])
def test_a_cuda_dlpack_producer_is_described_by_its_capsule(dtype, shape, strides):
    """An object that speaks only DLPack (no ``dtype``/``shape`` attributes) on a CUDA device: dtype, shape and
    strides come from the capsule it exports (memory never read here)."""
    from nvdispatch._cuda.dlpack_export import capsule

    class DlpackOnly:
        def __dlpack_device__(self):
            return (2, 0)  # kDLCUDA, device 0

        def __dlpack__(self, **kwargs):
            return capsule(0x10000, shape, strides, dtype, 2, 0, self)

    x = DlpackOnly()
    info = adapter_for(x).info("x", x)
    assert (info.framework, info.dtype, info.shape, info.strides) == ("dlpack", dtype, shape, strides)
    assert (info.device.kind, info.device.index) == ("cuda", 0)


def test_a_cpu_only_torch_does_not_serve_other_owners_cuda_arrays():
    """The array passes around cuFFT/cuBLASLt for CAI, DLPack and JAX GPU arrays view them as a helper
    framework's arrays: a Torch built without CUDA cannot, so it is not offered for them (its own tensors keep it)."""
    torch = pytest.importorskip("torch")
    from nvdispatch._cuda import xp

    assert adapter_named("torch").device_ops_for_foreign_arrays() == torch.backends.cuda.is_built()
    if not torch.backends.cuda.is_built() and not _module_installed("cupy"):
        xp.namespace_for.cache_clear()
        assert xp.namespace_for("cuda_array_interface") is None and xp.namespace_for("jax") is None
        assert xp.namespace_for("torch") == "torch"


def _module_installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "complex64", "bool"])
def test_exported_capsules_carry_every_dtype_torch_reads_back(dtype):
    # bfloat16 (a "V"-kind NumPy dtype from ml_dtypes) is DLPack's kDLBfloat: results of that dtype handed to JAX or
    # Torch through our own capsule keep it
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from nvdispatch._cuda.dlpack_export import capsule

    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    host = (np.arange(6, dtype=np.float64) % 3).reshape(2, 3).astype(np_dtype)
    got = torch.utils.dlpack.from_dlpack(capsule(host.ctypes.data, host.shape, (3, 1), host.dtype, 1, 0, host))
    assert got.dtype == getattr(torch, dtype) and got.shape == (2, 3)
    np.testing.assert_array_equal(got.float().numpy() if dtype == "bfloat16" else got.numpy(),
                                  host.astype(np.float32) if dtype == "bfloat16" else host)  # fmt: skip
