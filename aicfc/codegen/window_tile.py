"""Tiles of the `window` family (schedules with TILE=1): a block computes a tile of outputs (TH rows x TW columns x CG
channels of one image) from a copy in shared memory of the input boxes its taps read
(`templates/window_tile.cu.j2`; cost terms in `planner/cost_window_tile.py`).

[Note: window tiles]
The direct unit (codegen/window.py, runs included) reads every tap from global memory: MobileNetV2's
3x3 depthwise over 32 x 112 x 112 x 32 at B32 took 23.8 us with 4-output runs, its instructions halved
(10.5 M a launch) but its ~106 registers leaving 16 warps an SM to wait on taps from L2: 42% of the
issue slots busy, DRAM at 28% (ncu, an H200, session 34). Here the loads are one bulk copy a tile:
- every load of the window's body (the image, the filter) has a box: over each of its buffer's
  dimensions, the span its affine index covers as the tile's variables and the taps run over their
  ranges (`boxes`; every coefficient is non-negative, so the span starts at the tile's origin with
  the taps at 0). The block copies each box into shared memory as vectors along the channel (the
  innermost dimension of both: the window reads channels-last), converted to fp32 once there rather
  than by every thread whose taps read it, the padding outside the buffer written as the load's fill
  (0 for a convolution, -inf for a max pool). A vector of 8 channels is two quads of fp32, and the
  box is two planes of quads: element (pixel P, channel c = v·vec + e) lies at (e div 4)·plane +
  4·(P·CGV + v) + e mod 4, so that a warp's 16-byte loads of neighbouring channel vectors and pixels
  are contiguous within a plane (no bank conflict; quads side by side in a pixel measured 6-way
  conflicts, ncu);
- a thread then takes `vec` channels of PX consecutive rows of one column of the tile (the runs of
  [Note: window runs] along the row: PX + KH - 1 rows of taps for PX outputs at stride 1), its
  neighbours in the warp the next channels, then the next columns, so that a quarter-warp's 16-byte
  shared loads cover 128 contiguous bytes (runs along the column put a thread's neighbour PX pixels
  away: 4-way bank conflicts at 4 outputs of 16 channels); it reads its taps from the boxes at
  offsets that depend on its place in the tile alone: the origin cancels, and no tap needs a guard;
- the epilogue and the store are the direct unit's, for outputs inside the tensor (a partial tile
  at the right or bottom edge computes and drops the rest).
Requires: a vector window (`window.vector_width` > 1) of rank >= 3 over channels-last data, its
variables (.., row, column, channel); every load of the body affine, non-negative in every variable
and contiguous along the channel; the taps few enough to unroll (window.MAX_RUN_TAPS); the boxes
within the static shared memory.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import numpy as np

from aicfc.codegen import vector
from aicfc.codegen.cexpr import Emitter, c_affine, contiguous_strides
from aicfc.codegen.common import decompose, render
from aicfc.codegen.row_reduce import COMBINE, INIT
from aicfc.ir.decision import Kernel
from aicfc.ir.lowered import Affine, Load, is_integer_compute, loads
from aicfc.ir.types import TensorType

SPACE = {"TH": (1, 2, 4, 8, 16), "TW": (4, 8, 16, 32), "CGV": (1, 2, 4, 8, 16), "PX": (1, 2, 4)}
MIN_THREADS, MAX_THREADS = 64, 512
SMEM_LIMIT = 40 * 1024          # the boxes' bytes a block (static shared memory, two blocks an SM at least)


@dataclasses.dataclass(frozen=True)
class Box:
    """A load's box: its buffer, the extents copied (one per buffer dimension), the first
    element's index per dimension (affine in the tile origin's variables), its fill."""
    load: Load
    extents: tuple[int, ...]
    origin: tuple[Affine, ...]
    fill: float

    @property
    def elements(self) -> int:
        return math.prod(self.extents)


def run_var(k: Kernel) -> str:
    """The variable of a thread's run: the row (the third innermost)."""
    return k.ops[0].domain_vars[-3]


def tile_extents(k: Kernel, p: Mapping) -> dict[str, int]:
    """Each output variable's extent in one tile: channel CG = CGV vectors, column TW, row TH, the
    outer ones 1."""
    red = k.ops[0]
    *outer, row, col, ch = red.domain_vars
    return {v: 1 for v in outer} | {row: p["TH"], col: p["TW"], ch: p["CGV"] * p["vec"]}


def _box(ld: Load, k: Kernel, tile: Mapping[str, int]) -> Box:
    red = k.ops[0]
    span = dict(zip(red.reduce_vars, red.reduce)) | dict(tile)
    extents = tuple(1 + sum(c * (span[v] - 1) for v, c in a.terms) for a in ld.index)
    origin = tuple(Affine.of({v: c for v, c in a.terms if v in tile}, a.const) for a in ld.index)
    return Box(ld, extents, origin, ld.fill if ld.fill is not None else 0.0)


def boxes(k: Kernel, p: Mapping) -> list[Box]:
    """The boxes of the body's loads (distinct loads, in the body's order)."""
    tile = tile_extents(k, p)
    return [_box(ld, k, tile) for ld in dict.fromkeys(loads(k.ops[0].body))]


def why_not(k: Kernel, types: Mapping[str, TensorType], vec: int) -> str | None:
    """Why the window cannot run in tiles (None: it can); `k` has its unit taps removed."""
    from aicfc.codegen.window import MAX_RUN_TAPS
    red = k.ops[0]
    if vec == 1:
        return "the window is not on vectors along a channels-last innermost variable"
    if len(red.domain_vars) < 3:
        return "tiles take rows, columns and channels: the window has fewer output variables"
    if math.prod(red.reduce) > MAX_RUN_TAPS or red.combiner not in COMBINE or is_integer_compute(red.type.dtype, red.body, types):
        return f"more than {MAX_RUN_TAPS} taps, or an integer or unknown combiner"
    inner = red.domain_vars[-1]
    for ld in dict.fromkeys(loads(red.body)):
        if ld.guard or not all(isinstance(a, Affine) for a in ld.index):
            return f"{ld.buffer}: a Concat guard or an indirect index"
        if any(c < 0 for a in ld.index for _, c in a.terms):
            return f"{ld.buffer}: an index decreases along a variable"
        if vector.kind(ld, types, inner, vec) != vector.CONTIGUOUS or ld.index[-1] != Affine.var(inner):
            return f"{ld.buffer}: not read contiguously along the channel in its innermost dimension"
    return None


def smem_bytes(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> int:
    """The boxes in fp32."""
    return sum(b.elements * 4 for b in boxes(k, p))


def threads(p: Mapping) -> int:
    return p["CGV"] * p["TW"] * (p["TH"] // p["PX"])


def space(k: Kernel, types: Mapping[str, TensorType], vec: int) -> list[dict]:
    from aicfc.codegen.window import without_unit_taps
    k = without_unit_taps(k)
    if why_not(k, types, vec):
        return []
    red = k.ops[0]
    rows, cols, chans = red.type.shape[-3:]
    widths = sorted({w for w in SPACE["TW"] if w < cols} | ({cols} if cols <= max(SPACE["TW"]) else set()))
    out = []
    for cgv in SPACE["CGV"]:
        if chans % (cgv * vec):
            continue
        for tw in widths:
            for th in SPACE["TH"]:
                if th > rows:
                    continue
                for px in SPACE["PX"]:
                    p = {"TILE": 1, "vec": vec, "PX": px, "TH": th, "TW": tw, "CGV": cgv}
                    if th % px or not MIN_THREADS <= threads(p) <= MAX_THREADS or smem_bytes(k, p, types) > SMEM_LIMIT:
                        continue
                    out.append(p | {"threads": threads(p), "SMEM": smem_bytes(k, p, types)})
    return out


def tiles(k: Kernel, p: Mapping) -> int:
    red = k.ops[0]
    ext = tile_extents(k, p)
    return math.prod(math.ceil(n / ext[v]) for v, n in zip(red.domain_vars, red.type.shape))


def _plane(b: Box, vec: int) -> int:
    """Floats of one plane of quads of a box in fp32 (vec / 4 planes; one where vec < 4)."""
    return b.elements * 4 // vec if vec % 4 == 0 else b.elements


def _bits(fill: float) -> int:
    """The fill's fp32 bits."""
    return int(np.array(fill, np.float32).view(np.uint32))


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str, sig) -> str:
    from aicfc.codegen.window import epilogue_loads, run_body, without_unit_taps
    k = without_unit_taps(k)
    red = k.ops[0]
    vec, px = p["vec"], p["PX"]
    *outer, row, col, ch = red.domain_vars
    ext = tile_extents(k, p)
    shape = dict(zip(red.domain_vars, red.type.shape))
    # the block's tile: its index split over the tiles of each variable, the origin o_v = t_v * extent
    tile_vars = [(f"t_{v}", math.ceil(shape[v] / ext[v])) for v in red.domain_vars]
    origin = {v: f"o_{v}" for v in red.domain_vars}
    # a thread's place in the tile (local variables l_v): its run of rows, its column, its channel vector (fastest)
    local = [(f"l_{row}", p["TH"] // px), (f"l_{col}", p["TW"]), (f"l_{ch}", p["CGV"])]
    box_list = boxes(k, p)
    copies = []
    for i, b in enumerate(box_list):
        t = types[b.load.buffer]
        strides = contiguous_strides(t.shape)
        coords = [(f"c{i}_{d}", n) for d, n in enumerate(b.extents[:-1])] + [(f"c{i}_v", b.extents[-1] // vec)]
        at = [c_affine(a, origin) + f" + c{i}_{d}" for d, a in enumerate(b.origin[:-1])] + [
            c_affine(b.origin[-1], origin) + f" + c{i}_v * {vec}"]
        inside = " && ".join(f"(unsigned)(g{d}) < {n}u" for d, n in enumerate(t.shape))
        copies.append(dict(name=f"sb{i}", elements=b.elements, vectors=b.elements // vec,
                           coords=decompose("q", coords, "int"), at=at, inside=inside,
                           offset=" + ".join(f"(long long)g{d} * {s}" for d, s in enumerate(strides)),
                           ptr=sig.params[b.load.buffer], bits=_bits(b.fill),
                           plane=_plane(b, vec)))
    box_of = {b.load: i for i, b in enumerate(box_list)}

    names = {v: f"l_{v}" for v in (row, col, ch)} | {v: "0" for v in outer}

    def box_offset(ld: Load, at: Load) -> str:
        """The flat offset in its box of `ld` read at `at` (a run's output and tap): per dimension,
        the index less the box's origin, which is the index's tile-variable terms at the thread's
        place in the tile plus the tap's share of the constant."""
        b = box_list[box_of[ld]]
        coeffs: dict[str, int] = {}
        const = 0
        for a_at, a, s in zip(at.index, ld.index, contiguous_strides(b.extents)):
            for v, c in a_at.terms:
                coeffs[v] = coeffs.get(v, 0) + c * s
            const += (a_at.const - a.const) * s
        # the pixel's first quad in a plane: P·CG elements are P·CGV quads of 4 (each pixel-dimension
        # stride is a multiple of CG); the channel's term (the local vector l_c) is the box load's own
        coeffs.pop(ch, None)
        quads = min(vec, 4)
        return c_affine(Affine.of({v: c * quads // vec for v, c in coeffs.items()}, const * quads // vec), names)

    held: dict[Load, str] = {}

    def box_load(ld: Load, at: Load) -> tuple[list[str], str]:
        held[at] = f"a{len(held)}"
        b = box_list[box_of[ld]]
        return [f"float {held[at]}[{vec}];", f"aicf_box_load<{vec}, {_plane(b, vec)}>(sb{box_of[ld]} + "
                f"({box_offset(ld, at)}), l_{ch}, {held[at]});"], held[at]

    def outside(j: int) -> dict[str, str]:
        """A variable used outside a load: its global value at output j of the run."""
        return {v: v for v in outer} | {row: f"({px} * {row} + {j})", col: col, ch: "first"}

    body = run_body(k, vec, px, row, Emitter(sig.params, types, prefix="v"), box_load, outside)
    # outputs: the global variables from the origin and the thread's place
    gnames = {v: v for v in red.domain_vars}
    epilogue = []
    extra = dict(epilogue_loads(k, px, row))
    for j in range(px):
        index = tuple(Affine.var(v) if v != row else Affine.of({row: px}, j) for v in red.domain_vars)
        guard = f"if ({row} * {px} + {j} < {shape[row]})" if shape[row] % p["TH"] else ""
        if len(k.ops) == 2:
            epi = k.ops[1]
            lines = []
            for ld, here in extra[j].items():
                if here not in held:   # declared before the outputs' blocks: a bias serves them all
                    held[here] = f"b{len(held)}"
                    epilogue += [f"float {held[here]}[{vec}];"] + vector.load_lines(
                        here, vector.kind(ld, types, ch, vec), vec, held[here], sig.params, types, gnames, ch, "first")
            epi_em = Emitter(sig.params, types, prefix=f"w{j}_")
            out = epi_em.emit(epi.body, gnames | {row: f"({px} * {row} + {j})", ch: "first"}, {red.out: f"acc[{j}][e]"},
                              {ld: f"{held[here]}[e]" for ld, here in extra[j].items()})
            lines += [f"float o[{vec}];", "#pragma unroll", f"for (int e = 0; e < {vec}; ++e) {{"] + [
                f"  {x}" for x in epi_em.take()] + [f"  o[e] = {out};", "}",
                vector.store_line(index, epi.type, sig.params[epi.out], gnames, ch, "first", vec, "o")]
        else:
            lines = [vector.store_line(index, red.type, sig.params[red.out], gnames, ch, "first", vec, f"acc[{j}]")]
        epilogue += [f"{guard} {{"] + [f"  {x}" for x in lines] + ["}"]
    return render("window_tile.cu.j2", name=name, signature=sig.text, threads=threads(p), vec=vec, runs=px,
                  combiner=red.combiner, reduce=list(red.reduce), shape=list(red.type.shape), TH=p["TH"], TW=p["TW"],
                  CG=p["CGV"] * vec, tile_split=decompose("blockIdx.x", tile_vars, "int"),
                  origins=[f"const int {origin[v]} = t_{v} * {ext[v]};" for v in red.domain_vars],
                  local_split=decompose("threadIdx.x", local, "int"),
                  globals_=[f"const int {row} = {origin[row]} / {px} + l_{row};", f"const int {col} = {origin[col]} + l_{col};",
                            f"const int first = {origin[ch]} + l_{ch} * {vec};"]
                  + [f"const int {v} = {origin[v]};" for v in outer],
                  valid=f"{row} * {px} < {shape[row]} && {col} < {shape[col]} && first < {shape[ch]}",
                  copies=copies, init=INIT[red.combiner], body=body, epilogue=epilogue)
