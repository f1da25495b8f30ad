"""Unit `band` of the `conv` family (sm_90a): a 3x3, stride-1, pad-1 convolution over channel blocks
whose image rows are read once a block of channels, each tap's rows taken from shared memory into
registers (`templates/conv_band.cu.j2`; cost terms in `planner/cost_conv_band.py`).

[Note: bands of pixels]
Under im2col (conv_wgmma.py, A = tma) a k-block is one tap of 64 channels, and the TMA walks its 64 image
rows of 128 bytes one pixel at a time (IM2COL_PIXELS_PER_US, ~360 rows a microsecond an SM): ResNet-50
B32's 7x7x512 3x3 convolutions take 72 k-blocks a tile, 12.8 us of rows under 8.2 us of products, and ran
at 46-47% of the tensor cores' peak (session 38). The `taps` unit (conv_taps.py, [Note: taps in registers])
reads an 8x8-pixel tile's 10x10 image rows once and takes each tap's rows from them with ldmatrix, but only
at 64 channels to 64. Here the same idea runs over any multiple of 64 channels to N:
- a tile is 64 consecutive output pixels (GEMM rows m0 .. m0 + 63, across image rows and images) by BN
  output channels; per block of 64 input channels (`cb`), the producer thread loads the tile's image rows
  as PIECES boxes of one image each (64 channels x (W + 2) columns x ROWS rows, from column -1 and the row
  above the tile's first: zeros outside the image), each piece at a 1024-byte boundary of a halo slot;
- the tile's nine taps a channel block are k-blocks of 64: B is the filter's box of BN rows at
  k = tap·C + 64·cb (K-major in (kh, kw, c) order); A is the tap's shifted rows, read by ldmatrix, each lane
  naming its pixel's row of the halo slot and undoing the 128-byte swizzle;
- NWG = 3 consumer warpgroups split the taps (warpgroup w: taps w, w + 3, w + 6), each issuing wgmma m64nBNk16
  with A from registers into sums of its own and waiting for each tap; at the tile's end warpgroups 1 and 2
  leave their sums in shared memory and warpgroup 0 adds them in warpgroup order (the same bits every run) and
  runs the epilogue (the kernel's ops on each pair of channels, `conv_wgmma.staged_parts`), its pairs stored
  from registers at gm·N + gn, rows past M not stored;
- each warpgroup has a ring of STAGES filter boxes of its own, and the producer issues a tap's box into the
  ring of the warpgroup that takes it. One ring shared in tap order was wrong: a stage's successive boxes went
  to different warpgroups, so a warpgroup could wait on a box two phases ahead of the stage's barrier, and an
  mbarrier parity wait on a phase not yet begun returns at once. It ran correct once and failed with
  `unspecified launch failure` within 300 back-to-back launches of ResNet-50 B32's plan (28x28 convolutions,
  four stages); with a ring a warpgroup, 300 launches ran clean.
A tile's image rows a channel block: PIECES x ROWS x (W + 2), 243 at 7x7 (three images of 9x9, whichever
the tile's 64 pixels touch) and 256 at 14x14 (two pieces of 8 rows of 16) against im2col's 576.

Why three warpgroups (a prototype on an H200, benchmarks/prototypes/rs_chain.cu, session 39): a warpgroup's
steps of 4 x m64nNk16 with A from ldmatrix take 0.15-0.22 us each at N = 64-128 waited for, 2-3x the tensor
pipe's time, where A from shared memory keeps 95-97% of the peak with one warpgroup. With one group kept in
flight ptxas serializes the wgmma (C7513: the next tap's ldmatrix defines input registers inside the pipeline
stage), so the steps are waited for and the warpgroups overlap each other instead: three reach 77% (N = 64),
91% (104) and 98% (128) of the peak in the prototype.
Measured (ResNet-50 B32, H200, each kernel alone, benchmarks/results/conv_band_session39_h200.txt): slower than
the units the planner takes, on every stride-1 3x3: the 7x7x512 ones 16.7-17.0 us (wgmma 64x104 im2col: 15.9-16.0),
14x14x256 18.0-18.8 (wgmma 128x128: 14.0-14.3), 28x28x128 20.7-21.2 (wgmma 64x128: 14.2-14.7), 56x56x64 23.7-25.2
(taps: 14.2-14.7 in session 38; wgmma 20.1-20.8). Earlier forms were slower still: one consumer warpgroup
17.3-26.3 us, two on a 128-row tile 17.8-25.5. So the unit runs only under `--pin NODE:BAND=1` (plan_schedules.OPT_IN); its cost terms
(planner/cost_conv_band.py) predict those runs within [0.83, 1.05].

Requires: NHWC fp16/bf16 image of C = 64·CB channels, a 3x3 window at stride 1 with one pixel of zero
padding (output size = input size), the filter K-major in (kh, kw, c) order, N a multiple of 8, the output
the row-major [pixels, N] matrix of the operands' type (`conv_wgmma.row_major_out`).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Mapping

from aicfc.codegen import conv_taps, conv_wgmma, gemm_wgmma
from aicfc.codegen.common import render
from aicfc.codegen.tma import TensorMap
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.properties import implicit_gemm
from aicfc.ir.types import TensorType

BM = 64                  # a tile's output pixels: one m64 block
NWG = 3                  # consumer warpgroups, splitting a channel block's nine taps
ROW_BYTES = 128          # a pixel's 64 channels of 16 bits: one swizzled row
HALO_SLOTS = 2           # halo slots in flight (a channel block's rows each)
WIDTHS = (64, 128)       # BN offered, and the fill width (gemm_wgmma.fill_widths) up to MAX_BN
MAX_BN = 192             # a consumer's BN / 2 sums, a tap's A fragments and the rows' addressing in CONSUMER_REGS
STAGES = (2, 3)          # B ring depths offered (a ring a consumer warpgroup)
MAX_SLOT_BYTES = 64 * 1024
PRODUCER_REGS = 40       # setmaxnreg: 128·40 + NWG·128·CONSUMER_REGS <= 65536
CONSUMER_REGS = 152
SMEM_SLACK = 1024        # the dynamic shared memory's alignment to a swizzle atom


@dataclasses.dataclass(frozen=True)
class Band:
    """Where a tile's image rows lie: PIECES boxes of ROWS image rows a tile and channel block."""
    image: tuple[int, int, int, int]     # N, H, W, C
    rows: int                            # image rows a piece's box covers (its first is the row above)
    pieces: int                          # images a tile touches at most

    @property
    def cols(self) -> int:
        return self.image[2] + 2

    @property
    def piece_rows(self) -> int:
        """Slot rows a piece takes: its box's pixel rows, whole 8-row swizzle periods (1024 bytes)."""
        return -(-self.rows * self.cols // 8) * 8

    @property
    def slot_bytes(self) -> int:
        return self.pieces * self.piece_rows * ROW_BYTES

    @property
    def box_bytes(self) -> int:
        return self.rows * self.cols * ROW_BYTES

    @property
    def channel_blocks(self) -> int:
        return self.image[3] // 64

    def tile_rows(self) -> int:
        """The image rows a tile brings in a channel block (every piece's box, zeros included)."""
        return self.pieces * self.rows * self.cols


def pieces_of(m0: int, m: int, h: int, w: int) -> list[tuple[int, int, int]]:
    """The images the output pixels m0 .. min(m0 + 64, m) - 1 touch: (image, first row, last row) each."""
    out = []
    p = m0
    end = min(m0 + BM, m)
    while p < end:
        n, rem = divmod(p, h * w)
        last = min(end, (n + 1) * h * w) - 1
        out.append((n, rem // w, (last - n * h * w) // w))
        p = last + 1
    return out


@functools.lru_cache(maxsize=64)   # a loop over every tile; asked by the space, each candidate's cost and the codegen
def band_of(image: tuple[int, int, int, int]) -> Band:
    """The band geometry of every tile: the most image rows (with the row above and below) a piece needs, and
    the most images a tile touches."""
    n, h, w, _ = image
    m = n * h * w
    rows, pieces = 0, 0
    for m0 in range(0, m, BM):
        ps = pieces_of(m0, m, h, w)
        pieces = max(pieces, len(ps))
        rows = max(rows, *(last - first + 3 for _, first, last in ps))
    return Band(image, rows, pieces)


def geometry(k: Kernel, plan: Plan) -> Band | str:
    """The band geometry where this unit runs the convolution, or why it does not."""
    why = conv_wgmma.why_not(k, plan)
    if why:
        return why
    types = plan.types()
    geo = conv_wgmma.im2col_geometry(k, types)
    if isinstance(geo, str):
        return geo
    if (geo.taps, geo.stride, geo.dilation, geo.pad) != ((3, 3), (1, 1), (1, 1), (1, 1)):
        return "not a 3x3 window at stride 1 with one pixel of padding"
    if geo.out != geo.image[1:3] or not geo.oh or not geo.ow:
        return "the output is not the image's size"
    if geo.image[3] % 64:
        return f"{geo.image[3]} channels: not whole blocks of 64"
    _, n, _ = conv_wgmma.dims(k)
    if n % 8:
        return f"{n} output channels: not a multiple of 8"
    if not conv_wgmma.row_major_out(k, types):
        return "the output is not the row-major [pixels, channels] matrix"
    if types[k.ops[-1].out].dtype != conv_wgmma.dtype_of(k, plan):
        return "the output's type is not the operands'"
    band = band_of(geo.image)
    if band.slot_bytes > MAX_SLOT_BYTES:
        return f"a tile's image rows take {band.slot_bytes} B a channel block, over {MAX_SLOT_BYTES}"
    if band.cols > 256 or band.rows > 256:
        return "a piece's box exceeds the TMA's 256 pixels a side"
    return band


def why_not(k: Kernel, plan: Plan) -> str | None:
    band = geometry(k, plan)
    return band if isinstance(band, str) else None


def tiles(k: Kernel, p: Mapping) -> tuple[int, int, int]:
    m, n, _ = conv_wgmma.dims(k)
    tm, tn = math.ceil(m / BM), math.ceil(n / p["BN"])
    return tm, tn, tm * tn


def part_bytes(p: Mapping) -> int:
    """The sums warpgroups 1 .. NWG - 1 leave for warpgroup 0: BN / 2 fp32 a thread."""
    return (NWG - 1) * 128 * p["BN"] // 2 * 4


def smem_bytes(p: Mapping) -> int:
    """The halo slots (SLOT_BYTES, the band's: recorded with the schedule), the filter's ring and the sums."""
    return SMEM_SLACK + HALO_SLOTS * p["SLOT_BYTES"] + NWG * p["STAGES"] * p["BN"] * ROW_BYTES + part_bytes(p)


def static_smem(p: Mapping) -> int:
    return 8 * 2 * (HALO_SLOTS + NWG * p["STAGES"])


def threads(p: Mapping) -> int:
    return 128 * (NWG + 1)


def space(k: Kernel, plan: Plan, hw_sms: int, smem_limit: int) -> list[dict]:
    band = geometry(k, plan)
    if isinstance(band, str):
        return []
    dtype = conv_wgmma.dtype_of(k, plan)
    m, n, _ = conv_wgmma.dims(k)
    out = []
    for bn in WIDTHS + gemm_wgmma.fill_widths(math.ceil(m / BM), n, hw_sms):
        if (bn > 64 and bn // 2 >= n) or bn > MAX_BN:      # a tile at least twice as wide as the output
            continue
        for st in STAGES:
            p = {"unit": "band", "BAND": 1, "dtype": dtype, "BN": bn, "STAGES": st, "SLOT_BYTES": band.slot_bytes}
            if smem_bytes(p) + static_smem(p) > smem_limit:
                continue
            out.append(dict(p, CTAS=min(tiles(k, p)[2], hw_sms)))
    return out


def tensor_maps(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> list[TensorMap]:
    """The image's (64 channels x W + 2 columns x ROWS rows of one image a box) and the filter's (64 x BN a
    tap and channel block), both in the 128-byte swizzle."""
    geo = conv_wgmma.im2col_geometry(k, types)
    assert not isinstance(geo, str), geo
    band = band_of(geo.image)
    order = conv_wgmma.k_order(k, types)
    assert not isinstance(order, str), order
    b = conv_wgmma._filter(k, types, order, p["BN"], p["dtype"])
    assert not isinstance(b, str), b
    return [conv_taps.image_map(k, types, p["dtype"], (band.cols, band.rows)),
            b.tensor_map(implicit_gemm(k.ops[0]).b.buffer, p["dtype"])]


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str, parts: Mapping) -> str:
    geo = conv_wgmma.im2col_geometry(k, types)
    assert not isinstance(geo, str), geo
    staged = conv_wgmma.staged_parts(k, types, parts["params"], parts["idx"])
    assert staged is not None, k.name
    m, n, _ = conv_wgmma.dims(k)
    band = band_of(geo.image)
    nimg, h, w, c = geo.image
    tm, _, total = tiles(k, p)
    return render("conv_band.cu.j2", name=name, dtype=p["dtype"], N_IMG=nimg, H=h, W=w, C=c, M=m, N=n, BN=p["BN"],
                  NWG=NWG,
                  STAGES=p["STAGES"], CTAS=p["CTAS"], TILES=total, TILES_M=tm, CB=band.channel_blocks,
                  ROWS=band.rows, COLS=band.cols, PIECES=band.pieces, PIECE_ROWS=band.piece_rows,
                  SLOT_BYTES=band.slot_bytes, BOX_BYTES=band.box_bytes, SLOTS=HALO_SLOTS, B_BYTES=p["BN"] * ROW_BYTES,
                  threads=threads(p), PRODUCER_REGS=PRODUCER_REGS, CONSUMER_REGS=CONSUMER_REGS, MAPS=p.get("MAPS"),
                  idx=parts["idx"], signature=parts["signature"], staged=staged)


