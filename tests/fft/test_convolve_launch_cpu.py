"""The prepared launches of the convolution kernels, on the CPU: the parameters packed for every step of the
device-fused, pairs and four-step strategies against an independent layout (NumPy's strides and scalar bytes
laid out as Numba's kernel ABI documents: meminfo, parent, nitems, itemsize, data, shape, strides), and the
compiled launcher (``_hotpath_launch.c``) driving a stand-in ``cuLaunchKernel`` that records what it was
given."""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

from nvdispatch._compiled import hotpath
from nvdispatch._cuda.kernel_launch import LaunchSpec, PreparedLaunches, dims3
from nvdispatch._cuda.kernel_params import SLOT, array_parameters, pack, scalar_parameters
from nvdispatch.device.fft_callback_kernel import KernelSpec, convolution_kernel
from nvdispatch.device.fft_filter import permute_step
from nvdispatch.device.fft_four_step import FourStepConvolution
from nvdispatch.device.kernel_steps import ArrayArg, KernelStep
from nvdispatch.executors.cuda_numba_launch import step_parameters


def _slot(raw: bytes) -> bytes:
    return raw + bytes(SLOT - len(raw))


def _expected(step: KernelStep, pointers) -> tuple[bytes, list[int]]:
    """Numba's parameters for ``step`` with the operands at ``pointers``, from NumPy arrays of the same shapes."""
    values, sizes = b"", []
    for arg in step.args:
        if isinstance(arg, ArrayArg):
            a = np.empty(arg.shape, arg.dtype)
            fields = [0, 0, a.size, a.itemsize, pointers[arg.operand], *a.shape, *a.strides]
            values += b"".join(_slot(np.int64(v).tobytes()) for v in fields)
            sizes += [8] * len(fields)
        elif np.iscomplexobj(arg):
            for part in (arg.real, arg.imag):
                values += _slot(part.tobytes())
                sizes.append(part.itemsize)
        else:
            values += _slot(np.asarray(arg).tobytes())
            sizes.append(np.asarray(arg).itemsize)
    return values, sizes


def _patched(step: KernelStep, pointers) -> tuple[bytes, tuple[int, ...]]:
    packed, patches = step_parameters(step)
    values = bytearray(packed.values)
    for param, operand in patches:
        struct.pack_into("<Q", values, SLOT * param, pointers[operand])
    return bytes(values), packed.sizes


def _steps_of_every_strategy():
    """(label, steps, operands) of the kernels the convolution plans launch (built, not compiled)."""
    out = []
    c64, f32, c128, f64 = (np.dtype(t) for t in ("complex64", "float32", "complex128", "float64"))
    for precision, real_in, cplx in (("float32", f32, c64), ("float64", f64, c128)):
        for real in (False, True):
            engine = FourStepConvolution(64, precision, real, parts=(8, 8))
            x_dtype = real_in if real else cplx
            out.append((f"four-step {precision} real={real}", engine.steps(3, x_dtype, cplx), 6))
        fused = convolution_kernel(KernelSpec("c2c", 64, precision, "forward", 64, scale=1 / 64, convolve=True))
        x = ArrayArg(0, (5, 64), cplx)
        out.append((f"device-fused {precision}", (fused.convolution_step(x, x, ArrayArg(2, (1, 64), cplx)),), 3))
        pairs = convolution_kernel(KernelSpec("c2c", 64, precision, "forward", 64, convolve=True, pairs=True))
        completed = ArrayArg(3, (1, 64), cplx)
        steps = (
            permute_step(ArrayArg(2, (33,), cplx), completed, True, np.dtype(precision).type(1 / 64)),
            pairs.convolution_step(ArrayArg(0, (5, 64), real_in), ArrayArg(1, (5, 64), real_in), completed),
        )
        out.append((f"device-fused pairs {precision}", steps, 4))
    return out


STRATEGY_STEPS = _steps_of_every_strategy()


@pytest.mark.parametrize("label,steps,operands", STRATEGY_STEPS, ids=[s[0] for s in STRATEGY_STEPS])
def test_packed_parameters_are_numbas_layout(label, steps, operands):
    pointers = [0x7F0000000000 + 0x100000 * i for i in range(operands)]
    for step in steps:
        want_values, want_sizes = _expected(step, pointers)
        got_values, got_sizes = _patched(step, pointers)
        assert got_sizes == tuple(want_sizes), label
        assert got_values == want_values, label


def test_scalars_take_their_own_width_and_complex_numbers_two_slots():
    packed = pack(
        [*scalar_parameters("float32", 1.5), *scalar_parameters("int64", -3), *scalar_parameters("complex128", 2 - 1j)]
    )
    assert packed.sizes == (4, 8, 8, 8)
    assert packed.values[:4] == np.float32(1.5).tobytes() and packed.values[4:8] == bytes(4)
    assert packed.values[8:16] == np.int64(-3).tobytes()
    assert packed.values[16:] == np.float64(2).tobytes() + np.float64(-1).tobytes()
    with pytest.raises(TypeError, match="bool"):
        scalar_parameters("bool", True)
    with pytest.raises(ValueError, match="strides"):
        array_parameters(0, (2, 3), (8,), 8)


def test_steps_describe_the_launches_of_the_four_step():
    engine = FourStepConvolution(64, "float32", True, parts=(8, 8))
    permute, forward, middle, inverse = engine.steps(3, np.float32, np.complex64)
    assert permute.args[1] == ArrayArg(4, (8, 8), np.dtype(np.complex64))  # the permuted filter
    assert forward.args[1].operand == 0 and inverse.args[3].operand == 1  # real x in, real out
    assert middle.args[0] == ArrayArg(3, (2 * 8, 8), np.dtype(np.complex64))  # the intermediate's rows
    assert forward.grid == inverse.grid and engine.steps(0, np.float32, np.complex64) == ()


# -- the compiled launcher, with a stand-in for the driver ------------------------------------------------------
LAUNCH = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,
    *[ctypes.c_uint] * 7,
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_void_p,
)
GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))
PUSH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class FakeDriver:
    """cuLaunchKernel and the context calls, recording what they get (parameters read by the given sizes)."""

    def __init__(self, sizes_of: dict, current: int = 0, fail_at: int | None = None):
        self.calls, self.events, self.current = [], [], current
        self.sizes_of, self.fail_at = sizes_of, fail_at

        def launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            sizes = self.sizes_of[f]
            values = b"".join(ctypes.string_at(params[i], size) for i, size in enumerate(sizes))
            self.calls.append((f, (gx, gy, gz), (bx, by, bz), shared, stream or 0, values))
            return 700 if len(self.calls) == self.fail_at else 0

        def get(out):
            out[0] = self.current
            return 0

        def push(ctx):
            self.events.append(("push", ctx))
            return 0

        def pop(out):
            self.events.append(("pop",))
            return 0

        self._fns = [LAUNCH(launch), GET(get), PUSH(push), GET(pop)]
        self.addresses = tuple(ctypes.cast(f, ctypes.c_void_p).value for f in self._fns)


def _compiled_launches(driver: FakeDriver, context: int, operands: int, specs):
    items = [(s.function, s.grid, s.block, s.shared, s.parameters.values, s.patches) for s in specs]
    return hotpath().make_kernel_launches(driver.addresses, context, operands, items)


needs_extension = pytest.mark.skipif(
    hotpath() is None or not hasattr(hotpath(), "make_kernel_launches"), reason="the compiled extension is not built"
)


@needs_extension
@pytest.mark.parametrize("label,steps,operands", STRATEGY_STEPS, ids=[s[0] for s in STRATEGY_STEPS])
def test_the_compiled_launcher_hands_the_driver_numbas_parameters(label, steps, operands):
    specs, sizes_of = [], {}
    for i, step in enumerate(steps):
        packed, patches = step_parameters(step)
        function = 0x1000 + i
        sizes_of[function] = packed.sizes
        specs.append(LaunchSpec(function, dims3(step.grid), dims3(step.block), step.shared, packed, patches))
    driver = FakeDriver(sizes_of, current=0x5000)
    run = _compiled_launches(driver, 0x5000, operands, specs)
    pointers = [0x7F0000000000 + 0x100000 * i for i in range(operands)]
    assert run(0xABC, *pointers) == 0
    assert driver.events == []  # the plan's context was current: nothing pushed
    assert len(driver.calls) == len(steps)
    for call, step, spec in zip(driver.calls, steps, specs):
        function, grid, block, shared, stream, values = call
        assert (function, grid, block, shared, stream) == (spec.function, spec.grid, spec.block, step.shared, 0xABC)
        assert values == b"".join(
            v[: sizes_of[function][i]] for i, v in enumerate(_chunks(_expected(step, pointers)[0]))
        ), label


def _chunks(values: bytes):
    return [values[i : i + SLOT] for i in range(0, len(values), SLOT)]


@needs_extension
def test_the_launcher_pushes_the_plans_context_stops_at_a_failure_and_checks_its_arguments():
    step = STRATEGY_STEPS[0][1][0]
    packed, patches = step_parameters(step)
    spec = LaunchSpec(0x1000, dims3(step.grid), dims3(step.block), 0, packed, patches)
    driver = FakeDriver({0x1000: packed.sizes}, current=0x6000, fail_at=1)
    run = _compiled_launches(driver, 0x5000, 6, [spec, spec])
    assert run(0, *range(1, 7)) == 700  # the driver's status; the second launch is not made
    assert len(driver.calls) == 1 and driver.events == [("push", 0x5000), ("pop",)]
    with pytest.raises(TypeError, match="6 pointers"):
        run(0, 1, 2)
    with pytest.raises(ValueError, match="out of range"):
        _compiled_launches(driver, 0, 1, [spec])  # patches name operands up to 5
    bad = LaunchSpec(0x1000, (0, 1, 1), (1, 1, 1), 0, packed, patches)
    with pytest.raises(ValueError, match="positive"):
        _compiled_launches(driver, 0, 6, [bad])


def test_prepared_launches_raise_the_drivers_error():
    from nvdispatch.errors import CudaRuntimeError

    prepared = PreparedLaunches.__new__(PreparedLaunches)
    prepared._run = lambda stream, *pointers: 1
    with pytest.raises(CudaRuntimeError, match="cuLaunchKernel"):
        prepared(0)


def test_a_launcher_that_cannot_prepare_says_why_and_launches_by_numba(monkeypatch, caplog):
    from nvdispatch.executors import cuda_numba_launch

    steps = STRATEGY_STEPS[0][1]
    monkeypatch.setattr(cuda_numba_launch, "unavailable", lambda: "no driver here")
    with caplog.at_level("DEBUG", logger="nvdispatch"):
        launcher = cuda_numba_launch.StepLauncher(steps, 6, 0, False, "convolve four-step")
    assert not launcher.prepared and launcher.how == "launched by Numba (no driver here)"
    assert "convolve four-step: 4 kernel launches, launched by Numba (no driver here)" in caplog.text

    def broken(steps, operands):
        raise RuntimeError("the driver said no")

    monkeypatch.setattr(cuda_numba_launch, "_prepare", broken)
    launcher = cuda_numba_launch.StepLauncher(steps, 6, 0, False, "convolve four-step")
    assert not launcher.prepared and "RuntimeError: the driver said no" in launcher.how


def test_the_convolve_plans_import_without_numba():
    """Without numba-cuda the "cuda" executor's convolve modules still import and decline with the reason (the
    launch module imports nvdispatch.device, which needs numba-cuda, only where a plan is made)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['numba'] = None\n"
        "from nvdispatch.executors import cuda_fft_convolve, cuda_fft_convolve_four_step, cuda_fft_convolve_unfused\n"
        "from nvdispatch.executors.cuda_numba import numba_reason\n"
        "print(numba_reason())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "numba-cuda is not installed" in done.stdout
