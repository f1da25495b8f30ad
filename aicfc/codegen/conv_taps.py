"""Unit `taps` of the `conv` family (sm_90a): a 3x3, stride-1, pad-1 convolution of 64 channels to 64
whose image is read once a tile, each tap's rows taken from shared memory into registers
(`templates/conv_taps.cu.j2`; cost terms in `planner/cost_conv_taps.py`).

[Note: taps in registers]
Under im2col (conv_wgmma.py, A = tma) every output pixel pulls 9 rows of 128 bytes through the TMA, and an
SM's TMA moves a 16 KB box of such rows in 0.30-0.40 us whatever the mode (im2col or tiled boxes), the ring's
depth or the grid (benchmarks/prototypes/tma_taps.cu, session 30): ResNet-50 B32's stage-1 3x3 convolutions
need 19.9-23.4 us for their loads alone and run 20.2-20.7, where their tensor-core bar is 15.0. The
image-tile mode (A = halo) loads each row once but shifts wgmma's shared-memory descriptor by the tap, which
costs the tensor cores (HALO_A_SMEM). Here:
- an output tile is 8x8 pixels of one image (m64); its 10x10 image pixels land by one TMA box (64 channels,
  128-byte swizzle, zeros outside the image) into a ring of SLOTS slots: 100 rows a tile instead of 576;
- for tap (kh, kw), pixel (y, x) of the tile reads slot row (y + kh)·10 + x + kw: ldmatrix takes any row,
  so each lane names its row and undoes the swizzle itself (chunk c of row R at (c ^ R % 8)·16), and the
  fragments go to wgmma m64n64k16 with A from registers; each tap is waited for before the next one's rows
  load (more taps in flight measured no faster, fewer registers);
- the filter (64 x 576) stays in shared memory for the whole run, nine 64 x 64 boxes;
- NCONS consumer warpgroups, warpgroup i taking the block's tiles i, i + NCONS, ... (three: with two, the
  tensor cores idled while both ran their epilogues; making two take turns was slower still), with setmaxnreg
  giving the producer's registers to them. A tap waited for is mostly latency: on an H200 one warpgroup's
  m64n64k64 with A from ldmatrix took 0.146 us, twice the tensor pipe's 0.073, and three warpgroups' kept 77%
  of the peak (session 39, benchmarks/prototypes/rs_chain.cu, [Note: bands of pixels] in codegen/conv_band.py).
  Four (640 threads, eight slots, 112 registers a consumer thread) measured the same in session 41 (an H200,
  ResNet-50 B32, each kernel alone; benchmarks/results/l2_total_session41_h200.txt): the three stage-1 3x3s
  14.30 / 14.77 / 13.99 us against 14.58 / 14.52 / 14.19, the plan 806.0 us both. So three stay. (setmaxnreg
  moves registers only within the block: four consumer warpgroups at 120 registers asked for more than the
  producer gave up and hung at their .inc);
- the epilogue (the kernel's ops on each pair of channels, `conv_wgmma.staged_parts`) writes its values into
  the warpgroup's staging in the output map's 128-byte swizzle, and one thread hands the 8x8-pixel box to the
  TMA; the staging is reused once that store has read it.
Measured as a prototype (benchmarks/prototypes/conv_halo_rs.cu, results in
benchmarks/results/conv_halo_rs_session30_h200.txt, an H200, one kernel in a CUDA graph): ResNet-50 B32's
stage-1 3x3 with bias and ReLU 15.0 us (49.8% of 989 TFLOP/s) against the im2col kernel's 20.2-20.7. Built
here (benchmarks/results/conv_taps_session30_h200.txt, torchvision ResNet-50 B32, fp16): the three stage-1
3x3 convolutions 14.3-14.8 us each in `aicf-run --profile` (50.6-52.4% of the roofline, predicted 15.0),
the plan 836.3 us against 850.2 without the unit (7 alternating rounds, outputs the same bits); at B1 the
planner keeps im2col (49 tiles).

Requires: NHWC fp16/bf16 image of exactly 64 channels, 64 output channels, a 3x3 window at stride 1 with one
pixel of zero padding (output size = input size, both multiples of 8), the filter K-major in (kh, kw, c)
order, the output the row-major [pixels, 64] matrix (`conv_wgmma.row_major_out`). One schedule: CTAS =
min(tiles, SMs).
"""
from __future__ import annotations

from typing import Mapping

from aicfc.codegen import conv_wgmma
from aicfc.codegen.common import render
from aicfc.codegen.tma import TensorMap
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.properties import implicit_gemm
from aicfc.ir.types import ITEMSIZE, TensorType

TILE = 8                 # an output tile is TILE x TILE pixels of one image: one m64 block
HALO = TILE + 2          # its image pixels a side (a 3x3 window)
NCONS = 3                # consumer warpgroups
SLOTS = 6                # image tiles in flight (two a consumer warpgroup)
ROW_BYTES = 128          # a pixel's 64 channels of 16 bits: one swizzled row
HALO_BYTES = HALO * HALO * ROW_BYTES
SLOT_BYTES = -(-HALO_BYTES // 1024) * 1024      # whole 1024-byte swizzle atoms
TAP_A_BYTES = TILE * TILE * ROW_BYTES          # a tap's A: the tile's 64 pixel rows (ldmatrix)
TAP_B_BYTES = 64 * ROW_BYTES                   # a tap's B: the filter's 64 x 64 box (wgmma's descriptor)
FILTER_BYTES = 9 * TAP_B_BYTES                 # nine taps' boxes
STAGE_BYTES = TILE * TILE * ROW_BYTES          # a warpgroup's staging: the output tile's 64 rows
PRODUCER_REGS, CONSUMER_REGS = 24, 160         # setmaxnreg: 128·24 + 3·128·160 <= 65536


def sixty_four(k: Kernel, plan: Plan, unit: str) -> conv_wgmma.Im2colGeometry | str:
    """The geometry of a convolution of 64 channels to 64 over an NHWC image that the Hopper engine reads
    (what the units that hold a pixel's channels in one 128-byte row and the filter's taps in 64 x 64 boxes
    take: this one and `pool`, codegen/conv_pool.py), or why it is not one."""
    why = conv_wgmma.why_not(k, plan)
    if why:
        return why
    geo = conv_wgmma.im2col_geometry(k, plan.types())
    if isinstance(geo, str):
        return geo
    _, n, _ = conv_wgmma.dims(k)
    if geo.image[3] != 64 or n != 64:
        return f"{geo.image[3]} channels to {n}: the {unit} unit runs 64 to 64"
    return geo


def geometry(k: Kernel, plan: Plan) -> conv_wgmma.Im2colGeometry | str:
    """The convolution's geometry where this unit runs it, or why it does not."""
    geo = sixty_four(k, plan, "taps")
    if isinstance(geo, str):
        return geo
    types = plan.types()
    if (geo.taps, geo.stride, geo.dilation, geo.pad) != ((3, 3), (1, 1), (1, 1), (1, 1)):
        return "not a 3x3 window at stride 1 with one pixel of padding"
    if geo.out != geo.image[1:3] or any(d % TILE for d in geo.out):
        return f"output {geo.out[0]}x{geo.out[1]}: not whole {TILE}x{TILE} tiles of the image's size"
    if not conv_wgmma.row_major_out(k, types):   # (then the staged epilogue's pairs exist too: 64 channels, contiguous)
        return "the output is not the row-major [pixels, channels] matrix"
    if types[k.ops[-1].out].dtype != conv_wgmma.dtype_of(k, plan):
        return "the output's type is not the operands'"
    return geo


def why_not(k: Kernel, plan: Plan) -> str | None:
    geo = geometry(k, plan)
    return geo if isinstance(geo, str) else None


def tiles(k: Kernel, types: Mapping[str, TensorType]) -> int:
    geo = conv_wgmma.im2col_geometry(k, types)
    assert not isinstance(geo, str), geo
    return geo.image[0] * (geo.out[0] // TILE) * (geo.out[1] // TILE)


def space(k: Kernel, plan: Plan, hw_sms: int) -> list[dict]:
    if why_not(k, plan):
        return []
    return [{"unit": "taps", "dtype": conv_wgmma.dtype_of(k, plan), "NCONS": NCONS,
             "CTAS": min(tiles(k, plan.types()), hw_sms)}]


def threads(p: Mapping) -> int:
    return 128 * (p["NCONS"] + 1)


def smem_bytes(p: Mapping) -> int:
    return 1024 + FILTER_BYTES + SLOTS * SLOT_BYTES + p["NCONS"] * STAGE_BYTES


def static_smem(p: Mapping) -> int:
    return 8 * (1 + 2 * SLOTS)


def tensor_maps(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> list[TensorMap]:
    """The image's (10x10 pixels of one image a box), the filter's (64 x 64 a tap) and the output's
    (8x8 pixels a box), all in the 128-byte swizzle."""
    geo = conv_wgmma.im2col_geometry(k, types)
    assert not isinstance(geo, str), geo
    return tile_maps(k, types, p["dtype"], (HALO, HALO), k.ops[-1].out, geo.image[1:3], (TILE, TILE))


def image_map(k: Kernel, types: Mapping[str, TensorType], dtype: str, image_box: tuple[int, int]) -> TensorMap:
    """The NHWC image's map with boxes of 64 channels x image_box (w, h) pixels of one image, 128-byte swizzle
    (the units that read image tiles: this one, `pool` and `band`, codegen/conv_band.py)."""
    geo = conv_wgmma.im2col_geometry(k, types)
    assert not isinstance(geo, str), geo
    g = implicit_gemm(k.ops[0])
    (n, h, w, c), e = geo.image, ITEMSIZE[types[g.a.buffer].dtype]
    return TensorMap(g.a.buffer, dtype, 0, (c, w, h, n), (c * e, w * c * e, h * w * c * e), (64, *image_box, 1), 128)


def tile_maps(k: Kernel, types: Mapping[str, TensorType], dtype: str, image_box: tuple[int, int], out: str,
              out_hw: tuple[int, int], out_box: tuple[int, int]) -> list[TensorMap]:
    """The maps of the units that read image tiles and keep the filter resident (this one and `pool`):
    the NHWC image's with boxes of image_box (w, h) pixels of one image, the filter's 64 x 64 boxes (one a tap),
    and the NHWC output `out` of out_hw (h, w) pixels of 64 channels with boxes of out_box (w, h), all in the
    128-byte swizzle."""
    g = implicit_gemm(k.ops[0])
    order = conv_wgmma.k_order(k, types)
    assert not isinstance(order, str), order
    b = conv_wgmma._filter(k, types, order, 64, dtype)
    assert not isinstance(b, str), b
    image = image_map(k, types, dtype, image_box)
    (oh, ow), eo, n = out_hw, ITEMSIZE[types[out].dtype], image.dims[3]
    return [image,
            b.tensor_map(g.b.buffer, dtype),
            TensorMap(out, dtype, 0, (64, ow, oh, n), (64 * eo, ow * 64 * eo, oh * ow * 64 * eo), (64, *out_box, 1), 128)]


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str, parts: Mapping) -> str:
    geo = conv_wgmma.im2col_geometry(k, types)
    assert not isinstance(geo, str), geo
    staged = conv_wgmma.staged_parts(k, types, parts["params"], parts["idx"])
    assert staged is not None, k.name
    n, h, w, _ = geo.image
    return render("conv_taps.cu.j2", name=name, dtype=p["dtype"], N_IMG=n, H=h, W=w, CTAS=p["CTAS"],
                  NCONS=p["NCONS"], SLOTS=SLOTS, SLOT_BYTES=SLOT_BYTES, HALO_BYTES=HALO_BYTES,
                  FILTER_BYTES=FILTER_BYTES, STAGE_BYTES=STAGE_BYTES, TILES=tiles(k, types),
                  TILES_X=w // TILE, TILES_XY=(h // TILE) * (w // TILE), threads=threads(p),
                  PRODUCER_REGS=PRODUCER_REGS, CONSUMER_REGS=CONSUMER_REGS, MAPS=p.get("MAPS"),
                  idx=parts["idx"], signature=parts["signature"], staged=staged)


def tile_flops() -> float:
    return 2.0 * TILE * TILE * 64 * 9 * 64
