"""Lowered scalar expressions → CUDA C statements.

An `Emitter` turns a body into SSA statements (`float t3 = ...;`), sharing structurally equal
subexpressions: after inlining, the same `add(load(%mm), load(%b))` may appear twice in a
GELU, and it is computed once. Loads become `p2[offset]` where the offset is the access's
affine index dotted with the buffer's row-major strides, written over the kernel's C loop
variables. Shapes and strides are compile-time constants: nothing about them is passed to or
computed on the device at run time.
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.ir.lowered import Affine, Call, Const, Expr, Load
from aicfc.ir.types import TensorType, contiguous_strides

UNARY = {
    "neg": "(-{0})", "exp": "expf({0})", "log": "logf({0})", "sqrt": "sqrtf({0})",
    "tanh": "tanhf({0})", "erf": "erff({0})", "sigmoid": "(1.0f / (1.0f + expf(-{0})))",
}
BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "max": "fmaxf({0}, {1})", "min": "fminf({0}, {1})",
}


def literal(x: float) -> str:
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    r = repr(float(x))
    return (r if ("." in r or "e" in r) else r + ".0") + "f"


def flat_offset(index: tuple[Affine, ...], t: TensorType) -> Affine:
    """The element offset of an access into a dense row-major buffer, as one affine form."""
    coeffs: dict[str, int] = {}
    const = 0
    for a, s in zip(index, contiguous_strides(t.shape)):
        const += a.const * s
        for v, c in a.terms:
            coeffs[v] = coeffs.get(v, 0) + c * s
    return Affine.of(coeffs, const)


def c_affine(a: Affine, names: Mapping[str, str]) -> str:
    parts = [names[v] if c == 1 else f"{c} * {names[v]}" for v, c in a.terms]
    if a.const or not parts:
        parts.append(str(a.const))
    return " + ".join(parts)


class Emitter:
    """Emits statements for expressions over one kernel's loop variables."""

    def __init__(self, params: Mapping[str, str], types: Mapping[str, TensorType], prefix: str = "t"):
        self.params = params          # buffer name -> C parameter name
        self.types = types
        self.prefix = prefix
        self.lines: list[str] = []
        self.memo: dict[Expr, str] = {}
        self.count = 0

    def emit(self, e: Expr, names: Mapping[str, str], registers: Mapping[str, str] = {}) -> str:
        """C expression (a variable or literal) for `e`. `registers` maps buffers held in registers."""
        key = (e, tuple(sorted(names.items())), tuple(sorted(registers.items())))
        if key in self.memo:
            return self.memo[key]
        if isinstance(e, Const):
            return literal(e.value)
        if isinstance(e, Load):
            if e.buffer in registers:
                return registers[e.buffer]
            off = c_affine(flat_offset(e.index, self.types[e.buffer]), names)
            code = f"__ldg({self.params[e.buffer]} + ({off}))"
            if self.types[e.buffer].dtype != "f32":
                code = f"static_cast<float>({code})"
        else:
            assert isinstance(e, Call)
            args = [self.emit(a, names, registers) for a in e.args]
            code = (UNARY[e.fn] if len(args) == 1 else BINARY[e.fn]).format(*args)
        var = f"{self.prefix}{self.count}"
        self.count += 1
        self.lines.append(f"const float {var} = {code};")
        self.memo[key] = var
        return var

    def take(self) -> list[str]:
        """The statements emitted so far; starts a fresh scope (no sharing across scopes)."""
        lines, self.lines, self.memo = self.lines, [], {}
        return lines
