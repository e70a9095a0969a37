// pl_round.cu: elementwise kernels of precision_lab.gpu (round_to, encode, decode on CuPy arrays).
//
// One thread handles groups of four consecutive elements (they share one Philox4x64-10 block of
// random words for stochastic rounding) in a grid-stride loop. All arithmetic is in pl_round.cuh,
// whose functions the test suite also runs on the CPU (tests/test_cuda_host.py).
//
// Kernel arguments: the format as (ebits, mbits, bias, nan_style, flags) (precision_lab.gpu.
// format_args), the rounding mode index (rounding.ROUNDING_MODES order), saturate, flush, and the
// stochastic-rounding key (seed mod 2**64, seed >> 64, random_bits).
#include "pl_round.cuh"

#define PL_GRID_LOOP(groups)                                                            \
  for (pl_u64 g = (pl_u64)blockIdx.x * blockDim.x + threadIdx.x; g < (groups);         \
       g += (pl_u64)gridDim.x * blockDim.x)

template <typename F>
__device__ void pl_round_kernel(const F* __restrict__ x, F* __restrict__ out, pl_u64 n, int fe,
                                int fm, int fbias, int fnan, int fflags, int mode, int saturate,
                                int flush, pl_u64 seed_lo, pl_u64 seed_hi, int random_bits) {
  const pl_plan<F> p =
      pl_make_plan<F>(pl_make_format(fe, fm, fbias, fnan, fflags), mode, saturate, flush);
  pl_sr_key key;
  key.seed_lo = seed_lo;
  key.seed_hi = seed_hi;
  key.random_bits = random_bits;
  PL_GRID_LOOP((n + 3) / 4) pl_round_group(p, x, out, n, g, key);
}

template <typename F, typename C>
__device__ void pl_encode_kernel(const F* __restrict__ x, C* __restrict__ out, pl_u64 n, int fe,
                                 int fm, int fbias, int fnan, int fflags, int mode, int saturate,
                                 int flush, pl_u64 seed_lo, pl_u64 seed_hi, int random_bits,
                                 int* err) {
  const pl_plan<F> p =
      pl_make_plan<F>(pl_make_format(fe, fm, fbias, fnan, fflags), mode, saturate, flush);
  pl_sr_key key;
  key.seed_lo = seed_lo;
  key.seed_hi = seed_hi;
  key.random_bits = random_bits;
  int bad = 0;
  PL_GRID_LOOP((n + 3) / 4) bad |= pl_encode_group(p, x, out, n, g, key);
  if (bad) atomicOr(err, 1);
}

template <typename F>
__device__ void pl_round_int_kernel(const F* __restrict__ x, F* __restrict__ out, pl_u64 n,
                                    int bits, int is_signed, int mode, pl_u64 seed_lo,
                                    pl_u64 seed_hi, int random_bits) {
  pl_sr_key key;
  key.seed_lo = seed_lo;
  key.seed_hi = seed_hi;
  key.random_bits = random_bits;
  PL_GRID_LOOP((n + 3) / 4) pl_round_int_group(x, out, n, g, bits, is_signed, mode, key);
}

template <typename F, typename C>
__device__ void pl_encode_int_kernel(const F* __restrict__ x, C* __restrict__ out, pl_u64 n,
                                     int bits, int is_signed, int mode, pl_u64 seed_lo,
                                     pl_u64 seed_hi, int random_bits, int* err) {
  pl_sr_key key;
  key.seed_lo = seed_lo;
  key.seed_hi = seed_hi;
  key.random_bits = random_bits;
  int bad = 0;
  PL_GRID_LOOP((n + 3) / 4) bad |= pl_encode_int_group(x, out, n, g, bits, is_signed, mode, key);
  if (bad) atomicOr(err, 1);
}

template <typename C, typename F>
__device__ void pl_decode_kernel(const C* __restrict__ codes, F* __restrict__ out, pl_u64 n,
                                 int fe, int fm, int fbias, int fnan, int fflags) {
  const pl_format f = pl_make_format(fe, fm, fbias, fnan, fflags);
  for (pl_u64 i = (pl_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (pl_u64)gridDim.x * blockDim.x) {
    out[i] = pl_traits<F>::value(pl_traits<F>::bits_from_double(pl_decode(f, (pl_u64)codes[i])));
  }
}

template <typename C, typename F>
__device__ void pl_decode_int_kernel(const C* __restrict__ codes, F* __restrict__ out, pl_u64 n,
                                     int bits, int is_signed) {
  for (pl_u64 i = (pl_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (pl_u64)gridDim.x * blockDim.x) {
    out[i] = (F)pl_decode_int((pl_u64)codes[i], bits, is_signed);
  }
}

#define PL_FMT_PARAMS int fe, int fm, int fbias, int fnan, int fflags
#define PL_FMT_ARGS fe, fm, fbias, fnan, fflags
#define PL_SR_PARAMS pl_u64 seed_lo, pl_u64 seed_hi, int random_bits
#define PL_SR_ARGS seed_lo, seed_hi, random_bits

#define PL_ROUND(F, SUF)                                                                       \
  extern "C" __global__ void pl_round_##SUF(const F* x, F* out, pl_u64 n, PL_FMT_PARAMS,       \
                                            int mode, int saturate, int flush, PL_SR_PARAMS) { \
    pl_round_kernel<F>(x, out, n, PL_FMT_ARGS, mode, saturate, flush, PL_SR_ARGS);             \
  }                                                                                            \
  extern "C" __global__ void pl_round_int_##SUF(const F* x, F* out, pl_u64 n, int bits,        \
                                                int is_signed, int mode, PL_SR_PARAMS) {       \
    pl_round_int_kernel<F>(x, out, n, bits, is_signed, mode, PL_SR_ARGS);                      \
  }
PL_ROUND(float, f32)
PL_ROUND(double, f64)

#define PL_ENCODE(F, SUF, C, CSUF)                                                             \
  extern "C" __global__ void pl_encode_##SUF##_##CSUF(const F* x, C* out, pl_u64 n,            \
                                                      PL_FMT_PARAMS, int mode, int saturate,   \
                                                      int flush, PL_SR_PARAMS, int* err) {     \
    pl_encode_kernel<F, C>(x, out, n, PL_FMT_ARGS, mode, saturate, flush, PL_SR_ARGS, err);    \
  }                                                                                            \
  extern "C" __global__ void pl_encode_int_##SUF##_##CSUF(const F* x, C* out, pl_u64 n,        \
                                                          int bits, int is_signed, int mode,   \
                                                          PL_SR_PARAMS, int* err) {            \
    pl_encode_int_kernel<F, C>(x, out, n, bits, is_signed, mode, PL_SR_ARGS, err);             \
  }
PL_ENCODE(float, f32, unsigned char, u8)
PL_ENCODE(float, f32, unsigned short, u16)
PL_ENCODE(float, f32, pl_u32, u32)
PL_ENCODE(float, f32, pl_u64, u64)
PL_ENCODE(double, f64, unsigned char, u8)
PL_ENCODE(double, f64, unsigned short, u16)
PL_ENCODE(double, f64, pl_u32, u32)
PL_ENCODE(double, f64, pl_u64, u64)

#define PL_DECODE(C, CSUF, F, SUF)                                                              \
  extern "C" __global__ void pl_decode_##CSUF##_##SUF(const C* codes, F* out, pl_u64 n,         \
                                                      PL_FMT_PARAMS) {                          \
    pl_decode_kernel<C, F>(codes, out, n, PL_FMT_ARGS);                                         \
  }                                                                                             \
  extern "C" __global__ void pl_decode_int_##CSUF##_##SUF(const C* codes, F* out, pl_u64 n,     \
                                                          int bits, int is_signed) {            \
    pl_decode_int_kernel<C, F>(codes, out, n, bits, is_signed);                                 \
  }
PL_DECODE(unsigned char, u8, float, f32)
PL_DECODE(unsigned short, u16, float, f32)
PL_DECODE(pl_u32, u32, float, f32)
PL_DECODE(pl_u64, u64, float, f32)
PL_DECODE(unsigned char, u8, double, f64)
PL_DECODE(unsigned short, u16, double, f64)
PL_DECODE(pl_u32, u32, double, f64)
PL_DECODE(pl_u64, u64, double, f64)
