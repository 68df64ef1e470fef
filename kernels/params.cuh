// The arguments of quantize_groups, passed by value as one struct.
//
// NOTES: this is the one definition. _launch.py builds its ctypes mirror by reading the fields
// below (one `type name;` per line, in order), and tests/test_compile.py compiles static_asserts
// that every size and offset of the mirror matches this struct. Keep one field per line.
#pragma once
#include "common.cuh"

namespace fgq {

struct Params {
  // NOTES: the first 48 bytes (c[0x0][0x210] to 0x23f on sm_90: one 64-byte line of the
  // constant cache) hold all that the one-pass kernel reads before its load; each further
  // line read there cost 0.03-0.07 us at small M, and the kernel read two (docs/perf.md step
  // 22). Hence the 32-bit copies of x's strides (the launch layer takes the row loop for wider
  // ones), the bytes for the shifts, and block_slots, which spares the kernel blockDim.x, read
  // from the driver's line of the bank (c[0x0][0x0], step 26). Every field the plain kernel reads after the load ends
  // before x_up_offset, in lines the prologue already touches: a field alone in its line
  // (floor_emax was, at 0x2dc) is first read after the group's shuffles, and its miss sits on
  // the dependent chain (step 18)
  const void* x;        // input values
  int x_row_stride32;   // one pass: x_row_stride (when it fits 32 bits)
  int x_batch_stride32; // one pass: x_batch_stride (when it fits 32 bits)
  u32 slots;              // one pass: group slots, batches * batch_tiles * tile_slots
  u32 tile_slots;         // group slots of a row tile, groups_per_row << tile_rows_log2
  u32 tile_slots_magic;   // n / tile_slots by divide_u31
  u32 batch_tiles;        // row tiles per batch, ceil(rows / tile rows)
  u32 batch_tiles_magic;  // n / batch_tiles by divide_u31
  u32 rows;             // real rows per batch (M)
  u8 tile_slots_shift;  //   tile_slots_magic's shift
  u8 batch_tiles_shift; //   batch_tiles_magic's shift
  u8 tile_rows_log2;    // a row tile holds 2^tile_rows_log2 consecutive rows
  u8 block_slots;       // one pass: group slots a block, its threads / lanes a group
  int groups_per_row;   // K / G
  i64 x_batch_stride;   // input elements between batches
  i64 x_row_stride;     // input elements between rows
  u8* q;                // codes, one byte each
  i64 q_batch_stride;   // bytes of q between batches (rows are K bytes apart)
  u32 grid_rows;        // rows per batch the kernel visits; [rows, grid_rows) are padding
  u32 batches;          // batches (B)
  float eps;            // floor of the group maximum
  u8* scales;           // scale storage; the layout's address function places each scale
  i64 s_batch_stride;   // bytes of scale storage between batches
  i64 s_row_stride;     // bytes of scale storage between rows (blocked: between row tiles)
  i64 s_word_stride;    // bytes between the scale words of one row (blocked: group tiles)
  u32 q_rows;           // rows of q storage per batch: padding rows below it are zeroed
  u32 scale_rows;       // rows of scale storage per batch: padding rows below it are zeroed
  float fmax;           // the output format's clamp
  float inverse_fmax;   // RN(1 / fmax)
  float ue8m0_floor;    // floor of amax / fmax before the power-of-two ceiling
  u32 nonfinite_codes;  // codes of +NaN, -NaN, +Inf, -Inf, one byte each from the lowest
  u32 floor_emax;       // scale_rule="floor": the format's emax_elem; 0 for "rceil"
  u32 masked_i64;       // masked layout: 1 when masked_m holds int64 counts
  i64 x_up_offset;      // fused SiLU-and-multiply: elements from a gate value to its up value
  u32 table_by_threads; // fused SiLU-and-multiply, one pass: every thread copies a piece of the
                        //   block's table (1) rather than one bulk copy (0); kernels/activation.cuh
  const void* masked_m; // masked layout: rows of each batch to quantize (int32 or int64), or 0
  const void* weight;   // fused RMSNorm: the weight [K], x's type
  u8* residual;         // fused add-RMSNorm: x + residual is written back here; 0 without
  i64 r_batch_stride;   // fused add-RMSNorm: residual elements between batches
  i64 r_row_stride;     // fused add-RMSNorm: residual elements between rows
  float eps_norm;       // fused RMSNorm: added to the mean square
  u32 global_mode;      // NVFP4: global_scale (0), *global_ptr (1), from amax at *global_ptr (2)
  float global_scale;   // NVFP4: the global scale, in mode 0
  const void* global_ptr;  // NVFP4: see global_mode (nvfp4_amax writes amax there)
  u8* global_out;       // NVFP4, mode 2: the computed global scale (float32) is written here
};

}  // namespace fgq
