"""The prepared launches of FusedMLP's one-pass backward (:mod:`nvdispatch.executors.cuda_activation_grad`), on the
CPU: both kernels' parameters for every form against an independent layout read off NumPy arrays of the operands'
shapes (bfloat16 rows seen as int64 quads, the mask, float32 partial rows, int16 sums), the launches a plan hands a
stand-in ``cuLaunchKernel`` (pointers, grid, block, shared memory, stream), the plan kept in the plan cache so a
repeated step packs nothing again, and the reason a plan launches through Numba instead."""

from __future__ import annotations

import numpy as np
import pytest

from nvdispatch import plan_cache
from nvdispatch._cuda.kernel_launch import dims3
from nvdispatch.device import DeviceConfigurationError
from nvdispatch.device import activation_grad as kernels
from nvdispatch.executors import cuda_activation_grad as executor
from nvdispatch.executors import cuda_numba_launch
from nvdispatch.executors.cuda_numba_launch import step_parameters
from tests.fft.kernel_launch_stand_in import needs_extension, numba_abi_parameters, received, stand_in_launcher

KINDS = ["relu", "relu_bits", "gelu", "none"]
# one row block and a partial one; columns beyond one block of threads (two blocks of column quads)
SHAPES = [(70, 12), (3, 4 * 128 + 8)]
POINTERS = [0x7F0000000000 + 0x100000 * i for i in range(5)]


def _mask_shape(m, n):
    return (m, -(-n // 128) * 16)  # cuBLASLt's rows of the ReLU bit mask: whole 128-column groups


def _operands(kind, m, n):
    """NumPy arrays of the operands' layouts, by operand number, as the kernels see them."""
    quads = np.empty((m, n), np.uint16).view(np.int64)  # bfloat16 rows, four to an int64
    rows = -(-m // 64)  # one partial row per 64 rows
    saved = np.empty(_mask_shape(m, n), np.uint8) if kind == "relu_bits" else quads
    return {0: quads, 1: saved, 2: quads, 3: np.empty((rows, n), np.float32), 4: np.empty(n, np.int16)}


def _pointers(kind):
    return POINTERS if kind != "none" else [POINTERS[0], POINTERS[0], POINTERS[0], *POINTERS[3:]]


def _patched(step, pointers):
    packed, patches = step_parameters(step)
    values = bytearray(packed.values)
    for param, operand in patches:
        values[8 * param : 8 * param + 8] = pointers[operand].to_bytes(8, "little")
    return bytes(values), packed.sizes


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_both_kernels_parameters_are_numbas_layout(kind, shape):
    m, n = shape
    column_pass, column_sums = kernels.steps(kind, m, n, _mask_shape(m, n) if kind == "relu_bits" else None)
    arrays = _operands(kind, m, n)
    want_operands = [0, 0, 0, 3] if kind == "none" else [0, 1, 2, 3]
    assert [a.operand for a in column_pass.args] == want_operands
    assert [a.operand for a in column_sums.args] == [3, 4]
    assert column_pass.grid == (-(-(n // 4) // 128), -(-m // 64)) and column_pass.block == (128,)
    assert column_sums.grid == (-(-n // 32),) and column_sums.block == (32, 8)
    assert column_pass.shared == column_sums.shared == 0
    for step in (column_pass, column_sums):
        values, sizes = _patched(step, POINTERS)
        want_values, want_sizes = numba_abi_parameters(step, POINTERS, arrays)
        assert sizes == tuple(want_sizes) and values == want_values


def test_the_mask_form_needs_the_masks_shape():
    with pytest.raises(DeviceConfigurationError, match="saved_shape"):
        kernels.steps("relu_bits", 8, 8)


@needs_extension
@pytest.mark.parametrize("kind", KINDS)
def test_a_plan_hands_the_driver_its_two_launches_on_the_callers_stream(kind, monkeypatch):
    driver = stand_in_launcher(monkeypatch, context=0x5000)
    packs = []
    counted = cuda_numba_launch.step_parameters
    monkeypatch.setattr(cuda_numba_launch, "step_parameters", lambda step: packs.append(step) or counted(step))
    m, n = 70, 12
    saved_shape = _mask_shape(m, n) if kind == "relu_bits" else None
    plan = executor.ActivationGradPlan(kind, m, n, saved_shape, 0, False)
    assert plan.prepared and plan.partial_rows == 2 and "cuLaunchKernel" in plan.steps[-1]
    assert len(packs) == 2
    arrays = _operands(kind, m, n)
    for stream, base in ((0xABC, 0), (0xDEF, 0x1000)):  # other pointers, the same packed parameters
        pointers = [p + base for p in _pointers(kind)]
        plan(stream, *pointers)
        calls = driver.calls[-2:]
        assert [c[0] for c in calls] == [0x1000, 0x1001]  # the pass, then the column sums
        for call, step in zip(calls, plan.launcher.steps):
            function, grid, block, shared, got_stream, values = call
            assert (grid, block, shared, got_stream) == (dims3(step.grid), dims3(step.block), 0, stream)
            assert values == received(numba_abi_parameters(step, pointers, arrays)[0], driver.sizes_of[function])
    assert len(driver.calls) == 4 and len(packs) == 2 and driver.events == []


def test_a_plan_that_cannot_prepare_says_why(monkeypatch, caplog):
    monkeypatch.setattr(cuda_numba_launch, "unavailable", lambda: "no driver here")
    with caplog.at_level("DEBUG", logger="nvdispatch"):
        plan = executor.ActivationGradPlan("gelu", 70, 12, None, 0, False)
    assert not plan.prepared and plan.steps[-1] == "launched by Numba (no driver here)"
    assert "fused MLP backward one-pass gelu (70, 12): 2 kernel launches, launched by Numba (no driver here)" in (
        caplog.text
    )
    assert plan.needs_release is False and plan.workspace_bytes == 0


def test_the_plan_is_kept_in_the_plan_cache_by_its_problem(monkeypatch):
    """A repeated step finds its plan (made once) in the one plan cache; another problem or device, or a cleared
    cache, makes another."""
    torch = pytest.importorskip("torch")
    from nvdispatch.integrations import torch_activation_grad as one_pass

    monkeypatch.setattr(cuda_numba_launch, "unavailable", lambda: "no driver here")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    made = []
    real = executor.ActivationGradPlan
    monkeypatch.setattr(executor, "ActivationGradPlan", lambda *a: made.append(a) or real(*a))
    plan_cache.clear()
    try:
        first = one_pass.plan_for("relu_bits", 70, 12, (70, 16), 0)
        assert one_pass.plan_for("relu_bits", 70, 12, (70, 16), 0) is first
        assert plan_cache.peek(executor.key("relu_bits", 70, 12, (70, 16), 0)) is first
        assert one_pass.plan_for("relu_bits", 70, 12, (70, 32), 0) is not first
        assert one_pass.plan_for("relu_bits", 70, 12, (70, 16), 1) is not first
        assert made == [("relu_bits", 70, 12, (70, 16), 0, False), ("relu_bits", 70, 12, (70, 32), 0, False),
                        ("relu_bits", 70, 12, (70, 16), 1, False)]  # fmt: skip
        plan_cache.clear()
        assert one_pass.plan_for("relu_bits", 70, 12, (70, 16), 0) is not first
    finally:
        plan_cache.clear()


@needs_extension
@pytest.mark.parametrize("kind", KINDS)
def test_activation_backward_hands_its_plan_every_tensors_pointer(kind, monkeypatch):
    """``activation_backward`` on stand-ins for CUDA tensors (CPU tensors; Torch's stream and device stood in for):
    the launches get g, the saved tensor, dz, the partial rows and the sums it allocates, on Torch's current
    stream; a repeated call finds the plan in the cache and packs nothing again."""
    torch = pytest.importorskip("torch")
    from nvdispatch.integrations import torch_activation_grad as one_pass

    driver = stand_in_launcher(monkeypatch)
    packs = []
    counted = cuda_numba_launch.step_parameters
    monkeypatch.setattr(cuda_numba_launch, "step_parameters", lambda step: packs.append(step) or counted(step))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 0xABC}))
    m, n = 70, 12
    g = torch.randn(m, n).to(torch.bfloat16)
    saved = {"relu": torch.relu(g), "gelu": g.clone(), "none": None}.get(kind)
    if kind == "relu_bits":
        saved = torch.zeros(_mask_shape(m, n), dtype=torch.uint8)
    plan_cache.clear()
    try:
        for _ in range(2):
            dz, db = one_pass.activation_backward(kind, g, saved)
            assert db.shape == (n,) and db.dtype == torch.bfloat16
            assert (dz is None) if kind == "none" else (dz.shape == g.shape and dz.dtype == torch.bfloat16)
            (f1, _, _, _, s1, pass_values), (f2, _, _, _, s2, sums_values) = driver.calls[-2:]
            assert s1 == s2 == 0xABC
            column_pass, column_sums = plan_cache.peek(
                executor.key(kind, m, n, _mask_shape(m, n) if kind == "relu_bits" else None, 0)
            ).launcher.steps
            gp = g.data_ptr()
            partials_ptr = int.from_bytes(sums_values[32:40], "little")  # the sums kernel's first array's data
            pointers = [gp, gp if saved is None else saved.data_ptr(), gp if dz is None else dz.data_ptr(),
                        partials_ptr, db.data_ptr()]  # fmt: skip
            arrays = _operands(kind, m, n)
            assert pass_values == received(numba_abi_parameters(column_pass, pointers, arrays)[0], driver.sizes_of[f1])
            assert sums_values == received(numba_abi_parameters(column_sums, pointers, arrays)[0], driver.sizes_of[f2])
        assert len(driver.calls) == 4 and len(packs) == 2
    finally:
        plan_cache.clear()
