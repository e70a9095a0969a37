// The x86 BF16 instructions of this CPU, run on numpy buffers through ctypes
// (tests/gemm/test_cpu_isa_hardware.py). Built without -m flags: only the kernels carry
// target attributes, so the CPUID check runs on any x86-64 CPU and the test skips, saying
// why, where AVX512-BF16 is missing.
#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

extern "C" {

// 1 when the CPU has AVX512F, AVX512VL and AVX512-BF16 and the OS saves the ZMM state.
int pl_has_avx512bf16(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;  // OSXSAVE
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xe6) != 0xe6) return 0;  // XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM enabled
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!(b & (1u << 16)) || !(b & (1u << 31))) return 0;  // AVX512F, AVX512VL
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 5) & 1;  // AVX512_BF16
}

// out[i] = VDPBF16PS(acc[i], a[i], b[i]): a[i], b[i] hold a pair of bf16 (element 0 in the
// low half); acc, out fp32 words. n a multiple of 16. mxcsr: the MXCSR value during the run.
__attribute__((target("avx512f,avx512vl,avx512bf16"))) void pl_vdpbf16ps(
    const uint32_t* acc, const uint32_t* a, const uint32_t* b, uint32_t* out, int64_t n,
    uint32_t mxcsr) {
    unsigned saved = _mm_getcsr();
    _mm_setcsr(mxcsr);
    for (int64_t i = 0; i < n; i += 16) {
        __m512 s = _mm512_castsi512_ps(_mm512_loadu_si512(acc + i));
        __m512bh x = (__m512bh)_mm512_loadu_si512(a + i);
        __m512bh y = (__m512bh)_mm512_loadu_si512(b + i);
        _mm512_storeu_si512(out + i, _mm512_castps_si512(_mm512_dpbf16_ps(s, x, y)));
    }
    _mm_setcsr(saved);
}

// out[i] = VCVTNEPS2BF16(x[i]) (bf16 codes); n a multiple of 16.
__attribute__((target("avx512f,avx512vl,avx512bf16"))) void pl_vcvtneps2bf16(
    const uint32_t* x, uint16_t* out, int64_t n, uint32_t mxcsr) {
    unsigned saved = _mm_getcsr();
    _mm_setcsr(mxcsr);
    for (int64_t i = 0; i < n; i += 16) {
        __m512 v = _mm512_castsi512_ps(_mm512_loadu_si512(x + i));
        __m256bh r = _mm512_cvtneps_pbh(v);
        _mm256_storeu_si256((__m256i*)(out + i), (__m256i)r);
    }
    _mm_setcsr(saved);
}

// VCVTNE2PS2BF16: 32 codes from two vectors: out[32j .. 32j+15] from y (the low half of the
// destination: the second source), out[32j+16 .. 32j+31] from x. n (of x and of y) a multiple
// of 16; out has 2n codes.
__attribute__((target("avx512f,avx512vl,avx512bf16"))) void pl_vcvtne2ps2bf16(
    const uint32_t* x, const uint32_t* y, uint16_t* out, int64_t n, uint32_t mxcsr) {
    unsigned saved = _mm_getcsr();
    _mm_setcsr(mxcsr);
    for (int64_t i = 0; i < n; i += 16) {
        __m512 vx = _mm512_castsi512_ps(_mm512_loadu_si512(x + i));
        __m512 vy = _mm512_castsi512_ps(_mm512_loadu_si512(y + i));
        __m512bh r = _mm512_cvtne2ps_pbh(vx, vy);
        _mm512_storeu_si512(out + 2 * i, (__m512i)r);
    }
    _mm_setcsr(saved);
}

}  // extern "C"
