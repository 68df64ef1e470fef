"""Experiment (docs/perf.md step 17): the flat one-pass grid against the row loop, a peer-style
minimal kernel and the roofline kernel, in one run.

For each (M, K), by CUDA-graph replay over rotating buffers as `bench` does (us per call):
- roof: the roofline kernel (same traffic, no work);
- peer: a minimal kernel written here in the style of SGLang's v2 kernel (flat group index,
  eight lanes per group, 32-bit offsets, integer division for the scale's row after the load,
  one byte store per scale, no padding rows, blocks of 8 or 16 groups as its host picks). It
  is a stand-in measured in the same run, not SGLang's code; its q and scales are checked
  against ours before timing;
- our one-pass kernel with T threads per block: <T> as shipped; nopad<T> writing no padding
  rows (not checked: it breaks the contract, and shows what the padding costs at M = 1);
  finite<T> without the Inf/NaN paths (the data holds none, so it is checked); both;
- loop: our row loop, as the launch layer sends large grids.
Every variant of ours is checked bit for bit against the NumPy backend before it is timed.
Run from the repository root: PYTHONPATH=$PWD python3 docs/experiments/flat_one_pass.py
"""

import sys

import cupy
import harness
import ml_dtypes
import numpy as np

from fp8_group_quant import _jit, _launch, bench
from fp8_group_quant.__main__ import activation
from fp8_group_quant._arrays import describe
from fp8_group_quant._request import make_request
from fp8_group_quant.reference import quantize_into

PEER = r"""
typedef unsigned int u32;
extern "C" __global__ void peer_packed(const uint4* __restrict__ x, uint4* __restrict__ q,
                                       unsigned char* __restrict__ scales, int groups_total,
                                       int groups_per_row, int tma) {
  const int gid = blockIdx.x * (blockDim.x / 8) + threadIdx.x / 8;
  const int lane = threadIdx.x % 8;
  const bool live = gid < groups_total;
  const int g = live ? gid : groups_total - 1;
  const uint4 a = __ldg(x + (g * 16 + lane * 2));
  const uint4 b = __ldg(x + (g * 16 + lane * 2 + 1));
  const u32 w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  float v[16];
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    m = fmaxf(m, fmaxf(fabsf(v[2 * i]), fabsf(v[2 * i + 1])));
  }
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  const float y = fmaxf(m, 1e-10f) / 448.0f;
  const u32 e = (__float_as_uint(y) + 0x7fffffu) >> 23;  // ceil to a power of two
  const float inv = __uint_as_float((254u - e) << 23);
  u32 out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    unsigned short lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(v[4 * i + 1] * inv),
        "f"(v[4 * i] * inv));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(v[4 * i + 3] * inv),
        "f"(v[4 * i + 2] * inv));
    out[i] = lo | ((u32)hi << 16);
  }
  if (!live) return;
  q[g * 8 + lane] = make_uint4(out[0], out[1], out[2], out[3]);
  if (lane == 0) {
    const int row = g / groups_per_row, col = g % groups_per_row;
    scales[((col / 4) * tma + row) * 4 + col % 4] = (unsigned char)e;
  }
}
"""


# text edits of kernels/ that make each binary measured (the production binary has none)
NO_PAD = [("if (active && row == p.rows - 1u) {", "if (false) {")]
FINITE = [("const bool nonfinite = magnitude >= In::kInf;", "const bool nonfinite = false;")]
VARIANTS = {"": [], "nopad": NO_PAD, "finite": FINITE}
COLUMNS = [("", 128), ("", 256), ("nopad", 128), ("finite", 128)]


def variant(*edits):
    """The default instantiation compiled from kernels/ with ``edits`` (old, new) applied."""
    text = _jit.source_text("quantize.cu")
    for old, new in edits:
        if old not in text:
            raise LookupError(f"edit target not in the kernel source: {old}")
        text = text.replace(old, new)
    if not edits:
        return _jit.get_function(
            _launch.SOURCE, _launch.DEFAULT_KEY.name_expression, cupy.cuda.runtime.getDevice()
        )
    return harness.compile_function(text, _launch.DEFAULT_KEY.name_expression)


def ours(m: int, k: int, x, threads: int | None, one_pass: bool, function=None):
    """Our launch at (m, k): one-pass with ``threads`` per block (and optionally another
    binary of it), or the row loop."""
    request = make_request(describe(x, "x"), 128, "e4m3", "ue8m0", "packed", 1e-10, False)
    device = cupy.cuda.runtime.getDevice()
    if not one_pass:
        saved = _launch.ONE_PASS_MAX_WAVES
        _launch.ONE_PASS_MAX_WAVES = 0
        try:
            return _launch.prepare(request, device)
        finally:
            _launch.ONE_PASS_MAX_WAVES = saved
    params = _launch.make_params(request)
    params.block_slots = threads // request.kernel_key().lanes_per_group  # step 26's field
    if function is None:
        key = request.kernel_key()
        function = _jit.get_function(_launch.SOURCE, key.name_expression, device)
    slots = _launch.one_pass_slots(request.output, 1)
    grid = (-(-slots * 8 // threads), 1, 1)
    return harness.variant_launch(function, grid, (threads, 1, 1), params)


def reference(m: int, k: int, x_host) -> tuple:
    """The NumPy backend's q and scale storage at (m, k)."""
    geometry = _launch.Geometry((m, k), 128, "packed", False)
    q_ref = np.empty(geometry.q_storage, np.uint8)
    s_ref = np.empty(geometry.scale_storage, np.int32)
    quantize_into(x_host, geometry, "e4m3", "ue8m0", 1e-10, q_ref, s_ref)
    return q_ref, s_ref


def check_ours(launch, expected, x_dev) -> None:
    """Run ``launch`` once over poisoned outputs; every byte must equal the reference's."""
    q_ref, s_ref = expected
    q = cupy.full(q_ref.size, 0x7F, cupy.uint8)
    s = cupy.full(s_ref.size, 0x7F7F7F7F, cupy.int32)
    launch.launch(x_dev.data.ptr, q.data.ptr, s.data.ptr, cupy.cuda.get_current_stream().ptr)
    if not (np.array_equal(q.get(), q_ref) and np.array_equal(s.get(), s_ref)):
        raise AssertionError("a variant of ours differs from the reference")


def main() -> None:
    _launch.PDL = False  # as the roofline kernel: back-to-back launches do not overlap
    roofline = harness.roofline_function()
    peer = cupy.RawModule(code=PEER, options=("--std=c++17",)).get_function("peer_packed")
    binaries = {name: variant(*edits) for name, edits in VARIANTS.items()}
    print("registers:", {name: f.num_regs for name, f in binaries.items()}, "peer", peer.num_regs)
    columns = ("roof", "peer", *(f"{n}{t}" for n, t in COLUMNS), "loop")
    print(f"{'M':>6} {'K':>5} " + " ".join(f"{c:>9}" for c in columns), flush=True)
    ks = [int(a) for a in sys.argv[1:]] or [7168, 2688, 2048]
    for k in ks:
        for m in (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384):
            times, same = measure(m, k, roofline, peer, binaries)
            print(f"{m:>6} {k:>5} " + " ".join(f"{t:>9.2f}" for t in times)
                  + ("" if same else "  peer differs"), flush=True)  # fmt: skip


def measure(m: int, k: int, roofline, peer, binaries) -> tuple[list[float], bool]:
    """Times of every column at (m, k), and whether the peer's output equals ours."""
    x_host = activation(m, k, seed=m + k).astype(ml_dtypes.bfloat16)
    buffers = max(2, min(64, -(-harness.ROTATE_BYTES // x_host.nbytes)))
    inputs = [cupy.asarray(x_host) for _ in range(buffers)]
    scale_words = _launch.Geometry((m, k), 128, "packed", False).scale_storage
    outputs = [(cupy.empty((m, k), cupy.uint8), cupy.empty(scale_words, cupy.int32))
               for _ in range(buffers)]  # fmt: skip
    launches = {
        f"{name}{threads}": ours(m, k, inputs[0], threads, True, binaries[name])
        for name, threads in COLUMNS
    }
    launches["loop"] = ours(m, k, inputs[0], None, False)
    expected = reference(m, k, x_host)
    for name, launch in launches.items():
        if "nopad" not in name:  # skips part of the contract (finite data has no Inf/NaN)
            check_ours(launch, expected, inputs[0])
    # the peer: groups per block as its host picks, checked against ours
    total, per_row, tma = m * k // 128, k // 128, -(-m // 4) * 4
    spb = 16 if total % 16 == 0 and total // 16 >= 132 else 8
    peer_grid = (-(-total // spb), 1, 1)

    def peer_call(i):
        x, (q, s) = inputs[i % buffers], outputs[i % buffers]
        args = (x, q, s, np.int32(total), np.int32(per_row), np.int32(tma))
        return lambda: peer(peer_grid, (spb * 8, 1, 1), args)

    outputs[0][1].fill(0)
    peer_call(0)()
    q_ours = cupy.empty_like(outputs[0][0])
    s_ours = cupy.zeros_like(outputs[0][1])
    stream = cupy.cuda.get_current_stream().ptr
    launches[f"{COLUMNS[0][0]}{COLUMNS[0][1]}"].launch(
        inputs[0].data.ptr, q_ours.data.ptr, s_ours.data.ptr, stream
    )
    same = bool((q_ours.view(cupy.uint8) == outputs[0][0].view(cupy.uint8)).all())
    same = same and bool((s_ours == outputs[0][1]).all())
    times = [
        harness.time_roofline(roofline, inputs, outputs),
        bench.graph_time_us(cupy, [peer_call(i) for i in range(max(buffers, 32))], 9),
    ]
    times += [harness.time_launch(launch, inputs, outputs) for launch in launches.values()]
    return times, same


if __name__ == "__main__":
    main()
