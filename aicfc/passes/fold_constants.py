"""fold_constants: a node whose inputs are all weights becomes a weight (evaluated with numpy,
by the op table's `evaluate`, for every dtype).

Folding is skipped when the result would exceed FOLD_LIMIT bytes, so a broadcast of a small
constant does not bloat the bundle.

    weight %b: f32[16,8]
    %bt: f32[8,16] = Transpose(%b) {perm=[1, 0]}
  becomes
    weight %bt: f32[8,16]
"""
from __future__ import annotations

import numpy as np

from aicfc.ir.high import Graph
from aicfc.ir.ops import OPS
from aicfc.ir.types import Weight

FOLD_LIMIT = 64 << 20


def fold_constants(g: Graph) -> Graph:
    values = {w.name: w for w in g.weights}
    nodes = []
    for n in g.nodes:
        if all(i in values for i in n.inputs) and n.type.nbytes <= FOLD_LIMIT:
            # Any op of the table, integer and bool tensors included (shape arithmetic, masks).
            with np.errstate(all="ignore"):
                result = np.asarray(OPS[n.op].evaluate([values[i].array() for i in n.inputs], n.attr))
            values[n.output] = Weight.of(n.output, result.astype(n.type.np_dtype).reshape(n.type.shape))
        else:
            nodes.append(n)
    return g.replace(nodes=tuple(nodes), weights=tuple(values.values()))
