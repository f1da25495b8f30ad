"""The memory-bound half of the `gemm` family: `gemv`, a contraction of at most MAX_ROWS rows
(a decode step's projections: M = batch x 1 token) against a weight read exactly once.

At M <= 8 a GEMM moves K·N weight bytes for 2·M·K·N FLOPs: it is a stream of the weight, and its
time is the bytes over the bandwidth the kernel keeps in flight. Little's law sets the target:
4.25 TB/s (an H200's measured copy) x ~1 us of loaded DRAM latency is ~4 MB in flight, 32 KB on
each of 132 SMs. The kernel, over the ONNX [K, N] weight as relayout_weights keeps it for
fp16/bf16 (contiguous along n: a k-row of a column tile is BN·2 >= 128 contiguous bytes, whole
128-byte lines, so no re-layout is needed for the loads to coalesce):

- block = BN columns x KPER k-rows (split-k over SPLITK blocks along y); a warp instruction
  covers RW = 256/BN k-rows (BN < 256) of LN = BN/8 lanes, each lane one 16-byte vector
  (8 columns; SEG = 2 vectors per lane at BN = 512); `ld.global.cs` (read once: evict first);
- a thread holds two register buffers of U k-rows (weight vectors and the M activations of
  each row): the next step's loads are issued before this step's FMAs, so U to 2U rows per
  thread are in flight: WARPS·32·U·16 B = 16 KB (4 warps, U = 4) to 64 KB (8 warps, U = 8) a
  block; the planner picks the grid (N/BN tiles x SPLITK) so that every SM gets its share;
- reduction tail, all in a fixed order (the same bits every run): the RW sub-rows of a warp
  by shuffles, the warps through shared memory (one barrier, each element added in warp order
  by one thread), then the splits: CL = 1 (SPLITK of 2, 4 or 8) makes the splits of a column tile one
  thread block cluster, and rank 0 adds the others' sums from their shared memory in rank order
  (two cluster barriers, no global traffic); CL = 0 writes partial rows to the kernel's scratch
  and the last split to take a ticket adds them in split order (codegen/scratch.py);
- the epilogue runs from shared memory: paired stores, a gate's up column beside it, and the
  rotary map, whose partner column (half a head away) is in the block's tile because BN is a
  multiple of the head (`gemm.why_not_rotary`): `rb` = the tile's first column, `rc` = the
  column's 8-column block in it (the names `gemm.epilogue_value` reads).

Measured (benchmarks/results/gemv_h100.txt, an H100 SXM, decode shapes, each launch streaming
a weight not in L2): at M = 1 the large projections stream at 2.6-2.9 TB/s (gate/up 17.7 us,
LM head 45.0 us, cuBLAS 18.1 and 46.7), the small ones carry ~4 us of launch and tail (O-proj
6.8 us, cuBLAS 6.2); at M = 8 the kernel is 1.5-2x slower than cuBLAS: 181 registers at 8 rows
leave one block per SM, and the FMAs (8 a weight) are not hidden (cost_gemv's exposed term).

[Note: gemv weights before the wait]
In a plan of dependent launches ([Note: PDL], codegen/pdl.py) a kernel's blocks sit on the SMs
while the kernel before it runs. Where the weight is a constant of the plan (no kernel writes
it), the gemv requests its first step of weight vectors before `griddepcontrol.wait`, and only
the activations wait (PRE = 1; the template puts pdl.MARK after those loads). Measured on an
H100, the 4-layer decode plan of benchmarks/generate.py's Llama, replayed as one graph, 5
alternating rounds: 280.6 us against 285.5 without (`benchmarks/results/gemv_prewait_session8_h100.txt`).
Prefetching more of the slice into L2 (`prefetch.global.L2`, 32 KB a block) made each gemv
faster timed alone but the plan slower: 295.7 us with the prefetch before the wait, 297.2 after
it, 318.8 with a rolling prefetch two steps ahead; so the kernel keeps no L2 prefetch.
Staging more of the slice in shared memory fared the same (session 10, an H200, the same plan,
benchmarks/decode_ab.py on the branch session10-gemv-staged; results in
benchmarks/results/decode_ab*_session10_h200.txt): the first steps of each block's weight
copied by cp.async before the wait, up to 96 KB a block (the whole slice of the O- and
QKV-projections), their activations into shared memory after it. Every gemv but the QKV ran
faster alone (the kernels alone summed 201.3 us against 218.6), but the plan replayed in
247.0 us against 227.9. Setting every kernel's shared-memory carveout to the most made both
sides slower (243.3 and 255.9 us). So the copy before the wait stays at one step of registers.
Measured again in session 20 (an H200, the 4-layer plan, 9 alternating rounds, one process;
benchmarks/results/decode_ab_session20_h200.txt): without that step the plan replayed 214.6 us
against 206.8, and the QKV and O projections' whole slices requested into L2 before the wait
(`prefetch.global.L2`) 212.2 against 206.6.
An RMSNorm folded into the gemv that reads it fared the same (session 14, an H200, branch
session14-fold-row-scale, benchmarks/results/fold_row_scale_session14_h200.txt): every block read
its rows once (the statistics and the activation) and scaled its sums before the epilogue, one
launch fewer per norm. Alone the folded kernels cost what the norm and the gemv cost apart (the
4-layer plan's kernels summed 202.7 us against 202.8), but the plan replayed in 249-256 us
against 215-218, with the activation re-read each step, staged in shared memory or in an L2
scratch. So the norms stay row passes of their own.

Rows are the product of the output's m and batch variables (a decode step's [B, 1, N]: B rows),
which only the activations vary with. Requires: fp16/bf16 operands, B contiguous along n with
rows 16-byte aligned (N and the k stride multiples of 8 elements). Parameter space: SPACE, with
M·SEG·8 <= MAX_ACC accumulators, `held` <= MAX_HELD registers, WARPS·M·BN·4 bytes of shared
memory <= SMEM_MAX, each split at least one step of k-rows. Cost terms: planner/cost_gemv.py.
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen import pdl
from aicfc.codegen.cexpr import flat_offset
from aicfc.codegen.common import CTYPES, render
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.types import TensorType

MAX_ROWS = 8
VEC = 8            # columns of a 16-byte vector of fp16/bf16
SPACE = {"BN": (64, 128, 256, 512), "WARPS": (4, 8), "U": (4, 8), "SPLITK": (1, 2, 3, 4, 6, 8, 12, 16, 32), "CL": (0, 1)}
# Splits that may be one thread block cluster (at most 8 blocks, portable on sm_90): 2, 4 or 8. Clusters of 3 and 6 ran the gate/up 16.4-16.8 us
# where the same grid without them ran 13.4 (an H200, benchmarks/results/gemv_session15_h200.txt).
CLUSTER_SPLITS = (2, 4, 8)
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


def space(m: int, n: int, kk: int, early: bool = False) -> list[dict]:
    """`m`: every row, the batch variables' included (BM: all of them); `early`: the weight is a
    constant of the plan, so its first bytes are requested before the dependent-launch wait
    (PRE = 1, [Note: gemv weights before the wait])."""
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
                        if cl and sk not in CLUSTER_SPLITS:
                            continue
                        p = {"unit": "gemv", "BM": m, "BN": bn, "WARPS": warps, "U": u, "SPLITK": sk, "CL": cl}
                        if early:
                            p["PRE"] = 1
                        if sk > 1 and math.ceil(kk / sk) < k_step(p):
                            continue
                        out.append(p)
    return out


def static_smem(p: Mapping) -> int:
    """The warps' partial rows, and the split's flag."""
    return 4 * p["WARPS"] * p["BM"] * p["BN"] + 16


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
                  PRE=p.get("PRE", 0), PDL_MARK=pdl.MARK,
                  TA=CTYPES[types[c.a.buffer].dtype], TB=CTYPES[types[c.b.buffer].dtype], rows=rows, ROT_D=parts["rotary"],
                  **{x: parts[x] for x in parts if x not in ("c", "rotary", "M")})
