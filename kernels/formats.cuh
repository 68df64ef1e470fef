// The number formats: input types (decoding, loading a lane, float32 -> the input type), the
// lanes of values the quantizer reads, the output encodings and UE8M0 scales. A trait holds a
// format's instructions; its numbers (fmax, the codes of NaN and Inf) are one Python table,
// _spec.OUTPUT_FORMATS, and reach the kernels through Params.
#pragma once
#include "common.cuh"

namespace fgq {

// template codes; the Python registries (_spec.py) name them in their rows
enum InputType : int { kBF16 = 0, kF16 = 1, kF32 = 2 };
// kFloat8: the binary of e4m3 and e5m2, which reads its format from Params.output
enum OutputType : int { kE4M3 = 0, kE5M2 = 1, kInt8 = 2, kE4M3FNUZ = 3, kFloat8 = 4 };
enum ScaleFormat : int { kFloat32Scale = 0, kUE8M0Scale = 1 };

enum : u32 { kHalfMagnitudes = 0x7fff7fffu };  // the magnitude bits of a word's two 16-bit halves

// input types -------------------------------------------------------------------------------------
// A lane holds kLaneWords words. raw(words, i) is the encoding of value i; f32_bits(words, i) its
// exact float32 bits. Magnitudes (encodings without the sign bit) order like the values they
// encode, so the group maximum is an integer maximum; magnitudes >= kInf are Inf or NaN.

template <int kIn> struct Input;

template <> struct Input<kBF16> {
  typedef u16 Storage;
  static constexpr int kBytes = 2;
  static constexpr u32 kSign = 0x8000u;
  static constexpr u32 kInf = 0x7f80u;
  __device__ static __forceinline__ u32 raw(const u32 (&w)[kLaneWords], int i) {
    return (w[i / 2] >> (16 * (i % 2))) & 0xffffu;
  }
  __device__ static __forceinline__ u32 f32_bits(const u32 (&w)[kLaneWords], int i) {
    return i % 2 ? w[i / 2] & 0xffff0000u : w[i / 2] << 16;
  }
  __device__ static __forceinline__ u32 max_magnitude(const u32 (&w)[kLaneWords]) {
    u32 m = w[0] & kHalfMagnitudes;
#pragma unroll
    for (int i = 1; i < kLaneWords; ++i) m = max_u16x2(m, w[i] & kHalfMagnitudes);
    return max(m & 0xffffu, m >> 16);
  }
  __device__ static __forceinline__ float magnitude_to_f32(u32 m) { return __uint_as_float(m << 16); }
};

template <> struct Input<kF16> {
  typedef u16 Storage;
  static constexpr int kBytes = 2;
  static constexpr u32 kSign = 0x8000u;
  static constexpr u32 kInf = 0x7c00u;
  __device__ static __forceinline__ u32 raw(const u32 (&w)[kLaneWords], int i) {
    return (w[i / 2] >> (16 * (i % 2))) & 0xffffu;
  }
  __device__ static __forceinline__ float half_to_f32(u32 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<u16>(h)));
    return f;
  }
  __device__ static __forceinline__ u32 f32_bits(const u32 (&w)[kLaneWords], int i) {
    return __float_as_uint(half_to_f32(raw(w, i)));
  }
  __device__ static __forceinline__ u32 max_magnitude(const u32 (&w)[kLaneWords]) {
    return Input<kBF16>::max_magnitude(w);  // same 16-bit magnitude order
  }
  __device__ static __forceinline__ float magnitude_to_f32(u32 m) { return half_to_f32(m); }
};

template <> struct Input<kF32> {
  typedef u32 Storage;
  static constexpr int kBytes = 4;
  static constexpr u32 kSign = kF32Sign;
  static constexpr u32 kInf = kF32Inf;
  __device__ static __forceinline__ u32 raw(const u32 (&w)[kLaneWords], int i) { return w[i]; }
  __device__ static __forceinline__ u32 f32_bits(const u32 (&w)[kLaneWords], int i) { return w[i]; }
  __device__ static __forceinline__ u32 max_magnitude(const u32 (&w)[kLaneWords]) {
    u32 m = w[0] & (kSign - 1u);
#pragma unroll
    for (int i = 1; i < kLaneWords; ++i) m = max(m, w[i] & (kSign - 1u));
    return m;
  }
  __device__ static __forceinline__ float magnitude_to_f32(u32 m) { return __uint_as_float(m); }
};

// the largest finite magnitude of a lane: the slow path, for groups holding Inf or NaN
template <int kIn>
__device__ __forceinline__ u32 max_finite_magnitude(const u32 (&w)[kLaneWords]) {
  typedef Input<kIn> In;
  constexpr int kValues = kLaneWords * 4 / In::kBytes;
  u32 m = 0u;
#pragma unroll
  for (int i = 0; i < kValues; ++i) {
    const u32 magnitude = In::raw(w, i) & (In::kSign - 1u);
    m = max(m, magnitude < In::kInf ? magnitude : 0u);
  }
  return m;
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

// value i of a loaded lane, as float32
template <int kIn>
__device__ __forceinline__ float value_of(const u32 (&words)[kLaneWords], int i) {
  return __uint_as_float(Input<kIn>::f32_bits(words, i));
}

// float32 -> the input type -----------------------------------------------------------------------

// float32 -> the input type and back (round to nearest even; no flush of subnormals)
template <int kIn> __device__ __forceinline__ float round_to_input(float v);
template <> __device__ __forceinline__ float round_to_input<kBF16>(float v) {
  // NOTES: one cvt: v rounded into the high half of a word whose low half is +0's, which is the
  // float32 of the rounded value (a cvt to 16 bits took a second instruction to shift it back)
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(v), "f"(0.0f));
  return __uint_as_float(r);
}
template <> __device__ __forceinline__ float round_to_input<kF16>(float v) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  return Input<kF16>::half_to_f32(h);
}
template <> __device__ __forceinline__ float round_to_input<kF32>(float v) { return v; }

// two float32 values rounded to nearest even into one word of a 16-bit input type, lo in the
// low half; a NaN becomes what cvt writes (0x7fff, seen on the H200 in the residual the fused
// add-RMSNorm writes back), which map_lane then canonicalises
template <int kIn> __device__ __forceinline__ u32 input_pair(float lo, float hi);
template <> __device__ __forceinline__ u32 input_pair<kBF16>(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <> __device__ __forceinline__ u32 input_pair<kF16>(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// the NaN halves (or words) of `words`, in the input type, made the positive quiet NaN
template <int kIn>
__device__ __forceinline__ void canonicalise_nan(u32 (&words)[kLaneWords]) {
  typedef Input<kIn> In;
#pragma unroll
  for (int w = 0; w < kLaneWords; ++w) {
    if constexpr (In::kBytes == 2) {
      constexpr u32 kQuietNaN = kIn == kBF16 ? 0x7fc0u : 0x7e00u;
      u32 lo = words[w] & 0xffffu, hi = words[w] >> 16;
      if ((lo & (In::kSign - 1u)) > In::kInf) lo = kQuietNaN;
      if ((hi & (In::kSign - 1u)) > In::kInf) hi = kQuietNaN;
      words[w] = lo | (hi << 16);
    } else {
      if ((words[w] & (In::kSign - 1u)) > In::kInf) words[w] = kF32QuietNaN;
    }
  }
}

// per value of one lane: bits of the input type, made by `value` from the i-th float32 value;
// NaN is the positive quiet NaN (0x7fc0, 0x7e00, 0x7fc00000), as NumPy converts float32's.
// kCheck false: the caller knows whether a value may be NaN and passes `maybe_nan`, and no
// value is tested unless it is true
// NOTES: 16-bit types convert two values with one cvt, and only a lane that made a NaN takes
// the path that canonicalises it, instead of NaN selects on every value
template <int kIn, bool kCheck = true, typename F>
__device__ __forceinline__ void map_lane(u32 (&words)[kLaneWords], F value, bool maybe_nan = true) {
  typedef Input<kIn> In;
  u32 out[kLaneWords];
  bool nan = false;
#pragma unroll
  for (int w = 0; w < kLaneWords; ++w) {
    if constexpr (In::kBytes == 2) {
      const float lo = value(2 * w), hi = value(2 * w + 1);
      if constexpr (kCheck) nan |= lo != lo || hi != hi;
      out[w] = input_pair<kIn>(lo, hi);
    } else {
      const float v = value(w);
      if constexpr (kCheck) nan |= v != v;
      out[w] = __float_as_uint(v);
    }
  }
  if (__builtin_expect(kCheck ? nan : maybe_nan, 0)) canonicalise_nan<kIn>(out);
#pragma unroll
  for (int w = 0; w < kLaneWords; ++w) words[w] = out[w];
}

// the lanes of values the quantizer reads ---------------------------------------------------------

// a lane's values as float32, each exact in the input type (the fused RMSNorm's: they come out
// of float32 arithmetic rounded to the input type, so packing them into its encoding only for
// the quantizer to unpack them again would cost work). maybe_nan false promises no NaN.
template <int kValues> struct FloatLane {
  float v[kValues];
};

// how the quantizer reads a lane's values: as loaded (u32 words in kIn's encoding), or a
// FloatLane. magnitude: an order-preserving encoding of |v|, at least kInf for Inf or NaN.
template <int kIn, typename V> struct LaneValues;

template <int kIn> struct LaneValues<kIn, u32[kLaneWords]> {
  typedef Input<kIn> In;
  static constexpr u32 kInf = In::kInf;
  __device__ static __forceinline__ float value(const u32 (&w)[kLaneWords], int i) {
    return __uint_as_float(In::f32_bits(w, i));
  }
  // the bits patch_nonfinite reads (kIn's encoding) and whose type they are
  static constexpr int kRawType = kIn;
  __device__ static __forceinline__ u32 raw(const u32 (&w)[kLaneWords], int i) { return In::raw(w, i); }
  __device__ static __forceinline__ u32 max_magnitude(const u32 (&w)[kLaneWords]) {
    return In::max_magnitude(w);
  }
  __device__ static __forceinline__ u32 max_finite_magnitude(const u32 (&w)[kLaneWords]) {
    return fgq::max_finite_magnitude<kIn>(w);
  }
  __device__ static __forceinline__ float magnitude_to_f32(u32 m) { return In::magnitude_to_f32(m); }
};

template <int kIn, int kValues> struct LaneValues<kIn, FloatLane<kValues>> {
  static_assert(kValues == kLaneWords * 4 / Input<kIn>::kBytes, "a lane's values");
  static constexpr u32 kInf = kF32Inf;
  __device__ static __forceinline__ float value(const FloatLane<kValues>& f, int i) { return f.v[i]; }
  static constexpr int kRawType = kF32;
  __device__ static __forceinline__ u32 raw(const FloatLane<kValues>& f, int i) {
    return __float_as_uint(f.v[i]);
  }
  // NOTES: a float maximum that keeps NaN (max.NaN, one instruction a value as fmaxf, which
  // skips NaN): a lane holding NaN reports NaN, whose magnitude bits lie above kInf, so it takes
  // the slow path as Inf does, and the caller need not test its inputs for NaN. Under CuPy's
  // -ftz it reads a subnormal as 0, which changes nothing: amax is at least eps, a normal float
  // (docs/spec.md section 3)
  __device__ static __forceinline__ u32 max_magnitude(const FloatLane<kValues>& f) {
    float m = fabsf(f.v[0]);
#pragma unroll
    for (int i = 1; i < kValues; ++i) m = max_keeping_nan(m, fabsf(f.v[i]));
    return __float_as_uint(m);
  }
  __device__ static __forceinline__ u32 max_finite_magnitude(const FloatLane<kValues>& f) {
    u32 m = 0u;
#pragma unroll
    for (int i = 0; i < kValues; ++i) {
      const u32 magnitude = __float_as_uint(f.v[i]) & (kF32Sign - 1u);
      m = max(m, magnitude < kInf ? magnitude : 0u);
    }
    return m;
  }
  __device__ static __forceinline__ float magnitude_to_f32(u32 m) { return __uint_as_float(m); }
};

// output encodings --------------------------------------------------------------------------------
// encode4(t) returns the codes of four scaled values t = v / s, t[j] in bits 8j to 8j + 7, for
// finite inputs (patch_nonfinite gives the others theirs).
// kLean: the format's encoding fits the 40-register budget of six resident blocks an SM.
// kCodeExponent: encode4 takes t * 2^kCodeExponent, so that a caller multiplying by a power of
// two folds the factor into its own multiply (exact: |t| <= fmax, far from overflow).

template <int kOut> struct Output;

// e4m3's largest finite value: its satfinite clamp, and NVFP4's largest scale
constexpr float kE4M3Max = 448.0f;

// float8 formats: one cvt rounds and saturates two values at a time
template <int kOut>
struct Float8Output {
  static constexpr bool kLean = true;
  static constexpr u32 kCodeExponent = 0;
  __device__ static __forceinline__ u32 encode4(const float (&t)[4]) {
    return Output<kOut>::encode2(t[0], t[1]) | (Output<kOut>::encode2(t[2], t[3]) << 16);
  }
};

template <> struct Output<kE4M3> : Float8Output<kE4M3> {
  __device__ static __forceinline__ u32 encode2(float lo, float hi) {
    // NOTES: .satfinite rounds to nearest even and then clamps to +-448, which equals the spec's
    // clamp-then-round; non-finite inputs are patched afterwards.
    u16 r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
  }
};

template <> struct Output<kE5M2> : Float8Output<kE5M2> {
  __device__ static __forceinline__ u32 encode2(float lo, float hi) {
    u16 r;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
  }
};

// float8_e4m3fnuz (AMD): bias 8, so the code of t is the e4m3fn code of 2t (an exact multiply,
// which kCodeExponent hands to the caller); the clamp at +-224 is e4m3fn's +-448 halved. The
// format has no -0: 0x80 is its only NaN.
template <> struct Output<kE4M3FNUZ> {
  static constexpr bool kLean = true;
  static constexpr u32 kCodeExponent = 1;
  __device__ static __forceinline__ u32 encode4(const float (&t2)[4]) {
    const u32 codes = Output<kE4M3>::encode4(t2);
    // a byte of zero magnitude (+0 or -0) becomes +0
    constexpr u32 kByteMagnitudes = 0x7f7f7f7fu;
    return codes & __vcmpne4(codes & kByteMagnitudes, 0u);
  }
};

// e4m3 and e5m2 in one binary: encode_lane (group.cuh) takes the format's encoding by one
// uniform branch on Params.output; the two differ in the cvt alone (one lean budget, no
// factor: e4m3fnuz's, which has one, keeps a binary of its own)
template <> struct Output<kFloat8> {
  static constexpr bool kLean = true;
  static constexpr u32 kCodeExponent = 0;
};

template <> struct Output<kInt8> {
  static constexpr bool kLean = false;
  static constexpr u32 kCodeExponent = 0;
  __device__ static __forceinline__ u32 encode4(const float (&t)[4]) {
    // NOTES: the spec's clamp to +-127 never binds for a finite input: |v| <= amax and
    // s >= RN(amax / 127) (a power of two at least that for UE8M0), so |v / s| <= 127.002 even
    // when s is subnormal (relative error <= 1.5e-5 for amax >= eps >= 2^-126), and the rounded
    // code stays in [-127, 127]. Rounding is then one add: RN(t + kRoundMagic) is the float whose
    // low mantissa byte holds round-half-even(t) in two's complement, in place of two FMNMX, an
    // F2I (quarter rate) and a mask per value. Non-finite inputs are patched afterwards.
    u32 b[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = __float_as_uint(add_rn(t[j], kRoundMagic));
    return __byte_perm(__byte_perm(b[0], b[1], 0x0040), __byte_perm(b[2], b[3], 0x0040), 0x5410);
  }
};

// the code of a non-finite input (from `codes`: +NaN, -NaN, +Inf, -Inf, a byte each), or `code`
// unchanged for a finite one; with kUnsignedNaN every NaN is +NaN (the fused SiLU's values,
// whose NaN is +NaN by definition but may come out of bf16x2 arithmetic with a sign:
// canonicalising here costs nothing outside this rare path)
// NOTES: set explicitly rather than trusting the arithmetic: Inf / s through the reciprocal path
// of divide_fast gives NaN, and cvt's NaN has no sign.
template <int kIn, bool kUnsignedNaN>
__device__ __forceinline__ u32 patch_nonfinite(u32 code, u32 raw, u32 codes) {
  typedef Input<kIn> In;
  const u32 magnitude = raw & (In::kSign - 1u);
  if (magnitude < In::kInf) return code;
  const bool negative = (raw & In::kSign) != 0u && (magnitude == In::kInf || !kUnsignedNaN);
  const u32 which = (magnitude == In::kInf ? 2u : 0u) + (negative ? 1u : 0u);
  return (codes >> (8u * which)) & 0xffu;
}

// RN(amax / fmax) for amax >= eps (positive, finite, normal); inverse_fmax = RN(1 / fmax)
// NOTES: Markstein's division with the precomputed reciprocal is exact while the quotient and the
// residual stay normal; amax >= 2^-60 keeps both far from the subnormal range (the default eps,
// 1e-10, always takes this path). Smaller maxima, reachable only with a tiny eps, take div.rn.
__device__ __forceinline__ float divide_by_max(float amax, float fmax, float inverse_fmax) {
  constexpr float kMinFastAmax = 8.673617379884035e-19f;  // 2^-60
  if (amax >= kMinFastAmax) {
    return divide_fast(amax, fmax, inverse_fmax);
  }
  return div_rn(amax, fmax);
}

// UE8M0 scales ------------------------------------------------------------------------------------
// The exponent byte of docs/spec.md section 3 item 3: y = max(RN(amax / fmax), floor), then
// y's biased exponent plus one if any mantissa bit is set (the smallest power of two >= y),
// computed from the bits of amax, fmax and floor without the division. amax is a positive,
// finite, normal float32 (at least eps); fmax and floor are positive normal floats.
// NOTES: with amax = ma * 2^ea and fmax = mf * 2^ef (ma, mf in [1, 2)), amax / fmax lies in
// (2^(ea - ef - 1), 2^(ea - ef)] when ma <= mf and in (2^(ea - ef), 2^(ea - ef + 1)) when
// ma > mf, so its ceiling exponent is ea - ef + (ma > mf), a comparison of mantissa bits.
// Rounding the quotient first changes nothing: RN lands on 2^n from above only for a quotient
// in (2^n, 2^n (1 + 2^-24)], i.e. ma in (mf, mf (1 + 2^-24)], an interval shorter than ma's
// step of 2^-23 that holds no float; landing on 2^(n-1) from above would need
// ma / mf <= (1 + 2^-24) / 2, impossible with ma >= 1 > mf / 2 (1 + 2^-24). The ceiling is
// monotone, so the floor is a maximum of exponents; a quotient below 2^-126 is far below the
// floor. tests/test_reference.py checks a transcription against the division over every
// bfloat16 and every float32 mantissa of five binades (a review also ran every positive normal
// float32 amax for the four formats' fmax: no difference).
__device__ __forceinline__ u32 ue8m0_exponent(float amax, float fmax, float floor) {
  const u32 a = __float_as_uint(amax), f = __float_as_uint(fmax), b = __float_as_uint(floor);
  const int ceiling = static_cast<int>(a >> 23) - (static_cast<int>(f >> 23) - kF32Bias) +
                      ((a & kF32Mantissa) > (f & kF32Mantissa));
  const int floor_ceiling = static_cast<int>(b >> 23) + ((b & kF32Mantissa) != 0u);
  return static_cast<u32>(max(ceiling, floor_ceiling));
}

}  // namespace fgq
