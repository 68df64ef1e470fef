// The FP4 formats: e2m1 codes two to a byte, the first value in the low nibble. NVFP4
// (docs/spec.md, section 4a): an e4m3 scale per 16 values in the blocked layout and a float32
// global scale; MXFP4 (section 4b): a UE8M0 scale per 32 values, in the row or blocked layout.
// The formats' arithmetic, then the bodies of quantize_fp4 and NVFP4's nvfp4_amax.
#pragma once
#include "common.cuh"
#include "formats.cuh"
#include "group.cuh"
#include "layouts.cuh"

namespace fgq {

// the formats -------------------------------------------------------------------------------------
// template codes; _spec.FP4_FORMATS names them in its rows
enum Fp4Kind : int { kNvfp4 = 0, kMxfp4 = 1 };
template <int kFormat> struct Fp4 {
  static constexpr int kGroup = kFormat == kNvfp4 ? 16 : 32;  // values a scale covers
};
constexpr float kE2M1Max = 6.0f;  // e2m1's largest value
enum : u32 {
  kE2M1Sign = 8u,     // an e2m1 code's sign bit
  kE2M1MaxCode = 7u,  // the magnitude bits of 6
  kE4M3Bias = 7u,     // e4m3's exponent bias
};

// the e4m3 byte of u >= 0, rounded to nearest even (subnormals included), saturated to 448
__device__ __forceinline__ u32 e4m3_byte(float u) {
  u16 r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(fminf(u, kE4M3Max)));
  return r & 0xffu;
}

// the float32 value of a non-negative e4m3 byte (exact)
__device__ __forceinline__ float e4m3_value(u32 byte) {
  const u32 exponent = (byte >> 3) & 15u, mantissa = byte & 7u;
  constexpr float kSubnormalStep = 0.001953125f;  // 2^-9
  if (exponent == 0u) return mul_rn(static_cast<float>(mantissa), kSubnormalStep);
  return __uint_as_float(((exponent + (kF32Bias - kE4M3Bias)) << 23) | (mantissa << 20));
}

// the three magnitude bits of the e2m1 code of m >= 0 (not NaN): m rounded to nearest on
// 0, 0.5, 1, 1.5, 2, 3, 4, 6, ties to the even code, saturating at 6 (the sign is bit 3)
// NOTES: the grid has step 2^(k-1) on [2^k, 2^(k+1)) for k = 1, 2 and 0.5 below 2, so with
// k = (m >= 2) + (m >= 4) the code is RNE(m * 2^(1-k)) + 2k, capped at 7: the scaling is
// exact and the add of kRoundMagic rounds once, to nearest even (the integer in the low
// mantissa bits). Checked against the scalar model at every tie (tests/test_nvfp4.py).
__device__ __forceinline__ u32 e2m1_magnitude(float m) {
  const u32 k = (m >= 2.0f) + (m >= 4.0f);
  const float step = __uint_as_float(0x40000000u - (k << 23));  // 2^(1-k)
  const u32 rounded = __float_as_uint(fma_rn(m, step, kRoundMagic)) - __float_as_uint(kRoundMagic);
  return min(rounded + 2u * k, static_cast<u32>(kE2M1MaxCode));
}

// eight 4-bit codes in one word, code i in bits 4i to 4i + 3
// NOTES: written as adds of shifted values (the codes do not overlap), which compile to one
// shift-and-add (LEA) each: 7 instructions for 8 codes instead of a shift and an or per code
__device__ __forceinline__ u32 pack_nibbles(const u32 (&c)[8]) {
  const u32 b0 = c[0] + (c[1] << 4), b1 = c[2] + (c[3] << 4);
  const u32 b2 = c[4] + (c[5] << 4), b3 = c[6] + (c[7] << 4);
  return (b0 + (b1 << 8)) + ((b2 + (b3 << 8)) << 16);
}

// the kernels' bodies -----------------------------------------------------------------------------
// NOTES: a group is 16 values (NVFP4) or 32 (MXFP4), one or two 32-byte lanes of 16-bit input
// (two or four of float32), so a thread owns a group or a share of one: the one-pass grid's slot
// numbering with one-row tiles, no loop. The arithmetic is docs/spec.md section 4a or 4b, one
// IEEE float32 operation per step.

// the global scale of the launch (after wait_for_producer: it may come from the device)
__device__ __forceinline__ float nvfp4_global(const Params& p) {
  if (p.global_mode == 0u) return p.global_scale;
  if (p.global_mode == 1u) return *static_cast<const float*>(p.global_ptr);
  const u32 amax_bits = *static_cast<const u32*>(p.global_ptr);
  // NOTES: compared as bits: CuPy compiles with -ftz=true, where a subnormal amax == 0.0f
  if (amax_bits == 0u) return 1.0f;
  const float amax = __uint_as_float(amax_bits);
  const float g = div_rn(kE4M3Max * kE2M1Max, amax);
  return g == __uint_as_float(kF32Inf) ? float32_max() : g;
}

// NVFP4's scale byte from the group maximum and the global scale g, and |RN(v / d)| of the
// lane's values in m: the divisions by d take the exact reciprocal path of divide_fast where
// d >= 2^-80
template <int kIn, int kValues>
__device__ __forceinline__ u32 nvfp4_scaled(const u32 (&words)[kLaneWords], float amax, float g,
                                            float (&m)[kValues]) {
  typedef Input<kIn> In;
  // RN(RN(g * amax) / 6): Markstein's division by 6 with RN(1/6), exact where divide_by_max is
  constexpr float kInverseE2M1Max = 0x1.555556p-3f;  // RN(1 / 6)
  const float u = divide_by_max(mul_rn(g, amax), kE2M1Max, kInverseE2M1Max);
  const u32 s_byte = e4m3_byte(u);
  // d = RN(S / g): the reciprocal path while S / g stays normal (S >= 2^-9 or 0)
  const float S = e4m3_value(s_byte);
  constexpr float kMaxFastGlobal = 1.152921504606847e18f;  // 2^60
  const float d = g >= kMinFastDivisor && g <= kMaxFastGlobal
                      ? divide_fast(S, g, rcp_rn(g))
                      : div_rn(S, g);
  // NOTES: with u <= 448 the scale did not saturate, so |v / d| <= amax / d stays below 10
  // (S is at least u / 1.5 where it is a subnormal e4m3, 2^-9 and up): no quotient overflows
  // and Markstein's path is exact. Saturated scales, d = 0 and d < 2^-80 take div.rn.
  const bool fast = d >= kMinFastDivisor && u <= kE4M3Max;

  // |RN(v / d)|: the reciprocal path for every value (one uniform branch; Markstein's three
  // operations, the sign left out), or the rare cases one value at a time. The code's sign is
  // v's (d > 0, or t = v * 0), which keeps -0 and negative values that round to zero at 8.
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
  return s_byte;
}

// MXFP4's UE8M0 byte e from the group maximum (eps applied) by the call's rule, and
// |RN(v * 2^(127 - e))| of the lane's values in m: one exact multiply each (rounded only where
// the product is subnormal); the code's sign is v's, as NVFP4's
template <int kIn, int kValues>
__device__ __forceinline__ u32 mxfp4_scaled(const Params& p, const u32 (&words)[kLaneWords],
                                            float amax, float (&m)[kValues]) {
  typedef Input<kIn> In;
  const u32 exponent = rule_exponent(p, amax);
  const float inverse = __uint_as_float((2u * kF32Bias - exponent) << 23);
#pragma unroll
  for (int i = 0; i < kValues; ++i) {
    m[i] = fabsf(mul_rn(__uint_as_float(In::f32_bits(words, i)), inverse));
  }
  return exponent;
}

// arithmetic='reciprocal' (docs/spec.md, section 4a; vLLM's and FlashInfer's references): the
// scale byte of u = RN(g * RN(amax * RN(1/6))), e4m3 (NVFP4) or u rounded up to a power of two
// on its bits (MXFP4: UE8M0), and |RN(v * r)| of the lane's values in m, with
// r = RN(1 / RN(S * RN(1/g))), 0 where that product is 0 (as RN(1/g) is where g is)
template <int kIn, int kFormat, int kValues>
__device__ __forceinline__ u32 reciprocal_scaled(const u32 (&words)[kLaneWords], float amax,
                                                 float g, float (&m)[kValues]) {
  typedef Input<kIn> In;
  constexpr float kInverseE2M1Max = 0x1.555556p-3f;  // RN(1 / 6)
  const float u = mul_rn(g, mul_rn(amax, kInverseE2M1Max));
  u32 s_byte;
  float S;
  if constexpr (kFormat == kNvfp4) {
    s_byte = e4m3_byte(u);
    S = e4m3_value(s_byte);
  } else {
    s_byte = (__float_as_uint(u) + kF32Mantissa) >> 23;  // u >= 0: the carry rounds it up
    S = __uint_as_float(s_byte << 23);
  }
  // NOTES: zero tests on the bits: CuPy compiles with -ftz=true, where a subnormal == 0.0f
  const float inverse_g = __float_as_uint(g) == 0u ? 0.0f : rcp_rn(g);
  const float c = mul_rn(S, inverse_g);
  const float r = __float_as_uint(c) == 0u ? 0.0f : rcp_rn(c);
#pragma unroll
  for (int i = 0; i < kValues; ++i) {
    m[i] = fabsf(mul_rn(__uint_as_float(In::f32_bits(words, i)), r));
  }
  return s_byte;
}

// quantize_fp4's body: one group (or a share of one) a thread, its scale through kLayout;
// kReciprocal: arithmetic='reciprocal' (instantiations of their own, the others' code as it was)
// NOTES: p by value, a copy the compiler removes. Through a reference (as the other kernels'
// helpers take it) the compiler did not hoist the load of p.rows above the padding test, and
// compiled two branches where the kernel's own parameter gives one
template <int kIn, int kFormat, int kLayout, bool kReciprocal>
__device__ __forceinline__ void fp4_quantize_group(const Params p) {
  typedef Input<kIn> In;
  typedef typename In::Storage Storage;
  constexpr int kGroup = Fp4<kFormat>::kGroup;
  constexpr int kValues = kLaneWords * 4 / In::kBytes;  // 16 (16-bit input) or 8 (float32)
  constexpr int kLanes = kGroup / kValues;
  typedef ScaleLayout<kLayout> Layout;

  // the slot: past the grid's last slot, a thread works on the last one and stores nothing
  const u32 slot_in_grid = blockIdx.x * (blockDim.x / kLanes) + threadIdx.x / kLanes;
  const int lane = threadIdx.x % kLanes;
  const bool active = slot_in_grid < p.slots;
  const u32 slot = min(slot_in_grid, p.slots - 1u);
  const u32 flat_row = divide_u31(slot, p.tile_slots_magic, p.tile_slots_shift);
  const int group = static_cast<int>(slot - flat_row * static_cast<u32>(p.groups_per_row));
  const u32 batch = divide_u31(flat_row, p.batch_tiles_magic, p.batch_tiles_shift);
  const u32 row = flat_row - batch * p.rows;
  // load
  u32 words[kLaneWords];
  wait_for_producer();
  load_lane<kIn, true>(static_cast<const Storage*>(p.x) + batch * p.x_batch_stride +
                           row * p.x_row_stride + group * kGroup + lane * kValues, words);
  float g = 0.0f;
  if constexpr (kFormat == kNvfp4 || kReciprocal) g = nvfp4_global(p);  // MXFP4's: kReciprocal
  signal_dependents();
  // zero the padding rows' scales (the blocked layout's; the row layout has none); publish a
  // computed global scale
  if constexpr (Layout::kSpreadPadding) {
    if (active && row == p.rows - 1u) Layout::zero_rows(p, batch, row + 1u, group, lane, kLanes);
  }
  if (kFormat == kNvfp4 && p.global_mode == 2u && slot_in_grid == 0u && lane == 0) {
    *reinterpret_cast<float*>(p.global_out) = g;
  }

  // amax over the finite values (the slow path only for a warp holding Inf or NaN, as in
  // quantize_group), then the scale and the scaled magnitudes
  u32 magnitude = group_max<kLanes>(In::max_magnitude(words), kAllLanes);
  const bool nonfinite = magnitude >= In::kInf;
  if (__builtin_expect(__any_sync(kAllLanes, nonfinite), 0)) {
    const u32 finite = group_max<kLanes>(max_finite_magnitude<kIn>(words), kAllLanes);
    if (nonfinite) magnitude = finite;
  }
  const float amax = In::magnitude_to_f32(magnitude);
  float m[kValues];
  u32 s_byte;
  if constexpr (kReciprocal) {
    s_byte = reciprocal_scaled<kIn, kFormat, kValues>(words, amax, g, m);
  } else if constexpr (kFormat == kNvfp4) {
    s_byte = nvfp4_scaled<kIn, kValues>(words, amax, g, m);
  } else {
    s_byte = mxfp4_scaled<kIn, kValues>(p, words, fmaxf(amax, p.eps), m);
  }
  // the codes
  u32 packed[kValues / 8];
#pragma unroll
  for (int w = 0; w < kValues / 8; ++w) {
    u32 codes[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const u32 sign = (In::raw(words, 8 * w + j) & In::kSign) != 0u ? kE2M1Sign : 0u;
      codes[j] = e2m1_magnitude(m[8 * w + j]) | sign;
    }
    packed[w] = pack_nibbles(codes);
  }
  if (__builtin_expect(nonfinite, 0)) {  // NaN: +0; +-Inf: +-6
#pragma unroll
    for (int i = 0; i < kValues; ++i) {
      const u32 raw = In::raw(words, i), magnitude_i = raw & (In::kSign - 1u);
      if (magnitude_i >= In::kInf) {
        const u32 code = magnitude_i == In::kInf
                             ? (kE2M1MaxCode | ((raw & In::kSign) != 0u ? kE2M1Sign : 0u))
                             : 0u;
        const int shift = 4 * (i % 8);
        packed[i / 8] = (packed[i / 8] & ~(0xfu << shift)) | (code << shift);
      }
    }
  }
  // store: the codes, then the scale (a float layout holds UE8M0's power of two 2^(e - 127);
  // the byte layouts take s_byte, e4m3 or UE8M0)
  if (!active) return;
  constexpr int kGroupBytes = kGroup / 2;
  u8* q = p.q + batch * p.q_batch_stride + row * (static_cast<i64>(p.groups_per_row) * kGroupBytes) +
          group * kGroupBytes + lane * (kValues / 2);
  if constexpr (kValues == 16) {
    *reinterpret_cast<uint2*>(q) = make_uint2(packed[0], packed[1]);
  } else {
    *reinterpret_cast<u32*>(q) = packed[0];
  }
  const float scale = __uint_as_float(s_byte << 23);
  Layout::store_at(Layout::at(p, batch, row, group), p, group, scale, s_byte, true, lane == 0);
}

// the largest finite magnitude of x, as float32 bits, into *global_ptr (zeroed before): the
// computed global scale's one extra pass over x
template <int kIn>
__device__ __forceinline__ void nvfp4_amax_walk(const Params& p) {
  typedef Input<kIn> In;
  typedef typename In::Storage Storage;
  constexpr int kValues = kLaneWords * 4 / In::kBytes;
  const u32 lanes_per_row = static_cast<u32>(p.groups_per_row) * (Fp4<kNvfp4>::kGroup / kValues);
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
  best = group_max<32>(best, kAllLanes);
  if ((threadIdx.x & 31u) == 0u && best != 0u) atomicMax(static_cast<u32*>(const_cast<void*>(p.global_ptr)), best);
}

}  // namespace fgq
