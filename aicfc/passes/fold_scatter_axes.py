"""fold_scatter_axes: High IR → High IR; a ScatterND between inverse transposes writes the
untransposed tensor at other axes (called by canonicalize, after its rewrites).

torch's exporter states `past.index_copy(2, pos, k)` on [B, H, S, D] as ScatterND writing
axis 0 of past transposed to [S, B, H, D], and transposes the result back. Writing axis 0 of
Transpose_p(x) is writing axis p[0] of x, so

    %t = Transpose(%past) {perm=[2, 0, 1, 3]}
    %s = ScatterND(%t, %ids, %upd) {axes=[0]}
    %y = Transpose(%s) {perm=[1, 2, 0, 3]}
  becomes
    %y = ScatterND(%past, %ids, %upd') {axes=[2]}

with %upd' the updates' slices permuted to the remaining axes of x in increasing order (here
none: B, H, D keep their order). Only when the inner transpose and the scatter have no other
reader: then %past itself is what is updated, which `declare_state` needs to see.
"""
from __future__ import annotations

from aicfc.ir.high import Graph, Node, make_attrs
from aicfc.ir.ops import OPS


def fold_scatter_axes(g: Graph) -> Graph:
    producer = {n.output: n for n in g.nodes}
    users = g.users()
    outputs = set(g.outputs)
    drop: set[str] = set()
    replace: dict[str, list[Node]] = {}
    for outer in g.nodes:
        scatter = producer.get(outer.inputs[0]) if outer.op == "Transpose" else None
        if scatter is None or scatter.op != "ScatterND" or len(users.get(scatter.output, [])) != 1:
            continue
        inner = producer.get(scatter.inputs[0])
        if (inner is None or inner.op != "Transpose" or len(users.get(inner.output, [])) != 1
                or scatter.output in outputs or inner.output in outputs):
            continue
        p, q = inner.attr["perm"], outer.attr["perm"]
        if tuple(p[d] for d in q) != tuple(range(len(p))):
            continue
        axes = scatter.attr["axes"]
        rest_t = [d for d in range(len(p)) if d not in axes]      # in the transposed order
        new_axes = tuple(p[a] for a in axes)
        rest_x = sorted(p[d] for d in rest_t)                      # in x's order
        lead = len(g.types()[scatter.inputs[2]].shape) - len(rest_t)
        perm = tuple(range(lead)) + tuple(lead + [p[d] for d in rest_t].index(a) for a in rest_x)
        made: list[Node] = []
        upd = scatter.inputs[2]
        types = g.types()
        if perm != tuple(range(len(perm))):
            t = OPS["Transpose"].infer([types[upd]], {"perm": perm})
            made.append(Node("Transpose", (upd,), f"{outer.output}.upd", t, make_attrs({"perm": perm}), scatter.origin))
            upd = made[-1].output
            types[upd] = t
        ins = (inner.inputs[0], scatter.inputs[1], upd)
        at = {"axes": new_axes}
        t = OPS["ScatterND"].infer([types[ins[0]], types[ins[1]], types[upd]], at)
        made.append(Node("ScatterND", ins, outer.output, t, make_attrs(at), scatter.origin))
        drop |= {inner.output, scatter.output}
        replace[outer.output] = made
    if not replace:
        return g
    nodes: list[Node] = []
    for n in g.nodes:
        if n.output in drop:
            continue
        nodes.extend(replace.get(n.output, [n]))
    return g.replace(nodes=tuple(nodes))
