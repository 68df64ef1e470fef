// Tiles of 128 or 256 rows by 128 or 256 columns, one thread block each (docs/spec.md, sections
// 4c and 4d): a weight's 128x128 or 256x256 blocks (one scale a tile), and the column-wise
// orientation (one scale a channel of the tile's 128 or 256 tokens, 128 channels a tile), with
// the row-wise groups of the same read for "both" (128 tokens only).
//
// Each row is kLanes lanes of 32 bytes (16 values of 16-bit input, 8 of float32), consecutive
// threads along a row (coalesced 256- or 512-byte runs), kPasses rows a thread kRowsPerPass
// apart. A tile is read twice: the first pass only reduces (the tile maximum: warp shuffles and
// a shared-memory step across the 8 warps; a channel's maximum over the tile's tokens: shuffles
// over the threads of the channel, then shared memory), the second reads each lane again (from
// L1 where the first pass left it, else L2), encodes and stores it, one row at a time. The
// first pass counts Inf and NaN as they are, as the row-wise kernels do; where one of them is a
// maximum, the finite one is taken again on a rare path (a weight block's by a second
// reduction, a channel's by the thread that scales it).
// NOTES: holding the tile in registers between the passes took 72-181 registers and one or two
// blocks an SM, with a block's loads idle while it encoded (1.7-4.0x the roof, docs/perf.md);
// the second read is L1 or L2 traffic, not DRAM's, and keeps four blocks an SM in flight.
// Column-wise codes go through shared memory, transposed, so qt is stored in 16-byte runs of
// consecutive tokens. The per-group arithmetic is group.cuh's.
#pragma once
#include "common.cuh"
#include "formats.cuh"
#include "group.cuh"
#include "layouts.cuh"

namespace fgq {

// kTile (rows and columns of a tile: a weight block, a token group) and kTileThreads (threads
// of a tile block) are _abi.ENUMERATORS, in abi.cuh
enum : int { kTileWarps = kTileThreads / 32 };
// resident tile blocks an SM the kernels are compiled for: 64 registers, no spill (sm_90);
// tiles of 256 rows take twice the loads a thread and two blocks an SM (128 registers)
enum : int { kTileBlocksPerSm = 4 };
template <int kRows> struct TileBlocks {
  static_assert(kRows == kTile || kRows == 2 * kTile, "tiles of 128 or 256 rows");
  static constexpr int kPerSm = kTileBlocksPerSm * kTile / kRows;
};

// how quantize_weight_blocks stores a block's scale (Params.weight_layout; _layout.py)
enum WeightLayoutKind : int { kWeightFloat = 0, kWeightBytes = 1, kWeightPacked = 2 };

// kRows x kCols: a weight block (128 or 256 square), or a column tile (128 or 256 tokens by
// 128 channels)
template <int kIn, int kRows = kTile, int kCols = kTile> struct TileShape {
  static constexpr int kValues = kLaneWords * 4 / Input<kIn>::kBytes;  // values a lane
  static constexpr int kLanes = kCols / kValues;                       // lanes a row
  static constexpr int kRowsPerPass = kTileThreads / kLanes;
  static constexpr int kPasses = kRows / kRowsPerPass;                 // rows a thread
  static_assert(kLanes <= 32 && kPasses * kRowsPerPass == kRows, "a row's lanes in one warp");
};

// where the column kernel keeps the code of (channel, token) in shared memory: each channel's
// kTokens tokens in a kTokens-byte row, its 16-byte chunks permuted by the channel's lane
// NOTES: a warp's byte stores there are one token row of each of its lanes' channels, which
// lie kValues channels apart: rows padded to 144 bytes put all eight of a 16-bit row's lanes
// in one bank (eight-way conflicts, sixteen-way for float32); with the chunks xor-permuted by
// the lane they fall in eight banks (float32: two lanes a bank), and a thread of the store to
// qt still reads 16 contiguous bytes
template <int kIn, int kTokens>
__device__ __forceinline__ int code_slot(int channel, int token) {
  static_assert(kTokens % 128 == 0, "runs of eight 16-byte chunks: the xor key's three bits");
  const int key = (channel / TileShape<kIn>::kValues) & 7;
  return channel * kTokens + ((((token >> 4) ^ key) << 4) | (token & 15));
}

// the magnitudes of one loaded word: 16-bit inputs two a word (its halves), for
// max_magnitudes, so a running maximum costs an instruction a word. kFinite: Inf and NaN as
// zero (the rare pass of a tile that holds either); else as they are, >= kInf, which is how a
// tile finds that it holds one
template <int kIn, bool kFinite>
__device__ __forceinline__ u32 word_magnitudes(u32 word) {
  typedef Input<kIn> In;
  if constexpr (In::kBytes == 2) {
    const u32 m = word & kHalfMagnitudes;
    if constexpr (!kFinite) return m;
    return m & __vcmpltu2(m, In::kInf * 0x10001u);  // a half's mask: all ones where finite
  } else {
    const u32 m = word & (In::kSign - 1u);
    if constexpr (!kFinite) return m;
    return m < In::kInf ? m : 0u;
  }
}

// the larger of two word_magnitudes, half by half for 16-bit inputs
template <int kIn>
__device__ __forceinline__ u32 max_magnitudes(u32 a, u32 b) {
  if constexpr (Input<kIn>::kBytes == 2) {
    return max_u16x2(a, b);
  } else {
    return max(a, b);
  }
}

// the larger half of a 16-bit input's word_magnitudes (float32's as it is)
template <int kIn>
__device__ __forceinline__ u32 fold_magnitudes(u32 m) {
  if constexpr (Input<kIn>::kBytes == 2) {
    return max(m & 0xffffu, m >> 16);
  } else {
    return m;
  }
}

// one lane of row `row`, columns [col, col + kValues), of batch `batch`: zeros past `rows` and
// `cols`; vector loads where the lane is whole and `vec` (x's base and strides 16-byte aligned)
// kWhole: the caller knows the lane is real, whole and aligned (a whole tile), so the load is
// one straight-line vector load and a thread's loads can all be in flight together
template <int kIn, bool kWhole = false>
__device__ __forceinline__ void load_tile_lane(const Params& p, u32 batch, u32 row, i64 col,
                                               i64 cols, bool vec, u32 (&w)[kLaneWords]) {
  typedef typename Input<kIn>::Storage Storage;
  constexpr int kValues = TileShape<kIn>::kValues;  // the same for every tile shape
  const Storage* src = static_cast<const Storage*>(p.x) + batch * p.x_batch_stride +
                       static_cast<i64>(row) * p.x_row_stride + col;
  if constexpr (kWhole) {
    load_lane<kIn, true>(src, w);
  } else {
#pragma unroll
    for (int i = 0; i < kLaneWords; ++i) w[i] = 0u;
    if (row >= p.rows) return;
    if (col + kValues <= cols) {
      if (vec) {
        load_lane<kIn, true>(src, w);
      } else {
        load_lane<kIn, false>(src, w);
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < kValues; ++i) {  // a partial lane at the right edge
      if (col + i < cols) {
        const u32 v = static_cast<u32>(__ldg(src + i));
        if constexpr (Input<kIn>::kBytes == 4) {
          w[i] = v;
        } else {
          w[i / 2] |= v << (16 * (i % 2));
        }
      }
    }
  }
}

// a lane's codes at dst: one store where the lane is whole and aligned, else byte by byte
template <int kValues>
__device__ __forceinline__ void store_tile_codes(u8* dst, const u32 (&codes)[kValues / 4], i64 col,
                                                 i64 cols, bool vec) {
  if (col + kValues <= cols && vec) {
    store_codes<kValues>(dst, codes);
    return;
  }
#pragma unroll
  for (int i = 0; i < kValues; ++i) {
    if (col + i < cols) dst[i] = static_cast<u8>(codes[i / 4] >> (8 * (i % 4)));
  }
}

// the largest of every thread's `value` in the block (all threads call it; one barrier pair)
__device__ __forceinline__ u32 block_max(u32 value, u32* warp_max) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    value = max(value, __shfl_xor_sync(kAllLanes, value, offset));
  }
  if ((threadIdx.x & 31u) == 0u) warp_max[threadIdx.x >> 5] = value;
  __syncthreads();
  value = warp_max[0];
#pragma unroll
  for (int w = 1; w < kTileWarps; ++w) value = max(value, warp_max[w]);
  return value;
}

// weight_block_tile (quantize_weight_blocks): w [E, N, K] in blocks of kBlock x kBlock ----------
// Grid (ceil(K / kBlock), ceil(N / kBlock), E). Params: rows = N, groups_per_row = kb, x_* strides,
// q_batch_stride = N * K, eps, the format's numbers; the scale of block (b, i, j) goes to
// scales + b * s_batch_stride + i * s_row_stride + j * s_word_stride (float words or bytes),
// or for the packed layout to byte j % 4 of the word of each row n of the block at
// b * s_batch_stride + n * s_row_stride + (j / 4) * s_word_stride, the padding rows below N
// and the bytes above the last block of a row zeroed (layouts.cuh's packed store; 128x128 blocks
// only). kArith: the block's arithmetic (encode_scaled's: the default, or section 3c's with
// float scales). kBlock: 128 or 256.
template <int kIn, int kOut, int kScale, int kArith = kDefaultArith, int kBlock = kTile>
__device__ __forceinline__ void weight_block_tile(const Params& p) {
  typedef TileShape<kIn, kBlock, kBlock> S;
  __shared__ u32 warp_max[kTileWarps];
  const u32 batch = blockIdx.z, block_row = blockIdx.y;
  const int block_col = static_cast<int>(blockIdx.x);
  const int lane = threadIdx.x % S::kLanes;
  const u32 first_row = block_row * kBlock + threadIdx.x / S::kLanes;
  const i64 cols = p.cols;  // K: the weight's columns (a partial last block allowed)
  const i64 col = static_cast<i64>(block_col) * kBlock + lane * S::kValues;
  const bool vec = p.x_aligned != 0u;

  // the tile's largest magnitude: every lane's loads in flight together, none kept (a whole
  // tile's loads without branches between them: with them each waited for the last). Inf and
  // NaN count as they are (an instruction a word): a tile whose maximum is one of them takes
  // its finite maximum in a second, rare pass
  u32 magnitude = 0u;
  const auto reduce = [&](auto whole, auto finite) {
#pragma unroll
    for (int i = 0; i < S::kPasses; ++i) {
      u32 words[kLaneWords];
      load_tile_lane<kIn, decltype(whole)::value>(p, batch, first_row + i * S::kRowsPerPass, col,
                                                 cols, vec, words);
#pragma unroll
      for (int w = 0; w < kLaneWords; ++w) {
        magnitude = max_magnitudes<kIn>(
            magnitude, word_magnitudes<kIn, decltype(finite)::value>(words[w]));
      }
    }
    magnitude = fold_magnitudes<kIn>(magnitude);
  };
  wait_for_producer();
  const bool whole = vec && (block_row + 1u) * kBlock <= p.rows &&
                     static_cast<i64>(block_col + 1) * kBlock <= cols;
  if (whole) {
    reduce(Flag<true>(), Flag<false>());
  } else {
    reduce(Flag<false>(), Flag<false>());
  }
  signal_dependents();
  magnitude = block_max(magnitude, warp_max);
  const bool nonfinite = magnitude >= Input<kIn>::kInf;  // the block's: a uniform branch
  if (__builtin_expect(nonfinite, 0)) {
    __syncthreads();  // every thread has read warp_max
    magnitude = 0u;
    reduce(Flag<false>(), Flag<true>());
    magnitude = block_max(magnitude, warp_max);
  }
  const float amax = fmaxf(Input<kIn>::magnitude_to_f32(magnitude), p.eps);

  // each row's lane read again, encoded and stored; a rolled loop holds one lane at a time. A
  // whole tile's rows take the straight loads and, where K keeps them aligned, vector stores
  float scale = 0.0f;
  u32 exponent = 0u;
  const bool q_vec = cols % S::kValues == 0;  // rows K bytes apart: whole lanes stay aligned
  const auto encode_rows = [&](auto straight) {
    constexpr bool kStraight = decltype(straight)::value;
#pragma unroll 1
    for (int i = 0; i < S::kPasses; ++i) {
      const u32 row = first_row + i * S::kRowsPerPass;
      u32 words[kLaneWords];
      load_tile_lane<kIn, kStraight>(p, batch, row, col, cols, vec, words);
      u32 codes[S::kValues / 4];
      scale = encode_scaled<kIn, kOut, kScale, S::kValues, kArith>(p, words, amax, exponent, codes);
      if (__builtin_expect(nonfinite, 0) && Input<kIn>::max_magnitude(words) >= Input<kIn>::kInf) {
        patch_group<kIn, false, S::kValues>(p, words, codes);
      }
      u8* dst = p.q + batch * p.q_batch_stride + static_cast<i64>(row) * cols + col;
      if constexpr (kStraight) {
        store_codes<S::kValues>(dst, codes);
      } else if (row < p.rows) {
        store_tile_codes<S::kValues>(dst, codes, col, cols, q_vec);
      }
    }
  };
  // (tiles of 256: the guarded pass only, as float32's straight one spills at 128 registers)
  if (kBlock == kTile && whole && q_vec) {
    encode_rows(Flag<kBlock == kTile>());
  } else {
    encode_rows(Flag<false>());
  }

  // the block's scale
  u8* base = p.scales + batch * p.s_batch_stride;
  if (kBlock == kTile && p.weight_layout == kWeightPacked) {
    // each row of the block holds the block's byte; the padding rows [N, align(N, 4)), all in
    // the last block row (align(N, 4) <= 128 nb), zeros
    const u32 row = block_row * kTile + threadIdx.x;
    if (threadIdx.x < static_cast<u32>(kTile) && row < p.scale_rows) {
      u8* word = base + row * p.s_row_stride + (block_col / 4) * p.s_word_stride;
      ScaleLayout<kPackedExponents>::store_at(word, p, block_col, scale, exponent, row < p.rows,
                                              true);
    }
  } else if (threadIdx.x == 0) {
    u8* at = base + block_row * p.s_row_stride + block_col * p.s_word_stride;
    if (p.weight_layout == kWeightBytes) {
      *at = static_cast<u8>(exponent);
    } else {
      *reinterpret_cast<float*>(at) = scale;
    }
  }
}

// the largest finite magnitude of `count` values `row_stride` apart from x (a channel's tokens),
// by one thread, eight loads in flight at a time: the rare path of a column tile holding Inf
// or NaN, kept out of line
template <int kIn>
__device__ __noinline__ u32 column_finite_max(const typename Input<kIn>::Storage* x,
                                              i64 row_stride, int count) {
  typedef Input<kIn> In;
  constexpr int kInFlight = 8;
  u32 m = 0u;
  for (int t = 0; t < count; t += kInFlight) {
    u32 raw[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      raw[j] = t + j < count ? static_cast<u32>(__ldg(x + (t + j) * row_stride)) : 0u;
    }
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const u32 magnitude = raw[j] & (In::kSign - 1u);
      if (magnitude < In::kInf) m = max(m, magnitude);
    }
  }
  return m;
}

// one lane's column-wise codes (its kValues channels at one token) under the channels' scales,
// into the transposed shared rows. kGeneral: the tile holds a non-finite value or a float
// scale below kMinFastDivisor, so each value picks its division and is patched
// (patch_nonfinite); the common case skips both tests, a third of the column encoding's
// instructions
template <int kIn, int kOut, int kScale, bool kProduct, bool kGeneral, int kTokens>
__device__ __forceinline__ void encode_column_codes(const Params& p, const u32 (&words)[kLaneWords],
                                                    const float2* channel_scale, int lane,
                                                    int token, u8* codes_t) {
  typedef TileShape<kIn> S;
  // channel lane * kValues + v sits v * kTokens bytes after channel lane * kValues (code_slot's
  // key is the same for a lane's channels)
  const int first = code_slot<kIn, kTokens>(lane * S::kValues, token);
#pragma unroll
  for (int v = 0; v < S::kValues; v += 4) {  // four channels a code word
    float scaled[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float value = value_of<kIn>(words, v + j);
      const float2 pair = channel_scale[(v + j) * S::kLanes + lane];
      if constexpr (kProduct || kScale != kFloat32Scale) {
        scaled[j] = scaled_value<kOut, kMultiply>(value, pair.x, pair.y);
      } else if constexpr (kGeneral) {
        scaled[j] = pair.x >= kMinFastDivisor
                        ? scaled_value<kOut, kDivideFast>(value, pair.x, pair.y)
                        : scaled_value<kOut, kDivideExact>(value, pair.x, pair.y);
      } else {
        scaled[j] = scaled_value<kOut, kDivideFast>(value, pair.x, pair.y);
      }
    }
    const u32 word = Output<kOut>::encode4(scaled);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      u32 code = (word >> (8 * j)) & 0xffu;
      if constexpr (kGeneral) {
        code = patch_nonfinite<kIn, false>(code, Input<kIn>::raw(words, v + j), p.nonfinite_codes);
      }
      codes_t[first + (v + j) * kTokens] = static_cast<u8>(code);
    }
  }
}

// column_tile (quantize_columns): x [M, K] column-wise, and row-wise where p.q is set ("both") -
// Grid (K / 128, ceil(M / kTokens)); Params.cols = K. The row-wise result (kTokens = 128 only)
// uses the plain Params (rows = M, groups_per_row = K / 128, the layout's strides, q, scales)
// through quantize_group, as the
// other kernels; the column-wise one the t_* fields: codes at qt (K rows of M bytes), scales
// of channel c, token group j where the layout puts (row c, group j) of a [K, t_groups]
// matrix (t_row_stride, t_word_stride, t_scale_rows: its padding rows are zeroed). kArith: both
// results' arithmetic (the default, or section 3c's with float scales). kTokens: a token group,
// 128 or 256.
template <int kIn, int kOut, int kScale, int kLayout, int kArith = kDefaultArith,
          int kTokens = kTile>
__device__ __forceinline__ void column_tile(const Params& p) {
  typedef TileShape<kIn, kTokens, kTile> S;
  typedef Input<kIn> In;
  constexpr bool kProduct = kArith == kReciprocalArith || kArith == kMultiplierArith;
  static_assert(kArith == kDefaultArith || (kProduct && kScale == kFloat32Scale),
                "the column kernel's arithmetics: the default, or section 3c's of float scales");
  // a channel's entries (lane * kValues + v) sit at slot v * kLanes + lane: a warp's lanes then
  // read and write consecutive words (by channel they were four-way conflicts)
  __shared__ u32 channel_max[kTileWarps][kTile];    // each warp's maxima
  __shared__ float2 channel_scale[kTile];  // the channel's scale and scaled_value's factor
  __shared__ __align__(16) u8 codes_t[kTile * kTokens];
  const int group = static_cast<int>(blockIdx.x);  // the row-wise group: the tile's channels
  const u32 token_block = blockIdx.y;
  const int lane = threadIdx.x % S::kLanes;
  const u32 first_row = token_block * kTokens + threadIdx.x / S::kLanes;
  const i64 k = p.cols;
  const i64 col = static_cast<i64>(group) * kTile + lane * S::kValues;
  const bool vec = p.x_aligned != 0u;

  // each channel's largest magnitude over this thread's rows (loads in flight together, none
  // kept), then over the threads of the warp that hold the channel. Inf and NaN count as they
  // are (an instruction a word): a channel whose maximum is one of them is read again for its
  // finite maximum by the thread that scales it (rare)
  u32 magnitudes[kLaneWords];  // word w's channels
#pragma unroll
  for (int w = 0; w < kLaneWords; ++w) magnitudes[w] = 0u;
  const auto reduce = [&](auto whole) {
#pragma unroll
    for (int i = 0; i < S::kPasses; ++i) {
      u32 words[kLaneWords];
      load_tile_lane<kIn, decltype(whole)::value>(p, 0u, first_row + i * S::kRowsPerPass, col, k,
                                                 vec, words);
#pragma unroll
      for (int w = 0; w < kLaneWords; ++w) {
        magnitudes[w] = max_magnitudes<kIn>(magnitudes[w], word_magnitudes<kIn, false>(words[w]));
      }
    }
  };
  wait_for_producer();
  const bool whole = vec && (token_block + 1u) * kTokens <= p.rows;  // K is whole tiles
  if (whole) {
    reduce(Flag<true>());
  } else {
    reduce(Flag<false>());
  }
  signal_dependents();
  const u32 warp = threadIdx.x >> 5;
#pragma unroll
  for (int w = 0; w < kLaneWords; ++w) {
    u32 m = magnitudes[w];
#pragma unroll
    for (int offset = S::kLanes; offset < 32; offset *= 2) {
      m = max_magnitudes<kIn>(m, __shfl_xor_sync(kAllLanes, m, offset));
    }
    if ((threadIdx.x & 31u) < static_cast<u32>(S::kLanes)) {
      constexpr int kPerWord = 4 / In::kBytes;
#pragma unroll
      for (int h = 0; h < kPerWord; ++h) {
        const int v = w * kPerWord + h;
        channel_max[warp][v * S::kLanes + lane] = kPerWord == 2 ? (m >> (16 * h)) & 0xffffu : m;
      }
    }
  }
  __syncthreads();

  // each channel's scale, by one thread a channel, which also stores it
  Params t = p;  // the column-wise result's layout
  t.scales = p.scales_t;
  t.s_batch_stride = 0;
  t.s_row_stride = p.t_row_stride;
  t.s_word_stride = p.t_word_stride;
  t.groups_per_row = p.t_groups;
  t.scale_rows = p.t_scale_rows;
  const int token_group = static_cast<int>(token_block);
  // a float scale below the fast division's range (a tiny eps), or Inf or NaN, anywhere in the
  // tile takes the general encoding below for all of it; the common one has neither test a
  // value
  bool general = false;
  if (threadIdx.x < static_cast<u32>(kTile)) {
    const int slot = static_cast<int>(threadIdx.x);
    const int channel = (slot % S::kLanes) * S::kValues + slot / S::kLanes;
    u32 m = channel_max[0][slot];
#pragma unroll
    for (int w = 1; w < kTileWarps; ++w) m = max(m, channel_max[w][slot]);
    if (__builtin_expect(m >= In::kInf, 0)) {
      general = true;
      const u32 first = token_block * kTokens;
      const i64 c = static_cast<i64>(group) * kTile + channel;
      m = column_finite_max<kIn>(
          static_cast<const typename In::Storage*>(p.x) + c + first * p.x_row_stride,
          p.x_row_stride, static_cast<int>(min(static_cast<u32>(kTokens), p.rows - first)));
    }
    const float amax = fmaxf(In::magnitude_to_f32(m), p.eps);
    float factor;
    u32 exponent;
    const float scale = group_scale<kOut, kScale, kArith>(p, amax, factor, exponent);
    channel_scale[slot] = make_float2(scale, factor);
    if constexpr (kScale == kFloat32Scale && !kProduct) general |= scale < kMinFastDivisor;
    const u32 c = static_cast<u32>(group) * kTile + channel;
    ScaleLayout<kLayout>::store_at(ScaleLayout<kLayout>::at(t, 0u, c, token_group), t,
                                   token_group, scale, exponent, true, true);
  }
  // the padding rows (channels K .. t_scale_rows) of this token group's scales
  if (blockIdx.x + 1u == gridDim.x && threadIdx.x == 0) {
    for (u32 c = static_cast<u32>(k); c < p.t_scale_rows; ++c) {
      ScaleLayout<kLayout>::zero(t, 0u, c, token_group);
    }
  }
  const bool general_tile = __syncthreads_or(general) != 0;

  // each row's lane read again: its row-wise group ("both"), as every other kernel quantizes
  // it, and its values' column-wise codes, transposed into shared memory; a rolled loop holds
  // one lane at a time. A whole tile's rows take the straight loads (no row or edge guard)
  const u32 warp_lane = threadIdx.x & 31u;
  const u32 mask = ((1u << S::kLanes) - 1u) << (warp_lane & ~static_cast<u32>(S::kLanes - 1));
  const auto encode_rows = [&](auto straight) {
    constexpr bool kStraight = decltype(straight)::value;
#pragma unroll 1
    for (int i = 0; i < S::kPasses; ++i) {
      const u32 row = first_row + i * S::kRowsPerPass;
      u32 words[kLaneWords];
      load_tile_lane<kIn, kStraight>(p, 0u, row, col, k, vec, words);
      if (kTokens == kTile && p.q != nullptr) {
        const bool real = kStraight || row < p.rows;
        quantize_group<kIn, kTile, kOut, kScale, kLayout, false, false, false, kArith>(
            p, words, S::kLanes == 32 ? kAllLanes : mask, real, p.q + row * k + col, real,
            ScaleLayout<kLayout>::at(p, 0u, row, group), real && lane == 0, group);
        if (row + 1u == p.rows) {
          zero_padding_rows<S::kValues, S::kLanes, kLayout>(p, p.q + col, k, 0u, row, group, lane);
        }
      }
      const int token = static_cast<int>(threadIdx.x) / S::kLanes + i * S::kRowsPerPass;
      if (general_tile) {
        encode_column_codes<kIn, kOut, kScale, kProduct, true, kTokens>(p, words, channel_scale,
                                                                       lane, token, codes_t);
      } else {
        encode_column_codes<kIn, kOut, kScale, kProduct, false, kTokens>(p, words, channel_scale,
                                                                        lane, token, codes_t);
      }
    }
  };
  if (whole) {
    encode_rows(Flag<true>());
  } else {
    encode_rows(Flag<false>());
  }
  __syncthreads();

  // qt: each channel's run of this block's tokens, 16 bytes a store where whole and aligned
  const i64 m = p.rows;
  const i64 token0 = static_cast<i64>(token_block) * kTokens;
  const bool qt_vec = m % 16 == 0;
  for (int chunk = threadIdx.x; chunk < kTile * (kTokens / 16); chunk += kTileThreads) {
    const int channel = chunk / (kTokens / 16), part = chunk % (kTokens / 16);
    const i64 token = token0 + part * 16;
    if (token >= m) continue;
    u8* dst = p.qt + (static_cast<i64>(group) * kTile + channel) * m + token;
    const u8* src = codes_t + code_slot<kIn, kTokens>(channel, part * 16);
    if (qt_vec && token + 16 <= m) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int b = 0; b < 16 && token + b < m; ++b) dst[b] = src[b];
    }
  }
}

}  // namespace fgq
