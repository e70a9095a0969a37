// cuda_emul.h: just enough of CUDA to run the package's kernels on the CPU, for the tests.
//
// Include it before a .cu file and compile with a C++20 compiler. Each CUDA thread of a block
// runs as a fiber (ucontext) of one OS thread; __syncthreads() yields to a scheduler that runs
// every fiber of the block to the barrier before any goes on; __shared__ variables are function
// statics (blocks run one after the other, so the threads of the running block share them).
// The rounding intrinsics the kernels use (__fmaf_rn/rz/ru) are computed exactly: the product of
// two floats is exact in double, the sum is held as a two-sum pair and rounded once by the
// rounding core, with IEEE 754's signs of exact zero sums.
#ifndef PL_CUDA_EMUL_H
#define PL_CUDA_EMUL_H

#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 700  // (macOS keeps the ucontext routines behind it)
#endif
#include <ucontext.h>

#include <atomic>
#include <functional>
#include <vector>

struct pl_emu_dim3 {
  unsigned x, y, z;
};
inline pl_emu_dim3 threadIdx = {0, 0, 0};
inline pl_emu_dim3 blockIdx = {0, 0, 0};
inline pl_emu_dim3 blockDim = {1, 1, 1};
inline pl_emu_dim3 gridDim = {1, 1, 1};

// The threads of a block are fibers (ucontext) on one OS thread: __syncthreads() switches back to
// the scheduler, which resumes every fiber of the block in turn, so that each has reached the
// barrier (or ended) before any goes on.
struct pl_emu_fiber {
  ucontext_t ctx;
  pl_emu_dim3 tid;
  bool done;
};
inline ucontext_t pl_emu_main;
inline pl_emu_fiber* pl_emu_running = nullptr;
inline const std::function<void()>* pl_emu_body = nullptr;

inline void __syncthreads() { swapcontext(&pl_emu_running->ctx, &pl_emu_main); }
inline int atomicOr(int* p, int v) { return std::atomic_ref<int>(*p).fetch_or(v); }

inline void pl_emu_trampoline() {
  (*pl_emu_body)();
  pl_emu_running->done = true;
  swapcontext(&pl_emu_running->ctx, &pl_emu_main);
}

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

// Run fn() as every thread of every block of the grid, the blocks one after the other (they
// share the __shared__ statics in turn), the threads of a block as fibers.
template <class Fn>
void pl_emu_launch(pl_emu_dim3 grid, pl_emu_dim3 block, Fn fn) {
  gridDim = grid;
  blockDim = block;
  const std::function<void()> body = fn;
  pl_emu_body = &body;
  const unsigned nthreads = block.x * block.y * block.z;
  const size_t stack = 1 << 17;
  std::vector<pl_emu_fiber> fibers(nthreads);
  std::vector<char> stacks((size_t)nthreads * stack);
  for (unsigned bz = 0; bz < grid.z; ++bz) {
    for (unsigned by = 0; by < grid.y; ++by) {
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        blockIdx = {bx, by, bz};
        unsigned i = 0;
        for (unsigned tz = 0; tz < block.z; ++tz) {
          for (unsigned ty = 0; ty < block.y; ++ty) {
            for (unsigned tx = 0; tx < block.x; ++tx, ++i) {
              pl_emu_fiber& f = fibers[i];
              f.tid = {tx, ty, tz};
              f.done = false;
              getcontext(&f.ctx);
              f.ctx.uc_stack.ss_sp = stacks.data() + (size_t)i * stack;
              f.ctx.uc_stack.ss_size = stack;
              f.ctx.uc_link = nullptr;
              makecontext(&f.ctx, pl_emu_trampoline, 0);
            }
          }
        }
        for (bool left = true; left;) {  // one pass: every fiber to its next barrier or its end
          left = false;
          for (pl_emu_fiber& f : fibers) {
            if (f.done) continue;
            pl_emu_running = &f;
            threadIdx = f.tid;
            swapcontext(&pl_emu_main, &f.ctx);
            left = left || !f.done;
          }
        }
      }
    }
  }
}

#endif  // PL_CUDA_EMUL_H
