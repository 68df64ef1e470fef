#!/usr/bin/env bash
# Session 22's first device run for fused step 29 (branch silu-six-blocks), on the GPU machine
# from the repository root: bash docs/experiments/six_blocks_check.sh SGLANG_SOURCE OUT_DIR
#   SGLANG_SOURCE: sglang/kernels/jit/csrc/gemm/per_token_group_quant_8bit_v2.cuh from the
#   sglang wheel (as for sglang_fused.py). About five minutes.
# 1. NVRTC into the disk cache; 2. the whole GPU suite; 3. the six-block kernel against the
# five-block one in one tree (FP8_GROUP_QUANT_SILU_SIX_BLOCKS_WAVES=inf takes the five-block
# kernel everywhere), two rounds in alternating processes, with one-pass grids at M = 4096 too
# (--persistent-waves 100); 4. bench --fused; 5. memcheck with every one-pass SiLU grid on the
# six-block kernel.
set -uo pipefail
peer=$(realpath "$1")
out=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=$root
cd "$root"
python3 tools/precompile.py 16 > "$out/precompile.log" 2>&1
timeout 240 python3 -m pytest -m gpu -n 16 -p no:cacheprovider --tb=short -rfE -W ignore -q tests \
  > "$out/gpu-tests.log" 2>&1
tail -3 "$out/gpu-tests.log"
cd docs/experiments
for round in 1 2; do
  for waves in inf 2.2; do
    echo "== SILU_SIX_BLOCKS_WAVES=$waves, round $round" | tee -a "$out/ab.log"
    FP8_GROUP_QUANT_SILU_SIX_BLOCKS_WAVES=$waves timeout 90 python3 sglang_fused.py "$peer" \
      512 768 896 1024 1536 2048 4096 2>&1 | grep -v Deprec | tee -a "$out/ab.log"
  done
done
for waves in inf 2.2; do
  echo "== one pass at 4096, SILU_SIX_BLOCKS_WAVES=$waves" | tee -a "$out/ab.log"
  FP8_GROUP_QUANT_SILU_SIX_BLOCKS_WAVES=$waves timeout 60 python3 sglang_fused.py "$peer" 4096 \
    --persistent-waves 100 2>&1 | grep -v Deprec | tee -a "$out/ab.log"
done
cd "$root"
timeout 60 python3 -m fp8_group_quant bench --fused --m 1 64 512 1024 4096 --json "$out/fused.json" \
  > "$out/fused.log" 2>&1
cat "$out/fused.log"
FP8_GROUP_QUANT_SILU_SIX_BLOCKS_WAVES=0 FP8_GROUP_QUANT_SILU_TABLE_WAVES=0 SANITIZE_TOOLS=memcheck \
  timeout 150 bash tools/sanitize.sh "$out/sanitize.log" | tail -2
