#!/usr/bin/env bash
# The GPU checks of a gemv's L2 requests ahead of its own loads ([Note: requests ahead of the stream] in
# codegen/gemm_gemv.py; the experiment's switch AICF_GEMV_AHEAD=kn=N;km=N), each a device call of under 10 minutes:
#   bash benchmarks/ahead_round.sh ab         # the 1 B Llama's 4-layer decode plan, alternating rounds in one process:
#                                             # none, the [K, N] gemvs 2 / 4 steps ahead, the K-major 1, both
#   bash benchmarks/ahead_round.sh timeline   # the 2-layer plan's timeline, none against VARIANT (default kn=4)
#   bash benchmarks/ahead_round.sh generate   # the 20-layer B1 step under VARIANT and its profile, with the peer
# Logs go to $OUT (the device tool's output folder), or /tmp/out.
set -uo pipefail
cd "$(dirname "$0")/.."
source .gpu/env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
VARIANT=${VARIANT:-kn=4}
python3 -m pip install -q -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu_$1.txt"
case "$1" in
  ab)
    timeout 170 python3 benchmarks/decode_ab.py --layers 4 --compile-only --folder /tmp/ab --jobs 16 \
        --variant base: --variant kn2:env.AICF_GEMV_AHEAD=kn=2 --variant kn4:env.AICF_GEMV_AHEAD=kn=4 \
        --variant km1:env.AICF_GEMV_AHEAD=km=1 --variant both:env.AICF_GEMV_AHEAD="kn=4;km=1" 2>&1 | grep -i "compiled\|error\|Traceback"
    timeout 400 python3 benchmarks/decode_ab.py --layers 4 --rounds 5 --folder /tmp/ab --jobs 16 \
        --bundle base=/tmp/ab/base.aicf --bundle kn2=/tmp/ab/kn2.aicf --bundle kn4=/tmp/ab/kn4.aicf \
        --bundle km1=/tmp/ab/km1.aicf --bundle both=/tmp/ab/both.aicf 2>&1 | grep -v "decode gemvs" | tee "$OUT/ahead_ab.txt" | tail -12
    ;;
  timeline)
    timeout 150 python3 benchmarks/decode_ab.py --layers 2 --compile-only --timeline --folder /tmp/tl --jobs 16 \
        --variant base: --variant ahead:env.AICF_GEMV_AHEAD="$VARIANT" 2>&1 | grep -i "compiled\|error\|Traceback"
    timeout 300 python3 benchmarks/decode_ab.py --layers 2 --rounds 3 --folder /tmp/tl --timeline --timeline-busy \
        --jobs 16 --bundle base=/tmp/tl/base.aicf --bundle ahead=/tmp/tl/ahead.aicf 2>&1 | tee "$OUT/ahead_timeline.txt" | tail -40
    ;;
  generate)
    AICF_GEMV_AHEAD="$VARIANT" timeout 560 python3 benchmarks/generate.py --batch 1 --profile \
        --json "$OUT/generate_b1_ahead.json" 2>&1 | tee "$OUT/generate_b1_ahead.txt" | tail -30
    ;;
  *)
    echo "usage: bash benchmarks/ahead_round.sh ab|timeline|generate" >&2
    exit 2
    ;;
esac
