// The kernels for any CPU (the compiler's baseline instruction set).
#include <math.h>
#include <string.h>

#include "kernels.h"

namespace pl_base {
#include "../cuda/pl_gemm.cuh"
#include "kernels.inc"
#include "quant.inc"
#include "blocks.inc"
}  // namespace pl_base
