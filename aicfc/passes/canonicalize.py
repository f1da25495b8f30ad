"""canonicalize: High IR → High IR with fewer op kinds for the later stages to know.

- `Gemm(A, B, C; alpha, beta, transA, transB)` becomes Transpose/MatMul/Mul/Add, all keeping
  the Gemm's origin, so later passes see one contraction plus pointwise work they can fuse.
- `Identity` disappears (its uses read its input), unless it defines a graph output.

    %y: f32[4,8] = Gemm(%a, %b, %c) {alpha=2.0, beta=1.0, transA=0, transB=1} from "g"
  becomes
    %y.bt: f32[16,8] = Transpose(%b) {perm=[1, 0]} from "g"
    %y.mm: f32[4,8] = MatMul(%a, %y.bt) from "g"
    %y.alpha: f32[4,8] = Mul(%y.mm, %y.alpha.c) from "g"
    %y: f32[4,8] = Add(%y.alpha, %c) from "g"
"""
from __future__ import annotations

import numpy as np

from aicfc.ir.high import Graph, Node, make_attrs
from aicfc.ir.ops import OPS
from aicfc.ir.types import Weight


def canonicalize(g: Graph) -> Graph:
    nodes: list[Node] = []
    weights = list(g.weights)
    types = g.types()
    rename: dict[str, str] = {}

    def emit(op: str, inputs: tuple[str, ...], out: str, origin: str, **attrs) -> str:
        t = OPS[op].infer([types[i] for i in inputs], attrs)
        types[out] = t
        nodes.append(Node(op, inputs, out, t, make_attrs(attrs), origin))
        return out

    def scalar(name: str, value: float, dtype: np.dtype) -> str:
        weights.append(Weight.of(name, np.asarray(value, dtype=dtype)))
        types[name] = weights[-1].type
        return name

    for n in g.nodes:
        ins = tuple(rename.get(i, i) for i in n.inputs)
        if n.op == "Identity" and n.output not in g.outputs:
            rename[n.output] = ins[0]
            continue
        if n.op != "Gemm":
            nodes.append(Node(n.op, ins, n.output, n.type, n.attrs, n.origin))
            continue
        at, y, dt = n.attr, n.output, n.type.np_dtype
        a, b = ins[0], ins[1]
        if at["transA"]:
            a = emit("Transpose", (a,), f"{y}.at", n.origin, perm=(1, 0))
        if at["transB"]:
            b = emit("Transpose", (b,), f"{y}.bt", n.origin, perm=(1, 0))
        parts = [emit("MatMul", (a, b), f"{y}.mm", n.origin)]
        if at["alpha"] != 1.0:
            parts[0] = emit("Mul", (parts[0], scalar(f"{y}.alpha.c", at["alpha"], dt)), f"{y}.alpha", n.origin)
        if len(ins) == 3 and at["beta"] != 0.0:
            c = ins[2]
            if at["beta"] != 1.0:
                c = emit("Mul", (c, scalar(f"{y}.beta.c", at["beta"], dt)), f"{y}.beta", n.origin)
            parts.append(c)
        if len(parts) == 2:
            emit("Add", tuple(parts), y, n.origin)
        else:
            last = nodes.pop()
            nodes.append(Node(last.op, last.inputs, y, last.type, last.attrs, last.origin))
            types[y] = last.type
    return g.replace(nodes=tuple(nodes), weights=tuple(weights),
                     outputs=tuple(rename.get(o, o) for o in g.outputs))
