"""Schedule family `attention`: streaming (flash) attention, property
`weighted_streaming_reduction` (`passes/streaming_attention.py` builds the kernel).

Each block owns BM query rows of one batch (all batch variables flattened: batch, heads) and
streams the keys in tiles of BN: scores S = Q·Kᵀ for the tile, the score expression F (scale,
mask loads) in registers, then the online softmax: running row maximum m and sum l, the
output accumulators rescaled by e^{m_old - m_new} whenever m grows (exact by rescaling
invariance), and O += P·V. After the last tile O / l is stored. The S×S scores never leave
the chip. Three arithmetic units:

- `mma` (fp16/bf16 policy): FlashAttention-2 on tensor cores. Warps own 16-row slices (MI of
  them); S = Q·Kᵀ and O += P·V with mma.sync m16n8k16, Q fragments loaded once with ldmatrix
  and kept in registers, K tiles with ldmatrix, V tiles with ldmatrix.trans, and P re-used
  from the S accumulators as the A operand of P·V without a trip through shared memory. K/V
  tiles are double-buffered with 16-byte cp.async. Needs every row of Q, K, V contiguous
  along the head dimension and 16-byte aligned (any layout reached through views and folded
  transposes qualifies: BERT's [B,S,H·D] buffers do).
- `wgmma` (fp16/bf16 policy, sm_90 only: `attention_wgmma.cu.j2`, built for sm_90a): Hopper
  warpgroup MMA. NWG warpgroups of 128 threads own 64 query rows each; S = Q·Kᵀ reads Q and K
  from shared memory through matrix descriptors (wgmma.mma_async m64n{BN}k16), O += P·V takes
  P from the S accumulators as its register A operand and V from shared memory (m64n{Dv}k16,
  V transposed). Tiles are stored in the 128-byte swizzle, K/V in STAGES buffers filled by
  16-byte cp.async from all threads. OVERLAP = 1: a warpgroup issues S_j and P_{j-1}·V_{j-1}
  together and runs tile j's softmax while P·V occupies the tensor cores (V one tile behind K),
  with the loads STAGES - 1 tiles ahead; 0: S, softmax, P·V in turn, double-buffered; 2
  (ping-pong, NWG = 2, STAGES = 3): warpgroup 0 copies K and warpgroup 1 V, and the two run half
  an iteration apart, so each one's softmax runs while the other's products are on the tensor
  cores (one named barrier per key tile). Needs
  what `mma` needs, plus head dimensions that are multiples of 64 (one swizzled 128-byte row)
  and at most 256 (wgmma's N).
- `simt` (any policy; the only unit under fp32/tf32): exact fp32 arithmetic. TPR threads per
  query row split the key tile's scores and the output columns; rows reduce with shuffles.

Parameter space: mma: BM ∈ {64, 128} x BN ∈ {32, 64, 128} x warps ∈ {4, 8} (16 or 32 rows per
warp), STAGES = 2; wgmma: NWG ∈ {1, 2, 3} (BM = 64·NWG) x BN ∈ {64, 128} x OVERLAP ∈ {0, 1, 2}
x STAGES ∈ {2, 3} (3 with OVERLAP only, 2 with NWG = 2 and STAGES = 3 only; shared memory bounds
it); simt: BM ∈ {16, 32, 64} x
BN ∈ {32, 64} x TPR ∈ {4, 8, 16, 32}. `causal` (0/1) is not a choice but a fact the space records: a constant mask that is 0 on and below
the diagonal and <= -1e4 above it (`properties.causal_logits`); the kernel then skips the key
tiles above the diagonal and never reads the mask. The rule decides it on the model's f32
values and records it on the kernel (`CAUSAL_RULE` among its rewrites). Constraints beyond
the planner's (shared memory, registers, threads): at most 128 fp32 accumulators per thread
for S and O (mma); wgmma keeps out of the space only what its instructions cannot do, the
register estimate (`planner/cost.py`) rejects the tiles that would spill.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from aicfc.codegen import attention_split
from aicfc.codegen.cexpr import Emitter, c_affine, c_offset, flat_offset, literal
from aicfc.codegen.common import CTYPES, decompose, render, signature
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine, Call, Compute, Const, Expr, Load, loads
from aicfc.ir.properties import Attention, causal_split, live_key_loads, live_key_position, streaming_attention
from aicfc.ir.types import ITEMSIZE, TensorType
from aicfc.passes.fold_cache_writes import attention_part, cache_writes, scatter_part
from aicfc.passes.streaming_attention import CAUSAL_RULE, LIVE_RULE

SPACE = {"mma": {"BM": (64, 128), "BN": (32, 64, 128), "warps": (4, 8), "STAGES": (2,)},
         "wgmma": {"NWG": (1, 2, 3), "BN": (64, 128), "STAGES": (2, 3), "OVERLAP": (0, 1, 2)},
         "simt": {"BM": (16, 32, 64), "BN": (32, 64), "TPR": (4, 8, 16, 32)}}
MMA_TYPE = {"fp16": "f16", "bf16": "bf16"}
WGMMA_TARGET = "sm_90"   # wgmma.mma_async is an sm_90a feature: Hopper only, not its successors
WG_ROWS = 64             # query rows per warpgroup: the M of every wgmma shape
MAX_ACC = 128     # fp32 S and O accumulators per thread (mma)
PAD = 8           # elements added to every shared row: rows 16·(odd) bytes apart, so the 8
                  # rows one ldmatrix phase reads hit 8 different 16-byte bank groups


@dataclass(frozen=True)
class Geometry:
    """Extents and flat offsets of the kernel's tensors over its variables: the batch
    variables, the query row `row`, the key `r0`, the head dimension `d`, the value column."""

    att: Attention
    batch: list[tuple[str, int]]
    sq: int
    sk: int
    d: int
    dv: int
    q: Affine
    k: Affine
    v: Affine
    o: Affine            # offset of the stored tensor (O, or its layout map) for O's element
    store: Compute

    @property
    def nb(self) -> int:
        return math.prod(n for _, n in self.batch)


def geometry(k: Kernel, types: Mapping[str, TensorType]) -> Geometry:
    k = attention_part(k)
    att = roles(k)
    store = k.ops[-1]
    bind = dict(k.binds[-1])
    o_index = tuple(Affine.var(v).substitute(bind) for v in store.domain_vars)
    ext = att.out.extents()
    return Geometry(att, [(v, ext[v]) for v in att.batch], ext[att.row], att.out.reduce[0],
                    att.scores.reduce[0], ext[att.col],
                    flat_offset(att.q.index, types[att.q.buffer]), flat_offset(att.k.index, types[att.k.buffer]),
                    flat_offset(att.v.index, types[att.v.buffer]), flat_offset(o_index, types[store.out]), store)


def roles(k: Kernel) -> Attention:
    """The attention roles of the kernel's computes (S, max, sum, P, O, [layout map])."""
    k = attention_part(k)   # without the cache writes folded into it (passes/fold_cache_writes.py)
    att = streaming_attention(k.ops[4], {op.out: op for op in k.ops})
    assert isinstance(att, Attention), f"kernel {k.name} is not a streaming attention"
    return att


def dims(k: Kernel) -> tuple[int, int, int, int, int]:
    """(batch count, query rows, keys, head dimension of q·k, of v)."""
    att = roles(k)
    ext = att.out.extents()
    return (math.prod(ext[v] for v in att.batch), ext[att.row], att.out.reduce[0], att.scores.reduce[0],
            ext[att.col])


def causal(k: Kernel) -> bool:
    """The rule decided it on the model's own mask values (before any precision policy
    rounded them) and recorded it on the kernel."""
    return CAUSAL_RULE in k.rewrites


def _split(off: Affine, inner: tuple[str, ...]) -> tuple[Affine, list[int]]:
    """(the batch part of an offset, the strides of the `inner` variables)."""
    return (Affine.of({v: c for v, c in off.terms if v not in inner}, off.const), [off.coeff(v) for v in inner])


def why_not_mma(g: Geometry, types: Mapping[str, TensorType], precision: str) -> str | None:
    dtype = MMA_TYPE.get(precision)
    if dtype is None:
        return f"--precision {precision}: tensor-core attention needs fp16/bf16; the SIMT kernel runs in fp32"
    att = g.att
    if {types[b].dtype for b in (att.q.buffer, att.k.buffer, att.v.buffer)} != {dtype}:
        return f"q, k and v are not all {dtype}"
    if g.d % 8 or g.dv % 8:
        return f"head dimensions {g.d}/{g.dv} are not multiples of 8 (16-byte rows)"
    for name, off, inner, fast in (("q", g.q, (att.row, "d"), "d"), ("k", g.k, ("r0", "d"), "d"),
                                   ("v", g.v, ("r0", att.col), att.col)):
        if off.coeff(fast) != 1:
            return f"{name} is not contiguous along the head dimension"
        if off.const % 8 or any(c % 8 for v, c in off.terms if v != fast):
            return f"rows of {name} are not 16-byte aligned"
    return None


def why_not_wgmma(g: Geometry, types: Mapping[str, TensorType], precision: str, target: str) -> str | None:
    if target != WGMMA_TARGET:
        return f"--target {target}: warpgroup MMA (wgmma) exists on {WGMMA_TARGET} only"
    why = why_not_mma(g, types, precision)
    if why:
        return why
    if g.d % 64 or g.dv % 64:
        return f"head dimensions {g.d}/{g.dv} are not multiples of 64 (one 128-byte swizzled row)"
    if g.dv > 256 or g.d > 256:
        return f"head dimensions {g.d}/{g.dv} above 256 (wgmma's N, and shared memory)"
    return None


def space(k: Kernel, plan: Plan) -> list[dict]:
    g = geometry(k, plan.types())
    c = int(causal(k))
    out = [{"unit": "simt", "BM": bm, "BN": bn, "TPR": tpr, "causal": c}
           for bm in SPACE["simt"]["BM"] for bn in SPACE["simt"]["BN"] for tpr in SPACE["simt"]["TPR"]
           if bn % tpr == 0 and 64 <= bm * tpr <= 1024]
    if why_not_mma(g, plan.types(), plan.precision) is None:
        dp, dvp = _ceil16(g.d), _ceil16(g.dv)
        for bm in SPACE["mma"]["BM"]:
            for bn in SPACE["mma"]["BN"]:
                for w in SPACE["mma"]["warps"]:
                    mi = bm // w // 16
                    if bm % (16 * w) or mi * 4 * (bn // 8 + dvp // 8) > MAX_ACC or dp > 256:
                        continue
                    out += [{"unit": "mma", "dtype": MMA_TYPE[plan.precision], "BM": bm, "BN": bn, "warps": w,
                             "STAGES": st, "causal": c} for st in SPACE["mma"]["STAGES"]]
    if why_not_wgmma(g, plan.types(), plan.precision, plan.target) is None:
        wg = SPACE["wgmma"]
        out += [{"unit": "wgmma", "dtype": MMA_TYPE[plan.precision], "BM": WG_ROWS * nwg, "BN": bn, "NWG": nwg,
                 "STAGES": st, "OVERLAP": ov, "causal": c}
                for nwg in wg["NWG"] for bn in wg["BN"] for ov in wg["OVERLAP"] for st in wg["STAGES"]
                if (ov or st == 2) and (ov != 2 or (nwg == 2 and st == 3))]
    # the serial schedule is double-buffered only; ping-pong pairs two warpgroups over three stages
    if attention_split.why_not(g, plan.types(), plan.precision, bool(c), why_not_mma) is None:
        out += attention_split.space(g, MMA_TYPE[plan.precision])   # few query rows: split the keys
    return out


def declined(k: Kernel, plan: Plan) -> list[tuple[dict, str]]:
    g, types = geometry(k, plan.types()), plan.types()
    why = why_not_mma(g, types, plan.precision)
    why_wg = why_not_wgmma(g, types, plan.precision, plan.target)
    why_split = attention_split.why_not(g, types, plan.precision, causal(k), why_not_mma)
    return [({"unit": unit}, reason) for unit, reason in (("mma", why), ("wgmma", why_wg), ("split", why_split))
            if reason]


def _ceil16(n: int) -> int:
    return (n + 15) // 16 * 16


def copy_lanes(threads: int, cols: int) -> int:
    """wgmma tiles are copied by `threads` in steps of whole rows: L threads per row (L a
    multiple of 8 dividing the row's cols / 8 chunks, 128-byte runs per 8 threads), each
    keeping its chunks c0 + L·j, with threads / L a multiple of 8 rows per step so that the
    128-byte swizzle (period 8 rows) puts a thread's chunks at one place in every row. The
    widest such L; 8 always qualifies (threads a multiple of 128, cols of 64)."""
    chunks = cols // 8
    return max(lanes for lanes in range(8, chunks + 1, 8)
               if chunks % lanes == 0 and threads % lanes == 0 and (threads // lanes) % 8 == 0)


def threads(p: Mapping) -> int:
    if p["unit"] == "split":
        return attention_split.threads(p)
    if p["unit"] == "wgmma":
        return 128 * p["NWG"]
    return 32 * p["warps"] if p["unit"] == "mma" else p["BM"] * p["TPR"]


def smem_bytes(k: Kernel, p: Mapping) -> int:
    _, _, _, d, dv = dims(k)
    if p["unit"] == "split":
        return attention_split.smem_bytes(attention_split.structure(roles(k)).rows, d, dv, p)
    if p["unit"] == "wgmma":   # + 1024: the kernel rounds its base up to the swizzle's 1024-byte period;
        # + 16: OVERLAP's scheduling anchor (attention_wgmma.cu.j2)
        return (p["BM"] * d + p["STAGES"] * p["BN"] * (d + dv)) * ITEMSIZE[p["dtype"]] + 1024 + 16 * p["OVERLAP"]
    if p["unit"] == "mma":
        pitch, vpitch = _ceil16(d) + PAD, _ceil16(dv) + PAD
        return (p["BM"] * pitch + p["STAGES"] * p["BN"] * (pitch + vpitch)) * ITEMSIZE[p["dtype"]]
    return 4 * (p["BM"] * (d + 1) + p["BN"] * (d + 1) + p["BN"] * dv + p["BM"] * p["BN"])


def launch(k: Kernel, p: Mapping) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    if p["unit"] == "split":
        sp = attention_split.structure(roles(k))
        return (sp.nkv * p["SPLITS"], 1, 1), (threads(p), 1, 1), smem_bytes(k, p)
    nb, sq, _, _, _ = dims(k)
    return (nb * math.ceil(sq / p["BM"]), 1, 1), (threads(p), 1, 1), smem_bytes(k, p)


def launch_why_not(k: Kernel, p: Mapping, grid: tuple[int, int, int], hw) -> str | None:
    """Why the launch of `p` is refused beyond the generic limits (plan_schedules._rank)."""
    return attention_split.cluster_why_not(p, grid[0] * grid[1] * grid[2], hw.sm_count) if p.get("unit") == "split" else None


def static_smem(k: Kernel, p: Mapping) -> int:
    return 0


LOG2E = 1.4426950408889634


# [Note: the slot table as the key index] Under the live-key rule ([Note: live keys] in ir/properties.py)
# the mask reads slot[j], a constant table the rule proved equal to j, once a score: a load from global memory
# inside the key loop whose first round trip every block waits for (session 45, an H200: the 1 B Llama's decode
# attention spent 1.8 us from its key tile's landing to its scores, one tile of 128 keys). Where the table's
# stored type holds every key index exactly (`slot_is_index`), the score reads the index itself: the same value,
# no load. It reads `gj`, not the clamped `gj_c` the load used: every template sets a key at or past SK to -inf
# after its logit, and with `gj_c` ptxas spilled 4 bytes in one cluster kernel (B2, 4 heads over 1 at Sq 4).
# Measured (H200, the 1 B Llama's 4-layer plans, benchmarks/decode_ab.py; attention_push_session45_h200.txt and
# l2_fill_session46_h200.txt): the decode step did not move (183.8 against 182.4 us: the load was not what the tile
# waited on), the prefill plan, whose flash attention reads the same table, replayed 1.4-2.0% faster (497.5 against 504.7 us).
EXACT_INDEX = {"f16": 2048, "bf16": 256, "f32": 1 << 24, "f64": 1 << 53, "i32": 1 << 31, "i64": 1 << 63}


def slot_is_index(g: Geometry, types: Mapping[str, TensorType]) -> Load | None:
    """The restated mask's slot load when its table stores every key index 0..SK-1 exactly, else None."""
    found = live_key_loads(g.att)
    if found is None:
        return None
    slot = found[0]
    return slot if g.sk - 1 <= EXACT_INDEX.get(types[slot.buffer].dtype, -1) else None


def _logits(g: Geometry, p: Mapping, sig, types, live: bool = False,
            position: str | None = None) -> tuple[list[str], str, str]:
    """C statements computing F for one score `s_raw` at (gi_c, gj_c), the value's name, and the
    factor that takes it to log2 units for the tensor-core kernels' exp2. F = s·c with a constant
    c > 0 (the usual 1/sqrt(D)) is s itself with c folded into that factor: a positive scale keeps
    the row's max where it was, and exp2(s·c·log2e - m·c·log2e) is the same softmax with one
    multiplication a score fewer (the softmax, not the products, bounds these kernels at D = 64:
    planner/cost_attention_wgmma.py). `position`: C holding the live-key position (`position_read`), read in its
    place ([Note: the rows' positions read once] in codegen/attention_split.py)."""
    att = g.att
    f: Expr = att.logits
    if p["causal"]:
        f = causal_split(att)[1]   # the mask is not read: the kernel compares j > i instead
    scale = _positive_scale(f, att.scores.out)
    if scale is not None and p["unit"] != "simt":
        return [], "s_raw", literal(scale * LOG2E)
    em = Emitter(sig.params, types, prefix="f")
    names = {v: v for v, _ in g.batch} | {att.row: "gi_c", "r0": "gj_c"}
    slot = slot_is_index(g, types) if live else None   # [Note: the slot table as the key index]
    values = {slot: "static_cast<float>(gj)"} if slot else {}
    if live and position is not None:
        values[live_key_position(att)] = position
    value = em.emit(f, names, {att.scores.out: "s_raw"}, values)
    return em.take(), value, literal(LOG2E)


def position_read(g: Geometry, sig, types) -> tuple[list[str], str]:
    """C statements reading the live-key position P of query row `gi_p` as the score expression reads it (a
    float), and the value's name ([Note: the rows' positions read once] in codegen/attention_split.py)."""
    em = Emitter(sig.params, types, prefix="lp")
    value = em.emit(live_key_position(g.att), {v: v for v, _ in g.batch} | {g.att.row: "gi_p"})
    return em.take(), value


def _positive_scale(f: Expr, scores: str) -> float | None:
    """c where `f` is the score times a finite constant c > 0 (either order), else None."""
    if not (isinstance(f, Call) and f.fn == "mul" and len(f.args) == 2):
        return None
    a, b = f.args
    if isinstance(a, Const):
        a, b = b, a
    if isinstance(a, Load) and a.buffer == scores and isinstance(b, Const) and 0 < b.value < float("inf"):
        return float(b.value)
    return None


def live_position(k: Kernel, g: Geometry, sig, types) -> str | None:
    """C for the position P of query row `gi_l` as a `long long`, when the rule bounded the key
    loop by it ([Note: live keys] in ir/properties.py: key j is live for the row while j <= P);
    None otherwise. An integer position is read as it is, a float one floored."""
    if LIVE_RULE not in k.rewrites:
        return None
    pos = live_key_position(g.att)
    assert pos is not None, f"kernel {k.name}: {LIVE_RULE!r} recorded but the mask is not of that form"
    names = {v: v for v, _ in g.batch} | {g.att.row: "gi_l"}
    read = f"{sig.params[pos.buffer]}[{c_offset(pos, sig.params, types, names)}]"
    if types[pos.buffer].dtype in ("i64", "i32"):
        return f"(long long){read}"
    return f"(long long)floorf(static_cast<float>({read}))"


def _store(g: Geometry, types, sig, names: dict[str, str]) -> dict:
    """How the output is written: pointer, batch base, row/column strides, pair vector type."""
    base, (s_row, s_col) = _split(g.o, (g.att.row, g.att.col))
    dtype = types[g.store.out].dtype
    vec = {"f32": ("float2", "make_float2"), "f16": ("__half2", "__floats2half2_rn"),
           "bf16": ("__nv_bfloat162", "__floats2bfloat162_rn")}.get(dtype)
    paired = (vec is not None and s_col == 1 and g.dv % 2 == 0 and base.const % 2 == 0
              and all(c % 2 == 0 for _, c in base.terms) and s_row % 2 == 0)
    return {"ptr": sig.params[g.store.out], "base": c_affine(base, names), "s_row": s_row, "s_col": s_col,
            "T": CTYPES[dtype], "vec": vec if paired else None}


def _cache_writes(k: Kernel, g: Geometry, sig, types, operands: dict) -> list[dict]:
    """For each cache update folded into the kernel (passes/fold_cache_writes.py): which operand
    (k or v) reads the cache, the update count, and C for an update u's slot and its value at
    head-dimension element `dd` (the scatter's expressions over the attention's variables)."""
    from aicfc.codegen import scatter
    out = []
    for y in cache_writes(k):
        key, ld = ("k", g.att.k) if g.att.k.buffer == y else ("v", g.att.v)
        sub = scatter_part(k, y)
        _, val, _, ((ident, _),) = scatter.parts(sub)
        names = {"r0": "u"}
        for a, ix in enumerate(ld.index):
            if ix == Affine.var("r0"):
                names[f"i{a}"] = "slot"
            elif ix.terms:
                v = ix.terms[0][0]
                names[f"i{a}"] = "dd" if v in ("d", g.att.col) else v
            else:
                names[f"i{a}"] = str(ix.const)
        em = Emitter(sig.params, types, prefix=f"w{key}")
        slot = em.emit(ident, names)
        slot_lines = em.take()
        body = val.body
        assert isinstance(body, Call) and body.fn == "select"
        value = em.emit(body.args[1], names)
        out.append({"which": key, "Q": val.reduce[0], "slot_lines": slot_lines, "slot": slot,
                    "value_lines": em.take(), "value": value, **operands[key]})
    return out


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str) -> str:
    g = geometry(k, types)
    att = g.att
    sig = signature(k, types, p)
    idx = sig.index_type
    names = {v: v for v, _ in g.batch}
    operands = {}
    for key, ld, off, inner in (("q", att.q, g.q, (att.row, "d")), ("k", att.k, g.k, ("r0", "d")),
                                ("v", att.v, g.v, ("r0", att.col))):
        base, strides = _split(off, inner)
        operands[key] = {"ptr": sig.params[ld.buffer], "base": c_affine(base, names), "s_row": strides[0],
                         "s_col": strides[1], "T": CTYPES[types[ld.buffer].dtype]}
    if p["unit"] == "split":   # the score expression in natural units (attention_split.py says why)
        live = LIVE_RULE in k.rewrites   # [Note: the rows' positions read once]: the scores read row_p[r]
        lines, value, _ = _logits(g, {"unit": "simt", "causal": 0}, sig, types, live, "row_p[r]" if live else None)
        return attention_split.render_kernel(k, g, p, sig, operands, _store(g, types, sig, names),
                                             live_position(k, g, sig, types), lines, value, name,
                                             _cache_writes(k, g, sig, types, operands),
                                             position_read(g, sig, types) if live else None)
    lines, value, log2_scale = _logits(g, p, sig, types, LIVE_RULE in k.rewrites)
    tiles = math.ceil(g.sq / p["BM"])
    common = dict(name=name, signature=sig.text, idx=idx, decompose=decompose("batch", g.batch, idx),
                  SQ=g.sq, SK=g.sk, D=g.d, DV=g.dv, NB=g.nb, TILES=tiles, KT=math.ceil(g.sk / p["BN"]),
                  BM=p["BM"], BN=p["BN"], causal=bool(p["causal"]), threads=threads(p),
                  q=operands["q"], k=operands["k"], v=operands["v"], o=_store(g, types, sig, names),
                  logit_lines=lines, logit=value, live=live_position(k, g, sig, types), log2_scale=log2_scale, empty_rows_zero=att.empty_rows_zero, mask_reads=[ld.buffer for ld in loads(att.logits)
                                                              if ld.buffer != att.scores.out])
    if p["unit"] == "simt":
        return render("attention.cu.j2", unit="simt", TPR=p["TPR"], **common)
    if p["unit"] == "wgmma":
        return render("attention_wgmma.cu.j2", dtype=p["dtype"], T=CTYPES[p["dtype"]], NWG=p["NWG"], STAGES=p["STAGES"],
                      OVERLAP=bool(p["OVERLAP"]), PINGPONG=p["OVERLAP"] == 2, copy_lanes=copy_lanes, **common)
    dp, dvp = _ceil16(g.d), _ceil16(g.dv)
    return render("attention.cu.j2", unit="mma", dtype=p["dtype"], T=CTYPES[p["dtype"]], warps=p["warps"],
                  WR=p["BM"] // p["warps"], MI=p["BM"] // p["warps"] // 16, DP=dp, DVP=dvp,
                  PITCH=dp + PAD, VPITCH=dvp + PAD, esize=ITEMSIZE[p["dtype"]], **common)
