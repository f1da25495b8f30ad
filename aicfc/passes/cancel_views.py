"""cancel_views: High IR → High IR; reshape/transpose cancellation (part of canonicalize).

torch's dynamo exporter transposes kᵀ for scaled_dot_product_attention on a merged batch:

    %k3: [B·H, S, D] = Reshape(%k)            merge B and H
    %kt3: [B·H, D, S] = Transpose(%k3) {perm=[0, 2, 1]}
    %kt: [B, H, D, S] = Reshape(%kt3)          split them again

A merge followed by a reading in another order is no affine access (the merged index needs
div/mod), so lowered as written the transpose is a stored copy, and the attention reads kᵀ
column-wise. Three rewrites take such chains apart:

- "Transpose(merge) => merge(Transpose)": a Transpose of a Reshape that only merges runs of
  consecutive dimensions permutes those runs, so it is the Transpose of the source by the
  expanded permutation, followed by the merge (as a Reshape of the transposed source).
- "Reshape(Reshape(x)) => Reshape(x)": both are row-major reinterpretations of the same
  elements.
- "Reshape to its own shape => nothing": the reader reads the source.

The chain above becomes `%kt = Transpose(%k) {perm=[0, 1, 3, 2]}`, a pure access that folds
into the attention's operand.
"""
from __future__ import annotations

from aicfc.ir.high import Graph, Node, make_attrs
from aicfc.ir.types import TensorType

VIEW_RULE = "Transpose(merge) => merge(Transpose)"


def merge_groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[list[int]] | None:
    """For each dimension of `dst`, the run of `src` dimensions it merges (extent-1 dimensions
    of `src` join the run before them, or the first one), or None when `dst` does not only
    merge runs of `src`."""
    groups: list[list[int]] = []
    d = 0
    for extent in dst:
        run, size = [], 1
        while d < len(src) and (size < extent or (size == extent and src[d] == 1 and extent != 1 and run)):
            run.append(d)
            size *= src[d]
            d += 1
        if size != extent:
            return None
        groups.append(run)
    if d < len(src):
        if any(src[i] != 1 for i in range(d, len(src))) or not groups:
            return None
        groups[-1] += list(range(d, len(src)))
    return groups


def cancel_views(g: Graph) -> Graph:
    producer = {n.output: n for n in g.nodes}
    types = g.types()
    rename: dict[str, str] = {}
    nodes: list[Node] = []
    for n in g.nodes:
        n = Node(n.op, tuple(rename.get(i, i) for i in n.inputs), n.output, n.type, n.attrs, n.origin)
        src = producer.get(n.inputs[0]) if n.inputs else None
        if n.op == "Transpose" and src is not None and src.op == "Reshape":
            x = rename.get(src.inputs[0], src.inputs[0])
            groups = merge_groups(types[x].shape, src.type.shape)
            if groups is not None and all(groups):
                perm = [d for p in n.attr["perm"] for d in groups[p]]
                t_shape = tuple(types[x].shape[d] for d in perm)
                tname = f"{n.output}.t"
                t = TensorType(n.type.dtype, t_shape)
                types[tname] = t
                nodes.append(Node("Transpose", (x,), tname, t, make_attrs({"perm": tuple(perm), "rule": VIEW_RULE}),
                                  n.origin))
                n = Node("Reshape", (tname,), n.output, n.type, make_attrs({"shape": n.type.shape}), n.origin)
                producer[tname] = nodes[-1]
        if n.op == "Reshape":
            inner = producer.get(n.inputs[0])
            if inner is not None and inner.op == "Reshape":
                n = Node("Reshape", (rename.get(inner.inputs[0], inner.inputs[0]),), n.output, n.type,
                         n.attrs, n.origin)
            if types[n.inputs[0]].shape == n.type.shape and n.output not in g.outputs:
                rename[n.output] = n.inputs[0]
                continue
        producer[n.output] = n
        nodes.append(n)
    return g.replace(nodes=tuple(nodes), outputs=tuple(rename.get(o, o) for o in g.outputs))
