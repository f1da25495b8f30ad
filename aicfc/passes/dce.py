"""dce: drop nodes and weights that no graph output depends on.

    %a = Relu(%x); %b = Tanh(%x); output %a      becomes      %a = Relu(%x); output %a
"""
from __future__ import annotations

from aicfc.ir.high import Graph


def dce(g: Graph) -> Graph:
    live = set(g.outputs)
    kept = []
    for n in reversed(g.nodes):
        if n.output in live:
            kept.append(n)
            live.update(n.inputs)
    return g.replace(nodes=tuple(reversed(kept)), weights=tuple(w for w in g.weights if w.name in live))
