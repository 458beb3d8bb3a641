"""The ``"inplace"`` strategy of the GPU matmul executors: the unfused matmul (cuBLASLt with the DEFAULT epilogue,
or its BIAS epilogue where the epilog starts by adding a bias; or the framework's own matmul), then the epilog's
other steps on the result through CuPy/Torch ops. Used where cuBLASLt has no fused kernel for the case, and timed
against the fused plan by autotune.
"""

from __future__ import annotations

import dataclasses

from .._epilog import INPUTS, STEPS, Epilog, apply_steps, spec_of
from .._matmul_problem import MatmulProblem, scalar_value
from . import lt_autotune
from . import lt_layout as L
from .arrays import as_kind, result_kind
from .lt_descriptors import device_index, probe
from .lt_matmul import LtMatmulPlan
from .streams import framework_stream, stream_pointer
from .xp import Xp, as_xp, namespace_for

__all__ = ["InplacePlan"]


def _unfused_gemm(p: MatmulProblem) -> tuple[LtMatmulPlan, bool]:
    """The GEMM of the unfused strategy and whether it adds the bias: cuBLASLt's BIAS epilogue where it takes
    the case (a pass over the result saved), else the DEFAULT epilogue."""
    if p.epilog.steps[:1] == ("add_bias",) and p.epilog.epilog.name != "BIAS":
        biased = dataclasses.replace(
            p, epilog=spec_of(Epilog.BIAS), inputs=tuple(i for i in p.inputs if i[0] == "bias")
        )
        orientation, cast, _ = probe(biased)
        if orientation is not None:
            return LtMatmulPlan(biased, orientation=orientation, bias_cast=cast), True
    return LtMatmulPlan(p, fused=False, orientation="row"), False


class InplacePlan:
    """Strategy ``"inplace"``: the unfused matmul (cuBLASLt with the DEFAULT epilogue, or its BIAS epilogue
    where the epilog starts by adding a bias; or the framework's own matmul), then the epilog's other steps
    on the result through CuPy/Torch ops, in place (a saved pre-activation is the GEMM's result itself where
    the framework can write the activation to a new array: no copy). Used where cuBLASLt has no fused kernel
    for the case, and timed against it by autotune; ``steps`` say why. ``relu_aux`` keeps cuBLASLt's bit-mask
    format (so both strategies of one executor speak the same format) and a boolean mask is accepted too."""

    strategy = "inplace"
    tuning_kind = lt_autotune.TUNING_KIND  # its tuning is its GEMM's

    def __init__(self, p: MatmulProblem, why: str, via: str = "lt"):
        self.problem = p
        self.device_index = device_index(p)
        self.xp = Xp(namespace_for(p.framework))
        self.framework = p.framework
        self.via = via
        self.mm, bias_in_gemm = _unfused_gemm(p) if via == "lt" else (None, False)
        tail = p.epilog.steps[1:] if bias_in_gemm else p.epilog.steps  # the epilog's steps after the GEMM
        #: the framework's out-of-place vocabulary (None: CuPy's ops write in place only)
        self.fresh_ops = getattr(self.xp, "epilog_ops_fresh", lambda: None)()
        split = "save_pre_activation" in tail and self.fresh_ops is not None
        i = tail.index("save_pre_activation") if split else len(tail)
        #: the tail as two epilog specs: the steps in place, then (after a pre-activation kept without a copy)
        #: the steps writing a new array, or None
        self._in_place = dataclasses.replace(p.epilog, steps=tail[:i])
        self._fresh = dataclasses.replace(p.epilog, steps=tail[i + 1 :]) if split else None
        first = self.mm.steps if self.mm is not None else (f"{self.xp.name}.matmul (+ alpha, beta * c)",)
        why = f"not fused: {why}" if why else "unfused variant (for autotuning)"
        name = self.xp.name
        described = [f"{st} (in place, {name})" for st in self._in_place.steps]
        if split:
            described.append("save_pre_activation (the GEMM's result itself, no copy)")
            described += [f"{st} (into a new array, {name})" for st in self._fresh.steps]
        self.steps = (*first, *described, why)
        self.ld_bits = L.relu_aux_ld_bits(p.n)

    def _finish(self, d, inputs: dict, ops) -> tuple:
        """The epilog's tail on ``d``: (result, aux); the result is ``d`` unless the tail wrote a new array."""
        axis = self.problem.options.bgrad_axis
        d, aux = apply_steps(self._in_place, d, inputs, ops, bgrad_axis=axis)
        if self._fresh is None:
            return d, aux
        aux[STEPS["save_pre_activation"].output] = d  # never written again: the activation makes a new array
        d, more = apply_steps(self._fresh, d, inputs, self.fresh_ops, bgrad_axis=axis)
        return d, {**aux, **more}

    @property
    def workspace_bytes(self) -> int:
        return self.mm.workspace_bytes if self.mm is not None else 0

    def release(self) -> None:
        if self.mm is not None:
            self.mm.release()

    def tuning(self):
        """The GEMM's autotuned algorithm choice (recorded under the GEMM's own key), None untuned."""
        return self.mm.tuning() if self.mm is not None else None

    def autotune(self, operands, iterations: int = 3, stream=None):
        """Tune the GEMM's cuBLASLt algorithm as the native plan tunes its own (the elementwise tail has no
        knobs). Returns ``[(label, seconds)]``."""
        return self.mm.autotune(operands, iterations, stream) if self.mm is not None else []

    def time(self, operands, iterations: int = 3, stream=None) -> float:
        """GPU seconds of one call (CUDA events, as the native plan is timed: Matmul.autotune compares them)."""
        sp = stream_pointer(stream, self.framework, self.device_index)
        return lt_autotune.gpu_seconds(lambda: self.execute(operands, sp), sp, self.device_index, iterations)

    def execute(self, operands, stream=None):
        sp = stream_pointer(stream, self.framework, self.device_index)
        with framework_stream(self.xp.name, sp, self.device_index):
            return self._run(operands, sp)

    def _run(self, operands, sp):
        p, xp = self.problem, self.xp
        fw, helper = self.framework, xp.name
        kind = result_kind(operands["a"], fw)
        if self.mm is not None:
            out = self.mm.execute(operands, sp)  # on sp, the current stream of both helpers now
            d = as_xp(out, fw, helper)
        else:
            a = xp.astype(as_xp(operands["a"], fw, helper), p.result_dtype)
            b = xp.astype(as_xp(operands["b"], fw, helper), p.result_dtype)
            d = xp.mod.matmul(a, b)
            alpha = scalar_value(operands.get("alpha", 1))
            if alpha != 1:
                d *= alpha
            c = operands.get("c")
            if c is not None:
                beta = operands.get("beta")
                beta = 1 if beta is None else scalar_value(beta)
                if beta != 0:
                    d += beta * xp.astype(as_xp(c, fw, helper), p.result_dtype)
            out = d
        dd = d.reshape(p.promoted_shape) if (p.a_vector or p.b_vector) else d
        inputs = {}
        for name, sig in p.inputs:
            x = as_xp(operands[name], fw, helper)
            if INPUTS[name].mask_of and sig.dtype == "uint8":  # cuBLASLt's bits -> a boolean mask
                x = xp.unpack_mask(xp.contiguous(x), p.n)
            inputs[name] = INPUTS[name].prepare(x, p)
        ops = xp.epilog_ops()
        name = p.epilog.epilog.name
        if name in ("BGRADA", "BGRADB"):
            if name == "BGRADA":
                a = xp.astype(as_xp(operands["a"], fw, helper), p.result_dtype)
                aux = {"bgrada": ops.sum(a.reshape(1, -1) if p.a_vector else a, -1, False)}
            else:
                b = xp.astype(as_xp(operands["b"], fw, helper), p.result_dtype)
                aux = {"bgradb": ops.sum(b.reshape(-1, 1) if p.b_vector else b, -2, False)}
        else:
            done, aux = self._finish(dd, inputs, ops)
            if done is not dd:  # the tail wrote the result to a new array
                out = done.reshape(p.result_shape) if (p.a_vector or p.b_vector) else done
                if self.mm is not None:
                    out = as_kind(kind, out, xp.name)
        if "relu_aux" in aux:
            aux["relu_aux"] = xp.pack_mask(xp.contiguous(aux["relu_aux"]), self.ld_bits)
        elif "gelu_aux" in aux and (p.a_vector or p.b_vector):
            aux["gelu_aux"] = aux["gelu_aux"].reshape(p.result_shape)
        result = out if self.mm is not None else as_kind(kind, out, xp.name)
        if not p.epilog.outputs:
            return result
        return result, {k: as_kind(kind, v, xp.name) for k, v in aux.items()}
