"""Experiment (docs/perf.md, step 11): what makes a kernel with the quantizer's traffic slower
than the roofline kernel at a few rows?

Roofline variants with 14 more parameters, with the quantizer's 2-D grid of 224-thread blocks,
and with 256 dependent integer instructions between the loads and the store (unrolled: 424
instructions of code; rolled: 56), beside the quantizer, by CUDA-graph replay.
Run on a GPU from the repository root: PYTHONPATH=. python3 docs/experiments/small_m_anatomy.py
Output of the H200 run: docs/logs/experiment-small-m-anatomy-h200.log
"""
import numpy as np, cupy, ml_dtypes
from fp8_group_quant import _jit, _launch, bench, api
from fp8_group_quant._layout import Geometry

CODE = r'''
typedef long long i64;
#define BODY(extra) \
  const uint4 a = __ldg(x + 2 * i); const uint4 b = __ldg(x + 2 * i + 1); \
  unsigned w0 = a.x ^ b.x, w1 = a.y ^ b.y, w2 = a.z ^ b.z, w3 = a.w ^ b.w; extra \
  q[i] = make_uint4(w0, w1, w2, w3);
#define CHAIN for (int t = 0; t < 32; ++t) { w0 = (w0 ^ (w0 >> 13)) * 0x5bd1e995u; w1 = (w1 ^ (w1 >> 11)) * 0x9e3779b1u; w2 = (w2 ^ (w2 >> 7)) * 0x85ebca6bu; w3 = (w3 ^ (w3 >> 5)) * 0xc2b2ae35u; }
extern "C" {
__global__ void r_plain(const uint4* __restrict__ x, uint4* __restrict__ q, i64 n) {
  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; if (i >= n) return; BODY()
}
__global__ void r_params(const uint4* __restrict__ x, uint4* __restrict__ q, i64 n, i64 p0, i64 p1, i64 p2, i64 p3, i64 p4, i64 p5, i64 p6, i64 p7, i64 p8, i64 p9, i64 p10, i64 p11, i64 p12, i64 p13) {
  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; if (i >= n + p0 + p13) return; BODY()
}
__global__ void r_grid2d(const uint4* __restrict__ x, uint4* __restrict__ q, i64 per_row) {
  const i64 i = (i64)blockIdx.x * per_row + (i64)blockIdx.y * blockDim.x + threadIdx.x; BODY()
}
__global__ void r_unrolled(const uint4* __restrict__ x, uint4* __restrict__ q, i64 n) {
  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; if (i >= n) return;
  BODY(_Pragma("unroll") CHAIN)
}
__global__ void r_rolled(const uint4* __restrict__ x, uint4* __restrict__ q, i64 n) {
  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; if (i >= n) return;
  BODY(_Pragma("unroll 1") CHAIN)
}
}
'''
mod = cupy.RawModule(code=CODE)
f = {n: mod.get_function(n) for n in ("r_plain", "r_params", "r_grid2d", "r_unrolled", "r_rolled")}
for n, fn in f.items():
    print(n, "regs", fn.num_regs, flush=True)
key = _launch.DEFAULT_KEY
dev = cupy.cuda.runtime.getDevice()
print(f"{'M':>6} " + " ".join(f"{n:>11}" for n in list(f) + ["ours"]), flush=True)
k = 7168
for m in (1, 16, 64, 256):
    nbuf = 64
    host = np.random.default_rng(m).standard_normal((m, k), dtype=np.float32).astype(ml_dtypes.bfloat16)
    xs = [cupy.asarray(host) for _ in range(nbuf)]
    outs = [api.quantize_packed(x) for x in xs]
    chunks = m * k * 2 // 32
    g1 = (-(-chunks // 256), 1, 1)
    def launches(name):
        fn = f[name]
        if name == "r_grid2d":
            return [lambda i=i: fn((m, 2, 1), (224, 1, 1), (xs[i % nbuf], outs[i % nbuf][0], np.int64(448))) for i in range(64)]
        extra = tuple(np.int64(0) for _ in range(14)) if name == "r_params" else ()
        return [lambda i=i: fn(g1, (256, 1, 1), (xs[i % nbuf], outs[i % nbuf][0], np.int64(chunks)) + extra) for i in range(64)]
    row = [bench.graph_time_us(cupy, launches(n), replays=9) for n in f]
    ours = [lambda i=i: api.quantize_packed(xs[i % nbuf], out=outs[i % nbuf][0], scale_out=outs[i % nbuf][1]) for i in range(64)]
    row.append(bench.graph_time_us(cupy, ours, replays=9))
    print(f"{m:>6} " + " ".join(f"{t:>11.2f}" for t in row), flush=True)
