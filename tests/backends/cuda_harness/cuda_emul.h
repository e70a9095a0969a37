// cuda_emul.h: just enough of CUDA to run the package's kernels on the CPU, for the tests.
//
// Include it before a .cu file and compile with a C++20 compiler (-pthread). Each CUDA thread
// of a block runs as a std::thread (which then runs that thread of every block, in turn);
// __syncthreads() is a std::barrier over the block's threads; __shared__ variables are
// function statics (blocks run one after the other, so the threads of the running block share
// them). The rounding intrinsics the kernels use (__fmaf_rn/rz/ru) are
// computed exactly: the product of two floats is exact in double, the sum is held as a two-sum
// pair and rounded once by the rounding core, with IEEE 754's signs of exact zero sums.
#ifndef PL_CUDA_EMUL_H
#define PL_CUDA_EMUL_H

#include <atomic>
#include <barrier>
#include <thread>
#include <vector>

struct pl_emu_dim3 {
  unsigned x, y, z;
};
inline thread_local pl_emu_dim3 threadIdx = {0, 0, 0};
inline thread_local pl_emu_dim3 blockIdx = {0, 0, 0};
inline pl_emu_dim3 blockDim = {1, 1, 1};
inline pl_emu_dim3 gridDim = {1, 1, 1};
inline std::barrier<>* pl_emu_barrier = nullptr;

inline void __syncthreads() { pl_emu_barrier->arrive_and_wait(); }
inline int atomicOr(int* p, int v) { return std::atomic_ref<int>(*p).fetch_or(v); }

struct alignas(16) float4 {
  float x, y, z, w;
};

#define __align__(n) __attribute__((aligned(n)))
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)

float __fmaf_rn(float a, float b, float c);
float __fmaf_rz(float a, float b, float c);
float __fmaf_ru(float a, float b, float c);

// Run fn() as every thread of every block of the grid: one std::thread per thread of a block,
// each running the blocks one after the other (a barrier ends each block, so that they share
// the __shared__ statics in turn).
template <class Fn>
void pl_emu_launch(pl_emu_dim3 grid, pl_emu_dim3 block, Fn fn) {
  gridDim = grid;
  blockDim = block;
  const unsigned nthreads = block.x * block.y * block.z;
  std::barrier<> bar((std::ptrdiff_t)nthreads);
  pl_emu_barrier = &bar;
  std::vector<std::thread> threads;
  threads.reserve(nthreads);
  for (unsigned tz = 0; tz < block.z; ++tz) {
    for (unsigned ty = 0; ty < block.y; ++ty) {
      for (unsigned tx = 0; tx < block.x; ++tx) {
        threads.emplace_back([=, &fn, &bar] {
          threadIdx = {tx, ty, tz};
          for (unsigned bz = 0; bz < grid.z; ++bz) {
            for (unsigned by = 0; by < grid.y; ++by) {
              for (unsigned bx = 0; bx < grid.x; ++bx) {
                blockIdx = {bx, by, bz};
                fn();
                bar.arrive_and_wait();
              }
            }
          }
        });
      }
    }
  }
  for (auto& t : threads) t.join();
}

#endif  // PL_CUDA_EMUL_H
