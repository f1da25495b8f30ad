#!/usr/bin/env bash
# Session 11's GPU round for issue 17 (one device call, under 10 minutes): the unfolded stem and conv split-k
# (tests, memcheck), then ResNet-50 B32 checked against onnxruntime and profiled kernel by kernel, and the
# split-k candidates of its late 3x3 convolutions timed pinned beside the planner's choice.
#   bash benchmarks/conv_round.sh            # logs to $OUT (the device tool's output folder), or /tmp/out
set -uo pipefail
source .gpu/env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
W=/tmp/r50; mkdir -p $W
# ResNet-50 B32 and B1 exported by torch and compiled while the tests run
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
for b in r32 r32_fold; do
  timeout 60 python3 -m aicf_run $W/$b.aicf --check $W/resnet50_b32.onnx --input $W/resnet50_b32_inputs.npz 2>&1 \
      | tail -2 | tee "$OUT/profile_$b.txt"
  timeout 100 python3 -m aicf_run $W/$b.aicf --profile --input $W/resnet50_b32_inputs.npz >> "$OUT/profile_$b.txt" 2>&1
  python3 benchmarks/conv_profile_summary.py "$OUT/profile_$b.txt" 2>&1 | tail -3
  grep -E "^\s+[01]\s+k|whole plan" "$OUT/profile_$b.txt"
done
timeout 150 python3 benchmarks/conv_split_ab.py 2>&1 | grep -v -i warn | tee "$OUT/split_ab.txt"
