// Device helpers shared by the kernels: exact float32 arithmetic, input decoding, output
// encodings and UE8M0 scales. No kernels live here, and no CUDA header is included, so NVRTC needs
// nothing but itself (no cuda_fp8.h / cuda_bf16.h version pairing).
//
// NOTES: CuPy always appends -ftz=true to NVRTC options. Every float operation whose result can be
// subnormal is therefore written as PTX without .ftz (div.rn.f32, mul.rn.f32, fma.rn.f32), and
// magnitudes are compared as integers, so the kernels match the IEEE reference whatever flag the
// driver or CuPy passes.
#pragma once
// abi.cuh (the constants and Params) is written by fp8_group_quant/_abi.py
#include "abi.cuh"

namespace fgq {

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

// Template codes; the Python registries (_spec.py, _layout.py) name them in their rows.
enum InputType : int { kBF16 = 0, kF16 = 1, kF32 = 2 };
enum OutputType : int { kE4M3 = 0, kE5M2 = 1, kInt8 = 2, kE4M3FNUZ = 3 };
enum ScaleFormat : int { kFloat32Scale = 0, kUE8M0Scale = 1 };

// exact float32 arithmetic ---------------------------------------------------------------------

__device__ __forceinline__ float div_rn(float a, float b) {
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

__device__ __forceinline__ float mul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

__device__ __forceinline__ float add_rn(float a, float b) {
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

__device__ __forceinline__ float fma_rn(float a, float b, float c) {
  float r;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
}

// RN(sqrt(a)), IEEE round to nearest (no .ftz)
__device__ __forceinline__ float sqrt_rn(float a) {
  float r;
  asm("sqrt.rn.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}

// RN(1 / a), IEEE round to nearest (no .ftz)
__device__ __forceinline__ float rcp_rn(float a) {
  float r;
  asm("rcp.rn.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}

// Divisors at least this large take the reciprocal path of divide_fast.
constexpr float kMinFastDivisor = 8.271806125530277e-25f;  // 2^-80

// RN(v / s) given r = RN(1 / s), in three instructions instead of a full division.
// NOTES: Markstein's theorem: with r the correctly rounded reciprocal and q = RN(v * r) within an
// ulp of v / s, the residual v - s * q is exact under FMA and RN(q + residual * r) is the correctly
// rounded quotient. Needs s >= 2^-80 (so 1/s is finite and residuals of quotients that can round
// to a nonzero code do not underflow); the sign is re-applied so that -0 / s stays -0.
__device__ __forceinline__ float divide_fast(float v, float s, float r) {
  const float q = mul_rn(v, r);
  const float residual = fma_rn(-q, s, v);
  const float rounded = fma_rn(residual, r, q);
  return __uint_as_float(__float_as_uint(rounded) | (__float_as_uint(v) & 0x80000000u));
}

// n / d for n < 2^31, as a multiply and a shift: magic = ceil(2^shift / d) with
// shift = 31 + ceil(log2 d), both from _launch.divisor() on the host.
// NOTES: Granlund and Montgomery (1994), theorem 4.2 with N = 31: magic * d - 2^shift < d, which
// makes the quotient exact for every n < 2^31; magic < 2^32 holds for every d >= 1.
__device__ __forceinline__ u32 divide_u31(u32 n, u32 magic, u32 shift) {
  return static_cast<u32>((static_cast<unsigned long long>(n) * magic) >> shift);
}

// Programmatic Dependent Launch (sm_90 and newer; no-ops before, and when the launch did not ask
// for it). wait: block until the grid this one depends on has finished and its writes are
// visible; signal: let the dependent grid start its prologue (it still waits for our end).
__device__ __forceinline__ void wait_for_producer() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void signal_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// ask for `bytes` (a multiple of 16) from `src` (16-byte aligned) into L2, issued by one thread
// (a bulk prefetch; sm_90 and newer, a no-op before)
__device__ __forceinline__ void prefetch_l2(const void* src, u32 bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
#endif
}

// max(a, b), NaN if either is NaN (max.NaN, sm_80 and newer)
__device__ __forceinline__ float max_keeping_nan(float a, float b) {
  float m;
  asm("max.NaN.ftz.f32 %0, %1, %2;" : "=f"(m) : "f"(a), "f"(b));
  return m;
}

// packed unsigned 16-bit maximum (one instruction on sm_90 and newer)
__device__ __forceinline__ u32 max_u16x2(u32 a, u32 b) {
#if __CUDA_ARCH__ >= 900
  u32 r;
  asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  return __vmaxu2(a, b);
#endif
}

// input types --------------------------------------------------------------------------------------
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
    u32 m = w[0] & 0x7fff7fffu;
#pragma unroll
    for (int i = 1; i < kLaneWords; ++i) m = max_u16x2(m, w[i] & 0x7fff7fffu);
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
  static constexpr u32 kSign = 0x80000000u;
  static constexpr u32 kInf = 0x7f800000u;
  __device__ static __forceinline__ u32 raw(const u32 (&w)[kLaneWords], int i) { return w[i]; }
  __device__ static __forceinline__ u32 f32_bits(const u32 (&w)[kLaneWords], int i) { return w[i]; }
  __device__ static __forceinline__ u32 max_magnitude(const u32 (&w)[kLaneWords]) {
    u32 m = w[0] & 0x7fffffffu;
#pragma unroll
    for (int i = 1; i < kLaneWords; ++i) m = max(m, w[i] & 0x7fffffffu);
    return m;
  }
  __device__ static __forceinline__ float magnitude_to_f32(u32 m) { return __uint_as_float(m); }
};

// largest finite magnitude of a lane: the slow path, for groups holding Inf or NaN
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
  static constexpr u32 kInf = 0x7f800000u;
  __device__ static __forceinline__ float value(const FloatLane<kValues>& f, int i) { return f.v[i]; }
  static constexpr int kRawType = kF32;
  __device__ static __forceinline__ u32 raw(const FloatLane<kValues>& f, int i) {
    return __float_as_uint(f.v[i]);
  }
  // NOTES: a float maximum that keeps NaN (max.NaN, one instruction a value as fmaxf, which
  // skips NaN): a lane holding NaN reports NaN, whose magnitude bits lie above kInf, so it takes
  // the slow path as Inf does, and the caller need not say whether its values may be NaN (the
  // RMSNorm kernel tested its weight and sums for that: fused step 21). Under CuPy's -ftz it
  // reads a subnormal as 0, which changes nothing: amax is at least eps, a normal float
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
      const u32 magnitude = __float_as_uint(f.v[i]) & 0x7fffffffu;
      m = max(m, magnitude < kInf ? magnitude : 0u);
    }
    return m;
  }
  __device__ static __forceinline__ float magnitude_to_f32(u32 m) { return __uint_as_float(m); }
};

// output encodings -------------------------------------------------------------------------------
// A format's trait holds its instructions only: encode4(t) returns the codes of four scaled values
// t = v / s, t[j] in bits 8j to 8j + 7, for finite inputs. Its numbers (fmax, the codes of NaN and
// Inf) live in one Python table, _spec.OUTPUT_FORMATS, and reach the kernel through Params.
// kLean: the format's encoding fits the 40-register budget of six resident blocks per SM.
// kCodeExponent: encode4 takes t * 2^kCodeExponent, so that a caller multiplying by a power of
// two folds the factor into its own multiply (exact: |t| <= fmax, far from overflow).

template <int kOut> struct Output;

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
    return codes & __vcmpne4(codes & 0x7f7f7f7fu, 0u);
  }
};

template <> struct Output<kInt8> {
  static constexpr bool kLean = false;
  static constexpr u32 kCodeExponent = 0;
  __device__ static __forceinline__ u32 encode4(const float (&t)[4]) {
    // NOTES: the spec's clamp to +-127 never binds for a finite input: |v| <= amax and
    // s >= RN(amax / 127) (a power of two at least that for UE8M0), so |v / s| <= 127.002 even
    // when s is subnormal (relative error <= 1.5e-5 for amax >= eps >= 2^-126), and the rounded
    // code stays in [-127, 127]. Rounding is then one add: RN(t + 1.5 * 2^23) is the float whose
    // low mantissa byte holds round-half-even(t) in two's complement. Non-finite inputs are
    // patched afterwards. This replaces two FMNMX, an F2I (quarter rate) and a mask per value.
    u32 b[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = __float_as_uint(add_rn(t[j], 12582912.0f));
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
  if (amax >= 8.673617379884035e-19f) {  // 2^-60
    return divide_fast(amax, fmax, inverse_fmax);
  }
  return div_rn(amax, fmax);
}

// NVFP4 (docs/spec.md, section 4a) ------------------------------------------------------------
constexpr float kE2M1Max = 6.0f;
constexpr float kE4M3Max = 448.0f;

// the e4m3 byte of u >= 0, rounded to nearest even (subnormals included), saturated to 448
__device__ __forceinline__ u32 e4m3_byte(float u) {
  u16 r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(fminf(u, kE4M3Max)));
  return r & 0xffu;
}

// the float32 value of a non-negative e4m3 byte (exact)
__device__ __forceinline__ float e4m3_value(u32 byte) {
  const u32 exponent = (byte >> 3) & 15u, mantissa = byte & 7u;
  if (exponent == 0u) return mul_rn(static_cast<float>(mantissa), 0.001953125f);  // m * 2^-9
  return __uint_as_float(((exponent + 120u) << 23) | (mantissa << 20));
}

// the three magnitude bits of the e2m1 code of m >= 0 (not NaN): m rounded to nearest on
// 0, 0.5, 1, 1.5, 2, 3, 4, 6, ties to the even code, saturating at 6 (the sign is bit 3)
// NOTES: the grid has step 2^(k-1) on [2^k, 2^(k+1)) for k = 1, 2 and 0.5 below 2, so with
// k = (m >= 2) + (m >= 4) the code is RNE(m * 2^(1-k)) + 2k, capped at 7: the scaling is
// exact and the add of 1.5 * 2^23 rounds once, to nearest even (the integer in the low
// mantissa bits). Checked against the scalar model at every tie (tests/test_nvfp4.py).
__device__ __forceinline__ u32 e2m1_magnitude(float m) {
  const u32 k = (m >= 2.0f) + (m >= 4.0f);
  const float step = __uint_as_float(0x40000000u - (k << 23));  // 2^(1-k)
  const u32 rounded = __float_as_uint(fma_rn(m, step, 12582912.0f)) - 0x4B400000u;
  return min(rounded + 2u * k, 7u);
}

// eight 4-bit codes in one word, code i in bits 4i to 4i + 3
// NOTES: written as adds of shifted values (the codes do not overlap), which compile to one
// shift-and-add (LEA) each: 7 instructions for 8 codes instead of a shift and an or per code
__device__ __forceinline__ u32 pack_nibbles(const u32 (&c)[8]) {
  const u32 b0 = c[0] + (c[1] << 4), b1 = c[2] + (c[3] << 4);
  const u32 b2 = c[4] + (c[5] << 4), b3 = c[6] + (c[7] << 4);
  return (b0 + (b1 << 8)) + ((b2 + (b3 << 8)) << 16);
}

// UE8M0 scales -----------------------------------------------------------------------------------
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
  const int ceiling = static_cast<int>(a >> 23) - (static_cast<int>(f >> 23) - 127) +
                      ((a & 0x7fffffu) > (f & 0x7fffffu));
  const int floor_ceiling = static_cast<int>(b >> 23) + ((b & 0x7fffffu) != 0u);
  return static_cast<u32>(max(ceiling, floor_ceiling));
}

}  // namespace fgq
