"""Experiment (docs/perf.md, open gaps): what makes a kernel with the quantizer's traffic slower
than the roofline kernel at a few rows?

Roofline variants with 14 more parameters, with the quantizer's 2-D grid of 224-thread blocks,
and with 256 dependent integer instructions between the loads and the store (unrolled: 424
instructions of code; rolled: 56), beside the quantizer, by CUDA-graph replay.
Run on a GPU from the repository root: PYTHONPATH=. python3 docs/experiments/small_m_anatomy.py
Output of the H200 run: docs/logs/experiment-small-m-anatomy-h200.log
"""

import cupy
import harness
import numpy as np

from fp8_group_quant import api, bench

# xor-shift-multiply steps: not linear, so the compiler cannot fold 32 of them into one
CODE = r"""
typedef long long i64;
#define BODY(extra)                                                              \
  const uint4 a = __ldg(x + 2 * i);                                              \
  const uint4 b = __ldg(x + 2 * i + 1);                                          \
  unsigned w0 = a.x ^ b.x, w1 = a.y ^ b.y, w2 = a.z ^ b.z, w3 = a.w ^ b.w;       \
  extra                                                                          \
  q[i] = make_uint4(w0, w1, w2, w3);
#define CHAIN                                                                    \
  for (int t = 0; t < 32; ++t) {                                                 \
    w0 = (w0 ^ (w0 >> 13)) * 0x5bd1e995u;                                        \
    w1 = (w1 ^ (w1 >> 11)) * 0x9e3779b1u;                                        \
    w2 = (w2 ^ (w2 >> 7)) * 0x85ebca6bu;                                         \
    w3 = (w3 ^ (w3 >> 5)) * 0xc2b2ae35u;                                         \
  }
#define INDEX const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
extern "C" {
__global__ void r_plain(const uint4* __restrict__ x, uint4* __restrict__ q, i64 n) {
  INDEX if (i >= n) return;
  BODY()
}
__global__ void r_params(const uint4* __restrict__ x, uint4* __restrict__ q, i64 n,
                         i64 p0, i64 p1, i64 p2, i64 p3, i64 p4, i64 p5, i64 p6, i64 p7,
                         i64 p8, i64 p9, i64 p10, i64 p11, i64 p12, i64 p13) {
  INDEX if (i >= n + p0 + p13) return;
  BODY()
}
__global__ void r_grid2d(const uint4* __restrict__ x, uint4* __restrict__ q, i64 per_row) {
  const i64 i = (i64)blockIdx.x * per_row + (i64)blockIdx.y * blockDim.x + threadIdx.x;
  BODY()
}
__global__ void r_unrolled(const uint4* __restrict__ x, uint4* __restrict__ q, i64 n) {
  INDEX if (i >= n) return;
  BODY(_Pragma("unroll") CHAIN)
}
__global__ void r_rolled(const uint4* __restrict__ x, uint4* __restrict__ q, i64 n) {
  INDEX if (i >= n) return;
  BODY(_Pragma("unroll 1") CHAIN)
}
}
"""
NAMES = ("r_plain", "r_params", "r_grid2d", "r_unrolled", "r_rolled")
K = 7168  # two 224-thread blocks of 16 values per thread per row, as the quantizer launches


def launches(function, name: str, m: int, inputs, outputs) -> list:
    """One graph's worth of launches of the roofline variant ``name`` over the inputs."""
    chunks = m * K * 2 // 32
    if name == "r_grid2d":
        grid, block, extra = (m, 2, 1), (224, 1, 1), ()
        count = np.int64(K * 2 // 32)  # chunks per row
    else:
        grid, block, count = (-(-chunks // 256), 1, 1), (256, 1, 1), np.int64(chunks)
        extra = tuple(np.int64(0) for _ in range(14)) if name == "r_params" else ()

    def call(i):
        x, (q, _) = inputs[i % len(inputs)], outputs[i % len(outputs)]
        return lambda: function(grid, block, (x, q, count) + extra)

    return [call(i) for i in range(harness.CALLS)]


def quantizer_launches(inputs, outputs) -> list:
    def call(i):
        x, (q, s) = inputs[i % len(inputs)], outputs[i % len(outputs)]
        return lambda: api.quantize_packed(x, out=q, scale_out=s)

    return [call(i) for i in range(harness.CALLS)]


def main() -> None:
    module = cupy.RawModule(code=CODE)
    functions = {name: module.get_function(name) for name in NAMES}
    for name, function in functions.items():
        print(name, "registers", function.num_regs, flush=True)
    print(f"{'M':>6} " + " ".join(f"{n:>11}" for n in (*NAMES, "ours")), flush=True)
    for m in (1, 16, 64, 256):
        inputs, outputs = harness.rotating_inputs(m, K)
        times = [
            bench.graph_time_us(cupy, launches(f, name, m, inputs, outputs), 9)
            for name, f in functions.items()
        ]
        times.append(bench.graph_time_us(cupy, quantizer_launches(inputs, outputs), 9))
        print(f"{m:>6} " + " ".join(f"{t:>11.2f}" for t in times), flush=True)


if __name__ == "__main__":
    main()
