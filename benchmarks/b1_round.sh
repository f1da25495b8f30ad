#!/usr/bin/env bash
# The one-row decode step's next GPU check (issue 19, session 70), one device call of under 10 minutes:
#   bash benchmarks/b1_round.sh gk   # the 1 B Llama's 4-layer B1 decode plan with its gated gate/up pairs read K-major
#                                    # (the planner predicts them slower K-major and keeps them [K, N]; sessions 50
#                                    # and 59 measured them even on an H200 before the tail steps, the tables before
#                                    # the loop and the early trigger, session 72 even on an H100) at the planner's pick and at BN 32, 8 warps (the
#                                    # plain gate/up's fastest alone on an H100, session 67) with U 4 (session 50's
#                                    # best, there at KS 2; the planner takes KS 1 now), against the default
#                                    # ([K, N] gated, 352 blocks: 3.96 TB/s in session 63's timeline where a plain
#                                    # read reaches 4.45), 5 alternating rounds in one process
#                                    # (ROUNDS=3 for a short budget)
# Run on an H200 in session 74 (benchmarks/results/b1_gk_session74_h200.txt, 3 rounds): gk replayed the 4-layer plan
# 1.009x and stepped 0.998x, gk32 0.969x / 0.965x: neither is a lever; the planner's [K, N] stays.
# Logs go to $OUT (the device tool's output folder), or /tmp/out.
source "$(dirname "$0")/round_env.sh" "gpu_b1_$1.txt"
KM="" GU32=""
for l in 0 1 2 3; do   # every one-row gemv weight the default reads K-major, and the layer's gate/up pairs
  p=model.layers.$l
  KM="$KM+$p.self_attn.q_proj.weight.g.$p.self_attn.k_proj.weight.g.$p.self_attn.v_proj.weight.g.cat"
  KM="$KM+$p.self_attn.o_proj.weight+$p.mlp.down_proj.weight+$p.mlp.gate_proj.weight.g.$p.mlp.up_proj.weight.g.cat.pairs"
done
for n in 115 211 307 403; do GU32="$GU32,dpin.node_matmul_$n:BN=32,dpin.node_matmul_$n:WARPS=8,dpin.node_matmul_$n:U=4"; done
case "$1" in
  gk)
    python3 -m pip install -q -e '.[dev]' > /dev/null 2>&1
    timeout 200 python3 benchmarks/decode_ab.py --layers 4 --batch 1 --compile-only --folder /tmp/b1 --jobs 16 \
        --variant base: --variant "gk:pin.kmajor=${KM#+}" --variant "gk32:pin.kmajor=${KM#+}$GU32" \
        2>&1 | tee "$OUT/b1gk_compile.txt" | grep -i "compiled\|error\|Traceback" | cut -c1-200
    timeout $((60 * ${ROUNDS:-5} + 30)) python3 benchmarks/decode_ab.py --layers 4 --batch 1 --rounds "${ROUNDS:-5}" \
        --folder /tmp/b1 --jobs 16 \
        --bundle base=/tmp/b1/base.aicf --bundle gk=/tmp/b1/gk.aicf --bundle gk32=/tmp/b1/gk32.aicf \
        2>&1 | grep -v "decode gemvs" | tee "$OUT/b1gk_ab.txt" | tail -10
    ;;
  *)
    echo "usage: bash benchmarks/b1_round.sh gk" >&2
    exit 2
    ;;
esac
