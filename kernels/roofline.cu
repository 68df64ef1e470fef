// The quantizer's traffic with none of its work: the honest ceiling the benchmark compares with.
// One thread per 16 bf16 values: two 16-byte loads and one 16-byte store, as in quantize_groups.
#include "common.cuh"

namespace fgq {

__global__ void roofline_copy(const uint4* __restrict__ x, uint4* __restrict__ q, i64 chunks) {
  const i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const uint4 a = __ldg(x + 2 * i);
  const uint4 b = __ldg(x + 2 * i + 1);
  // NOTES: the store depends on both loads, so neither can be dropped by the compiler
  q[i] = make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
}

}  // namespace fgq


namespace fgq {

// The fused SiLU-and-multiply quantizer's traffic: one thread per 16 output bytes reads the 32
// gate bytes and the 32 up bytes (`up` chunks of 32 bytes further) and stores 16.
__global__ void roofline_gated(const uint4* __restrict__ x, uint4* __restrict__ q, i64 chunks,
                               i64 row_chunks) {
  const i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const i64 row = i / row_chunks, column = i - row * row_chunks;
  const uint4* gate = x + 2 * (row * 2 * row_chunks + column);
  const uint4* up = gate + 2 * row_chunks;
  const uint4 a = __ldg(gate), b = __ldg(gate + 1), c = __ldg(up), d = __ldg(up + 1);
  q[i] = make_uint4(a.x ^ b.x ^ c.x ^ d.x, a.y ^ b.y ^ c.y ^ d.y, a.z ^ b.z ^ c.z ^ d.z,
                    a.w ^ b.w ^ c.w ^ d.w);
}

}  // namespace fgq

namespace fgq {

// The fused add-RMSNorm quantizer's traffic: one thread per 16 values reads 32 bytes of x and
// 32 of the residual, writes the 32 residual bytes back and stores 16 bytes of codes.
__global__ void roofline_residual(const uint4* __restrict__ x, uint4* __restrict__ residual,
                                  uint4* __restrict__ q, i64 chunks) {
  const i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const uint4 a = __ldg(x + 2 * i), b = __ldg(x + 2 * i + 1);
  const uint4 c = residual[2 * i], d = residual[2 * i + 1];
  residual[2 * i] = make_uint4(a.x ^ c.x, a.y ^ c.y, a.z ^ c.z, a.w ^ c.w);
  residual[2 * i + 1] = make_uint4(b.x ^ d.x, b.y ^ d.y, b.z ^ d.z, b.w ^ d.w);
  q[i] = make_uint4(a.x ^ b.x ^ c.x ^ d.x, a.y ^ b.y ^ c.y ^ d.y, a.z ^ b.z ^ c.z ^ d.z,
                    a.w ^ b.w ^ c.w ^ d.w);
}

}  // namespace fgq

namespace fgq {

// NVFP4's traffic: 32 bytes read and 8 written per thread (the e4m3 scales, 1 byte per 32 read,
// are left out, so this roof is slightly faster than the same traffic)
__global__ void roofline_narrow(const uint4* __restrict__ x, uint2* __restrict__ q, i64 chunks) {
  const i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const uint4 a = __ldg(x + 2 * i);
  const uint4 b = __ldg(x + 2 * i + 1);
  q[i] = make_uint2(a.x ^ a.y ^ b.x ^ b.y, a.z ^ a.w ^ b.z ^ b.w);
}

}  // namespace fgq

namespace fgq {

// Both orientations' traffic: one read and two writes. One thread per 16 bf16 values reads 32
// bytes and stores 16 to q and 16 to qt (at the same offset: the roof of a transpose is a copy's).
__global__ void roofline_split(const uint4* __restrict__ x, uint4* __restrict__ q,
                               uint4* __restrict__ qt, i64 chunks) {
  const i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const uint4 a = __ldg(x + 2 * i);
  const uint4 b = __ldg(x + 2 * i + 1);
  q[i] = make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
  qt[i] = make_uint4(a.x ^ b.y, a.y ^ b.z, a.z ^ b.w, a.w ^ b.x);
}

}  // namespace fgq
