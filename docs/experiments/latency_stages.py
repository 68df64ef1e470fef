"""Experiment (docs/perf.md, open gaps): where a small call's GPU time goes.

Variants of the default kernel with one stage left out (the shuffles; the maximum, scale and
encoding; the row loop), timed by CUDA-graph replay beside the roofline kernel. The 'no row loop'
variant skips every row after a slot's first, so its times at M >= 1024 are not comparable.
Run on a GPU from the repository root: PYTHONPATH=. python3 docs/experiments/latency_stages.py
Output of the H200 run: docs/logs/experiment-latency-stages-h200.log
"""

import harness

from fp8_group_quant import _jit, _launch

SOURCE = _jit.source_text("quantize.cu")
STAGES_START = SOURCE.index("    // the group maximum over finite values")
STAGES_END = SOURCE.index("    // store the codes")
COPY_ONLY = """    u32 codes[kValues / 4];
    for (int i = 0; i < kValues / 4; ++i) codes[i] = words[i] ^ words[i + 4];
    float scale = 1.0f;
    u32 exponent = words[0] & 0xffu;
"""
VARIANTS = {
    "production": SOURCE,
    "no shuffles": SOURCE.replace(
        "u32 magnitude = group_max<kLanes>(In::max_magnitude(words), mask);",
        "u32 magnitude = In::max_magnitude(words);",
    ),
    "copy only (no max, scale, encode)": SOURCE[:STAGES_START] + COPY_ONLY + SOURCE[STAGES_END:],
    "no row loop (one row per slot)": SOURCE.replace(
        "    if (next_batch < batches) load_row(next_batch, next_row, next);",
        "    next_batch = batches;",
    ),
}


def time_shape(functions, roofline, m: int, k: int) -> list[float]:
    inputs, outputs = harness.rotating_inputs(m, k)
    base, values = harness.default_launch(m, k)
    times = [harness.time_roofline(roofline, inputs, outputs)]
    for function in functions:
        launch = harness.variant_launch(function, base.grid, base.block, values)
        times.append(harness.time_launch(launch, inputs, outputs))
    return times


def main() -> None:
    expression = _launch.DEFAULT_KEY.name_expression
    functions = [harness.compile_function(text, expression) for text in VARIANTS.values()]
    roofline = harness.roofline_function()
    names = " ".join(f"{name[:22]:>23}" for name in VARIANTS)
    print(f"{'M':>6} {'K':>5} {'roofline':>9} {names}", flush=True)
    for m in (1, 16, 64, 256, 1024, 8192):
        times = time_shape(functions, roofline, m, 7168)
        variants = " ".join(f"{t:>23.2f}" for t in times[1:])
        print(f"{m:>6} {7168:>5} {times[0]:>9.2f} {variants}", flush=True)


if __name__ == "__main__":
    main()
