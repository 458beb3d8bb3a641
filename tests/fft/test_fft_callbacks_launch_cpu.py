"""The prepared launch of the device-fused FFT-with-callbacks plan, on the CPU: the generated kernel's parameters
(x, the result, then every prolog/epilog data array, C-contiguous or strided) against an independent layout read
off NumPy arrays of the same memory, the launch the plan's ``execute`` hands a stand-in ``cuLaunchKernel``
(pointers, grid, block, shared memory, stream; nothing packed again per call), and the reason a plan launches
through Numba instead (:mod:`tests.fft.kernel_launch_stand_in`)."""

from __future__ import annotations

import numpy as np
import pytest

from nvdispatch._cuda.kernel_launch import dims3
from nvdispatch._fft_callbacks import prepare
from nvdispatch.device.fft_callback_kernel import KernelSpec, build_callback_kernel
from nvdispatch.device.kernel_steps import ArrayArg
from nvdispatch.executors import cuda_fft_callbacks as op
from nvdispatch.executors.cuda_numba_launch import step_parameters
from tests.fft.kernel_launch_stand_in import needs_extension, numba_abi_parameters, received, stand_in_launcher

torch = pytest.importorskip("torch")


def weighted(v, i, w, table):
    return v * w[i % 8] + table[0, i % 3]


def shifted(v, i, s):
    return v + s[i % 4]


def _problem(rows=5, n=16, dtype=torch.complex64, layouts="mixed"):
    """A callback FFT problem on CPU tensors with data arrays of several layouts, and its operands."""
    x = torch.randn(rows, n, dtype=dtype)
    w = torch.randn(8, dtype=torch.complex64)
    if layouts == "mixed":
        table = torch.randn(3, 4, dtype=torch.float32).T  # Fortran-ordered (4, 3)
        s = torch.randn(4, 2, dtype=torch.float64)[:, 1]  # a column: a stride of two elements
    else:
        table = torch.randn(4, 3, dtype=torch.float32)
        s = torch.randn(4, dtype=torch.float64)
    return prepare("fft", x, None, -1, None, None, "backward", weighted, shifted, (w, table), (s,))


def _kernel(problem):
    p = problem.fft
    spec = KernelSpec(p.kind, p.lengths[0], p.real_dtype, p.direction, p.shape[-1], prolog_args=2, epilog_args=1,
                      scale=p.scale())  # fmt: skip
    return build_callback_kernel(spec, weighted, shifted)


@pytest.mark.parametrize("layouts", ["mixed", "contiguous"])
def test_the_steps_parameters_are_numbas_layout_of_every_operand(layouts):
    problem, operands = _problem(layouts=layouts)
    kernel = _kernel(problem)
    step = op.fused_step(problem, kernel, 5)
    data = [*operands["prolog_data"], *operands["epilog_data"]]
    arrays = {2 + i: d.numpy() for i, d in enumerate(data)}  # NumPy's view of each data array's memory
    arrays[0] = operands["x"].numpy()
    arrays[1] = np.empty((5, 16), np.complex64)
    assert [a.operand for a in step.args] == [0, 1, 2, 3, 4]
    assert [a.layout for a in step.args] == ["C", "C", "C"] + (["A", "A"] if layouts == "mixed" else ["C", "C"])
    assert step.grid == (-(-5 // kernel.ffts_per_block),) and step.block == kernel.block_dim
    assert step.shared == kernel.shared_memory_size
    pointers = [0x7F0000000000 + 0x100000 * i for i in range(5)]
    want_values, want_sizes = numba_abi_parameters(step, pointers, arrays)
    packed, patches = step_parameters(step)
    values = bytearray(packed.values)
    for param, operand in patches:
        values[8 * param : 8 * param + 8] = pointers[operand].to_bytes(8, "little")
    assert packed.sizes == tuple(want_sizes)
    assert bytes(values) == want_values


def test_a_padded_real_input_is_read_as_its_rows():
    x = torch.randn(3, 2, 10, dtype=torch.float32)
    w = torch.randn(8, dtype=torch.complex64)
    table = torch.randn(4, 3)
    problem, _ = prepare("fft", x, 12, -1, None, None, "ortho", weighted, None, (w, table), None)
    kernel = build_callback_kernel(
        KernelSpec("c2c", 12, "float32", "forward", 10, prolog_args=2, scale=problem.fft.scale(), promote=True),
        weighted,
    )
    x_arg, out_arg = op.fused_step(problem, kernel, 6).args[:2]
    assert x_arg == ArrayArg(0, (6, 10), np.dtype(np.float32))
    assert out_arg == ArrayArg(1, (6, 12), np.dtype(np.complex64))


@pytest.fixture
def cpu_plan(monkeypatch):
    """``make(problem)``: the device-fused plan of ``problem`` made on the CPU (the callbacks' GPU compile checks
    and the device queries stood in for; results allocated as CPU tensors)."""
    from nvdispatch._cuda import arrays, runtime

    monkeypatch.setattr(op, "check_callback", lambda cb, dtype: None)
    monkeypatch.setattr(runtime, "current_device", lambda: 0)
    monkeypatch.setattr(runtime, "device_count", lambda: 1)

    def empty(kind, shape, dtype, device_index, stream, order="C"):
        t = torch.empty(shape, dtype=getattr(torch, dtype))
        return t, t.data_ptr()

    monkeypatch.setattr(arrays, "empty", empty)

    def make(problem, as_keyed=True):
        plan = op.plan(problem, "device-fused")
        plan._as_keyed = as_keyed  # CPU tensors stand for device memory (True) or a coercing backend's copies
        return plan

    return make


@needs_extension
@pytest.mark.parametrize("as_keyed", [True, False], ids=["device-operands", "coerced-copies"])
def test_execute_hands_the_driver_every_operands_pointer_on_the_callers_stream(monkeypatch, cpu_plan, as_keyed):
    driver = stand_in_launcher(monkeypatch, context=0x5000)
    packs = []
    from nvdispatch.executors import cuda_numba_launch

    counted = cuda_numba_launch.step_parameters
    monkeypatch.setattr(cuda_numba_launch, "step_parameters", lambda step: packs.append(step) or counted(step))
    problem, operands = _problem()
    plan = cpu_plan(problem, as_keyed)
    assert plan.launcher.prepared and "cuLaunchKernel" in " ".join(plan.steps)
    assert len(packs) == 1
    data = [*operands["prolog_data"], *operands["epilog_data"]]
    for stream in (0xABC, 0xDEF):  # a repeated call packs nothing again
        out = plan.execute(operands, stream=stream)
        assert out.shape == (5, 16) and out.dtype == torch.complex64
        function, grid, block, shared, got_stream, values = driver.calls[-1]
        step = plan.launcher.steps[0]
        assert (grid, block, shared, got_stream) == (dims3(step.grid), dims3(step.block), step.shared, stream)
        pointers = [operands["x"].data_ptr(), out.data_ptr(), *[d.data_ptr() for d in data]]
        arrays = {0: operands["x"].numpy(), 1: out.numpy(), **{2 + i: d.numpy() for i, d in enumerate(data)}}
        assert values == received(numba_abi_parameters(step, pointers, arrays)[0], driver.sizes_of[function])
    assert len(driver.calls) == 2 and len(packs) == 1 and driver.events == []


def test_a_plan_that_cannot_prepare_says_why_and_launches_by_numba(monkeypatch, cpu_plan, caplog):
    from nvdispatch.executors import cuda_numba_launch

    monkeypatch.setattr(cuda_numba_launch, "unavailable", lambda: "no driver here")
    problem, _ = _problem()
    with caplog.at_level("DEBUG", logger="nvdispatch"):
        plan = cpu_plan(problem)
    assert not plan.launcher.prepared
    assert "launched by Numba (no driver here)" in plan.steps
    assert "fft_callbacks: 1 kernel launches, launched by Numba (no driver here)" in caplog.text


def test_an_empty_batch_prepares_no_launch(cpu_plan):
    x = torch.zeros(0, 16, dtype=torch.complex64)
    problem, operands = prepare("fft", x, None, -1, None, None, "backward", None, shifted, None,
                                (torch.zeros(4, dtype=torch.float64),))  # fmt: skip
    plan = cpu_plan(problem)
    assert plan.launcher.steps == () and "no launches" in plan.launcher.how
    assert plan.execute(operands, stream=0).shape == (0, 16)


@needs_extension
def test_coerced_operands_laid_out_unlike_the_key_are_launched_by_numba_for_that_call(monkeypatch, cpu_plan, caplog):
    """A coercing backend's copies are read per call: where a data array's layout is not the one packed (a
    contiguous copy of a strided array), that call goes through Numba on views of the arrays as they are."""
    driver = stand_in_launcher(monkeypatch)
    problem, operands = _problem()
    plan = cpu_plan(problem, as_keyed=False)
    launched = []
    monkeypatch.setattr(op, "numba_view", lambda a, fw, shape=None: (a, shape))
    monkeypatch.setattr(plan.kernel, "launch", lambda *args: launched.append(args))
    monkeypatch.setattr(plan, "_streams", lambda s: ("stream", s))
    copies = {**operands, "prolog_data": tuple(d.contiguous() for d in operands["prolog_data"])}
    with caplog.at_level("DEBUG", logger="nvdispatch"):
        out = plan.execute(copies, stream=0xABC)
    assert driver.calls == [] and len(launched) == 1
    (xv, x_shape), (ov, out_shape), _, pdata, edata, stream = launched[0]
    assert xv is copies["x"] and x_shape == (5, 16) and ov is out and out_shape == (5, 16)
    assert [d for d, _ in pdata] == list(copies["prolog_data"]) and stream == ("stream", 0xABC)
    assert [d for d, _ in edata] == list(operands["epilog_data"])
    assert "laid out unlike the plan's key" in caplog.text
    plan.execute(operands, stream=0xABC)  # laid out as the key says: the prepared launch
    assert len(driver.calls) == 1 and len(launched) == 1


def test_laid_out_as_compares_dtype_shape_and_byte_strides():
    from nvdispatch._cuda.arrays import DeviceView

    c = ArrayArg(0, (5, 16), np.dtype(np.complex64))
    a = ArrayArg(2, (4, 3), np.dtype(np.float32), strides=(4, 16))
    assert op.laid_out_as(DeviceView(0, "complex64", (5, 16), (16, 1)), c)
    assert op.laid_out_as(DeviceView(0, "complex64", (80,), (1,)), c)  # the rows of a C-contiguous whole
    assert not op.laid_out_as(DeviceView(0, "complex64", (16, 5), (1, 16)), c)
    assert not op.laid_out_as(DeviceView(0, "complex128", (5, 16), (16, 1)), c)
    assert op.laid_out_as(DeviceView(0, "float32", (4, 3), (1, 4)), a)
    assert not op.laid_out_as(DeviceView(0, "float32", (4, 3), (3, 1)), a)
    assert op.laid_out_as(DeviceView(0, "float32", (1, 3), (7, 1)), ArrayArg(1, (1, 3), np.dtype(np.float32)))
