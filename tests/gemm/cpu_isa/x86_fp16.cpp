// The AVX512-FP16 instructions a CPU fp16 GEMM uses, run on numpy buffers through ctypes
// (tests/gemm/test_cpu_isa_fp16.py): VFMADD231PH (the fp16 FMA), VCVTPS2PHX (fp32 to fp16)
// and VCVTPH2PSX (fp16 to fp32). Built without -m flags: only the kernels carry target
// attributes, so the CPUID check runs on any x86-64 CPU and the test skips, saying why, where
// AVX512-FP16 is missing.
#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>

extern "C" {

// 1 when the CPU has AVX512F, AVX512BW, AVX512VL and AVX512-FP16 and the OS saves ZMM state.
int pl_has_avx512fp16(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;  // OSXSAVE
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xe6) != 0xe6) return 0;  // XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM enabled
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!(b & (1u << 16)) || !(b & (1u << 30)) || !(b & (1u << 31))) return 0;  // F, BW, VL
    return (d >> 23) & 1;  // AVX512_FP16
}

// For each of n lanes (n a multiple of 32): s = c[i]; for j < k: s = VFMADD231PH(s, a[i*k+j],
// b[i*k+j]) (s = a * b + s, one rounding by MXCSR); out[i] = s. fp16 codes throughout.
// mxcsr: the MXCSR value during the run; *mxcsr_after: MXCSR read after the last instruction.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512fp16"))) void pl_vfmadd231ph(
    const uint16_t* c, const uint16_t* a, const uint16_t* b, uint16_t* out, int64_t n, int k,
    uint32_t mxcsr, uint32_t* mxcsr_after) {
    unsigned saved = _mm_getcsr();
    _mm_setcsr(mxcsr);
    uint16_t ta[32], tb[32];
    for (int64_t i = 0; i < n; i += 32) {
        __m512i s = _mm512_loadu_si512(c + i);
        for (int j = 0; j < k; ++j) {
            for (int l = 0; l < 32; ++l) {
                ta[l] = a[(i + l) * k + j];
                tb[l] = b[(i + l) * k + j];
            }
            __m512i x = _mm512_loadu_si512(ta);
            __m512i y = _mm512_loadu_si512(tb);
            // AT&T: vfmadd231ph src3, src2, dest: dest = src2 * src3 + dest
            __asm__ volatile("vfmadd231ph %2, %1, %0" : "+v"(s) : "v"(x), "v"(y));
        }
        _mm512_storeu_si512(out + i, s);
    }
    *mxcsr_after = _mm_getcsr();
    _mm_setcsr(saved);
}

// out[i] = VCVTPS2PHX(x[i]): fp32 words to fp16 codes by MXCSR; n a multiple of 16.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512fp16"))) void pl_vcvtps2phx(
    const uint32_t* x, uint16_t* out, int64_t n, uint32_t mxcsr, uint32_t* mxcsr_after) {
    unsigned saved = _mm_getcsr();
    _mm_setcsr(mxcsr);
    for (int64_t i = 0; i < n; i += 16) {
        __m512 v = _mm512_castsi512_ps(_mm512_loadu_si512(x + i));
        __m256h r;
        __asm__ volatile("vcvtps2phx %1, %0" : "=v"(r) : "v"(v));
        _mm256_storeu_si256((__m256i*)(out + i), _mm256_castph_si256(r));
    }
    *mxcsr_after = _mm_getcsr();
    _mm_setcsr(saved);
}

// out[i] = VCVTPH2PSX(x[i]): fp16 codes to fp32 words; n a multiple of 16.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512fp16"))) void pl_vcvtph2psx(
    const uint16_t* x, uint32_t* out, int64_t n, uint32_t mxcsr, uint32_t* mxcsr_after) {
    unsigned saved = _mm_getcsr();
    _mm_setcsr(mxcsr);
    for (int64_t i = 0; i < n; i += 16) {
        __m256i v = _mm256_loadu_si256((const __m256i*)(x + i));
        __m512 r;
        __asm__ volatile("vcvtph2psx %1, %0" : "=v"(r) : "v"(v));
        _mm512_storeu_si512(out + i, _mm512_castps_si512(r));
    }
    *mxcsr_after = _mm_getcsr();
    _mm_setcsr(saved);
}

}  // extern "C"
