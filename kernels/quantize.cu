// Per-token group quantization: one kernel family for every input type, group size, output
// format and scale layout. Python picks the instantiation (_launch.py) and the scale strides.
//
// Work split: a group of kGroup values is held by kLanes consecutive lanes of a warp, 32 bytes
// (two 16-byte loads) per lane. The lanes reduce the group maximum with xor-shuffles limited to
// their own lanes, compute the scale, quantize in registers and store their codes with one store.
// No shared memory, no __syncthreads, no atomics.
//
// Grid, two paths from one template (docs/perf.md steps 14 and 17). kOnePass: the group slots
// of the real rows are numbered flat over a 1-D grid, one group per lane set and no loop, so
// every block but the last is full whatever K is; the launch layer takes it for every grid of
// the instantiations that fit six blocks per SM (min_blocks_per_sm) and for grids of a few
// waves of the others. Otherwise the row loop:
// a block covers a tile of tile_rows consecutive rows by groups_per_block groups, y splits a
// row's groups over blocks, and x holds a few resident waves of blocks that walk the row tiles
// with a stride of the grid, each lane loading its next row before it quantizes the current
// one, which keeps more bytes in flight for the heavier instantiations. In both, the slots of
// a tile run rows fastest, so with tile_rows > 1 a warp holds the same groups of consecutive
// rows and the column-major scale layouts are stored as contiguous runs (one sector for eight
// float scales) instead of one scattered 4-byte store per group.
// Rows in [rows, grid_rows) of each batch are padding rows: the kernel writes zeros there (to q
// below q_rows, to the scales below scale_rows), so callers may allocate with empty and no memset
// is launched. The one-pass path has no slots for them: the last real row's slots write them.
//
// kAct (activation.cuh) turns the loaded bytes into the values quantized: kIdentity, or
// kSiluMul, which loads a gate lane and its up lane and computes the engines' silu_and_mul.
// quantize_masked, at the end, is the masked MoE layout's persistent kernel over the same steps.
#include "activation.cuh"
#include "common.cuh"
#include "layouts.cuh"

namespace fgq {

// NOTES: six resident blocks of 256 threads cap a kernel at 40 registers, five at 48. The lean
// instantiations (16-bit input to float8 with power-of-two scales, vector loads) fit 40 with no
// spill and keep six blocks, in both paths. So does the one-pass path of every vector-load
// instantiation of plain input (no spill since session 7 computes its store addresses once),
// and it takes six where that measured faster (below); the fused SiLU path keeps five. In the
// row loop, int8 output, exact float scales and float32 input, and anywhere the element-wise
// load fallback, need up to 48 and spilled 4 to 56 bytes at 40 (ptxas -v), so they take five:
// no instantiation spills (tests/test_compile.py checks it for sm_90).
template <int kIn, int kOut, int kScale, bool kVec16, bool kOnePass, int kAct>
constexpr int min_blocks_per_sm() {
  constexpr bool lean = kIn != kF32 && Output<kOut>::kLean && kScale != kFloat32Scale;
  // one pass at six blocks measured faster for int8 and float32 input (session 7, run 4: int8
  // with UE8M0 scales from 1.06 to 1.02x the headline per byte at M = 8192) and slower for exact
  // float scales of 16-bit input (1.07 to 1.09-1.15x: their three extra instructions a value
  // want the row loop's prefetch), which keep five blocks, and so the loop past 16 waves
  constexpr bool one_pass_six = kOnePass && (kScale != kFloat32Scale || kIn == kF32);
  return kVec16 && kAct == kIdentity && (lean || one_pass_six) ? 6 : 5;
}

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

// one lane's input bytes: its 32 bytes of x, and with kSiluMul the up bytes x_up_offset
// elements further (in `up`; unused otherwise)
template <int kIn, bool kVec16, int kAct>
__device__ __forceinline__ void load_inputs(const Params& p, const typename Input<kIn>::Storage* src,
                                            u32 (&words)[kLaneWords], u32 (&up)[kLaneWords]) {
  load_lane<kIn, kVec16>(src, words);
  if constexpr (kAct == kSiluMul) load_lane<kIn, kVec16>(src + p.x_up_offset, up);
}

// the values quantized, from the loaded bytes: x itself, or SiLU(gate) * up
template <int kIn, int kAct, typename Table>
__device__ __forceinline__ void apply_activation(u32 (&words)[kLaneWords], const u32 (&up)[kLaneWords],
                                                 const Table& table) {
  if constexpr (kAct == kSiluMul) silu_mul_lane<kIn>(words, up, table);
}

// one lane's values of a group: load_inputs, then apply_activation
template <int kIn, bool kVec16, int kAct, typename Table>
__device__ __forceinline__ void load_values(const Params& p, const typename Input<kIn>::Storage* src,
                                            const Table& table, u32 (&words)[kLaneWords]) {
  u32 up[kLaneWords];
  load_inputs<kIn, kVec16, kAct>(p, src, words, up);
  apply_activation<kIn, kAct>(words, up, table);
}

// maximum over the lanes of one group ------------------------------------------------------------
// NOTES: the xor offsets stay below kLanes, so each group reduces among its own lanes; `mask`
// names the lanes that run the call together.
template <int kLanes>
__device__ __forceinline__ u32 group_max(u32 value, u32 mask) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    value = max(value, __shfl_xor_sync(mask, value, offset));
  }
  return value;
}

// scale and encode one lane's values ---------------------------------------------------------------
enum ScaleOp : int { kMultiply = 0, kDivideFast = 1, kDivideExact = 2 };

template <int kIn, int kOut, int kOp, int kValues, typename V>
__device__ __forceinline__ void encode_lane(const V& values, float scale, float factor,
                                            u32 (&codes)[kValues / 4]) {
#pragma unroll
  for (int w = 0; w < kValues / 4; ++w) {
    float t[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float v = LaneValues<kIn, V>::value(values, 4 * w + j);
      // kMultiply: factor already holds the format's 2^kCodeExponent; both exact powers of two
      if constexpr (kOp == kMultiply) t[j] = mul_rn(v, factor);
      if constexpr (kOp == kDivideFast) t[j] = divide_fast(v, scale, factor);
      if constexpr (kOp == kDivideExact) t[j] = div_rn(v, scale);
      if constexpr (kOp != kMultiply && Output<kOut>::kCodeExponent != 0) {
        t[j] = mul_rn(t[j], static_cast<float>(1u << Output<kOut>::kCodeExponent));
      }
    }
    codes[w] = Output<kOut>::encode4(t);
  }
}

// kValues zero codes (16 or 8 bytes) at dst
template <int kValues>
__device__ __forceinline__ void store_zeros(u8* dst) {
  if constexpr (kValues == 16) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
  } else {
    *reinterpret_cast<uint2*>(dst) = make_uint2(0u, 0u);
  }
}

// zero the padding rows below `row`, the last real row of `batch`: q's below q_rows, the
// scales' below scale_rows; called by every lane of every group of that row, q_batch is the
// lane's bytes of row 0
template <int kValues, int kLanes, int kLayout>
__device__ __forceinline__ void zero_padding_rows(const Params& p, u8* q_batch, i64 k, u32 batch,
                                                  u32 row, int group, int lane) {
  if constexpr (ScaleLayout<kLayout>::kSpreadPadding) {
#pragma unroll 1
    for (u32 pad = row + 1u; pad < p.q_rows; ++pad) store_zeros<kValues>(q_batch + pad * k);
    ScaleLayout<kLayout>::zero_rows(p, batch, row + 1u, group, lane, kLanes);
  } else {
#pragma unroll 1
    for (u32 pad = row + 1u; pad < p.grid_rows; ++pad) {
      if (pad < p.q_rows) store_zeros<kValues>(q_batch + pad * k);
      if (pad < p.scale_rows && lane == 0) ScaleLayout<kLayout>::zero(p, batch, pad, group);
    }
  }
}

// one lane's codes (16 or 8 bytes) at q_dst
template <int kValues>
__device__ __forceinline__ void store_codes(u8* q_dst, const u32 (&codes)[kValues / 4]) {
  if constexpr (kValues == 16) {
    *reinterpret_cast<uint4*>(q_dst) = make_uint4(codes[0], codes[1], codes[2], codes[3]);
  } else {
    *reinterpret_cast<uint2*>(q_dst) = make_uint2(codes[0], codes[1]);
  }
}

// the codes of a group's non-finite values: NaN keeps its sign, e5m2 keeps Inf, int8 NaN gives
// 0. kUnsignedNaN: see patch_nonfinite
template <int kIn, bool kUnsignedNaN, int kValues, typename V>
__device__ __forceinline__ void patch_group(const Params& p, const V& values,
                                            u32 (&codes)[kValues / 4]) {
  typedef LaneValues<kIn, V> L;
#pragma unroll
  for (int i = 0; i < kValues; ++i) {
    const int shift = 8 * (i % 4);
    const u32 code = patch_nonfinite<L::kRawType, kUnsignedNaN>((codes[i / 4] >> shift) & 0xffu,
                                                                L::raw(values, i), p.nonfinite_codes);
    codes[i / 4] = (codes[i / 4] & ~(0xffu << shift)) | (code << shift);
  }
}

// scale, encode and store one group ----------------------------------------------------------------
// From `magnitude`, the group's maximum magnitude over finite values; `patch` gives the
// non-finite values their codes before the stores (see quantize_group for the arguments).
// Leaves the codes in `codes`.
template <int kIn, int kOut, int kScale, int kLayout, bool kUnsignedNaN, bool kStraightTail,
          int kValues, typename V>
__device__ __forceinline__ void finish_group(const Params& p, const V& values, u32 magnitude,
                                             bool patch, bool real_row, u8* q_dst, bool store_q,
                                             u8* scale_at, bool store_scale, int group,
                                             u32 (&codes)[kValues / 4]) {
  const float amax = fmaxf(LaneValues<kIn, V>::magnitude_to_f32(magnitude), p.eps);
  float scale;
  u32 exponent = 0u;
  if constexpr (kScale == kFloat32Scale) {
    scale = divide_by_max(amax, p.fmax, p.inverse_fmax);
    if (scale >= kMinFastDivisor) {
      encode_lane<kIn, kOut, kDivideFast, kValues>(values, scale, rcp_rn(scale), codes);
    } else {
      encode_lane<kIn, kOut, kDivideExact, kValues>(values, scale, 0.0f, codes);
    }
  } else {
    // NOTES: both rules from amax's bits, no division (ue8m0_exponent says why that is the
    // spec's quotient; it took 10 dependent instructions through Markstein's division), both
    // computed, then selected: a uniform branch between them sat on the group's chain.
    // scale_rule="floor": amax's biased exponent minus emax_elem, at least 1
    const u32 floor_rule = static_cast<u32>(
        max(static_cast<int>(__float_as_uint(amax) >> 23) - static_cast<int>(p.floor_emax), 1));
    const u32 rceil = ue8m0_exponent(amax, p.fmax, p.ue8m0_floor);
    exponent = p.floor_emax != 0u ? floor_rule : rceil;
    scale = __uint_as_float(exponent << 23);
    const float inverse = __uint_as_float((254u + Output<kOut>::kCodeExponent - exponent) << 23);
    encode_lane<kIn, kOut, kMultiply, kValues>(values, scale, inverse, codes);
  }
  if (__builtin_expect(patch, 0)) patch_group<kIn, kUnsignedNaN, kValues>(p, values, codes);
  // the codes, then the scale (one lane per group)
  if (store_q) store_codes<kValues>(q_dst, codes);
  ScaleLayout<kLayout>::template store_at<kStraightTail>(scale_at, p, group, scale, exponent,
                                                        real_row, store_scale);
}

// quantize one group (this lane's share) and store it -------------------------------------------
// `values` are this lane's values (as loaded, or a FloatLane: LaneValues); `mask` names the
// lanes that run this call together (the group's own lanes, or with kWholeWarp all 32);
// `real_row` false quantizes a padding row's zeros. The codes go to q_dst when store_q, the
// scale to scale_at (the layout's at() of the group) when store_scale. kUnsignedNaN: see
// patch_nonfinite. kStraightTail (the one-pass kernel's, whose register budget allows it): no
// branch between the group's scale and its stores. The codes of non-finite values are patched
// after the stores and stored again by the same thread (its second store is the one that
// remains); the branch around the patch had been a jump over 2.9 KB of code on the common
// path, and the scale is stored by predicated stores (layouts.cuh) rather than under a branch
// on lane 0 (docs/perf.md step 22).
template <int kIn, int kGroup, int kOut, int kScale, int kLayout, bool kWholeWarp,
          bool kUnsignedNaN = false, bool kStraightTail = false, typename V>
__device__ __forceinline__ void quantize_group(const Params& p, const V& values, u32 mask,
                                               bool real_row, u8* q_dst, bool store_q,
                                               u8* scale_at, bool store_scale, int group) {
  typedef LaneValues<kIn, V> L;
  constexpr int kValues = kLaneWords * 4 / Input<kIn>::kBytes;
  constexpr int kLanes = kGroup / kValues;

  // the group maximum over finite values ---------------------------------------------------------
  u32 magnitude = group_max<kLanes>(L::max_magnitude(values), mask);
  const bool nonfinite = magnitude >= L::kInf;  // uniform over the group
  if constexpr (kWholeWarp) {
    // NOTES: the whole-warp mask needs a warp-uniform branch: every lane takes the slow path if
    // any group of the warp holds Inf or NaN, and keeps its own maximum if its group does not
    if (__builtin_expect(__any_sync(mask, nonfinite), 0)) {
      const u32 finite = group_max<kLanes>(L::max_finite_magnitude(values), mask);
      if (nonfinite) magnitude = finite;
    }
  } else {
    if (__builtin_expect(nonfinite, 0)) {
      magnitude = group_max<kLanes>(L::max_finite_magnitude(values), mask);
    }
  }
  u32 codes[kValues / 4];
  finish_group<kIn, kOut, kScale, kLayout, kUnsignedNaN, kStraightTail, kValues>(
      p, values, magnitude, nonfinite && !kStraightTail, real_row, q_dst, store_q, scale_at,
      store_scale, group, codes);
  if (kStraightTail && __builtin_expect(nonfinite, 0)) {
    patch_group<kIn, kUnsignedNaN, kValues>(p, values, codes);
    if (store_q) store_codes<kValues>(q_dst, codes);
  }
}

// the one-pass path of quantize_groups: one group slot per lane set, no loop ---------------------
// NOTES: one group per lane set and no loop, for grids of a few waves. The slots of the grid are
// numbered flat over (batch, row tile, group, row of the tile), so every block but the last is
// full whatever K is, and a slot finds its place with two multiplicative divisions (no branch,
// no division instruction). Every lane stays to the end, so the shuffles name the whole warp
// (plain SHFL, no convergence checks); a slot past the end, or on a row past the last of a
// partial tile, works on a clamped one and stores nothing. Only real rows have slots: the last
// row's slots also zero the padding rows below. kFlat (_launch.flat_slots: plain input, one-row
// tiles, rows K apart, batches rows * K apart): slot s's values start at x + s * G, so the load
// is issued before the divisions, which only the stores need
template <int kIn, int kGroup, int kOut, int kScale, int kLayout, bool kVec16, int kAct, bool kFlat,
          typename Table>
__device__ __forceinline__ void one_pass_group(const Params& p, Table& table) {
  typedef typename Input<kIn>::Storage Storage;
  constexpr int kValues = kLaneWords * 4 / Input<kIn>::kBytes;
  constexpr int kLanes = kGroup / kValues;
  const int lane = threadIdx.x % kLanes;
  const int tile_rows_log2 = p.tile_rows_log2;
  const u32 slot_in_grid = blockIdx.x * p.block_slots + threadIdx.x / kLanes;
  const bool in_grid = slot_in_grid < p.slots;
  const u32 slot = min(slot_in_grid, p.slots - 1u);
  const Storage* x = static_cast<const Storage*>(p.x);
  u32 words[kLaneWords];
  u32 up[kLaneWords];
  // NOTES: PDL: nothing global is read or written before the producer of x is done (the
  // previous kernel may also still read q and the scales), but kSiluMul's table, constant
  // data copied before the loads (SiluBandTable); once our loads are issued the next kernel
  // may start its prologue
  table.start(p.table_by_threads != 0u);
  wait_for_producer();
  if constexpr (kFlat) {
    load_inputs<kIn, kVec16, kAct>(p, x + static_cast<i64>(slot) * kGroup + lane * kValues, words, up);
  }
  const u32 tile = divide_u31(slot, p.tile_slots_magic, p.tile_slots_shift);
  const u32 within = slot - tile * p.tile_slots;
  const int group = static_cast<int>(within >> tile_rows_log2);
  const u32 batch = divide_u31(tile, p.batch_tiles_magic, p.batch_tiles_shift);
  const u32 row = ((tile - batch * p.batch_tiles) << tile_rows_log2) +
                  (within & ((1u << tile_rows_log2) - 1u));
  const bool active = in_grid && row < p.rows;
  const u32 read_row = min(row, p.rows - 1u);
  const i64 value0 = static_cast<i64>(group) * kGroup + lane * kValues;
  const i64 k = static_cast<i64>(p.groups_per_row) * kGroup;
  if constexpr (!kFlat) {
    load_inputs<kIn, kVec16, kAct>(
        p, x + static_cast<i64>(batch) * p.x_batch_stride32 +
               static_cast<i64>(static_cast<int>(read_row)) * p.x_row_stride32 + value0, words,
        up);
  }
  signal_dependents();
  table.wait(p.table_by_threads != 0u);
  apply_activation<kIn, kAct>(words, up, table);
  u8* q_batch = p.q + batch * p.q_batch_stride + value0;
  // NOTES: the stores' addresses are computed here, while the load is in flight, and pinned
  // (an empty asm that "modifies" them); the compiler otherwise recomputed them after the
  // group's dependent chain, about 40 instructions between the codes and their stores
  // (docs/perf.md step 18)
  u8* q_dst = q_batch + row * k;
  u8* scale_at = ScaleLayout<kLayout>::at(p, batch, row, group);
  u32 stores = active ? (lane == 0 ? 3u : 1u) : 0u;  // bit 0: the codes, bit 1: the scale
  asm volatile("" : "+l"(q_dst), "+l"(scale_at), "+r"(stores));
  __builtin_assume(__isGlobal(q_dst));
  __builtin_assume(__isGlobal(scale_at));
  // NOTES: the padding rows of q and the scales get their zeros from the last real row's
  // slots, while the loads are in flight: stores issued after the group's dependent chain
  // would lengthen the kernel's tail (docs/perf.md step 17)
  if (active && row == p.rows - 1u) {
    zero_padding_rows<kValues, kLanes, kLayout>(p, q_batch, k, batch, row, group, lane);
  }
  quantize_group<kIn, kGroup, kOut, kScale, kLayout, true, kAct == kSiluMul, true>(
      p, words, 0xffffffffu, true, q_dst, stores & 1u, scale_at, stores & 2u, group);
}

// kBlocks: resident blocks of kMaxThreads threads an SM the compiler fits the kernel to; 0 takes
// min_blocks_per_sm's. The one-pass bfloat16 SiLU-and-multiply kernels have a second
// instantiation at six (40 registers, against 48 at five) for large grids
// NOTES: at 40 registers that kernel measured 3-5% faster from M = 896 (N = 7168: more blocks
// an SM, more bytes in flight) and 5-7% slower at M = 512, where each block's longer chain
// shows; so the launch layer takes it past _launch.SILU_SIX_BLOCKS_WAVES (docs/perf.md, fused
// step 29). kFlat: the one-pass kernel of plain input with the load linear in the slot
// (one_pass_group), which the launch layer takes for contiguous rows (_launch.flat_slots)
template <int kIn, int kGroup, int kOut, int kScale, int kLayout, bool kVec16, bool kOnePass,
          int kAct, int kBlocks = 0, bool kFlat = false>
__global__ void __launch_bounds__(kMaxThreads,
                                  (kBlocks != 0 ? kBlocks
                                                : min_blocks_per_sm<kIn, kOut, kScale, kVec16, kOnePass, kAct>()))
    quantize_groups(const __grid_constant__ Params p) {
  typedef Input<kIn> In;
  typedef typename In::Storage Storage;
  constexpr int kValues = kLaneWords * 4 / In::kBytes;  // 16 (16-bit input) or 8 (float32)
  constexpr int kLanes = kGroup / kValues;              // lanes per group
  static_assert(kLanes >= 2 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "lanes per group");
  static_assert(kLayout != kPackedExponents || kScale == kUE8M0Scale,
                "a packed word holds UE8M0 exponent bytes only");
  static_assert(!kFlat || (kOnePass && kAct == kIdentity), "the linear load: plain input, one pass");

  const int lane = threadIdx.x % kLanes;
  const int tile_rows_log2 = p.tile_rows_log2;
  __shared__ typename ActivationTable<kIn, kAct>::Type table;
  // NOTES: the one-pass path starts the table's copy before its loads and waits for it (a
  // barrier) after them (a barrier before them would hold them back: docs/perf.md, fused steps
  // 5 and 27); the row loop fills it here, before any thread returns
  if constexpr (kAct == kSiluMul && !kOnePass) table.fill();

  if constexpr (kOnePass) {
    one_pass_group<kIn, kGroup, kOut, kScale, kLayout, kVec16, kAct, kFlat>(p, table);
    return;
  }

  const int slot = threadIdx.x / kLanes;  // the group slot: rows fastest, then groups
  const int groups_per_block = blockDim.x / kLanes >> tile_rows_log2;
  const int slot_group = blockIdx.y * groups_per_block + (slot >> tile_rows_log2);
  // the slot's first row over all batches
  const u32 slot_row = (blockIdx.x << tile_rows_log2) + (slot & ((1 << tile_rows_log2) - 1));

  // the row loop: each slot walks the rows (padding rows included) of all batches with a
  // stride of the grid, loading the next row before it quantizes the current one, so loads stay
  // in flight while it computes
  const int group = slot_group;
  const u32 row_step = gridDim.x << tile_rows_log2;
  const u32 rows = p.rows, grid_rows = p.grid_rows, batches = p.batches;
  // whole groups leave together, so the shuffle masks stay complete
  if (group >= p.groups_per_row || slot_row >= batches * grid_rows) return;
  const i64 k = static_cast<i64>(p.groups_per_row) * kGroup;
  const i64 value0 = static_cast<i64>(group) * kGroup + lane * kValues;
  const u32 warp_lane = threadIdx.x & 31u;
  const u32 mask = kLanes == 32 ? 0xffffffffu
                                : ((1u << kLanes) - 1u) << (warp_lane & ~static_cast<u32>(kLanes - 1));
  const Storage* x_lane = static_cast<const Storage*>(p.x) + value0;

  // a padding row reads nothing and quantizes zeros
  auto load_row = [&](u32 batch, u32 row, u32(&words)[kLaneWords]) {
    if (row < rows) {
      load_values<kIn, kVec16, kAct>(p, x_lane + batch * p.x_batch_stride + row * p.x_row_stride,
                                     table, words);
    } else {
#pragma unroll
      for (int i = 0; i < kLaneWords; ++i) words[i] = 0u;
    }
  };

  // NOTES: a division here would sit before the first load; rows of the first batch need none
  u32 batch = 0u, row = slot_row;
  if (slot_row >= grid_rows) {
    batch = slot_row / grid_rows;
    row = slot_row - batch * grid_rows;
  }
  u32 next[kLaneWords];
  wait_for_producer();  // PDL, as in the one-pass path
  load_row(batch, row, next);
  while (true) {
    u32 words[kLaneWords];
#pragma unroll
    for (int i = 0; i < kLaneWords; ++i) words[i] = next[i];
    // the next row of this slot, loaded now so that it is in flight while we compute
    u32 next_batch = batch;
    u32 next_row = row + row_step;
    if (next_row >= grid_rows) {  // with one batch: only past the last row, so leave
      const u32 carry = batches == 1 ? 1u : next_row / grid_rows;
      next_batch += carry;
      next_row -= carry * grid_rows;
    }
    if (next_batch < batches) {
      load_row(next_batch, next_row, next);
    } else {
      signal_dependents();  // this slot's last load is issued
    }
    quantize_group<kIn, kGroup, kOut, kScale, kLayout, false, kAct == kSiluMul>(
        p, words, mask, row < rows, p.q + batch * p.q_batch_stride + row * k + value0,
        row < p.q_rows, ScaleLayout<kLayout>::at(p, batch, row, group),
        lane == 0 && row < p.scale_rows, group);

    if (next_batch >= batches) break;
    batch = next_batch;
    row = next_row;
  }
}

// the masked MoE layout: x [E, T, K], only rows t < masked_m[e] of expert e --------------------
// NOTES: a persistent grid whose work scales with sum(masked_m), not with E * T, and which
// reads masked_m on the device (no host synchronisation, so a CUDA graph replays it with new
// counts). Each block clamps the counts to [0, T] and scans their row tiles (in each warp's
// lanes for up to 32 experts, else into shared memory); the group slots of the real tiles are
// numbered as in the one-pass kernel and walked with a stride of the grid; a slot finds its
// expert by two ballots over the lanes (docs/perf.md, fused step 15) or by binary search. Rows at
// or past masked_m[e], and TMA padding rows, are not written. Without masked_m (a null
// pointer) every batch has p.rows rows: the plain fused SiLU-and-multiply path's grid for
// large inputs without padding rows, one table copy per resident block instead of one per
// 16 groups (_launch.fused_takes_persistent; docs/perf.md, fused step 12).
// slots per thread and iteration, their loads issued together: three of x alone, two of gate
// and up (64 bytes each), which fit the 64 registers of eight resident blocks without a spill
template <int kAct>
constexpr int masked_unroll() {
  return kAct == kIdentity ? kMaskedUnroll : kMaskedUnrollSilu;
}

template <int kIn, int kGroup, int kOut, int kScale, int kLayout, int kAct>
__global__ void __launch_bounds__(kMaskedThreads, 8) quantize_masked(const __grid_constant__ Params p) {
  typedef Input<kIn> In;
  typedef typename In::Storage Storage;
  constexpr int kValues = kLaneWords * 4 / In::kBytes;
  constexpr int kLanes = kGroup / kValues;
  constexpr int kWarps = kMaskedThreads / 32;
  __shared__ typename ActivationTable<kIn, kAct>::Type table;
  __shared__ u32 first_tile[kMaxExperts + 1];  // row tiles of the experts before e
  __shared__ u32 expert_rows[kMaxExperts];     // clamped masked_m
  __shared__ u32 warp_totals[kWarps];
  if constexpr (kAct == kSiluMul) table.fill();

  const u32 experts = p.batches;
  const int tile_rows_log2 = p.tile_rows_log2;
  const u32 tile_rows = 1u << tile_rows_log2;
  const u32 tile_slots = p.tile_slots;
  const u32 slots_per_block = kMaskedThreads / kLanes;
  const u32 warp_lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  // expert e's row count, clamped to [0, rows]
  auto clamped_rows = [&](u32 e) {
    long long count = p.masked_m == nullptr ? p.rows  // the plain fused path: all rows
                      : p.masked_i64 ? static_cast<const long long*>(p.masked_m)[e]
                                     : static_cast<const int*>(p.masked_m)[e];
    return static_cast<u32>(count < 0 ? 0 : (count > p.rows ? p.rows : count));
  };
  // inclusive scan over the warp's lanes
  auto warp_scan = [&](u32 value) {
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const u32 before = __shfl_up_sync(0xffffffffu, value, offset);
      if (warp_lane >= static_cast<u32>(offset)) value += before;
    }
    return value;
  };
  // NOTES: with at most 32 experts, and a block's slots of one step within two row tiles, each
  // warp scans the counts in its own lanes (lane e: expert e's rows and first tile) and keeps
  // a copy in shared memory for itself, with no barrier, and a slot finds its expert by two
  // ballots over the lanes (the experts whose first tile is at or before each of the two
  // tiles) and a population count, where the general path searches the scan in shared memory
  // (five dependent reads)
  // One expert (the plain fused path's usual single batch, or E = 1) needs neither: every
  // thread clamps its count and each slot's expert is 0 (step 15 had sent it to the ballots)
  const bool single = experts == 1u;  // uniform
  const bool in_lanes = !single && experts <= 32u && slots_per_block <= tile_slots;  // uniform
  wait_for_producer();  // PDL: masked_m and x may come from the previous kernel
  u32 lane_first = 0xffffffffu, total_tiles, single_rows = 0u;
  if (single) {
    single_rows = clamped_rows(0u);
    total_tiles = (single_rows + tile_rows - 1u) >> tile_rows_log2;
  } else if (in_lanes) {
    const u32 rows = warp_lane < experts ? clamped_rows(warp_lane) : 0u;
    const u32 tiles = (rows + tile_rows - 1u) >> tile_rows_log2;
    const u32 inclusive = warp_scan(tiles);
    if (warp_lane < experts) lane_first = inclusive - tiles;
    total_tiles = __shfl_sync(0xffffffffu, inclusive, 31);
    // the warp's own copy of the scan (entries 32 * warp + e), read after a slot's ballots
    expert_rows[threadIdx.x] = rows;
    first_tile[threadIdx.x] = lane_first;
    __syncwarp();
  } else {
    // each thread clamps and counts the tiles of a run of consecutive experts
    const u32 per_thread = (experts + kMaskedThreads - 1) / kMaskedThreads;
    const u32 first_expert = threadIdx.x * per_thread;
    u32 local = 0u;
    for (u32 i = 0; i < per_thread; ++i) {
      const u32 e = first_expert + i;
      if (e < experts) {
        expert_rows[e] = clamped_rows(e);
        local += (expert_rows[e] + tile_rows - 1u) >> tile_rows_log2;
      }
    }
    // exclusive scan of the runs: within each warp by shuffles, then over the warps
    const u32 inclusive = warp_scan(local);
    if (warp_lane == 31u) warp_totals[warp] = inclusive;
    __syncthreads();
    u32 start = inclusive - local;
    for (u32 w = 0; w < warp; ++w) start += warp_totals[w];
    for (u32 i = 0; i < per_thread; ++i) {
      const u32 e = first_expert + i;
      if (e < experts) {
        first_tile[e] = start;
        start += (expert_rows[e] + tile_rows - 1u) >> tile_rows_log2;
      }
    }
    if (threadIdx.x == kMaskedThreads - 1) first_tile[experts] = start;  // the total
    __syncthreads();
    total_tiles = first_tile[experts];
  }
  signal_dependents();

  const u32 total_slots = total_tiles * tile_slots;
  const u32 grid_slots = gridDim.x * slots_per_block;
  const int lane = threadIdx.x % kLanes;
  const i64 k = static_cast<i64>(p.groups_per_row) * kGroup;
  // NOTES: `base` is uniform over the block, so every lane runs every iteration and the
  // shuffles name the whole warp; a slot past the end works on the last one and stores nothing.
  // Each iteration takes kUnroll slots a grid apart and issues all their loads before it
  // quantizes any, so a persistent block keeps as many bytes in flight as the one-pass kernel's
  // fuller grid (docs/perf.md, fused step 2)
  constexpr int kUnroll = masked_unroll<kAct>();
  for (u32 base = blockIdx.x * slots_per_block; base < total_slots; base += kUnroll * grid_slots) {
    u32 words[kUnroll][kLaneWords], up[kUnroll][kLaneWords];
    u32 batch[kUnroll], row[kUnroll];
    int group[kUnroll];
    bool active[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const u32 slot_raw = base + u * grid_slots + threadIdx.x / kLanes;
      const u32 slot = min(slot_raw, total_slots - 1u);
      const u32 tile = divide_u31(slot, p.tile_slots_magic, p.tile_slots_shift);
      const u32 within = slot - tile * tile_slots;
      group[u] = static_cast<int>(within >> tile_rows_log2);
      u32 lo, first, rows;  // the last expert whose first tile is at or before `tile`
      if (single) {
        lo = 0u;
        first = 0u;
        rows = single_rows;
      } else if (in_lanes) {
        // the block's first slot of this step: its tile or the next holds every slot's
        const u32 block_tile =
            divide_u31(min(base + u * grid_slots, total_slots - 1u), p.tile_slots_magic, p.tile_slots_shift);
        const u32 at_first = __ballot_sync(0xffffffffu, lane_first <= block_tile);
        const u32 at_next = __ballot_sync(0xffffffffu, lane_first <= block_tile + 1u);
        lo = static_cast<u32>(__popc(tile == block_tile ? at_first : at_next)) - 1u;
        first = first_tile[32u * warp + lo];
        rows = expert_rows[32u * warp + lo];
      } else {
        u32 hi = experts;
        lo = 0u;
        while (hi - lo > 1u) {
          const u32 mid = (lo + hi) >> 1;
          if (first_tile[mid] <= tile) lo = mid; else hi = mid;
        }
        first = first_tile[lo];
        rows = expert_rows[lo];
      }
      batch[u] = lo;
      row[u] = ((tile - first) << tile_rows_log2) + (within & (tile_rows - 1u));
      // rows is at least 1: the expert owns this tile
      active[u] = slot_raw < total_slots && row[u] < rows;
      load_inputs<kIn, true, kAct>(
          p, static_cast<const Storage*>(p.x) + lo * p.x_batch_stride +
                 min(row[u], rows - 1u) * p.x_row_stride + static_cast<i64>(group[u]) * kGroup +
                 lane * kValues, words[u], up[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      apply_activation<kIn, kAct>(words[u], up[u], table);
      const i64 value0 = static_cast<i64>(group[u]) * kGroup + lane * kValues;
      quantize_group<kIn, kGroup, kOut, kScale, kLayout, true, kAct == kSiluMul>(
          p, words[u], 0xffffffffu, true, p.q + batch[u] * p.q_batch_stride + row[u] * k + value0,
          active[u], ScaleLayout<kLayout>::at(p, batch[u], row[u], group[u]),
          active[u] && lane == 0, group[u]);
    }
  }
}

// fused (add-)RMSNorm: a row at a time ------------------------------------------------------------
// NOTES: a row's sum of squares needs the whole row before any group can be scaled, so a block
// holds whole rows, kPer 32-byte lanes a thread: thread t holds lanes t and, with kPer = 2,
// t + blockDim.x (a multiple of 32, so each warp holds whole warps of lanes and the same lane of
// a group in both), at most 1024 lanes a row (K <= 16384 for 16-bit input). It reduces in the
// order docs/spec.md (section 2b) defines: each lane folds its squares in half, each warp of
// lanes folds its 32 lanes with xor shuffles, one shared slot per warp of lanes; warp 0 folds
// the 32 slots again, computes r and passes it on behind a second barrier (fused step 21). Two
// lanes a thread halve the per-row work a lane (the second fold, the division, square root and
// reciprocal, the addresses and the loop), which pays where many rows keep the SMs issuing; one
// lane a thread keeps twice the warps on a row, which pays where few rows leave them waiting on
// the row's chain (_launch.norm_lanes; docs/perf.md, fused step 13).
// The grid is a block a row or at most one resident wave of blocks that walk the rows (over all
// batches) with a stride of the grid (_launch.norm_blocks). In the source a walking block loads
// its next row after it has stored the current one; the compiler (sm_90) issues those loads at
// the top of the iteration into registers of their own, so the next row is in flight while the
// current one is worked on. Written by hand (fused step 7), that second set of words kept the
// two-lane kernel at 80 registers, three blocks an SM; as it stands it fits 72, four blocks
// (fused step 18; a shared-memory stash filled by cp.async instead ran the walk at 39.0 us at
// M = 4096, K = 7168, against 30.9). The warp slots and r alternate between two sets (from
// when one barrier a row sufficed; one set of slots measured no faster, fused step 19). Lanes past the row's last work on a
// copy of that lane, add +0 to the sums and store nothing, so the group shuffles name the
// whole warp. The last real row of each batch zeroes the padding rows below it. A walking grid
// of 16-bit input without a residual takes the kStash instantiation (quantize_norm).

// whether a lane's normalised values reach the quantizer as float32 (FloatLane) rather than
// packed in the input type
// NOTES: float32 skips the pack, the unpack and the maximum over packed halves: RMSNorm at
// M = 4096 (two lanes a thread, bfloat16 to e4m3, packed scales) 37.4 -> 31.0 us (docs/perf.md,
// fused step 16). It holds more registers: with two lanes a thread (72 registers, fused step
// 18) the blocked layout keeps the packed words (float32 lanes spilled four words there in
// every input type), every other two-lane instantiation fits float32 lanes
template <int kIn, int kGroup, int kOut, int kLayout, int kPer>
constexpr bool norm_float_lanes() {
  return kPer == 1 || kLayout != kBlockedExponents;
}

template <int kIn, int kGroup, int kOut, int kScale, int kLayout, int kPer, bool kAdd, bool kStash>
__device__ __forceinline__ void norm_rows(const Params& p, float (&warp_sums)[2][32], float (&row_r)[2],
                                          float4* norm_stash) {
  typedef Input<kIn> In;
  typedef typename In::Storage Storage;
  constexpr int kValues = kLaneWords * 4 / In::kBytes;
  constexpr int kLanes = kGroup / kValues;
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
  // NOTES: the weight is read again each row (an L1 hit): held in registers, it took both
  // instantiations past their register limits with spills, with the residual too. With kStash
  // (quantize_norm) the thread keeps its weight values as float32 in shared memory instead: four
  // shared loads a lane a row replace two loads and 16 unpacks (fused step 19). No barrier: a
  // thread reads only what it wrote. Lanes handed to the quantizer as float32 (kFloat) need no
  // test of the weight for Inf and NaN (the quantizer's maximum keeps NaN), so the general
  // kernel reads none of it here (fused step 21) but after r, from L2 on its first row: the L1
  // prefetch a lane it issued here until fused step 25 cost add-RMSNorm 1% at M = 512 and
  // gained nothing anywhere
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

    if constexpr (kAdd) {
#pragma unroll
      for (int j = 0; j < kPer; ++j) add_residual<kIn>(words[j], other[j]);
    }
    // the mean square: lanes, then warps of lanes, then the 32 slots, each folded in half
    float lane_sums[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) lane_sums[j] = in_row[j] ? lane_sum_of_squares<kIn>(words[j]) : 0.0f;
    if constexpr (kAdd) {
      // NOTES: the sum x + residual is written back with NaN as the positive quiet NaN; a lane
      // holding NaN has a NaN sum of squares, so only a lane whose sum is not finite looks for
      // it (add_residual's test of each pair took about 3 instructions a pair: fused step 22)
      Storage* r_row = residual_lane + batch * p.r_batch_stride + row * p.r_row_stride;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (__builtin_expect(!(lane_sums[j] <= 3.4028234663852886e38f), 0)) canonicalise_nan<kIn>(words[j]);
        if (in_row[j]) {
          uint4* dst = reinterpret_cast<uint4*>(r_row + j * second);
          dst[0] = make_uint4(words[j][0], words[j][1], words[j][2], words[j][3]);
          dst[1] = make_uint4(words[j][4], words[j][5], words[j][6], words[j][7]);
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
      // NOTES: the next row's x is loaded after this row's stores (below), and the compiler
      // leaves those loads there (in the general kernel it issues them at the top of the
      // iteration, into registers of their own: the stash kernel's instantiations spilled with
      // such registers at 72 and 80, NVRTC 12). So one thread asks for the block's next row
      // into L2 here, one bulk prefetch, once this row has arrived (every lane sum is in its
      // warp's slot), so that it streams from DRAM while this row is worked on and does not
      // share the bandwidth with this row's own loads. Issued at the top of the iteration
      // instead (fused step 19), where it slowed the row it overlapped, it was skipped for a
      // block's last-but-one row; here every row with a next one prefetches it: RMSNorm at
      // M = 1024 / 2048 / 4096 (K = 7168, without PDL) 9.51-9.63 / 16.49-16.74 / 28.20-28.30
      // -> 9.38-9.45 / 15.59-15.61 / 27.24-27.52 us (docs/perf.md, fused step 26)
      if (t == 0 && more) {
        const u32 next = flat + gridDim.x;
        const u32 next_batch = p.batches == 1u ? 0u : next / p.rows;
        prefetch_l2(static_cast<const Storage*>(p.x) + next_batch * p.x_batch_stride +
                        (next - next_batch * p.rows) * p.x_row_stride,
                    static_cast<u32>(k) * In::kBytes);
      }
    }
    // r = 1 / sqrt(mean + eps): one warp computes it and passes it on through shared memory
    // behind a second barrier, about 80 instructions a row fewer in each other warp (fused step
    // 19 for walking blocks; step 21 for a block a row, whose SMs are as busy issuing once the
    // rows have arrived: git show edcea8b:docs/experiments/norm_timeline.py)
    float r = 0.0f;
    if (t < 32) {
      const float total = warp_fold(warp_slot ? warp_sums[set][t & 31] : 0.0f);
      const float mean = div_rn(total, static_cast<float>(lanes * kValues));
      r = div_rn(1.0f, sqrt_rn(add_rn(mean, p.eps_norm)));
      if (t == 0) row_r[set] = r;
    }
    __syncthreads();
    r = row_r[set];
    u8* q_batch = p.q + batch * p.q_batch_stride;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      // NOTES: packed lanes (!kFloat): a product is NaN only if x, the weight or r is NaN or
      // Inf (|x * r| stays below sqrt(K) times a few ulps, so it cannot overflow, and x * r * w
      // then only to Inf); a finite lane sum means finite x, and r is finite unless the total
      // is NaN. So only such lanes test their results for NaN (about 12 instructions a lane).
      const bool maybe_nan =
          !(lane_sums[j] <= 3.4028234663852886e38f && r <= 3.4028234663852886e38f) || weight_nonfinite[j];
      FloatLane<kValues> y;
      auto normalize = [&](auto weight_of) {
        if constexpr (kFloat) {
          normalize_lane<kIn>(words[j], weight_of, r, y);
        } else {
          normalize_lane<kIn>(words[j], weight_of, r, maybe_nan);
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
            p, y, 0xffffffffu, true, q_dst, in_row[j], scale_at, in_row[j] && lane == 0, group[j]);
      } else {
        quantize_group<kIn, kGroup, kOut, kScale, kLayout, true>(
            p, words[j], 0xffffffffu, true, q_dst, in_row[j], scale_at, in_row[j] && lane == 0, group[j]);
      }
    }

    if (!more) break;
    flat += gridDim.x;
    load_row(flat, batch, row, words, other);
  }
}

// NOTES: registers: one lane a thread fits 64 (two 448-thread blocks an SM at K = 7168, and
// 1024-thread blocks at all); two lanes fit 72 (four 224-thread blocks an SM: a sub-partition's
// 16384 registers hold its seven warps of 72), float32 input to the blocked layout 80 (four
// words spilled at 72): three blocks. Before fused step 18 two lanes held the walking block's
// next row too and needed 80 (three words spilled at 72) and 88, three blocks an SM; 88 would
// have cost one (five warps of 88 a sub-partition, not six: fused step 16)
template <int kIn, int kLayout, int kPer>
constexpr int norm_registers() {
  return kPer == 1 ? 64 : kIn == kF32 && kLayout == kBlockedExponents ? 80 : 72;
}

// kStash: the walking kernel for 16-bit input without a residual: the launch gives it
// kPer * 64 bytes of dynamic shared memory a thread for its weight values as float32, and one
// thread prefetches the block's next row into L2 (norm_rows;
// _launch.norm_stash_bytes, fused step 19)
// NOTES: its own instantiation: as a path of the general kernel it pushed up to 19 of the 112
// two-lane instantiations of 16-bit input past 72 registers (4-20 bytes spilled, offline,
// NVRTC 12, sm_90), different ones with each change
template <int kIn, int kGroup, int kOut, int kScale, int kLayout, int kPer, bool kStash>
__global__ void __maxnreg__((norm_registers<kIn, kLayout, kPer>()))
    quantize_norm(const __grid_constant__ Params p) {
  static_assert(kPer == 1 || kPer == 2, "lanes a thread");
  static_assert(!kStash || Input<kIn>::kBytes == 2, "the stash holds unpacked 16-bit values");
  __shared__ float warp_sums[2][32];
  __shared__ float row_r[2];
  extern __shared__ float4 norm_stash[];  // kStash: the weight as float32
  if (blockIdx.x >= p.batches * p.rows) return;  // whole blocks, before any barrier
  if constexpr (kStash) {
    norm_rows<kIn, kGroup, kOut, kScale, kLayout, kPer, false, true>(p, warp_sums, row_r, norm_stash);
  } else if (p.residual != nullptr) {
    norm_rows<kIn, kGroup, kOut, kScale, kLayout, kPer, true, false>(p, warp_sums, row_r, norm_stash);
  } else {
    norm_rows<kIn, kGroup, kOut, kScale, kLayout, kPer, false, false>(p, warp_sums, row_r, norm_stash);
  }
}

// NVFP4: e2m1 codes two to a byte, e4m3 scales in the blocked layout ------------------------
// NOTES: a group is 16 values, one 32-byte lane of 16-bit input (two of float32), so a thread
// owns a group (or half of one): the one-pass grid's slot numbering with one-row tiles, no
// loop. The arithmetic is docs/spec.md section 4a, one IEEE float32 operation per step; the
// divisions by d take the exact reciprocal path of divide_fast where d >= 2^-80.

// the global scale of the launch (after wait_for_producer: it may come from the device)
__device__ __forceinline__ float nvfp4_global(const Params& p) {
  if (p.global_mode == 0u) return p.global_scale;
  if (p.global_mode == 1u) return *static_cast<const float*>(p.global_ptr);
  const u32 amax_bits = *static_cast<const u32*>(p.global_ptr);
  // NOTES: compared as bits: CuPy compiles with -ftz=true, where a subnormal amax == 0.0f
  if (amax_bits == 0u) return 1.0f;
  const float amax = __uint_as_float(amax_bits);
  const float g = div_rn(448.0f * 6.0f, amax);
  return g == __int_as_float(0x7f800000) ? 3.4028234663852886e38f : g;
}

template <int kIn>
__global__ void __launch_bounds__(kMaxThreads) quantize_nvfp4(const __grid_constant__ Params p) {
  typedef Input<kIn> In;
  typedef typename In::Storage Storage;
  constexpr int kValues = kLaneWords * 4 / In::kBytes;  // 16 (16-bit input) or 8 (float32)
  constexpr int kLanes = 16 / kValues;
  typedef ScaleLayout<kBlockedExponents> Layout;

  const u32 slot_in_grid = blockIdx.x * (blockDim.x / kLanes) + threadIdx.x / kLanes;
  const int lane = threadIdx.x % kLanes;
  const bool active = slot_in_grid < p.slots;
  const u32 slot = min(slot_in_grid, p.slots - 1u);
  const u32 flat_row = divide_u31(slot, p.tile_slots_magic, p.tile_slots_shift);
  const int group = static_cast<int>(slot - flat_row * static_cast<u32>(p.groups_per_row));
  const u32 batch = divide_u31(flat_row, p.batch_tiles_magic, p.batch_tiles_shift);
  const u32 row = flat_row - batch * p.rows;
  u32 words[kLaneWords];
  wait_for_producer();
  load_lane<kIn, true>(static_cast<const Storage*>(p.x) + batch * p.x_batch_stride +
                           row * p.x_row_stride + group * 16 + lane * kValues, words);
  const float g = nvfp4_global(p);
  signal_dependents();
  if (active && row == p.rows - 1u) Layout::zero_rows(p, batch, row + 1u, group, lane, kLanes);
  if (p.global_mode == 2u && slot_in_grid == 0u && lane == 0) {
    *reinterpret_cast<float*>(p.global_out) = g;
  }

  // amax over the finite values (the slow path only for a warp holding Inf or NaN, as in
  // quantize_group), then s, S and d
  u32 magnitude = group_max<kLanes>(In::max_magnitude(words), 0xffffffffu);
  const bool nonfinite = magnitude >= In::kInf;
  if (__builtin_expect(__any_sync(0xffffffffu, nonfinite), 0)) {
    const u32 finite = group_max<kLanes>(max_finite_magnitude<kIn>(words), 0xffffffffu);
    if (nonfinite) magnitude = finite;
  }
  const float amax = In::magnitude_to_f32(magnitude);
  // RN(RN(g * amax) / 6): Markstein's division by 6 with RN(1/6), exact where divide_by_max is
  const float u = divide_by_max(mul_rn(g, amax), kE2M1Max, __uint_as_float(0x3e2aaaabu));
  const u32 s_byte = e4m3_byte(u);
  // d = RN(S / g): the reciprocal path while S / g stays normal (S >= 2^-9 or 0)
  const float S = e4m3_value(s_byte);
  const float d = g >= kMinFastDivisor && g <= 1.152921504606847e18f  // 2^60
                      ? divide_fast(S, g, rcp_rn(g))
                      : div_rn(S, g);
  // NOTES: with u <= 448 the scale did not saturate, so |v / d| <= amax / d stays below 10
  // (S is at least u / 1.5 where it is a subnormal e4m3, 2^-9 and up): no quotient overflows
  // and Markstein's path is exact. Saturated scales, d = 0 and d < 2^-80 take div.rn.
  const bool fast = d >= kMinFastDivisor && u <= kE4M3Max;

  // |RN(v / d)|: the reciprocal path for every value (one uniform branch; Markstein's three
  // operations, the sign left out), or the rare cases one value at a time. The code's sign is
  // v's (d > 0, or t = v * 0), which keeps -0 and negative values that round to zero at 8.
  float m[kValues];
  if (fast) {
    const float r = rcp_rn(d);
#pragma unroll
    for (int i = 0; i < kValues; ++i) {
      const float v = __uint_as_float(In::f32_bits(words, i));
      const float q = mul_rn(v, r);
      m[i] = fabsf(fma_rn(fma_rn(-q, d, v), r, q));
    }
  } else {
#pragma unroll
    for (int i = 0; i < kValues; ++i) {
      const float v = __uint_as_float(In::f32_bits(words, i));
      m[i] = fabsf(__float_as_uint(d) == 0u ? 0.0f : div_rn(v, d));  // d >= 0; bits, not -ftz
    }
  }
  u32 packed[kValues / 8];
#pragma unroll
  for (int w = 0; w < kValues / 8; ++w) {
    u32 codes[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const u32 sign = (In::raw(words, 8 * w + j) & In::kSign) != 0u ? 8u : 0u;
      codes[j] = e2m1_magnitude(m[8 * w + j]) | sign;
    }
    packed[w] = pack_nibbles(codes);
  }
  if (__builtin_expect(nonfinite, 0)) {  // NaN: +0; +-Inf: +-6
#pragma unroll
    for (int i = 0; i < kValues; ++i) {
      const u32 raw = In::raw(words, i), magnitude_i = raw & (In::kSign - 1u);
      if (magnitude_i >= In::kInf) {
        const u32 code = magnitude_i == In::kInf ? (7u | ((raw & In::kSign) != 0u ? 8u : 0u)) : 0u;
        const int shift = 4 * (i % 8);
        packed[i / 8] = (packed[i / 8] & ~(0xfu << shift)) | (code << shift);
      }
    }
  }
  if (!active) return;
  u8* q = p.q + batch * p.q_batch_stride + row * (static_cast<i64>(p.groups_per_row) * 8) +
          group * 8 + lane * (kValues / 2);
  if constexpr (kValues == 16) {
    *reinterpret_cast<uint2*>(q) = make_uint2(packed[0], packed[1]);
  } else {
    *reinterpret_cast<u32*>(q) = packed[0];
  }
  Layout::store_at(Layout::at(p, batch, row, group), p, group, 0.0f, s_byte, true, lane == 0);
}

// the largest finite magnitude of x, as float32 bits, into *global_ptr (zeroed before): the
// computed global scale's one extra pass over x
template <int kIn>
__global__ void __launch_bounds__(kMaxThreads) nvfp4_amax(const __grid_constant__ Params p) {
  typedef Input<kIn> In;
  typedef typename In::Storage Storage;
  constexpr int kValues = kLaneWords * 4 / In::kBytes;
  const u32 lanes_per_row = static_cast<u32>(p.groups_per_row) * (16 / kValues);
  wait_for_producer();
  u32 best = 0u;
  for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < p.slots; i += gridDim.x * blockDim.x) {
    const u32 flat_row = divide_u31(i, p.tile_slots_magic, p.tile_slots_shift);
    const u32 batch = divide_u31(flat_row, p.batch_tiles_magic, p.batch_tiles_shift);
    const u32 row = flat_row - batch * p.rows;
    const u32 column = i - flat_row * lanes_per_row;
    u32 words[kLaneWords];
    load_lane<kIn, true>(static_cast<const Storage*>(p.x) + batch * p.x_batch_stride +
                             row * p.x_row_stride + column * kValues, words);
    best = max(best, __float_as_uint(In::magnitude_to_f32(max_finite_magnitude<kIn>(words))));
  }
  signal_dependents();
  best = group_max<32>(best, 0xffffffffu);
  if ((threadIdx.x & 31u) == 0u && best != 0u) atomicMax(static_cast<u32*>(const_cast<void*>(p.global_ptr)), best);
}

}  // namespace fgq
