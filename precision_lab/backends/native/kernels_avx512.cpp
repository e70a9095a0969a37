// The fp32 FMA GEMM (fma32.inc) and the block-FMA fast path (blockfma_fast.inc, with the tile
// kernels' rounding from kernels.inc) built for AVX-512 (x86-64 with GCC or Clang); module.cpp uses it
// only where the CPU (and the OS) supports AVX-512F. The other kernels stay on the AVX2 build.
#include <math.h>
#include <string.h>

#include "kernels.h"

#if defined(PL_HAVE_AVX2)
#include <immintrin.h>
#define PL_KERNELS_AVX512 1
#define PL_KERNELS_AVX2 1  // (a superset: kernels.inc's trunc_v uses the vector round too)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,avx512f"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,avx512f")
#endif
namespace pl_avx512 {
#include "../cuda/pl_gemm.cuh"
#include "common.inc"
#include "kernels.inc"
#include "fma32.inc"
#include "blockfma_fast.inc"
}  // namespace pl_avx512
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
