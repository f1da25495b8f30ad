#!/usr/bin/env bash
# Issue 17, session 5: the conv GPU tests, ResNet-50 B32/B1 against reduce-overhead, and the B32
# per-kernel profile, in one device call. Run from the repository root after `source .gpu/env.sh`:
#   bash benchmarks/conv_session5.sh OUTDIR [EXTRA_CASES]
set -u
OUT_DIR=${1:?outdir}; EXTRA=${2:-}
mkdir -p "$OUT_DIR"; W=/tmp/conv5; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT_DIR/device.txt"
T0=$(date +%s)
timeout 240 python3 -m pytest -q -m gpu -n 14 -p no:cacheprovider tests/test_conv_wgmma.py tests/test_conv.py \
  tests/test_conv_as_matmul.py > "$OUT_DIR/gpu_tests.txt" 2>&1; echo "tests rc=$? $(( $(date +%s) - T0 ))s"; tail -3 "$OUT_DIR/gpu_tests.txt"
( python3 benchmarks/export_case.py resnet50:32 --out-dir $W > $W/export.log 2>&1 &&
  python3 -m aicfc compile $W/resnet50_b32.onnx -o $W/r32.aicf --target sm_90 --precision fp16 -q &&
  python3 -m aicfc explain $W/r32.aicf --json > "$OUT_DIR/explain_r32.json" ) > $W/compile.log 2>&1 &
CP=$!
timeout 300 python3 benchmarks/models.py --cases resnet50:32,resnet50:1${EXTRA:+,$EXTRA} --json "$OUT_DIR/models.json" \
  > "$OUT_DIR/models.txt" 2>&1; echo "models rc=$? $(( $(date +%s) - T0 ))s"
grep -v "torch.onnx\|return cls" "$OUT_DIR/models.txt" | tail -12
wait $CP; echo "compile rc=$?"; tail -3 $W/compile.log
timeout 120 python3 -m aicf_run $W/r32.aicf --profile --input $W/resnet50_b32_inputs.npz > "$OUT_DIR/profile_r32.txt" 2>&1
echo "profile rc=$? $(( $(date +%s) - T0 ))s"; head -70 "$OUT_DIR/profile_r32.txt"
