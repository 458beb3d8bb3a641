"""cuBLASLt algorithm autotuning that persists.

``Matmul.autotune()`` on a cuBLASLt plan times, on the caller's operands and stream (CUDA events):

* the heuristic's top candidates (``limit``, default :data:`CANDIDATES`) at the plan's workspace limit,
* the heuristic's answers at smaller workspace limits (4 MiB, none) — other kernels, often other split-K
  choices,
* split-K variants (2, 4, 8, 16 slices, reduced in the compute type) of the first few candidates, each
  validated with ``cublasLtMatmulAlgoCheck`` (Hopper kernels that take no split-K are skipped),

and keeps the fastest. The choice is recorded in the plan cache under a key holding the GPU (name and compute
capability), the driver, the cuBLASLt version and the problem, so ``plan_cache.save()``/``load()`` carry it
to another process on an identical machine and nowhere else: cuBLASLt documents its algorithm structure as
serialisable for the same library version. Any later plan for the same problem — a stateless ``matmul``
call included — starts with the recorded algorithm after one ``cublasLtMatmulAlgoCheck``, and without timing.
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Callable

__all__ = ["environment", "fingerprint", "tuning_key", "candidates", "autotune", "saved_choice", "record", "CANDIDATES"]

#: candidates the heuristic is asked for when autotuning
CANDIDATES = 8
_SPLITK = (2, 4, 8, 16)
_SPLITK_OF_FIRST = 3
_SMALLER_WORKSPACES = (4 << 20, 0)

# cublasLtMatmulAlgoConfigAttributes_t
_CONFIG_SPLITK_NUM = 2
_CONFIG_REDUCTION_SCHEME = 3
_REDUCTION_COMPUTE_TYPE = 2


@functools.lru_cache(maxsize=16)
def environment(device_index: int) -> dict:
    """``{"gpu", "cc", "driver", "cublaslt"}`` of ``device_index`` (what a tuned algorithm depends on)."""
    from . import cublaslt, runtime

    rt = runtime.cudart()
    prop = runtime.check(rt.cudaGetDeviceProperties(device_index), "cudaGetDeviceProperties")
    name = prop.name
    name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    name = name.split("\x00", 1)[0].strip()
    driver = runtime.check(rt.cudaDriverGetVersion(), "cudaDriverGetVersion")
    return {
        "gpu": name,
        "cc": f"{prop.major}.{prop.minor}",
        "driver": int(driver),
        "cublaslt": int(cublaslt.version()),
    }


def compute_capability(device_index: int) -> tuple[int, int]:
    major, minor = environment(device_index)["cc"].split(".")
    return int(major), int(minor)


def fingerprint(device_index: int) -> str:
    env = environment(device_index)
    return f"{env['gpu']} (cc {env['cc']}), driver {env['driver']}, cuBLASLt {env['cublaslt']}"


def tuning_key(plan) -> tuple:
    """Where a plan's tuned algorithm is recorded: machine fingerprint + plan kind + problem."""
    return ("cublaslt-algo", fingerprint(plan.device_index), type(plan).__name__, plan.strategy, plan.problem)


# -- cuBLASLt entry points beyond the plan's ------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _fns():
    from . import cublaslt as lt

    L = lt.lib()
    vp = ctypes.c_void_p
    cfg = L.cublasLtMatmulAlgoConfigSetAttribute
    cfg.argtypes = [ctypes.POINTER(lt.Algo), ctypes.c_int, vp, ctypes.c_size_t]
    cfg.restype = ctypes.c_int
    check = L.cublasLtMatmulAlgoCheck
    check.argtypes = [vp, vp, vp, vp, vp, vp, ctypes.POINTER(lt.Algo), ctypes.POINTER(lt.HeuristicResult)]
    check.restype = ctypes.c_int
    return cfg, check


def _check(core, handle: int, algo) -> object | None:
    """``cublasLtMatmulAlgoCheck``: a HeuristicResult (workspace size filled in) or None when it does not fit."""
    from . import cublaslt as lt

    _, check = _fns()
    result = lt.HeuristicResult()
    status = check(
        handle, core.desc.ptr, core.a.ptr, core.b.ptr, core.c.ptr, core.d.ptr, ctypes.byref(algo), ctypes.byref(result)
    )
    if status != 0 or result.state != 0:
        return None
    result.algo = algo
    return result


def _key(result) -> tuple[int, ...]:
    return tuple(int(x) for x in result.algo.data)


def candidates(core, handle: int, limit: int = CANDIDATES) -> list[tuple[str, object]]:
    """``[(label, HeuristicResult)]``: heuristic answers at several workspace limits, then split-K variants."""
    from . import cublaslt as lt

    out: list[tuple[str, object]] = []
    seen: set[tuple[int, ...]] = set()

    def add(label, r):
        k = (_key(r), int(r.workspaceSize))
        if k not in seen:
            seen.add(k)
            out.append((label, r))

    for i, r in enumerate(core.algorithms(handle, 256, limit)):
        add(f"heuristic #{i}", r)
    for ws in _SMALLER_WORKSPACES:
        if ws >= core.max_workspace:
            continue
        pref = lt.Preference(ws, 256)
        for i, r in enumerate(lt.heuristic(handle, core.desc, core.a, core.b, core.c, core.d, pref, limit)):
            add(f"heuristic #{i} (workspace <= {ws >> 20} MiB)", r)
    cfg, _ = _fns()
    first = [r for _, r in out[:_SPLITK_OF_FIRST]]
    for i, r in enumerate(first):
        for slices in _SPLITK:
            algo = lt.Algo()
            ctypes.memmove(ctypes.byref(algo), ctypes.byref(r.algo), ctypes.sizeof(algo))
            v, scheme = ctypes.c_uint32(slices), ctypes.c_uint32(_REDUCTION_COMPUTE_TYPE)
            if cfg(ctypes.byref(algo), _CONFIG_SPLITK_NUM, ctypes.byref(v), 4) != 0:
                break
            if cfg(ctypes.byref(algo), _CONFIG_REDUCTION_SCHEME, ctypes.byref(scheme), 4) != 0:
                break
            checked = _check(core, handle, algo)
            if checked is not None and checked.workspaceSize <= core.max_workspace:
                add(f"heuristic #{i} split-K {slices}", checked)
    return out


#: launches per timed sample, queued behind a GPU busy-wait so host overhead never shows in the GPU time
_BURST = 5
#: seconds of that busy-wait
_HOLD_SECONDS = 2e-3


def _busy_wait(stream: int, device_index: int, seconds: float) -> bool:
    """Hold ``stream`` busy on the GPU for about ``seconds`` (Torch's sleep kernel), so launches queued after
    it run back to back; False where Torch is not available (then samples include host gaps)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            return False
    dev = torch.device("cuda", device_index)
    with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=dev)):
        torch.cuda._sleep(max(int(seconds * 2e9), 1))  # clock cycles at ~2 GHz (longer on slower clocks)
    return True


def _on_torch_current_stream(launch, stream: int, device_index: int, iterations: int) -> float | None:
    """Median GPU seconds timed with Torch's own events and busy-wait on Torch's current stream (the common
    case of autotune), else None. On the H200 the raw-handle form below let the host's per-launch time show for
    kernels of 7-17 us (timed at ~36 us; cause not found) while this form, the benchmarks', timed them right."""
    import statistics
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    current = torch.cuda.current_stream(device_index)
    if int(current.cuda_stream) != int(stream):
        return None
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    with torch.cuda.device(device_index):
        for _ in range(max(1, iterations)):
            torch.cuda._sleep(int(_HOLD_SECONDS * 2e9))  # clock cycles at ~2 GHz
            start.record(current)
            for _ in range(_BURST):
                launch()
            stop.record(current)
            stop.synchronize()
            samples.append(start.elapsed_time(stop) * 1e-3 / _BURST)
    return float(statistics.median(samples))


def gpu_seconds(launch: Callable[[], None], stream: int, device_index: int, iterations: int = 3) -> float:
    """Median GPU seconds of ``launch()`` (queuing work on ``stream``): CUDA events around bursts of
    back-to-back launches queued behind a busy-wait, so small kernels are not timed with the host's gaps."""
    import statistics

    from .runtime import EventTimer, check, cudart

    rt = cudart()
    launch()  # warm-up (and workspace allocation)
    torch_timed = _on_torch_current_stream(launch, stream, device_index, iterations)
    if torch_timed is not None:
        return torch_timed
    with EventTimer() as timer:
        samples = []
        for _ in range(max(1, iterations)):
            _busy_wait(stream, device_index, _HOLD_SECONDS)
            check(rt.cudaEventRecord(timer._start, stream), "cudaEventRecord")
            for _ in range(_BURST):
                launch()
            check(rt.cudaEventRecord(timer._stop, stream), "cudaEventRecord")
            check(rt.cudaEventSynchronize(timer._stop), "cudaEventSynchronize")
            ms = check(rt.cudaEventElapsedTime(timer._start, timer._stop), "cudaEventElapsedTime")
            samples.append(ms * 1e-3 / _BURST)
    return float(statistics.median(samples))


def autotune(plan, launch: Callable[[object], None], stream: int, iterations: int = 3, limit: int = CANDIDATES):
    """Time every candidate of ``plan`` (``launch(result)`` queues one matmul with it on ``stream``); set and
    record the fastest. Returns ``[(label, seconds)]`` (inf for a candidate that failed)."""
    cands = candidates(plan.core, plan.handle, limit)
    original = plan._algo
    times = []
    try:
        for label, r in cands:
            try:
                t = gpu_seconds(lambda r=r: launch(r), stream, plan.device_index, iterations)
            except Exception:  # noqa: BLE001 - an algorithm that fails on these operands is skipped
                t = math.inf
            times.append((label, t))
    except BaseException:  # interrupted: the shared plan keeps the algorithm it had, not a trial one
        plan._algo = original
        raise
    best = min(range(len(cands)), key=lambda i: times[i][1]) if cands else None
    if best is not None and math.isfinite(times[best][1]):
        label, r = cands[best]
        plan._algo = r
        record(plan, r, label, times[best][1])
    else:
        plan._algo = original
    return times


def record(plan, result, label: str = "", seconds: float | None = None) -> dict:
    """Record ``result`` as ``plan``'s tuned algorithm (for later plans and ``plan_cache.save``)."""
    from .._plan_cache import plan_cache

    choice = {
        "env": environment(plan.device_index),
        "data": list(_key(result)),
        "ws": int(result.workspaceSize),
        "label": label,
        "seconds": seconds,
    }
    plan._tuned = choice
    plan_cache.record_tuning(tuning_key(plan), choice)
    return choice


def saved_choice(plan, tuning=None):
    """The recorded algorithm for ``plan`` on this machine (validated by cuBLASLt), else None.

    ``tuning`` is what the plan cache handed the executor for the plan's key (a record of :func:`record`
    saved by an older layout); it is used only when made on this machine.
    """
    from .._plan_cache import plan_cache
    from . import cublaslt as lt

    env = environment(plan.device_index)
    choice = plan_cache.tuning_for(tuning_key(plan))
    if not _usable(choice, env) and _usable(tuning, env):
        choice = tuning
    if not _usable(choice, env):
        return None
    algo = lt.Algo()
    for i, x in enumerate(choice["data"][:8]):
        algo.data[i] = int(x)
    checked = _check(plan.core, plan.handle, algo)
    if checked is None or checked.workspaceSize > plan.core.max_workspace:
        return None
    plan._tuned = choice
    return checked


def _usable(choice, env) -> bool:
    return isinstance(choice, dict) and choice.get("env") == env and isinstance(choice.get("data"), list)
