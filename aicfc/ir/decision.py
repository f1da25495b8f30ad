"""Decision-applied IR: kernels with chosen schedules, buffers with offsets, and why.

[Note: Decision IR]
A `Kernel` is a group of lowered computes that run as one launch, in order. `binds[k]` maps
the loop variables of `ops[k]` onto the kernel's iteration space (the variables of the last
op for row reductions and maps, of the contraction for GEMMs), so codegen can place every
member in one loop nest. Only the outputs in `stores` reach memory; the others live in
registers (that is what fusion buys); an `inlined` producer (passes/join_concat.py) is never stored
either: the kernel computes it where it loads it (`Kernel.loads` lists what the kernel really reads); a
`joined` GEMM (passes/join_reduce.py) runs in the kernel's epilogue over the tile it just computed, its
result among `stores` (`own_stores`: the kernel's own).
`schedule` is filled by planning: the chosen
parameters, launch shape, the predicted cost with its terms, and every candidate considered
with its predicted time or the constraint it broke. `buffers` is filled by memory planning:
every stored tensor gets a region and a byte offset; views share their source's bytes.

    decision mlp target=sm_90 {
      input %x: f32[4,64]
      kernel k0 gemm {
        %y.mm: f32[4,32] = sum[64] mul(load(%x, [i0, r0]), load(%w, [r0, i1])) from ["g"]
        %y: f32[4,32] = map add(load(%y.mm, [i0, i1]), load(%b, [i1])) from ["g"]
        bind %y {i0: i0, i1: i1}
        store %y
        properties [tile_compatible_compute]
        rewrites ["matmul => gemm epilogue"]
        schedule {BM=32, BN=32} grid=[1,1,1] block=[64,1,1] smem=0 registers=38
        predicted {bytes=9344.0, flops=16384.0, time_us=2.1}
        candidate {BM=64, BN=64} time_us=2.4
        candidate {BM=128, BN=128} rejected "shared memory 66560 B > 49152 B"
      }
      buffer %x arena offset=0 bytes=1024
      output %y
    }
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from aicfc.errors import AicfError
from aicfc.ir import text
from aicfc.ir.lowered import (Affine, Compute, Load, Rewrite, View, loads, parse_affine, parse_header_item, parse_op,
                              parse_rewrite, print_header, print_op, print_rewrite, verify_op)
from aicfc.ir.types import TensorType, Value, Weight

Params = tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Candidate:
    params: Params
    predicted_time_us: float | None = None
    rejected_because: str = ""


@dataclass(frozen=True, slots=True)
class Schedule:
    params: Params
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    registers: int | None
    predicted: tuple[tuple[str, float], ...]
    candidates: tuple[Candidate, ...] = ()

    @property
    def param(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def time_us(self) -> float:
        return dict(self.predicted)["time_us"]


@dataclass(frozen=True, slots=True)
class InPlace:
    """A memory decision: the kernel writes `output` over the bytes of `reuses`, which dies there."""

    output: str
    reuses: str
    reason: str


@dataclass(frozen=True, slots=True)
class Prefetch:
    """A memory decision (passes/l2_fill.py): the kernel requests byte ranges [offset, offset + bytes) of
    `buffer`, a weight a later kernel streams, into L2 before its dependent-launch wait."""

    buffer: str
    ranges: tuple[tuple[int, int], ...]
    reason: str

    @property
    def bytes(self) -> int:
        return sum(n for _, n in self.ranges)


@dataclass(frozen=True, slots=True)
class Inlined:
    """A memory decision (passes/join_concat.py): the producer `op` runs inside the kernel where it loads
    `op.out` (directly or through `views`, reshapes of it), so `op.out` is never stored; the kernel
    reads `op`'s own inputs instead."""

    op: Compute
    views: tuple[str, ...]
    reason: str

    @property
    def names(self) -> frozenset[str]:
        return frozenset((self.op.out, *self.views))


@dataclass(frozen=True, slots=True)
class Joined:
    """A decision (passes/join_reduce.py): kernel `name`'s GEMM, `ops` (a contraction whose A operand is this
    kernel's stored output, then its epilogue) bound by `binds`, runs in this kernel's epilogue as a second
    product over the tile just computed, which holds every column it reads; `ops[-1].out` is among this
    kernel's stores, and this kernel's output is not read back from memory for it."""

    name: str
    ops: tuple[Compute, ...]
    binds: tuple[tuple[tuple[str, Affine], ...], ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Kernel:
    name: str
    family: str
    ops: tuple[Compute, ...]
    binds: tuple[tuple[tuple[str, Affine], ...], ...]
    stores: tuple[str, ...]
    properties: tuple[str, ...] = ()
    rewrites: tuple[str, ...] = ()
    schedule: Schedule | None = None
    inplace: tuple[InPlace, ...] = ()   # filled by plan_memory
    prefetch: tuple[Prefetch, ...] = ()  # filled by passes/l2_fill.py
    inlined: tuple[Inlined, ...] = ()    # filled by passes/join_concat.py
    joined: tuple[Joined, ...] = ()      # filled by passes/join_reduce.py

    def replace(self, **changes: Any) -> Kernel:
        return dataclasses.replace(self, **changes)

    @property
    def origins(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(o for op in self.ops + tuple(i.op for i in self.inlined) + self.joined_ops
                                   for o in op.origin))

    @property
    def joined_ops(self) -> tuple[Compute, ...]:
        return tuple(op for j in self.joined for op in j.ops)

    @property
    def own_stores(self) -> tuple[str, ...]:
        """The stores of the kernel's own ops (its `stores` less a joined GEMM's)."""
        joined = {op.out for op in self.joined_ops}
        return tuple(s for s in self.stores if s not in joined)

    @property
    def outs(self) -> frozenset[str]:
        return frozenset(op.out for op in self.ops + self.joined_ops)

    def loads(self) -> list[Load]:
        """Every load the kernel issues: its ops' (less those of an inlined producer's result, which it
        computes in place), its inlined producers' own and its joined GEMM's (that one's of this kernel's
        output, among `outs`, read from the tile, not from memory)."""
        inner = frozenset().union(*(i.names for i in self.inlined))
        return ([ld for op in self.ops for ld in loads(op.body) if ld.buffer not in inner]
                + [ld for i in self.inlined for ld in loads(i.op.body)]
                + [ld for op in self.joined_ops for ld in loads(op.body)])


@dataclass(frozen=True, slots=True)
class Buffer:
    name: str
    type: TensorType
    region: str          # "arena" | "weights"
    offset: int
    alias_of: str = ""   # a view shares the bytes of its source


@dataclass(frozen=True, slots=True)
class State:
    """A graph input and the graph output that is its updated version, held as one persistent
    device buffer (region "state") that `kernel` updates in place (passes/declare_state.py).
    `write_bytes`: what the in-place update moves per run; `copy_bytes`: what writing the
    output apart (a copy of the whole tensor with the update) would."""

    input: str
    output: str
    kernel: str
    reason: str
    write_bytes: int
    copy_bytes: int


@dataclass(frozen=True, slots=True)
class Plan:
    name: str
    target: str
    inputs: tuple[Value, ...]
    weights: tuple[Weight, ...]
    kernels: tuple[Kernel, ...]
    views: tuple[View, ...]
    outputs: tuple[str, ...]
    buffers: tuple[Buffer, ...] = ()
    rewrites: tuple[Rewrite, ...] = ()
    precision: str = "fp32"   # the policy of passes/apply_precision.py
    state: tuple[State, ...] = ()
    launch: str = "stream"    # "dependent" or "stream": [Note: PDL] in codegen/pdl.py
    timeline: bool = False    # every kernel stamps its entry: [Note: timeline] in codegen/timeline.py
    triggers: tuple[int, ...] = ()   # each kernel's trigger_from as codegen rendered it ([Note: PDL]); set by build_modules
    symbols: tuple[str, ...] = ()    # each kernel's function ([Note: shared kernel code]); set by build_modules

    def replace(self, **changes: Any) -> Plan:
        new = dataclasses.replace(self, **changes)
        return self if new == self else new

    def types(self) -> dict[str, TensorType]:
        out = {v.name: v.type for v in self.inputs}
        out.update({w.name: w.type for w in self.weights})
        out.update({op.out: op.type for k in self.kernels for op in k.ops})
        out.update({i.op.out: i.op.type for k in self.kernels for i in k.inlined})
        out.update({op.out: op.type for k in self.kernels for op in k.joined_ops})
        out.update({v.out: v.type for v in self.views})
        return out

    def __str__(self) -> str:
        return print_plan(self)


# ---------------------------------------------------------------- printer

def _bind(b: tuple[tuple[str, Affine], ...]) -> str:
    return "{" + ", ".join(f"{v}: {a}" for v, a in b) + "}"


def print_kernel(k: Kernel) -> list[str]:
    lines = [f"  kernel {k.name} {k.family} {{"]
    lines += [f"    {print_op(op)}" for op in k.ops]
    lines += [f"    bind {text.name(op.out)} {_bind(b)}" for op, b in zip(k.ops, k.binds)]
    lines += [f"    store {text.name(s)}" for s in k.stores]
    lines.append(f"    properties {text.attr_value(k.properties)}")
    lines.append(f"    rewrites {text.attr_value(k.rewrites)}")
    s = k.schedule
    if s is not None:
        regs = "unknown" if s.registers is None else str(s.registers)
        lines.append(f"    schedule {text.attrs(s.params) or '{}'} grid={text.attr_value(s.grid)} "
                     f"block={text.attr_value(s.block)} smem={s.smem_bytes} registers={regs}")
        lines.append(f"    predicted {text.attrs(s.predicted)}")
        for c in s.candidates:
            tail = (f"time_us={text.number(c.predicted_time_us)}" if c.predicted_time_us is not None
                    else f"rejected {text.attr_value(c.rejected_because)}")
            lines.append(f"    candidate {text.attrs(c.params) or '{}'} {tail}")
    for ip in k.inplace:
        lines.append(f"    inplace {text.name(ip.output)} reuses {text.name(ip.reuses)} {text.attr_value(ip.reason)}")
    for f in k.prefetch:
        lines.append(f"    prefetch {text.name(f.buffer)} {text.attr_value([list(r) for r in f.ranges])} {text.attr_value(f.reason)}")
    for i in k.inlined:
        lines.append(f"    inlined {text.attr_value(list(i.views))} {text.attr_value(i.reason)} {print_op(i.op)}")
    for j in k.joined:
        lines.append(f"    joined {j.name} {text.attr_value(j.reason)} {{")
        lines += [f"      {print_op(op)}" for op in j.ops]
        lines += [f"      bind {text.name(op.out)} {_bind(b)}" for op, b in zip(j.ops, j.binds)]
        lines.append("    }")
    lines.append("  }")
    return lines


def print_plan(p: Plan) -> str:
    lines = print_header("decision", p)
    lines[0] = f"decision {text.attr_value(p.name)} target={p.target} precision={p.precision} {{"
    for k in p.kernels:
        lines += print_kernel(k)
    lines += [f"  {print_op(v)}" for v in p.views]
    for b in p.buffers:
        alias = f" alias={text.name(b.alias_of)}" if b.alias_of else ""
        lines.append(f"  buffer {text.name(b.name)}: {b.type} {b.region} offset={b.offset}{alias}")
    lines += [f"  output {text.name(o)}" for o in p.outputs]
    lines += [f"  {print_rewrite(r)}" for r in p.rewrites]
    lines += [f"  state {text.name(st.input)} {text.name(st.output)} kernel={text.attr_value(st.kernel)} write_bytes={st.write_bytes} "
              f"copy_bytes={st.copy_bytes} {text.attr_value(st.reason)}" for st in p.state]
    return "\n".join(lines + ["}"]) + "\n"


# ---------------------------------------------------------------- parser

def _kv(c: text.Cursor, key: str) -> Any:
    c.expect(key)
    c.expect("=")
    return c.attr_value()


def _parse_kernel(c: text.Cursor) -> Kernel:
    name = c.ident()
    family = c.ident()
    c.expect("{")
    ops: list[Compute] = []
    binds: dict[str, tuple[tuple[str, Affine], ...]] = {}
    stores: list[str] = []
    props: tuple = ()
    rewrites: tuple = ()
    schedule = None
    predicted: tuple = ()
    cands: list[Candidate] = []
    inplace: list[InPlace] = []
    prefetch: list[Prefetch] = []
    inlined: list[Inlined] = []
    joined: list[Joined] = []
    while not c.accept("}"):
        if c.accept("bind"):
            _parse_bind(c, binds)
        elif c.accept("joined"):
            joined.append(_parse_joined(c))
        elif c.accept("store"):
            stores.append(c.value())
        elif c.accept("properties"):
            props = tuple(c.attr_value())
        elif c.accept("rewrites"):
            rewrites = tuple(c.attr_value())
        elif c.accept("schedule"):
            params = tuple(sorted(c.attrs().items()))
            grid, block = tuple(_kv(c, "grid")), tuple(_kv(c, "block"))
            smem = _kv(c, "smem")
            regs = _kv(c, "registers")
            schedule = (params, grid, block, smem, None if regs == "unknown" else regs)
        elif c.accept("predicted"):
            predicted = tuple(sorted((k, float(v)) for k, v in c.attrs().items()))
        elif c.accept("inplace"):
            out = c.value()
            c.expect("reuses")
            inplace.append(InPlace(out, c.value(), str(c.attr_value())))
        elif c.accept("prefetch"):
            buf = c.value()
            ranges = tuple((int(a), int(b)) for a, b in c.attr_value())
            prefetch.append(Prefetch(buf, ranges, str(c.attr_value())))
        elif c.accept("inlined"):
            views = tuple(str(v) for v in c.attr_value())
            reason = str(c.attr_value())
            op = parse_op(c)
            if not isinstance(op, Compute):
                raise c.fail("a compute after `inlined`")
            inlined.append(Inlined(op, views, reason))
        elif c.accept("candidate"):
            params = tuple(sorted(c.attrs().items()))
            if c.accept("rejected"):
                cands.append(Candidate(params, None, str(c.attr_value())))
            else:
                cands.append(Candidate(params, float(_kv(c, "time_us"))))
        else:
            op = parse_op(c)
            if not isinstance(op, Compute):
                raise c.fail("a compute inside a kernel")
            ops.append(op)
    sched = Schedule(*schedule, predicted, tuple(cands)) if schedule else None
    return Kernel(name, family, tuple(ops), tuple(binds.get(op.out, ()) for op in ops), tuple(stores),
                  props, rewrites, sched, tuple(inplace), tuple(prefetch), tuple(inlined), tuple(joined))


def _parse_bind(c: text.Cursor, binds: dict[str, tuple[tuple[str, Affine], ...]]) -> None:
    out = c.value()
    c.expect("{")
    pairs = []
    while not c.accept("}"):
        v = c.ident()
        c.expect(":")
        pairs.append((v, parse_affine(c)))
        c.accept(",")
    binds[out] = tuple(pairs)


def _parse_joined(c: text.Cursor) -> Joined:
    name = c.ident()
    reason = str(c.attr_value())
    c.expect("{")
    ops: list[Compute] = []
    binds: dict[str, tuple[tuple[str, Affine], ...]] = {}
    while not c.accept("}"):
        if c.accept("bind"):
            _parse_bind(c, binds)
            continue
        op = parse_op(c)
        if not isinstance(op, Compute):
            raise c.fail("a compute inside `joined`")
        ops.append(op)
    return Joined(name, tuple(ops), tuple(binds.get(op.out, ()) for op in ops), reason)


def parse_plan(source: str, weight_data: dict[str, bytes]) -> Plan:
    c = text.Cursor(source)
    c.expect("decision")
    name = str(c.attr_value())
    target = str(_kv(c, "target"))
    precision = str(_kv(c, "precision"))
    c.expect("{")
    inputs: list[Value] = []
    weights: list[Weight] = []
    kernels: list[Kernel] = []
    views: list[View] = []
    buffers: list[Buffer] = []
    outputs: list[str] = []
    rewrites: list[Rewrite] = []
    state: list[State] = []
    while not c.accept("}"):
        if parse_header_item(c, inputs, weights, weight_data):
            continue
        if c.accept("state"):
            x, y = c.value(), c.value()
            kernel = str(_kv(c, "kernel"))
            write, copy = int(_kv(c, "write_bytes")), int(_kv(c, "copy_bytes"))
            state.append(State(x, y, kernel, str(c.attr_value()), write, copy))
        elif c.accept("kernel"):
            kernels.append(_parse_kernel(c))
        elif c.accept("buffer"):
            bname = c.value()
            c.expect(":")
            t = c.ttype()
            region = c.ident()
            offset = int(_kv(c, "offset"))
            alias = ""
            if c.accept("alias"):
                c.expect("=")
                alias = c.value()
            buffers.append(Buffer(bname, t, region, offset, alias))
        elif c.accept("output"):
            outputs.append(c.value())
        elif c.accept("rewrite"):
            rewrites.append(parse_rewrite(c))
        else:
            op = parse_op(c)
            if not isinstance(op, View):
                raise c.fail("a view outside kernels")
            views.append(op)
    return Plan(name, target, tuple(inputs), tuple(weights), tuple(kernels), tuple(views),
                tuple(outputs), tuple(buffers), tuple(rewrites), precision, tuple(state))


# ---------------------------------------------------------------- verifier

def verify_plan(p: Plan) -> None:
    """Kernels read only what earlier kernels stored; stores exist; buffers do not collide."""
    types: dict[str, TensorType] = {v.name: v.type for v in p.inputs}
    types.update({w.name: w.type for w in p.weights})
    views: dict[str, list] = {}   # a source may have several views (of different shapes)
    for v in p.views:
        views.setdefault(v.source, []).append(v)
    stored = set(types)

    def add_views(name: str) -> None:
        for v in views.get(name, ()):
            types[v.out] = v.type
            stored.add(v.out)
            add_views(v.out)
    for name in list(types):
        add_views(name)
    for k in p.kernels:
        where = f"Decision IR verifier: kernel {k.name}"
        local = dict(types)
        if len(k.binds) != len(k.ops):
            raise AicfError(f"{where}: {len(k.binds)} bindings for {len(k.ops)} ops")
        inner: set[str] = set()
        for i in k.inlined:
            verify_op(i.op, {n: t for n, t in local.items() if n in stored}, f"{where}: inlined {i.op.out!r}")
            local[i.op.out] = i.op.type
            local.update({v.out: v.type for v in p.views if v.out in i.views})
            inner |= i.names
        for op in k.ops + k.joined_ops:
            verify_op(op, {n: t for n, t in local.items() if n in stored or n in k.outs or n in inner}, f"{where}: {op.out!r}")
            local[op.out] = op.type
        for s in k.stores:
            if s not in k.outs:
                raise AicfError(f"{where}: stores {s!r}, which it does not compute")
            types[s] = local[s]
            stored.add(s)
            add_views(s)
        sched = k.schedule
        if sched is not None and (min(sched.grid) < 1 or min(sched.block) < 1
                                  or sched.block[0] * sched.block[1] * sched.block[2] > 1024):
            raise AicfError(f"{where}: launch shape grid={sched.grid} block={sched.block} is not valid")
    for o in p.outputs:
        if o not in stored:
            raise AicfError(f"Decision IR verifier: output {o!r} is never stored")
    _verify_buffers(p)


def _verify_buffers(p: Plan) -> None:
    if not p.buffers:
        return
    by_name = {b.name: b for b in p.buffers}
    for name in p.types():
        if name not in by_name and any(name in k.stores for k in p.kernels):
            raise AicfError(f"Decision IR verifier: stored tensor {name!r} has no buffer")
