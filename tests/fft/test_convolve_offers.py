"""Which strategies the GPU convolution offers, decided on the CPU: the rules read the problem (length,
precision, layout, filter), not the device, so every GPU test case can be checked here before a GPU runs it.

cuFFT is not on this machine: where a rule needs it (whether cuFFT links an LTO callback here) the test stands
in for it, and says so."""

from __future__ import annotations

import pytest

from nvdispatch._adapters import Device, OperandInfo
from nvdispatch._fft_convolve import build_convolve_problem
from nvdispatch._memory import CUDA, TORCH_TENSOR
from nvdispatch.device.fft_config import max_block_size
from nvdispatch.executors import cuda_fft_convolve as op
from tests.fft.convolve_cases import BEYOND_THE_DEVICE_ENGINE, CASES

pytest.importorskip("numba.cuda")

GPU = Device("cuda", 0)
ON_CUDA = frozenset({TORCH_TENSOR, CUDA})
ALL = {"device-fused", "four-step", "unfused", "cufft-lto", "cufft-lto-load"}


@pytest.fixture
def cufft_links_callbacks(monkeypatch):
    """Stands in for a GPU machine: its cuFFT links LTO callbacks (the rule's own answer needs libcufft), and
    Numba compiles for the GPU (the test suite runs Numba's CUDA simulator, which the route declines)."""
    from nvdispatch.executors import cuda_fft_convolve_four_step, cuda_fft_convolve_unfused

    monkeypatch.setattr(op, "lto_reason", lambda problem: None)
    for module in (op, cuda_fft_convolve_four_step, cuda_fft_convolve_unfused):
        monkeypatch.setattr(module, "numba_reason", lambda: None)


def _problem(rows, n, dtype, filter_rows):
    real = dtype.startswith("float")
    m = n // 2 + 1 if real else n
    hdtype = "complex64" if dtype in ("complex64", "float32") else "complex128"
    hshape = (m,) if filter_rows == "one" else (rows, m)
    x = OperandInfo(None, "torch", GPU, dtype, (rows, n), None, memory=ON_CUDA)
    h = OperandInfo(None, "torch", GPU, hdtype, hshape, None, memory=ON_CUDA)
    return build_convolve_problem(x, h, "torch", GPU, None, -1)


@pytest.mark.parametrize("strategy,rows,n,dtype,filter_rows", CASES)
def test_every_gpu_test_case_is_offered(strategy, rows, n, dtype, filter_rows, cufft_links_callbacks):
    """``test_convolve_gpu.py::test_every_strategy_matches_numpy`` runs ``strategy`` on this problem: the route
    must offer it (a case the rules refuse, as 8192-point float64 signals were, fails here, not on a GPU)."""
    problem = _problem(rows, n, dtype, filter_rows)
    assert strategy in op.strategies(problem), dict(op.refusals(problem)).get(strategy)


@pytest.mark.parametrize("rows,n,dtype,filter_rows", BEYOND_THE_DEVICE_ENGINE)
def test_double_precision_beyond_4096_points_has_no_device_fused(rows, n, dtype, filter_rows, cufft_links_callbacks):
    problem = _problem(rows, n, dtype, filter_rows)
    offered = set(op.strategies(problem)) - {"timed"}
    refused = dict(op.refusals(problem))
    assert "device-fused" in refused and "unfused" in offered
    assert refused["device-fused"] == (
        f"n={n} is not a device-engine length in float64 (2**a 3**b 5**c 7**d, 2..{max_block_size('float64')})"
    )
    assert offered | set(refused) == ALL and not offered & set(refused)


@pytest.mark.parametrize(
    "n,dtype,fused",
    [
        (4096, "complex128", True),
        (4096, "float64", True),
        (8192, "complex128", False),
        (8192, "float64", False),
        (16384, "complex128", False),
        (8192, "complex64", True),
        (16384, "complex64", True),
        (16384, "float32", True),
        (32768, "complex64", False),
        (11 * 512, "complex64", False),  # a prime factor above 7
    ],
)
def test_device_fused_follows_the_engines_lengths_per_precision(n, dtype, fused, cufft_links_callbacks):
    """The documented rule: 2**a 3**b 5**c 7**d up to 16384 points in single precision, 4096 in double; the
    device (H100 or H200, both sm_90 with 227 KiB of shared memory) does not enter it."""
    problem = _problem(3, n, dtype, "each")
    assert ("device-fused" in op.strategies(problem)) is fused, op.refusals(problem)
    assert "unfused" in op.strategies(problem)


def test_each_plan_and_the_timed_choice_name_what_is_not_offered(monkeypatch, cufft_links_callbacks):
    """``explain()`` shows a plan's steps: they end with every strategy not offered and why."""
    from nvdispatch._cuda import runtime

    class Plan:
        def __init__(self, problem, name):
            self.strategy, self.steps = name, (f"{name}: its own step", problem.describe())

        def execute(self, operands, stream=None):
            raise AssertionError("explained, not run")

        def release(self):
            pass

    monkeypatch.setattr(op, "_make", Plan)
    monkeypatch.setattr(op, "environment", lambda device_index: {"gpu": "a test GPU"})
    monkeypatch.setattr(op, "_result_check", lambda problem, dev: None)
    monkeypatch.setattr(runtime, "current_device", lambda: 0)
    problem = _problem(5, 8192, "float64", "each")
    wanted = [
        "not offered: device-fused (n=8192 is not a device-engine length in float64 (2**a 3**b 5**c 7**d, 2..4096))",
        "not offered: four-step (h must be one C-contiguous row for all signals)",
        "not offered: cufft-lto (real signals take the load-callback form (cufft-lto-load), not a store callback on "
        "cuFFT's R2C)",
    ]
    one = op.plan(problem, "unfused")
    assert list(one.steps[1:-1]) == wanted and one.steps[-1] == problem.describe()
    timed = op.plan(problem, "timed")  # 1.3 MB moved: the model's first, untimed
    assert timed.steps[0].startswith("chose ") and list(timed.steps[-4:-1]) == wanted
    assert timed.steps[-1] == problem.describe()
    offered = _problem(5, 4096, "complex64", "one")
    assert not [s for s in op.plan(offered, "device-fused").steps if s.startswith("not offered")]
