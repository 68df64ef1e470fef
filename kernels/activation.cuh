// Activations: what turns the loaded bytes into the values quantized. The kernels call the
// activation trait at the end of this file; the rest are the gated inputs,
// y = round(round(f(gate)) * up) with f SiLU or GELU, op by op in float32, and their
// shared-memory tables.
//
// NOTES: the definition is fp8_group_quant/activation.py (docs/spec.md, section 2a); every step
// here is the same IEEE operation in the same order (mul.rn / add.rn / div.rn, never contracted
// into an FMA, since NumPy has none in float32), so both backends agree bit for bit. The
// constants and the table are the float32 values that module computes; tests/test_activation.py
// reads them from this file and compares.
#pragma once
#include "common.cuh"
#include "formats.cuh"
#include "band_tables_bf16.cuh"

namespace fgq {

// template codes; the Python registry (_spec.INPUT_MODES) names them in its rows
enum Activation : int { kIdentity = 0, kSiluMul = 1, kGeluTanhMul = 2 };

// SiLU in float32 ---------------------------------------------------------------------------------

constexpr float kInvLn2x64 = 0x1.715476p+6f;  // RN(64 / ln 2)
constexpr float kLn2Over64Hi = 0x1.63p-7f;  // ln 2 / 64, 9 significant bits
constexpr float kLn2Over64Lo = -0x1.bd0106p-19f;  // RN(ln 2 / 64 - kLn2Over64Hi)
constexpr float kOneSixth = 0x1.555556p-3f;  // RN(1 / 6)

// 2^(j / 64) = hi + lo: RN(2^(j / 64)) and RN(2^(j / 64) - hi), interleaved
// NOTES: in global memory, read once per block (ExpTable::fill), not in constant memory: a
// variable in the constant space anywhere in the module costs every kernel launched from it
// 0.1-0.2 us a launch, whether the kernel reads it or not (docs/perf.md);
// tests/test_compile.py checks that the module declares none
__device__ __align__(8) const float kExpTable[128] = {
    0x1p+0f, 0x0p+0f, 0x1.02c9a4p+0f, -0x1.887fap-28f,
    0x1.059b0ep+0f, -0x1.9d4f52p-25f, 0x1.087452p+0f, -0x1.e2990ep-26f,
    0x1.0b5586p+0f, 0x1.9f3122p-25f, 0x1.0e3ec4p+0f, -0x1.a585ccp-25f,
    0x1.11301ep+0f, -0x1.fdb496p-25f, 0x1.1429aap+0f, 0x1.d525bcp-25f,
    0x1.172b84p+0f, -0x1.c15742p-27f, 0x1.1a35bep+0f, 0x1.6df96ep-25f,
    0x1.1d4874p+0f, -0x1.d2e8cap-25f, 0x1.2063b8p+0f, 0x1.0c519ap-25f,
    0x1.2387a6p+0f, 0x1.ceac48p-25f, 0x1.26b456p+0f, 0x1.789f38p-26f,
    0x1.29e9ep+0f, -0x1.5c0424p-25f, 0x1.2d285ap+0f, 0x1.b900c2p-26f,
    0x1.306fep+0f, 0x1.4636e2p-25f, 0x1.33c08cp+0f, -0x1.b37d2p-25f,
    0x1.371a74p+0f, -0x1.18aac6p-25f, 0x1.3a7db4p+0f, -0x1.634c02p-25f,
    0x1.3dea64p+0f, 0x1.824684p-25f, 0x1.4160a2p+0f, 0x1.f72e2ap-28f,
    0x1.44e086p+0f, 0x1.8624b4p-30f, 0x1.486a2cp+0f, -0x1.47d866p-25f,
    0x1.4bfdaep+0f, -0x1.593abcp-25f, 0x1.4f9b28p+0f, -0x1.2c5a6cp-25f,
    0x1.5342b6p+0f, -0x1.2c561p-25f, 0x1.56f474p+0f, -0x1.295b04p-25f,
    0x1.5ab07ep+0f, -0x1.5bd5ecp-27f, 0x1.5e76f2p+0f, -0x1.4a5bd6p-25f,
    0x1.6247ecp+0f, -0x1.f8b55p-25f, 0x1.662388p+0f, 0x1.2a9112p-27f,
    0x1.6a09e6p+0f, 0x1.9fcef4p-26f, 0x1.6dfb24p+0f, -0x1.cd72e8p-27f,
    0x1.71f75ep+0f, 0x1.1d8beep-25f, 0x1.75feb6p+0f, -0x1.37b306p-25f,
    0x1.7a1148p+0f, -0x1.829fdp-25f, 0x1.7e2f34p+0f, -0x1.261634p-25f,
    0x1.82589ap+0f, -0x1.accc7cp-26f, 0x1.868d9ap+0f, -0x1.2edb44p-26f,
    0x1.8ace54p+0f, 0x1.15506ep-27f, 0x1.8f1aeap+0f, -0x1.baa232p-26f,
    0x1.93737cp+0f, -0x1.e64744p-25f, 0x1.97d82ap+0f, -0x1.0d8d84p-31f,
    0x1.9c4918p+0f, 0x1.51f848p-27f, 0x1.a0c668p+0f, -0x1.2886a6p-26f,
    0x1.a5503cp+0f, -0x1.b83b54p-25f, 0x1.a9e6b6p+0f, -0x1.50c048p-25f,
    0x1.ae89fap+0f, -0x1.a94b14p-26f, 0x1.b33a2cp+0f, -0x1.ec3a82p-26f,
    0x1.b7f77p+0f, -0x1.a09438p-25f, 0x1.bcc1eap+0f, -0x1.f687c6p-25f,
    0x1.c199bep+0f, -0x1.3d56b2p-27f, 0x1.c67f12p+0f, 0x1.cafa2ap-25f,
    0x1.cb720ep+0f, -0x1.8837ccp-27f, 0x1.d072d4p+0f, 0x1.40f13p-25f,
    0x1.d5818ep+0f, -0x1.822dbcp-27f, 0x1.da9e6p+0f, 0x1.ed9942p-27f,
    0x1.dfc974p+0f, -0x1.908c94p-25f, 0x1.e502eep+0f, 0x1.e2cffep-26f,
    0x1.ea4afap+0f, 0x1.52486cp-27f, 0x1.efa1bep+0f, 0x1.cc2b44p-25f,
    0x1.f50766p+0f, -0x1.246ebp-26f, 0x1.fa7c18p+0f, 0x1.9e90d8p-28f,
};

// the table in shared memory: the lanes of a warp index it at random; filled once per block
// before any return
struct ExpTable {
  float2 entries[64];
  __device__ __forceinline__ void fill() {
    // NOTES: a loop, so that blocks of fewer than 64 threads (Tuning.one_pass_threads allows
    // 32) fill every entry too
    for (int i = threadIdx.x; i < 64; i += blockDim.x) {
      entries[i] = __ldg(reinterpret_cast<const float2*>(kExpTable) + i);
    }
    __syncthreads();
  }
  // as BandTable's; the one-pass kernel starts before its loads and waits after them, so
  // the fill and its barrier go in wait()
  __device__ __forceinline__ void start(bool) {}
  __device__ __forceinline__ void wait(bool) { fill(); }
};

// v * 2^n for n in [-190, 127], rounded once: one multiply, or for n < -126 an exact scaling
// by 2^-64 first
__device__ __forceinline__ float power_of_two(int e) {
  return __uint_as_float(static_cast<u32>(e + kF32Bias) << 23);
}

__device__ __forceinline__ float scale_by_power_of_two(float v, int n) {
  if (n < -126) return mul_rn(mul_rn(v, power_of_two(-64)), power_of_two(n + 64));
  return mul_rn(v, power_of_two(n));
}

// exp(x) ~ m * 2^n for x in [-110, 110]; returns m, sets n
// NOTES: the same operations as the definition, in cheaper instructions: rint(t) for
// |t| < 2^22 is RN(t + kRoundMagic) - kRoundMagic, both steps exact but the first, which rounds
// ties to even as cvt.rni does, and k is the difference of the sum's bits from the constant's:
// two adds and an integer subtract instead of the quarter-rate F2I and I2F.
// k * kLn2Over64Hi is exact (9 significant bits times |k| < 2^14), so x minus it is one fma.
__device__ __forceinline__ float exp_parts(float x, const ExpTable& table, int& n) {
  const float biased = add_rn(mul_rn(x, kInvLn2x64), kRoundMagic);
  const int k = static_cast<int>(__float_as_uint(biased) - __float_as_uint(kRoundMagic));
  const float kf = add_rn(biased, -kRoundMagic);  // exact: |k| < 2^14
  const float r = add_rn(fma_rn(-kf, kLn2Over64Hi, x), -mul_rn(kf, kLn2Over64Lo));
  const float p = add_rn(r, mul_rn(mul_rn(r, r), add_rn(mul_rn(r, kOneSixth), 0.5f)));
  const float2 t = table.entries[k & 63];
  n = k >> 6;  // (k - j) / 64, an arithmetic shift
  return add_rn(t.x, add_rn(t.y, mul_rn(t.x, p)));
}

__device__ __forceinline__ float canonical_nan(float v) {
  return v != v ? __uint_as_float(kF32QuietNaN) : v;
}

// SiLU in float32, as activation.silu; kSplit and kLimit are that module's SPLIT and -NEG_LIMIT
__device__ __forceinline__ float silu(float g, const ExpTable& table) {
  constexpr float kSplit = -64.0f;  // below: g * exp(g), as exp(-g) would pass 2^92
  constexpr float kLimit = 110.0f;  // below -kLimit: -0; exp's argument range
  const bool far = g < kSplit;
  float x = g >= 0.0f ? -fminf(g, kLimit) : -g;
  if (far) x = fmaxf(g, -kLimit);
  if (g != g) x = 0.0f;
  int n;
  const float m = exp_parts(x, table, n);
  float s;
  if (far) {
    s = g < -kLimit ? -0.0f : scale_by_power_of_two(mul_rn(g, m), n);
  } else {
    s = div_rn(g, add_rn(1.0f, scale_by_power_of_two(m, n)));
  }
  return canonical_nan(s);
}

// round_to_input(f(g)) * up: the tables a block holds in shared memory for the gated inputs -------

// float16 and float32 gates: the arithmetic, with its exp table
struct SiluByArithmetic : ExpTable {
  // SiLU(gate) * up for a lane: gate words in, y words out (the input's encoding), given the
  // matching up words
  template <int kIn>
  __device__ __forceinline__ void mul_lane(u32 (&words)[kLaneWords],
                                           const u32 (&up)[kLaneWords]) const {
    u32 gate[kLaneWords];
#pragma unroll
    for (int w = 0; w < kLaneWords; ++w) gate[w] = words[w];
    map_lane<kIn>(words, [&](int i) {
      return mul_rn(round_to_input<kIn>(silu(value_of<kIn>(gate, i), *this)), value_of<kIn>(up, i));
    });
  }
};

// the constant of the band tables' bfloat16x2 products
// NOTES: a struct of its own name for what the module carries: under CuPy's
// --device-as-default-execution-space its static member is a device variable, and removing or
// renaming it moves the constant-bank slots the kernels read table addresses from
// (tools/same_code.py)
struct SiluBandTable {
  // NOTES: products as fma with -0 added (exact, and it keeps a product's -0), which sm_80 and
  // newer have; mul.bf16x2 needs sm_90
  static constexpr u32 kMinusZeros = 0x80008000u;
};

// bfloat16 gates of SiLU and GELU: the definition's result read from a table inside the
// activation's band (Band: SiluBand, GeluBand in band_tables_bf16.cuh), two rules outside it;
// activation.BandTable.lookup is the same lookup in NumPy, checked there against the
// definition for every gate
// NOTES: two values a step, in bfloat16x2 arithmetic where it gives the same bits: RN(g / 2) is
// one correctly rounded bf16 multiply, max.NaN(g, -0) the rule above the band, and
// RN_bf16(RN_f32(s * up)) equals the one correctly rounded bf16 product, since the exact product
// of two bfloat16 values has at most 16 significant bits (docs/spec.md, section 2a). A NaN
// this makes may carry a sign; quantize_group then encodes every NaN as +NaN (kUnsignedNaN).
// About 10 instructions a value, against 23 for SiLU's float32 arithmetic (docs/perf.md).
template <typename Band>
struct BandTable {
  static_assert(kSiluBandWords == 2048, "the band table: 4,096 entries, any 12-bit index");
  uint4 vectors[kSiluBandWords / 4];
  unsigned long long barrier;  // the bulk copy's mbarrier (sm_90 and newer)
  // NOTES: two ways to copy the table, both without registers and without a barrier before
  // wait(), so start() goes before the block's own loads: its requests (the table is read
  // from L2) then do not queue behind theirs (from DRAM). With `by_threads` false (and on
  // sm_90 and newer) one thread copies it with one bulk copy (the TMA engine) that completes
  // on an mbarrier, where a copy by every thread through registers costs about 90
  // instructions a thread. With `by_threads` every thread issues cp.async for its 16-byte
  // pieces, faster in grids of many blocks an SM and slower in grids of a few: the plan
  // chooses (Tuning.silu_table_waves; docs/perf.md). The table is constant data: no producer
  // writes it, so start() may come before wait_for_producer(). Blocks of the one-pass grid
  // take the module's kSiluBandReplicas copies of the table in turn (start); the walking
  // grids' blocks, which copy once each, the first (fill).
  // NOTES: several copies, since with one, read by every block of a one-pass grid from the
  // same L2 lines, the grid ran 0.1-0.4 us longer at M = 1024-2048, N = 7168 (docs/perf.md)
  __device__ __forceinline__ void start(bool by_threads) {
    copy(by_threads, reinterpret_cast<const uint4*>(Band::replica(blockIdx.x % kSiluBandReplicas)));
  }
  __device__ __forceinline__ void copy(bool by_threads, const uint4* source) {
#if __CUDA_ARCH__ >= 900
    if (by_threads) {
      copy_by_threads(source);
      return;
    }
    if (threadIdx.x == 0) {
      const u32 bar = static_cast<u32>(__cvta_generic_to_shared(&barrier));
      constexpr u32 kBytes = sizeof(vectors);
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar));
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(kBytes)
                   : "memory");
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
          ::"r"(static_cast<u32>(__cvta_generic_to_shared(vectors))), "l"(source),
          "r"(kBytes), "r"(bar)
          : "memory");
    }
#else
    copy_by_threads(source);
#endif
  }
  __device__ __forceinline__ void wait(bool by_threads) const {
#if __CUDA_ARCH__ >= 900
    if (!by_threads) {
      __syncthreads();  // the mbarrier is initialised before anyone waits on it
      const u32 bar = static_cast<u32>(__cvta_generic_to_shared(&barrier));
      u32 done = 0u;
      while (!done) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
            : "=r"(done) : "r"(bar) : "memory");
      }
      return;
    }
#endif
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
  }
  // the block's threads copy the table 16 bytes at a time with cp.async (sm_80 and newer)
  __device__ __forceinline__ void copy_by_threads(const uint4* source) {
    for (int i = threadIdx.x; i < kSiluBandWords / 4; i += blockDim.x) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                   ::"r"(static_cast<u32>(__cvta_generic_to_shared(vectors + i))), "l"(source + i)
                   : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  __device__ __forceinline__ void fill() {
    copy(false, reinterpret_cast<const uint4*>(Band::replica(0)));
    wait(false);
  }
  __device__ __forceinline__ u32 shared_base() const {
    return static_cast<u32>(__cvta_generic_to_shared(vectors));
  }
  // the entry at byte `offset` of the copy (zero-extended)
  __device__ __forceinline__ u32 entry(u32 base, u32 offset) const {
    u32 value;
    // NOTES: volatile keeps the read after wait(); an explicit shared address,
    // since through a generic pointer NVRTC rebuilt the window address before every read
    asm volatile("ld.shared.u16 %0, [%1];" : "=r"(value) : "r"(base + offset));
    return value;
  }
  // 0xffff in each half of `w` whose bit 15 is set, else 0 (prmt's sign-replicating selector)
  static __device__ __forceinline__ u32 halves_signs(u32 w) {
    u32 mask;
    asm("prmt.b32 %0, %1, 0, 0xbb99;" : "=r"(mask) : "r"(w));
    return mask;
  }
  // NOTES: both gates of the word at once, each step one instruction for the pair but the
  // two reads and their addresses: the band classes as masks of the halves, the result chosen
  // by bitwise selects (activation.BandTable.lookup replays it)
  __device__ __forceinline__ u32 mul_pair(u32 base, u32 gate, u32 up) const {
    static_assert(Band::kSize <= 0x800u && kSiluNegativeEntry == 0x800u &&
                      Band::kFirst <= 0x8000u - Band::kSize,
                  "an entry is the sign at bit 11 and 11 bits of offset");
    constexpr u32 kPair = 0x10001u;
    constexpr u32 kMinusZeros = SiluBandTable::kMinusZeros;
    u32 half, above;  // RN(g * 0.5) and max.NaN(g, -0), both halves
    constexpr u32 kHalves = 0x3f003f00u;  // bfloat16 0.5 in both halves
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(half) : "r"(gate), "r"(kHalves), "r"(kMinusZeros));
    asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(above) : "r"(gate), "r"(kMinusZeros));
    // per half t = 0x8000 + |h| - first, with no carry between the halves (|h| <= 0x7fff):
    // bit 15 set from the band's first gate up, and inside the band its low 11 bits are the
    // offset; u = t - band (no borrow: t >= 0x8000 - first > band) has bit 15 past the band
    const u32 t = (gate & kHalfMagnitudes) + kPair * (0x8000u - Band::kFirst);
    const u32 u = t - kPair * Band::kSize;
    const u32 not_below = halves_signs(t);
    const u32 in_band = halves_signs(t & ~u);
    const u32 outside = (not_below & above) | (~not_below & half);
    const u32 index = t | ((gate >> 4) & 0x08000800u);  // each half's sign to its bit 11
    const u32 table = __byte_perm(entry(base, (index << 1) & 0x1ffeu),
                                  entry(base, (index >> 15) & 0x1ffeu), 0x5410);
    const u32 s = (in_band & table) | (~in_band & outside);
    u32 y;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(y) : "r"(s), "r"(up), "r"(kMinusZeros));
    return y;
  }
  // f(gate) * up for a lane: gate words in, y words out, given the matching up words
  template <int kIn>
  __device__ __forceinline__ void mul_lane(u32 (&words)[kLaneWords],
                                           const u32 (&up)[kLaneWords]) const {
    static_assert(kIn == kBF16, "a table of bfloat16 results");
    const u32 base = shared_base();
#pragma unroll
    for (int w = 0; w < kLaneWords; ++w) words[w] = mul_pair(base, words[w], up[w]);
  }
};

// the activation trait ----------------------------------------------------------------------------
// What the kernels ask of an activation: one struct per activation, and ActivationTrait<kAct>
// maps the template code Python passes (fgq::kIdentity, fgq::kSiluMul) to it. A new activation
// is an Activation code, its struct and its ActivationTrait, plus its NumPy definition.
//   kInputs       input lanes a lane of values reads: x alone, or a gated activation's gate
//                 and up
//   kUnsignedNaN  every NaN of the values is +NaN, whatever its sign bit (patch_nonfinite)
//   kSixBlocks    may run at six 256-thread blocks an SM (40 registers) where the rest of the
//                 instantiation fits them (min_blocks_per_sm)
//   kMaskedSlots  group slots a thread of quantize_masked loads together
//   Table<kIn>    what a block holds in shared memory: fill() for the walking grids, start()
//                 before the loads and wait() after them for the one-pass grid
//   load          issue a lane's loads: x into `words`, or the gate there and the up lane
//                 x_up_offset elements further into `up`
//   apply         what load() read -> the values quantized, in `words`
// NOTES: the numbers are enumerators, not static constexpr members: under CuPy's
// --device-as-default-execution-space such a member is a device variable that the module
// carries, and each one moves the constant-bank slots the kernels read table addresses from

// what a block holds for an activation without a table: nothing
struct NoTable {
  __device__ __forceinline__ void fill() {}
  __device__ __forceinline__ void start(bool) {}
  __device__ __forceinline__ void wait(bool) const {}
};

// x as loaded
struct IdentityActivation {
  enum : int { kInputs = 1, kMaskedSlots = kMaskedUnroll };
  enum : bool { kUnsignedNaN = false, kSixBlocks = true };
  template <int kIn> using Table = NoTable;
  template <int kIn, bool kVec16>
  __device__ static __forceinline__ void load(const Params& p,
                                              const typename Input<kIn>::Storage* src,
                                              u32 (&words)[kLaneWords], u32 (&up)[kLaneWords]) {
    load_lane<kIn, kVec16>(src, words);
  }
  template <int kIn, typename Shared>
  __device__ static __forceinline__ void apply(u32 (&words)[kLaneWords],
                                               const u32 (&up)[kLaneWords], const Shared& table) {}
};

// f(gate) * up, f SiLU or GELU. Its table: bfloat16's band of results (BandTable<Band>),
// `Arithmetic` for float16 and float32; either computes a lane (mul_lane). kMaskedSlots: two
// slots of gate and up (64 bytes each) fit the 64 registers of eight resident blocks without a
// spill, as three of x alone do
template <int kIn, typename Band, typename Arithmetic> struct GateTable {
  typedef Arithmetic Type;
};
template <typename Band, typename Arithmetic> struct GateTable<kBF16, Band, Arithmetic> {
  typedef BandTable<Band> Type;
};

// clamp_limit (docs/spec.md, section 2a): gate <= L and -L <= up <= L, L in the input's type;
// NaN stays NaN (min.NaN / max.NaN), as the definition's comparisons leave it
template <int kIn>
__device__ __forceinline__ void clamp_gate_up(float limit, u32 (&gate)[kLaneWords],
                                              u32 (&up)[kLaneWords]) {
#pragma unroll
  for (int w = 0; w < kLaneWords; ++w) {
    if constexpr (kIn == kF32) {
      float g = __uint_as_float(gate[w]), u = __uint_as_float(up[w]);
      asm("min.NaN.f32 %0, %0, %1;" : "+f"(g) : "f"(limit));
      asm("{ min.NaN.f32 %0, %0, %1; max.NaN.f32 %0, %0, %2; }" : "+f"(u) : "f"(limit), "f"(-limit));
      gate[w] = __float_as_uint(g);
      up[w] = __float_as_uint(u);
    } else {
      // exact conversions: the limit is a value of the input type
      const u32 high = input_pair<kIn>(limit, limit), low = input_pair<kIn>(-limit, -limit);
      if constexpr (kIn == kBF16) {
        asm("min.NaN.bf16x2 %0, %0, %1;" : "+r"(gate[w]) : "r"(high));
        asm("{ min.NaN.bf16x2 %0, %0, %1; max.NaN.bf16x2 %0, %0, %2; }"
            : "+r"(up[w]) : "r"(high), "r"(low));
      } else {
        asm("min.NaN.f16x2 %0, %0, %1;" : "+r"(gate[w]) : "r"(high));
        asm("{ min.NaN.f16x2 %0, %0, %1; max.NaN.f16x2 %0, %0, %2; }"
            : "+r"(up[w]) : "r"(high), "r"(low));
      }
    }
  }
}

template <typename Band, typename Arithmetic>
struct GatedMulActivation {
  enum : int { kInputs = 2, kMaskedSlots = kMaskedUnrollSilu };
  enum : bool { kUnsignedNaN = true, kSixBlocks = false };
  template <int kIn> using Table = typename GateTable<kIn, Band, Arithmetic>::Type;
  template <int kIn, bool kVec16>
  __device__ static __forceinline__ void load(const Params& p,
                                              const typename Input<kIn>::Storage* src,
                                              u32 (&words)[kLaneWords], u32 (&up)[kLaneWords]) {
    load_lane<kIn, kVec16>(src, words);
    load_lane<kIn, kVec16>(src + p.x_up_offset, up);
    // NOTES: a runtime value under a uniform branch: the unclamped calls pay one compare a
    // lane, and no instantiation is added
    if (__builtin_expect(p.clamp_limit < __uint_as_float(kF32Inf), 0)) {
      clamp_gate_up<kIn>(p.clamp_limit, words, up);
    }
  }
  template <int kIn, typename Shared>
  __device__ static __forceinline__ void apply(u32 (&words)[kLaneWords],
                                               const u32 (&up)[kLaneWords], const Shared& table) {
    table.template mul_lane<kIn>(words, up);
  }
};

// GELU (tanh approximation) in float32, as activation.gelu_tanh (docs/spec.md, section 2c) ------
// gelu(g) = g / (1 + exp(-2v)), v = sqrt(2/pi) (g + 0.044715 g^3), SiLU's shape with the sign
// folded: g / (1 + e) for g >= 0, (g e) / (1 + e) for g < 0, e = exp(-|2v|) <= 1, so 1 + e
// stays in [1, 2] and no branch is needed. e = 2^(x / 64) from the exponential's table, with
// x = -|w| and w = 2v * 64 / ln 2 one polynomial in g.
// NOTES: every float operation is PTX without .ftz (CuPy passes -ftz=true, under which fminf,
// fabsf, a negation or a float comparison flush a subnormal gate), the sign test an integer
// one. m 2^n is m 2^(n + 64), exact (n >= -160), times 2^-64, the one rounding.
__device__ __forceinline__ float gelu_tanh(float g, const ExpTable& table) {
  constexpr float kGateMin = -0x1p+4f;  // -16: every gelu below it rounds to -0
  constexpr float kA = 0x1.26aec2p+7f;  // RN(2 sqrt(2 / pi) 64 / ln 2)
  constexpr float kB = 0x1.a5a7dp+2f;   // RN(2 sqrt(2 / pi) 0.044715 * 64 / ln 2)
  constexpr float kWMin = -0x1.4p+13f;  // -10240: 2^(x / 64) = 2^-160 there, e is 0 before
  constexpr float kP1 = 0x1.62e484p-7f;  // 2^(f / 64) - 1 ~ f (kP1 + f kP2), |f| <= 1/2
  constexpr float kP2 = 0x1.ebfd44p-15f;
  constexpr float kTwoToMinus64 = 0x1p-64f;
  float c, x;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(c) : "f"(g), "f"(kGateMin));
  const float w = mul_rn(c, add_rn(kA, mul_rn(kB, mul_rn(c, c))));
  asm("{ .reg .f32 t; abs.f32 t, %1; neg.f32 t, t; max.f32 %0, t, %2; }"
      : "=f"(x) : "f"(w), "f"(kWMin));  // max(-|w|, kWMin); a NaN w gives kWMin
  // k = rint(x) and f = x - k, both exact (|x| < 2^22), as in exp_parts
  // NOTES: the table index and 2^(n + 64) come from the sum's bits b = bits(kRoundMagic) + k:
  // b's low 6 bits are j (the constant's are 0), and b << 17 is k << 17 (the constant's bits
  // shift out), whose bits from 23 up hold n (j's end below them)
  const float biased = add_rn(x, kRoundMagic);
  const u32 b = __float_as_uint(biased);
  const float f = sub_rn(x, add_rn(biased, -kRoundMagic));
  const float p = mul_rn(f, add_rn(kP1, mul_rn(f, kP2)));
  const float2 t = table.entries[b & 63u];
  const float m = add_rn(t.x, add_rn(t.y, mul_rn(t.x, p)));
  const u32 scale = ((b << 17) + (static_cast<u32>(64 + kF32Bias) << 23)) & ~kF32Mantissa;
  const float e = mul_rn(mul_rn(m, __uint_as_float(scale)), kTwoToMinus64);  // RN(m 2^n)
  const float s = __float_as_int(g) < 0 ? mul_rn(c, e) : c;
  return div_rn(s, add_rn(1.0f, e));
}

// float16 and float32 gates: the arithmetic, with section 2a's exp table
struct GeluByArithmetic : ExpTable {
  // GELU-tanh(gate) * up for a lane. float16: two GELUs rounded into one word by one cvt, times
  // the up word in one x2 fma with -0 added, which is RN(RN_f32(s * up)): the float32 product of
  // two float16 values is exact
  // NOTES: a NaN may carry either sign here; quantize_group encodes every NaN as +NaN
  // (kUnsignedNaN), so no value is canonicalised
  template <int kIn>
  __device__ __forceinline__ void mul_lane(u32 (&words)[kLaneWords],
                                           const u32 (&up)[kLaneWords]) const {
    constexpr u32 kMinusZeros = SiluBandTable::kMinusZeros;
#pragma unroll
    for (int w = 0; w < kLaneWords; ++w) {
      if constexpr (kIn == kF32) {
        const float g = __uint_as_float(words[w]);
        words[w] = __float_as_uint(mul_rn(gelu_tanh(g, *this), __uint_as_float(up[w])));
      } else {
        static_assert(kIn == kF16, "bfloat16 reads a table of results");
        const float lo = gelu_tanh(value_of<kIn>(words, 2 * w), *this);
        const float hi = gelu_tanh(value_of<kIn>(words, 2 * w + 1), *this);
        u32 y;
        asm("fma.rn.f16x2 %0, %1, %2, %3;"
            : "=r"(y) : "r"(input_pair<kIn>(lo, hi)), "r"(up[w]), "r"(kMinusZeros));
        words[w] = y;
      }
    }
  }
};

struct SiluMulActivation : GatedMulActivation<SiluBand, SiluByArithmetic> {};
struct GeluTanhMulActivation : GatedMulActivation<GeluBand, GeluByArithmetic> {};

template <int kAct> struct ActivationTrait;
template <> struct ActivationTrait<kIdentity> : IdentityActivation {};
template <> struct ActivationTrait<kSiluMul> : SiluMulActivation {};
template <> struct ActivationTrait<kGeluTanhMul> : GeluTanhMulActivation {};

// one lane's values: the activation's loads, then its arithmetic
template <int kIn, bool kVec16, int kAct, typename Table>
__device__ __forceinline__ void load_values(const Params& p,
                                            const typename Input<kIn>::Storage* src,
                                            const Table& table, u32 (&words)[kLaneWords]) {
  typedef ActivationTrait<kAct> Act;
  u32 up[kLaneWords];
  Act::template load<kIn, kVec16>(p, src, words, up);
  Act::template apply<kIn>(words, up, table);
}

}  // namespace fgq
