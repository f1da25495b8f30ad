# The device command of session 5 (issue 19), as run: it produced benchmarks/results/generate_session5_h100.txt.
# (compute-sanitizer was not run: the shared device budget left no second run.)
set -x
date -u
nvidia-smi --query-gpu=name --format=csv,noheader
export AICF_CACHE_DIR=/tmp/aicf-cache
timeout 230 python3 -m pytest -q -x -p no:cacheprovider tests/test_generate_gpu.py -k "feed_kernels or device_greedy or cli_generate or fp32" 2>&1 | tail -30
date -u
timeout 320 python3 benchmarks/generate.py --batch 1 --jobs 16 --folder /tmp/aicf-gen --json $OUT/gen_b1.json 2>&1 | grep -v "^ *[0-9]* *k[0-9]"
date -u
