"""GeGLU beside SiLU-and-multiply, fused (bf16 [M, 2N] -> e4m3, packed UE8M0, N = 7168), in one
process: each path's graph of calls over rotating buffers, the two replayed in turn (a, b, a,
b, ...) in five rounds, each path checked against the NumPy backend first. Prints per M the
median times, the ratio GeGLU / SiLU of each round and their median.

    PYTHONPATH=. python3 tools/geglu_vs_silu.py [M ...]
"""

import math
import sys

import cupy
import ml_dtypes
import numpy as np

import fp8_group_quant as fgq
from fp8_group_quant.bench.timing import ROTATE_BYTES, interleaved_graph_times_us

N = 7168
OPTIONS = dict(scale="ue8m0", layout="packed")
PATHS = ("silu_mul", "gelu_tanh_mul")


def calls_of(xs, activation: str, count: int) -> list:
    """``count`` prepared-output calls of one path over the buffers ``xs``, after checking the
    first buffer's result against the NumPy backend bit for bit."""
    outs = [fgq.quantize(x, 128, **OPTIONS, activation=activation) for x in xs]
    q, s = outs[0]
    q_ref, s_ref = fgq.quantize(cupy.asnumpy(xs[0]), 128, **OPTIONS, activation=activation)
    assert np.array_equal(cupy.asnumpy(q).view(np.uint8), np.asarray(q_ref).view(np.uint8))
    assert np.array_equal(cupy.asnumpy(s), np.asarray(s_ref)), activation

    def call(x, o):
        return lambda: fgq.quantize(x, 128, **OPTIONS, activation=activation, out=o[0],
                                    scale_out=o[1])  # fmt: skip

    return [call(xs[i % len(xs)], outs[i % len(xs)]) for i in range(count)]


def main(ms: list[int]) -> None:
    rng = np.random.default_rng(5)
    for m in ms:
        buffers = max(2, min(32, math.ceil(ROTATE_BYTES / (m * 2 * N * 2))))
        xs = []
        for _ in range(buffers):
            values = (rng.standard_normal((m, 2 * N)) * 3).astype(np.float32)
            values[rng.random(values.shape) < 1e-3] *= 40  # outliers
            xs.append(cupy.asarray(values.astype(ml_dtypes.bfloat16)))
        lists = [calls_of(xs, path, max(buffers, 200)) for path in PATHS]
        rounds = [interleaved_graph_times_us(cupy, lists, replays=9) for _ in range(5)]
        silu, gelu = (float(np.median([r[i] for r in rounds])) for i in range(2))
        ratios = [r[1] / r[0] for r in rounds]
        print(f"M={m:6d} silu {silu:7.3f} gelu {gelu:7.3f} ratio {np.median(ratios):.3f} "
              f"rounds {' '.join(f'{x:.3f}' for x in ratios)}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1, 8, 16, 32, 64, 128, 256, 1024, 4096, 8192])
