"""The Hopper engine of the `conv` family (sm_90a): an implicit GEMM over a channels-last image
on the warp-specialized `wgmma` pipeline of `gemm_wgmma` (its template, with a gathering producer).

C[m, n] = epilogue(sum_k A[m, k] · B[k, n]) with m = the output pixel (n, oh, ow) and n = the
output channel, each flattened row-major as the lowered domain orders them, and k = (kh, kw, c)
with the image's channel c innermost. `passes/channels_last.py` makes that layout: the image
X[n, h, w, c] (A) and the filter W[o, kh, kw, c] (B, the [OC, KH·KW·C] matrix, K-major).

A k-block of 64 k (one 128-byte swizzle row of fp16/bf16) of one A row is 8 runs of 8 channels,
16 contiguous bytes of the image at one (kh, kw) tap, or all padding (the guard of the lowered
access does not depend on c). The producer warpgroup's 128 threads gather them: thread t takes
run t % 8 of rows t / 8 + 16 j, splits the flat m and k back into loop variables, and issues a
16-byte `cp.async` (zero-filled where the guard fails, past M or past K) straight to the place
the 128-byte swizzle puts it (run r of row i at i·128 + ((r ^ i % 8)·16), tiles 1024-byte
aligned), so the consumers' wgmma descriptors are the GEMM's. One thread of it loads the
filter tile with the TMA (the B tensor map). A stage is full when the TMA's bytes landed and
all 128 gatherers arrived. Each gatherer commits one group of copies a k-block and keeps up to
`gather_lag(STAGES) + 1` = STAGES - 1 of them in flight: after committing k-block `it` it waits
until LAG groups are pending (`cp.async.wait_group LAG`), makes k-block it - LAG's copies visible
to the async proxy wgmma reads through (`fence.proxy.async`), then arrives on that stage's full
barrier. The producer next waits for the consumers to free k-block it + 1 - STAGES, published
already while LAG <= STAGES - 1; LAG = STAGES - 2 leaves the consumers one published stage of
slack. So STAGES >= 3 (LAG >= 1: with LAG = 0 each gatherer would wait for the copies it has
just issued). Measured (ResNet-50 B32, H200, benchmarks/results/*_session5_h200.txt): STAGES 5 and
6 ran the 3x3 convolutions' k-blocks no faster than STAGES 3 and 4 did with one group pending, so
the cost model does not credit the deeper lag (planner/cost_conv_wgmma.py, t_round).

A by the TMA (A = "tma", chosen by cost beside A = "gather" where `im2col_geometry` allows): the
TMA's im2col mode reads the A tile itself ([Note: TMA im2col record] in codegen/tma.py). One
thread issues, per k-block, one copy of BM output pixels' 64 channels at one tap: coordinates
(c0, ow·sw - pw, oh·sh - ph, n) of the tile's first pixel, offsets (kw·dw, kh·dh) of the tap; the
TMA walks the pixels w fastest, then h, then n, zero-filling the padding and past the last image,
and writes 128-byte swizzled rows, so the consumers' descriptors are unchanged. For an 8-channel
image (the stem, its input copy padded to 8) a k-block is 8 taps of 16 bytes a pixel: 8 copies,
each into its own BM x 16-byte run of unswizzled core matrices (`PlainA`: LBO = BM·16 between
taps, SBO = 128 between 8-row groups); a tap past the filter's last re-reads that one, whose
weights the filter's map reads as zeros. The map's corners: lower = -pad, upper chosen so the walk
takes OW positions a row (ceil((W + upper - lower) / stride) = OW).

Parameter space (`space`): NWG in {1, 2, 3} consumer warpgroups of MI in {1, 2} m64 blocks (not both
2: that epilogue spills under ptxas; three unsplit with A = tma alone, [Note: three warpgroups] in
codegen/gemm_wgmma.py), BN in
{64, 128, 256} and the fill width ([Note: widths that fill the SMs] in codegen/gemm_wgmma.py; not with halo)
(at most MAX_ACC accumulators per thread), STAGES 3 to 6 while the ring fits,
persistent CTAS = min(tiles·SPLITK, SMs), A in {gather, tma, halo} (halo: stride-1 convolutions,
[Note: halo tiles], its PITCH / OHP / TILE_BYTES recorded with it; the B ring then holds the
filter's k-blocks alone and two image-tile slots follow it), SPLITK where the output tiles leave
SMs idle (the GEMM engine's rule, `split_ks`; not with halo), through scratch (CL = 0) or as one
thread block cluster (CL = 1, [Note: k-splits as a cluster] in codegen/gemm_wgmma.py); PP (ping-pong: two warpgroups
take whole tiles in turn); OUT, the epilogue: from registers a pair of channels a store (OUT =
0), or staged (OUT = the stored element's bytes) where the output is the row-major [M, N] matrix
(`row_major_out`: NHWC inside the graph; not under halo, whose rows are slots); STREAM
(stream-k, the GEMM engine's: gemm_wgmma.py; not with halo; only under --pin STREAM=1).

Staged epilogue (OUT): each consumer warpgroup writes its values (bias, BatchNorm, activation,
residual) into its own shared-memory region, rows padded by 16 bytes, then copies them out in
16-byte chunks, whole 32-byte sectors of each output row: the template's and the GEMM engine's
`staged` path (`staged_parts` gives the lines, the copy-out offset is gm·N + gn). From registers
a quad of threads writes half a sector per row and store. Measured on ResNet-50 B32 (H200,
benchmarks/results/profile_resnet50_b32_session16_h200.txt, each kernel alone): the stem 91.9 ->
61.7 us, stage 1's 3x3 24.9 -> 20.8, stage 2's 18.9 -> 14.9, stage 3's 16.7 -> 13.9, the strided
1x1 projections 30.1 -> 20.8 and 19.0 -> 13.7; the plan 1170 -> 1076 us.

Split-k (SPLITK > 1): the late layers' convolutions have few output tiles and long K (ResNet-50
B32's 14x14 3x3: 98 tiles of 128x128 over 36 k-blocks on 132 SMs; its 7x7 ones 52-104 tiles over
72): a work unit is (tile, k-split) as in the GEMM engine, whose template publishes each split's
fp32 partial tile and lets the last to take the tile's ticket add them in split order and run
the epilogue (`codegen/scratch.py` gives the buffers). The producer walks the same units (gather
or im2col, its k-block index is the split's), so nothing else changes. Measured (H200, benchmarks/results/
conv_split_ab_session11_h200.txt, each kernel alone): on those convolutions split-k never paid.
14x14x256: 18.8 us unsplit against 36.0 / 60.3 / 58.1 at 2 / 3 / 4 splits; 7x7x512: 23.1 against
24.8 / 41.3 / 38.1. The cost terms predicted each split slower too (so the planner keeps SPLITK =
1 there), though 1.17-1.44x under what the splits measured. As a cluster (CL = 1, [Note: k-splits as a
cluster] in codegen/gemm_wgmma.py) a split costs less: ResNet-50 B1's 3x3 convolutions from stage 2 on
run split that way by cost (14x14x256 5.7-5.8 us as 4 splits against 7.0 as 6 through scratch, 28x28x128
5.2 against 5.6 unsplit), stage 1's stay unsplit (3.7 us against 4.2-4.3 as 2 splits).
Cost terms: `planner/cost_conv_wgmma.py`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from aicfc.codegen import gemm_wgmma, pdl
from aicfc.codegen.cexpr import c_affine, flat_offset, guard_condition
from aicfc.codegen.common import decompose, element_offset, render
from aicfc.codegen.gemm_wgmma import KSTEP, MAX_ACC, ROW_BYTES, Operand, bk
from aicfc.codegen.tma import IM2COL_CORNER, IM2COL_MAX_STRIDE, Im2col, TensorMap
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.properties import implicit_gemm
from aicfc.ir.types import ITEMSIZE, TensorType

TARGET = gemm_wgmma.TARGET
SPACE = {"NWG": (1, 2, 3), "MI": (1, 2), "BN": (64, 128, 256), "STAGES": (3, 4, 5, 6), "A": ("gather", "tma", "halo"),
         "SPLITK": (1, 2, 3, 4, 6)}
RUN = 16                                  # bytes per gathered run
NARROW = 16                               # bytes of a pixel's channels an im2col copy may read as core-matrix rows
PRODUCER_REGS, CONSUMER_REGS = 56, 224    # setmaxnreg with NWG = 2: 128·56 + 256·224 <= 65536
GATHERERS = 128                           # the producer warpgroup's threads


def gather_lag(stages: int) -> int:
    """How many k-blocks late a gatherer publishes a stage (`cp.async.wait_group` of the template's
    `gather_producer`): it has gather_lag + 1 groups of copies in flight."""
    assert stages >= 3, stages
    return stages - 2


def k_order(k: Kernel, types: Mapping[str, TensorType]) -> tuple[str, ...] | str:
    """The reduction variables outer to inner with the image's channel innermost, or why the
    image is not contiguous along a channel run."""
    op = k.ops[0]
    g = implicit_gemm(op)
    if g is None:
        return "not an implicit GEMM"
    ta = types[g.a.buffer]
    off = flat_offset(g.a.index, ta)
    inner = [r for r in op.reduce_vars if off.coeff(r) == 1]
    if len(inner) != 1:
        return "the image is not channels-last (no reduction variable is contiguous in it)"
    c = inner[0]
    esize = ITEMSIZE[ta.dtype]
    run = RUN // esize
    ext = op.extents()
    if ext[c] % run:
        return (f"the image's contiguous reduction axis has {ext[c]} elements, no whole {RUN}-byte runs "
                "(the image is not channels-last, or its channels are not a multiple of 8)")
    if any(coef % run for v, coef in off.terms if v != c) or off.const % run:
        return f"an image run does not start {RUN}-byte aligned"
    dim = next(d for d, a in enumerate(g.a.index) if a.coeff(c))
    if g.a.fill is not None and dim in g.a.guarded_dims:
        return "the padding guard depends on the channel"
    return tuple(r for r in op.reduce_vars if r != c) + (c,)


@dataclasses.dataclass(frozen=True)
class Im2colGeometry:
    """A 2-D convolution over a channels-last image [N, H, W, C] the TMA can read in im2col mode
    ([Note: TMA im2col record] in codegen/tma.py): the image's loop variables and its geometry."""
    n: str | None                    # the batch variable (None: the image has one)
    oh: str | None
    ow: str | None
    kh: str | None
    kw: str | None
    c: str
    image: tuple[int, int, int, int]     # N, H, W, C
    out: tuple[int, int]                 # OH, OW
    stride: tuple[int, int]              # h, w
    dilation: tuple[int, int]
    pad: tuple[int, int]                 # top, left (the index's constant, negated)
    taps: tuple[int, int]                # KH, KW
    esize: int                           # the image's bytes per element

    @property
    def narrow(self) -> bool:
        """A pixel's channels are one 16-byte run (the 8-channel stem): a k-block is 64 / C taps."""
        return self.image[3] * self.esize == NARROW

    def lower(self) -> tuple[int, int]:
        return (-self.pad[1], -self.pad[0])

    def upper(self) -> tuple[int, int]:
        """The corner making the walk along w (h) take OW (OH) positions: W + upper - lower =
        (OW - 1)·stride + 1."""
        (_, h, w, _), (oh, ow) = self.image, self.out
        return ((ow - 1) * self.stride[1] + 1 - w - self.pad[1], (oh - 1) * self.stride[0] + 1 - h - self.pad[0])


def _spatial(ix, domain: set, reduce: set, ext: Mapping[str, int]) -> tuple | str:
    """(output var, its stride, filter var, its dilation, pad) of one spatial index, or why not."""
    outs = [(v, c) for v, c in ix.terms if v in domain and ext[v] > 1]
    taps = [(v, c) for v, c in ix.terms if v in reduce and ext[v] > 1]
    if len(outs) > 1 or len(taps) > 1 or len(outs) + len(taps) != len([t for t in ix.terms if ext[t[0]] > 1]):
        return "a spatial index is not output·stride + tap·dilation - pad"
    (o, s), (t, d) = (outs or [(None, 1)])[0], (taps or [(None, 1)])[0]
    if s < 1 or d < 1:
        return "a spatial index has a negative stride or dilation"
    return o, s, t, d, -ix.const


def im2col_geometry(k: Kernel, types: Mapping[str, TensorType]) -> Im2colGeometry | str:
    """The convolution's geometry where the TMA's im2col mode reads its image tile by tile (one
    k-block = one filter tap x 64 channels), or why it cannot."""
    op = k.ops[0]
    g = implicit_gemm(op)
    if g is None:
        return "not an implicit GEMM"
    ta = types[g.a.buffer]
    order = k_order(k, types)
    if isinstance(order, str):
        return order
    if len(ta.shape) != 4 or len(g.a.index) != 4:
        return f"the image has rank {len(ta.shape)}; the im2col load reads 2-D convolutions (rank 4)"
    ext = op.extents()
    domain, reduce = set(op.domain_vars), set(op.reduce_vars)
    c = order[-1]
    per_block = ROW_BYTES // ITEMSIZE[ta.dtype]
    if ext[c] % per_block and ext[c] * ITEMSIZE[ta.dtype] != NARROW:
        return (f"{ext[c]} channels are neither whole k-blocks of {per_block} nor one {NARROW}-byte run a pixel "
                "(an im2col copy reads one filter tap of whole 128-byte rows, or 16-byte rows into core matrices)")
    ixn, ixh, ixw, ixc = g.a.index
    if ixc.terms != ((c, 1),) or ixc.const:
        return "the channel index is not the channel variable"
    live_n = [(v, co) for v, co in ixn.terms if ext[v] > 1]
    if ixn.const or len(live_n) > 1 or (live_n and (live_n[0][1] != 1 or live_n[0][0] not in domain)):
        return "the batch index is not a batch variable"
    nv = live_n[0][0] if live_n else None
    hh, ww = _spatial(ixh, domain, reduce, ext), _spatial(ixw, domain, reduce, ext)
    for part in (hh, ww):
        if isinstance(part, str):
            return part
    (oh, sh, kh, dh, ph), (ow, sw, kw, dw, pw) = hh, ww
    if g.a.fill is not None and (g.a.fill != 0.0 or g.a.guard or not set(g.a.guarded_dims) <= {1, 2}):
        return "the image's padding is not zeros outside its bounds"
    if tuple(v for v in (nv, oh, ow) if v) != tuple(g.m):
        return "the GEMM rows are not the output pixels (n, oh, ow) in order"
    if tuple(v for v in order[:-1] if ext[v] > 1) != tuple(v for v in (kh, kw) if v):
        return "the filter taps are not ordered (kh, kw) outside the channel"
    geo = Im2colGeometry(nv, oh, ow, kh, kw, c, tuple(ta.shape), (ext[oh] if oh else 1, ext[ow] if ow else 1),
                         (sh, sw), (dh, dw), (ph, pw), (ext[kh] if kh else 1, ext[kw] if kw else 1),
                         ITEMSIZE[ta.dtype])
    lim = IM2COL_CORNER[4]
    if any(not -lim <= v < lim for v in geo.lower() + geo.upper()):
        return f"the pixel box's corners {geo.lower()}, {geo.upper()} exceed the TMA's [{-lim}, {lim - 1}]"
    if max(sh, sw) > IM2COL_MAX_STRIDE:
        return f"stride {max(sh, sw)} exceeds the TMA's {IM2COL_MAX_STRIDE}"
    if max((ext[kh] - 1) * dh if kh else 0, (ext[kw] - 1) * dw if kw else 0) >= 2**16:
        return "the filter's extent exceeds the im2col offsets' 16 bits"
    return geo


@dataclasses.dataclass(frozen=True)
class Halo:
    """A = halo: an output tile is R whole output rows of one image (slots of PITCH columns, those
    past OW computed and not stored), and its A operand for every tap is one image tile in shared
    memory, shifted ([Note: halo tiles])."""
    geo: Im2colGeometry
    pitch: int          # slots a row: a power of two >= OW + (KW - 1)·dw
    rows: int           # R = BM / PITCH output rows a tile
    tile_rows: int      # RH = R + (KH - 1)·dh image rows a tile reads
    oh_pad: int         # OH rounded up to whole tiles of R rows

    @property
    def tile_bytes(self) -> int:
        """Bytes of the tile's slot: RH·PITCH swizzled 128-byte rows, plus the last taps' reach past
        them (read only for slots that are not stored), whole 1024-byte swizzle atoms."""
        slots = self.tile_rows * self.pitch + (self.geo.taps[1] - 1) * self.geo.dilation[1]
        return -(-slots * ROW_BYTES // 1024) * 1024

    @property
    def loaded(self) -> int:
        """Bytes one copy lands (what the tile's full barrier expects)."""
        return self.tile_rows * self.pitch * ROW_BYTES

    @property
    def channel_blocks(self) -> int:
        """Image tiles an output tile loads: one per 64 channels."""
        return self.geo.image[3] // 64


def halo_geometry(k: Kernel, types: Mapping[str, TensorType], bm: int) -> Halo | str:
    """The image-tile geometry of a stride-1 convolution for BM-row tiles, or why there is none.

    [Note: halo tiles] Under im2col every tap re-reads the image: a 3x3 convolution brings each
    pixel into shared memory 9 times (ResNet-50 B32's 56x56x64 ones: 115 MB of A through L2 for
    13 MB of image, 31% of the tensor-core roofline). With stride 1 the taps' rows are shifts of
    each other: output slot m = (r, c) of a tile reads image row r + kh·dh, column c + kw·dw. So a
    tile stores its image rows once, RH = R + (KH - 1)·dh rows of PITCH columns from column -pw
    (the TMA's tiled mode, zeros outside the image), one 128-byte row of 64 channels a slot in the
    128-byte swizzle: the layout the GEMM's K-major tiles have. Tap (kh, kw) is the same descriptor
    moved kh·dh·PITCH + kw·dw rows: the swizzle is a function of the row's address (bits 7-9), which
    the TMA wrote by and wgmma reads by, so a start on any row of a 1024-byte atom reads what was
    written (base offset 0: the pattern itself starts on the atom). A first version kept 8-channel
    chunks unswizzled (16-byte core matrices may start at any slot) and loaded them as 8 copies of
    16-byte rows a slot: the TMA moved about 270 of those rows a microsecond per SM, and the
    convolutions ran 1.3-1.7x slower than under im2col (benchmarks/results/conv_halo_ab_session11_h200.txt).
    This version, in ResNet-50 B32 on the H200: the 28x28 and 14x14 3x3 convolutions as fast as under
    im2col (20.2 / 16.6 us against 20.3 / 16.7), the 56x56 ones slower (31.5 against 24.6; the cost
    terms' HALO_A_SMEM); so far the saved L2 traffic has bought no time. Under im2col the 56x56 ones run at
    the TMA's own rate: a 16 KB box of image rows takes 0.30-0.40 us an SM on an H200 in any mode (im2col or
    tiled, 3 to 12 stages, 33 to 132 CTAs; benchmarks/prototypes/tma_taps.cu, session 30): their 54 k-blocks
    an SM take 19.9-23.4 us with no arithmetic at all (the kernels run 20.2-20.7), where their tensor-core bar
    is 15.0 us. So they reach it
    only through fewer rows through the TMA, i.e. image tiles whose shifted reads cost the tensor cores
    nothing (A from registers through ldmatrix, which takes any row; not built).
    Slots past OW (PITCH is a
    power of two, so a tile of BM rows is BM / PITCH whole rows) and rows past OH are computed
    and not stored: the price, paid in tensor-core time, is OW·OH / (PITCH·OHP) of the tile used."""
    geo = im2col_geometry(k, types)
    if isinstance(geo, str):
        return geo
    if geo.narrow:
        return "8 channels a pixel: the narrow im2col load, not an image tile"
    if geo.stride != (1, 1):
        return f"stride {geo.stride}: the taps' rows are not shifts of one image tile"
    kh, kw = geo.taps
    if kh * kw == 1:
        return "one tap: each pixel is read once already"
    (oh, ow), (dh, dw) = geo.out, geo.dilation
    pitch = max(8, 1 << (ow + (kw - 1) * dw - 1).bit_length())
    if pitch > bm:
        return f"a row of {pitch} slots exceeds the tile's {bm} rows"
    rows = bm // pitch
    h = Halo(geo, pitch, rows, rows + (kh - 1) * dh, -(-oh // rows) * rows)
    if max(pitch, h.tile_rows) > 256:
        return f"the image tile's box [{pitch}, {h.tile_rows}] exceeds the TMA's 256"
    return h


def halo_of(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> Halo:
    h = halo_geometry(k, types, p["BM"])
    assert not isinstance(h, str) and (h.pitch, h.oh_pad) == (p["PITCH"], p["OHP"]), (h, p)
    return h


def halo_map(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> TensorMap:
    """The image's tiled map: 64 channels x PITCH columns x RH rows of one image a copy, 128-byte swizzle."""
    h = halo_of(k, p, types)
    g = implicit_gemm(k.ops[0])
    (n, hh, w, c), e = h.geo.image, ITEMSIZE[types[g.a.buffer].dtype]
    return TensorMap(g.a.buffer, p["dtype"], 0, (c, w, hh, n), (c * e, w * c * e, hh * w * c * e),
                     (ROW_BYTES // e, h.pitch, h.tile_rows, 1), ROW_BYTES)


def halo_lines(k: Kernel, p: Mapping, types: Mapping[str, TensorType], lines: list[str], idx: str) -> list[str]:
    """An epilogue's `lines` for GEMM row `gm` of slot space: stored only for a slot inside the
    output, with gm the output pixel's flat index there."""
    h = halo_of(k, p, types)
    (oh, ow), pitch, ohp = h.geo.out, h.pitch, h.oh_pad
    return [f"const {idx} hq = gm / {pitch}, hw = gm % {pitch}, ho = hq % {ohp}, hb = hq / {ohp};",
            f"if (hw < {ow} && ho < {oh}) {{", f"const {idx} hgm = (hb * {oh} + ho) * {ow} + hw;", "{",
            f"const {idx} gm = hgm;", *lines, "}", "}"]


def _filter(k: Kernel, types: Mapping[str, TensorType], order: tuple[str, ...], bn: int, dtype: str) -> Operand | str:
    """The filter as the K-major [N, K] TMA operand, or why it is not one."""
    op = k.ops[0]
    g = implicit_gemm(op)
    tb = types[g.b.buffer]
    off = flat_offset(g.b.index, tb)
    ext = op.extents()
    step = 1
    for r in reversed(order):
        if ext[r] > 1 and off.coeff(r) != step:
            return "the filter is not K-major in (kh, kw, c) order"
        step *= ext[r]
    kk = step
    if len(g.n) != 1 or off.coeff(g.n[0]) != kk:
        return "the filter's rows are not one output channel apart"
    if any(v not in order and v != g.n[0] for v, _ in off.terms):
        return "the filter depends on a batch variable"
    esize = ITEMSIZE[tb.dtype]
    o = Operand("b", g.n[0], bn, True, (("r0", kk, 1), (g.n[0], ext[g.n[0]], kk)), off.const, esize, bk(dtype),
                KSTEP[dtype])
    why = o.tensor_map("x", dtype).problems()
    return f"filter: {why}" if why else o


def dtype_of(k: Kernel, plan: Plan) -> str | None:
    g = implicit_gemm(k.ops[0])
    types = plan.types()
    dts = {types[g.a.buffer].dtype, types[g.b.buffer].dtype}
    return next((d for d in ("f16", "bf16") if dts == {d} and plan.precision == {"f16": "fp16", "bf16": "bf16"}[d]),
                None)


def why_not(k: Kernel, plan: Plan) -> str | None:
    """Why the Hopper engine cannot run this convolution (None when it can)."""
    if plan.target != TARGET:
        return f"wgmma and TMA are sm_90a features; the target is {plan.target}"
    if implicit_gemm(k.ops[0]) is None:
        return "not an implicit GEMM"
    dtype = dtype_of(k, plan)
    if dtype is None:
        return f"--precision {plan.precision}: the wgmma implicit GEMM runs fp16/bf16 operands only"
    order = k_order(k, plan.types())
    if isinstance(order, str):
        return order
    b = _filter(k, plan.types(), order, 64, dtype)
    return b if isinstance(b, str) else None


def dims(k: Kernel) -> tuple[int, int, int]:
    from aicfc.codegen.conv import dims as conv_dims
    _, m, n, kk, _ = conv_dims(k)
    return m, n, kk


def block_m(p: Mapping) -> int:
    return 64 * p["MI"] * p["NWG"]


def stage_bytes(p: Mapping) -> int:
    """A ring stage: A's and B's k-blocks, or B's alone where A is an image tile of its own (A = halo)."""
    return (0 if p.get("A") == "halo" else p["BM"]) * ROW_BYTES + p["BN"] * ROW_BYTES


def smem_bytes(p: Mapping) -> int:
    return (p["STAGES"] * stage_bytes(p) + 2 * p.get("TILE_BYTES", 0) + p["NWG"] * gemm_wgmma.out_wg_bytes(p)
            + gemm_wgmma.SMEM_SLACK)


def static_smem(p: Mapping) -> int:
    return 16 * p["STAGES"] + (32 if p.get("A") == "halo" else 0)


def threads(p: Mapping) -> int:
    return 128 * (p["NWG"] + 1)


def tiles(k: Kernel, p: Mapping) -> tuple[int, int, int]:
    m, n, _ = dims(k)
    if p.get("A") == "halo":
        m = virtual_m(k, p)
    tm, tn = math.ceil(m / p["BM"]), math.ceil(n / p["BN"])
    return tm, tn, tm * tn


def virtual_m(k: Kernel, p: Mapping) -> int:
    """A = halo: the GEMM rows are slots (image, output row padded to OHP, column padded to PITCH)."""
    g = implicit_gemm(k.ops[0])
    ext = k.ops[0].extents()
    m = math.prod(ext[v] for v in g.m)
    oh, ow = ext[g.m[-2]], ext[g.m[-1]]
    return m // (oh * ow) * p["OHP"] * p["PITCH"]


def space(k: Kernel, plan: Plan, hw_sms: int, smem_limit: int) -> list[dict]:
    if why_not(k, plan):
        return []
    dtype = dtype_of(k, plan)
    types = plan.types()
    _, n, kk = dims(k)
    # A by the TMA's im2col mode where it can read the image, else gathered by the producer warpgroup
    loads = ("gather", "tma") if not isinstance(im2col_geometry(k, types), str) else ("gather",)
    # the epilogue from registers (OUT = 0) or staged in shared memory and copied out in 16-byte chunks (OUT = the
    # stored element's bytes) where the output is the row-major [M, N] matrix; not under halo tiles (slot rows)
    outs = (0, ITEMSIZE[types[k.ops[-1].out].dtype]) if row_major_out(k, types) else (0,)

    def staged(p: dict, variants: list[dict]) -> list[dict]:
        """`p` with every STAGES and variant whose ring fits the shared memory."""
        return [q for st in SPACE["STAGES"] for v in variants
                if smem_bytes(q := dict(p, STAGES=st, **v)) + static_smem(q) <= smem_limit]
    halos, points, fill = [], [], []
    m = dims(k)[0]
    for nwg, pp in ((n_, pp_) for n_ in SPACE["NWG"] for pp_ in (0, 1) if n_ > 1 or not pp_):
        for mi in SPACE["MI"]:
            bm = 64 * mi * (1 if pp else nwg)
            # [Note: widths that fill the SMs] (gemm_wgmma.py): the filter is K-major, so the width that puts
            # the rows of tiles in one wave too, offered after every standard one (not as image tiles)
            fills = gemm_wgmma.fill_widths(math.ceil(m / bm), n, hw_sms)
            for bn in SPACE["BN"] + fills:
                out = points if bn in SPACE["BN"] else fill
                # two warpgroups of two m64 blocks: the register epilogue's index splitting spills past
                # the 168 registers a thread of 384 may have (ptxas, CUDA 13); under ping-pong (PP) each
                # warpgroup holds a whole tile of MI m64 blocks, as one warpgroup does
                if mi * bn // 2 > MAX_ACC or (bn > 64 and bn // 2 >= n) or (nwg == 2 and mi == 2 and not pp) \
                        or not gemm_wgmma.tile_ok(nwg, pp, mi, bn):
                    continue
                p = {"unit": "wgmma", "dtype": dtype, "BM": bm, "BN": bn, "BK": bk(dtype),
                     "NWG": nwg, "MI": mi, "PP": pp}
                # [Note: three warpgroups] (gemm_wgmma.py): 192-row tiles unsplit, with A by the TMA alone
                three = gemm_wgmma.plain_only(nwg)
                h = halo_geometry(k, types, p["BM"])
                if not isinstance(h, str) and not pp and not three and out is points:   # (the halo loops do not take turns)
                    q = dict(p, A="halo", PITCH=h.pitch, OHP=h.oh_pad, TILE_BYTES=h.tile_bytes, SPLITK=1)
                    halos += staged(dict(q, CTAS=min(tiles(k, q)[2], hw_sms)), [{}])
                nt, ktiles = tiles(k, p)[2], math.ceil(kk / p["BK"])
                these = [a for a in loads if a == "tma"] if three else loads
                for sk in [1] if three else split_ks(nt, ktiles, hw_sms):
                    out += [q for c in staged(dict(p, SPLITK=sk, CTAS=min(nt * sk, hw_sms), STREAM=0),
                                              [{"A": a, "OUT": o} for a in these for o in outs])
                            for q in gemm_wgmma.with_cl(c, nt, hw_sms)]
                if not three and gemm_wgmma.stream_ok(nt, ktiles, hw_sms):   # stream-k: an even share of all k-blocks a block
                    out += staged(dict(p, SPLITK=1, CTAS=hw_sms, STREAM=1), [{"A": a, "OUT": o} for a in loads for o in outs])
    return halos + points + fill


def split_ks(tiles: int, ktiles: int, hw_sms: int) -> list[int]:
    """The k-splits offered: 1, and where the tiles leave SMs idle those that fill at most two
    waves and leave every split at least two k-blocks (gemm_wgmma.space's rule)."""
    out = [1]
    for sk in SPACE["SPLITK"][1:]:
        per = math.ceil(ktiles / sk)
        if tiles < hw_sms and tiles * sk <= 2 * hw_sms and per >= 2 and (sk - 1) * per < ktiles:
            out.append(sk)
    return out


def tensor_maps(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> list[TensorMap]:
    order = k_order(k, types)
    assert not isinstance(order, str), order
    b = _filter(k, types, order, p["BN"], p["dtype"])
    assert not isinstance(b, str), b
    maps = [b.tensor_map(implicit_gemm(k.ops[0]).b.buffer, p["dtype"])]
    if p.get("A") == "tma":
        maps.insert(0, image_map(k, p, types))
    elif p.get("A") == "halo":
        maps.insert(0, halo_map(k, p, types))
    return maps


def image_map(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> TensorMap:
    """The image's im2col tensor map: BM pixels of one k-block's 64 channels a copy."""
    geo = im2col_geometry(k, types)
    assert not isinstance(geo, str), geo
    g = implicit_gemm(k.ops[0])
    t = types[g.a.buffer]
    (n, h, w, c), e = geo.image, ITEMSIZE[t.dtype]
    return TensorMap(g.a.buffer, p["dtype"], 0, (c, w, h, n), (c * e, w * c * e, h * w * c * e),
                     (c if geo.narrow else ROW_BYTES // e, p["BM"], 1, 1), 0 if geo.narrow else ROW_BYTES,
                     Im2col(geo.lower(), geo.upper(), (1, geo.stride[1], geo.stride[0], 1)))


def im2col_lines(k: Kernel, types: Mapping[str, TensorType]) -> dict:
    """The producer's lines for the im2col load: per tile, the first pixel's coordinates (cw, ch,
    cn) from m0; per k-block, the tap's offsets (ow_, oh_) and the channel start (c0) from k0."""
    geo = im2col_geometry(k, types)
    assert not isinstance(geo, str), geo
    ext = k.ops[0].extents()
    n = geo.image[0]
    (oh, ow), (sh, sw), (dh, dw), (ph, pw) = geo.out, geo.stride, geo.dilation, geo.pad
    tile = decompose("m0", [("tn", n), ("toh", oh), ("tow", ow)], "int")
    tile.append(f"const int cw = tow * {sw} - {pw}, ch = toh * {sh} - {ph}, cn = tn;")
    what = f"{geo.image} NHWC image, stride {geo.stride}, dilation {geo.dilation}, pad {geo.pad}"
    if geo.narrow:
        kh, kw = geo.taps
        return {"tile_lines": tile, "what": what, "taps": ROW_BYTES // NARROW, "last_tap": kh * kw - 1,
                "channels": geo.image[3],
                "k_lines": [f"const int tkh = tap / {kw}, tkw = tap % {kw};",
                            f"const unsigned short ow_ = tkw * {dw}, oh_ = tkh * {dh};"]}
    taps = decompose("k0", [("tkh", ext[geo.kh] if geo.kh else 1), ("tkw", ext[geo.kw] if geo.kw else 1),
                            ("c0", geo.image[3])], "int")
    taps.append(f"const unsigned short ow_ = tkw * {dw}, oh_ = tkh * {dh};")
    return {"tile_lines": tile, "k_lines": taps, "what": what, "taps": 0}


@dataclasses.dataclass(frozen=True)
class PlainA:
    """The narrow im2col A tile as wgmma reads it: no swizzle, a k-block's 8 taps each a run of
    BM rows x 16 bytes (8-row core matrices 128 bytes apart along M, the next tap BM·16 bytes on
    along K); a k16 step is two taps."""
    rows: int
    desc = "aicf_wgg_desc_plain"
    sbo = 128

    @property
    def lbo(self) -> int:
        return self.rows * NARROW

    def block_at(self, i: str) -> str:
        return f"({i}) * {64 * NARROW}"

    def kstep(self, kk: str) -> str:
        return f"({kk}) * {2 * self.rows * NARROW}"

    @property
    def describe(self) -> str:
        return f"im2col, {ROW_BYTES // NARROW} taps of {self.rows} x {NARROW} B per stage, no swizzle"


def gather_lines(k: Kernel, types: Mapping[str, TensorType], params: Mapping[str, str], idx: str,
                 order: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(lines splitting the flat k `gk` into reduction variables, once per k-block and run;
    lines splitting the flat m `gm` into pixel variables and setting `src` (the run's first
    element) and `ok` (inside the image, M and K)), for the producer's gather."""
    op = k.ops[0]
    g = implicit_gemm(op)
    ext = op.extents()
    klines = decompose("gk", [(r, ext[r]) for r in order], idx)
    names = {v: v for v in op.domain_vars + op.reduce_vars}
    for v in op.domain_vars:
        if ext[v] == 1:
            names[v] = "0"
    mlines = decompose("gm", [(v, ext[v]) for v in g.m], idx)
    off = c_affine(flat_offset(g.a.index, types[g.a.buffer]), names)
    guard = guard_condition(g.a, types[g.a.buffer], names) if g.a.fill is not None else ""
    mlines.append(f"const bool ok = kin && gm < ({idx}){math.prod(ext[v] for v in g.m)}"
                  f"{f' && ({guard})' if guard else ''};")
    mlines.append(f"const auto* src = {params[g.a.buffer]} + (ok ? ({idx})({off}) : ({idx})0);")
    return klines, mlines


def stored_offset(k: Kernel):
    """The stored element's flat offset in the convolution's variables (the epilogue's last op, its
    variables bound to the convolution's)."""
    from aicfc.ir.lowered import Affine
    last = k.ops[-1]
    bind = dict(k.binds[-1]) if len(k.ops) == 2 else {v: Affine.var(v) for v in last.domain_vars}
    return element_offset(last, bind)


def _pair_values(k: Kernel, types: Mapping[str, TensorType], params: Mapping[str, str], idx: str):
    """(lines splitting `gm` and computing what the two values need, the values of columns gn and
    gn + 1 of row gm, the stored tensor's offset, the names) where the stored tensor is contiguous
    and 2-aligned along the output channel; else None (an NCHW graph output, an odd channel count)."""
    from aicfc.codegen.cexpr import Emitter
    op = k.ops[0]
    g = implicit_gemm(op)
    ext = op.extents()
    if len(g.n) != 1 or ext[g.n[0]] % 2:
        return None
    n = g.n[0]
    last = k.ops[-1]
    off = stored_offset(k)
    if off.coeff(n) != 1 or off.const % 2 or any(x % 2 for v, x in off.terms if v != n):
        return None
    names = {v: ("0" if ext[v] == 1 else v) for v in op.domain_vars}
    lines = decompose("gm", [(v, ext[v]) for v in g.m], idx)
    em = Emitter(params, types, prefix="v")
    if len(k.ops) == 2:
        values = [em.emit(last.body, names | {n: col}, {op.out: acc}) for col, acc in (("gn", "accv"), ("gn1", "accv1"))]
    else:
        values = ["accv", "accv1"]
    return lines + em.take(), values, off, names | {n: "gn"}


def paired_lines(k: Kernel, types: Mapping[str, TensorType], params: Mapping[str, str], idx: str) -> list[str] | None:
    """The epilogue of output columns gn and gn + 1 of row gm (accumulators `accv`, `accv1`)
    ending in one 2-element store, or None where the stored tensor is not contiguous and 2-aligned
    along the output channel (an NCHW graph output) or the channel count is odd."""
    from aicfc.codegen.gemm import PAIR_TYPES
    pv = _pair_values(k, types, params, idx)
    if pv is None:
        return None
    lines, values, off, names = pv
    vec_t, vec = PAIR_TYPES[types[k.ops[-1].out].dtype]
    return lines + [f"*reinterpret_cast<{vec_t}*>({params[k.ops[-1].out]} + ({c_affine(off, names)})) = "
                    f"{vec}({values[0]}, {values[1]});"]


def row_major_out(k: Kernel, types: Mapping[str, TensorType]) -> bool:
    """Whether the stored tensor is the [M, N] matrix row-major (NHWC, output pixel m = (n, oh, ow)
    flattened, channel innermost, nothing else stored), 16-byte chunks of a row aligned: what a staged
    epilogue (OUT) copies out in 16-byte chunks at gm·N + gn."""
    op = k.ops[0]
    g = implicit_gemm(op)
    ext = op.extents()
    last = k.ops[-1]
    if len(g.n) != 1 or len(k.stores) != 1 or k.stores[0] != last.out:
        return False
    off = stored_offset(k)
    n = ext[g.n[0]]
    if n % (16 // ITEMSIZE[last.type.dtype]) or off.const or off.coeff(g.n[0]) != 1:
        return False
    stride, want = n, {g.n[0]: 1}
    for v in reversed(g.m):
        want[v] = stride if ext[v] > 1 else off.coeff(v)
        stride *= ext[v]
    # a variable of extent 1 is always 0: its term in the offset (a batch of one) adds nothing
    return all(off.coeff(v) == c for v, c in want.items()) and {v for v, _ in off.terms if ext[v] > 1} <= set(want)


def staged_parts(k: Kernel, types: Mapping[str, TensorType], params: Mapping[str, str], idx: str):
    """The epilogue as values staged in shared memory and copied out in 16-byte chunks (a
    `gemm.Staged`), or None where the output is not the row-major [M, N] matrix (`row_major_out`)."""
    from aicfc.codegen.common import CTYPES
    from aicfc.codegen.gemm import PAIR_TYPES, Staged
    pv = _pair_values(k, types, params, idx)
    if pv is None or not row_major_out(k, types):
        return None
    lines, values, _, _ = pv
    dt = types[k.ops[-1].out].dtype
    vec_t, vec = PAIR_TYPES[dt]
    _, n, _ = dims(k)
    return Staged(tuple(lines) + (f"const float sv0 = {values[0]};", f"const float sv1 = {values[1]};"),
                  CTYPES[dt], vec_t, vec, params[k.ops[-1].out], f"gm * {n} + gn", ITEMSIZE[dt])


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str, parts: Mapping) -> str:
    dtype = p["dtype"]
    order = k_order(k, types)
    assert not isinstance(order, str), order
    b = _filter(k, types, order, p["BN"], dtype)
    assert not isinstance(b, str), b
    halo = halo_of(k, p, types) if p.get("A") == "halo" else None
    b = dataclasses.replace(b, smem_at=0 if halo else p["BM"] * ROW_BYTES)
    m, n, kk = dims(k)
    esize = ITEMSIZE[dtype]
    tm, tn, total = tiles(k, p)
    sk = p.get("SPLITK", 1)
    tma_a = p.get("A") in ("tma", "halo")
    im2col = im2col_lines(k, types) if p.get("A") == "tma" else None
    paired = paired_lines(k, types, parts["params"], parts["idx"])
    epilogue = parts["epilogue"]
    if halo:
        m = virtual_m(k, p)
        paired = paired and halo_lines(k, p, types, paired, parts["idx"])
        epilogue = halo_lines(k, p, types, epilogue, parts["idx"])
    if im2col and im2col["taps"]:
        a = PlainA(p["BM"])
    else:
        a = Operand("a", None, p["BM"], True, (("r0", kk, 1), ("gm", m, kk)), 0, esize, bk(dtype), KSTEP[dtype])
    if not tma_a:
        klines, mlines = gather_lines(k, types, parts["params"], parts["idx"], order)
    return render("gemm_wgmma.cu.j2", name=name, batch=1, M=m, N=n, K=kk, dtype=dtype, KSTEP=KSTEP[dtype],
                  BM=p["BM"], BN=p["BN"], BK=p["BK"], NWG=p["NWG"], MI=p["MI"], PP=p.get("PP", 0),
                  CT=128 if p.get("PP") else 128 * p["NWG"],
                  OUT_WG_BYTES=gemm_wgmma.out_wg_bytes(p), LDS=gemm_wgmma.staging_row(p), STAGES=p["STAGES"], CTAS=p["CTAS"], TILES=total, TILES_M=tm,
                  TILES_N=tn, GROUP=gemm_wgmma.GROUP, BRES=0, RES_AT=0, B_BYTES=0, JOIN=None, KT=math.ceil(kk / p["BK"]), STAGE_BYTES=stage_bytes(p),
                  threads=threads(p), TA=0, TB=0, a=a, b=b, idx=parts["idx"], signature=parts["signature"],
                  decompose=parts["decompose"], epilogue=epilogue, paired=paired, SPLITK=sk,
                  staged=staged_parts(k, types, parts["params"], parts["idx"]) if p.get("OUT") else None,
                  KT_PER=gemm_wgmma.kt_per(p, kk), partials=parts["params"].get(f"{k.name}.partials"),
                  tickets=parts["params"].get(f"{k.name}.tickets"), ROT_D=None,
                  PRODUCER_REGS=PRODUCER_REGS,
                  CONSUMER_REGS=gemm_wgmma.consumer_regs(p["NWG"], PRODUCER_REGS, CONSUMER_REGS), CLUSTER=1, CL=p.get("CL", 0), TS=None, MAPS=p.get("MAPS"), PDL_MARK=pdl.MARK, prefetch=(), copy_in=None, a_more=[], a_im2col=False,
                  STREAM=p.get("STREAM", 0),
                  MAXPARTS=gemm_wgmma.stream_parts(total, math.ceil(kk / p["BK"]), p["CTAS"]) if p.get("STREAM") else 0,
                  im2col=im2col, halo=halo and dict(
                      PITCH=halo.pitch, OHP=halo.oh_pad, RH=halo.tile_rows, A_BYTES=halo.tile_bytes,
                      LOADED=halo.loaded, CB=halo.channel_blocks, C=halo.geo.image[3], T=halo.geo.taps[0] * halo.geo.taps[1],
                      KW=halo.geo.taps[1], DW=halo.geo.dilation[1], ROW_SHIFT=halo.geo.dilation[0] * halo.pitch,
                      PH=halo.geo.pad[0], PW=halo.geo.pad[1],
                      what=f"{halo.geo.image} NHWC image, {halo.rows} output rows of {halo.pitch} slots a tile"),
                  gather=None if tma_a else dict(
                      arrivals=GATHERERS + 1, k_lines=klines, m_lines=mlines, rows=p["BM"] // 16, esize=esize,
                      lag=gather_lag(p["STAGES"]), B_BYTES=p["BN"] * ROW_BYTES,
                      what=f"k = ({', '.join(order)}) flattened"))
