"""Autotuning a plan on scratch buffers (nvdispatch/_cuda/lt_scratch_autotune.py) against a fake CUDA runtime that
keeps device memory in host bytes: a buffer per operand and output of the problem's spans, filled with finite
values that are not all zeros, launches on a private stream with the trial algorithm, and everything given back
(buffers, the stream's workspace, the stream, the current device) also when timing fails."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

from nvdispatch._cuda import lt_autotune, lt_scratch_autotune, runtime
from nvdispatch._cuda.lt_scratch_autotune import autotune_on_scratch, pattern
from nvdispatch._cuda.lt_setup import setup
from nvdispatch._detect import Device
from nvdispatch.integrations.jax_matmul_kernel import MatmulCall, _device_problem


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "complex64", "uint8"])
def test_the_pattern_is_finite_and_not_zero(dtype):
    got = pattern(dtype, 4099, seed=3)
    assert len(got) == 4099
    if dtype == "bfloat16":
        values = (np.frombuffer(got[:4098], np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        dt = np.dtype(dtype)
        values = np.frombuffer(got[: len(got) // dt.itemsize * dt.itemsize], dt)
    assert np.isfinite(values).all() if values.dtype.kind in "fc" else True
    assert np.count_nonzero(values) > 0.9 * values.size
    if values.dtype.kind in "fc":  # real and imaginary parts in [-1, 1)
        assert np.abs(values.view(values.real.dtype)).max() <= 1


class FakeDevice:
    """cudart as far as the scratch tuner uses it; device memory as host bytes."""

    cudaMemcpyKind = SimpleNamespace(cudaMemcpyHostToDevice="H2D", cudaMemcpyDeviceToDevice="D2D")

    def __init__(self):
        self.memory: dict[int, bytearray] = {}
        self.device, self.streams, self.destroyed, self.next = 1, [], [], 1 << 20

    def allocation(self, ptr):
        for base, mem in self.memory.items():
            if base <= ptr < base + len(mem):
                return base, mem
        raise AssertionError(f"{ptr:#x} is no allocation")

    def malloc_async(self, nbytes, stream):
        assert stream in self.streams
        ptr, self.next = self.next, self.next + ((nbytes + 511) // 256) * 256
        self.memory[ptr] = bytearray(nbytes)
        return ptr

    def free_async(self, ptr, stream):
        del self.memory[ptr]

    def cudaSetDevice(self, device):
        self.device = device
        return (0,)

    def cudaStreamCreateWithFlags(self, flags):
        self.streams.append(1000 + len(self.streams))
        return (0, self.streams[-1])

    def cudaStreamDestroy(self, stream):
        self.destroyed.append(stream)
        return (0,)

    def cudaStreamSynchronize(self, stream):
        return (0,)

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):
        base, mem = self.allocation(dst)
        if kind == "H2D":
            data = ctypes.string_at(src, nbytes)
        else:
            sbase, smem = self.allocation(src)
            data = bytes(smem[src - sbase : src - sbase + nbytes])
        assert dst - base + nbytes <= len(mem)
        mem[dst - base : dst - base + nbytes] = data
        return (0,)


class FakePlan:
    def __init__(self, problem):
        self.problem = problem
        self.setup = setup(problem, "row")
        self.device_index = 0
        self.launch = SimpleNamespace(algo="heuristic #0", workspaces={})
        self.launched = []

    def execute_into(self, pointers, outputs, stream, alpha, beta):
        self.launch.workspaces.setdefault(stream, SimpleNamespace(release=lambda: self.launched.append("released")))
        self.launched.append((self.launch.algo, dict(pointers), dict(outputs), stream, alpha, beta))


@pytest.fixture
def device(monkeypatch):
    fake = FakeDevice()
    monkeypatch.setattr(runtime, "cudart", lambda: fake)
    monkeypatch.setattr(runtime, "check", lambda result, what: result[1] if len(result) > 1 else None)
    monkeypatch.setattr(runtime, "current_device", lambda: fake.device)
    monkeypatch.setattr(runtime, "malloc_async", fake.malloc_async)
    monkeypatch.setattr(runtime, "free_async", fake.free_async)
    monkeypatch.setattr(lt_scratch_autotune, "_PATTERN_BYTES", 1000)  # several doubling copies
    return fake


def _plan(m=33, n=40, k=17):
    call = MatmulCall(epilog="RELU_AUX_BIAS")
    arrays = {"a": jnp.ones((m, k)), "b": jnp.ones((k, n)), "bias": jnp.ones((1, n))}
    problem = _device_problem(call, call.options, arrays, {"a": (), "b": (), "bias": ()}, Device("cuda", 0))
    return FakePlan(problem)


def test_candidates_run_on_filled_buffers_of_the_problem_and_all_is_given_back(device, monkeypatch):
    plan = _plan()
    seen = {}

    def autotune(plan_, launch, stream, iterations, limit, **bounds):
        seen.update(stream=stream, iterations=iterations, limit=limit, bounds=bounds)
        seen["contents"] = {base: bytes(mem) for base, mem in device.memory.items()}
        launch("candidate 1")
        launch("candidate 2")
        return [("candidate 1", 2.0), ("candidate 2", 1.0)]

    monkeypatch.setattr(lt_autotune, "autotune", autotune)
    got = autotune_on_scratch(plan, 2.0, None, iterations=4, max_candidates=9, budget=1.5)
    assert got == [("candidate 1", 2.0), ("candidate 2", 1.0)]
    (stream,) = device.streams
    assert seen["stream"] == stream and seen["iterations"] == 4 and seen["limit"] == 8
    check = seen["bounds"].pop("check")  # the winner's result is checked on the scratch output
    assert isinstance(check, lt_autotune.ResultSample) and check.shape == (33, 40)
    assert seen["bounds"] == {"max_candidates": 9, "budget": 1.5, "busy_wait": seen["bounds"]["busy_wait"]}
    (first, pointers, outputs, on, alpha, beta), (second, *_), released = plan.launched
    assert (first, second, on, alpha, beta, released) == ("candidate 1", "candidate 2", stream, 2.0, None, "released")
    sizes = {name: len(seen["contents"][ptr]) for name, ptr in {**pointers, **outputs}.items()}
    assert sizes == {"a": 33 * 17 * 4, "b": 17 * 40 * 4, "bias": 40 * 4, "out": 33 * 40 * 4,
                     "relu_aux": plan.setup.n_lt * plan.setup.aux_ld // 8}
    for name in ("a", "b", "bias"):
        values = np.frombuffer(seen["contents"][pointers[name]], np.float32)
        assert np.isfinite(values).all() and np.count_nonzero(values) == values.size
        head = np.frombuffer(pattern("float32", 1000, seed=("a", "b", "bias").index(name)), np.float32)
        tiled = np.resize(head, values.size)  # the pattern repeated up to the buffer's size
        np.testing.assert_array_equal(values, tiled)
    assert not device.memory and device.destroyed == [stream] and device.device == 1  # all given back
    assert plan.launch.workspaces == {}


def test_a_failure_gives_everything_back_and_raises(device, monkeypatch):
    plan = _plan()

    def autotune(plan_, launch, stream, iterations, limit, **bounds):
        launch("candidate 1")
        raise RuntimeError("cublasLtMatmul failed")

    monkeypatch.setattr(lt_autotune, "autotune", autotune)
    with pytest.raises(RuntimeError, match="cublasLtMatmul failed"):
        autotune_on_scratch(plan)
    assert not device.memory and device.destroyed == device.streams and device.device == 1
    assert plan.launch.workspaces == {}
