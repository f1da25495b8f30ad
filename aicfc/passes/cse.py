"""cse: one node per distinct computation, one weight per distinct constant.

Two weights with the same type and bytes are one constant; two nodes with the same op, the
same (already merged) inputs and the same attributes compute the same tensor, since every op
in the table is a pure function. Later duplicates are replaced by the first everywhere they
are read. A duplicate that is a graph output keeps its name (the output must exist), so it is
left alone. Exporters emit such duplicates often: one `Constant` per use, a mask or a shape
computed once per layer.

    %a = Relu(%x); %b = Relu(%x); %y = Add(%a, %b)      becomes      %a = Relu(%x); %y = Add(%a, %a)
"""
from __future__ import annotations

from aicfc.ir.high import Graph, Node


def cse(g: Graph) -> Graph:
    outputs = set(g.outputs)
    rename: dict[str, str] = {}
    first_weight: dict[tuple, str] = {}
    weights = []
    for w in g.weights:
        key = (w.type, w.sha256)
        if key in first_weight and w.name not in outputs:
            rename[w.name] = first_weight[key]
            continue
        first_weight.setdefault(key, w.name)
        weights.append(w)
    first_node: dict[tuple, str] = {}
    nodes: list[Node] = []
    for n in g.nodes:
        inputs = tuple(rename.get(i, i) for i in n.inputs)
        key = (n.op, inputs, n.attrs, n.type)
        if key in first_node and n.output not in outputs:
            rename[n.output] = first_node[key]
            continue
        first_node.setdefault(key, n.output)
        nodes.append(n if inputs == n.inputs else Node(n.op, inputs, n.output, n.type, n.attrs, n.origin))
    return g.replace(weights=tuple(weights), nodes=tuple(nodes))
