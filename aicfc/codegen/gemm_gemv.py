"""The memory-bound half of the `gemm` family: `gemv`, a contraction of at most MAX_ROWS rows
(a decode step's projections: M = batch x 1 token) against a weight read exactly once.

At M <= 8 a GEMM moves K·N weight bytes for 2·M·K·N FLOPs: it is a stream of the weight, and
the time is the bytes over the bandwidth the kernel keeps in flight. Tensor-core tiles stage
BM >= 32 rows (16 of them padding per m16 fragment at M = 1) and spend their blocks on
pipelines built for reuse; here each thread streams the weight itself:

- block: BN columns (BN / 256 segments of 256) of one K range (split-k over SPLITK blocks);
  warp w reads k-rows w, w + WARPS, ..., UNROLL rows at a time, each lane one 16-byte vector
  (8 columns) per row and segment, `ld.global.cs` (the weight is read once: not kept in L1);
- the M activation values of a k-row are scalar loads every lane of a warp shares (one
  transaction, cached), multiplied into M x 8 fp32 accumulators per segment;
- the warps' partial sums are added in shared memory in warp order (fixed, so repeated runs
  give identical bits); with SPLITK > 1 the partial row tile goes to the kernel's scratch and
  the last split to take a ticket adds all splits in split order (codegen/scratch.py, as the
  `mma` split-k does) and runs the epilogue from shared memory (a gate's up column beside it).
  Rotary epilogues are not offered (`gemm.why_not_rotary`).

Rows are the product of the output's m and batch variables (a decode step's [B, 1, N]: B rows),
which only the activations vary with. Requires: fp16/bf16 operands, B contiguous along n with rows 16-byte
aligned (N and the k stride multiples of 8 elements): the ONNX [K, N] weight layout, which
relayout_weights keeps for fp16/bf16. Parameter space: BN ∈ {256, 512} x WARPS ∈ {4, 8} x
SPLITK ∈ {1, 2, 4, 8, 16, 32} (each split at least UNROLL·WARPS k-rows), M·BN/256·8 <= 64
accumulators per thread. Cost terms: `planner/cost.py` `_gemv_cost`.
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen.cexpr import flat_offset
from aicfc.codegen.common import CTYPES, render
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.types import TensorType

MAX_ROWS = 8
VEC = 8            # columns of a 16-byte vector of fp16/bf16
SPACE = {"BN": (64, 128, 256, 512), "WARPS": (4, 8), "U": (4, 8), "SPLITK": (1, 2, 4, 8, 16, 32), "CL": (0, 1)}
CLUSTER_MAX = 8    # blocks of a portable thread block cluster (sm_90)
MAX_ACC = 64       # fp32 accumulators per thread (BM x SEG x 8)
MAX_HELD = 192     # accumulators + two buffers of a step's weight vectors (4 registers each) and activations (1)
SMEM_MAX = 48 * 1024 - 16   # static shared memory: the warps' partial rows, and the split's flag


def lanes(bn: int) -> tuple[int, int, int]:
    """(LN, RW, SEG): lanes across a k-row (8 columns each), k-rows per warp instruction, and
    the column segments of LN·8 a lane covers (BN = SEG·LN·8)."""
    ln = min(32, bn // VEC)
    return ln, 32 // ln, bn // (VEC * ln)


def held(m: int, seg: int, u: int) -> int:
    """Registers a thread holds through its loop: accumulators, and two steps' weight vectors
    and activations (the one it adds, the next one loading)."""
    return m * seg * VEC + 2 * u * (4 * seg + m)


def k_step(p: Mapping) -> int:
    """k-rows a block covers per step of its loop."""
    return p["WARPS"] * lanes(p["BN"])[1] * p["U"]


def why_not(k: Kernel, plan: Plan, dtype: str | None) -> str | None:
    """Why the contraction cannot run as a gemv (None: it can)."""
    from aicfc.codegen.gemm import dims
    if dtype not in ("f16", "bf16"):
        return "gemv streams fp16/bf16 weights"
    c, m, n, kk, batch = dims(k)
    types = plan.types()
    rows = m * math.prod(e for _, e in batch)
    if rows > MAX_ROWS:
        return f"{rows} rows: gemv is for at most {MAX_ROWS} (a decode step)"
    if any(v in {u for a in c.b.index for u, _ in a.terms} for v, _ in batch):
        return "the weight varies with a batch variable (a batched product, not one weight)"
    if c.n is None or types[c.a.buffer].dtype != dtype or types[c.b.buffer].dtype != dtype:
        return "gemv needs both operands in the tensor-core type"
    off = flat_offset(c.b.index, types[c.b.buffer])
    if off.coeff(c.n) != 1 or off.coeff("r0") % VEC or off.const % VEC or n % VEC or any(
            x % VEC for v, x in off.terms if v not in (c.n, "r0")):
        return "gemv needs the weight contiguous along n in 16-byte rows"
    return None


def space(m: int, n: int, kk: int) -> list[dict]:
    """`m`: every row, the batch variables' included (BM: all of them)."""
    out = []
    for bn in SPACE["BN"]:
        seg = lanes(bn)[2]
        if m * seg * VEC > MAX_ACC:
            continue
        for warps in SPACE["WARPS"]:
            if warps * m * bn * 4 > SMEM_MAX:
                continue
            for u in SPACE["U"]:
                if held(m, seg, u) > MAX_HELD:
                    continue
                for sk in SPACE["SPLITK"]:
                    for cl in SPACE["CL"]:
                        if cl and not 1 < sk <= CLUSTER_MAX:
                            continue
                        p = {"unit": "gemv", "BM": m, "BN": bn, "WARPS": warps, "U": u, "SPLITK": sk, "CL": cl}
                        if sk > 1 and math.ceil(kk / sk) < k_step(p):
                            continue
                        out.append(p)
    return out


def threads(p: Mapping) -> int:
    return 32 * p["WARPS"]


def k_per_split(kk: int, p: Mapping) -> int:
    return math.ceil(kk / p["SPLITK"])


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str, parts: dict) -> str:
    from aicfc.codegen.common import decompose
    from aicfc.codegen.gemm import dims
    c, m, _, _, batch = dims(k)
    rows = decompose("row", list(batch) + [("gm", m)], parts["idx"])   # the row's batch variables and gm
    ln, rw, seg = lanes(p["BN"])
    return render("gemm_gemv.cu.j2", name=name, threads=threads(p), BM=p["BM"], BN=p["BN"], WARPS=p["WARPS"],
                  SPLITK=p["SPLITK"], CL=p.get("CL", 0), LN=ln, RW=rw, SEG=seg, U=p["U"], KSTEP=k_step(p), KPER=k_per_split(parts["K"], p),
                  TA=CTYPES[types[c.a.buffer].dtype], TB=CTYPES[types[c.b.buffer].dtype], rows=rows, ROT_D=parts["rotary"],
                  **{x: parts[x] for x in parts if x not in ("c", "rotary", "M")})
