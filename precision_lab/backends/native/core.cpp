// core.cpp: precision_lab._native, the compiled CPU backend of round_to, encode and decode.
//
// The arithmetic is the CUDA kernels' own: precision_lab/cuda/pl_round.cuh compiled as plain C++.
// Its per-element routines (pl_round_bits, pl_encode_rounded, pl_decode, pl_round_int) are the
// exact reference; this file adds what makes them fast on a CPU:
//
// - Blocks of BLOCK elements go through a tight, branch-free loop per rounding mode that rounds
//   the common case (magnitude within the format's normal range) by an integer add-and-mask on the
//   bit pattern, exactly as precision_lab/rounding.py does, and flags the other elements
//   (subnormal results, overflow, inf, NaN, negative inputs of unsigned formats). The compiler
//   vectorises these loops. A block with flagged elements gets a second vectorised pass: inputs
//   below the smallest normal are rounded to the fixed quantum there by an integer rounding of
//   their bit patterns with a per-element shift (the header's pl_low_fast / pl_low_code, every
//   mode; the stochastic ones read the element's full random word), overflows and infinities by
//   a compare and select. Only what is left (NaN, negative inputs of unsigned formats, formats
//   without a fixed quantum below their smallest normal) is redone by the header's exact
//   routine.
//   Rounding modes this file does not know (added to the header later) take the per-element
//   routine for every element.
// - Stochastic rounding uses the header's Philox4x64-10 words (pl_random_group's, from its round
//   pl_philox4x64_round with the round keys computed once per call: fill_random), keyed by
//   (seed, flat index) like precision_lab/_random.py, so chunking and threads do not matter. The
//   fast path gets each word already cut to its addend, in the working type's width; the exact
//   routine gets the full words (block_random).
// - round_to and encode share their passes over a block; what they store (result bits or codes)
//   is a template parameter (store_bits, store_codes).
// - float16 input is widened exactly to the working type; codes are written as uint8/16/32/64;
//   decode of formats of at most 16 bits is a lookup in a table the caller passes in.
// - Every entry point works on a range [lo, hi) of flat, C-contiguous buffers and releases the
//   GIL, so precision_lab.native spreads chunks of a large array over its thread pool.
//
// Python API (all buffers C-contiguous and native-endian; the itemsizes tell their dtypes: 2/4/8
// for float16/32/64 input, 4/8 for float32/64 output, 1/2/4/8 for uint codes; see the methods'
// docstrings and precision_lab/native/__init__.py). Each works on elements [lo, hi):
//   round_float / round_int: values rounded to the format, in the output's float type;
//   encode_float / encode_int: codes; they return 1 if a NaN met a format without a NaN code;
//   decode_table / decode_float / decode_int: values of codes; they return 1 if a code is out of
//   range (the caller then lets the numpy backend raise the error);
//   elementwise: add/sub/mul/fma/div/sqrt of float32/float16/bfloat16 operands correctly rounded to a
//   format whose values fit in float32 (precision_lab.ops; float32 results).
//   random_words: the random words stochastic rounding gives to a range of flat indices (tests).
// fmt is the tuple (exponent_bits, mantissa_bits, bias, nan_style, flags) of
// precision_lab.gpu.format_args; mode is the index in precision_lab.rounding.ROUNDING_MODES.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <string.h>
// x86-64 with GCC or Clang: AVX-512F and AVX2 copies of the random-word generator, used where the
// CPU has them (philox_groups_avx512, philox_groups_avx2); -DPL_NO_AVX512 / -DPL_NO_AVX2 leave
// them out.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if !defined(PL_NO_AVX512)
#define PL_PHILOX_AVX512 1
#endif
#if !defined(PL_NO_AVX2)
#define PL_PHILOX_AVX2 1
#endif
#if defined(PL_PHILOX_AVX512) || defined(PL_PHILOX_AVX2)
#include <immintrin.h>
#endif
#endif

#include "../cuda/pl_round.cuh"
#include "fpenv.h"

#ifndef PL_SOURCE_HASH
#define PL_SOURCE_HASH "unknown"
#endif

// x86-64 with GCC on Linux: the hot loops are compiled twice, for the baseline (SSE2) and for
// AVX2, and the loader picks one for the CPU it runs on (function multi-versioning: the binary
// stays portable; no -march flag). Elsewhere the baseline only.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(PL_NO_CLONES)
#define PL_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PL_CLONES
#endif

#if defined(__GNUC__)
#define PL_INLINE inline __attribute__((always_inline))  // into each clone: compiled for its ISA
#else
#define PL_INLINE inline
#endif

namespace {

const int BLOCK = 1024;  // elements per block: the block's scratch stays in L1

typedef unsigned char pl_u8;
typedef unsigned short pl_u16;

// ----- loading a block of input as bits of the working type (exact widening) --------------------
// float16 bits -> float32 bits, exactly, without branches (selects; the loops vectorise)
inline pl_u32 half_to_float_bits(pl_u16 h) {
  const pl_u32 sign = (pl_u32)(h & 0x8000u) << 16;
  const pl_u32 em = (pl_u32)(h & 0x7FFFu) << 13;  // exponent and mantissa at float32 positions
  const pl_u32 e = em & 0x0F800000u;
  const pl_u32 normal = em + 0x38000000u;                      // rebias by 127 - 15
  const pl_u32 special = em | 0x7F800000u;                     // inf, NaN (payload kept)
  // subnormal (or zero): m * 2**-24 = (1.m * 2**-14) - 2**-14, exact in float32
  const float sub = pl_f32_of(em + 0x38800000u) - 6.103515625e-05f;
  pl_u32 r = e == 0x0F800000u ? special : normal;
  r = e == 0 ? pl_bits_of(sub) : r;
  return sign | r;
}

inline pl_u64 float_bits_to_double_bits(pl_u32 u) { return pl_bits_of((double)pl_f32_of(u)); }

// Bits of elements [i0, i0 + n) of src (itemsize src_size) in the working type U; points into
// src itself when no conversion is needed.
template <typename U>
PL_INLINE const U* load_block(const void* src, int src_size, size_t i0, int n, U* buf);

template <>
PL_INLINE const pl_u32* load_block<pl_u32>(const void* src, int src_size, size_t i0, int n, pl_u32* buf) {
  if (src_size == 4) return (const pl_u32*)src + i0;
  const pl_u16* h = (const pl_u16*)src + i0;
  for (int i = 0; i < n; ++i) buf[i] = half_to_float_bits(h[i]);
  return buf;
}

template <>
PL_INLINE const pl_u64* load_block<pl_u64>(const void* src, int src_size, size_t i0, int n, pl_u64* buf) {
  if (src_size == 8) return (const pl_u64*)src + i0;
  if (src_size == 4) {
    const pl_u32* f = (const pl_u32*)src + i0;
    for (int i = 0; i < n; ++i) buf[i] = float_bits_to_double_bits(f[i]);
  } else {
    const pl_u16* h = (const pl_u16*)src + i0;
    for (int i = 0; i < n; ++i) buf[i] = float_bits_to_double_bits(half_to_float_bits(h[i]));
  }
  return buf;
}

// Value of element i of src as a double (exact), for the integer formats.
inline double load_double(const void* src, int src_size, size_t i) {
  if (src_size == 8) return pl_f64_of(((const pl_u64*)src)[i]);
  if (src_size == 4) return (double)pl_f32_of(((const pl_u32*)src)[i]);
  return (double)pl_f32_of(half_to_float_bits(((const pl_u16*)src)[i]));
}

// ----- random words of flat indices [start, start + n) ------------------------------------------
// The header's Philox4x64-10 words (pl_random_group), generated a range at a time. Its cost is the
// 20 64x64 -> 128-bit products of each group of 4 words. Measured on the development machine (one
// core, 1024-word ranges, ns per word): 2.4 when each product took a MUL and an IMUL (the header
// before pl_mul128); 1.6 with one MUL; 1.45 with BMI2's MULX and the state kept in registers
// (philox_whole_groups; 2 groups interleaved by hand: 1.57, slower); 1.35 with AVX-512F, 8 groups
// per vector from 32x32-bit products (philox_groups_avx512; AVX-512 and MULX groups mixed in one
// loop: slower). Both at about 5 cycles per word: the multiplier port (MULX) or the two vector
// ports (AVX-512) are busy. On CPUs without AVX-512 an AVX2 copy runs vector and MULX groups
// side by side (philox_groups_avx2: 2.70 -> 1.80 ns/word on an AMD Zen 3). The copies for BMI2,
// AVX2 and AVX-512 are picked at run time; the build stays portable (no -march flag).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(PL_NO_CLONES)
#define PL_CLONES_BMI2 __attribute__((noinline, target_clones("bmi2", "default")))
#else
#define PL_CLONES_BMI2
#endif

// The round keys of Philox4x64-10 under a seed (the same for every block: computed once per call).
struct philox_keys {
  pl_u64 k0[10], k1[10];
  explicit philox_keys(const pl_sr_key& key) {
    k0[0] = key.seed_lo;
    k1[0] = key.seed_hi;
    for (int r = 1; r < 10; ++r) {
      k0[r] = k0[r - 1] + PL_PHILOX_W0;
      k1[r] = k1[r - 1] + PL_PHILOX_W1;
    }
  }
};

// pl_random_group's four words of group g (unmasked), from the precomputed round keys.
PL_INLINE void philox_group(const philox_keys& k, pl_u64 g, pl_u64 w[4]) {
  w[0] = g;
  w[1] = w[2] = w[3] = 0;
  for (int r = 0; r < 10; ++r) pl_philox4x64_round(w, k.k0[r], k.k1[r]);
}

// What the generator writes for each element: out = (R)((word & keep) >> sh), the masked word
// itself (R = pl_u64, sh = 0: what the exact routine takes) or the addend of the stochastic modes'
// fast path (R: the working type's bits; sh = 64 - s for stochastic, 63 for stochastic_equal), so
// that the rounding loops over float32 stay in 32-bit lanes.
template <typename R>
PL_INLINE R word_out(pl_u64 w, pl_u64 keep, int sh) {
  return (R)((w & keep) >> sh);
}

// The outputs of the ng whole groups g, g+1, ... into out: the hot loop, written with one
// scalar per word, the rounds unrolled and the key folded in off the multiplications' path
// (c1 ^ k0 is ready before the product's high half): GCC then keeps the state in registers
// (10% faster than philox_group in this loop, which spilled).
template <typename R>
PL_INLINE void philox_whole_groups(const philox_keys& k, pl_u64 keep, int sh, pl_u64 g, size_t ng,
                                   R* __restrict out) {
  for (size_t q = 0; q < ng; ++q, ++g, out += 4) {
    pl_u64 c0 = g, c1 = 0, c2 = 0, c3 = 0;
#pragma GCC unroll 10
    for (int r = 0; r < 10; ++r) {  // pl_philox4x64_round
      pl_u64 hi0, hi1;
      const pl_u64 lo0 = pl_mul128(0xD2E7470EE14C6C93ULL, c0, &hi0);
      const pl_u64 lo1 = pl_mul128(0xCA5A826395121157ULL, c2, &hi1);
      c0 = hi1 ^ (c1 ^ k.k0[r]);
      c2 = hi0 ^ (c3 ^ k.k1[r]);
      c1 = lo1;
      c3 = lo0;
    }
    out[0] = word_out<R>(c0, keep, sh);
    out[1] = word_out<R>(c1, keep, sh);
    out[2] = word_out<R>(c2, keep, sh);
    out[3] = word_out<R>(c3, keep, sh);
  }
}

// AVX-512F: 32 whole groups at a time, 8 per vector (a lane per group, a vector per word). Each
// 64x64 -> 128-bit product from four 32x32 -> 64 products (vpmuludq) and carries; the shuffles
// take the 32-bit halves on the shuffle port, beside the multiplier. Returns the number of groups
// done (a multiple of 32); philox_whole_groups does the rest. Picked at run time where the CPU
// (and the OS) support AVX-512F.
#if defined(PL_PHILOX_AVX512)
#define PL_AVX512 __attribute__((target("avx512f")))

// hi:lo = a * m for the constant m = mh * 2**32 + ml (ml, mh broadcast)
PL_AVX512 inline void mul128_x8(__m512i a, __m512i ml, __m512i mh, __m512i* hi, __m512i* lo) {
  const __m512i a1 = _mm512_shuffle_epi32(a, _MM_PERM_DDBB);  // high halves (low dwords read)
  const __m512i p00 = _mm512_mul_epu32(a, ml), p01 = _mm512_mul_epu32(a, mh);
  const __m512i p10 = _mm512_mul_epu32(a1, ml), p11 = _mm512_mul_epu32(a1, mh);
  // t = p10 + floor(p00 / 2**32) and u = p01 + (t mod 2**32) stay below 2**64
  const __m512i t = _mm512_add_epi64(p10, _mm512_maskz_shuffle_epi32(0x5555, p00, _MM_PERM_DDBB));
  const __m512i u = _mm512_add_epi64(p01, _mm512_and_si512(t, _mm512_set1_epi64(0xFFFFFFFFLL)));
  const __m512i t_hi = _mm512_maskz_shuffle_epi32(0x5555, t, _MM_PERM_DDBB);  // t / 2**32
  const __m512i u_hi = _mm512_maskz_shuffle_epi32(0x5555, u, _MM_PERM_DDBB);
  *hi = _mm512_add_epi64(_mm512_add_epi64(p11, t_hi), u_hi);
  *lo = _mm512_mask_shuffle_epi32(p00, 0xAAAA, u, _MM_PERM_CCAA);  // low dword p00's, high u's
}

template <typename R>
PL_AVX512 __attribute__((noinline)) size_t philox_groups_avx512(const philox_keys& k, pl_u64 keep,
                                                                 int sh, pl_u64 g, size_t ng,
                                                                 R* __restrict out) {
  const int V = 4;  // vectors in flight: their multiplications overlap
  const __m512i m0l = _mm512_set1_epi64(0xE14C6C93LL), m0h = _mm512_set1_epi64(0xD2E7470ELL);
  const __m512i m1l = _mm512_set1_epi64(0x95121157LL), m1h = _mm512_set1_epi64(0xCA5A8263LL);
  const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i mask = _mm512_set1_epi64((long long)keep);
  // word order of a group after the transposition below
  const __m512i lo_pairs = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
  const __m512i hi_pairs = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  // ... and of the 32-bit outputs: group g's two halves (words 0 1, words 2 3) side by side
  const __m512i lo_groups = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0);
  const __m512i hi_groups = _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
  size_t q = 0;
  for (; q + 8 * V <= ng; q += 8 * V) {
    __m512i c0[V], c1[V], c2[V], c3[V];
    for (int v = 0; v < V; ++v) {
      c0[v] = _mm512_add_epi64(_mm512_set1_epi64((long long)(g + q + 8 * v)), lane);
      c1[v] = c2[v] = c3[v] = _mm512_setzero_si512();
    }
#pragma GCC unroll 10  // the rounds unrolled: no register copies for the rotation of the state
    for (int r = 0; r < 10; ++r) {  // pl_philox4x64_round, 8 groups per vector
      const __m512i k0 = _mm512_set1_epi64((long long)k.k0[r]);
      const __m512i k1 = _mm512_set1_epi64((long long)k.k1[r]);
      for (int v = 0; v < V; ++v) {
        __m512i hi0, lo0, hi1, lo1;
        mul128_x8(c0[v], m0l, m0h, &hi0, &lo0);
        mul128_x8(c2[v], m1l, m1h, &hi1, &lo1);
        c0[v] = _mm512_ternarylogic_epi64(hi1, c1[v], k0, 0x96);  // three-way xor
        c2[v] = _mm512_ternarylogic_epi64(hi0, c3[v], k1, 0x96);
        c1[v] = lo1;
        c3[v] = lo0;
      }
    }
    const __m128i count = _mm_cvtsi32_si128(sh);
    for (int v = 0; v < V; ++v) {
      const __m512i w0 = _mm512_srl_epi64(_mm512_and_si512(c0[v], mask), count);
      const __m512i w1 = _mm512_srl_epi64(_mm512_and_si512(c1[v], mask), count);
      const __m512i w2 = _mm512_srl_epi64(_mm512_and_si512(c2[v], mask), count);
      const __m512i w3 = _mm512_srl_epi64(_mm512_and_si512(c3[v], mask), count);
      R* o = out + 4 * (q + 8 * v);
      if constexpr (sizeof(R) == 4) {  // 32-bit outputs (below 2**32: sh >= 32)
        // a lane per group: words 0 and 1 (2 and 3) as the low and high dwords, in memory order
        const __m512i w01 = _mm512_mask_shuffle_epi32(w0, 0xAAAA, w1, _MM_PERM_CCAA);
        const __m512i w23 = _mm512_mask_shuffle_epi32(w2, 0xAAAA, w3, _MM_PERM_CCAA);
        _mm512_storeu_si512(o, _mm512_permutex2var_epi64(w01, lo_groups, w23));  // groups 0-3
        _mm512_storeu_si512(o + 16, _mm512_permutex2var_epi64(w01, hi_groups, w23));  // 4-7
      } else {  // 4 words x 8 groups -> 8 groups of 4 words, in memory order
        const __m512i ab_lo = _mm512_unpacklo_epi64(w0, w1);  // groups 0 2 4 6: words 0 1
        const __m512i ab_hi = _mm512_unpackhi_epi64(w0, w1);  // groups 1 3 5 7: words 0 1
        const __m512i cd_lo = _mm512_unpacklo_epi64(w2, w3);
        const __m512i cd_hi = _mm512_unpackhi_epi64(w2, w3);
        const __m512i x0 = _mm512_permutex2var_epi64(ab_lo, lo_pairs, cd_lo);  // groups 0, 2
        const __m512i x1 = _mm512_permutex2var_epi64(ab_hi, lo_pairs, cd_hi);  // groups 1, 3
        const __m512i x2 = _mm512_permutex2var_epi64(ab_lo, hi_pairs, cd_lo);  // groups 4, 6
        const __m512i x3 = _mm512_permutex2var_epi64(ab_hi, hi_pairs, cd_hi);  // groups 5, 7
        _mm512_storeu_si512(o, _mm512_shuffle_i64x2(x0, x1, 0x44));
        _mm512_storeu_si512(o + 8, _mm512_shuffle_i64x2(x0, x1, 0xEE));
        _mm512_storeu_si512(o + 16, _mm512_shuffle_i64x2(x2, x3, 0x44));
        _mm512_storeu_si512(o + 24, _mm512_shuffle_i64x2(x2, x3, 0xEE));
      }
    }
  }
  return q;
}

// Whether the CPU and the OS support AVX-512F (asked once).
bool have_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}
#endif

// AVX2 with BMI2 (x86-64 CPUs without AVX-512F, e.g. AMD Zen 2/3): per loop, 8 groups in two
// 4-lane vectors (each 64x64 -> 128-bit product from four 32x32 -> 64 products, vpmuludq) and 2
// groups in scalar registers (MULX) beside them: the vector and integer units work at the same
// time. Measured on an AMD EPYC (Zen 3, 2.45 GHz, no AVX-512; 16M words in blocks of 1024, one
// thread, min of 5): 2.70 ns/word MULX only (philox_whole_groups), 1.80 mixed as here; vectors
// alone 2.0 (2 or 3 in flight), 1 vector + 3 scalar 1.93, 2 + 1 1.86. Folding the first two
// rounds (counter words 1-3 are zero: 18 products instead of 20) changed nothing measurable (the
// loop is bound by instructions issued, not by the multipliers). Returns the number of groups
// done (a multiple of 10); philox_whole_groups does the rest.
#if defined(PL_PHILOX_AVX2)
#define PL_AVX2_BMI2 __attribute__((target("avx2,bmi2")))

// hi:lo = a * m for the constant m = mh * 2**32 + ml (ml, mh broadcast), 4 lanes
PL_AVX2_BMI2 inline void mul128_x4(__m256i a, __m256i ml, __m256i mh, __m256i* hi, __m256i* lo) {
  const __m256i low32 = _mm256_set1_epi64x(0xFFFFFFFFLL);
  const __m256i a1 = _mm256_srli_epi64(a, 32);
  const __m256i p00 = _mm256_mul_epu32(a, ml), p01 = _mm256_mul_epu32(a, mh);
  const __m256i p10 = _mm256_mul_epu32(a1, ml), p11 = _mm256_mul_epu32(a1, mh);
  // t = p10 + floor(p00 / 2**32) and u = p01 + (t mod 2**32) stay below 2**64
  const __m256i t = _mm256_add_epi64(p10, _mm256_srli_epi64(p00, 32));
  const __m256i u = _mm256_add_epi64(p01, _mm256_and_si256(t, low32));
  *hi = _mm256_add_epi64(_mm256_add_epi64(p11, _mm256_srli_epi64(t, 32)), _mm256_srli_epi64(u, 32));
  *lo = _mm256_blend_epi32(p00, _mm256_slli_epi64(u, 32), 0xAA);  // low dword p00's, high u's
}

template <typename R>
PL_AVX2_BMI2 __attribute__((noinline)) size_t philox_groups_avx2(const philox_keys& k, pl_u64 keep,
                                                                  int sh, pl_u64 g, size_t ng,
                                                                  R* __restrict out) {
  const int V = 2, S = 2, PER = 4 * V + S;  // vectors and scalar groups per loop
  const __m256i m0l = _mm256_set1_epi64x(0xE14C6C93LL), m0h = _mm256_set1_epi64x(0xD2E7470ELL);
  const __m256i m1l = _mm256_set1_epi64x(0x95121157LL), m1h = _mm256_set1_epi64x(0xCA5A8263LL);
  const __m256i lane = _mm256_set_epi64x(3, 2, 1, 0);
  const __m256i mask = _mm256_set1_epi64x((long long)keep);
  const __m128i count = _mm_cvtsi32_si128(sh);
  size_t q = 0;
  for (; q + PER <= ng; q += PER) {
    __m256i c0[V], c1[V], c2[V], c3[V];
    pl_u64 s0[S], s1[S], s2[S], s3[S];
    for (int v = 0; v < V; ++v) {
      c0[v] = _mm256_add_epi64(_mm256_set1_epi64x((long long)(g + q + 4 * v)), lane);
      c1[v] = c2[v] = c3[v] = _mm256_setzero_si256();
    }
    for (int s = 0; s < S; ++s) {
      s0[s] = g + q + 4 * V + s;
      s1[s] = s2[s] = s3[s] = 0;
    }
#pragma GCC unroll 10
    for (int r = 0; r < 10; ++r) {  // pl_philox4x64_round
      const __m256i k0 = _mm256_set1_epi64x((long long)k.k0[r]);
      const __m256i k1 = _mm256_set1_epi64x((long long)k.k1[r]);
      for (int v = 0; v < V; ++v) {
        __m256i hi0, lo0, hi1, lo1;
        mul128_x4(c0[v], m0l, m0h, &hi0, &lo0);
        mul128_x4(c2[v], m1l, m1h, &hi1, &lo1);
        c0[v] = _mm256_xor_si256(hi1, _mm256_xor_si256(c1[v], k0));
        c2[v] = _mm256_xor_si256(hi0, _mm256_xor_si256(c3[v], k1));
        c1[v] = lo1;
        c3[v] = lo0;
      }
      for (int s = 0; s < S; ++s) {
        pl_u64 hi0, hi1;
        const pl_u64 lo0 = pl_mul128(0xD2E7470EE14C6C93ULL, s0[s], &hi0);
        const pl_u64 lo1 = pl_mul128(0xCA5A826395121157ULL, s2[s], &hi1);
        s0[s] = hi1 ^ (s1[s] ^ k.k0[r]);
        s2[s] = hi0 ^ (s3[s] ^ k.k1[r]);
        s1[s] = lo1;
        s3[s] = lo0;
      }
    }
    for (int v = 0; v < V; ++v) {  // lane j holds group j's words: out[4 j + i] = word i's lane j
      const __m256i w0 = _mm256_srl_epi64(_mm256_and_si256(c0[v], mask), count);
      const __m256i w1 = _mm256_srl_epi64(_mm256_and_si256(c1[v], mask), count);
      const __m256i w2 = _mm256_srl_epi64(_mm256_and_si256(c2[v], mask), count);
      const __m256i w3 = _mm256_srl_epi64(_mm256_and_si256(c3[v], mask), count);
      R* o = out + 4 * (q + 4 * v);
      if constexpr (sizeof(R) == 4) {  // 32-bit outputs (below 2**32: sh >= 32)
        const __m256i w01 = _mm256_blend_epi32(w0, _mm256_slli_epi64(w1, 32), 0xAA);
        const __m256i w23 = _mm256_blend_epi32(w2, _mm256_slli_epi64(w3, 32), 0xAA);
        const __m256i ev = _mm256_unpacklo_epi64(w01, w23);  // groups 0 and 2
        const __m256i od = _mm256_unpackhi_epi64(w01, w23);  // groups 1 and 3
        _mm256_storeu_si256((__m256i*)o, _mm256_permute2x128_si256(ev, od, 0x20));
        _mm256_storeu_si256((__m256i*)(o + 8), _mm256_permute2x128_si256(ev, od, 0x31));
      } else {  // 4 words x 4 groups -> 4 groups of 4 words
        const __m256i t0 = _mm256_unpacklo_epi64(w0, w1);  // groups 0 2: words 0 1
        const __m256i t1 = _mm256_unpackhi_epi64(w0, w1);  // groups 1 3: words 0 1
        const __m256i t2 = _mm256_unpacklo_epi64(w2, w3);  // groups 0 2: words 2 3
        const __m256i t3 = _mm256_unpackhi_epi64(w2, w3);  // groups 1 3: words 2 3
        _mm256_storeu_si256((__m256i*)o, _mm256_permute2x128_si256(t0, t2, 0x20));
        _mm256_storeu_si256((__m256i*)(o + 4), _mm256_permute2x128_si256(t1, t3, 0x20));
        _mm256_storeu_si256((__m256i*)(o + 8), _mm256_permute2x128_si256(t0, t2, 0x31));
        _mm256_storeu_si256((__m256i*)(o + 12), _mm256_permute2x128_si256(t1, t3, 0x31));
      }
    }
    for (int s = 0; s < S; ++s) {
      R* o = out + 4 * (q + 4 * V + s);
      o[0] = word_out<R>(s0[s], keep, sh);
      o[1] = word_out<R>(s1[s], keep, sh);
      o[2] = word_out<R>(s2[s], keep, sh);
      o[3] = word_out<R>(s3[s], keep, sh);
    }
  }
  return q;
}

// Whether the CPU supports AVX2 and BMI2 (asked once).
bool have_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
  return yes;
}
#endif

// Which copy generates whole groups: PHILOX_AUTO picks the fastest the CPU has; the others force
// one (random_words' `path`, for the tests: every copy must give the same words).
enum { PHILOX_AUTO = -1, PHILOX_SCALAR = 0, PHILOX_AVX2 = 1, PHILOX_AVX512 = 2 };

// Whether this build and this CPU have the copy `path`.
bool philox_has(int path) {
  switch (path) {
    case PHILOX_SCALAR: return true;
#if defined(PL_PHILOX_AVX2)
    case PHILOX_AVX2: return have_avx2();
#endif
#if defined(PL_PHILOX_AVX512)
    case PHILOX_AVX512: return have_avx512();
#endif
    default: return false;
  }
}

// The copy PHILOX_AUTO stands for (asked once).
int philox_auto() {
  static const int path = philox_has(PHILOX_AVX512) ? PHILOX_AVX512
                          : philox_has(PHILOX_AVX2) ? PHILOX_AVX2
                                                    : PHILOX_SCALAR;
  return path;
}

// out[i] = word_out of the random word of flat index start + i, for i < n (n <= BLOCK).
template <typename R>
PL_CLONES_BMI2 void fill_random(const philox_keys& k, pl_u64 keep, int sh, size_t start, int n,
                                R* __restrict out, int path = PHILOX_AUTO) {
  const size_t end = start + (size_t)n;
  size_t g = start >> 2;
  pl_u64 w[4];
  if (start & 3) {  // the range starts inside a group: its words from start on
    philox_group(k, (pl_u64)g, w);
    for (size_t i = start; i < 4 * g + 4 && i < end; ++i) out[i - start] = word_out<R>(w[i & 3], keep, sh);
    ++g;
  }
  if (4 * g + 4 <= end) {  // whole groups
    const size_t ng = (end - 4 * g) / 4;
    size_t done = 0;
    if (path == PHILOX_AUTO) path = philox_auto();
#if defined(PL_PHILOX_AVX512)
    if (path == PHILOX_AVX512) done = philox_groups_avx512<R>(k, keep, sh, (pl_u64)g, ng, out + (4 * g - start));
#endif
#if defined(PL_PHILOX_AVX2)
    if (path == PHILOX_AVX2) done = philox_groups_avx2<R>(k, keep, sh, (pl_u64)g, ng, out + (4 * g - start));
#endif
    philox_whole_groups<R>(k, keep, sh, (pl_u64)(g + done), ng - done, out + (4 * (g + done) - start));
    g += ng;
  }
  if (4 * g < end) {  // the range ends inside a group
    philox_group(k, (pl_u64)g, w);
    for (size_t i = 4 * g; i < end; ++i) out[i - start] = word_out<R>(w[i & 3], keep, sh);
  }
}

// rw[i] = the (masked) random word of flat index start + i, for i < n (n <= BLOCK); path: the
// copy that generates the whole groups (PHILOX_AUTO: the fastest)
void fill_words(const pl_sr_key& key, size_t start, int n, pl_u64* __restrict rw,
                int path = PHILOX_AUTO) {
  fill_random<pl_u64>(philox_keys(key), pl_random_mask(key.random_bits), 0, start, n, rw, path);
  const pl_u64 mark = pl_random_mark(key.random_bits);  // the SR variants' marker bit
  if (mark)
    for (int i = 0; i < n; ++i) rw[i] |= mark;
}

// ra[i] = the fast path's addend (word_out with shift sh) of the masked word rw[i]
template <typename U>
PL_INLINE void addends_of_words(const pl_u64* __restrict rw, int sh, U* __restrict ra, int n) {
  for (int i = 0; i < n; ++i) ra[i] = (U)(rw[i] >> sh);
}

// 1 when the element with bits x needs the exact routine (constants passed by value, so that
// stores through byte pointers cannot alias them and the loops vectorise)
template <typename U>
PL_INLINE U needs_exact(U x, U keep, U thr, U range, U zero_fast) {
  const U a = x & keep;
  return (U)((U)(a - thr) > range) & ~(zero_fast & ((U)0 - (U)(a == 0)));
}

// ----- the fast path: constants of one job in the integer view of the working type --------------
template <typename F>
struct fast_consts {
  typedef typename pl_traits<F>::U U;
  int s;          // bits dropped in the format's normal range
  U notmask;      // keeps the format's bits
  U half_m1;      // 2**(s-1) - 1
  U flip;         // exponent-only formats whose bias parity differs from the working type's
  U keep;         // magnitude mask for the range test (all bits for unsigned formats)
  U thr, range;   // fast iff (bits & keep) - thr <= range
  U zero_fast;    // all ones when ±0 rounds to ±0 on the fast path
  // encoding
  U offset;       // bias difference, in code units
  int drop;       // sign shift from the working type's code position to the format's
  U sign_code;    // the format's sign bit (0 when unsigned)
  int nbits;

  explicit fast_consts(const pl_plan<F>& p) {
    const int W = pl_traits<F>::W;
    const pl_format& f = p.fmt;
    s = p.s;
    const U mask = s ? (((U)1 << s) - 1) : (U)0;
    notmask = ~mask;
    half_m1 = s ? (((U)1 << (s - 1)) - 1) : (U)0;
    flip = (U)p.flip_parity;
    keep = f.is_signed ? (((U)1 << (W - 1)) - 1) : ~(U)0;
    thr = p.threshold;
    range = p.maxbits - p.threshold;
    zero_fast = (f.is_signed && f.has_zero && f.nan_style != PL_NAN_FNUZ) ? ~(U)0 : (U)0;
    offset = (U)((U)(pl_i64)(pl_traits<F>::BIAS - f.bias) << f.mbits);
    nbits = pl_total_bits(f);
    drop = (W - 1 - s) - (nbits - 1);
    sign_code = f.is_signed ? ((U)1 << (nbits - 1)) : (U)0;
  }

};

// Rounded bits (low s bits not yet cleared) of the in-range element x, by mode; ra: the
// element's addend of the stochastic modes (see word_out; 0 for the others).
template <typename U, int MODE>
PL_INLINE U fast_round(U x, int s, U notmask, U half_m1, U flip, U ra) {
  const int W = (int)sizeof(U) * 8;
  const U mask = ~notmask;
  switch (MODE) {
    case PL_RNE:
      return (((x >> s) & 1) ^ flip) + half_m1 + x;
    case PL_RNA:
      return x + half_m1 + 1;
    case PL_RTZ:
      return x;
    case PL_RUP:
      return x + (((x >> (W - 1)) ^ 1) * mask);
    case PL_RDN:
      return x + ((x >> (W - 1)) * mask);
    case PL_RTO: {  // inexact: one quantum up when the kept part's code is even
      const U q = (U)1 << s;
      const U inexact = ((x & mask) + mask) & q;  // q iff a dropped bit is set (no compare)
      const U even = (x ^ ~(flip << s)) & q;      // q iff the kept part's code is even
      return (x & notmask) + (inexact & even);
    }
    case PL_RNZ:  // half the quantum less one: exact ties stay down
      return x + half_m1;
    case PL_SRE: {  // inexact: a whole quantum up iff the top random bit is set
      const U inexact = ((x & mask) + mask) >> s;
      return x + ((inexact & ra) << s);  // ra: the top random bit
    }
    default:  // PL_SR: add the top s bits of the random word below the kept part (ra)
      return x + ra;
  }
}

// The code of the in-range element x whose fast_round result is `rounded` (the element's sign
// moved to the format's sign bit).
template <typename U>
PL_INLINE U fast_code(U x, U rounded, int s, U offset, U low, int drop, U sign_code, U keep,
                      int top) {
  const int W = (int)sizeof(U) * 8;
  U k = (rounded >> s) - offset;
  k = (k & low) | ((k >> drop) & sign_code);     // the sign bit moves down to the format's
  const U zero = (U)0 - (U)((x & keep) == 0);  // ±0: the sign alone
  return (k & ~zero) | (((x >> (W - 1)) << top) & sign_code & zero);
}

// Calls fix(i) for each i < n with flag[i] != 0, scanning eight flags at a time (a block usually
// holds few flagged elements, if any); flag has room for n rounded up to a multiple of 8.
template <typename Fix>
PL_INLINE void scan_flags(pl_u8* flag, int n, Fix fix) {
  for (int i = n; i < ((n + 7) & ~7); ++i) flag[i] = 0;
  for (int i = 0; i < n; i += 8) {
    pl_u64 eight;
    memcpy(&eight, flag + i, 8);
    if (eight == 0) continue;
    for (int k = i; k < i + 8; ++k)
      if (flag[k]) fix(k);
  }
}

// flag[i] = 1 for each element of a block that the first pass flagged; returns their number.
template <typename F>
PL_INLINE int flag_block(const fast_consts<F>& c, const typename pl_traits<F>::U* __restrict b,
                         pl_u8* __restrict flag, int n) {
  typedef typename pl_traits<F>::U U;
  const U keep = c.keep, thr = c.thr, range = c.range, zero_fast = c.zero_fast;
  int count = 0;
  for (int i = 0; i < n; ++i) {
    const U f = needs_exact(b[i], keep, thr, range, zero_fast);
    flag[i] = (pl_u8)f;
    count += (int)f;
  }
  return count;
}

// Calls fix(i) for each flagged element of a block: the flags are computed in one vectorised
// pass and scanned eight at a time.
template <typename F, typename Fix>
PL_INLINE void for_flagged(const fast_consts<F>& c, const typename pl_traits<F>::U* __restrict b,
                        int n, Fix fix) {
  pl_u8 flag[BLOCK + 8];
  flag_block(c, b, flag, n);
  scan_flags(flag, n, fix);
}

// At most this many flagged elements in a block: the exact routine for each is cheaper than a
// second pass over the block.
const int FEW_FLAGGED = 24;

// ----- the fast paths outside the normal range -------------------------------------------------
// Blocks with flagged elements get a second vectorised pass: inputs below the smallest normal are
// rounded on their bit patterns (the header's pl_low_fast / pl_low_code; the stochastic modes
// with the elements' full random words, block_random::rw),
// finite inputs above the max and infinities by a compare and select between the first pass's
// result and per-sign constants (every mode with a fast path). What is left (NaN, negative inputs
// of unsigned formats, low inputs of formats without a fixed quantum) goes to the header's exact
// routine.
template <typename F>
struct edge_consts {
  typedef typename pl_traits<F>::U U;
  pl_low_plan<F> low;
  U low_on;           // all ones when the low path applies
  U over_on;          // all ones when the overflow path applies to round_to
  U over_code_on;     // ... and to encode (the overflow's codes exist)
  U maxbits;
  U over_res[2], inf_res[2];    // results of finite overflows and of infinities, by sign
  U over_code[2], inf_code[2];  // their codes

  edge_consts(const pl_plan<F>& p, bool exact_only) : low(pl_make_low_plan<F>(p)) {
    const bool on = !exact_only && p.mode <= PL_SRE;
    low_on = (on && low.ok) ? ~(U)0 : (U)0;
    over_on = on ? ~(U)0 : (U)0;
    maxbits = p.maxbits;
    int err = 0;
    for (int neg = 0; neg < 2; ++neg) {
      over_res[neg] = pl_overflow_bits(p, neg != 0, false);
      inf_res[neg] = pl_overflow_bits(p, neg != 0, true);
      over_code[neg] = (U)pl_encode_rounded(p, over_res[neg], &err);
      inf_code[neg] = (U)pl_encode_rounded(p, inf_res[neg], &err);
    }
    over_code_on = err ? (U)0 : over_on;
  }
};

// ----- whole ranges -----------------------------------------------------------------------------
template <typename F>
struct job {
  pl_plan<F> p;
  fast_consts<F> c;
  pl_sr_key key;
  bool random;      // the mode needs random words
  bool exact_only;  // no input takes the fast path: the format has no normal value, or the
                    // mode was added to the header after this file
  edge_consts<F> e;
  philox_keys pk;   // the random words: their round keys,
  pl_u64 keep;      // mask (random_bits)
  int sh;           // and the shift that gives the fast path's addends (word_out)
  job(const pl_format& f, int mode, int saturate, int flush, pl_sr_key k)
      : p(pl_make_plan<F>(f, mode, saturate, flush)),
        c(p),
        key(k),
        random(pl_is_stochastic(mode)),
        exact_only(mode > PL_SRE || p.maxbits < p.threshold),
        e(p, exact_only),
        pk(k),
        keep(pl_random_mask(k.random_bits)),
        sh(mode == PL_SRE ? 63 : 64 - (c.s ? c.s : 1)) {}
  pl_u64 word(size_t index) const {  // the (masked) random word of one flat index
    pl_u64 w[4];
    philox_group(pk, (pl_u64)(index >> 2), w);
    return (w[index & 3] & keep) | pl_random_mark(key.random_bits);
  }
};

// More flagged elements than this in a block of a stochastic mode: the block's random words are
// generated for all its elements (fill_words) rather than one group per flagged element.
const int FEW_WORDS = 32;

// Asks the CPU to fetch the cache lines of [p, p + bytes) (write: for writing).
PL_INLINE void prefetch_lines(const char* p, int bytes, int write) {
#if defined(__GNUC__)
  for (int k = 0; k < bytes; k += 64) {
    if (write) __builtin_prefetch(p + k, 1);
    else __builtin_prefetch(p + k, 0);
  }
#else
  (void)p, (void)bytes, (void)write;
#endif
}

// The random data of a block of a stochastic mode (MODE as a template argument): the fast path's
// addends ra (the working type's width: the rounding loops over float32 stay in 32-bit lanes) and
// the full words rw of the exact routine, generated only where a block has many flagged elements
// (else each flagged element's word is recomputed: job::word).
template <typename F, int MODE>
struct block_random {
  typedef typename pl_traits<F>::U U;
  enum { ADDENDS = MODE == PL_SR || MODE == PL_SRE };  // the fast path reads addends
  U ra[ADDENDS ? BLOCK : 1];
  pl_u64 rw[BLOCK];
  bool words = false;    // rw holds the block's words
  bool many = false;     // the previous block had many flagged elements: words first
  size_t i0 = 0;

  // before the passes over elements [i0, i0 + n), whose input and output start at `in` and `out`
  // (itemsizes in_size, out_size); low: the passes will round inputs below the smallest normal
  // (their path reads the full words)
  PL_INLINE void start(const job<F>& j, size_t i0_, int n, const void* in, int in_size, void* out,
                       int out_size, bool low) {
    i0 = i0_;
    words = false;
    if (!j.random) return;
    if (!ADDENDS || j.exact_only || many || low) {  // the words are needed: addends from them
      fill_words(j.key, i0, n, rw);
      words = true;
      if (ADDENDS && !j.exact_only) addends_of_words(rw, j.sh, ra, n);
      return;
    }
    // The addends a part at a time, the block's input and output fetched into the cache meanwhile:
    // the loads overlap the generator's arithmetic (else they would wait until it is done).
    const int PART = 128;
    for (int p = 0; p < n; p += PART) {
      const int m = n - p < PART ? n - p : PART;
      prefetch_lines((const char*)in + (size_t)p * in_size, m * in_size, 0);
      prefetch_lines((const char*)out + (size_t)p * out_size, m * out_size, 1);
      fill_random<U>(j.pk, j.keep, j.sh, i0 + (size_t)p, m, ra + p);
    }
  }
  // the block's full words (the low path of the stochastic modes), if not yet there
  PL_INLINE void ensure_words(const job<F>& j, int n) {
    if (j.random && !words) {
      fill_words(j.key, i0, n, rw);
      words = true;
    }
  }
  // after the passes: `flagged` elements go to the exact routine
  PL_INLINE void need(const job<F>& j, int n, int flagged) {
    many = flagged > FEW_WORDS;
    if (j.random && many && !words) {
      fill_words(j.key, i0, n, rw);
      words = true;
    }
  }
  pl_u64 word(const job<F>& j, int i) const {  // element i's word (0 for the other modes)
    return !j.random ? 0 : words ? rw[i] : j.word(i0 + (size_t)i);
  }
};

// yes ? a : b without a branch (the loops below vectorise)
template <typename B, typename U>
PL_INLINE U select(B yes, U a, U b) {
  const U m = (U)0 - (U)(yes != 0);
  return (a & m) | (b & ~m);
}

// How a block is processed, chosen from the previous block's elements (gradients come in long
// runs of tiny values): AFTER_FIRST, a second pass after the first pass (block_first) flagged
// elements; FUSED, one pass for everything (the previous block was mostly outside the normal
// range); LOW_IN / OVER_IN, one pass for the normal range and the inputs below the smallest normal
// / above the max; ALL_LOW / ALL_OVER, one pass for inputs below the smallest normal / above the
// max only. A pass of the last four kinds that meets an element it does not cover is redone FUSED.
enum { AFTER_FIRST = 0, FUSED = 1, LOW_IN = 2, OVER_IN = 3, ALL_LOW = 4, ALL_OVER = 5 };

// Counts of a block's elements below the smallest normal and above the max (fast paths on).
struct edge_count {
  int low = 0, over = 0;
  int next_kind(int n) const {  // the kind for the next block (-1: the plain first pass)
    if (low == n) return ALL_LOW;
    if (over == n) return ALL_OVER;
    if (4 * (low + over) <= n) return -1;
    return over == 0 ? LOW_IN : low == 0 ? OVER_IN : FUSED;
  }
};

// What the passes over a block store, as their template parameter S: store_bits, round_to's
// result bits (the working type's), or store_codes, encode's codes (type C). A policy holds the
// constants of its stores beyond fast_consts' (the loops copy it, so that stores through byte
// pointers cannot alias them; fast_consts' are passed in, to hold no constant twice: the loops
// keep them in registers) and says:
//   value(x, rounded, s, notmask, keep): the output of the in-range element x whose fast_round
//     result is rounded;
//   rounded_bits(rounded, v, notmask): its rounded bits (low s cleared) given also that output v;
//   low<MODE>(L, a, neg, rw): the output of an input below the smallest normal (pl_low_fast /
//     pl_low_code; rw: its full random word, stochastic modes);
//   over_on, over[sign], inf[sign]: the overflow path's switch and outputs (edge_consts);
//   READS_ROUNDED: the output is the rounded bits (a second pass reads them back);
//   exact(p, bits, rw, err): the output by the header's exact routine.
template <typename F>
struct store_bits {
  typedef typename pl_traits<F>::U U;
  typedef U T;  // the output's element type
  enum { READS_ROUNDED = 1 };
  U over_on, over[2], inf[2];
  store_bits(const fast_consts<F>&, const edge_consts<F>& e)
      : over_on(e.over_on), over{e.over_res[0], e.over_res[1]}, inf{e.inf_res[0], e.inf_res[1]} {}
  PL_INLINE U value(U, U rounded, int, U notmask, U) const { return rounded & notmask; }
  PL_INLINE U rounded_bits(U, U v, U) const { return v; }
  template <int MODE>
  PL_INLINE U low(const pl_low_plan<F>& L, U a, U neg, pl_u64 rw) const {
    return pl_low_fast<F>(L, MODE, a, neg, rw);
  }
  static T exact(const pl_plan<F>& p, U bits, pl_u64 rw, int*) { return pl_round_bits(p, bits, rw); }
};

template <typename F, typename C>
struct store_codes {
  typedef typename pl_traits<F>::U U;
  typedef C T;
  enum { READS_ROUNDED = 0 };
  int drop, top;
  U offset, low_bits, sign_code;
  U over_on, over[2], inf[2];
  store_codes(const fast_consts<F>& c, const edge_consts<F>& e)
      : drop(c.drop > 0 ? c.drop : 0), top(c.nbits - 1), offset(c.offset),
        low_bits(c.sign_code ? c.sign_code - 1 : ~(U)0), sign_code(c.sign_code),
        over_on(e.over_code_on), over{e.over_code[0], e.over_code[1]},
        inf{e.inf_code[0], e.inf_code[1]} {}
  PL_INLINE U value(U x, U rounded, int s, U, U keep) const {
    return fast_code(x, rounded, s, offset, low_bits, drop, sign_code, keep, top);
  }
  PL_INLINE U rounded_bits(U rounded, U, U notmask) const { return rounded & notmask; }
  template <int MODE>
  PL_INLINE U low(const pl_low_plan<F>& L, U a, U neg, pl_u64 rw) const {
    return pl_low_code<F>(L, MODE, a, neg, sign_code, rw);
  }
  static T exact(const pl_plan<F>& p, U bits, pl_u64 rw, int* err) {
    return (T)pl_encode_rounded(p, pl_round_bits(p, bits, rw), err);
  }
};

// The first pass over a block: out[i] = the output of b[i] as if in range; returns nonzero when
// some element is flagged (needs another path).
template <typename F, int MODE, typename S>
PL_INLINE typename pl_traits<F>::U block_first(const fast_consts<F>& c, const S store,
                                               const typename pl_traits<F>::U* __restrict b,
                                               typename S::T* __restrict out,
                                               const typename pl_traits<F>::U* __restrict ra,
                                               int n) {
  typedef typename pl_traits<F>::U U;
  const S st = store;
  const int s = c.s;
  const U notmask = c.notmask, half_m1 = c.half_m1, flip = c.flip;
  const U keep = c.keep, thr = c.thr, range = c.range, zero_fast = c.zero_fast;
  U any = 0;
  for (int i = 0; i < n; ++i) {
    const U x = b[i];
    const U rounded = fast_round<U, MODE>(x, s, notmask, half_m1, flip,
                                          (MODE == PL_SR || MODE == PL_SRE) ? ra[i] : 0);
    out[i] = (typename S::T)st.value(x, rounded, s, notmask, keep);
    any |= needs_exact(x, keep, thr, range, zero_fast);
  }
  return any;
}

// A pass over a block of KIND (see above): low and overflowing inputs get their outputs (and
// in-range ones too, except AFTER_FIRST where the first pass gave them); flag[i] = 1 for the
// elements still to do exactly. rw: the block's full random words (stochastic modes, kinds
// with the low path). Returns their number (kinds after FUSED: nonzero when the pass
// met an element it does not cover, and then the block must be redone FUSED).
template <typename F, int MODE, int KIND, typename S>
PL_INLINE int block_edges(const job<F>& j, const S store,
                          const typename pl_traits<F>::U* __restrict b,
                          typename S::T* __restrict out,
                          const typename pl_traits<F>::U* __restrict ra,
                          const pl_u64* __restrict rw, pl_u8* __restrict flag, int n,
                          edge_count* cnt) {
  typedef typename pl_traits<F>::U U;
  const int W = pl_traits<F>::W;
  const S st = store;
  const fast_consts<F>& c = j.c;
  const pl_low_plan<F> L = j.e.low;
  const int s = c.s;
  const U notmask = c.notmask, half_m1 = c.half_m1, flip = c.flip;
  const U keep = c.keep, thr = c.thr, range = c.range, zero_fast = c.zero_fast;
  const U abs_mask = ((U)1 << (W - 1)) - 1, inf = pl_traits<F>::inf_bits(), maxbits = j.e.maxbits;
  const U low_on = j.e.low_on, over_on = st.over_on;
  const U over0 = st.over[0], over1 = st.over[1], inf0 = st.inf[0], inf1 = st.inf[1];
  const bool IN = KIND <= OVER_IN, LOWP = KIND != OVER_IN && KIND != ALL_OVER;
  const bool OVERP = KIND != LOW_IN && KIND != ALL_LOW;
  // AFTER_FIRST reads the first pass's outputs back (and, where they are the rounded bits, does
  // not round again)
  const bool READ = KIND == AFTER_FIRST, ROUND = (IN || OVERP) && !(READ && S::READS_ROUNDED);
  U left = 0, n_low = 0, n_over = 0;
  for (int i = 0; i < n; ++i) {
    const U x = b[i], a = x & keep, neg = x >> (W - 1);
    const U low = LOWP ? low_on & ((U)0 - (U)(a < thr)) : (U)0;
    const U over = OVERP ? over_on & ((U)0 - (U)((a > maxbits) & (a <= inf))) : (U)0;
    const U rounded = ROUND ? fast_round<U, MODE>(x, s, notmask, half_m1, flip,
                                                  (MODE == PL_SR || MODE == PL_SRE) ? ra[i] : 0)
                            : (U)0;
    const U v = READ ? (U)out[i] : (IN || OVERP) ? st.value(x, rounded, s, notmask, keep) : (U)0;
    U res = IN ? v & ~(low | over) : (U)0;
    if (LOWP) {
      const pl_u64 w = (MODE == PL_SR || MODE == PL_SRE) ? rw[i] : 0;
      res |= st.template low<MODE>(L, a, neg, w) & low;
    }
    if (OVERP) {  // big, unless the input rounds down to the max (an infinite input never does)
      const U big = select(neg, select(a == inf, inf1, over1), select(a == inf, inf0, over0));
      res |= select((st.rounded_bits(rounded, v, notmask) & abs_mask) <= maxbits, v, big) & over;
    }
    out[i] = (typename S::T)res;
    const U ex = (IN ? needs_exact(x, keep, thr, range, zero_fast) : (U)1) & ~(low | over) & 1;
    flag[i] = (pl_u8)ex;
    left += ex;
    n_low += low & 1;
    n_over += over & 1;
  }
  cnt->low = (int)n_low;
  cnt->over = (int)n_over;
  return (int)left;
}

// The passes over one block of a range (range_mode): the first pass, the flags, the passes of
// each kind, as a functor for run_passes.
template <typename F, int MODE, typename S>
struct block_passes {
  typedef typename pl_traits<F>::U U;
  const job<F>& j;
  const S& st;
  const U* b;
  typename S::T* out;
  block_random<F, MODE>* rnd;
  pl_u8* flag;
  int n;
  edge_count* cnt;
  PL_INLINE bool first() const { return block_first<F, MODE>(j.c, st, b, out, rnd->ra, n) != 0; }
  PL_INLINE int flags() const { return flag_block(j.c, b, flag, n); }
  template <int KIND>
  PL_INLINE int edges() const {
    if ((MODE == PL_SR || MODE == PL_SRE) && KIND != OVER_IN && KIND != ALL_OVER && j.e.low_on)
      rnd->ensure_words(j, n);  // the low path reads the full words
    return block_edges<F, MODE, KIND>(j, st, b, out, rnd->ra, rnd->rw, flag, n, cnt);
  }
};

// The passes over a block whose kind is `kind` (-1: the first pass, then AFTER_FIRST if it
// flagged more than a few elements); returns the number of elements left to the exact routine,
// flagged in pass.flag. (A functor, not a lambda: a lambda would not be compiled for the
// instruction set of the clone that calls it.)
template <typename P>
PL_INLINE int run_passes(const P& pass, int kind) {
  int left;
  if (kind == ALL_LOW) left = pass.template edges<ALL_LOW>();
  else if (kind == ALL_OVER) left = pass.template edges<ALL_OVER>();
  else if (kind == LOW_IN) left = pass.template edges<LOW_IN>();
  else if (kind == OVER_IN) left = pass.template edges<OVER_IN>();
  else if (kind == FUSED) left = pass.template edges<FUSED>();
  else if (!pass.first()) left = 0;
  else if ((left = pass.flags()) > FEW_FLAGGED) left = pass.template edges<AFTER_FIRST>();
  if (left && kind > FUSED) left = pass.template edges<FUSED>();  // an element the pass does not
  return left;                                                     // cover: redo
}

// Elements [lo, hi) of src into dst, outputs of the policy S (store_bits: round_to, store_codes:
// encode); returns the exact routine's error flag (a NaN met a format without a NaN code).
template <typename F, int MODE, typename S>
PL_CLONES int range_mode(const job<F>& j, const void* src, int src_size, void* dst, size_t lo,
                         size_t hi) {
  typedef typename pl_traits<F>::U U;
  typedef typename S::T T;
  const S st(j.c, j.e);
  U buf[BLOCK];
  block_random<F, MODE> rnd;
  pl_u8 flag[BLOCK + 8];
  int err = 0;
  int kind = -1;  // of the next block: -1 the first pass, else see AFTER_FIRST ... ALL_OVER
  for (size_t i0 = lo; i0 < hi; i0 += BLOCK) {
    const int n = (int)(hi - i0 < (size_t)BLOCK ? hi - i0 : (size_t)BLOCK);
    const U* b = load_block<U>(src, src_size, i0, n, buf);
    T* out = (T*)dst + i0;
    const bool low_next = kind == ALL_LOW || kind == LOW_IN || kind == FUSED;
    rnd.start(j, i0, n, (const char*)src + i0 * src_size, src_size, out, sizeof(T),
              low_next && j.e.low_on);
    if (j.exact_only) {  // the exact routine throughout
      for (int i = 0; i < n; ++i) out[i] = S::exact(j.p, b[i], rnd.word(j, i), &err);
      continue;
    }
    edge_count cnt;
    const block_passes<F, MODE, S> pass = {j, st, b, out, &rnd, flag, n, &cnt};
    const int left = run_passes(pass, kind);
    rnd.need(j, n, left);
    if (left)
      scan_flags(flag, n, [&](int i) { out[i] = S::exact(j.p, b[i], rnd.word(j, i), &err); });
    kind = cnt.next_kind(n);
  }
  return err;
}

// round_to's first pass over a block (the elementwise operations' rounding): r[i] = result bits
// of b[i]; returns nonzero when some element is flagged.
template <typename F, int MODE>
PL_INLINE typename pl_traits<F>::U round_block_fast(const job<F>& j,
                                                    const typename pl_traits<F>::U* __restrict b,
                                                    typename pl_traits<F>::U* __restrict r,
                                                    const typename pl_traits<F>::U* __restrict ra,
                                                    int n) {
  return block_first<F, MODE>(j.c, store_bits<F>(j.c, j.e), b, r, ra, n);
}

// The rounding mode as a template argument (modes 0..8 have fast paths; a later mode runs the
// header's exact routine throughout).
#define PL_BY_MODE(mode, CALL)             \
  switch (mode) {                          \
    case PL_RNE: CALL(PL_RNE); break;      \
    case PL_RNA: CALL(PL_RNA); break;      \
    case PL_RTZ: CALL(PL_RTZ); break;      \
    case PL_RUP: CALL(PL_RUP); break;      \
    case PL_RDN: CALL(PL_RDN); break;      \
    case PL_RTO: CALL(PL_RTO); break;      \
    case PL_SR: CALL(PL_SR); break;        \
    case PL_RNZ: CALL(PL_RNZ); break;      \
    case PL_SRE: CALL(PL_SRE); break;      \
    default: CALL(PL_SRE + 1); break;      \
  }

template <typename F>
void round_range(const job<F>& j, const void* src, int src_size, void* dst, size_t lo, size_t hi) {
  if (j.c.s == 0) {  // no bits to drop in the normal range (fp32 from float32): no rounding
    range_mode<F, PL_RTZ, store_bits<F>>(j, src, src_size, dst, lo, hi);
    return;
  }
#define PL_CALL(M) range_mode<F, M, store_bits<F>>(j, src, src_size, dst, lo, hi)
  PL_BY_MODE(j.p.mode, PL_CALL)
#undef PL_CALL
}

template <typename F, typename C>
int encode_range(const job<F>& j, const void* src, int src_size, void* dst, size_t lo,
                 size_t hi) {
  int err = 0;
  if (j.c.s == 0) return range_mode<F, PL_RTZ, store_codes<F, C>>(j, src, src_size, dst, lo, hi);
#define PL_CALL(M) err = range_mode<F, M, store_codes<F, C>>(j, src, src_size, dst, lo, hi)
  PL_BY_MODE(j.p.mode, PL_CALL)
#undef PL_CALL
  return err;
}

// ----- buffers from Python ----------------------------------------------------------------------
struct buffer {
  Py_buffer view;
  bool held = false;
  ~buffer() {
    if (held) PyBuffer_Release(&view);
  }
  bool get(PyObject* obj, bool writable, const char* name) {
    if (PyObject_GetBuffer(obj, &view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) {
      PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous%s buffer", name,
                   writable ? " writable" : "");
      return false;
    }
    held = true;
    return true;
  }
};

// Checks lo <= hi <= elements of each buffer, given their itemsizes.
bool check_range(Py_ssize_t lo, Py_ssize_t hi, const buffer& a, int asize, const buffer& b,
                 int bsize) {
  if (lo < 0 || hi < lo || a.view.len < hi * asize || b.view.len < hi * bsize) {
    PyErr_Format(PyExc_ValueError, "range [%zd, %zd) outside the buffers", lo, hi);
    return false;
  }
  return true;
}

bool check_size(int size, const char* name, int a, int b, int c, int d) {
  if (size == a || size == b || size == c || size == d) return true;
  PyErr_Format(PyExc_ValueError, "unsupported itemsize %d of %s", size, name);
  return false;
}

pl_format parse_format(PyObject* t, bool* ok) {
  int e = 0, m = 0, bias = 0, nan = 0, flags = 0;
  *ok = PyArg_ParseTuple(t, "iiiii", &e, &m, &bias, &nan, &flags) != 0;
  return pl_make_format(e, m, bias, nan, flags);
}

pl_sr_key make_key(unsigned long long lo, unsigned long long hi, int random_bits) {
  pl_sr_key k;
  k.seed_lo = lo;
  k.seed_hi = hi;
  k.random_bits = random_bits;
  return k;
}

// round_float / encode_float share their arguments; `encode` selects the operation.
PyObject* float_op(PyObject* args, bool encode) {
  PyObject *src_obj, *out_obj, *fmt_obj;
  int src_size, out_size, mode, saturate, flush, random_bits;
  unsigned long long seed_lo, seed_hi;
  Py_ssize_t lo, hi;
  if (!PyArg_ParseTuple(args, "OiOiOiiiKKinn", &src_obj, &src_size, &out_obj, &out_size, &fmt_obj,
                        &mode, &saturate, &flush, &seed_lo, &seed_hi, &random_bits, &lo, &hi))
    return NULL;
  bool ok;
  const pl_format f = parse_format(fmt_obj, &ok);
  if (!ok) return NULL;
  buffer src, out;
  if (!src.get(src_obj, false, "src") || !out.get(out_obj, true, "out")) return NULL;
  if (!check_size(src_size, "src", 2, 4, 8, 8) ||
      !(encode ? check_size(out_size, "out", 1, 2, 4, 8) : check_size(out_size, "out", 4, 8, 4, 8)))
    return NULL;
  if (!check_range(lo, hi, src, src_size, out, out_size)) return NULL;
  const bool wide = encode ? !pl_fits_float32(f) || src_size == 8 : out_size == 8;
  const pl_sr_key key = make_key(seed_lo, seed_hi, random_bits);
  const void* s = src.view.buf;
  void* d = out.view.buf;
  int err = 0;
  PL_BEGIN_NATIVE;
  if (wide) {
    const job<double> j(f, mode, saturate, flush, key);
    if (!encode) round_range(j, s, src_size, d, (size_t)lo, (size_t)hi);
    else if (out_size == 1) err = encode_range<double, pl_u8>(j, s, src_size, d, lo, hi);
    else if (out_size == 2) err = encode_range<double, pl_u16>(j, s, src_size, d, lo, hi);
    else if (out_size == 4) err = encode_range<double, pl_u32>(j, s, src_size, d, lo, hi);
    else err = encode_range<double, pl_u64>(j, s, src_size, d, lo, hi);
  } else {
    const job<float> j(f, mode, saturate, flush, key);
    if (!encode) round_range(j, s, src_size, d, (size_t)lo, (size_t)hi);
    else if (out_size == 1) err = encode_range<float, pl_u8>(j, s, src_size, d, lo, hi);
    else if (out_size == 2) err = encode_range<float, pl_u16>(j, s, src_size, d, lo, hi);
    else if (out_size == 4) err = encode_range<float, pl_u32>(j, s, src_size, d, lo, hi);
    else err = encode_range<float, pl_u64>(j, s, src_size, d, lo, hi);
  }
  PL_END_NATIVE;
  return PyLong_FromLong(err);
}

PyObject* round_float(PyObject*, PyObject* args) { return float_op(args, false); }
PyObject* encode_float(PyObject*, PyObject* args) { return float_op(args, true); }

// Integer formats: the header's per-element routine (one double rounding per element).
PyObject* int_op(PyObject* args, bool encode) {
  PyObject *src_obj, *out_obj;
  int src_size, out_size, bits, is_signed, mode, random_bits;
  unsigned long long seed_lo, seed_hi;
  Py_ssize_t lo, hi;
  if (!PyArg_ParseTuple(args, "OiOiiiiKKinn", &src_obj, &src_size, &out_obj, &out_size, &bits,
                        &is_signed, &mode, &seed_lo, &seed_hi, &random_bits, &lo, &hi))
    return NULL;
  buffer src, out;
  if (!src.get(src_obj, false, "src") || !out.get(out_obj, true, "out")) return NULL;
  if (!check_size(src_size, "src", 2, 4, 8, 8) ||
      !(encode ? check_size(out_size, "out", 1, 2, 4, 8) : check_size(out_size, "out", 4, 8, 4, 8)))
    return NULL;
  if (!check_range(lo, hi, src, src_size, out, out_size)) return NULL;
  const pl_sr_key key = make_key(seed_lo, seed_hi, random_bits);
  const void* s = src.view.buf;
  void* d = out.view.buf;
  int err = 0;
  PL_BEGIN_NATIVE;
  pl_u64 rw[BLOCK];
  for (size_t i0 = (size_t)lo; i0 < (size_t)hi; i0 += BLOCK) {
    const int n = (int)((size_t)hi - i0 < (size_t)BLOCK ? (size_t)hi - i0 : (size_t)BLOCK);
    if (mode >= PL_SR) fill_words(key, i0, n, rw);
    for (int i = 0; i < n; ++i) {
      const size_t k = i0 + (size_t)i;
      const double v = pl_round_int(load_double(s, src_size, k), bits, is_signed, mode,
                                    mode >= PL_SR ? rw[i] : 0);
      if (!encode) {
        if (out_size == 4) ((pl_u32*)d)[k] = pl_traits<float>::bits_from_double(v);
        else ((pl_u64*)d)[k] = pl_traits<double>::bits_from_double(v);
      } else {
        const pl_u64 code = pl_encode_int(v, bits, &err);
        if (out_size == 1) ((pl_u8*)d)[k] = (pl_u8)code;
        else if (out_size == 2) ((pl_u16*)d)[k] = (pl_u16)code;
        else if (out_size == 4) ((pl_u32*)d)[k] = (pl_u32)code;
        else ((pl_u64*)d)[k] = code;
      }
    }
  }
  PL_END_NATIVE;
  return PyLong_FromLong(err);
}

PyObject* round_int(PyObject*, PyObject* args) { return int_op(args, false); }
PyObject* encode_int(PyObject*, PyObject* args) { return int_op(args, true); }

// ----- decode -----------------------------------------------------------------------------------
// Code i as an unsigned 64-bit number (negative signed codes become huge: out of range).
inline pl_u64 load_code(const void* codes, int size, bool is_signed, size_t i) {
  switch (size) {
    case 1:
      return is_signed ? (pl_u64)(pl_i64)((const signed char*)codes)[i] : ((const pl_u8*)codes)[i];
    case 2:
      return is_signed ? (pl_u64)(pl_i64)((const short*)codes)[i] : ((const pl_u16*)codes)[i];
    case 4:
      return is_signed ? (pl_u64)(pl_i64)((const int*)codes)[i] : ((const pl_u32*)codes)[i];
    default:
      return ((const pl_u64*)codes)[i];
  }
}

template <typename C, typename T>
PL_CLONES pl_u64 lookup(const C* codes, const T* table, pl_u64 size, T* out, size_t lo, size_t hi) {
  pl_u64 bad = 0;
  const pl_u64 mask = size - 1;
  for (size_t i = lo; i < hi; ++i) {
    const pl_u64 c = (pl_u64)codes[i];
    bad |= c & ~mask;
    out[i] = table[c & mask];
  }
  return bad;
}

template <typename T>
pl_u64 lookup_any(const void* codes, int size, bool is_signed, const T* table, pl_u64 tsize,
                  T* out, size_t lo, size_t hi) {
  switch (size) {  // signed codes are sign-extended: negative ones are out of range
    case 1:
      return is_signed ? lookup((const signed char*)codes, table, tsize, out, lo, hi)
                       : lookup((const pl_u8*)codes, table, tsize, out, lo, hi);
    case 2:
      return is_signed ? lookup((const short*)codes, table, tsize, out, lo, hi)
                       : lookup((const pl_u16*)codes, table, tsize, out, lo, hi);
    case 4:
      return is_signed ? lookup((const int*)codes, table, tsize, out, lo, hi)
                       : lookup((const pl_u32*)codes, table, tsize, out, lo, hi);
    default:
      return is_signed ? lookup((const pl_i64*)codes, table, tsize, out, lo, hi)
                       : lookup((const pl_u64*)codes, table, tsize, out, lo, hi);
  }
}

PyObject* decode_table(PyObject*, PyObject* args) {
  PyObject *codes_obj, *table_obj, *out_obj;
  int code_size, code_signed, out_size;
  Py_ssize_t lo, hi;
  if (!PyArg_ParseTuple(args, "OipOOinn", &codes_obj, &code_size, &code_signed, &table_obj,
                        &out_obj, &out_size, &lo, &hi))
    return NULL;
  buffer codes, table, out;
  if (!codes.get(codes_obj, false, "codes") || !table.get(table_obj, false, "table") ||
      !out.get(out_obj, true, "out"))
    return NULL;
  if (!check_size(code_size, "codes", 1, 2, 4, 8) || !check_size(out_size, "out", 4, 8, 4, 8) ||
      !check_range(lo, hi, codes, code_size, out, out_size))
    return NULL;
  const pl_u64 tsize = (pl_u64)(table.view.len / out_size);
  if (tsize == 0 || (tsize & (tsize - 1)) != 0) {
    PyErr_SetString(PyExc_ValueError, "table size must be a power of two");
    return NULL;
  }
  pl_u64 bad;
  PL_BEGIN_NATIVE;
  if (out_size == 4)
    bad = lookup_any(codes.view.buf, code_size, code_signed, (const pl_u32*)table.view.buf, tsize,
                     (pl_u32*)out.view.buf, (size_t)lo, (size_t)hi);
  else
    bad = lookup_any(codes.view.buf, code_size, code_signed, (const pl_u64*)table.view.buf, tsize,
                     (pl_u64*)out.view.buf, (size_t)lo, (size_t)hi);
  PL_END_NATIVE;
  return PyLong_FromLong(bad != 0);
}

// Formats wider than 16 bits: the header's pl_decode / pl_decode_int per element.
PyObject* decode_op(PyObject* args, bool integer) {
  PyObject *codes_obj, *out_obj, *fmt_obj = NULL;
  int code_size, code_signed, out_size, bits = 0, is_signed = 0;
  Py_ssize_t lo, hi;
  bool ok = true;
  pl_format f = pl_make_format(0, 0, 0, 0, 0);
  if (integer) {
    if (!PyArg_ParseTuple(args, "OipOiiinn", &codes_obj, &code_size, &code_signed, &out_obj,
                          &out_size, &bits, &is_signed, &lo, &hi))
      return NULL;
  } else {
    if (!PyArg_ParseTuple(args, "OipOiOnn", &codes_obj, &code_size, &code_signed, &out_obj,
                          &out_size, &fmt_obj, &lo, &hi))
      return NULL;
    f = parse_format(fmt_obj, &ok);
    if (!ok) return NULL;
    bits = pl_total_bits(f);
  }
  buffer codes, out;
  if (!codes.get(codes_obj, false, "codes") || !out.get(out_obj, true, "out")) return NULL;
  if (!check_size(code_size, "codes", 1, 2, 4, 8) || !check_size(out_size, "out", 4, 8, 4, 8) ||
      !check_range(lo, hi, codes, code_size, out, out_size))
    return NULL;
  const pl_u64 limit = bits >= 64 ? ~0ULL : (1ULL << bits) - 1;
  pl_u64 bad = 0;
  const void* c = codes.view.buf;
  void* d = out.view.buf;
  PL_BEGIN_NATIVE;
  for (size_t i = (size_t)lo; i < (size_t)hi; ++i) {
    const pl_u64 code = load_code(c, code_size, code_signed != 0, i);
    bad |= (code > limit) | (code_signed && (code >> 63));  // negative signed codes too
    const double v = integer ? pl_decode_int(code & limit, bits, is_signed) : pl_decode(f, code & limit);
    if (out_size == 4) ((pl_u32*)d)[i] = pl_traits<float>::bits_from_double(v);
    else ((pl_u64*)d)[i] = pl_traits<double>::bits_from_double(v);
  }
  PL_END_NATIVE;
  return PyLong_FromLong(bad != 0);
}

PyObject* decode_float(PyObject*, PyObject* args) { return decode_op(args, false); }
PyObject* decode_int(PyObject*, PyObject* args) { return decode_op(args, true); }

// ----- elementwise arithmetic of precision_lab.ops (add, sub, mul, fma) --------------------------
// Operands are float32 values (float32, float16 or bfloat16 input, widened exactly); the format's
// values fit in float32. Each operand is first put on the format's grid (nearest_even with the
// call's switches; infinities kept under saturate in formats that have them), as
// precision_lab.ops does; then the exact result is formed in double: a product of two float32
// values is exact in double, a sum (or product plus addend) is a TwoSum pair s + t collapsed by
// round-to-odd to 53 bits (exact for targets of at most 51 significant bits); that double is
// rounded once by the header (fast path plus pl_round_bits for flagged elements).
// div and sqrt: the double quotient or root q = RN(x / y) or RN(sqrt(x)) and the exact
// remainder x - q * y (x - q * q) by fma (exact: the operands are float32 values, so nothing
// underflows) give the round-to-odd collapse of the exact result, as for sums.
enum { PL_OP_ADD = 0, PL_OP_SUB = 1, PL_OP_MUL = 2, PL_OP_FMA = 3, PL_OP_DIV = 4, PL_OP_SQRT = 5 };

// Bits of elements [i0, i0 + n) of an operand as float32 (kind: 4 float32, 2 float16, 3 bfloat16).
PL_INLINE const pl_u32* load_operand(const void* src, int kind, size_t i0, int n, pl_u32* buf) {
  if (kind == 4) return (const pl_u32*)src + i0;
  const pl_u16* h = (const pl_u16*)src + i0;
  if (kind == 3) {
    for (int i = 0; i < n; ++i) buf[i] = (pl_u32)h[i] << 16;
  } else {
    for (int i = 0; i < n; ++i) buf[i] = half_to_float_bits(h[i]);
  }
  return buf;
}

// r = the format's value of each float32 b (the grid job: nearest_even, the call's switches)
template <int MODE>
PL_INLINE void round_f32_block(const job<float>& j, const pl_u32* __restrict b, pl_u32* __restrict r,
                            int n) {
  if (j.exact_only) {
    for (int i = 0; i < n; ++i) r[i] = pl_round_bits(j.p, b[i], 0);
    return;
  }
  if (round_block_fast<float, MODE>(j, b, r, NULL, n))
    for_flagged(j.c, b, n, [&](int i) { r[i] = pl_round_bits(j.p, b[i], 0); });
}

struct arith_job {
  job<float> grid;    // operands onto the grid
  job<double> out;    // the exact result onto the format
  job<float> out32;   // the same rounding of results that are exact in float32
  pl_plan<double> special;  // non-finite results under stochastic modes: nearest_even
  int op;
  bool on_grid;       // operands already on the grid (the format's own dtype, nothing to flush)
  bool keep_inf;      // saturate in a format with inf: infinite operands stay infinite
  bool fast32;        // try float32 first (sums; products of formats of at most 12 bits)
  arith_job(const pl_format& f, int op_, int mode, int saturate, int flush, pl_sr_key k,
            bool on_grid_)
      : grid(f, PL_RNE, saturate, flush, k),
        out(f, mode, saturate, flush, k),
        out32(f, mode, saturate, flush, k),
        special(pl_make_plan<double>(f, PL_RNE, saturate, flush)),
        op(op_),
        on_grid(on_grid_),
        keep_inf(saturate && f.has_inf),
        fast32(out32.c.s > 0 && !out32.exact_only &&
               (op_ == PL_OP_ADD || op_ == PL_OP_SUB || (op_ == PL_OP_MUL && f.mbits <= 11))) {}
};

// Operand block on the grid: a pointer to n float32 bit patterns.
PL_INLINE const pl_u32* grid_operand(const arith_job& j, const void* src, int kind, size_t i0,
                                     int n, pl_u32* buf, pl_u32* r) {
  const pl_u32* b = load_operand(src, kind, i0, n, buf);
  if (j.on_grid) return b;
  if (j.grid.c.s == 0) round_f32_block<PL_RTZ>(j.grid, b, r, n);
  else round_f32_block<PL_RNE>(j.grid, b, r, n);
  if (j.keep_inf)
    for (int i = 0; i < n; ++i) r[i] = (b[i] & 0x7FFFFFFFu) == 0x7F800000u ? b[i] : r[i];
  return r;
}

// Exact results of one block as doubles (bits in v); inexact[i] = 1 where the double is the
// round-to-odd collapse of an inexact TwoSum pair (t != 0).
PL_INLINE pl_u64 exact_block(int op, bool down, const pl_u32* __restrict a,
                             const pl_u32* __restrict b, const pl_u32* __restrict c,
                             pl_u64* __restrict v, int n) {
  pl_u64 any_inexact = 0;
  if (op == PL_OP_MUL) {
    for (int i = 0; i < n; ++i) v[i] = pl_bits_of((double)pl_f32_of(a[i]) * (double)pl_f32_of(b[i]));
    return 0;
  }
  if (op == PL_OP_DIV || op == PL_OP_SQRT) {
    for (int i = 0; i < n; ++i) {
      const double x = (double)pl_f32_of(a[i]);
      const double y = op == PL_OP_DIV ? (double)pl_f32_of(b[i]) : 0.0;
      const double q = op == PL_OP_DIV ? x / y : sqrt(x);
      const double d = op == PL_OP_DIV ? y : q;  // exact - q = rem / d (sqrt: rem / (q + root))
      const double rem = fma(-q, d, x);
      const pl_u64 qb = pl_bits_of(q);
      const pl_u64 inexact = (pl_u64)(rem != 0) & (pl_u64)(q - q == 0) & (pl_u64)(q != 0);
      const pl_u64 inward = inexact & (((pl_bits_of(rem) ^ pl_bits_of(d)) ^ qb) >> 63);
      v[i] = (qb - inward) | inexact;
      any_inexact |= inexact;
    }
    return any_inexact;
  }
  for (int i = 0; i < n; ++i) {
    double x, y;
    pl_u64 xb, yb;
    if (op == PL_OP_FMA) {
      x = (double)pl_f32_of(a[i]) * (double)pl_f32_of(b[i]);  // exact
      y = (double)pl_f32_of(c[i]);
    } else {
      x = (double)pl_f32_of(a[i]);
      y = (double)pl_f32_of(op == PL_OP_SUB ? b[i] ^ 0x80000000u : b[i]);
    }
    xb = pl_bits_of(x);
    yb = pl_bits_of(y);
    const double s = x + y;  // TwoSum
    const double bp = s - x;
    const double t = (x - (s - bp)) + (y - bp);
    const pl_u64 sb = pl_bits_of(s);
    const pl_u64 inexact = (pl_u64)(t != 0) & (pl_u64)(s - s == 0);  // finite s only
    const pl_u64 inward = inexact & ((pl_bits_of(t) ^ sb) >> 63);
    pl_u64 r = (sb - inward) | inexact;
    // an exact zero sum is -0 under `down` unless both addends are +0
    if (down) r = (s == 0 && (xb | yb) != 0) ? 0x8000000000000000ULL : r;
    v[i] = r;
    any_inexact |= inexact;
  }
  return any_inexact;
}

// Sums and products in float32, rounded by the float32 job, where float32 holds them exactly;
// redo[i] = 1 (and a nonzero return) for the others: inexact sums (TwoSum error not zero),
// products below float32's normal range or overflowing, non-finite results, and zero sums under
// `down` (their sign is the ops' rule) -- the caller redoes those in double.
template <int MODE>
PL_INLINE int float_block(const arith_job& j, bool down, bool random, const pl_u32* __restrict a,
                          const pl_u32* __restrict b, pl_u32* __restrict o,
                          const pl_u64* __restrict rw, pl_u8* __restrict redo, int n) {
  pl_u32 v[BLOCK], ra[BLOCK];
  if (MODE == PL_SR || MODE == PL_SRE) addends_of_words(rw, j.out32.sh, ra, n);
  pl_u32 any = 0;
  if (j.op == PL_OP_MUL) {
    for (int i = 0; i < n; ++i) {
      const pl_u32 am = a[i] & 0x7FFFFFFFu, bm = b[i] & 0x7FFFFFFFu;
      const pl_u32 r = pl_bits_of(pl_f32_of(a[i]) * pl_f32_of(b[i]));
      const pl_u32 m = r & 0x7FFFFFFFu;
      const pl_u32 bad = ((m < 0x00800000u) & (am != 0) & (bm != 0)) | (m >= 0x7F800000u);
      v[i] = r;
      redo[i] = (pl_u8)bad;
      any |= bad;
    }
  } else {
    const pl_u32 flip = j.op == PL_OP_SUB ? 0x80000000u : 0u;
    for (int i = 0; i < n; ++i) {
      const float x = pl_f32_of(a[i]), y = pl_f32_of(b[i] ^ flip);
      const float s = x + y;
      const float bp = s - x;
      const float t = (x - (s - bp)) + (y - bp);  // NaN for non-finite sums: redone
      const pl_u32 bad = (pl_u32)(t != 0) | (pl_u32)(down & (s == 0));
      v[i] = pl_bits_of(s);
      redo[i] = (pl_u8)bad;
      any |= bad;
    }
  }
  if (round_block_fast<float, MODE>(j.out32, v, o, ra, n))
    for_flagged(j.out32.c, v, n,
                [&](int i) { o[i] = pl_round_bits(j.out32.p, v[i], random ? rw[i] : 0); });
  return any != 0;
}

template <int MODE>
PL_CLONES int arith_range_mode(const arith_job& j, const void* xs, int xk, const void* ys, int yk,
                               const void* zs, int zk, pl_u32* dst, size_t lo, size_t hi) {
  typedef pl_u64 U;
  pl_u32 bx[BLOCK], by[BLOCK], bz[BLOCK], gx[BLOCK], gy[BLOCK], gz[BLOCK];
  U v[BLOCK], r[BLOCK], ra[BLOCK];
  pl_u64 rw[BLOCK];
  const bool random = j.out.random;
  const bool down = j.out.p.mode == PL_RDN;
  for (size_t i0 = lo; i0 < hi; i0 += BLOCK) {
    const int n = (int)(hi - i0 < (size_t)BLOCK ? hi - i0 : (size_t)BLOCK);
    const pl_u32* a = grid_operand(j, xs, xk, i0, n, bx, gx);
    const pl_u32* b = grid_operand(j, ys, yk, i0, n, by, gy);
    const pl_u32* c = j.op == PL_OP_FMA ? grid_operand(j, zs, zk, i0, n, bz, gz) : NULL;
    if (random) fill_words(j.out.key, i0, n, rw);
    if (j.fast32) {  // float32 results where exact; the others (flagged) in double
      pl_u32* o = dst + i0;
      pl_u8 redo[BLOCK + 8];
      if (float_block<MODE>(j, down, random, a, b, o, rw, redo, n)) {
        for (int i = 0; i < n; ++i) {
          if (!redo[i]) continue;
          pl_u64 e, rb;
          if (exact_block(j.op, down, a + i, b + i, NULL, &e, 1) && random) return 1;
          const bool finite = (e & 0x7FF0000000000000ULL) != 0x7FF0000000000000ULL;
          rb = random && !finite ? pl_round_bits(j.special, e, 0)
                                 : pl_round_bits(j.out.p, e, random ? rw[i] : 0);
          o[i] = pl_bits_of((float)pl_f64_of(rb));
        }
      }
      continue;
    }
    if (exact_block(j.op, down, a, b, c, v, n) && random) return 1;  // needs the exact fraction
    if (j.out.exact_only) {
      for (int i = 0; i < n; ++i) r[i] = pl_round_bits(j.out.p, v[i], random ? rw[i] : 0);
    } else {
      if (MODE == PL_SR || MODE == PL_SRE) addends_of_words(rw, j.out.sh, ra, n);
      if (round_block_fast<double, MODE>(j.out, v, r, ra, n))
        for_flagged(j.out.c, v, n, [&](int i) {
          const bool finite = (v[i] & 0x7FF0000000000000ULL) != 0x7FF0000000000000ULL;
          r[i] = random && !finite ? pl_round_bits(j.special, v[i], 0)
                                   : pl_round_bits(j.out.p, v[i], random ? rw[i] : 0);
        });
    }
    pl_u32* o = dst + i0;
    for (int i = 0; i < n; ++i) o[i] = pl_bits_of((float)pl_f64_of(r[i]));  // exact
  }
  return 0;
}

// elementwise(x, x_kind, y, y_kind, z, z_kind, out, op, fmt, mode, saturate, flush, on_grid,
// seed_lo, seed_hi, random_bits, lo, hi) -> 1 when a stochastic sum needs the exact discarded
// fraction beyond 53 bits (the caller then uses the numpy path), else 0
PyObject* elementwise(PyObject*, PyObject* args) {
  PyObject *x_obj, *y_obj, *z_obj, *out_obj, *fmt_obj;
  int xk, yk, zk, op, mode, saturate, flush, on_grid, random_bits;
  unsigned long long seed_lo, seed_hi;
  Py_ssize_t lo, hi;
  if (!PyArg_ParseTuple(args, "OiOiOiOiOiiipKKinn", &x_obj, &xk, &y_obj, &yk, &z_obj, &zk,
                        &out_obj, &op, &fmt_obj, &mode, &saturate, &flush, &on_grid, &seed_lo,
                        &seed_hi, &random_bits, &lo, &hi))
    return NULL;
  bool ok;
  const pl_format f = parse_format(fmt_obj, &ok);
  if (!ok) return NULL;
  if (op < PL_OP_ADD || op > PL_OP_SQRT) {
    PyErr_Format(PyExc_ValueError,
                 "op must be 0 (add), 1 (sub), 2 (mul), 3 (fma), 4 (div) or 5 (sqrt), got %d", op);
    return NULL;
  }
  if (!pl_fits_float32(f) || f.mbits > 23) {
    PyErr_SetString(PyExc_ValueError, "fmt: the format's values must fit in float32");
    return NULL;
  }
  buffer x, y, z, out;
  if (!x.get(x_obj, false, "x") || !y.get(y_obj, false, "y") || !z.get(z_obj, false, "z") ||
      !out.get(out_obj, true, "out"))
    return NULL;
  const int ksize[5] = {0, 0, 2, 2, 4};
  if (!check_size(xk, "x", 2, 3, 4, 4) || !check_size(yk, "y", 2, 3, 4, 4) ||
      !check_size(zk, "z", 2, 3, 4, 4) || !check_range(lo, hi, x, ksize[xk], out, 4) ||
      (op != PL_OP_SQRT && !check_range(lo, hi, y, ksize[yk], out, 4)) ||
      (op == PL_OP_FMA && !check_range(lo, hi, z, ksize[zk], out, 4)))
    return NULL;
  const arith_job j(f, op, mode, saturate, flush, make_key(seed_lo, seed_hi, random_bits),
                    on_grid != 0);
  int err = 0;
  const void *xs = x.view.buf, *ys = y.view.buf, *zs = z.view.buf;
  pl_u32* d = (pl_u32*)out.view.buf;
  PL_BEGIN_NATIVE;
  if (j.out.c.s == 0) {
    err = arith_range_mode<PL_RTZ>(j, xs, xk, ys, yk, zs, zk, d, lo, hi);
  } else {
#define PL_CALL(M) err = arith_range_mode<M>(j, xs, xk, ys, yk, zs, zk, d, lo, hi)
    PL_BY_MODE(j.out.p.mode, PL_CALL)
#undef PL_CALL
  }
  PL_END_NATIVE;
  return PyLong_FromLong(err);
}

// random_words(out, seed_lo, seed_hi, random_bits, start[, path]): out[i] = the random word of
// flat index start + i (out: a uint64 buffer), as fill_words gives it to the exact routine (the
// fast path takes its top bits: word_out); path (tests): the generator copy (PHILOX_*)
PyObject* random_words(PyObject*, PyObject* args) {
  PyObject* out_obj;
  unsigned long long seed_lo, seed_hi, start;
  int random_bits, path = PHILOX_AUTO;
  if (!PyArg_ParseTuple(args, "OKKiK|i", &out_obj, &seed_lo, &seed_hi, &random_bits, &start,
                        &path))
    return NULL;
  if (random_bits < 1 || random_bits > 64) {
    PyErr_Format(PyExc_ValueError, "random_bits must be in 1..64, got %d", random_bits);
    return NULL;
  }
  if (path != PHILOX_AUTO && !philox_has(path)) {
    PyErr_Format(PyExc_ValueError,
                 "path must be -1 (auto) or a generator this build and CPU have (0 scalar, 1 "
                 "AVX2, 2 AVX-512; see philox_paths()), got %d", path);
    return NULL;
  }
  buffer out;
  if (!out.get(out_obj, true, "out")) return NULL;
  const size_t n = (size_t)out.view.len / 8;
  if (start > ~0ULL - n) {
    PyErr_SetString(PyExc_ValueError, "start + len(out) must be below 2**64");
    return NULL;
  }
  const pl_sr_key key = make_key(seed_lo, seed_hi, random_bits);
  pl_u64* w = (pl_u64*)out.view.buf;
  PL_BEGIN_NATIVE;
  for (size_t i0 = 0; i0 < n; i0 += BLOCK)
    fill_words(key, (size_t)start + i0, (int)(n - i0 < (size_t)BLOCK ? n - i0 : (size_t)BLOCK),
               w + i0, path);
  PL_END_NATIVE;
  Py_RETURN_NONE;
}

// philox_paths() -> (paths, auto): the generator copies this build and CPU have (0 scalar, 1
// AVX2, 2 AVX-512) and the one round_to uses (for the tests)
PyObject* philox_paths(PyObject*, PyObject*) {
  PyObject* have = PyList_New(0);
  if (!have) return NULL;
  for (int path = PHILOX_SCALAR; path <= PHILOX_AVX512; ++path) {
    if (!philox_has(path)) continue;
    PyObject* v = PyLong_FromLong(path);
    if (!v || PyList_Append(have, v) != 0) {
      Py_XDECREF(v);
      Py_DECREF(have);
      return NULL;
    }
    Py_DECREF(v);
  }
  return Py_BuildValue("(Ni)", have, philox_auto());
}

// fast_paths(fmt, mode, saturate, flush, itemsize) -> (low, overflow, overflow_codes): whether
// round_to/encode with a working type of that itemsize (4: float32, 8: float64) take the fast
// paths for inputs below the smallest normal, above the max (round_to), above the max (encode).
// For the tests: they assert that the exhaustive comparisons run through these paths.
PyObject* fast_paths(PyObject*, PyObject* args) {
  PyObject* fmt_obj;
  int mode, saturate, flush, itemsize;
  if (!PyArg_ParseTuple(args, "Oiiii", &fmt_obj, &mode, &saturate, &flush, &itemsize)) return NULL;
  bool ok;
  const pl_format f = parse_format(fmt_obj, &ok);
  if (!ok || !check_size(itemsize, "itemsize", 4, 8, 4, 8)) return NULL;
  const pl_sr_key key = make_key(0, 0, 64);
  bool low, over, over_code;
  if (itemsize == 4) {
    const job<float> j(f, mode, saturate, flush, key);
    low = j.e.low_on != 0, over = j.e.over_on != 0, over_code = j.e.over_code_on != 0;
  } else {
    const job<double> j(f, mode, saturate, flush, key);
    low = j.e.low_on != 0, over = j.e.over_on != 0, over_code = j.e.over_code_on != 0;
  }
  return Py_BuildValue("(OOO)", low ? Py_True : Py_False, over ? Py_True : Py_False,
                       over_code ? Py_True : Py_False);
}

PyMethodDef methods[] = {
    {"round_float", round_float, METH_VARARGS,
     "round_float(src, src_itemsize, out, out_itemsize, fmt, mode, saturate, flush, seed_lo, "
     "seed_hi, random_bits, lo, hi): round elements lo..hi-1 of src into out"},
    {"encode_float", encode_float, METH_VARARGS,
     "encode_float(src, src_itemsize, out, code_itemsize, fmt, mode, saturate, flush, seed_lo, "
     "seed_hi, random_bits, lo, hi) -> 1 if NaN met a format without NaN"},
    {"round_int", round_int, METH_VARARGS,
     "round_int(src, src_itemsize, out, out_itemsize, bits, signed, mode, seed_lo, seed_hi, "
     "random_bits, lo, hi)"},
    {"encode_int", encode_int, METH_VARARGS,
     "encode_int(src, src_itemsize, out, code_itemsize, bits, signed, mode, seed_lo, seed_hi, "
     "random_bits, lo, hi) -> 1 if NaN met"},
    {"decode_table", decode_table, METH_VARARGS,
     "decode_table(codes, code_itemsize, code_signed, table, out, out_itemsize, lo, hi) -> 1 if a "
     "code lies outside the table"},
    {"decode_float", decode_float, METH_VARARGS,
     "decode_float(codes, code_itemsize, code_signed, out, out_itemsize, fmt, lo, hi) -> 1 if a "
     "code is out of range"},
    {"decode_int", decode_int, METH_VARARGS,
     "decode_int(codes, code_itemsize, code_signed, out, out_itemsize, bits, signed, lo, hi) -> 1 "
     "if a code is out of range"},
    {"elementwise", elementwise, METH_VARARGS,
     "elementwise(x, x_kind, y, y_kind, z, z_kind, out, op, fmt, mode, saturate, flush, on_grid, "
     "seed_lo, seed_hi, random_bits, lo, hi): float32 results of add/sub/mul/fma (op 0..3) of "
     "float32/float16/bfloat16 operands (kind 4/2/3) -> 1 if a stochastic sum needs the numpy path"},
    {"random_words", random_words, METH_VARARGS,
     "random_words(out, seed_lo, seed_hi, random_bits, start[, path]): out[i] (uint64) = the "
     "random word of flat index start + i that stochastic rounding uses; path: the generator "
     "copy (-1 auto, 0 scalar, 1 AVX2, 2 AVX-512)"},
    {"philox_paths", philox_paths, METH_NOARGS,
     "philox_paths() -> (paths, auto): the random-word generator copies this build and CPU have "
     "(0 scalar, 1 AVX2, 2 AVX-512) and the one in use"},
    {"fast_paths", fast_paths, METH_VARARGS,
     "fast_paths(fmt, mode, saturate, flush, itemsize) -> (low, overflow, overflow_codes): the "
     "fast paths a job takes outside the format's normal range (working itemsize 4 or 8)"},
    {NULL, NULL, 0, NULL}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "precision_lab.backends._native",
                          "Compiled CPU backend of round_to, encode and decode "
                          "(see precision_lab/native/core.cpp).",
                          -1, methods, NULL, NULL, NULL, NULL};

}  // namespace

PyMODINIT_FUNC PyInit__native(void) {
  PyObject* m = PyModule_Create(&module_def);
  if (m == NULL) return NULL;
  if (PyModule_AddStringConstant(m, "SOURCE_HASH", PL_SOURCE_HASH) < 0 ||
      PyModule_AddIntConstant(m, "BLOCK", BLOCK) < 0 ||
      PyModule_AddIntConstant(m, "FAST_MODES", PL_SRE + 1) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
