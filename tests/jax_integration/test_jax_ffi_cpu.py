"""The XLA FFI handler (src/nvdispatch/_hotpath_ffi.c) run by XLA's CPU backend against cuBLASLt probes that
record their arguments (no GPU needed): XLA accepts its API version, the ``plan`` attribute reaches the entry,
each buffer reaches cuBLASLt in its role, the algorithm follows the buffers' alignment, and what does not fit
the entry is an error XLA raises, not a crash. The route choice (:mod:`nvdispatch.integrations.jax_ffi`) is
checked here too; the handler on the GPU is tested by test_jax_gpu_ffi.py."""

from __future__ import annotations

import ctypes
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nvdispatch
from nvdispatch._compiled import hotpath
from nvdispatch.errors import ExecutorUnavailableError, InvalidArgumentError
from nvdispatch.integrations import jax_ffi

hp = hotpath()
built = hp is not None and hp.ffi_info()[0]
needs_handler = pytest.mark.skipif(not built, reason="the extension is not built with the XLA FFI handler here")

HANDLE, DESC, LA, LB, LC, LD, ALPHA, BETA = 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008
BIAS_ATTR, AUX_ATTR = 8, 11
TARGET = "nvdispatch_probe_matmul"
A, B, C, BIAS, AUX = 0, 1, 2, 3, 4  # the C table's operand roles
D, AUX_OUT, BGRAD = 0, 1, 2  # its result roles


def _algo(tag: int) -> bytes:
    return bytes([tag]) + bytes(63)


ALGOS = ((256, _algo(1), 0), (64, _algo(2), 0), (16, _algo(3), 32))


@pytest.fixture(scope="module")
def target():
    jax.ffi.register_ffi_target(TARGET, hp.ffi_handler("host"), platform="cpu", api_version=1)
    return TARGET


def _plan(inputs, outputs, handle=HANDLE, a_first=False, algos=ALGOS) -> int:
    plan_id = hp.ffi_new_plan()
    ints = (hp.LT_LAUNCH_PROBE, hp.LT_SET_ATTRIBUTE_PROBE, handle, DESC, LA, LB, LC, LD, ALPHA, BETA, int(a_first),
            BIAS_ATTR, AUX_ATTR)  # fmt: skip
    hp.ffi_set_plan(plan_id, 0, ints, inputs, outputs, algos, ("kept",))
    return plan_id


def _call(plan_id, args, results, workspace=64):
    shapes = [jax.ShapeDtypeStruct(s, d) for s, d in results] + [jax.ShapeDtypeStruct((workspace,), np.uint8)]
    fn = jax.jit(lambda *xs: jax.ffi.ffi_call(TARGET, shapes)(*xs, plan=np.int64(plan_id)))
    return jax.block_until_ready(fn(*args))


def _alignment(*pointers: int) -> int:
    mixed = 0
    for p in pointers:
        mixed |= p
    return 256 if mixed % 256 == 0 else mixed & -mixed


@needs_handler
def test_xla_accepts_the_handlers_api_version_which_is_the_headers():
    import jaxlib

    header = os.path.join(os.path.dirname(jaxlib.__file__), "include", "xla", "ffi", "api", "c_api.h")
    if not os.path.isfile(header):
        pytest.skip("jaxlib ships no c_api.h here")
    text = open(header).read()
    major = int(re.search(r"#define XLA_FFI_API_MAJOR (\d+)", text).group(1))
    minor = int(re.search(r"#define XLA_FFI_API_MINOR (\d+)", text).group(1))
    assert hp.ffi_info() == (True, major, minor)
    jax.ffi.register_ffi_target("nvdispatch_probe_version", hp.ffi_handler("host"), platform="cpu", api_version=1)


@needs_handler
@pytest.mark.parametrize("a_first", [False, True])
def test_one_launch_with_each_buffer_in_its_role(target, a_first):
    a, b, bias = jnp.ones((4, 3), jnp.float32), jnp.ones((3, 5), jnp.float32), jnp.ones((5,), jnp.float32)
    plan_id = _plan(((A, 12), (B, 15), (BIAS, 5)), ((D, 20),), a_first=a_first)
    _, count0, _, _ = hp.probe_record()
    _call(plan_id, (a, b, bias), [((4, 5), np.float32)])
    calls, count, attr, _ = hp.probe_record()
    assert count == count0 + 1
    assert (calls[0], calls[1], calls[2], calls[4], calls[6], calls[7], calls[9], calls[11]) == (
        HANDLE, DESC, ALPHA, LA, LB, BETA, LC, LD,
    )  # fmt: skip
    assert calls[8] == calls[10] != 0  # no c: C is D
    assert calls[15] == 0  # the host handler has no stream
    assert attr[:2] == (DESC, BIAS_ATTR) and attr[2] not in (0, calls[3], calls[5], calls[10])
    first, second = calls[3], calls[5]  # cuBLASLt's A and B: our a and b in the entry's order
    assert first != second and 0 not in (first, second)
    # the algorithm for the buffers' alignment, with its workspace size, the workspace XLA allocated
    align = _alignment(calls[3], calls[5], calls[10])
    tag = next(i + 1 for i, (al, _, _) in enumerate(ALGOS) if al <= align)
    assert ctypes.string_at(calls[12], 64) == _algo(tag)
    assert calls[14] == ALGOS[tag - 1][2] and (calls[14] == 0 or calls[13] != 0)


@needs_handler
def test_c_aux_and_bias_gradient_reach_their_pointers(target):
    a, b, c = jnp.ones((4, 3)), jnp.ones((3, 5)), jnp.ones((4, 5))
    aux = jnp.ones((4, 8), jnp.float32)
    plan_id = _plan(((A, 12), (B, 15), (C, 20), (AUX, 32)), ((D, 20), (BGRAD, 5)))
    _call(plan_id, (a, b, c, aux), [((4, 5), np.float32), ((5,), np.float32)])
    calls, _, attr, _ = hp.probe_record()
    assert calls[8] != calls[10]  # C is c, D the result
    assert attr[:2] == (DESC, AUX_ATTR)  # set after the bias (the bias gradient's buffer)
    plan_id = _plan(((A, 12), (B, 15)), ((D, 20), (AUX_OUT, 40)))
    _call(plan_id, (a, b), [((4, 5), np.float32), ((5, 8), np.float32)])
    assert hp.probe_record()[2][:2] == (DESC, AUX_ATTR)


@needs_handler
def test_what_does_not_fit_the_entry_is_an_error_not_a_crash(target):
    a, b = jnp.ones((4, 3)), jnp.ones((3, 5))
    plan_id = _plan(((A, 12), (B, 15)), ((D, 20),))
    with pytest.raises(Exception, match="no cuBLASLt plan"):
        _call(plan_id + 10_000, (a, b), [((4, 5), np.float32)])
    with pytest.raises(Exception, match="not those plan"):
        _call(plan_id, (a, jnp.ones((3, 6))), [((4, 6), np.float32)])
    with pytest.raises(Exception, match="takes 2 operands"):
        _call(plan_id, (a, b, b), [((4, 5), np.float32)])
    small = _plan(((A, 12), (B, 15)), ((D, 20),), algos=((256, _algo(1), 1 << 20),))
    with pytest.raises(Exception, match="workspace"):
        _call(small, (a, b), [((4, 5), np.float32)], workspace=16)
    failing = _plan(((A, 12), (B, 15)), ((D, 20),), handle=13)  # the probe answers status 13
    with pytest.raises(Exception, match="status 13"):
        _call(failing, (a, b), [((4, 5), np.float32)])


@needs_handler
def test_the_handlers_by_kind():
    for kind in ("gpu", "gpu-graphs", "host"):
        assert type(hp.ffi_handler(kind)).__name__ == "PyCapsule"
    with pytest.raises(ValueError, match="gpu-graphs"):
        hp.ffi_handler("tpu")
    with pytest.raises(TypeError):
        hp.ffi_handler(True)


@needs_handler
def test_the_table_checks_what_python_registers():
    plan_id = hp.ffi_new_plan()
    ints = (1,) * 10 + (0, 8, 11)
    with pytest.raises(ValueError, match="64 bytes"):
        hp.ffi_set_plan(plan_id, 0, ints, ((A, 1),), ((D, 1),), ((256, b"short", 0),), ())
    with pytest.raises(ValueError, match="role"):
        hp.ffi_set_plan(plan_id, 0, ints, ((9, 1),), ((D, 1),), ALGOS, ())
    with pytest.raises(ValueError, match="device"):
        hp.ffi_set_plan(plan_id, 99, ints, ((A, 1),), ((D, 1),), ALGOS, ())
    with pytest.raises(TypeError, match="13 ints"):
        hp.ffi_set_plan(plan_id, 0, ints[:5], ((A, 1),), ((D, 1),), ALGOS, ())
    hp.ffi_set_plan(plan_id, 0, ints, ((A, 1),), ((D, 1),), ALGOS, ())
    with pytest.raises(ValueError, match="has an entry"):
        hp.ffi_set_plan(plan_id, 0, ints, ((A, 1),), ((D, 1),), ALGOS, ())
    hp.ffi_set_algorithms(plan_id, 0, ALGOS[:1])
    with pytest.raises(ValueError, match="no entry"):
        hp.ffi_set_algorithms(plan_id, 1, ALGOS)


@needs_handler
def test_the_launch_record_names_the_algorithm_and_workspace_of_each_launch(target):
    """What a probe comparing the routes reads: per entry, the launches the handler queued and the last one's
    algorithm (the entry's pick for the buffers' alignment), workspace and workspace buffer."""
    a, b = jnp.ones((4, 3), jnp.float32), jnp.ones((3, 5), jnp.float32)
    plan_id = _plan(((A, 12), (B, 15)), ((D, 20),))
    empty = hp.ffi_launch_record(plan_id, 0)
    assert (empty["calls"], empty["index"], empty["algorithm"]) == (0, -1, b"")
    answers = []
    query_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))

    @query_type
    def query(stream, status):  # never asked here: the host handler has no stream
        answers.append(stream)
        return 0

    hp.ffi_set_capture_query(ctypes.cast(query, ctypes.c_void_p).value)
    try:
        for n in (1, 2):
            _call(plan_id, (a, b), [((4, 5), np.float32)], workspace=96)
            calls = hp.probe_record()[0]
            record = hp.ffi_launch_record(plan_id, 0)
            align = _alignment(calls[3], calls[5], calls[10])
            index = next(i for i, (al, _, _) in enumerate(ALGOS) if al <= align)
            assert record["calls"] == n and record["index"] == index and record["alignment"] == align
            assert record["algorithm"] == ALGOS[index][1] == ctypes.string_at(calls[12], 64)
            assert record["workspace"] == ALGOS[index][2] == calls[14] and record["capacity"] == 96
            assert record["stream"] == 0 and record["captured"] == record["uncaptured"] == 0
    finally:
        hp.ffi_set_capture_query(0)
    assert answers == []
    with pytest.raises(ValueError, match="no entry"):
        hp.ffi_launch_record(plan_id, 1)


def test_the_route_is_explicit(monkeypatch):
    with jax_ffi.jax_route("callback"):
        assert jax_ffi.route() == ("callback", "asked for (NVDISPATCH_JAX_ROUTE or jax_route)")
    if not jax_ffi._jax_gpus():  # this machine: the GPU branch is traced but never runs
        got, why = jax_ffi.route()
        assert got == "callback" and why
        for name in ("ffi", "ffi-graphs"):
            with jax_ffi.jax_route(name), pytest.raises(ExecutorUnavailableError, match="FFI handler"):
                jax_ffi.route()
    monkeypatch.setenv("NVDISPATCH_JAX_ROUTE", "fast")
    with pytest.raises(InvalidArgumentError, match="NVDISPATCH_JAX_ROUTE"):
        jax_ffi.route()
    with pytest.raises(InvalidArgumentError, match="name"):
        with jax_ffi.jax_route("sometimes"):
            pass


@pytest.mark.skipif(not hasattr(jax, "make_user_context"), reason="this JAX has no user contexts in its trace key")
def test_a_function_jitted_earlier_is_traced_again_under_another_route(monkeypatch):
    monkeypatch.delenv("NVDISPATCH_JAX_ROUTE", raising=False)
    traced = []
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)

    def product(a, b):
        traced.append(jax_ffi.asked_route())
        return nvdispatch.matmul(a, b)

    f = jax.jit(product)
    got = []
    with jax_ffi.jax_route("callback"):
        got += [f(a, b), f(a, b)]  # the second call: JAX's program of the first
    got.append(f(a, b))  # the process's route: traced again
    with jax_ffi.jax_route("callback"):
        got.append(f(a, b))
    assert traced == ["callback", "auto"]
    for y in got:
        np.testing.assert_allclose(np.asarray(y, np.float64), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-6)


# -- the Python side of the route: stage_matmul against a recorder executor and the probes ---------------------------
class _Recorder:
    """A stand-in for the ``cuda`` executor whose plans give probe launches (what ``external_launch`` gives)."""

    name = "cuda"

    def __init__(self):
        self.planned = []

    def decline(self, op, problem, *, coerce=False):
        return None

    def strategies(self, op, problem):
        return ("native",)

    def plan(self, op, problem, strategy, tuning=None):
        from types import SimpleNamespace

        self.planned.append(problem)

        class Plan:
            setup = SimpleNamespace(orientation="row")
            steps = ()
            workspace_bytes = 0
            needs_release = False

            def __init__(self):
                self.algorithm_listeners = []
                self.problem = problem

            def external_algorithms(self):
                return ALGOS

            def external_launch(self, alpha, beta):
                core = SimpleNamespace(**{k: SimpleNamespace(ptr=v) for k, v in
                                          dict(desc=DESC, a=LA, b=LB, c=LC, d=LD).items()})
                return SimpleNamespace(core=core, handle=HANDLE, alpha=ALPHA, beta=BETA, a_first=False,
                                       algorithms=ALGOS, keep=())

            def release(self):
                pass

        return Plan()


_Recorder.__module__ = "nvdispatch.executors.test_recorder"  # one of nvdispatch's own: its plans run unwrapped


@pytest.fixture
def staged(monkeypatch, target):
    """``stage_matmul`` with the recorder as the ``cuda`` executor, JAX's CPU as 'GPU 0' and the probes as
    cuBLASLt: the handler runs on XLA's CPU backend."""
    from types import SimpleNamespace

    from nvdispatch import plan_cache
    from nvdispatch._cuda import cublaslt
    from nvdispatch.integrations import jax_buffers

    rec = _Recorder()
    monkeypatch.setattr(jax_buffers, "builtin", lambda name: rec if name == "cuda" else None)
    monkeypatch.setattr(jax_buffers, "candidates", lambda framework, kind: [SimpleNamespace(executor=rec)])
    monkeypatch.setattr(jax_ffi, "_jax_gpus", lambda: (0,))
    monkeypatch.setattr(jax_ffi, "_registry", jax_ffi._Registry())  # probe entries stay out of real programs
    monkeypatch.setattr(jax_ffi, "TARGET", TARGET)
    monkeypatch.setattr(jax_ffi, "TARGET_GRAPHS", TARGET)
    probes = {"cublasLtMatmul": hp.LT_LAUNCH_PROBE, "cublasLtMatmulDescSetAttribute": hp.LT_SET_ATTRIBUTE_PROBE}
    monkeypatch.setattr(cublaslt, "address", probes.__getitem__)
    plan_cache.clear()
    yield rec
    plan_cache.clear()


def _stage(a, b, bias, alpha=2.0, graphs=False):
    from nvdispatch._detect import Device
    from nvdispatch.integrations.jax_matmul_kernel import MatmulCall, _device_problem

    call = MatmulCall(epilog="RELU_BIAS", alpha=alpha)
    names, views = ("a", "b", "bias"), {"a": (), "b": (), "bias": ()}
    arrays = dict(zip(names, (a, b, bias)))

    def problem_for(dev, shapes):
        return _device_problem(call, call.options, arrays, views, Device("cuda", dev), shapes)

    return jax_ffi.stage_matmul(problem_for, call.state, call.alpha, call.beta, "row", names, (a, b, bias),
                                graphs=graphs)


@needs_handler
def test_stage_matmul_plans_while_tracing_and_xla_calls_the_entry(staged):
    a, b, bias = jnp.ones((6, 3)), jnp.ones((3, 5)), jnp.ones((1, 5))
    f = jax.jit(lambda a, b, bias: _stage(a, b, bias))
    _, count0, _, _ = hp.probe_record()
    (out,) = jax.block_until_ready(f(a, b, bias))  # run before the probe's record is read
    assert out.shape == (6, 5) and out.dtype == jnp.float32
    calls, count, attr, _ = hp.probe_record()
    assert count == count0 + 1 and (calls[0], calls[1], calls[2], calls[7]) == (HANDLE, DESC, ALPHA, BETA)
    assert attr[:2] == (DESC, BIAS_ATTR)
    (problem,) = staged.planned
    assert (problem.m, problem.n, problem.k, problem.device.index) == (6, 5, 3, 0)
    plans = len(jax_ffi.staged_plans())
    jax.clear_caches()
    jax.jit(lambda a, b, bias: _stage(a, b, bias))(a, b, bias)  # traced again: the same entry
    assert len(staged.planned) == 1 and len(jax_ffi.staged_plans()) == plans
    jax.jit(lambda a, b, bias: _stage(a, b, bias, alpha=3.0))(a, b, bias)  # another alpha: another entry
    assert len(jax_ffi.staged_plans()) == plans + 1


@needs_handler
def test_the_graphs_route_launches_the_ffi_routes_entry(staged):
    """A problem staged on "ffi" and on "ffi-graphs" is one entry of the C table: the same descriptors, algorithm
    and workspace, whichever target XLA calls (issue 29: the routes' timings differ by XLA's command buffers,
    not by what cuBLASLt is asked)."""
    a, b, bias = jnp.ones((9, 3)), jnp.ones((3, 5)), jnp.ones((1, 5))
    jax.block_until_ready(jax.jit(lambda a, b, bias: _stage(a, b, bias))(a, b, bias))
    plans = len(jax_ffi.staged_plans())
    (first,) = jax_ffi.launch_records()
    jax.block_until_ready(jax.jit(lambda a, b, bias: _stage(a, b, bias, graphs=True))(a, b, bias))
    assert len(staged.planned) == 1 and len(jax_ffi.staged_plans()) == plans
    (second,) = jax_ffi.launch_records()
    assert (second["plan"], second["device"]) == (first["plan"], first["device"])
    assert (first["calls"], second["calls"]) == (1, 2)
    assert second["problem"] == str(staged.planned[0])
    index = next(i for i, (al, _, _) in enumerate(ALGOS) if al <= second["alignment"])
    assert second["algorithm"] == ALGOS[index][1] and second["workspace"] == ALGOS[index][2]
    assert second["capacity"] == max(ws for _, _, ws in ALGOS)  # the workspace reserved: the largest algorithm's


@needs_handler
def test_stage_matmul_under_vmap_plans_the_batched_call(staged):
    a, b, bias = jnp.ones((4, 6, 3)), jnp.ones((3, 5)), jnp.ones((1, 5))
    (out,) = jax.block_until_ready(jax.jit(jax.vmap(lambda a: _stage(a, b, bias)))(a))
    assert out.shape == (4, 6, 5)
    assert staged.planned[-1].batch_shape == (4,) and hp.probe_record()[0][0] == HANDLE


@needs_handler
def test_autotune_reaches_the_entries_within_their_workspace(staged):
    a, b, bias = jnp.ones((7, 3)), jnp.ones((3, 5)), jnp.ones((1, 5))
    f = jax.jit(lambda a, b, bias: _stage(a, b, bias))
    jax.block_until_ready(f(a, b, bias))  # finished: XLA's CPU may run it beside the next call (one probe record)
    plan = jax_ffi.staged_plans()[-1]
    tuned = ((256, _algo(9), 0), *ALGOS[1:])
    plan.external_algorithms = lambda: tuned
    for listener in plan.algorithm_listeners:
        listener(plan)
    jax.block_until_ready(f(a, b, bias))
    calls = hp.probe_record()[0]
    align = _alignment(calls[3], calls[5], calls[10])
    assert ctypes.string_at(calls[12], 64) == next(algo for al, algo, _ in tuned if al <= align)
    hungry = ((256, _algo(10), 1 << 30), (16, _algo(11), 1 << 30))  # more workspace than the call reserved
    plan.external_algorithms = lambda: hungry
    for listener in plan.algorithm_listeners:
        listener(plan)
    jax.block_until_ready(f(a, b, bias))  # the entry kept the algorithms it had
    calls = hp.probe_record()[0]  # this call's operands may be aligned otherwise: its own pick among them
    align = _alignment(calls[3], calls[5], calls[10])
    assert ctypes.string_at(calls[12], 64) == next(algo for al, algo, _ in tuned if al <= align)


def test_explain_says_which_route_a_staged_matmul_takes():
    import nvdispatch

    a, b = jnp.ones((4, 3)), jnp.ones((3, 2))
    with jax_ffi.jax_route("callback"):
        got = nvdispatch.explain(a, b, epilog="RELU")
    assert got.compiled.startswith("inside jax.jit on a GPU this matmul is staged through the 'callback' route (asked "
                                   "for (NVDISPATCH_JAX_ROUTE or jax_route)); its cuBLASLt algorithm")
    assert f"compiled: {got.compiled}" in str(got)
    assert nvdispatch.explain(np.ones((4, 3)), np.ones((3, 2))).compiled is None  # NumPy: nothing compiled


@pytest.mark.parametrize(
    "compiled, refuse, why",
    [
        (None, False, "extension is not built"),
        ("without", False, "without jaxlib's XLA FFI header"),
        ("with", True, "XLA refused the handler (built for XLA FFI API 0.1): ValueError: incompatible API version"),
    ],
)
def test_where_the_handler_cannot_serve_the_route_is_the_callback_and_says_why(monkeypatch, compiled, refuse, why):
    from types import SimpleNamespace

    fake = None
    if compiled is not None:
        fake = SimpleNamespace(ffi_info=lambda: (compiled == "with", 0, 1), ffi_handler=lambda kind: object())
    monkeypatch.setattr(jax_ffi, "hotpath", lambda: fake)
    monkeypatch.setattr(jax_ffi, "_jax_gpus", lambda: (0,))
    if refuse:
        def register(*args, **kwargs):
            raise ValueError("incompatible API version")

        monkeypatch.setattr(jax.ffi, "register_ffi_target", register)
    jax_ffi._registration.cache_clear()
    try:
        got, reason = jax_ffi.route()
        assert got == "callback" and why in reason
        with jax_ffi.jax_route("ffi"), pytest.raises(ExecutorUnavailableError, match="FFI handler"):
            jax_ffi.route()
    finally:
        jax_ffi._registration.cache_clear()


def test_every_epilogs_buffers_have_a_role_in_the_handler():
    """Every input and output an epilog names reaches the handler in a role (a missing one was a KeyError while
    tracing DRELU_BGRAD/DGELU_BGRAD on the GPU)."""
    from nvdispatch._epilog import EPILOGS

    for spec in EPILOGS.values():
        for name in spec.inputs:
            assert name in jax_ffi._INPUT_ROLES, (spec.epilog.name, name)
        for name in spec.outputs:
            assert name in jax_ffi._OUTPUT_ROLES, (spec.epilog.name, name)
