// core_round.cpp: round_to's passes (round_range) for each rounding mode, with float32 and
// float64 as the working type; a translation unit of precision_lab._native (see core.inc).
#include "core.inc"

namespace pl_core {

void round_float32(const pl_format& f, int mode, int saturate, int flush, const pl_sr_key& key,
                   const void* src, int src_size, void* dst, size_t lo, size_t hi) {
  round_range(job<float>(f, mode, saturate, flush, key), src, src_size, dst, lo, hi);
}

void round_float64(const pl_format& f, int mode, int saturate, int flush, const pl_sr_key& key,
                   const void* src, int src_size, void* dst, size_t lo, size_t hi) {
  round_range(job<double>(f, mode, saturate, flush, key), src, src_size, dst, lo, hi);
}

}  // namespace pl_core
