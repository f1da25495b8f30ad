"""Schedule family `row_reduce`: per-row statistics (sum or max over one variable j) reduced by
a group of threads, then the row's element-wise output in the same kernel.

Parameter space: threads per row (`tpr`, a power of two) x rows per block (`rpb`). Partial
results merge in registers, then across the warp with shuffles, then across warps through
shared memory: the associativity the `online_reducible_norm` property guarantees.
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen.cexpr import Emitter, c_affine, flat_offset
from aicfc.codegen.common import decompose, render, signature, store_line
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine, substitute
from aicfc.ir.types import TensorType

SPACE = {"tpr": (8, 16, 32, 64, 128, 256, 512, 1024), "rpb": (1, 2, 4, 8, 16, 32)}
INIT = {"sum": "0.0f", "max": "(-INFINITY)"}
COMBINE = {"sum": "({0} + {1})", "max": "fmaxf({0}, {1})"}


def geometry(k: Kernel) -> tuple[list[tuple[str, int]], str, int]:
    """(row variables with extents, the reduced variable j, j's extent) of the kernel's space."""
    anchor = k.ops[-1]
    extents = anchor.extents()
    if anchor.combiner != "map":
        j = "r0"
    else:
        j = next(v for v, _ in dict(k.binds[0])["r0"].terms)
    rows = [(v, n) for v, n in extents.items() if v != j]
    return rows, j, extents[j]


def space(k: Kernel, plan: Plan) -> list[dict]:
    return [{"tpr": t, "rpb": r} for t in SPACE["tpr"] for r in SPACE["rpb"] if 32 <= t * r <= 1024]


def launch(k: Kernel, p: Mapping) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    rows, _, _ = geometry(k)
    nrows = math.prod(n for _, n in rows)
    return (math.ceil(nrows / p["rpb"]), 1, 1), (p["tpr"], p["rpb"], 1), 0


def static_smem(k: Kernel, p: Mapping) -> int:
    return 4 * p["rpb"] * (p["tpr"] // 32) if p["tpr"] > 32 else 0


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str) -> str:
    rows, j, cols = geometry(k)
    sig = signature(k, types)
    names = {v: v for v, _ in rows} | {j: j}
    em = Emitter(sig.params, types, prefix="v")
    registers: dict[str, str] = {}
    stats = []
    anchor_is_map = k.ops[-1].combiner == "map"
    for op, bind in zip(k.ops, k.binds):
        if op.combiner == "map":
            continue
        b = dict(bind)
        value = em.emit(substitute(op.body, b), names, registers)
        var = f"s_{len(stats)}"
        store = None
        if op.out in k.stores:
            index = tuple(Affine.var(v).substitute(b) for v in op.domain_vars)
            store = f"{sig.params[op.out]}[{c_affine(flat_offset(index, op.type), names)}] = {var};"
        stats.append({"var": var, "init": INIT[op.combiner], "combine": COMBINE[op.combiner],
                      "value": value, "body": em.take(), "store": store,
                      "comment": f"{op.combiner} over {j} of {op.out}"})
        registers[op.out] = var
    out_body = None
    if anchor_is_map:
        anchor = k.ops[-1]
        value = em.emit(anchor.body, names, registers)
        out_body = em.take() + [store_line(anchor, dict(k.binds[-1]), value, sig.params, names)]
    width = min(p["tpr"], 32)
    offsets = [width >> s for s in range(1, int(math.log2(width)) + 1)]
    return render("row_reduce.cu.j2", name=name, rows=math.prod(n for _, n in rows), cols=cols,
                  tpr=p["tpr"], rpb=p["rpb"], idx=sig.index_type, signature=sig.text,
                  decompose=decompose("row", rows, sig.index_type), stats=stats, j=j,
                  warp_offsets=offsets, out_body=out_body)
