"""benchmarks/precision_bench.py's JAX timing on the CPU, with stand-ins for Torch's CUDA events and JAX's wait:
each peer's GPU sample is CUDA events on the stream its work runs on, the wall sample long back-to-back runs, the
peers in rotating turns; a GPU sample whose sleep did not outlast the host's queuing is counted as not back to
back; the goal's ratio is on GPU time with wall clock beside; a profiler trace splits into per-peer kernel time
at the markers."""

from __future__ import annotations

import pathlib
import sys
from types import SimpleNamespace

import pytest

BENCH = pathlib.Path(__file__).parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import precision_bench

    return precision_bench


class _Event:
    def __init__(self, log, reached):
        self.log, self.reached = log, reached

    def record(self, stream):
        self.log.append(("record", stream))

    def query(self):
        return self.reached()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 2.0  # ms


def _torch(log, host_waits=lambda: False):
    """Torch's stand-in: events that time 2 ms; ``host_waits()`` says whether the GPU reached the start event
    before the host had queued its calls."""

    class _Stream:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            log.append(("on", self.stream))

        def __exit__(self, *exc):
            log.append(("off", self.stream))

    cuda = SimpleNamespace(
        Event=lambda enable_timing: _Event(log, host_waits),
        stream=_Stream,
        synchronize=lambda: None,
        _sleep=lambda cycles: log.append(("sleep", cycles)),
    )
    return SimpleNamespace(cuda=cuda)


JAX = SimpleNamespace(block_until_ready=lambda x: x)


def test_each_peer_gets_a_wall_and_a_gpu_sample_per_round_in_rotating_turns(bench):
    log: list = []
    calls: list = []
    peers = {name: (lambda name=name: calls.append(name) or name) for name in ("ours", "theirs", "eager")}
    streams = {"ours": "xla", "theirs": "xla", "eager": "legacy"}
    got = bench._jax_in_turns(peers, streams, JAX, _torch(log), rounds=3)
    assert set(got["gpu"]) == set(got["wall"]) == set(peers)
    assert all(len(v) == 3 for v in got["gpu"].values()) and all(len(v) == 3 for v in got["wall"].values())
    n = got["calls"]["ours"]
    gpu_calls = min(n, bench.JAX_GPU_CALLS)  # few: more executions in flight and the host would wait on the GPU
    assert got["gpu"]["ours"] == [pytest.approx(2e-3 / gpu_calls)] * 3  # the events' 2 ms over the sample's calls
    assert got["covered"] == {name: [True] * 3 for name in peers}
    assert bench.JAX_MIN_CALLS <= n <= bench.JAX_MAX_CALLS
    # each GPU sample: the sleep and the start event on the peer's own stream
    recorded = [s for what, s in log if what == "record"]
    assert recorded.count("legacy") == 2 * 3 and recorded.count("xla") == 2 * 2 * 3
    # the order rotates: each round starts with another peer
    starts = []
    for name in calls:
        if not starts or starts[-1] != name:
            starts.append(name)
    assert starts[:3] == ["ours", "theirs", "eager"]  # sizing
    assert "theirs" in starts[3:] and "eager" in starts[3:]


def test_a_gpu_sample_the_host_fell_behind_is_not_counted_back_to_back(bench):
    got = bench._jax_in_turns({"p": lambda: 1}, {"p": "xla"}, JAX, _torch([], host_waits=lambda: True), rounds=2)
    assert got["covered"] == {"p": [False, False]}


def test_no_stream_no_gpu_samples_and_the_ratios_are_walls(bench):
    got = bench._jax_in_turns({"ours": lambda: 1, "peer": lambda: 2}, {}, JAX, _torch([]), rounds=2)
    assert got["gpu"] == {} and len(got["wall"]["ours"]) == 2
    cell = bench._jax_summary(got, ["ours"], "peer", "wall")
    assert cell["basis"] == "wall" and "gpu_samples_back_to_back" not in cell and cell["best_peer"] == "peer"


def test_the_goal_ratio_is_gpu_time_with_wall_beside(bench):
    got = {
        "gpu": {"ours": [1.0, 1.1, 0.9], "peer": [2.0, 2.0, 2.0]},
        "wall": {"ours": [3.0, 3.0, 3.0], "peer": [1.0, 1.0, 1.0]},
        "covered": {"ours": [True, True, False], "peer": [True, True, True]},
        "calls": {"ours": 10, "peer": 12},
    }
    cell = bench._jax_summary(got, ["ours"], "peer", "gpu")
    assert cell["ratio"] == {"ours": 0.5} and cell["per_round_ratio"]["ours"] == [0.5, 0.55, 0.45]
    assert cell["wall"]["ratio"] == {"ours": 3.0}
    assert cell["gpu_samples_back_to_back"] == {"ours": "2/3", "peer": "3/3"}
    assert bench._ratios(cell) == {"ours": 0.5} and bench._ratios(cell, "wall") == {"ours": 3.0}


def test_a_profiler_trace_splits_into_kernel_time_per_peer_at_the_markers(bench):
    def kernel(name, ts, dur):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}

    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::x", "ts": 0, "dur": 99},  # host events are not device time
        kernel("at::cuda::spin_kernel(long)", 1, 1),
        kernel("sm90_gemm_xla", 10, 40), kernel("fusion_relu", 60, 10),
        kernel("sm90_gemm_xla", 100, 40), kernel("fusion_relu", 150, 10),
        kernel("at::cuda::spin_kernel(long)", 200, 1),
        {"ph": "X", "cat": "gpu_memset", "name": "Memset", "ts": 205, "dur": 2},
        kernel("sm90_gemm_lt", 210, 45), kernel("sm90_gemm_lt", 300, 45),
    ]
    got = bench._split_device_time(events, ["xla", "ours"], calls=2)
    assert got["xla"]["seconds"] == pytest.approx(50e-6) and got["xla"]["launches_per_call"] == 2
    assert got["xla"]["kernels"][0] == {"name": "sm90_gemm_xla", "per_call": 1.0, "us_each": pytest.approx(40.0)}
    assert got["ours"]["seconds"] == pytest.approx(46e-6)
    missing = bench._split_device_time(events, ["a", "b", "c"], calls=2)
    assert all("3 peers" in v["error"] for v in missing.values())


def test_the_script_imports_without_a_gpu(bench):
    assert bench.GOAL == 1.0 and "precision_bench" in sys.modules
