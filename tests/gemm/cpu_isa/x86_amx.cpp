// AMX-BF16 TDPBF16PS on this CPU, run on numpy buffers through ctypes
// (tests/gemm/test_cpu_isa_amx.py). Built without -m flags: only the kernel carries target
// attributes, so the CPUID check runs on any x86-64 CPU and the test skips, saying why, where
// AMX is missing or the OS does not grant the tile data state.
#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

extern "C" {

// 0 when this CPU has AMX-TILE and AMX-BF16, the OS enables the tile state in XCR0 (bits 17
// and 18) and grants this process XTILEDATA; otherwise why not: 1 no AMX-TILE/AMX-BF16 in
// CPUID, 2 no OSXSAVE, 3 XCR0 lacks the tile config/data bits, 4 arch_prctl refused.
int pl_amx_status(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 1;
    if (!(d & (1u << 24)) || !(d & (1u << 22))) return 1;  // AMX-TILE, AMX-BF16
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27))) return 2;  // OSXSAVE
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 3;  // XTILECFG, XTILEDATA
    // ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18)
    if (syscall(SYS_arch_prctl, 0x1023, 18)) return 4;
    return 0;
}

struct TileConfig {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

// For each of n tiles t: C_t (16 x 16 fp32 words) += A_t (16 x K bf16, row-major, K = k *
// ninstr) . B_t (K x 16 bf16, row-major), as ninstr TDPBF16PS instructions of k elements of K
// each (k even, 2 <= k <= 32; the A tile's rows are 2k bytes, the B tile holds k / 2 rows of
// 16 pairs: the VNNI layout, built here), C kept in its tile between them. out: n x 16 x 16
// fp32 words. mxcsr: the MXCSR value during the run; *mxcsr_after: MXCSR read after the last
// instruction (its exception flags tell whether the instructions updated it). Returns 0, or -1
// for a bad k. (An A tile whose rows are not a multiple of 4 bytes, an odd k, raises #UD here.)
__attribute__((target("amx-tile,amx-bf16"))) int pl_tdpbf16ps(
    const uint32_t* c, const uint16_t* a, const uint16_t* b, uint32_t* out, int64_t n, int k,
    int ninstr, uint32_t mxcsr, uint32_t* mxcsr_after) {
    if (k < 2 || k > 32 || (k & 1) || ninstr < 1) return -1;
    const int K = k * ninstr;
    TileConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    cfg.rows[0] = 16; cfg.colsb[0] = 64;              // C: 16 x 16 fp32
    cfg.rows[1] = 16; cfg.colsb[1] = (uint16_t)(2 * k);  // A: 16 x k bf16
    cfg.rows[2] = (uint8_t)(k / 2); cfg.colsb[2] = 64;   // B: k/2 rows of 16 bf16 pairs
    _tile_loadconfig(&cfg);
    unsigned saved = _mm_getcsr();
    _mm_setcsr(mxcsr);
    uint16_t vnni[16 * 32];  // one instruction's B: (k/2) x 16 x 2
    for (int64_t t = 0; t < n; ++t) {
        const uint16_t* at = a + t * 16 * K;
        const uint16_t* bt = b + t * (int64_t)K * 16;
        _tile_loadd(0, c + t * 256, 64);
        for (int j = 0; j < ninstr; ++j) {
            for (int p = 0; p < k / 2; ++p)
                for (int col = 0; col < 16; ++col) {
                    vnni[(p * 16 + col) * 2 + 0] = bt[(j * k + 2 * p) * 16 + col];
                    vnni[(p * 16 + col) * 2 + 1] = bt[(j * k + 2 * p + 1) * 16 + col];
                }
            _tile_loadd(1, at + j * k, 2 * K);
            _tile_loadd(2, vnni, 64);
            _tile_dpbf16ps(0, 1, 2);
        }
        _tile_stored(0, out + t * 256, 64);
    }
    *mxcsr_after = _mm_getcsr();
    _mm_setcsr(saved);
    _tile_release();
    return 0;
}

}  // extern "C"
