// Device helpers shared by the kernels: raw loads, exact float32 arithmetic, output encodings and
// UE8M0 scales. No kernels live here, and no CUDA header is included, so NVRTC needs nothing but
// itself (no cuda_fp8.h / cuda_bf16.h version pairing).
//
// NOTES: CuPy always appends -ftz=true to NVRTC options. Every float operation whose result can be
// subnormal is therefore written as PTX without .ftz (div.rn.f32, mul.rn.f32) and absolute values
// and maxima are taken on the integer bits, so the kernels match the IEEE reference whatever flag
// the driver or CuPy passes.
#pragma once

namespace fgq {

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

// Template codes; _launch.py spells the same names in its name expressions.
enum InputType : int { kBF16 = 0, kF16 = 1, kF32 = 2 };
enum OutputType : int { kE4M3 = 0, kE5M2 = 1, kInt8 = 2 };
enum ScaleKind : int { kFloatScale = 0, kPow2Scale = 1, kPackedUE8M0 = 2 };

constexpr u32 kAbsMask = 0x7fffffffu;
constexpr u32 kInfBits = 0x7f800000u;

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

// input types: bits of one element to float32 (exact) ------------------------------------------

template <int kIn> struct Input;

template <> struct Input<kBF16> {
  typedef u16 Storage;
  static constexpr int kBytes = 2;
  __device__ static __forceinline__ u32 to_f32_bits(u32 raw) { return raw << 16; }
};

template <> struct Input<kF16> {
  typedef u16 Storage;
  static constexpr int kBytes = 2;
  __device__ static __forceinline__ u32 to_f32_bits(u32 raw) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<u16>(raw)));
    // NOTES: cvt returns the canonical (positive) NaN; carry the input's sign so that a negative
    // NaN encodes as one, as it does from bfloat16 and float32 (a no-op for every other value)
    return __float_as_uint(f) | ((raw & 0x8000u) << 16);
  }
};

template <> struct Input<kF32> {
  typedef u32 Storage;
  static constexpr int kBytes = 4;
  __device__ static __forceinline__ u32 to_f32_bits(u32 raw) { return raw; }
};

// output encodings -------------------------------------------------------------------------------
// encode2(lo, hi) returns the codes of two values, lo in bits 0-7, hi in bits 8-15.

template <int kOut> struct Output;

template <> struct Output<kE4M3> {
  static constexpr float kMax = 448.0f;
  static constexpr u32 kNaN = 0x7f;  // ml_dtypes' NaN; the sign bit is carried over
  static constexpr bool kKeepsInf = false;
  static constexpr u32 kInf = 0;
  __device__ static __forceinline__ u32 encode2(float lo, float hi) {
    // NOTES: .satfinite rounds to nearest even and then clamps to +-448, which equals the spec's
    // clamp-then-round; non-finite inputs are patched by the caller.
    u16 r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
  }
};

template <> struct Output<kE5M2> {
  static constexpr float kMax = 57344.0f;
  static constexpr u32 kNaN = 0x7e;
  static constexpr bool kKeepsInf = true;
  static constexpr u32 kInf = 0x7c;
  __device__ static __forceinline__ u32 encode2(float lo, float hi) {
    u16 r;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
  }
};

template <> struct Output<kInt8> {
  static constexpr float kMax = 127.0f;
  static constexpr u32 kNaN = 0;  // NaN has no int8 code: it becomes 0
  static constexpr bool kKeepsInf = false;
  static constexpr u32 kInf = 0;
  __device__ static __forceinline__ u32 encode1(float v) {
    // NOTES: fminf/fmaxf turn NaN into a bound; NaN lanes are patched by the caller.
    v = fminf(fmaxf(v, -kMax), kMax);
    return static_cast<u32>(__float2int_rn(v)) & 0xffu;  // round half to even
  }
  __device__ static __forceinline__ u32 encode2(float lo, float hi) {
    return encode1(lo) | (encode1(hi) << 8);
  }
};

// code of a non-finite input, or the encoded code unchanged for a finite one
template <int kOut>
__device__ __forceinline__ u32 patch_nonfinite(u32 code, u32 in_bits) {
  typedef Output<kOut> Out;
  const u32 mag = in_bits & kAbsMask;
  const u32 sign = kOut == kInt8 ? 0u : (in_bits >> 24) & 0x80u;
  if (mag > kInfBits) return Out::kNaN | (Out::kNaN ? sign : 0u);
  if (Out::kKeepsInf && mag == kInfBits) return Out::kInf | sign;
  return code;
}

// UE8M0 scales -----------------------------------------------------------------------------------
// Exponent byte of the smallest power of two >= max(y, 1e-10): the biased exponent, plus one if
// any mantissa bit is set. y is positive and finite here.
__device__ __forceinline__ u32 ue8m0_exponent(float y) {
  const u32 bits = __float_as_uint(fmaxf(y, 1e-10f));
  return (bits >> 23) + ((bits & 0x7fffffu) != 0u);
}

}  // namespace fgq
