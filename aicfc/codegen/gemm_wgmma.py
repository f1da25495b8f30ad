"""The Hopper engine of the `gemm` family (sm_90a): warp-specialized `wgmma` fed by the TMA.

One producer warpgroup (a single thread of it issues every copy) brings the operand tiles in
with `cp.async.bulk.tensor` (128-byte swizzle) into a ring of STAGES shared-memory stages;
each stage has a `full` mbarrier (the copies' bytes landed: mbarrier transaction counts) and
an `empty` one (lane 0 of every consumer warp, past its wgmma wait for the stage). NWG consumer warpgroups issue
`wgmma.mma_async` m64nBNk16 (k8 for tf32) on descriptors of those tiles, keep one group in
flight, and write the epilogue straight from their accumulators. `setmaxnreg` moves registers
from the producer (PRODUCER_REGS) to the consumers (CONSUMER_REGS). Blocks are persistent:
CTAS blocks (at most one per SM) walk the output tiles in a raster of GROUP tile rows, and the
producer fetches the next tile's k-blocks while the consumers run the current epilogue.

Operand layouts come from the lowered access maps, as for `mma`: an operand contiguous along k
is loaded as K-major boxes (rows x 128 bytes); one contiguous along m (n) as MN-major boxes (BK
k-rows x 64 elements) read with wgmma's transpose bit (fp16/bf16 only: tf32 wgmma reads
K-major operands alone). Every other variable of the access is one more tensor-map dimension
(batch variables; broadcast ones have none). TMA zero-fills what lies outside the tensor, so
any M, N, K works without predicates or padding; what it needs is 16-byte strides and a
16-byte aligned start (`TensorMap.problems`), else the candidate is declined with the reason.

Parameter space: NWG in {1, 2, 3} consumer warpgroups of MI in {1, 2} m64 blocks (BM = 64·NWG·MI;
three only as [Note: three warpgroups] says);
OUT (the itemsize of the stored tensor where its rows can be written in 16-byte chunks, or 0):
the consumers stage the output tile in shared memory of their own and store whole sectors
(`gemm.staged_layout`), instead of each thread's two-column pieces from registers. Both are
candidates where staging is possible: a staged fp32 tile costs as much shared memory as the
ring (128x256 tf32 does not fit beside 3 stages), and a quad of threads' fp32 pairs already
fills a 32-byte sector, so the cost model charges register stores of 16-bit outputs alone the
half-sector penalty.
TS = 1 (with OUT > 0, where `output_map` finds the output's tensor map): the staged tile is laid
out as the TMA boxes of the output's map (BN·OUT/128 boxes of 128-byte rows by 64·MI rows, 128-byte
swizzled) and one thread of the warpgroup hands them to the TMA (`cp.async.bulk.tensor` shared ->
global, bulk groups), which writes whole lines and clips the tile at M and N; the warpgroup only
waits for the TMA to have read its staging before it stages the next tile. The output's map is
the kernel's third. Not with PP = 1: ping-pong tiles with TMA stores measured about a third
slower than staged stores (ResNet-50 B32's 1x1 GEMMs, 64x128 tiles: 22.2-23.1 us against
16.6-16.9; benchmarks/results/profile_resnet50_b32_session7_h100.txt), the stores apparently
holding up the other warpgroup's loads in the TMA unit; the cause is not measured further.
PP = 1 (ping-pong, NWG = 2): each warpgroup owns whole tiles of BM = 64·MI rows and the two take
a block's work units in turn, so one's epilogue runs under the other's k-blocks (the ring is
shared in unit order);
BN in {64, 128, 192, 256} (and, where B is K-major, a width between them: [Note: widths that fill the
SMs]), STAGES from 2 while the ring fits the shared memory; BK is one
128-byte swizzle row (64 fp16/bf16, 32 tf32). SPLITK: where the output tiles cannot fill the
SMs (fewer tiles than SMs, K long), a work unit is (tile, k-split); each split publishes its
fp32 partial tile to scratch and the last to take the tile's ticket adds them in split order
and runs the epilogue (the scratch buffers of `codegen/scratch.py`, as for `mma`). At most MAX_ACC fp32 accumulators per consumer
thread (MI·BN/2). CTAS = min(tiles, SMs).

STREAM = 1 (stream-k): where the tiles leave the last wave short (`stream_ok`), every one of the
SMs' blocks takes an even share of all tiles x KT k-blocks (block c from floor(c·total / CTAS)),
cut at tile boundaries into work units; a tile cut among several blocks (`stream_parts` at most)
is finished by the block holding its tail ([Note: the tail finishes]).
Correct on an H200 and an H100 (tests/test_gemm_wgmma.py, tests/test_conv_wgmma.py: 20 GPU cases) but slower
there than the data-parallel tiles on every shape measured: ResNet-50 B32's stage-4 1x1 GEMMs
14.8-21.9 us against 9.2-13.8, its 3x3 convolutions 20.4-29.5 against 15.0-20.1
(benchmarks/results/stream_k_session16_h200.txt). So it runs only under `--pin STREAM=1`
(passes/plan_schedules.py OPT_IN: explain lists the candidates with that reason); its cost terms
(cost_wgmma.stream_k) predicted those runs at 0.83-1.38 of what they measured.

[Note: stream-k in step]
Part of why stream-k lost: a box that many CTAs read at once comes through the TMA far faster
than one a CTA reads alone (benchmarks/prototypes/tma_taps.cu on an H200, session 30: a conv's
8 KB filter box, read by all 132 CTAs in step, added 0.03 us to a k-block whose 16 KB image box,
read by one CTA, took 0.40). Data-parallel tiles walk their k-blocks in step, so a B box is read
by every CTA of its tile column at once; stream-k's shares start anywhere in a tile, so the
blocks were at every k-block at once. A block now runs its last unit first: that unit starts at
its tile's first k-block, as every block's does, and the first unit (a tile's tail) follows, at
an offset of KT - share that every block shares, so all blocks stand at one of two k-blocks.
Measured (H200, benchmarks/results/tma_taps_session30_h200.txt, call 5, the tree before in the
same call): ResNet-50 B32's 7x7x512 3x3 convolution pinned to stream-k 22.7-24.5 us against
25.6-28.3, its 14x14x256 one 19.6-23.2 against 21.5-24.0, the GEMMs 1568x2048x512, 1568x512x2048,
6272x1024x256 and 1568x1024x512 13.7 / 16.1 / 14.1 / 11.7 us against 15.8 / 15.9 / 14.9 / 12.3; the data-parallel picks still run faster (16.8, 15.2, 9.3 us), so stream-k
stays opt-in. What is left is not measured apart (the fixups' fence, ticket and partial reads at
the end of every block).

[Note: the tail finishes]
A tile's parts ran through split-k's protocol: each part published its fp32 partial, fenced, took
the tile's ticket, and the last to take it read every part back (its own included) and ran the
epilogue, so every block fenced and waited on the ticket twice and wrote both of its partials.
But which part can finish is known before the launch: a block runs its last unit (a tile's head)
first and its first unit (the previous tile's tail) second ([Note: stream-k in step]), so a tile's
head ends early in its block and its tail late in the next; a part between them (where a tile spans
three or more blocks) is a block's whole share and ends with it. Now a part but the tail publishes its partial and counts itself
in (thread 0 fences after a barrier over the consumers' stores, then adds one to the tile's
counter) and goes on without waiting; the tail keeps its sums in registers, waits (thread 0,
`ld.acquire.gpu`) until the parts before it have counted, adds theirs in split order (the same
bits every run), zeroes the counter and runs the epilogue. A part only waits on blocks of lower
index, which the GPU placed before it, and CTAS is at most the SMs: every block is resident. On an
H100 (session 76, benchmarks/results/stream_k_session76_h100.txt, bundles of the tree before and
after each kernel alone, two rounds): ResNet-50 B32's 3x3 convolutions pinned to stream-k 8-11%
faster (28x28x128 22.7 -> 20.2-20.4 us, 14x14x256 21.3-21.4 -> 19.2, 7x7x512 26.8-26.9 -> 24.7-24.8
on 128x128 tiles; 21.9-22.0 -> 19.9 and 27.0-27.1 -> 25.1-25.2 on 64x128 ping-pong tiles), still
slower than the data-parallel tiles (16.3, 15.8, 18.5 us). The timeline's stamps (thread 0 of the
14x14x256's blocks, `aicfc compile --timeline`) say why: the median block's k-blocks ran 0.39 us
each where the 98 data-parallel tiles ran 0.32, 132 CTAs' boxes crossing the L2 at 10.6 TB/s, its
partial's publication took 2.3 us (the fence behind its stores), the wait 0.5, the read back 1.3,
the epilogue 0.8 ([Note: stream-k's terms] in planner/cost_wgmma.py).

[Note: the prologue before the wait]
In a plan of dependent launches ([Note: PDL] in codegen/pdl.py) a kernel's entry waits until the
kernel before it has completed; what comes before the entry runs while that kernel finishes, on
the SMs it has already left. This family's prologue touches nothing another kernel writes: the
ring's barriers in shared memory, the maps' fences and prefetches (written at load), the cluster's
first barrier. So the template puts the entry (pdl.MARK) after it, and a block whose SM is free
early (34 of 132 under a 98-tile grid) starts its first copies as soon as the wait returns. Measured
on an H100 (session 76, benchmarks/results/prologue_session76_h100.txt): ResNet-50 B32's plan, the
template before swapped in for the other bundle, 924.6 -> 914.2 us (7 alternating rounds, the
same bits); each kernel alone, back to back, its 14x14x256 3x3s 14.96-15.27 us where session 75's
profile on another H100 had 15.13-15.45.

[Note: epilogue prefetch]
An epilogue that reads a tensor of the output's size (a residual add: `gemm.extra_reads`) loads it
from registers after the tile's last k-block, so where a tile has a single k-block (ResNet's 1x1
convolutions from 64 channels) nothing of the tile covers that read's DRAM round trip, and the
other warpgroup's one k-block (ping-pong) covers little of it. For such tiles the producer thread
requests the tile's rows of that tensor into L2 (`cp.async.bulk.prefetch.L2`, one request per row
of min(BN, N - n0) elements, rows past M none) right after issuing the tile's k-block, up to
STAGES - 1 tiles before the consumers reach its epilogue, whose loads then hit L2. Rendered where the
rows are contiguous runs of whole 16-byte chunks (`gemm.prefetch_reads`), for unsplit tiles of one
k-block (`prefetches`). Nothing is waited for, so it changes no result.
Measured on ResNet-50 B32 (H200, each kernel alone, two rounds each against the same plan without
requests; benchmarks/results/epilogue_prefetch_session17_h200.txt): the 56x56 1x1s with the
residual add (K = 64, 64x256 ping-pong tiles) 42.8 -> 35.4 us, which is what the cost terms
predicted for them (35.3: the reads at the SM's L2 share). Tiles of 2, 4 and 8 k-blocks measured
slower with the row requests (22.1 -> 26.1, 15.8 -> 19.3, 11.0 -> 11.8 us: the requests, TMA
operations, queue with the k-blocks' copies in the SM's TMA unit) and no faster with one request
of the whole tile through a tensor map (+1-3%; the 56x56 ones 38.9 us); split tiles: most splits
never run the epilogue. The convolution family does not request (ResNet's residual adds land in
the 1x1 GEMMs the graph rewrites them into).

[Note: residual through the staging]
RS = 1 (a staged, unsplit tile whose epilogue reads one residual of the output's element size, along n
in whole 16-byte chunks: `gemm.staged_source`): at the start of each tile the consumer warpgroup copies
its rows of the residual into its own output staging with 16-byte `cp.async` (whole sectors, nothing
through registers), and the epilogue reads each pair of it from there, where it then stages its value:
every element is read and overwritten by the same thread. The copies land under the tile's k-blocks;
the warpgroup waits for them (`cp.async.wait_all`, then its barrier) just before the epilogue, and
syncs once more before copying in, since the last tile's copy-out reads the same staging. The
epilogue otherwise read the residual in the accumulators' layout, a quad of threads 16 bytes of a row,
each a 4-byte load: under ncu (H200, ResNet-50 B32's 14x14 1x1 with the residual add, 64x128 ping-pong
tiles of 4 k-blocks) the warps spent 43% of their cycles waiting on L1TEX with DRAM at 19% and L2 at
45% of peak. Not with TS (the staging is then the TMA's swizzled boxes) nor split-k (most splits never
run the epilogue); no L2 prefetch either (`prefetches`). Cost: the residual's bytes leave the
epilogue's term and join the tile's k-blocks (planner/cost_wgmma.py). RS is a key of every candidate
of such a kernel (0 or 1), so `--pin RS=0` keeps the epilogue's own loads for an A/B.
Measured on an H200 (benchmarks/results/residual_staging_session18_h200.txt: torchvision ResNet-50 B32,
each kernel alone, two alternating rounds against the --pin RS=0 plan): the 28x28 1x1s with the add
22.0-27.0 -> 17.5-20.0 us, the 14x14 ones 15.9 -> 14.4, the 56x56 ones (one k-block, which the L2
prefetch served before) 35.4 -> 34.1-34.6; the plan replayed in 981.5 us against 1022.3.
Session 83's timeline had the stage-4 expansions with the residual (128x208 cooperative tiles of 8
k-blocks, one a CTA) see their first k-block land 2.05 us after the go against 1.28-1.54 for the other
GEMMs, the residual's 53 KB a tile copied in with the ring's first boxes. Session 84 issued the copy
after the first k-block's products instead (cooperative tiles of 4 or more k-blocks): the B32 plan
831.6 us against 831.4 (7 rounds) and those two kernels 12.1 us alone against 11.6 at the start
(benchmarks/results/late_residual_session84_h100.txt). Not kept.

[Note: widths that fill the SMs]
Blocks are one a SM, so a GEMM of a few rows of tiles runs its tiles in one wave and leaves SMs idle:
ResNet-50 B32's stage 4 has 1568 rows (32 images of 7x7 pixels), 25 tiles of 64 rows, so 512 columns
in tiles of 128 are 100 tiles on 132 SMs. wgmma's n is any multiple of 8 up to 256, and a K-major B
is loaded as boxes of any number of rows, so where B is K-major the space also offers the width
`fill_widths` names: the narrowest multiple of 8 at which the rows of tiles still fit one wave (132 //
25 = 5 columns: ceil(512 / 5) = 103 -> 104, 125 tiles of which the last column is 96 wide), where it
makes more tiles than the standard width at or above it. Each tile's k-blocks then carry 104/128 of the
MMA work; its A box is the same. Not with a TMA store (TS: the staging is laid out as 128-byte boxes),
nor as a cluster pair (CLUSTER = 2 loads B as two boxes of BN/2 rows, which must be whole swizzle atoms);
an MN-major B (boxes of 64 columns) keeps the standard widths, so the transformers' GEMMs, whose weights
are re-laid out along n, never see one. The fill width is offered after the standard ones (a tie keeps the
standard width), and the cost terms decide.
Measured (session 37, an H200, torchvision ResNet-50 B32 fp16 --profile h200, one process;
benchmarks/results/fill_widths_session37_h200.txt): the planner moved 7 kernels of stage 4 to widths 104
or 208. Alone (`aicf-run --profile`): the 6272x512x1024 GEMM (256x104 tiles) 13.66 -> 12.40 us, past its
bar (53.6% of the tensor cores' peak); the 1568x2048x1024 projection (128x208) 18.02 -> 14.92; the 3x3
convolutions 16.1-16.2 -> 15.8-16.1 (their k-blocks wait on the im2col A box, which a narrower tile does
not shrink); the expanding 1x1s with the residual add 10.0 -> 9.7-9.8. In the plan's chain (timeline) the
3x3 convolutions gained 1.7-2.1 us each and the projection 3.0, but the kernels after them lost part of it:
the residual add after the first 3x3 ran 9.6 against 6.6 us, since its blocks no longer land early on the
SMs the 100-tile grid left free (the cost model does not see that), and stage 4 took 178.5 us from k44's start
against 183.4. The whole plan replayed the same, 819.6 against 819.9 us (15 alternating rounds), as did
EfficientNet-B0 B32's (four 1x1 GEMMs moved to 128x120: 965.5 against 965.0 us).

[Note: three warpgroups]
Tiles of 64 or 128 rows leave SMs idle where the rows of tiles do not divide into the SMs: ResNet-50 B32's
stage 2 has 25088 rows, 196 tiles of 128 rows at 128 columns on 132 SMs (the busiest SM runs two, the wave
74% full), stage 4's first 1x1 (6272 rows, 1024 -> 512 channels) 49 rows of tiles of 128. NWG = 3 consumer
warpgroups of one m64 block each make 192-row tiles: 131 of them at 128 columns in stage 2, one wave, each
SM's tensor work 0.75 of two 128-row tiles'. A block is 512 threads, so 128 registers a thread at launch;
`setmaxnreg` gives the producer 40 (56 in the convolution engine) and each consumer what is left, 152
(`consumer_regs`); the accumulators stay at WIDE_ACC (BN <= 128: 64 sums a thread). Offered cooperative only
(MI = 1, no ping-pong), unsplit, unclustered, without stream-k or TMA stores (`plain_only`: the forms not
run on a GPU with them), and in the convolution engine with A by the TMA alone: with the gathering producer
(128 threads gathering 192 rows) a staged 3x3 spilled 32 bytes within those 128 registers (ptxas, CUDA 13).
Measured on an H100 (session 80, benchmarks/results/three_warpgroups_session80_h100.txt, each kernel alone):
the stage-2 3x3 convolutions 15.8-15.9 -> 13.4 us (47% -> 55.6% of the tensor peak), stage 4's first 1x1
(6272 x 512, K 1024) 14.9 -> 11.9; the stage-3 3x3s as two k-splits of 192x128 in a cluster (132 CTAs) ran
18.1 us against 15.3 unsplit at 128x128, where [Note: k-splits as a cluster]'s terms had them 2.4 us faster
(predicted 14.6): not offered.

[Note: setmaxnreg's pool]
`setmaxnreg.inc` takes its registers from the CTA's own pool (PTX ISA: "a pool of available registers is maintained
per-CTA"; the instruction "blocks the execution until enough registers are available in the CTA's register pool"),
which holds what the block was launched with: threads x the kernel's registers, 168 x 384 = 64512 for a producer
and two consumer warpgroups, not the SM's 65536. So the producer's and the consumers' counts must sum within
that, or the consumers wait at their `setmaxnreg.inc` forever. 40 + 2 x 232 (and 56 + 2 x 224) fill 64512 exactly;
the gathering stem's 96 + 2 x 208 (codegen/conv_pool.py, session 87) asked for 65536: session 90's call of
`conv_round.sh s88q` (a fresh H100) ran out its 420 s with neither gathering plan's first run back, which this
explains (read after the call; no device time was left to run the fix). Every form now takes its consumers'
count from `consumer_regs` (96 + 2 x 200 for that stem; tests/test_setmaxnreg.py checks each).

[Note: images as rows]
FLAT = 1: a batched GEMM whose batch variable b (the one just outside m) steps every access of the
kernel by M times its step along m (`gemm.flat_var`: the operands, the epilogue's reads and the store;
not where a read is guarded or indirect, nor where a tensor is read at the same rows by every image) runs
as one GEMM of b·M rows: element (b, m) lies where element (0, b·M + m) does in every tensor, so the
kernel indexes them with b = 0 (`gemm.shape`; the codegen names b "0", the operands' and the output's
tensor maps lose b's dimension). A ResNet 1x1 convolution over channels-last images is such a GEMM: its
pixels are rows, and an image of 14x14 = 196 pixels leaves its second 128-row tile 53% empty, 49 of
them 77% (stage 4: 7x7). Offered where it leaves fewer tiles (every FLAT = 1 candidate has a FLAT = 0 twin;
FLAT is then a key of every candidate, so `--pin FLAT=0` is an A/B); the cost terms see the merged M.
Measured on an H200 (benchmarks/results/images_as_rows_session22_h200.txt, ResNet-50 B32 fp16): the
plan replayed in 886.8 us against 937.8 with `--pin FLAT=0` (9 alternating rounds; 903.7 against 958.1
in a second call); stage 3's 1x1s with the residual add 13.8 -> 9.7 us, its 1024 -> 256 ones 8.7 -> 7.8.

CLUSTER = 2: thread-block clusters of two CTAs (`__cluster_dims__(2, 1, 1)`, so the ordinary launch
and graph capture run them; CTAS = 2·min(pairs, SMs/2), even). The two CTAs of a cluster take the
two tiles of a *pair*: tile rows 2u and 2u + 1 of one tile column, so they share B's box and each
loads half of it with `.multicast::cluster` into both CTAs' shared memory (and its own A box as
usual). B is the shared operand because the tiles the planner picks for tall GEMMs (BM = 128,
BN = 192 or 256) have the larger B box, the raster already walks adjacent tile rows of one column,
and the weight is B in every transformer GEMM. A K-major B is then loaded as two boxes of BN/2 rows
(one per CTA); an MN-major B's BN/64 boxes alternate between the CTAs. Each CTA's `full` barrier
expects every byte landing in its stage (its A and all of B: STAGE_BYTES, as without clusters);
a consumer warp frees a stage in both CTAs (lane r arrives on CTA r's barrier through `mapa`),
since the peer's producer writes into it, so the `empty` barriers count the warps of both. Both CTAs sync the
cluster after barrier init. At the end no cluster barrier: the producer thread waits as if for STAGES more
stages (CUTLASS's producer tail), i.e. until both CTAs' consumers freed every stage's last use; then no arrival
of the peer is still on its way to this CTA's barriers and every multicast into it has landed, so it may exit.
(A cluster barrier there, arriving with release semantics, also waited for the epilogue's global stores: about
1.7 us a launch on the H100, the fixed cost that kept clusters from paying.) A pair whose second row lies past M runs the same
loads (the TMA zero-fills its A box, and the full barrier still counts the whole box) and stores
nothing (every store is guarded by gm < M). Not with SPLITK > 1: split-k only runs where the tiles
cannot fill the SMs, where L2 traffic is not what limits, and a ghost tile would need a scratch
slot and ticket of its own. Not in the gathering producer (conv_wgmma.py): always CLUSTER = 1.
Measured on an H100 (benchmarks/results/gemm_wgmma_h100_session5.txt): 128x192 tiles on 4096x768x768 10.46 us
clustered against 10.88 alone; planner/cost_wgmma.py says how it is charged.

[Note: k-splits as a cluster]
CL = 1 (SPLITK of CL_SPLITS, not ping-pong, not stream-k, CLUSTER = 1): the SPLITK splits of a tile are
the CTAs of one thread block cluster (`__cluster_dims__(SPLITK, 1, 1)`, rank = split), one work unit a
CTA (CTAS = tiles x SPLITK, at most `cl_ctas`: one wave of co-resident clusters), and the splits add
through distributed shared memory instead of split-k's scratch: once every consumer warp of a CTA is
past its last k-block the ring is free, so each split but the first leaves its accumulators there
(16-byte vectors, a warp's 32 contiguous); a cluster barrier (release / acquire) publishes them; the
first split adds them to its own in split order (`ld.shared::cluster`, the peers' rings through `mapa`)
and runs the epilogue; a second barrier keeps the peers' shared memory alive until it has read them.
Every thread of the cluster, producers included, takes both barriers. The sum is split-k's, bit for
bit ((0 + p0) + p1 ... in split order). No partials in global memory, no fence, no ticket.
The ring must hold the tile in fp32 (STAGES x stage bytes >= BM x BN x 4).
Measured on an H200 (session 26, each kernel alone; benchmarks/results/split_cluster_session26_h200.txt):
the same tiles and splits through scratch against as a cluster: ResNet-50 B32's 7x7x512 3x3 (128x128, 2
splits) 20.78 -> 19.07 us; ResNet-50 B1's 14x14x256 3x3, 6 splits through scratch 7.0 us against 4 as
a cluster 5.7-5.8; a 4-layer Llama prefill's down projection (512 x 5632 -> 2048, 2 splits) 25.1-25.4 ->
23.7-23.9 us on one machine but 24.9-25.5 -> 25.3-26.1 on another (calls 4 and 6): not a gain there. Against unsplit tiles it is the cost model's call (planner/cost_wgmma.split_terms):
the same prefill's QKV and O projections ran 13.2-14.2 and 9.6-10.3 us unsplit against 16.7-18.0 and
11.6-12.0 split, which the model called right only with [Note: the TMA's share of L2].

[Note: B resident in shared memory]
BRES > 0 (unsplit, unclustered, not stream-k; a B without a batch dimension of its own): the tiles are
walked column-fastest (GROUP = 1: tile t is column t mod TILES_N), so block c, taking tiles c, c + CTAS, ...,
visits only P = TILES_N / gcd(CTAS, TILES_N) columns of B (`b_panels`), in turn. Where the block walks more
tiles than P and P x KT k-blocks of B (BRES = P·KT, BN·128 bytes each) fit in shared memory past the ring
and the staging (`resident_at`, 1024-byte aligned), its first P tiles bring their B k-blocks into those
slots on the ring stage's own `full` barrier (the stage then expects A's bytes and B's), and every later
tile loads A alone and reads B from slot (tile ordinal mod P, kb). The ring's stages hold A alone. Under
ping-pong a warpgroup's first tile starts only after the other has waited for every stage of its own, so
the slots its tile reads landed on barriers one of the two waited for before a named barrier between them.
What it saves is B's bytes through the L2 and the SM's port once per tile: ResNet-50 B32's small-K 1x1
GEMMs load a B k-block of 16 KB beside an A one of 8 KB (the stage-3 expansions, 6272 x 256 -> 1024,
64x128 tiles: 64 KB of B a tile against 32 of A and 16 of the residual).
Cost: B's bytes leave the k-blocks' L2 term but for the block's first tiles (planner/cost_wgmma.py). Where a
DRAM-bound GEMM's time ties with B through the ring, the tie goes to fewer L2 bytes (plan_schedules._order).
Measured on an H100 (session 85, benchmarks/results/b_resident_session85_h100.txt; ResNet-50 B32, fp16): the
plan replayed 1.009-1.011x faster than with B through the ring everywhere (three machines, 7 of 7 alternating
rounds each, the same bits; ResNet-50 B32 against torch.compile 2.09x -> 2.13x). Alone: the stage-2 expansions
with the residual 23.0 -> 22.1 us, k16 (the stage-2 joined expansion, 6 k-blocks) 21.8 -> 20.7, the stage-1
ones 43.6 -> 42.8, the stage-3 expansions 13.15 -> 12.6 (aicfc tune: 10.81-11.09 against 11.03-11.41); the
stage-3 reduce GEMMs (16 k-blocks) and the transformers' GEMMs (12+ k-blocks of 128-256 columns) have no room
for it. Requesting the residual's rows into L2 before a resident tile's k-blocks (the producer, one request
a row, [Note: epilogue prefetch]) was measured and removed: the plan 0.947x, the 4-k-block tiles 2 us slower
each (the requests queue with the A boxes in the SM's TMA unit), the 1-k-block ones 0.8 us faster. Other
resident tiles for the stage-3 expansions measured slower alone: 64x256 ping-pong (BRES = 4, 3 stages) 13.5 us,
128x128 cooperative with TMA stores (BRES = 8) 18.0. MobileNetV2 B32 replayed 1.022x and EfficientNet-B0 B32
1.031x against the tree before (same bits). `--pin BRES=0` binds every candidate of a kernel whose space has the
key, so it also drops that kernel's mma and thin candidates: compare against the tree before instead.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping

from aicfc.codegen import pdl
from aicfc.codegen.cexpr import flat_offset
from aicfc.codegen.common import render
from aicfc.codegen.tma import Im2col, TensorMap
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine, Load
from aicfc.ir.types import ITEMSIZE, TensorType

TARGET = "sm_90"          # wgmma and setmaxnreg are sm_90a features: Hopper only
SPACE = {"NWG": (1, 2, 3), "PP": (0, 1), "MI": (1, 2), "BN": (64, 128, 192, 256), "STAGES": (2, 3, 4, 5, 6, 7, 8),
         "SPLITK": (1, 2, 3, 4, 6, 8), "CLUSTER": (1, 2), "TS": (0, 1)}
KSTEP = {"f16": 16, "bf16": 16, "tf32": 8}
ROW_BYTES = 128           # one swizzle row: BK·itemsize
GROUP = 8                 # tile rows per raster group
CL_SPLITS = (2, 4)        # k-splits that may be one cluster ([Note: k-splits as a cluster])
MAX_ACC = 128             # fp32 accumulators per consumer thread
PRODUCER_REGS, CONSUMER_REGS = 40, 232   # setmaxnreg with NWG = 2: 128·40 + 256·232 <= 65536
WIDE_ACC = 64             # fp32 accumulators per consumer thread with three warpgroups ([Note: three warpgroups])
SMEM_SLACK = 1024         # dynamic shared memory is aligned up to 1024 bytes in the kernel


def launch_registers(threads: int) -> int:
    """Registers a thread holds at launch under `__launch_bounds__(threads, 1)`: the SM's 64K over the block, in
    steps of 8, at most ptxas's 255 (what ptxas gives a kernel that moves registers with setmaxnreg: 168 for 384
    threads, 128 for 512; 255 for 256, which the hardware allocates as 256). The planner's register ceiling too
    (planner/cost.py)."""
    return min(255, 65536 // threads // 8 * 8)


def consumer_regs(nwg: int, producer: int, most: int) -> int:
    """The registers `setmaxnreg` gives each of `nwg` consumer warpgroups' threads: at most `most`, and no more than
    the block's launch registers leave after the producer warpgroup's `producer` ([Note: setmaxnreg's pool])."""
    threads = 128 * (nwg + 1)
    return min(most, (launch_registers(threads) * threads - 128 * producer) // (128 * nwg) // 8 * 8)


def tile_ok(nwg: int, pp: int, mi: int, bn: int) -> bool:
    """[Note: three warpgroups]: NWG = 3 only cooperative, of one m64 block each, at most WIDE_ACC sums a thread."""
    return nwg < 3 or (not pp and mi == 1 and bn // 2 <= WIDE_ACC)


def plain_only(nwg: int) -> bool:
    """[Note: three warpgroups]: NWG = 3 tiles are offered unsplit, unclustered, without stream-k or TMA stores."""
    return nwg > 2


def fill_widths(tiles_m: int, n: int, hw_sms: int) -> tuple[int, ...]:
    """[Note: widths that fill the SMs]: the narrowest tile width, a multiple of 8 between the
    standard widths, at which `tiles_m` rows of tiles still run in one wave, where it makes more
    tiles than the standard width at or above it (else none)."""
    per_row = hw_sms // max(tiles_m, 1)
    if per_row < 1:
        return ()
    w = math.ceil(math.ceil(n / per_row) / 8) * 8
    wider = [b for b in SPACE["BN"] if b >= w]
    if w < SPACE["BN"][0] or not wider or w in SPACE["BN"] or math.ceil(n / w) <= math.ceil(n / wider[0]):
        return ()
    return (w,)


def bk(dtype: str) -> int:
    return ROW_BYTES // ITEMSIZE["f32" if dtype == "tf32" else dtype]


def threads(p: Mapping) -> int:
    return 128 * (p["NWG"] + 1)


def block_m(p: Mapping) -> int:
    """A tile's rows: every consumer warpgroup's MI m64 blocks, or one warpgroup's (ping-pong)."""
    return 64 * p["MI"] * (1 if p.get("PP") else p["NWG"])


def stage_bytes(p: Mapping) -> int:
    """A ring stage: the A tile's k-block, and B's unless B is resident ([Note: B resident in shared memory])."""
    return (block_m(p) + (0 if p.get("BRES") else p["BN"])) * ROW_BYTES


def b_bytes(p: Mapping) -> int:
    """One k-block of a tile's B (BN rows of 128 bytes; a multiple of 1024 for any BN a multiple of 8)."""
    return p["BN"] * ROW_BYTES


def resident_at(p: Mapping) -> int:
    """Where the resident B k-blocks start: past the ring and the staging, on a 1024-byte boundary."""
    return _swizzle_aligned(p["STAGES"] * stage_bytes(p) + p["NWG"] * out_wg_bytes(p))


def _swizzle_aligned(n: int) -> int:
    """`n` bytes rounded up to the 128-byte swizzle's 1024-byte period (where a swizzled tile may start)."""
    return -(-n // 1024) * 1024


def b_panels(tiles_n: int, ctas: int) -> int:
    """The columns of tiles one block visits when tiles are walked column-fastest (n = tile mod tiles_n)
    and block c takes tiles c, c + ctas, ...: their period tiles_n / gcd(ctas, tiles_n)."""
    return tiles_n // math.gcd(ctas, tiles_n)


def out_wg_bytes(p: Mapping) -> int:
    """A consumer warpgroup's staging region for the output tile (0: stores from registers)."""
    return 64 * p["MI"] * (p["BN"] * p["OUT"] + 16) if p.get("OUT") else 0


def staging_row(p: Mapping) -> int:
    """The staging's row pitch in elements: BN and 16 bytes (the 8 rows a warp's pair store covers
    fall in different banks; every row starts 16-byte aligned)."""
    return p["BN"] + 16 // max(p.get("OUT", 0), 1)


def out_box(p: Mapping) -> tuple[int, int]:
    """(columns, rows) of one box of the output's tensor map (TS = 1): one 128-byte swizzle row of
    columns, a warpgroup's 64·MI rows; BN / columns boxes a warpgroup's tile."""
    return ROW_BYTES // p["OUT"], 64 * p["MI"]


def _used(p: Mapping) -> int:
    if p.get("BRES"):
        return resident_at(p) + p["BRES"] * b_bytes(p)
    return p["STAGES"] * stage_bytes(p) + p["NWG"] * out_wg_bytes(p)


def joined_at(p: Mapping) -> int:
    """Where a joined GEMM's weight starts (J2 of its columns x BN, 16-bit: [Note: a reduce joined into the
    epilogue] in passes/join_reduce.py): past everything else, on a 1024-byte boundary."""
    return _swizzle_aligned(_used(p))


def joined_boxes(p: Mapping) -> int:
    """A warpgroup's boxes of the joined GEMM's output (64 columns of 16 bits, 64·MI rows) in its staging."""
    return -(-p["J2"] // 64)


def joined_staging_at(p: Mapping) -> int:
    """Where the consumer warpgroups' stagings of the joined output start: past its weight (a multiple of 1024)."""
    return joined_at(p) + p["J2"] * p["BN"] * 2


def smem_bytes(p: Mapping) -> int:
    if p.get("J2"):
        return joined_staging_at(p) + p["NWG"] * joined_boxes(p) * 64 * p["MI"] * ROW_BYTES + SMEM_SLACK
    return _used(p) + SMEM_SLACK


def static_smem(p: Mapping) -> int:
    return 16 * p["STAGES"]


@dataclass(frozen=True)
class Operand:
    """How one operand's tiles are loaded and described to wgmma.

    `dims` are the tensor-map dimensions innermost first as (variable, extent, stride in
    elements); dims[0] is contiguous and is k (K-major) or the operand's m/n variable."""

    name: str                              # "a" or "b"
    var: str | None                        # m (a) or n (b) variable; None when its extent is 1
    rows: int                              # BM or BN
    k_major: bool
    dims: tuple[tuple[str, int, int], ...]
    offset: int                            # elements to element (0, ..., 0)
    esize: int
    BK: int
    KSTEP: int
    smem_at: int = 0                       # byte offset of this operand's tile in a stage
    halves: bool = False                   # K-major, shared by a cluster: two boxes of rows/2, one per CTA

    @property
    def map(self) -> str:
        return f"tma_{self.name}"

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def boxes(self) -> int:
        return (2 if self.halves else 1) if self.k_major else self.rows // 64

    @property
    def box(self) -> tuple[int, ...]:
        inner = (self.BK, self.rows // self.boxes) if self.k_major else (64, self.BK)
        return inner + (1,) * (self.rank - 2)

    @property
    def box_bytes(self) -> int:
        return self.box[0] * self.box[1] * self.esize

    @property
    def lbo(self) -> int:
        """Leading byte offset: unused by K-major tiles (1 unit), the next 64 columns otherwise."""
        return 16 if self.k_major else self.BK * ROW_BYTES

    desc = "aicf_wgg_desc"                 # the template's descriptor maker (128-byte swizzle)
    sbo = 1024                             # stride byte offset: 8 swizzled rows

    def block_at(self, i: str) -> str:
        """Byte offset of m64 block `i` (A only): 64 rows of 128 B, or the i-th 64-column box."""
        return f"({i}) * {64 * ROW_BYTES if self.k_major else self.BK * ROW_BYTES}"

    def kstep(self, kk: str) -> str:
        """Byte offset of k-step `kk`: 32 bytes along a K-major row, KSTEP rows of an MN-major box."""
        return f"({kk}) * {self.KSTEP * self.esize if self.k_major else self.KSTEP * ROW_BYTES}"

    def coords(self, k0: str, mn0: str, j: int) -> str:
        step = self.rows // self.boxes if self.k_major else 64
        at = f"{mn0} + {step * j}" if j else mn0
        first = (k0, at) if self.k_major else (at, k0)
        return ", ".join(first + tuple(f"(int){v}" for v, _, _ in self.dims[2:]))

    @property
    def describe(self) -> str:
        lay = "K-major" if self.k_major else "MN-major (transposed in wgmma)"
        return f"{lay}, {self.boxes} TMA box(es) of {'x'.join(map(str, self.box[:2]))} per stage, rank-{self.rank} map"

    def tensor_map(self, buffer: str, dtype: str) -> TensorMap:
        strides = tuple(s * self.esize for _, _, s in self.dims[1:])
        return TensorMap(buffer, dtype, self.offset, tuple(e for _, e, _ in self.dims), strides, self.box, ROW_BYTES)


def without(off: Affine, var: str | None) -> Affine:
    """`off` with `var` at 0 (FLAT = 1: the merged batch variable indexes nothing of its own)."""
    return off if var is None else Affine.of({v: x for v, x in off.terms if v != var}, off.const)


def operand(name: str, ld: Load, t: TensorType, var: str | None, extents: Mapping[str, int], K: int,
            batch: list[str], rows: int, dtype: str, merged: str | None = None) -> Operand | str:
    """The operand's staging, or why TMA cannot load it; `merged`: the batch variable FLAT = 1 takes
    as more rows of m (its images are rows of the operand's map: [Note: images as rows])."""
    off = without(flat_offset(ld.index, t), merged)
    esize = ITEMSIZE[t.dtype]
    k_major = off.coeff("r0") == 1
    if not k_major and (var is None or off.coeff(var) != 1):
        return f"operand {name.upper()} is contiguous along neither k nor {'m' if name == 'a' else 'n'}"
    if not k_major and dtype == "tf32":
        return f"operand {name.upper()} is {'M' if name == 'a' else 'N'}-major; tf32 wgmma reads K-major operands only"
    known = {"r0", *batch} | ({var} if var else set())
    if any(v not in known for v, _ in off.terms):
        return f"operand {name.upper()} is indexed by a variable outside m, n, k and the batch"
    ext = dict(extents) | {"r0": K}
    mn = (var, ext[var], off.coeff(var)) if var else ("_", 1, 0)
    kd = ("r0", K, off.coeff("r0"))
    first = (kd, mn) if k_major else (mn, kd)
    if first[1][2] == 0:   # an extent-1 m/n: any legal stride (it is never stepped)
        first = (first[0], (first[1][0], 1, -(-first[0][1] * esize // 16) * 16 // esize))
    rest = tuple((v, ext[v], off.coeff(v)) for v in batch if off.coeff(v) and ext[v] > 1)
    dims = first + rest
    if len(dims) > 5:
        return f"operand {name.upper()} needs a rank-{len(dims)} tensor map (TMA: at most 5)"
    mapdt = "f32" if dtype == "tf32" else dtype
    op = Operand(name, var, rows, k_major, dims, off.const, esize, bk(dtype), KSTEP[dtype])
    why = op.tensor_map("x", mapdt).problems()
    return f"operand {name.upper()}: {why}" if why else op


def output_map(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> TensorMap | str:
    """The output's tensor map for a TMA store (TS = 1), or why there is none: the staged layout
    (`gemm.staged_layout`: one stored tensor, contiguous along n, 16-byte chunks) indexed by m, n and
    the batch alone, at most 5 dimensions (n, m, the batch variables that step it)."""
    from aicfc.codegen.gemm import flat_merged, shape, staged_layout, store_target
    c, m, n, _, batch = shape(k, p)
    layout = staged_layout(k, types, n)
    if layout is None:
        return "the output cannot be staged (not one tensor contiguous along n in 16-byte chunks)"
    off, dt = layout
    off = without(off, flat_merged(k) if p.get("FLAT") else None)
    ext = dict(batch) | ({c.m: m} if c.m else {}) | {c.n: n}
    if any(v not in ext for v, _ in off.terms):
        return "the output is indexed by a variable outside m, n and the batch"
    esize = ITEMSIZE[dt]
    mdim = (m, off.coeff(c.m) * esize) if c.m and off.coeff(c.m) else (1, -(-n * esize // 16) * 16)
    rest = [(ext[v], off.coeff(v) * esize) for v, _ in batch if off.coeff(v) and ext[v] > 1]
    if len(rest) + 2 > 5:
        return f"the output needs a rank-{len(rest) + 2} tensor map (TMA: at most 5)"
    cols, rows = out_box({"OUT": esize, "MI": p["MI"]})
    tm = TensorMap(store_target(k, types)[0].out, dt, off.const, (n, mdim[0]) + tuple(e for e, _ in rest),
                   (mdim[1],) + tuple(s for _, s in rest), (cols, rows) + (1,) * len(rest), ROW_BYTES)
    why = tm.problems()
    return f"output: {why}" if why else tm


def operands(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> tuple[Operand | str, Operand | str]:
    from aicfc.codegen.gemm import flat_merged, shape
    c, m, n, kk, batch = shape(k, p)
    ext = k.ops[0].extents() | ({c.m: m} if c.m else {})
    names = [v for v, _ in batch]
    merged = flat_merged(k) if p.get("FLAT") else None
    a = operand("a", c.a, types[c.a.buffer], c.m, ext, kk, names, block_m(p), p["dtype"], merged)
    b = operand("b", c.b, types[c.b.buffer], c.n, ext, kk, names, p["BN"], p["dtype"], merged)
    if isinstance(a, Operand) and isinstance(b, Operand):
        # B's boxes follow A's in a stage, or start its resident slot ([Note: B resident in shared memory])
        b = dataclasses.replace(b, smem_at=0 if p.get("BRES") else block_m(p) * ROW_BYTES, halves=p.get("CLUSTER", 1) > 1)
    return a, b


def a_parts(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> list[dict]:
    """Where the kernel's A operand is a concatenation it computes in place ([Note: a concatenation read
    by k-blocks] in passes/join_concat.py), its inputs in k order, each {"op": the Operand its k-blocks
    load through (`tma_a` for the first, `tma_a2`, `tma_a3`, ... after), "c0": its first k, "map": its
    tensor map, "lines": for a strided subsample read through an im2col map, the producer's lines
    giving the tile's first pixel (cw{j}, ch{j}, cn{j}) from m0, else None}; [] otherwise."""
    if not k.inlined:
        return []
    from aicfc.codegen.common import decompose
    from aicfc.codegen.gemm import flat_merged, shape
    from aicfc.passes.join_concat import joined_parts
    c, m, _, _, batch = shape(k, p)
    ext = k.ops[0].extents() | ({c.m: m} if c.m else {})
    merged = flat_merged(k) if p.get("FLAT") else None
    mapdt = "f32" if p["dtype"] == "tf32" else p["dtype"]
    cat = next(i.op for i in k.inlined if c.a.buffer in i.names).type.shape
    out = []
    for j, (part, t) in enumerate(joined_parts(k, types)):
        name = "a" if j == 0 else f"a{j + 1}"
        if part.stride is None:
            op = operand(name, Load(part.buffer, c.a.index), t, c.m, ext, t.shape[-1], [v for v, _ in batch],
                         block_m(p), p["dtype"], merged)
            assert isinstance(op, Operand), op
            out.append({"op": op, "c0": part.c0, "map": op.tensor_map(part.buffer, mapdt), "lines": None})
            continue
        first = out[0]["op"]
        tm = subsample_map(part, cat, p["dtype"], first.box[1], types)
        (n, _, _, _), (sh, sw), (oh, ow) = part.image, part.stride, cat[1:3]
        lines = decompose("m0", [(f"tn{j}", n), (f"toh{j}", oh), (f"tow{j}", ow)], "int")
        lines.append(f"const int cw{j} = tow{j} * {sw}, ch{j} = toh{j} * {sh}, cn{j} = tn{j};")
        out.append({"op": dataclasses.replace(first, name=name), "c0": part.c0, "map": tm, "lines": lines,
                    "j": j})
    return out


def subsample_map(part, out: tuple[int, ...], dtype: str, rows: int, types: Mapping[str, TensorType]) -> TensorMap:
    """The im2col map of a concatenation's strided input (`join_concat.Part` with a stride): `rows` output pixels
    of 64 channels a box, a 1x1 walk of the image with the part's element strides over an output of `out`'s
    [N, OH, OW, C] pixels."""
    (n, h, w, ch), e, (sh, sw), (oh, ow) = part.image, ITEMSIZE[types[part.buffer].dtype], part.stride, out[1:3]
    return TensorMap(part.buffer, dtype, 0, (ch, w, h, n), (ch * e, w * ch * e, h * w * ch * e),
                     (ROW_BYTES // e, rows, 1, 1), ROW_BYTES,
                     Im2col((0, 0), ((ow - 1) * sw + 1 - w, (oh - 1) * sh + 1 - h), (1, sw, sh, 1)))


def why_not(k: Kernel, plan: Plan, dtype: str | None) -> str | None:
    """Why the Hopper engine cannot run this contraction (None when it can)."""
    if plan.target != TARGET:
        return f"wgmma and TMA are sm_90a features; the target is {plan.target}"
    if dtype is None:
        return None   # the precision policy's own reason is given for the tensor-core units
    a, b = operands(k, {"dtype": dtype, "NWG": 1, "PP": 0, "MI": 1, "BN": 64}, plan.types())
    for o in (a, b):
        if isinstance(o, str):
            return o
    return None


def space(k: Kernel, plan: Plan, dtype: str, hw_sms: int, smem_limit: int) -> list[dict]:
    from aicfc.codegen.gemm import dims, flat_var, staged_layout, staged_source
    _, m, n, kk, batch = dims(k)
    types = plan.types()
    layout = staged_layout(k, types, n)
    copies_in = staged_source(k, types, n) is not None
    out = ITEMSIZE[layout[1]] if layout else 0   # bytes per staged output element; 0: no staging
    tma_out = out and isinstance(output_map(k, {"MI": 1}, types), TensorMap)
    stores = [(out, 0)] + ([(out, 1)] if tma_out else []) + ([(0, 0)] if out else [])   # (OUT, TS)
    nb = math.prod(e for _, e in batch)
    # [Note: images as rows]: FLAT = 1 where the batch variable outside m may join it and that leaves
    # fewer tiles (the images' last tile rows are short); FLAT is then a key of every candidate
    merged = flat_var(k, types)
    eb = dict(batch)[merged] if merged else 1
    # [Note: widths that fill the SMs]: a K-major B (its box any multiple of 8 rows) may take a width
    # between the standard ones, offered after them (ties keep the standard width)
    b = operands(k, {"dtype": dtype, "NWG": 1, "PP": 0, "MI": 1, "BN": 64}, types)[1]
    b_k_major = isinstance(b, Operand) and b.k_major
    # [Note: B resident in shared memory]: only a B every tile reads the same (no batch dimension of its own)
    holds = isinstance(b, Operand) and b.rank == 2
    points, fills = [], []
    for nwg, pp in ((n, pp) for n in SPACE["NWG"] for pp in SPACE["PP"] if n > 1 or not pp):
        for mi in SPACE["MI"]:
            bm = 64 * mi * (1 if pp else nwg)
            flats = (0, 1) if merged and math.ceil(m * eb / bm) < eb * math.ceil(m / bm) else (0,)
            for fl, bn in ((fl, bn) for bn in SPACE["BN"] for fl in flats):
                if mi * bn // 2 <= MAX_ACC and tile_ok(nwg, pp, mi, bn):
                    points += _points((nwg, pp, mi, bn, bm), m * eb if fl else m, n, kk,
                                      nb // eb if fl else nb, dtype, hw_sms, smem_limit, stores, copies_in,
                                      holds, {"FLAT": fl} if merged else {})
            for fl in flats if b_k_major else ():
                mm, bb = (m * eb, nb // eb) if fl else (m, nb)
                for bn in fill_widths(math.ceil(mm / bm) * bb, n, hw_sms):
                    if mi * bn // 2 <= MAX_ACC and tile_ok(nwg, pp, mi, bn):
                        fills += _points((nwg, pp, mi, bn, bm), mm, n, kk, bb, dtype, hw_sms, smem_limit,
                                         [st for st in stores if not st[1]], copies_in,
                                         holds, {"FLAT": fl} if merged else {})
    out = points + fills
    # BRES is then a key of every candidate, so that --pin BRES=0 keeps B in the ring
    return [q if "BRES" in q else dict(q, BRES=0) for q in out] if any(q.get("BRES") for q in out) else out


def _points(tile: tuple[int, int, int, int, int], m: int, n: int, kk: int, nb: int, dtype: str, hw_sms: int,
            smem_limit: int, stores: list, copies_in: bool, holds: bool, extra: Mapping) -> list[dict]:
    """The candidates of one tile (NWG, PP, MI, BN, BM) over M x N x K and nb batches; `extra` joins every one;
    `holds`: B may stay resident ([Note: B resident in shared memory])."""
    nwg, pp, mi, bn, bm = tile
    points = []
    tiles = math.ceil(m / bm) * math.ceil(n / bn) * nb
    ktiles = math.ceil(kk / bk(dtype))
    for sk, cl in ((sk, cl) for sk in SPACE["SPLITK"] for cl in SPACE["CLUSTER"]):
        if plain_only(nwg) and (sk > 1 or cl > 1):
            continue
        per = math.ceil(ktiles / sk)
        if sk > 1 and (tiles * sk > 2 * hw_sms or tiles >= hw_sms or per < 2 or (sk - 1) * per >= ktiles):
            continue
        if cl > 1 and (sk > 1 or bn not in SPACE["BN"]):
            continue   # see the module note; a fill width's half box need not be whole swizzle atoms
        pairs = math.ceil(math.ceil(m / bm) / 2) * math.ceil(n / bn) * nb
        ctas = 2 * min(pairs, hw_sms // 2) if cl > 1 else min(tiles * sk, hw_sms)
        # stream-k (STREAM = 1): every SM takes an even share of all the k-blocks
        streams = (0, 1) if sk == 1 and cl == 1 and not plain_only(nwg) and stream_ok(tiles, ktiles, hw_sms) else (0,)
        for st, (o, ts), sm in ((st, o, sm) for st in SPACE["STAGES"] for o in stores for sm in streams
                                if not ((pp or plain_only(nwg)) and o[1])):
            p = {"unit": "wgmma", "dtype": dtype, "BM": bm, "BN": bn, "BK": bk(dtype), "NWG": nwg, "PP": pp,
                 "MI": mi, "OUT": o, "TS": ts, "STAGES": st, "SPLITK": sk, "CLUSTER": cl,
                 "CTAS": hw_sms if sm else ctas, "STREAM": sm, **extra}
            # [Note: B resident in shared memory]: unsplit, unclustered tiles whose block walks more tiles than
            # the columns of B it visits may hold those columns' k-blocks for the whole walk
            held = b_panels(math.ceil(n / bn), ctas) if holds and sk == 1 and cl == 1 and not sm else 0
            resident = [dict(p, BRES=held * ktiles)] if held and math.ceil(tiles / ctas) > held else []
            for point in [p] + resident:
                if smem_bytes(point) + static_smem(point) > smem_limit:
                    continue
                # [Note: residual through the staging]: where the epilogue has such a residual, RS
                # is a key of every candidate (so --pin RS=0 / RS=1 applies), 1 on staged, unsplit ones
                for q in with_cl(point, tiles, hw_sms):
                    points += ([dict(q, RS=0)] + ([dict(q, RS=1)] if o and not ts and sk == 1 and not sm else [])
                               if copies_in else [q])
    return points


def cl_ctas(sk: int, hw_sms: int) -> int:
    """The most CTAs clusters of `sk` k-splits are offered, so that they run in one wave: whole pairs
    of clusters (132 -> 132 CTAs for 2 splits, 128 for 4). An assumption about how the GPCs of 16 or
    18 SMs hold clusters of one block an SM: cuOccupancyMaxActiveClusters said 66 clusters of 2 on an
    H100 (planner/cost_wgmma.py); for 4 it was not asked, and the most measured is ResNet-50 B1's 26
    clusters of 4 (104 CTAs) in one wave (5.2 us, session 26)."""
    return hw_sms - hw_sms % (2 * sk)


def cl_ok(p: Mapping, tiles: int, hw_sms: int) -> bool:
    """Whether split candidate `p` (SPLITK > 1) may run its splits as one cluster (CL = 1):
    [Note: k-splits as a cluster]."""
    sk = p.get("SPLITK", 1)
    return (sk in CL_SPLITS and not p.get("PP") and not p.get("STREAM") and p.get("CLUSTER", 1) == 1
            and tiles * sk <= cl_ctas(sk, hw_sms)
            and p["STAGES"] * stage_bytes(p) >= 4 * p["BM"] * p["BN"])


def with_cl(p: dict, tiles: int, hw_sms: int) -> list[dict]:
    """A split candidate as split-k through scratch (CL = 0) and, where `cl_ok`, as a cluster (CL = 1,
    one CTA a work unit); unsplit candidates unchanged (no CL key)."""
    if p.get("SPLITK", 1) == 1:
        return [p]
    return [dict(p, CL=0)] + ([dict(p, CL=1, CTAS=tiles * p["SPLITK"])] if cl_ok(p, tiles, hw_sms) else [])


def group(p: Mapping) -> int:
    """Tile rows per raster group: GROUP, or 1 (column-fastest) where B is resident, so that a block's
    tiles visit only `b_panels` columns."""
    return 1 if p.get("BRES") else GROUP


def tiles(k: Kernel, p: Mapping) -> tuple[int, int, int]:
    """(tiles along m, along n, all tiles with the batch)."""
    from aicfc.codegen.gemm import shape
    _, m, n, _, batch = shape(k, p)
    tm, tn = math.ceil(m / p["BM"]), math.ceil(n / p["BN"])
    return tm, tn, tm * tn * math.prod(e for _, e in batch)


def pairs(k: Kernel, p: Mapping) -> tuple[int, int]:
    """(pairs of tile rows, all pairs with the tile columns and the batch): a cluster's work units."""
    from aicfc.codegen.gemm import shape
    _, m, n, _, batch = shape(k, p)
    pm = math.ceil(math.ceil(m / p["BM"]) / 2)
    return pm, pm * math.ceil(n / p["BN"]) * math.prod(e for _, e in batch)


def kt_per(p: Mapping, K: int) -> int:
    """k-blocks per split."""
    return math.ceil(math.ceil(K / p["BK"]) / p.get("SPLITK", 1))


def stream_share(q: int, total: int, ctas: int) -> int:
    """The block whose stream-k share holds k-block q of `total` (block c's starts at floor(c·total / ctas))."""
    return ((q + 1) * ctas - 1) // total


def stream_parts(tiles: int, kt: int, ctas: int) -> int:
    """Stream-k (STREAM = 1): the most blocks one tile's k-blocks are cut among, its scratch slots."""
    total = tiles * kt
    return max(stream_share((t + 1) * kt - 1, total, ctas) - stream_share(t * kt, total, ctas) + 1 for t in range(tiles))


def stream_ok(tiles: int, ktiles: int, hw_sms: int) -> bool:
    """Where stream-k is offered: the tiles leave the last wave short (tiles not a multiple of the SMs)
    and each block's share is at least two k-blocks."""
    return tiles % hw_sms != 0 and tiles * ktiles >= 2 * hw_sms


def prefetches(p: Mapping, K: int) -> bool:
    """Whether the producer requests the epilogue's residual rows into L2 ([Note: epilogue
    prefetch]): tiles of one k-block, unsplit, whose consumers do not copy the residual in (RS)."""
    return p.get("SPLITK", 1) == 1 and not p.get("STREAM") and not p.get("RS") and math.ceil(K / p["BK"]) == 1


def tensor_maps(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> list[TensorMap]:
    if p.get("unit") != "wgmma":
        return []
    from aicfc.codegen.gemm import dims
    c = dims(k)[0]
    a, b = operands(k, p, types)
    assert isinstance(a, Operand) and isinstance(b, Operand), (a, b)
    mapdt = "f32" if p["dtype"] == "tf32" else p["dtype"]
    inputs = a_parts(k, p, types)
    maps = [inputs[0]["map"] if inputs else a.tensor_map(c.a.buffer, mapdt), b.tensor_map(c.b.buffer, mapdt)]
    if p.get("TS"):
        out = output_map(k, p, types)
        assert isinstance(out, TensorMap), out
        maps.append(out)
    maps += [part["map"] for part in inputs[1:]]
    if p.get("J2"):   # the joined GEMM's output, stored by the TMA ([Note: a reduce joined into the epilogue])
        out = joined_map(k, p, types)
        assert isinstance(out, TensorMap), out
        maps.append(out)
    return maps


def joined_map(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> TensorMap | str:
    """The tensor map of the output of the GEMM joined into `k` (`Kernel.joined`), or why there is none: as the
    host's own (`output_map`), its rows the host's."""
    from aicfc.codegen.gemm import joined_kernel
    return output_map(joined_kernel(k), p, types)


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str, parts: Mapping) -> str:
    from aicfc.codegen.gemm import joined_kernel
    a, b = operands(k, p, types)
    assert isinstance(a, Operand) and isinstance(b, Operand), (a, b)
    inputs = a_parts(k, p, types)
    if inputs:
        a = dataclasses.replace(inputs[0]["op"], smem_at=a.smem_at)
    more = [dict(part, op=dataclasses.replace(part["op"], smem_at=a.smem_at), at=(3 if p.get("TS") else 2) + j)
            for j, part in enumerate(inputs[1:])]
    tm, tn, total = tiles(k, p)
    dtype = p["dtype"]
    return render("gemm_wgmma.cu.j2", name=name, batch=parts["batch"], M=parts["M"], N=parts["N"], K=parts["K"],
                  dtype=dtype, KSTEP=KSTEP[dtype], BM=p["BM"], BN=p["BN"], BK=p["BK"], NWG=p["NWG"], MI=p["MI"],
                  PP=p.get("PP", 0), CT=128 if p.get("PP") else 128 * p["NWG"],
                  OUT_WG_BYTES=out_wg_bytes(p), LDS=staging_row(p),
                  STAGES=p["STAGES"], CTAS=p["CTAS"], TILES=total, TILES_M=tm, TILES_N=tn, GROUP=group(p),
                  BRES=p.get("BRES", 0), RES_AT=resident_at(p), B_BYTES=b_bytes(p),
                  KT=math.ceil(parts["K"] / p["BK"]), STAGE_BYTES=stage_bytes(p), threads=threads(p),
                  TA=int(not a.k_major), TB=int(not b.k_major), a=a, b=b, idx=parts["idx"],
                  signature=parts["signature"], decompose=parts["decompose"], epilogue=parts["epilogue"],
                  paired=parts["paired"], staged=parts["staged"] if p.get("OUT") else None, SPLITK=p.get("SPLITK", 1), KT_PER=kt_per(p, parts["K"]),
                  partials=parts["partials"], tickets=parts["tickets"], ROT_D=parts["rotary"], PRODUCER_REGS=PRODUCER_REGS,
                  CONSUMER_REGS=consumer_regs(p["NWG"], PRODUCER_REGS, CONSUMER_REGS),
                  CLUSTER=p.get("CLUSTER", 1), PAIRS_M=pairs(k, p)[0], PAIRS=pairs(k, p)[1], CL=p.get("CL", 0),
                  STREAM=p.get("STREAM", 0), MAXPARTS=stream_parts(total, math.ceil(parts["K"] / p["BK"]), p["CTAS"])
                  if p.get("STREAM") else 0,
                  TS=store_coords(k, p, types) if p.get("TS") else None, MAPS=p.get("MAPS"), PDL_MARK=pdl.MARK,
                  prefetch=parts["prefetch"] if prefetches(p, parts["K"]) else (), copy_in=parts["copy_in"],
                  a_more=more, a_im2col=any(part["lines"] for part in more),
                  JOIN=dict(parts["joined"], AT=joined_at(p), ST=joined_staging_at(p),
                            ST_WG=joined_boxes(p) * 64 * p["MI"] * ROW_BYTES, map_at=(3 if p.get("TS") else 2) + len(more),
                            store=dict(store_coords(joined_kernel(k), p, types), boxes=joined_boxes(p)))
                  if p.get("J2") else None,
                  gather=None, im2col=None, halo=None)   # the TMA loads A too (codegen/conv_wgmma.py gathers it or loads it im2col)


def store_coords(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> dict:
    """What the template's TMA store needs: the boxes of a warpgroup's tile and the map's
    coordinates past (n, m), the batch variables that step the output."""
    out = output_map(k, p, types)
    assert isinstance(out, TensorMap), out
    from aicfc.codegen.gemm import shape, staged_layout
    c, _, n, _, batch = shape(k, p)
    off = staged_layout(k, types, n)[0]
    cols, rows = out_box(p)
    rest = [v for v, e in batch if off.coeff(v) and e > 1]
    return {"rank": len(out.dims), "cols": cols, "rows": rows, "boxes": p["BN"] // cols,
            "box_bytes": rows * ROW_BYTES, "batch": "".join(f", (int){v}" for v in rest)}
