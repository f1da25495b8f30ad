#!/usr/bin/env bash
# Session 11's GPU rounds for issue 17 (each one device call, under 10 minutes); logs to $OUT (the device tool's
# output folder), or /tmp/out.
#   bash benchmarks/conv_round.sh unfold   # the unfolded stem and conv split-k: tests, memcheck; ResNet-50 B32
#                                          # checked and profiled with and without the unfolded stem; split-k A/B
#   bash benchmarks/conv_round.sh halo     # image tiles (A = halo): tests, memcheck; ResNet-50 B32 checked and
#                                          # profiled; the 3x3 convolutions by cost, im2col and halo, pinned
#   bash benchmarks/conv_round.sh final    # ResNet-50 B32 checked and profiled; ResNet-50 B32 and B1 against
#                                          # torch.compile(mode="reduce-overhead") (benchmarks/models.py)
#   bash benchmarks/conv_round.sh h100     # session 73's open questions (on an H100): ResNet-50 B32 profiled twice
#                                          # (is k16, the stage-2 joined 1x1 GEMM, 35.8 us against 18.1 predicted
#                                          # again?), `aicfc tune` of it and of the 64->256 1x1s (53.4 against 42.7),
#                                          # and whether initcheck sees a TMA store (benchmarks/prototypes/initcheck_tma.cu)
#   bash benchmarks/conv_round.sh pairs    # session 74's open question (on an H100): do cluster pairs still win on the
#                                          # 4096x768x768 and 4096x3072x768 GEMMs (session 5: 4% on the first), as they
#                                          # lose on ResNet-50's 1x1 GEMMs? `aicfc tune` of both; then `final`
#   bash benchmarks/conv_round.sh lockstep # session 74's candidate for sm_90 (on an H100): the h200 profile's cluster_lockstep
#                                          # (0.02, every pair) and an H100's own l2_total_gbs (9500, ncu) over sm_90 without a
#                                          # lockstep; ResNet-50 B32, BERT-base B8 S512 and GPT-2 B8 S512 compiled both ways,
#                                          # each A/B'd by whole-plan replays (benchmarks/plan_ab.py, 7 alternating rounds),
#                                          # ResNet-50's both profiled
#   bash benchmarks/conv_round.sh verify   # after a planner change (session 74): ResNet-50 B32 compiled (its explain kept),
#                                          # checked and profiled; memcheck and racecheck over one run of its plan; the
#                                          # Hopper GEMM and convolution GPU tests; ResNet-50 B32 and B1 against torch.compile
#   bash benchmarks/conv_round.sh close    # `verify` without its profile (session 81: after `nwg3` on the same machine)
#   bash benchmarks/conv_round.sh split    # session 75 (an H100): which of session 74's two sm_90 candidates moved the plans,
#                                          # cluster_lockstep 0.02 alone and l2_total_gbs 9500 alone, each A/B'd against sm_90's
#                                          # on ResNet-50 B32, BERT-base B8 S512 and GPT-2 B8 S512 (the schedules that differ
#                                          # kept); DRAM copy / write-only / read-only / 1:4 rates; ncu of k6, k26, k31, k32;
#                                          # the stage-3/4 3x3s by cost and pinned to stream-k (benchmarks/conv_ab.py)
#   bash benchmarks/conv_round.sh clusters # session 75's sm_90 lockstep (pairs bound by their tensor work spared) against the
#                                          # profile before it (no lockstep) on ResNet-50 B32, BERT-base and GPT-2 B8 S512,
#                                          # MobileNetV2 and EfficientNet-B0 B32, a 2-layer Llama B8 S512: the schedules that
#                                          # differ, and a plan A/B where any do; ResNet-50 B32 profiled, against torch.compile
#   bash benchmarks/conv_round.sh cnns     # after `clusters` (session 75): EfficientNet-B0 B32 before / after / after with
#                                          # k63 (moved from a wgmma pair to an mma tile) pinned back to wgmma, A/B'd;
#                                          # MobileNetV2 and EfficientNet-B0 B32 and B1 against torch.compile(mode=
#                                          # "reduce-overhead") (benchmarks/models.py)
#   bash benchmarks/conv_round.sh l2bytes  # session 75's open question (either card): where the L2 bytes of the memory-bound
#                                          # 1x1 GEMMs come from (ncu counted 221 MB through k6's L2 for ~77 MB of operands
#                                          # and output): L2 sectors by source unit and node, DRAM bytes, for k6, k9, k26, k32
#   bash benchmarks/conv_round.sh streamk  # session 76 (either card): stream-k with the tail part finishing its tile ([Note: the
#                                          # tail finishes]): its GPU tests, memcheck and racecheck; the 3x3s s2-s4 by cost
#                                          # and pinned to stream-k (benchmarks/conv_ab.py); bundles of the tree before
#                                          # (ab_old/, benchmarks/stream_k_bundles.py run there) against the same pins now,
#                                          # each kernel alone, and stamped (--timeline); ResNet-50's 1x1 GEMM shapes by
#                                          # cost and pinned, beside cuBLAS
#   bash benchmarks/conv_round.sh prologue # session 76 (either card): the Hopper GEMM/convolution kernels' prologue before their
#                                          # dependent-launch wait ([Note: the prologue before the wait]): ResNet-50 B32
#                                          # compiled with the template before (ab_old/, swapped in) and after, A/B'd by
#                                          # whole-plan replays; the new plan checked and profiled (PROFILE=0: not); the
#                                          # Hopper GEMM, convolution and cluster GPU tests; stream-k's bundles under
#                                          # memcheck and racecheck (benchmarks/stream_k_bundles.py)
#   bash benchmarks/conv_round.sh pdl      # session 77 (either card): ResNet-50 B32's wgmma kernels alone as the plan launches
#                                          # them (dependent) and plainly (benchmarks/pdl_alone.py); `aicfc tune` of two 3x3s
#                                          # (plain launches, random inputs); the plan's timeline (phases of every block)
#                                          # and profile
#   bash benchmarks/conv_round.sh late     # session 77 (either card): [Note: the trigger as the blocks exit]'s GPU tests; ResNet-50
#                                          # B32 and B1, GPT-2 B8 S512 and the 4-layer Llama B1 decoder (prefill and decode)
#                                          # with the rule and without (--pin late=0), A/B'd (the transformers' plans
#                                          # should not differ: the rule keeps to channels-last images); ResNet-50 B32 profiled
#   bash benchmarks/conv_round.sh chain    # session 78 (either card): ResNet-50 B32's kernels in the plan's chain (compiled
#                                          # with --timeline: each kernel's start to the next one's) beside each timed alone
#                                          # (--profile), against their predictions; MobileNetV2 and EfficientNet-B0 at B32
#                                          # and B1 with [Note: the trigger as the blocks exit] and without (--pin late=0),
#                                          # A/B'd (the rule reached them unmeasured in session 77)
#   bash benchmarks/conv_round.sh card     # session 78 (an H200 wanted): the tree as it is on this card: the timeline, late
#                                          # trigger and PDL GPU tests; ResNet-50 B32 checked,
#                                          # profiled alone and in the plan's chain (--timeline); the late trigger's A/B on
#                                          # ResNet-50 B32 and EfficientNet-B0 B32; ResNet-50 B32 and B1 against
#                                          # torch.compile(mode="reduce-overhead") (benchmarks/models.py)
#   bash benchmarks/conv_round.sh outputs  # session 78: [Note: outputs written back] (aicf_run/profile.py): ResNet-50 B32 built,
#                                          # checked and profiled (its pointwise kernels' outputs rotated over copies)
#   bash benchmarks/conv_round.sh maps     # session 79: [Note: moved maps] (aicf_run/moved.py): its GPU tests (and the profile's,
#                                          # PDL's), memcheck over them; ResNet-50 B32 profiled with its Hopper kernels' weights
#                                          # and outputs rotated too, beside its timeline
#   bash benchmarks/conv_round.sh cap      # session 79: `maps`, with [Note: im2col boxes in flight] (the sm_90 profile's cap of 4);
#                                          # ResNet-50 B32 compiled without the cap too and A/B'd against it (7 rounds)
#   bash benchmarks/conv_round.sh h200     # session 79 (an H200): ResNet-50 B32 compiled with --profile h200, profiled alone and in
#                                          # the plan's chain (--timeline)
#   bash benchmarks/conv_round.sh capab    # session 79: the cap's A/B on ResNet-50 B1, MobileNetV2 and EfficientNet-B0 B32 (where a
#                                          # schedule differs); ResNet-50 B32 and B1 against torch.compile(mode="reduce-overhead")
#   bash benchmarks/conv_round.sh nwg3     # session 80: [Note: three warpgroups] (192-row tiles): its GPU tests, memcheck over
#                                          # some; ResNet-50 B32 compiled by the tree before (ab_old/aicfc, a copy of the
#                                          # previous commit's package, run from there) and now, A/B'd (7 rounds); the new
#                                          # plan profiled alone and in the chain; EfficientNet-B0 B32, BERT-base and GPT-2
#                                          # B8 S512 compiled both ways and A/B'd where a schedule differs
#   bash benchmarks/conv_round.sh nwg3pin  # session 80: ResNet-50 B32 with 192-row tiles pinned where the planner does not pick
#                                          # them (a stage-1 and a stage-3 3x3, a stage-3 reduce 1x1, by their torch-export
#                                          # node names), profiled: measured / predicted of those candidates
#   bash benchmarks/conv_round.sh s81      # session 81: `nwg3` (no timeline) and `nwg3pin` in one call (the final form of three warpgroups)
#   bash benchmarks/conv_round.sh s82      # session 82: other schedules pinned on stage 4's kernels and the stage-2 joined
#                                          # expansion, two bundles profiled beside the plan (measured / predicted of those)
#   bash benchmarks/conv_round.sh sweep    # session 82: the 3x3s over the im2col engine's tile shapes (benchmarks/im2col_sweep.py)
#   bash benchmarks/conv_round.sh s82v     # session 82: `s82min`, and B1 profiled under the key, ping-pong conv GPU tests, B32
#                                          # under the key against torch.compile
#   bash benchmarks/conv_round.sh s82min   # session 82: the sm_90 profile with `im2col_cap_rows` A/B'd against it as it is
#                                          # (ResNet-50 B32), profiled, memcheck (a budget of minutes)
#   bash benchmarks/conv_round.sh s83      # session 83: `s82v` with the plan without the key profiled too (one machine),
#                                          # ResNet-50 B1's plans A/B'd where a schedule differs, the keyed plan's timeline
#   bash benchmarks/conv_round.sh s83h     # session 83 (an H200): the key A/B'd there beside the h200 profile, and the
#                                          # 20-layer B1 generate step against its bandwidth limit (issue 19; GEN=0:
#                                          # the A/B alone)
#   bash benchmarks/conv_round.sh s84      # session 84: [Note: a concatenation read by k-blocks] (passes/join_concat.py): its
#                                          # GPU tests; ResNet-50 B32 with the projections' Concats joined and kept
#                                          # (--pin concat=0), A/B'd (7 rounds), the joined plan under memcheck and profiled
#   bash benchmarks/conv_round.sh s84m     # session 84, after s84: B1 A/B'd likewise, B32 and B1 against torch.compile
#   bash benchmarks/conv_round.sh s84r     # session 84: the residual's copy after the first k-block (a form since removed: the
#                                          # record of the call that dropped it), GPU tests, racecheck, ResNet-50 B32 against
#                                          # the tree before (ab_old/aicfc) A/B'd, profiled
#   bash benchmarks/conv_round.sh s85      # session 85: [Note: B resident in shared memory] (codegen/gemm_wgmma.py): its GPU
#                                          # tests; ResNet-50 B32 with B resident where the cost picks it and kept in the ring
#                                          # (--pin BRES=0), A/B'd (7 rounds); both profiled; memcheck over the resident plan
#   bash benchmarks/conv_round.sh s85m     # session 85, after s85 on the same machine: racecheck over the resident plan,
#                                          # MobileNetV2 B32 A/B'd likewise (its ring side pinned mma/thin kernels onto
#                                          # wgmma too: see s85v), ResNet-50 B32 / B1 against torch.compile
#   bash benchmarks/conv_round.sh s85v     # session 85, the final tree: the Hopper GPU suites; MobileNetV2 and
#                                          # EfficientNet-B0 B32 against the tree before (ab_old/, carried), A/B'd
#   bash benchmarks/conv_round.sh s85w     # session 85: the stage-3 expansions on two other resident-B tiles, A/B'd, profiled
#   bash benchmarks/conv_round.sh s85p     # session 85, after s85: the stage-3 expansions pinned to B resident, A/B'd, profiled
#   bash benchmarks/conv_round.sh s85t     # session 85, after s85: `aicfc tune` of the 1x1 GEMMs B residency reaches
#   (s85f, session 85: the residual's rows requested into L2 before a resident tile's k-blocks, PF = 1, A/B'd at 0.947x
#    and removed with its key; the record is in benchmarks/results/b_resident_session85_h100.txt, call 5)
#   bash benchmarks/conv_round.sh s86      # session 86: [Note: a reduce joined into the epilogue] (passes/join_reduce.py):
#                                          # its GPU tests; ResNet-50 B32 joined and apart (--pin joinr=0) A/B'd, memcheck, profile
#   bash benchmarks/conv_round.sh s86b     # session 86: 64-column joins (the default), every join and none A/B'd,
#                                          # the default checked and profiled
#   bash benchmarks/conv_round.sh s86s     # session 86: stage 1's shapes as a block pair, 64 and 128 columns joined and apart,
#                                          # host tiles pinned, A/B'd and profiled
#   bash benchmarks/conv_round.sh s86m     # session 86, after s86b: racecheck, B32 / B1 against torch.compile
#   bash benchmarks/conv_round.sh s86t     # session 86, the final tree: ResNet-50 B32 profiled alone and in the chain
#   bash benchmarks/conv_round.sh s86b8    # session 86: ResNet-50 B8 joined and apart A/B'd, checked
#   bash benchmarks/conv_round.sh s87      # session 87: [Note: the stem gathers its input] (passes/gather_stem.py, opt-in):
#                                          # its GPU tests, the unfolded stem's and the pool unit's; ResNet-50 B32 gathering
#                                          # (--pin gstem=1) and with the copy A/B'd, memcheck, profile
#   bash benchmarks/conv_round.sh s87q     # session 87: s87 for a budget of minutes (fewer tests, 5 rounds)
#   bash benchmarks/conv_round.sh s88      # session 88: the gathering stem in turn and a tile ahead (GA=1) against the copy:
#                                          # GPU tests, a three-way A/B, memcheck, profiles (GEN=0: r32_ahead's too)
#   bash benchmarks/conv_round.sh s88q     # session 88: s88 reordered for a budget of minutes: A/B, both profiles, tests, memcheck
#                                          # (session 90: every step stamped in $OUT/steps.txt; a plan that hangs alone is left out;
#                                          # give the call the whole 600 s: a fresh machine's export and compiles take minutes)
#   bash benchmarks/conv_round.sh s87m     # session 87, after s87: racecheck over the gathering plan; ResNet-50 B1 A/B'd
#                                          # likewise; B32 / B1 against torch.compile
#   bash benchmarks/conv_round.sh s81min   # session 81: `s81`'s A/B and profile only, for a device budget of a few minutes
#   bash benchmarks/conv_round.sh splitpdl # session 79: the stage-4 3x3s (and neighbours) timed alone dependent and plain
#                                          # (benchmarks/pdl_alone.py), with the cap (k-split clusters) and without (64x104 tiles)
source "$(dirname "$0")/round_env.sh" gpu.txt
W=/tmp/r50; mkdir -p $W
# build_r32: ResNet-50 B32 exported ($W/resnet50_b32.onnx and its inputs) and compiled into $W/r32.aicf (sm_90, fp16)
build_r32() {
  python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1 &&
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --precision fp16 -q > $W/compile.log 2>&1
  echo "resnet compile rc=$?"; tail -2 $W/compile.log
}
# profile NAME: ResNet-50 B32's bundle $W/NAME.aicf checked against onnxruntime, then every kernel timed alone
profile() {
  timeout 60 python3 -m aicf_run $W/$1.aicf --check $W/resnet50_b32.onnx --input $W/resnet50_b32_inputs.npz 2>&1 \
      | tail -2 | tee "$OUT/profile_$1.txt"
  timeout 180 python3 -m aicf_run $W/$1.aicf --profile --input $W/resnet50_b32_inputs.npz >> "$OUT/profile_$1.txt" 2>&1
  # the bars at this GPU's copy rate (the summary's default is an H200's: session 73 on an H100 printed 8 at the bar for 21)
  [ -n "${COPY:-}" ] || COPY=$(python3 -c "from benchmarks.gemv import copy_gbs; print(round(copy_gbs()))" 2>/dev/null | tail -1)
  echo "copy bandwidth ${COPY:-unmeasured} GB/s" | tee -a "$OUT/profile_$1.txt"
  python3 benchmarks/conv_profile_summary.py "$OUT/profile_$1.txt" 2>&1 | tail -3   # it reads the line above
  grep -E "^\s+[01]\s+k|whole plan" "$OUT/profile_$1.txt"
}
# sanitize_stream_k CASE...: stream-k bundles (benchmarks/stream_k_bundles.py, built into /tmp/skb) under memcheck and
# racecheck, one run each, the summaries into $OUT/sanitizer.txt
sanitize_stream_k() {
  python3 benchmarks/stream_k_bundles.py /tmp/skb > /dev/null
  for c in "$@"; do for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool python3 -m aicf_run /tmp/skb/${c}_sk128.aicf --no-graph \
        --input /tmp/skb/${c}_in.npz --output-dir /tmp 2>&1 | tail -1 | sed "s/^/$c $tool: /"
  done; done | tee "$OUT/sanitizer.txt"
}
# compile_pair CASE A FLAGS_A B: CASE exported into $W and compiled twice, into NAME_A.aicf with FLAGS_A and NAME_B.aicf
# with none, NAME the case with ':' as '_b' (efficientnet_b0:32 -> efficientnet_b0_b32)
compile_pair() {
  local n; n=$(echo $1 | sed 's/:/_b/')
  ( python3 benchmarks/export_case.py $1 --out-dir $W > $W/export_$n.log 2>&1 &&
    python3 -m aicfc compile $W/$n.onnx -o $W/${n}_$2.aicf --target sm_90 --precision fp16 -q $3 &&
    python3 -m aicfc compile $W/$n.onnx -o $W/${n}_$4.aicf --target sm_90 --precision fp16 -q ) \
    > $W/compile_$n.log 2>&1 || echo "compile $1 failed"
}
# late_pair CASE: CASE with the late trigger off (NAME_base.aicf, --pin late=0) and on (NAME_late.aicf)
late_pair() { compile_pair $1 base "--pin late=0" late; }
# schedules_differ A B: prints the kernels whose schedules differ between bundles A and B; fails where none do
schedules_differ() {
  python3 -c "import sys; from aicf_run.bundle import read_bundle as r; a, b = r(sys.argv[1]), r(sys.argv[2]); \
pa, pb = ({k['name']: k['params'] for k in x.kernels} for x in (a, b)); \
d = [n for n in pa if n in pb and pa[n] != pb[n]]; print('schedules that differ:', d or 'none'); \
print('kernels of one only:', sorted(set(pa) ^ set(pb)) or 'none'); sys.exit(0 if d else 1)" "$1" "$2"
}
# compile_pin: ResNet-50 B32 with 192-row tiles pinned where the planner does not pick them (a stage-1 3x3, a stage-3
# reduce 1x1 and 3x3 at BN 64, by their torch-export node names) into $W/r32_pin.aicf; their schedules into $OUT
compile_pin() {
  python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_pin.aicf --target sm_90 --precision fp16 -q \
      --pin node_Conv_760:NWG=3 --pin node_Conv_838:NWG=3 --pin node_Conv_838:BN=64 --pin node_Conv_841:NWG=3 \
      --pin node_Conv_841:BN=64 > $W/compile_pin.log 2>&1; echo "compile pin rc=$?"; tail -2 $W/compile_pin.log
  python3 -m aicfc explain $W/r32_pin.aicf 2>&1 | grep -A4 -E "^k(4|30|31) " | grep -E "^k|schedule|predicted" \
      > "$OUT/explain_pin.txt"
}
# build_now_and_before [pin]: ResNet-50 B32 exported, then compiled by this tree ($W/r32.aicf) and by ab_old/aicfc (a
# copy of an earlier commit's package: $W/r32_before.aicf) in parallel, with compile_pin beside them where asked
build_now_and_before() {
  ( python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --precision fp16 -q &
    [ -z "${1:-}" ] || compile_pin &
    cd ab_old && python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_before.aicf --target sm_90 --precision fp16 -q
    wait ) > $W/compile_before.log 2>&1
}
# now_and_before CASE N TAG [EXPORT FLAGS]: CASE exported as $W/N.onnx, compiled by this tree into $W/N_TAG.aicf and by
# ab_old/aicfc (a copy of an earlier commit's package, carried) into $W/N_before.aicf
now_and_before() {
  ( python3 benchmarks/export_case.py $1 ${4:-} --out-dir $W > $W/export_$2.log 2>&1 &&
    python3 -m aicfc compile $W/$2.onnx -o $W/${2}_$3.aicf --target sm_90 --precision fp16 -q &&
    cd ab_old && python3 -m aicfc compile $W/$2.onnx -o $W/${2}_before.aicf --target sm_90 --precision fp16 -q ) \
    > $W/compile_$2.log 2>&1 || echo "compile $1 failed"
}
# ab_before N TAG: where a schedule differs, $W/N_before.aicf and $W/N_TAG.aicf A/B'd as before and TAG (7 rounds)
ab_before() {
  schedules_differ $W/${1}_before.aicf $W/${1}_$2.aicf && \
    timeout 100 python3 benchmarks/plan_ab.py before=$W/${1}_before.aicf $2=$W/${1}_$2.aicf --rounds 7 2>&1 | tail -n 2
}
# pin_round TESTS PIN A B: TESTS' GPU tests; ResNet-50 B32 exported, compiled with PIN into $W/r32_A.aicf and without into
# $W/r32.aicf, the schedules that differ, the two A/B'd as A and B (7 rounds), memcheck over one run of r32, r32 profiled
pin_round() {
  timeout 300 python3 -m pytest -q -n 8 -m gpu $1 2>&1 | tail -n 3 | tee "$OUT/tests.txt"
  python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1
  python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_$3.aicf --target sm_90 --precision fp16 -q $2 &
  python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --precision fp16 -q
  wait
  schedules_differ $W/r32_$3.aicf $W/r32.aicf | tee "$OUT/ab.txt"
  timeout 100 python3 benchmarks/plan_ab.py $3=$W/r32_$3.aicf $4=$W/r32.aicf --rounds 7 2>&1 | tail -n 3 | tee -a "$OUT/ab.txt"
  timeout 60 compute-sanitizer --tool memcheck python3 -m aicf_run $W/r32.aicf --no-graph \
      --input $W/resnet50_b32_inputs.npz --output-dir /tmp 2>&1 | tail -n 2 | tee "$OUT/memcheck.txt"
  profile r32
}
# rows_ab: [Note: im2col boxes in flight] counted in pixel rows (the sm_90 profile with `im2col_cap_rows`, $W/rows.json:
# ResNet-50 B32's stage-4 3x3s on 64x104 ping-pong tiles) against sm_90 as it is: ResNet-50 B32 compiled both ways
# ($W/r32_before.aicf, $W/r32.aicf), A/B'd (7 rounds), the keyed plan profiled and run once under memcheck
rows_ab() {
  python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1
  echo '{"base": "sm_90", "name": "sm_90, the im2col cap in pixel rows", "im2col_cap_rows": 128}' > $W/rows.json
  python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_before.aicf --target sm_90 --precision fp16 -q &
  python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --precision fp16 -q --profile $W/rows.json
  wait
  schedules_differ $W/r32_before.aicf $W/r32.aicf | tee "$OUT/ab.txt"
  timeout 60 python3 benchmarks/plan_ab.py before=$W/r32_before.aicf rows=$W/r32.aicf --rounds 7 2>&1 | tail -n 3 \
      | tee -a "$OUT/ab.txt"
  profile r32
  timeout 60 compute-sanitizer --tool memcheck python3 -m aicf_run $W/r32.aicf --no-graph \
      --input $W/resnet50_b32_inputs.npz --output-dir /tmp 2>&1 | tail -n 2 | tee "$OUT/memcheck.txt"
}
# sanitize_test_peer: memcheck and racecheck over one run of $W/r32.aicf's plan, the Hopper GEMM and convolution GPU
# tests, ResNet-50 B32 and B1 against torch.compile(mode="reduce-overhead") (benchmarks/models.py)
sanitize_test_peer() {
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool python3 -m aicf_run $W/r32.aicf --no-graph \
        --input $W/resnet50_b32_inputs.npz --output-dir /tmp 2>&1 | tail -2 | tee "$OUT/$tool.txt"
  done
  timeout 200 python3 -m pytest -m gpu -q -n 8 tests/test_gemm_wgmma.py tests/test_conv_wgmma.py 2>&1 | tail -3 \
      | tee "$OUT/tests.txt"
  timeout 200 python3 benchmarks/models.py --cases resnet50:32,resnet50:1 --json "$OUT/models.json" > "$OUT/models.txt" 2>&1
  echo "models rc=$?"; grep -E "^resnet50|^model|FAIL" "$OUT/models.txt"
}
# nocap_profile: $W/nocap.json, the sm_90 profile without [Note: im2col boxes in flight]'s cap
nocap_profile() {
  echo '{"base": "sm_90", "name": "sm_90 without the im2col cap", "im2col_in_flight": 0}' > $W/nocap.json
}
# build_r32_tl: build_r32, then the same model compiled with --timeline ($W/r32_tl.aicf)
build_r32_tl() {
  build_r32
  python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_tl.aicf --target sm_90 --precision fp16 -q --timeline \
    > $W/compile_tl.log 2>&1
}
# timeline_r32 NAME: $W/r32_tl.aicf's timeline into $OUT/NAME.json (for conv_profile_summary.py --timeline)
timeline_r32() {
  timeout 90 python3 -m aicf_run $W/r32_tl.aicf --timeline --json --input $W/resnet50_b32_inputs.npz > "$OUT/$1.json" 2>&1
  echo "timeline $1 rc=$?"
}
# moved_maps_checks: [Note: moved maps]'s GPU tests with the profile's and PDL's, then memcheck over its own
moved_maps_checks() {
  timeout 200 python3 -m pytest -m gpu -q --tb=short tests/test_moved_maps.py tests/test_run_bench.py tests/test_pdl.py \
      2>&1 | tail -40 > "$OUT/tests.txt"; tail -1 "$OUT/tests.txt"
  timeout 200 compute-sanitizer --tool memcheck python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/test_moved_maps.py 2>&1 | tail -3 | tee "$OUT/memcheck.txt"
}
# alone_and_chain: $W/r32_tl.aicf's timeline and $W/r32.aicf's profile, summarized side by side
alone_and_chain() {
  timeline_r32 timeline
  profile r32
  python3 benchmarks/conv_profile_summary.py "$OUT/profile_r32.txt" --timeline "$OUT/timeline.json" 2>&1 | tail -3
}
case "${1:-}" in
  unfold)
    ( python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1 &&
      python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --precision fp16 -q &&
      python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_fold.aicf --target sm_90 --precision fp16 -q --pin unfold=0 ) \
      > $W/compile.log 2>&1 &
    CP=$!
    timeout 300 python3 -m pytest -m gpu -q -n 8 tests/test_unfold_taps.py tests/test_conv_wgmma.py 2>&1 | tail -6 | tee "$OUT/tests.txt"
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -m gpu -q \
        "tests/test_unfold_taps.py::test_gpu_unfolded_stem" "tests/test_unfold_taps.py::test_gpu_conv_split_k" 2>&1 \
        | tail -4 | tee "$OUT/memcheck.txt"
    wait $CP; echo "resnet compile rc=$?"; tail -2 $W/compile.log
    profile r32; profile r32_fold
    timeout 150 python3 benchmarks/conv_ab.py --cases s3 s4 --pins SPLITK=1 SPLITK=2 SPLITK=3 SPLITK=4 2>&1 \
        | grep -v -i warn | tee "$OUT/split_ab.txt"
    ;;
  halo)
    ( python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1 &&
      python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --precision fp16 -q ) > $W/compile.log 2>&1 &
    CP=$!
    timeout 240 python3 -m pytest -m gpu -q -n 8 -x tests/test_conv_halo.py 2>&1 | tail -8 | tee "$OUT/tests_halo.txt"
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -m gpu -q -x \
        "tests/test_conv_halo.py::test_gpu_conv_halo" -k "fp16 and (cost or mi2)" 2>&1 | tail -4 | tee "$OUT/memcheck_halo.txt"
    wait $CP; echo "resnet compile rc=$?"; tail -2 $W/compile.log
    profile r32
    timeout 150 python3 benchmarks/conv_ab.py --pins A=tma A=halo 2>&1 | grep -v -i warn | tee "$OUT/halo_ab.txt"
    timeout 200 python3 -m pytest -m gpu -q -n 8 tests/test_conv_wgmma.py tests/test_unfold_taps.py tests/test_conv.py 2>&1 \
        | tail -4 | tee "$OUT/tests_conv.txt"
    ;;
  final)
    build_r32
    profile r32
    timeout 300 python3 benchmarks/models.py --cases resnet50:32,resnet50:1 --json "$OUT/models.json" > "$OUT/models.txt" 2>&1
    echo "models rc=$?"; grep -E "^resnet50|^model|FAIL" "$OUT/models.txt"
    ;;
  h100)
    nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/initcheck_tma benchmarks/prototypes/initcheck_tma.cu 2>&1 | tail -3
    { /tmp/initcheck_tma; compute-sanitizer --tool initcheck --print-limit 4 /tmp/initcheck_tma 2>&1 | grep -v "Host Frame"
      compute-sanitizer --tool memcheck /tmp/initcheck_tma 2>&1 | tail -1; } 2>&1 | tee "$OUT/initcheck_tma.txt" | tail -12
    build_r32
    profile r32; cp "$OUT/profile_r32.txt" "$OUT/profile_r32_first.txt"; profile r32
    timeout 240 python3 -m aicfc tune $W/resnet50_b32.onnx --target sm_90 --precision fp16 --top 6 --spread 4 \
        --kernel node_Conv_793 --kernel node_Conv_775 --json "$OUT/tune_h100.json" > "$OUT/tune_h100.txt" 2>&1
    echo "tune rc=$?"; tail -12 "$OUT/tune_h100.txt"
    ;;
  pairs)
    for s in 4096x768x768 4096x3072x768; do
      python3 -c "import numpy as np, onnx, sys; from tests.test_gemm_gpu import matmul
onnx.save(matmul(*map(int, sys.argv[1].split('x')), np.random.default_rng(0)), sys.argv[2])" $s /tmp/mm_$s.onnx
      timeout 120 python3 -m aicfc tune /tmp/mm_$s.onnx --target sm_90 --precision fp16 --top 24 --spread 4 \
          --json "$OUT/tune_mm_$s.json" > "$OUT/tune_mm_$s.txt" 2>&1
      echo "tune $s rc=$?"; grep -E "^\s+[*+ ]+\s+[0-9]+ " "$OUT/tune_mm_$s.txt" | cut -c1-200 | head -12
    done
    bash "$0" final
    ;;
  lockstep)
    # the profiles as session 75 ran them: sm_90 without a lockstep (base), and with it on every pair plus the L2 total
    printf '{"base": "sm_90", "cluster_lockstep": 0, "cluster_lockstep_compute": 0}\n' > /tmp/sm90_before.json
    printf '{"base": "sm_90", "cluster_lockstep": 0.02, "cluster_lockstep_compute": 0.02, "l2_total_gbs": 9500}\n' \
        > /tmp/sm90_lockstep.json
    for c in resnet50:32 bert:8x512 gpt2:8x512; do
      n=$(echo $c | sed 's/:/_b/; s/x/_s/')
      python3 benchmarks/export_case.py $c --out-dir $W > $W/export_$n.log 2>&1 || { echo "export $c failed"; continue; }
      python3 -m aicfc compile $W/$n.onnx -o $W/${n}_base.aicf --target sm_90 --precision fp16 -q \
            --profile /tmp/sm90_before.json &&
        python3 -m aicfc compile $W/$n.onnx -o $W/${n}_ls.aicf --target sm_90 --precision fp16 -q \
            --profile /tmp/sm90_lockstep.json || { echo "compile $c failed"; continue; }
      timeout 120 python3 benchmarks/plan_ab.py base=$W/${n}_base.aicf lockstep=$W/${n}_ls.aicf --rounds 7 \
          --json "$OUT/ab_$n.json" 2>&1 | tail -3 | tee "$OUT/ab_$n.txt"
    done
    cp $W/resnet50_b32_base.aicf $W/r32.aicf; profile r32; cp "$OUT/profile_r32.txt" "$OUT/profile_base.txt"
    cp $W/resnet50_b32_ls.aicf $W/r32.aicf; profile r32; cp "$OUT/profile_r32.txt" "$OUT/profile_lockstep.txt"
    ;;
  split)
    # base: sm_90 before session 75 (no lockstep); ls: the lockstep on every pair; l2: the L2 total alone
    printf '{"base": "sm_90", "cluster_lockstep": 0, "cluster_lockstep_compute": 0}\n' > /tmp/sm90_base.json
    printf '{"base": "sm_90", "cluster_lockstep": 0.02, "cluster_lockstep_compute": 0.02}\n' > /tmp/sm90_ls.json
    printf '{"base": "sm_90", "cluster_lockstep": 0, "cluster_lockstep_compute": 0, "l2_total_gbs": 9500}\n' > /tmp/sm90_l2.json
    for c in resnet50:32 bert:8x512 gpt2:8x512; do
      n=$(echo $c | sed 's/:/_b/; s/x/_s/')
      python3 benchmarks/export_case.py $c --out-dir $W > $W/export_$n.log 2>&1 || { echo "export $c failed"; continue; }
      for v in base ls l2; do
        python3 -m aicfc compile $W/$n.onnx -o $W/${n}_$v.aicf --target sm_90 --precision fp16 -q --profile /tmp/sm90_$v.json \
            || echo "compile $c $v failed"
        python3 -m aicfc explain $W/${n}_$v.aicf | grep -E "^k[0-9]+ |^    schedule" | cut -c1-200 > $W/${n}_$v.sched
      done
      for v in ls l2; do echo "## $n: base -> $v, $(diff $W/${n}_base.sched $W/${n}_$v.sched | grep -c '^>') schedules differ"
        diff $W/${n}_base.sched $W/${n}_$v.sched | grep -E "^[<>]" | head -40; done >> "$OUT/sched_diff.txt"
      timeout 150 python3 benchmarks/plan_ab.py base=$W/${n}_base.aicf lockstep=$W/${n}_ls.aicf l2total=$W/${n}_l2.aicf \
          --rounds 7 2>&1 | tail -4 | tee -a "$OUT/ab_split.txt"
    done
    python3 - <<'PY' 2>&1 | tee "$OUT/dram_mix.txt"
import statistics, torch
def t(f, n=20):
    for _ in range(3): f()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)
N = 1 << 29
x = torch.randn(N, dtype=torch.float16, device="cuda"); y = torch.empty_like(x)
q = torch.randn(N // 4, 1, dtype=torch.float16, device="cuda"); z = torch.empty(N // 4, 4, dtype=torch.float16, device="cuda")
for name, f, nbytes in [("copy 1:1", lambda: y.copy_(x), 4 * N), ("write only (fill)", lambda: y.fill_(1.0), 2 * N),
                        ("read only (sum)", lambda: x.sum(), 2 * N), ("read 1 : write 4", lambda: z.copy_(q.expand(-1, 4)), 2 * N + N // 2)]:
    us = t(f); print(f"{name:20s} {us:9.1f} us  {nbytes / us / 1e3:7.0f} GB/s")
PY
    cp $W/resnet50_b32_base.aicf $W/r32.aicf
    [ -f $W/resnet50_b32_inputs.npz ] && timeout 200 ncu --kernel-name regex:'^k(6|26|31|32)$' --launch-count 4 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
        python3 -m aicf_run $W/r32.aicf --no-graph --input $W/resnet50_b32_inputs.npz --output-dir /tmp > "$OUT/ncu.txt" 2>&1
    echo "ncu rc=$?"; grep -E "^  k[0-9]+ |Duration|DRAM Throughput|Warp Cycles Per Issued|Issued Warp Per Scheduler" "$OUT/ncu.txt" | head -40
    timeout 150 python3 benchmarks/conv_ab.py --cases s3 s4 --pins STREAM=1,BM=128,BN=128 STREAM=1 2>&1 | grep -v -i warn \
        | tee "$OUT/streamk.txt"
    ;;
  clusters)
    printf '{"base": "sm_90", "cluster_lockstep": 0, "cluster_lockstep_compute": 0}\n' > /tmp/sm90_before.json
    for c in resnet50:32 bert:8x512 gpt2:8x512 mobilenet_v2:32 efficientnet_b0:32 llama:8x512; do
      n=$(echo $c | sed 's/:/_b/; s/x/_s/'); extra=""
      [ "${c%%:*}" = llama ] && { extra="--layers 2"; n=${n}_l2; }
      python3 benchmarks/export_case.py $c --out-dir $W $extra > $W/export_$n.log 2>&1 || { echo "export $c failed"; continue; }
      for v in before after; do
        prof=""; [ $v = after ] || prof="--profile /tmp/sm90_before.json"
        python3 -m aicfc compile $W/$n.onnx -o $W/${n}_$v.aicf --target sm_90 --precision fp16 -q $prof || echo "compile $c $v failed"
        python3 -m aicfc explain $W/${n}_$v.aicf | grep -E "^k[0-9]+ |^    schedule" | cut -c1-200 \
            | awk '/^k/{k=$1; next} {print k, $0}' > $W/${n}_$v.sched
      done
      moved=$(diff $W/${n}_before.sched $W/${n}_after.sched | grep -c "^>")
      echo "## $n: $moved schedules differ" | tee -a "$OUT/sched_diff.txt"
      diff $W/${n}_before.sched $W/${n}_after.sched | grep -E "^[<>]" | cut -c1-130 >> "$OUT/sched_diff.txt"
      [ "$moved" -gt 0 ] && timeout 150 python3 benchmarks/plan_ab.py before=$W/${n}_before.aicf after=$W/${n}_after.aicf \
          --rounds 7 2>&1 | tail -3 | tee -a "$OUT/ab_clusters.txt"
    done
    cp $W/resnet50_b32_after.aicf $W/r32.aicf; profile r32
    timeout 200 python3 benchmarks/models.py --cases resnet50:32,resnet50:1 --json "$OUT/models.json" > "$OUT/models.txt" 2>&1
    echo "models rc=$?"; grep -E "^resnet50|^model|FAIL" "$OUT/models.txt"
    ;;
  cnns)
    printf '{"base": "sm_90", "cluster_lockstep": 0, "cluster_lockstep_compute": 0}\n' > /tmp/sm90_before.json
    n=efficientnet_b0_b32
    python3 benchmarks/export_case.py efficientnet_b0:32 --out-dir $W > $W/export_$n.log 2>&1 || echo "export failed"
    python3 -m aicfc compile $W/$n.onnx -o $W/${n}_before.aicf --target sm_90 --precision fp16 -q --profile /tmp/sm90_before.json
    python3 -m aicfc compile $W/$n.onnx -o $W/${n}_after.aicf --target sm_90 --precision fp16 -q
    node=$(python3 -m aicfc explain $W/${n}_after.aicf | awk '$1 == "k63" {print $6}' | tr -d ,)
    python3 -m aicfc explain $W/${n}_after.aicf | grep -A2 "^k63 " | cut -c1-200 | tee "$OUT/k63.txt"
    python3 -m aicfc compile $W/$n.onnx -o $W/${n}_pinned.aicf --target sm_90 --precision fp16 -q --pin "$node:unit=wgmma"
    python3 -m aicfc explain $W/${n}_pinned.aicf | grep -A2 "^k63 " | cut -c1-200 | tee -a "$OUT/k63.txt"
    timeout 150 python3 benchmarks/plan_ab.py before=$W/${n}_before.aicf after=$W/${n}_after.aicf pinned=$W/${n}_pinned.aicf \
        --rounds 9 2>&1 | tail -4 | tee "$OUT/ab_effnet.txt"
    timeout 330 python3 benchmarks/models.py --cases mobilenet_v2:32,mobilenet_v2:1,efficientnet_b0:32,efficientnet_b0:1 \
        --json "$OUT/models_cnns.json" > "$OUT/models_cnns.txt" 2>&1
    echo "models rc=$?"; grep -E "^mobilenet|^efficientnet|^model|FAIL" "$OUT/models_cnns.txt"
    ;;
  l2bytes)
    build_r32
    ncu --query-metrics 2>/dev/null | grep -E "^lts__t_(sectors|requests)_src" | head -40 > "$OUT/l2_metric_names.txt"
    timeout 300 ncu --kernel-name regex:'^k(6|9|26|32)$' --launch-count 4 --section SpeedOfLight \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,regex:'^lts__t_sectors_src(unit|node)_[a-z]+\.sum$',regex:'^lts__t_sectors_srcunit_tex_op_(read|write)\.sum$' \
        python3 -m aicf_run $W/r32.aicf --no-graph --input $W/resnet50_b32_inputs.npz --output-dir /tmp > "$OUT/ncu_l2.txt" 2>&1
    echo "ncu rc=$?"; grep -E "^  k[0-9]+ |Duration|bytes|sectors" "$OUT/ncu_l2.txt" | head -60
    ;;
  streamk)
    # ab_old/: `python3 benchmarks/stream_k_bundles.py ab_old` run at the tree before (carried); the same bundles now, and
    # with --timeline's stamps
    timeout 240 python3 -m pytest -m gpu -q -n 8 tests/test_gemm_wgmma.py tests/test_conv_wgmma.py -k "stream" 2>&1 | tail -3 \
        | tee "$OUT/tests.txt"
    sanitize_stream_k s3
    python3 benchmarks/stream_k_bundles.py /tmp/skb_tl --timeline > /dev/null
    if [ -d ab_old ]; then for r in 1 2; do for b in s2 s3 s4; do for v in ab_old /tmp/skb; do
      timeout 60 python3 -m aicf_run $v/${b}_sk128.aicf --profile 2>&1 | awk -v t="$b $v" '$2 ~ /^k[0-9]+$/ && $3 > 5 {print t, $0}'
    done; done; done | tee "$OUT/old_new.txt"; fi
    for b in s3 s4; do echo "## $b"
      timeout 60 python3 -m aicf_run /tmp/skb_tl/${b}_sk128.aicf --timeline 2>&1 | tail -12; done | tee "$OUT/timeline.txt"
    timeout 200 python3 benchmarks/conv_ab.py --cases s2 s3 s4 --pins STREAM=1 STREAM=1,BM=128,BN=128 2>&1 | tee "$OUT/conv_ab.txt"
    for pin in unit=wgmma STREAM=1; do
      timeout 150 python3 benchmarks/gemm.py --precision fp16 --pin $pin --shape 1568x2048x512 --shape 1568x512x2048 \
          --shape 6272x1024x256 --shape 1568x1024x512 --shape 6272x256x1024 --shape 3136x512x2048 2>&1 | tail -9
    done | tee "$OUT/gemm.txt"
    ;;
  pdl)
    build_r32
    timeout 240 python3 benchmarks/pdl_alone.py $W/r32.aicf --input $W/resnet50_b32_inputs.npz --rounds 3 2>&1 \
        | tee "$OUT/pdl_alone.txt"
    timeout 200 python3 -m aicfc tune $W/resnet50_b32.onnx --target sm_90 --precision fp16 --top 2 --spread 0 \
        --kernel node_Conv_841 --kernel node_Conv_802 > "$OUT/tune.txt" 2>&1
    echo "tune rc=$?"; grep -E "^k|\*|\+" "$OUT/tune.txt" | head -12
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_tl.aicf --target sm_90 --precision fp16 -q --timeline
    timeout 90 python3 -m aicf_run $W/r32_tl.aicf --timeline --input $W/resnet50_b32_inputs.npz > "$OUT/timeline.txt" 2>&1
    echo "timeline rc=$?"; tail -3 "$OUT/timeline.txt"
    profile r32
    ;;
  late)
    # [Note: the trigger as the blocks exit]: its GPU tests; the default against --pin late=0, each case A/B'd as it is
    # built; then ResNet-50 B32 profiled (session 77 ran this, as `late5`, with the rule then kept to boundaries between
    # convolution, GEMM and pointwise kernels)
    timeout 100 python3 -m pytest -m gpu -q -n 4 tests/test_late_trigger.py tests/test_pdl.py 2>&1 | tail -1 \
        | tee "$OUT/tests_late.txt"
    for c in resnet50:32 llama gpt2:8x512 resnet50:1; do
      if [ $c = llama ]; then
        python3 -m pip install -q -e '.[dev]' > /dev/null 2>&1
        timeout 150 python3 benchmarks/decode_ab.py --layers 4 --batch 1 --compile-only --folder /tmp/b1 --jobs 16 \
            --variant base:pin.late=0 --variant late: 2>&1 | tail -1
        timeout 150 python3 benchmarks/decode_ab.py --layers 4 --batch 1 --rounds 5 --folder /tmp/b1 --jobs 16 \
            --bundle base=/tmp/b1/base.aicf --bundle late=/tmp/b1/late.aicf 2>&1 | grep -v "decode gemvs" | tail -3
        continue
      fi
      n=$(echo $c | sed 's/:/_b/; s/x/_s/')
      python3 benchmarks/export_case.py $c --out-dir $W > $W/export_$n.log 2>&1 || { echo "export $c failed"; continue; }
      python3 -m aicfc compile $W/$n.onnx -o $W/${n}_base.aicf --target sm_90 --precision fp16 -q --pin late=0 &&
        python3 -m aicfc compile $W/$n.onnx -o $W/${n}_late.aicf --target sm_90 --precision fp16 -q \
        || { echo "compile $c failed"; continue; }
      echo "## $c"
      timeout 150 python3 benchmarks/plan_ab.py base=$W/${n}_base.aicf late=$W/${n}_late.aicf --rounds 7 2>&1 | tail -2
    done 2>&1 | tee "$OUT/ab_late.txt"
    cp $W/resnet50_b32_late.aicf $W/r32.aicf; profile r32
    ;;
  prologue)
    sanitize_stream_k s3 s4
    build_r32
    cp aicfc/templates/gemm_wgmma.cu.j2 /tmp/gemm_wgmma_new.cu.j2
    cp ab_old/gemm_wgmma.cu.j2 aicfc/templates/gemm_wgmma.cu.j2
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_before.aicf --target sm_90 --precision fp16 -q
    cp /tmp/gemm_wgmma_new.cu.j2 aicfc/templates/gemm_wgmma.cu.j2
    timeout 150 python3 benchmarks/plan_ab.py before=$W/r32_before.aicf after=$W/r32.aicf --rounds 7 2>&1 | tail -2 \
        | tee "$OUT/ab_prologue.txt"
    [ "${PROFILE:-1}" = 0 ] || profile r32
    timeout 240 python3 -m pytest -m gpu -q -n 12 tests/test_gemm_wgmma.py tests/test_conv_wgmma.py \
        tests/test_gemm_wgmma_cluster.py 2>&1 | tail -2 | tee "$OUT/tests.txt"
    ;;
  verify)
    build_r32
    python3 -m aicfc explain $W/r32.aicf > "$OUT/explain_r32.txt" 2>&1
    profile r32
    sanitize_test_peer
    ;;
  close)
    # verify without its profile, for a machine that ran `nwg3` (the bundle and its inputs kept; built where not)
    [ -f $W/r32.aicf ] || build_r32
    sanitize_test_peer
    ;;
  chain)
    # every compile first, in parallel (the GPU idle), then the measurements one at a time
    build_r32_tl &
    for c in mobilenet_v2:32 efficientnet_b0:32 mobilenet_v2:1 efficientnet_b0:1; do late_pair $c & done
    wait; ls $W/*.aicf
    for r in 1 2; do timeline_r32 timeline_$r; done
    timeout 90 python3 -m aicf_run $W/r32_tl.aicf --timeline --input $W/resnet50_b32_inputs.npz > "$OUT/timeline.txt" 2>&1
    profile r32
    for r in 1 2; do
      python3 benchmarks/conv_profile_summary.py "$OUT/profile_r32.txt" --timeline "$OUT/timeline_$r.json" 2>&1 | tail -4
    done | tee "$OUT/summary.txt"
    for c in mobilenet_v2:32 efficientnet_b0:32 mobilenet_v2:1 efficientnet_b0:1; do
      n=$(echo $c | sed 's/:/_b/'); echo "## $c"
      timeout 100 python3 benchmarks/plan_ab.py base=$W/${n}_base.aicf late=$W/${n}_late.aicf --rounds 7 2>&1 | tail -2
    done 2>&1 | tee "$OUT/ab_cnns.txt"
    ;;
  card)
    ( build_r32_tl; python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_base.aicf --target sm_90 --precision fp16 \
        -q --pin late=0 ) &
    n=efficientnet_b0_b32
    late_pair efficientnet_b0:32 &
    wait
    timeout 120 python3 -m pytest -m gpu -q -n 4 tests/test_timeline_gpu.py tests/test_late_trigger.py tests/test_pdl.py \
        2>&1 | tail -1 | tee "$OUT/tests.txt"
    timeline_r32 timeline
    timeout 90 python3 -m aicf_run $W/r32_tl.aicf --timeline --input $W/resnet50_b32_inputs.npz > "$OUT/timeline.txt" 2>&1
    profile r32
    python3 benchmarks/conv_profile_summary.py "$OUT/profile_r32.txt" --timeline "$OUT/timeline.json" 2>&1 | tail -3
    { echo "## resnet50:32"; timeout 100 python3 benchmarks/plan_ab.py base=$W/r32_base.aicf late=$W/r32.aicf --rounds 7 2>&1 | tail -2
      echo "## efficientnet_b0:32"; timeout 100 python3 benchmarks/plan_ab.py base=$W/${n}_base.aicf late=$W/${n}_late.aicf \
        --rounds 7 2>&1 | tail -2; } | tee "$OUT/ab_late.txt"
    timeout 240 python3 benchmarks/models.py --cases resnet50:32,resnet50:1 --json "$OUT/models.json" > "$OUT/models.txt" 2>&1
    echo "models rc=$?"; grep -E "^resnet50|^model|FAIL" "$OUT/models.txt"
    ;;
  outputs)
    build_r32
    profile r32
    ;;
  maps)
    build_r32_tl &
    moved_maps_checks
    wait
    alone_and_chain
    ;;
  cap)
    nocap_profile
    ( build_r32_tl; python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_nocap.aicf --target sm_90 --precision fp16 \
        -q --profile $W/nocap.json ) &
    moved_maps_checks
    wait
    alone_and_chain
    timeout 120 python3 benchmarks/plan_ab.py nocap=$W/r32_nocap.aicf cap=$W/r32.aicf --rounds 7 2>&1 | tail -3 \
        | tee "$OUT/ab_cap.txt"
    ;;
  h200)
    ( python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1 &&
      python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --profile h200 --precision fp16 -q &&
      python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_tl.aicf --target sm_90 --profile h200 --precision fp16 \
        -q --timeline ) > $W/compile.log 2>&1; echo "compile rc=$?"
    alone_and_chain
    ;;
  capab)
    nocap_profile
    for c in resnet50:1 mobilenet_v2:32 efficientnet_b0:32; do compile_pair $c nocap "--profile $W/nocap.json" cap & done
    wait
    for c in resnet50:1 mobilenet_v2:32 efficientnet_b0:32; do
      n=$(echo $c | sed 's/:/_b/'); echo "## $c"
      schedules_differ $W/${n}_nocap.aicf $W/${n}_cap.aicf
      timeout 100 python3 benchmarks/plan_ab.py nocap=$W/${n}_nocap.aicf cap=$W/${n}_cap.aicf --rounds 7 2>&1 | tail -2
    done 2>&1 | tee "$OUT/ab_cap_cnns.txt"
    timeout 300 python3 benchmarks/models.py --cases resnet50:32,resnet50:1 --json "$OUT/models.json" > "$OUT/models.txt" 2>&1
    echo "models rc=$?"; grep -E "^resnet50|^model|FAIL" "$OUT/models.txt"
    ;;
  splitpdl)
    nocap_profile
    build_r32
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_nocap.aicf --target sm_90 --precision fp16 -q \
        --profile $W/nocap.json
    for b in r32_nocap r32 r32_nocap r32; do echo "## $b"
      timeout 100 python3 benchmarks/pdl_alone.py $W/$b.aicf --input $W/resnet50_b32_inputs.npz --rounds 3 \
          --kernels k45 k46 k47 k50 k53 k56 2>&1 | tail -7
    done | tee "$OUT/pdl_split.txt"
    ;;
  nwg3)
    # every compile first, on the CPU, while the GPU runs the tests
    ( build_r32_tl; cd ab_old && python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_before.aicf --target sm_90 \
        --precision fp16 -q ) > $W/compile_before.log 2>&1 &
    CP=$!
    timeout 240 python3 -m pytest -m gpu -q -n 8 --tb=short tests/test_conv_wgmma.py tests/test_gemm_wgmma.py \
        -k "three or nwg3 or NWG3" 2>&1 | tail -30 > "$OUT/tests.txt"; tail -1 "$OUT/tests.txt"
    timeout 150 compute-sanitizer --tool memcheck python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_conv_wgmma.py \
        -k "three_warpgroups and (3x3_s1_p1 or wide_k or 7x7_s2_p3_c8)" 2>&1 | tail -3 | tee "$OUT/memcheck.txt"
    wait $CP; echo "compiles rc=$?"
    timeout 120 python3 benchmarks/plan_ab.py before=$W/r32_before.aicf nwg3=$W/r32.aicf --rounds 7 2>&1 | tail -3 \
        | tee "$OUT/ab_nwg3.txt"
    alone_and_chain
    ;;
  nwg3pin)
    [ -f $W/resnet50_b32_inputs.npz ] || python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1
    compile_pin
    profile r32_pin
    ;;
  s82)
    # session 82: ResNet-50 B32 with other schedules pinned on the kernels measured out of the band or far below the bar
    # (stage 4's 1x1s and 3x3s, the stage-2 joined expansion), two bundles (each kernel profiled alone, so one bundle
    # carries one alternative per kernel), profiled beside the plain plan: what those candidates measure against their
    # predictions. va: k51 128x128 ping-pong pairs, k54 3 stages, k49 128x128 k-split clusters, k52 64x128 ping-pong,
    # k50 128x64 (the model's im2col walk at 25.6 us), k53 64x256 split, k16 64x128; vb: k51 256x120, k54 128x256,
    # k49 64x256 split, k52 128x64, k50 64x256 split, k53 128x128 unsplit, k16 64x256
    VA="node_Conv_901:BM=128 node_Conv_901:BN=128 node_Conv_901:PP=1 node_Conv_910:BN=208 node_Conv_910:STAGES=3
        node_Conv_895:BM=128 node_Conv_895:BN=128 node_Conv_895:SPLITK=2 node_Conv_904:NWG=2 node_Conv_904:PP=1
        node_Conv_898:SPLITK=1 node_Conv_898:BM=128 node_Conv_907:BM=64 node_Conv_793:BM=64 node_Conv_793:BN=128"
    VB="node_Conv_901:BM=256 node_Conv_910:BN=256 node_Conv_895:BN=256 node_Conv_904:BM=128 node_Conv_904:BN=64
        node_Conv_898:BN=256 node_Conv_907:SPLITK=1 node_Conv_907:BN=128 node_Conv_793:BN=256"
    python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --precision fp16 -q > $W/compile.log 2>&1 &
    for v in va vb; do
      pins=""; for p in $( [ $v = va ] && echo $VA || echo $VB ); do pins="$pins --pin $p"; done
      python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_$v.aicf --target sm_90 --precision fp16 -q $pins \
          > $W/compile_$v.log 2>&1 &
    done
    wait; tail -n 2 $W/compile*.log
    for v in r32 r32_va r32_vb; do   # seven files back (at most eight come back: session 82's text explains cost the profiles)
      python3 -m aicfc explain --json $W/$v.aicf > "$OUT/explain_$v.json" 2>&1
      profile $v
    done
    ;;
  sweep)
    # session 82: ResNet-50 B32's 3x3 convolutions spread over the im2col engine's tile shapes (benchmarks/im2col_sweep.py:
    # five bundles, the five stage-3 3x3s of one bundle each on its own schedule), each bundle checked and profiled, with
    # the plain plan; everything into $OUT/sweep.tgz (explain --json and profile of each)
    python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1
    mkdir -p $W/sweep
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --precision fp16 -q > $W/compile.log 2>&1 &
    for b in 0 1 2 3 4; do
      python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/sw$b.aicf --target sm_90 --precision fp16 -q \
          $(python3 benchmarks/im2col_sweep.py pins $W/resnet50_b32.onnx $b --device) > $W/compile_sw$b.log 2>&1 &
    done
    wait; tail -n 2 $W/compile*.log
    for v in r32 sw0 sw1 sw2 sw3 sw4; do
      python3 -m aicfc explain --json $W/$v.aicf > $W/sweep/explain_$v.json 2>&1
      timeout 60 python3 -m aicf_run $W/$v.aicf --check $W/resnet50_b32.onnx --input $W/resnet50_b32_inputs.npz 2>&1 \
          | tail -n 2 > $W/sweep/profile_$v.txt
      timeout 120 python3 -m aicf_run $W/$v.aicf --profile --input $W/resnet50_b32_inputs.npz >> $W/sweep/profile_$v.txt 2>&1
      echo "$v: $(grep -c PASS $W/sweep/profile_$v.txt) pass; $(grep 'sum of kernel' $W/sweep/profile_$v.txt)"
    done
    python3 -c "from benchmarks.gemv import copy_gbs; print(round(copy_gbs()))" 2>/dev/null | tail -n 1 > $W/sweep/copy_gbs.txt
    tar -czf "$OUT/sweep.tgz" -C $W sweep
    ;;
  s82v)
    # session 82: `s82min` and more: ResNet-50 B1 under the key profiled; the ping-pong convolution GPU tests; B32 under
    # the key against torch.compile(mode="reduce-overhead")
    python3 benchmarks/export_case.py resnet50:1 --out-dir $W > $W/export_b1.log 2>&1 &
    rows_ab
    python3 -m aicfc compile $W/resnet50_b1.onnx -o $W/r1.aicf --target sm_90 --precision fp16 -q --profile $W/rows.json
    timeout 60 python3 -m aicf_run $W/r1.aicf --check $W/resnet50_b1.onnx --input $W/resnet50_b1_inputs.npz 2>&1 \
        | tail -n 2 > "$OUT/profile_b1.txt"
    timeout 60 python3 -m aicf_run $W/r1.aicf --profile --input $W/resnet50_b1_inputs.npz >> "$OUT/profile_b1.txt" 2>&1
    grep -E "whole plan|within" "$OUT/profile_b1.txt"
    timeout 120 python3 -m pytest -m gpu -q -n 8 tests/test_conv_wgmma.py -k "pingpong or PP or pp" 2>&1 | tail -n 3 \
        | tee "$OUT/tests.txt"
    timeout 150 python3 benchmarks/models.py --cases resnet50:32 --profile $W/rows.json --json /tmp/models.json \
        > "$OUT/models.txt" 2>&1
    echo "models rc=$?"; grep -E "^resnet50|^model|FAIL" "$OUT/models.txt"
    ;;
  s83)
    # session 83: ResNet-50 B32 under three sm_90 profiles: as shipped (before), with `im2col_cap_rows` (rows), and with
    # that and the L2's whole traffic at session 74's measured 9.5 TB/s (rowsl2): a three-way plan A/B (7 rounds), each
    # plan profiled on the same machine (the bars and the band at one process's copy rate), memcheck over `rows`, the
    # `rows` plan's timeline; ResNet-50 B1 A/B'd likewise where a schedule differs. Profiles and timeline in
    # $OUT/profiles.tgz
    python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1
    python3 benchmarks/export_case.py resnet50:1 --out-dir $W > $W/export_b1.log 2>&1 &
    echo '{"base": "sm_90", "name": "sm_90, the im2col cap in pixel rows", "im2col_cap_rows": 128}' > $W/rows.json
    echo '{"base": "sm_90", "name": "rows and the L2 whole traffic", "im2col_cap_rows": 128, "l2_total_gbs": 9500}' \
        > $W/rowsl2.json
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_before.aicf --target sm_90 --precision fp16 -q &
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_rowsl2.aicf --target sm_90 --precision fp16 -q \
        --profile $W/rowsl2.json &
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --precision fp16 -q --profile $W/rows.json
    wait
    { schedules_differ $W/r32_before.aicf $W/r32.aicf; schedules_differ $W/r32_before.aicf $W/r32_rowsl2.aicf; } \
        | tee "$OUT/ab.txt"
    timeout 100 python3 benchmarks/plan_ab.py before=$W/r32_before.aicf rows=$W/r32.aicf rowsl2=$W/r32_rowsl2.aicf \
        --rounds 7 2>&1 | tail -n 4 | tee -a "$OUT/ab.txt"
    OUT0=$OUT; OUT=$W/prof; mkdir -p $OUT
    profile r32_before; profile r32; profile r32_rowsl2
    OUT=$OUT0
    timeout 60 compute-sanitizer --tool memcheck python3 -m aicf_run $W/r32.aicf --no-graph \
        --input $W/resnet50_b32_inputs.npz --output-dir /tmp 2>&1 | tail -n 2 | tee "$OUT/memcheck.txt"
    wait
    python3 -m aicfc compile $W/resnet50_b1.onnx -o $W/r1.aicf --target sm_90 --precision fp16 -q --profile $W/rows.json &
    python3 -m aicfc compile $W/resnet50_b1.onnx -o $W/r1_rowsl2.aicf --target sm_90 --precision fp16 -q \
        --profile $W/rowsl2.json &
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_tl.aicf --target sm_90 --precision fp16 -q --timeline \
        --profile $W/rows.json > $W/compile_tl.log 2>&1 &
    python3 -m aicfc compile $W/resnet50_b1.onnx -o $W/r1_before.aicf --target sm_90 --precision fp16 -q
    wait
    { schedules_differ $W/r1_before.aicf $W/r1.aicf; schedules_differ $W/r1_before.aicf $W/r1_rowsl2.aicf; } \
        | tee "$OUT/ab_b1.txt"
    timeout 60 python3 benchmarks/plan_ab.py before=$W/r1_before.aicf rows=$W/r1.aicf rowsl2=$W/r1_rowsl2.aicf \
        --rounds 7 2>&1 | tail -n 4 | tee -a "$OUT/ab_b1.txt"
    timeout 90 python3 -m aicf_run $W/r32_tl.aicf --timeline --json --input $W/resnet50_b32_inputs.npz \
        > $W/prof/timeline.json 2>&1; echo "timeline rc=$?"
    tar -czf "$OUT/profiles.tgz" -C $W prof
    ;;
  s86)
    # session 86: [Note: a reduce joined into the epilogue] (passes/join_reduce.py): its GPU tests; ResNet-50 B32 with
    # the GEMMs over a stage-1 expansion's whole rows joined where predicted faster (r32) and apart (r32_apart, --pin
    # joinr=0), A/B'd (7 rounds), memcheck over r32, r32 profiled
    pin_round tests/test_join_reduce.py "--pin joinr=0" apart joined
    ;;
  s87|s87q)
    # session 87: [Note: the stem gathers its input] (passes/gather_stem.py; opt-in: --pin gstem=1): the gather's GPU tests
    # and the unfolded stem's (s87: the pool unit's too); ResNet-50 B32 gathering (r32_gather) and with the copy (r32,
    # the default), A/B'd (s87: 7 rounds, s87q: 5), r32_gather checked, memcheck over one run of it, profiled
    tests="tests/test_gather_stem.py tests/test_unfold_taps.py"; [ "$1" = s87q ] || tests="$tests tests/test_conv_pool.py"
    timeout 300 python3 -m pytest -q -n 10 -m gpu $tests 2>&1 | tail -n 3 | tee "$OUT/tests.txt"
    python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_gather.aicf --target sm_90 --precision fp16 -q --pin gstem=1 &
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --precision fp16 -q
    wait
    timeout 100 python3 benchmarks/plan_ab.py copy=$W/r32.aicf gather=$W/r32_gather.aicf --rounds $([ "$1" = s87q ] \
        && echo 5 || echo 7) 2>&1 | tail -n 3 | tee "$OUT/ab.txt"
    timeout 60 compute-sanitizer --tool memcheck python3 -m aicf_run $W/r32_gather.aicf --no-graph \
        --input $W/resnet50_b32_inputs.npz --output-dir /tmp 2>&1 | tail -n 2 | tee "$OUT/memcheck.txt"
    profile r32_gather
    ;;
  s88|s88q)
    # session 88: the gathering stem loading in turn (r32_gather, --pin gstem=1) and a tile ahead (r32_ahead, GA=1,
    # [Note: a tile's loads ahead]) against the copy (r32): their GPU tests, a three-way A/B (5 rounds), memcheck over
    # one run of each gathering plan, both profiled (r32_ahead only where GEN=0 leaves the time); s88q: the A/B and
    # the profiles first, then the tests and memcheck (a budget of a few minutes: what matters most comes back first).
    # Session 90's call of s88q (a fresh H100) ran out its 420 s with nothing back: the three-way A/B under `timeout 120`
    # printed nothing and the profile after it was cut off. So every step is now stamped into $OUT/steps.txt, each
    # plan runs once alone under a short limit first (a plan that hangs shows as rc 124 and is left out of the rest),
    # and the A/B's own progress (benchmarks/plan_ab.py's stderr) goes to $OUT/ab.txt whole
    step() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a "$OUT/steps.txt"; }
    gather_tests() {   # the gathering stem's and the unfolded stem's GPU tests, under a limit of $1 seconds
      timeout "$1" python3 -m pytest -q -n 10 -m gpu tests/test_gather_stem.py tests/test_unfold_taps.py 2>&1 \
          | tail -n 3 | tee "$OUT/tests.txt"
    }
    if [ "$1" = s88 ]; then gather_tests 300; fi
    step export; python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1
    step compile
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_gather.aicf --target sm_90 --precision fp16 -q --pin gstem=1 &
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_ahead.aicf --target sm_90 --precision fp16 -q --pin gstem=1 \
        --pin GA=1 &
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --precision fp16 -q
    wait
    ran=()
    for b in r32 r32_gather r32_ahead; do
      timeout 45 python3 -m aicf_run $W/$b.aicf --no-graph --input $W/resnet50_b32_inputs.npz --output-dir /tmp \
          > $W/run_$b.log 2>&1
      rc=$?; step "one run of $b: rc $rc$([ $rc = 124 ] && echo ' (cut off at 45 s: a hang?)')"; tail -n 2 $W/run_$b.log
      if [ $rc = 0 ]; then ran+=($b); fi
    done
    step "A/B of ${ran[*]}"
    ab=(); for b in "${ran[@]}"; do n=${b#r32_}; ab+=("${n/r32/copy}=$W/$b.aicf"); done
    timeout 150 python3 benchmarks/plan_ab.py "${ab[@]}" --rounds 5 > "$OUT/ab.txt" 2>&1; step "A/B rc $?"
    tail -n 4 "$OUT/ab.txt"
    gathering=(); for b in "${ran[@]}"; do [ $b = r32 ] || gathering+=($b); done
    if [ "$1" = s88q ]; then
      for b in "${gathering[@]}"; do step "profile $b"; profile $b; done
      step tests; gather_tests 200
    fi
    for b in "${gathering[@]}"; do
      step "memcheck $b"
      timeout 60 compute-sanitizer --tool memcheck python3 -m aicf_run $W/$b.aicf --no-graph \
          --input $W/resnet50_b32_inputs.npz --output-dir /tmp 2>&1 | tail -n 2 | sed "s/^/$b: /" | tee -a "$OUT/memcheck.txt"
    done
    if [ "$1" = s88 ]; then
      for b in "${gathering[@]}"; do
        if [ $b = r32_gather ] || [ "${GEN:-1}" = 0 ]; then step "profile $b"; profile $b; fi
      done
    fi
    step done
    ;;
  s87m)
    # session 87, after s87 on the same machine: racecheck over r32_gather; ResNet-50 B1 gathering and with the copy
    # A/B'd; ResNet-50 B32 and B1 against torch.compile(mode="reduce-overhead") (the default plans)
    timeout 150 compute-sanitizer --tool racecheck python3 -m aicf_run $W/r32_gather.aicf --no-graph \
        --input $W/resnet50_b32_inputs.npz --output-dir /tmp 2>&1 | tail -n 2 | tee "$OUT/racecheck.txt"
    compile_pair resnet50:1 gather "--pin gstem=1" copy
    schedules_differ $W/resnet50_b1_copy.aicf $W/resnet50_b1_gather.aicf | tee "$OUT/ab_b1.txt"
    timeout 100 python3 benchmarks/plan_ab.py copy=$W/resnet50_b1_copy.aicf gather=$W/resnet50_b1_gather.aicf \
        --rounds 7 2>&1 | tail -n 3 | tee -a "$OUT/ab_b1.txt"
    timeout 60 python3 -m aicf_run $W/resnet50_b1_gather.aicf --check $W/resnet50_b1.onnx \
        --input $W/resnet50_b1_inputs.npz 2>&1 | tail -n 2 | tee -a "$OUT/ab_b1.txt"
    timeout 330 python3 benchmarks/models.py --cases resnet50:32,resnet50:1 > "$OUT/models.txt" 2>&1; tail -n 3 "$OUT/models.txt"
    ;;
  s86b)
    # session 86: joins of 64 columns by prediction (the default: r32), every legal join (--pin joinr=1: r32_all, s86's
    # plan) and none (r32_apart), a three-way A/B (7 rounds); r32 checked and profiled
    python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_all.aicf --target sm_90 --precision fp16 -q --pin joinr=1 &
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_apart.aicf --target sm_90 --precision fp16 -q --pin joinr=0 &
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --precision fp16 -q
    wait
    schedules_differ $W/r32_apart.aicf $W/r32.aicf | tee "$OUT/ab.txt"
    timeout 120 python3 benchmarks/plan_ab.py apart=$W/r32_apart.aicf joined=$W/r32.aicf all=$W/r32_all.aicf --rounds 7 \
        2>&1 | tail -n 4 | tee -a "$OUT/ab.txt"
    profile r32
    ;;
  s86s)
    # session 86: stage 1's shapes as a block pair (benchmarks/join_reduce_shapes.py), 64 and 128 columns joined and
    # apart, the 128-column join on other host tiles: A/B'd (5 rounds each), each bundle profiled
    python3 benchmarks/join_reduce_shapes.py $W/jrs | tee "$OUT/shapes.txt"
    timeout 60 python3 benchmarks/plan_ab.py apart=$W/jrs/n64_apart.aicf joined=$W/jrs/n64_joined.aicf --rounds 5 \
        2>&1 | tail -n 3 | tee -a "$OUT/shapes.txt"
    timeout 90 python3 benchmarks/plan_ab.py apart=$W/jrs/n128_apart.aicf joined=$W/jrs/n128_joined.aicf \
        pp=$W/jrs/n128_pp.aicf ts0=$W/jrs/n128_ts0.aicf --rounds 5 2>&1 | tail -n 5 | tee -a "$OUT/shapes.txt"
    for c in n64_apart n64_joined n128_apart n128_joined n128_pp n128_ts0; do
      echo "## $c"; timeout 60 python3 -m aicf_run $W/jrs/$c.aicf --profile 2>&1 | grep -E "^\s+[0-9]+\s+k|whole plan"
    done 2>&1 | tee -a "$OUT/shapes.txt"
    ;;
  s86t)
    # session 86, the final tree: ResNet-50 B32 (joins by prediction) profiled alone and timed in the chain (a bundle
    # compiled with --timeline): each convolution judged both ways
    build_r32_tl
    alone_and_chain
    ;;
  s86b8)
    # session 86: ResNet-50 B8 with the joins by prediction and apart (--pin joinr=0), A/B'd (7 rounds), checked
    python3 benchmarks/export_case.py resnet50:8 --out-dir $W > $W/export_b8.log 2>&1
    python3 -m aicfc compile $W/resnet50_b8.onnx -o $W/r8_apart.aicf --target sm_90 --precision fp16 -q --pin joinr=0 &
    python3 -m aicfc compile $W/resnet50_b8.onnx -o $W/r8.aicf --target sm_90 --precision fp16 -q
    wait
    schedules_differ $W/r8_apart.aicf $W/r8.aicf | tee "$OUT/ab_b8.txt"
    timeout 100 python3 benchmarks/plan_ab.py apart=$W/r8_apart.aicf joined=$W/r8.aicf --rounds 7 2>&1 | tail -n 3 \
        | tee -a "$OUT/ab_b8.txt"
    timeout 60 python3 -m aicf_run $W/r8.aicf --check $W/resnet50_b8.onnx --input $W/resnet50_b8_inputs.npz 2>&1 \
        | tail -2 | tee -a "$OUT/ab_b8.txt"
    ;;
  s86m)
    # session 86, after s86b: racecheck over r32; ResNet-50 B32 and B1 against torch.compile(mode="reduce-overhead")
    timeout 150 compute-sanitizer --tool racecheck python3 -m aicf_run $W/r32.aicf --no-graph \
        --input $W/resnet50_b32_inputs.npz --output-dir /tmp 2>&1 | tail -n 2 | tee "$OUT/racecheck.txt"
    timeout 330 python3 benchmarks/models.py --cases resnet50:32,resnet50:1 > "$OUT/models.txt" 2>&1; tail -n 3 "$OUT/models.txt"
    ;;
  s85)
    # session 85: the resident-B GPU tests; ResNet-50 B32 with B resident where the cost picks it (r32) and with B through
    # the ring everywhere (r32_ring, --pin BRES=0), A/B'd, memcheck over r32, both profiled
    pin_round tests/test_b_resident.py "--pin BRES=0" ring resident
    profile r32_ring
    ;;
  s85p)
    # session 85, after s85 on the same machine: the stage-3 expansions (k32 k35 k38 k41 k44, by their export's node
    # names) pinned to B resident (BRES = 8: two columns of 128, four k-blocks) where the cost left them in the ring;
    # a three-way A/B (7 rounds) against s85's bundles; the pinned plan profiled
    P=""; for n in 844 853 862 871 880; do P="$P --pin node_Conv_$n:BRES=8"; done
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_s3.aicf --target sm_90 --precision fp16 -q $P
    schedules_differ $W/r32.aicf $W/r32_s3.aicf | tee "$OUT/ab_s3.txt"
    timeout 120 python3 benchmarks/plan_ab.py ring=$W/r32_ring.aicf resident=$W/r32.aicf s3=$W/r32_s3.aicf --rounds 7 \
        2>&1 | tail -n 4 | tee -a "$OUT/ab_s3.txt"
    profile r32_s3
    ;;
  s85t)
    # session 85, after s85: `aicfc tune` of the memory-bound 1x1 GEMMs B residency reaches (k9, k16, k30, k32, k49 by
    # their export's node names), the model's 24 best and 4 spread, B resident and in the ring alike
    K=""; for n in 775 793 838 844 895; do K="$K --kernel node_Conv_$n"; done
    timeout 500 python3 -m aicfc tune $W/resnet50_b32.onnx --target sm_90 --precision fp16 --top 24 --spread 4 $K \
        --json "$OUT/tune_s85.json" > "$OUT/tune_s85.txt" 2>&1; echo "tune rc=$?"; tail -n 40 "$OUT/tune_s85.txt"
    ;;
  s85v)
    # session 85, the final tree (ab_old/: a copy of ec27ece's package, the tree before, carried): the Hopper GEMM,
    # convolution, resident-B, residual-staging and join GPU tests; MobileNetV2 and EfficientNet-B0 B32 compiled
    # now and before, A/B'd (7 rounds) where a schedule differs
    timeout 330 python3 -m pytest -m gpu -q -n 8 tests/test_gemm_wgmma.py tests/test_conv_wgmma.py \
        tests/test_b_resident.py tests/test_residual_staging.py tests/test_join_concat.py 2>&1 | tail -n 4 \
        | tee "$OUT/tests.txt"
    for c in mobilenet_v2:32 efficientnet_b0:32; do
      n=$(echo $c | sed 's/:/_b/')
      now_and_before $c $n now
      echo "## $c"
      ab_before $n now
    done 2>&1 | tee "$OUT/ab_cnns.txt"
    ;;
  s85w)
    # session 85: the stage-3 expansions (k32 k35 k38 k41 k44) pinned to two other resident-B tiles, 64x256 ping-pong
    # (BRES = 4) and 128x128 cooperative (BRES = 8), against the default (64x128 ping-pong, BRES = 8): A/B'd, profiled
    python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1
    P=""; Q=""; for n in 844 853 862 871 880; do
      P="$P --pin node_Conv_$n:BN=256 --pin node_Conv_$n:BRES=4"
      Q="$Q --pin node_Conv_$n:PP=0 --pin node_Conv_$n:BM=128 --pin node_Conv_$n:BN=128 --pin node_Conv_$n:BRES=8"
    done
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --precision fp16 -q &
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_w256.aicf --target sm_90 --precision fp16 -q $P &
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_coop.aicf --target sm_90 --precision fp16 -q $Q
    wait
    timeout 100 python3 benchmarks/plan_ab.py default=$W/r32.aicf w256=$W/r32_w256.aicf coop=$W/r32_coop.aicf \
        --rounds 5 2>&1 | tail -n 4 | tee "$OUT/ab_w.txt"
    profile r32_w256
    profile r32_coop
    ;;
  s85m)
    # session 85, after s85 on the same machine: racecheck over r32's plan; MobileNetV2 B32 with B resident and in the
    # ring, A/B'd; ResNet-50 B32 and B1 against torch.compile(mode="reduce-overhead")
    timeout 150 compute-sanitizer --tool racecheck python3 -m aicf_run $W/r32.aicf --no-graph \
        --input $W/resnet50_b32_inputs.npz --output-dir /tmp 2>&1 | tail -n 2 | tee "$OUT/racecheck.txt"
    compile_pair mobilenet_v2:32 ring "--pin BRES=0" resident
    schedules_differ $W/mobilenet_v2_b32_ring.aicf $W/mobilenet_v2_b32_resident.aicf | tee "$OUT/ab_mv2.txt"
    timeout 100 python3 benchmarks/plan_ab.py ring=$W/mobilenet_v2_b32_ring.aicf \
        resident=$W/mobilenet_v2_b32_resident.aicf --rounds 7 2>&1 | tail -n 3 | tee -a "$OUT/ab_mv2.txt"
    timeout 330 python3 benchmarks/models.py --cases resnet50:32,resnet50:1 > "$OUT/models.txt" 2>&1; tail -n 3 "$OUT/models.txt"
    ;;
  s84)
    # session 84: the join's GPU tests; ResNet-50 B32 with the Concats joined (r32) and kept (r32_kept, --pin concat=0),
    # A/B'd; r32 checked against onnxruntime, under memcheck and profiled (B1 and the peer: s84m)
    pin_round tests/test_join_concat.py "--pin concat=0" kept joined
    ;;
  s84m)
    # session 84, after s84 on the same machine: ResNet-50 B1 with the Concats joined and kept, A/B'd; B32 and B1
    # against torch.compile(mode="reduce-overhead")
    python3 benchmarks/export_case.py resnet50:1 --out-dir $W > $W/export_b1.log 2>&1
    python3 -m aicfc compile $W/resnet50_b1.onnx -o $W/r1_cat.aicf --target sm_90 --precision fp16 -q --pin concat=0 &
    python3 -m aicfc compile $W/resnet50_b1.onnx -o $W/r1.aicf --target sm_90 --precision fp16 -q
    wait
    timeout 60 python3 benchmarks/plan_ab.py kept=$W/r1_cat.aicf joined=$W/r1.aicf --rounds 7 2>&1 | tail -n 3 \
        | tee -a "$OUT/ab.txt"
    timeout 330 python3 benchmarks/models.py --cases resnet50:32,resnet50:1 > "$OUT/models.txt" 2>&1; tail -n 3 "$OUT/models.txt"
    ;;
  s84r)
    # session 84, at a tree (since reverted) whose cooperative RS = 1 tiles of 4+ k-blocks copied the residual in after
    # their first k-block (measured 1.000x: [Note: residual through the staging]): the residual-staging GPU tests
    # (late_4kb was that tree's case), racecheck over the long-K cooperative ones; ResNet-50 B32 compiled by the tree
    # before (ab_old/aicfc, a copy of the previous commit's package) and that one (only k51/k54 differ), A/B'd (7
    # rounds), the new plan profiled
    timeout 150 python3 -m pytest -q -m gpu tests/test_residual_staging.py 2>&1 | tail -n 3 | tee "$OUT/tests.txt"
    timeout 120 compute-sanitizer --tool racecheck python3 -m pytest -q -m gpu tests/test_residual_staging.py \
        -k "late_4kb or long_k_coop" 2>&1 | tail -n 3 | tee "$OUT/racecheck.txt"
    build_now_and_before
    timeout 100 python3 benchmarks/plan_ab.py early=$W/r32_before.aicf late=$W/r32.aicf --rounds 7 2>&1 | tail -n 3 \
        | tee "$OUT/ab.txt"
    profile r32
    ;;
  s83h)
    # session 83 on an H200: ResNet-50 B32 under sm_90 before the key (norows), sm_90 as it is now (the key) and the
    # bundled h200 profile, a three-way plan A/B (7 rounds); then the 1 B Llama's 20-layer B1 generate step against
    # its bandwidth limit (issue 19; no peer: benchmarks/generate.py --no-peer)
    python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1
    echo '{"base": "sm_90", "name": "sm_90 without im2col_cap_rows", "im2col_cap_rows": 0}' > $W/norows.json
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_norows.aicf --target sm_90 --precision fp16 -q \
        --profile $W/norows.json &
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32_h200.aicf --target sm_90 --precision fp16 -q --profile h200 &
    python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --precision fp16 -q
    wait
    schedules_differ $W/r32_norows.aicf $W/r32.aicf | tee "$OUT/ab_h200.txt"
    timeout 100 python3 benchmarks/plan_ab.py norows=$W/r32_norows.aicf rows=$W/r32.aicf h200=$W/r32_h200.aicf \
        --rounds 7 2>&1 | tail -n 4 | tee -a "$OUT/ab_h200.txt"
    [ "${GEN:-1}" = 0 ] && exit 0   # GEN=0: the A/B only (a budget of a few minutes)
    timeout 330 python3 benchmarks/generate.py --layers 20 --batch 1 --no-peer --folder /tmp/gen --jobs 16 \
        > "$OUT/generate_b1.txt" 2>&1; echo "generate rc=$?"; grep -E "bandwidth limit|copy bandwidth" "$OUT/generate_b1.txt"
    ;;
  s82min)
    # session 82: the sm_90 profile with `im2col_cap_rows` against it as it is (`rows_ab`), for a budget of minutes
    rows_ab
    ;;
  s81min)
    # `s81` for a device budget of a few minutes: the A/B against the previous package and the profile only
    build_now_and_before; echo "compiles rc=$?"
    timeout 90 python3 benchmarks/plan_ab.py before=$W/r32_before.aicf nwg3=$W/r32.aicf --rounds 5 2>&1 | tail -3 \
        | tee "$OUT/ab_nwg3.txt"
    profile r32
    ;;
  s81)
    # session 81: `nwg3` (without the chain's timeline) and `nwg3pin` in one call, the compiles in parallel on the CPU
    # while the GPU runs the tests
    build_now_and_before pin &
    CP=$!
    timeout 240 python3 -m pytest -m gpu -q -n 8 --tb=short tests/test_conv_wgmma.py tests/test_gemm_wgmma.py \
        -k "three or nwg3 or NWG3" 2>&1 | tail -30 > "$OUT/tests.txt"; tail -1 "$OUT/tests.txt"
    timeout 150 compute-sanitizer --tool memcheck python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_conv_wgmma.py \
        -k "three_warpgroups and (3x3_s1_p1 or wide_k or 7x7_s2_p3_c8)" 2>&1 | tail -3 | tee "$OUT/memcheck.txt"
    wait $CP; echo "compiles rc=$?"; cp $W/compile_pin.log "$OUT/" 2>/dev/null
    timeout 120 python3 benchmarks/plan_ab.py before=$W/r32_before.aicf nwg3=$W/r32.aicf --rounds 7 2>&1 | tail -3 \
        | tee "$OUT/ab_nwg3.txt"
    profile r32
    profile r32_pin
    ;;
  nwg3ab)
    # CASE:STEM[:EXPORT FLAGS]; each exported, compiled now and by ab_old/aicfc, A/B'd where a schedule differs
    CASES="efficientnet_b0:32/efficientnet_b0_b32 bert:8x512/bert_b8_s512 gpt2:8x512/gpt2_b8_s512 llama:1x512/llama_b1_s512_l2"
    for cs in $CASES; do
      c=${cs%/*}; n=${cs#*/}; extra=""; [ "${c%%:*}" = llama ] && extra="--layers 2"
      now_and_before $c $n nwg3 "$extra" &
    done
    wait
    for cs in $CASES; do
      c=${cs%/*}; n=${cs#*/}; echo "## $c"
      ab_before $n nwg3
    done 2>&1 | tee "$OUT/ab_nwg3_models.txt"
    ;;
  *) echo "usage: $0 unfold|halo|final|h100|pairs|lockstep|split|clusters|cnns|l2bytes|verify|close|streamk|prologue|pdl|late|chain|card|outputs|maps|cap|h200|capab|splitpdl|nwg3|nwg3pin|nwg3ab|s81|s81min|s82min|s83h|s84|s84m|s84r|s85|s85p|s85t|s85v|s85w|s85m" >&2; exit 2 ;;
esac
