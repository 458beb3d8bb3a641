"""Generate the Python source of one device FFT configuration (Stockham passes, fully unrolled).

Data layout (the cuFFTDx default layout):

* ``c2c``, Block: thread ``t`` of an FFT holds element ``t + i * stride`` in ``thread_data[i]`` for
  ``i < elements_per_thread``, with ``stride = size // elements_per_thread``; the output has the same layout.
* ``r2c``, Block: the input is real; ``thread_data`` viewed as reals holds ``x[t + i * stride]`` at real slot
  ``i``. The output holds ``X[t + i * stride]`` in complex slot ``i`` for every ``i`` with
  ``t + i * stride <= size // 2`` (slots past that are undefined).
* ``c2r``, Block: the input holds ``X[t + i * stride]`` in complex slot ``i`` where ``t + i * stride <=
  size // 2`` (other slots are ignored); the real output ``x[t + i * stride]`` is at real slot ``i``.
* Thread execution: one thread holds a whole FFT; element ``i`` is in slot ``i`` (``size // 2 + 1`` complex
  slots for the half spectrum of r2c/c2r).

Inverse transforms are unnormalised. The Block algorithm is the Stockham autosort FFT: pass ``p`` with
radix ``R`` and span ``Ns`` (the product of the previous radices) has ``size // R`` butterflies; butterfly
``j`` reads ``j + r * size // R``, twiddles by ``exp(sign 2 pi i r (j % Ns) / (Ns R))``, and writes
``(j // Ns) * Ns * R + j % Ns + r * Ns``. Thread ``t`` owns butterflies ``t + b * stride``, so the first pass
reads and the last pass writes exactly the registers of the layout above; the passes in between exchange
through shared memory (real and imaginary planes, padded per exchange to avoid bank conflicts, see
:mod:`.shared_layout`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .codegen import Complex, SourceWriter
from .fft_config import FFTConfig
from .shared_layout import HERMITIAN_PADDING, Padding

__all__ = ["generate_fft_source", "FUNCTION_NAME"]
FUNCTION_NAME = "fft_impl"


def generate_fft_source(config: FFTConfig, checks: Sequence[str] = ()) -> tuple[str, dict]:
    """Return ``(source, globals)`` defining ``fft_impl(_self, thread_data, shared_mem=None)``; ``checks``
    are statements run first (see :mod:`.launch_checks`)."""
    w = SourceWriter(config.precision)
    w.constants["REAL"] = config.precision
    w.constants["IDX"] = np.uint64  # unsigned shared-memory indices: no negative-index wraparound code
    for statement in checks:
        w.emit(statement)
    if config.execution == "Thread":
        _thread_body(w, config)
    else:
        _block_body(w, config)
    header = f"def {FUNCTION_NAME}(_self, thread_data, shared_mem=None):"
    return w.source(header), dict(w.constants)


# -- Thread execution ------------------------------------------------------------------------------------
def _thread_body(w: SourceWriter, c: FFTConfig) -> None:
    n = c.size
    w.emit("tdf = thread_data.view(REAL)")
    zero = w.const(0.0)
    if c.fft_type == "r2c":
        x = [(f"tdf[{i}]", zero) for i in range(n)]
    elif c.fft_type == "c2r":
        half = [(f"tdf[{2 * k}]", f"tdf[{2 * k + 1}]") for k in range(n // 2 + 1)]
        x = [_load(w, v) for v in half]
        x += [w.assign(x[n - k][0], f"-{x[n - k][1]}") for k in range(n // 2 + 1, n)]
    else:
        x = [(f"tdf[{2 * i}]", f"tdf[{2 * i + 1}]") for i in range(n)]
    x = [_load(w, v) for v in x]
    y = w.dft(x, c.sign)
    if c.fft_type == "c2r":
        for i in range(n):
            w.emit(f"tdf[{i}] = {y[i][0]}")
        return
    count = n // 2 + 1 if c.fft_type == "r2c" else n
    for i in range(count):
        w.emit(f"tdf[{2 * i}] = {y[i][0]}")
        w.emit(f"tdf[{2 * i + 1}] = {y[i][1]}")


def _load(w: SourceWriter, value: Complex) -> Complex:
    if value[0].isidentifier() and value[1].isidentifier():
        return value
    return w.assign(value[0], value[1], stem="x")


# -- Block execution -------------------------------------------------------------------------------------
def _block_body(w: SourceWriter, c: FFTConfig) -> None:
    n, e, t_count = c.size, c.elements_per_thread, c.threads_per_fft
    plane = c.plane
    w.emit("tdf = thread_data.view(REAL)")
    w.emit("t = cuda.threadIdx.x")
    if t_count > 1:
        w.emit("smf = shared_mem.view(REAL)")
        w.emit(f"re_base = cuda.threadIdx.y * {c.shared_stride}")
        w.emit(f"im_base = re_base + {plane if c.shared_planes == 2 else 0}")
    # With one plane the real parts are exchanged first, then the imaginary parts.
    phases = [("re", "im")] if c.shared_planes == 2 else [("re",), ("im",)]
    zero = w.const(0.0)

    barriers = _Barriers(w, c.regions)
    exchange = 0  # exchange k uses region k % c.regions

    # registers[i] holds element t + i * stride on entry.
    if c.fft_type == "r2c":
        regs = [w.assign(f"tdf[{i}]", zero, stem="x") for i in range(e)]
    elif c.fft_type == "c2r":
        regs = _hermitian_registers(w, c, phases, barriers)
        exchange += 1
    else:
        regs = [w.assign(f"tdf[{2 * i}]", f"tdf[{2 * i + 1}]", stem="x") for i in range(e)]

    radices = c.radices
    span = 1
    for index, radix in enumerate(radices):
        groups = e // radix  # butterflies per thread in this pass
        outputs: list[list[Complex]] = []
        for b in range(groups):
            x = [regs[b + r * groups] for r in range(radix)]
            if span > 1:
                x = _apply_twiddles(w, x, f"t + {b * t_count}", span, radix, c.sign)
            outputs.append(w.dft(x, c.sign))
        if index == len(radices) - 1:
            regs = [outputs[i % groups][i // groups] for i in range(e)]
        else:
            padding = c.paddings[index]
            writes = _output_slots(w, padding, outputs, t_count, span, radix)
            next_radix = radices[index + 1]
            reads = _input_slots(w, padding, n, t_count, next_radix, e // next_radix)
            region = exchange % c.regions
            regs = _exchange(w, writes, reads, phases, barriers, region, region * c.region_offset)
            exchange += 1
        span *= radix

    if c.fft_type == "c2r":
        for i in range(e):
            w.emit(f"tdf[{i}] = {regs[i][0]}")
        return
    count = e // 2 + 1 if c.fft_type == "r2c" else e
    for i in range(count):
        w.emit(f"tdf[{2 * i}] = {regs[i][0]}")
        w.emit(f"tdf[{2 * i + 1}] = {regs[i][1]}")


def _apply_twiddles(w: SourceWriter, x: list[Complex], j_expr: str, span: int, radix: int, sign: int):
    """Multiply x[r] by exp(sign 2 pi i r (j % span) / (span radix)), j given as an expression."""
    angle, sine, cosine = w.fresh("ang"), w.fresh("ws"), w.fresh("wc")
    step = w.const(sign * 2 / (span * radix))  # in units of pi
    w.emit(f"{angle} = REAL(({j_expr}) % {span}) * {step}")
    w.emit(f"{sine}, {cosine} = SINCOSPI({angle})")
    w1 = (cosine, sine)
    powers: dict[int, Complex] = {1: w1}
    for r in range(2, radix):
        half = r // 2
        powers[r] = w.mul(powers[half], powers[r - half])
    return [x[0]] + [w.mul(x[r], powers[r]) for r in range(1, radix)]


def _input_slots(w: SourceWriter, pad: Padding, n: int, t_count: int, radix: int, groups: int) -> list[str]:
    """Padded slots of element j + r * n / radix for each butterfly j = t + b * t_count, in register order."""
    slots: list[str] = [""] * (radix * groups)
    group = 1 << pad.shift
    t_residue = min(t_count, group) - 1  # t % group is at most this
    tp = w.fresh("tp")
    w.emit(f"{tp} = {pad.expr('t')}")
    for r in range(radix):
        for b in range(groups):
            offset = b * t_count + r * (n // radix)
            slot = pad.constant_offset(tp, t_residue, offset)
            if slot is None:
                q = w.fresh("q")
                w.emit(f"{q} = t + {offset}")
                slot = pad.expr(q)
            slots[b + r * groups] = slot
    return slots


def _output_slots(
    w: SourceWriter, pad: Padding, outputs: list[list[Complex]], t_count: int, span: int, radix: int
):
    """(slot, value) pairs: butterfly output r goes to (j // span) * span * radix + j % span + r * span."""
    group = 1 << pad.shift
    if span == 1:
        alignment = min(radix & -radix, group)  # d = j * radix is a multiple of this
        d_residue = group - alignment
    elif (span * radix) % group == 0 and span <= group:
        d_residue = span - 1  # d % group == j % span
    else:
        d_residue = group - 1
    writes: list[tuple[str, Complex]] = []
    for b, values in enumerate(outputs):
        j, d, dp = w.fresh("j"), w.fresh("d"), w.fresh("dp")
        w.emit(f"{j} = t + {b * t_count}")
        if span == 1:
            w.emit(f"{d} = {j} * {radix}")
        else:
            w.emit(f"{d} = ({j} // {span}) * {span * radix} + {j} % {span}")
        w.emit(f"{dp} = {pad.expr(d)}")
        for r, value in enumerate(values):
            slot = pad.constant_offset(dp, d_residue, r * span)
            if slot is None:
                q = w.fresh("q")
                w.emit(f"{q} = {d} + {r * span}")
                slot = pad.expr(q)
            writes.append((slot, value))
    return writes


class _Barriers:
    """Emits the block barriers of the exchanges: one between the writes and the reads of an exchange, and one
    before writes into a region read since the last barrier (at entry every region counts as read: the
    caller may have used the shared memory)."""

    def __init__(self, w: SourceWriter, regions: int):
        self.w = w
        self.read_since_barrier = set(range(regions))

    def before_write(self, region: int) -> None:
        if region in self.read_since_barrier:
            self.barrier()

    def barrier(self) -> None:
        self.w.emit("cuda.syncthreads()")
        self.read_since_barrier.clear()

    def after_read(self, region: int) -> None:
        self.read_since_barrier.add(region)


def _exchange(
    w: SourceWriter, writes, reads: list[str], phases, barriers: _Barriers, region: int, offset: int
) -> list[Complex]:
    """Write every (slot, value), then read ``reads`` back, one shared-memory plane per phase."""
    names = [(w.fresh("xr"), w.fresh("xi")) for _ in reads]
    base = {part: f"{part}_base" + (f" + {offset}" if offset else "") for part in ("re", "im")}
    for phase in phases:
        barriers.before_write(region)
        for slot, value in writes:
            for part in phase:
                w.emit(f"smf[IDX({base[part]} + {slot})] = {value[0 if part == 're' else 1]}")
        barriers.barrier()
        for slot, name in zip(reads, names):
            for part in phase:
                w.emit(f"{name[0 if part == 're' else 1]} = smf[IDX({base[part]} + {slot})]")
        barriers.after_read(region)
    return names


def _hermitian_registers(w: SourceWriter, c: FFTConfig, phases, barriers: _Barriers) -> list[Complex]:
    """c2r: load X[k] for k <= n // 2 and complete the spectrum with X[n - k] = conj(X[k])."""
    n, e, s = c.size, c.elements_per_thread, c.threads_per_fft
    half = n // 2
    given = e // 2 + 1  # complex slots holding the half spectrum
    if s == 1:
        regs = [w.assign(f"tdf[{2 * i}]", f"tdf[{2 * i + 1}]", stem="x") for i in range(min(given, e))]
        regs += [w.assign(regs[n - k][0], f"-{regs[n - k][1]}", stem="x") for k in range(len(regs), n)]
        return regs
    regs = [(w.fresh("xr"), w.fresh("xi")) for _ in range(e)]
    for phase in phases:
        barriers.before_write(0)
        for i in range(min(given, e)):
            lowest, highest = i * s, i * s + s - 1
            if lowest > half:
                continue
            guard = "" if highest <= half else f"if t + {i * s} <= {half}: "
            slot = HERMITIAN_PADDING.expr(f"t + {i * s}")
            for part in phase:
                w.emit(f"{guard}smf[IDX({part}_base + {slot})] = tdf[{2 * i + (part == 'im')}]")
        barriers.barrier()
        for i in range(e):
            lowest, highest = i * s, i * s + s - 1
            own = HERMITIAN_PADDING.expr(f"t + {i * s}")
            mirror = HERMITIAN_PADDING.expr(f"{n} - t - {i * s}")
            for part in phase:
                name = regs[i][part == "im"]
                own_read = f"smf[IDX({part}_base + {own})]"
                mirror_read = ("-" if part == "im" else "") + f"smf[IDX({part}_base + {mirror})]"
                if highest <= half:
                    w.emit(f"{name} = {own_read}")
                elif lowest > half:
                    w.emit(f"{name} = {mirror_read}")
                else:
                    w.emit(f"{name} = {own_read} if t + {i * s} <= {half} else {mirror_read}")
        barriers.after_read(0)
    return regs
