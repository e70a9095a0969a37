// The kernels built for AVX2 + FMA (x86-64 with GCC or Clang); used only where the CPU has both.
// The header is included inside the namespace, so these copies of its inline functions are
// distinct symbols from the baseline ones (no AVX2 code can leak into the baseline path).
#include <math.h>
#include <string.h>

#include "kernels.h"

#if defined(PL_HAVE_AVX2)
#include <immintrin.h>
#define PL_KERNELS_AVX2 1
// blocks.inc's random words: philox.inc's AVX2 and AVX-512 copies, picked at run time
#define PL_PHILOX_AVX2 1
#define PL_PHILOX_AVX512 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC target("avx2,fma")
#endif
namespace pl_avx2 {
#include "../cuda/pl_gemm.cuh"
#include "common.inc"
#include "kernels.inc"
#include "fma32.inc"
#include "blockfma_fast.inc"
#include "quant.inc"
#include "philox.inc"
#include "blocks.inc"
#include "hadamard.inc"
}  // namespace pl_avx2
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
