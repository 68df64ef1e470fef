// The per-group work every kernel shares: a group of kGroup values is held by kLanes
// consecutive lanes of a warp, 32 bytes a lane; the lanes reduce the group maximum with xor
// shuffles among themselves, compute the scale, encode in registers and store their codes with
// one store, and the group's first lane stores the scale. No shared memory, no atomics.
#pragma once
#include "common.cuh"
#include "formats.cuh"
#include "layouts.cuh"

namespace fgq {

// the maximum over the lanes of one group ---------------------------------------------------------
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

// the upstream arithmetics compiled into instantiations of their own (KernelKey.arithmetic), so
// that the other instantiations' code and registers stay as they were
enum ArithmeticMode : int {
  kDefaultArith = 0,     // docs/spec.md, section 3
  kUnflooredArith = 1,   // 'unfloored' (section 3b): FlashInfer's MXFP8
  kReciprocalArith = 2,  // 'reciprocal' (section 3c): v * RN(1 / s), DeepGEMM's weights
  kMultiplierArith = 3,  // 'multiplier' (section 3c): RN(fmax / amax) first, torchao's
};

// scale and encode one lane's values --------------------------------------------------------------
// kMultiplyBf16: arithmetic='bfloat16' (docs/spec.md, section 3a), the product rounded to bfloat16
enum ScaleOp : int { kMultiply = 0, kDivideFast = 1, kDivideExact = 2, kMultiplyBf16 = 3 };

__device__ __forceinline__ float round_bf16(float v) {
  return __uint_as_float(input_pair<kBF16>(v, 0.0f) << 16);
}

// one value scaled for encoding: v / scale (factor = RN(1 / scale) for kDivideFast), or
// v * factor for kMultiply, factor already holding the format's 2^kCodeExponent (both exact
// powers of two), or that product rounded to bfloat16 for kMultiplyBf16
template <int kOut, int kOp>
__device__ __forceinline__ float scaled_value(float v, float scale, float factor) {
  float t;
  if constexpr (kOp == kMultiply) t = mul_rn(v, factor);
  if constexpr (kOp == kDivideFast) t = divide_fast(v, scale, factor);
  if constexpr (kOp == kDivideExact) t = div_rn(v, scale);
  if constexpr (kOp == kMultiplyBf16) t = round_bf16(mul_rn(v, factor));
  if constexpr (kOp != kMultiply && Output<kOut>::kCodeExponent != 0) {
    t = mul_rn(t, static_cast<float>(1u << Output<kOut>::kCodeExponent));
  }
  return t;
}

// kFloat8 (e4m3 and e5m2): the format's encoding by one uniform branch on Params.output
template <int kIn, int kOut, int kOp, int kValues, typename V>
__device__ __forceinline__ void encode_lane(const Params& p, const V& values, float scale,
                                            float factor, u32 (&codes)[kValues / 4]) {
  if constexpr (kOut == kFloat8) {
    if (p.output == kE5M2) {
      encode_lane<kIn, kE5M2, kOp, kValues>(p, values, scale, factor, codes);
    } else {
      encode_lane<kIn, kE4M3, kOp, kValues>(p, values, scale, factor, codes);
    }
  } else {
#pragma unroll
    for (int w = 0; w < kValues / 4; ++w) {
      float t[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        t[j] = scaled_value<kOut, kOp>(LaneValues<kIn, V>::value(values, 4 * w + j), scale, factor);
      }
      codes[w] = Output<kOut>::encode4(t);
    }
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

// the UE8M0 exponent byte of amax (eps applied) by the call's scale_rule (docs/spec.md section 3)
// NOTES: both rules from amax's bits, no division (ue8m0_exponent says why that is the
// spec's quotient; Markstein's division is 10 dependent instructions), both computed, then
// selected: a uniform branch between them would sit on the group's chain.
__device__ __forceinline__ u32 rule_exponent(const Params& p, float amax) {
  // scale_rule="floor": amax's biased exponent minus emax_elem, at least 1
  const u32 floor_rule = static_cast<u32>(
      max(static_cast<int>(__float_as_uint(amax) >> 23) - static_cast<int>(p.floor_emax), 1));
  const u32 rceil = ue8m0_exponent(amax, p.fmax, p.ue8m0_floor);
  return p.floor_emax != 0u ? floor_rule : rceil;
}

// arithmetic='bfloat16' (docs/spec.md, section 3a; vLLM's masked SiLU kernel) -------------------
// the group's scale with every step rounded to bfloat16, its exponent byte for a power-of-two
// scale, and the bfloat16 reciprocal the values are multiplied by; amax has eps applied (eps
// is the bfloat16 one in this mode, Params.eps)
// NOTES: log2 of a bfloat16 scale lies at least 8e-4 from a boundary that moves the ceiling
// (tests/test_upstream_modes.py), so log2f's few ulp never move the ceiling
template <int kScale>
__device__ __forceinline__ float bf16_scale(const Params& p, float amax, float& scale,
                                            u32& exponent) {
  scale = round_bf16(mul_rn(amax, round_bf16(p.inverse_fmax)));
  if constexpr (kScale != kFloat32Scale) {
    const int ceiling = static_cast<int>(ceilf(round_bf16(log2f(scale))));
    exponent = static_cast<u32>(min(max(ceiling + kF32Bias, 1), 254));
    scale = __uint_as_float(exponent << 23);
  }
  return round_bf16(div_rn(1.0f, scale));
}

// the power of two a value is multiplied by under UE8M0 exponent byte `exponent`:
// 2^-(exponent - bias) times the format's 2^kCodeExponent, as float32 bits
template <int kOut>
__device__ __forceinline__ float ue8m0_inverse(u32 exponent) {
  return __uint_as_float((2u * kF32Bias + Output<kOut>::kCodeExponent - exponent) << 23);
}

// arithmetic='unfloored' (docs/spec.md, section 3b; FlashInfer's MXFP8): instantiations of
// their own (kUnflooredArith) ------------------------------------------------------------------

// the UE8M0 byte of RN(amax / fmax), nothing floored, from amax's bits (amax may be 0 or +Inf,
// which gives 254): ue8m0_exponent's exact ceiling where the quotient is normal; below
// fmax * 2^-126 it rounds to at most 2^-126 (byte 1) and passes 2^-127 from two steps of amax
// above fmax * 2^-127 on (one step adds under half a subnormal step of the quotient, as fmax's
// mantissa lies in [1, 2)); else 0
__device__ __forceinline__ u32 unfloored_exponent(float amax, float fmax) {
  const u32 a = __float_as_uint(amax), f = __float_as_uint(fmax);
  if (a >= kF32Inf) return 2u * kF32Bias;
  if (a >= f - ((kF32Bias - 1u) << 23)) return ue8m0_exponent(amax, fmax, 0.0f);
  return a >= f - (static_cast<u32>(kF32Bias) << 23) + 2u ? 1u : 0u;
}

// what byte e multiplies by: 2^(127 - e), the subnormal 2^-127 at 254, and 0 for byte 0 (the
// codes of a zero scale are zero)
__device__ __forceinline__ float unfloored_inverse(u32 e) {
  constexpr u32 kTwoToMinus127 = 0x00400000u;
  if (e == 0u) return 0.0f;
  return __uint_as_float(e == 2u * kF32Bias ? kTwoToMinus127 : (2u * kF32Bias - e) << 23);
}

// the maximum magnitude of a group holding Inf or NaN (quantize_group's slow path): over its
// finite values, or +Inf where the group holds one and kUnfloored takes infinities
template <int kIn, int kLanes, int kValues, bool kUnfloored, typename V>
__device__ __forceinline__ u32 nonfinite_group_max(const V& values, u32 mask) {
  typedef LaneValues<kIn, V> L;
  u32 magnitude = group_max<kLanes>(L::max_finite_magnitude(values), mask);
  if constexpr (kUnfloored) {
    constexpr u32 kMagnitude = Input<L::kRawType>::kSign - 1u;
    u32 inf = 0u;
#pragma unroll
    for (int i = 0; i < kValues; ++i) {
      inf |= (L::raw(values, i) & kMagnitude) == L::kInf ? L::kInf : 0u;
    }
    magnitude = max(magnitude, group_max<kLanes>(inf, mask));
  }
  return magnitude;
}

// arithmetic='reciprocal' and 'multiplier' (docs/spec.md, section 3c): the float scale of a
// group whose maximum is amax (eps applied, at least 2^-64, so that every quotient and
// reciprocal here is a normal float), and in `factor` what its values are multiplied by:
// RN(1 / s) of s = RN(amax * RN(1 / fmax)), or r = RN(fmax / amax) and s = RN(1 / r)
template <int kArith>
__device__ __forceinline__ float product_scale(const Params& p, float amax, float& factor) {
  if constexpr (kArith == kMultiplierArith) {
    factor = div_rn(p.fmax, amax);
    return rcp_rn(factor);
  } else {
    const float scale = mul_rn(amax, p.inverse_fmax);
    factor = rcp_rn(scale);
    return scale;
  }
}

// the scale of a group (or a column tile's channel) whose maximum is amax (eps applied), by the
// rules of docs/spec.md or kArith's; `exponent` receives the UE8M0 byte (0 for float scales),
// `factor` what scaled_value multiplies by (for the default float scales RN(1 / scale), the
// fast division's reciprocal)
template <int kOut, int kScale, int kArith>
__device__ __forceinline__ float group_scale(const Params& p, float amax, float& factor,
                                             u32& exponent) {
  constexpr bool kProduct = kArith == kReciprocalArith || kArith == kMultiplierArith;
  constexpr bool kE4M3Binary = kOut == kE4M3 || kOut == kFloat8;  // e4m3 runs the float8 binary
  static_assert(kArith != kUnflooredArith || (kE4M3Binary && kScale == kUE8M0Scale),
                "MXFP8's arithmetic");
  static_assert(!kProduct || (kE4M3Binary && kScale == kFloat32Scale), "section 3c's");
  exponent = 0u;
  if constexpr (kProduct) {
    return product_scale<kArith>(p, amax, factor);
  } else if constexpr (kScale == kFloat32Scale) {
    const float scale = divide_by_max(amax, p.fmax, p.inverse_fmax);
    factor = rcp_rn(scale);
    return scale;
  } else {
    if constexpr (kArith == kUnflooredArith) {
      exponent = unfloored_exponent(amax, p.fmax);
      factor = unfloored_inverse(exponent);
    } else {
      exponent = rule_exponent(p, amax);
      factor = ue8m0_inverse<kOut>(exponent);
    }
    return __uint_as_float(exponent << 23);
  }
}

// the scale of a group whose maximum is amax (eps applied), and this lane's codes under it;
// `exponent` receives the UE8M0 byte (0 for float scales). kArith: an upstream's arithmetic,
// kUnflooredArith (e4m3, UE8M0; amax unfloored), kReciprocalArith or kMultiplierArith (e4m3,
// float scales)
template <int kIn, int kOut, int kScale, int kValues, int kArith = kDefaultArith, typename V>
__device__ __forceinline__ float encode_scaled(const Params& p, const V& values, float amax,
                                               u32& exponent, u32 (&codes)[kValues / 4]) {
  constexpr bool kProduct = kArith == kReciprocalArith || kArith == kMultiplierArith;
  float scale;
  // NOTES: a runtime mode under a uniform branch, for the one drop-in that asks for it;
  // bfloat16 input only (the request checks it), so no other instantiation carries it
  if (kIn == kBF16 && __builtin_expect(p.bf16_arithmetic != 0u, 0)) {
    exponent = 0u;
    const float inverse = bf16_scale<kScale>(p, amax, scale, exponent);
    encode_lane<kIn, kOut, kMultiplyBf16, kValues>(p, values, scale, inverse, codes);
  } else if constexpr (kScale == kFloat32Scale && !kProduct) {
    // group_scale's rule, with the reciprocal taken only where the fast division uses it
    exponent = 0u;
    scale = divide_by_max(amax, p.fmax, p.inverse_fmax);
    if (scale >= kMinFastDivisor) {
      encode_lane<kIn, kOut, kDivideFast, kValues>(p, values, scale, rcp_rn(scale), codes);
    } else {
      encode_lane<kIn, kOut, kDivideExact, kValues>(p, values, scale, 0.0f, codes);
    }
  } else {
    float factor;
    scale = group_scale<kOut, kScale, kArith>(p, amax, factor, exponent);
    encode_lane<kIn, kOut, kMultiply, kValues>(p, values, scale, factor, codes);
  }
  return scale;
}

// scale, encode and store one group ---------------------------------------------------------------
// From `magnitude`, the group's maximum magnitude over finite values; `patch` gives the
// non-finite values their codes before the stores (see quantize_group for the arguments).
// Leaves the codes in `codes`.
template <int kIn, int kOut, int kScale, int kLayout, bool kUnsignedNaN, bool kStraightTail,
          int kValues, int kArith, typename V>
__device__ __forceinline__ void finish_group(const Params& p, const V& values, u32 magnitude,
                                             bool patch, bool real_row, u8* q_dst, bool store_q,
                                             u8* scale_at, bool store_scale, int group,
                                             u32 (&codes)[kValues / 4]) {
  const float amax = fmaxf(LaneValues<kIn, V>::magnitude_to_f32(magnitude), p.eps);
  u32 exponent;
  const float scale =
      encode_scaled<kIn, kOut, kScale, kValues, kArith>(p, values, amax, exponent, codes);
  if (__builtin_expect(patch, 0)) patch_group<kIn, kUnsignedNaN, kValues>(p, values, codes);
  // the codes, then the scale (one lane per group)
  if (store_q) store_codes<kValues>(q_dst, codes);
  ScaleLayout<kLayout>::template store_at<kStraightTail>(scale_at, p, group, scale, exponent,
                                                        real_row, store_scale);
}

// quantize one group (this lane's share) and store it ---------------------------------------------
// `values` are this lane's values (as loaded, or a FloatLane: LaneValues); `mask` names the
// lanes that run this call together (the group's own lanes, or with kWholeWarp all 32);
// `real_row` false quantizes a padding row's zeros. The codes go to q_dst when store_q, the
// scale to scale_at (the layout's at() of the group) when store_scale. kUnsignedNaN: see
// patch_nonfinite. kArith: encode_scaled's (with kUnflooredArith infinities also enter the
// maximum). kStraightTail (the one-pass kernel's, whose register budget allows it): no
// branch between the group's scale and its stores. The codes of non-finite values are patched
// after the stores and stored again by the same thread (its second store is the one that
// remains), so the common path does not jump over the patch (2.9 KB of code), and the scale
// is stored by predicated stores (layouts.cuh) rather than under a branch on lane 0
// (docs/perf.md).
template <int kIn, int kGroup, int kOut, int kScale, int kLayout, bool kWholeWarp,
          bool kUnsignedNaN = false, bool kStraightTail = false, int kArith = kDefaultArith,
          typename V>
__device__ __forceinline__ void quantize_group(const Params& p, const V& values, u32 mask,
                                               bool real_row, u8* q_dst, bool store_q,
                                               u8* scale_at, bool store_scale, int group) {
  typedef LaneValues<kIn, V> L;
  constexpr int kValues = kLaneWords * 4 / Input<kIn>::kBytes;
  constexpr int kLanes = kGroup / kValues;
  constexpr bool kUnfloored = kArith == kUnflooredArith;

  // reduce the group maximum over finite values
  u32 magnitude = group_max<kLanes>(L::max_magnitude(values), mask);
  const bool nonfinite = magnitude >= L::kInf;  // uniform over the group
  if constexpr (kWholeWarp) {
    // NOTES: the whole-warp mask needs a warp-uniform branch: every lane takes the slow path if
    // any group of the warp holds Inf or NaN, and keeps its own maximum if its group does not
    if (__builtin_expect(__any_sync(mask, nonfinite), 0)) {
      const u32 finite = nonfinite_group_max<kIn, kLanes, kValues, kUnfloored>(values, mask);
      if (nonfinite) magnitude = finite;
    }
  } else {
    if (__builtin_expect(nonfinite, 0)) {
      magnitude = nonfinite_group_max<kIn, kLanes, kValues, kUnfloored>(values, mask);
    }
  }
  // scale, encode, store
  u32 codes[kValues / 4];
  finish_group<kIn, kOut, kScale, kLayout, kUnsignedNaN, kStraightTail, kValues, kArith>(
      p, values, magnitude, nonfinite && !kStraightTail, real_row, q_dst, store_q, scale_at,
      store_scale, group, codes);
  if (kStraightTail && __builtin_expect(nonfinite, 0)) {
    patch_group<kIn, kUnsignedNaN, kValues>(p, values, codes);
    if (store_q) store_codes<kValues>(q_dst, codes);
  }
}

}  // namespace fgq
