#!/usr/bin/env bash
# The GPU checks of session 9's cost and benchmark changes, in two device calls (each under 10 minutes):
#   bash benchmarks/gpu_cost_round.sh predictions   # every GEMM kernel of BERT/GPT-2 against the model, alone and
#                                                   # in its plan, with the default profile and one that sets the
#                                                   # SM's L2 port ([Note: L2 share of a small grid])
#   bash benchmarks/gpu_cost_round.sh gemm          # GEMMs against cuBLAS, replays paired; the GEMM GPU tests
# Logs go to $OUT (the device tool's output folder), or /tmp/out.
set -uo pipefail
source .gpu/env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu_$1.txt"
quiet() { grep -v -i "warn\|onnxscript\|exporter\|^\s*$"; }
case "$1" in
  predictions)
    python3 - <<'EOF'
import json
from aicfc.planner.hardware import load_profile
json.dump({**load_profile("sm_90").data, "sm_l2_port_gbs": 130.0}, open("/tmp/sm_90_port.json", "w"))
EOF
    python3 benchmarks/gemm_predictions.py --json "$OUT/pred_default.json" 2>&1 | quiet > "$OUT/pred_default.txt"
    tail -4 "$OUT/pred_default.txt"
    python3 benchmarks/gemm_predictions.py --profile /tmp/sm_90_port.json --json "$OUT/pred_port.json" 2>&1 | quiet \
        > "$OUT/pred_port.txt"
    tail -4 "$OUT/pred_port.txt"
    ;;
  gemm)
    python3 benchmarks/gemm.py --precision fp16 --precision bf16 --shape 4096x4096x4096 --shape 8192x8192x8192 \
        --shape 4096x768x768 --shape 4096x3072x768 --shape 4096x768x3072 --paired --reps 60 2>&1 | tee "$OUT/gemm.txt" \
        | grep -v "^\s*$" | tail -14
    python3 benchmarks/gemm.py --precision tf32 --shape 4096x4096x4096 --paired --reps 30 2>&1 | tee -a "$OUT/gemm.txt" | tail -3
    python3 -m pytest -m gpu -q -n 14 tests/test_gemm_wgmma.py tests/test_gemm_gpu.py tests/test_gemm_wgmma_cluster.py \
        2>&1 | tail -4 | tee "$OUT/tests.txt"
    ;;
  *) echo "usage: $0 predictions|gemm" >&2; exit 2 ;;
esac
