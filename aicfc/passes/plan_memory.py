"""plan_memory: Decision IR → Decision IR with a byte offset for every stored tensor.

Weights get their own region, packed in order. Activations (inputs, outputs, intermediates that
a kernel stores) share one arena: each is live from the kernel that writes it to the last kernel
that reads it (inputs: the whole run, so they are never overwritten; outputs: to the end), and
buffers whose lifetimes do not overlap may share bytes. Placement is greedy by size, largest first, at the lowest offset
that fits. A view shares its source's bytes. Intermediates that fusion removed never appear.

In-place: a kernel may write a stored tensor y over the bytes of an intermediate x that dies
in that kernel (no later kernel reads it, it is not a graph input or output) when x and y have
the same type and every read of x in the kernel is at the element the same thread then writes
in y (`why_not_inplace` checks this per family). The two then form one slot, placed once, and
the kernel records the decision with its reason. A residual chain h1 = x + f(x), h2 = h1 +
g(h1), ... then lives in one buffer.

    kernel k0 stores %a; kernel k1 reads %a, stores %b; kernel k2 reads %b, stores %y
  gives
    buffer %a arena offset=0; buffer %b arena offset=<after %a>; buffer %y arena offset=0
"""
from __future__ import annotations

import dataclasses

from aicfc.codegen.scratch import scratch
from aicfc.passes.fold_cache_writes import scatter_part
from aicfc.passes.work_before_wait import ahead, running
from aicfc.ir.decision import Buffer, InPlace, Kernel, Plan
from aicfc.ir.lowered import Affine, Load, index_loads, indirect_dims, loads, view_base
from aicfc.ir.properties import is_identity_access
from aicfc.ir.types import TensorType, Weight
from aicfc.planner.cost import scatter_bytes

ALIGN = 256


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def why_not_inplace(k: Kernel, x: str, y: str, types: dict[str, TensorType]) -> str | None:
    """None when kernel `k` may write its store `y` over `x`; else the reason it may not.

    Legal when each thread reads x only at the element it later writes in y: a map reads x at
    its own index; a GEMM reads x only in its epilogue, at the accumulator's index; a row pass
    reads x only inside the row it writes, and reduces the whole row (statistics) before it
    writes any of it.
    """
    if types[x] != types[y]:
        return f"{x!r} is {types[x]}, {y!r} is {types[y]}"
    if k.family not in ("pointwise", "gemm", "row_reduce"):
        return f"the {k.family} family has no in-place rule"
    if y in {op.out for op in k.joined_ops}:
        return f"{y!r} is written by the GEMM joined into {k.name}'s epilogue, whose rows are not the elements read"
    writer = next(op for op in k.ops if op.out == y)
    if any(ld.buffer == x for i in k.inlined for ld in loads(i.op.body)):
        return f"{x!r} is read by the producer the kernel computes in its operand loads, by many threads"
    for op, bind in zip(k.ops, k.binds):
        for ld in loads(op.body):
            if ld.buffer != x:
                continue
            if indirect_dims(ld) or any(ld is ids for ids in index_loads(op.body)):
                return f"{x!r} is read through or as an indirect (data-dependent) index"
            if k.family == "gemm" and op is k.ops[0]:
                return f"{x!r} is an operand of the contraction, read by many threads"
            index = tuple(a.substitute(dict(bind)) for a in ld.index) if k.family == "row_reduce" else ld.index
            if not is_identity_access(Load(x, index), types[y].shape):
                return f"{x!r} is read at other elements than the one written"
    bind = dict(k.binds[k.ops.index(writer)])
    if any(bind.get(v) != Affine.var(v) for v, n in zip(writer.domain_vars, writer.type.shape) if n > 1):
        return f"{y!r} is not written at its own loop index"
    return None


def plan_memory(plan: Plan, inplace: bool = True) -> Plan:
    # Scratch a schedule needs (codegen/scratch.py): arena scratch lives only in its kernel;
    # zero-initialized scratch joins the weights region, uploaded once as zeros.
    zeroed = [Weight(s.name, s.type, bytes(s.type.nbytes)) for k in plan.kernels for s in scratch(k) if s.zeroed]
    known = plan.types()
    plan = plan.replace(weights=plan.weights + tuple(w for w in zeroed if w.name not in known))
    types = plan.types()
    arena_scratch = {s.name: (i, s.type) for i, k in enumerate(plan.kernels) for s in scratch(k) if not s.zeroed}
    types.update({name: t for name, (_, t) in arena_scratch.items()})
    base = view_base(plan.views)

    end = len(plan.kernels)
    # Inputs stay live to the end: no kernel overwrites them, so replaying the plan (a CUDA
    # graph, a benchmark loop) without copying the inputs in again gives the same outputs.
    live: dict[str, list[int]] = {v.name: [-1, end] for v in plan.inputs}
    # A kernel that works before its wait ([Note: work before the wait]) writes while the kernels still
    # running beside it read and write: what it stores is live from the first of them.
    starts = [min([i] + running(plan.kernels, i)) if ahead(k) else i for i, k in enumerate(plan.kernels)]
    writer: dict[str, int] = {}
    for i, k in enumerate(plan.kernels):
        for s in k.stores:
            live.setdefault(s, [starts[i], i])
            writer.setdefault(s, i)
        for ld in k.loads():
            b = base(ld.buffer)
            if b in live:
                live[b][1] = max(live[b][1], i)
    for o in plan.outputs:
        live[base(o)][1] = end
    for name, (i, _) in arena_scratch.items():
        live[name] = [starts[i], i]

    # In-place: y takes x's slot when x, an intermediate, dies in the kernel that first writes y
    # (y may be a graph output: the slot then lives to the end).
    fixed = {v.name for v in plan.inputs} | {base(o) for o in plan.outputs}
    slot = {name: name for name in live}
    kernels = list(plan.kernels)
    for i, k in enumerate(kernels if inplace else []):
        decisions: list[InPlace] = []
        taken: set[str] = set()
        for y in k.stores:
            if writer[y] != i:
                continue
            reads = dict.fromkeys(ld.buffer for ld in k.loads())
            for x in reads:
                if (x not in live or x in fixed or x in taken or live[x][1] != i or live[x][0] >= i
                        or any(base(o) == x and o != x for o in reads)):
                    continue
                if why_not_inplace(k, x, y, types) is None:
                    taken.add(x)
                    slot[y] = slot[x]
                    decisions.append(InPlace(y, x, f"{x!r} dies in {k.name}, which reads each of its "
                                             f"elements only before writing the same element of {y!r}"))
                    break
        if decisions:
            kernels[i] = k.replace(inplace=tuple(decisions))
    plan = plan.replace(kernels=tuple(kernels))
    span: dict[str, list[int]] = {}
    for name, (first, last) in live.items():
        s = span.setdefault(slot[name], [first, last])
        s[0], s[1] = min(s[0], first), max(s[1], last)

    # State (passes/declare_state.py): each input/output pair is one buffer of the "state"
    # region, which persists across runs; it takes no arena bytes.
    stateful = {n for st in plan.state for n in (st.input, st.output)}
    placed: list[tuple[int, int, int, int]] = []   # (offset, size, first, last)
    offsets: dict[str, int] = {}
    for name in sorted((n for n in span if n not in stateful), key=lambda n: (-types[n].nbytes, n)):
        size = _align(max(1, types[name].nbytes))
        first, last = span[name]
        offset = 0
        # Lowest offset that overlaps no placed slot whose lifetime overlaps this one.
        while True:
            clash = [o + s for o, s, f, l in placed
                     if f <= last and first <= l and o < offset + size and offset < o + s]
            if not clash:
                break
            offset = _align(max(clash))
        placed.append((offset, size, first, last))
        offsets[name] = offset
    offsets = {name: offsets[slot[name]] for name in live if name not in stateful}

    buffers = [Buffer(n, types[n], "arena", offsets[n]) for n in sorted(offsets, key=lambda n: (offsets[n], n))]
    # The state's bytes at the storage precision apply_precision chose after declare_state.
    by_kernel = {k.name: k for k in plan.kernels}
    writes = {st.output: scatter_bytes(scatter_part(by_kernel[st.kernel], st.output), types) for st in plan.state}
    plan = plan.replace(state=tuple(dataclasses.replace(
        st, write_bytes=writes[st.output], copy_bytes=2 * types[st.output].nbytes + writes[st.output])
        for st in plan.state))
    soff = 0
    for st in plan.state:
        buffers += [Buffer(st.input, types[st.input], "state", soff), Buffer(st.output, types[st.output], "state", soff)]
        soff = _align(soff + types[st.output].nbytes)
    woff = 0
    for w in plan.weights:
        buffers.append(Buffer(w.name, w.type, "weights", woff))
        woff = _align(woff + w.type.nbytes)
    by_name = {b.name: b for b in buffers}
    inlined = {n for k in plan.kernels for i in k.inlined for n in i.names}
    for v in plan.views:
        if v.out in inlined:
            continue   # a reshape of a result its reader computes in place (passes/join_concat.py): no bytes
        src = by_name[base(v.out)]
        buffers.append(Buffer(v.out, v.type, src.region, src.offset, v.source))
        by_name[v.out] = buffers[-1]
    return plan.replace(buffers=tuple(buffers))


def memory_summary(plan: Plan, graph_intermediate_bytes: int = 0) -> dict:
    """Sizes `explain` reports: the arena after planning against the sums before it.

    `intermediate_bytes`: every intermediate a kernel stores (after fusion), one buffer each.
    `graph_intermediate_bytes` (given by the caller, who has the High IR): every tensor the
    model's graph names between its inputs and outputs, one buffer each, at the plan's storage
    precision: what a runtime that runs the ONNX graph node by node would allocate.
    """
    arena = [b for b in plan.buffers if b.region == "arena" and not b.alias_of]
    io = {v.name for v in plan.inputs} | set(plan.outputs)
    return {
        "arena_bytes": max((b.offset + _align(b.type.nbytes) for b in arena), default=0),
        "weights_bytes": max((b.offset + _align(b.type.nbytes) for b in plan.buffers if b.region == "weights"), default=0),
        "state_bytes": max((b.offset + _align(b.type.nbytes) for b in plan.buffers if b.region == "state"), default=0),
        "state": [{"input": st.input, "output": st.output, "kernel": st.kernel, "reason": st.reason,
                   "write_bytes": st.write_bytes, "copy_bytes": st.copy_bytes} for st in plan.state],
        "intermediate_bytes": sum(b.type.nbytes for b in arena if b.name not in io),
        "activation_bytes": sum(b.type.nbytes for b in arena),
        "graph_intermediate_bytes": graph_intermediate_bytes,
        "inplace": [{"kernel": k.name, "output": ip.output, "reuses": ip.reuses, "reason": ip.reason}
                    for k in plan.kernels for ip in k.inplace],
    }
