#!/usr/bin/env bash
# Session 68's GPU checks (issue 19): the gemv weight loads with an L2 prefetch size ([Note: the weight loads' L2
# hints] in codegen/gemm_gemv.py, the switch AICF_GEMV_LOAD), each mode a device call of under 10 minutes:
#   bash benchmarks/l2hint_round.sh first    # the gemv GPU tests (session 67's joint-scale mend, never run on a GPU),
#                                            # the decode projections alone at one row under each load, then the
#                                            # 1 B Llama's 4-layer B1 decode plan under each load, 7 alternating rounds
#   bash benchmarks/l2hint_round.sh generate # the 20-layer B1 step against the bandwidth limit and the peer (the
#                                            # loads as AICF_GEMV_LOAD says, the default when unset)
#   bash benchmarks/l2hint_round.sh b8       # the 20-layer B8 step, no peer
#   bash benchmarks/l2hint_round.sh tests    # GPU tests beyond the gemv's: generation, the executor, PDL, the CLI
# Logs go to $OUT (the device tool's output folder), or /tmp/out.
set -uo pipefail
cd "$(dirname "$0")/.."
source .gpu/env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q -e '.[dev]' > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu_$1.txt"
LOADS="cs256 nc256"
case "$1" in
  first)
    timeout 150 python3 -m pytest -q -m gpu -n 16 tests/test_gemv.py tests/test_gemv_kmajor.py 2>&1 | tail -4 \
        | tee "$OUT/gemv_tests.txt"
    for v in cs $LOADS; do
      echo "== AICF_GEMV_LOAD=$v" | tee -a "$OUT/alone.txt"
      AICF_GEMV_LOAD=$v timeout 75 python3 benchmarks/gemv.py --rows 1 --top 0 --shapes qkv_rope o_proj gate_up down \
          2>&1 | grep -v "^summary" | tee -a "$OUT/alone.txt" | grep " pick "
    done
    vs=(--variant base:) bs=(--bundle base=/tmp/ab/base.aicf)
    for v in $LOADS; do vs+=(--variant "$v:env.AICF_GEMV_LOAD=$v"); bs+=(--bundle "$v=/tmp/ab/$v.aicf"); done
    timeout 150 python3 benchmarks/decode_ab.py --layers 4 --compile-only --folder /tmp/ab --jobs 16 "${vs[@]}" 2>&1 \
        | grep -i "compiled\|error\|Traceback"
    timeout 240 python3 benchmarks/decode_ab.py --layers 4 --rounds 7 --folder /tmp/ab --jobs 16 "${bs[@]}" 2>&1 \
        | grep -v "decode gemvs" | tee "$OUT/l2hint_ab.txt" | tail -8
    ;;
  generate)
    timeout 580 python3 benchmarks/generate.py --batch 1 --json "$OUT/generate_b1.json" 2>&1 | tee "$OUT/generate_b1.txt" | tail -12
    ;;
  b8)
    timeout 580 python3 benchmarks/generate.py --batch 8 --no-peer --json "$OUT/generate_b8.json" 2>&1 \
        | tee "$OUT/generate_b8.txt" | tail -8
    ;;
  tests)
    timeout 560 python3 -m pytest -q -m gpu -n 16 tests/test_generate_gpu.py tests/test_run_cli.py tests/test_pdl.py \
        tests/test_generate.py tests/test_llama.py tests/test_row_scale.py tests/test_tail_steps.py tests/test_l2_fill.py \
        2>&1 | tail -6 | tee "$OUT/tests.txt"
    ;;
  *)
    echo "usage: bash benchmarks/l2hint_round.sh first|generate|b8|tests" >&2
    exit 2
    ;;
esac
