"""fold_column_scale: High IR → High IR; a constant per-column scale of a MatMul's left operand
moves into its constant right operand (rule COLUMN_SCALE_RULE).

    %xn = Mul(%g, %x)            g: [K] constant (an RMSNorm's weight), x: [.., K]
    %y  = MatMul(%xn, %w)        w: [K, N] constant
  becomes
    %y  = MatMul(%x, %w.g)       w.g[k, n] = g[k]·w[k, n], computed once at compile time

(x ⊙ g)·W = x·(diag(g)·W): the scale of column k of x multiplies row k of W. Every reader of %xn
must be such a MatMul (Q, K and V read one norm; gate and up another), each with a weight that
nothing else reads (a tied embedding keeps its one copy), and %xn no graph output; then the Mul
goes. What is left of the norm is x·r, r one number a row: a row scale that commutes with the
contraction, so a gemv may apply it to its sums (passes/fold_row_scale.py). Every plan compiled
from the model makes the same folded bytes, so a bundle of several plans stores each weight once.
Rounding: g·W is rounded once to the weight's type (fp16 at --precision fp16, after this pass),
where the Mul rounded x·g; both are within the precision's tolerance.
"""
from __future__ import annotations

from aicfc.ir.high import Graph, Node, make_attrs
from aicfc.ir.types import RowScaled, Weight

COLUMN_SCALE_RULE = "MatMul(x·g, W) => MatMul(x, g·W)"
COLUMN_SCALE_REASON = ("a constant scale of the contraction's column k multiplies row k of the constant weight: "
                       "folded at compile time, the Mul is gone")


def _scale_of(mul: Node, wmap: dict[str, Weight]) -> tuple[str, Weight] | None:
    """(x, g) when `mul` is Mul(x, g) (either order) of a float constant g over x's last axis only."""
    if mul.op != "Mul":
        return None
    for x, c in (mul.inputs, mul.inputs[::-1]):
        g = wmap.get(c)
        if g is None or x in wmap or g.type.dtype not in ("f32", "f16", "f64") or not g.type.shape:
            continue
        k = mul.type.shape[-1] if mul.type.shape else 0
        if g.type.shape[-1] == k and k > 1 and all(d == 1 for d in g.type.shape[:-1]) and \
                len(g.type.shape) <= len(mul.type.shape):
            return x, g
    return None


def fold_column_scale(g: Graph) -> Graph:
    wmap = g.weight_map()
    users = g.users()
    uses = {name: len(us) for name, us in users.items()}
    folds: dict[str, tuple[str, Weight]] = {}   # Mul output -> (x, g)
    for n in g.nodes:
        found = _scale_of(n, wmap)
        if found is None or n.output in g.outputs:
            continue
        readers = users.get(n.output, [])
        if readers and all(r.op == "MatMul" and r.inputs[0] == n.output
                           and r.inputs[1] in wmap and len(wmap[r.inputs[1]].type.shape) == 2
                           and wmap[r.inputs[1]].type.dtype in ("f32", "f16", "f64")
                           and uses.get(r.inputs[1], 0) == 1 and r.inputs[1] not in g.outputs for r in readers):
            folds[n.output] = found
    if not folds:
        return g
    nodes: list[Node] = []
    weights = list(g.weights)
    for n in g.nodes:
        if n.output in folds:
            continue   # every reader takes x and the folded weight
        if n.op == "MatMul" and n.inputs[0] in folds:
            x, scale = folds[n.inputs[0]]
            w = wmap[n.inputs[1]]
            made = Weight(f"{w.name}.g", w.type, RowScaled(w, scale))   # computed when read
            weights.append(made)
            attrs = dict(n.attr) | {"rule": COLUMN_SCALE_RULE}
            nodes.append(Node("MatMul", (x, made.name), n.output, n.type, make_attrs(attrs), n.origin))
            continue
        nodes.append(n)
    live = {i for n in nodes for i in n.inputs} | set(g.outputs)
    return g.replace(nodes=tuple(nodes), weights=tuple(w for w in weights if w.name in live))
