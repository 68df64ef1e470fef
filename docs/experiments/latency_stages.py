"""Experiment (docs/perf.md, step 11): where a small call's GPU time goes.

Variants of the default kernel with one stage left out (the shuffles; the maximum, scale and
encoding; the row loop), timed by CUDA-graph replay beside the roofline kernel. The 'no row loop'
variant skips every row after a slot's first, so its times at M >= 1024 are not comparable.
Run on a GPU from the repository root: PYTHONPATH=. python3 docs/experiments/latency_stages.py
Output of the H200 run: docs/logs/experiment-latency-stages-h200.log
"""
import re, sys, numpy as np, cupy, ml_dtypes
from fp8_group_quant import _jit, _launch, bench, api
from fp8_group_quant._layout import Geometry

src = _jit.source_text("quantize.cu")
start = src.index("    // the group maximum over finite values")
end = src.index("    // store the codes")
VARIANTS = {
    "production": src,
    "no shuffles": src.replace("u32 magnitude = group_max<kLanes>(In::max_magnitude(words), mask);",
                               "u32 magnitude = In::max_magnitude(words);"),
    "copy only (no max, scale, encode)": src[:start] + """    u32 codes[kValues / 4];
    for (int i = 0; i < kValues / 4; ++i) codes[i] = words[i] ^ words[i + 4];
    float scale = 1.0f;
    u32 exponent = words[0] & 0xffu;
""" + src[end:],
    "no row loop (one row per slot)": src.replace("    if (next_batch < batches) load_row(next_batch, next_row, next);", "    next_batch = batches;"),
}
key = _launch.DEFAULT_KEY
device = cupy.cuda.runtime.getDevice()
funcs = {}
for name, text in VARIANTS.items():
    mod = cupy.RawModule(code=text, options=_jit.nvrtc_options(), name_expressions=(key.name_expression,))
    funcs[name] = mod.get_function(key.name_expression)
roof = cupy.RawModule(code=_jit.source_text("roofline.cu"), options=_jit.nvrtc_options(), name_expressions=("fgq::roofline_copy",)).get_function("fgq::roofline_copy")
print(f"{'M':>6} {'K':>5} {'roofline':>9} " + " ".join(f"{n[:22]:>23}" for n in VARIANTS), flush=True)
for k in (7168,):
    for m in (1, 16, 64, 256, 1024, 8192):
        geometry = Geometry((m, k), 128, "packed", False)
        nbuf = max(2, min(64, -(-256 * 2**20 // (m * k * 2))))
        xs = [cupy.asarray(np.random.default_rng(m).standard_normal((m, k), dtype=np.float32).astype(ml_dtypes.bfloat16)) for _ in range(nbuf)]
        outs = [api.quantize_packed(x) for x in xs]
        base = _launch.prepare(key, geometry, device, k, k, 1e-10)
        values = (0, 0, 0) + tuple(a.value for a in base._args)
        row = []
        chunks = m * k * 2 // 32
        grid = (-(-chunks // 256), 1, 1)
        calls = [(lambda i=i: roof(grid, (256, 1, 1), (xs[i % nbuf], outs[i % nbuf][0], np.int64(chunks)))) for i in range(max(nbuf, 32))]
        row.append(bench.graph_time_us(cupy, calls, replays=9))
        for name, f in funcs.items():
            with _jit.current_device(device):
                L = _launch.Launch(f.kernel.ptr, base.grid, base.block, values)
            calls = [(lambda i=i, L=L: L.launch(xs[i % nbuf].data.ptr, outs[i % nbuf][0].data.ptr, outs[i % nbuf][1].data.ptr, cupy.cuda.get_current_stream().ptr)) for i in range(max(nbuf, 32))]
            row.append(bench.graph_time_us(cupy, calls, replays=9))
        print(f"{m:>6} {k:>5} {row[0]:>9.2f} " + " ".join(f"{t:>23.2f}" for t in row[1:]), flush=True)
        del xs, outs
