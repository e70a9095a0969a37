// The kernels for any CPU (the compiler's baseline instruction set).
#include <math.h>
#include <string.h>

#include "kernels.h"

#if defined(__SSE2__) || defined(_M_X64)
#endif

namespace pl_base {
#include "../cuda/pl_gemm.cuh"
#include "common.inc"
#include "kernels.inc"
#include "fma32.inc"
#include "blockfma_fast.inc"
#include "quant.inc"
#include "philox.inc"  // (the scalar copy only)
#include "blocks.inc"
#include "hadamard.inc"
}  // namespace pl_base
