// The benchmark's producer and consumer around the quantizer (`bench --chain`): one kernel that
// writes x, one that reads q and the scales. Both take part in Programmatic Dependent Launch as
// quantize_groups does, so a chain of them measures what PDL saves between kernels.
#include "common.cuh"

namespace fgq {

// x[i]: bf16 values of varied sign, exponent and mantissa from a hash of i and the step
__global__ void produce_bf16(u16* __restrict__ x, i64 n, u32 step) {
  wait_for_producer();
  signal_dependents();  // the quantizer may start its prologue; it waits for our end to read
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const u32 h = static_cast<u32>(i) * 2654435761u + step * 40503u;
    x[i] = static_cast<u16>(((h >> 16) & 0x8000u) | ((118u + h % 17u) << 7) | (h & 0x7fu));
  }
}

// reads every word of q and of the scales, as a GEMM would; writes only if the sum is a magic
// value, so the reads cannot be dropped and the kernel writes (almost) nothing
__global__ void consume(const u32* __restrict__ q, i64 q_words, const u32* __restrict__ scales,
                        i64 scale_words, u32* __restrict__ sink) {
  wait_for_producer();
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  const i64 first = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  u32 sum = 0u;
  for (i64 i = first; i < q_words; i += stride) sum += __ldg(q + i);
  for (i64 i = first; i < scale_words; i += stride) sum ^= __ldg(scales + i);
  signal_dependents();
  if (sum == 0x9e3779b9u) sink[blockIdx.x] = sum;
}

}  // namespace fgq
