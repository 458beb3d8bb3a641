"""Straight-line Python source for complex arithmetic on (real, imaginary) variable pairs.

Generated code calls ``cuda.fma(a, b, c)`` (``a * b + c``, one rounding on a GPU) for products.

Generated kernels never use Numba's complex type inside the transform: every complex value is a pair of
real variables, every constant is a named global of the working precision (so fp32 code never promotes to
fp64), and every DFT of a small radix is written out fully, with its twiddles as constants.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["SourceWriter", "Complex"]

#: A complex value in generated code: the names of the variables holding its real and imaginary parts.
Complex = tuple[str, str]


class SourceWriter:
    """Accumulates generated statements, fresh variable names and named real constants.

    Examples
    --------
    >>> w = SourceWriter(np.float32)
    >>> out = w.dft([("ar", "ai"), ("br", "bi")], sign=-1)
    >>> len(out), len(w.lines)
    (2, 4)
    """

    def __init__(self, real_type: type[np.floating], indent: str = "    "):
        self.real_type = real_type
        self.indent = indent
        self.lines: list[str] = []
        self.constants: dict[str, np.floating] = {}
        self._constant_names: dict[float, str] = {}
        self._counter = 0

    # -- bookkeeping -------------------------------------------------------------------------------------
    def emit(self, statement: str) -> None:
        """Append one statement at the current indentation."""
        self.lines.append(self.indent + statement)

    def fresh(self, stem: str = "v") -> str:
        """A variable name not used before."""
        self._counter += 1
        return f"{stem}{self._counter}"

    def const(self, value: float) -> str:
        """Name of a global holding ``value`` in the working precision."""
        value = float(value)
        name = self._constant_names.get(value)
        if name is None:
            name = f"K{len(self._constant_names)}"
            self._constant_names[value] = name
            self.constants[name] = self.real_type(value)
        return name

    def assign(self, real_expr: str, imag_expr: str, stem: str = "v") -> Complex:
        """Bind two expressions to fresh variables and return them as a complex pair."""
        re, im = self.fresh(stem + "r"), self.fresh(stem + "i")
        self.emit(f"{re} = {real_expr}")
        self.emit(f"{im} = {imag_expr}")
        return re, im

    # -- arithmetic --------------------------------------------------------------------------------------
    def add(self, a: Complex, b: Complex) -> Complex:
        return self.assign(f"{a[0]} + {b[0]}", f"{a[1]} + {b[1]}")

    def sub(self, a: Complex, b: Complex) -> Complex:
        return self.assign(f"{a[0]} - {b[0]}", f"{a[1]} - {b[1]}")

    def mul(self, a: Complex, b: Complex) -> Complex:
        """Product of two runtime complex values (two multiplies and two fused multiply-adds)."""
        return self.assign(
            f"cuda.fma({a[0]}, {b[0]}, -({a[1]} * {b[1]}))", f"cuda.fma({a[0]}, {b[1]}, {a[1]} * {b[0]})"
        )

    def mul_unit(self, a: Complex, angle: float) -> Complex:
        """``a * exp(i * angle)`` with the constant factor folded in (exact for multiples of pi/4)."""
        eighth = angle / (math.pi / 4)
        if abs(eighth - round(eighth)) < 1e-12:
            octant = int(round(eighth)) % 8
            if octant == 0:
                return a
            if octant == 2:  # i
                return self.assign(f"-{a[1]}", f"{a[0]}")
            if octant == 4:  # -1
                return self.assign(f"-{a[0]}", f"-{a[1]}")
            if octant == 6:  # -i
                return self.assign(f"{a[1]}", f"-{a[0]}")
            h = self.const(math.sqrt(0.5))
            if octant == 1:  # (1 + i) / sqrt 2
                return self.assign(f"({a[0]} - {a[1]}) * {h}", f"({a[0]} + {a[1]}) * {h}")
            if octant == 3:  # (-1 + i) / sqrt 2
                return self.assign(f"-({a[0]} + {a[1]}) * {h}", f"({a[0]} - {a[1]}) * {h}")
            if octant == 5:  # (-1 - i) / sqrt 2
                return self.assign(f"({a[1]} - {a[0]}) * {h}", f"-({a[0]} + {a[1]}) * {h}")
            return self.assign(f"({a[0]} + {a[1]}) * {h}", f"({a[1]} - {a[0]}) * {h}")  # (1 - i)/sqrt 2
        c, s = self.const(math.cos(angle)), self.const(math.sin(angle))
        return self.assign(f"cuda.fma({a[0]}, {c}, -({a[1]} * {s}))", f"cuda.fma({a[0]}, {s}, {a[1]} * {c})")

    # -- transforms --------------------------------------------------------------------------------------
    def dft(self, x: Sequence[Complex], sign: int) -> list[Complex]:
        """Emit an unnormalised DFT of ``len(x)`` points, ``X[k] = sum_n x[n] exp(sign 2 pi i n k / R)``.

        Composite lengths are split by decimation in time (radix 4 first, then the smallest prime), with
        constant twiddles; prime lengths use the symmetric direct form.
        """
        radix = len(x)
        if radix == 1:
            return list(x)
        if radix == 2:
            return [self.add(x[0], x[1]), self.sub(x[0], x[1])]
        p = 4 if radix % 4 == 0 and radix != 4 else _smallest_prime_factor(radix)
        if p == radix or radix == 4:
            return self._dft_4(x, sign) if radix == 4 else self._dft_prime(x, sign)
        m = radix // p
        parts = [self.dft(x[j::p], sign) for j in range(p)]
        out: list[Complex] = [("", "")] * radix
        for k in range(m):
            column = [self.mul_unit(parts[j][k], sign * 2 * math.pi * j * k / radix) for j in range(p)]
            for q, value in enumerate(self.dft(column, sign)):
                out[k + m * q] = value
        return out

    def _dft_4(self, x: Sequence[Complex], sign: int) -> list[Complex]:
        s0, d0 = self.add(x[0], x[2]), self.sub(x[0], x[2])
        s1, d1 = self.add(x[1], x[3]), self.sub(x[1], x[3])
        rot = self.mul_unit(d1, sign * math.pi / 2)  # sign * i * d1
        return [self.add(s0, s1), self.add(d0, rot), self.sub(s0, s1), self.sub(d0, rot)]

    def _dft_prime(self, x: Sequence[Complex], sign: int) -> list[Complex]:
        p = len(x)
        half = (p - 1) // 2
        sums = [self.add(x[j], x[p - j]) for j in range(1, half + 1)]
        diffs = [self.sub(x[j], x[p - j]) for j in range(1, half + 1)]
        total_r = " + ".join([x[0][0]] + [s[0] for s in sums])
        total_i = " + ".join([x[0][1]] + [s[1] for s in sums])
        out: list[Complex] = [self.assign(total_r, total_i)] + [("", "")] * (p - 1)
        for k in range(1, half + 1):
            cos_terms = [(self.const(math.cos(2 * math.pi * j * k / p)), s) for j, s in enumerate(sums, 1)]
            sin_terms = [(self.const(math.sin(2 * math.pi * j * k / p)), d) for j, d in enumerate(diffs, 1)]
            a = self.assign(
                _fma_chain(x[0][0], [(c, s[0]) for c, s in cos_terms]),
                _fma_chain(x[0][1], [(c, s[1]) for c, s in cos_terms]),
            )
            first_c, first_d = sin_terms[0]
            b = self.assign(
                _fma_chain(f"{first_c} * {first_d[0]}", [(c, d[0]) for c, d in sin_terms[1:]]),
                _fma_chain(f"{first_c} * {first_d[1]}", [(c, d[1]) for c, d in sin_terms[1:]]),
            )
            # X[k] = a + i*sign*b, X[p-k] = a - i*sign*b
            if sign < 0:
                out[k] = self.assign(f"{a[0]} + {b[1]}", f"{a[1]} - {b[0]}")
                out[p - k] = self.assign(f"{a[0]} - {b[1]}", f"{a[1]} + {b[0]}")
            else:
                out[k] = self.assign(f"{a[0]} - {b[1]}", f"{a[1]} + {b[0]}")
                out[p - k] = self.assign(f"{a[0]} + {b[1]}", f"{a[1]} - {b[0]}")
        return out

    def source(self, header: str) -> str:
        """The function text: ``header`` line followed by the emitted body."""
        return "\n".join([header, *self.lines, self.indent + "return"]) + "\n"


def _fma_chain(start: str, terms: Sequence[tuple[str, str]]) -> str:
    """``start + sum(c * v)`` as nested fused multiply-adds."""
    expr = start
    for c, v in terms:
        expr = f"cuda.fma({c}, {v}, {expr})"
    return expr


def _smallest_prime_factor(n: int) -> int:
    for p in range(2, int(math.isqrt(n)) + 1):
        if n % p == 0:
            return p
    return n
