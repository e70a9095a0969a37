// core_encode64.cpp: encode's passes (encode_range) for each rounding mode and code width, with
// float64 as the working type; a translation unit of precision_lab._native (see core.inc).
#include "core.inc"

namespace pl_core {

int encode_float64(const pl_format& f, int mode, int saturate, int flush, const pl_sr_key& key,
                   const void* src, int src_size, void* dst, int out_size, size_t lo, size_t hi) {
  const job<double> j(f, mode, saturate, flush, key);
  switch (out_size) {
    case 1: return encode_range<double, pl_u8>(j, src, src_size, dst, lo, hi);
    case 2: return encode_range<double, pl_u16>(j, src, src_size, dst, lo, hi);
    case 4: return encode_range<double, pl_u32>(j, src, src_size, dst, lo, hi);
    default: return encode_range<double, pl_u64>(j, src, src_size, dst, lo, hi);
  }
}

}  // namespace pl_core
