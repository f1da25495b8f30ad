"""The tensor-core half of the `gemm` family: `mma.sync` tiles fed by `ldmatrix` from swizzled
shared memory, which a multi-stage `cp.async` pipeline fills.

Operand layout comes from the lowered access maps. An operand contiguous along k is staged as
rows of k (`ldmatrix`); one contiguous along m (or n) is staged as rows of k holding m (n) and
read with `ldmatrix.trans`; tf32 fragments are read with plain shared loads. Global loads are
16-byte `cp.async` where the contiguous extent and every other stride are multiples of the
vector, narrower vectors where only those fit, and synchronous element loads otherwise, so any
M, N, K works without the caller padding anything. Shared rows are XOR-swizzled in 16-byte
chunks so the 8 rows one `ldmatrix` phase reads fall in 8 different bank groups.

Parameter space: block tile BM x BN x BK, WM x WN warps, STAGES pipeline depth, and SPLITK:
where the output tiles alone cannot fill the GPU (M·N small, K long), the K range is split
over SPLITK blocks per tile; each writes its fp32 partial tile to a scratch buffer and the
last to arrive (counted with an atomic ticket) adds them up and runs the epilogue
(`codegen/scratch.py`). Constraints (besides the planner's hardware ones): warp tiles are
multiples of 16 x 16 and hold at most 128 accumulators per thread; every split gets at least
two k-tiles.

At M = 1 (a decode step's gate/up and down projections, which the model puts here: the gemv's
full grids cost the plan more, planner/cost_gemv.py) the 32x32 tiles stream the weight at about
3.0 TB/s. Neither of two changes moved that (an H200, the 1 B Llama's 4-layer decode plan,
benchmarks/results/decode_ab_session20_h200.txt): the ring's first STAGES-1 weight stages requested
before the dependent-launch wait, A's after it (the plan 209.0 us against 206.6), and 6 or 8
stages instead of 4 (the gate/up 15.04 us alone against 15.06; the plan 208.6-209.1 against 206.7).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from aicfc.codegen.cexpr import flat_offset
from aicfc.codegen.common import CTYPES, render
from aicfc.ir.decision import Kernel
from aicfc.ir.lowered import Load
from aicfc.ir.types import ITEMSIZE, TensorType

KSTEP = {"f16": 16, "bf16": 16, "tf32": 8}
SPACE = {"BM": (32, 64, 128, 256), "BN": (32, 64, 128, 256), "STAGES": (2, 3, 4),
         "BK": {"f16": (32, 64), "bf16": (32, 64), "tf32": (16, 32)},
         "warps": ((1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4), (2, 4), (4, 2)),
         "SPLITK": (1, 2, 3, 4, 6, 8)}
SPLIT_BELOW_TILES = 132   # split k only when fewer output tiles than this (about one wave)
GROUP = 8          # tile rows per raster group (L2 reuse between neighbouring blocks)
MAX_ACC = 128      # fp32 accumulators per thread


@dataclass(frozen=True)
class Tile:
    """How one operand's block tile is staged: R rows of L elements, 16-byte chunks swizzled."""

    name: str
    R: int
    L: int
    rows_k: bool      # rows are k (the operand is contiguous along m/n), else rows are m/n
    VEC: int          # elements per cp.async (async) or 1
    async_: bool
    edge_free: bool   # extents are multiples of the tile: no predicates, no zero-fill
    SK: int           # element stride of k in global memory
    ROWSTRIDE: int    # element stride of the tile's row variable in global memory
    esize: int
    threads: int

    @property
    def CH(self) -> int:
        return 16 // self.esize

    @property
    def CM(self) -> int:
        return min(self.L // self.CH, 8)

    @property
    def RP(self) -> int:
        return max(1, 8 // (self.L // self.CH))

    @property
    def SLOTS(self) -> int:
        return math.ceil(self.R * self.L // self.VEC / self.threads)

    @property
    def ROWSTEP(self) -> int:
        """Tile rows between a thread's consecutive copies."""
        return self.threads // (self.L // self.VEC)

    @property
    def uniform(self) -> bool:
        """Every copy of a thread is its first moved by whole swizzle periods (8 rows): one
        pointer and one shared offset per thread instead of one per copy."""
        return (self.edge_free and self.threads % (self.L // self.VEC) == 0 and self.ROWSTEP % 8 == 0
                and (self.R * self.L // self.VEC) % self.threads == 0)

    @property
    def describe(self) -> str:
        how = (f"{self.VEC * self.esize}-byte cp.async" if self.async_ else "element loads (no aligned vector fits)")
        return f"{self.R} rows of {self.L} {'k-major' if self.rows_k else 'k-contiguous'}, {how}"


def mma_type(k: Kernel, types: Mapping[str, TensorType], precision: str) -> str | None:
    """The tensor-core input type this contraction may use under `precision`, or None."""
    from aicfc.codegen.gemm import dims
    c = dims(k)[0]
    dts = {types[c.a.buffer].dtype, types[c.b.buffer].dtype}
    if dts == {"f16"} and precision == "fp16":
        return "f16"
    if dts == {"bf16"} and precision == "bf16":
        return "bf16"
    if dts == {"f32"} and precision == "tf32":
        return "tf32"
    return None


def space(dtype: str, m: int = 0, n: int = 0, k: int = 0, batch: int = 1) -> list[dict]:
    out = []
    for bm in SPACE["BM"]:
        for bn in SPACE["BN"]:
            for wm, wn in SPACE["warps"]:
                wtm, wtn = bm // wm, bn // wn
                if wtm % 16 or wtn % 16 or (wtm // 16) * (wtn // 8) * 4 > MAX_ACC:
                    continue
                tiles = math.ceil(m / bm) * math.ceil(n / bn) * batch
                for bk in SPACE["BK"][dtype]:
                    ktiles = math.ceil(k / bk)
                    for st in SPACE["STAGES"]:
                        for sk in SPACE["SPLITK"]:
                            per = math.ceil(ktiles / sk)
                            if sk > 1 and (tiles >= SPLIT_BELOW_TILES or per < 2 or (sk - 1) * per >= ktiles):
                                continue
                            out.append({"unit": "mma", "dtype": dtype, "BM": bm, "BN": bn, "BK": bk,
                                        "WM": wm, "WN": wn, "STAGES": st, "SPLITK": sk})
    return out


def threads(p: Mapping) -> int:
    return 32 * p["WM"] * p["WN"]


def smem_bytes(p: Mapping) -> int:
    esize = ITEMSIZE["f32" if p["dtype"] == "tf32" else p["dtype"]]
    return p["STAGES"] * (p["BM"] + p["BN"]) * p["BK"] * esize


def tile(name: str, ld: Load, t: TensorType, var: str | None, extent: int, p: Mapping, K: int) -> Tile:
    """Staging of operand `ld` (free variable `var` of extent `extent`) for schedule `p`."""
    off = flat_offset(ld.index, t)
    esize = ITEMSIZE[t.dtype]
    sk = off.coeff("r0")
    rows_k = sk != 1 and var is not None and off.coeff(var) == 1
    block = p["BM"] if name == "a" else p["BN"]
    contig, dim = (var, extent) if rows_k else ("r0", K)
    vec = 1
    if off.coeff(contig) == 1:
        others = [c for v, c in off.terms if v != contig] + [off.const]
        for cand in (16 // esize, 8 // esize, 4 // esize):
            if cand >= 1 and dim % cand == 0 and all(o % cand == 0 for o in others):
                vec = cand
                break
    async_ = vec * esize >= 4
    r, length = (p["BK"], block) if rows_k else (block, p["BK"])
    edge_free = async_ and vec * esize == 16 and extent % block == 0 and K % p["BK"] == 0
    row_stride = sk if rows_k else (off.coeff(var) if var is not None else 0)
    return Tile(name, r, length, rows_k, vec if async_ else 1, async_, edge_free, sk, row_stride, esize, threads(p))


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str, parts: Mapping) -> str:
    """`parts` carries what the SIMT path also needs (dims, signature, offsets, epilogue)."""
    c, m, n, kk = parts["c"], parts["M"], parts["N"], parts["K"]
    a = tile("a", c.a, types[c.a.buffer], c.m, m, p, kk)
    b = tile("b", c.b, types[c.b.buffer], c.n, n, p, kk)
    dtype = p["dtype"]
    return render("gemm_mma.cu.j2", name=name, batch=parts["batch"], M=m, N=n, K=kk, dtype=dtype,
                  shape_mnk=f"m16n8k{KSTEP[dtype]}", T=CTYPES[types[c.a.buffer].dtype], esize=a.esize, KSTEP=KSTEP[dtype],
                  BM=p["BM"], BN=p["BN"], BK=p["BK"], WM=p["WM"], WN=p["WN"], STAGES=p["STAGES"],
                  WTM=p["BM"] // p["WM"], WTN=p["BN"] // p["WN"], MI=p["BM"] // p["WM"] // 16,
                  NI=p["BN"] // p["WN"] // 8, threads=threads(p), GROUP=GROUP,
                  tiles_m=math.ceil(m / p["BM"]), tiles_n=math.ceil(n / p["BN"]), a=a, b=b,
                  idx=parts["idx"], signature=parts["signature"], decompose=parts["decompose"],
                  a_ptr=parts["a_ptr"], b_ptr=parts["b_ptr"], a_off=parts["a_off"], b_off=parts["b_off"],
                  epilogue=parts["epilogue"], paired=parts["paired"], SPLITK=p.get("SPLITK", 1),
                  KT_PER=math.ceil(math.ceil(kk / p["BK"]) / p.get("SPLITK", 1)),
                  partials=parts["partials"], tickets=parts["tickets"], ROT_D=parts["rotary"])
