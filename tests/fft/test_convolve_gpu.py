"""``fft.convolve`` on a GPU: every strategy of the ``"cuda"`` executor against float64 NumPy (c64 and c128,
real and complex signals, one filter row or one per signal), and the timed choice the route makes: what
``explain()`` says, the choice recorded and taken back from a tunings file."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import fft as nfft
from nvdispatch import plan_cache
from nvdispatch._fft_convolve import prepare
from nvdispatch.executors import cuda_fft_convolve as op
from tests.fft.convolve_cases import BEYOND_THE_DEVICE_ENGINE, CASES

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - the gpu marker skips first on GPU-less machines
    pytest.skip("needs torch with CUDA", allow_module_level=True)

RNG = np.random.default_rng(5)


def _signal(rows, n, dtype):
    if np.dtype(dtype).kind == "f":
        return RNG.standard_normal((rows, n)).astype(dtype)
    return (RNG.standard_normal((rows, n)) + 1j * RNG.standard_normal((rows, n))).astype(dtype)


def _filter(shape, dtype):
    return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dtype)


def _complex_of(dtype):
    return np.result_type(np.dtype(dtype), np.complex64)


def _reference(x, h, n):
    if np.dtype(x.dtype).kind == "f":
        return np.fft.irfft(np.fft.rfft(x.astype(np.float64)) * h.astype(np.complex128), n)
    return np.fft.ifft(np.fft.fft(x.astype(np.complex128)) * h.astype(np.complex128))


def _check(got, want, dtype):
    got = got.cpu().numpy() if hasattr(got, "cpu") else np.asarray(got)
    assert got.shape == want.shape and got.dtype == np.dtype(dtype)
    tol = 3e-5 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-11
    assert np.abs(got - want).max() <= tol * np.abs(want).max()


def _run_strategy(strategy, x, h):
    xt, ht = torch.as_tensor(x, device="cuda"), torch.as_tensor(h, device="cuda")
    problem, operands, _ = prepare(xt, ht, None, -1)
    assert strategy in op.strategies(problem), dict(op.refusals(problem)).get(strategy)
    plan = op.plan(problem, strategy)
    try:
        got = plan.execute(operands)
        torch.cuda.synchronize()
        return got, plan
    finally:
        plan.release()


@pytest.mark.parametrize("strategy,rows,n,dtype,filter_rows", CASES)
def test_every_strategy_matches_numpy(strategy, rows, n, dtype, filter_rows):
    x = _signal(rows, n, dtype)
    m = n // 2 + 1 if np.dtype(dtype).kind == "f" else n
    h = _filter((m,) if filter_rows == "one" else (rows, m), _complex_of(dtype))
    got, plan = _run_strategy(strategy, x, h)
    assert plan.strategy == strategy
    _check(got, _reference(x, h, n), dtype)


@pytest.mark.parametrize("rows,n,dtype,filter_rows", BEYOND_THE_DEVICE_ENGINE)
def test_beyond_the_device_engine_every_offered_strategy_matches_numpy(rows, n, dtype, filter_rows):
    """Double-precision signals longer than the device engine's 4096-point blocks: the route offers what its
    rules say (``unfused`` always; ``device-fused`` never), ``explain()`` names why the others are not offered,
    and each strategy offered, and the route's own call, match NumPy."""
    x = _signal(rows, n, dtype)
    m = n // 2 + 1 if np.dtype(dtype).kind == "f" else n
    h = _filter((m,) if filter_rows == "one" else (rows, m), _complex_of(dtype))
    xt, ht = torch.as_tensor(x, device="cuda"), torch.as_tensor(h, device="cuda")
    problem, *_ = prepare(xt, ht, None, -1)
    offered = [s for s in op.strategies(problem) if s != "timed"]
    refused = dict(op.refusals(problem))
    assert "unfused" in offered and "device-fused" not in offered, refused
    assert f"n={n} is not a device-engine length in float64" in refused["device-fused"]
    assert set(offered) | set(refused) == {"device-fused", "four-step", "unfused", "cufft-lto", "cufft-lto-load"}
    want = _reference(x, h, n)
    for strategy in offered:
        got, _ = _run_strategy(strategy, x, h)
        _check(got, want, dtype)
    got = nfft.convolve(xt, ht)
    torch.cuda.synchronize()
    _check(got, want, dtype)
    explained = str(nvdispatch.explain(nfft.convolve, xt, ht))
    assert "not offered: device-fused (n=" in explained and "2..4096" in explained, explained


def test_real_signals_take_the_load_callback_not_the_store_one():
    x, h = _signal(7, 16384, "float32"), _filter(8193, np.complex64)
    problem, *_ = prepare(torch.as_tensor(x, device="cuda"), torch.as_tensor(h, device="cuda"), None, -1)
    strategies = op.strategies(problem)
    assert "cufft-lto" not in strategies and "cufft-lto-load" in strategies, strategies
    assert "cufft-lto-load" in op.lto_convolve_reason(problem)


def test_four_step_with_a_real_filter_and_imaginary_dc():
    n = 16384
    x = _signal(4, n, "float32")
    h = RNG.standard_normal(n // 2 + 1).astype(np.float32)
    got, _ = _run_strategy("four-step", x, h)
    _check(got, _reference(x, h, n), "float32")
    hc = _filter(n // 2 + 1, np.complex64)  # irfft ignores Im(h[0]) and Im(h[n/2]): so must the packed rows
    got, _ = _run_strategy("four-step", x, hc)
    _check(got, _reference(x, hc, n), "float32")


def test_the_route_times_once_records_and_explains():
    """A problem worth timing (64 MiB moved): the first call times the candidates, explain() names the choice
    and the timings, the choice is recorded, and a plan made from a saved file takes it without timing."""
    rows, n = 4096, 1024
    x = torch.as_tensor(_signal(rows, n, np.complex64), device="cuda")
    h = torch.as_tensor(_filter(n, np.complex64), device="cuda")
    before = nvdispatch.explain(nfft.convolve, x, h)
    assert before.strategy == "timed" and "timed choice among" in before.steps[0], str(before)
    got = nfft.convolve(x, h)
    torch.cuda.synchronize()
    _check(got, _reference(x.cpu().numpy(), h.cpu().numpy(), n), np.complex64)
    after = nvdispatch.explain(nfft.convolve, x, h)
    assert after.steps[0].startswith("chose ") and "median us per call" in after.steps[0], str(after)
    assert "unfused" in after.steps[0], str(after)  # the three-kernel form is always timed
    print(after)


def test_a_saved_choice_is_taken_back_without_timing(tmp_path):
    rows, n = 256, 65536
    x = torch.as_tensor(_signal(rows, n, np.complex64), device="cuda")
    h = torch.as_tensor(_filter(n, np.complex64), device="cuda")
    nfft.convolve(x, h)
    chosen = nvdispatch.explain(nfft.convolve, x, h).steps[0]
    path = tmp_path / "tunings.json"
    assert plan_cache.save(path) >= 1
    plan_cache.clear()
    plan_cache.clear_tunings()
    plan_cache.load(path)
    again = nvdispatch.explain(nfft.convolve, x, h)
    assert "by a timing recorded on this machine" in again.steps[0], str(again)
    assert chosen.split(":")[0].removeprefix("chose ") in again.steps[0]
    got = nfft.convolve(x, h)
    torch.cuda.synchronize()
    _check(got[:4], _reference(x[:4].cpu().numpy(), h.cpu().numpy(), n), np.complex64)


def test_explain_after_a_call_whose_plan_the_cache_did_not_keep():
    """A plan the cache does not keep (one over its byte bound, as cuFFT's workspaces at 64 x 2**20 complex128
    are; here caching is off) is released when its call lets go. explain() then plans again and must read the
    steps of the plan it holds (it raised KeyError: 'unfused', reading them from a released timed choice)."""
    rows, n = 256, 11 * 1024  # no device-engine length: the cuFFT strategies only; 46 MB moved
    x, h = _signal(rows, n, np.complex64), _filter(n, np.complex64)
    xt, ht = torch.as_tensor(x, device="cuda"), torch.as_tensor(h, device="cuda")
    kept = plan_cache.maxsize
    plan_cache.maxsize = 0
    try:
        for _ in range(2):  # the first call chooses; the second plans the choice again
            got = nfft.convolve(xt, ht)
            torch.cuda.synchronize()
            _check(got[:4], _reference(x[:4], h, n), np.complex64)
            explained = nvdispatch.explain(nfft.convolve, xt, ht)
            assert explained.strategy == "timed" and explained.steps[0].startswith("chose "), str(explained)
    finally:
        plan_cache.maxsize = kept


def test_timed_convolution_on_a_side_stream_and_small_problems_untimed():
    s = torch.cuda.Stream()
    x = _signal(2048, 4096, np.float32)  # 64 MiB moved: timed, on the side stream
    h = _filter(2049, np.complex64)
    xt, ht = torch.as_tensor(x, device="cuda"), torch.as_tensor(h, device="cuda")
    torch.cuda.synchronize()
    got = nfft.convolve(xt, ht, stream=s)
    s.synchronize()
    _check(got[:8], _reference(x[:8], h, 4096), np.float32)
    small = nvdispatch.explain(nfft.convolve, xt[:4], ht)
    assert small.steps[0].startswith("chose ") and "the model's first" in small.steps[0], str(small)


def test_cupy_operands():
    cupy = pytest.importorskip("cupy")
    x = _signal(8, 65536, np.complex64)
    h = _filter(65536, np.complex64)
    got = nfft.convolve(cupy.asarray(x), cupy.asarray(h))
    assert isinstance(got, cupy.ndarray)
    _check(cupy.asnumpy(got), _reference(x, h, 65536), np.complex64)


@pytest.mark.parametrize(
    "rows,n,dtype", [(2, 1 << 20, "complex64"), (3, 65536, "float32"), (2, 65536, "complex128"), (3, 16384, "float64")]
)
def test_every_four_step_variant_matches_numpy(rows, n, dtype):
    """The configurations the timed choice tries (longer rows; wider column tiles opt in to more shared memory)."""
    from nvdispatch.device.fft_four_step import four_step_variants
    from nvdispatch.executors.cuda_fft_convolve import MOST_FOUR_STEP
    from nvdispatch.executors.cuda_fft_convolve_four_step import FourStepConvolvePlan

    x = _signal(rows, n, dtype)
    m = n // 2 + 1 if np.dtype(dtype).kind == "f" else n
    h = _filter((m,), _complex_of(dtype))
    xt, ht = torch.as_tensor(x, device="cuda"), torch.as_tensor(h, device="cuda")
    problem, operands, _ = prepare(xt, ht, None, -1)
    want = _reference(x, h, n)
    real_dtype = np.dtype(dtype).type(0).real.dtype.name
    for variant in four_step_variants(n, real_dtype, MOST_FOUR_STEP):
        plan = FourStepConvolvePlan(problem, "four-step", variant)
        got = plan.execute(operands)
        torch.cuda.synchronize()
        _check(got, want, dtype)


@pytest.mark.parametrize("rows,n,dtype", [(17, 64, "float32"), (5, 1024, "float64"), (4, 4096, "float32")])
def test_device_fused_pairs_of_real_rows_match_numpy(rows, n, dtype):
    """Two real rows a complex transform, h completed to a Hermitian filter (its imaginary DC ignored)."""
    from nvdispatch.executors.cuda_fft_convolve import FusedConvolvePlan

    x = _signal(rows, n, dtype)
    h = _filter((n // 2 + 1,), _complex_of(dtype))
    h[0] += 1j
    xt, ht = torch.as_tensor(x, device="cuda"), torch.as_tensor(h, device="cuda")
    problem, operands, _ = prepare(xt, ht, None, -1)
    plan = FusedConvolvePlan(problem, "device-fused", pairs=True)
    got = plan.execute(operands)
    torch.cuda.synchronize()
    _check(got, _reference(x, h, n), dtype)
    assert "two real rows" in " ".join(plan.steps)


# -- the prepared launch (cuLaunchKernel from the compiled extension) against Numba's launch -----------------------
# strategy, rows, n, x dtype: small kernels (each compiles for seconds); the real four-step reuses the complex one's
LAUNCH_CASES = [
    ("device-fused", 9, 64, "complex64"),
    ("device-fused pairs", 17, 64, "float32"),
    ("four-step", 5, 2048, "complex64"),
    ("four-step", 3, 2048, "float32"),
    ("unfused", 9, 64, "float32"),  # the multiply between cuFFT's transforms
]


def _launch_plan(strategy, problem):
    from nvdispatch.executors.cuda_fft_convolve import FusedConvolvePlan

    if strategy == "device-fused pairs":
        return FusedConvolvePlan(problem, "device-fused", pairs=True)
    return op.plan(problem, strategy)


@pytest.mark.parametrize("strategy,rows,n,dtype", LAUNCH_CASES)
def test_prepared_launch_matches_numbas_launch_and_numpy(strategy, rows, n, dtype, monkeypatch):
    from nvdispatch.executors import cuda_numba_launch

    x = _signal(rows, n, dtype)
    m = n // 2 + 1 if np.dtype(dtype).kind == "f" else n
    h = _filter((m,), _complex_of(dtype))
    xt, ht = torch.as_tensor(x, device="cuda"), torch.as_tensor(h, device="cuda")
    problem, operands, _ = prepare(xt, ht, None, -1)
    prepared = _launch_plan(strategy, problem)
    assert prepared.launcher.prepared, prepared.launcher.how
    assert "cuLaunchKernel" in " ".join(prepared.steps)
    got = prepared.execute(operands)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()  # the caller's stream is honoured
    with torch.cuda.stream(side):
        got_side = prepared.execute(operands, stream=side)
    side.synchronize()
    monkeypatch.setattr(cuda_numba_launch, "unavailable", lambda: "the test launches by Numba")
    by_numba = _launch_plan(strategy, problem)
    assert not by_numba.launcher.prepared and "by Numba" in by_numba.launcher.how
    want = by_numba.execute(operands)
    torch.cuda.synchronize()
    assert torch.equal(got, want) and torch.equal(got_side, want)  # the same kernels on the same operands
    _check(got, _reference(x, h, n), dtype)


def test_packed_parameters_are_what_numba_prepares():
    """The parameters the prepared launch packs, against Numba's own ``_Kernel._prepare_args`` on device arrays
    at the same addresses (ints as cuda.core passes them: 8 bytes; ctypes scalars: their bytes)."""
    import ctypes
    import struct

    from numba import cuda

    from nvdispatch._cuda.kernel_params import SLOT
    from nvdispatch.device.fft_four_step import FourStepConvolution
    from nvdispatch.device.kernel_steps import ArrayArg
    from nvdispatch.executors.cuda_numba_launch import step_parameters

    engine = FourStepConvolution(2048, "float32", True)
    engine.compile(np.complex64)
    steps = engine.steps(3, np.float32, np.complex64)
    shapes = {}
    for step in steps:
        for a in step.args:
            if isinstance(a, ArrayArg):
                shapes[a.operand] = max(shapes.get(a.operand, 0), a.size * a.itemsize)
    buffers = {i: cuda.device_array(nbytes, np.uint8) for i, nbytes in shapes.items()}
    pointers = {i: b.device_ctypes_pointer.value for i, b in buffers.items()}
    for step in steps:
        argtypes = step.argument_types()
        kernel = step.dispatcher.compile(argtypes)
        values = [
            cuda.from_cuda_array_interface(
                {"shape": a.shape, "strides": None, "typestr": a.dtype.str, "data": (pointers[a.operand], False),
                 "version": 3}, owner=buffers[a.operand], sync=False)
            if isinstance(a, ArrayArg) else a
            for a in step.args
        ]  # fmt: skip
        kernelargs = []
        for t, v in zip(argtypes, values):
            kernel._prepare_args(t, v, 0, [], kernelargs)
        numba_bytes = b"".join(
            struct.pack("<q", v) if isinstance(v, int) else bytes(v) + bytes(SLOT - ctypes.sizeof(v))
            for v in kernelargs
        )
        packed, patches = step_parameters(step)
        ours = bytearray(packed.values)
        for param, operand in patches:
            struct.pack_into("<Q", ours, SLOT * param, pointers[operand])
        assert bytes(ours) == numba_bytes
        assert packed.sizes == tuple(8 if isinstance(v, int) else ctypes.sizeof(v) for v in kernelargs)
