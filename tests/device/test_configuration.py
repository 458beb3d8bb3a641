"""Knob validation, typed errors, ``valid(...)``, attributes and the simulator patches (no kernel launches)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import nvdispatch.device as device
from nvdispatch.device import DeviceConfigurationError, UnsupportedConfigurationError


def make(**overrides):
    knobs = dict(fft_type="c2c", size=128, precision=np.float32, direction="forward", execution="Block")
    knobs.update(overrides)
    return device.fft(**knobs)


@pytest.mark.parametrize(
    "overrides,argument",
    [
        ({"fft_type": "r2r"}, "fft_type"),
        ({"direction": "backward"}, "direction"),
        ({"execution": "Grid"}, "execution"),
        ({"size": 11}, "size"),
        ({"size": 32768}, "size"),
        ({"size": 128, "execution": "Thread"}, "size"),
        ({"precision": np.int32}, "precision"),
        ({"elements_per_thread": 3}, "elements_per_thread"),
        ({"ffts_per_block": 0}, "ffts_per_block"),
        ({"ffts_per_block": 2000}, "ffts_per_block"),
        ({"compiler": "nvrtc"}, "compiler"),
    ],
)
def test_bad_knob_raises_typed_error_naming_it(overrides, argument):
    with pytest.raises(DeviceConfigurationError) as info:
        make(**overrides)
    assert isinstance(info.value, ValueError)
    assert info.value.argument == argument
    assert argument in str(info.value) and "expected" in str(info.value)


def test_error_lists_the_valid_values():
    with pytest.raises(DeviceConfigurationError) as info:
        make(size=64, elements_per_thread=3)
    assert "2, 4, 8, 16, 32" in info.value.expected
    assert device.valid("elements_per_thread", size=64) == [2, 4, 8, 16, 32]


def test_r2c_must_be_forward():
    with pytest.raises(UnsupportedConfigurationError):
        make(fft_type="r2c", direction="inverse")
    assert make(fft_type="c2r", direction=None).direction == "inverse"


def test_valid_pairs_and_sizes():
    pairs = device.valid("elements_per_thread", "ffts_per_block", size=16)
    assert (16, 1) in pairs and all(16 % e == 0 for e, _ in pairs)
    sizes = device.valid("size", size=2, execution="Thread")
    assert 2 in sizes and 35 in sizes and 64 in sizes and 128 not in sizes


@pytest.mark.parametrize("size", [2**p for p in range(1, 13)] + [3, 5, 7, 15, 21, 35, 105, 360, 2401])
def test_every_supported_size_has_a_suggested_configuration(size):
    F = make(size=size)
    assert F.size % F.elements_per_thread == 0
    assert F.stride * F.elements_per_thread == size
    assert F.block_dim == device.Dim3(F.stride, F.ffts_per_block, 1)
    assert F.shared_memory_size <= 48 * 1024


def test_blocks_beyond_48_kib_are_valid_but_never_suggested():
    """More FFTs a block than fit 48 KiB exchange through one plane; a kernel launching them opts in."""
    suggested = make(size=1024, elements_per_thread=16)
    assert suggested.shared_memory_size <= 48 * 1024
    wide = make(size=1024, elements_per_thread=16, ffts_per_block=16)
    assert 48 * 1024 < wide.shared_memory_size <= 227 * 1024
    assert wide.block_dim == device.Dim3(64, 16, 1)
    with pytest.raises(device.DeviceConfigurationError):
        make(size=4096, elements_per_thread=4, ffts_per_block=2)  # 2048 threads


def test_double_precision_blocks_stop_at_4096_points():
    """A float64 element takes twice a float32's registers: longer blocks fail to launch on an H200."""
    assert device.FFT(4096, np.float64, "c2c", "Block", direction="forward").size == 4096
    assert device.FFT(16384, np.float32, "c2c", "Block", direction="forward").size == 16384
    with pytest.raises(device.DeviceConfigurationError, match=r"size.*\[2, 4096\] for Block in float64"):
        device.FFT(8192, np.float64, "c2c", "Block", direction="forward")
    assert device.valid("size", size=2, precision="float64")[-1] == 4096
    assert device.valid("size", size=2)[-1] == 16384


def test_attributes_of_seed_configuration():
    F = make(size=128, elements_per_thread=2, ffts_per_block=1)
    assert (F.storage_size, F.stride, F.elements_per_thread, F.ffts_per_block) == (2, 64, 2, 1)
    assert F.block_dim == (64, 1, 1)
    assert str(F.value_type) == "complex64" and F.input_type == F.output_type == F.value_type
    assert F.files == [] and F.files + F.files == []
    assert F.precision is np.float32 and F.fft_type == "c2c" and F.direction == "forward"
    R = make(fft_type="r2c", elements_per_thread=8)
    assert str(R.input_type) == "float32" and str(R.output_type) == "complex64" and R.storage_size == 5
    T = device.FFT(16, np.float64, "c2r", "Thread")
    assert T.storage_size == 9 and T.block_dim == (1, 1, 1) and T.shared_memory_size == 0


def test_matmul_bad_arguments():
    with pytest.raises(DeviceConfigurationError, match="size"):
        device.matmul(size=(4, 4), precision=np.float32)
    with pytest.raises(DeviceConfigurationError, match="data_type"):
        device.matmul(size=(4, 4, 4), precision=np.float32, data_type="quaternion")
    with pytest.raises(DeviceConfigurationError, match="arrangement"):
        device.matmul(
            size=(4, 4, 4), precision=np.float32, arrangement=("col_major", "diagonal", "row_major")
        )
    with pytest.raises(DeviceConfigurationError, match="block_size"):
        device.matmul(size=(4, 4, 4), precision=np.float32, block_size=4096)


def test_simulator_accepts_gpu_valid_kernel_spellings():
    if not device.simulator_compat.simulator_active():
        pytest.skip("only meaningful under NUMBA_ENABLE_CUDASIM=1")

    @cuda.jit(link=[])
    def kernel(out):
        dynamic = cuda.shared.array(shape=(0,), dtype=np.complex64)
        out[cuda.threadIdx.x] = dynamic.size

    out = cuda.to_device(np.zeros(2, np.int64))
    kernel[1, 2, 0, 64](out)
    assert list(out.copy_to_host()) == [8, 8]


def test_nvmath_compatibility_keywords():
    F = make(fft_type="r2c", sm=(9, 0), real_fft_options={"complex_layout": "natural", "real_mode": "normal"})
    assert F.fft_type == "r2c"
    with pytest.raises(UnsupportedConfigurationError) as info:
        make(fft_type="r2c", real_fft_options={"complex_layout": "packed"})
    assert info.value.argument == "real_fft_options"
    with pytest.raises(TypeError):
        make(leading_dimension=3)
    MM = device.matmul(size=(4, 4, 4), precision=np.float32, alpha=2.0, beta=0.0)
    assert (MM.alpha, MM.beta) == (2.0, 0.0)
