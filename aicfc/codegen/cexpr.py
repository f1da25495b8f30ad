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
from typing import Callable, Mapping

from aicfc.ir.lowered import Affine, Call, Const, Expr, Load, indirect_dims
from aicfc.ir.types import TensorType, contiguous_strides

UNARY = {
    "neg": "(-{0})", "exp": "aicf_exp({0})", "log": "logf({0})", "sqrt": "sqrtf({0})",
    "tanh": "tanhf({0})", "erf": "aicf_erf({0})", "sigmoid": "aicf_sigmoid({0})",
    "not": "(({0}) == 0.0f ? 1.0f : 0.0f)", "isnan": "(isnan({0}) ? 1.0f : 0.0f)",
    "cos": "cosf({0})", "sin": "sinf({0})",
}
BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "max": "fmaxf({0}, {1})", "min": "fminf({0}, {1})",
    "eq": "(({0}) == ({1}) ? 1.0f : 0.0f)",
    "gt": "(({0}) > ({1}) ? 1.0f : 0.0f)", "lt": "(({0}) < ({1}) ? 1.0f : 0.0f)",
    "ge": "(({0}) >= ({1}) ? 1.0f : 0.0f)", "le": "(({0}) <= ({1}) ? 1.0f : 0.0f)",
    "and": "(({0}) != 0.0f && ({1}) != 0.0f ? 1.0f : 0.0f)", "or": "(({0}) != 0.0f || ({1}) != 0.0f ? 1.0f : 0.0f)",
    "xor": "((({0}) != 0.0f) != (({1}) != 0.0f) ? 1.0f : 0.0f)",
    "fmod": "fmodf({0}, {1})", "mod": "aicf_mod({0}, {1})",
}
# Issue 18's element-wise functions (rintf rounds half to even in the default rounding mode).
UNARY.update({"abs": "fabsf({0})", "floor": "floorf({0})", "ceil": "ceilf({0})", "round": "rintf({0})",
              "softplus": "aicf_softplus({0})"})
# The trigonometric and hyperbolic functions and expm1: libm's single-precision ones
UNARY.update({fn: f"{fn}f({{0}})" for fn in ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
                                             "expm1")})
TERNARY = {"select": "(({0}) != 0.0f ? ({1}) : ({2}))"}
# An integer compute's functions ([Note: Integer computes]): int64 arithmetic; a comparison or
# logic op gives 1 or 0. Nothing else reaches one (the importer allows integers at run time
# only in the ops these spell: ops.INTEGER_RUNTIME).
INT_UNARY = {"neg": "(-{0})", "abs": "llabs({0})", "not": "(({0}) == 0LL ? 1LL : 0LL)"}
INT_BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})",
    "max": "max({0}, {1})", "min": "min({0}, {1})",
    "eq": "(({0}) == ({1}) ? 1LL : 0LL)", "gt": "(({0}) > ({1}) ? 1LL : 0LL)", "lt": "(({0}) < ({1}) ? 1LL : 0LL)",
    "ge": "(({0}) >= ({1}) ? 1LL : 0LL)", "le": "(({0}) <= ({1}) ? 1LL : 0LL)",
    "and": "(({0}) != 0LL && ({1}) != 0LL ? 1LL : 0LL)", "or": "(({0}) != 0LL || ({1}) != 0LL ? 1LL : 0LL)",
    "xor": "((({0}) != 0LL) != (({1}) != 0LL) ? 1LL : 0LL)",
    "idiv": "aicf_idiv({0}, {1})", "fmod": "aicf_ifmod({0}, {1})", "mod": "aicf_imod({0}, {1})",
}
INT_TERNARY = {"select": "(({0}) != 0LL ? ({1}) : ({2}))"}


def int_literal(x: float) -> str:
    if not math.isfinite(x) or x != int(x):
        raise ValueError(f"internal: literal {x!r} in an integer compute")
    return f"{int(x)}LL"


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


def reciprocal_divisions(e: Expr, invariant: Callable[[Expr], bool]) -> Expr:
    """e with every div(a, b) whose divisor is the same for all the elements a loop visits
    (`invariant`: a literal, a row's statistics) as mul(a, 1/b): the division runs once per
    row (the compiler keeps one 1/b for the unrolled elements) or at compile time, not once
    per element. The product differs from the quotient by one more rounding (about an ulp)."""
    if not isinstance(e, Call):
        return e
    args = tuple(reciprocal_divisions(a, invariant) for a in e.args)
    if e.fn == "div" and invariant(args[1]) and args[0] != Const(1.0):
        b = args[1]
        if isinstance(b, Const):
            if b.value == 0.0 or not math.isfinite(b.value):
                return Call(e.fn, args)
            return Call("mul", (args[0], Const(1.0 / b.value)))
        return Call("mul", (args[0], Call("div", (Const(1.0), b))))
    return Call(e.fn, args)


def contains(e: Expr, part: Expr) -> bool:
    return e == part or (isinstance(e, Call) and any(contains(a, part) for a in e.args))


def guard_condition(ld: Load, t: TensorType, names: Mapping[str, str]) -> str:
    """The C test that a guarded load's computed indices lie inside the buffer ("" when the
    load is not guarded): one unsigned comparison per guarded dimension, a negative index
    wrapping to a large one ([Note: Lowered IR], guarded loads)."""
    return " && ".join(f"(unsigned)({c_affine(ld.index[d], names)}) < {t.shape[d]}u" for d in ld.guarded_dims)


def c_affine(a: Affine, names: Mapping[str, str]) -> str:
    """The C expression of an affine form; a variable named "0" (held at zero: an extent-1 loop, a
    FLAT GEMM's merged image index) drops out rather than printing `stride * 0`."""
    parts = [names[v] if c == 1 else f"{c} * {names[v]}" for v, c in a.terms if names[v] != "0"]
    if a.const or not parts:
        parts.append(str(a.const))
    return " + ".join(parts)


def c_offset(ld: Load, params: Mapping[str, str], types: Mapping[str, TensorType], names: Mapping[str, str]) -> str:
    """The C element offset of an access. An indirect entry ([Note: Indirect index]) adds its
    stride times the id read as an integer (`long long`), wrapped and clamped by `aicf_index`
    (codegen/module.py); the affine entries give one affine form as for any load."""
    t = types[ld.buffer]
    dims = indirect_dims(ld)
    if not dims:
        return c_affine(flat_offset(ld.index, t), names)   # type: ignore[arg-type]
    strides = contiguous_strides(t.shape)
    parts = [c_affine(flat_offset(tuple(Affine() if d in dims else a for d, a in enumerate(ld.index)), t), names)]
    for d in dims:
        ids = ld.index[d].ids   # type: ignore[union-attr]
        at = c_affine(flat_offset(ids.index, types[ids.buffer]), names)
        parts.append(f"{strides[d]}LL * aicf_index(__ldg({params[ids.buffer]} + ({at})), {t.shape[d]}LL)")
    return " + ".join(parts)


class Emitter:
    """Emits statements for expressions over one kernel's loop variables."""

    def __init__(self, params: Mapping[str, str], types: Mapping[str, TensorType], prefix: str = "t",
                 integer: bool = False):
        self.params = params          # buffer name -> C parameter name
        self.types = types
        self.prefix = prefix
        self.integer = integer        # an integer compute's body: int64 ([Note: Integer computes])
        self.scalar = "long long" if integer else "float"
        self.lines: list[str] = []
        self.memo: dict[Expr, str] = {}
        self.count = 0

    def emit(self, e: Expr, names: Mapping[str, str], registers: Mapping[str, str] = {},
             values: Mapping[Expr, str] = {}) -> str:
        """C expression (a variable or literal) for `e`. `registers` maps buffers held in
        registers (a row's statistics); `values` maps subexpressions whose value a schedule
        already holds (an element of a vector loaded, or of a row cached, before the loop)."""
        key = (e, tuple(sorted(names.items())), tuple(sorted(registers.items())), tuple(values.items()))
        if key in self.memo:
            return self.memo[key]
        if e in values:
            return values[e]
        if isinstance(e, Const):
            return int_literal(e.value) if self.integer else literal(e.value)
        if isinstance(e, Load):
            if e.buffer in registers:
                return registers[e.buffer]
            code = self.load(e, names)
        else:
            assert isinstance(e, Call)
            args = [self.emit(a, names, registers, values) for a in e.args]
            table = ({1: INT_UNARY, 2: INT_BINARY, 3: INT_TERNARY} if self.integer
                     else {1: UNARY, 2: BINARY, 3: TERNARY})[len(args)]
            if e.fn not in table:
                raise ValueError(f"internal: {e.fn} in an integer compute")
            code = table[e.fn].format(*args)
        var = f"{self.prefix}{self.count}"
        self.count += 1
        self.lines.append(f"const {self.scalar} {var} = {code};")
        self.memo[key] = var
        return var

    def load(self, e: Load, names: Mapping[str, str]) -> str:
        """A scalar read of one access, converted to float (to int64 in an integer compute; no
        statement emitted)."""
        off = c_offset(e, self.params, self.types, names)
        dtype = self.types[e.buffer].dtype
        # __ldg (the read-only cache path) has no overload for bool: a plain read there.
        code = f"{self.params[e.buffer]}[{off}]" if dtype == "bool" else f"__ldg({self.params[e.buffer]} + ({off}))"
        if self.integer:
            code = code if dtype == "i64" else f"static_cast<long long>({code})"
        else:
            code = code if dtype == "f32" else f"static_cast<float>({code})"
        guard = guard_condition(e, self.types[e.buffer], names)
        fill = int_literal(e.fill) if self.integer and guard else literal(e.fill) if guard else ""
        return f"({guard} ? {code} : {fill})" if guard else code

    def take(self) -> list[str]:
        """The statements emitted so far; starts a fresh scope (no sharing across scopes)."""
        lines, self.lines, self.memo = self.lines, [], {}
        return lines
