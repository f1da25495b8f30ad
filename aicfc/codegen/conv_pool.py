"""Unit `pool` of the `conv` family (sm_90a): a stride-1 convolution of 64 channels to 64 and the
3x3, stride-2, pad-1 max pool that reads it, as one kernel (`templates/conv_pool.cu.j2`; cost terms
in `planner/cost_conv_pool.py`; the rewrite that forms such a kernel: `passes/pool_epilogue.py`).

[Note: pooled tiles]
ResNet's stem writes 112x112x64 pixels an image and the max pool reads them back to keep a quarter:
at B32 the convolution (51 MB stored) and the pool (51 MB read) took 36 + 21 us of the plan's 836
(session 30's profile). Here the convolution's output never leaves the SM:
- a tile is TPH x TPW pooled pixels of one image; their windows cover the convolution's pixels
  (2·TPH + 1) x (2·TPW + 1) from (2·py0 - 1, 2·px0 - 1): one pixel of overlap with each neighbour
  tile, computed twice (256 rows for 224 pooled-pixel quarters at 8 x 7, 14% more products);
- those pixels' image rows land by one TMA box (64 channels, 128-byte swizzle, zeros outside the
  image) in a ring of SLOTS slots, and every tap's rows go from it to registers by ldmatrix, each
  lane naming its row (as [Note: taps in registers], codegen/conv_taps.py); the region's pixels
  are GEMM rows in blocks of 64 (wgmma m64n64k16, A from registers, the filter resident in shared
  memory, one 64 x 64 box a tap);
- each block's epilogue (the kernel's ops on each pair of channels) writes its values into the
  warpgroup's region tile in shared memory, -inf where the pixel lies outside the convolution's
  output (the pool's padding reads -inf, so every window keeps its own maximum);
- the warpgroup then takes the 3x3 maxima of 16-byte channel runs from that tile into a staging
  in the output map's 128-byte swizzle and one thread hands the TPH x TPW box to the TMA (which
  drops what lies past the pooled image's edge).
NCONS consumer warpgroups take a block's tiles in turn (warpgroup i: i, i + NCONS, ...); one producer
thread loads the filter once and then the tiles' image boxes.

[Note: one consumer a slot]
Tile j lands in slot j % SLOTS, and its warpgroup waits for the slot's `full` barrier with the parity
of phase j / SLOTS. An mbarrier parity wait only tells the phase in progress from the one before it: a
wait for a phase two ahead returns at once, as if that phase had completed. Where SLOTS is a multiple
of NCONS a slot's tiles all go to one warpgroup, which consumed the slot's previous tile itself before
it waits for the next, so every wait is at most one phase ahead. Otherwise a slot's successive tiles go
to different warpgroups, and one of them can run ahead of the slot. For example, with NCONS = 3 and
SLOTS = 2, warpgroup 2 may wait for tile 2 in slot 0 while tile 0 is still landing there. It then reads
the slot early and arrives on its `empty` barrier out of turn. Found in session 40: `aicfc tune` timed
ResNet-50 B32's stem at 8 x 7 tiles with NCONS = 3 and SLOTS = 2. That candidate tied the planner's
pick and faulted (unspecified launch failure, at the producer's TMA, under compute-sanitizer). The
GPU tests had never reused a slot: their images make at most one tile a block. So the space offers
only rings whose SLOTS is a multiple of NCONS: 2 or 4 slots for two warpgroups, 3 for three. The
`taps` unit (NCONS 3, SLOTS 6) already meets this rule; `band` gives each warpgroup its own ring.
Measured (session 31, an H200, torchvision ResNet-50 B32 fp16; benchmarks/results/pool_stem_session31_h200.txt):
the merged stem 39.6-40.1 us alone (predicted 35.75) where the im2col stem took 39.6 and the max pool 18.5; the
plan 819.2 us against 833.1 (7 alternating rounds); 8 x 7 tiles with three consumer warpgroups 39.4, with two and
three slots 39.6. A tile takes about 2.9 us against 1.1 us of products at the SM's peak: with N = 64 every
wgmma reads as many filter bytes as it multiplies image bytes, and with the ldmatrix rows, the region tile and
the pooling's reads a tile moves about 400 KB through shared memory (1.8 us at 128 bytes a clock).

[Note: channels as rows]
XP = 1 swaps the GEMM's operands: the 64 output channels are wgmma's M (A: the filter's resident 64 x 64
box of each tap, K-major) and the tile's convolution pixels are N (B: the image rows, read by wgmma straight
from the slot as K-major 128-byte rows). That takes the ldmatrix of every tap's pixel rows and the
filter's wide reads by every wgmma (N = 64, as many filter bytes as image bytes) out of shared memory: a
tile's traffic there goes from about 400 KB to about 290 KB (the image rows once per tap, the filter's
64 rows a tap, the region tile, the pooling's reads). It needs a window one
pixel wide (KW = 1: the unfolded ResNet stem's 4x1), so that each tap is the slot shifted by whole rows,
and rows a multiple of 8 pixels apart, so that each tap's B starts on a 1024-byte swizzle period: the
image box is PITCH = RW rounded up to 8 pixels wide, and N = RH x PITCH slot rows (at most 256, a
multiple of 16), the columns past RW computed and never pooled. 7 x 7 pooled pixels make 15 x 15
convolution pixels, N = 15 x 16 = 240: one m64n240k16 a tap and k16 step. The accumulators are 64
channels x N pixels; the epilogue's values go into the region tile transposed by `stmatrix.trans`
(a pixel's 8 channels a 16-byte row), so the pooling pass is unchanged but for the row pitch. The
epilogue must not read anything per pixel (`pixel_free`): its lines are rendered with both values of a
pair on one channel. One or two consumer warpgroups: 120 accumulators a thread and their epilogue need more
than the 152 registers a thread of three may have, and three rings of this size do not fit.
Measured (session 40, an H200, torchvision ResNet-50 B32 fp16; benchmarks/results/pool_xp_session40_h200.txt,
each kernel alone): the stem with its pool 32.1-35.2 us on 7x7 tiles and two warpgroups, against 39.8-41.9
for the 7x8 tiles of the kernel above; one warpgroup 44.8-45.7 whatever the ring's depth. A tile's
products take about 2.0 us there, half the tensor cores' peak, with the filter in registers (a first
version) or in shared memory alike; why is not known. At B1 (64 tiles, one a block) it measured 5.2-5.3 us
against 5.7-5.9, but the cost terms keep the 4x8 tiles there (3.81 us predicted against 4.32).

[Note: the stem gathers its input]
GI = 1 (passes/gather_stem.py): the image is not read from memory but computed by the kernel, from the producer
that `Kernel.inlined` holds (the stem's unfolded copy of the graph's NCHW input, [Note: row phases] in
passes/unfold_taps.py: U[n, hh, ow, c, r, s] = X[n, c, 2 hh + r - 3, 2 ow + s - 3]). The producer warpgroup's
128 threads fill each tile's slot themselves, with what the TMA box of U would have landed there: slot row
(yy, xx) is U's pixel (cy0 - PAD_H + yy, cx0 - PAD_W + xx) of image n, zero outside U, its 16-byte chunk j the
8 innermost elements of U's trailing index j (one (c, r) pair, s = 0..7), each the producer's value at that
index (its guarded loads of X, converted to the operands' type as the copy's store rounds them), stored at
row·128 + ((j ^ row % 8)·16) as the 128-byte swizzle puts it. Thread t takes chunks t, t + 128, ... of the
slot, chunk-major (j = q / (BW·BH)), so a warp's lanes walk neighbouring pixels of one chunk: their loads
of X step two elements apart along a row and their stores take 8 distinct 16-byte bank groups an 8-row period.
Then each fences its writes to the async proxy the consumers' wgmma reads through
(`fence.proxy.async.shared::cta`) and arrives on the slot's `full` barrier, which counts 128 arrivals (one, the
TMA's bytes, under GI = 0). The filter's boxes and the pooled output still go by the TMA (two maps, not
three). The copy's kernel goes: U (53 MB at ResNet-50 B32) is neither written nor read back, and the stem
reads the input (9.6 MB: the plan's fp16 image) once from DRAM.
Where the producer's last chunks are its fill for every pixel (the stem's padding channel C' - 1: the row's
last 16 elements since the layout puts the channels outermost), XP's products run KSTEPS = 3 of the 4 k16
steps a tap (`gathered_ksteps`): a quarter fewer products, none of the skipped ones with a nonzero term, and the
producer fills only the 2·KSTEPS chunks a row that they read. (The copy's path cannot skip them: what the copy
stored is not the kernel's to know.)
Eligible where the producer is one map of the kernel's image alone whose innermost extent is 8 and whose
trailing extents make the 64 elements of the image's rows, in the operands' type.
Measured (session 87, an H100, benchmarks/results/gather_stem_session87_h100.txt): chunk by chunk as above, each
chunk's eight guarded 2-byte loads waited for before its store, the stem took 131.1 us alone where it took 31.3
reading the copy, 0.61 us a chunk: a round trip to memory each, 13.5 of them a thread a tile. Hence the rows' form:

[Note: a slot filled by source rows]
Where the producer copies a 16-bit source of the operands' type whose last axis the slot's pixel column steps by
an even a and the chunk's 8 elements by 1 (the stem: X[n, c, 2 hh + r - 3, 2 ow + s - 3], a = 2; `gather_rows`),
a task is one (chunk j, slot row yy): its BW chunks read one run of a·(BW - 1) + 8 elements of one source row
(38 for the stem's 16 columns). The thread loads the run's 20 32-bit words at once (one round trip; zero past the
row's ends, the row's length even so a word is inside or outside whole), then builds each chunk's four pairs
with byte permutes from words a·xx/2 .. + 4 (the run's first element odd or even: `sel`) and stores it. A tile
of the stem is 18 rows x 6 chunks = 108 tasks, one round for 128 threads. Its 20 words and 16 chunks need 96
registers a producer thread (ptxas spilled at 40, 56 and 80), so GI kernels give the consumers what is left
of the block's launch registers (`GATHER_REGS`: 200 for two, 136 for three; [Note: setmaxnreg's pool] in
codegen/gemm_wgmma.py: 208 for two, as first written, hung). The element-by-element form stays for other producers.

[Note: a tile's loads ahead]
GA = 1, where a tile's tasks fit the 128 producer threads (one task a thread a tile: the stem's 108 on 7x7 XP tiles,
90 on 4x4): a thread holds two runs of words and requests tile j + 1's before it waits for tile j's slot and fills
it, so a run's round trip to memory runs under the previous tile's wait and stores instead of after them (in turn,
GA = 0, each tile pays the round trip and then its stores). Both fit the producer's 96 registers (ptxas spilled
at 56, not at 80). The cost terms do not tell them apart yet (their t_rows is the same, and a tie goes to GA = 0):
which one a GPU runs faster is for `benchmarks/conv_round.sh s88q` (or `s88`) to say, with `--pin GA=1` on one
side. A task's loads and permutes are two template macros (`run_words`, `run_chunks`) that each form renders inline:
one pair of device lambdas shared by both at run time spilled 4 bytes in the in-turn form on three consumer
warpgroups (4x8 tiles, XP = 0), where the inline code does not.

Requires: NHWC fp16/bf16 image of exactly 64 channels, 64 output channels, a KH x KW window (KH·KW
<= 16) at stride 1 without dilation (any zero padding), the filter K-major in (kh, kw, c) order, the
convolution's result read by nothing but the pool, and the pool a max over 3x3 at stride 2 with one
pixel of padding of that result, its output the row-major [N, PH, PW, 64] tensor. After
`unfold_taps` the ResNet stem is such a convolution (a 4x1 window over 64-element rows).
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Mapping

from aicfc.codegen import conv_taps, conv_wgmma, gemm_wgmma
from aicfc.codegen.common import render
from aicfc.codegen.tma import TensorMap
from aicfc.codegen.cexpr import Emitter, c_affine, flat_offset, guard_condition
from aicfc.codegen.common import decompose
from aicfc.ir.decision import Inlined, Kernel, Plan
from aicfc.ir.lowered import Affine, Compute, Load, loads
from aicfc.ir.properties import implicit_gemm
from aicfc.ir.types import ITEMSIZE, TensorType

ROW_BYTES = 128                       # a pixel's 64 channels of 16 bits: one swizzled row
BLOCK = 64                            # GEMM rows a wgmma block
MAX_ROWS = 4 * BLOCK                  # a tile's convolution pixels at most (four blocks)
TAP_BYTES = 64 * ROW_BYTES            # a tap's filter box (64 x 64) and a block's A rows through ldmatrix
TILES = ((8, 7), (7, 8), (4, 8), (8, 4), (4, 4))   # (TPH, TPW) offered
XP_TILES = ((7, 7), (4, 4))                        # (TPH, TPW) offered with channels as rows ([Note: channels as rows])
XP_MAX_N = 256                                     # wgmma's widest n
MAX_TAPS = 16
CHUNK = 8                             # elements of a gathered 16-byte chunk ([Note: the stem gathers its input])
# setmaxnreg: the producer's registers, and each consumer's as the block's launch registers leave them
# ([Note: setmaxnreg's pool] in codegen/gemm_wgmma.py), at most 232
PRODUCER_REGS = 40
CONSUMER_REGS = {n: gemm_wgmma.consumer_regs(n, PRODUCER_REGS, 232) for n in (1, 2, 3)}   # 232, 232, 152
# GI ([Note: a slot filled by source rows]): a producer thread holds a run of 20 words and builds 16 chunks from
# them; ptxas spilled at 40, 56 and 80 registers (none at 96)
GATHER_REGS = (96, {n: gemm_wgmma.consumer_regs(n, 96, 232) for n in (1, 2, 3)})   # 232, 200, 136


@dataclasses.dataclass(frozen=True)
class Pooled:
    """A pooled convolution's geometry."""
    conv: conv_wgmma.Im2colGeometry
    pooled: tuple[int, int]           # PH, PW


def is_pooled(k: Kernel) -> bool:
    """Whether the kernel ends in a window reduction over its convolution's result (formed by
    passes/pool_epilogue.py): only this unit runs such a kernel."""
    return k.family == "conv" and len(k.ops) >= 2 and k.ops[-1].combiner == "max" and bool(k.ops[-1].reduce)


def gathered(k: Kernel) -> Inlined | None:
    """The producer of the convolution's image the kernel computes itself ([Note: the stem gathers its input]),
    or None where it reads the image from memory."""
    g = implicit_gemm(k.ops[0])
    return next((i for i in k.inlined if g is not None and {g.a.buffer, g.b.buffer} & i.names), None)


def gather_why_not(op: Compute, image: TensorType) -> str | None:
    """Why the producer `op` of a pooled convolution's image (`image`: the [N, H, W, 64] view the convolution
    reads) cannot fill the slots ([Note: the stem gathers its input]), or None where it can."""
    shape = op.type.shape
    if op.reduce or len(shape) < 4 or shape[-1] != CHUNK:
        return f"its producer is not a map whose innermost extent is {CHUNK}"
    if tuple(image.shape) != tuple(shape[:3]) + (64,) or math.prod(shape[3:]) != 64:
        return "the image is not the producer's result with its trailing dimensions as one row of 64"
    if op.type.dtype != image.dtype:
        return "the producer's type is not the image's"
    if any(not isinstance(a, Affine) for ld in loads(op.body) for a in ld.index):
        return "the producer reads through an indirect index"
    return None


def gathered_ksteps(k: Kernel, types: Mapping[str, TensorType]) -> int:
    """The k16 steps of a slot row the products need (4 of its 64 elements; fewer where the gathered producer's last
    chunks are its fill, zero, for every pixel: the unfolded stem's padding channel, [Note: row phases] in
    passes/unfold_taps.py): a chunk whose guarded load tests a dimension its own indices fix outside the source."""
    inl = gathered(k)
    if inl is None:
        return 4
    op, body = inl.op, inl.op.body
    if not isinstance(body, Load) or body.fill != 0.0:
        return 4
    shape, vs = op.type.shape, op.domain_vars
    inner = list(zip(vs[3:-1], shape[3:-1]))
    src = types[body.buffer].shape

    def zero(j: int) -> bool:
        at, rest = {}, j
        for v, e in reversed(inner):
            at[v], rest = rest % e, rest // e
        for d in body.guarded_dims:
            a = body.index[d]
            if all(v in at for v, _ in a.terms):
                value = a.const + sum(c * at[v] for v, c in a.terms)
                if not 0 <= value < src[d]:
                    return True
        return False
    chunks = 64 // CHUNK
    last = max((j for j in range(chunks) if not zero(j)), default=0)
    return last // 2 + 1   # a k16 step is two chunks


def gather_lines(k: Kernel, types: Mapping[str, TensorType], params: Mapping[str, str]) -> list[str]:
    """The producer's values for one chunk: `gv[CHUNK]` from the slot pixel's image `gn`, U coordinates `gu1`, `gu2`
    and chunk `gj` ([Note: the stem gathers its input]); zeros outside the producer's result."""
    op = gathered(k).op
    shape, vs = op.type.shape, op.domain_vars
    names = {vs[0]: "gn", vs[1]: "gu1", vs[2]: "gu2", vs[-1]: "gs"}
    names.update({v: v for v in vs[3:-1]})
    em = Emitter(params, types, prefix="gt")
    value = em.emit(op.body, names, {})
    return (["float gv[8];", f"const bool gin = (unsigned)gu1 < {shape[1]}u && (unsigned)gu2 < {shape[2]}u;"]
            + decompose("gj", [(v, shape[3 + i]) for i, v in enumerate(vs[3:-1])], "int")
            + ["#pragma unroll", f"for (int gs = 0; gs < {CHUNK}; ++gs) {{", "  float gval = 0.0f;", "  if (gin) {",
               *("    " + line for line in em.take()), f"    gval = {value};", "  }", "  gv[gs] = gval;", "}"])


@dataclasses.dataclass(frozen=True)
class Rows:
    """[Note: a slot filled by source rows]: how a producer that copies a 16-bit source of the operands' type reads
    it, a run of one source row per task: C lines setting `row_ok` and `row` (the source row's element offset) from
    `gn`, `gu1` and `gj`, the source's extent along its last axis, and the run's first element as C of `cx0`."""
    lines: tuple[str, ...]
    width: int            # the source's last extent (even)
    stride: int           # a: the run steps a·xx elements from one slot pixel to the next (even)
    first: str            # the run's first element along the last axis for the tile's first slot column
    words: int            # 32-bit words a task loads: the run and one element of slack for an odd start


def gather_rows(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> Rows | None:
    """The row-run form of the gathered producer ([Note: a slot filled by source rows]) where it applies, else None
    (the chunk-by-chunk form, `gather_lines`)."""
    op = gathered(k).op
    body, vs, shape = op.body, op.domain_vars, op.type.shape
    if not isinstance(body, Load) or body.fill != 0.0:
        return None
    src = types[body.buffer]
    if src.dtype != op.type.dtype or ITEMSIZE[src.dtype] != 2 or src.shape[-1] % 2:
        return None
    last = body.index[-1]
    a, one = last.coeff(vs[2]), last.coeff(vs[-1])
    if one != 1 or a % 2 or a <= 0 or any(v not in (vs[2], vs[-1]) for v, _ in last.terms):
        return None
    if any(x.coeff(vs[2]) or x.coeff(vs[-1]) for x in body.index[:-1]):
        return None
    names = {vs[0]: "gn", vs[1]: "gu1", **{v: v for v in vs[3:-1]}}
    row = Load(body.buffer, tuple(body.index[:-1]) + (Affine(),), 0.0,
               tuple(d for d in body.guard if d < len(body.index) - 1))
    guard = guard_condition(row, src, names) or "true"   # the load's tests but the last axis's (per word, below)
    lines = (decompose("gj", [(v, shape[3 + i]) for i, v in enumerate(vs[3:-1])], "int")
             + [f"const bool row_ok = (unsigned)gu1 < {shape[1]}u && {guard};",
                f"const int row = row_ok ? {c_affine(flat_offset(row.index, src), names)} : 0;"])
    geo = pooled_of(k, types).conv
    run = a * (box(p, geo.taps)[0] - 1) + CHUNK   # the source elements a task's BW slot pixels read
    return Rows(tuple(lines), src.shape[-1], a, f"{a} * (cx0 - {geo.pad[1]}) + {last.const}", run // 2 + 1)


def row_tasks(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> int:
    """The rows' form's tasks a tile ([Note: a slot filled by source rows]): each of the box's rows by the 2·KSTEPS
    chunks of it that the products read."""
    return box(p, pooled_of(k, types).conv.taps)[1] * 2 * ksteps(k, p, types)


def ahead_why_not(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> str | None:
    """Why the gathered producer cannot load a tile ahead ([Note: a tile's loads ahead]), or None where it can:
    the rows' form with one task a producer thread a tile."""
    if not p.get("GI") or gather_rows(k, p, types) is None:
        return "the slots are not filled by source rows"
    tasks = row_tasks(k, p, types)
    return f"{tasks} tasks a tile for 128 producer threads" if tasks > 128 else None


def conv_part(k: Kernel) -> Kernel:
    """The kernel without its pool: the convolution and its epilogue, storing the pooled input."""
    return k.replace(ops=k.ops[:-1], binds=k.binds[:-1], stores=(k.ops[-2].out,))


def pool_window(pool: Compute, src: str) -> str | None:
    """Why `pool` is not the 3x3, stride-2, pad-1 max over channels-last `src` (None when it is)."""
    if pool.combiner != "max" or tuple(pool.reduce) != (3, 3):
        return "not a 3x3 max"
    body = pool.body
    if not isinstance(body, Load) or body.buffer != src or len(body.index) != 4:
        return "the pool does not read the convolution's result alone"
    if body.fill is None or body.fill != float("-inf") or body.guard:
        return "the pool's padding is not -inf outside the image"
    n, y, x, c = pool.domain_vars
    r0, r1 = pool.reduce_vars
    want = (Affine.var(n), Affine.of({y: 2, r0: 1}, -1), Affine.of({x: 2, r1: 1}, -1), Affine.var(c))
    if tuple(body.index) != want:
        return "not a window of stride 2 with one pixel of padding over [n, h, w, c]"
    return None


def geometry(k: Kernel, plan: Plan) -> Pooled | str:
    """The pooled convolution's geometry where this unit runs it, or why it does not."""
    if not is_pooled(k):
        return "no max pool follows the convolution in this kernel"
    conv = conv_part(k)
    geo = conv_taps.sixty_four(conv, plan, "pool")
    if isinstance(geo, str):
        return geo
    types = plan.types()
    if geo.stride != (1, 1) or geo.dilation != (1, 1):
        return "the convolution is strided or dilated"
    if geo.taps[0] * geo.taps[1] > MAX_TAPS:
        return f"{geo.taps[0]}x{geo.taps[1]} taps: the filter stays in shared memory for at most {MAX_TAPS}"
    if not conv_wgmma.row_major_out(conv, types):
        return "the convolution's result is not the row-major [pixels, channels] matrix"
    if conv_wgmma.staged_parts(conv, types, _params(conv), "int") is None:
        return "the epilogue does not stage channel pairs"
    pool = k.ops[-1]
    why = pool_window(pool, conv.ops[-1].out)
    if why:
        return why
    out = types[pool.out]
    ph, pw = pool.type.shape[1], pool.type.shape[2]
    if tuple(pool.type.shape) != (geo.image[0], ph, pw, 64) or out.dtype != conv_wgmma.dtype_of(conv, plan):
        return "the pooled output is not [N, PH, PW, 64] in the operands' type"
    if (ph, pw) != ((geo.out[0] - 1) // 2 + 1, (geo.out[1] - 1) // 2 + 1):
        return "the pooled size is not the window's over the convolution's output"
    return Pooled(geo, (ph, pw))


def why_not(k: Kernel, plan: Plan) -> str | None:
    geo = geometry(k, plan)
    return geo if isinstance(geo, str) else None


def _params(k: Kernel) -> dict[str, str]:
    """Parameter names for rendering the epilogue's values only (what it loads; its store is not used)."""
    from aicfc.codegen.common import kernel_args
    return {b: f"p{i}" for i, b in enumerate(kernel_args(k))}


def window(k: Kernel) -> tuple[int, int]:
    """(KH, KW): the extents of the filter variables in the image's height and width indices."""
    op = k.ops[0]
    ext, red = op.extents(), set(op.reduce_vars)
    g = implicit_gemm(op)
    return tuple(max([ext[v] for v, _ in g.a.index[i].terms if v in red] or [1]) for i in (1, 2))


def region(p: Mapping) -> tuple[int, int]:
    """The convolution pixels a tile computes: (rows, columns)."""
    return 2 * p["TPH"] + 1, 2 * p["TPW"] + 1


def pitch(p: Mapping, taps: tuple[int, int]) -> int:
    """Pixels between a slot's image rows: the box's width, rounded up to 8 under XP ([Note: channels as rows])."""
    w = region(p)[1] + taps[1] - 1
    return -(-w // 8) * 8 if p.get("XP") else w


def box(p: Mapping, taps: tuple[int, int]) -> tuple[int, int]:
    """The image box a tile reads under a KH x KW window: (width, height) in pixels."""
    rh, rw = region(p)
    return pitch(p, taps), rh + taps[0] - 1


def xp_cols(p: Mapping) -> int:
    """XP: the GEMM's N, the slot rows of the region (RH rows of PITCH pixels; KW = 1)."""
    return region(p)[0] * pitch(p, (1, 1))


def pixel_free(lines) -> bool:
    """Whether an epilogue's rendered lines compute its two values (sv0, sv1) from nothing that depends on the
    pixel (`gm`, or a name defined from it, such as the pixel's coordinates the lines split it into): XP renders
    them with both values of a pair on one channel and two pixels."""
    tainted = {"gm"}
    for line in lines:
        m = re.match(r"\s*const\s+[\w:<>]+\s+(\w+)\s*=(.*)", line)
        if m and tainted & set(re.findall(r"\b\w+\b", m.group(2))):
            tainted.add(m.group(1))
    return not tainted & {"sv0", "sv1"}


def blocks(p: Mapping) -> int:
    rh, rw = region(p)
    return -(-rh * rw // BLOCK)


def _kb(n: int) -> int:
    return -(-n // 1024) * 1024


def slot_bytes(p: Mapping, taps: tuple[int, int]) -> int:
    w, h = box(p, taps)
    return _kb(w * h * ROW_BYTES)


def region_bytes(p: Mapping) -> int:
    """A warpgroup's region tile: its blocks' rows of 128 bytes (XP: its N slot rows, in whole swizzle periods)."""
    return _kb(xp_cols(p) * ROW_BYTES) if p.get("XP") else blocks(p) * BLOCK * ROW_BYTES


def pool_bytes(p: Mapping) -> int:
    """A warpgroup's pooled staging: TPH x TPW rows of 128 bytes, in whole swizzle atoms."""
    return _kb(p["TPH"] * p["TPW"] * ROW_BYTES)


def smem_bytes(p: Mapping, taps: tuple[int, int]) -> int:
    return (1024 + taps[0] * taps[1] * TAP_BYTES + p["SLOTS"] * slot_bytes(p, taps)
            + p["NCONS"] * (region_bytes(p) + pool_bytes(p)))


def tiles(p: Mapping, geo: Pooled) -> int:
    (ph, pw), n = geo.pooled, geo.conv.image[0]
    return n * -(-ph // p["TPH"]) * -(-pw // p["TPW"])


def space(k: Kernel, plan: Plan, hw_sms: int, smem_limit: int) -> list[dict]:
    geo = geometry(k, plan)
    if isinstance(geo, str):
        return []
    out = []
    # [Note: channels as rows]: a window one pixel wide and an epilogue that reads nothing per pixel
    xp = geo.conv.taps[1] == 1 and pixel_free(conv_wgmma.staged_parts(conv_part(k), plan.types(), _params(conv_part(k)),
                                                                      "int").lines)
    dtype = conv_wgmma.dtype_of(conv_part(k), plan)
    gi = {"GI": 1} if gathered(k) else {}   # [Note: the stem gathers its input]: every candidate fills its slots
    shapes = [(t, 0) for t in TILES] + ([(t, 1) for t in XP_TILES] if xp else [])
    for (tph, tpw), x in shapes:
        p = {"unit": "pool", "dtype": dtype, "TPH": tph, "TPW": tpw, **({"XP": x} if xp else {}), **gi}
        if any(d > 256 for d in box(p, geo.conv.taps)):
            continue
        if (xp_cols(p) > XP_MAX_N or xp_cols(p) % 16) if x else blocks(p) * BLOCK > MAX_ROWS:
            continue
        for nc in (2, 1) if x else (3, 2):   # the deepest ring that fits beside NCONS warpgroups' tiles ([Note: one consumer a slot])
            ring = [s for s in (4, 3, 2) if s % nc == 0 and smem_bytes(dict(p, NCONS=nc, SLOTS=s), geo.conv.taps)
                    + static_smem(dict(p, SLOTS=s)) <= smem_limit]
            # XP: every ring that fits (session 40 timed one warpgroup's at 2, 3 and 4 slots: equal); else the deepest
            out += [dict(p, NCONS=nc, SLOTS=s, CTAS=min(tiles(p, geo), hw_sms)) for s in (ring if x else ring[:1])]
    if gi:   # [Note: a tile's loads ahead]: GA = 0 and 1 where it applies (ties go to 0: `_order`'s fixed order)
        types = plan.types()
        out = [q for p in out for q in ([dict(p, GA=0), dict(p, GA=1)] if ahead_why_not(k, p, types) is None else [p])]
    return out


def threads(p: Mapping) -> int:
    return 128 * (p["NCONS"] + 1)


def static_smem(p: Mapping) -> int:
    return 8 * (1 + 2 * p["SLOTS"])


def pooled_of(k: Kernel, types: Mapping[str, TensorType]) -> Pooled:
    conv = conv_part(k)
    geo = conv_wgmma.im2col_geometry(conv, types)
    assert not isinstance(geo, str), geo
    pool = k.ops[-1]
    return Pooled(geo, (pool.type.shape[1], pool.type.shape[2]))


def tensor_maps(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> list[TensorMap]:
    """The image's (a tile's box of pixels of one image), the filter's (64 x 64 a tap) and the pooled
    output's (TPH x TPW pixels a box), all in the 128-byte swizzle."""
    geo = pooled_of(k, types)
    maps = conv_taps.tile_maps(conv_part(k), types, p["dtype"], box(p, geo.conv.taps), k.ops[-1].out, geo.pooled,
                               (p["TPW"], p["TPH"]))
    return maps[1:] if p.get("GI") else maps   # GI: the slots are filled by the producer warpgroup, not the TMA


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str, parts: Mapping) -> str:
    geo = pooled_of(k, types)
    conv = conv_part(k)
    params = dict(parts["params"])
    params.setdefault(conv.ops[-1].out, "nullptr")   # the staged values' own store is not rendered
    staged = conv_wgmma.staged_parts(conv, types, params, parts["idx"])
    assert staged is not None, k.name
    n, h, w, _ = geo.conv.image
    (oh, ow), (ph, pw), (kh, kw) = geo.conv.out, geo.pooled, geo.conv.taps
    rh, rw = region(p)
    bw, bh = box(p, geo.conv.taps)
    taps = kh * kw
    xp = bool(p.get("XP"))
    if xp:
        assert kw == 1 and pixel_free(staged.lines), k.name
    gi = bool(p.get("GI"))
    assert gi == (gathered(k) is not None), k.name
    rows = gather_rows(k, p, types) if gi else None
    ahead = bool(p.get("GA"))
    regs = GATHER_REGS if gi else (PRODUCER_REGS, CONSUMER_REGS)   # GA's two runs of words fit 96 too (80 did)
    assert not ahead or ahead_why_not(k, p, types) is None, k.name
    u_hw = gathered(k).op.type.shape[1:3] if gi else (0, 0)
    return render("conv_pool.cu.j2", name=name, dtype=p["dtype"], N_IMG=n, H=h, W=w, OH=oh, OW=ow, PH=ph, PW=pw,
                  KH=kh, KW=kw, PAD_H=geo.conv.pad[0], PAD_W=geo.conv.pad[1], TAPS=taps, TPH=p["TPH"], TPW=p["TPW"],
                  XP=xp, NP=xp_cols(p) if xp else 0, PITCH=bw,
                  RH=rh, RW=rw, BW=bw, BH=bh, BLOCKS=blocks(p), CTAS=p["CTAS"], NCONS=p["NCONS"], SLOTS=p["SLOTS"],
                  SLOT_BYTES=slot_bytes(p, geo.conv.taps), BOX_BYTES=bw * bh * ROW_BYTES, FILTER_BYTES=taps * TAP_BYTES,
                  REGION_BYTES=region_bytes(p), POOL_BYTES=pool_bytes(p),
                  TILES=tiles(p, geo), TILES_X=-(-pw // p["TPW"]), TILES_XY=-(-ph // p["TPH"]) * -(-pw // p["TPW"]),
                  threads=threads(p), PRODUCER_REGS=regs[0], CONSUMER_REGS=regs[1][p["NCONS"]],
                  MAPS=p.get("MAPS"), idx=parts["idx"], signature=parts["signature"], staged=staged,
                  GATHER=gi, NMAPS=2 if gi else 3, KSTEPS=ksteps(k, p, types), U_H=u_hw[0], U_W=u_hw[1],
                  ROWS=rows, SRC=parts["params"][gathered(k).op.body.buffer] if rows else "", AHEAD=ahead,
                  TASKS=row_tasks(k, p, types) if rows else 0,
                  gather=[] if rows or not gi else gather_lines(k, types, parts["params"]))


def ksteps(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> int:
    """The k16 steps a tap runs: 4, or under XP with the slots gathered those that are not all zeros
    (`gathered_ksteps`; the ldmatrix path keeps 4, reading the zeros)."""
    return gathered_ksteps(k, types) if p.get("XP") and p.get("GI") else 4


def tile_flops(p: Mapping, geo: Pooled, steps: int = 4) -> float:
    """Products a tile runs: its blocks of 64 rows (XP: its N slot rows) by 64 channels over every tap's 16·`steps`
    channels (`ksteps`)."""
    rows = xp_cols(p) if p.get("XP") else blocks(p) * BLOCK
    return 2.0 * rows * 64 * geo.conv.taps[0] * geo.conv.taps[1] * 16 * steps
