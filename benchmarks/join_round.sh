#!/usr/bin/env bash
# The GPU checks of the O projection joined to the split attention's launch (passes/join_launches.py, written in
# session 62 without a GPU), each a device call of under 10 minutes, in this order:
#   bash benchmarks/join_round.sh tests      # the join's GPU tests (the joined step against onnxruntime and the step
#                                            # apart, bit for bit, over 200 replays), compute-sanitizer memcheck and
#                                            # synccheck on them, and the profile's GPU tests ([Note: cold weights])
#   bash benchmarks/join_round.sh ab         # the 1 B Llama's 4-layer plan: apart, joined (--pin joino=1), joined with
#                                            # the role's early trigger off, and joined with its weight requests gated
#                                            # (--pin joingate=1)
#   bash benchmarks/join_round.sh timeline   # the 2-layer plan's timeline, apart and joined
#   bash benchmarks/join_round.sh generate   # the 20-layer step at B1 joined, against the bandwidth limit and the peer,
#                                            # and its profile (measured / predicted per kernel, weights cold)
#   bash benchmarks/join_round.sh profile    # where the join loses: the 20-layer step apart and its profile, weights
#                                            # cold (session 61's [Note: cold weights], never run on a GPU yet)
# Logs go to $OUT (the device tool's output folder), or /tmp/out.
source "$(dirname "$0")/round_env.sh" "gpu_$1.txt"
python3 -m pip install -q -e . > /dev/null 2>&1
case "$1" in
  tests)
    timeout 240 python3 -m pytest -q -m gpu tests/test_join_launches.py tests/test_run_bench.py 2>&1 | tail -8 | tee "$OUT/tests.txt"
    for tool in memcheck synccheck; do
      timeout 130 compute-sanitizer --tool "$tool" --target-processes all python3 -m pytest -q -m gpu -k fp16 \
          tests/test_join_launches.py 2>&1 | grep -E "ERROR SUMMARY|passed|failed" | tee -a "$OUT/sanitizer.txt"
    done
    ;;
  ab)
    # joined_late: the role's blocks let the gate/up launch only as they leave (the O's early trigger off);
    # joined_gated: the role's weight requests after every attention block's first tile ([Note: the joined role's gate])
    timeout 150 python3 benchmarks/decode_ab.py --layers 4 --compile-only --folder /tmp/ab --jobs 16 \
        --variant base: --variant joined:pin.joino=1 --variant joined_late:pin.joino=1,pin.trigger=0 \
        --variant joined_gated:pin.joino=1,pin.joingate=1 2>&1 | grep -i "compiled\|error\|Traceback"
    timeout 400 python3 benchmarks/decode_ab.py --layers 4 --rounds 7 --folder /tmp/ab --jobs 16 \
        --bundle base=/tmp/ab/base.aicf --bundle joined=/tmp/ab/joined.aicf --bundle joined_late=/tmp/ab/joined_late.aicf \
        --bundle joined_gated=/tmp/ab/joined_gated.aicf 2>&1 | grep -v "decode gemvs" | tee "$OUT/join_ab.txt" | tail -10
    ;;
  timeline)
    timeout 150 python3 benchmarks/decode_ab.py --layers 2 --compile-only --timeline --folder /tmp/tl --jobs 16 \
        --variant base: --variant joined:pin.joino=1 2>&1 | grep -i "compiled\|error\|Traceback"
    timeout 300 python3 benchmarks/decode_ab.py --layers 2 --rounds 3 --folder /tmp/tl --timeline --timeline-busy \
        --jobs 16 --bundle base=/tmp/tl/base.aicf --bundle joined=/tmp/tl/joined.aicf 2>&1 | tee "$OUT/join_timeline.txt" | tail -40
    ;;
  generate)
    timeout 560 python3 benchmarks/generate.py --batch 1 --pin joino=1 --profile \
        --json "$OUT/generate_b1_joined.json" 2>&1 | tee "$OUT/generate_b1_joined.txt" | tail -30
    ;;
  profile)
    timeout 560 python3 benchmarks/generate.py --batch 1 --no-peer --profile \
        --json "$OUT/generate_b1_apart.json" 2>&1 | tee "$OUT/generate_b1_apart.txt" | tail -30
    ;;
  *)
    echo "usage: bash benchmarks/join_round.sh tests|ab|timeline|generate|profile" >&2
    exit 2
    ;;
esac
