"""Unit `split` of the `attention` family: split-KV (flash-decoding) attention for few query
rows (`templates/attention_split.cu.j2`, cost terms in `planner/cost_attention_split.py`).

A decode step has one query row per head: the tile units (`mma`, `wgmma`) give each block
64-128 query rows, so a step runs batch·heads blocks, each streaming the whole live cache alone
(the Llama decode step: 32 blocks on 132 SMs, latency-bound at 126 GB/s). Here the keys are
cut into SPLITS chunks of CH keys and the grid is (the batch variables K and V depend on) x
SPLITS: one block holds every query row that reads the same K/V rows (the G query heads of a
grouped-query group times the Sq query rows: R = G·Sq rows), so each K/V row is read once.
A block streams its chunk in tiles of BN keys (K/V double-buffered by 16-byte cp.async),
keeping per row a running maximum m, sum l and unnormalised output o (the online softmax of
rescaling invariance), and publishes (m, l, o) to scratch. Partials merge exactly as key tiles
do: M = max m_s, L = Σ l_s·e^(m_s - M), O = Σ o_s·e^(m_s - M) / L.

The combine: the last block of a (batch, kv head) to take its ticket (`codegen/scratch.py`:
zeroed i32 tickets, reset to zero by that block, so graph replays find them zero) reads every
live partial in split order (the same bits whichever block is last) and stores O. A second
kernel would do the same work after a launch gap (~1.3-2 us in a graph) and an extra pass over
the partials; the last-block merge costs one fence and one atomic (`planner/cost_attention_split.py`).

Live keys ([Note: live keys] in ir/properties.py): every block reads the positions and takes
the live length L = max over its rows of P + 1; a block whose chunk starts at or past L returns
at once without a ticket, and the combine counts only the ceil(L / CH) live chunks. Keys at or
past L inside the last live chunk are neither loaded (zero-filled) nor scored (-inf): the dead
slots of a cache are never read, whatever they hold.

MMA = 0: arithmetic in fp32 on the SIMT cores (at R <= 32 rows the tensor cores' 64-row tiles would be
mostly padding and the step is bound by latency, not issue). Scores in natural units, so a
-FLT_MAX mask keeps a fully masked row's uniform softmax (as onnxruntime computes it).

[Note: split attention on tensor cores]
MMA = 1 runs a tile on the tensor cores instead (mma.sync m16n8k16, the fragment layouts of
templates/attention.cu.j2): the block's R query rows are one A operand of 16·MI rows (R <= 16·MI,
the rest zero), and warp w takes keys w·KW .. w·KW + KW - 1 of every tile (KW = BN / warps, a
multiple of 16), keeping its own online softmax over them; the warps merge (m, l, O) once,
through shared memory, after the key loop: one barrier a tile where the SIMT body has three,
and no shared-memory FMA chains. P is rounded to the storage type for P·V, as in the `mma` unit.
STAGES tiles are in flight (STAGES - 1 requested before the dependent-launch wait under PRE),
and SPLITS = 1 (one block a K/V head) needs no partials, no ticket and no combine: the block
stores O itself. Measured on an H200 (planner/cost_attention_split.py): a tile's chain is still
about 0.6 us (the SIMT body's 64-key tile, 1.7), and one SM streams a chunk at about 30 GB/s, so
many splits of one tile each win: the 1 B Llama's decode attention 6.48 us alone (tune's timing)
against the SIMT body's 6.95, 6.1 against 7.0 in its plan.

[Note: the merge's reads at once]
The last chunk's merge needs every live chunk's (m, l) for the weights and every O partial for
the sum. Read as the formulas go (the maxima, then (m, l) again for the weights, then the O
partials once the weights are in shared memory), that is three dependent round trips to L2 on the
decode step's critical path. Where SPLITS <= MERGE_HELD and a thread holds at most one O pair
(R·Dv/2 <= threads), each thread requests its pair of every live chunk, and lane s of each row's
warp chunk s's (m, l), before using any: one round trip. The sums keep their order (one chunk a
lane, the weights' butterfly as before; O added in split order, the dead chunks' zero weights
adding nothing), so the values are those of the three-pass merge. Measured on an H200 (session
24, benchmarks/results/split_merge_session24_h200.txt): the 1 B Llama's decode attention 4.75 us
alone against 5.53, its 4-layer decode plan 202.2 us against 208.4 (7 alternating rounds, the same
tokens), the 20-layer step 0.859 ms against 0.875 (session 19's, another process). In the plan's
timeline the attention runs 6.2-6.4 us from its start to its last block's exit, against 6.5-6.7
before (two machines, not an A/B): in the chain the saving looks smaller than alone.

[Note: the new rows with the query]
A decode step's attention writes its token's K and V rows into the cache it reads
(passes/fold_cache_writes.py). Only the block whose chunk holds a new row's slot reads that row
(it stages the row from the update, not the cache), so that block writes the row into the cache
as it patches its tile, after its own copy of the tile has landed; the last block of the K/V head
writes only a row at or past the live length, which no chunk holds. The new rows' elements are
requested right after the dependent-launch wait, with the query rows, into registers. Before,
the block read them after its tile had landed (a second round trip after the query's), and the
last block read them again after the merge to write the cache (a round trip at the kernel's
end): two of the block's serial trips to L2 fewer on the decode step's critical path. Measured on
an H200 (session 25, benchmarks/results/new_rows_session25_h200.txt): the 1 B Llama's decode
attention 4.51-4.59 us alone against 4.68-4.71, but its 8-layer decode plan 368.9 us against
368.1 (7 alternating rounds, the same tokens; the generate step 0.3710 against 0.3728 ms): in
the chain the saving does not show. Kept as the shorter chain, not as a measured gain.
Session 55 (an H200; SASS of the decode step's attention): the "one round trip" was three for the
block holding the new rows: after the wait it read the position again (the slots), then the new rows,
whose conversion to float waited for them, then the query rows. Now the slots are computed from the
positions before the wait where PRE allows it (fold_cache_writes.why_not_early also asks that the
slots read nothing another kernel writes), and on tensor cores a thread's query elements (at most
QREG_MAX) are requested into registers before the new rows and stored after, so both reads are one
trip. The slots are held as int (-1 outside the cache: in no chunk either way), two registers fewer.

[Note: the rows' positions read once]
Under the live-key rule the scores' mask compares each key with its row's position (j <= P). That
position was read in the key loop, per score (`__ldg` after the tile's products: a trip to L1 or L2
between the products and the softmax on every tile). The block now reads each row's position once, with
the other positions (before the wait under PRE), into shared memory (`row_p`, R floats), and the score
expression reads `row_p[r]` in its place (the Emitter's `values`: the same float the load gave). A
per-thread register copy instead spilled 4 bytes at the 96 registers ptxas picked for the 1 B Llama's
4-warp form, which the planner then rejected for the 8-warp form (session 50: the plan 188.5 us against 165.4).
Measured on an H200 (session 55, benchmarks/results/attention_trips_session55_h200.txt; the 1 B Llama's
decode plan, benchmarks/decode_ab.py against the previous commit's bundle compiled in the same call):
the 2-layer timeline's phases, each block from its go, put the query staged at 0.51-0.77 us (1.02 before),
the scores 0.26-0.51 us after the tile (0.77) and the last block's exit 3.94-4.19 us (4.26-4.51); but
the 4-layer plan replayed in 158.8 us against 158.0 (9 alternating rounds), the generate step 0.1619
against 0.1620 ms, the same tokens: in the chain the attention's blocks still land late and the saving
does not show in the plan. Kept as the shorter chain.

[Note: split attention as a cluster]
CL = 1 (2 <= SPLITS <= CLUSTER_SPLITS, the portable cluster size): the SPLITS chunks of a K/V head are
the CTAs of one thread block cluster (`__cluster_dims__(SPLITS, 1, 1)`; a head's chunks are consecutive
blocks, so a chunk's rank is its split). Chunk s merges its share of the rows' column pairs (pairs
s·PPR .. s·PPR + PPR - 1). Each chunk pushes its partial into the chunks that merge it, as the gemv's
splits do ([Note: splits pushed to rank 0] in codegen/gemm_gemv.py): every pair of its unnormalised O into
the inbox of the chunk that merges that pair (8-byte `st.shared::cluster`), its rows' (m, l) into every
chunk's, then arrives on the cluster barrier with release semantics and waits (acquire); each chunk then
adds its pairs over the live chunks from its own inbox, in split order, and stores them. The barrier's
first phase, arrived at the kernel's start, makes sure every chunk runs before anyone writes into it.
Until session 44 each chunk kept its partial in its own memory and the mergers read it over
`ld.shared::cluster` between two barriers (the second kept each block's memory alive for its peers):
the timeline's phases put about 1 us from the first barrier to the exit (session 44, call 1). The push
form is the same adds in the same order (bit-identical outputs). Measured on an H200 (session 45,
benchmarks/results/attention_push_session45_h200.txt): alone (`aicfc tune`) 4.95 us against the pull's
5.15 for 6 chunks of 128 keys, 5.16 against 5.87 for 6 of 64; the 4-layer decode plan of the 1 B Llama
186.6 against 188.0 us at B1, 232.4 against 232.8 at B8 (2 chunks). No partials in global memory, no
fence, no ticket, no scratch. A chunk past the live length reads no key (an empty chunk) but pushes and
meets the barrier; the merge reads only the live chunks, so its (m, l) are never used. Each row's (m, l)
is pushed by the thread that wrote it: an empty chunk meets no block barrier before its pushes (the first
push form read them from other threads there, and compute-sanitizer racecheck reported it). A new row at
or past the live length (in no chunk) is written by chunk 0 after the merge.
Only where every block has an SM of its own (`cluster_why_not`): at B8 of the 1 B Llama, 256 blocks in
clusters of 4 (two a SM) ran 14.1 us against 9.1 through the ticket. Measured on an H200 (session 28,
benchmarks/results/split_attention_cluster_session28_h200.txt): the 1 B Llama's decode attention, 6
chunks of 128 keys, 5.15 us as a cluster against 6.17 through the ticket and 5.56 for the pick before
(12 chunks of 64 through the ticket), tune's launches; its 4-layer decode plan 202.1 us against 206.5
(7 alternating rounds, the same tokens); at B8, 2 chunks of 128 keys 8.36-8.58 against 9.16-9.79.

[Note: the decode attention in the chain]
The 1 B Llama's decode attention takes 4.0 us timed alone and 5.5-6.0 in its plan's chain (go to
done, [Note: timeline]); its blocks land only as the QKV gemv's blocks leave (about 0.5 us before
its start), so what it requests before the wait is not hidden. Five changes were measured on an
H200 in session 36 (benchmarks/results/decode_chain_session36_h200.txt, the 4-layer decode plan,
alternating rounds) and none kept: the O projection without weight loads before its wait (PRE = 0)
runs the attention 0.9 us faster and itself 1.1 us slower (199.6 against 198.7 us); the attention
triggering the next launch after its cache reads instead of at its entry, 191.1 against 190.6; its
first tile requested before the positions are read (the dead rows zeroed once landed), 3.96 us alone
against 4.06 but its plan 195.5 against 193.3 (B8 244.2 against 241.4); CL = 0 (blocks that may land
early, 96 of 64 keys) 204.9 against 195.7; the QKV gemv without clusters 199.9. A preferred carveout
of 132 KB on every kernel lets some of the attention's blocks land earlier but not the last
(194.4 against 193.2; 100 KB 191.2; 164 KB 210.9, likely as the gemvs' loads in flight lose the L1 it
takes: a guess, not checked).
Session 50 (an H200, benchmarks/results/decode_session50_h200.txt): the step's timeline puts the keys scored
1.5 us after the query is staged (one 128-key tile a block), and the kernel timed alone, its 1.6 MB in L2, at 3.8 us
against 4.8-5.0 in the chain; so the QKV gemv before it was made to request both caches whole into L2 as its blocks
land (`cp.async.bulk.prefetch.L2`, thread 0 of each of its 768 blocks a share, before its wait). The 4-layer plan
replayed 160.0 us against 159.6 without it (7 alternating rounds, the same tokens; compute-sanitizer clean), and in
a 2-layer plan's timeline (call 8) the keys were scored 2.56 us after the go with the caches requested and without:
the tile's DRAM latency is not what the chain waits on, and the pass was not kept. What the 1.5-1.8 us from the
staged query to the scored keys is (one tile's products, scores, softmax and P·V in 4 warps, about 3000 cycles)
is the open question. The attention at 8 warps (16 keys a warp) ran the plan in 188.5 us against 165.4.
Session 57 (an H200; benchmarks/results/smem_config_session57_h200.txt, attention_carveout_session57_h200.txt,
qkv_attention_carveout_session57_h200.txt) found what decides where its blocks land: ncu puts the attention's
shared-memory configuration at 196 KB (two of its 94 KB blocks an SM, though its 48 blocks take one SM each)
and every gemv's at 16-32 KB, so an attention block fits on an SM only once the QKV's blocks have left it. After
the first layer's QKV (768 blocks, about 6 an SM) none lands early and its go comes 0.9-1.0 us after the QKV's
done; after the later layers' (384 blocks) 24-48 of the 48 land early and the go comes 0.35-0.5 us after, as at
the other boundaries (the 2-layer timelines of calls 1, 5 and 6). Preferring the configuration of one
block (a 44% carveout, 100 KB) left the gemvs whose blocks then land on those 48 SMs 156 KB of L1 instead of 60:
the 4-layer plan replayed 1.007-1.009x in two bundle pairs (9 rounds), the generate step 1.000x; the QKV at 44%
too 1.005x on the generate step, the QKV alone 0.921x; in the 2-layer timeline the attention's blocks still
landed as the QKV's left. Not kept. An attention whose shared memory fits the gemvs' 16 KB (its K/V tile through
registers, a thread's 4 KB of keys and values) could land during the QKV; not built.
Session 58 (an H200, benchmarks/results/attention_fills_o_session58_h200.txt, 9 alternating rounds) had each block, once
its keys and values had landed, request its share of the O projection's whole weight into L2 (thread 0, bulk requests of
64 KB), so that the DRAM would stream it from the attention's first microsecond instead of from the O's landing about
2 us later: the generate step 0.1605 ms against 0.1567 (0.976x), with the O's gate/up head at 8 / 12 MiB 0.1618 /
0.1656. In the 2-layer timeline the tile landed no later but the cluster met 4.1-4.35 us after the go against 3.3:
the merges, not the loads, waited. Not kept.
Session 52 (an H200, benchmarks/results/attention_phases_session52_h200.txt) stamped the key loop's steps (thread 0
of each block, the clock's 0.26 us steps, a 2-layer plan): query staged 0.8-1.0 us after the go, the tile landed 0.5
later, the scores 0.5, the softmax 0.25, P·V 0.25, the warps' merge 0.5-0.8, the cluster's barrier 0.5, the exit 0.5.
No step is long; each is a few hundred cycles of latency. Two guesses measured and dropped: (1) the code cold in the
instruction caches (29 KB of SASS, most of it run once a block): the same kernel with its copy loops not unrolled and
the dead in-loop prefetch of a one-tile chunk left out (21 KB) ran the 4-layer plan in 161.9 us against 162.9
(1.006x, 7 rounds) with the same phases; (2) each warp pushing its own (m, l, O) to the cluster, no block merge
(24 partials merged from the inbox): 167.0 against 163.4 us (9 rounds), its cluster met no sooner (the pushes are 8
remote stores a thread instead of 1) and its merge of 24 partials took 1.5 us instead of 0.5.

Parameter space: SPLITS (chunks of whole BN tiles: every distinct split of the key tiles, up to
MAX_SPLITS) x BN ∈ {32, 64, 128} x warps ∈ {4, 8}, BN at most the threads and at most MAX_RT
score rows a thread (MMA = 0, STAGES = 2); and MMA = 1 with BN ∈ {64, 128}, KW >= 16 and
STAGES ∈ {2, 4, 8} (at most a chunk's tiles plus one), where D and Dv are multiples of 16.
CL ∈ {0, 1} as above. Legal where the query is short (Sq <= MAX_SQ, R <= MAX_ROWS),
q/k/v are fp16/bf16 rows contiguous along the head dimension and 16-byte aligned (what `mma`
needs), and the mask is not the causal constant (which the tile units skip by tiles).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from aicfc.codegen import pdl
from aicfc.codegen.common import CTYPES, decompose, render
from aicfc.codegen.timeline import phase_mark
from aicfc.ir.decision import Kernel
from aicfc.ir.properties import Attention
from aicfc.ir.types import ITEMSIZE, TensorType

SPACE = {"BN": (32, 64, 128), "warps": (4, 8)}
MMA_SPACE = {"BN": (64, 128), "warps": (4, 8), "STAGES": (2, 4, 8)}
SMEM_LIMIT = 227 * 1024   # an sm_90 block's dynamic shared memory
MAX_SQ = 4          # query rows a head: a decode step, or a few speculative rows; longer queries fill
                    # the tile units' 64-row tiles (a prefill), where splitting the keys buys nothing
MAX_ROWS = 32       # query rows of one block (G·Sq)
MAX_RT = 8          # score rows a thread accumulates (ptxas spilled at 16: 32 rows, BN 64, 4 warps)
MAX_SPLITS = 64     # chunks per (batch, kv head): the combine's weights live in shared memory
MERGE_HELD = 16     # at most this many chunks, the merge holds a thread's O pair of each in registers
                    # ([Note: the merge's reads at once])
QREG_MAX = 4        # at most this many query elements a thread, they are held in registers while the new rows are
                    # requested ([Note: the new rows with the query]; 8 spilled 4 bytes: B2, 4 heads over 1, Sq 4)
CLUSTER_SPLITS = 8  # CL = 1: the chunks of a K/V head as one thread block cluster, at most the portable
                    # cluster size ([Note: split attention as a cluster])
LOG2E = 1.4426950408889634
PAD = 8             # elements added to a staged K/V row: rows 16·(odd) bytes apart, so the 8
                    # threads of one 16-byte load phase hit 8 different bank groups


@dataclass(frozen=True)
class Split:
    """The block structure: `kv` batch variables (K and V depend on them: one block per value
    and split), `group` variables (K and V ignore them: query heads sharing a K/V head), rows
    R = prod(group) · Sq."""

    kv: list[tuple[str, int]]
    group: list[tuple[str, int]]
    rows: int

    @property
    def nkv(self) -> int:
        return math.prod(n for _, n in self.kv)


def structure(att: Attention) -> Split:
    """A batch variable of extent > 1 that indexes neither K nor V is a group variable (after
    passes/read_grouped_heads.py, the query heads g of K/V head hk: h = G·hk + g)."""
    ext = att.out.extents()
    kv_vars = {v for ld in (att.k, att.v) for a in ld.index for v, _ in a.terms}
    kv, group = [], []
    for v in att.batch:
        (group if ext[v] > 1 and v not in kv_vars else kv).append((v, ext[v]))
    return Split(kv, group, math.prod(n for _, n in group) * ext[att.row])


def why_not(g, types: Mapping[str, TensorType], precision: str, causal: bool, why_not_mma) -> str | None:
    why = why_not_mma(g, types, precision)
    if why:
        return why
    rows = structure(g.att).rows
    if g.sq > MAX_SQ:
        return f"{g.sq} query rows a head (more than {MAX_SQ}): the tile units fill their tiles"
    if rows > MAX_ROWS:
        return f"{rows} query rows share each K/V row (more than {MAX_ROWS}): the tile units fill their tiles"
    if causal:
        return "the mask is the causal constant: the tile units skip its keys by tiles"
    return None


def chunk(sk: int, splits: int, bn: int) -> int:
    """Keys per split: whole BN tiles."""
    return math.ceil(math.ceil(sk / bn) / splits) * bn


def splits_of(sk: int, bn: int) -> list[int]:
    """Every distinct number of chunks of whole BN tiles (t tiles a chunk, t = 1.. all)."""
    kt = math.ceil(sk / bn)
    return sorted({math.ceil(kt / t) for t in range(1, kt + 1) if math.ceil(kt / t) <= MAX_SPLITS})


def space(g, dtype: str) -> list[dict]:
    rows = structure(g.att).rows
    out = []
    for bn in SPACE["BN"]:
        for w in SPACE["warps"]:
            p = {"unit": "split", "dtype": dtype, "BN": bn, "warps": w, "causal": 0, "MMA": 0, "STAGES": 2}
            if bn > 32 * w or thread_map(rows, g.dv, p)["RT"] > MAX_RT:
                continue
            out += [q for s in splits_of(g.sk, bn) for q in clustered({**p, "SPLITS": s})]
    if g.d % 16 or g.dv % 16:
        return out
    for bn in MMA_SPACE["BN"]:
        for w in MMA_SPACE["warps"]:
            if (bn // w) % 16:
                continue
            for s in splits_of(g.sk, bn):
                tiles = chunk(g.sk, s, bn) // bn
                for st in MMA_SPACE["STAGES"]:
                    p = {"unit": "split", "dtype": dtype, "BN": bn, "warps": w, "causal": 0, "MMA": 1,
                         "STAGES": st, "SPLITS": s}
                    out += [q for q in clustered(p)
                            if (st == 2 or st <= tiles + 1) and smem_bytes(rows, g.d, g.dv, q) <= SMEM_LIMIT]
    return out


def clustered(p: dict) -> list[dict]:
    """`p` with its partials merged through a ticket (CL = 0) and, where its chunks fit one portable
    cluster, through the cluster's shared memory (CL = 1, [Note: split attention as a cluster])."""
    return [p | {"CL": 0}] + ([p | {"CL": 1}] if 2 <= p["SPLITS"] <= CLUSTER_SPLITS else [])


def threads(p: Mapping) -> int:
    return 32 * p["warps"]


def thread_map(rows: int, dv: int, p: Mapping) -> dict[str, int]:
    """How the block's threads share the work. Scores: thread t takes key t % BN of the tile for
    rows t / BN + RS·k (RS = threads / BN, RT of them). P·V: column pairs R·Dv/2 (`pairs`); when
    there are fewer than threads, KS slices of the tile's keys each sum a part, merged at the
    end; NP pairs per thread. MMA = 1: warp w's keys KW = BN / warps, MI 16-row slices of rows;
    after the merge every thread holds NP whole pairs (KS = 1)."""
    t = threads(p)
    pairs = rows * dv // 2
    if p.get("MMA"):
        return {"RS": 0, "RT": 0, "pairs": pairs, "KS": 1, "NP": math.ceil(pairs / t),
                "KW": p["BN"] // p["warps"], "MI": math.ceil(rows / 16)}
    rs = t // p["BN"]
    ks = max(1, t // pairs)
    while p["BN"] % ks:
        ks //= 2
    return {"RS": rs, "RT": math.ceil(rows / rs), "pairs": pairs, "KS": ks, "NP": math.ceil(pairs / (t // ks))}


def smem_bytes(rows: int, d: int, dv: int, p: Mapping) -> int:
    esize = ITEMSIZE[p["dtype"]]
    staged = p.get("STAGES", 2) * p["BN"] * ((d + PAD) + (dv + PAD)) * esize
    stats = 4 * rows + rows * p["SPLITS"] + 1   # row_m, row_l, row_a, the weights, row_p, the ticket
    if p.get("MMA"):   # the query rows as 16-row slices, and every warp's (O, m, l) for the merge
        mi = math.ceil(rows / 16)
        base = staged + 16 * mi * (d + PAD) * esize + 4 * (p["warps"] * 16 * mi * (dv + 2) + stats)
    else:
        base = staged + 4 * (rows * d + rows * p["BN"] + stats + 2 * threads(p) + 3)
    return cluster_partial_at(base) + 4 * inbox_floats(rows, dv, p["SPLITS"]) if p.get("CL") else base


def cluster_why_not(p: Mapping, blocks: int, sms: int) -> str | None:
    """CL = 1 only where every block has an SM of its own ([Note: split attention as a cluster])."""
    if p.get("CL") and blocks > sms:
        return (f"{blocks} blocks in clusters of {p['SPLITS']}: more than the {sms} SMs (on an H200, 256 blocks "
                "in clusters of 4 ran 14.1 us against 9.1 through the ticket)")
    return None


def cluster_partial_at(base: int) -> int:
    """CL = 1: the byte offset of the block's inbox (`inbox_floats`), after the rest."""
    return -(-base // 16) * 16


def pairs_a_rank(rows: int, dv: int, splits: int) -> int:
    """CL = 1: the column pairs of the rows each chunk merges (PPR; the last may merge fewer)."""
    return math.ceil(rows * dv // 2 / splits)


def inbox_floats(rows: int, dv: int, splits: int) -> int:
    """CL = 1: a chunk's inbox, every chunk's share of the pairs it merges, then every chunk's (m, l) a row."""
    return splits * (2 * pairs_a_rank(rows, dv, splits) + 2 * rows)


def partial_floats(nkv: int, rows: int, dv: int, splits: int) -> int:
    """Scratch: every split's unnormalised rows (R x Dv), then its (m, l) per row."""
    return nkv * splits * rows * (dv + 2)


def render_kernel(k: Kernel, g, p: Mapping, sig, operands: dict, store: dict, live: str | None,
                  logit_lines: list[str], logit: str, name: str, writes: list[dict] = (),
                  position: tuple[list[str], str] | None = None) -> str:
    """`g`, `sig`, `operands`, `store`, `live`, the logits: what codegen/attention.py derived for
    every unit (the score expression in natural units)."""
    from aicfc.codegen.scratch import scratch
    sp = structure(g.att)
    idx = sig.index_type
    part, tickets = (sig.params[s.name] for s in scratch(k, p)) if p["SPLITS"] > 1 and not p.get("CL") else (None, None)
    tm = thread_map(sp.rows, g.dv, p)
    assert tm["KS"] == 1 or tm["NP"] == 1, tm
    return render("attention_split.cu.j2", name=name, signature=sig.text, idx=idx, T=CTYPES[p["dtype"]],
                  dtype=p["dtype"], threads=threads(p), warps=p["warps"], BN=p["BN"], SPLITS=p["SPLITS"],
                  CH=chunk(g.sk, p["SPLITS"], p["BN"]), R=sp.rows, SQ=g.sq, SK=g.sk, D=g.d, DV=g.dv,
                  PITCH=g.d + PAD, VPITCH=g.dv + PAD, NKV=sp.nkv, esize=ITEMSIZE[p["dtype"]], LOG2E=LOG2E,
                  kv_decompose=decompose("kvb", sp.kv, idx), row_decompose=decompose("r", sp.group + [("gi", g.sq)], idx),
                  q=operands["q"], k=operands["k"], v=operands["v"], o=store, live=live, logit_lines=logit_lines,
                  logit=logit, empty_rows_zero=g.att.empty_rows_zero, partials=part, tickets=tickets,
                  stats_at=sp.nkv * p["SPLITS"] * sp.rows * g.dv, writes=list(writes), PRE=p.get("PRE", 0),
                  PDL_MARK=pdl.MARK, PHASE=phase_mark, MMA=p.get("MMA", 0), STAGES=p.get("STAGES", 2), MERGE_HELD=MERGE_HELD, QREG_MAX=QREG_MAX,
                  CL=p.get("CL", 0), pos_lines=position[0] if position else None,
                  pos_value=position[1] if position else None, PPR=pairs_a_rank(sp.rows, g.dv, p["SPLITS"]),
                  CLP_AT=cluster_partial_at(smem_bytes(sp.rows, g.d, g.dv, {**p, "CL": 0})), JG=p.get("JG", 0), **tm)
