// kernels.h: the CPU kernels of precision_lab._native_kernels, built twice (kernels_base.cpp for
// baseline x86-64 / any CPU, kernels_avx2.cpp for AVX2+FMA), and the fp32 FMA GEMM and the
// block-FMA fast path a third time for AVX-512 (kernels_avx512.cpp); module.cpp picks them at
// import.
#ifndef PL_NATIVE_KERNELS_H
#define PL_NATIVE_KERNELS_H

// entries of the int64 parameter block of pl_gemm.cuh (PL_P_SIZE; checked in kernels.inc)
#define PL_GEMM_NPARAMS 235

// the fp32 FMA GEMM (fma32.inc), also built for AVX-512 on its own
#define PL_FMA32_DECLS                                                                           \
  long long k_fma32_pack(const float* B, float* Bp, long long K, long long N, long long q0,    \
                         long long q1, const int* grid, int b_trans);                           \
  long long k_fma32_rows(const long long* params, const float* A, const float* Bp,             \
                         const float* C, void* D, int f32, int same_out, long long r0,          \
                         long long r1, const int* grid, long long seg, int a_trans,             \
                         const int* grid_out);                                                  \
  int k_fma32_tile(int which);                                                                 \
  void k_fma64_rows(const double* A, const double* B, const double* C, double* D, long long M, \
                    long long N, long long K, long long r0, long long r1);                    \
  void k_exact_block_rows(const double* A, const double* B, const double* C, float* D,          \
                          long long M, long long N, long long K, long long block, long long r0, \
                          long long r1);                                                       \
  void k_pairwise32_rows(const float* A, const float* B, const float* C, float* D, long long M, \
                         long long N, long long K, long long P, int flush, long long r0,        \
                         long long r1);

// the block-FMA fast path (blockfma_fast.inc), built for each instruction set
#define PL_BFMA_DECLS                                                                            \
  void k_bfma_info(const long long* params, const int* opts, long long* out);                   \
  long long k_bfma_pack_b(const long long* params, const int* opts, const float* B, float* Bs, \
                          int* Be, int* OB, long long q0, long long q1, const int* grid,        \
                          int* spread, const int* sexp);                                        \
  long long k_bfma_rows(const long long* params, const int* opts, const float* A,              \
                        const float* Bs, const int* Be, const int* OB, const float* C, void* D, \
                        int f32, long long r0, long long r1, const int* grid, int spread_b,     \
                        const int* sexp);                                                        \
  long long k_bfma_grouped_rows(const long long* params, const int* opts, const double* A,      \
                                const double* B, const double* SA, const double* SB,             \
                                const int* ESA, const int* ESB, const float* C, void* D, int f32, \
                                long long G, long long kblock, long long nkb, long long r0,      \
                                long long r1, const double* grid);

#define PL_KERNEL_DECLS                                                                          \
  void k_gemm_rows(const long long* params, const double* A, const double* B, const double* C, \
                   const double* SA, const double* SB, const short* EA, const short* EB,       \
                   const float* B32, void* D, int f32, long long r0, long long r1, int flags); \
  void k_align_exps(const double* x, short* out, long long n, int emin);                       \
  PL_FMA32_DECLS                                                                                \
  PL_BFMA_DECLS                                                                                 \
  long long k_quantize(const void* x, int x_f64, void* out, int out_code, long long C,         \
                       long long inner, const double* S, const double* Z, int mode,            \
                       int short_path, int torch, double qmin, double qmax, long long lo,      \
                       long long hi);                                                           \
  void k_dequantize(const void* q, int q_code, void* out, int f64, int short_path, long long C, \
                    long long inner, const double* S, const double* Z, long long lo,            \
                    long long hi);                                                              \
  void k_blocks(const void* x, void* out, int f64, long long U, long long A, long long B,      \
                long long C, int rule, int mode, int codes_only, int int_elem, int int_bits,   \
                const int* elem, const int* scale, const int* ints, const double* dbls,        \
                double* values, const unsigned long long* key, long long u0, long long u1);   \
  double k_block_amax(const void* x, int f64, long long A, long long B, long long C, double* out,   \
                    long long u0, long long u1);                                   \
  void k_hadamard(const float* x, float* out, long long n, const float* signs, int inverse,     \
                  float c, long long b0, long long b1);                                        \
  void k_hadamard_exact64(const float* x, double* out, unsigned char* flags, long long n,       \
                          const double* signs, long long b0, long long b1);                    \
  void k_hadamard_exact32(const float* x, float* out, unsigned char* flags, long long n,        \
                          long long C, const double* signs, int inverse, int odd, double c1,   \
                          double c2, long long b0, long long b1);

namespace pl_base {
PL_KERNEL_DECLS
}
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PL_HAVE_AVX2 1
namespace pl_avx2 {
PL_KERNEL_DECLS
}
namespace pl_avx512 {
PL_FMA32_DECLS
PL_BFMA_DECLS
}
#endif

#endif
