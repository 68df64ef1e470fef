"""Experiment (issue 13, session 10): the fused SiLU path on its one-pass grid or on the masked
layout's persistent grid.

The plain SiLU-and-multiply path launches one group slot per lane set (one-pass, five
resident blocks of 128 threads), each block copying the 7.5 KB SiLU table into shared memory
and waiting for it. The masked layout's kernel (quantize_masked) walks the slots with a
persistent grid, copying the table once per resident block. Timing the same rows through it
(x viewed as [1, M, 2N], masked_m = [M]) shows what a persistent grid would give the plain
path. Its codes are checked against the plain path's first.

Columns, us per call, CUDA-graph replay over rotating buffers, graphs replayed in turn, PDL
off as `bench` launches (N = 7168 unless given, bf16 -> e4m3, packed UE8M0 scales): roof
(`roofline_gated`, the same traffic), one-pass (the library's plain SiLU launch), persistent
(the masked kernel, E = 1).
Run from the repository root: PYTHONPATH=$PWD python3 docs/experiments/silu_persistent.py [N]
"""

import sys

import cupy
import ml_dtypes
import numpy as np

from fp8_group_quant import _jit, _launch, api, bench

OPTIONS = dict(scale="ue8m0", layout="packed", activation="silu_mul")


def measure(m: int, n: int, roof) -> dict:
    rng = np.random.default_rng(m)
    host = (rng.standard_normal((m, 2 * n), dtype=np.float32) * 3).astype(ml_dtypes.bfloat16)
    buffers = max(2, min(32, -(-bench.ROTATE_BYTES // host.nbytes)))
    xs = [cupy.asarray(host) for _ in range(buffers)]
    counts = cupy.asarray(np.array([m], np.int32))
    plain = [api.quantize(x, 128, **OPTIONS) for x in xs]
    masked = [api.quantize(x.reshape(1, m, 2 * n), 128, **OPTIONS, masked_m=counts) for x in xs]
    q_plain, q_masked = plain[0][0].get().view(np.uint8), masked[0][0].get().view(np.uint8)
    if not np.array_equal(q_plain.reshape(-1)[: m * n], q_masked.reshape(-1)[: m * n]):
        raise AssertionError("the persistent grid's codes differ from the one-pass grid's")
    chunks = m * n * 2 // 32
    grid = (-(-chunks // bench.ROOFLINE_THREADS), 1, 1)
    calls = max(buffers, 32)

    def roofline(i):
        x, q = xs[i % buffers], plain[i % buffers][0]
        args = (x, q, np.int64(chunks), np.int64(n * 2 // 32))
        return lambda: roof(grid, (bench.ROOFLINE_THREADS, 1, 1), args)

    def one_pass(i):
        x, (q, s) = xs[i % buffers], plain[i % buffers]
        return lambda: api.quantize(x, 128, **OPTIONS, out=q, scale_out=s)

    def persistent(i):
        x, (q, s) = xs[i % buffers].reshape(1, m, 2 * n), masked[i % buffers]
        return lambda: api.quantize(x, 128, **OPTIONS, masked_m=counts, out=q, scale_out=s)

    lists = [[make(i) for i in range(calls)] for make in (roofline, one_pass, persistent)]
    times = bench.interleaved_graph_times_us(cupy, lists, 11)
    return dict(zip(("roof", "one-pass", "persistent"), times))


def main() -> None:
    _launch.PDL = False  # as bench: back-to-back calls do not overlap
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 7168
    roof = _jit.get_function("roofline.cu", "fgq::roofline_gated", cupy.cuda.runtime.getDevice())
    print(f"N = {n}; us per call; x roof")
    print(f"{'M':>6} {'roof':>8} {'one-pass':>9} {'persistent':>11} {'x roof':>7} {'x roof':>7}")
    for m in (1, 64, 512, 1024, 4096, 16384):
        t = measure(m, n, roof)
        print(f"{m:>6} {t['roof']:>8.2f} {t['one-pass']:>9.2f} {t['persistent']:>11.2f} "
              f"{t['one-pass'] / t['roof']:>7.3f} {t['persistent'] / t['roof']:>7.3f}",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
