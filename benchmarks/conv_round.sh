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
#                                          # (0.02) and an H100's own l2_total_gbs (9500, ncu) over sm_90's; ResNet-50 B32,
#                                          # BERT-base B8 S512 and GPT-2 B8 S512 compiled both ways, each A/B'd by whole-plan
#                                          # replays (benchmarks/plan_ab.py, 7 alternating rounds), ResNet-50's both profiled
#   bash benchmarks/conv_round.sh verify   # after a planner change (session 74): ResNet-50 B32 compiled (its explain kept),
#                                          # checked and profiled; memcheck and racecheck over one run of its plan; the
#                                          # Hopper GEMM and convolution GPU tests; ResNet-50 B32 and B1 against torch.compile
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
  timeout 100 python3 -m aicf_run $W/$1.aicf --profile --input $W/resnet50_b32_inputs.npz >> "$OUT/profile_$1.txt" 2>&1
  # the bars at this GPU's copy rate (the summary's default is an H200's: session 73 on an H100 printed 8 at the bar for 21)
  [ -n "${COPY:-}" ] || COPY=$(python3 -c "from benchmarks.gemv import copy_gbs; print(round(copy_gbs()))" 2>/dev/null | tail -1)
  echo "copy bandwidth ${COPY:-unmeasured} GB/s" | tee -a "$OUT/profile_$1.txt"
  python3 benchmarks/conv_profile_summary.py "$OUT/profile_$1.txt" 2>&1 | tail -3   # it reads the line above
  grep -E "^\s+[01]\s+k|whole plan" "$OUT/profile_$1.txt"
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
    printf '{"base": "sm_90", "cluster_lockstep": 0.02, "l2_total_gbs": 9500}\n' > /tmp/sm90_lockstep.json
    for c in resnet50:32 bert:8x512 gpt2:8x512; do
      n=$(echo $c | sed 's/:/_b/; s/x/_s/')
      python3 benchmarks/export_case.py $c --out-dir $W > $W/export_$n.log 2>&1 || { echo "export $c failed"; continue; }
      python3 -m aicfc compile $W/$n.onnx -o $W/${n}_base.aicf --target sm_90 --precision fp16 -q &&
        python3 -m aicfc compile $W/$n.onnx -o $W/${n}_ls.aicf --target sm_90 --precision fp16 -q \
            --profile /tmp/sm90_lockstep.json || { echo "compile $c failed"; continue; }
      timeout 120 python3 benchmarks/plan_ab.py base=$W/${n}_base.aicf lockstep=$W/${n}_ls.aicf --rounds 7 \
          --json "$OUT/ab_$n.json" 2>&1 | tail -3 | tee "$OUT/ab_$n.txt"
    done
    cp $W/resnet50_b32_base.aicf $W/r32.aicf; profile r32; cp "$OUT/profile_r32.txt" "$OUT/profile_base.txt"
    cp $W/resnet50_b32_ls.aicf $W/r32.aicf; profile r32; cp "$OUT/profile_r32.txt" "$OUT/profile_lockstep.txt"
    ;;
  verify)
    build_r32
    python3 -m aicfc explain $W/r32.aicf > "$OUT/explain_r32.txt" 2>&1
    profile r32
    for tool in memcheck racecheck; do
      timeout 150 compute-sanitizer --tool $tool python3 -m aicf_run $W/r32.aicf --no-graph \
          --input $W/resnet50_b32_inputs.npz --output-dir /tmp 2>&1 | tail -2 | tee "$OUT/$tool.txt"
    done
    timeout 200 python3 -m pytest -m gpu -q -n 8 tests/test_gemm_wgmma.py tests/test_conv_wgmma.py 2>&1 | tail -3 \
        | tee "$OUT/tests.txt"
    timeout 200 python3 benchmarks/models.py --cases resnet50:32,resnet50:1 --json "$OUT/models.json" > "$OUT/models.txt" 2>&1
    echo "models rc=$?"; grep -E "^resnet50|^model|FAIL" "$OUT/models.txt"
    ;;
  *) echo "usage: $0 unfold|halo|final|h100|pairs|lockstep|verify" >&2; exit 2 ;;
esac
