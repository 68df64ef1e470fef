// Fused (add-)RMSNorm (docs/spec.md, section 2b; the definition is activation.rms_norm): the
// lane's arithmetic, then norm_rows, quantize_norm's walk over the rows.
#pragma once
#include "common.cuh"
#include "formats.cuh"
#include "group.cuh"
#include "layouts.cuh"

namespace fgq {

// a lane's arithmetic -----------------------------------------------------------------------------

// x = round(x + residual), in the input type, NaN as the hardware writes it: the caller makes it
// the positive quiet NaN (norm_rows, only where the lane's sum of squares is not finite)
// NOTES: 16-bit types add two values with one packed add (sm_80 and newer), which rounds the
// exact sum once where the definition rounds it to float32 first; both give the same value.
// Take 2^e <= |a| < 2^(e+1) for the larger value a and p the type's significant bits (8 for
// bfloat16, 11 for float16). Sums that cancel below 2^(e-1) are exact (Sterbenz), and an
// inexact float32 sum needs b smaller than the sum's float32 unit times 2^(p-1), so it stays
// below 2^(e+1) and |b| < 2^(e+p-24). Every midpoint of the type's grid (the overflow
// threshold above its largest value among them) lies at least 2^(e-p-1) from a, so such a sum
// lies at least 2^(e-p-2) from each, beyond float32's rounding (at most 2^(e-24)): no tie is
// made or moved. Sums past float32's range are Inf both ways. tests/test_norm.py checks every
// value of the type against 640 others over every exponent. The float path costs about seven
// instructions a pair (four unpacks, two adds, a pack)
template <int kIn>
__device__ __forceinline__ void add_residual(u32 (&words)[kLaneWords], const u32 (&residual)[kLaneWords]) {
#if __CUDA_ARCH__ >= 800
  if constexpr (Input<kIn>::kBytes == 2) {
#pragma unroll
    for (int w = 0; w < kLaneWords; ++w) {
      if constexpr (kIn == kBF16) {
        // a * 1 + b rounded once (fma.rn.bf16x2 is sm_80's; add.rn.bf16x2 needs sm_90)
        constexpr u32 kOnes = 0x3f803f80u;  // bfloat16 1.0 in both halves
        asm("fma.rn.bf16x2 %0, %1, %2, %3;"
            : "=r"(words[w]) : "r"(words[w]), "r"(kOnes), "r"(residual[w]));
      } else {
        asm("add.rn.f16x2 %0, %1, %2;" : "=r"(words[w]) : "r"(words[w]), "r"(residual[w]));
      }
    }
    return;
  }
#endif
  u32 x[kLaneWords];
#pragma unroll
  for (int w = 0; w < kLaneWords; ++w) x[w] = words[w];
  map_lane<kIn, false>(words, [&](int i) { return add_rn(value_of<kIn>(x, i), value_of<kIn>(residual, i)); }, false);
}

// a[i] += a[i + kWidth] for i < kWidth, then the same for half the width, down to a[0]
// NOTES: one template step a width: written as a loop over `width /= 2`, NVRTC keeps the outer
// loop and indexes the registers through predicated moves, about 240 instructions a lane
template <int kWidth>
__device__ __forceinline__ void fold_in_half(float* a) {
  if constexpr (kWidth >= 1) {
#pragma unroll
    for (int i = 0; i < kWidth; ++i) a[i] = add_rn(a[i], a[i + kWidth]);
    fold_in_half<kWidth / 2>(a);
  }
}

// the lane's squares RN(v * v), folded in half: value i plus value i + n/2, down to one;
// value(i) is the lane's value i as float32
template <int kIn, typename Value>
__device__ __forceinline__ float lane_sum_of_squares(Value value) {
  constexpr int kValues = kLaneWords * 4 / Input<kIn>::kBytes;
  float a[kValues];
#pragma unroll
  for (int i = 0; i < kValues; ++i) {
    const float v = value(i);
    a[i] = mul_rn(v, v);
  }
  fold_in_half<kValues / 2>(a);
  return a[0];
}

// the 32 values of a warp folded in half (lane i plus lane i + 16, and so on): xor shuffles
// with offsets 16 to 1 leave that sum in every lane, since a + b and b + a round alike
__device__ __forceinline__ float warp_fold(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = add_rn(v, __shfl_xor_sync(kAllLanes, v, offset));
  return v;
}

// RN(x * r), rounded to the input type first with norm_rounding "twice" and
// "twice_unrounded_sum" (kTwice: vLLM's, docs/spec.md section 2b)
template <int kIn, bool kTwice>
__device__ __forceinline__ float normalized(float x, float r) {
  const float n = mul_rn(x, r);
  if constexpr (kTwice) return round_to_input<kIn>(n);
  return n;
}

// y = round(RN(x * r) * w), in the input type, into `words`; x(i) is the lane's value i as
// float32 (it may read `words`: map_lane writes them last); weight(i) is w's value i as float32
// (from the loaded words, or from the float32 copy a walking block keeps: kStash); `maybe_nan`
// false promises that no product is NaN (norm_rows)
template <int kIn, bool kTwice, typename Value, typename Weight>
__device__ __forceinline__ void normalize_lane(u32 (&words)[kLaneWords], Value x, Weight weight,
                                               float r, bool maybe_nan) {
  map_lane<kIn, false>(words, [&](int i) {
    return mul_rn(normalized<kIn, kTwice>(x(i), r), weight(i));
  }, maybe_nan);
}

// y = round(RN(x * r) * w) for each value of a lane, rounded to the input type and kept as
// float32 for the quantizer (FloatLane, whose NaN it encodes as +NaN, the canonical NaN the
// definition gives); x and weight as above
template <int kIn, bool kTwice, int kValues, typename Value, typename Weight>
__device__ __forceinline__ void normalize_lane(Value x, Weight weight, float r,
                                               FloatLane<kValues>& y) {
#pragma unroll
  for (int i = 0; i < kValues; ++i) {
    y.v[i] = round_to_input<kIn>(mul_rn(normalized<kIn, kTwice>(x(i), r), weight(i)));
  }
}

// the walk over rows ------------------------------------------------------------------------------
// NOTES: a row's sum of squares needs the whole row before any group can be scaled, so a block
// holds whole rows, kPer 32-byte lanes a thread: thread t holds lanes t and, with kPer = 2,
// t + blockDim.x (a multiple of 32, so each warp holds whole warps of lanes and the same lane of
// a group in both), at most 1024 lanes a row (K <= 16384 for 16-bit input). It reduces in the
// order docs/spec.md (section 2b) defines: each lane folds its squares in half, each warp of
// lanes folds its 32 lanes with xor shuffles, one shared slot per warp of lanes; warp 0 folds
// the 32 slots again, computes r and passes it on behind a second barrier. Two lanes a thread
// halve the per-row work a lane (the second fold, the division, square root and reciprocal, the
// addresses and the loop), which pays where many rows keep the SMs issuing; one lane a thread
// keeps twice the warps on a row, which pays where few rows leave them waiting on the row's
// chain (_plan.norm_lanes; docs/perf.md).
// The grid is a block a row or at most one resident wave of blocks that walk the rows (over all
// batches) with a stride of the grid (_plan.norm_blocks). In the source a walking block loads
// its next row after it has stored the current one; the compiler (sm_90) issues those loads at
// the top of the iteration into registers of their own, so the next row is in flight while the
// current one is worked on. Written by hand, that second set of words needs 80 registers in the
// two-lane kernel, three blocks an SM, where this fits 72, four blocks (a shared-memory stash
// filled by cp.async instead is slower: docs/perf.md). The warp slots and r alternate between
// two sets (one set of slots is no faster). Lanes past the row's last work on a copy of that
// lane, add +0 to the sums and store nothing, so the group shuffles name the whole warp. The
// last real row of each batch zeroes the padding rows below it. A walking grid of 16-bit input
// without a residual takes the kStash instantiation (quantize_norm).

// whether a lane's normalised values reach the quantizer as float32 (FloatLane) rather than
// packed in the input type
// NOTES: float32 skips the pack, the unpack and the maximum over packed halves (RMSNorm at
// M = 4096, two lanes a thread: 31.0 us against 37.4, docs/perf.md). It holds more registers:
// with two lanes a thread (72 registers) the blocked layout keeps the packed words (float32
// lanes spill four words there in every input type); every other two-lane instantiation fits
// float32 lanes
template <int kIn, int kGroup, int kOut, int kLayout, int kPer>
constexpr bool norm_float_lanes() {
  return kPer == 1 || kLayout != kBlockedExponents;
}

// what norm_rows normalises: x; round(x + residual), the sum it writes back (docs/spec.md,
// section 2b, step 1); or, for norm_rounding="twice_unrounded_sum" (vLLM's add-RMSNorm), the
// float32 sum x + residual unrounded, writing back the rounded sum all the same
enum NormSum : int { kNoResidual, kRoundedSum, kUnroundedSum };

// quantize_norm's body: kSum as above; kStash keeps the weight as float32 in shared memory
// (norm_stash)
// NOTES: kUnroundedSum holds x and the residual until the row is normalised (the rounded sum
// only while it is written back) and adds them where a float32 sum is read (twice a value):
// 32 bytes a lane more than kRoundedSum. As its own path it leaves the others' code as it was;
// it is compiled for one lane a thread only, where every instantiation fits its cap with no
// spill and no more registers than before (sm_90). At two lanes (72 registers) it spilled in
// a third of the 16-bit instantiations (4-52 bytes; reading x and the residual again from L1
// instead of holding them spilled too), so _plan.norm_lanes gives it one lane. Float32 input
// takes kRoundedSum: its sum is the float32 sum
template <int kIn, int kGroup, int kOut, int kScale, int kLayout, int kPer, int kSum, bool kStash>
__device__ __forceinline__ void norm_rows(const Params& p, float (&warp_sums)[2][32], float (&row_r)[2],
                                          float4* norm_stash) {
  typedef Input<kIn> In;
  typedef typename In::Storage Storage;
  constexpr int kValues = kLaneWords * 4 / In::kBytes;
  constexpr int kLanes = kGroup / kValues;
  constexpr bool kAdd = kSum != kNoResidual;
  constexpr bool kUnrounded = kSum == kUnroundedSum;
  static_assert(!kUnrounded || (In::kBytes == 2 && kPer == 1), "16-bit input, one lane a thread");
  constexpr int kOtherLanes = kAdd ? kPer : 1;
  constexpr bool kFloat = norm_float_lanes<kIn, kGroup, kOut, kLayout, kPer>();

  const u32 total_rows = p.batches * p.rows;
  const int lanes = p.groups_per_row * kLanes;
  const int t = threadIdx.x;
  const int lane = t % kLanes;  // the same in each of the thread's lanes
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
  Storage* residual_lane = reinterpret_cast<Storage*>(p.residual) + value0[0];
  const i64 second = value0[kPer - 1] - value0[0];  // elements from the first lane to the second

  // a row's lanes of x (and of the residual): flat is its index over all batches
  auto load_row = [&](u32 flat, u32& batch, u32& row, u32(&x)[kPer][kLaneWords],
                      u32(&r)[kOtherLanes][kLaneWords]) {
    // one division a row (about 20 instructions), none with one batch, the usual case
    batch = p.batches == 1u ? 0u : flat / p.rows;
    row = flat - batch * p.rows;
    const Storage* x_row = x_lane + batch * p.x_batch_stride + row * p.x_row_stride;
#pragma unroll
    for (int j = 0; j < kPer; ++j) load_lane<kIn, true>(x_row + j * second, x[j]);
    if constexpr (kAdd) {
      const Storage* r_row = residual_lane + batch * p.r_batch_stride + row * p.r_row_stride;
#pragma unroll
      for (int j = 0; j < kPer; ++j) load_lane<kIn, true>(r_row + j * second, r[j]);
    }
  };

  u32 flat = blockIdx.x, batch, row;
  u32 words[kPer][kLaneWords], other[kOtherLanes][kLaneWords];
  wait_for_producer();  // PDL, as in quantize_groups
  load_row(flat, batch, row, words, other);
  // the weight
  // NOTES: the weight is read again each row (an L1 hit): held in registers, it takes both
  // instantiations past their register limits with spills, with the residual too. With kStash
  // the thread keeps its weight values as float32 in shared memory instead: four shared loads
  // a lane a row replace two loads and 16 unpacks. No barrier: a thread reads only what it
  // wrote. Lanes handed to the quantizer as float32 (kFloat) need no test of the weight for Inf
  // and NaN (the quantizer's maximum keeps NaN), so the general kernel reads none of it here
  // but after r, from L2 on its first row (an L1 prefetch here cost add-RMSNorm 1% at M = 512
  // and gained nothing: docs/perf.md)
  const Storage* weight_lane = static_cast<const Storage*>(p.weight) + value0[0];
  constexpr int kChunks = kValues / 4;  // float4 chunks a lane
  // each warp's chunks together, chunk c of its thread i at c * 32 + i: one address a thread,
  // constant offsets, and a warp's 16-byte reads in distinct banks
  float4* const stash = norm_stash + (t >> 5) * (32 * kPer * kChunks) + (t & 31);
  bool weight_nonfinite[kPer];  // read by packed lanes (!kFloat) only
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    weight_nonfinite[j] = false;
    if constexpr (!kStash && kFloat) continue;
    u32 weight[kLaneWords];
    load_lane<kIn, true>(weight_lane + j * second, weight);
    if constexpr (!kFloat) weight_nonfinite[j] = In::max_magnitude(weight) >= In::kInf;
    if constexpr (kStash) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        stash[(j * kChunks + c) * 32] =
            make_float4(value_of<kIn>(weight, 4 * c), value_of<kIn>(weight, 4 * c + 1),
                        value_of<kIn>(weight, 4 * c + 2), value_of<kIn>(weight, 4 * c + 3));
      }
    }
  }
  for (int set = 0;; set ^= 1) {
    const bool more = flat + gridDim.x < total_rows;
    if (!more) signal_dependents();  // this block's last loads are issued

    // x + residual (kUnrounded: x and the residual stay, the rounded sum is made to write back)
    if constexpr (kSum == kRoundedSum) {
#pragma unroll
      for (int j = 0; j < kPer; ++j) add_residual<kIn>(words[j], other[j]);
    }
    // value i of lane j, the one normalised, as float32: kUnrounded adds the residual's
    auto value = [&](int j, int i) {
      if constexpr (kUnrounded) return add_rn(value_of<kIn>(words[j], i), value_of<kIn>(other[j], i));
      return value_of<kIn>(words[j], i);
    };
    // the mean square: lanes, then warps of lanes, then the 32 slots, each folded in half
    float lane_sums[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      lane_sums[j] = in_row[j] ? lane_sum_of_squares<kIn>([&](int i) { return value(j, i); }) : 0.0f;
    }
    if constexpr (kAdd) {
      // write x + residual back
      // NOTES: with NaN as the positive quiet NaN; a lane holding NaN has a NaN sum of squares,
      // so only a lane whose sum is not finite looks for it (a test in add_residual costs
      // about 3 instructions a pair). The float32 sums are NaN where the rounded ones are
      Storage* r_row = residual_lane + batch * p.r_batch_stride + row * p.r_row_stride;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        u32 sum[kLaneWords];  // kUnrounded: the rounded sum, only to write back
        u32(&back)[kLaneWords] = kUnrounded ? sum : words[j];
        if constexpr (kUnrounded) {
#pragma unroll
          for (int w = 0; w < kLaneWords; ++w) sum[w] = words[j][w];
          add_residual<kIn>(sum, other[j]);
        }
        if (__builtin_expect(!(lane_sums[j] <= float32_max()), 0)) canonicalise_nan<kIn>(back);
        if (in_row[j]) {
          uint4* dst = reinterpret_cast<uint4*>(r_row + j * second);
          dst[0] = make_uint4(back[0], back[1], back[2], back[3]);
          dst[1] = make_uint4(back[4], back[5], back[6], back[7]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const float warp_total = warp_fold(lane_sums[j]);
      if ((t & 31) == 0) warp_sums[set][(t >> 5) + j * static_cast<int>(blockDim.x >> 5)] = warp_total;
    }
    __syncthreads();
    if constexpr (kStash) {
      // prefetch the block's next row into L2
      // NOTES: the next row's x is loaded after this row's stores (below), and the compiler
      // leaves those loads there (in the general kernel it issues them at the top of the
      // iteration, into registers of their own, which made the stash kernel spill at 72 and 80
      // registers). So one thread asks for the block's next row into L2 here, one bulk
      // prefetch, once this row has arrived (every lane sum is in its warp's slot), so that it
      // streams from DRAM while this row is worked on and does not share the bandwidth with
      // this row's own loads; at the top of the iteration it slows the row it overlaps. 1-6%
      // faster at M = 1024-4096, K = 7168 (docs/perf.md)
      if (t == 0 && more) {
        const u32 next = flat + gridDim.x;
        const u32 next_batch = p.batches == 1u ? 0u : next / p.rows;
        prefetch_l2(static_cast<const Storage*>(p.x) + next_batch * p.x_batch_stride +
                        (next - next_batch * p.rows) * p.x_row_stride,
                    static_cast<u32>(k) * In::kBytes);
      }
    }
    // r = 1 / sqrt(mean + eps): one warp computes it and passes it on through shared memory
    // behind a second barrier, about 80 instructions a row fewer in each other warp (also for
    // a block a row, whose SMs are busy issuing once the rows have arrived: docs/perf.md)
    float r = 0.0f;
    if (t < 32) {
      const float total = warp_fold(warp_slot ? warp_sums[set][t & 31] : 0.0f);
      const float mean = div_rn(total, static_cast<float>(lanes * kValues));
      r = div_rn(1.0f, sqrt_rn(add_rn(mean, p.eps_norm)));
      if (t == 0) row_r[set] = r;
    }
    __syncthreads();
    r = row_r[set];
    // normalise, quantize and store each lane
    u8* q_batch = p.q + batch * p.q_batch_stride;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      // NOTES: packed lanes (!kFloat): a product is NaN only if x, the weight or r is NaN or
      // Inf (|x * r| stays below sqrt(K) times a few ulps, so it cannot overflow, and x * r * w
      // then only to Inf); a finite lane sum means finite x, and r is finite unless the total
      // is NaN. So only such lanes test their results for NaN (about 12 instructions a lane).
      const bool maybe_nan =
          !(lane_sums[j] <= float32_max() && r <= float32_max()) || weight_nonfinite[j];
      FloatLane<kValues> y;
      // NOTES: norm_rounding chosen once a lane (a uniform branch), not a value at a time: a
      // select a value became a predicated convert issued for every value whatever the mode
      auto normalize = [&](auto weight_of) {
        auto x_of = [&](int i) { return value(j, i); };
        auto rounded = [&](auto twice) {
          if constexpr (kFloat) {
            normalize_lane<kIn, decltype(twice)::value>(x_of, weight_of, r, y);
          } else {
            normalize_lane<kIn, decltype(twice)::value>(words[j], x_of, weight_of, r, maybe_nan);
          }
        };
        if (kUnrounded || p.norm_rounding != 0u) {
          rounded(Flag<true>());
        } else {
          rounded(Flag<false>());
        }
      };
      if constexpr (kStash) {
        float w[kValues];
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const float4 v = stash[(j * kChunks + c) * 32];
          w[4 * c] = v.x, w[4 * c + 1] = v.y, w[4 * c + 2] = v.z, w[4 * c + 3] = v.w;
        }
        normalize([&](int i) { return w[i]; });
      } else {
        u32 weight[kLaneWords];
        load_lane<kIn, true>(weight_lane + j * second, weight);
        normalize([&](int i) { return value_of<kIn>(weight, i); });
      }
      if (in_row[j] && row == p.rows - 1u) {
        zero_padding_rows<kValues, kLanes, kLayout>(p, q_batch + value0[j], k, batch, row, group[j], lane);
      }
      u8* q_dst = q_batch + row * k + value0[j];
      u8* scale_at = ScaleLayout<kLayout>::at(p, batch, row, group[j]);
      if constexpr (kFloat) {
        quantize_group<kIn, kGroup, kOut, kScale, kLayout, true, true>(
            p, y, kAllLanes, true, q_dst, in_row[j], scale_at, in_row[j] && lane == 0, group[j]);
      } else {
        quantize_group<kIn, kGroup, kOut, kScale, kLayout, true>(
            p, words[j], kAllLanes, true, q_dst, in_row[j], scale_at, in_row[j] && lane == 0, group[j]);
      }
    }

    // the block's next row
    if (!more) break;
    flat += gridDim.x;
    load_row(flat, batch, row, words, other);
  }
}

}  // namespace fgq
