#!/usr/bin/env bash
# The GPU checks of session 9's cost and benchmark changes, in two device calls (each under 10 minutes):
#   bash benchmarks/gpu_cost_round.sh predictions   # every GEMM kernel of BERT/GPT-2 against the model, alone and
#                                                   # in its plan, with the default profile and one that sets the
#                                                   # SM's L2 port ([Note: L2 share of a small grid])
#   bash benchmarks/gpu_cost_round.sh gemm          # GEMMs against cuBLAS, replays paired; the GEMM GPU tests
#   bash benchmarks/gpu_cost_round.sh verify        # predictions under the current profile, paired GEMMs, ResNet-50 B32 profile
#   bash benchmarks/gpu_cost_round.sh refit NAME '{"key": value}' ...   # predictions under changed profile keys
# Logs go to $OUT (the device tool's output folder), or /tmp/out.
source "$(dirname "$0")/round_env.sh" "gpu_$1.txt"
quiet() { grep -v -i "warn\|onnxscript\|exporter\|^\s*$"; }
# profile NAME JSON: /tmp/sm_90_NAME.json, the sm_90 profile with JSON's keys changed
profile() {
  python3 -c 'import json, sys
from aicfc.planner.hardware import load_profile
json.dump({**load_profile("sm_90").data, **json.loads(sys.argv[2])}, open(f"/tmp/sm_90_{sys.argv[1]}.json", "w"))' "$1" "$2"
}
# predict NAME [PROFILE]: gemm_predictions.py (under PROFILE) into $OUT/pred_NAME.txt and .json
predict() {
  python3 benchmarks/gemm_predictions.py ${2:+--profile "$2"} --json "$OUT/pred_$1.json" 2>&1 | quiet > "$OUT/pred_$1.txt"
  tail -4 "$OUT/pred_$1.txt"
}
# paired REPS SECONDS: the GEMMs against cuBLAS, replays paired (fp16/bf16 with REPS pairs, tf32 with half),
# each gemm.py run stopped after SECONDS (0: not stopped); into $OUT/gemm.txt
paired() {
  timeout "$2" python3 benchmarks/gemm.py --precision fp16 --precision bf16 --shape 4096x4096x4096 \
      --shape 8192x8192x8192 --shape 4096x768x768 --shape 4096x3072x768 --shape 4096x768x3072 --paired --reps "$1" \
      2>&1 | tee "$OUT/gemm.txt" | grep -v "^\s*$" | tail -14
  timeout "$2" python3 benchmarks/gemm.py --precision tf32 --shape 4096x4096x4096 --paired --reps $(( $1 / 2 )) 2>&1 \
      | tee -a "$OUT/gemm.txt" | tail -3
}
case "$1" in
  predictions)
    profile port '{"sm_l2_port_gbs": 130.0}'
    predict default
    predict port /tmp/sm_90_port.json
    ;;
  refit)
    # bash benchmarks/gpu_cost_round.sh refit NAME '{profile keys}' [NAME '{...}' ...]: the predictions round
    # under the sm_90 profile with those keys changed, one pass per NAME
    shift
    while [ $# -ge 2 ]; do
      profile "$1" "$2"
      predict "$1" "/tmp/sm_90_$1.json"
      shift 2
    done
    ;;
  verify)
    # session 10's closing round: the GEMM kernels against the current profile's predictions, GEMMs against
    # cuBLAS (paired replays), ResNet-50 B32's per-kernel profile
    predict current
    W=/tmp/r50; mkdir -p $W
    ( python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1 &&
      python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --precision fp16 -q ) > $W/compile.log 2>&1 &
    CP=$!
    paired 40 200
    wait $CP; echo "resnet compile rc=$?"; tail -2 $W/compile.log
    timeout 60 python3 -m aicf_run $W/r32.aicf --check $W/resnet50_b32.onnx --input $W/resnet50_b32_inputs.npz 2>&1 \
        | tail -2 | tee "$OUT/profile_r32.txt"
    timeout 120 python3 -m aicf_run $W/r32.aicf --profile --input $W/resnet50_b32_inputs.npz >> "$OUT/profile_r32.txt" 2>&1
    python3 benchmarks/conv_profile_summary.py "$OUT/profile_r32.txt" 2>&1 | tail -8
    ;;
  gemm)
    paired 60 0
    python3 -m pytest -m gpu -q -n 14 tests/test_gemm_wgmma.py tests/test_gemm_gpu.py tests/test_gemm_wgmma_cluster.py \
        2>&1 | tail -4 | tee "$OUT/tests.txt"
    ;;
  *) echo "usage: $0 predictions|gemm|verify|refit NAME JSON ..." >&2; exit 2 ;;
esac
