// Per-token group quantization: one kernel family for every input type, group size, output
// format and scale layout. Python picks the instantiation (_launch.py) and the scale strides.
//
// Work split: a group of kGroup values is held by kLanes consecutive lanes of a warp, 32 bytes
// (two 16-byte loads) per lane. The lanes reduce the group maximum with xor-shuffles limited to
// their own lanes, compute the scale, quantize in registers and store their codes with one store.
// No shared memory, no __syncthreads, no atomics.
//
// Grid: y splits a row's groups into blocks of at most kMaxThreads threads; x walks the rows of
// all batches (batch * grid_rows of them) with a stride of gridDim.x, so M is not bounded by a
// grid dimension. Each lane loads its next row before it quantizes the current one, keeping
// loads in flight while it computes. Rows in [rows, grid_rows) of each batch are padding rows:
// the kernel writes zeros there (to q when pad_q, to the scales when pad_scales), so callers may
// allocate with empty and no memset is launched.
#include "common.cuh"

namespace fgq {

constexpr int kMaxThreads = 256;  // _launch.MAX_THREADS_PER_BLOCK
constexpr int kLaneWords = 8;     // 32 bytes of input per lane

// load one lane's 32 bytes ------------------------------------------------------------------------
template <int kIn, bool kVec16>
__device__ __forceinline__ void load_lane(const void* src, u32 (&words)[kLaneWords]) {
  if constexpr (kVec16) {
    const uint4 a = __ldg(static_cast<const uint4*>(src));
    const uint4 b = __ldg(static_cast<const uint4*>(src) + 1);
    words[0] = a.x, words[1] = a.y, words[2] = a.z, words[3] = a.w;
    words[4] = b.x, words[5] = b.y, words[6] = b.z, words[7] = b.w;
  } else {
    // NOTES: fallback for inputs whose base or row stride is not 16-byte aligned
#pragma unroll
    for (int i = 0; i < kLaneWords; ++i) {
      if constexpr (Input<kIn>::kBytes == 4) {
        words[i] = __ldg(static_cast<const u32*>(src) + i);
      } else {
        const u16* h = static_cast<const u16*>(src) + 2 * i;
        words[i] = static_cast<u32>(__ldg(h)) | (static_cast<u32>(__ldg(h + 1)) << 16);
      }
    }
  }
}

template <int kIn, int kGroup, int kOut, int kScale, bool kVec16>
__global__ void __launch_bounds__(kMaxThreads)
    quantize_groups(const void* __restrict__ x, u8* __restrict__ q, void* __restrict__ scales,
                    u32 rows, u32 grid_rows, u32 total_rows, int groups_per_row,
                    i64 x_batch_stride, i64 x_row_stride, i64 q_batch_stride, i64 s_batch_stride,
                    i64 s_row_stride, i64 s_group_stride, int pad_q, int pad_scales, float eps) {
  typedef Input<kIn> In;
  typedef Output<kOut> Out;
  constexpr int kValues = 32 / In::kBytes;  // values per lane: 16 (16-bit input) or 8 (float32)
  constexpr int kLanes = kGroup / kValues;  // lanes per group
  static_assert(kLanes >= 2 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "lanes per group");

  const int groups_per_block = blockDim.x / kLanes;
  const int group = blockIdx.y * groups_per_block + threadIdx.x / kLanes;
  if (group >= groups_per_row) return;  // whole groups leave together: masks stay complete
  const int lane = threadIdx.x % kLanes;
  const i64 k = static_cast<i64>(groups_per_row) * kGroup;
  const i64 value0 = static_cast<i64>(group) * kGroup + lane * kValues;
  const u32 warp_lane = threadIdx.x & 31u;
  const u32 mask = kLanes == 32 ? 0xffffffffu
                                : ((1u << kLanes) - 1u) << (warp_lane & ~static_cast<u32>(kLanes - 1));
  const typename In::Storage* x_lane = static_cast<const typename In::Storage*>(x) + value0;

  // a padding row reads nothing and quantizes zeros
  auto load_row = [&](u32 flat_row, u32(&words)[kLaneWords]) {
    const u32 batch = flat_row / grid_rows;
    const u32 row = flat_row - batch * grid_rows;
    if (row < rows) {
      load_lane<kIn, kVec16>(x_lane + batch * x_batch_stride + row * x_row_stride, words);
    } else {
#pragma unroll
      for (int i = 0; i < kLaneWords; ++i) words[i] = 0u;
    }
  };

  u32 flat_row = blockIdx.x;
  u32 next[kLaneWords];
  load_row(flat_row, next);
  while (true) {
    u32 words[kLaneWords];
#pragma unroll
    for (int i = 0; i < kLaneWords; ++i) words[i] = next[i];
    const u32 following = flat_row + gridDim.x;
    if (following < total_rows) load_row(following, next);  // in flight while we compute

    const u32 batch = flat_row / grid_rows;
    const u32 row = flat_row - batch * grid_rows;
    const bool real_row = row < rows;  // uniform over the block

    // upcast; absolute maximum over the finite values -------------------------------------------
    // NOTES: for non-negative floats the integer order of the bits is the float order, so the
    // maximum is an integer max; non-finite magnitudes (>= 0x7f800000) count as zero.
    u32 bits[kValues];
    u32 amax_bits = 0u;
    bool nonfinite = false;
#pragma unroll
    for (int i = 0; i < kValues; ++i) {
      const u32 raw = In::kBytes == 4 ? words[i] : (words[i / 2] >> (16 * (i % 2))) & 0xffffu;
      bits[i] = In::to_f32_bits(raw);
      const u32 mag = bits[i] & kAbsMask;
      const bool finite = mag < kInfBits;
      nonfinite |= !finite;
      amax_bits = max(amax_bits, finite ? mag : 0u);
    }

    // reduce the group maximum over the group's lanes --------------------------------------------
    // NOTES: the mask names only this group's lanes, so groups that left early (or live in
    // another part of the warp) are never waited for.
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) {
      amax_bits = max(amax_bits, __shfl_xor_sync(mask, amax_bits, offset));
    }
    const float amax = fmaxf(__uint_as_float(amax_bits), eps);

    // scale ----------------------------------------------------------------------------------------
    float scale;      // float32 value of the scale
    float inv_scale;  // 2^(127-e) for power-of-two scales
    u32 exponent = 0u;
    if constexpr (kScale == kFloatScale) {
      scale = div_rn(amax, Out::kMax);
      inv_scale = 0.0f;
    } else {
      exponent = ue8m0_exponent(div_rn(amax, Out::kMax));
      scale = __uint_as_float(exponent << 23);
      inv_scale = __uint_as_float((254u - exponent) << 23);
    }

    // quantize in registers ------------------------------------------------------------------------
    u32 codes[kValues / 4];
#pragma unroll
    for (int w = 0; w < kValues / 4; ++w) {
      float t[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float v = __uint_as_float(bits[4 * w + j]);
        t[j] = kScale == kFloatScale ? div_rn(v, scale) : mul_rn(v, inv_scale);
      }
      codes[w] = Out::encode2(t[0], t[1]) | (Out::encode2(t[2], t[3]) << 16);
    }
    if (nonfinite) {  // rare: NaN keeps its sign, e5m2 keeps infinities, int8 NaN becomes 0
#pragma unroll
      for (int i = 0; i < kValues; ++i) {
        const int shift = 8 * (i % 4);
        const u32 code = patch_nonfinite<kOut>((codes[i / 4] >> shift) & 0xffu, bits[i]);
        codes[i / 4] = (codes[i / 4] & ~(0xffu << shift)) | (code << shift);
      }
    }

    // store the codes --------------------------------------------------------------------------------
    if (real_row || pad_q) {
      u8* dst = q + batch * q_batch_stride + row * k + value0;
      if constexpr (kValues == 16) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(codes[0], codes[1], codes[2], codes[3]);
      } else {
        *reinterpret_cast<uint2*>(dst) = make_uint2(codes[0], codes[1]);
      }
    }

    // store the scale (one lane per group) -----------------------------------------------------------
    if (lane == 0 && (real_row || pad_scales)) {
      if constexpr (kScale == kPackedUE8M0) {
        // NOTES: four groups share one int32 word (group g is byte g % 4). Each group's lane 0
        // writes its own byte; the last group of a row also zeroes the unused bytes of its word,
        // so the padding is owned by the kernel without atomics.
        u8* word = reinterpret_cast<u8*>(static_cast<u32*>(scales) + batch * s_batch_stride +
                                         row * s_row_stride + (group / 4) * s_group_stride);
        word[group % 4] = real_row ? static_cast<u8>(exponent) : 0;
        if (group == groups_per_row - 1) {
          for (int b = group % 4 + 1; b < 4; ++b) word[b] = 0;
        }
      } else {
        static_cast<float*>(scales)[batch * s_batch_stride + row * s_row_stride +
                                    group * s_group_stride] = real_row ? scale : 0.0f;
      }
    }

    if (following >= total_rows) break;
    flat_row = following;
  }
}

}  // namespace fgq
