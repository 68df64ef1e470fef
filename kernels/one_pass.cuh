// The one-pass grid walk of quantize_groups: one group slot per lane set, no loop.
// NOTES: the other walks, the row loop and the masked layout's persistent walk, are written in
// their kernels (quantize.cu): moved into functions, they compiled to other code, since the
// compiler treats loads through a reference to the parameters unlike loads of the kernel's own
// parameter (it speculates only the latter). This one was a function from the start.
#pragma once
#include "activation.cuh"
#include "common.cuh"
#include "formats.cuh"
#include "group.cuh"
#include "layouts.cuh"

namespace fgq {

// NOTES: for grids of a few waves. The slots of the grid are
// numbered flat over (batch, row tile, group, row of the tile), so every block but the last is
// full whatever K is, and a slot finds its place with two multiplicative divisions (no branch,
// no division instruction). Every lane stays to the end, so the shuffles name the whole warp
// (plain SHFL, no convergence checks); a slot past the end, or on a row past the last of a
// partial tile, works on a clamped one and stores nothing. Only real rows have slots: the last
// row's slots also zero the padding rows below. kFlat (_plan.flat_slots: plain input, one-row
// tiles, rows K apart, batches rows * K apart): slot s's values start at x + s * G, so the load
// is issued before the divisions, which only the stores need
template <int kIn, int kGroup, int kOut, int kScale, int kLayout, bool kVec16, int kAct, bool kFlat,
          int kArith, typename Table>
__device__ __forceinline__ void one_pass_group(const Params& p, Table& table) {
  typedef ActivationTrait<kAct> Act;
  typedef typename Input<kIn>::Storage Storage;
  constexpr int kValues = kLaneWords * 4 / Input<kIn>::kBytes;
  constexpr int kLanes = kGroup / kValues;
  const int lane = threadIdx.x % kLanes;
  const int tile_rows_log2 = p.tile_rows_log2;
  // the slot: past the grid's last slot, a lane works on the last one and stores nothing
  const u32 slot_in_grid = blockIdx.x * p.block_slots + threadIdx.x / kLanes;
  const bool in_grid = slot_in_grid < p.slots;
  const u32 slot = min(slot_in_grid, p.slots - 1u);
  const Storage* x = static_cast<const Storage*>(p.x);
  u32 words[kLaneWords];
  u32 up[kLaneWords];
  // load
  // NOTES: PDL: nothing global is read or written before the producer of x is done (the
  // previous kernel may also still read q and the scales), but the activation's table,
  // constant data copied before the loads (BandTable); once our loads are issued the next
  // kernel may start its prologue
  table.start(p.table_by_threads != 0u);
  wait_for_producer();
  if constexpr (kFlat) {
    Act::template load<kIn, kVec16>(p, x + static_cast<i64>(slot) * kGroup + lane * kValues, words,
                                    up);
  }
  // where the slot lies: batch, row, group
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
    Act::template load<kIn, kVec16>(
        p, x + static_cast<i64>(batch) * p.x_batch_stride32 +
               static_cast<i64>(static_cast<int>(read_row)) * p.x_row_stride32 + value0, words,
        up);
  }
  signal_dependents();
  // the values
  table.wait(p.table_by_threads != 0u);
  Act::template apply<kIn>(words, up, table);
  u8* q_batch = p.q + batch * p.q_batch_stride + value0;
  // the stores' addresses
  // NOTES: computed here, while the load is in flight, and pinned (an empty asm that
  // "modifies" them): the compiler otherwise recomputes them after the group's dependent
  // chain, about 40 instructions between the codes and their stores (docs/perf.md)
  u8* q_dst = q_batch + row * k;
  u8* scale_at = ScaleLayout<kLayout>::at(p, batch, row, group);
  u32 stores = active ? (lane == 0 ? 3u : 1u) : 0u;  // bit 0: the codes, bit 1: the scale
  asm volatile("" : "+l"(q_dst), "+l"(scale_at), "+r"(stores));
  __builtin_assume(__isGlobal(q_dst));
  __builtin_assume(__isGlobal(scale_at));
  // zero the padding rows
  // NOTES: the padding rows of q and the scales get their zeros from the last real row's
  // slots, while the loads are in flight: stores issued after the group's dependent chain
  // would lengthen the kernel's tail (docs/perf.md)
  if (active && row == p.rows - 1u) {
    zero_padding_rows<kValues, kLanes, kLayout>(p, q_batch, k, batch, row, group, lane);
  }
  // quantize and store
  quantize_group<kIn, kGroup, kOut, kScale, kLayout, true, Act::kUnsignedNaN, true, kArith>(
      p, words, kAllLanes, true, q_dst, stores & 1u, scale_at, stores & 2u, group);
}

}  // namespace fgq
