// core_encode32.cpp: encode's passes (encode_range) for each rounding mode and code width, with
// float32 as the working type; a translation unit of precision_lab._native (see core.inc). Codes
// of 8 bytes go to core_encode64.cpp (out_size 4 or less here).
#include "core.inc"

namespace pl_core {

int encode_float32(const pl_format& f, int mode, int saturate, int flush, const pl_sr_key& key,
                   const void* src, int src_size, void* dst, int out_size, size_t lo, size_t hi) {
  const job<float> j(f, mode, saturate, flush, key);
  switch (out_size) {
    case 1: return encode_range<float, pl_u8>(j, src, src_size, dst, lo, hi);
    case 2: return encode_range<float, pl_u16>(j, src, src_size, dst, lo, hi);
    default: return encode_range<float, pl_u32>(j, src, src_size, dst, lo, hi);
  }
}

}  // namespace pl_core
