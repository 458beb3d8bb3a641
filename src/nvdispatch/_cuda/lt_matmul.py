"""The regular cuBLASLt matmul plan, shared by the ``cuda`` and ``cupy`` executors: a problem set up in cuBLASLt's
terms (:mod:`.lt_setup`) in the orientation its heuristic fuses (:mod:`.lt_descriptors`), whose ``execute`` is
one ``cublasLtMatmul`` on the caller's stream (:mod:`.lt_launch`) with the operand copies, casts and epilogue
buffers (:mod:`.lt_aux`) the case needs, and whose direct call (:mod:`.lt_direct`) serves the commonest form.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .._epilog import Epilog
from .._matmul_problem import MatmulProblem, scalar_value
from .._strides import c_strides
from ..errors import ExecutorUnavailableError, PlanStateError
from . import cublaslt as lt
from . import lt_direct
from .arrays import empty, make_view, pointer_getter, result_from_operand, result_kind
from .lt_aux import aux_input_pointer, aux_output, bias_gradient_output
from .lt_descriptors import LtDescriptors, max_workspace, probe
from .lt_plan_base import LtPlanBase
from .lt_setup import Operand, lt_types, setup
from .xp import as_xp

__all__ = ["LtMatmulPlan", "ExternalLaunch", "EXTERNAL_ALIGNMENTS"]

#: the operand alignments (bytes) an external launch has an algorithm for
EXTERNAL_ALIGNMENTS = (256, 128, 64, 32, 16)


@dataclasses.dataclass(frozen=True)
class ExternalLaunch:
    """What :meth:`LtMatmulPlan.external_launch` gives: descriptors (``core``: ``desc``, ``a``..``d``), handle,
    host pointers to alpha and beta, whether cuBLASLt's A is ``a``, the algorithms by alignment, and ``keep``:
    what owns all of these (the caller holds it as long as it may launch)."""

    core: Any
    handle: int
    alpha: int
    beta: int
    a_first: bool
    algorithms: tuple
    keep: tuple


class LtMatmulPlan(LtPlanBase):
    """A planned cuBLASLt matmul (strategy ``"native"``; with ``fused=False`` the unfused matmul that the
    ``"inplace"`` fallback runs before its elementwise epilog)."""

    def __init__(self, p: MatmulProblem, *, fused: bool = True, tuning=None, orientation=None, bias_cast=False):
        self._planned = False  # set once planned: from then a new algorithm (autotune) makes a new direct call
        #: called with the plan when its algorithm changes (autotune), by holders of an external launch
        self.algorithm_listeners: list = []
        self._start(p, "native" if fused else "inplace")
        if orientation is None:
            orientation, bias_cast, _ = probe(p) if fused else ("row", False, "")
            orientation = orientation or "row"
        self.setup = s = setup(p, orientation, bias_cast, None if fused else 1)
        a_first = s.lt_a.source == "a"  # cuBLASLt's A is operand a (else b: the row orientation)
        self._plan_launch(LtDescriptors(p, s, max_workspace(p)), a_first=a_first, tuning=tuning)
        self._get_ptr = pointer_getter(p.framework)
        self._needs_xp = (
            s.lt_a.copy
            or s.lt_b.copy
            or s.c_mode == "copy"
            or s.bias_copy
            or s.bias_cast
            or s.aux_in not in (None, "direct")
        )
        if self._needs_xp and self._xp is None:
            raise ExecutorUnavailableError(
                "operands", "CuPy or Torch to copy operands into cuBLASLt's layout", "neither installed"
            )
        self._scale_dtype = np.dtype(lt_types(p)[2])
        self._scalars: dict = {}
        # per-call constants
        self._inputs = p.input_sigs
        self._direct_operands = not s.lt_a.copy and not s.lt_b.copy
        #: cuBLASLt's operands as our a and b
        self._operand_of_a, self._operand_of_b = (s.lt_a, s.lt_b) if a_first else (s.lt_b, s.lt_a)
        self._order = "F" if (s.orientation == "col" and not p.a_vector and not p.b_vector) else "C"
        self._one, self._zero = self._scalar_buffer(1, []), self._scalar_buffer(0, [])
        shape = tuple(int(d) for d in p.result_shape)
        #: (kind, new_empty args, kwargs, transposed) where operand a makes the result like itself, else None
        self._result_like = result_from_operand(p.framework, shape, p.result_dtype, self._order)
        self._result_strides = (*c_strides(shape)[:-2], 1, shape[-2]) if self._order == "F" else c_strides(shape)
        self.steps = self._describe()
        self.direct = self._direct_call()
        self._planned = True

    def _algorithm_changed(self) -> None:
        if self._planned:  # the compiled direct call holds the algorithm it launches: make it anew
            self.direct = self._direct_call()
            for listener in list(self.algorithm_listeners):  # external launches holding a copy of it
                listener(self)

    # -- the direct call -------------------------------------------------------------------------------
    def _direct_call(self):
        """The Plan protocol's direct call (see :mod:`.lt_direct`): compiled where it can be, else
        :meth:`python_direct` for the plain form; None where the plan's form has none (or, for a form with an
        aux input or an extra output, where the compiled form does not serve: execute runs it as before)."""
        p = self.problem
        if not lt_direct.serves(p, self.setup, self.strategy, self._needs_xp):
            return None
        kind = self._result_like[0] if self._result_like is not None else ""
        compiled = lt_direct.compiled_direct(
            LtDescriptors(p, self.setup, self.core.max_workspace),
            self.handle,
            self.algorithm,
            one=self._one,
            zero=self._zero,
            keep=tuple(self._scalars.values()),
            a_first=self.launch.a_first,
            problem=p,
            setup=self.setup,
            kind=kind,
            order=self._order,
            launch=self.launch,
            current_stream=self._current_stream,
            fallback=self.python_direct,
        )
        if compiled is not None:
            return compiled
        return self.python_direct if lt_direct.plain(p) else None

    def python_direct(self, a, b, x=None):
        """The direct call in Python (every alignment, every framework, an algorithm with a workspace): ``x`` is
        the epilogue's input (the bias, or the aux a DRELU/DGELU reads); returns what :meth:`execute` does."""
        current = self._current_stream
        sp = current() if current is not None else 0
        if not lt_direct.plain(self.problem):  # an aux input or an extra output: the execute path
            operands = {"a": a, "b": b}
            if x is not None:
                operands[next(iter(self._inputs))] = x
            return self._execute(operands, sp)
        get = self._get_ptr
        out, ptr_d, kind = self._result(a, sp)
        pointers = () if x is None else ((lt.DESC_BIAS_POINTER, get(x)),)
        self.launch(get(a), get(b), ptr_d, ptr_d, self._one, self._zero, sp, pointers, kind)
        return out

    # -- description ---------------------------------------------------------------------------------
    def _describe(self) -> tuple[str, ...]:
        s, p = self.setup, self.problem
        ops = "NTC"
        form = (
            "D^T = B^T A^T (row-major result, bias along N native)"
            if s.orientation == "row"
            else ("D = A B (column-major result, bias along M native)")
        )
        steps = []
        for o in (s.lt_a, s.lt_b):
            if o.conj_copy:
                steps.append(f"copy {o.source} to a C-ordered {p.result_dtype} array of its values (its memory holds "
                             "their conjugates, in a layout op C cannot read)")  # fmt: skip
            elif o.copy:
                steps.append(f"copy {o.source} to a C-ordered {p.result_dtype} array (its strides/dtype need it)")
        steps += [f"note: {n}" for n in s.notes]
        epi = p.epilog.epilog.name if self.strategy == "native" else "DEFAULT"
        steps.append(
            f"cublasLtMatmul {form}, op(A)={ops[s.lt_a.op]} op(B)={ops[s.lt_b.op]}, epilogue {epi}"
            + (
                f" (cuBLASLt {_epilogue_name(s.epilogue)})"
                if self.strategy == "native" and s.epilogue != int(p.epilog.epilog)
                else ""
            )
            + f", batch {s.batch}, compute type {lt_types(p)[0]}, one launch on the caller's stream"
        )
        return tuple(steps)

    # -- execution ---------------------------------------------------------------------------------
    def _scalar(self, value, keep: list):
        """Host pointer to ``value`` in the scale type; a buffer not kept by the plan is kept in ``keep``."""
        if value.__class__ is int and (value == 1 or value == 0):
            return self._one if value else self._zero
        return self._scalar_buffer(value, keep)

    def _scalar_buffer(self, value, keep: list) -> int:
        value = scalar_value(value)
        buf = self._scalars.get(value)
        if buf is None:
            arr = np.array([value], dtype=self._scale_dtype)
            buf = (arr, arr.ctypes.data)
            if len(self._scalars) < 16:  # the plan keeps buffers of the first 16 values it sees
                self._scalars[value] = buf
            else:
                keep.append(arr)  # cuBLASLt reads host scalars during the call: alive until it returns
        return buf[1]

    def execute_into(self, pointers, outputs, sp: int, alpha=1, beta=None) -> None:
        """Queue the matmul on raw stream ``sp`` over device memory the caller owns (an XLA custom call's buffers):
        ``pointers`` maps ``a``, ``b`` (and ``c`` and each epilog input) to addresses holding them as the problem's
        strides describe; ``outputs`` maps ``"out"`` and each auxiliary output to a buffer laid out as
        :func:`~.lt_setup.output_layouts` says. Nothing is allocated but the workspace; the launch is
        :meth:`execute`'s. Only for a native plan whose operands need no conversion (same dtypes, layouts cuBLASLt
        reads in place): :class:`~nvdispatch.errors.PlanStateError` otherwise."""
        p, s = self.problem, self.setup
        if self.strategy != "native" or self._needs_xp or not self._direct_operands or s.c_mode == "copy":
            raise PlanStateError(
                "plan", "a native plan reading its operands in place", f"one needing copies ({self.steps[0]})"
            )
        ptr_d = outputs["out"]
        ptr_c, beta_value = ptr_d, 0
        if p.c is not None:
            ptr_c, beta_value = pointers["c"], (1 if beta is None else beta)
        bias_ptr = outputs[s.bgrad] if s.bgrad else pointers.get("bias")
        aux_ptr = None
        if s.aux_out:
            aux_ptr = outputs[p.epilog.outputs[0]]
        elif s.aux_in:
            aux_ptr = pointers["relu_aux" if "relu_aux" in self._inputs else "gelu_aux"]
        attributes = () if bias_ptr is None else ((lt.DESC_BIAS_POINTER, bias_ptr),)
        if aux_ptr is not None:
            attributes += ((lt.DESC_EPILOGUE_AUX_POINTER, aux_ptr),)
        keep: list = []
        alpha_ptr, beta_ptr = self._scalar(alpha, keep), self._scalar(beta_value, keep)
        self.launch(pointers["a"], pointers["b"], ptr_c, ptr_d, alpha_ptr, beta_ptr, sp, attributes, "")
        del keep

    def external_launch(self, alpha=1, beta=None) -> ExternalLaunch:
        """What a caller outside Python (the XLA FFI handler of ``_hotpath_ffi.c``) needs to launch this plan as
        :meth:`execute_into` does, with ``alpha``/``beta`` fixed: descriptors and layouts of its own (so that
        setting their pointers never disturbs this plan's launches), the handle, host scalars, and the
        algorithm for each operand alignment. Same conditions as :meth:`execute_into`."""
        p, s = self.problem, self.setup
        if self.strategy != "native" or self._needs_xp or not self._direct_operands or s.c_mode == "copy":
            raise PlanStateError(
                "plan", "a native plan reading its operands in place", f"one needing copies ({self.steps[0]})"
            )
        keep: list = []
        beta_value = 0 if p.c is None else (1 if beta is None else beta)
        alpha_ptr, beta_ptr = self._scalar(alpha, keep), self._scalar(beta_value, keep)
        core = LtDescriptors(p, s, self.core.max_workspace)
        return ExternalLaunch(
            core=core,
            handle=self.handle,
            alpha=alpha_ptr,
            beta=beta_ptr,
            a_first=self.launch.a_first,
            algorithms=self.external_algorithms(),
            keep=(core, self, *keep),
        )

    def external_algorithms(self) -> tuple[tuple[int, bytes, int], ...]:
        """``((alignment, cublasLtMatmulAlgo_t bytes, workspace bytes), ...)``, best alignment first: the
        algorithm in use for 256-byte aligned pointers, the heuristic's first for each smaller alignment."""
        found = []
        for alignment in EXTERNAL_ALIGNMENTS:
            try:
                algo = self.launch.algo if alignment == 256 else self.launch.algorithm_for(alignment)
            except lt.CublasLtError:
                continue
            found.append((alignment, bytes(algo.algo), int(algo.workspaceSize)))
        return tuple(found)

    def _execute(self, operands, sp: int):
        p, s = self.problem, self.setup
        a, b = operands["a"], operands["b"]
        keep = []  # temporaries alive until the launch is queued (their memory is stream-ordered)
        xp = self._xp
        # operands
        if self._direct_operands:  # cuBLASLt reads a and b in place
            get = self._get_ptr
            ptr_a, ptr_b = get(a), get(b)
        else:
            ptr_a = self._operand_ptr(self._operand_of_a, a, b, keep)
            ptr_b = self._operand_ptr(self._operand_of_b, a, b, keep)
        out, ptr_d, kind = self._result(a, sp)
        beta = operands.get("beta")
        c = operands.get("c")
        ptr_c = ptr_d
        if c is not None:
            beta = 1 if beta is None else beta
            if s.c_mode == "direct":
                ptr_c = self._get_ptr(c)
            else:
                xp.copy_into(as_xp(out, kind, xp.name), as_xp(c, self.framework, xp.name))
        else:
            beta = 0
        # epilogue pointers
        aux_out = None
        outputs = {}
        pointers = ()
        if self.strategy == "native":
            bias_ptr = aux_ptr = None
            if "bias" in self._inputs:
                bias_ptr = self._bias_ptr(operands["bias"], keep)
            if s.bgrad:
                outputs[s.bgrad], bias_ptr = bias_gradient_output(p, s, kind, self.device_index, sp)
            if s.aux_out:
                aux_out, aux_ptr = aux_output(p, s, kind, self.device_index, sp)
            elif s.aux_in:
                aux_ptr = aux_input_pointer(p, s, operands, self.framework, xp, self._get_ptr, keep)
            if bias_ptr is not None:
                pointers = ((lt.DESC_BIAS_POINTER, bias_ptr),)
            if aux_ptr is not None:
                pointers += ((lt.DESC_EPILOGUE_AUX_POINTER, aux_ptr),)
        alpha_ptr = self._scalar(operands.get("alpha", 1), keep)
        beta_ptr = self._scalar(beta, keep)
        self.launch(ptr_a, ptr_b, ptr_c, ptr_d, alpha_ptr, beta_ptr, sp, pointers, kind)
        del keep
        if aux_out is not None:
            outputs[p.epilog.outputs[0]] = aux_out
        if self.strategy != "native" or not p.epilog.outputs:
            return out
        return out, outputs

    def _bias_ptr(self, bias, keep: list) -> int:
        """The bias cuBLASLt reads: the caller's in place, or a contiguous copy / a cast (kept in ``keep``)."""
        s = self.setup
        if not (s.bias_copy or s.bias_cast):
            return self._get_ptr(bias)
        xp = self._xp
        bx = as_xp(bias, self.framework, xp.name)
        if s.bias_cast:
            bx = xp.astype(bx, self.problem.result_dtype)
        if s.bias_copy:
            bx = xp.contiguous(bx)
        keep.append(bx)
        return xp.data_ptr(bx)

    def _result(self, a, sp: int):
        """``(result, its pointer, its kind)``: a new result array in the caller's type."""
        like = self._result_like
        p = self.problem
        if like is not None:  # operand a makes it: its device, its allocator's pool of the current stream
            kind, args, kwargs, transposed = like
            out = a.new_empty(*args, **kwargs)
            ptr_d = self._get_ptr(out)
            if transposed:
                out = make_view(kind, out, p.result_shape, self._result_strides)
            return out, ptr_d, kind
        kind = result_kind(a, self.framework)
        out, ptr_d = empty(kind, p.result_shape, p.result_dtype, self.device_index, sp, self._order)
        return out, ptr_d, kind

    def _operand_ptr(self, o: Operand, a, b, keep) -> int:
        x = a if o.source == "a" else b
        if not o.copy:
            return self._get_ptr(x)
        p, xp = self.problem, self._xp
        sig = p.a if o.source == "a" else p.b
        vec = (o.source == "a" and p.a_vector) or (o.source == "b" and p.b_vector)
        y = as_xp(x, self.framework, xp.name)
        if sig.conj:  # read by its memory: a cached call hands the plan the caller's lazy conjugate view itself
            y = xp.memory(y)
        y = xp.astype(y, p.result_dtype)
        if o.conj_copy:  # x's memory holds the conjugates of its values
            y = xp.conj(y)
        if vec:
            y = xp.contiguous(y)
        else:
            y = xp.contiguous(y, (*p.batch_shape, *sig.shape[-2:]))
        keep.append(y)
        return xp.data_ptr(y)


def _epilogue_name(value: int) -> str:
    """The name of cuBLASLt epilogue ``value`` (our Epilog enum mirrors cuBLASLt's values)."""
    try:
        return Epilog(value).name
    except ValueError:
        return str(value)
