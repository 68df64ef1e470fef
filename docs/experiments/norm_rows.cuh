// Experiment (issue 13, session 20): the fused RMSNorm with several rows a block in flight in
// registers. Appended to quantize.cu by docs/experiments/norm_rows.py (not part of the library).
// NOTES: a block holds kRows row slots, kPer 32-byte lanes a thread in each (the library's lane
// numbering: thread t holds lanes t and t + blockDim.x). It loads every slot's row up front, in
// slot order, then works the slots in turn; each slot, once its row is stored, loads the row
// kRows * gridDim.x further on into the same registers. So with one wave of blocks (M <= the
// grid's rows) the rows of an SM arrive one after another and each is worked on while the next
// ones arrive, where a block a row has them all arrive at the end together; past a wave, each
// block keeps kRows rows in flight without shared-memory stages. The reduction is the
// library's (the spec's order): lane sums, xor folds, one slot a warp of lanes, warp 0 folds
// the slots and computes r behind two barriers. 16-bit input, no residual; the weight as
// float32 in dynamic shared memory, as the library's kStash kernel keeps it.
namespace fgq {

template <int kIn, int kGroup, int kOut, int kScale, int kLayout, int kPer, int kRows, int kRegisters>
__global__ void __maxnreg__(kRegisters) quantize_norm_rows(const __grid_constant__ Params p) {
  typedef Input<kIn> In;
  typedef typename In::Storage Storage;
  static_assert(In::kBytes == 2, "16-bit input");
  constexpr int kValues = kLaneWords * 4 / In::kBytes;
  constexpr int kLanes = kGroup / kValues;
  constexpr int kChunks = kValues / 4;
  __shared__ float warp_sums[2][32];
  __shared__ float row_r[2];
  extern __shared__ float4 norm_stash[];

  const u32 total_rows = p.batches * p.rows;
  const int lanes = p.groups_per_row * kLanes;
  const int t = threadIdx.x;
  const int lane = t % kLanes;
  const i64 k = static_cast<i64>(p.groups_per_row) * kGroup;
  const bool warp_slot = (t & 31) < kPer * static_cast<int>(blockDim.x >> 5);
  bool in_row[kPer];
  int group[kPer];
  i64 value0[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int index = t + j * static_cast<int>(blockDim.x);
    in_row[j] = index < lanes;
    group[j] = min(index, lanes - 1) / kLanes;
    value0[j] = static_cast<i64>(min(index, lanes - 1)) * kValues;
  }
  const Storage* x_lane = static_cast<const Storage*>(p.x) + value0[0];
  const i64 second = value0[kPer - 1] - value0[0];
  const u32 stride = gridDim.x * kRows;

  auto place = [&](u32 flat, u32& batch, u32& row) {
    batch = p.batches == 1u ? 0u : flat / p.rows;
    row = flat - batch * p.rows;
  };
  auto load_row = [&](u32 flat, u32(&x)[kPer][kLaneWords]) {
    u32 batch, row;
    place(flat, batch, row);
    const Storage* x_row = x_lane + batch * p.x_batch_stride + row * p.x_row_stride;
#pragma unroll
    for (int j = 0; j < kPer; ++j) load_lane<kIn, true>(x_row + j * second, x[j]);
  };

  u32 words[kRows][kPer][kLaneWords];
  wait_for_producer();
  const u32 first = blockIdx.x * kRows;
#pragma unroll
  for (int s = 0; s < kRows; ++s) {
    if (first + s < total_rows) load_row(first + s, words[s]);
  }
  float4* const stash = norm_stash + (t >> 5) * (32 * kPer * kChunks) + (t & 31);
  const Storage* weight_lane = static_cast<const Storage*>(p.weight) + value0[0];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    u32 weight[kLaneWords];
    load_lane<kIn, true>(weight_lane + j * second, weight);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      stash[(j * kChunks + c) * 32] =
          make_float4(value_of<kIn>(weight, 4 * c), value_of<kIn>(weight, 4 * c + 1),
                      value_of<kIn>(weight, 4 * c + 2), value_of<kIn>(weight, 4 * c + 3));
    }
  }

  int set = 0;
  for (u32 base = first; base < total_rows; base += stride) {
    if (base + stride >= total_rows) signal_dependents();  // the block's last loads are issued
#pragma unroll
    for (int s = 0; s < kRows; ++s) {
      const u32 flat = base + s;
      if (flat >= total_rows) break;  // the same in the whole block
      u32 batch, row;
      place(flat, batch, row);
      float lane_sums[kPer];
#pragma unroll
      for (int j = 0; j < kPer; ++j) lane_sums[j] = in_row[j] ? lane_sum_of_squares<kIn>(words[s][j]) : 0.0f;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const float warp_total = warp_fold(lane_sums[j]);
        if ((t & 31) == 0) warp_sums[set][(t >> 5) + j * static_cast<int>(blockDim.x >> 5)] = warp_total;
      }
      __syncthreads();
      float r = 0.0f;
      if (t < 32) {
        const float total = warp_fold(warp_slot ? warp_sums[set][t & 31] : 0.0f);
        const float mean = div_rn(total, static_cast<float>(lanes * kValues));
        r = div_rn(1.0f, sqrt_rn(add_rn(mean, p.eps_norm)));
        if (t == 0) row_r[set] = r;
      }
      __syncthreads();
      r = row_r[set];
      set ^= 1;
      const u32 next = flat + stride;
      const bool more = next < total_rows;
      u8* q_batch = p.q + batch * p.q_batch_stride;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        float w[kValues];
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const float4 v = stash[(j * kChunks + c) * 32];
          w[4 * c] = v.x, w[4 * c + 1] = v.y, w[4 * c + 2] = v.z, w[4 * c + 3] = v.w;
        }
        FloatLane<kValues> y;
        normalize_lane<kIn>(words[s][j], [&](int i) { return w[i]; }, r, y);
        if (in_row[j] && row == p.rows - 1u) {
          zero_padding_rows<kValues, kLanes, kLayout>(p, q_batch + value0[j], k, batch, row, group[j], lane);
        }
        quantize_group<kIn, kGroup, kOut, kScale, kLayout, true, true>(
            p, y, 0xffffffffu, true, q_batch + row * k + value0[j], in_row[j],
            ScaleLayout<kLayout>::at(p, batch, row, group[j]), in_row[j] && lane == 0, group[j]);
      }
      if (more) load_row(next, words[s]);
    }
  }
}

}  // namespace fgq
