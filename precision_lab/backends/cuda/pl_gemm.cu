// pl_gemm.cu: GEMM kernels of precision_lab.gemm.cupy_backend, the accumulator models on the GPU.
//
// * pl_gemm_generic_{f32,f64}: every model (sequential, pairwise, blocked, block_fma,
//   exact_block; product
//   rounding, promotion, scales, stochastic rounding, special values). Blocks of 16x16 threads,
//   one output element per thread; A and B tiles (float64) go through shared memory; the tiles
//   restart at every segment and hold whole block-FMA blocks (tk is a multiple of the block
//   length), so each thread runs the per-element state machine of pl_gemm.cuh on its products;
//   with scales="in_block" each block FMA reads its products' scales from SA and SB.
// * pl_gemm_fma_{rn,rz,ru}_f32: the fixed-order FMA loop for fp32 sequential accumulation
//   with exact products (round-to-nearest-even, toward zero, up): an FMA rounds a*b + s once,
//   which is exactly the model. 128x128 output tiles, 256 threads of 8x8 outputs each (two runs
//   of 4 rows and of 4 columns, 64 apart: float4 shared-memory loads), float32 tiles of depth 8
//   in shared memory, the next tile prefetched into registers, k strictly increasing for every
//   output element.
// Both write d = round(W, out_format, out_rounding) in the output dtype (the f32/f64 suffix; the
// FMA kernels serve output formats that float32 holds).
// Launch: generic grid (ceil(N/16), ceil(M/16), batches), block (16, 16); fma grid
// (ceil(N/128), ceil(M/128), batches), block (16, 16). params: cupy_backend.params (int64).
#include "pl_gemm.cuh"

#define PL_G_TILE 16
#define PL_G_TKMAX 128
#define PL_F_TILE 128
#define PL_F_BK 8

template <typename F>
__device__ void pl_gemm_generic_impl(const double* __restrict__ A, const double* __restrict__ B,
                                     const double* __restrict__ C, const double* __restrict__ SA,
                                     const double* __restrict__ SB, F* __restrict__ D,
                                     const pl_i64* __restrict__ params) {
  __shared__ pl_gemm_cfg cfg;
  __shared__ double As[PL_G_TILE][PL_G_TKMAX + 1];
  __shared__ double Bs[PL_G_TKMAX][PL_G_TILE];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int tid = ty * PL_G_TILE + tx;
  const int nthreads = PL_G_TILE * PL_G_TILE;
  if (tid == 0) pl_gemm_load_cfg(&cfg, params);
  __syncthreads();
  const pl_i64 M = cfg.M, N = cfg.N, K = cfg.K;
  const pl_i64 batch = blockIdx.z;
  const pl_i64 row0 = (pl_i64)blockIdx.y * PL_G_TILE, col0 = (pl_i64)blockIdx.x * PL_G_TILE;
  const pl_i64 row = row0 + ty, col = col0 + tx;
  const bool live = row < M && col < N;
  const double* Ab = A + batch * M * K;
  const double* Bb = B + batch * K * N;
  const pl_u64 idx = (pl_u64)((batch * M + row) * N + col);
  pl_gemm_elem e;
  pl_gemm_begin(cfg, &e, idx, (cfg.has_c && live) ? C[idx] : 0.0);
  const pl_i64 nseg = K > 0 ? (K + cfg.seg - 1) / cfg.seg : 0;
  const int TK = cfg.tk;
  for (pl_i64 s = 0; s < nseg; ++s) {
    pl_i64 k0, k1;
    pl_gemm_segment(cfg, s, &k0, &k1);
    if (live) pl_gemm_begin_segment(cfg, &e, k0, k1);
    if (pl_gemm_is_structured(cfg)) {  // spec 3e: each thread reads its products at random
      if (live) {
        double sa, sb;
        pl_gemm_scales(cfg, SA, SB, batch, row, col, k0, &sa, &sb);
        const double P = pl_gemm_structured(cfg, Ab + row * K + k0, 1, Bb + k0 * N + col, N,
                                            k1 - k0, e.has_s0 != 0, e.s0, idx);
        pl_gemm_promote(cfg, &e, s, P, sa, sb);
      }
      continue;  // (uniform over the block: cfg is shared)
    }
    for (pl_i64 t0 = k0; t0 < k1; t0 += TK) {
      const int tn = (int)(k1 - t0 < TK ? k1 - t0 : TK);
      for (int i = tid; i < PL_G_TILE * TK; i += nthreads) {
        const int r = i / TK, kk = i % TK;
        As[r][kk] = (row0 + r < M && kk < tn) ? Ab[(row0 + r) * K + t0 + kk] : 0.0;
      }
      for (int i = tid; i < TK * PL_G_TILE; i += nthreads) {
        const int kk = i / PL_G_TILE, cc = i % PL_G_TILE;
        Bs[kk][cc] = (col0 + cc < N && kk < tn) ? Bb[(t0 + kk) * N + col0 + cc] : 0.0;
      }
      __syncthreads();
      if (live) {
        if (cfg.order >= PL_BLOCK_FMA) {  // (block_fma, exact_block)
          for (int j = 0; j < tn; j += cfg.block) {
            const int jn = tn - j < cfg.block ? tn - j : cfg.block;
            const pl_gemm_sc sc{SA, SB, batch, row, col, t0 + j};
            pl_gemm_feed_block(cfg, &e, t0 + j, t0 + j + jn, &As[ty][j], 1, &Bs[j][tx],
                               PL_G_TILE, cfg.scales_in ? &sc : nullptr);
          }
        } else {
          for (int kk = 0; kk < tn; ++kk) pl_gemm_feed(cfg, &e, k0, k1, t0 + kk, As[ty][kk], Bs[kk][tx]);
        }
      }
      __syncthreads();
    }
    if (live) {
      double sa, sb;
      pl_gemm_scales(cfg, SA, SB, batch, row, col, k0, &sa, &sb);
      pl_gemm_end_segment(cfg, &e, s, k0, k1, sa, sb);
    }
  }
  if (live && K == 1) pl_gemm_k1(cfg, &e, cfg.has_c ? C[idx] : 0.0, Ab[row * K], Bb[col]);
  if (live) D[idx] = pl_traits<F>::value(pl_traits<F>::bits_from_double(pl_gemm_finish(cfg, &e)));
}

template <int MODE>
__device__ __forceinline__ float pl_fma(float a, float b, float c) {
  if (MODE == PL_RTZ) return __fmaf_rz(a, b, c);
  if (MODE == PL_RUP) return __fmaf_ru(a, b, c);
  return __fmaf_rn(a, b, c);
}

// Row (or column) of micro-tile entry i of thread t: two runs of 4, 64 apart (float4 loads).
__device__ __forceinline__ int pl_fma_pos(int t, int i) { return t * 4 + (i & 3) + 64 * (i >> 2); }

template <int MODE, typename F>
__device__ void pl_gemm_fma_impl(const float* __restrict__ A, const float* __restrict__ B,
                                 const float* __restrict__ C, F* __restrict__ D,
                                 const pl_i64* __restrict__ params) {
  __shared__ pl_gemm_cfg cfg;
  // padded rows: the transposed stores of A hit distinct banks; rows stay 16-byte aligned
  __shared__ __align__(16) float As[PL_F_BK][PL_F_TILE + 4];
  __shared__ __align__(16) float Bs[PL_F_BK][PL_F_TILE + 4];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int tid = ty * 16 + tx;
  if (tid == 0) pl_gemm_load_cfg(&cfg, params);
  __syncthreads();
  const pl_i64 M = cfg.M, N = cfg.N, K = cfg.K;
  const pl_i64 batch = blockIdx.z;
  const pl_i64 row0 = (pl_i64)blockIdx.y * PL_F_TILE, col0 = (pl_i64)blockIdx.x * PL_F_TILE;
  const float* Ab = A + batch * M * K;
  const float* Bb = B + batch * K * N;
  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const pl_i64 row = row0 + pl_fma_pos(ty, i), col = col0 + pl_fma_pos(tx, j);
      acc[i][j] = (cfg.has_c && row < M && col < N) ? C[(batch * M + row) * N + col] : 0.0f;
    }
  }
  // each thread moves 4 elements of A's and 4 of B's tile: global -> registers -> shared
  float ra[4], rb[4];
  auto fetch = [&](pl_i64 t0) {
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const int i = tid + 256 * l;
      const int r = i / PL_F_BK, kk = i % PL_F_BK;
      ra[l] = (row0 + r < M && t0 + kk < K) ? Ab[(row0 + r) * K + t0 + kk] : 0.0f;
      const int kb = i / PL_F_TILE, cb = i % PL_F_TILE;
      rb[l] = (t0 + kb < K && col0 + cb < N) ? Bb[(t0 + kb) * N + col0 + cb] : 0.0f;
    }
  };
  auto store = [&]() {
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const int i = tid + 256 * l;
      As[i % PL_F_BK][i / PL_F_BK] = ra[l];
      Bs[i / PL_F_TILE][i % PL_F_TILE] = rb[l];
    }
  };
  if (K > 0) fetch(0);
  for (pl_i64 t0 = 0; t0 < K; t0 += PL_F_BK) {
    store();
    __syncthreads();
    if (t0 + PL_F_BK < K) fetch(t0 + PL_F_BK);  // in flight while this tile is computed
    const int kn = (int)(K - t0 < PL_F_BK ? K - t0 : PL_F_BK);
    if (kn == PL_F_BK) {
#pragma unroll
      for (int kk = 0; kk < PL_F_BK; ++kk) {
        const float4 a0 = *reinterpret_cast<const float4*>(&As[kk][ty * 4]);
        const float4 a1 = *reinterpret_cast<const float4*>(&As[kk][64 + ty * 4]);
        const float4 b0 = *reinterpret_cast<const float4*>(&Bs[kk][tx * 4]);
        const float4 b1 = *reinterpret_cast<const float4*>(&Bs[kk][64 + tx * 4]);
        const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = pl_fma<MODE>(a[i], b[j], acc[i][j]);
        }
      }
    } else {  // the last, partial tile: no padded products (0 * 0 would turn -0 into +0)
      for (int kk = 0; kk < kn; ++kk) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            acc[i][j] = pl_fma<MODE>(As[kk][pl_fma_pos(ty, i)], Bs[kk][pl_fma_pos(tx, j)],
                                     acc[i][j]);
          }
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const pl_i64 row = row0 + pl_fma_pos(ty, i), col = col0 + pl_fma_pos(tx, j);
      if (row < M && col < N) {
        const pl_u64 idx = (pl_u64)((batch * M + row) * N + col);
        const double d = pl_gemm_output(cfg, (double)acc[i][j], idx);
        D[idx] = pl_traits<F>::value(pl_traits<F>::bits_from_double(d));
      }
    }
  }
}

#define PL_GEMM_GENERIC(F, SUF)                                                                  \
  extern "C" __global__ void __launch_bounds__(256)                                              \
      pl_gemm_generic_##SUF(const double* A, const double* B, const double* C, const double* SA, \
                            const double* SB, F* D, const pl_i64* params) {                      \
    pl_gemm_generic_impl<F>(A, B, C, SA, SB, D, params);                                         \
  }
PL_GEMM_GENERIC(float, f32)
PL_GEMM_GENERIC(double, f64)

#define PL_GEMM_FMA(MODE, MSUF)                                                                  \
  extern "C" __global__ void __launch_bounds__(256)                                              \
      pl_gemm_fma_##MSUF##_f32(const float* A, const float* B, const float* C, float* D,         \
                               const pl_i64* params) {                                           \
    pl_gemm_fma_impl<MODE, float>(A, B, C, D, params);                                           \
  }
PL_GEMM_FMA(PL_RNE, rn)
PL_GEMM_FMA(PL_RTZ, rz)
PL_GEMM_FMA(PL_RUP, ru)
