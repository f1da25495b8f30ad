"""Schedule family `gemm`: a `tile_compatible_compute` contraction, tiled through shared memory.

C[batch, m, n] = epilogue(sum_k A[.., m, k] * B[.., k, n]). Operand accesses come from the
lowered IR as affine maps, so transposed or broadcast operands are just other strides: the
tile loader walks whichever of m/k (n/k) is contiguous fastest, to keep loads coalesced.

Parameter space: block tile BM x BN, K step BK, per-thread tile TM x TN; threads =
(BM/TM)(BN/TN). A thread's TM rows are TM/VM runs of VM = min(TM, 4) adjacent rows (VN likewise
for columns), read from shared memory as one VM-wide vector each. Constraints: 32 <= threads <=
1024, static shared memory 2*4*BK*(BM+VM+BN+VN) (double-buffered, rows padded by the vector
width) <= the profile's per-block limit, and at most PREFETCH_MAX elements of the next K step
staged in each thread's registers.
"""
from __future__ import annotations


import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Mapping

from aicfc.codegen import gemm_gemv, gemm_mma, gemm_thin, gemm_wgmma
from aicfc.codegen.cexpr import Emitter, c_affine, flat_offset, guard_condition, literal
from aicfc.codegen.common import CTYPES, decompose, element_offset, render, signature, store_line
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.memo import by_identity, last_by_identity
from aicfc.ir.lowered import Affine, Call, Compute, Expr, Load, indirect_dims, loads
from aicfc.ir.properties import Contraction, Rotary, contraction, gated_pairs, is_band_of_ones, rotary_pairs
from aicfc.ir.types import ITEMSIZE, TensorType
from aicfc.planner.hardware import load_profile

SPACE = {"BM": (16, 32, 64, 128), "BN": (16, 32, 64, 128), "BK": (8, 16, 32), "TM": (1, 2, 4, 8), "TN": (1, 2, 4, 8)}
PREFETCH_MAX = 16   # elements of the next K step's tiles a thread may hold in registers


def vectors(p: Mapping) -> tuple[int, int]:
    """(VM, VN): the widths of a thread's shared-memory reads of its A and B fragments."""
    return min(p["TM"], 4), min(p["TN"], 4)


def _wavefronts(words: list[list[int]]) -> int:
    """Shared-memory wavefronts of one warp access: each lane's 4-byte word addresses; a
    wavefront serves one distinct word per bank (equal words are broadcast).

    A 16-byte access (LDS.128) is served half a warp at a time, each half at least one
    wavefront, and a half's quarters (8 lanes each) are not broadcast to each other: a half
    takes ceil((distinct bytes of its first quarter + of its second) / 128) wavefronts.
    Measured with Nsight Compute (H200, 2048^3 fp32, BK=16): a warp of 4x8 thread tiles, whose
    two halves each read the same 8 float4s of B twice, made 10 wavefronts per k (this rule:
    10; one distinct word per bank over the warp: 3) against 8 for 8x4 tiles (rule: 8)."""
    if words and len(words[0]) == 4:
        quarters = [{w // 4 for lane in words[q:q + 8] for w in lane} for q in range(0, len(words), 8)]
        halves = [quarters[h:h + 2] for h in range(0, len(quarters), 2)]
        return sum(max(1, -(-sum(16 * len(q) for q in half) // 128)) for half in halves)
    banks: dict[int, set[int]] = {}
    for lane in words:
        for w in lane:
            banks.setdefault(w % 32, set()).add(w)
    return max(len(v) for v in banks.values())


def smem_traffic(p: Mapping, a_k_fast: bool, b_k_fast: bool) -> tuple[float, float]:
    """(read, write) shared-memory wavefronts per warp and K step of the SIMT kernel, from the
    template's addressing (the first warp; rows padded by the vector width): the fragment reads
    of every k (A then B) and the stores of the next step's tiles. A function of the tile's five
    sizes and the two layouts alone, so remembered (ranking asks it for every SIMT candidate)."""
    return _smem_traffic(p["unit"], p["BM"], p["BN"], p["BK"], p["TM"], p["TN"], a_k_fast, b_k_fast)


@functools.lru_cache(maxsize=4096)
def _smem_traffic(unit: str, bm: int, bn: int, bk: int, tm: int, tn: int, a_k_fast: bool,
                  b_k_fast: bool) -> tuple[float, float]:
    p = {"unit": unit, "BM": bm, "BN": bn, "BK": bk, "TM": tm, "TN": tn}
    t = threads(p)
    vm, vn = vectors(p)
    lanes = range(min(32, t))
    cols = bn // tn
    a = _wavefronts([[(l // cols) * vm + r for r in range(vm)] for l in lanes])
    b = _wavefronts([[(l % cols) * vn + r for r in range(vn)] for l in lanes])
    read = bk * ((tm // vm) * a + (tn // vn) * b)

    def stores(rows: int, k_fast: bool, pad: int, count: int) -> float:
        def at(e: int) -> int:   # element e of the tile, stored [k][row] in rows of rows + pad words
            return (e % bk) * (rows + pad) + e // bk if k_fast else (e // rows) * (rows + pad) + e % rows
        return count * _wavefronts([[at(l)] for l in lanes])
    la, lb = prefetch(p)
    return read, stores(bm, a_k_fast, vm, la) + stores(bn, b_k_fast, vn, lb)


def prefetch(p: Mapping) -> tuple[int, int]:
    """(LA, LB): elements of the next A and B tiles each thread fetches into registers."""
    t = threads(p)
    return -(-p["BM"] * p["BK"] // t), -(-p["BN"] * p["BK"] // t)


@by_identity   # asked once per candidate while ranking
def dims(k: Kernel) -> tuple[Contraction, int, int, int, list[tuple[str, int]]]:
    """(contraction, M, N, K, batch variables with extents)."""
    mm = k.ops[0]
    c = contraction(mm)
    assert c is not None, f"kernel {k.name} is not a contraction"
    ext = mm.extents()
    return c, ext.get(c.m, 1) if c.m else 1, ext.get(c.n, 1) if c.n else 1, mm.reduce[0], [(v, ext[v]) for v in c.batch]


def flat_var(k: Kernel, types: Mapping[str, TensorType]) -> str | None:
    """The batch variable whose images the Hopper engine may take as more rows of m (FLAT = 1),
    or None ([Note: images as rows] in codegen/gemm_wgmma.py): the domain variable just outside m,
    a batch of more than one, where every access of the kernel (its operands, its epilogue's reads
    and its store) steps that variable by M times its step along m. Then element (b, m) lies where
    element (0, b·M + m) does in every tensor, so the kernel reads and writes the same bytes with
    b = 0 and m over b·M rows. Not where a read is guarded (its test is per dimension), indirect
    or an operand's rows of another batch would be read (a broadcast [P, C] table)."""
    c, m, _, _, batch = dims(k)
    mm = k.ops[0]
    if c.m is None or len(k.ops) > 2 or rotary(k) is not None or gated(k):
        return None
    at = mm.domain_vars.index(c.m)
    b = mm.domain_vars[at - 1] if at else None
    if b is None or dict(batch).get(b, 1) <= 1:
        return None
    if any(v != a for bind in k.binds for v, a in bind if a != Affine.var(v)):
        return None
    offsets = []
    for op in k.ops:
        for ld in loads(op.body):
            if ld.buffer == mm.out:
                continue   # the accumulators
            if ld.fill is not None or indirect_dims(ld):
                return None
            offsets.append(flat_offset(ld.index, types[ld.buffer]))
    last, bind = store_target(k, types)
    offsets.append(element_offset(last, bind))
    return b if all(off.coeff(b) == m * off.coeff(c.m) for off in offsets) else None


def shape(k: Kernel, p: Mapping) -> tuple[Contraction, int, int, int, list[tuple[str, int]]]:
    """`dims` as schedule `p` runs the kernel: with FLAT = 1 the batch variable of `flat_var`
    is part of m (M times its extent rows) and no longer a batch variable."""
    c, m, n, kk, batch = dims(k)
    if not p.get("FLAT"):
        return c, m, n, kk, batch
    b = flat_merged(k)
    return c, m * dict(batch)[b], n, kk, [(v, e) for v, e in batch if v != b]


def flat_merged(k: Kernel) -> str:
    """The variable FLAT = 1 merges into m (the one `flat_var` found legal)."""
    mm = k.ops[0]
    return mm.domain_vars[mm.domain_vars.index(dims(k)[0].m) - 1]


def space(k: Kernel, plan: Plan) -> list[dict]:
    dtype = gemm_mma.mma_type(k, plan.types(), plan.precision)
    simt = [p for p in simt_space() if p["TN"] >= 2] if gated(k) else simt_space()   # a thread's column pairs
    if not dtype:
        return simt
    _, m, n, kk, batch = dims(k)
    rows = m * math.prod(e for _, e in batch)
    hw = load_profile(plan.target)
    out = simt + gemm_mma.space(dtype, m, n, kk, math.prod(e for _, e in batch))
    if gemm_wgmma.why_not(k, plan, dtype) is None:
        out += gemm_wgmma.space(k, plan, dtype, hw.sm_count, hw.smem_per_block_optin)
    if gemm_gemv.why_not(k, plan, dtype) is None:
        weights = {w.name for w in plan.weights}
        out += gemm_gemv.space(rows, n, kk, early=dims(k)[0].b.buffer in weights, km=gemm_gemv.k_major(k, plan.types()),
                               hw=hw)
    if gemm_thin.why_not(k, plan, dtype) is None:
        out += gemm_thin.space(rows, n, kk, hw.sm_count)
    if row_scale(k) is not None:   # [Note: a norm's row scale in the gemv]: only the gemv adds the rows' statistic
        out = [p for p in out if p["unit"] == "gemv" and gemm_gemv.row_scale_fits(p, kk) is None]
    rot = rotary(k)
    return out if rot is None else [p for p in out if why_not_rotary(rot, p) is None]


def why_not_rotary(rot: Rotary, p: Mapping) -> str | None:
    """Why a tile cannot run a rotary epilogue: a thread must hold both halves of each head it
    touches (the partner column is 8·(head/16) blocks away in its own fragments). wgmma: a
    warpgroup holds all BN columns of its rows; mma: a warp its BN/WN; gemv: the block's BN
    columns in shared memory (over a K-major weight, BN/2 of each half of a head where BN is under the head);
    SIMT threads hold strided columns, never a head's two halves."""
    if p["unit"] == "gemv" and rot.half % 8:
        return f"gemv's epilogue takes a head's halves in 8-column blocks; {rot.half} is not a multiple of 8"
    width = p["BN"] if p["unit"] in ("wgmma", "gemv") else p["BN"] // p["WN"] if p["unit"] == "mma" else None
    if p.get("KM") and width < rot.head:   # [Note: a rotary gemv over a K-major weight]: a block takes both halves' columns
        return None if rot.head % width == 0 and width % 4 == 0 else (
            f"{width} columns a block are not two even runs of matching columns of a head of {rot.head}")
    if width is None:
        return f"{p['unit']} threads do not hold both halves of a head of {rot.head}"
    if width % rot.head:
        return f"{width} columns a thread's tile do not hold whole heads of {rot.head}"
    return None


def declined(k: Kernel, plan: Plan) -> list[tuple[dict, str]]:
    """Candidates the precision policy rules out, with the reason (explain shows them)."""
    dtype = gemm_mma.mma_type(k, plan.types(), plan.precision)
    rot = rotary(k)
    extra = [({"unit": "simt"}, why_not_rotary(rot, {"unit": "simt"}))] if rot else []
    if dtype:
        why = gemm_wgmma.why_not(k, plan, dtype)
        return ([({"unit": "wgmma"}, why)] if why else []) + extra
    return [({"unit": "mma"}, f"--precision {plan.precision} does not allow tensor cores for this contraction"
             + (" (exact fp32 semantics)" if plan.precision == "fp32" else ""))]


def tensor_maps(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> list:
    """The TMA descriptors the schedule takes (codegen/tma.py): the Hopper engine's two operands."""
    return gemm_wgmma.tensor_maps(k, p, types)


def simt_space(prefetched: bool = True) -> list[dict]:
    """The SIMT tiles; `prefetched`: the schedule stages the next K step in registers (this
    family's kernel; the implicit GEMM's does not), so its size is bounded by PREFETCH_MAX."""
    out = []
    for bm in SPACE["BM"]:
        for bn in SPACE["BN"]:
            for bk in SPACE["BK"]:
                for tm in SPACE["TM"]:
                    for tn in SPACE["TN"]:
                        p = {"unit": "simt", "BM": bm, "BN": bn, "BK": bk, "TM": tm, "TN": tn}
                        if bm % tm == 0 and bn % tn == 0 and (not prefetched or sum(prefetch(p)) <= PREFETCH_MAX):
                            out.append(p)
    return out


def threads(p: Mapping) -> int:
    if p["unit"] == "gemv":
        return gemm_gemv.threads(p)
    if p["unit"] == "thin":
        return gemm_thin.threads(p)
    if p["unit"] == "wgmma":
        return gemm_wgmma.threads(p)
    if p["unit"] == "mma":
        return gemm_mma.threads(p)
    return (p["BM"] // p["TM"]) * (p["BN"] // p["TN"])


def launch(k: Kernel, p: Mapping) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    _, m, n, _, batch = dims(k)
    nb = math.prod(e for _, e in batch)
    if p["unit"] == "gemv":
        return (math.ceil(n / p["BN"]), p["SPLITK"], 1), (threads(p), 1, 1), 0
    if p["unit"] == "thin":
        return (p["GRID"], 1, 1), (threads(p), 1, 1), 0
    if p["unit"] == "wgmma":
        return (p["CTAS"], 1, 1), (threads(p), 1, 1), gemm_wgmma.smem_bytes(p)
    if p["unit"] == "mma":
        tiles = math.ceil(m / p["BM"]) * math.ceil(n / p["BN"])
        return (tiles, p["SPLITK"], nb), (threads(p), 1, 1), gemm_mma.smem_bytes(p)
    return (math.ceil(n / p["BN"]), math.ceil(m / p["BM"]), nb), (threads(p), 1, 1), 0


def without_hint(p: Mapping) -> dict | None:
    """`p` without its launch-bounds hint (the K-major gemv's MB: [Note: the K-major gemv's register budget]), or None
    where it has none: what plan_schedules.check_leaders builds again when ptxas spills under the hint."""
    return {k: v for k, v in p.items() if k != "MB"} if p.get("MB") else None


def static_smem(k: Kernel, p: Mapping) -> int:
    if p["unit"] == "gemv":   # and a row-scaled gemv's warps' parts of each row's statistic
        return gemm_gemv.static_smem(p) + (4 * p["WARPS"] * p["BM"] if row_scale(k) is not None else 0)
    if p["unit"] == "thin":
        return gemm_thin.static_smem(p)
    if p["unit"] == "wgmma":
        return gemm_wgmma.static_smem(p)
    if p["unit"] == "mma":
        return 0
    vm, vn = vectors(p)
    return 2 * 4 * p["BK"] * (p["BM"] + vm + p["BN"] + vn)


def operand_k_fast(k: Kernel, types: Mapping[str, TensorType]) -> tuple[bool, bool]:
    """Whether A and B are contiguous along k (their tiles are then stored transposed)."""
    c = dims(k)[0]
    return _k_fast(c.a, types[c.a.buffer], c.m), _k_fast(c.b, types[c.b.buffer], c.n)


def _k_fast(ld: Load, t: TensorType, var: str | None) -> bool:
    """True when the operand is contiguous along k (or has no m/n variable at all)."""
    off = flat_offset(ld.index, t)
    return var is None or abs(off.coeff("r0")) <= abs(off.coeff(var))


def row_scale(k: Kernel) -> Compute | None:
    """The row statistic of a gemv that applies a norm's row scale to its sums (ops: contraction,
    statistic, scaled sums[, epilogue]; [Note: a norm's row scale in the gemv] in
    codegen/gemm_gemv.py), or None."""
    return k.ops[1] if gemm_gemv.ROW_SCALE_RULE in k.rewrites and len(k.ops) >= 3 else None


@by_identity
def acc_ops(k: Kernel) -> tuple[Compute, ...]:
    """The ops the epilogue sees: the contraction as the tile holds its sums before the epilogue,
    then the epilogue map if any. A row-scaled gemv's tile holds the scaled sums by then: its
    contraction stands under the scaled op's name (the epilogue reads that)."""
    if row_scale(k) is None:
        return k.ops
    return (dataclasses.replace(k.ops[0], out=k.ops[2].out),) + k.ops[3:]


def gated(k: Kernel) -> bool:
    """Whether the epilogue stores one value per column pair (gn, gn + 1), gn even, at column
    gn / 2 (`properties.gated_pairs`: SwiGLU over interleaved gate/up columns). Every unit
    holds such pairs in one thread: mma/wgmma fragments, SIMT runs of VN >= 2 (`space`)."""
    ops = acc_ops(k)
    return len(ops) == 2 and gated_pairs(ops[0], ops[1]) is not None


def rotary(k: Kernel) -> Rotary | None:
    """The split of the epilogue's columns into heads when it is a rotary map
    (`properties.rotary_pairs`: passes/rotary_epilogue.py)."""
    ops = acc_ops(k)
    return rotary_pairs(ops[0], ops[1]) if len(ops) == 2 else None


def store_target(k: Kernel, types: Mapping[str, TensorType]) -> tuple[Compute, dict[str, Affine]]:
    """The stored op and the binding of its variables to the contraction's. A rotary map's
    [.., G, 2, half] elements lie where the contraction's [.., N] ones do (row-major), so it is
    stored as that shape at the contraction's own index."""
    last = k.ops[-1]
    if rotary(k) is not None:
        mm = acc_ops(k)[0]
        return Compute(last.out, TensorType(types[last.out].dtype, mm.type.shape), "map", (), mm.body), {
            v: Affine.var(v) for v in mm.domain_vars}
    return last, (dict(k.binds[-1]) if len(acc_ops(k)) == 2 else {v: Affine.var(v) for v in last.domain_vars})


def epilogue_value(k: Kernel, em: Emitter, names: Mapping[str, str], col: str, acc: str, partner: str,
                   hoisted: Mapping[Expr, str] = {}) -> str:
    """The epilogue's value at the column named `col` from the accumulator `acc` (a rotary map:
    and its rotation partner's `partner`).

    A rotary map's head digits come from the two names every tensor-core epilogue site defines
    beside `col` (templates gemm_mma/gemm_wgmma, under ROT_D): `rb`, the first column of the
    thread's head-aligned tile (a multiple of the head: `why_not_rotary`), and `rc`, the
    column's 8-column block within it, a constant of the unrolled loop. With col = rb + rc + (col
    & 7): head g = rb/head + rc/head, half t = (rc/half) & 1 and j = rc % half + (col & 7), so t
    and every choice that depends on it fold at compile time, and no element divides. The
    range tests' bands are ones ([Note: rotary bands]): each read is its guard alone. `hoisted`: terms held in
    registers already (`hoisted_tables`)."""
    mm, epi = acc_ops(k)
    rot = rotary(k)
    if rot is None:
        n = dims(k)[0].n
        return em.emit(epi.body, dict(names) | ({n: col} if n else {}), {mm.out: acc})
    where = _rotary_where(rot, names, col)
    t = where[rot.t]
    values = _band_values(epi.body, em.types, where) | dict(hoisted)
    for ld in loads(epi.body):
        if ld.buffer == mm.out:
            u = rot.half_of(ld)
            values[ld] = acc if u is None else f"({t} == {u} ? {acc} : {partner})"
    return em.emit(epi.body, where, {}, values)


def _rotary_where(rot: Rotary, names: Mapping[str, str], col: str) -> dict[str, str]:
    """The rotary map's variables at the column named `col` (`epilogue_value`)."""
    return dict(names) | {rot.g: f"(rb / {rot.head} + rc / {rot.head})", rot.t: f"((rc / {rot.half}) & 1)",
                          rot.j: f"(rc % {rot.half} + ({col} & 7))"}


def _band_values(e: Expr, types: Mapping[str, TensorType], where: Mapping[str, str]) -> dict[Load, str]:
    """Each band of ones `e` reads, as its guard ([Note: rotary bands] in ir/properties.py)."""
    values = {}
    for ld in loads(e):
        if is_band_of_ones(ld.buffer, types[ld.buffer].dtype):
            guard = guard_condition(ld, types[ld.buffer], where)
            values[ld] = f"({guard} ? 1.0f : {literal(ld.fill)})" if guard else "1.0f"
    return values


def table_terms(k: Kernel, types: Mapping[str, TensorType]) -> list[Expr]:
    """The terms of a rotary epilogue that read no accumulator but some table in memory (the cos and sin of a
    decode step's positions, recomputed there: [Note: a table recomputed where it is read] in
    passes/inline_producers.py), outermost first; none where the epilogue is no rotary map."""
    if rotary(k) is None:
        return []
    mm, epi = acc_ops(k)
    out: list[Expr] = []

    def visit(e: Expr) -> None:
        reads = loads(e)
        if isinstance(e, Call) and not any(ld.buffer == mm.out for ld in reads) and any(
                not is_band_of_ones(ld.buffer, types[ld.buffer].dtype) for ld in reads):
            if e not in out:
                out.append(e)
        elif isinstance(e, Call):
            for a in e.args:
                visit(a)
    visit(epi.body)
    return out


def hoisted_tables(k: Kernel, types: Mapping[str, TensorType], sig,
                   names: Mapping[str, str]) -> tuple[list[dict], tuple[dict, dict]]:
    """([Note: tables computed before the loop] in codegen/gemm_gemv.py) each `table_terms` term at the pair's two
    columns gn and gn1 as the template's hoisted registers {name, lines, value}, and for each column the map from
    term to register that `epilogue_value` reads."""
    rot = rotary(k)
    regs: list[dict] = []
    got: tuple[dict, dict] = ({}, {})
    em = Emitter(sig.params, types, prefix="tq")
    terms = table_terms(k, types)
    for col, held in zip(("gn", "gn1"), got):
        where = _rotary_where(rot, names, col)
        for term in terms:
            value = em.emit(term, where, {}, _band_values(term, types, where))
            name = f"tbl{len(regs)}"
            regs.append(dict(name=name, lines=em.take(), value=value))
            held[term] = name
    return regs, got


def _gated_epilogue(k: Kernel, types: Mapping[str, TensorType], sig, names: dict[str, str]) -> list[str]:
    """Lines computing the gated value from `accv` (column gn) and `accv1` (gn + 1) and storing
    it at column gn / 2."""
    mm, epi = acc_ops(k)
    n = gated_pairs(mm, epi)
    d = mm.domain_vars.index(n)
    values = {ld: ("accv" if ld.index[d].const == 0 else "accv1") for ld in loads(epi.body) if ld.buffer == mm.out}
    where = names | {n: "(gn >> 1)"}
    em = Emitter(sig.params, types, prefix="v")
    value = em.emit(epi.body, where, {}, values)
    return em.take() + [store_line(epi, {v: Affine.var(v) for v in epi.domain_vars}, value, sig.params, where)]


def runs_along(off: Affine, n_var: str, n: int, ve: int) -> bool:
    """Whether the elements at flat offset `off` lie along `n_var` (n of them) in aligned runs of `ve`:
    contiguous along it, and every run start a multiple of `ve` whatever the other variables."""
    return (n % ve == 0 and off.coeff(n_var) == 1 and off.const % ve == 0
            and all(x % ve == 0 for v, x in off.terms if v != n_var))


def _paired_epilogue(k: Kernel, types: Mapping[str, TensorType], sig, names: dict[str, str],
                     n: int, hoist: list | None = None, tables: tuple[dict, dict] | None = None) -> list[str] | None:
    """Epilogue for two adjacent columns (gn, gn+1) ending in one 2-element vector store, or
    None when the stored tensor is not contiguous and 2-aligned along n (or N is odd); `hoist`:
    its pair loads go there (`paired_loads`); `tables`: its table terms held in registers (`hoisted_tables`)."""
    c = dims(k)[0]
    last, bind = store_target(k, types)
    off = element_offset(last, bind)
    if c.n is None or not runs_along(off, c.n, n, 2):
        return None
    lines, values = _pair_values(k, types, sig, names, hoist=hoist, tables=tables)
    vec_t, vec = PAIR_TYPES[types[last.out].dtype]
    ptr = sig.params[last.out]
    return lines + [f"*reinterpret_cast<{vec_t}*>({ptr} + ({c_affine(off, names)})) = {vec}({values[0]}, {values[1]});"]


# the vector of two elements of each stored type, and what packs two floats into it
PAIR_TYPES = {"f32": ("float2", "make_float2"), "f16": ("__half2", "__floats2half2_rn"),
              "bf16": ("__nv_bfloat162", "__floats2bfloat162_rn")}


def _pair_values(k: Kernel, types: Mapping[str, TensorType], sig, names: dict[str, str],
                 staged_reads: Mapping[str, str] | None = None, hoist: list | None = None,
                 tables: tuple[dict, dict] | None = None) -> tuple[list[str], list[str]]:
    """(lines, [value of column gn, value of column gn1]): the epilogue of the accumulators
    `accv`, `accv1` (the contraction itself when the kernel has no epilogue)."""
    em = Emitter(sig.params, types, prefix="v")
    if len(acc_ops(k)) == 2 and rotary(k) is None:
        lines, cols = paired_loads(k, types, sig, names, staged_reads, hoist)
        if lines:
            mm, epi = acc_ops(k)
            n = dims(k)[0].n
            values = [em.emit(epi.body, dict(names) | {n: col}, {mm.out: acc}, got)
                      for col, acc, got in (("gn", "accv", cols[0]), ("gn1", "accv1", cols[1]))]
            return lines + em.take(), values
    values = []
    for (col, acc, partner), held in zip((("gn", "accv", "accp"), ("gn1", "accv1", "accp1")), tables or ({}, {})):
        values.append(acc if len(acc_ops(k)) == 1 else epilogue_value(k, em, names, col, acc, partner, held))
    return em.take(), values


# a pair of each loaded type read as one vector, and its two halves as float
PAIR_LOADS = {"f32": ("float2", "{r}.x", "{r}.y"), "f16": ("__half2", "__low2float({r})", "__high2float({r})"),
              "bf16": ("__nv_bfloat162", "__low2float({r})", "__high2float({r})")}


def paired_reads(k: Kernel, types: Mapping[str, TensorType]) -> list[tuple[Load, Affine]]:
    """The epilogue's tensor reads that `paired_loads` reads as 2-element vectors (contiguous along
    n, pair-aligned, not data-dependent), each with its flat offset, in the epilogue's order."""
    mm, epi = acc_ops(k)
    n = dims(k)[0].n
    out: list[tuple[Load, Affine]] = []
    if n is None:
        return out
    for ld in dict.fromkeys(loads(epi.body)):
        t = types.get(ld.buffer)
        if ld.buffer == mm.out or t is None or ld.fill is not None or t.dtype not in PAIR_LOADS or indirect_dims(ld):
            continue   # [Note: Indirect index]: a data-dependent row is read element by element
        off = flat_offset(ld.index, t)
        if off.coeff(n) != 1 or off.const % 2 or any(x % 2 for v, x in off.terms if v != n):
            continue
        out.append((ld, off))
    return out


def paired_load_expr(ld: Load, off: Affine, types: Mapping[str, TensorType], sig, names: Mapping[str, str]) -> str:
    """The 2-element vector load of `ld` (`paired_reads`) at the element `names` binds (its n to
    the pair's first column)."""
    vec_t = PAIR_LOADS[types[ld.buffer].dtype][0]
    return f"__ldg(reinterpret_cast<const {vec_t}*>({sig.params[ld.buffer]} + ({c_affine(off, names)})))"


def paired_loads(k: Kernel, types: Mapping[str, TensorType], sig, names: dict[str, str],
                 staged_reads: Mapping[str, str] | None = None, hoist: list | None = None) -> tuple[list[str], tuple[dict, dict]]:
    """(lines, (values at column gn, values at gn + 1)): the epilogue's tensor reads (a residual,
    a per-column scale) that are contiguous along n and pair-aligned, each read once for both
    columns as a 2-element vector. Read as two scalars, a residual costs twice the load
    instructions and registers, so fewer of the tile's reads are in flight at once: a 1x1
    convolution's residual epilogue was a chain of memory round trips. A buffer of
    `staged_reads` is read from the shared-memory element that expression names instead
    ([Note: residual through the staging] in codegen/gemm_wgmma.py); with `hoist`, each load goes
    there as {ctype, name, load} (the template's early registers) and the register is read instead
    ([Note: epilogue reads before the wait] in passes/early_epilogue.py)."""
    n = dims(k)[0].n
    lines: list[str] = []
    lo: dict = {}
    hi: dict = {}
    for ld, off in paired_reads(k, types):
        vec_t, low, high = PAIR_LOADS[types[ld.buffer].dtype]
        r = f"pr{len(lo)}"
        src = (staged_reads or {}).get(ld.buffer)
        if src is not None:
            code = f"*reinterpret_cast<const {vec_t}*>({src})"
        else:
            code = paired_load_expr(ld, off, types, sig, dict(names) | {n: "gn"})
            if hoist is not None:
                hoist.append(dict(ctype=vec_t, name=f"epre{len(hoist)}", load=code))
                code = hoist[-1]["name"]
        lines.append(f"const {vec_t} {r} = {code};")
        lo[ld], hi[ld] = low.format(r=r), high.format(r=r)
    return lines, (lo, hi)


@dataclass(frozen=True)
class Staged:
    """An epilogue split at its store, for kernels that stage the output tile in shared memory:
    `lines` compute `sv0`, `sv1` (the values of columns gn, gn1 of row gm, as float), `vec` packs
    two of them into `vec_t` (two of the stored type `T`), and a VE-element chunk starting at (gm, gn) is stored at
    `ptr + (off)` (the tensor is contiguous along n and every chunk 16-byte aligned)."""

    lines: tuple[str, ...]
    T: str
    vec_t: str
    vec: str
    ptr: str
    off: str
    esize: int

    @property
    def VE(self) -> int:
        return 16 // self.esize


def staged_layout(k: Kernel, types: Mapping[str, TensorType], n: int) -> tuple[Affine, str] | None:
    """(offset of the stored element, its dtype) where the epilogue can be staged: one stored
    tensor, contiguous along n, every 16-byte chunk of a row aligned and inside N or outside it."""
    c = dims(k)[0]
    if c.n is None or len(k.own_stores) != 1 or k.own_stores[0] != k.ops[-1].out or gated(k):
        return None
    last, bind = store_target(k, types)
    dt = last.type.dtype
    ve = 16 // ITEMSIZE[dt]
    off = element_offset(last, bind)
    if not runs_along(off, c.n, n, ve):
        return None
    return off, dt


@last_by_identity   # the wgmma terms ask it for every candidate of a kernel in a row
def extra_reads(k: Kernel, types: Mapping[str, TensorType]) -> tuple[str, ...]:
    """Tensors of (at least half) the output's size the epilogue reads per output element: residuals,
    not bias rows."""
    c, m, n, _, batch = dims(k)
    size = m * n * math.prod(e for _, e in batch)
    out = []
    ops = acc_ops(k)
    if len(ops) == 2:
        for ld in loads(ops[1].body):
            if ld.buffer != ops[0].out and ld.buffer not in (c.a.buffer, c.b.buffer) and 2 * types[ld.buffer].numel >= size:
                out.append(ld.buffer)
    return tuple(dict.fromkeys(out))


def prefetch_reads(k: Kernel, types: Mapping[str, TensorType]) -> list[tuple[str, Affine]]:
    """The epilogue's output-sized reads (a residual: `extra_reads`) with their flat offsets in the
    epilogue's variables, where a tile row of them is a contiguous run of whole 16-byte chunks:
    what a bulk L2 request of the row needs ([Note: epilogue prefetch] in codegen/gemm_wgmma.py)."""
    c, _, n, _, _ = dims(k)
    if c.n is None or c.m is None or len(k.ops) != 2 or rotary(k) is not None or gated(k):
        return []
    out: dict[str, Affine] = {}
    reads = extra_reads(k, types)
    for ld in loads(k.ops[1].body):
        if ld.buffer not in reads or ld.buffer in out or indirect_dims(ld):
            continue
        t = types[ld.buffer]
        off = flat_offset(ld.index, t)
        if runs_along(off, c.n, n, 16 // ITEMSIZE[t.dtype]):
            out[ld.buffer] = off
    return list(out.items())


@dataclass(frozen=True)
class ResidualRead:
    """A residual the epilogue reads, as the template fetches it ahead: the producer's L2 requests
    of its tile rows ([Note: epilogue prefetch]) or the consumers' copy into their staging ([Note:
    residual through the staging]), both in codegen/gemm_wgmma.py."""
    buffer: str
    ptr: str         # the kernel parameter
    off: str         # flat offset of element (gm, gn), C
    itemsize: int


def _residual_read(buffer: str, off: Affine, types: Mapping[str, TensorType], sig, names: dict[str, str]) -> ResidualRead:
    return ResidualRead(buffer, sig.params[buffer], c_affine(off, names), ITEMSIZE[types[buffer].dtype])


def staged_source(k: Kernel, types: Mapping[str, TensorType], n: int) -> tuple[str, Affine] | None:
    """(buffer, flat offset of element (gm, gn)) of the residual a staged epilogue can copy into its
    staging ahead of the tile's k-blocks and read from there ([Note: residual through the staging]
    in codegen/gemm_wgmma.py): the epilogue's one output-sized read, of the stored element's size,
    a contiguous run of whole 16-byte chunks along n, read as pairs (`paired_loads`)."""
    layout = staged_layout(k, types, n)
    reads = extra_reads(k, types)
    if layout is None or len(reads) != 1 or rotary(k) is not None:
        return None
    found = [(b, off) for b, off in prefetch_reads(k, types) if b == reads[0]]
    if not found or ITEMSIZE[types[reads[0]].dtype] != ITEMSIZE[layout[1]]:
        return None
    if any(ld.buffer == reads[0] and ld.fill is not None for ld in loads(k.ops[1].body)):
        return None
    return found[0]


def staged_epilogue(k: Kernel, types: Mapping[str, TensorType], sig, names: dict[str, str], n: int,
                    staging_row: int = 0) -> Staged | None:
    """The epilogue as values plus one 16-byte store per chunk of columns (`staged_layout`); with
    `staging_row` (the staging's row pitch in elements), the residual of `staged_source` read from
    the staged tile's element (r, cl)."""
    layout = staged_layout(k, types, n)
    if layout is None:
        return None
    off, dt = layout
    reads = None
    if staging_row:
        src = staged_source(k, types, n)
        if src is None:
            return None
        reads = {src[0]: f"st + r * {staging_row} + cl"}
    body, values = _pair_values(k, types, sig, names, reads)
    lines = tuple(body) + (f"const float sv0 = {values[0]};", f"const float sv1 = {values[1]};")
    vec_t, vec = PAIR_TYPES[dt]
    return Staged(lines, CTYPES[dt], vec_t, vec, sig.params[k.ops[-1].out], c_affine(off, names), ITEMSIZE[dt])


def early_reads(k: Kernel, types: Mapping[str, TensorType]) -> list[str] | None:
    """The buffers a gemv's epilogue reads, which it may request before the dependent-launch wait
    ([Note: epilogue reads before the wait] in passes/early_epilogue.py): an ungated, unrotated
    epilogue stored as pairs (`_paired_epilogue`) whose every read is a pair vector
    (`paired_reads`: a residual, a per-column scale), or a rotary map's table terms (`table_terms`: what they read
    but the bands, [Note: tables computed before the loop] in codegen/gemm_gemv.py); None otherwise, or where it
    reads nothing."""
    c, _, n, _, _ = dims(k)
    if len(acc_ops(k)) != 2 or gated(k) or c.n is None:
        return None
    last, bind = store_target(k, types)
    if not runs_along(element_offset(last, bind), c.n, n, 2):
        return None
    if rotary(k) is not None:
        tables = [ld.buffer for t in table_terms(k, types) for ld in loads(t)
                  if not is_band_of_ones(ld.buffer, types[ld.buffer].dtype)]
        return list(dict.fromkeys(tables)) or None
    mm, epi = acc_ops(k)
    paired = {ld for ld, _ in paired_reads(k, types)}
    reads = [ld for ld in dict.fromkeys(loads(epi.body)) if ld.buffer != mm.out]
    if not reads or any(ld not in paired for ld in reads):
        return None
    return list(dict.fromkeys(ld.buffer for ld in reads))


def _row_scale_parts(k: Kernel, types: Mapping[str, TensorType], sig) -> dict:
    """A row-scaled gemv's C pieces ([Note: a norm's row scale in the gemv] in codegen/gemm_gemv.py):
    `elem`, the statistic's summand of one element `x` of the row (the contraction's A operand,
    which the statistic reads at the same elements: passes/fold_row_scale.py checks it), and
    `scale`, the scaled sum of the tile's sum `red[i]` with the row's statistic `st`."""
    mm, stat, scaled = k.ops[:3]
    em = Emitter(sig.params, types, prefix="rs")
    elem = em.emit(stat.body, {}, {dims(k)[0].a.buffer: "x"})
    elem_lines = em.take()
    value = em.emit(scaled.body, {}, {mm.out: "red[i]", stat.out: "st"})
    return dict(elem=elem, elem_lines=elem_lines, scale=value, scale_lines=em.take())


def joined_kernel(k: Kernel) -> Kernel:
    """The GEMM joined into `k`'s epilogue ([Note: a reduce joined into the epilogue] in
    passes/join_reduce.py) as a kernel of its own, unscheduled."""
    j = k.joined[0]
    return Kernel(j.name, "gemm", j.ops, j.binds, (j.ops[-1].out,))


def joined_epilogue(k: Kernel, types: Mapping[str, TensorType], sig, names: Mapping[str, str]) -> dict:
    """What the Hopper template's joined product needs: its columns N2, the weight's pointer (contiguous, K-major
    or N-major as `kmajor` says: join_reduce checked), the lines of its epilogue at the pair (gm, gn), (gm, gn1) from
    `accv`, `accv1` and the pair's two values (staged as `vec`, then stored by the TMA); `names`: the host kernel's
    batch variables and flat row (the joined GEMM's rows are its rows)."""
    r = joined_kernel(k)
    c, _, n2, _, _ = dims(r)
    where = dict(names) | {c.m: "gm", c.n: "gn"}
    lines, values = _pair_values(r, types, sig, where)
    vec_t, vec = PAIR_TYPES[types[r.ops[-1].out].dtype]
    kmajor = flat_offset(c.b.index, types[c.b.buffer]).coeff("r0") == 1
    return {"N2": n2, "w": sig.params[c.b.buffer], "lines": lines, "pair": values, "vec_t": vec_t, "vec": vec,
            "kmajor": kmajor}


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str) -> str:
    c, m, n, kk, batch = shape(k, p)
    sig = signature(k, types, p)
    idx = sig.index_type
    names = {v: v for v, _ in batch} | ({flat_merged(k): "0"} if p.get("FLAT") else {})
    a_names = names | {"r0": "gk"} | ({c.m: "gm"} if c.m else {})
    b_names = names | {"r0": "gk"} | ({c.n: "gn"} if c.n else {})
    out_names = names | ({c.m: "gm"} if c.m else {}) | ({c.n: "gn"} if c.n else {})
    for v, e in k.ops[0].extents().items():    # extent-1 output variables index nothing
        if e == 1 and v.startswith("i"):
            out_names.setdefault(v, "0")
            a_names.setdefault(v, "0")
            b_names.setdefault(v, "0")
    a_off = c_affine(flat_offset(c.a.index, types[c.a.buffer]), a_names)
    b_off = c_affine(flat_offset(c.b.index, types[c.b.buffer]), b_names)
    mm = acc_ops(k)[0]
    em = Emitter(sig.params, types, prefix="v")
    is_gated = gated(k)
    if is_gated:
        lines = _gated_epilogue(k, types, sig, out_names)
    elif len(acc_ops(k)) == 2:
        value = epilogue_value(k, em, out_names, "gn", "accv", "accp")
        target, bind = store_target(k, types)
        lines = em.take() + [store_line(target, bind, value, sig.params, out_names)]
    else:
        lines = [store_line(mm, {v: Affine.var(v) for v in mm.domain_vars}, "accv", sig.params, out_names)]
    rs = _row_scale_parts(k, types, sig) if row_scale(k) is not None else None
    early: list[dict[str, str]] | None = [] if p.get("EPRE") else None
    tables, held = ([], None)
    if p["unit"] == "gemv" and not is_gated and gemm_gemv.one_pair_a_thread(p) and table_terms(k, types):
        tables, held = hoisted_tables(k, types, sig, out_names)
    paired = lines if is_gated else _paired_epilogue(k, types, sig, out_names, n, early, held)
    if paired is None:   # the epilogue of single columns computes its table terms itself
        tables = []
    parts = dict(c=c, M=m, N=n, K=kk, row_scale=rs, batch=math.prod(e for _, e in batch), idx=idx, signature=sig.text,
                 decompose=decompose("batch", batch, idx), a_ptr=sig.params.get(c.a.buffer),   # none where A is a concatenation read by k-blocks (wgmma)
                 b_ptr=sig.params[c.b.buffer], a_off=a_off, b_off=b_off, epilogue=lines,
                 paired=paired, tables=tables, tables_early=bool(p.get("EPRE")),
                 staged=staged_epilogue(k, types, sig, out_names, n,
                                                gemm_wgmma.staging_row(p) if p.get("RS") else 0) if p["unit"] in ("wgmma", "thin") else None,
                 copy_in=_residual_read(*staged_source(k, types, n), types, sig, out_names) if p.get("RS") else None,
                 prefetch=tuple(_residual_read(b, off, types, sig, out_names)
                                for b, off in prefetch_reads(k, types)) if p["unit"] == "wgmma" else (),
                 partials=sig.params.get(f"{k.name}.partials"), tickets=sig.params.get(f"{k.name}.tickets"),
                 rotary=getattr(rotary(k), "head", None),
                 early=early or [],
                 joined=joined_epilogue(k, types, sig, names) if k.joined else None,
                 fill=[(sig.params[f.buffer], f.ranges) for f in k.prefetch])
    if p["unit"] == "gemv":
        return gemm_gemv.render_kernel(k, p, types, name, parts)
    if p["unit"] == "thin":
        return gemm_thin.render_kernel(k, p, types, name, parts)
    if p["unit"] == "mma":
        return gemm_mma.render_kernel(k, p, types, name, parts)
    if p["unit"] == "wgmma":
        return gemm_wgmma.render_kernel(k, p, types, name, parts)
    simt = {key: p[key] for key in ("BM", "BN", "BK", "TM", "TN")}
    t = threads(p)
    vm, vn = vectors(p)
    la, lb = prefetch(p)
    return render("gemm.cu.j2", name=name, threads=t, **simt, **{x: parts[x] for x in parts if x != "c"},
                  VM=vm, VN=vn, PA=vm, PB=vn, LA=la, LB=lb, a_ragged=p["BM"] * p["BK"] % t != 0,
                  b_ragged=p["BN"] * p["BK"] % t != 0, gated=is_gated, **dict(zip(("a_k_fast", "b_k_fast"), operand_k_fast(k, types))))
