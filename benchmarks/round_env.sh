# The preamble of the benchmarks/*_round.sh device scripts, sourced as `source "$(dirname "$0")/round_env.sh" FILE`:
# strict mode, the repository root as the working folder, the GPU machine's environment (`.gpu/env.sh`, staged by
# ../shared/gpu/stage.sh), unbuffered Python, $OUT (the device tool's output folder, or /tmp/out), and the GPU's
# name, clocks, power and temperature into $OUT/FILE.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source .gpu/env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/$1"
