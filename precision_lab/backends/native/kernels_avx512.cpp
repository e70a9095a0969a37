// The fp32 FMA GEMM (fma32.inc) built for AVX-512 (x86-64 with GCC or Clang); module.cpp uses it
// only where the CPU (and the OS) supports AVX-512F. The other kernels stay on the AVX2 build.
#include <math.h>
#include <string.h>

#include "kernels.h"

#if defined(PL_HAVE_AVX2)
#include <immintrin.h>
#define PL_KERNELS_AVX512 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,avx512f"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,avx512f")
#endif
namespace pl_avx512 {
#include "../cuda/pl_gemm.cuh"
#include "common.inc"
#include "fma32.inc"
}  // namespace pl_avx512
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
