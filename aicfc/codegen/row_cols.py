"""The `cols` pass of the `row_reduce` family: one reduction over a variable j that is strided in
memory, of rows whose innermost variable c is contiguous: a spatial mean of a channels-last image
(squeeze-excite's squeeze, a global average pool), y[n, c] = sum_j f(x[n, j, c]).

The other passes give a row to `tpr` threads that step along j; here j steps C elements, so a
warp's loads touch 32/tpr channels of a pixel and use a quarter of each sector at tpr = 8
(EfficientNet-B0 B32's squeezes ran 20-88 us at 270-750 GB/s on an H200:
benchmarks/results/cnn_profiles_session15_h200.txt). Under `cols` a thread owns `vec` consecutive
channels (one 16-byte vector) and a block is `lanes` such vectors side by side (lanes·vec
channels of one outer row) by `slices` threads along j: slice s reads j = s, s + slices, ...,
so a warp reads lanes·16 contiguous bytes of 32/lanes pixels. The slices' partial results merge
through shared memory in a tree (log2 slices barriers), in the same order every run, and slice
0 stores the vector.

Legal (`geometry`) where the kernel is one sum / max / min stored as it is (no prologue, no
element-wise output), reading one row input along j whose channel run is contiguous and 16-byte
aligned; otherwise the reason. Parameters: lanes in LANES (at most the row's vectors), threads
in THREADS; blocks = ceil(C / vec / lanes) x the outer rows. Cost terms (planner/cost.py
`_row_cols_cost`): the input's bytes at the DRAM rate the grid's resident threads sustain (bytes
in flight by Little's law, UNROLL vectors a thread), a lanes·16-byte run per 32-byte sector,
the tree's barriers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from aicfc.codegen.cexpr import Emitter, c_affine, flat_offset
from aicfc.codegen.common import CTYPES, decompose, element_offset, render, signature
from aicfc.ir.decision import Kernel
from aicfc.ir.lowered import Affine, Load
from aicfc.ir.types import ITEMSIZE, TensorType

LANES = (1, 2, 4, 8, 16, 32)
THREADS = (128, 256, 512, 1024)
UNROLL = 4          # vectors a thread has in flight along j
INIT = {"sum": "0.0f", "max": "(-INFINITY)", "min": "INFINITY"}
COMBINE = {"sum": "({0} + {1})", "max": "fmaxf({0}, {1})", "min": "fminf({0}, {1})"}


@dataclass(frozen=True)
class Cols:
    c: str                              # the contiguous row variable (the channel)
    vec: int                            # channels a thread owns: one 16-byte vector of the input
    load: Load                          # the row input read along j
    outer: tuple[tuple[str, int], ...]  # the other row variables, in row order
    vcols: int                          # vectors a row holds: C / vec


def geometry(row, types: Mapping[str, TensorType]) -> Cols | str:
    """The `cols` layout of the row kernel `row` (row_reduce.analyze's), or why it does not apply."""
    if row.anchor is not None or row.prologue is not None or len(row.stats) != 1:
        return "not one stored reduction (an element-wise output or several statistics)"
    stat = row.stats[0]
    if stat.combiner not in COMBINE:
        return f"a {stat.combiner} reduction"
    lds = [ld for ld in row.row_loads([row.of(stat)]) if row.per_row(ld)]
    if len(lds) != 1 or len(row.row_loads([row.of(stat)])) != 1:
        return "not one row input read along j"
    ld = lds[0]
    if not all(isinstance(a, Affine) for a in ld.index):
        return "the row input is read through an index (a gather)"
    t = types[ld.buffer]
    off = flat_offset(ld.index, t)
    if off.coeff(row.j) in (0, 1):
        return f"{row.j} is contiguous in the row input (the vector passes read it)"
    vec = 16 // ITEMSIZE[t.dtype]
    ext = dict(row.rows)
    c = channel(row.rows)
    if c is None or off.coeff(c) != 1:
        return "the innermost row variable is not contiguous in the row input"
    if ext[c] % vec or off.const % vec or any(x % vec for v, x in off.terms if v != c):
        return f"the channel run ({ext[c]} elements) is not whole {vec}-element, 16-byte aligned vectors"
    outer = tuple((v, n) for v, n in row.rows if v != c)
    return Cols(c, vec, ld, outer, ext[c] // vec)


def channel(rows) -> str | None:
    """The row variable a thread's vector runs along: the innermost one of extent > 1."""
    return next((v for v, n in reversed(rows) if n > 1), None)


def space(row, types: Mapping[str, TensorType]) -> list[dict]:
    g = geometry(row, types)
    if isinstance(g, str):
        return []
    lanes = [n for n in LANES if n <= max(1, g.vcols) and (n == 1 or n // 2 < g.vcols)]
    return [{"pass": "cols", "vec": g.vec, "lanes": n, "threads": t, "tpr": 1, "rpb": t}
            for n in lanes for t in THREADS if t // n >= 2]


def slices(p: Mapping) -> int:
    return p["threads"] // p["lanes"]


def blocks(rows, p: Mapping) -> int:
    """ceil(C / vec / lanes) blocks a row of channels, times the outer rows (`rows`: the row variables)."""
    ext = dict(rows)
    c = channel(rows)
    return math.ceil(ext[c] // p["vec"] / p["lanes"]) * math.prod(n for v, n in rows if v != c)


def launch(rows, p: Mapping) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    return (blocks(rows, p), 1, 1), (p["lanes"], slices(p), 1), 0


def static_smem(p: Mapping) -> int:
    return 4 * p["threads"] * p["vec"]


def render_kernel(k: Kernel, row, p: Mapping, types: Mapping[str, TensorType], name: str) -> str:
    """The kernel `k` (analyzed as `row` by row_reduce) under the `cols` schedule `p`."""
    g = geometry(row, types)
    assert not isinstance(g, str), g
    stat = row.stats[0]
    sig = signature(k, types)
    idx = sig.index_type
    names = {v: v for v, _ in row.rows} | {row.j: row.j}
    em = Emitter(sig.params, types, prefix="v")
    elements = []
    for v in range(g.vec):
        value = em.emit(row.of(stat), names | {g.c: f"(c0 + {v})"}, {}, {g.load: f"t[{v}]"})
        elements.append((em.take(), value))
    t = types[g.load.buffer]
    at = c_affine(flat_offset(g.load.index, t), names | {g.c: "c0"})
    bind = dict(k.binds[k.ops.index(stat)])
    out = element_offset(stat, bind)
    stores = [f"{sig.params[stat.out]}[{c_affine(out, names | {g.c: f'(c0 + {v})'})}] = acc[{v}];"
              for v in range(g.vec)] if stat.out in k.stores else []
    return render("row_cols.cu.j2", name=name, signature=sig.text, idx=idx, vec=g.vec, lanes=p["lanes"],
                  slices=slices(p), threads=p["threads"], cblocks=math.ceil(g.vcols / p["lanes"]), vcols=g.vcols,
                  j=row.j, cols=row.cols, decompose=decompose("outer", list(g.outer), idx),
                  ctype=CTYPES[t.dtype], ptr=sig.params[g.load.buffer], at=at, elements=elements,
                  init=INIT[stat.combiner], combine=COMBINE[stat.combiner], stores=stores, comb=stat.combiner,
                  unroll=UNROLL, what=f"{stat.combiner} over {row.j} ({row.cols} steps) of {stat.out}")
