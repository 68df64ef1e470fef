#!/usr/bin/env bash
# Session 22: the SiLU path's persistent grid (M past eight one-pass waves) in other shapes, one
# tree per shape (copies of kernels/ with two lines changed, made here; FP8_GROUP_QUANT_KERNEL_DIR):
#   kernels  two slots a thread a step, eight 128-thread blocks an SM (64 registers; the library's)
#   .va      one slot, twelve blocks (40 registers, 16 bytes spilled)
#   .vb      one slot, ten blocks (48 registers)
#   .vc      three slots, five blocks (96 registers)
#   .vd      two slots, four 256-thread blocks (64 registers)
# From the repository root on the GPU machine:
#   bash docs/experiments/persistent_shapes.sh SGLANG_SOURCE OUT_DIR
set -uo pipefail
peer=$(realpath "$1")
out=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=$root
cd "$root"
shape() {  # shape TREE UNROLL THREADS BLOCKS
  rm -rf "$1" && cp -r kernels "$1"
  sed -i "s/constexpr int kMaskedUnrollSilu = 2;/constexpr int kMaskedUnrollSilu = $2;/; \
s/constexpr int kMaskedThreads = 128;/constexpr int kMaskedThreads = $3;/; \
s/__launch_bounds__(kMaskedThreads, 8) quantize_masked/__launch_bounds__(kMaskedThreads, $4) quantize_masked/" \
    "$1/quantize.cu"
}
shape .va 1 128 12
shape .vb 1 128 10
shape .vc 3 128 5
shape .vd 2 256 4
cd "$root/docs/experiments"
for round in 1 2; do
  for tree in kernels .va .vb .vc .vd; do
    check=--no-check
    [ "$round" = 1 ] && check=
    echo "== $tree, round $round" | tee -a "$out/persistent.log"
    FP8_GROUP_QUANT_KERNEL_DIR=$root/$tree timeout 120 python3 sglang_fused.py "$peer" 4096 8192 \
      $check 2>&1 | grep -v Deprec | tee -a "$out/persistent.log"
  done
done
