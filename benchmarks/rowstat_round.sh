#!/usr/bin/env bash
# The GPU checks of the row statistic from a tensor-core gemv's own activations ([Note: the row statistic from the
# stream] in codegen/gemm_gemv.py: the decode step's norms folded into their gemvs at 8 rows), each a device call of
# under 10 minutes:
#   bash benchmarks/rowstat_round.sh check      # the row-scale GPU tests (B8 fp16 / bf16 folded and apart against
#                                               # onnxruntime) and compute-sanitizer memcheck on the folded B8 case, then
#                                               # the 1 B Llama's 4-layer B8 decode plan folded against its norms apart
#   bash benchmarks/rowstat_round.sh generate   # the 20-layer B8 step, P512 + 256, and its profile (no peer)
# Logs go to $OUT (the device tool's output folder), or /tmp/out.
set -uo pipefail
cd "$(dirname "$0")/.."
source .gpu/env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu_$1.txt"
case "$1" in
  check)
    timeout 200 python3 -m pytest -q -m gpu tests/test_row_scale.py 2>&1 | tail -6 | tee "$OUT/tests.txt"
    timeout 120 compute-sanitizer --tool memcheck --target-processes all python3 -m pytest -q -m gpu \
        "tests/test_row_scale.py::test_gpu_decode_step_matches_onnxruntime[1-8-1-fp16]" 2>&1 | grep -E "ERROR SUMMARY|passed|failed" | tee "$OUT/sanitizer.txt"
    timeout 120 python3 benchmarks/decode_ab.py --layers 4 --batch 8 --compile-only --folder /tmp/ab8 --jobs 16 \
        --variant folded: --variant apart:pin.rowscale=0 2>&1 | grep -i "compiled\|error\|Traceback"
    timeout 200 python3 benchmarks/decode_ab.py --layers 4 --batch 8 --rounds 5 --folder /tmp/ab8 --jobs 16 \
        --bundle folded=/tmp/ab8/folded.aicf --bundle apart=/tmp/ab8/apart.aicf 2>&1 | grep -v "decode gemvs" \
        | tee "$OUT/rowstat_ab_b8.txt" | tail -6
    ;;
  generate)
    timeout 560 python3 benchmarks/generate.py --batch 8 --no-peer --profile \
        --json "$OUT/generate_b8.json" 2>&1 | tee "$OUT/generate_b8.txt" | tail -40
    ;;
  *)
    echo "usage: bash benchmarks/rowstat_round.sh check|generate" >&2
    exit 2
    ;;
esac
