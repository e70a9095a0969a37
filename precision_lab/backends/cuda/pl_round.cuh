// pl_round.cuh: the rounding core of precision_lab in C++/CUDA.
//
// A port of precision_lab/rounding.py and precision_lab/codec.py that gives the same bits:
// round a float32/float64 to a format's grid in every rounding mode (stochastic rounding with the
// same counter-based random words as precision_lab/_random.py), encode values to codes and decode
// codes to values. Every function is __host__ __device__: under nvcc/NVRTC it runs on the GPU,
// and as plain C++ (no __CUDACC__) the test suite compiles it with the system compiler and checks
// it bit for bit against the numpy core (tests/test_cuda_host.py).
//
// No standard header is needed under NVRTC (__CUDACC_RTC__). The arithmetic is integer or exact
// double arithmetic (ldexp, frexp, floor, ceil, rint, fmod: exact on host and device); compile
// without fast-math / flush-to-zero (nvcc: -ftz=false; g++: -ffp-contract=off, no -ffast-math).
#ifndef PL_ROUND_CUH
#define PL_ROUND_CUH

#if defined(__CUDACC__)
#define PL_HD __host__ __device__ __forceinline__
#define PL_HD_CALL __host__ __device__ __noinline__  // big functions: one copy, called
#define PL_HD_VEC PL_HD
#elif defined(__GNUC__)
#define PL_HD inline
#define PL_HD_CALL inline
#define PL_HD_VEC inline __attribute__((always_inline))  // in CPU loops that must vectorise
#else
#define PL_HD inline
#define PL_HD_CALL inline
#define PL_HD_VEC inline
#endif

#if !defined(__CUDACC_RTC__)
#include <math.h>
#include <string.h>
#endif

typedef unsigned int pl_u32;
typedef unsigned long long pl_u64;
typedef long long pl_i64;

// ----- rounding modes, overflow, NaN styles (the order of rounding.ROUNDING_MODES) ----------------
enum {
  PL_RNE = 0,  // nearest_even
  PL_RNA = 1,  // nearest_away
  PL_RTZ = 2,  // toward_zero
  PL_RUP = 3,  // up (toward +inf)
  PL_RDN = 4,  // down (toward -inf)
  PL_RTO = 5,  // odd
  PL_SR = 6,   // stochastic
  PL_RNZ = 7,  // nearest_zero (ties toward zero)
  PL_SRE = 8,  // stochastic_equal (inexact: up or down with probability 1/2, top random bit)
  PL_SRF = 9,  // stochastic_offset (Fitzgibbon & Felix's SRF: PL_SR on words carrying the offset)
  PL_SRC = 10  // stochastic_corrected (their SRC: the fraction rounded to N bits, then PL_SR)
};
// Whether a mode draws random words (rounding.STOCHASTIC_MODES).
PL_HD bool pl_is_stochastic(int mode) {
  return mode == PL_SR || mode == PL_SRE || mode == PL_SRF || mode == PL_SRC;
}
enum { PL_NAN_IEEE = 0, PL_NAN_FN = 1, PL_NAN_FNUZ = 2, PL_NAN_NONE = 3 };
enum { PL_HAS_INF = 1, PL_HAS_SUBNORMALS = 2, PL_HAS_ZERO = 4, PL_SIGNED = 8 };

// A FloatFormat (formats.py) as plain data.
struct pl_format {
  int ebits;      // exponent_bits
  int mbits;      // mantissa_bits
  int bias;       // exponent bias (already resolved)
  int nan_style;  // PL_NAN_*
  int has_inf;
  int has_subnormals;
  int has_zero;
  int is_signed;
};

PL_HD pl_format pl_make_format(int ebits, int mbits, int bias, int nan_style, int flags) {
  pl_format f;
  f.ebits = ebits;
  f.mbits = mbits;
  f.bias = bias;
  f.nan_style = nan_style;
  f.has_inf = (flags & PL_HAS_INF) != 0;
  f.has_subnormals = (flags & PL_HAS_SUBNORMALS) != 0;
  f.has_zero = (flags & PL_HAS_ZERO) != 0;
  f.is_signed = (flags & PL_SIGNED) != 0;
  return f;
}

// ----- bit casts ---------------------------------------------------------------------------------
PL_HD pl_u32 pl_bits_of(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  pl_u32 u;
  memcpy(&u, &v, sizeof u);
  return u;
#endif
}
PL_HD pl_u64 pl_bits_of(double v) {
#if defined(__CUDA_ARCH__)
  return (pl_u64)__double_as_longlong(v);
#else
  pl_u64 u;
  memcpy(&u, &v, sizeof u);
  return u;
#endif
}
PL_HD float pl_f32_of(pl_u32 u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  memcpy(&v, &u, sizeof v);
  return v;
#endif
}
PL_HD double pl_f64_of(pl_u64 u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double((long long)u);
#else
  double v;
  memcpy(&v, &u, sizeof v);
  return v;
#endif
}
PL_HD bool pl_isnan(double v) { return (pl_bits_of(v) & 0x7FFFFFFFFFFFFFFFULL) > 0x7FF0000000000000ULL; }
PL_HD double pl_nan64() { return pl_f64_of(0x7FF8000000000000ULL); }
PL_HD double pl_inf64() { return pl_f64_of(0x7FF0000000000000ULL); }

// ----- the working float types (float32 and float64 viewed as unsigned integers) -----------------
template <typename F>
struct pl_traits;

template <>
struct pl_traits<float> {
  typedef pl_u32 U;
  enum { W = 32, P = 23, BIAS = 127 };
  static PL_HD U bits(float v) { return pl_bits_of(v); }
  static PL_HD float value(U u) { return pl_f32_of(u); }
  static PL_HD U inf_bits() { return 0x7F800000u; }
  static PL_HD U nan_bits() { return 0x7FC00000u; }  // numpy's float32 NaN (positive)
  static PL_HD double min_normal() { return 1.1754943508222875e-38; }  // 2**-126
  // an exactly representable double -> its float32 bits (a NaN becomes the canonical NaN)
  static PL_HD U bits_from_double(double v) {
    if (pl_isnan(v)) return nan_bits() | ((pl_bits_of(v) >> 63) ? 0x80000000u : 0u);
    return pl_bits_of((float)v);
  }
};

template <>
struct pl_traits<double> {
  typedef pl_u64 U;
  enum { W = 64, P = 52, BIAS = 1023 };
  static PL_HD U bits(double v) { return pl_bits_of(v); }
  static PL_HD double value(U u) { return pl_f64_of(u); }
  static PL_HD U inf_bits() { return 0x7FF0000000000000ULL; }
  static PL_HD U nan_bits() { return 0x7FF8000000000000ULL; }
  static PL_HD double min_normal() { return 2.2250738585072014e-308; }  // 2**-1022
  static PL_HD U bits_from_double(double v) {
    if (pl_isnan(v)) return nan_bits() | (pl_bits_of(v) & 0x8000000000000000ULL);
    return pl_bits_of(v);
  }
};

// ----- derived properties of a format (formats.FloatFormat) -------------------------------------
PL_HD int pl_total_bits(const pl_format& f) { return f.ebits + f.mbits + (f.is_signed ? 1 : 0); }

PL_HD pl_u64 pl_max_code_magnitude(const pl_format& f) {
  const int e = f.ebits, m = f.mbits;
  const pl_u64 top = (1ULL << (e + m)) - 1;
  if (f.nan_style == PL_NAN_IEEE) return ((((1ULL << e) - 2) << m) | ((1ULL << m) - 1));
  // fn: the all-ones code is NaN; an inf outside the IEEE style (P3109 extended domain) takes the
  // next code below the NaNs
  return top - (f.nan_style == PL_NAN_FN ? 1 : 0) - (f.has_inf ? 1 : 0);
}

// Magnitude code of +inf (formats.FloatFormat.inf_code; meaningful only when f.has_inf).
PL_HD pl_u64 pl_inf_code(const pl_format& f) { return pl_max_code_magnitude(f) + 1; }

PL_HD int pl_emin(const pl_format& f) { return (f.has_zero ? 1 : 0) - f.bias; }

PL_HD double pl_magnitude(const pl_format& f, pl_u64 code) {
  const int m = f.mbits;
  const pl_u64 exp_field = code >> m, frac = code & ((1ULL << m) - 1);
  if (exp_field == 0 && f.has_zero) return ldexp((double)frac, pl_emin(f) - m);
  return ldexp((double)((1ULL << m) | frac), (int)exp_field - f.bias - m);
}

PL_HD double pl_fmt_max(const pl_format& f) { return pl_magnitude(f, pl_max_code_magnitude(f)); }
PL_HD double pl_smallest_normal(const pl_format& f) { return ldexp(1.0, pl_emin(f)); }
PL_HD double pl_smallest_subnormal(const pl_format& f) {
  if (f.has_subnormals && f.mbits > 0) return ldexp(1.0, pl_emin(f) - f.mbits);
  return pl_smallest_normal(f);
}

// rounding.follows_p3109: is the format an IEEE P3109 one (equal to p3109(k, p, signed, domain))?
// Signed: NaN on the negative-zero code (fnuz), bias 2**(exponent_bits - 1) (0 without exponent
// bits); unsigned: NaN on the all-ones code (fn), bias 2**(exponent_bits - 1); zero and
// subnormals in both, infinities in the extended domain only. Their overflow follows P3109
// (pl_special): round to odd overflows to inf (NaN in the finite domain) like round to nearest.
PL_HD bool pl_is_p3109(const pl_format& f) {
  if (!f.has_zero || !f.has_subnormals) return false;
  const int bias = f.ebits >= 1 ? 1 << (f.ebits - 1) : 0;
  if (f.is_signed) return f.nan_style == PL_NAN_FNUZ && f.bias == bias && f.ebits + f.mbits >= 1;
  return f.nan_style == PL_NAN_FN && f.ebits >= 1 && f.bias == bias;
}

// rounding.working_dtype: can float32 hold every value of the format? (the quantum of the lowest
// binade is at least 2**-149)
PL_HD bool pl_fits_float32(const pl_format& f) {
  return f.mbits <= 23 && pl_fmt_max(f) <= 3.4028234663852886e38 && pl_emin(f) - f.mbits >= -149;
}

// ----- counter-based random words: Philox4x64-10 (precision_lab/_random.py) ----------------------
PL_HD pl_u64 pl_mulhi64(pl_u64 a, pl_u64 b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#elif defined(__SIZEOF_INT128__) && !defined(PL_NO_INT128)
  return (pl_u64)(((unsigned __int128)a * b) >> 64);
#else  // compilers without __int128 (MSVC, some 32-bit targets): four 32x32 -> 64 products
  const pl_u64 a0 = a & 0xFFFFFFFFULL, a1 = a >> 32, b0 = b & 0xFFFFFFFFULL, b1 = b >> 32;
  const pl_u64 p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  const pl_u64 mid = (p00 >> 32) + (p01 & 0xFFFFFFFFULL) + (p10 & 0xFFFFFFFFULL);
  return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
#endif
}

// The 128-bit product a * b: returns the low 64 bits and stores the high 64 in *hi. With __int128
// both halves come from one multiplication (GCC does not merge pl_mulhi64(a, b) with a * b: it
// emits a MUL and an IMUL, twice the multiplier's work in Philox).
PL_HD pl_u64 pl_mul128(pl_u64 a, pl_u64 b, pl_u64* hi) {
#if !defined(__CUDA_ARCH__) && defined(__SIZEOF_INT128__) && !defined(PL_NO_INT128)
  const unsigned __int128 p = (unsigned __int128)a * b;
  *hi = (pl_u64)(p >> 64);
  return (pl_u64)p;
#else
  *hi = pl_mulhi64(a, b);
  return a * b;
#endif
}

// One Philox4x64 round of counter c (in place) under the round key (k0, k1).
PL_HD void pl_philox4x64_round(pl_u64 c[4], pl_u64 k0, pl_u64 k1) {
  pl_u64 hi0, hi1;
  const pl_u64 lo0 = pl_mul128(0xD2E7470EE14C6C93ULL, c[0], &hi0);
  const pl_u64 lo1 = pl_mul128(0xCA5A826395121157ULL, c[2], &hi1);
  const pl_u64 n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
  c[0] = n0;
  c[1] = lo1;
  c[2] = n2;
  c[3] = lo0;
}

// The Weyl increments of Philox4x64's key between rounds.
#define PL_PHILOX_W0 0x9E3779B97F4A7C15ULL
#define PL_PHILOX_W1 0xBB67AE8584CAA73BULL

// Philox4x64-10 of counter c (in place) under key (k0, k1).
PL_HD void pl_philox4x64_10(pl_u64 c[4], pl_u64 k0, pl_u64 k1) {
  for (int round = 0; round < 10; ++round) {
    pl_philox4x64_round(c, k0, k1);
    k0 += PL_PHILOX_W0;
    k1 += PL_PHILOX_W1;
  }
}

// The mask that keeps the top random_bits bits (1..64) of a random word. random_bits = N + 64
// (65..127, rounding.word_bits) asks for the words of the SR variants PL_SRF and PL_SRC with N
// bits: the top N bits and the marker bit 2**(63 - N) (pl_random_mark).
PL_HD pl_u64 pl_random_mask(int random_bits) {
  const int n = random_bits > 64 ? random_bits - 64 : random_bits;
  return n >= 64 ? ~0ULL : ~((1ULL << (64 - n)) - 1);
}

// The marker bit of the SR variants' words (0 for random_bits <= 64): SRF's offset of half a
// random unit, and how SRC learns N.
PL_HD pl_u64 pl_random_mark(int random_bits) {
  return random_bits > 64 && random_bits < 128 ? 1ULL << (127 - random_bits) : 0ULL;
}

// The random words of flat indices 4*group .. 4*group+3 for seed (seed_lo + 2**64 seed_hi), with
// the low 64 - random_bits bits cleared (random_bits in 1..64; 65..127: pl_random_mask).
PL_HD void pl_random_group(pl_u64 group, pl_u64 seed_lo, pl_u64 seed_hi, int random_bits,
                           pl_u64 w[4]) {
  w[0] = group;
  w[1] = 0;
  w[2] = 0;
  w[3] = 0;
  pl_philox4x64_10(w, seed_lo, seed_hi);
  const pl_u64 keep = pl_random_mask(random_bits), mark = pl_random_mark(random_bits);
  for (int j = 0; j < 4; ++j) w[j] = (w[j] & keep) | mark;
}

// Stochastic rounding's choice (rounding._sr_up): away from zero iff frac64 + R >= 2**64, frac64
// the discarded fraction times 2**64, floored, R the word (PL_SRF's words carry its offset).
// PL_SRC first rounds frac64 to its top N bits (nearest, ties to even; N from the marker bit) and
// adds the word without the marker; a fraction that rounds up to 1 always goes away.
PL_HD bool pl_sr_up(pl_u64 frac64, pl_u64 rw, int mode) {
  if (mode != PL_SRC) return frac64 != 0 && rw >= 0ULL - frac64;
  const pl_u64 low = rw & (0ULL - rw), unit = low << 1;
  const pl_u64 rem = frac64 & (unit - 1), t = frac64 - rem;
  const bool inc = rem > low || (rem == low && (t & unit) != 0);
  const pl_u64 c = t + (inc ? unit : 0ULL);
  const pl_u64 r = rw ^ low;
  return (inc && c == 0) || (c != 0 && r >= 0ULL - c);
}

// The random word of one flat index.
PL_HD pl_u64 pl_random_word(pl_u64 index, pl_u64 seed_lo, pl_u64 seed_hi, int random_bits) {
  pl_u64 w[4];
  pl_random_group(index >> 2, seed_lo, seed_hi, random_bits, w);
  return w[index & 3];
}

// ----- rounding to an integer multiple of 2**qexp (rounding._round_quantum) ----------------------
// mag >= 0 finite; returns k as a double integer; rw: the element's (masked) random word.
PL_HD double pl_round_quantum(double mag, bool neg, int qexp, int mode, pl_u64 rw) {
  double v = ldexp(mag, -qexp);
  // scaling down a tiny input can underflow: v < 2**-1022 then stands in for it (every mode
  // decides the same for any value in (0, 2**-64))
  if (qexp > 0 && ldexp(v, qexp) != mag) v = ldexp(1.0, -100);
  if (mode == PL_RNE) return rint(v);
  const double f = floor(v);
  switch (mode) {
    case PL_RTZ:
      return f;
    case PL_RNA:
      return f + (v - f >= 0.5 ? 1.0 : 0.0);
    case PL_RUP:
      return neg ? f : ceil(v);
    case PL_RDN:
      return neg ? ceil(v) : f;
    case PL_RTO:
      return f + ((v != f && fmod(f, 2.0) == 0.0) ? 1.0 : 0.0);
    case PL_RNZ:
      return f + (v - f > 0.5 ? 1.0 : 0.0);
    case PL_SRE:
      return f + ((v != f && (rw >> 63) != 0) ? 1.0 : 0.0);
    default: {  // stochastic modes: up iff floor(frac * 2**64) + R >= 2**64 (pl_sr_up)
      const pl_u64 frac64 = (pl_u64)floor(ldexp(v - f, 64));
      return f + (pl_sr_up(frac64, rw, mode) ? 1.0 : 0.0);
    }
  }
}

// ----- the plan of one rounding job (rounding._Plan) ---------------------------------------------
template <typename F>
struct pl_plan {
  typedef typename pl_traits<F>::U U;
  pl_format fmt;
  int mode;
  int saturate;  // overflow == "saturate"
  int flush;     // subnormals == "flush"
  int s;         // bits dropped in the format's normal range
  int emin;
  int qexp;  // quantum exponent below the smallest normal
  int flip_parity;  // exponent-only format whose bias parity differs from the working type's
  int p3109;        // P3109 overflow rules (pl_is_p3109)
  U threshold;
  U maxbits;
  double smallest_normal;
};

template <typename F>
PL_HD pl_plan<F> pl_make_plan(const pl_format& fmt, int mode, int saturate, int flush) {
  typedef pl_traits<F> T;
  pl_plan<F> p;
  p.fmt = fmt;
  p.mode = mode;
  p.saturate = saturate;
  p.flush = flush;
  p.s = T::P > fmt.mbits ? T::P - fmt.mbits : 0;
  p.emin = pl_emin(fmt);
  p.qexp = p.emin - (fmt.has_subnormals ? fmt.mbits : 0);
  p.flip_parity = fmt.mbits == 0 && ((fmt.bias - (int)T::BIAS) & 1) != 0;
  p.p3109 = pl_is_p3109(fmt);
  p.smallest_normal = pl_smallest_normal(fmt);
  const double thr = p.smallest_normal > T::min_normal() ? p.smallest_normal : T::min_normal();
  p.threshold = T::bits_from_double(thr);
  p.maxbits = T::bits_from_double(pl_fmt_max(fmt));
  return p;
}

// Result bits (sign included) for NaN/inf inputs and overflow (rounding._special): an overflow is
// a result beyond the max after rounding with an unbounded exponent; under overflow "ieee" it
// goes to inf (NaN without inf) in the round-to-nearest and stochastic modes and the outward
// directed mode, to max under toward_zero, the inward directed mode and odd (IEEE 754 clause
// 7.4), except that P3109 formats send odd to inf too (the P3109 interim report's Saturate,
// OvfInf mode).
template <typename F>
PL_HD typename pl_traits<F>::U pl_special(const pl_plan<F>& p, typename pl_traits<F>::U u, bool neg) {
  typedef pl_traits<F> T;
  typedef typename T::U U;
  const U signbit = (U)1 << (T::W - 1);
  const pl_format& fmt = p.fmt;
  const bool nan_keeps_sign =
      (fmt.nan_style == PL_NAN_IEEE || fmt.nan_style == PL_NAN_FN) && fmt.is_signed;
  const U sign_bits = neg ? signbit : (U)0;
  const bool is_nan = u > T::inf_bits();
  const bool is_inf = u == T::inf_bits();
  bool to_inf;
  if (p.saturate) {
    to_inf = false;
  } else if (p.mode == PL_RNE || p.mode == PL_RNA || p.mode == PL_RNZ || pl_is_stochastic(p.mode)) {
    to_inf = true;
  } else if (p.mode == PL_RUP) {
    to_inf = !neg;
  } else if (p.mode == PL_RDN) {
    to_inf = neg;
  } else {
    to_inf = p.mode == PL_RTO && p.p3109;
  }
  if (is_inf && !p.saturate) to_inf = true;
  U big, big_sign;
  if (fmt.has_inf) {
    big = to_inf ? T::inf_bits() : p.maxbits;
    big_sign = sign_bits;
  } else if (fmt.nan_style != PL_NAN_NONE) {
    big = to_inf ? T::nan_bits() : p.maxbits;
    big_sign = nan_keeps_sign ? sign_bits : (to_inf ? (U)0 : sign_bits);
  } else {
    big = p.maxbits;
    big_sign = sign_bits;
  }
  const U nan_sign = nan_keeps_sign ? sign_bits : (U)0;
  return is_nan ? (T::nan_bits() | nan_sign) : (big | big_sign);
}

// Magnitude bits of results for inputs below p.threshold, in exact double arithmetic
// (rounding._low_bits).
template <typename F>
PL_HD typename pl_traits<F>::U pl_low_bits(const pl_plan<F>& p, typename pl_traits<F>::U u, bool neg,
                                           pl_u64 rw) {
  typedef pl_traits<F> T;
  const pl_format& fmt = p.fmt;
  const double mag = (double)T::value(u);
  int e;
  frexp(mag, &e);
  e -= 1;
  const int qexp = e >= p.emin ? e - fmt.mbits : p.qexp;
  double k = pl_round_quantum(mag, neg, qexp, p.mode, rw);
  if (fmt.mbits == 0 && e >= p.emin && (p.mode == PL_RNE || p.mode == PL_RTO)) {
    // exponent-only formats: k is 1 or 2 in the normal range, and "even" is the parity of the
    // code (exponent field), not of k
    const double v = ldexp(mag, -qexp);
    const bool code_odd = ((e + fmt.bias) & 1) != 0;
    if (p.mode == PL_RNE) {
      if (v == 1.5) k = code_odd ? 2.0 : 1.0;
    } else if (v != floor(v)) {
      k = code_odd ? 1.0 : 2.0;
    }
  }
  double val = ldexp(k, qexp);
  if (!fmt.has_zero) {  // e8m0: zero is NaN (the least value without NaN); positive values
    // below 2**emin go to 2**emin
    if (mag == 0.0 && fmt.nan_style != PL_NAN_NONE) return T::nan_bits();
    if (val < p.smallest_normal) val = p.smallest_normal;
  }
  if (p.flush && val < p.smallest_normal) val = 0.0;
  return T::bits_from_double(val);
}

template <typename F>
PL_HD typename pl_traits<F>::U pl_finish_bits(const pl_plan<F>& p, typename pl_traits<F>::U u,
                                              bool neg, typename pl_traits<F>::U r);

// Round the value with bits `bits` (working type F) to the format: the result's bits.
// rw: the element's random word (masked to random_bits), used by stochastic rounding only.
template <typename F>
PL_HD typename pl_traits<F>::U pl_round_bits(const pl_plan<F>& p, typename pl_traits<F>::U bits,
                                             pl_u64 rw) {
  typedef pl_traits<F> T;
  typedef typename T::U U;
  const int W = T::W;
  const U abs_mask = ((U)1 << (W - 1)) - 1;
  const U u = bits & abs_mask;
  const U sign = bits ^ u;
  const int s = p.s;
  U r;
  if (s == 0) {
    r = u;
  } else {
    const U mask = ((U)1 << s) - 1;
    switch (p.mode) {
      case PL_RTZ:
        r = u;
        break;
      case PL_RNE:  // "even" is the parity of the format's code
        r = (((u >> s) & 1) ^ (U)p.flip_parity) + (((U)1 << (s - 1)) - 1) + u;
        break;
      case PL_RNA:
        r = u + ((U)1 << (s - 1));
        break;
      case PL_RUP:
        r = u + (sign == 0 ? mask : (U)0);
        break;
      case PL_RDN:
        r = u + (sign != 0 ? mask : (U)0);
        break;
      case PL_RNZ:  // half the quantum less one: exact ties stay down
        r = u + (((U)1 << (s - 1)) - 1);
        break;
      case PL_SRE:  // inexact: a whole quantum up iff the top random bit is set
        r = u + (((u & mask) != 0 && (rw >> 63) != 0) ? ((U)1 << s) : (U)0);
        break;
      case PL_RTO:  // inexact: the neighbour whose code is odd
        r = u & ~mask;
        if ((u & mask) != 0 && (((r >> s) & 1) ^ (U)p.flip_parity) == 0) r += (U)1 << s;
        break;
      case PL_SRC: {  // the dropped bits rounded to N (nearest even), then the word's top s bits
        const pl_u64 low = rw & (0ULL - rw);              // the marker 2**(63 - N)
        const pl_u64 unit = (low << 1) >> (64 - s);       // 2**(s - N), or 0/1 when N >= s
        r = u;
        if (unit > 1) r = (u + ((u / (U)unit) & 1) + ((U)unit / 2 - 1)) & ~((U)unit - 1);
        r += (U)((rw ^ low) >> (64 - s));
        break;
      }
      default: {  // stochastic (and stochastic_offset): the top s bits of the random word
        const U top = (U)(rw >> (64 - W));
        r = u + (top >> (W - s));
      }
    }
    r &= ~mask;
  }
  const bool neg = sign != 0;
  if (u < p.threshold) r = pl_low_bits(p, u, neg, rw);
  return pl_finish_bits(p, u, neg, r);
}

// The rest of pl_round_bits once the magnitude is rounded (r: the result's magnitude bits, or
// any value above p.maxbits for an overflow): overflow, inf and NaN, unsigned formats, zeros.
// u: the input's magnitude bits; neg: its sign.
template <typename F>
PL_HD typename pl_traits<F>::U pl_finish_bits(const pl_plan<F>& p, typename pl_traits<F>::U u,
                                              bool neg, typename pl_traits<F>::U r) {
  typedef pl_traits<F> T;
  typedef typename T::U U;
  const int W = T::W;
  const U abs_mask = ((U)1 << (W - 1)) - 1;
  const U sign = neg ? (U)1 << (W - 1) : (U)0;
  // overflow, inf and NaN
  const bool over = u > p.maxbits && (u >= T::inf_bits() || r > p.maxbits);
  U res = over ? pl_special(p, u, neg) : (r | sign);
  bool nan = (res & abs_mask) > T::inf_bits();
  if (!p.fmt.is_signed) {  // unsigned: negative inputs are NaN, or the least value without NaN
    const bool negative = neg && !(u == 0 && p.fmt.has_zero) && u <= T::inf_bits();
    if (p.fmt.nan_style != PL_NAN_NONE) {
      nan = nan || negative;
    } else if (negative) {
      res = p.fmt.has_zero ? (U)0 : T::bits_from_double(pl_smallest_subnormal(p.fmt));
    }
    if (nan) res = T::nan_bits();
  }
  // every value subnormal (no exponent bits): saturated results flush too
  if (p.flush && p.maxbits < p.threshold && (res & abs_mask) < T::inf_bits()) res &= ~abs_mask;
  if (p.fmt.nan_style == PL_NAN_FNUZ || !p.fmt.is_signed) {
    if ((res & abs_mask) == 0) res = 0;  // no negative zero
  }
  if (nan && p.fmt.nan_style != PL_NAN_IEEE && p.fmt.nan_style != PL_NAN_FN) res = T::nan_bits();
  return res;
}

// ----- fast paths outside the normal range (vectorisable; native/core.cpp runs them in blocks) ---
// Below the smallest normal the format's grid has a fixed quantum q = 2**qexp. Adding the magic
// constant C = 2**(qexp + P) (whose binade is spaced by q) to a magnitude below the smallest
// normal rounds it to a multiple k*q in nearest_even, exactly as IEEE addition rounds; the bits of
// the sum less those of C are k, and (sum - C) is k*q, exactly. The other deterministic modes
// correct k by one, from the sign of the exact residue |x| - k*q and whether it is a tie. The
// stochastic modes take k and the discarded fraction from the input's bit pattern by integer
// shifts (pl_low_multiple_random). Above the max the result is one of two constants per sign. Each function here gives pl_round_bits's
// bits for the inputs it is meant for (the caller selects them), without branches. Needs the
// default rounding of the hardware (nearest_even) and no flush-to-zero, like the rest of the file.

// Constants of the fast path below the smallest normal.
template <typename F>
struct pl_low_plan {
  typedef typename pl_traits<F>::U U;
  int ok;             // the path applies to this job (else such inputs take pl_round_bits)
  int base;           // BIAS + P + qexp: an input with exponent field E is sig * q * 2**(E - base)
  F magic;            // C = 2**(qexp + P)
  U magic_bits;
  U half_q;           // bits of q / 2 (those of inf where it underflows: every low input is
                      // then exact)
  U flush_below;      // results below this (the smallest normal) become zero; 0 without flush
  U keep_neg_zero;    // all ones when a negative input that rounds to zero keeps its sign
  int code_shift;     // the code's magnitude is k << code_shift
  U code_keep;        // and-mask of that code (clears subnormal codes under flush)
};

// ok when: a mode of the header up to stochastic_equal; the format has zero and a fixed quantum
// below its smallest normal in the working type (its smallest normal is normal there: rounding._Plan.fixed_quantum); a
// normal value exists (not all_low); C is finite; and (s > 0, or every input below the threshold
// is exact: native/core.cpp rounds s == 0 jobs with the toward_zero loop).
template <typename F>
PL_HD pl_low_plan<F> pl_make_low_plan(const pl_plan<F>& p) {
  typedef pl_traits<F> T;
  typedef typename T::U U;
  const pl_format& f = p.fmt;
  pl_low_plan<F> L;
  const int msub = f.has_subnormals ? f.mbits : 0;
  const int base = (int)T::BIAS + (int)T::P + p.qexp;  // 1 + the bits dropped at exponent field 1
  L.ok = p.mode <= PL_SRE && f.has_zero &&
         p.smallest_normal >= T::min_normal() && p.maxbits >= p.threshold && msub <= (int)T::P &&
         base >= 1 && p.qexp + (int)T::P <= (int)T::BIAS && (p.s > 0 || base <= 1);
  L.base = base;
  const int cexp = L.ok ? p.qexp + (int)T::P : 0;
  L.magic = (F)ldexp(1.0, cexp);
  L.magic_bits = T::bits(L.magic);
  L.half_q = base >= 2 ? T::bits((F)ldexp(1.0, p.qexp - 1)) : T::inf_bits();
  L.flush_below = p.flush ? p.threshold : (U)0;
  L.keep_neg_zero = (f.is_signed && f.nan_style != PL_NAN_FNUZ) ? ~(U)0 : (U)0;
  L.code_shift = f.mbits - msub;
  L.code_keep = p.flush ? ~(((U)1 << f.mbits) - 1) : ~(U)0;
  return L;
}

// k for the stochastic modes (pl_low_multiple), exactly as pl_round_quantum decides it, by
// integer operations on the bit pattern a (below the smallest normal): |x| = sig * 2**-d
// quanta, with sig the significand (hidden bit included) and d = base - max(E, 1) >= 0 for
// exponent field E. k = sig >> d; the discarded fraction times 2**64, floored, is
// frac64 = sig << (64 - d) modulo 2**64 (1 <= d <= 64), sig >> (d - 64) (d > 64), or 0 (d = 0); stochastic rounds up iff frac64 + rw >= 2**64 (a carry out of 64 bits),
// stochastic_equal iff the fraction is not zero and rw's top bit is set. rw: the element's
// (masked) random word.
template <typename F>
PL_HD_VEC typename pl_traits<F>::U pl_low_multiple_random(const pl_low_plan<F>& L, int mode,
                                                      typename pl_traits<F>::U a, pl_u64 rw) {
  typedef pl_traits<F> T;
  typedef typename T::U U;
  const int W = T::W, P = T::P;
  const U field = a >> P;
  const U sig = (a & (((U)1 << P) - 1)) | (field != 0 ? (U)1 << P : (U)0);
  const int d = L.base - (int)(field != 0 ? field : 1);
  const int dk = d < W - 1 ? d : W - 1;  // sig < 2**(W - 1): a shift by W - 1 leaves 0
  const U k = sig >> dk;
  if (mode == PL_SRE) return k + (U)(((k << dk) != sig) & (rw >> 63));
  const pl_u64 s64 = (pl_u64)sig;
  const int dr = d - 64 < 63 ? d - 64 : 63;  // sig < 2**63 as well
  const pl_u64 frac64 =
      d <= 64 ? (s64 << ((64 - d) & 63)) & ((pl_u64)0 - (pl_u64)(d != 0)) : s64 >> (dr & 63);
  return k + (U)(frac64 + rw < rw);
}

// k, the multiple of the quantum that the magnitude with bits a (below the smallest normal)
// rounds to in `mode`; neg: the sign (0/1); rw: the element's (masked) random word (stochastic
// modes only).
template <typename F>
PL_HD_VEC typename pl_traits<F>::U pl_low_multiple(const pl_low_plan<F>& L, int mode,
                                               typename pl_traits<F>::U a,
                                               typename pl_traits<F>::U neg, pl_u64 rw = 0) {
  typedef pl_traits<F> T;
  typedef typename T::U U;
  if (mode == PL_SR || mode == PL_SRE) return pl_low_multiple_random<F>(L, mode, a, rw);
  const F v = T::value(a);
  const F t = v + L.magic;  // rounds to nearest even
  const U k = T::bits(t) - L.magic_bits;
  if (mode == PL_RNE) return k;
  const U d = T::bits(v - (t - L.magic));  // the residue, exact; its sign decides
  const U sign = d >> (T::W - 1), inexact = (U)((d << 1) != 0);
  const U above = inexact & (sign ^ 1), below = inexact & sign;
  switch (mode) {
    case PL_RNA:  // a tie that nearest_even rounded down
      return k + (U)(d == L.half_q);
    case PL_RNZ:  // a tie that nearest_even rounded up
      return k - (U)(d == (L.half_q | ((U)1 << (T::W - 1))));
    case PL_RUP:
      return k + (above & (neg ^ 1)) - (below & neg);
    case PL_RDN:
      return k + (above & neg) - (below & (neg ^ 1));
    case PL_RTO: {
      const U even = (k & 1) ^ 1;
      return k + (above & even) - (below & even);
    }
    default:  // PL_RTZ
      return k - below;
  }
}

// Result bits (sign included) of an input whose magnitude bits a lie below the smallest normal
// (L.ok; signed formats, or a >= 0). neg: the sign bit (0/1); rw: the random word (stochastic).
template <typename F>
PL_HD_VEC typename pl_traits<F>::U pl_low_fast(const pl_low_plan<F>& L, int mode,
                                           typename pl_traits<F>::U a,
                                           typename pl_traits<F>::U neg, pl_u64 rw = 0) {
  typedef pl_traits<F> T;
  typedef typename T::U U;
  const U k = pl_low_multiple<F>(L, mode, a, neg, rw);
  U r = T::bits(T::value(L.magic_bits + k) - L.magic);  // k * q, exactly
  r &= (U)0 - (U)(r >= L.flush_below);
  const U keep_sign = L.keep_neg_zero | ((U)0 - (U)(r != 0));
  return r | ((neg << (T::W - 1)) & keep_sign);
}

// The code (sign included: sign_code is the format's sign bit, 0 when unsigned) of the same
// inputs as pl_low_fast.
template <typename F>
PL_HD_VEC typename pl_traits<F>::U pl_low_code(const pl_low_plan<F>& L, int mode,
                                           typename pl_traits<F>::U a,
                                           typename pl_traits<F>::U neg,
                                           typename pl_traits<F>::U sign_code, pl_u64 rw = 0) {
  typedef typename pl_traits<F>::U U;
  const U k = (pl_low_multiple<F>(L, mode, a, neg, rw) << L.code_shift) & L.code_keep;
  const U keep_sign = L.keep_neg_zero | ((U)0 - (U)(k != 0));
  return k | (sign_code & ((U)0 - neg) & keep_sign);
}

// Result bits of a finite input above the max that rounds above it (inf: an infinite input), by
// sign: pl_round_bits's result for every such input.
template <typename F>
PL_HD typename pl_traits<F>::U pl_overflow_bits(const pl_plan<F>& p, bool neg, bool inf) {
  typedef pl_traits<F> T;
  return pl_finish_bits(p, inf ? T::inf_bits() : T::inf_bits() - 1, neg, T::inf_bits());
}

template <typename F>
PL_HD F pl_round_value(const pl_plan<F>& p, F x, pl_u64 rw) {
  return pl_traits<F>::value(pl_round_bits(p, pl_traits<F>::bits(x), rw));
}

// ----- integer formats (rounding._round_int_chunk) -----------------------------------------------
// x rounded to an integer of `bits` bits (saturating; NaN stays NaN), as a double.
PL_HD double pl_round_int(double a, int bits, int is_signed, int mode, pl_u64 rw) {
  const pl_u64 ab = pl_bits_of(a);
  const bool neg = (ab >> 63) != 0;
  const pl_u64 mag_bits = ab & 0x7FFFFFFFFFFFFFFFULL;
  const bool finite = mag_bits < 0x7FF0000000000000ULL;
  double val;
  if (finite) {
    const double k = pl_round_quantum(pl_f64_of(mag_bits), neg, 0, mode, rw);
    val = (neg ? -k : k) + 0.0;  // integers have no negative zero
  } else if (mag_bits > 0x7FF0000000000000ULL) {
    return pl_nan64();
  } else {
    val = neg ? -pl_inf64() : pl_inf64();
  }
  const double lo = is_signed ? -ldexp(1.0, bits - 1) : 0.0;
  const double hi = is_signed ? ldexp(1.0, bits - 1) - 1.0 : ldexp(1.0, bits) - 1.0;
  if (val < lo) val = lo;
  if (val > hi) val = hi;
  return val;
}

// ----- codes (codec._float_codes, codec._decode_arith) -------------------------------------------
// Magnitude-and-sign code of the canonical positive NaN (-1 when the format has none).
PL_HD pl_i64 pl_nan_code(const pl_format& f) {
  const int e = f.ebits, m = f.mbits;
  if (f.nan_style == PL_NAN_IEEE) return m ? (pl_i64)(((((1ULL << e) - 1) << m) | (1ULL << (m - 1)))) : -1;
  if (f.nan_style == PL_NAN_FN) return (pl_i64)((1ULL << (e + m)) - 1);
  if (f.nan_style == PL_NAN_FNUZ) return (pl_i64)(1ULL << (pl_total_bits(f) - 1));
  return -1;
}

// The code of an already rounded value with bits rb. Sets *nan_error when rb is NaN and the
// format has no NaN code (the caller raises ValueError).
template <typename F>
PL_HD pl_u64 pl_encode_rounded(const pl_plan<F>& p, typename pl_traits<F>::U rb, int* nan_error) {
  typedef pl_traits<F> T;
  typedef typename T::U U;
  const int W = T::W;
  const pl_format& fmt = p.fmt;
  const int m = fmt.mbits, nbits = pl_total_bits(fmt);
  const U abs_mask = ((U)1 << (W - 1)) - 1;
  const U offset = (U)((U)(pl_i64)(T::BIAS - fmt.bias) << m);
  const U mag = rb & abs_mask;
  U code = (mag >> p.s) - offset;
  if (mag < p.threshold) {
    const double v = (double)T::value(mag);
    if (v == 0.0) {
      code = 0;
    } else {
      int e;
      frexp(v, &e);
      e -= 1;
      const bool normal = e >= p.emin;
      const pl_i64 field = normal ? e + fmt.bias : 0;
      const double sig = ldexp(v, normal ? m - e : -p.qexp) - (normal ? ldexp(1.0, m) : 0.0);
      code = (U)((pl_u64)(field << m) + (pl_u64)(pl_i64)sig);
    }
  }
  const U sign = fmt.is_signed ? (U)((rb >> (W - 1)) << (nbits - 1)) : (U)0;
  code |= sign;
  if (mag >= T::inf_bits()) {
    const bool nan = mag > T::inf_bits();
    if (nan && fmt.nan_style == PL_NAN_NONE) *nan_error = 1;
    const U inf_code = (U)pl_inf_code(fmt);
    const pl_i64 nan_code = pl_nan_code(fmt);
    const U nan_sign =
        (fmt.nan_style == PL_NAN_IEEE || fmt.nan_style == PL_NAN_FN) ? sign : (U)0;
    code = nan ? ((U)(nan_code > 0 ? nan_code : 0) | nan_sign) : (inf_code | sign);
  }
  return (pl_u64)code;
}

// Round and encode in one step.
template <typename F>
PL_HD pl_u64 pl_encode_value(const pl_plan<F>& p, F x, pl_u64 rw, int* nan_error) {
  return pl_encode_rounded(p, pl_round_bits(p, pl_traits<F>::bits(x), rw), nan_error);
}

// Two's-complement code of a rounded integer value (NaN sets *nan_error).
PL_HD pl_u64 pl_encode_int(double rounded, int bits, int* nan_error) {
  if (pl_isnan(rounded)) {
    *nan_error = 1;
    return 0;
  }
  return (pl_u64)(pl_i64)rounded & ((bits >= 64) ? ~0ULL : ((1ULL << bits) - 1));
}

// Value of a code, by the format's definition (double; NaN with the code's sign where the
// format's NaN keeps it).
PL_HD double pl_decode(const pl_format& f, pl_u64 c) {
  const int e = f.ebits, m = f.mbits, nbits = pl_total_bits(f);
  bool neg = false;
  pl_u64 mag = c;
  if (f.is_signed) {
    neg = ((c >> (nbits - 1)) & 1) != 0;
    mag = c & ((1ULL << (nbits - 1)) - 1);
  }
  const pl_u64 exp_field = mag >> m;
  const double frac = (double)(mag & ((1ULL << m) - 1));
  double val;
  if (exp_field == 0 && f.has_zero) {
    val = f.has_subnormals ? ldexp(frac, pl_emin(f) - m) : 0.0;
  } else {
    val = ldexp(frac + ldexp(1.0, m), (int)exp_field - f.bias - m);
  }
  const pl_u64 top = (1ULL << e) - 1;
  bool nan = false;
  if (f.nan_style == PL_NAN_IEEE) {
    if (exp_field == top) {
      if (frac == 0.0) {
        val = pl_inf64();
      } else {
        nan = true;
      }
    }
  } else if (f.nan_style == PL_NAN_FN) {
    nan = mag == (1ULL << (e + m)) - 1;
  } else if (f.nan_style == PL_NAN_FNUZ) {
    nan = neg && mag == 0;
  }
  if (f.has_inf && f.nan_style != PL_NAN_IEEE && mag == pl_inf_code(f)) val = pl_inf64();
  const bool nan_keeps_sign = f.nan_style == PL_NAN_IEEE || f.nan_style == PL_NAN_FN;
  if (nan) return (neg && nan_keeps_sign) ? -pl_nan64() : pl_nan64();
  return neg ? -val : val;
}

// Value of an integer-format code (two's complement when signed).
PL_HD double pl_decode_int(pl_u64 c, int bits, int is_signed) {
  pl_i64 v = (pl_i64)c;
  if (is_signed && bits < 64 && c >= (1ULL << (bits - 1))) v -= (pl_i64)(1ULL << bits);
  return (double)v;
}

// ----- groups of four elements: what one GPU thread does, and the host harness too ---------------
// Elements 4*g .. 4*g+3 (those below n) share one Philox block, as in precision_lab/_random.py.
struct pl_sr_key {
  pl_u64 seed_lo, seed_hi;
  int random_bits;
};

template <typename F>
PL_HD void pl_round_group(const pl_plan<F>& p, const F* x, F* out, pl_u64 n, pl_u64 g,
                          const pl_sr_key& key) {
  pl_u64 w[4] = {0, 0, 0, 0};
  if (pl_is_stochastic(p.mode)) pl_random_group(g, key.seed_lo, key.seed_hi, key.random_bits, w);
  for (int j = 0; j < 4; ++j) {
    const pl_u64 i = 4 * g + j;
    if (i < n) out[i] = pl_round_value(p, x[i], w[j]);
  }
}

template <typename F, typename C>
PL_HD int pl_encode_group(const pl_plan<F>& p, const F* x, C* out, pl_u64 n, pl_u64 g,
                          const pl_sr_key& key) {
  pl_u64 w[4] = {0, 0, 0, 0};
  int err = 0;
  if (pl_is_stochastic(p.mode)) pl_random_group(g, key.seed_lo, key.seed_hi, key.random_bits, w);
  for (int j = 0; j < 4; ++j) {
    const pl_u64 i = 4 * g + j;
    if (i < n) out[i] = (C)pl_encode_value(p, x[i], w[j], &err);
  }
  return err;
}

template <typename F>
PL_HD void pl_round_int_group(const F* x, F* out, pl_u64 n, pl_u64 g, int bits, int is_signed,
                              int mode, const pl_sr_key& key) {
  pl_u64 w[4] = {0, 0, 0, 0};
  if (pl_is_stochastic(mode)) pl_random_group(g, key.seed_lo, key.seed_hi, key.random_bits, w);
  for (int j = 0; j < 4; ++j) {
    const pl_u64 i = 4 * g + j;
    if (i < n) {
      const double v = pl_round_int((double)x[i], bits, is_signed, mode, w[j]);
      out[i] = pl_traits<F>::value(pl_traits<F>::bits_from_double(v));
    }
  }
}

template <typename F, typename C>
PL_HD int pl_encode_int_group(const F* x, C* out, pl_u64 n, pl_u64 g, int bits, int is_signed,
                              int mode, const pl_sr_key& key) {
  pl_u64 w[4] = {0, 0, 0, 0};
  int err = 0;
  if (pl_is_stochastic(mode)) pl_random_group(g, key.seed_lo, key.seed_hi, key.random_bits, w);
  for (int j = 0; j < 4; ++j) {
    const pl_u64 i = 4 * g + j;
    if (i < n) {
      const double v = pl_round_int((double)x[i], bits, is_signed, mode, w[j]);
      out[i] = (C)pl_encode_int(v, bits, &err);
    }
  }
  return err;
}

#endif  // PL_ROUND_CUH
