// Scale layouts: where the scale of (batch, row, group) is stored, and what is stored there.
//
// A layout's trait is its address function; its numbers (strides, padding, alignment) come from
// its descriptor in _layout.py through Params, in bytes. at() is where the scale of (batch, row,
// group) goes, store_at() writes it there when `store` (the group's lane 0); a
// padding row (real_row false) stores zeros, so the kernel owns its padding without a memset.
// NOTES: kPredicated asks store_at for stores each predicated on its own condition, with no
// branch: only lane 0 stores, and a branch around its stores made the warp diverge at the
// one-pass kernel's tail (docs/perf.md). The conditions then live in registers until the
// stores, which spilled 4-8 bytes in kernels that keep more live (the row loop's next row,
// RMSNorm's row): those branch.
#pragma once
#include "common.cuh"

namespace fgq {

// the address functions; each ScaleLayout row of _layout.py names one as its kernel_trait
enum ScaleLayoutKind : int { kFloatWords = 0, kPackedExponents = 1, kBlockedExponents = 2 };

template <int kLayout> struct ScaleLayout;

// row, col, col_tma: one float32 per group (the scale, or its power of two for UE8M0)
// kSpreadPadding: false, the padding rows below a batch's last row are few (at most 3, a TMA
// box) and each group's lane 0 zeroes its own scale in each (zero); true, the blocked layout's
// up to 127 are spread over all lanes of the last row (zero_rows)
template <> struct ScaleLayout<kFloatWords> {
  static constexpr bool kSpreadPadding = false;
  // where the scale of (batch, row, group) goes; store_at writes it there
  __device__ static __forceinline__ u8* at(const Params& p, u32 batch, u32 row, int group) {
    return p.scales + batch * p.s_batch_stride + row * p.s_row_stride + group * p.s_word_stride;
  }
  template <bool kPredicated = false>
  __device__ static __forceinline__ void store_at(u8* at, const Params& p, int group, float scale,
                                                  u32 exponent, bool real_row, bool store) {
    if (store) *reinterpret_cast<float*>(at) = real_row ? scale : 0.0f;
  }
  // zero the scale of (batch, row, group) in a padding row
  __device__ static __forceinline__ void zero(const Params& p, u32 batch, u32 row, int group) {
    store_at(at(p, batch, row, group), p, group, 0.0f, 0u, false, true);
  }
};

// UE8M0 exponent bytes, four groups per 4-byte word (group g is byte g % 4); Layout::word_at
// is where the word of (batch, row, group) starts
template <class Layout> struct ExponentBytes {
  // the word that holds the scale of (batch, row, group); store_at writes the group's byte
  __device__ static __forceinline__ u8* at(const Params& p, u32 batch, u32 row, int group) {
    return Layout::word_at(p, batch, row, group);
  }
  template <bool kPredicated = false>
  __device__ static __forceinline__ void store_at(u8* word, const Params& p, int group,
                                                  float scale, u32 exponent, bool real_row,
                                                  bool store) {
    // NOTES: each group's lane 0 writes its own byte; the last group of a row also zeroes the
    // unused bytes above its own, so the padding is owned by the kernel without atomics. The
    // byte stores are predicated, not a loop (a loop, or a switch over aligned stores, which
    // the compiler made a jump table read from constant memory, sat on the kernel's tail)
    const int at = group & 3;
    if constexpr (kPredicated) {
      const bool last = store & (group == p.groups_per_row - 1);
      if (store) word[at] = real_row ? static_cast<u8>(exponent) : 0;
      if (last & (at < 1)) word[1] = 0;
      if (last & (at < 2)) word[2] = 0;
      if (last & (at < 3)) word[3] = 0;
    } else {
      if (!store) return;
      word[at] = real_row ? static_cast<u8>(exponent) : 0;
      if (group == p.groups_per_row - 1) {
        if (at < 1) word[1] = 0;
        if (at < 2) word[2] = 0;
        if (at < 3) word[3] = 0;
      }
    }
  }
  // zero a padding row's word of (batch, row, group): one 4-byte store by its first group
  __device__ static __forceinline__ void zero(const Params& p, u32 batch, u32 row, int group) {
    if (group % 4 == 0) *reinterpret_cast<u32*>(Layout::word_at(p, batch, row, group)) = 0u;
  }
};

// packed, packed_row: strided int32 words
template <> struct ScaleLayout<kPackedExponents> : ExponentBytes<ScaleLayout<kPackedExponents>> {
  static constexpr bool kSpreadPadding = false;
  __device__ static __forceinline__ u8* word_at(const Params& p, u32 batch, u32 row, int group) {
    return p.scales + batch * p.s_batch_stride + row * p.s_row_stride +
           (group / 4) * p.s_word_stride;
  }
};

// blocked: Blackwell's 128x4 tiles of 512 bytes. s_row_stride is the bytes of a row of tiles,
// s_word_stride a tile's 512; inside a tile, row r's word sits at (r % 32) * 16 + (r / 32 % 4) * 4
template <> struct ScaleLayout<kBlockedExponents> : ExponentBytes<ScaleLayout<kBlockedExponents>> {
  static constexpr bool kSpreadPadding = true;
  __device__ static __forceinline__ u8* word_at(const Params& p, u32 batch, u32 row, int group) {
    return p.scales + batch * p.s_batch_stride + (row >> 7) * p.s_row_stride +
           (group / 4) * p.s_word_stride + (row & 31u) * 16u + ((row >> 5) & 3u) * 4u;
  }
  // zero the words of rows [first, scale_rows) in the 512-byte tile of `group`'s column,
  // called by every lane of every group of one row: the column's 4 * lanes threads (fewer in
  // a last column of under four groups) share the tile's 32 chunks of 16 bytes (chunk c holds
  // rows c, c + 32, c + 64 and c + 96); a chunk of padding rows only takes one 16-byte store,
  // one that also holds real rows a 4-byte store per padding row
  // NOTES: the padding rows all lie in the last real row's row of tiles (scale_rows is the
  // next multiple of 128), so no two threads share a word and nothing else writes these words;
  // the storage starts 16-byte aligned (the API checks scale_out) and tiles are 512 bytes
  __device__ static __forceinline__ void zero_rows(const Params& p, u32 batch, u32 first,
                                                   int group, int lane, int lanes) {
    if (first >= p.scale_rows) return;
    const int column = group & ~3;
    const int members = min(4, p.groups_per_row - column) * lanes;
    const u32 within = first & 127u;  // the first padding row inside the tile, at least 1
    u8* tile = word_at(p, batch, first & ~127u, column);
    for (u32 c = (group & 3) * lanes + lane; c < 32u; c += members) {
      const u32 real_quads = within > c ? (within - c + 31u) / 32u : 0u;
      if (real_quads == 0u) {
        *reinterpret_cast<uint4*>(tile + c * 16u) = make_uint4(0u, 0u, 0u, 0u);
      } else {
        for (u32 q = real_quads; q < 4u; ++q) *reinterpret_cast<u32*>(tile + c * 16u + q * 4u) = 0u;
      }
    }
  }
};

}  // namespace fgq
