// Scale layouts: where the scale of (batch, row, group) is stored, and what is stored there.
//
// A layout's trait is its address function; its numbers (strides, padding, alignment) come from
// its descriptor in _layout.py through Params, in bytes. store() runs on the group's lane 0; a
// padding row (real_row false) stores zeros, so the kernel owns its padding without a memset.
#pragma once
#include "params.cuh"

namespace fgq {

// the address functions; each ScaleLayout row of _layout.py names one as its kernel_trait
enum ScaleLayoutKind : int { kFloatWords = 0, kPackedExponents = 1 };

template <int kLayout> struct ScaleLayout;

// row, col, col_tma: one float32 per group (the scale, or its power of two for UE8M0)
template <> struct ScaleLayout<kFloatWords> {
  __device__ static __forceinline__ void store(const Params& p, u32 batch, u32 row, int group,
                                               float scale, u32 exponent, bool real_row) {
    u8* at = p.scales + batch * p.s_batch_stride + row * p.s_row_stride + group * p.s_word_stride;
    *reinterpret_cast<float*>(at) = real_row ? scale : 0.0f;
  }
  // zero the scale of (batch, row, group) in a padding row
  __device__ static __forceinline__ void zero(const Params& p, u32 batch, u32 row, int group) {
    store(p, batch, row, group, 0.0f, 0u, false);
  }
};

// packed, packed_row: UE8M0 exponent bytes, four groups per int32 word (group g is byte g % 4)
template <> struct ScaleLayout<kPackedExponents> {
  __device__ static __forceinline__ void store(const Params& p, u32 batch, u32 row, int group,
                                               float scale, u32 exponent, bool real_row) {
    // NOTES: each group's lane 0 writes its own byte; the last group of a row also zeroes the
    // unused bytes of its word, so the padding is owned by the kernel without atomics.
    u8* word = p.scales + batch * p.s_batch_stride + row * p.s_row_stride +
               (group / 4) * p.s_word_stride;
    word[group % 4] = real_row ? static_cast<u8>(exponent) : 0;
    if (group == p.groups_per_row - 1) {
      for (int b = group % 4 + 1; b < 4; ++b) word[b] = 0;
    }
  }
  // zero a padding row's word of (batch, row, group): one 4-byte store by its first group
  __device__ static __forceinline__ void zero(const Params& p, u32 batch, u32 row, int group) {
    if (group % 4 == 0) {
      *reinterpret_cast<u32*>(p.scales + batch * p.s_batch_stride + row * p.s_row_stride +
                              (group / 4) * p.s_word_stride) = 0u;
    }
  }
};

}  // namespace fgq
