"""Lowered IR: every op as a compute definition, no kernel names.

[Note: Lowered IR]
A `Compute` defines one tensor element-wise over its own shape. Its iteration domain is the
output shape, with one loop variable per dimension named i0, i1, ...; reductions add r0, r1,
... over `reduce` extents, combined with `sum`, `max`, `min` or `prod`. The `body` is a scalar expression whose
only memory reads are `load(%buf, [affine, ...])`, one affine index per dimension of the buffer
(an integer combination of loop variables plus a constant). Size-1 broadcast dimensions read
index 0. Every buffer is dense row-major, so an access is a linear function of the loop
variables: this is what lets passes compose accesses (transpose folding, inlining) and lets
codegen emit one multiply-add per variable. A `View` reinterprets a buffer with another shape
(Reshape); it moves no data.

A guarded load `load(%x, [...], fill=0.0)` reads `fill` wherever an index falls outside its
dimension (zero padding of a convolution, -inf padding of a max pool). The guard is on the
computed dimensions, and on those `guard=[d, ...]` names: a Concat along axis d reads input k
as `load(%xk, [i0, i1+-off_k, ...], fill=0.0)` (i1+-off_k is computed) or, for the first input,
`load(%x0, [i0, i1, ...], fill=0.0, guard=[1])`, and sums the terms: exactly one is not the fill
at each element. Any other dimension (a plain variable or a constant) must stay in bounds as in
any load (the verifier checks it), so codegen tests just the guarded ones, each by one unsigned
comparison. A guarded dimension must be inside its buffer for some point of the domain.
Substituting variables (`reindex`) keeps every guarded dimension guarded, since the test is on
the index's value; passes that change the buffer read keep the guard only where the
per-dimension test survives: access folding through a view and inlining a producer into a
guarded load are declined.

    %h: f32[4,128] = sum[64] mul(load(%x, [i0, r0]), load(%w1, [r0, i1])) from ["mm1"]
    %y: f32[4,128] = map max(load(%h, [i0, i1]), 0.0) from ["relu1"]
    %v: f32[512] = view %y from ["flat"]
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Union

from aicfc.errors import AicfError
from aicfc.ir import text
from aicfc.ir.types import TensorType, Value, Weight

# Scalar functions the body may call, with their arity. Codegen and the interpreter implement
# exactly these; the verifier rejects anything else.
FNS: dict[str, int] = {
    "add": 2, "sub": 2, "mul": 2, "div": 2, "max": 2, "min": 2,
    "neg": 1, "exp": 1, "log": 1, "sqrt": 1, "tanh": 1, "erf": 1, "sigmoid": 1,
    # Equal and Where (issue 6): eq gives 1.0 or 0.0; select(c, a, b) is a where c != 0, else b.
    "eq": 2, "select": 3,
    # Comparisons, logic and IsNaN (masks): 1.0 or 0.0, a logic input is true where != 0.
    "gt": 2, "lt": 2, "ge": 2, "le": 2, "and": 2, "or": 2, "xor": 2, "not": 1, "isnan": 1,
    # Issue 18's element-wise ops: round is half to even; softplus is log(1 + exp(x)) without
    # overflow; fmod is C's fmodf (the sign of a), mod the floored remainder (the sign of b).
    "abs": 1, "floor": 1, "ceil": 1, "round": 1, "softplus": 1, "fmod": 2, "mod": 2,
    "cos": 1, "sin": 1,
    # ONNX's other trigonometric and hyperbolic functions (NaN outside their domains); expm1 is
    # exp(x) - 1 without the cancellation near 0 (Elu, Selu, Celu).
    "tan": 1, "asin": 1, "acos": 1, "atan": 1, "sinh": 1, "cosh": 1, "asinh": 1, "acosh": 1, "atanh": 1, "expm1": 1,
    # ONNX Div on integers: the quotient truncated toward zero; only in an integer compute
    # ([Note: Integer computes]), where a zero divisor gives 0 (ONNX leaves it undefined).
    "idiv": 2,
}
COMBINERS = ("map", "sum", "max", "min", "prod")


@dataclass(frozen=True, slots=True)
class Affine:
    """sum(coeff * var) + const, terms sorted by variable name, no zero coefficients."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def var(name: str) -> Affine:
        return Affine(((name, 1),))

    @staticmethod
    def of(coeffs: Mapping[str, int], const: int = 0) -> Affine:
        return Affine(tuple(sorted((v, c) for v, c in coeffs.items() if c)), const)

    def coeff(self, var: str) -> int:
        return dict(self.terms).get(var, 0)

    def substitute(self, mapping: Mapping[str, Affine]) -> Affine:
        """Replace variables by affine expressions (variables not in `mapping` stay)."""
        coeffs: dict[str, int] = {}
        const = self.const
        for v, c in self.terms:
            if v in mapping:
                sub = mapping[v]
                const += c * sub.const
                for w, d in sub.terms:
                    coeffs[w] = coeffs.get(w, 0) + c * d
            else:
                coeffs[v] = coeffs.get(v, 0) + c
        return Affine.of(coeffs, const)

    def bounds(self, extents: Mapping[str, int]) -> tuple[int, int]:
        lo = hi = self.const
        for v, c in self.terms:
            top = c * (extents[v] - 1)
            lo, hi = lo + min(0, top), hi + max(0, top)
        return lo, hi

    def __str__(self) -> str:
        parts = [v if c == 1 else f"{c}*{v}" for v, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return "+".join(parts)


@dataclass(frozen=True, slots=True)
class Load:
    buffer: str
    index: tuple[Affine | Indirect, ...]   # an Indirect entry: [Note: Indirect index]
    fill: float | None = None   # guarded load: the value read outside the buffer (see the note)
    # Dimensions indexed by a plain variable (or a constant) that the guard tests too: a Concat
    # input along its axis. Sorted; only dimensions `computed_dims` does not already give.
    guard: tuple[int, ...] = ()

    @property
    def computed_dims(self) -> tuple[int, ...]:
        """The affine dimensions indexed by neither a plain variable nor a constant."""
        return tuple(d for d, a in enumerate(self.index) if isinstance(a, Affine) and not (
            not a.terms or (len(a.terms) == 1 and a.terms[0][1] == 1 and a.const == 0)))

    @property
    def guarded_dims(self) -> tuple[int, ...]:
        """The dimensions a guarded load tests: the computed ones and those named in `guard`."""
        if self.fill is None:
            return ()
        return tuple(sorted(set(self.computed_dims) | set(self.guard)))


@dataclass(frozen=True, slots=True)
class Const:
    value: float


@dataclass(frozen=True, slots=True)
class Call:
    fn: str
    args: tuple[Expr, ...]


Expr = Union[Load, Const, Call]


# ---------------------------------------------------------------- indirect indices (Gather, issue 6)
# [Note: Indirect index]
# One index entry of a load may be read from memory instead of being affine: in
# `load(%emb, [@load(%ids, [i0, i1]), i2])` dimension 0 is the integer ids[i0, i1] (an i64 or
# i32 buffer, read at affine indices, unguarded, itself never indirect). This is a Gather with
# run-time indices (an embedding lookup). The id x of a dimension of extent n is used as
#     x + n if x < 0 (ONNX: negative indices count from the end), then clamped into 0..n-1,
# so no id, however invalid, reads outside the buffer: an id >= n reads row n-1, an id < -n
# reads row 0 (ONNX leaves out-of-range ids undefined; this is the defined answer). The
# interpreter, the verifier (which skips the bounds check of such a dimension: the clamp is
# the bound) and codegen (`aicf_index` in codegen/module.py) implement exactly this rule.
# An indirect load is never guarded (no `fill`). Passes that reason about affine accesses
# treat it conservatively: not tile-compatible, not composed through a view, not inlined into
# (neither the data read through it nor the ids), strided for vectors, never in place.

@dataclass(frozen=True, slots=True)
class Indirect:
    """An index entry read from memory: `@load(%ids, [affine, ...])` ([Note: Indirect index])."""

    ids: Load

    def substitute(self, mapping: Mapping[str, Affine]) -> Indirect:
        return Indirect(Load(self.ids.buffer, tuple(a.substitute(mapping) for a in self.ids.index)))

    def __str__(self) -> str:
        return "@" + print_expr(self.ids)


Index = Union[Affine, Indirect]


def indirect_dims(ld: Load) -> tuple[int, ...]:
    return tuple(d for d, a in enumerate(ld.index) if isinstance(a, Indirect))


def index_vars(a: Index) -> set[str]:
    """The loop variables an index entry depends on (an indirect one: those of its id's access)."""
    if isinstance(a, Indirect):
        return {v for b in a.ids.index for v, _ in b.terms}
    return {v for v, _ in a.terms}


def index_loads(e: Expr) -> list[Load]:
    """The accesses of `e` read as indices (the ids of indirect entries), not as values."""
    return [a.ids for ld in loads(e) for a in ld.index if isinstance(a, Indirect)]


def has_indirect(e: Expr) -> bool:
    return any(indirect_dims(ld) for ld in loads(e))


@dataclass(frozen=True, slots=True)
class Compute:
    out: str
    type: TensorType
    combiner: str
    reduce: tuple[int, ...]
    body: Expr
    origin: tuple[str, ...] = ()

    @property
    def domain_vars(self) -> tuple[str, ...]:
        return tuple(f"i{k}" for k in range(len(self.type.shape)))

    @property
    def reduce_vars(self) -> tuple[str, ...]:
        return tuple(f"r{k}" for k in range(len(self.reduce)))

    def extents(self) -> dict[str, int]:
        return dict(zip(self.domain_vars + self.reduce_vars, self.type.shape + self.reduce))


@dataclass(frozen=True, slots=True)
class View:
    out: str
    type: TensorType
    source: str
    origin: tuple[str, ...] = ()


Op = Union[Compute, View]


@dataclass(frozen=True, slots=True)
class Rewrite:
    """A record of one rewrite considered: applied or declined, and why, in words."""

    rule: str
    target: str
    applied: bool
    reason: str
    bytes_saved: int = 0


@dataclass(frozen=True, slots=True)
class Program:
    name: str
    inputs: tuple[Value, ...]
    weights: tuple[Weight, ...]
    ops: tuple[Op, ...]
    outputs: tuple[str, ...]
    rewrites: tuple[Rewrite, ...] = ()

    def replace(self, **changes: Any) -> Program:
        new = dataclasses.replace(self, **changes)
        return self if new == self else new

    def types(self) -> dict[str, TensorType]:
        out = {v.name: v.type for v in self.inputs}
        out.update({w.name: w.type for w in self.weights})
        out.update({op.out: op.type for op in self.ops})
        return out

    def __str__(self) -> str:
        return print_program(self)


# ---------------------------------------------------------------- expression helpers

def loads(e: Expr) -> list[Load]:
    """Every access of `e`, the ids an indirect index reads included (after their load)."""
    if isinstance(e, Load):
        return [e] + [a.ids for a in e.index if isinstance(a, Indirect)]
    if isinstance(e, Call):
        return [ld for a in e.args for ld in loads(a)]
    return []


# [Note: Integer computes]
# A body has no types of its own: it computes in float (fp32 in a kernel, the interpreter's
# dtype), its loads converted on read and its result on store. A compute whose result and every
# value it loads are integers or bools, with at least one integer among them, is an integer
# compute instead: its body runs in int64 (`long long` in a kernel, np.int64 in the
# interpreter), its literals are integers, so position ids and masks computed at run time
# (RoBERTa's CumSum of its non-padding mask, masks multiplied and compared) are exact at any
# magnitude, not only below 2**24. The ids of an indirect index are read as integers either
# way and do not count. Inlining keeps the distinction (passes/inline_producers.py): an integer
# compute's arithmetic is never moved into a float body, nor a float-to-integer conversion
# into an integer body.
INTEGER_DTYPES = ("i64", "i32")


def value_loads(e: Expr) -> list[Load]:
    """The accesses whose values `e` computes with (not the ids of an indirect index)."""
    if isinstance(e, Load):
        return [e]
    if isinstance(e, Call):
        return [ld for a in e.args for ld in value_loads(a)]
    return []


def is_integer_compute(dtype: str, body: Expr, types: Mapping[str, TensorType]) -> bool:
    """Whether a compute with result `dtype` and `body` is an integer compute
    ([Note: Integer computes]); `types` gives the dtype of every buffer the body loads."""
    dtypes = [dtype] + [types[ld.buffer].dtype for ld in value_loads(body)]
    return all(d in INTEGER_DTYPES or d == "bool" for d in dtypes) and any(d in INTEGER_DTYPES for d in dtypes)


def map_loads(e: Expr, fn) -> Expr:
    """Rebuild `e` with every Load replaced by fn(load) (which may return any Expr). The ids of
    an indirect index are not visited: passes decline what reads through them ([Note: Indirect index])."""
    if isinstance(e, Load):
        return fn(e)
    if isinstance(e, Call):
        return Call(e.fn, tuple(map_loads(a, fn) for a in e.args))
    return e


def substitute(e: Expr, mapping: Mapping[str, Affine]) -> Expr:
    """Rename loop variables inside every access of `e`."""
    return map_loads(e, lambda ld: reindex(ld, tuple(a.substitute(mapping) for a in ld.index)))


def reindex(ld: Load, index: tuple[Affine, ...]) -> Load:
    """`ld` reading at `index` instead: every dimension it guarded stays guarded (one that became
    a plain variable or a constant is named in `guard`), since the test is on the index's value."""
    new = dataclasses.replace(ld, index=index, guard=())
    if ld.fill is None:
        return new
    computed = set(new.computed_dims)
    return dataclasses.replace(new, guard=tuple(d for d in ld.guarded_dims if d not in computed))


def reader_names(ops) -> dict[str, list[str]]:
    """buffer -> the outputs of the ops that read it (a Compute's loads, a View's source), each
    op once, in program order."""
    readers: dict[str, list[str]] = {}
    for op in ops:
        names = [ld.buffer for ld in loads(op.body)] if isinstance(op, Compute) else [op.source]
        for n in dict.fromkeys(names):
            readers.setdefault(n, []).append(op.out)
    return readers


def view_base(views) -> Callable[[str], str]:
    """name -> the buffer its chain of views starts from (a name that is no view, itself)."""
    source = {v.out: v.source for v in views}

    def base(name: str) -> str:
        while name in source:
            name = source[name]
        return name
    return base


def count_ops(e: Expr) -> int:
    return 1 + sum(count_ops(a) for a in e.args) if isinstance(e, Call) else 0


def identity_index(rank: int) -> tuple[Affine, ...]:
    return tuple(Affine.var(f"i{k}") for k in range(rank))


# ---------------------------------------------------------------- printer

def print_expr(e: Expr) -> str:
    if isinstance(e, Load):
        fill = "" if e.fill is None else f", fill={text.number(e.fill)}"
        if e.guard:
            fill += f", guard=[{', '.join(map(str, e.guard))}]"
        return f"load({text.name(e.buffer)}, [{', '.join(str(a) for a in e.index)}]{fill})"
    if isinstance(e, Const):
        return text.number(e.value)
    return f"{e.fn}({', '.join(print_expr(a) for a in e.args)})"


def print_op(op: Op) -> str:
    origin = f" from {text.attr_value(op.origin)}" if op.origin else ""
    if isinstance(op, View):
        return f"{text.name(op.out)}: {op.type} = view {text.name(op.source)}{origin}"
    head = op.combiner if op.combiner == "map" else f"{op.combiner}[{','.join(map(str, op.reduce))}]"
    return f"{text.name(op.out)}: {op.type} = {head} {print_expr(op.body)}{origin}"


def print_rewrite(r: Rewrite) -> str:
    verdict = "applied" if r.applied else "declined"
    return (f"rewrite {text.attr_value(r.rule)} {text.name(r.target)} {verdict} "
            f"{text.attr_value(r.reason)} saved={r.bytes_saved}")


def print_header(kind: str, p: Any) -> list[str]:
    lines = [f"{kind} {text.attr_value(p.name)} {{"]
    lines += [f"  input {text.name(v.name)}: {v.type}" for v in p.inputs]
    lines += [f"  weight {text.name(w.name)}: {w.type} sha256=\"{w.sha256}\"" for w in p.weights]
    return lines


def print_program(p: Program) -> str:
    lines = print_header("lowered", p)
    lines += [f"  {print_op(op)}" for op in p.ops]
    lines += [f"  output {text.name(o)}" for o in p.outputs]
    lines += [f"  {print_rewrite(r)}" for r in p.rewrites]
    return "\n".join(lines + ["}"]) + "\n"


# ---------------------------------------------------------------- parser

def parse_affine(c: text.Cursor) -> Affine:
    coeffs: dict[str, int] = {}
    const = 0
    while True:
        if c.peek.kind == "number":
            k = c.integer()
            if c.accept("*"):
                v = c.ident()
                coeffs[v] = coeffs.get(v, 0) + k
            else:
                const += k
        else:
            v = c.ident()
            coeffs[v] = coeffs.get(v, 0) + 1
        if not c.accept("+"):
            return Affine.of(coeffs, const)


def parse_expr(c: text.Cursor) -> Expr:
    if c.peek.kind == "number":
        return Const(float(c.number()))
    fn = c.ident()
    c.expect("(")
    if fn == "load":
        buf = c.value()
        c.expect(",")
        c.expect("[")
        index: list[Index] = []
        while not c.accept("]"):
            index.append(parse_index(c))
            if not c.accept(","):
                c.expect("]")
                break
        fill = None
        if c.accept(","):
            c.expect("fill")
            c.expect("=")
            fill = float(c.number())
        guard: tuple[int, ...] = ()
        if fill is not None and c.accept(","):
            c.expect("guard")
            c.expect("=")
            guard = tuple(c.int_list())
        c.expect(")")
        return Load(buf, tuple(index), fill, guard)
    args: list[Expr] = []
    while not c.accept(")"):
        args.append(parse_expr(c))
        if not c.accept(","):
            c.expect(")")
            break
    return Call(fn, tuple(args))


def parse_op(c: text.Cursor) -> Op:
    out = c.value()
    c.expect(":")
    t = c.ttype()
    c.expect("=")
    head = c.ident()
    if head == "view":
        src = c.value()
        return View(out, t, src, _origin(c))
    if head not in COMBINERS:
        raise c.fail("map, sum[...], max[...] or view")
    reduce = () if head == "map" else c.int_list()
    body = parse_expr(c)
    return Compute(out, t, head, reduce, body, _origin(c))


def _origin(c: text.Cursor) -> tuple[str, ...]:
    return tuple(str(x) for x in c.attr_value()) if c.accept("from") else ()


def parse_rewrite(c: text.Cursor) -> Rewrite:
    rule = str(c.attr_value())
    target = c.value()
    verdict = c.ident()
    reason = str(c.attr_value())
    c.expect("saved")
    c.expect("=")
    return Rewrite(rule, target, verdict == "applied", reason, c.integer())


def parse_header_item(c: text.Cursor, inputs: list, weights: list, weight_data: dict[str, bytes]) -> bool:
    """Parse an `input` or `weight` line if one is next; shared by the lowered and decision parsers."""
    if c.accept("input"):
        v = c.value()
        c.expect(":")
        inputs.append(Value(v, c.ttype()))
        return True
    if c.accept("weight"):
        v = c.value()
        c.expect(":")
        t = c.ttype()
        c.expect("sha256")
        c.expect("=")
        digest = c.string()
        w = Weight(v, t, weight_data.get(v, b""))
        if w.sha256 != digest:
            raise AicfError(f"IR text: no matching data given for weight {v!r}")
        weights.append(w)
        return True
    return False


def parse_program(source: str, weight_data: dict[str, bytes]) -> Program:
    c = text.Cursor(source)
    c.expect("lowered")
    name = str(c.attr_value())
    c.expect("{")
    inputs: list[Value] = []
    weights: list[Weight] = []
    ops: list[Op] = []
    outputs: list[str] = []
    rewrites: list[Rewrite] = []
    while not c.accept("}"):
        if parse_header_item(c, inputs, weights, weight_data):
            continue
        if c.accept("output"):
            outputs.append(c.value())
        elif c.accept("rewrite"):
            rewrites.append(parse_rewrite(c))
        else:
            ops.append(parse_op(c))
    return Program(name, tuple(inputs), tuple(weights), tuple(ops), tuple(outputs), tuple(rewrites))


# ---------------------------------------------------------------- verifier

def verify_expr(e: Expr, extents: Mapping[str, int], types: Mapping[str, TensorType], where: str) -> None:
    if isinstance(e, Const):
        return
    if isinstance(e, Call):
        if FNS.get(e.fn) != len(e.args):
            raise AicfError(f"{where}: unknown function {e.fn}/{len(e.args)}")
        for a in e.args:
            verify_expr(a, extents, types, where)
        return
    if e.buffer not in types:
        raise AicfError(f"{where}: loads {e.buffer!r}, which is not defined before it")
    shape = types[e.buffer].shape
    if len(e.index) != len(shape):
        raise AicfError(f"{where}: load of {e.buffer!r} has {len(e.index)} indices, the buffer has rank {len(shape)}")
    if indirect_dims(e):
        verify_indirect(e, extents, types, where)
        return
    if e.guard and (e.fill is None or list(e.guard) != sorted(set(e.guard) - set(e.computed_dims))
                    or not all(0 <= d < len(shape) for d in e.guard)):
        raise AicfError(f"{where}: load of {e.buffer!r} guard {list(e.guard)} must name sorted dimensions that "
                        "are not computed, of a load with a fill")
    guarded = e.guarded_dims
    for d, (a, n) in enumerate(zip(e.index, shape)):
        for v, _ in a.terms:
            if v not in extents:
                raise AicfError(f"{where}: index of {e.buffer!r} uses unknown variable {v!r}")
        lo, hi = a.bounds(extents)
        if d in guarded:
            if hi < 0 or lo >= n:
                raise AicfError(f"{where}: guarded load of {e.buffer!r} dim {d} ranges {lo}..{hi}, never inside 0..{n - 1}")
            continue
        if lo < 0 or hi >= n:
            raise AicfError(f"{where}: load of {e.buffer!r} dim {d} ranges {lo}..{hi}, outside 0..{n - 1}")


def parse_index(c: text.Cursor) -> Index:
    """An affine index entry, or `@load(%ids, [...])` ([Note: Indirect index])."""
    if not c.accept("@"):
        return parse_affine(c)
    ids = parse_expr(c)
    if not isinstance(ids, Load):
        raise c.fail("a load after @ (an indirect index)")
    return Indirect(ids)


def verify_indirect(e: Load, extents: Mapping[str, int], types: Mapping[str, TensorType], where: str) -> None:
    """A load with indirect entries ([Note: Indirect index]): unguarded; each id an unguarded,
    in-bounds affine read of an integer buffer (no bounds check on its dimension: the clamp
    is the bound); every affine entry inside its dimension as in any load."""
    if e.fill is not None or e.guard:
        raise AicfError(f"{where}: load of {e.buffer!r} is both guarded and indirect")
    for d, (a, n) in enumerate(zip(e.index, types[e.buffer].shape)):
        if isinstance(a, Indirect):
            ids = a.ids
            if ids.buffer in types and types[ids.buffer].dtype not in ("i64", "i32"):
                raise AicfError(f"{where}: indirect index of {e.buffer!r} dim {d} reads {ids.buffer!r} of "
                                f"{types[ids.buffer].dtype}, not i64/i32")
            if ids.fill is not None or indirect_dims(ids):
                raise AicfError(f"{where}: indirect index of {e.buffer!r} dim {d} is guarded or itself indirect")
            verify_expr(ids, extents, types, where)
            continue
        for v, _ in a.terms:
            if v not in extents:
                raise AicfError(f"{where}: index of {e.buffer!r} uses unknown variable {v!r}")
        lo, hi = a.bounds(extents)
        if lo < 0 or hi >= n:
            raise AicfError(f"{where}: load of {e.buffer!r} dim {d} ranges {lo}..{hi}, outside 0..{n - 1}")


def verify_op(op: Op, types: Mapping[str, TensorType], where: str) -> None:
    if isinstance(op, View):
        if op.source not in types:
            raise AicfError(f"{where}: view of undefined {op.source!r}")
        if types[op.source].numel != op.type.numel or types[op.source].dtype != op.type.dtype:
            raise AicfError(f"{where}: view changes element count or dtype")
        return
    if op.combiner not in COMBINERS or (op.combiner == "map") != (not op.reduce):
        raise AicfError(f"{where}: combiner {op.combiner} does not fit reduce extents {list(op.reduce)}")
    if any(n <= 0 for n in op.type.shape + op.reduce):
        raise AicfError(f"{where}: empty iteration domain")
    verify_expr(op.body, op.extents(), types, where)


def verify_program(p: Program) -> None:
    """Names unique and defined before use, every access inside its buffer, functions known."""
    types: dict[str, TensorType] = {}
    for name, t in [(v.name, v.type) for v in p.inputs] + [(w.name, w.type) for w in p.weights]:
        if name in types:
            raise AicfError(f"Lowered IR verifier: {name!r} is defined twice")
        types[name] = t
    for op in p.ops:
        where = f"Lowered IR verifier: {op.out!r}"
        if op.out in types:
            raise AicfError(f"{where}: defined twice")
        verify_op(op, types, where)
        types[op.out] = op.type
    for o in p.outputs:
        if o not in types:
            raise AicfError(f"Lowered IR verifier: output {o!r} is not defined")
