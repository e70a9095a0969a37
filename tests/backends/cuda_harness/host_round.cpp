// Host harness: precision_lab/cuda/pl_round.cuh compiled as plain C++ into a shared library that
// tests/test_cuda_host.py calls through ctypes. Each entry point runs the same per-group functions
// as the CUDA kernels in precision_lab/cuda/pl_round.cu, over all groups of four elements.
#include "pl_round.cuh"

namespace {
pl_format fmt_of(const int* f) { return pl_make_format(f[0], f[1], f[2], f[3], f[4]); }
pl_sr_key key_of(pl_u64 lo, pl_u64 hi, int random_bits) {
  pl_sr_key k;
  k.seed_lo = lo;
  k.seed_hi = hi;
  k.random_bits = random_bits;
  return k;
}

template <typename F>
void round_all(const F* x, F* out, pl_u64 n, const int* f, int mode, int saturate, int flush,
               pl_u64 lo, pl_u64 hi, int rbits) {
  const pl_plan<F> p = pl_make_plan<F>(fmt_of(f), mode, saturate, flush);
  const pl_sr_key key = key_of(lo, hi, rbits);
  for (pl_u64 g = 0; g < (n + 3) / 4; ++g) pl_round_group(p, x, out, n, g, key);
}

template <typename F>
int encode_all(const F* x, pl_u64* out, pl_u64 n, const int* f, int mode, int saturate, int flush,
               pl_u64 lo, pl_u64 hi, int rbits) {
  const pl_plan<F> p = pl_make_plan<F>(fmt_of(f), mode, saturate, flush);
  const pl_sr_key key = key_of(lo, hi, rbits);
  int err = 0;
  for (pl_u64 g = 0; g < (n + 3) / 4; ++g) err |= pl_encode_group(p, x, out, n, g, key);
  return err;
}

template <typename F>
void round_int_all(const F* x, F* out, pl_u64 n, int bits, int is_signed, int mode, pl_u64 lo,
                   pl_u64 hi, int rbits) {
  const pl_sr_key key = key_of(lo, hi, rbits);
  for (pl_u64 g = 0; g < (n + 3) / 4; ++g)
    pl_round_int_group(x, out, n, g, bits, is_signed, mode, key);
}

template <typename F>
int encode_int_all(const F* x, pl_u64* out, pl_u64 n, int bits, int is_signed, int mode,
                   pl_u64 lo, pl_u64 hi, int rbits) {
  const pl_sr_key key = key_of(lo, hi, rbits);
  int err = 0;
  for (pl_u64 g = 0; g < (n + 3) / 4; ++g)
    err |= pl_encode_int_group(x, out, n, g, bits, is_signed, mode, key);
  return err;
}
}  // namespace

extern "C" {
void plh_round_f32(const float* x, float* out, pl_u64 n, const int* f, int mode, int saturate,
                   int flush, pl_u64 lo, pl_u64 hi, int rbits) {
  round_all(x, out, n, f, mode, saturate, flush, lo, hi, rbits);
}
void plh_round_f64(const double* x, double* out, pl_u64 n, const int* f, int mode, int saturate,
                   int flush, pl_u64 lo, pl_u64 hi, int rbits) {
  round_all(x, out, n, f, mode, saturate, flush, lo, hi, rbits);
}
int plh_encode_f32(const float* x, pl_u64* out, pl_u64 n, const int* f, int mode, int saturate,
                   int flush, pl_u64 lo, pl_u64 hi, int rbits) {
  return encode_all(x, out, n, f, mode, saturate, flush, lo, hi, rbits);
}
int plh_encode_f64(const double* x, pl_u64* out, pl_u64 n, const int* f, int mode, int saturate,
                   int flush, pl_u64 lo, pl_u64 hi, int rbits) {
  return encode_all(x, out, n, f, mode, saturate, flush, lo, hi, rbits);
}
void plh_round_int_f32(const float* x, float* out, pl_u64 n, int bits, int is_signed, int mode,
                       pl_u64 lo, pl_u64 hi, int rbits) {
  round_int_all(x, out, n, bits, is_signed, mode, lo, hi, rbits);
}
void plh_round_int_f64(const double* x, double* out, pl_u64 n, int bits, int is_signed, int mode,
                       pl_u64 lo, pl_u64 hi, int rbits) {
  round_int_all(x, out, n, bits, is_signed, mode, lo, hi, rbits);
}
int plh_encode_int_f32(const float* x, pl_u64* out, pl_u64 n, int bits, int is_signed, int mode,
                       pl_u64 lo, pl_u64 hi, int rbits) {
  return encode_int_all(x, out, n, bits, is_signed, mode, lo, hi, rbits);
}
int plh_encode_int_f64(const double* x, pl_u64* out, pl_u64 n, int bits, int is_signed, int mode,
                       pl_u64 lo, pl_u64 hi, int rbits) {
  return encode_int_all(x, out, n, bits, is_signed, mode, lo, hi, rbits);
}
// decoded values as float32 bits (to_f32 != 0) or float64
void plh_decode(const pl_u64* codes, void* out, pl_u64 n, const int* f, int to_f32) {
  const pl_format fmt = fmt_of(f);
  for (pl_u64 i = 0; i < n; ++i) {
    const double v = pl_decode(fmt, codes[i]);
    if (to_f32) {
      static_cast<pl_u32*>(out)[i] = pl_traits<float>::bits_from_double(v);
    } else {
      static_cast<pl_u64*>(out)[i] = pl_traits<double>::bits_from_double(v);
    }
  }
}
void plh_decode_int(const pl_u64* codes, double* out, pl_u64 n, int bits, int is_signed) {
  for (pl_u64 i = 0; i < n; ++i) out[i] = pl_decode_int(codes[i], bits, is_signed);
}
void plh_random_words(pl_u64 lo, pl_u64 hi, int rbits, pl_u64 start, pl_u64 n, pl_u64* out) {
  for (pl_u64 i = 0; i < n; ++i) out[i] = pl_random_word(start + i, lo, hi, rbits);
}
// max, smallest_normal, smallest_subnormal, emin, max_code_magnitude, bits, fits_float32
void plh_format_info(const int* f, double* out) {
  const pl_format fmt = fmt_of(f);
  out[0] = pl_fmt_max(fmt);
  out[1] = pl_smallest_normal(fmt);
  out[2] = pl_smallest_subnormal(fmt);
  out[3] = pl_emin(fmt);
  out[4] = (double)pl_max_code_magnitude(fmt);
  out[5] = pl_total_bits(fmt);
  out[6] = pl_fits_float32(fmt) ? 1.0 : 0.0;
}
}
