"""AVX10.2 and AMX-FP8 models of ``precision_lab.gemm.cpu_instructions`` (issue 33), on any CPU.

No hardware with AVX10.2 or AMX-FP8 was available (the Intel Xeon here has AVX512-FP16 and
AMX-BF16 only), so every model here is published, not measured: the Bochs x86 emulator
(bochs-emu/Bochs, commit ``ci.BOCHS_COMMIT``: cpu/avx/bf8.h, hf8.h, avx10_2_cvt_fp8.cc,
avx10_2_cvt.cc, avx10_2_misc.cc, amx.cc, softfloat3e). The oracles below are written from the
rules as read there, in exact arithmetic, independent of the library's rounding core and GEMM
model:

* conversions: fp16 values as integers in units of ``2**-24`` (every fp16 value is one), FP8
  grids decoded by hand from the bit layouts, rounding and the BIAS forms' add-and-truncate in
  integers; exhaustive over all 65 536 fp16 codes, and over every bias byte;
* VDPPHPS and AMX-FP8: ``fractions.Fraction`` sums rounded to fp32 (nearest even, tininess after
  rounding, flush to signed zeros), step by step in the order Bochs computes.

Each test also checks that a plausible wrong rule disagrees with the model somewhere, so the
comparison can fail.
"""

from __future__ import annotations

import math
from fractions import Fraction as F

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.gemm import cpu_instructions as ci

ALL16 = np.arange(65536, dtype=np.uint32)


# ----- FP8 grids from the bit layouts (Bochs's bf8.h / hf8.h comments) ---------------------------
def fp8_table(fp8: str) -> np.ndarray:
    """Magnitudes of the positive finite codes 0x00.. (units of 2**-24), in code order."""
    out = []
    for c in range(128):
        if fp8 == "bf8":
            e, m = c >> 2, c & 3
            if e == 31:
                break
            out.append(m << 8 if e == 0 else (4 + m) << (e + 7))
        else:
            e, m = c >> 3, c & 7
            if e == 15 and m == 7:
                break
            out.append(m << 15 if e == 0 else (8 + m) << (e + 14))
    return np.array(out, dtype=np.int64)


TABLE = {f: fp8_table(f) for f in ("bf8", "hf8")}
EMIN = {"bf8": -14, "hf8": -6}
MANT = {"bf8": 2, "hf8": 3}


def test_the_fp8_formats_are_intels():
    assert ci.FP8_FORMATS == {"bf8": "e5m2", "hf8": "e4m3"}
    for fp8, name in ci.FP8_FORMATS.items():
        fmt = pl.get_format(name)
        t = TABLE[fp8].astype(np.float64) * 2.0**-24
        assert float(fmt.max) == t[-1]  # 57344 and 448
        assert len(t) == {"bf8": 124, "hf8": 127}[fp8]
        dec = pl.decode(np.arange(len(t), dtype=np.uint8), name)
        assert np.array_equal(np.asarray(dec, dtype=np.float64), t)
    assert np.isnan(pl.decode(np.uint8(0x7F), "e4m3"))  # HF8: S.1111.111 is NaN, no inf
    assert TABLE["hf8"][-1] * 2.0**-24 == 448 and TABLE["bf8"][-1] * 2.0**-24 == 57344


# ----- the conversions' integer oracle ------------------------------------------------------------
def fp16_ints(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sign bit and magnitude (units of 2**-24) of finite fp16 codes, decoded by hand."""
    e = ((h >> 10) & 31).astype(np.int64)
    m = (h & 0x3FF).astype(np.int64)
    mag = np.where(e == 0, m, (1024 + m) << np.maximum(e - 1, 0))
    return (h >> 15).astype(np.int64), mag


def quantum(mag: np.ndarray, fp8: str) -> np.ndarray:
    """The FP8 quantum at each magnitude (units of 2**-24): 2**(max(e, emin) - mant)."""
    e = np.zeros_like(mag)
    nz = mag > 0
    e[nz] = np.floor(np.log2(mag[nz].astype(np.float64))).astype(np.int64) - 24
    # exact floor(log2): correct the float estimate at powers of two
    e = np.where(nz & ((np.int64(1) << np.clip(e + 24, 0, 62)) > mag), e - 1, e)
    e = np.where(nz & ((np.int64(1) << np.clip(e + 25, 0, 62)) <= mag), e + 1, e)
    return np.int64(1) << (np.maximum(e, EMIN[fp8]) - MANT[fp8] + 24)


def oracle_fp8(h: np.ndarray, fp8: str, saturate: bool, r: np.ndarray | None) -> np.ndarray:
    """Bochs's rule: nearest even (``r`` None) or ``floor(|x| / q + r / 256)`` quanta, then the
    overflow rule (BF8: inf or 0x7b; HF8: NaN 0x7f or 0x7e) and the NaN rule."""
    h = h.astype(np.uint32)
    sign, mag = fp16_ints(h)
    q = quantum(mag, fp8)
    if r is None:
        n, rem = mag // q, mag % q
        n = n + ((2 * rem > q) | ((2 * rem == q) & (n % 2 == 1)))
    else:
        n = (256 * mag + r.astype(np.int64) * q) // (256 * q)
    v = n * q
    table = TABLE[fp8]
    over = v > table[-1]
    code = np.searchsorted(table, np.minimum(v, table[-1])).astype(np.int64)
    assert (table[code] == np.minimum(v, table[-1])).all()  # on the grid
    top = {"bf8": 0x7C, "hf8": 0x7F}[fp8]
    code = np.where(over, 0x7B if fp8 == "bf8" and saturate else 0x7E if saturate else top, code)
    exp16, frac16 = (h >> 10) & 31, h & 0x3FF
    inf, nan = (exp16 == 31) & (frac16 == 0), (exp16 == 31) & (frac16 != 0)
    code = np.where(inf, (0x7B if fp8 == "bf8" else 0x7E) if saturate else top, code)
    code = code | (sign << 7)
    qnan = ((h >> 8) | 2) if fp8 == "bf8" else (sign << 7) | 0x7F
    return np.where(nan, qnan, code).astype(np.uint8)


FN = {"bf8": ci.vcvtph2bf8, "hf8": ci.vcvtph2hf8}
BIAS_FN = {"bf8": ci.vcvtbiasph2bf8, "hf8": ci.vcvtbiasph2hf8}


@pytest.mark.parametrize("fp8", ["bf8", "hf8"])
@pytest.mark.parametrize("saturate", [False, True])
def test_nearest_even_conversions_on_every_fp16_code(fp8, saturate):
    h = ALL16.astype(np.uint16)
    got = FN[fp8](h, saturate=saturate)
    want = oracle_fp8(h, fp8, saturate, None)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(hex(int(h[i])), hex(int(got[i])), hex(int(want[i]))) for i in bad[:8]]
    assert np.array_equal(FN[fp8](h.view(np.float16), saturate=saturate), got)  # float16 too
    # the oracle can tell: truncation and round-half-away disagree with the model
    trunc = oracle_fp8(h, fp8, saturate, np.zeros(65536, np.int64))
    away = oracle_fp8(h, fp8, saturate, np.full(65536, 128, np.int64))
    assert (trunc != got).sum() > 1000 and (away != got).sum() > 100


@pytest.mark.parametrize("fp8", ["bf8", "hf8"])
@pytest.mark.parametrize("saturate", [False, True])
def test_bias_conversions_on_every_code_and_every_bias(fp8, saturate):
    h = ALL16.astype(np.uint16)
    for r0 in range(0, 256, 32):
        r = np.arange(r0, r0 + 32, dtype=np.int64)[:, None]
        # src1's 16-bit words: only their low byte counts (high bytes set to show it)
        words = (r | (np.arange(32)[:, None] << 8)).astype(np.uint16)
        got = BIAS_FN[fp8](np.broadcast_to(h, (32, 65536)), words, saturate=saturate)
        want = oracle_fp8(np.broadcast_to(h, (32, 65536)).ravel(), fp8, saturate,
                          np.broadcast_to(r, (32, 65536)).ravel()).reshape(32, 65536)  # fmt: skip
        bad = np.argwhere(got != want)
        assert bad.size == 0, [(int(r[i, 0]), hex(int(h[j])), hex(int(got[i, j])),
                                hex(int(want[i, j]))) for i, j in bad[:8]]  # fmt: skip
    # the oracle can tell: a bias aligned one bit higher (r / 128 of a quantum) disagrees
    r = np.full(65536, 100, np.int64)
    wrong = oracle_fp8(h, fp8, saturate, 2 * r)
    assert (BIAS_FN[fp8](h, r.astype(np.uint16), saturate=saturate) != wrong).sum() > 1000


def test_bias_forms_are_stochastic_rounding_with_the_bias_as_random_bits():
    # the distribution over the 256 bias values is exact SR with 8 bits: x = 1 + 3/16 of a BF8
    # quantum above 1 rounds up for exactly 48 of them
    x = np.full(256, np.float16(1 + 0.25 * 3 / 16))
    up = ci.vcvtbiasph2bf8(x, np.arange(256, dtype=np.uint16)) == 0x3D
    assert up.sum() == 48 and up[-48:].all()
    with pytest.raises(TypeError, match="bias must hold"):
        ci.vcvtbiasph2bf8(x, np.float32(1.0))


@pytest.mark.parametrize("fn", [ci.vcvt2ph2bf8, ci.vcvt2ph2hf8])
def test_two_source_forms_put_src2_low(fn):
    rng = np.random.default_rng(5)
    a, b = (rng.integers(0, 65536, (3, 8)).astype(np.uint16) for _ in range(2))
    one = ci.vcvtph2bf8 if fn is ci.vcvt2ph2bf8 else ci.vcvtph2hf8
    for sat in (False, True):
        d = fn(a, b, saturate=sat)
        assert np.array_equal(d[:, :8], one(b, saturate=sat))
        assert np.array_equal(d[:, 8:], one(a, saturate=sat))


def test_vcvthf82ph_on_every_code():
    c = np.arange(256, dtype=np.uint8)
    got = ci.vcvthf82ph(c)
    table = TABLE["hf8"]
    for code in range(256):
        m = code & 0x7F
        if m == 0x7F:
            want = ((code & 0x80) << 8) | 0x7F80
        else:
            v = np.float16(float(table[m]) * 2.0**-24)  # exact: HF8 values are fp16 values
            assert float(v) == float(table[m]) * 2.0**-24
            want = int(v.view(np.uint16)) | ((code & 0x80) << 8)
        assert int(got[code]) == want, hex(code)
    # round trip: every non-NaN HF8 code comes back from fp16 unchanged
    ok = (c & 0x7F) != 0x7F
    assert np.array_equal(ci.vcvtph2hf8(got[ok]), c[ok])


# ----- VCVT2PS2PHX: an exact oracle of fp32 -> fp16 under each MXCSR mode -------------------------
def rne_fp16_code(x: np.float32, mode: str, daz: bool) -> int:
    v = F(float(x))
    if daz and 0 < abs(v) < F(2) ** -126:
        v = F(0)
    s = 0x8000 if math.copysign(1, float(x)) < 0 else 0
    m = abs(v)
    if m == 0:
        return s
    e = max(m.numerator.bit_length() - m.denominator.bit_length(), -30)
    while F(2) ** e > m:
        e -= 1
    while F(2) ** (e + 1) <= m:
        e += 1
    q = F(2) ** (max(e, -14) - 10)
    n, rem = divmod(m, q)
    up = {
        "nearest_even": rem * 2 > q or (rem * 2 == q and n % 2 == 1),
        "toward_zero": False,
        "up": rem > 0 and not s,
        "down": rem > 0 and bool(s),
    }[mode]
    w = (n + up) * q
    if w > 65504:
        inward = mode == "toward_zero" or (mode == "up" and s) or (mode == "down" and not s)
        return s | (0x7BFF if inward else 0x7C00)
    return s | int(np.float16(float(w)).view(np.uint16))


@pytest.mark.parametrize("mode", ["nearest_even", "down", "up", "toward_zero"])
def test_vcvt2ps2phx(mode):
    rng = np.random.default_rng(11)
    n = 1500
    bits = (rng.integers(0, 2**32, n, dtype=np.uint64)).astype(np.uint32)
    e = rng.integers(97, 146, n).astype(np.uint32)  # exponents around fp16's range
    e[:100] = 0  # fp32 subnormals (DAZ matters under up / down)
    bits = (bits & np.uint32(0x807FFFFF)) | (e << np.uint32(23))
    x = bits.view(np.float32)
    for daz in (False, True):
        d = ci.vcvt2ps2phx(x[: n // 2], x[n // 2 :], rounding=mode, daz=daz)
        got = np.concatenate([d[n // 2 :], d[: n // 2]])  # src1 high, src2 low
        want = [rne_fp16_code(v, mode, daz) for v in x]
        assert got.tolist() == want
    if mode in ("up", "down"):  # the oracle can tell DAZ apart
        assert [rne_fp16_code(v, mode, True) for v in x[:100]] != [
            rne_fp16_code(v, mode, False) for v in x[:100]
        ]


# ----- fp32 steps in exact arithmetic (softfloat3e's roundPackToF32 with FTZ) ---------------------
TINY = F(2) ** -126


def rne32(x: F) -> float:
    """Nearest even to 24 bits with an unbounded exponent; overflow to inf."""
    if x == 0:
        return 0.0
    m = abs(x)
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if F(2) ** e > m:
        e -= 1
    q = F(2) ** (e - 23)
    n, r = divmod(m, q)
    if r * 2 > q or (r * 2 == q and n % 2):
        n += 1
    v = n * q
    return math.copysign(math.inf if v >= F(2) ** 128 else float(v), x)


def add32(a: float, b: F | float, ftz: bool = True) -> float:
    """fp32 ``a + b`` (``b`` exact), nearest even, flush to signed zero when tiny after
    rounding; IEEE zero signs."""
    if not (math.isfinite(a) and math.isfinite(float(b))):
        return a + float(b)
    s = F(a) + F(b)
    if s == 0:
        bneg = math.copysign(1, float(b)) < 0
        return -0.0 if (math.copysign(1, a) < 0 and bneg) else 0.0
    v = rne32(s)
    return math.copysign(0.0, v) if ftz and abs(v) < TINY else v


def daz32(v: float) -> float:
    return math.copysign(0.0, v) if abs(v) < TINY else v


def same(x: float, y: float) -> bool:
    return (x == y and math.copysign(1, x) == math.copysign(1, y)) or (x != x and y != y)


# ----- VDPPHPS (the row) --------------------------------------------------------------------------
def fp16_values(rng, shape, sub=0.1):
    e = rng.integers(-10, 8, shape)
    m = rng.integers(0, 1024, shape)
    v = (1 + m / 1024) * 2.0**e
    s = rng.random(shape) < sub
    v[s] = rng.integers(0, 1024, s.sum()) * 2.0**-24  # subnormals (kept by VDPPHPS)
    v *= rng.choice([-1.0, 1.0], shape)
    return v.astype(np.float16)


def vdpphps_oracle(c: float, a, b, odd_first=True, daz_inputs=False, daz_c=True) -> float:
    d = daz32(c) if daz_c else c
    av = [daz32_fp16(float(x)) if daz_inputs else float(x) for x in a]
    bv = [daz32_fp16(float(x)) if daz_inputs else float(x) for x in b]
    for i in range(0, len(av), 2):
        for j in (i + 1, i) if odd_first else (i, i + 1):
            d = add32(d, F(av[j]) * F(bv[j]))  # the FMA: exact product, one rounding
    return d


def test_vdpphps_row_against_bochs_rule():
    acc = pl.tensor_core("x86", "fp16", instruction="vdpphps")
    assert (acc.pair_order, acc.input_subnormals, acc.tininess) == (
        "odd_first",
        "flush_signed_c",
        "after_rounding",
    )
    rng = np.random.default_rng(3)
    n, k = 600, 6  # chains of 3 instructions
    a, b = fp16_values(rng, (n, k)), fp16_values(rng, (n, k))
    c = (rng.standard_normal(n) * 2.0 ** rng.integers(-20, 4, n)).astype(np.float32)
    c[:60] = (rng.integers(1, 2**23, 60) * 2.0**-149 * rng.choice([-1, 1], 60)).astype(np.float32)
    # zero products on a negative subnormal destination (signs of zero)
    a[:30], b[:30], c[:30] = 0, np.abs(b[:30]), -np.abs(c[:30])
    # the odd product cancels the destination exactly: then the even one alone is rounded
    a[60:120, 1] = np.float16(2.0**-12)
    b[60:120, 1] = np.float16(2.0**-12)
    c[60:120] = np.float32(-(2.0**-24))
    d = pl.gemm(a[:, None, :], b[:, :, None], c[:, None, None], input_format="fp16",
                accumulator=acc).reshape(n)  # fmt: skip
    want = [vdpphps_oracle(float(c[i]), a[i], b[i]) for i in range(n)]
    bad = [i for i in range(n) if not same(float(d[i]), want[i])]
    assert not bad, [(i, float(d[i]), want[i]) for i in bad[:5]]
    # the oracle can tell: even first, or DAZ on the fp16 inputs, give other bits
    even = [vdpphps_oracle(float(c[i]), a[i], b[i], odd_first=False) for i in range(n)]
    dazed = [vdpphps_oracle(float(c[i]), a[i], b[i], daz_inputs=True) for i in range(n)]
    assert sum(not same(x, y) for x, y in zip(even, want, strict=True)) > 20
    assert sum(not same(x, y) for x, y in zip(dazed, want, strict=True)) > 20
    # DAZ on the destination cannot show: the first FMA's FTZ flushes a subnormal sum as well
    # (fp16 products are 0 or at least 2**-48), and the zero signs then agree
    keep_c = [vdpphps_oracle(float(c[i]), a[i], b[i], daz_c=False) for i in range(n)]
    assert all(same(x, y) for x, y in zip(keep_c, want, strict=True))


# ----- AMX-FP8 (a function: not expressible as an Accumulator row) --------------------------------
def fp8_values(rng, fp8, shape):
    name = ci.FP8_FORMATS[fp8]
    codes = rng.integers(0, 256, shape).astype(np.uint8)
    v = np.asarray(pl.decode(codes, name), dtype=np.float64)
    v[~np.isfinite(v)] = 1.0
    return v


def amx_fp8_oracle(c, a, b, fa, fb, k=64, lanes_of_pairs=True):
    def widen(x, fp8):  # BF8 subnormals read as zeros (f16_to_f32 under DAZ); HF8 kept
        return daz32_fp16(x) if fp8 == "bf8" else x

    av = [widen(float(x), fa) for x in a]
    bv = [widen(float(x), fb) for x in b]
    while len(av) % 4:
        av.append(0.0)
        bv.append(0.0)
    dest = daz32(c)
    for k0 in range(0, len(av), k):
        lane = [0.0, 0.0]
        for j in range(k0, min(k0 + k, len(av)), 4):
            p = [av[j + i] * bv[j + i] for i in range(4)]  # exact in float64 and in fp32
            assert all(rne32(F(x)) == x for x in p if x)
            if lanes_of_pairs:
                for t in (0, 1):
                    lane[t] = add32(lane[t], add32(p[2 * t], F(p[2 * t + 1]), ftz=False))
            else:  # wrong variant: the exact sum of four, rounded once, into one lane
                lane[0] = add32(lane[0], sum((F(x) for x in p), F(0)))
        dest = add32(dest, add32(lane[0], lane[1]))
    return dest


def daz32_fp16(v: float) -> float:
    return math.copysign(0.0, v) if abs(v) < 2.0**-14 else v


@pytest.mark.parametrize("instruction", list(ci.AMX_FP8_INPUTS))
def test_amx_fp8_against_bochs_rule(instruction):
    fa, fb = ci.AMX_FP8_INPUTS[instruction]
    rng = np.random.default_rng(list(ci.AMX_FP8_INPUTS).index(instruction))
    m, n, K = 6, 5, 150  # three instructions (64, 64, 22) and a padded tail
    a, b = fp8_values(rng, fa, (m, K)), fp8_values(rng, fb, (K, n))
    c = (rng.standard_normal((m, n)) * 2.0 ** rng.integers(-30, 10, (m, n))).astype(np.float32)
    c[0, :] = np.float32(3e-39)  # a subnormal destination is read as zero
    d = ci.tdpfp8ps(c, a, b, instruction=instruction)
    wrong = 0
    for i in range(m):
        for j in range(n):
            want = amx_fp8_oracle(float(c[i, j]), a[i], b[:, j], fa, fb)
            assert same(float(d[i, j]), want), (i, j, float(d[i, j]), want)
            alt = amx_fp8_oracle(float(c[i, j]), a[i], b[:, j], fa, fb, lanes_of_pairs=False)
            wrong += not same(alt, want)
    assert wrong > 3  # the oracle can tell the pair-sum lanes from one exact sum of four


def test_amx_fp8_subnormals_and_pairs():
    # a BF8 subnormal element is read as zero, an HF8 one is kept
    sub_b, sub_h = 2.0**-16, 2.0**-9
    one = np.float32([[0.0]])
    assert float(ci.tdpfp8ps(one, [[sub_b, 0, 0, 0]], [[1.0]] * 4, "tdpbf8ps")[0, 0]) == 0
    assert float(ci.tdpfp8ps(one, [[sub_h, 0, 0, 0]], [[1.0]] * 4, "tdphf8ps")[0, 0]) == sub_h
    assert float(ci.tdpfp8ps(one, [[sub_b, 0, 0, 0]], [[1.0]] * 4, "tdpbhf8ps")[0, 0]) == 0
    assert (
        float(ci.tdpfp8ps(one, [[1.0, 0, 0, 0]], [[sub_b]] + [[1.0]] * 3, "tdphbf8ps")[0, 0]) == 0
    )
    # p0 + p1 is rounded before the lane: 2**15 + 2**-9 - 2**15 = 0 in lane 0 (the pair sum
    # rounds), while an exact sum of the four would keep 2**-9
    a = [[2.0**15, 2.0**-9, -(2.0**15), 0.0]]
    d = ci.tdpfp8ps(one, a, [[1.0]] * 4, "tdpbf8ps")
    assert float(d[0, 0]) == 0.0
    with pytest.raises(ValueError, match="must hold HF8"):
        ci.tdpfp8ps(one, [[1.0625, 0, 0, 0]], [[1.0]] * 4, "tdphf8ps")
    with pytest.raises(ValueError, match="instruction must be one of"):
        ci.tdpfp8ps(one, [[1.0]], [[1.0]], "tdpbf16ps")


@pytest.mark.parametrize("instruction", list(ci.AMX_FP8_INPUTS))
def test_amx_fp8_rows_equal_bochs_rule(instruction):
    """The rows (lanes fed by runs of two products, inputs through fp16 under DAZ) against
    :func:`tdpfp8ps` bit for bit, on every FP8 code (subnormals, zeros, infinities and NaNs
    included), K from 1 to three instructions with ragged tails, destinations with subnormals;
    and against the exact oracle on finite inputs."""
    fa, fb = (ci.FP8_FORMATS[f] for f in ci.AMX_FP8_INPUTS[instruction])
    acc = pl.tensor_core("x86", (fa, fb) if fa != fb else fa, instruction=instruction)
    assert acc.lane_run == 2 and acc.split_k == ci.AMX_FP8_K
    rng = np.random.default_rng(7 + list(ci.AMX_FP8_INPUTS).index(instruction))
    for k in (1, 2, 3, 4, 5, 7, 63, 64, 65, 66, 130, 192, 201):
        a = np.asarray(pl.decode(rng.integers(0, 256, (6, k)), fa), np.float64)
        b = np.asarray(pl.decode(rng.integers(0, 256, (k, 5)), fb), np.float64)
        if k % 2:  # finite inputs: most outputs are numbers
            a[~np.isfinite(a)], b[~np.isfinite(b)] = 0.5, -2.0
        c = (rng.standard_normal((6, 5)) * 2.0 ** rng.integers(-140, 20, (6, 5))).astype(np.float32)
        want = ci.tdpfp8ps(c, a, b, instruction=instruction)
        got = np.asarray(
            pl.gemm(a, b, c.astype(np.float64), input_format=(fa, fb), accumulator=acc,
                    out_format="fp32"), np.float32,
        )  # fmt: skip
        same_bits = got.view(np.uint32) == want.view(np.uint32)
        assert (same_bits | (np.isnan(got) & np.isnan(want))).all(), (k, got, want)
        if k in (5, 65):
            for i in range(6):
                for j in range(5):
                    o = amx_fp8_oracle(
                        float(c[i, j]), a[i], b[:, j], *ci.AMX_FP8_INPUTS[instruction]
                    )
                    assert same(float(got[i, j]), o), (k, i, j)
    # the runs matter: interleaved single products (lane_run=None) differ somewhere
    # (p0 + p1 rounds 448**2 + 2**-18 to 448**2; one product per lane keeps the 2**-18)
    a, b = np.array([[448.0, 2.0**-9, -448.0, 0.0]]), np.array([[448.0], [2.0**-9], [448.0], [0]])
    x = pl.gemm(a, b, input_format=(fa, fb), accumulator=acc)
    y = pl.gemm(a, b, input_format=(fa, fb), accumulator=acc.replace(lane_run=None))
    assert float(np.asarray(x)[0, 0]) == 0.0 and float(np.asarray(y)[0, 0]) == 2.0**-18
