"""Unit `stem` of the `conv` family: a convolution of a few input channels (C·KH·KW <= 64, the
first layer of an image network) on tensor cores (`mma.sync` m16n8k16) fed from an image patch in
shared memory (`templates/conv_stem.cu.j2`; cost terms in `planner/cost_conv_stem.py`).

[Note: the stem on tensor cores]
MobileNetV2's and EfficientNet-B0's first convolution (3 -> 32 channels, 3x3 window, stride 2,
pad 1, over 32 x 3 x 224 x 224 fp16 NCHW, bias and ReLU6 or SiLU, stored channels-last
[32, 112, 112, 32]) ran as the `mma` implicit GEMM (gemm_mma.cu.j2 with an `AicfGather` im2col) in
69-72 us on an H200, predicted 29.7: ncu found it bound by instruction issue, 47M warp instructions,
since every gathered element splits its flat (m, k) index by divisions. It moves 35 MB (~8.5 us at
the copy's 4.2 TB/s) for 0.7 GFLOP. The image's 3 channels are too few for the Hopper units (16-byte
runs of channels), and the channels-last copy that pads them to 8 costs more than it saves.

So here no element's index is divided at run time:
- a block takes one output tile of TH x TW pixels of one image and copies the tile's input patch,
  C channels x PH = (TH-1)·sh + (KH-1)·dh + 1 rows x PW = (TW-1)·sw + (KW-1)·dw + 1 columns, into
  shared memory (zeros outside the image: the padding), one patch row a warp step with the lanes
  along its columns (coalesced along an NCHW image's contiguous axis, two columns a lane in one
  4-byte load where pairs stay aligned: `Patch.shift`, `unit_columns`; an NHWC image is read one
  column a lane, strided). Several rows' predicated loads are in flight before their stores.
  Patch rows are PITCH elements apart, the pitch chosen at compile time among the even PW .. PW + 31
  by counting the bank conflicts of the gathers below (`patch`). A run of zeros follows the patch:
  k past K reads it;
- K = C·KH·KW is padded to KC k-steps of 16. The m16n8k16 A fragment gives lane (g = lane / 4,
  t = lane % 4) k = 16s + 2t, 2t + 1, 2t + 8, 2t + 9; the patch offset of such a k,
  koff = c·PH·PITCH + kh·dh·PITCH + kw·dw (k split into the convolution's reduction variables in
  their order, the filter's flattened k), is a compile-time table over t, picked once per lane
  (`aicf_stem_pick`). k >= K points at the zero run, which is as long as the farthest pixel's base
  plus one (every pixel adds its base to the offset);
- the filter's B fragments (K x N, N <= 64 output channels) are loaded once per warp into
  registers, 0 past K (the `thin` unit's held weight, codegen/gemm_thin.py);
- each warp walks 16-pixel groups of the tile: pixel r is (r / TW, r % TW), the lane's rows g and
  g + 8 (g + 8 is a fixed offset D from g: 8 columns on, or one row down where TW = 8), the
  pixel's base (r / TW)·sh·PITCH + (r % TW)·sw + shift, and A's element is patch[base + koff]: one add and
  one 16-bit shared load an element, two packed a register, then KC x N/8 mma.sync;
- the epilogue is staged like gemm_thin's: the warp's 16 x N values through
  `conv_wgmma.staged_parts` into its staging (rows N + 8 elements apart), then whole 16-byte
  pieces stored with __stcs at gm·N + gn; pixels past the output (a partial tile) compute pixel 0's
  epilogue (no branch, so its per-channel loads stay out of the group loop) and are not stored.
SASS (CUDA 13, sm_90) of MobileNetV2 B32's stem at the 8x32 tile: 64 registers, no local memory, 1200
instructions a warp (the filter and tables ~185, the patch ~330, each of its 4 groups ~170, of which the
epilogue's adds, clamps, packs and stores are 64), against the mma implicit GEMM's ~47M warp
instructions in all.
The filter's fragments and the offset tables are read before the dependent-launch wait ([Note: PDL]
in codegen/pdl.py), the image patch after it (ptxas, CUDA 13, schedules the wait first all the same:
the SASS starts with it).

Requires: fp16/bf16 operands, an implicit GEMM over a rank-4 image (NCHW or NHWC) whose GEMM rows are
the output pixels (n, oh, ow) in order and which has no batch variables; one output-channel variable,
N % 8 == 0 and N <= 64; K <= 64; each spatial image index out·stride + tap·dilation - pad; zero
padding; a constant filter; the output the row-major [pixels, channels] matrix of the operands' type
(`conv_wgmma.row_major_out`); the smallest tile's patch in static shared memory. Any target with
mma.sync (sm_80 on), though only sm_90 plans store convolutions channels-last (passes/channels_last.py):
elsewhere the unit declines the NCHW output. Parameter space: TW in {8, 16, 32}, TH in {2, 4, 8} with TH·TW a multiple of 16
and at most 256, WARPS in {4, 8}; PITCH follows from the tile.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Mapping

import numpy as np

from aicfc.codegen import conv_wgmma, pdl
from aicfc.codegen.cexpr import flat_offset
from aicfc.codegen.common import render
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine
from aicfc.ir.properties import implicit_gemm
from aicfc.ir.types import ITEMSIZE, TensorType, contiguous_strides

SPACE = {"TW": (8, 16, 32), "TH": (2, 4, 8), "WARPS": (4, 8)}
MAX_K = 64              # k a lane holds the filter's fragments of: 4 k-steps
MAX_N = 64
MAX_PIXELS = 256        # TH·TW
STATIC_SMEM = 48 * 1024  # CUDA's static shared memory a block, on every target
MIN_SM = 80
LOADS = 16              # a lane's patch loads in flight before their stores


@dataclasses.dataclass(frozen=True)
class Layout:
    """What the convolution's index says (no tensor types needed): which image dimension is which,
    the window's geometry and how k splits into the reduction variables."""
    dims: tuple[int, int, int, int]     # the image's dimensions of (batch, channel, row, column)
    images: int                         # batch of the output (NB)
    channels: int                       # C
    out: tuple[int, int]                # OH, OW
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pad: tuple[int, int]                # the index's constant, negated (top, left)
    taps: tuple[int, int]               # KH, KW
    roles: tuple[tuple[str, int], ...]  # each reduction variable (outer to inner): its role ("c", "kh", "kw";
                                        # "" for extent 1) and extent
    n: int                              # output channels

    @property
    def k(self) -> int:
        return math.prod(e for _, e in self.roles)

    @property
    def k_steps(self) -> int:
        return -(-self.k // 16)

    def split(self, k: int) -> dict[str, int]:
        """Flat k as its roles' values (k flattened row-major over the reduction variables)."""
        got = {}
        for role, e in reversed(self.roles):
            k, got[role] = divmod(k, e)
        return {"c": got.get("c", 0), "kh": got.get("kh", 0), "kw": got.get("kw", 0)}


@dataclasses.dataclass(frozen=True)
class Patch:
    rows: int       # PH
    cols: int       # PW, plus the shift, even
    shift: int      # image columns the patch holds before the first pixel's window (1 where the padding is odd)
    pitch: int      # elements between patch rows (even)
    zero: int       # length of the zero run after the C·PH rows
    ways: float     # the gathers' mean bank-conflict degree at this pitch

    def at_zero(self, lay: Layout) -> int:
        return zero_at(lay, self.rows, self.pitch)

    def elements(self, lay: Layout) -> int:
        """The patch and its zero run, whole 16-byte pieces."""
        return self.at_zero(lay) + -(-self.zero // 8) * 8


def _live(a: Affine, ext: Mapping[str, int]) -> list[tuple[str, int]]:
    return [(v, c) for v, c in a.terms if ext[v] > 1]


def layout(k: Kernel) -> Layout | str:
    """The convolution's layout from its index alone, or why this unit cannot read it."""
    op = k.ops[0]
    g = implicit_gemm(op)
    if g is None:
        return "not an implicit GEMM"
    ext = op.extents()
    idx = g.a.index
    if len(idx) != 4 or any(not isinstance(a, Affine) for a in idx):
        return "the image is not a rank-4 tensor read at affine indices"
    if any(ext[v] > 1 for v in g.batch):
        return "the GEMM has batch variables (the stem's rows are every output pixel)"
    if len(g.n) != 1:
        return "more than one output-channel variable"
    domain, reduce = set(op.domain_vars), set(op.reduce_vars)
    b = _live(idx[0], ext)
    if idx[0].const or len(b) > 1 or (b and (b[0][1] != 1 or b[0][0] not in domain)):
        return "the image's first index is not the batch variable"

    def channel_like(d: int) -> bool:   # one reduction variable alone, or nothing (one channel)
        t = _live(idx[d], ext)
        return not idx[d].const and (not t or (len(t) == 1 and t[0][1] == 1 and t[0][0] in reduce))
    cd = 1 if channel_like(1) else 3 if channel_like(3) else None
    if cd is None:
        return "the image's channel index is neither its second nor its last (NCHW or NHWC)"
    hd, wd = [d for d in (1, 2, 3) if d != cd]
    hh = conv_wgmma._spatial(idx[hd], domain, reduce, ext)
    ww = conv_wgmma._spatial(idx[wd], domain, reduce, ext)
    for part in (hh, ww):
        if isinstance(part, str):
            return part
    (oh, sh, kh, dh, ph), (ow, sw, kw, dw, pw) = hh, ww
    nv = b[0][0] if b else None
    cv = _live(idx[cd], ext)[0][0] if _live(idx[cd], ext) else None
    if tuple(v for v in (nv, oh, ow) if v) != tuple(g.m):
        return "the GEMM rows are not the output pixels (n, oh, ow) in order"
    used = [v for v in (cv, kh, kw) if v]
    if len(set(used)) != len(used) or set(used) != {v for v in op.reduce_vars if ext[v] > 1}:
        return "the reduction is not over (channel, kh, kw) of the image"
    if g.a.fill is not None and (g.a.fill != 0.0 or not set(g.a.guarded_dims) <= {hd, wd}):
        return "the image's padding is not zeros outside its bounds"
    role = {cv: "c", kh: "kh", kw: "kw"}
    return Layout((0, cd, hd, wd), ext[nv] if nv else 1, ext[cv] if cv else 1,
                  (ext[oh] if oh else 1, ext[ow] if ow else 1), (sh, sw), (dh, dw), (ph, pw),
                  (ext[kh] if kh else 1, ext[kw] if kw else 1),
                  tuple((role.get(v, "") if ext[v] > 1 else "", ext[v]) for v in op.reduce_vars), ext[g.n[0]])


def zero_at(lay: Layout, rows: int, pitch: int) -> int:
    """Where the zero run starts: after the C·PH rows, 16-byte aligned (it is cleared by 16-byte stores)."""
    return -(-lay.channels * rows * pitch // 8) * 8


def koffsets(lay: Layout, rows: int, pitch: int) -> list[int]:
    """The patch offset of every k < KC·16 (the zero run's start past K)."""
    zero = zero_at(lay, rows, pitch)
    out = []
    for k in range(16 * lay.k_steps):
        if k >= lay.k:
            out.append(zero)
            continue
        r = lay.split(k)
        out.append(r["c"] * rows * pitch + r["kh"] * lay.dilation[0] * pitch + r["kw"] * lay.dilation[1])
    return out


def shift(lay: Layout) -> int:
    """Image columns the patch starts before the first pixel's window: one where the left padding is odd, so
    that its first column is even (every tile's, since TW is even) and pairs of an NCHW row load 4-byte aligned."""
    return lay.pad[1] % 2


def pixel_bases(lay: Layout, th: int, tw: int, pitch: int) -> np.ndarray:
    r = np.arange(th * tw)
    return (r // tw) * lay.stride[0] * pitch + (r % tw) * lay.stride[1] + shift(lay)


def _ways(lay: Layout, th: int, tw: int, rows: int, pitch: int) -> float:
    """The mean number of distinct 4-byte words a warp's 16-bit gather reads in one bank (1: no
    conflict), over the tile's groups, both rows of a lane, every k-step and fragment slot."""
    ko = np.array(koffsets(lay, rows, pitch)).reshape(lay.k_steps, 16)
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    slots = ko[:, 2 * t[None, :] + np.array([0, 1, 8, 9])[:, None]]               # [KC, 4, 32]
    r = 16 * np.arange(th * tw // 16)[:, None, None] + g + 8 * np.arange(2)[:, None]  # [groups, 2, 32]
    base = pixel_bases(lay, th, tw, pitch)[r]
    words = np.sort(((base[:, :, None, None, :] + slots) // 2).reshape(-1, 32), axis=1)
    first = np.ones(words.shape, bool)
    first[:, 1:] = words[:, 1:] != words[:, :-1]
    at = (np.arange(len(words))[:, None] * 32 + words % 32)[first]
    return float(np.bincount(at, minlength=32 * len(words)).reshape(-1, 32).max(axis=1).mean())


@functools.lru_cache(maxsize=256)
def patch(lay: Layout, th: int, tw: int) -> Patch:
    """The tile's patch, its row pitch the one of the even PW .. PW + 31 whose gathers conflict least (the
    narrowest among equals)."""
    rows = (th - 1) * lay.stride[0] + (lay.taps[0] - 1) * lay.dilation[0] + 1
    cols = (tw - 1) * lay.stride[1] + (lay.taps[1] - 1) * lay.dilation[1] + 1 + shift(lay)
    cols += cols % 2
    ways, pitch = min((_ways(lay, th, tw, rows, p), p) for p in range(cols, cols + 32, 2))
    reach = int(pixel_bases(lay, th, tw, pitch).max())   # the farthest pixel's base
    return Patch(rows, cols, shift(lay), pitch, reach + 1, ways)


def geometry(k: Kernel, plan: Plan) -> Layout | str:
    """The convolution's layout where this unit runs it, or why it does not."""
    from aicfc.codegen.pdl import sm
    if sm(plan.target) < MIN_SM:
        return f"mma.sync m16n8k16 needs sm_{MIN_SM}; the target is {plan.target}"
    op = k.ops[0]
    g = implicit_gemm(op)
    if g is None:
        return "not an implicit GEMM"
    dtype = conv_wgmma.dtype_of(k, plan)
    if dtype is None:
        return f"--precision {plan.precision}: the stem runs fp16/bf16 operands on mma.sync"
    kk = math.prod(op.reduce)
    if kk > MAX_K:
        return f"K = C·KH·KW = {kk} > {MAX_K}: the stem holds every k of the filter in registers"
    lay = layout(k)
    if isinstance(lay, str):
        return lay
    if lay.n % 8 or lay.n > MAX_N:
        return f"N = {lay.n} output channels: the stem takes multiples of 8 up to {MAX_N}"
    types = plan.types()
    if len(types[g.a.buffer].shape) != 4:
        return f"the image has rank {len(types[g.a.buffer].shape)}, not 4"
    if g.b.buffer not in {w.name for w in plan.weights}:
        return "the filter is computed; the stem loads a constant filter before the dependent-launch wait"
    off = flat_offset(g.b.index, types[g.b.buffer])
    ext = op.extents()
    if any(ext[v] > 1 and v not in op.reduce_vars and v != g.n[0] for v, _ in off.terms):
        return "the filter varies with an output pixel"
    if not conv_wgmma.row_major_out(k, types):
        return "the output is not the row-major [pixels, channels] matrix"
    if types[k.ops[-1].out].dtype != dtype:
        return "the output's type is not the operands'"
    p = min_params(lay, dtype)
    if static_smem_of(lay, p, ITEMSIZE[dtype]) > STATIC_SMEM:
        return (f"the patch of a {p['TH']}x{p['TW']} tile ({lay.channels} channels) exceeds {STATIC_SMEM} B of "
                "shared memory")
    return lay


def min_params(lay: Layout, dtype: str) -> dict:
    return {"unit": "stem", "dtype": dtype, "TH": 2, "TW": 8, "WARPS": 4}


def why_not(k: Kernel, plan: Plan) -> str | None:
    geo = geometry(k, plan)
    return geo if isinstance(geo, str) else None


def tiles(lay: Layout, p: Mapping) -> int:
    return lay.images * -(-lay.out[0] // p["TH"]) * -(-lay.out[1] // p["TW"])


def groups(p: Mapping) -> int:
    """16-pixel groups a tile."""
    return p["TH"] * p["TW"] // 16


def space(k: Kernel, plan: Plan, smem_limit: int = STATIC_SMEM) -> list[dict]:
    lay = geometry(k, plan)
    if isinstance(lay, str):
        return []
    dtype = conv_wgmma.dtype_of(k, plan)
    oh, ow = lay.out
    out = []
    for tw in SPACE["TW"]:
        if tw > 8 and tw // 2 >= ow:   # a narrower tile covers the row
            continue
        for th in SPACE["TH"]:
            if th * tw % 16 or th * tw > MAX_PIXELS or (th > 2 and th // 2 >= oh):
                continue
            for warps in SPACE["WARPS"]:
                p = {"unit": "stem", "dtype": dtype, "TH": th, "TW": tw, "WARPS": warps}
                if static_smem_of(lay, p, ITEMSIZE[dtype]) > min(smem_limit, STATIC_SMEM):
                    continue
                out.append(p)
    return out


def threads(p: Mapping) -> int:
    return 32 * p["WARPS"]


def static_smem_of(lay: Layout, p: Mapping, out_esize: int) -> int:
    """The patch with its zero run (16-bit elements) and each warp's 16 x (N + 8) staging."""
    return 2 * patch(lay, p["TH"], p["TW"]).elements(lay) + p["WARPS"] * 16 * (lay.n + 8) * out_esize


def static_smem(k: Kernel, p: Mapping) -> int:
    lay = layout(k)
    assert not isinstance(lay, str), lay
    return static_smem_of(lay, p, ITEMSIZE[k.ops[-1].type.dtype])


def launch(k: Kernel, p: Mapping) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    lay = layout(k)
    assert not isinstance(lay, str), lay
    return (tiles(lay, p), 1, 1), (threads(p), 1, 1), 0


def registers(lay: Layout, p: Mapping) -> int:
    """Registers a lane holds: the filter's fragments (2 a k-step and 8 channels), the patch offsets
    (4 a k-step), the accumulators (4 an 8-channel block), a k-step's A (4), and 32 for the tile,
    addresses and loop state."""
    nb = lay.n // 8
    return 2 * lay.k_steps * nb + 4 * lay.k_steps + 4 * nb + 4 + 32


def unit_columns(k: Kernel, types: Mapping[str, TensorType]) -> int:
    """Patch columns a lane copies at once: 2 (one 4-byte load) where an image row is contiguous and every pair
    starts 4-byte aligned (its first column even: Patch.shift) and lies inside the image or outside it whole
    (W even); else 1."""
    lay = layout(k)
    assert not isinstance(lay, str), lay
    t = types[implicit_gemm(k.ops[0]).a.buffer]
    sn, sc, sy, sx = (contiguous_strides(t.shape)[d] for d in lay.dims)
    return 2 if sx == 1 and sn % 2 == 0 and sc % 2 == 0 and sy % 2 == 0 and t.shape[lay.dims[3]] % 2 == 0 else 1


def _pick(values: list[int]) -> str:
    return "aicf_stem_pick(t, " + ", ".join(str(v) for v in values) + ")"


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str, parts: Mapping) -> str:
    lay = layout(k)
    assert not isinstance(lay, str), lay
    g = implicit_gemm(k.ops[0])
    staged = conv_wgmma.staged_parts(k, types, parts["params"], parts["idx"])
    assert staged is not None, k.name
    th, tw, warps = p["TH"], p["TW"], p["WARPS"]
    pt = patch(lay, th, tw)
    ta = types[g.a.buffer]
    strides = contiguous_strides(ta.shape)
    sn, sc, sy, sx = (strides[d] for d in lay.dims)
    size = (ta.shape[lay.dims[2]], ta.shape[lay.dims[3]])
    # the filter's offset of each k (its reduction variables' terms and constant), -1 past K
    off = flat_offset(g.b.index, types[g.b.buffer])
    ext = k.ops[0].extents()
    names = [v for v in k.ops[0].reduce_vars]
    fk = []
    for kk in range(16 * lay.k_steps):
        if kk >= lay.k:
            fk.append(-1)
            continue
        rest, vals = kk, {}
        for v in reversed(names):
            rest, vals[v] = divmod(rest, ext[v])
        fk.append(off.const + sum(off.coeff(v) * x for v, x in vals.items()))
    ko = koffsets(lay, pt.rows, pt.pitch)

    def table(per_k: list[int]) -> list[list[str]]:
        """[step][slot] the lane's pick of per_k at k = 16·step + 2t + (0, 1, 8, 9)[slot]."""
        return [[_pick([per_k[16 * s + 2 * t + d] for t in range(4)]) for d in (0, 1, 8, 9)]
                for s in range(lay.k_steps)]
    n_groups = groups(p)
    e = unit_columns(k, types)
    steps = -(-pt.cols // e // 32)
    return render("conv_stem.cu.j2", name=name, dtype=p["dtype"], signature=parts["signature"], idx=parts["idx"],
                  threads=threads(p), WARPS=warps, TH=th, TW=tw, C=lay.channels, N=lay.n, NB=lay.n // 8, K=lay.k,
                  KC=lay.k_steps, KH=lay.taps[0], KW=lay.taps[1], SH=lay.stride[0], SW=lay.stride[1],
                  DH=lay.dilation[0], DW=lay.dilation[1], PAD_H=lay.pad[0], PAD_W=lay.pad[1], IMAGES=lay.images,
                  H=size[0], W=size[1], OH=lay.out[0], OW=lay.out[1], SN=sn, SC=sc, SY=sy, SX=sx,
                  PH=pt.rows, PW=pt.cols, SHIFT=pt.shift, PITCH=pt.pitch, ZERO=pt.zero, ZERO_AT=pt.at_zero(lay),
                  PATCH=pt.elements(lay), ROWS=lay.channels * pt.rows, ROW_STEPS=-(-lay.channels * pt.rows // warps),
                  E=e, UT="unsigned" if e == 2 else "unsigned short", UNITS=pt.cols // e, COL_STEPS=steps,
                  BATCH=max(1, min(-(-lay.channels * pt.rows // warps), LOADS // steps)),
                  GROUPS=n_groups, GROUP_STEPS=-(-n_groups // warps),
                  TILES_W=-(-lay.out[1] // tw), TILES_HW=-(-lay.out[0] // th) * -(-lay.out[1] // tw),
                  WHOLE=lay.out[0] % th == 0 and lay.out[1] % tw == 0,
                  D=8 * lay.stride[1] if tw >= 16 else lay.stride[0] * pt.pitch, LDS=lay.n + 8,
                  ko=table([2 * x for x in ko]), fo=table(fk), FN=off.coeff(g.n[0]), a_ptr=parts["params"][g.a.buffer],
                  b_ptr=parts["params"][g.b.buffer], staged=staged, PDL_MARK=pdl.MARK)
