"""Schedule family `row_reduce`: a row's statistics (sums or maxima over one variable j), reduced
by a group of threads, then the row's element-wise output, in one kernel.

A thread owns `vec` consecutive elements of the row per step, one 16-byte vector where the row
is contiguous ([Note: Vector access] in codegen/vector.py), and steps tpr·vec elements apart
(`iters` steps; consecutive threads read consecutive vectors). Partial results merge in
registers, across the warp with shuffles, then across warps through shared memory: the
associativity that `online_reducible_norm` guarantees.

Parameter space: threads per row `tpr` x rows per block `rpb` x `pass`, how often the row comes
from memory (`vec` is not searched: the widest legal vector, narrower ones are recorded as
declined with the reason):

- `regs`: the row is read once into registers: each thread holds iters·vec elements of every
  row input the statistics read (a compile-time count, loops fully unrolled), and every
  statistic and the output are computed from there, each statistic exactly as defined (a
  variance takes a second pass over the registers, after the mean). DRAM: inputs read once,
  outputs written once. A row too long to hold is rejected by the register estimate.
- `online`: one streaming pass merges every statistic (`properties.online_merges`): plain sums
  and maxima; a running max with sums rescaled by exp(m_old - m_new) (softmax); Chan's merge
  of (count, mean, M2) for a mean and variance (Welford, taken per vector: each step's vec
  elements give an exact (vec, mean, M2) that merges into the thread's state). Legal only
  where each statistic that reads another has such a merge (the partial states merge, the
  update is associative); otherwise the candidate is declined with the reason. The output
  pass reads the row a second time (an L2 hit while the rows in flight fit in L2).
- `multi`: one pass per statistic, then one for the output, each reading the row again.

A decode step's norms are one row in one block, whose output pass reads the scale vector after
the block's sum, a second load round trip. Holding the scale in registers, requested before the
dependent-launch wait, with the row itself in registers (`regs`), made each norm faster alone
(1.11-1.31 -> 0.97-1.12 us on an H200) but not the plan (the 1 B Llama's 4-layer decode plan
210.1 us against 209.3, 9 alternating rounds; benchmarks/results/decode_ab_session20_h200.txt), so
the norms keep the passes below.

A stored element-wise map the pass reads as its row (form_kernels' rule "map + row pass =>
stored prologue", a residual sum before a norm) is computed and stored in the first pass over
the row, then read from registers (`regs`) or back from its own store.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Callable, Mapping

from aicfc.codegen import row_cols, vector
from aicfc.codegen.cexpr import Emitter, contains, flat_offset, literal, reciprocal_divisions
from aicfc.codegen.common import decompose, render, signature, store_line
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine, Call, Compute, Const, Expr, Load, index_vars, loads, substitute
from aicfc.ir.properties import Merge, online_merges
from aicfc.ir.types import TensorType

SPACE = {"tpr": (8, 16, 32, 64, 128, 256, 512, 1024), "rpb": (1, 2, 4, 8, 16, 32),
         "pass": ("regs", "online", "multi")}
INIT = {"sum": "0.0f", "max": "(-INFINITY)", "min": "INFINITY", "prod": "1.0f"}
COMBINE = {"sum": "({0} + {1})", "max": "fmaxf({0}, {1})", "min": "fminf({0}, {1})", "prod": "({0} * {1})"}
STREAM_UNROLL = 4          # steps of a streaming pass unrolled (loads in flight per thread)
COSTLY = {"exp", "log", "tanh", "erf", "sigmoid", "sqrt", "div"}   # worth a register to reuse


def geometry(k: Kernel) -> tuple[list[tuple[str, int]], str, int]:
    """(row variables with extents, the reduced variable j, j's extent) of the kernel's space."""
    anchor = k.ops[-1]
    extents = anchor.extents()
    if anchor.combiner != "map":
        j = "r0"
    else:
        bind = next(dict(b) for op, b in zip(k.ops, k.binds) if op.combiner != "map")
        j = next(v for v, _ in bind["r0"].terms)
    rows = [(v, n) for v, n in extents.items() if v != j]
    return rows, j, extents[j]


@dataclass(frozen=True)
class Row:
    """A row kernel over its own variables: every member's body with its binding applied."""

    rows: tuple[tuple[str, int], ...]
    j: str
    cols: int
    prologue: Compute | None        # the stored map computed in the first pass
    stats: tuple[Compute, ...]
    anchor: Compute | None          # the element-wise output; None: one reduction, stored
    body: tuple[tuple[str, Expr], ...]

    def of(self, op: Compute) -> Expr:
        return dict(self.body)[op.out]

    def along(self, ld: Load) -> bool:
        """The access moves with j (it reads the row, not one value per row)."""
        return any(self.j in index_vars(a) for a in ld.index)

    def per_row(self, ld: Load) -> bool:
        """The access differs between rows (a row input, not a vector shared by all rows)."""
        wide = {v for v, n in self.rows if n > 1}
        return any(index_vars(a) & wide for a in ld.index)

    def row_loads(self, exprs: list[Expr]) -> list[Load]:
        """Distinct accesses along j in `exprs`, in order."""
        return list(dict.fromkeys(ld for e in exprs for ld in loads(e) if self.along(ld)))

    def cached(self) -> list[Load]:
        """`regs`: the row inputs the statistics read, held in registers (the prologue's own
        value is held too, apart from these)."""
        pro = self.prologue.out if self.prologue else None
        return [ld for ld in self.row_loads([self.of(s) for s in self.stats])
                if self.per_row(ld) and ld.buffer != pro]


@functools.lru_cache(maxsize=256)
def analyze(k: Kernel) -> Row:
    rows, j, cols = geometry(k)
    body = tuple((op.out, substitute(op.body, dict(b))) for op, b in zip(k.ops, k.binds))
    anchor = k.ops[-1] if k.ops[-1].combiner == "map" else None
    prologue = k.ops[0] if anchor is not None and k.ops[0].combiner == "map" and k.ops[0] is not anchor else None
    stats = tuple(op for op in k.ops if op.combiner != "map")
    return Row(tuple(rows), j, cols, prologue, stats, anchor, body)


def invariant(row: Row) -> Callable[[Expr], bool]:
    """Whether an expression is the same for every element of a row (reads nothing along j)."""
    return lambda e: not any(row.along(ld) for ld in loads(e))


def body(row: Row, op: Compute) -> Expr:
    """What codegen computes for `op`: its body with divisions by row-invariant values as
    products by their reciprocal (cexpr.reciprocal_divisions)."""
    return reciprocal_divisions(row.of(op), invariant(row))


@functools.lru_cache(maxsize=256)
def reused(k: Kernel) -> tuple[Compute, ...]:
    """`regs`: statistics whose per-element value the output computes again (softmax's
    exp(x - max)), kept in registers from their pass instead of recomputed."""
    row = analyze(k)
    if row.anchor is None:
        return ()
    out = body(row, row.anchor)
    return tuple(s for s in row.stats if _costly(body(row, s)) and contains(out, body(row, s)))


def _costly(e: Expr) -> bool:
    return isinstance(e, Call) and (e.fn in COSTLY or any(_costly(a) for a in e.args))


def merges(k: Kernel) -> tuple[Merge, ...] | str:
    """How the statistics stream in one pass (`online`), or why they cannot."""
    row = analyze(k)
    return online_merges([(s, row.of(s)) for s in row.stats], row.cols)


def _dtypes(k: Kernel, types: Mapping[str, TensorType]) -> list[str]:
    row = analyze(k)
    return [types[ld.buffer].dtype for ld in row.row_loads([e for _, e in row.body])] + [op.type.dtype for op in k.ops]


def vector_width(k: Kernel, types: Mapping[str, TensorType]) -> tuple[int, str]:
    """(vec, why not wider): the row's elements per vector access."""
    row = analyze(k)
    accesses = row.row_loads([e for _, e in row.body])
    width, why = vector.widest(_dtypes(k, types), row.cols)
    if width == 1:
        return 1, why
    outs = [op for op in (row.prologue, row.anchor) if op is not None]
    strided = [op.out for op in outs if vector.kind(Load(op.out, tuple(Affine.var(v) for v in op.domain_vars)),
                                                   types, row.j, width) != vector.CONTIGUOUS]
    if not outs and not any(vector.kind(ld, types, row.j, width) == vector.CONTIGUOUS for ld in accesses):
        strided = [k.ops[0].out]
    if strided:
        stride = flat_offset(tuple(Affine.var(v) for v in k.ops[-1].domain_vars), k.ops[-1].type).coeff(row.j)
        return 1, (f"the row of {strided[0]!r} is not contiguous in memory ({row.j} steps "
                   f"{stride if row.anchor else 'other than 1'} elements): no {width}-element vectors")
    return width, why


def modes(k: Kernel) -> list[str]:
    row = analyze(k)
    if row.anchor is None:
        return ["multi"]
    out = ["regs"]
    if len(row.stats) > 1 and not isinstance(merges(k), str):
        out.append("online")
    return out + ["multi"]


def space(k: Kernel, plan: Plan) -> list[dict]:
    vec, _ = vector_width(k, plan.types())
    return [{"tpr": t, "rpb": r, "pass": m, "vec": vec} for m in modes(k)
            for t in SPACE["tpr"] for r in SPACE["rpb"] if 32 <= t * r <= 1024] + row_cols.space(analyze(k), plan.types())


def declined(k: Kernel, plan: Plan) -> list[tuple[dict, str]]:
    """Candidates outside the space, with the reason (explain lists them as rejected)."""
    out = []
    types = plan.types()
    vec, why = vector_width(k, types)
    if why:
        out.append(({"vec": vector.full_width(_dtypes(k, types))}, why))
    m = merges(k)
    if analyze(k).anchor is not None and len(analyze(k).stats) > 1 and isinstance(m, str):
        out.append(({"pass": "online"}, f"statistics do not merge in one streaming pass: {m}"))
    return out


def iters(k: Kernel, p: Mapping) -> int:
    return math.ceil(analyze(k).cols / (p["tpr"] * p["vec"]))


def cached_elements(k: Kernel, p: Mapping) -> int:
    """Row elements a thread holds in registers at once under `regs` (the prologue's value
    included). A reused value (softmax's exp(x - max)) is computed from the cached inputs
    element by element; a cached input the output no longer reads dies as its reused value is
    made, so the two are not held together (ptxas reuses the registers: the loops are unrolled)."""
    if p["pass"] != "regs":
        return 0
    row = analyze(k)
    held = len(row.cached()) + (row.prologue is not None)
    kept = reused(k)
    if kept:
        out = body(row, row.anchor)
        for s in kept:
            out = _replace(out, body(row, s))
        still_read = {ld.buffer for ld in row.row_loads([out])}
        late = sum(ld.buffer in still_read for ld in row.cached()) + (row.prologue is not None)
        held = max(held, late + len(kept))
    return held * iters(k, p) * p["vec"]


def _replace(e: Expr, sub: Expr) -> Expr:
    """`e` with every occurrence of `sub` replaced by a constant."""
    if e == sub:
        return Const(0.0)
    if isinstance(e, Call):
        return Call(e.fn, tuple(_replace(a, sub) for a in e.args))
    return e


def state_vars(k: Kernel, p: Mapping) -> int:
    """Floats a thread merges with the others per block reduction (shared memory per warp)."""
    m = merges(k)
    if p["pass"] != "online" or isinstance(m, str):
        return 1
    return sum({"plain": 1, "softmax": len(x.stats), "welford": 3}[x.kind] for x in m)


def traversals(k: Kernel, mode: str) -> list[set[str]]:
    """The row inputs (per-row buffers) read from memory in each pass over the row, in order;
    the prologue's own buffer stands for its re-reads after the pass that computed it."""
    row = analyze(k)
    pro = row.prologue

    def reads(exprs: list[Expr], first: bool) -> set[str]:
        found = {ld.buffer for ld in row.row_loads(exprs) if row.per_row(ld)}
        if pro is not None and first:
            found.discard(pro.out)
            found |= {ld.buffer for ld in row.row_loads([row.of(pro)]) if row.per_row(ld)}
        return found
    stat_exprs = [row.of(s) for s in row.stats]
    anchor = [row.of(row.anchor)] if row.anchor is not None else []
    if mode == "regs":
        held = {ld.buffer for ld in row.cached()} | ({pro.out} if pro else set())
        return [reads(stat_exprs, True), reads(anchor, False) - held]
    if mode == "online":
        return [reads(stat_exprs, True)] + ([reads(anchor, False)] if anchor else [])
    return [reads([e], i == 0) for i, e in enumerate(stat_exprs)] + ([reads(anchor, False)] if anchor else [])


def launch(k: Kernel, p: Mapping) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    if p["pass"] == "cols":
        return row_cols.launch(geometry(k)[0], p)
    rows, _, _ = geometry(k)
    nrows = math.prod(n for _, n in rows)
    return (math.ceil(nrows / p["rpb"]), 1, 1), (p["tpr"], p["rpb"], 1), 0


def static_smem(k: Kernel, p: Mapping) -> int:
    if p["pass"] == "cols":
        return row_cols.static_smem(p)
    return 4 * p["rpb"] * (p["tpr"] // 32) * state_vars(k, p) if p["tpr"] > 32 else 0


# ---------------------------------------------------------------- codegen

class _Gen:
    """C for one row kernel under one schedule: the template's passes, each a loop over the
    thread's steps (j0 = (it·tpr + lane)·vec) with a v-loop over the vector's elements."""

    def __init__(self, k: Kernel, p: Mapping, types: Mapping[str, TensorType]):
        self.row = analyze(k)
        self.k, self.types = k, types
        self.sig = signature(k, types)
        self.vec, self.tpr, self.mode = p["vec"], p["tpr"], p["pass"]
        self.iters = iters(k, p)
        self.idx = self.sig.index_type
        self.names = {v: v for v, _ in self.row.rows} | {self.row.j: self.row.j}
        self.em = Emitter(self.sig.params, types, prefix="v")
        self.registers: dict[str, str] = {}
        self.arrays = 0
        self.cache = {ld: f"c{i}" for i, ld in enumerate(self.row.cached())} if self.mode == "regs" else {}
        self.reuse = {s.out: f"r{i}" for i, s in enumerate(reused(k))} if self.mode == "regs" else {}

    def vloop(self, lines: list[str]) -> list[str]:
        j = self.row.j
        head = [f"const {self.idx} {j} = j0 + v;"] if any(re.search(rf"\b{j}\b", x) for x in lines) else []
        return ["#pragma unroll", f"for (int v = 0; v < {self.vec}; ++v) {{",
                *(f"  {x}" for x in head + lines), "}"]

    def element(self, e: Expr, values: Mapping[Expr, str], registers: Mapping[str, str] | None = None) -> tuple[str, list[str]]:
        """One element of `e` (divisions by row-invariant values as reciprocal products)."""
        e = reciprocal_divisions(e, invariant(self.row))
        value = self.em.emit(e, self.names, self.registers if registers is None else registers, values)
        return value, self.em.take()

    def values(self, exprs: list[Expr], computed: Mapping[str, str] = {}) -> tuple[list[str], dict[Load, str]]:
        """Loads of a step's vectors for every access along j in `exprs`, and what each access
        reads inside the v-loop: a cached register, a vector just loaded, or `computed` (the
        prologue's value this pass computes)."""
        lines: list[str] = []
        values: dict[Load, str] = {}
        pro = self.row.prologue
        for ld in self.row.row_loads(exprs):
            if pro is not None and ld.buffer == pro.out and pro.out in computed:
                values[ld] = computed[pro.out]
            elif pro is not None and ld.buffer == pro.out and self.mode == "regs":
                values[ld] = f"cp[it * {self.vec} + v]"
            elif ld in self.cache:
                values[ld] = f"{self.cache[ld]}[it * {self.vec} + v]"
            else:
                arr = f"t{self.arrays}"
                self.arrays += 1
                kind = vector.kind(ld, self.types, self.row.j, self.vec)
                lines += [f"float {arr}[{self.vec}];"] + vector.load_lines(
                    ld, kind, self.vec, arr, self.sig.params, self.types, self.names, self.row.j, "j0")
                values[ld] = f"{arr}[v]"
        return lines, values

    def compute_map(self, op: Compute, dest: str | None, values: Mapping[Load, str]) -> list[str]:
        """The v-loop computing `op` into dest[v] (to store as a vector after it), or with no
        vector (vec 1, or dest None) storing each element in the loop."""
        value, lines = self.element(self.row.of(op), values)
        if dest is not None:
            lines.append(f"{dest}[v] = {value};")
        if self.vec == 1 or dest is None:
            lines.append(store_line(op, {v: Affine.var(v) for v in op.domain_vars}, value, self.sig.params,
                                    self.names))
        return self.vloop(lines)

    def stored_vector(self, op: Compute, src: str) -> list[str]:
        if self.vec == 1:
            return []
        ident = tuple(Affine.var(v) for v in op.domain_vars)
        return [vector.store_line(ident, op.type, self.sig.params[op.out], self.names, self.row.j, "j0",
                                  self.vec, src)]

    def prologue_step(self, dest: str) -> list[str]:
        """A step of the prologue: its inputs' vectors, its value into dest[0..vec), stored."""
        pro = self.row.prologue
        assert pro is not None
        lines, values = self.values([self.row.of(pro)])
        return lines + self.compute_map(pro, dest, values) + self.stored_vector(pro, dest)

    def stat_store(self, op: Compute, value: str) -> str | None:
        if op.out not in self.k.stores:
            return None
        return store_line(op, dict(self.k.binds[self.k.ops.index(op)]), value, self.sig.params, self.names)


def _plain(g: _Gen, s: Compute, n: int, values: Mapping[Load, str]) -> tuple[list[str], list[str], list[str], str]:
    """(declarations, step lines, lines after the loop, the thread's partial) of a sum or max."""
    acc = f"a{n}"
    value, lines = g.element(g.row.of(s), values)
    lines.append(f"{acc}[v] = {COMBINE[s.combiner].format(f'{acc}[v]', value)};")
    if s.out in g.reuse:
        lines.append(f"{g.reuse[s.out]}[it * {g.vec} + v] = {value};")
    decl = [f"float {acc}[{g.vec}];", "#pragma unroll", f"for (int v = 0; v < {g.vec}; ++v) {acc}[v] = {INIT[s.combiner]};"]
    fold = [f"float s{n} = {acc}[0];"] + (["#pragma unroll", f"for (int v = 1; v < {g.vec}; ++v) s{n} = "
                                          f"{COMBINE[s.combiner].format(f's{n}', f'{acc}[v]')};"] if g.vec > 1 else [])
    return decl, g.vloop(lines), fold, f"s{n}"


def _online(g: _Gen, ms: tuple[Merge, ...], values: Mapping[Load, str]) -> tuple[list[str], list[str], list[str], dict]:
    """(declarations, step lines, lines after the loop, the reduction) of every merge at once;
    the reduction's `final` maps each statistic to its register after the block merge, which
    its `finish` lines compute."""
    by = {s.out: s for s in g.row.stats}
    decl: list[str] = []
    step: list[str] = []
    after: list[str] = []
    state: list[str] = []
    merge: list[str] = []
    final: dict[str, str] = {}
    finish: list[str] = []
    for n, m in enumerate(ms):
        if m.kind == "plain":
            d, s, f, var = _plain(g, by[m.stats[0]], n, values)
            decl += d
            step += s
            after += f
            state.append(var)
            merge.append(f"{var} = {COMBINE[by[m.stats[0]].combiner].format(var, 'b_' + var)};")
            final[m.stats[0]] = var
        elif m.kind == "softmax":
            mx, sums = f"m{n}", [f"t{n}_{i}" for i in range(len(m.stats) - 1)]
            decl += [f"float {mx} = -INFINITY;"] + [f"float {t} = 0.0f;" for t in sums]
            value, lines = g.element(g.row.of(by[m.stats[0]]), values)
            step += [f"float x{n}[{g.vec}];"] + g.vloop(lines + [f"x{n}[v] = {value};"])
            step += [f"float tm{n} = x{n}[0];", "#pragma unroll",
                     f"for (int v = 1; v < {g.vec}; ++v) tm{n} = fmaxf(tm{n}, x{n}[v]);",
                     f"const float nm{n} = fmaxf({mx}, tm{n});",
                     f"const float sc{n} = ({mx} == nm{n}) ? 1.0f : expf({mx} - nm{n});"]
            step += [f"{t} *= sc{n};" for t in sums]
            rescaled: list[str] = []
            for t, name in zip(sums, m.stats[1:]):
                value, lines = g.element(g.row.of(by[name]), values, {**g.registers, m.stats[0]: f"nm{n}"})
                rescaled += g.vloop(lines + [f"{t} += {value};"])
            step += [f"if (nm{n} != -INFINITY) {{", *(f"  {x}" for x in rescaled), "}", f"{mx} = nm{n};"]
            state += [mx] + sums
            merge += ["{", f"  const float nm = fmaxf({mx}, b_{mx});",
                      f"  const float sa = ({mx} == nm) ? 1.0f : expf({mx} - nm);",
                      f"  const float sb = (b_{mx} == nm) ? 1.0f : expf(b_{mx} - nm);",
                      *(f"  {t} = {t} * sa + b_{t} * sb;" for t in sums), f"  {mx} = nm;", "}"]
            final[m.stats[0]] = mx
            final.update(zip(m.stats[1:], sums))
        else:   # welford
            cnt, mean, m2 = f"n{n}", f"u{n}", f"q{n}"
            decl += [f"float {cnt} = 0.0f, {mean} = 0.0f, {m2} = 0.0f;"]
            assert m.operand is not None
            value, lines = g.element(m.operand, values)
            step += [f"float x{n}[{g.vec}];"] + g.vloop(lines + [f"x{n}[v] = {value};"])
            step += [f"float ts{n} = 0.0f, tq{n} = 0.0f;", "#pragma unroll",
                     f"for (int v = 0; v < {g.vec}; ++v) ts{n} += x{n}[v];",
                     f"const float tu{n} = ts{n} * {literal(1.0 / g.vec)};", "#pragma unroll",
                     f"for (int v = 0; v < {g.vec}; ++v) tq{n} += (x{n}[v] - tu{n}) * (x{n}[v] - tu{n});",
                     "{", f"  const float nn = {cnt} + {g.vec}.0f;", f"  const float wt = {g.vec}.0f / nn;",
                     f"  const float d = tu{n} - {mean};", f"  {mean} += d * wt;",
                     f"  {m2} += tq{n} + d * d * {cnt} * wt;", f"  {cnt} = nn;", "}"]
            state += [cnt, mean, m2]
            merge += ["{", f"  const float nn = {cnt} + b_{cnt};", f"  const float wt = (nn > 0.0f) ? b_{cnt} / nn : 0.0f;",
                      f"  const float d = b_{mean} - {mean};", f"  {mean} += d * wt;",
                      f"  {m2} += b_{m2} + d * d * {cnt} * wt;", f"  {cnt} = nn;", "}"]
            finish.append(f"const float var{n} = {m2} * {literal(m.scale)};")
            final[m.stats[0]] = mean
            final[m.stats[1]] = f"var{n}"
    return decl, step, after, {"vars": state, "merge": merge, "final": final, "finish": finish}


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str) -> str:
    if p["pass"] == "cols":
        return row_cols.render_kernel(k, analyze(k), p, types, name)
    g = _Gen(k, p, types)
    row = g.row
    pro = row.prologue
    load_phase = None
    if g.mode == "regs" and (g.cache or pro is not None or g.reuse):
        lines: list[str] = []
        for ld, arr in g.cache.items():
            kind = vector.kind(ld, types, row.j, g.vec)
            lines += vector.load_lines(ld, kind, g.vec, f"({arr} + it * {g.vec})", g.sig.params, types,
                                       g.names, row.j, "j0")
        if pro is not None:
            lines += g.prologue_step(f"(cp + it * {g.vec})")
        load_phase = {"arrays": list(g.cache.values()) + (["cp"] if pro is not None else []) + list(g.reuse.values()),
                      "step": lines}

    passes = []
    stats = list(row.stats)
    online = merges(k) if g.mode == "online" else None
    groups: list[list[Compute]] = [stats] if g.mode == "online" else [[s] for s in stats]
    for n, group in enumerate(groups):
        first = n == 0 and g.mode != "regs"
        step: list[str] = []
        computed: dict[str, str] = {}
        if first and pro is not None:
            step += [f"float pv[{g.vec}];"] + g.prologue_step("pv")
            computed[pro.out] = "pv[v]"
        loads_, values = g.values([row.of(s) for s in group], computed)
        step += loads_
        if online is not None:
            assert not isinstance(online, str)
            decl, lines_, after, red = _online(g, online, values)
            step += lines_
        else:
            decl, lines_, after, var = _plain(g, group[0], n, values)
            step += lines_
            red = {"vars": [var], "merge": [f"{var} = {COMBINE[group[0].combiner].format(var, 'b_' + var)};"],
                   "final": {group[0].out: var}, "finish": []}
        g.registers.update(red["final"])
        stores = [line for s in group if (line := g.stat_store(s, red["final"][s.out]))]
        passes.append({"comment": ", ".join(f"{s.combiner} over {row.j} of {s.out}" for s in group)
                       + (" (merged online)" if online is not None else ""),
                       "decl": decl, "step": step, "after": after, "vars": red["vars"], "merge": red["merge"],
                       "finish": red["finish"], "stores": stores})

    out_pass = None
    if row.anchor is not None:
        loads_, values = g.values([row.of(row.anchor)])
        values.update({body(row, s): f"{g.reuse[s.out]}[it * {g.vec} + v]" for s in reused(k) if s.out in g.reuse})
        vectors = g.vec > 1
        out_pass = (loads_ + ([f"float o[{g.vec}];"] if vectors else [])
                    + g.compute_map(row.anchor, "o" if vectors else None, values) + g.stored_vector(row.anchor, "o"))
    width = min(p["tpr"], 32)
    return render("row_reduce.cu.j2", name=name, rows=math.prod(n for _, n in row.rows), cols=row.cols,
                  tpr=p["tpr"], rpb=p["rpb"], vec=g.vec, iters=g.iters, mode=g.mode, idx=g.idx,
                  signature=g.sig.text, decompose=decompose("row", list(row.rows), g.idx),
                  unroll="#pragma unroll" if g.mode == "regs" else f"#pragma unroll {STREAM_UNROLL}",
                  load_phase=load_phase, passes=passes, out_pass=out_pass, nvars=max(len(x["vars"]) for x in passes),
                  warp_offsets=[width >> s for s in range(1, int(math.log2(width)) + 1)], width=width)
