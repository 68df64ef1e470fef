"""Experiment (issue 13, session 10, fused step 12): the plain fused SiLU path on its one-pass
grid or on the masked layout's persistent grid.

The one-pass SiLU-and-multiply grid has one group slot per lane set (five resident blocks of
128 threads), each block copying the 8 KB SiLU table into shared memory and waiting for it.
The masked layout's kernel (quantize_masked) walks the slots with a persistent grid, copying
the table once per resident block; with no masked_m it takes every row as real, and the
launch layer sends large plain SiLU inputs to it (_launch.fused_takes_persistent). Columns,
us per call, CUDA-graph replay over rotating buffers, graphs replayed in turn, PDL off as
`bench` launches (N = 7168 unless given, bf16 -> e4m3, packed UE8M0 scales): roof
(`roofline_gated`, the same traffic); one-pass and persistent, each path forced by prepared
calls made with _launch.PERSISTENT_FUSED_WAVES (and, before fused step 27,
PERSISTENT_ONE_WALK_WAVES) at infinity or 0 (persistent only where the rows need no
padding); library, the launch layer's choice. The two paths' outputs are compared byte for
byte first. (Run 3 of session 10 had, instead of the persistent column, the masked API with
E = 1 and masked_m = [M], before the plain path could take that kernel.) From the repository root:
PYTHONPATH=$PWD python3 docs/experiments/silu_persistent.py [N [M...]]
"""

import math
import sys

import cupy
import ml_dtypes
import numpy as np

from fp8_group_quant import _jit, _launch, api, bench

OPTIONS = dict(scale="ue8m0", layout="packed", activation="silu_mul")


def prepared(x, out, waves: float):
    """A prepared call of the plain SiLU path whose plan was made with the persistent grid's
    threshold at ``waves`` (bound to its plan: later calls do not look the threshold up)."""
    saved = _launch.PERSISTENT_FUSED_WAVES
    _launch.PERSISTENT_FUSED_WAVES = waves
    try:
        with bench.pdl_launches(False):
            return api.prepare(x, 128, **OPTIONS, out=out[0], scale_out=out[1])
    finally:
        _launch.PERSISTENT_FUSED_WAVES = saved


def measure(m: int, n: int, roof) -> dict:
    rng = np.random.default_rng(m)
    host = (rng.standard_normal((m, 2 * n), dtype=np.float32) * 3).astype(ml_dtypes.bfloat16)
    buffers = max(2, min(32, -(-bench.ROTATE_BYTES // host.nbytes)))
    xs = [cupy.asarray(host) for _ in range(buffers)]
    outs = [api.quantize(x, 128, **OPTIONS) for x in xs]
    paths = {"one-pass": math.inf, "persistent": 0.0} if m % 4 == 0 else {"one-pass": math.inf}
    calls = {name: [prepared(xs[0], out, waves) for out in outs] for name, waves in paths.items()}
    results = []
    for made in calls.values():
        q, s = outs[0]
        q.fill(0x7F)
        s.fill(-1)
        made[0](xs[0])
        results.append((q.get(), s.get()))
    for q, s in results[1:]:
        if not (np.array_equal(q, results[0][0]) and np.array_equal(s, results[0][1])):
            raise AssertionError("the persistent grid's output differs from the one-pass grid's")
    chunks = m * n * 2 // 32
    grid = (-(-chunks // bench.ROOFLINE_THREADS), 1, 1)
    count = max(buffers, 32)

    def roofline(i):
        x, q = xs[i % buffers], outs[i % buffers][0]
        args = (x, q, np.int64(chunks), np.int64(n * 2 // 32))
        return lambda: roof(grid, (bench.ROOFLINE_THREADS, 1, 1), args)

    def path(made):
        return lambda i: lambda: made[i % buffers](xs[i % buffers])

    def library(i):
        x, (q, s) = xs[i % buffers], outs[i % buffers]
        return lambda: api.quantize(x, 128, **OPTIONS, out=q, scale_out=s)

    makers = {"roof": roofline, **{name: path(made) for name, made in calls.items()},
              "library": library}  # fmt: skip
    lists = [[make(i) for i in range(count)] for make in makers.values()]
    return dict(zip(makers, bench.interleaved_graph_times_us(cupy, lists, 11)))


def main() -> None:
    _launch.PDL = False  # as bench: back-to-back calls do not overlap
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 7168
    roof = _jit.get_function("roofline.cu", "fgq::roofline_gated", cupy.cuda.runtime.getDevice())
    names = ("one-pass", "persistent", "library")
    print(f"N = {n}; us per call, then x roof")
    print(f"{'M':>6} {'roof':>8} " + " ".join(f"{c:>10}" for c in names) + "  "
          + " ".join(f"{c:>10}" for c in names))  # fmt: skip
    for m in [int(a) for a in sys.argv[2:]] or (1, 64, 512, 1024, 2048, 4096, 16384):
        t = measure(m, n, roof)
        times = " ".join(f"{t[c]:>10.2f}" if c in t else f"{'-':>10}" for c in names)
        ratios = " ".join(f"{t[c] / t['roof']:>10.3f}" if c in t else f"{'-':>10}" for c in names)
        print(f"{m:>6} {t['roof']:>8.2f} {times}  {ratios}", flush=True)


if __name__ == "__main__":
    main()
