"""The memory-bound half of the `gemm` family: `gemv`, a contraction of at most MAX_ROWS rows
(a decode step's projections: M = batch x 1 token) against a weight read exactly once.

At M <= 8 a GEMM moves K·N weight bytes for 2·M·K·N FLOPs: it is a stream of the weight, and its
time is the bytes over the bandwidth the kernel keeps in flight. Little's law sets the target:
4.25 TB/s (an H200's measured copy) x ~1 us of loaded DRAM latency is ~4 MB in flight, 32 KB on
each of 132 SMs. The kernel, over the ONNX [K, N] weight as relayout_weights keeps it for
fp16/bf16 (a one-row gemv's may be stored K-major instead: [Note: the gemv over a K-major weight]; contiguous along n: a k-row of a column tile is BN·2 >= 128 contiguous bytes, whole
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
  thread block cluster, whose other splits push their sums into rank 0's shared memory and leave, and
  rank 0 adds them in rank order ([Note: splits pushed to rank 0]; no global traffic); CL = 0 writes
  partial rows to the kernel's scratch and the last split to take a ticket adds them in split order
  (codegen/scratch.py);
- the epilogue runs from shared memory: paired stores, a gate's up column beside it, and the
  rotary map, whose partner column (half a head away) is in the block's tile because BN is a
  multiple of the head (`gemm.why_not_rotary`): `rb` = the tile's first column, `rc` = the
  column's 8-column block in it (the names `gemm.epilogue_value` reads).

Measured (benchmarks/results/gemv_h100.txt, an H100 SXM, decode shapes, each launch streaming
a weight not in L2): at M = 1 the large projections stream at 2.6-2.9 TB/s (gate/up 17.7 us,
LM head 45.0 us, cuBLAS 18.1 and 46.7), the small ones carry ~4 us of launch and tail (O-proj
6.8 us, cuBLAS 6.2); at M = 8 the kernel is 1.5-2x slower than cuBLAS: 181 registers at 8 rows
leave one block per SM, and the FMAs (8 a weight) are not hidden (cost_gemv's exposed term).

[Note: the gemv over a K-major weight]
A one-row gemv over the ONNX [K, N] weight needs split-k for parallelism: a block's BN columns are 128 bytes
of a k-row, so N = 2048 gives 32 column tiles, and the k-splits are merged across the blocks of a cluster.
`aicf-run --timeline` of a chain of such gemvs (session 47, benchmarks/results/gemv_kmajor_session47_h200.txt)
puts the median block's last weights at 2.05 us of a 2048 x 2048 gemv's 4.26 us in the chain and its merged
splits at 3.07: the weights stream at the DRAM's rate, then a microsecond goes to sums and merging. Stored
K-major ([N, K], relayout_weights.GEMV_RULE), a column's k-rows are contiguous: a block takes BN columns whole
(SPLITK = 1, KM = 1), warp w adds part w % KS of the k-rows of columns w / KS + j·(WARPS / KS), a lane U 16-byte
vectors a step with the next step loading (the weight's first step before the dependent-launch wait, as PRE
does), the lanes' sums by shuffles and the parts in order through shared memory (the same bits every run),
then the same epilogue from shared memory (residual, gate pairs, row scale, rotary: [Note: a rotary gemv over a
K-major weight]). 2-8 rows take the tensor-core steps, so their weights stay [K, N].
Measured on an H200 (session 47): a chain of twelve K-major gemvs (benchmarks/gemv_layout/kmajor.cu, BN 2 over
4 warps, U 4) ran 6.07 us a gemv against aicf's [K, N] plan of the same chain, 7.20 (both graph-replayed, PDL);
in the 1 B Llama's 4-layer decode plan every one-row gemv K-major ran 197.8 us against 179.2 (the gate/up and LM
head picks held too few bytes in flight and lost their L2 fill's head), the cost-chosen O and down projections
176.7 against 182.7, the down projections alone 174.2 (1.048x; the down 5.57 us alone against 8.00 over [K, N]).
So relayout_weights chooses it by the planner's prediction. Session 48 (an H200, benchmarks/decode_ab.py, the
4-layer plan, alternating rounds in one process; benchmarks/results/gemv_kmajor_session48_h200.txt): the rotary
QKV K-major too and the O projection after the decode attention K-major with the L2 fill as one bulk request a
run of its columns (PF = 1 here: a block's columns are contiguous rows of [N, K]) replayed 170.1 us against 173.1
(1.017x; the O's fill 0.7 us of it), then MB ([Note: the K-major gemv's register budget]) 164.5 against
173.2 (1.053x). The gate/up pairs' layout is the predictions' too (session 47: 17.7 us K-major against 12.6; with MB
about even, session 50, and on an H100 in session 72; the 1 B Llama's stay [K, N] by the terms, relayout_weights.
gemv_candidates). The K-major unit's predictions are not refitted: alone they ran 0.59-1.02 of the
prediction before MB, 0.63-0.91 with it (session 50's profile, where a weight under the L2's 50 MB is
partly read from L2 when the kernel repeats), and 0.62-0.82 in the plan's chain.

[Note: a rotary gemv over a K-major weight]
A rotary epilogue needs each column's partner half a head away (passes/rotary_epilogue.py); the [K, N] gemv gets it by
tiles of whole heads (BN a multiple of the head). Over a K-major weight a block's columns need not be contiguous:
where BN is under the head (BN | head, BN/2 even), block b takes RH = BN/2 columns of one head's first half and
the same RH of its second (head b / (head/BN), offset (b mod head/BN)·RH), so tile column j is weight column
hb + j mod RH + (j / RH)·head/2 and its partner is j ± RH in shared memory; `rb`, `rc` (the names
`gemm.epilogue_value` reads) come from the column itself. Paired stores keep (c, c + 1) in one half (RH even).
The 1 B Llama's QKV (3072 columns) then takes 768 blocks of 4 columns where blocks of whole heads would be 48:
alone 3.0-3.5 us against 4.1 over [K, N] (session 48's profile).

[Note: the K-major gemv's register budget]
ptxas schedules a K-major gemv for the occupancy its launch bounds allow: with `__launch_bounds__(threads)` alone it
held 32-45 registers and issued each weight vector one vector's adds before its use (SASS: the first step's loads,
then one load between every 8 FMAs), so a lane kept about U + 1 vectors in flight where the template asks for two
steps (2U); the grid never reaches that occupancy (the down projection's 1024 blocks of 128 threads are 8 an SM).
MB, the blocks the grid puts on its busiest SM (`km_blocks_per_sm`), goes into the launch bounds as their minimum
where it leaves a thread 64 registers or more: ptxas then keeps more of the next step's loads issued ahead (the down
projection's pick: 5 vectors ahead at 64 registers, 2 at 40). Measured (session 48, the 4-layer plan, 7 alternating
rounds): 164.5 us against 173.2 without MB (`AICF_GEMV_MINB=0`, an A/B's switch), the same plan's schedules.

[Note: splits pushed to rank 0]
With CL = 1 the SPLITK blocks of a column tile are one cluster and rank 0 adds their sums in rank
order. Until session 44 rank 0 pulled them: a cluster barrier once every block had its sums, rank 0
reading each peer's over `ld.shared::cluster` (a remote round trip), then a second barrier so that no
peer left while being read. `aicf-run --timeline`'s phases of the 1 B Llama's decode gemvs put 1.0-1.3
us between the median block's sums and the median rank 0's merged ones, on every gemv of the step.
Now each other split stores its BM·BN sums into its slot of rank 0's inbox (SPLITK - 1 slots of
static shared memory, counted in the space's bound) with 16-byte `st.shared::cluster`, arrives on the
cluster barrier with release semantics and leaves; rank 0 arrives, waits (acquire) and adds its own
sums and the inbox's in rank order: the same adds in the same order (bit-identical outputs), one
barrier phase and the remote reads fewer on rank 0's path. The barrier's first phase, arrived at the
kernel's start and waited before the push, makes sure rank 0 runs (its shared memory exists) before
anyone writes into it. A first form signalled rank 0 through an mbarrier in its shared memory (remote
arrives) and ran as fast (its phases: 0.8-1.0 us from the sums to the merge), but compute-sanitizer
racecheck, which does not follow mbarriers across CTAs, reported every push as a write into a block
that might have exited; the cluster barrier it follows (0 hazards). Measured on an H200 (session 44,
benchmarks/results/cluster_push_session44_h200.txt, benchmarks/decode_ab.py against the previous
commit's bundle, alternating rounds, one process): the 1 B Llama's 4-layer decode plan B1 189.2 us
against 192.1 (7 rounds; the mbarrier form 189.0 against 192.2), B8 231.3 against 239.7 (5 rounds),
the same tokens; the 20-layer B1 step 0.762 ms (session 43: 0.780-0.782).

[Note: gemv weights before the wait]
In a plan of dependent launches ([Note: PDL], codegen/pdl.py) a kernel's blocks sit on the SMs
while the kernel before it runs. Where the weight is a constant of the plan (no kernel writes
it), the gemv requests its first step of weight vectors before `griddepcontrol.wait`, and only
the activations wait (PRE = 1; the template puts pdl.MARK after those loads). Measured on an
H100, the 4-layer decode plan of benchmarks/generate.py's Llama, replayed as one graph, 5
alternating rounds: 280.6 us against 285.5 without (`benchmarks/results/gemv_prewait_session8_h100.txt`).
Prefetching more of the slice into L2 (`prefetch.global.L2`, 32 KB a block) made each gemv
faster timed alone but the plan slower: 295.7 us with the prefetch before the wait, 297.2 after
it, 318.8 with a rolling prefetch two steps ahead; so the kernel keeps no L2 prefetch. Measured again in
session 64 on the kernels of today (an H200, the 1 B Llama's 4-layer decode plan, 5 alternating rounds, one process;
benchmarks/results/ahead_ab_session64_h200.txt): each thread requesting its weight lines N steps past its own loads
into L2 (`prefetch.global.L2`, one request a 128-byte line, an experiment's switch since removed) replayed the plan
165.9 / 170.0 us with the [K, N] gemvs (the gate/up, the LM head) 2 / 4 steps ahead, 159.0 with the K-major ones
1 step ahead, 172.4 with both, against 151.6: more bytes requested in flight do not raise a gemv's stream. The
QKVs in blocks of 4 warps (768 blocks that fit one retiring down block's registers) replayed it in 151.5.
Nor do larger DRAM fetches a request (session 68, an H100, benchmarks/results/l2hint_session68_h100.txt; commit
e2045e0, an experiment's switch since removed): every weight vector loaded with the PTX prefetch size `.L2::256B`
(`ld.global.cs.L2::256B`: the L2 fetches the aligned 256 bytes around a missed sector) replayed the 4-layer B1
plan in 204.0 us against 196.4 (0.963x, 5 alternating rounds, the same tokens); alone at one row the QKV, O and
gate/up ran 4.67 / 3.71 / 16.97 us against 4.56 / 3.63 / 16.91, and past L1 (`ld.global.nc.L1::no_allocate.L2::256B`)
6.01 / 4.34 / 17.69. Not measured on an H200.
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
(`prefetch.global.L2`) 212.2 against 206.6. Session 43 (an H200, the same plan, 7 alternating rounds;
benchmarks/results/early_epilogue_session43_h200.txt) requested both register buffers' steps before
the wait (the O projection's whole slice: 2 steps of its 256 k-rows) with the residuals early: the
O projections so 190.1 us, the O and QKV 188.6, against 189.2 with one step; not kept.
Session 57 staged only the gate/up, whose blocks land while the split attention leaves the DRAM idle
([Note: the trigger before the wait] in passes/early_trigger.py): steps 1..ST of each thread's vectors
copied into static shared memory by 16-byte cp.async before the wait, the first streamed step requested
before the register and staged steps were added (an H200, the 4-layer plan, 7 alternating rounds;
benchmarks/results/gemv_stage*_session57_h200.txt). ST 1 / 2: 167.7 / 167.5 us against 158.5 (0.945x),
with an 8 MiB L2 head 171.7. The 2-layer timeline says why: 73 of the 352 blocks (35 KB of shared memory
each) landed early against all 352, as the SMs they land on run the O projection in a 16 KB shared-memory
configuration (ncu's launch__shared_mem_config_size: every gemv 16-32 KB, the split attention 196 KB;
benchmarks/results/smem_config_session57_h200.txt). With every kernel's preferred carveout at 100%,
343 blocks landed early and the gate/up's weights were streamed 7.94 us after its go against 9.22, but
every other gemv lost its L1 (the plan 178.8 us, the carveout alone 167.9, against 155.5); the carveout at
50% for all, or at 100% for the attention, O and gate/up alone, 0.85-0.93x. So no weights in shared memory.
The one exception is a K-major gemv whose blocks land in the sums and merges that end the gemv before it (the
down projection after the gate/up): it requests as many steps as that tail moves, in registers ([Note: steps
into the tail] in passes/tail_steps.py).
An RMSNorm folded into the gemv that reads it fared the same (session 14, an H200, branch
session14-fold-row-scale, benchmarks/results/fold_row_scale_session14_h200.txt): every block read
its rows once (the statistics and the activation) and scaled its sums before the epilogue, one
launch fewer per norm. Alone the folded kernels cost what the norm and the gemv cost apart (the
4-layer plan's kernels summed 202.7 us against 202.8), but the plan replayed in 249-256 us
against 215-218, with the activation re-read each step, staged in shared memory or in an L2
scratch. So the norms stay row passes of their own.

[Note: the gemv on tensor cores]
At 8 rows each weight element takes 8 FMAs (and its conversion): 1.44 GFLOP a layer of the 1 B
Llama, ~21 us at an H200's 67 TFLOP/s of fp32, so the SIMT steps run at the FMA pipe's pace and not
at the stream's (the 20-layer B8 decode step: 1.343 ms, 38% of its bandwidth limit, session 25).
With TC = 1 (rows >= TC_MIN_ROWS) the same stream feeds `mma.m16n8k16` with fp32 accumulators,
the weight as the A operand (W^T: 16 columns x 16 k-rows) and the rows as B (n = 8, rows past M
zero), so the products cost the tensor pipe a few percent of the stream's time:
- a warp's step is U chunks of 16 k-rows x SEG segments of 64 columns; lane (group, quad) of the
  fragment holds k-rows 4·quad + j (j < 4) at columns 8·group..+7 of a segment. The k order inside
  a chunk is free as long as A and B agree, so logical k-pair `quad` is physical rows 4·quad, +1 and
  logical `quad + 4` rows 4·quad + 2, +3; a byte permute pairs two k-rows of one column into an A
  register; accumulator i of a segment holds columns 8·group + 2i and + 1;
- the loads stay one 128-byte line per 8 lanes: lane 8·quad + group loads k-row 4·quad + j of
  columns 8·group, and one shuffle a register hands it to lane 4·group + quad. Loading in the
  fragment's own order put four lines under every 8 lanes. What that cost is not separated from
  the other changes made with the shuffle (session 27, an H200, the down projection 5632 x 2048 at
  8 rows): under ncu one schedule (BN 64, 8 warps, U 4, 4 splits as a cluster) ran 19.3 us before
  and 19.9 after, while its L1 throughput fell from 61% to 34% of peak (the SIMT kernel at one row:
  11.5 us, 21%); in benchmarks/gemv.py the fastest candidate went from 12.5 us to 9.5 (cuBLAS 11.1),
  at U = 2 and with the 8-byte activation loads and the refitted register count, and the 4-layer
  B8 plan from 276.1 to 239.4 us;
- a lane's four activations of its row are contiguous: one 8-byte load where `vector_rows`
  holds (the splits' k-ranges are then multiples of 16), else four 2-byte loads;
- the tail (warps' sums in shared memory, splits, epilogue) is the SIMT kernel's.
At one row the SIMT steps stream at the same rate (their FMAs are hidden), and they are the
measured ones, so TC is not a candidate there. Measured (benchmarks/results/gemv_tc_session27_h200.txt,
an H200): the 4-layer decode plan at B8 replayed 239.4 us against 325.7 with TC pinned off
(`benchmarks/decode_ab.py --batch 8`, 5 alternating rounds, one process); the 20-layer B8 step
1.009 ms (session 25: 1.343).

[Note: the tensor-core gemv over a K-major weight]
The tensor-core steps above read W as [K, N], so the A fragment (two k-rows of one column a register) is gathered by
a shuffle a register and byte permutes. Over W stored [N, K] (KM = 1, TC = 1, 2-8 rows) a lane's 16-byte vector
holds 8 k-rows of one column, and since the contraction adds over k, the mma's logical k may be any physical k as
long as the weight and the rows take the same: lane (group, quad) loads k-rows 8·quad..8·quad+7 of a 32-row chunk
of columns group and group + 8 of each 16-column tile, and of row `group` (rows past M zero), and those registers
are its A and B fragments as loaded, physical k 8·quad + 0..3 in one m16n8k16 and + 4..7 in the next. Block = T
tiles (BN = 16·T) whole over k, warp w a part of KP = K / WARPS k-rows (in 32-row chunks; KS = WARPS, so the warps'
sums meet in shared memory in warp order as the SIMT K-major form's parts do), U chunks in flight a warp, each
chunk's registers loaded again with the chunk U ahead once multiplied; no split, no cluster, the tail and the
epilogue (rotary through `colof` included) the K-major unit's. The loads are 16-byte vectors of 128-byte runs of
one column (4 lanes a column's 64 bytes). Written in session 65 while no device could be had and offered by
`--pin kmajor=tc` alone; session 67 (an H100) ran its GPU tests and memcheck clean, but its plan chose schedules
that ran 1.5x their predictions. Session 69 (an H200) timed its whole space at the 1 B Llama's four 8-row
projections, refitted its stream ([Note: the tensor-core gemv's stream] in planner/cost_gemv.py), and its weights
are now offered by default where 2-8 rows read them (relayout_weights; `--pin kmajor=one` as before): alone each
projection's measured best beat the [K, N] pick (QKV 5.30 us against 6.17, O 4.16 against 4.87, gate/up 12.20
against 15.47, down 8.50 against 9.56; benchmarks/results/tckm_fit_session69_h200.txt). In the 4-layer B8 decode
plan (3 alternating rounds, one process; benchmarks/results/tcbest_b8_session69_h200.txt) all four K-major with the
gate/up at BN 16, 8 warps, U 4 ran the generate step in 0.2239 ms against the [K, N] default's 0.2302 (replay
208.1 us against 212.0); with the old terms' gate/up pick (BN 32, 4 warps, U 4: 15.09 us alone) 0.2308 (replay
215.2). The refitted planner picks the gate/up's BN 16, 4 warps, U 4 (12.62 us alone against 12.59 at 8 warps),
the other three as measured; that exact plan has not yet run (`bash benchmarks/b8_round.sh
refit` is its A/B). In a plan the alone gains shrink: the four at those schedules gain 5.2 us a layer alone, and the
generate step gained 1.6 (the replay 1.0); with the old gate/up pick they gain 2.7 alone, and the step lost 0.15 (the
replay 0.8). Which of the four should be K-major in a plan is that A/B's to tell.

[Note: a norm's row scale in the gemv]
A decode step's RMSNorm is a kernel of one block between two gemvs: it reads the residual stream
h (2048 elements a row), adds its squares and stores h·r, r = 1/sqrt(mean(h²) + eps) (the norm's
weight g already folded into the projection's weight: passes/fold_column_scale.py). In the 1 B
Llama's 20-layer decode plan each of the 40 such kernels held the chain 1.2-2.8 us (session 24's
timeline), where the bytes it moves take a few nanoseconds. But r is one number a row, and
(h·r)·W = r·(h·W): the gemv that reads the norm may read h itself and scale its sums
(passes/fold_row_scale.py, ROW_SCALE_RULE). The kernel's ops are then the contraction over h,
the row statistic (the norm's own sum), the scaled sums (the norm's map with the sums in place of
h) and the epilogue. Every block adds the squares of whole rows, not only of its split's k-range:
right after the dependent-launch wait a thread requests RSV 16-byte vectors of each row (the row's
K/8 vectors over the block's threads, held in registers through the loop, so their round trip hides
under the weight stream), adds their elements' statistic after its last step, then a warp's lanes by
shuffles and the warps in warp order through shared memory (the same bits every run); the block
that runs the epilogue scales its tile's sums before it. Session 14 read the statistics in a
prologue before the loop and scaled every activation at every step: each folded kernel ran what the
norm and the gemv ran apart, and the plan replayed 19% slower (notes above); here the loop is the
plain gemv's. Offered where a thread's vectors of all rows fit in RSV_MAX (rows·K/8 over the
threads); the rewrite is a cost decision against the norm's kernel. Measured (session 35, an H200,
benchmarks/decode_ab.py, 5 alternating rounds, one process; benchmarks/results/row_scale_session35_h200.txt):
the 1 B Llama's 4-layer decode plan at B1 replayed 193.3 us against 201.2 before (the norms apart:
201.4), its scaled QKV projections alone 4.4 us as unscaled, and the 20-layer B1 step took 0.792 ms
(0.823 in session 28). At 8 rows, offered with RSV_MAX = 8 (a thread then holds 32 registers of rows),
the plan did not gain (240.5 us against 240.9): the scaled QKV and gate/up ran 0.6 and 1.1 us slower
alone, about what the two norms cost. Read after the loop instead (no register held, the unscaled
kernel's schedules; one L2 round trip a block exposed) the 8-row plan was slower still: 244.4 us against
241.3 (HEAD) and 240.6 (the norms apart), the kernels alone 227.5 against 223.4 us (call 6; tried, not
kept). A third form, session 64 (benchmarks/results/rowstat_b8_session64_h200.txt, commit 9eac58a, reverted): on
tensor cores each lane added the statistic's elements of the activations it loads for its own products (no row held,
no extra load), the quads and warps in order and a cluster's splits pushing theirs to rank 0 with the sums, so the
scaled QKV and gate/up kept the unscaled schedules (122 and 126 registers against 120 and 124): correct (the GPU tests
at B8 fp16 and bf16 against onnxruntime, memcheck 0 errors) and slower, the 4-layer 8-row plan 212.9 us against 210.0
with its norms apart (5 alternating rounds; the generate step 0.2303 ms against 0.2269). So 8 rows keep their norms,
which the planner's figures do not see (it predicts the 8-row folds faster: a one-row norm is predicted 2.8-3.4 us and
measures 1.0-1.7 alone; at 8 rows 1.05-1.11 us alone against 2.77, session 64's profile).
The model's final norm (after the last down projection, before the LM head) stays a row pass: it reads
the last residual sum, which inline_producers recomputes inside it (two buffers), so the fold declines.
Session 52 (an H200, benchmarks/results/final_norm_session52_h200.txt) tried storing that sum from the
down projection's epilogue, where the fold then took the norm into the LM head's gemv (predicted 33.08 us
against 35.75 for the two apart; the decode plan one kernel shorter): the 4-layer B1 plan replayed
163.8 us against 163.2 (9 alternating rounds, the same tokens) and the 20-layer step took 0.640 ms
(session 51: 0.634), so it was not kept. The norm's 2.8 us in the chain are not lost: the LM head's
500 blocks land while it runs and request their first weights then; the planner's figures miss that.

[Note: tables computed before the loop]
A rotary epilogue whose cos and sin are recomputed in it ([Note: a table recomputed where it is read] in
passes/inline_producers.py) has terms that read a table in memory (the position, the inverse frequencies)
and no accumulator (`gemm.table_terms`). They do not wait for the sums, so the threads that will run the
paired epilogue (one pair a thread: BM·BN/2 <= threads) compute them at their pair's two columns into
registers before the weight loop (`gemm.hoisted_tables`): before the dependent-launch wait where what they
read was written two or more launches back (EPRE = 1 from passes/early_epilogue.py, whose `early_reads`
names them), else right after the wait, where the thread's first weight step, requested before it, is
still in flight. The epilogue then reads the registers: its tail is the plain rotary map's.

Rows are the product of the output's m and batch variables (a decode step's [B, 1, N]: B rows),
which only the activations vary with. Requires: fp16/bf16 operands, B contiguous along n with
rows 16-byte aligned (N and the k stride multiples of 8 elements). Parameter space: SPACE, with
M·SEG·8 <= MAX_ACC accumulators, `held` <= MAX_HELD registers, WARPS·M·BN·4 bytes of shared
memory <= SMEM_MAX, each split at least one step of k-rows; TC = 1 adds TC_SPACE with `tc_held`
<= TC_MAX_HELD. Cost terms: planner/cost_gemv.py.
"""
from __future__ import annotations

import math
import os
from typing import Mapping

from aicfc.codegen import pdl
from aicfc.codegen.cexpr import flat_offset
from aicfc.codegen.common import CTYPES, render
from aicfc.codegen.timeline import phase_mark
from aicfc.errors import AicfError
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.properties import Contraction
from aicfc.ir.types import ITEMSIZE, TensorType
from aicfc.planner.hardware import Profile

MAX_ROWS = 8
VEC = 8            # columns of a 16-byte vector of fp16/bf16
SPACE = {"BN": (64, 128, 256, 512), "WARPS": (4, 8), "U": (4, 8), "SPLITK": (1, 2, 3, 4, 6, 8, 12, 16, 32), "CL": (0, 1)}
# Splits that may be one thread block cluster (at most 8 blocks, portable on sm_90): 2, 4 or 8. Clusters of 3 and 6 ran the gate/up 16.4-16.8 us
# where the same grid without them ran 13.4 (an H200, benchmarks/results/gemv_session15_h200.txt).
CLUSTER_SPLITS = (2, 4, 8)
MAX_ACC = 64       # fp32 accumulators per thread (BM x SEG x 8)
MAX_HELD = 192     # accumulators + two buffers of a step's weight vectors (4 registers each) and activations (1)
TC_MIN_ROWS = 2    # rows from which the tensor-core steps are candidates ([Note: the gemv on tensor cores])
TC_MAX_HELD = 200  # tc_held's bound: BN 256 (U = 1: 216) took 220-230 registers, one block of 128 threads an SM
SMEM_MAX = 48 * 1024 - 16   # static shared memory: the warps' partial rows (and rank 0's inbox), and the split's flag


def params(k: Kernel) -> dict | None:
    """Kernel `k`'s schedule parameters where it runs on this unit (a gemm kernel scheduled `gemv`), else None."""
    p = k.schedule.param if k.schedule is not None else {}
    return p if k.family == "gemm" and p.get("unit") == "gemv" else None


ROW_SCALE_RULE = "gemv(x·r, W) => gemv(x, W)·r (the norm's row scale in the gemv)"
RSV_MAX = 4        # 16-byte vectors of the rows a thread holds through the loop for the row statistic


def row_vectors(p: Mapping, kk: int) -> int:
    """16-byte vectors of one row a thread requests for the row statistic ([Note: a norm's row
    scale in the gemv]): the row's K/8 over the block's threads."""
    return -(-kk // (VEC * threads(p)))


def row_scale_fits(p: Mapping, kk: int) -> str | None:
    """Why schedule `p` cannot hold the rows of a row-scaled gemv (None: it can)."""
    held = p["BM"] * row_vectors(p, kk)
    if kk % VEC:
        return f"a row of {kk} elements is not whole 16-byte vectors"
    if held > RSV_MAX:
        return f"{held} vectors of the rows a thread, over {RSV_MAX}"
    return None


# [Note: the gemv over a K-major weight]: columns a block, k-parts a column (over the warps), vectors a lane a step
KM_SPACE = {"BN": (2, 4, 8, 16, 32, 64), "WARPS": (4, 8), "KS": (1, 2, 4, 8), "U": (2, 4)}
KM_MAX_STEPS = 32  # a warp's steps (columns x steps a column), unrolled in the template
KM_MB_REGS = 64    # registers a thread must keep for MB to be given ([Note: the K-major gemv's register budget])
PF_CHUNK = 64 * 1024   # bytes a bulk L2 request of a K-major block's slice ([Note: L2 fill]: PF = 1)
TC_SPACE = {"BN": (64, 128, 256), "U": (1, 2, 4)}   # the tensor-core steps' own (WARPS, SPLITK, CL as SPACE)
# [Note: the tensor-core gemv over a K-major weight]: 16-column tiles a block (BN = 16·T), U chunks of 32 k-rows a warp a step
TCKM_SPACE = {"T": (1, 2), "WARPS": (4, 8), "U": (1, 2, 4)}


def tc_held(seg: int, u: int) -> int:
    """Registers a tensor-core thread holds through its loop: 16 accumulators a 64-column
    segment, two steps of U chunks x SEG segments x 4 k-rows of 16-byte vectors, and 24 for
    their activations, the shuffled copies and the rest: with estimate_registers' 16 added,
    ptxas (CUDA 13) allocates within -22..+8 of it over the plain and rotary spaces at 3 and 8
    rows (U = 1: 66-71 for 72; U = 4: 188-192)."""
    return 16 * seg + 32 * u * seg + 24


def tc_k_major(p: Mapping) -> bool:
    """Whether schedule `p` runs the tensor-core steps over a K-major weight ([Note: the tensor-core gemv over a
    K-major weight])."""
    return bool(p.get("KM") and p.get("TC"))


def tckm_held(t: int, u: int) -> int:
    """Registers a tensor-core thread over a K-major weight holds through its loop: U chunks of two 16-byte weight
    vectors a tile and one of activations, 4 accumulators a tile, and 24 for the addresses and the rest (a guess
    until ptxas's counts are fitted: the register check reads what ptxas allocates)."""
    return 8 * u * t + 4 * u + 4 * t + 24


def k_part(kk: int, p: Mapping) -> int:
    """k-rows of a warp's part in a tensor-core gemv over a K-major weight: K over the warps, in whole 32-row chunks."""
    return -(-kk // (32 * p["WARPS"])) * 32


def one_pair_a_thread(p: Mapping) -> bool:
    """Whether the paired epilogue gives each thread at most one pair of columns (BM·BN/2 <= threads),
    as its operands read before the wait need ([Note: epilogue reads before the wait] in
    passes/early_epilogue.py: one register a read, loaded by the thread that adds it)."""
    return p["BM"] * p["BN"] // 2 <= threads(p)


def segments(p: Mapping) -> int:
    """Column segments a thread covers: 64 columns each on tensor cores, `lanes`'s SEG otherwise (one over a
    K-major weight: a lane's vectors run along k)."""
    if p.get("KM"):
        return 1
    return p["BN"] // 64 if p.get("TC") else lanes(p["BN"])[2]


def step_bytes(p: Mapping) -> int:
    """Weight bytes a thread requests per step of its loop (tensor cores over a K-major weight: two 16-byte
    vectors a 16-column tile a chunk)."""
    if tc_k_major(p):
        return p["U"] * p["BN"] * 2
    return p["U"] * segments(p) * (64 if p.get("TC") else 16)


def km_steps(p: Mapping, kk: int) -> tuple[int, int, int]:
    """(CPW, VPP, SPC) of a K-major schedule ([Note: the gemv over a K-major weight]): the columns a warp
    adds, the 16-byte vectors of a column's k-part, and the steps of U vectors a lane a part takes."""
    cpw = p["BN"] * p["KS"] // p["WARPS"]
    vpp = -(-kk // (VEC * p["KS"]))
    return cpw, vpp, -(-vpp // (32 * p["U"]))


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
    """k-rows a block covers per step of its loop (over a K-major weight, a column's k-part's step)."""
    if p.get("KM"):
        return 32 * p["U"] if p.get("TC") else 32 * p["U"] * VEC
    if p.get("TC"):
        return p["WARPS"] * 16 * p["U"]
    return p["WARPS"] * lanes(p["BN"])[1] * p["U"]


def registers(p: Mapping) -> int:
    """`held` (or `tc_held`) for the schedule `p`; over a K-major weight, the accumulators of a warp's
    columns and two steps' weight and activation vectors."""
    if tc_k_major(p):
        return tckm_held(p["BN"] // 16, p["U"])
    if p.get("KM"):
        return p["BN"] * p["KS"] // p["WARPS"] + 16 * p["U"]
    if p.get("TC"):
        return tc_held(segments(p), p["U"])
    return held(p["BM"], lanes(p["BN"])[2], p["U"])


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
    if off.coeff("r0") == 1:   # K-major ([Note: the gemv over a K-major weight])
        a = flat_offset(c.a.index, types[c.a.buffer])
        if 1 < rows < TC_MIN_ROWS:
            return f"{rows} rows: the gemv over a K-major weight is for one row or the tensor-core steps' {TC_MIN_ROWS}+"
        if kk % VEC or off.coeff(c.n) % VEC or off.const % VEC or any(x % VEC for v, x in off.terms if v not in (c.n, "r0")):
            return "gemv needs a K-major weight's columns in whole 16-byte vectors"
        if a.coeff("r0") != 1 or a.const % VEC or any(x % VEC for v, x in a.terms if v != "r0"):
            return "gemv over a K-major weight needs the row contiguous along k in 16-byte vectors"
        return None
    if off.coeff(c.n) != 1 or off.coeff("r0") % VEC or off.const % VEC or n % VEC or any(
            x % VEC for v, x in off.terms if v not in (c.n, "r0")):
        return "gemv needs the weight contiguous along n in 16-byte rows"
    return None


def k_major(k: Kernel, types: Mapping[str, TensorType]) -> bool:
    """Whether the gemv's weight is K-major (a column's k-rows contiguous)."""
    from aicfc.codegen.gemm import dims
    c = dims(k)[0]
    return flat_offset(c.b.index, types[c.b.buffer]).coeff("r0") == 1


def space(m: int, n: int, kk: int, early: bool = False, km: bool = False, hw: Profile | None = None) -> list[dict]:
    """`m`: every row, the batch variables' included (BM: all of them); `early`: the weight is a
    constant of the plan, so its first bytes are requested before the dependent-launch wait
    (PRE = 1, [Note: gemv weights before the wait]); `km`: the weight is K-major (`km_space`, on `hw`'s SMs)."""
    if km:
        return km_space(n, kk, early, hw) if m == 1 else tckm_space(m, n, kk, early)
    out = []
    for bn in SPACE["BN"]:
        seg = lanes(bn)[2]
        if m * seg * VEC > MAX_ACC:
            continue
        for warps in SPACE["WARPS"]:
            if warps * m * bn * 4 > SMEM_MAX:
                continue
            for u in SPACE["U"]:
                if held(m, seg, u) <= MAX_HELD:
                    out += _splits({"unit": "gemv", "TC": 0, "BM": m, "BN": bn, "WARPS": warps, "U": u}, kk, early)
    if m >= TC_MIN_ROWS:
        out += _tc_space(m, kk, early)
    return out


def km_blocks_per_sm(n: int, p: Mapping, hw: Profile | None) -> int:
    """MB ([Note: the K-major gemv's register budget]): the blocks the grid puts on its busiest SM, given to ptxas as
    the launch bounds' minimum where `hw`'s SM holds that many blocks with KM_MB_REGS registers a thread; 0 (no hint)
    otherwise, without a profile, or where AICF_GEMV_MINB=0 (an A/B's switch)."""
    if hw is None or os.environ.get("AICF_GEMV_MINB", "1") == "0":
        return 0
    mb = math.ceil(math.ceil(n / p["BN"]) / hw.sm_count)
    fits = mb * threads(p) * KM_MB_REGS <= hw.registers_per_sm and mb * threads(p) <= hw.max_threads_per_sm
    return mb if fits else 0


def km_space(n: int, kk: int, early: bool, hw: Profile | None = None) -> list[dict]:
    """[Note: the gemv over a K-major weight]: one row, BN columns a block over WARPS warps, each column's k-rows in
    KS parts (KS divides WARPS, and BN is whole columns for every warp), at most KM_MAX_STEPS steps a warp; MB the
    launch bounds' blocks an SM (`km_blocks_per_sm`)."""
    out = []
    for bn in KM_SPACE["BN"]:
        for warps in KM_SPACE["WARPS"]:
            for ks in KM_SPACE["KS"]:
                if warps % ks or bn * ks % warps or bn * ks < warps:
                    continue
                for u in KM_SPACE["U"]:
                    p = {"unit": "gemv", "KM": 1, "TC": 0, "BM": 1, "BN": bn, "WARPS": warps, "KS": ks, "U": u,
                         "SPLITK": 1, "CL": 0}
                    cpw, _, spc = km_steps(p, kk)
                    if cpw * spc > KM_MAX_STEPS or (bn > n and bn > 2):
                        continue
                    mb = km_blocks_per_sm(n, p, hw)
                    out.append(p | ({"PRE": 1} if early else {}) | ({"MB": mb} if mb else {}))
    return out


def tckm_space(m: int, n: int, kk: int, early: bool) -> list[dict]:
    """[Note: the tensor-core gemv over a K-major weight]: `m` rows (2-8), T tiles of 16 columns a block, every warp
    a part of k (KS = WARPS), U chunks of 32 k-rows a step; no split."""
    out = []
    for t in TCKM_SPACE["T"]:
        if 16 * t > max(16, n):
            continue
        for warps in TCKM_SPACE["WARPS"]:
            if warps * m * 16 * t * 4 > SMEM_MAX:
                continue
            for u in TCKM_SPACE["U"]:
                p = {"unit": "gemv", "KM": 1, "TC": 1, "BM": m, "BN": 16 * t, "WARPS": warps, "KS": warps, "U": u,
                     "SPLITK": 1, "CL": 0}
                if tckm_held(t, u) <= TC_MAX_HELD:
                    out.append(p | ({"PRE": 1} if early else {}))
    return out


def rotary_half_block(p: Mapping, head: int | None) -> int:
    """RH: the columns a K-major block takes from each half of a rotary head where BN is under the head
    ([Note: a rotary gemv over a K-major weight]); 0 where its columns are contiguous."""
    return p["BN"] // 2 if p.get("KM") and head and p["BN"] < head else 0


def _splits(tile: dict, kk: int, early: bool) -> list[dict]:
    """`tile` with each split of SPACE (CL = 1 where the splits may be a cluster), each split at
    least one step of k-rows."""
    out = []
    for sk in SPACE["SPLITK"]:
        for cl in SPACE["CL"]:
            if cl and sk not in CLUSTER_SPLITS:
                continue
            p = tile | {"SPLITK": sk, "CL": cl}
            if cl and partial_bytes(p) > SMEM_MAX:   # rank 0's inbox too
                continue
            if early:
                p["PRE"] = 1
            if sk == 1 or math.ceil(kk / sk) >= k_step(p):
                out.append(p)
    return out


def _tc_space(m: int, kk: int, early: bool) -> list[dict]:
    """[Note: the gemv on tensor cores]: BN of 64-column segments, U 16-row k-chunks a warp a step."""
    out = []
    for bn in TC_SPACE["BN"]:
        for warps in SPACE["WARPS"]:
            if warps * m * bn * 4 > SMEM_MAX:
                continue
            for u in TC_SPACE["U"]:
                if tc_held(bn // 64, u) <= TC_MAX_HELD:
                    out += _splits({"unit": "gemv", "TC": 1, "BM": m, "BN": bn, "WARPS": warps, "U": u}, kk, early)
    return out


def partial_bytes(p: Mapping) -> int:
    """The warps' partial rows; in a cluster, rank 0's inbox of the other splits' sums too ([Note: splits
    pushed to rank 0])."""
    inbox = (p["SPLITK"] - 1) if p.get("CL") else 0
    return 4 * (p["WARPS"] + inbox) * p["BM"] * p["BN"]


def static_smem(p: Mapping) -> int:
    """The partial rows (`partial_bytes`) and the split's flag."""
    return partial_bytes(p) + 16


def threads(p: Mapping) -> int:
    return 32 * p["WARPS"]


def k_per_split(kk: int, p: Mapping) -> int:
    """k-rows a split covers; on tensor cores a multiple of 16, so that every lane's four k-rows
    start 8-byte aligned (`vector_rows`)."""
    per = math.ceil(kk / p["SPLITK"])
    return -(-per // 16) * 16 if p.get("TC") and p["SPLITK"] > 1 else per


def vector_rows(c: Contraction, types: Mapping[str, TensorType]) -> bool:
    """Whether a tensor-core lane may read its four activations of a row (k-rows kb..kb+3, kb a
    multiple of 4) as one 8-byte load: the activation `c.a` is contiguous along k and every other
    stride and its offset are multiples of 4 elements."""
    off = flat_offset(c.a.index, types[c.a.buffer])
    return off.coeff("r0") == 1 and off.const % 4 == 0 and all(x % 4 == 0 for v, x in off.terms if v != "r0")


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str, parts: dict) -> str:
    from aicfc.codegen.common import decompose
    from aicfc.codegen.gemm import dims
    c, m, _, _, batch = dims(k)
    rows = decompose("row", list(batch) + [("gm", m)], parts["idx"])   # the row's batch variables and gm
    ln, rw, _ = lanes(p["BN"]) if not p.get("KM") else (32, 1, 1)
    seg = segments(p)
    cpw, vpp, spc = km_steps(p, parts["K"]) if p.get("KM") and not tc_k_major(p) else (0, 0, 0)
    if p.get("PRE", 0) > 1 and (not p.get("KM") or tc_k_major(p)):   # passes/tail_steps.py offers more steps to K-major gemvs alone
        raise AicfError(f"internal: {name}: PRE = {p['PRE']} steps before the wait needs a K-major weight on "
                         f"the SIMT steps (KM = 1, TC = 0)")
    if p.get("JOIN") and not (p.get("KM") and p["SPLITK"] == 1 and p.get("KS") == 1 and not parts["rotary"]
                              and parts["row_scale"] is None):   # passes/join_launches.why_not never asks for it
        raise AicfError(f"internal: {name}: a joined gemv needs a K-major weight in one split and one part a column, "
                        f"without a rotary or row-scaled epilogue")
    if parts.get("early") and not one_pair_a_thread(p):   # passes/early_epilogue.why_not never asks for it
        raise AicfError(f"internal: {name}: epilogue reads before the wait need one pair a thread, "
                        f"{p['BM']}x{p['BN']} over {threads(p)} threads")
    return render("gemm_gemv.cu.j2", name=name, threads=threads(p), TC=p.get("TC", 0), BM=p["BM"], BN=p["BN"], WARPS=p["WARPS"],
                  KM=p.get("KM", 0), KS=p.get("KS", 1), CPW=cpw, VPP=vpp, SPC_=spc,
                  T=p["BN"] // 16, KP=k_part(parts["K"], p) if tc_k_major(p) else 0,
                  AVEC=bool(p.get("TC")) and vector_rows(c, types),
                  SPLITK=p["SPLITK"], CL=p.get("CL", 0), LN=ln, RW=rw, SEG=seg, U=p["U"], KSTEP=k_step(p), KPER=k_per_split(parts["K"], p),
                  PRE=p.get("PRE", 0), PF=p.get("PF", 0), LINES=-(-p["BN"] * ITEMSIZE[types[c.b.buffer].dtype] // 128),
                  LINE_ELEMS=128 // ITEMSIZE[types[c.b.buffer].dtype], PDL_MARK=pdl.MARK, PHASE=phase_mark, RSV=row_vectors(p, parts["K"]),
                  TA=CTYPES[types[c.a.buffer].dtype], TB=CTYPES[types[c.b.buffer].dtype], rows=rows, ROT_D=parts["rotary"],
                  RH=rotary_half_block(p, parts["rotary"]), PF_CHUNK=PF_CHUNK, MB=p.get("MB", 0),
                  JOIN=bool(p.get("JOIN")), JOIN_FIRST=p.get("JOIN", 0), JOIN_BLOCKS=-(-parts["N"] // p["BN"]), JG=p.get("JG", 0),
                  **{x: parts[x] for x in parts if x not in ("c", "rotary", "M")})
