"""One matmul of nvdispatch staged into a JAX program: the host kernel (CPU) and the device kernel (GPU).

:func:`matmul_kernel` takes canonical operands (``jax_matmul`` makes them: ``a``/``b`` at least 2-D, every
operand of the result's rank, ``c`` and the masks of the result's shape; ``a``/``b`` possibly read transposed)
and returns the result and auxiliary outputs in the formats :func:`~.jax_matmul_shapes.output_avals` gives, on
every platform.

* CPU: the callback runs ``nvdispatch.matmul`` (the whole eager route: backend state as traced, plan cache) on
  NumPy views of XLA's buffers and copies the results into XLA's output buffers. bfloat16, which NumPy lacks,
  runs as float32 (exact products, the sum accumulated in float32 as cuBLASLt's is) rounded once at the end.
* GPU: the ``cuda`` executor's cuBLASLt plan writes into XLA's output buffers on XLA's stream, called by XLA
  through the extension's XLA FFI handler (:mod:`.jax_ffi`, planned while tracing) or from a Python buffer
  callback (``LtMatmulPlan.execute_into``, planned on the first run), as ``MatmulCall.gpu_route`` says: no host
  round trip, no allocation but cuBLASLt's workspace. Either way the plan is autotuned while tracing, where JAX
  has a GPU, as ``MatmulCall.autotune`` says (:mod:`.jax_autotune`). What cuBLASLt
  reads or writes in its own layouts is converted by XLA around the call: operands cast to the result dtype,
  a bias along M and ``c`` transposed for the column orientation, the ReLU mask packed to and unpacked from
  cuBLASLt's bits, the GELU pre-activation padded to its leading dimension. Float32 products follow JAX's
  precision setting (:mod:`.jax_precision`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._backends import BackendState, set_state
from .._cuda import lt_layout as L
from .._cuda.lt_setup import LT_DTYPES, orientations, output_layouts, setup
from .._detect import CPU, Device
from .._epilog import INPUTS, spec_of
from .._matmul_problem import MatmulOptions, MatmulPlanPreferences, MatmulProblem
from .._plan_cache import plan_cache
from .._route import log
from .._strides import c_strides
from ..linalg import matmul
from .jax_autotune import tune_staged, wants_timing
from .jax_buffers import PlanFinder, device_index, device_pointer, stage
from .jax_ffi import FFI_ROUTES, asked_route, gpu_ordinals, stage_matmul
from .jax_matmul_shapes import (
    abstract_problem,
    apply_epilog,
    check_orientation,
    output_avals,
    product_on_values,
    transposed,
)
from .jax_precision import with_convention

__all__ = ["MatmulCall", "matmul_kernel", "pack_mask", "unpack_mask"]


@dataclasses.dataclass(frozen=True)
class MatmulCall:
    """The static part of a staged matmul: everything but the operands."""

    epilog: str
    alpha: Any = 1
    beta: Any = None
    options: MatmulOptions = MatmulOptions()
    preferences: MatmulPlanPreferences = MatmulPlanPreferences()
    #: the backend state when the call was traced (the kernels run under it)
    state: BackendState = dataclasses.field(default_factory=BackendState)
    #: ``a``/``b`` are read transposed (their last two axes swapped) where True
    transpose_a: bool = False
    transpose_b: bool = False
    #: how the GPU kernel runs the plan: "ffi"/"ffi-graphs" (the extension's XLA FFI handler, outside or inside
    #: XLA's command buffers) or "callback" (a Python buffer callback); chosen when the call is traced
    #: (:func:`.jax_ffi.route`)
    gpu_route: str = "callback"
    #: how the GPU plan is autotuned while tracing: "auto", "always" or "off" (:mod:`.jax_autotune`)
    autotune: str = "off"

    @property
    def transpose(self) -> tuple[bool, bool]:
        return self.transpose_a, self.transpose_b


def matmul_kernel(call: MatmulCall, operands: dict[str, Any]) -> tuple:
    """``call`` on canonical ``operands`` (JAX values by name): ``(result, *auxiliary outputs)``.

    Under :func:`jax.vmap` the kernel is staged again on the batched shapes, a batch axis in front of every
    operand (one batched product, whatever route runs it). The result's batch is that of the operands
    together: where only ``c`` or an epilog input is batched, ``a`` is broadcast along the batch, so that each
    batch matrix of the result meets its own ``c``, bias or auxiliary input."""
    names = tuple(operands)

    @jax.custom_batching.custom_vmap
    def run(*values):
        return _kernel(call, dict(zip(names, values)))

    @run.def_vmap
    def _batched(axis_size, in_batched, *values):
        values = [x if batched else x[None] for x, batched in zip(values, in_batched)]
        if not (in_batched[names.index("a")] or in_batched[names.index("b")]):
            i = names.index("a")
            values[i] = jnp.broadcast_to(values[i], (axis_size, *values[i].shape[1:]))
        outs = run(*values)
        return tuple(outs), (True,) * len(outs)

    return tuple(run(*operands.values()))


def _kernel(call: MatmulCall, operands: dict[str, Any]) -> tuple:
    names = tuple(operands)
    spec = spec_of(call.epilog)
    problem = abstract_problem("jax", CPU, operands, spec, call.options, call.alpha, call.beta, call.transpose)
    avals = output_avals(problem)
    if 0 in (problem.m, problem.n, problem.k, *problem.batch_shape):  # nothing to compute: no kernel
        a, b = _logical(call, operands)
        inputs = {name: operands[name] for name in names if name in INPUTS}
        d = product_on_values(problem, a, b, operands.get("c"), call.alpha, call.beta)
        got = apply_epilog(problem, d, a, b, inputs)
        return tuple(x.reshape(want.shape).astype(want.dtype) for x, want in zip(got, avals.values()))
    return tuple(
        jax.lax.platform_dependent(
            *operands.values(),
            cpu=lambda *xs: _host(call, names, problem, avals, xs),
            cuda=lambda *xs: _device(call, names, problem, avals, xs),
        )
    )


# -- CPU -----------------------------------------------------------------------------------------------------
def _host(call: MatmulCall, names, problem: MatmulProblem, avals, values):
    """The host kernel: ``nvdispatch.matmul`` on NumPy views of the buffers (bfloat16 as float32)."""
    wide = {"bfloat16": jnp.float32}
    values = tuple(v.astype(wide[str(v.dtype)]) if str(v.dtype) in wide else v for v in values)
    host = dict(zip(names, values))
    run = abstract_problem("jax", CPU, host, problem.epilog, call.options, call.alpha, call.beta, call.transpose)
    run_avals = tuple(output_avals(run).values())
    outs = stage(_host_callback(call, names), run_avals, *values)
    return tuple(o.astype(want.dtype) for o, want in zip(outs, avals.values()))


def _host_callback(call: MatmulCall, names: tuple[str, ...]):
    spec = spec_of(call.epilog)

    def callback(ctx, outs, *ins):
        arrays = {name: np.asarray(x) for name, x in zip(names, ins)}
        for name, flag in (("a", call.transpose_a), ("b", call.transpose_b)):
            if flag:
                arrays[name] = np.swapaxes(arrays[name], -1, -2)
        inputs = {name: arrays[name] for name in names if name in INPUTS}
        with set_state(call.state):
            got = matmul(
                arrays["a"],
                arrays["b"],
                arrays.get("c"),
                alpha=call.alpha,
                beta=call.beta,
                epilog=call.epilog,
                epilog_inputs=inputs or None,
                options=call.options,
                preferences=call.preferences,
            )
        results = (got[0], *(got[1][name] for name in spec.outputs)) if spec.outputs else (got,)
        for buffer, value in zip(outs, results):
            np.copyto(np.asarray(buffer), value)

    return callback


# -- GPU -----------------------------------------------------------------------------------------------------
#: how the device kernel reads a buffer: "T" swaps its last two axes, ("crop", axis, n) keeps n entries of an axis
_View = tuple


def _view(rule: _View, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, element strides) of the view ``rule`` makes of a C-ordered buffer of ``shape``."""
    strides = c_strides(shape)
    for step in rule:
        if step == "T":
            shape, strides = transposed(shape, strides)
        else:
            _, axis, n = step
            shape = (*shape[:axis], n, *shape[axis + 1 :]) if axis != -1 else (*shape[:-1], n)
    return tuple(shape), tuple(strides)


def pack_mask(mask, ld_bits: int):
    """A boolean ``(..., cols, rows)`` mask as cuBLASLt's ReLU bits: uint8 ``(..., cols, ld_bits // 8)``, bit
    ``r % 8`` of byte ``r // 8`` set where ``mask[..., c, r]`` (rows padded with clear bits to ``ld_bits``)."""
    rows = mask.shape[-1]
    m = mask.astype(jnp.uint8)
    if ld_bits != rows:
        m = jnp.pad(m, [(0, 0)] * (m.ndim - 1) + [(0, ld_bits - rows)])
    m = m.reshape(*m.shape[:-1], ld_bits // 8, 8)
    return jnp.sum(m << jnp.arange(8, dtype=jnp.uint8), axis=-1, dtype=jnp.uint8)


def unpack_mask(bits, rows: int):
    """The inverse of :func:`pack_mask`: a boolean ``(..., cols, rows)`` mask."""
    m = (bits[..., None] >> jnp.arange(8, dtype=jnp.uint8)) & 1
    return m.reshape(*bits.shape[:-1], bits.shape[-1] * 8)[..., :rows].astype(bool)


#: result dtypes whose epilogs cuBLASLt fuses on every GPU nvdispatch runs on; others stage the plain product and
#: the epilog as XLA operations
_FUSED = ("float16", "bfloat16", "float32")


def _device(call: MatmulCall, names, problem: MatmulProblem, avals, values):
    """The device kernel: XLA brings the operands to cuBLASLt's layouts, the plan fills the output buffers."""
    dt = problem.result_dtype
    if dt not in LT_DTYPES:  # integers: cuBLASLt has no such product; XLA's own
        ops = dict(zip(names, values))
        a, b = _logical(call, ops)
        d = product_on_values(problem, a, b, ops.get("c"), call.alpha, call.beta)
        got = apply_epilog(problem, d, a, b, {n: ops[n] for n in names if n in INPUTS})
        return tuple(x.reshape(want.shape).astype(want.dtype) for x, want in zip(got, avals.values()))
    if problem.epilog.steps and dt not in _FUSED:
        return _device_unfused(call, names, problem, avals, values)
    options = with_convention(call.options, dt)
    for orientation in orientations(problem):
        inputs, views = _device_operands(call, names, problem, values, orientation)
        dev_problem = _device_problem(call, options, inputs, views, Device("cuda"))
        inputs, dev_problem = _read_in_place(call, options, inputs, views, dev_problem, orientation)
        if _fused_here(dev_problem, orientation):
            break
    else:  # this GPU's cuBLASLt has no fused kernel for the case
        return _device_unfused(call, names, problem, avals, values)
    row = orientation == "row"
    m, n = problem.m, problem.n
    layouts = output_layouts(dev_problem, setup(dev_problem, orientation))
    staged = _ffi_staged(call, options, inputs, views, orientation) if call.gpu_route in FFI_ROUTES else None
    if staged is None:
        _tune_while_tracing(call, options, inputs, views, orientation)
        results = tuple(jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in layouts.values())
        callback = _device_callback(call, options, tuple(inputs), views, orientation, tuple(layouts))
        staged = stage(callback, results, *inputs.values())
    outs = dict(zip(layouts, staged))
    converted = []
    for name, want in avals.items():
        x = outs[name]
        if name == "out":
            x = x if row else jnp.swapaxes(x, -1, -2)
        elif name == "relu_aux":
            x = unpack_mask(x, n) if row else jnp.swapaxes(unpack_mask(x, m), -1, -2)
        elif name == "gelu_aux":
            x = x[..., :n] if row else jnp.swapaxes(x[..., :m], -1, -2)
        else:  # a bias gradient or an operand sum (cuBLASLt: one per batch matrix)
            x = _take_broadcast(x, want.shape)
        converted.append(x.reshape(want.shape).astype(want.dtype))
    return tuple(converted)


def _ffi_staged(call: MatmulCall, options, inputs: dict, views, orientation: str):
    """The outputs of the XLA FFI call of the plan (:func:`.jax_ffi.stage_matmul`, planned now); None where the
    plan cannot be made here and the route was not asked for explicitly: the call then takes the buffer
    callback, which plans when the program runs on a GPU (a program traced for the CPU never does)."""
    names = tuple(inputs)

    def problem_for(dev, shapes):
        return _device_problem(call, options, dict(zip(names, inputs.values())), views, Device("cuda", dev), shapes)

    try:
        return stage_matmul(problem_for, call.state, call.alpha, call.beta, orientation, names, tuple(inputs.values()),
                            graphs=call.gpu_route == "ffi-graphs", autotune=call.autotune)
    except Exception as exc:  # noqa: BLE001 - logged; the callback route then behaves as it always has
        if asked_route() in FFI_ROUTES:
            raise
        log.debug("matmul: no XLA FFI plan while tracing (%s: %s); staged as a buffer callback", type(exc).__name__,
                  exc)
        return None


def _tune_while_tracing(call: MatmulCall, options, inputs: dict, views, orientation: str) -> None:
    """The buffer callback's plans made now, for each GPU JAX has, and autotuned where the call's mode times them
    (the callback plans on its first run and finds them, or a plan starting with their recorded choice). Under
    :func:`jax.vmap` the callback runs batched shapes, planned (untuned) on the first run."""
    if call.autotune == "off" or not _jax_has_gpu():
        return
    finder = PlanFinder("matmul", call.state)
    for dev in gpu_ordinals():
        problem = _device_problem(call, options, inputs, views, Device("cuda", dev))
        if not wants_timing(problem, call.autotune):
            return
        try:
            plan, _ = finder.acquire((dev,), lambda problem=problem: problem, "native")
        except Exception as exc:  # noqa: BLE001 - the run plans (and says why it cannot)
            log.debug("matmul: no plan while tracing for the buffer callback (%s: %s)", type(exc).__name__, exc)
            return
        try:
            check_orientation(plan, orientation)
            tune_staged(plan, call.autotune, call.alpha, call.beta)
        finally:
            plan_cache.let_go(plan)


def _device_operands(call: MatmulCall, names, problem: MatmulProblem, values, orientation: str):
    """``(operands, views)``: the operands as cuBLASLt reads them in ``orientation`` (XLA operations: casts to
    the result dtype, the mask packed to bits, the pre-activation padded, transposes for the column
    orientation) and how the kernel views each buffer (:func:`_view`)."""
    dt, row = problem.result_dtype, orientation == "row"
    m, n = problem.m, problem.n
    inputs, views = {}, {}
    for name, x in zip(names, values):
        if name in ("a", "b", "bias", "c", "gelu_aux") and str(x.dtype) != dt:
            x = x.astype(dt)  # cuBLASLt reads operands of the result's dtype (a bias too: no cast at run time)
        rule: _View = ()
        if name in ("a", "b") and call.transpose[name == "b"]:
            rule = ("T",)
        elif name == "c" and not row:
            x, rule = jnp.swapaxes(x, -1, -2), ("T",)
        elif name == "relu_aux":
            rows, mask = (n, x) if row else (m, jnp.swapaxes(x, -1, -2))
            x, rule = pack_mask(mask, L.relu_aux_ld_bits(rows)), (() if row else ("T",))
        elif name == "gelu_aux":
            rows, pre = (n, x) if row else (m, jnp.swapaxes(x, -1, -2))
            ld = L.gelu_aux_ld(rows)
            if ld != rows:
                pre = jnp.pad(pre, [(0, 0)] * (pre.ndim - 1) + [(0, ld - rows)])
            x, rule = pre, (("crop", -1, n),) if row else ("T", ("crop", -2, m))
        inputs[name] = x
        views[name] = rule
    return inputs, views


def _read_in_place(call: MatmulCall, options, inputs: dict, views, problem: MatmulProblem, orientation: str):
    """``(operands, problem)`` with every operand cuBLASLt would need copied (the staged kernel launches into XLA's
    buffers and copies nothing) broadcast to the full batch by XLA: an ``a``/``b`` whose batch axes no single
    stride describes (batched along one vmapped axis, broadcast along another: nested ``jacfwd``/``jacrev``), a
    ``c`` not laid out as the result."""
    s = setup(problem, orientation)
    copied = {o.source: o.copy for o in (s.lt_a, s.lt_b)} | {"c": s.c_mode == "copy"}
    batch = tuple(problem.result_shape[:-2])
    changed = dict(inputs)
    for name, x in inputs.items():
        if copied.get(name) and x.ndim >= 2 and batch and tuple(x.shape[:-2]) != batch:
            changed[name] = jnp.broadcast_to(x, batch + tuple(x.shape[-2:]))
    if all(changed[name] is x for name, x in inputs.items()):
        return inputs, problem
    return changed, _device_problem(call, options, changed, views, Device("cuda", problem.device.index))


def _fused_here(problem: MatmulProblem, orientation: str) -> bool:
    """Whether the ``cuda`` executor plans ``problem`` as one fused cuBLASLt launch in ``orientation``: asked of
    cuBLASLt's heuristic where JAX has a GPU in this process (the program is traced where it runs); elsewhere
    assumed (the GPU branch is traced but not run, or runs on another machine, whose plan then says so)."""
    if not _jax_has_gpu():
        return True
    from .._cuda.lt_descriptors import probe

    try:
        found, _, _ = probe(problem)
    except Exception:  # noqa: BLE001 - cuBLASLt unusable here: the run says why
        return True
    return found == orientation


@functools.lru_cache(maxsize=1)
def _jax_has_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def _device_unfused(call: MatmulCall, names, problem: MatmulProblem, avals, values):
    """The plain product on the device kernel, the epilog as XLA operations."""
    ops = dict(zip(names, values))
    plain = dataclasses.replace(call, epilog="DEFAULT")
    product_names = tuple(n for n in names if n in ("a", "b", "c"))
    spec = spec_of("DEFAULT")
    product = abstract_problem("jax", CPU, {n: ops[n] for n in product_names}, spec, call.options, call.alpha,
                               call.beta, call.transpose)
    (d,) = _device(plain, product_names, product, output_avals(product), tuple(ops[n] for n in product_names))
    a, b = _logical(call, ops)
    got = apply_epilog(problem, d, a, b, {n: ops[n] for n in names if n in INPUTS})
    return tuple(x.reshape(want.shape).astype(want.dtype) for x, want in zip(got, avals.values()))


def _logical(call: MatmulCall, ops: dict):
    """``a`` and ``b`` as the product reads them (transposed where the call says so), as XLA values."""
    a, b = ops["a"], ops["b"]
    return (jnp.swapaxes(a, -1, -2) if call.transpose_a else a), (jnp.swapaxes(b, -1, -2) if call.transpose_b else b)


def _take_broadcast(x, shape):
    """``x`` cut to ``shape`` where ``shape`` has 1 on axes along which ``x``'s entries are equal copies (an
    operand sum of an operand broadcast over a batch axis, which cuBLASLt computes once per batch matrix)."""
    if x.ndim != len(shape):
        return x
    index = tuple(slice(0, 1) if want == 1 and have != 1 else slice(None) for have, want in zip(x.shape, shape))
    return x[index]


def _device_problem(call: MatmulCall, options, arrays, views, device: Device, shapes=None) -> MatmulProblem:
    """The problem the ``cuda`` executor plans: ``arrays`` (values, or run-time buffers) read as ``views`` say."""
    spec = spec_of(call.epilog)
    got = {}
    for name, x in arrays.items():
        shape = tuple(int(d) for d in (x.shape if shapes is None else shapes[name]))
        got[name] = _view(views[name], shape)
    framework = "dlpack"
    return abstract_problem(framework, device, arrays, spec, options, call.alpha, call.beta, (False, False), got)


def _device_callback(call: MatmulCall, options, names, views, orientation: str, outputs: tuple[str, ...]):
    """The callback XLA runs on the GPU: the ``cuda`` executor's plan for the buffers' shapes (planned once per
    shape and device), launched into XLA's output buffers on XLA's stream."""
    finder = PlanFinder("matmul", call.state)
    alpha, beta, let_go = call.alpha, call.beta, plan_cache.let_go

    def callback(ctx, outs, *ins):
        dev = device_index(ins[0])
        key = (dev, *[tuple(x.shape) for x in ins])
        plan, _ = finder.acquire(
            key, lambda: _device_problem(call, options, dict(zip(names, ins)), views, Device("cuda", dev)), "native"
        )
        try:
            check_orientation(plan, orientation)
            pointers = {name: device_pointer(x) for name, x in zip(names, ins)}
            written = {name: device_pointer(x) for name, x in zip(outputs, outs)}
            plan.execute_into(pointers, written, int(ctx.stream), alpha, beta)
        finally:
            let_go(plan)

    return callback
