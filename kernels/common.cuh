// What every kernel header uses: the integer types, the numbers, exact float32 arithmetic and
// the warp and launch helpers. No CUDA header is included, so NVRTC needs nothing but itself (no
// cuda_fp8.h / cuda_bf16.h version pairing).
//
// NOTES: CuPy always appends -ftz=true to NVRTC options. Every float operation whose result can be
// subnormal is therefore written as PTX without .ftz (div.rn.f32, mul.rn.f32, fma.rn.f32), and
// magnitudes are compared as integers, so the kernels match the IEEE reference whatever flag the
// driver or CuPy passes.
#pragma once
// the constants Python and the kernels share, and struct Params: written by fp8_group_quant/_abi.py
#include "abi.cuh"

namespace fgq {

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

// numbers -----------------------------------------------------------------------------------------
// NOTES: CuPy compiles with --device-as-default-execution-space, so a constexpr variable at
// namespace scope (or a static constexpr member of a class) is a device variable that the module
// carries, and each one declared before the SiLU tables moves the constant-bank slot from which
// the kernels read a table's address: that changes their machine code. So numbers are
// enumerators, a constexpr function, or constants local to their one user; the variables here
// (kRoundMagic, kMinFastDivisor), in abi.cuh and beside the tables are the module's as they were
enum : u32 {
  kAllLanes = 0xffffffffu,     // every lane of a warp: a shuffle, vote or ballot mask
  kF32Sign = 0x80000000u,      // float32's sign bit
  kF32Inf = 0x7f800000u,       // +Inf; a larger magnitude is NaN
  kF32QuietNaN = 0x7fc00000u,  // the positive quiet NaN, as NumPy writes it
  kF32Mantissa = 0x007fffffu,  // float32's mantissa bits
};
enum : int { kF32Bias = 127 };  // float32's exponent bias

// the largest finite float32 (std::numeric_limits<float>::max(); NVRTC has no <limits>)
__device__ __forceinline__ constexpr float float32_max() { return 3.4028234663852886e38f; }

// 1.5 * 2^23: for |t| < 2^22, RN(t + kRoundMagic) holds round-half-even(t) in its low mantissa
// bits, so the rounded integer is the sum's bits minus the constant's
constexpr float kRoundMagic = 12582912.0f;

// exact float32 arithmetic ------------------------------------------------------------------------

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

// a - b, one rounding (sub.rn: the subtrahend's sign flipped in the add, where a negation
// written in C++ is a separate neg.ftz.f32 under -ftz=true)
__device__ __forceinline__ float sub_rn(float a, float b) {
  float r;
  asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
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

// divisors at least this large take the reciprocal path of divide_fast
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
  return __uint_as_float(__float_as_uint(rounded) | (__float_as_uint(v) & kF32Sign));
}

// n / d for n < 2^31, as a multiply and a shift: magic = ceil(2^shift / d) with
// shift = 31 + ceil(log2 d), both from _plan.divisor() on the host.
// NOTES: Granlund and Montgomery (1994), theorem 4.2 with N = 31: magic * d - 2^shift < d, which
// makes the quotient exact for every n < 2^31; magic < 2^32 holds for every d >= 1.
__device__ __forceinline__ u32 divide_u31(u32 n, u32 magic, u32 shift) {
  return static_cast<u32>((static_cast<unsigned long long>(n) * magic) >> shift);
}

// warp and launch helpers -------------------------------------------------------------------------

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

// a bool as a type, so that a generic lambda compiles one body per value under a uniform branch
template <bool kValue> struct Flag {
  static constexpr bool value = kValue;
};

}  // namespace fgq
