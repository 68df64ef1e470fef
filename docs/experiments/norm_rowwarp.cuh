// Experiment (issue 13, session 19): the fused RMSNorm with a whole row in one warp's registers.
// Appended to quantize.cu by docs/experiments/norm_rowwarp.py (not part of the library).
// NOTES: kSpans warps of lanes a row, exactly (lanes == 32 kSpans, checked by the script): each
// thread holds lane 32 s + i of every span s in registers (8 kSpans words). Pass 1 folds each
// span's lane sums with xor shuffles in the spec's order and keeps span s's total in thread s;
// one more warp_fold gives the row's sum, every thread computes r; pass 2 normalises (the
// weight as float32 from the block's shared memory), quantizes and stores span s, then loads
// span s of the warp's next row into the same registers, so the next row is in flight while
// this one is worked on. No barrier in the row loop; 16-bit input, no residual.
namespace fgq {

template <int kIn, int kGroup, int kOut, int kScale, int kLayout, int kSpans>
__global__ void __launch_bounds__(128, 3) quantize_norm_rowwarp(const __grid_constant__ Params p) {
  typedef Input<kIn> In;
  typedef typename In::Storage Storage;
  constexpr int kValues = kLaneWords * 4 / In::kBytes;
  constexpr int kLanes = kGroup / kValues;
  constexpr int kChunks = kValues / 4;
  constexpr int kRowLanes = 32 * kSpans;
  extern __shared__ float4 norm_stash[];

  const int i = threadIdx.x & 31;
  const i64 k = static_cast<i64>(kRowLanes) * kValues;
  const u32 total_rows = p.batches * p.rows;
  const u32 warps = gridDim.x * (blockDim.x >> 5);
  u32 flat = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);

  wait_for_producer();
  {
    const Storage* weight = static_cast<const Storage*>(p.weight);
    for (int lane_index = threadIdx.x; lane_index < kRowLanes; lane_index += blockDim.x) {
      u32 w[kLaneWords];
      load_lane<kIn, true>(weight + static_cast<i64>(lane_index) * kValues, w);
      float4* dst = norm_stash + (lane_index >> 5) * (32 * kChunks) + (lane_index & 31);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        dst[c * 32] = make_float4(value_of<kIn>(w, 4 * c), value_of<kIn>(w, 4 * c + 1),
                                  value_of<kIn>(w, 4 * c + 2), value_of<kIn>(w, 4 * c + 3));
      }
    }
  }
  __syncthreads();
  if (flat >= total_rows) return;

  auto row_of = [&](u32 f, u32& batch, u32& row) -> const Storage* {
    batch = p.batches == 1u ? 0u : f / p.rows;
    row = f - batch * p.rows;
    return static_cast<const Storage*>(p.x) + batch * p.x_batch_stride + row * p.x_row_stride + i * kValues;
  };
  u32 batch, row;
  const Storage* src = row_of(flat, batch, row);
  u32 words[kSpans][kLaneWords];
#pragma unroll
  for (int s = 0; s < kSpans; ++s) load_lane<kIn, true>(src + s * 32 * kValues, words[s]);

  for (;;) {
    float slot = 0.0f;
#pragma unroll
    for (int s = 0; s < kSpans; ++s) {
      const float total = warp_fold(lane_sum_of_squares<kIn>(words[s]));
      if (i == s) slot = total;
    }
    const float sum = warp_fold(slot);
    const float r = div_rn(1.0f, sqrt_rn(add_rn(div_rn(sum, static_cast<float>(k)), p.eps_norm)));

    const u32 next = flat + warps;
    const bool more = next < total_rows;
    if (!more) signal_dependents();
    u32 next_batch = 0u, next_row = 0u;
    const Storage* next_src = more ? row_of(next, next_batch, next_row) : src;
    u8* q_row = p.q + batch * p.q_batch_stride + row * k + i * kValues;
    const bool last_row = row == p.rows - 1u;
#pragma unroll
    for (int s = 0; s < kSpans; ++s) {
      float w[kValues];
      const float4* ws = norm_stash + s * (32 * kChunks) + i;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const float4 v = ws[c * 32];
        w[4 * c] = v.x, w[4 * c + 1] = v.y, w[4 * c + 2] = v.z, w[4 * c + 3] = v.w;
      }
      FloatLane<kValues> y;
      normalize_lane<kIn>(words[s], [&](int j) { return w[j]; }, r, y);
      if (more) load_lane<kIn, true>(next_src + s * 32 * kValues, words[s]);
      const int group = (s * 32 + i) / kLanes;
      const int lane = i % kLanes;
      if (last_row) {
        zero_padding_rows<kValues, kLanes, kLayout>(p, p.q + batch * p.q_batch_stride + (s * 32 + i) * kValues,
                                                    k, batch, row, group, lane);
      }
      quantize_group<kIn, kGroup, kOut, kScale, kLayout, true, true>(
          p, y, 0xffffffffu, true, q_row + s * 32 * kValues, true, ScaleLayout<kLayout>::at(p, batch, row, group),
          lane == 0, group);
    }
    if (!more) break;
    flat = next, batch = next_batch, row = next_row, src = next_src;
  }
}

}  // namespace fgq
