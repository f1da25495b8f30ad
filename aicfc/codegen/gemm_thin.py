"""The thin half of the `gemm` family: `thin`, a contraction over a short K (at most MAX_K) whose
output is many rows wide, streamed on tensor cores (`mma.sync` m16n8k16) one 16-row slab at a time.

[Note: thin GEMMs]
A 1x1 convolution that expands a thin activation (MobileNetV2's 16 -> 96 channels at 112x112 over
32 images: M = 401408 pixels, K = 16, N = 96) moves 12.8 MB in and 77 MB out for 1.2 GFLOP: its
time is the output's bytes. The tiled units spend it elsewhere (an H200, fp16, that kernel alone):
the mma tiles (BM 256 x BN 32, 64 threads) took 71.8 us with the L2 at 83% of its peak and DRAM at
19% (two-column register stores, each 32-byte sector written in halves by two instructions, and A
re-read by each of the 3 column tiles); the Hopper engine (256 x 128 tiles, 12 an SM) 63.8 us with
nothing busy: a tile's epilogue, one at a time on the SM, is the kernel (ncu, session 33,
benchmarks/results/thin_gemm_session33_h200.txt). At the copy's 4.2 TB/s it is ~21 us.

So this unit streams: a warp keeps the K x BNW weight columns of its chunk (NCH = N / BNW chunks)
in registers for the whole kernel, and walks 16-row slabs of A in a grid-stride loop over
resident warps (GRID blocks of WARPS = NCH x RW warps; warp w keeps chunk w mod NCH):
- A: a lane reads 4 contiguous k of rows g and g + 8 (one 8-byte load each per k-chunk of 16);
  the m16n8k16 fragment wants k 2t, 2t + 1, 2t + 8, 2t + 9 of lane t, and the order of k inside a
  chunk is free where A and B agree, so logical k 2t, 2t + 1 are physical 4t, 4t + 1 and logical
  2t + 8, 2t + 9 are 4t + 2, 4t + 3, in A and in the held B fragments alike ([Note: the gemv on
  tensor cores] does the same); k past K reads 0. The next slab's rows are requested before this
  slab's epilogue, so they arrive under it;
- epilogue: the staged epilogue (`gemm.staged_epilogue`) computes each pair into the warp's
  16 x BNW staging (rows BNW + 8 elements apart: BNW a multiple of 16 puts the 8 rows of a store
  in distinct banks), then the warp stores it as 16-byte pieces, a store covering whole rows of
  the chunk (streaming stores: the output is read by the next kernel, not this one).
Where N < K (a projection: 32 -> 16 channels at 112x112) A's stream dominates and the tiled units
read it once as well: there the mma tiles measured 8.5 us and thin 11.1 (the model predicted mma
at 14.0, thin at 11.5), so thin takes outputs at least as wide as K.
Requires: fp16/bf16 operands, N >= K, A contiguous along k with 8-byte aligned rows (K and every other
stride multiples of 4 elements), B a constant weight not varying with the batch, the output
staged (`gemm.staged_layout`: contiguous along n in 16-byte chunks), no rotary. Rows are the
batch variables and m together (like gemv). Cost terms: planner/cost_thin.py.
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen import pdl
from aicfc.codegen.cexpr import flat_offset
from aicfc.codegen.common import render
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.types import TensorType

MAX_K = 96          # k-chunks of 16 a warp holds the weight of: 6
SPACE = {"BNW": (16, 32, 48, 64, 80, 96, 112, 128, 144), "RW": (1, 2, 4, 8), "OCC": (1, 2, 3, 4, 6, 8)}
MAX_WARPS = 16
MAX_HELD = 168      # registers a lane holds: the weight's fragments, the accumulators, two slabs' A pieces


def chunks(kk: int) -> int:
    """k-chunks of 16."""
    return math.ceil(kk / 16)


def held(kk: int, bnw: int) -> int:
    """Registers a lane holds through its loop: B fragments (2 a chunk and 8 columns), 4
    accumulators an 8-column block, A's 2 rows x 2 registers a chunk for this slab and the next,
    and 24 for addresses and loop state."""
    kc = chunks(kk)
    return 2 * kc * (bnw // 8) + bnw // 2 + 8 * kc + 24


def why_not(k: Kernel, plan: Plan, dtype: str | None) -> str | None:
    """Why the contraction cannot run as a thin stream (None: it can)."""
    from aicfc.codegen.gemm import dims, rotary, staged_layout
    if dtype not in ("f16", "bf16"):
        return "thin streams fp16/bf16 operands on mma.sync"
    c, m, n, kk, batch = dims(k)
    types = plan.types()
    if kk > MAX_K:
        return f"K = {kk}: thin holds at most {MAX_K} k of the weight in registers"
    if c.n is None or c.m is None or n % 16:
        return f"N = {n}: thin takes chunks of 16 columns"
    if n < kk:
        return f"N = {n} is narrower than K = {kk}: thin is for outputs wider than their input (the tiled units read A once there too)"
    if c.b.buffer not in {w.name for w in plan.weights}:
        return "thin holds a constant weight in registers; B is computed"
    if any(v in {u for a in c.b.index for u, _ in a.terms} for v, _ in batch):
        return "the weight varies with a batch variable"
    if types[c.a.buffer].dtype != dtype or types[c.b.buffer].dtype != dtype:
        return "thin needs both operands in the tensor-core type"
    off = flat_offset(c.a.index, types[c.a.buffer])
    if off.coeff("r0") != 1 or kk % 4 or off.const % 4 or any(x % 4 for v, x in off.terms if v != "r0"):
        return "thin reads A as 4 contiguous k of a row (8-byte aligned): A must be contiguous along k"
    if staged_layout(k, types, n) is None:
        return "thin stages its output: it must be one tensor contiguous along n in 16-byte chunks"
    if rotary(k) is not None:
        return "thin has no rotary epilogue"
    return None


def space(rows: int, n: int, kk: int, sms: int) -> list[dict]:
    out = []
    slabs = math.ceil(rows / 16)
    for bnw in SPACE["BNW"]:
        if n % bnw or held(kk, bnw) > MAX_HELD:
            continue
        nch = n // bnw
        for rw in SPACE["RW"]:
            if nch * rw > MAX_WARPS or (rw > 1 and rw * sms > 2 * slabs):
                continue
            for occ in SPACE["OCC"]:
                grid = min(math.ceil(slabs / rw), sms * occ)
                if occ > 1 and grid < sms * occ:
                    continue   # as many blocks as a lower occupancy gives
                out.append({"unit": "thin", "BNW": bnw, "NCH": nch, "RW": rw, "OCC": occ, "GRID": grid})
    return out


def threads(p: Mapping) -> int:
    return 32 * p["NCH"] * p["RW"]


def static_smem(p: Mapping) -> int:
    """Each warp's 16 x (BNW + 8) staging of 16-bit values."""
    return p["NCH"] * p["RW"] * 16 * (p["BNW"] + 8) * 2


def registers(kk: int, p: Mapping) -> int:
    return held(kk, p["BNW"])


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str, parts: dict) -> str:
    from aicfc.codegen.common import decompose
    from aicfc.codegen.gemm import dims
    c, m, n, kk, batch = dims(k)
    variables = list(batch) + [("gm", m)]

    def rows(flat: str) -> list[str]:
        return decompose(flat, variables, parts["idx"])
    staged = parts["staged"]
    assert staged is not None, f"kernel {k.name}: thin needs the staged epilogue"
    dtype = types[c.a.buffer].dtype   # f16 or bf16, the PTX type names
    return render("gemm_thin.cu.j2", name=name, threads=threads(p), WARPS=p["NCH"] * p["RW"], NCH=p["NCH"],
                  BNW=p["BNW"], KC=chunks(kk), K=kk, N=n, ROWS=m * math.prod(e for _, e in batch), LDS=p["BNW"] + 8,
                  dtype=dtype, rows=rows, staged=staged, PDL_MARK=pdl.MARK, idx=parts["idx"],
                  signature=parts["signature"], a_ptr=parts["a_ptr"], a_off=parts["a_off"], b_ptr=parts["b_ptr"],
                  b_off=parts["b_off"])
