"""The XLA FFI route of a staged GPU matmul: nvdispatch's cuBLASLt plan called by XLA as a compiled handler.

A matmul staged into a JAX program runs on the GPU by one of two routes, chosen when the program is traced:

``"ffi"``
    The extension's XLA FFI handler (``_hotpath_ffi.c``), registered as the target ``nvdispatch_lt_matmul`` for
    the CUDA platform and staged with :func:`jax.ffi.ffi_call`. The plan is made while tracing, for each GPU
    JAX sees; the C plan table gets an entry per device (its own descriptors, the algorithm for each operand
    alignment, the host scalars) and the call carries the entry's id as its ``plan`` attribute. XLA calls the
    handler with its buffers and stream; no Python runs and the GIL is not taken. cuBLASLt's workspace (the
    plan's cap, ``preferences.max_workspace_bytes``) is one more result of the call, which XLA allocates and
    reuses like any temporary.
``"ffi-graphs"``
    The same handler declared compatible with XLA's command buffers (target ``nvdispatch_lt_matmul_graphs``):
    XLA may capture the call into the CUDA graphs it runs a program's kernels in, and replay it without calling
    the handler (a launch depends on the plan and the buffers only).
``"callback"``
    :func:`jax.experimental.buffer_callback` (:mod:`.jax_buffers`): Python runs on every call, on XLA's thread.

``NVDISPATCH_JAX_ROUTE`` (``auto``, the default; ``ffi``; ``ffi-graphs``; ``callback``) or :func:`jax_route`
decides (the block's route is part of JAX's trace cache key: a function called under another route is traced
again): ``auto`` takes ``ffi-graphs`` where the extension was built with the handler, this JAX has
:mod:`jax.ffi`, the handler registered (XLA accepts its API version) and JAX has a GPU in this process; else
``callback``, and :func:`route` says why. ``ffi``/``ffi-graphs`` asked for where they are not available is an
error at trace time. The CPU branch of a staged call always runs its host kernel.

A plan made while tracing is autotuned then, as XLA tunes its own GEMMs (:mod:`.jax_autotune`), before its
entries are set. Plan entries live as long as the process (a compiled program may keep an id that long);
autotuning a plan later (``plan.autotune``) reaches the entries made from it, within the workspace reserved when
it was traced (a launch XLA captured into a command buffer keeps the algorithm it was recorded with until XLA
records the call again).

The two FFI routes of one problem share its entry (the target is not part of the entry's key): ``ffi`` and
``ffi-graphs`` queue the same ``cublasLtMatmul`` (descriptors, algorithm, workspace), and a difference in their
timings is XLA's, not the launch's. :func:`launch_records` says what each entry's launches did (how many the
handler queued, how many under CUDA-graph capture with :func:`count_captured_launches`, the last one's algorithm
and workspace), for probes (``benchmarks/probes/jax_ffi_routes.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from .._compiled import hotpath
from .._cuda import cublaslt as lt
from .._cuda.lt_setup import output_layouts, setup
from .._plan_cache import plan_cache
from .._route import log
from ..errors import ExecutorUnavailableError
from ._settings import block_or_env, setting_block, trace_key
from .jax_autotune import tune_staged
from .jax_buffers import PlanFinder
from .jax_matmul_shapes import check_orientation

__all__ = [
    "TARGET",
    "TARGET_GRAPHS",
    "ROUTES",
    "FFI_ROUTES",
    "route",
    "asked_route",
    "jax_route",
    "gpu_ordinals",
    "stage_matmul",
    "staged_plans",
    "launch_records",
    "count_captured_launches",
]

#: the FFI target names of the handler: outside XLA's command buffers, and compatible with them
TARGET = "nvdispatch_lt_matmul"
TARGET_GRAPHS = "nvdispatch_lt_matmul_graphs"
ROUTES = ("auto", "ffi", "ffi-graphs", "callback")
FFI_ROUTES = ("ffi", "ffi-graphs")

#: codes of the C plan table (``_hotpath_ffi.c``): what each operand / result buffer is to the launch
_INPUT_ROLES = {"a": 0, "b": 1, "c": 2, "bias": 3, "relu_aux": 4, "gelu_aux": 4}
#: a bias gradient (BGRADA/BGRADB, or DRELU_BGRAD/DGELU_BGRAD's) is what cuBLASLt writes through the bias pointer
_OUTPUT_ROLES = {
    "out": 0,
    "relu_aux": 1,
    "gelu_aux": 1,
    "bgrada": 2,
    "bgradb": 2,
    "drelu_bgrad": 2,
    "dgelu_bgrad": 2,
}

_asked: contextvars.ContextVar[str | None] = contextvars.ContextVar("nvdispatch_jax_route", default=None)
#: the block's route in JAX's trace cache key: a function jitted earlier is traced again under another route
_trace_key = trace_key()


def asked_route() -> str:
    """The route asked for: :func:`jax_route`'s inside its block, else ``NVDISPATCH_JAX_ROUTE`` (``"auto"``)."""
    return block_or_env(_asked, "NVDISPATCH_JAX_ROUTE", "auto", ROUTES)


@contextlib.contextmanager
def jax_route(name: str) -> Iterator[None]:
    """Within the block, matmuls staged into JAX programs traced there take route ``name`` on the GPU
    (``"auto"``, ``"ffi"``, ``"ffi-graphs"`` or ``"callback"``; see the module docstring). The route is part of
    JAX's trace cache key: a function jitted earlier and called in the block is traced again on it; a compiled
    program (``jax.jit(f).lower(...).compile()``) keeps the route it was traced with.

    Examples
    --------
    >>> from nvdispatch.integrations.jax_ffi import jax_route, route
    >>> with jax_route("callback"):
    ...     route()[0]
    'callback'
    """
    with setting_block(_asked, "name", name, ROUTES, _trace_key):
        yield


def route() -> tuple[str, str]:
    """``(route, why)``: the route a GPU matmul staged now takes (``"ffi-graphs"``, ``"ffi"`` or ``"callback"``)
    and why.

    Raises :class:`~nvdispatch.errors.ExecutorUnavailableError` where ``"ffi"`` is asked for and not available."""
    asked = asked_route()
    if asked == "callback":
        return "callback", "asked for (NVDISPATCH_JAX_ROUTE or jax_route)"
    missing = _unavailable()
    if missing is None:
        graphs = " (command-buffer compatible)" if asked in ("auto", "ffi-graphs") else ""
        return (
            "ffi-graphs" if asked == "auto" else asked
        ), f"the extension's XLA FFI handler is registered for CUDA{graphs}"
    if asked in FFI_ROUTES:
        raise ExecutorUnavailableError("jax", "nvdispatch's XLA FFI handler (NVDISPATCH_JAX_ROUTE=ffi)", missing)
    return "callback", missing


def _unavailable() -> str | None:
    """Why the FFI route cannot be taken in this process; None where it can."""
    if not _jax_gpus():  # first: JAX's GPU backend is up before the handler is registered with it
        return "JAX has no GPU in this process (the GPU branch is traced but not run here)"
    return _registration()


@functools.lru_cache(maxsize=1)
def _registration() -> str | None:
    """Register the handler for CUDA once; None when it is registered, else why not."""
    compiled = hotpath()
    if compiled is None:
        return "nvdispatch's C extension is not built (or NVDISPATCH_PURE_PYTHON is set)"
    built, major, minor = compiled.ffi_info()
    if not built:
        return "the C extension was built without jaxlib's XLA FFI header (no jaxlib where it was built)"
    ffi = getattr(jax, "ffi", None)
    if ffi is None or not hasattr(ffi, "ffi_call") or not hasattr(ffi, "register_ffi_target"):
        return f"jax {jax.__version__} has no jax.ffi.ffi_call"
    try:
        for target, kind in ((TARGET, "gpu"), (TARGET_GRAPHS, "gpu-graphs")):
            ffi.register_ffi_target(target, compiled.ffi_handler(kind), platform="CUDA", api_version=1)
    except Exception as exc:  # noqa: BLE001 - XLA's refusal (an API version it does not serve) says why
        return f"XLA refused the handler (built for XLA FFI API {major}.{minor}): {type(exc).__name__}: {exc}"
    log.debug(
        "jax: XLA FFI handlers %r, %r registered for CUDA (XLA FFI API %d.%d)", TARGET, TARGET_GRAPHS, major, minor
    )
    return None


def gpu_ordinals() -> tuple[int, ...]:
    """The CUDA ordinals of the GPUs JAX has in this process (a staged call is planned for each)."""
    return _jax_gpus()


@functools.lru_cache(maxsize=1)
def _jax_gpus() -> tuple[int, ...]:
    """The CUDA ordinals of the GPUs JAX has in this process."""
    try:
        devices = jax.local_devices(backend="gpu")
    except RuntimeError:
        return ()
    ordinals = (getattr(d, "local_hardware_id", None) for d in devices)
    return tuple(sorted(int(d.id if o is None else o) for d, o in zip(devices, ordinals)))


# -- the plan table ------------------------------------------------------------------------------------------------
class _Registry:
    """Plan groups registered with the C table, by what they launch; held for the process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.groups: dict[Any, tuple[int, int]] = {}  # key -> (id, reserved workspace bytes)
        self.plans: list[Any] = []
        self.entries: list[tuple[int, int, str]] = []  # (id, device, the problem) per entry of the C table

    def group(self, key, make: Callable[[int], int]) -> tuple[int, int]:
        with self.lock:
            got = self.groups.get(key)
            if got is None:
                plan_id = hotpath().ffi_new_plan()
                got = self.groups[key] = (plan_id, make(plan_id))
            return got


_registry = _Registry()


def staged_plans() -> list:
    """The plans whose launches XLA FFI calls of this process run (e.g. to autotune them: the calls follow)."""
    with _registry.lock:
        return list(_registry.plans)


def _register_device(plan_id: int, device: int, plan, alpha, beta, inputs, outputs) -> int:
    """The C table's entry of ``plan`` for ``device``; returns the workspace it may use (bytes)."""
    launch = plan.external_launch(alpha, beta)
    core = launch.core
    # the plan's workspace cap, as XLA reserves for its own GEMMs: an algorithm autotune picks later fits too
    reserved = max([ws for _, _, ws in launch.algorithms] + [getattr(core, "max_workspace", 0), 1])
    ints = (
        lt.address("cublasLtMatmul"),
        lt.address("cublasLtMatmulDescSetAttribute"),
        launch.handle,
        core.desc.ptr,
        core.a.ptr,
        core.b.ptr,
        core.c.ptr,
        core.d.ptr,
        launch.alpha,
        launch.beta,
        int(launch.a_first),
        lt.DESC_BIAS_POINTER,
        lt.DESC_EPILOGUE_AUX_POINTER,
    )
    hotpath().ffi_set_plan(plan_id, device, ints, inputs, outputs, launch.algorithms, launch.keep)

    def follow(changed) -> None:  # autotune: the new algorithm where it fits the workspace reserved
        algorithms = tuple(a for a in changed.external_algorithms() if a[2] <= reserved)
        if algorithms:
            hotpath().ffi_set_algorithms(plan_id, device, algorithms)
        else:
            log.debug("jax: plan %d keeps its algorithm (the new one needs more workspace than reserved)", plan_id)

    plan.algorithm_listeners.append(follow)
    _registry.plans.append(plan)
    _registry.entries.append((plan_id, device, str(plan.problem)))
    return reserved


def launch_records() -> list[dict]:
    """What the launches of each entry of the C plan table did, for probes comparing the routes: per entry its
    ``plan`` id, ``device``, ``problem``, and the handler's record (``_hotpath_ffi.c``): ``calls`` (launches the
    handler queued: a program XLA runs from a captured CUDA graph replays the launch without calling the
    handler), ``captured``/``uncaptured`` (of those, launches on a stream being captured or not, counted while
    :func:`count_captured_launches` is on), and the last launch's ``index`` (of the entry's algorithms, best
    alignment first; -1 before any), ``alignment``, ``algorithm`` (the ``cublasLtMatmulAlgo_t`` bytes),
    ``workspace`` (bytes given to cuBLASLt), ``capacity`` (bytes of the workspace buffer XLA allocated) and
    ``stream``. The ``ffi`` and ``ffi-graphs`` routes of one problem share an entry (the target is not part of
    the entry's key): their calls add up in one record."""
    with _registry.lock:
        entries = list(_registry.entries)
    compiled = hotpath()
    return [{"plan": pid, "device": dev, "problem": problem, **compiled.ffi_launch_record(pid, dev)}
            for pid, dev, problem in entries]


def count_captured_launches(on: bool = True) -> bool:
    """Have every launch of the handler ask the driver whether its stream is being captured into a CUDA graph
    (``cuStreamIsCapturing``; :func:`launch_records`' ``captured``/``uncaptured``), or stop (``on=False``).
    A probe's switch: it costs a driver call per launch. Returns whether the counting is on."""
    from .._cuda.stream_clock import capture_query_address

    address = capture_query_address() if on else None
    hotpath().ffi_set_capture_query(address or 0)
    return address is not None


def stage_matmul(
    problem_for: Callable,
    state,
    alpha,
    beta,
    orientation: str,
    names: tuple[str, ...],
    values,
    graphs: bool = False,
    autotune: str = "off",
) -> tuple:
    """The FFI call of the ``cuda`` executor's plan on ``values`` (operands by ``names``, as cuBLASLt reads them):
    its outputs in :func:`~nvdispatch._cuda.lt_setup.output_layouts`' formats and order. ``problem_for(device,
    shapes)`` builds the plan's problem for a CUDA ordinal and the operands' shapes. Under :func:`jax.vmap` the
    call is staged again on the batched shapes (a batch axis in front of every operand: cuBLASLt's batch).
    ``graphs``: stage the command-buffer compatible target. ``autotune``: the mode a new plan is autotuned
    with (:func:`.jax_autotune.tune_staged`), once per entry."""
    finder = PlanFinder("matmul", state)
    target = TARGET_GRAPHS if graphs else TARGET

    @jax.custom_batching.custom_vmap
    def call(*xs):
        return _staged(finder, target, problem_for, state, alpha, beta, orientation, names, xs, autotune)

    @call.def_vmap
    def _batched(axis_size, in_batched, *xs):
        xs = [x if batched else x[None] for x, batched in zip(xs, in_batched)]
        outs = call(*xs)
        return tuple(outs), (True,) * len(outs)

    return tuple(call(*values))


def _staged(finder: PlanFinder, target: str, problem_for, state, alpha, beta, orientation: str, names, xs,
            autotune: str) -> tuple:
    shapes = {n: tuple(int(d) for d in x.shape) for n, x in zip(names, xs)}
    devices = _jax_gpus()
    problems = {dev: problem_for(dev, shapes) for dev in devices}
    first = problems[devices[0]]
    layouts = output_layouts(first, setup(first, orientation))
    inputs = tuple((_INPUT_ROLES[n], int(np.prod(shapes[n]))) for n in names)
    outputs = tuple((_OUTPUT_ROLES[n], int(np.prod(shape))) for n, (shape, _) in layouts.items())
    key = (tuple(problems.values()), orientation, alpha, beta, state, autotune)

    def make(plan_id: int) -> int:
        reserved = 1
        for dev, problem in problems.items():
            plan, _ = finder.acquire((dev, *shapes.values()), lambda problem=problem: problem, "native")
            try:
                check_orientation(plan, orientation)
                tune_staged(plan, autotune, alpha, beta)
                reserved = max(reserved, _register_device(plan_id, dev, plan, alpha, beta, inputs, outputs))
            finally:
                plan_cache.let_go(plan)
        log.debug("jax: matmul planned for XLA FFI calls as plan %d (%s, devices %s)", plan_id, first, devices)
        return reserved

    plan_id, reserved = _registry.group(key, make)
    results = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in layouts.values()]
    results.append(jax.ShapeDtypeStruct((reserved,), np.uint8))  # cuBLASLt's workspace
    log.debug("jax: matmul staged as XLA FFI call %r of plan %d", target, plan_id)
    outs = jax.ffi.ffi_call(target, results)(*xs, plan=np.int64(plan_id))
    return tuple(outs[:-1])
