#!/usr/bin/env bash
# One GPU call: the GEMM kernels of BERT-base and GPT-2 small against the cost model, GEMMs against cuBLAS
# in many short alternating rounds, and the GEMM GPU tests. Logs under $OUT (the device tool's output folder).
set -uo pipefail
source .gpu/env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 benchmarks/gemm_predictions.py --json "$OUT/pred.json" 2>&1 | grep -v -i "warn\|onnxscript\|exporter\|^\s*$" > "$OUT/pred.txt"
tail -3 "$OUT/pred.txt"
python3 benchmarks/gemm.py --precision fp16 --precision bf16 --shape 4096x4096x4096 --shape 8192x8192x8192 \
    --shape 4096x768x768 --shape 4096x3072x768 --shape 4096x768x3072 --rounds 11 --reps 15 2>&1 | tee "$OUT/gemm.txt" | grep -v "^\s*$" | tail -14
python3 -m pytest -m gpu -q -n 14 tests/test_gemm_wgmma.py tests/test_gemm_gpu.py tests/test_gemm_wgmma_cluster.py 2>&1 | tail -4 | tee "$OUT/tests.txt"
