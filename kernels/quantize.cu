// The kernels' entry points: the __global__ templates that Python instantiates by name
// (_plan.KernelKey.name_expression, _plan.nvfp4_amax_name). What they are built from:
//   common.cuh      integer types, numbers, exact float32 arithmetic, warp and launch helpers
//   formats.cuh     input types, the lanes of values the quantizer reads, output encodings,
//                   UE8M0 scales
//   layouts.cuh     where the scale of (batch, row, group) is stored, and the padding zeros
//   activation.cuh  the activation trait (kIdentity, kSiluMul, kGeluTanhMul): the gated
//                   activations' arithmetic and tables
//   group.cuh       the per-group work: the maximum, the scale, the codes and their stores
//   one_pass.cuh    quantize_groups' one-pass grid walk
//   norm.cuh        RMSNorm's arithmetic and quantize_norm's walk over the rows
//   fp4.cuh         the FP4 formats (NVFP4, MXFP4): e2m1 codes, the bodies of their kernels
//   tile.cuh        128x128 tiles: weight blocks, the column-wise orientation and "both"
//
// quantize_groups: every input type, group size, output format, scale layout and activation,
// two grid walks from one template (docs/perf.md). kOnePass: the group slots of the real rows
// are numbered flat over a 1-D grid, one group per lane set and no loop, so every block but the
// last is full whatever K is; the plan takes it for every grid of the instantiations that fit
// six blocks an SM (min_blocks_per_sm) and for grids of a few waves of the others. Otherwise
// the row loop: a block covers a tile of tile_rows consecutive rows by groups_per_block groups,
// y splits a row's groups over blocks, and x holds a few resident waves of blocks that walk the
// row tiles with a stride of the grid, each lane loading its next row before it quantizes the
// current one, which keeps more bytes in flight for the heavier instantiations. In both, the
// slots of a tile run rows fastest, so with tile_rows > 1 a warp holds the same groups of
// consecutive rows and the column-major scale layouts are stored as contiguous runs (one
// sector for eight float scales) instead of one scattered 4-byte store per group.
// Rows in [rows, grid_rows) of each batch are padding rows: the kernel writes zeros there (to q
// below q_rows, to the scales below scale_rows), so callers may allocate with empty and no memset
// is launched. The one-pass path has no slots for them: the last real row's slots write them.
//
// quantize_masked: the masked MoE layout's persistent kernel over the same per-group work.
// quantize_norm: the fused (add-)RMSNorm. quantize_fp4: NVFP4 and MXFP4; nvfp4_amax: NVFP4's
// computed global scale.
//
// NOTES: the row loop and the masked walk are written inside their kernels, not in functions
// beside the one-pass walk: moved into functions that take the parameters by reference, they
// compiled to different code (one_pass.cuh).
#include "activation.cuh"
#include "common.cuh"
#include "formats.cuh"
#include "fp4.cuh"
#include "group.cuh"
#include "layouts.cuh"
#include "norm.cuh"
#include "one_pass.cuh"
#include "tile.cuh"

namespace fgq {

// quantize_groups ---------------------------------------------------------------------------------

// resident blocks of 256 threads an SM that quantize_groups is compiled for
// NOTES: six resident blocks of 256 threads cap a kernel at 40 registers, five at 48. The lean
// instantiations (16-bit input to float8 with power-of-two scales, vector loads) fit 40 with no
// spill and keep six blocks, in both paths. So does the one-pass path of every vector-load
// instantiation of plain input (it computes its store addresses once: one_pass_group), and it
// takes six where that is faster (below); the fused SiLU path keeps five (its trait's
// kSixBlocks). In the row loop, int8 output, exact float scales and float32 input, and anywhere
// the element-wise load fallback, need up to 48 and spill 4 to 56 bytes at 40 (ptxas -v), so
// they take five: no instantiation spills (tests/test_compile.py checks it for sm_90).
template <int kIn, int kOut, int kScale, bool kVec16, bool kOnePass, int kAct>
constexpr int min_blocks_per_sm() {
  constexpr bool lean = kIn != kF32 && Output<kOut>::kLean && kScale != kFloat32Scale;
  // one pass at six blocks: faster for int8 and float32 input (int8 with UE8M0 scales at
  // M = 8192: 1.02x the headline's time per byte, against 1.06x at five), slower for exact
  // float scales of 16-bit input (1.09-1.15x against 1.07x: their three extra instructions a
  // value want the row loop's prefetch), which keep five blocks and the row loop past 16 waves
  // (docs/perf.md)
  constexpr bool one_pass_six = kOnePass && (kScale != kFloat32Scale || kIn == kF32);
  return kVec16 && ActivationTrait<kAct>::kSixBlocks && (lean || one_pass_six) ? 6 : 5;
}

// kBlocks: resident blocks of kMaxThreads threads an SM the compiler fits the kernel to; 0 takes
// min_blocks_per_sm's. The one-pass bfloat16 SiLU-and-multiply kernels have a second
// instantiation at six (40 registers, against 48 at five) for large grids
// NOTES: at 40 registers that kernel is 3-5% faster from M = 896 (N = 7168: more blocks an SM,
// more bytes in flight) and 5-7% slower at M = 512, where each block's longer chain shows; so
// the plan takes it past Tuning.silu_six_blocks_waves (docs/perf.md). kFlat: the one-pass
// kernel of plain input with the load linear in the slot (one_pass_group), which the plan takes
// for contiguous rows (_plan.flat_slots). kArith: an upstream's arithmetic (group.cuh's
// ArithmeticMode: FlashInfer's MXFP8, docs/spec.md section 3b; torchao's, section 3c),
// instantiations of its own
template <int kIn, int kGroup, int kOut, int kScale, int kLayout, bool kVec16, bool kOnePass,
          int kAct, int kBlocks = 0, bool kFlat = false, int kArith = kDefaultArith>
__global__ void __launch_bounds__(kMaxThreads,
                                  (kBlocks != 0 ? kBlocks
                                                : min_blocks_per_sm<kIn, kOut, kScale, kVec16, kOnePass, kAct>()))
    quantize_groups(const __grid_constant__ Params p) {
  typedef ActivationTrait<kAct> Act;
  typedef Input<kIn> In;
  typedef typename In::Storage Storage;
  constexpr int kValues = kLaneWords * 4 / In::kBytes;  // 16 (16-bit input) or 8 (float32)
  constexpr int kLanes = kGroup / kValues;              // lanes per group
  static_assert(kLanes >= 2 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "lanes per group");
  static_assert(kLayout != kPackedExponents || kScale == kUE8M0Scale,
                "a packed word holds UE8M0 exponent bytes only");
  static_assert(!kFlat || (kOnePass && Act::kInputs == 1),
                "the linear load: plain input, one pass");

  const int lane = threadIdx.x % kLanes;
  const int tile_rows_log2 = p.tile_rows_log2;
  __shared__ typename Act::template Table<kIn> table;
  // NOTES: the one-pass path starts the table's copy before its loads and waits for it (a
  // barrier) after them: a barrier before them would hold them back (docs/perf.md). The row
  // loop fills it here, before any thread returns
  if constexpr (!kOnePass) table.fill();

  if constexpr (kOnePass) {
    one_pass_group<kIn, kGroup, kOut, kScale, kLayout, kVec16, kAct, kFlat, kArith>(p, table);
    return;
  }

  // the row loop
  const int slot = threadIdx.x / kLanes;  // the group slot: rows fastest, then groups
  const int groups_per_block = blockDim.x / kLanes >> tile_rows_log2;
  const int slot_group = blockIdx.y * groups_per_block + (slot >> tile_rows_log2);
  // the slot's first row over all batches
  const u32 slot_row = (blockIdx.x << tile_rows_log2) + (slot & ((1 << tile_rows_log2) - 1));

  // each slot walks the rows (padding rows included) of all batches with a stride of the grid,
  // loading the next row before it quantizes the current one, so loads stay in flight while it
  // computes
  const int group = slot_group;
  const u32 row_step = gridDim.x << tile_rows_log2;
  const u32 rows = p.rows, grid_rows = p.grid_rows, batches = p.batches;
  // whole groups leave together, so the shuffle masks stay complete
  if (group >= p.groups_per_row || slot_row >= batches * grid_rows) return;
  const i64 k = static_cast<i64>(p.groups_per_row) * kGroup;
  const i64 value0 = static_cast<i64>(group) * kGroup + lane * kValues;
  const u32 warp_lane = threadIdx.x & 31u;
  const u32 mask = kLanes == 32 ? kAllLanes
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
    // quantize and store this row's group
    quantize_group<kIn, kGroup, kOut, kScale, kLayout, false, Act::kUnsignedNaN, false, kArith>(
        p, words, mask, row < rows, p.q + batch * p.q_batch_stride + row * k + value0,
        row < p.q_rows, ScaleLayout<kLayout>::at(p, batch, row, group),
        lane == 0 && row < p.scale_rows, group);

    if (next_batch >= batches) break;
    batch = next_batch;
    row = next_row;
  }
}

// quantize_masked: the masked MoE layout, x [E, T, K], only rows t < masked_m[e] of expert e ------
// NOTES: a persistent grid whose work scales with sum(masked_m), not with E * T, and which
// reads masked_m on the device (no host synchronisation, so a CUDA graph replays it with new
// counts). Each block clamps the counts to [0, T] and scans their row tiles (in each warp's
// lanes for up to 32 experts, else into shared memory); the group slots of the real tiles are
// numbered as in the one-pass kernel and walked with a stride of the grid; a slot finds its
// expert by two ballots over the lanes or by binary search. Rows at or past masked_m[e], and
// TMA padding rows, are not written. Without masked_m (a null pointer) every batch has p.rows
// rows: the plain fused SiLU-and-multiply path's grid for large inputs without padding rows,
// one table copy per resident block instead of one per 16 groups (_plan.fused_takes_persistent;
// docs/perf.md).
template <int kIn, int kGroup, int kOut, int kScale, int kLayout, int kAct>
__global__ void __launch_bounds__(kMaskedThreads, 8) quantize_masked(const __grid_constant__ Params p) {
  typedef ActivationTrait<kAct> Act;
  typedef Input<kIn> In;
  typedef typename In::Storage Storage;
  constexpr int kValues = kLaneWords * 4 / In::kBytes;
  constexpr int kLanes = kGroup / kValues;
  constexpr int kWarps = kMaskedThreads / 32;
  __shared__ typename Act::template Table<kIn> table;
  __shared__ u32 first_tile[kMaxExperts + 1];  // row tiles of the experts before e
  __shared__ u32 expert_rows[kMaxExperts];     // clamped masked_m
  __shared__ u32 warp_totals[kWarps];
  table.fill();

  // the experts' row counts and the scan of their row tiles
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
      const u32 before = __shfl_up_sync(kAllLanes, value, offset);
      if (warp_lane >= static_cast<u32>(offset)) value += before;
    }
    return value;
  };
  // NOTES: with at most 32 experts, and a block's slots of one step within two row tiles, each
  // warp scans the counts in its own lanes (lane e: expert e's rows and first tile) and keeps
  // a copy in shared memory for itself, with no barrier, and a slot finds its expert by two
  // ballots over the lanes (the experts whose first tile is at or before each of the two
  // tiles) and a population count, where the general path searches the scan in shared memory
  // (five dependent reads).
  // One expert (the plain fused path's usual single batch, or E = 1) needs neither: every
  // thread clamps its count and each slot's expert is 0
  const bool single = experts == 1u;  // uniform
  const bool in_lanes = !single && experts <= 32u && slots_per_block <= tile_slots;  // uniform
  wait_for_producer();  // PDL: masked_m and x may come from the previous kernel
  u32 lane_first = 0xffffffffu, total_tiles, single_rows = 0u;  // lane_first: none past the experts
  if (single) {
    single_rows = clamped_rows(0u);
    total_tiles = (single_rows + tile_rows - 1u) >> tile_rows_log2;
  } else if (in_lanes) {
    const u32 rows = warp_lane < experts ? clamped_rows(warp_lane) : 0u;
    const u32 tiles = (rows + tile_rows - 1u) >> tile_rows_log2;
    const u32 inclusive = warp_scan(tiles);
    if (warp_lane < experts) lane_first = inclusive - tiles;
    total_tiles = __shfl_sync(kAllLanes, inclusive, 31);
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

  // the walk over the group slots
  const u32 total_slots = total_tiles * tile_slots;
  const u32 grid_slots = gridDim.x * slots_per_block;
  const int lane = threadIdx.x % kLanes;
  const i64 k = static_cast<i64>(p.groups_per_row) * kGroup;
  // NOTES: `base` is uniform over the block, so every lane runs every iteration and the
  // shuffles name the whole warp; a slot past the end works on the last one and stores nothing.
  // Each iteration takes kUnroll slots a grid apart and issues all their loads before it
  // quantizes any, so a persistent block keeps as many bytes in flight as the one-pass kernel's
  // fuller grid
  constexpr int kUnroll = Act::kMaskedSlots;
  for (u32 base = blockIdx.x * slots_per_block; base < total_slots; base += kUnroll * grid_slots) {
    u32 words[kUnroll][kLaneWords], up[kUnroll][kLaneWords];
    u32 batch[kUnroll], row[kUnroll];
    int group[kUnroll];
    bool active[kUnroll];
    // each slot's expert and row, and its loads
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
        const u32 at_first = __ballot_sync(kAllLanes, lane_first <= block_tile);
        const u32 at_next = __ballot_sync(kAllLanes, lane_first <= block_tile + 1u);
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
      Act::template load<kIn, true>(
          p, static_cast<const Storage*>(p.x) + lo * p.x_batch_stride +
                 min(row[u], rows - 1u) * p.x_row_stride + static_cast<i64>(group[u]) * kGroup +
                 lane * kValues, words[u], up[u]);
    }
    // the values, quantized and stored
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      Act::template apply<kIn>(words[u], up[u], table);
      const i64 value0 = static_cast<i64>(group[u]) * kGroup + lane * kValues;
      quantize_group<kIn, kGroup, kOut, kScale, kLayout, true, Act::kUnsignedNaN>(
          p, words[u], kAllLanes, true, p.q + batch[u] * p.q_batch_stride + row[u] * k + value0,
          active[u], ScaleLayout<kLayout>::at(p, batch[u], row[u], group[u]),
          active[u] && lane == 0, group[u]);
    }
  }
}

// quantize_norm -----------------------------------------------------------------------------------

// the register cap of quantize_norm
// NOTES: one lane a thread fits 64 (two 448-thread blocks an SM at K = 7168, and 1024-thread
// blocks at all); two lanes fit 72 (four 224-thread blocks an SM: a sub-partition's 16384
// registers hold its seven warps of 72), float32 input to the blocked layout 80 (four words
// spill at 72): three blocks. 88 would cost one more (five warps of 88 a sub-partition, not six)
template <int kIn, int kLayout, int kPer>
constexpr int norm_registers() {
  return kPer == 1 ? 64 : kIn == kF32 && kLayout == kBlockedExponents ? 80 : 72;
}

// kPer: 32-byte lanes a thread (1 or 2). kStash: the walking kernel for 16-bit input without a
// residual: the launch gives it kPer * 64 bytes of dynamic shared memory a thread for its
// weight values as float32, and one thread prefetches the block's next row into L2 (norm_rows;
// _plan.norm_stash_bytes)
// NOTES: its own instantiation: as a path of the general kernel it pushed up to 19 of the 112
// two-lane instantiations of 16-bit input past 72 registers (4-20 bytes spilled, sm_90),
// different ones with each change
template <int kIn, int kGroup, int kOut, int kScale, int kLayout, int kPer, bool kStash>
__global__ void __maxnreg__((norm_registers<kIn, kLayout, kPer>()))
    quantize_norm(const __grid_constant__ Params p) {
  static_assert(kPer == 1 || kPer == 2, "lanes a thread");
  static_assert(!kStash || Input<kIn>::kBytes == 2, "the stash holds unpacked 16-bit values");
  // norm_rounding="twice_unrounded_sum" with a residual: 16-bit input (float32 input's sum is
  // already the float32 sum) and one lane a thread (norm_rows; _plan.norm_lanes gives it one)
  constexpr bool kUnroundedPath = Input<kIn>::kBytes == 2 && kPer == 1;
  __shared__ float warp_sums[2][32];
  __shared__ float row_r[2];
  extern __shared__ float4 norm_stash[];  // kStash: the weight as float32
  if (blockIdx.x >= p.batches * p.rows) return;  // whole blocks, before any barrier
  if constexpr (kStash) {
    norm_rows<kIn, kGroup, kOut, kScale, kLayout, kPer, kNoResidual, true>(p, warp_sums, row_r, norm_stash);
  } else if (p.residual != nullptr) {
    if (kUnroundedPath && p.norm_rounding == kNormTwiceUnroundedSum) {
      constexpr int kSum = kUnroundedPath ? kUnroundedSum : kRoundedSum;  // compiled only there
      norm_rows<kIn, kGroup, kOut, kScale, kLayout, kPer, kSum, false>(p, warp_sums, row_r, norm_stash);
    } else {
      norm_rows<kIn, kGroup, kOut, kScale, kLayout, kPer, kRoundedSum, false>(p, warp_sums, row_r, norm_stash);
    }
  } else {
    norm_rows<kIn, kGroup, kOut, kScale, kLayout, kPer, kNoResidual, false>(p, warp_sums, row_r, norm_stash);
  }
}

// tiles (tile.cuh) -------------------------------------------------------------------------------

// quantize_weight: one block a kBlock x kBlock weight block (128 or 256); the scale layout is a
// run-time choice (one store a block), so the key is the input type, the format and the scale
// kind, an upstream's arithmetic (kArith: DeepGEMM's or torchao's, docs/spec.md section 3c)
// and the block
template <int kIn, int kOut, int kScale, int kArith = kDefaultArith, int kBlock = kTile>
__global__ void __launch_bounds__(kTileThreads, TileBlocks<kBlock>::kPerSm) quantize_weight_blocks(const __grid_constant__ Params p) {
  weight_block_tile<kIn, kOut, kScale, kArith, kBlock>(p);
}

// orientation "col" (p.q null) and "both" (kTokens = 128): one block a tile of kTokens tokens by
// 128 channels; kArith: torchao's arithmetic (docs/spec.md section 3c) or the default
template <int kIn, int kOut, int kScale, int kLayout, int kArith = kDefaultArith,
          int kTokens = kTile>
__global__ void __launch_bounds__(kTileThreads, TileBlocks<kTokens>::kPerSm) quantize_columns(const __grid_constant__ Params p) {
  column_tile<kIn, kOut, kScale, kLayout, kArith, kTokens>(p);
}

// FP4 (fp4.cuh) -----------------------------------------------------------------------------------

// e2m1 codes two a byte and the scales of kFormat (kNvfp4, kMxfp4: Fp4Kind), stored in kLayout;
// kReciprocal: arithmetic='reciprocal' (vLLM's and FlashInfer's steps, docs/spec.md section 4a)
template <int kIn, int kFormat, int kLayout, bool kReciprocal = false>
__global__ void __launch_bounds__(kMaxThreads) quantize_fp4(const __grid_constant__ Params p) {
  fp4_quantize_group<kIn, kFormat, kLayout, kReciprocal>(p);
}

// NVFP4: the largest finite magnitude of x, for a global scale computed from it
template <int kIn>
__global__ void __launch_bounds__(kMaxThreads) nvfp4_amax(const __grid_constant__ Params p) {
  nvfp4_amax_walk<kIn>(p);
}

}  // namespace fgq
