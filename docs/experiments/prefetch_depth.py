"""Experiment (docs/perf.md, step 13): prefetch depth and blocks per SM at large M.

Variants of the default kernel (five instead of six blocks per SM; two rows in flight per lane
instead of one) checked against the production output, then timed by CUDA-graph replay beside
the roofline kernel, each grid sized from the variant's own occupancy and FP8_GROUP_QUANT_WAVES.
Run on a GPU from the repository root, e.g.
FP8_GROUP_QUANT_WAVES=8 PYTHONPATH=. python3 docs/experiments/prefetch_depth.py
Output of the H200 run: docs/logs/experiment-prefetch-depth-h200.log
"""

import os

import cupy
import harness
import numpy as np

from fp8_group_quant import _jit, _launch

SOURCE = _jit.source_text("quantize.cu")
OLD_LOOP = SOURCE[
    SOURCE.index("  u32 next[kLaneWords];\n  load_row(batch, row, next);") : SOURCE.index(
        "    const bool real_row = row < rows;"
    )
]
NEW_LOOP = """  auto advance = [&](u32& b, u32& r) {
    r += row_step;
    if (r >= grid_rows) {
      const u32 carry = batches == 1 ? 1u : r / grid_rows;
      b += carry;
      r -= carry * grid_rows;
    }
  };
  u32 next[kLaneWords], later[kLaneWords];
  load_row(batch, row, next);
  u32 next_batch = batch, next_row = row;
  advance(next_batch, next_row);
  if (next_batch < batches) load_row(next_batch, next_row, later);
  while (true) {
    u32 words[kLaneWords];
#pragma unroll
    for (int i = 0; i < kLaneWords; ++i) words[i] = next[i], next[i] = later[i];
    u32 later_batch = next_batch, later_row = next_row;
    if (later_batch < batches) {
      advance(later_batch, later_row);
      if (later_batch < batches) load_row(later_batch, later_row, later);
    }
"""
END_OLD = """    if (next_batch >= batches) break;
    batch = next_batch;
    row = next_row;
  }"""
END_NEW = """    if (next_batch >= batches) break;
    batch = next_batch;
    row = next_row;
    next_batch = later_batch;
    next_row = later_row;
  }"""
DEEP = SOURCE.replace(OLD_LOOP, NEW_LOOP).replace(END_OLD, END_NEW)
assert DEEP != SOURCE and "later_batch" in DEEP


def blocks_per_sm(text: str, blocks: int) -> str:
    """``text`` with every instantiation bounded to ``blocks`` resident blocks per SM."""
    bound = "(kIn == kF32 || kOut == kInt8 || kScale == kFloatScale || !kVec16) ? 5 : 6;"
    assert bound in text
    return text.replace(bound, f"{blocks};")


VARIANTS = {
    "production": SOURCE,
    "6 blocks->5": blocks_per_sm(SOURCE, 5),
    "prefetch 2 rows, 5 blk": blocks_per_sm(DEEP, 5),
    "prefetch 2 rows, 4 blk": blocks_per_sm(DEEP, 4),
}
WAVES = float(os.environ.get("FP8_GROUP_QUANT_WAVES", "8"))


def time_shape(functions, roofline, m: int, k: int) -> list[float]:
    inputs, outputs = harness.rotating_inputs(m, k)
    expected = cupy.asnumpy(outputs[0][0])
    base, values = harness.default_launch(m, k)
    device = cupy.cuda.runtime.getDevice()
    times = [harness.time_roofline(roofline, inputs, outputs)]
    for name, function in functions.items():
        # each variant's grid from its own occupancy
        per_sm, sms = _launch.resident_blocks(function.kernel.ptr, name, base.block[0], device)
        row_blocks = min(m, max(1, int(WAVES * per_sm * sms) // base.grid[1]))
        launch = harness.variant_launch(function, (row_blocks, *base.grid[1:]), base.block, values)
        outputs[0][0].fill(0xFF)  # the variant must rewrite every byte the library wrote
        harness.run_launch(launch, inputs[0], outputs[0])
        assert np.array_equal(cupy.asnumpy(outputs[0][0]), expected), name
        times.append(harness.time_launch(launch, inputs, outputs))
    return times


def main() -> None:
    expression = _launch.DEFAULT_KEY.name_expression
    functions = {n: harness.compile_function(t, expression) for n, t in VARIANTS.items()}
    for name, function in functions.items():
        print(name, "registers", function.num_regs, "local bytes", function.local_size_bytes)
    roofline = harness.roofline_function()
    names = " ".join(f"{name[:22]:>23}" for name in VARIANTS)
    print(f"# WAVES={WAVES}\n{'M':>6} {'K':>5} {'roofline':>9} {names}", flush=True)
    for k in (7168, 2048):
        for m in (1024, 4096, 8192, 16384):
            times = time_shape(functions, roofline, m, k)
            variants = " ".join(f"{t:>9.2f} ({t / times[0]:.3f})     " for t in times[1:])
            print(f"{m:>6} {k:>5} {times[0]:>9.2f} {variants}", flush=True)


if __name__ == "__main__":
    main()
