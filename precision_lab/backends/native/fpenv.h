// fpenv.h: the CPU's floating-point control state while native code runs.
//
// Every kernel assumes the IEEE default: round to nearest even, subnormals neither flushed nor read
// as zero (the fast paths let the hardware round, e.g. below the smallest normal). A library in the
// same process may have changed the thread's SSE control register (torch.set_flush_denormal, code
// built with -ffast-math), so each entry point that releases the GIL sets the default for its
// duration and restores the caller's state after it.
#ifndef PL_FPENV_H
#define PL_FPENV_H

#if defined(__SSE2__) || defined(_M_X64)
#include <xmmintrin.h>
struct pl_fpenv {
  unsigned saved;
  pl_fpenv() : saved(_mm_getcsr()) { _mm_setcsr(saved & ~0xE040u); }  // RC, FTZ and DAZ bits
  ~pl_fpenv() { _mm_setcsr(saved); }
  pl_fpenv(const pl_fpenv&) = delete;
  pl_fpenv& operator=(const pl_fpenv&) = delete;
};
#else
struct pl_fpenv {};  // other targets: the default environment is assumed
#endif

// Py_BEGIN_ALLOW_THREADS with the default floating-point environment until the matching
// PL_END_NATIVE
#define PL_BEGIN_NATIVE \
  Py_BEGIN_ALLOW_THREADS {  \
    pl_fpenv pl_fpenv_guard_;
#define PL_END_NATIVE \
  }                   \
  Py_END_ALLOW_THREADS

#endif
