#!/usr/bin/env bash
# The 8-row decode step's next GPU checks (issue 19; written in session 64, whose device was taken away before they
# ran), each a device call of under 10 minutes:
#   bash benchmarks/b8_round.sh proto   # benchmarks/prototypes/gemv_tc_kmajor.cu: an 8-row tensor-core gemv over a
#                                       # K-major weight, k permuted so a lane loads its fragments directly, against a
#                                       # plain read of the same bytes; session 64's profile of the product's kernels
#                                       # alone: gate/up 15.3 us, down 9.43, QKV 6.47, O 5.21-5.45
#   bash benchmarks/b8_round.sh ab      # the 1 B Llama's 4-layer B8 decode plan: the planner's pick against the split
#                                       # attention in 3 / 6 chunks (it picks 2) and the O projections split 8 ways
#                                       # (it picks 4), 5 alternating rounds in one process
#   bash benchmarks/b8_round.sh tc      # session 65: the tensor-core gemv over K-major weights (`--pin kmajor=tc`):
#                                       # its GPU tests, memcheck of one case, the 4-layer B8 plan against the default
#   bash benchmarks/b8_round.sh tcgemv  # session 66: its GPU tests and memcheck, then each 8-row projection alone
#                                       # (benchmarks/gemv.py) at the pick and at the tc pin's schedules, with the
#                                       # cost terms (--json), which fitting gemv_tckm_issue needs
#   bash benchmarks/b8_round.sh tcab    # session 66: the 4-layer B8 plan with `--pin kmajor=tc` against the default
#   bash benchmarks/b8_round.sh tcall   # session 66, one call for all of it by priority: tests, memcheck, the plan
#                                       # A/B (3 rounds), then the gate/up and down alone (a timeout cuts the last)
#   bash benchmarks/b8_round.sh fit     # session 69: every schedule of the tc pin's space (T, WARPS, U) for the four
#                                       # 8-row projections alone, with their cost terms (--json): the refit's data
#   bash benchmarks/b8_round.sh tcbest  # session 69: the 4-layer B8 plan: the default, the tc pin, the tc pin with its
#                                       # gate/up at the schedule session 67 measured fastest alone (BN 16, 8 warps,
#                                       # U 4), and the split attention in 3 chunks (it picks 2), 3 alternating rounds
#   bash benchmarks/b8_round.sh refit   # session 69, after the tensor-core K-major terms' refit made those gemvs the
#                                       # default at 2-8 rows: their GPU tests (and the generation tests, whose 2-row
#                                       # plans now take them), then the 4-layer B8 plan: the default against
#                                       # `--pin kmajor=one` (the default before), the gate/up pairs alone K-major
#                                       # (session 69's A/B suggests the QKV, O and down lose in a plan what they gain
#                                       # alone), 3 alternating rounds (session 70: trimmed to fit a short budget)
#   bash benchmarks/b8_round.sh quick   # refit's tests and the default against kmajor=one alone (about 6 minutes)
#   bash benchmarks/b8_round.sh gen8    # the 20-layer B8 step at the default (generate.py, no peer)
# Logs go to $OUT (the device tool's output folder), or /tmp/out.
source "$(dirname "$0")/round_env.sh" "gpu_$1.txt"
# The tensor-core gemv over K-major weights (session 65, `--pin kmajor=tc`):
TC=kmajor=tc,KM=1,TC=1
tc_tests() {   # its GPU tests and memcheck of one case
  python3 -m pip install -q -e '.[dev]' > /dev/null 2>&1
  timeout 130 python3 -m pytest -q -m gpu -n 8 tests/test_gemv_kmajor.py -k tensor_core 2>&1 | tail -6 | tee "$OUT/tckm_tests.txt"
  timeout 70 compute-sanitizer --tool memcheck python3 -m pytest -q -m gpu tests/test_gemv_kmajor.py \
      -k "tensor_core and M8K2000 and BN32W8U4 and fp16" 2>&1 | tail -4 | tee "$OUT/tckm_memcheck.txt"
}
tc_ab() {   # the 4-layer B8 decode plan against the planner's default ([K, N] tensor-core gemvs), $1 rounds
  python3 -m pip install -q -e '.[dev]' > /dev/null 2>&1
  timeout 110 python3 benchmarks/decode_ab.py --layers 4 --batch 8 --compile-only --folder /tmp/b8 --jobs 16 \
      --variant base: --variant tc:pin.kmajor=tc 2>&1 | tee "$OUT/tckm_compile.txt" | grep -i "compiled\|error\|Traceback\|gemvs"
  timeout $((50 * $1)) python3 benchmarks/decode_ab.py --layers 4 --batch 8 --rounds "$1" --folder /tmp/b8 --jobs 16 \
      --bundle base=/tmp/b8/base.aicf --bundle tc=/tmp/b8/tc.aicf 2>&1 | grep -v "decode gemvs" | tee "$OUT/tckm_ab.txt" | tail -8
}
tc_gemv() {   # 8-row projections alone at the pick and at these `--cand` schedules, with their cost terms
  local shapes cands=()
  shapes=$(printf '%s\n' "$@" | cut -d: -f1 | sort -u | tr '\n' ' ')
  for c in "$@"; do cands+=(--cand "$c"); done
  # shellcheck disable=SC2086
  timeout "${GEMV_TIMEOUT:-240}" python3 benchmarks/gemv.py --rows 8 --shapes $shapes --json "$OUT/tckm_gemv.json" "${cands[@]}" 2>&1 \
      | tee "$OUT/tckm_gemv.txt" | tail -30
}
default_tests() {   # the GPU tests the 2-8 row K-major default reaches (the generation tests' 2-row plans take it), $1 s
  python3 -m pip install -q -e '.[dev]' > /dev/null 2>&1
  timeout "$1" python3 -m pytest -q -m gpu -n 16 tests/test_gemv_kmajor.py tests/test_generate_gpu.py \
      2>&1 | tail -4 | tee "$OUT/refit_tests.txt"
}
default_ab() {   # the 4-layer B8 plan's variants NAME:PINS compiled in $1 s, then timed in 3 alternating rounds in $2 s
  local compile=$1 rounds=$2 v variants=() bundles=()
  shift 2
  for v in "$@"; do variants+=(--variant "$v"); bundles+=(--bundle "${v%%:*}=/tmp/b8/${v%%:*}.aicf"); done
  timeout "$compile" python3 benchmarks/decode_ab.py --layers 4 --batch 8 --compile-only --folder /tmp/b8 --jobs 16 \
      "${variants[@]}" 2>&1 | tee "$OUT/refit_compile.txt" | grep -i "compiled\|error\|Traceback\|gemvs"
  timeout "$rounds" python3 benchmarks/decode_ab.py --layers 4 --batch 8 --rounds 3 --folder /tmp/b8 --jobs 16 \
      "${bundles[@]}" 2>&1 | grep -v "decode gemvs" | tee "$OUT/refit_ab.txt" | tail -8
}
case "$1" in
  proto)
    nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/gemv_tc_kmajor benchmarks/prototypes/gemv_tc_kmajor.cu &&
        timeout 300 /tmp/gemv_tc_kmajor | tee "$OUT/gemv_tc_kmajor.txt"
    ;;
  ab)
    python3 -m pip install -q -e . > /dev/null 2>&1
    O8=dpin.node_matmul_104:SPLITK=8,dpin.node_matmul_200:SPLITK=8,dpin.node_matmul_296:SPLITK=8,dpin.node_matmul_392:SPLITK=8
    timeout 150 python3 benchmarks/decode_ab.py --layers 4 --batch 8 --compile-only --folder /tmp/b8 --jobs 16 \
        --variant base: --variant s3:dpin.SPLITS=3 --variant s6:dpin.SPLITS=6 --variant "o8:$O8" \
        2>&1 | grep -i "compiled\|error\|Traceback"
    timeout 330 python3 benchmarks/decode_ab.py --layers 4 --batch 8 --rounds 5 --folder /tmp/b8 --jobs 16 \
        --bundle base=/tmp/b8/base.aicf --bundle s3=/tmp/b8/s3.aicf --bundle s6=/tmp/b8/s6.aicf \
        --bundle o8=/tmp/b8/o8.aicf 2>&1 | grep -v "decode gemvs" | tee "$OUT/b8_ab.txt" | tail -8
    ;;
  tcall)   # by priority: a timeout cuts the last
    tc_tests; tc_ab 3
    tc_gemv gate_up:$TC,BN=32,WARPS=4,U=4 gate_up:$TC,BN=16,WARPS=8,U=4 down:$TC,BN=16,WARPS=8,U=4 \
        down:$TC,BN=16,WARPS=4,U=4
    ;;
  fit)
    python3 -m pip install -q -e '.[dev]' > /dev/null 2>&1
    all=()
    for shape in gate_up down o_proj qkv_rope; do
      for bn in 16 32; do for w in 4 8; do for u in 1 2 4; do all+=("$shape:$TC,BN=$bn,WARPS=$w,U=$u"); done; done; done
    done
    GEMV_TIMEOUT=520 tc_gemv "${all[@]}"
    ;;
  tcbest)
    python3 -m pip install -q -e '.[dev]' > /dev/null 2>&1
    GU=""
    for n in 115 211 307 403; do GU="$GU,dpin.node_matmul_$n:BN=16,dpin.node_matmul_$n:WARPS=8,dpin.node_matmul_$n:U=4"; done
    timeout 200 python3 benchmarks/decode_ab.py --layers 4 --batch 8 --compile-only --folder /tmp/b8 --jobs 16 \
        --variant base: --variant tc:pin.kmajor=tc --variant "tcb:pin.kmajor=tc$GU" --variant s3:dpin.SPLITS=3 \
        2>&1 | tee "$OUT/tcbest_compile.txt" | grep -i "compiled\|error\|Traceback\|gemvs"
    timeout 330 python3 benchmarks/decode_ab.py --layers 4 --batch 8 --rounds 3 --folder /tmp/b8 --jobs 16 \
        --bundle base=/tmp/b8/base.aicf --bundle tc=/tmp/b8/tc.aicf --bundle tcb=/tmp/b8/tcb.aicf \
        --bundle s3=/tmp/b8/s3.aicf 2>&1 | grep -v "decode gemvs" | tee "$OUT/tcbest_ab.txt" | tail -10
    ;;
  refit)
    default_tests 150
    PAIRS=""
    for l in 0 1 2 3; do
      PAIRS="$PAIRS+model.layers.$l.mlp.gate_proj.weight.g.model.layers.$l.mlp.up_proj.weight.g.cat.pairs"
    done
    default_ab 150 200 new: one:pin.kmajor=one "gu:pin.kmajor=${PAIRS#+}"
    ;;
  quick)   # refit's core on a short budget: its tests, then the default against `--pin kmajor=one`, 3 rounds
    default_tests 120
    default_ab 100 130 new: one:pin.kmajor=one
    ;;
  gen8)   # the 20-layer B8 step at the new default against the bandwidth limit (the README's figure; no peer)
    python3 -m pip install -q -e '.[dev]' > /dev/null 2>&1
    timeout 300 python3 benchmarks/generate.py --batch 8 --no-peer --json "$OUT/refit_generate_b8.json" 2>&1 \
        | tee "$OUT/refit_generate_b8.txt" | tail -8
    ;;
  tc) tc_tests; tc_ab 4 ;;
  tcab) tc_ab 4 ;;
  tcgemv)
    tc_tests
    tc_gemv o_proj:$TC,BN=16,WARPS=8,U=4 o_proj:$TC,BN=16,WARPS=4,U=4 o_proj:$TC,BN=32,WARPS=4,U=2 \
        gate_up:$TC,BN=32,WARPS=4,U=4 gate_up:$TC,BN=16,WARPS=8,U=4 gate_up:$TC,BN=32,WARPS=8,U=2 \
        down:$TC,BN=16,WARPS=8,U=4 down:$TC,BN=16,WARPS=4,U=4 down:$TC,BN=32,WARPS=8,U=2
    ;;
  *)
    echo "usage: bash benchmarks/b8_round.sh proto|ab|tc|tcgemv|tcab|tcall|fit|tcbest|refit|quick|gen8" >&2
    exit 2
    ;;
esac
