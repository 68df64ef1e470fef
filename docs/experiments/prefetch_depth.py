"""Experiment (docs/perf.md, step 10): prefetch depth and blocks per SM at large M.

Variants of the default kernel (five instead of six blocks per SM; two rows in flight per lane
instead of one) checked against the production output, then timed by CUDA-graph replay beside
the roofline kernel, each grid sized from the variant's own occupancy and FP8_GROUP_QUANT_WAVES.
Run on a GPU from the repository root, e.g.
FP8_GROUP_QUANT_WAVES=8 PYTHONPATH=. python3 docs/experiments/prefetch_depth.py
Output of the H200 run: docs/logs/experiment-prefetch-depth-h200.log
"""
import os, sys, numpy as np, cupy, ml_dtypes
from fp8_group_quant import _jit, _launch, bench, api
from fp8_group_quant._layout import Geometry

src = _jit.source_text("quantize.cu")
OLD_LOOP = src[src.index("  u32 next[kLaneWords];\n  load_row(batch, row, next);"):src.index("    const bool real_row = row < rows;")]
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
assert OLD_LOOP in src and END_OLD in src
deep = src.replace(OLD_LOOP, NEW_LOOP).replace(END_OLD, END_NEW)
five = lambda s: s.replace("? 5 : 6;", "? 5 : 5;")
four = lambda s: s.replace("? 5 : 6;", "? 4 : 4;")
VARIANTS = {"production": src, "6 blocks->5": five(src), "prefetch 2 rows, 5 blk": five(deep), "prefetch 2 rows, 4 blk": four(deep)}
key = _launch.DEFAULT_KEY
device = cupy.cuda.runtime.getDevice()
funcs = {}
for name, text in VARIANTS.items():
    mod = cupy.RawModule(code=text, options=_jit.nvrtc_options() + ("--ptxas-options=-v",), name_expressions=(key.name_expression,))
    funcs[name] = mod.get_function(key.name_expression)
    print(name, "regs", funcs[name].num_regs, "local", funcs[name].local_size_bytes, flush=True)
roof = cupy.RawModule(code=_jit.source_text("roofline.cu"), options=_jit.nvrtc_options(), name_expressions=("fgq::roofline_copy",)).get_function("fgq::roofline_copy")
waves = float(os.environ.get("FP8_GROUP_QUANT_WAVES", "8"))
print(f"# WAVES={waves}")
print(f"{'M':>6} {'K':>5} {'roofline':>9} " + " ".join(f"{n[:22]:>23}" for n in VARIANTS), flush=True)
for k in (7168, 2048):
    for m in (1024, 4096, 8192, 16384):
        geometry = Geometry((m, k), 128, "packed", False)
        nbuf = max(2, min(64, -(-256 * 2**20 // (m * k * 2))))
        host = np.random.default_rng(m).standard_normal((m, k), dtype=np.float32).astype(ml_dtypes.bfloat16)
        xs = [cupy.asarray(host) for _ in range(nbuf)]
        outs = [api.quantize_packed(x) for x in xs]
        q_ref = [cupy.asnumpy(o[0]) for o in outs[:1]]
        base = _launch.prepare(key, geometry, device, k, k, 1e-10)
        values = (0, 0, 0) + tuple(a.value for a in base._args)
        chunks = m * k * 2 // 32
        grid = (-(-chunks // 256), 1, 1)
        calls = [(lambda i=i: roof(grid, (256, 1, 1), (xs[i % nbuf], outs[i % nbuf][0], np.int64(chunks)))) for i in range(max(nbuf, 32))]
        row = [bench.graph_time_us(cupy, calls, replays=9)]
        for name, f in funcs.items():
            blocks_per_row = base.grid[1]
            with _jit.current_device(device):
                per_sm, sms = _launch.resident_blocks(f.kernel.ptr, name, base.block[0], device)
                cap = per_sm * sms
                tiles = geometry.grid_rows
                g = (min(tiles, max(1, int(waves * cap) // blocks_per_row)), blocks_per_row, 1)
                L = _launch.Launch(f.kernel.ptr, g, base.block, values)
            # correctness of the variant on buffer 0
            outs[0][0].fill(0xFF)
            L.launch(xs[0].data.ptr, outs[0][0].data.ptr, outs[0][1].data.ptr, cupy.cuda.get_current_stream().ptr)
            assert np.array_equal(cupy.asnumpy(outs[0][0]), q_ref[0]), name
            calls = [(lambda i=i, L=L: L.launch(xs[i % nbuf].data.ptr, outs[i % nbuf][0].data.ptr, outs[i % nbuf][1].data.ptr, cupy.cuda.get_current_stream().ptr)) for i in range(max(nbuf, 32))]
            row.append(bench.graph_time_us(cupy, calls, replays=9))
        print(f"{m:>6} {k:>5} {row[0]:>9.2f} " + " ".join(f"{t:>9.2f} ({t / row[0]:.3f})    " for t in row[1:]), flush=True)
        del xs, outs
