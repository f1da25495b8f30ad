"""plan_memory: Decision IR → Decision IR with a byte offset for every stored tensor.

Weights get their own region, packed in order. Activations (inputs, outputs, intermediates that
a kernel stores) share one arena: each is live from the kernel that writes it (inputs: from the
start) to the last kernel that reads it (outputs: to the end), and buffers whose lifetimes do
not overlap may share bytes. Placement is greedy by size, largest first, at the lowest offset
that fits. A view shares its source's bytes. Intermediates that fusion removed never appear.

    kernel k0 stores %a; kernel k1 reads %a, stores %b; kernel k2 reads %b, stores %y
  gives
    buffer %a arena offset=0; buffer %b arena offset=<after %a>; buffer %y arena offset=0
"""
from __future__ import annotations

from aicfc.codegen.scratch import scratch
from aicfc.ir.decision import Buffer, Plan
from aicfc.ir.types import Weight
from aicfc.ir.lowered import loads

ALIGN = 256


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_memory(plan: Plan) -> Plan:
    # Scratch a schedule needs (codegen/scratch.py): arena scratch lives only in its kernel;
    # zero-initialized scratch joins the weights region, uploaded once as zeros.
    zeroed = [Weight(s.name, s.type, bytes(s.type.nbytes)) for k in plan.kernels for s in scratch(k) if s.zeroed]
    known = plan.types()
    plan = plan.replace(weights=plan.weights + tuple(w for w in zeroed if w.name not in known))
    types = plan.types()
    arena_scratch = {s.name: (i, s.type) for i, k in enumerate(plan.kernels) for s in scratch(k) if not s.zeroed}
    types.update({name: t for name, (_, t) in arena_scratch.items()})
    source = {v.out: v.source for v in plan.views}

    def base(name: str) -> str:
        while name in source:
            name = source[name]
        return name

    end = len(plan.kernels)
    live: dict[str, list[int]] = {v.name: [-1, -1] for v in plan.inputs}
    for i, k in enumerate(plan.kernels):
        for s in k.stores:
            live.setdefault(s, [i, i])
        for op in k.ops:
            for ld in loads(op.body):
                b = base(ld.buffer)
                if b in live:
                    live[b][1] = max(live[b][1], i)
    for o in plan.outputs:
        live[base(o)][1] = end
    for name, (i, _) in arena_scratch.items():
        live[name] = [i, i]

    placed: list[tuple[int, int, int, int]] = []   # (offset, size, first, last)
    offsets: dict[str, int] = {}
    for name in sorted(live, key=lambda n: (-types[n].nbytes, n)):
        size = _align(max(1, types[name].nbytes))
        first, last = live[name]
        offset = 0
        for o, s, f, l in sorted(placed):
            if f <= last and first <= l and o < offset + size and offset < o + s:
                offset = _align(o + s)
        # re-scan until no overlap remains (placements are few; quadratic is fine)
        while any(f <= last and first <= l and o < offset + size and offset < o + s for o, s, f, l in placed):
            offset = _align(max(o + s for o, s, f, l in placed
                                if f <= last and first <= l and o < offset + size and offset < o + s))
        placed.append((offset, size, first, last))
        offsets[name] = offset

    buffers = [Buffer(n, types[n], "arena", offsets[n]) for n in sorted(offsets, key=lambda n: (offsets[n], n))]
    woff = 0
    for w in plan.weights:
        buffers.append(Buffer(w.name, w.type, "weights", woff))
        woff = _align(woff + w.type.nbytes)
    by_name = {b.name: b for b in buffers}
    for v in plan.views:
        src = by_name[base(v.out)]
        buffers.append(Buffer(v.out, v.type, src.region, src.offset, v.source))
        by_name[v.out] = buffers[-1]
    return plan.replace(buffers=tuple(buffers))


def memory_summary(plan: Plan) -> dict:
    """Sizes `explain` reports: the arena after planning against the sum before it."""
    arena = [b for b in plan.buffers if b.region == "arena" and not b.alias_of]
    io = {v.name for v in plan.inputs} | set(plan.outputs)
    return {
        "arena_bytes": max((b.offset + _align(b.type.nbytes) for b in arena), default=0),
        "weights_bytes": max((b.offset + _align(b.type.nbytes) for b in plan.buffers if b.region == "weights"), default=0),
        "intermediate_bytes": sum(b.type.nbytes for b in arena if b.name not in io),
        "activation_bytes": sum(b.type.nbytes for b in arena),
        "inplace": [],
    }
