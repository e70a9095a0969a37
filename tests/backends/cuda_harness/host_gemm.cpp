// Host harness: the kernels of precision_lab/cuda/*.cu run on the CPU (cuda_emul.h).
// The GEMM kernels are exported for ctypes as emu_<kernel>(grid x, y, z, block x, y, z, kernel
// arguments...), every CUDA thread a fiber. The elementwise kernels of pl_round.cu (grid-stride
// loops) are called directly after emu_single_thread(): one thread does all the work.
#include "cuda_emul.h"
#include "pl_gemm.cu"
#include "pl_round.cu"

extern "C" void emu_single_thread() {
  gridDim = {1, 1, 1};
  blockDim = {1, 1, 1};
  blockIdx = {0, 0, 0};
  threadIdx = {0, 0, 0};
}

namespace {
// IEEE fused multiply-add of floats in a rounding mode: exact product, exact sum, one rounding.
float emu_fma(float a, float b, float c, int mode) {
  const double p = (double)a * (double)b, dc = (double)c;
  if (!pl_finite(p) || !pl_finite(dc)) return (float)(p + dc);
  double s, t;
  pl_two_sum(p, dc, &s, &t);
  if (s == 0.0 && t == 0.0) {  // exact zero: +0 unless both are -0 (rounding down: -0 unless +0, +0)
    const bool both_zero = p == 0.0 && dc == 0.0;
    bool neg = both_zero ? (pl_signbit(p) && pl_signbit(dc)) : false;
    if (mode == PL_RDN) neg = both_zero ? (pl_signbit(p) || pl_signbit(dc)) : true;
    return neg ? -0.0f : 0.0f;
  }
  const pl_plan<double> plan = pl_make_plan<double>(pl_make_format(8, 23, 127, PL_NAN_IEEE, 15),
                                                    mode, 0, 0);
  return (float)pl_f64_of(pl_round_bits(plan, pl_bits_of(pl_odd_collapse(s, t)), 0ULL));
}
}  // namespace

float __fmaf_rn(float a, float b, float c) { return emu_fma(a, b, c, PL_RNE); }
float __fmaf_rz(float a, float b, float c) { return emu_fma(a, b, c, PL_RTZ); }
float __fmaf_ru(float a, float b, float c) { return emu_fma(a, b, c, PL_RUP); }

#define PL_EMU_DIMS unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz
#define PL_EMU_GRID pl_emu_dim3{gx, gy, gz}, pl_emu_dim3{bx, by, bz}

#define PL_EMU_GENERIC(F, SUF)                                                                   \
  extern "C" void emu_pl_gemm_generic_##SUF(PL_EMU_DIMS, const double* A, const double* B,      \
                                            const double* C, const double* SA, const double* SB, \
                                            F* D, const pl_i64* params) {                        \
    pl_emu_launch(PL_EMU_GRID, [&] { pl_gemm_generic_##SUF(A, B, C, SA, SB, D, params); });     \
  }
PL_EMU_GENERIC(float, f32)
PL_EMU_GENERIC(double, f64)

#define PL_EMU_FMA(MSUF)                                                                         \
  extern "C" void emu_pl_gemm_fma_##MSUF##_f32(PL_EMU_DIMS, const float* A, const float* B,     \
                                               const float* C, float* D, const pl_i64* params) { \
    pl_emu_launch(PL_EMU_GRID, [&] { pl_gemm_fma_##MSUF##_f32(A, B, C, D, params); });          \
  }
PL_EMU_FMA(rn)
PL_EMU_FMA(rz)
PL_EMU_FMA(ru)
