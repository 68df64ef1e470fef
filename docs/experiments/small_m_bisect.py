"""Experiment (issue 10, session 25): is ours' last 0.01-0.06 us behind SGLang's kernel at
small M in our code, or in what every kernel of ours shares (Params, the launch layer)?

At M = 1 and K = 2048 ours and SGLang's v2 kernel run the same grid (one block of 128 threads,
16 groups), and session 25's run 1 still had ours 0.06 us slower with the PDL attribute off
(1.40 against 1.34 us). Session 9's %globaltimer stamps put the difference between launches,
not inside a warp. This times, beside ours, SGLang's kernel and the roofline kernel, kernels
that take ours' Params and are launched by the library's launch layer (`_launch.Launch`, grid
and block as ours' one-pass path: 128 threads, block_slots slots a block):
- roofp: the roofline kernel's body (two 16-byte loads, one 16-byte store a thread, its
  address linear in the thread) reading x and q from Params; no launch bounds, no PDL
  instructions;
- roofp_gdc: the same with ours' launch bounds (256 threads, six blocks an SM) and ours'
  griddepcontrol.wait before the loads and launch_dependents after them;
- min_nopad: a minimal quantizer of ours' flat path (bf16 to e4m3, packed UE8M0 scales):
  ours' load, group maximum over bf16 bits, shuffles, rceil exponent and encode, the codes'
  and the scale byte's stores; no Inf/NaN path, no padding rows, no zeroed padding bytes
  (not the contract, so not checked against the reference).
And SGLang's kernel with ours' launch bounds (sgl_lb: 256 threads, six blocks an SM; its
blocks have 64 or 128 threads) and with its launch_dependents right after its loads, where ours
has it (sgl_early; it keeps its own at the end, a no-op once signalled).
If roofp times as the roofline kernel and min_nopad as SGLang's, the gap is in ours' code;
if roofp is slower than the roofline kernel, it is in what the launch layer and Params do.
Run from the repository root:
PYTHONPATH=$PWD python3 docs/experiments/small_m_bisect.py SGLANG_V2_CUH [--m=M,...] [K ...]
"""

import harness
import sglang_same_run

from fp8_group_quant import _jit

KERNELS = r"""
namespace fgq {

__global__ void roof_params(const __grid_constant__ Params p) {
  const u32 t = blockIdx.x * (p.block_slots * 8u) + threadIdx.x;
  if (t >= p.slots * 8u) return;
  const uint4* x = static_cast<const uint4*>(p.x) + 2 * static_cast<i64>(t);
  const uint4 a = __ldg(x), b = __ldg(x + 1);
  reinterpret_cast<uint4*>(p.q)[t] = make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
}

__global__ void __launch_bounds__(kMaxThreads, 6)
    roof_params_gdc(const __grid_constant__ Params p) {
  const u32 t = blockIdx.x * (p.block_slots * 8u) + threadIdx.x;
  if (t >= p.slots * 8u) return;
  wait_for_producer();
  const uint4* x = static_cast<const uint4*>(p.x) + 2 * static_cast<i64>(t);
  const uint4 a = __ldg(x), b = __ldg(x + 1);
  signal_dependents();
  reinterpret_cast<uint4*>(p.q)[t] = make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
}

__global__ void __launch_bounds__(kMaxThreads, 6) min_flat(const __grid_constant__ Params p) {
  const int lane = threadIdx.x % 8;
  const u32 slot_in_grid = blockIdx.x * p.block_slots + threadIdx.x / 8;
  const u32 slot = min(slot_in_grid, p.slots - 1u);
  u32 w[kLaneWords];
  wait_for_producer();
  const u16* x = static_cast<const u16*>(p.x) + static_cast<i64>(slot) * 128 + lane * 16;
  load_lane<kBF16, true>(x, w);
  signal_dependents();
  const u32 row = divide_u31(slot, p.tile_slots_magic, p.tile_slots_shift);
  const int group = static_cast<int>(slot - row * p.tile_slots);
  u8* q = p.q + static_cast<i64>(slot) * 128 + lane * 16;
  u8* s = p.scales + row * p.s_row_stride + (group / 4) * p.s_word_stride + (group & 3);
  asm volatile("" : "+l"(q), "+l"(s));
  u32 m = Input<kBF16>::max_magnitude(w);
  m = group_max<8>(m, 0xffffffffu);
  const float amax = fmaxf(Input<kBF16>::magnitude_to_f32(m), p.eps);
  const u32 e = ue8m0_exponent(amax, p.fmax, p.ue8m0_floor);
  const float inverse = __uint_as_float((254u - e) << 23);
  u32 codes[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float t[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      t[j] = __uint_as_float(Input<kBF16>::f32_bits(w, 4 * i + j)) * inverse;
    }
    codes[i] = Output<kE4M3>::encode4(t);
  }
  if (slot_in_grid < p.slots) {
    *reinterpret_cast<uint4*>(q) = make_uint4(codes[0], codes[1], codes[2], codes[3]);
    if (lane == 0) *s = static_cast<u8>(e);
  }
}

}  // namespace fgq
"""
SGLANG_EDITS = {
    "sgl_lb": [
        (
            "__global__ void per_token_group_quant_8bit_v2_kernel(",
            "__global__ void __launch_bounds__(256, 6) per_token_group_quant_8bit_v2_kernel(",
        )
    ],
    "sgl_early": [
        (
            "        if constexpr (FUSE_SILU_AND_MUL) {\n          const int secondary_offset",
            '        asm volatile("griddepcontrol.launch_dependents;" :::);\n'
            "        if constexpr (FUSE_SILU_AND_MUL) {\n          const int secondary_offset",
        )
    ],
}
EXTRA = {
    "roofp": "fgq::roof_params",
    "roofp_gdc": "fgq::roof_params_gdc",
    "min_nopad": "fgq::min_flat",
}


def main() -> None:
    text = _jit.source_text("quantize.cu") + KERNELS
    binaries = {name: harness.compile_function(text, expr) for name, expr in EXTRA.items()}
    sglang_same_run.UNCHECKED.update(EXTRA)
    sglang_same_run.main(binaries, SGLANG_EDITS)


if __name__ == "__main__":
    main()
