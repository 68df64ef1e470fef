#!/usr/bin/env bash
# A/B timing of two copies of the package on one GPU: the working tree ("new") and an earlier
# commit's copy ("base", default .base/, made with
#   rm -rf .base && mkdir .base && git archive <commit> fp8_group_quant kernels pyproject.toml | tar -x -C .base
# ), run alternately in separate processes so that both see the same host and clock state.
# Usage: bash tools/ab_bench.sh LOG [ROUNDS] [BASE_DIR] -- bench arguments...
# Prints "M roof_us ours_us ours/roof" per row of K = 7168 bench output.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$1; rounds=${2:-2}; base=${3:-.base}
shift 3 2>/dev/null || shift $#
[ "${1:-}" = "--" ] && shift
args=("$@"); [ ${#args[@]} -eq 0 ] && args=(--m 1 16 64 512 2048 --k 7168)
: > "$log"
for round in $(seq "$rounds"); do
  for side in base new; do
    dir=$PWD; [ "$side" = base ] && dir=$(cd "$base" && pwd)
    echo "## $side" >> "$log"
    (cd "$dir" && PYTHONPATH=$dir python3 -m fp8_group_quant bench "${args[@]}" 2>&1 |
      awk '$1 ~ /^[0-9]+$/ {print $1, $2, $4, $5, $6}') >> "$log"
  done
done
cat "$log"
