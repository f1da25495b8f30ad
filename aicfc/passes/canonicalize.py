"""canonicalize: High IR → High IR with fewer op kinds for the later stages to know.

- `Gemm(A, B, C; alpha, beta, transA, transB)` becomes Transpose/MatMul/Mul/Add, all keeping
  the Gemm's origin, so later passes see one contraction plus pointwise work they can fuse.
- `Identity` disappears (its uses read its input), unless it defines a graph output; so does
  `Dropout` (inference).
- `BatchNormalization` of a `Conv` whose result nothing else reads, with constant weights and
  statistics, folds into the Conv (rule BN_FOLD_RULE): W' = W·s per output channel and
  b' = (b - mean)·s + B with s = scale / sqrt(var + ε). The folded Conv carries
  `folded=<the norm's origin>`, which `lower` turns into the rewrite record. Any other
  constant BatchNormalization becomes Mul and Add by per-channel constants (a map that fuses
  into whatever produces or consumes it).
- A pointwise `Conv` (1x1, unit strides, no padding, one group), once its BatchNormalization is
  folded, becomes Reshape/MatMul/Add/Reshape (`conv_as_matmul`), a GEMM with its epilogue.

    %y: f32[4,8] = Gemm(%a, %b, %c) {alpha=2.0, beta=1.0, transA=0, transB=1} from "g"
  becomes
    %y.bt: f32[16,8] = Transpose(%b) {perm=[1, 0]} from "g"
    %y.mm: f32[4,8] = MatMul(%a, %y.bt) from "g"
    %y.alpha: f32[4,8] = Mul(%y.mm, %y.alpha.c) from "g"
    %y: f32[4,8] = Add(%y.alpha, %c) from "g"
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from aicfc.errors import AicfError
from aicfc.frontend.spatial import CONV_TRANSPOSE_REASON, CONV_TRANSPOSE_RULE
from aicfc.ir.high import Graph, Node, make_attrs
from aicfc.ir.ops import OPS
from aicfc.ir.types import Weight
from aicfc.passes.cancel_views import VIEW_RULE, cancel_views
from aicfc.passes import concat_projections, conv_as_matmul, fold_column_scale
from aicfc.passes.fold_scatter_axes import fold_scatter_axes

BN_FOLD_RULE = "Conv + BatchNormalization => Conv with folded weights"
SCALE_RULE = "MatMul(x·c, y) => MatMul(x, y)·c"
# Why each rewrite that marks its node with attribute `rule` was legal (`lower` records it).
CANON_REASONS = {
    SCALE_RULE: "a scalar commutes with the contraction: the scale is applied to the product, which is then a "
                "plain product of the operands (up to rounding)",
    VIEW_RULE: "the reshape only merged runs of dimensions, which the transpose permuted whole: it is a transpose "
               "of the source (a pure access) followed by the merge",
    conv_as_matmul.POINTWISE_CONV_RULE: conv_as_matmul.POINTWISE_CONV_REASON,
    concat_projections.CONCAT_PROJECTION_RULE: concat_projections.CONCAT_PROJECTION_REASON,
    CONV_TRANSPOSE_RULE: CONV_TRANSPOSE_REASON,
    fold_column_scale.COLUMN_SCALE_RULE: fold_column_scale.COLUMN_SCALE_REASON,
}


def canonicalize(g: Graph, pin: dict | None = None, projections: Mapping[str, str] | None = None) -> Graph:
    """`projections`: the projection shortcuts to merge with the 1x1 they are added to, by their Add's
    output, each with why (passes/concat_projections.py; the pipeline decides them by cost); `pin`:
    `--pin projection=0|1` overrides that; its other keys are later passes'."""
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

    wmap = g.weight_map()
    readers = g.users()
    for n in g.nodes:
        ins = tuple(rename.get(i, i) for i in n.inputs)
        if n.op in ("Identity", "Dropout") and n.output not in g.outputs:
            rename[n.output] = ins[0]
            continue
        if n.op == "BatchNormalization" and all(i in wmap for i in ins[1:]):
            _batch_norm(n, ins, nodes, weights, wmap, readers, g.outputs, types)
            continue
        if n.op == "MatMul" and _hoist_scales(n, ins, nodes, weights, wmap, readers, g.outputs, types):
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
    wmap = {w.name: w for w in weights}
    # After BatchNormalization folding: a projection shortcut's 1x1 and the 1x1 it is added to become
    # one 1x1 over their inputs' channels (passes/concat_projections.py) at the sites the pipeline chose.
    nodes = _concat_projections(nodes, weights, wmap, types, g.outputs, (pin or {}).get(concat_projections.PIN), projections or {})
    # Then pointwise convolutions become batched MatMuls (passes/conv_as_matmul.py).
    out_nodes: list[Node] = []
    for n in nodes:
        if conv_as_matmul.is_pointwise(n, types, wmap):
            made, new_weights = conv_as_matmul.rewrite(n, types, wmap)
            out_nodes += made
            weights += new_weights
        else:
            out_nodes.append(n)
    return fold_scatter_axes(cancel_views(g.replace(nodes=tuple(out_nodes), weights=tuple(weights),
                                                    outputs=tuple(rename.get(o, o) for o in g.outputs))))


def _concat_projections(nodes: list[Node], weights: list[Weight], wmap: dict[str, Weight], types: dict,
                        outputs: tuple[str, ...], forced, chosen: Mapping[str, str]) -> list[Node]:
    """Merge the sites `chosen` names (the Add's output -> why, the pipeline's cost decision:
    passes/pipeline.decide_projections), or every legal one under `--pin projection=1`, none under 0."""
    if forced is not None and str(forced) not in ("0", "1"):
        raise AicfError(f"--pin {concat_projections.PIN}={forced}: expected {concat_projections.PIN}=0 (keep "
                        f"projection shortcuts apart) or {concat_projections.PIN}=1 (merge wherever legal)")
    if str(forced) == "0" or (forced is None and not chosen):
        return nodes
    producer = {n.output: n for n in nodes}
    readers: dict[str, list[Node]] = {}
    for n in nodes:
        for i in dict.fromkeys(n.inputs):
            readers.setdefault(i, []).append(n)
    merged: dict[str, list[Node]] = {}   # the Add's output -> its replacement
    gone: set[str] = set()               # the merged convolutions' outputs

    def fresh(name: str) -> str:
        while name in types or name in wmap:
            name += "'"
        return name

    for n in nodes:
        if forced is None and n.output not in chosen:
            continue
        found = concat_projections.match(n, producer, readers, outputs, wmap, types)
        if found is None:
            continue
        why = chosen[n.output] if forced is None else f"--pin {concat_projections.PIN}={forced}"
        made, new_weights = concat_projections.rewrite(n, *found, types, wmap, fresh, why)
        merged[n.output] = made
        weights += new_weights
        gone.update(c.output for c in found)
    out: list[Node] = []
    for n in nodes:
        if n.output in gone:
            continue
        out += merged.get(n.output, [n])
    return out


def _batch_norm(n: Node, ins: tuple[str, ...], nodes: list[Node], weights: list[Weight], wmap: dict[str, Weight],
                readers: dict[str, list[Node]], outputs: tuple[str, ...], types: dict) -> None:
    """Fold a constant BatchNormalization into the Conv before it, or state it as x·s + t."""
    scale, bias, mean, var = (wmap[i].array().astype(np.float64) for i in ins[1:])
    s = scale / np.sqrt(var + n.attr["epsilon"])
    t = bias - mean * s
    dt = n.type.np_dtype
    conv = nodes[-1] if nodes and nodes[-1].output == ins[0] and nodes[-1].op == "Conv" else None
    if (conv is not None and len(readers.get(ins[0], [])) == 1 and ins[0] not in outputs
            and all(i in wmap for i in conv.inputs[1:])):
        w = wmap[conv.inputs[1]].array().astype(np.float64)
        b = wmap[conv.inputs[2]].array().astype(np.float64) if len(conv.inputs) == 3 else np.zeros(w.shape[0])
        new_w = Weight.of(f"{n.output}.w", (w * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(dt))
        new_b = Weight.of(f"{n.output}.b", (b * s + t).astype(dt))
        weights += [new_w, new_b]
        wmap.update({new_w.name: new_w, new_b.name: new_b})
        types.update({new_w.name: new_w.type, new_b.name: new_b.type, n.output: n.type})
        nodes[-1] = Node("Conv", (conv.inputs[0], new_w.name, new_b.name), n.output, n.type,
                         make_attrs({**conv.attr, "folded": n.origin or n.output}), conv.origin)
        return
    shape = (-1,) + (1,) * (len(n.type.shape) - 2)
    sw = Weight.of(f"{n.output}.scale", s.reshape(shape).astype(dt))
    tw = Weight.of(f"{n.output}.shift", t.reshape(shape).astype(dt))
    weights += [sw, tw]
    types.update({sw.name: sw.type, tw.name: tw.type})
    for op, a, b, out in (("Mul", ins[0], sw.name, f"{n.output}.scaled"), ("Add", f"{n.output}.scaled", tw.name, n.output)):
        t_out = OPS[op].infer([types[a], types[b]], {})
        types[out] = t_out
        nodes.append(Node(op, (a, b), out, t_out, (), n.origin))


def _scalar_scale(name: str, nodes: list[Node], wmap: dict[str, Weight], readers: dict[str, list[Node]],
                  outputs: tuple[str, ...]) -> tuple[str, float] | None:
    """(x, c) when `name` is Mul(x, c) (either order) of a one-element float constant c that only
    the MatMul at hand reads."""
    mul = next((m for m in reversed(nodes) if m.output == name), None)
    if mul is None or mul.op != "Mul" or len(readers.get(name, [])) != 1 or name in outputs:
        return None
    for x, c in (mul.inputs, mul.inputs[::-1]):
        w = wmap.get(c)
        if w is not None and x not in wmap and w.type.numel == 1 and w.type.dtype in ("f32", "f16", "f64"):
            return x, float(w.array().reshape(-1)[0])
    return None


def _feeds_softmax(name: str, readers: dict[str, list[Node]], steps: int = 3) -> bool:
    """Whether `name` reaches a Softmax through a chain of single-reader Add/Sub/Mul/Div/Where
    (the scores' scale and mask)."""
    for _ in range(steps + 1):
        users = readers.get(name, [])
        if len(users) != 1:
            return False
        if users[0].op == "Softmax":
            return True
        if users[0].op not in ("Add", "Sub", "Mul", "Div", "Where"):
            return False
        name = users[0].output
    return False


def _hoist_scales(n: Node, ins: tuple[str, ...], nodes: list[Node], weights: list[Weight], wmap: dict[str, Weight],
                  readers: dict[str, list[Node]], outputs: tuple[str, ...], types: dict) -> bool:
    """SCALE_RULE: MatMul(x·a, y·b) as MatMul(x, y)·(a·b); False when neither operand is scaled."""
    found = [_scalar_scale(i, nodes, wmap, readers, outputs) for i in ins]
    if not any(found) or any(types[i].shape != types[f[0]].shape for i, f in zip(ins, found) if f):
        return False
    if not all(found) and not _feeds_softmax(n.output, readers):
        return False   # one scaled operand elsewhere (a GELU's 0.5 before FFN2) is as good where it is
    operands = tuple(f[0] if f else i for i, f in zip(ins, found))
    scale = float(np.prod([f[1] for f in found if f]))
    mm = f"{n.output}.unscaled"
    types[mm] = n.type
    c = Weight.of(f"{n.output}.scale", np.asarray(scale, dtype=n.type.np_dtype))
    weights.append(c)
    wmap[c.name] = c
    types[c.name] = c.type
    nodes.append(Node("MatMul", operands, mm, n.type, n.attrs, n.origin))
    nodes.append(Node("Mul", (mm, c.name), n.output, n.type, make_attrs({"rule": SCALE_RULE}), n.origin))
    return True
