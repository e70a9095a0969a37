"""The CPU rows of ``pl.tensor_core`` against exact-rational oracles of their stated semantics
(issue 33): the x86 VDPBF16PS chain as measured (tests/gemm/test_cpu_isa_hardware.py runs the
hardware), and the Arm rows as the Arm ARM's pseudocode says (BFDotAdd with FPCR.EBF = 0 and 1,
BFMLAL, FP8DotAddFP, FP8MulAddFP). These run everywhere: no special CPU needed.
"""

from __future__ import annotations

import math
from fractions import Fraction as F

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.gemm import cpu_instructions as ci

INF = float("inf")


# ----- an exact oracle of one rounding ------------------------------------------------------------
def rnd(x: F, prec: int, emin: int, emax: int, mode: str) -> float:
    """Round the exact ``x`` to ``prec`` significant bits with subnormals below ``2**emin``
    (mode ``rne`` or ``rto``: round to odd), overflow to inf (both modes, as Arm's BF16
    round-to-odd does); a signed result (zero sign handled by the callers)."""
    if x == 0:
        return 0.0
    s = -1 if x < 0 else 1
    m = abs(x)
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if F(2) ** e > m:
        e -= 1
    q = F(2) ** (max(e, emin) - prec + 1)
    n, r = divmod(m, q)
    if mode == "rne":
        if r * 2 > q or (r * 2 == q and n % 2):
            n += 1
    elif r:  # round to odd
        n |= 1
    v = n * q
    if v >= F(2) ** (emax + 1):
        return s * INF
    return s * float(v)


def fp32(x: F, mode: str = "rne") -> float:
    return rnd(x, 24, -126, 127, mode)


def fp16(x: F) -> float:
    return rnd(x, 11, -14, 15, "rne")


def add(a: float, b: float, r) -> float:
    """a + b rounded by r, with IEEE's zero signs (an exact zero sum is +0 unless both -0)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return a + b
    s = F(a) + F(b)
    if s == 0:
        return -0.0 if (math.copysign(1, a) < 0 and math.copysign(1, b) < 0) else 0.0
    return r(s)


def ftz(v: float, tiny: float) -> float:
    return math.copysign(0.0, v) if abs(v) < tiny else v


def daz(v: float, tiny: float) -> float:
    return math.copysign(0.0, v) if abs(v) < tiny else v


# ----- inputs ------------------------------------------------------------------------------------
def bf16_values(rng, shape, lo=-8, hi=8, sub=0.1):
    e = rng.integers(lo, hi, shape)
    v = np.where(rng.random(shape) < 0.5, -1.0, 1.0) * (1 + rng.integers(0, 128, shape) / 128)
    v = np.ldexp(v, e)
    tiny = rng.random(shape) < sub
    return np.where(tiny, rng.integers(-127, 128, shape) * 2.0**-133, v)


def fp8_values(rng, fmt, shape):
    codes = rng.integers(0, 256, shape)
    v = np.asarray(pl.decode(codes.astype(np.uint8), fmt), dtype=np.float64)
    return np.where(np.isfinite(v), v, 1.0)


def run(gpu, fmt, a, b, c, out="fp32", instruction=None):
    acc = pl.tensor_core(gpu, fmt, out_format=out, instruction=instruction)
    with np.errstate(all="ignore"):
        d = pl.gemm(a[:, None, :], b[:, :, None], c[:, None, None], input_format=fmt,
                    accumulator=acc, out_format=out, input_rounding="exact")  # fmt: skip
    return np.asarray(d, dtype=np.float64)[:, 0, 0]


def same(x: float, y: float) -> bool:
    return (x == y and math.copysign(1, x) == math.copysign(1, y)) or (x != x and y != y)


# ----- x86 VDPBF16PS -----------------------------------------------------------------------------
def vdpbf16ps_oracle(c: float, a: list[float], b: list[float]) -> float:
    """The measured chain: per pair, fma(a1, b1) then fma(a0, b0), each RNE into fp32 with DAZ
    (signed zeros) on every input and FTZ after rounding (tininess after rounding)."""
    tiny = 2.0**-126
    r = daz(c, tiny)
    a = [daz(x, tiny) for x in a]
    b = [daz(x, tiny) for x in b]
    order = []
    for i in range(0, len(a) - 1, 2):
        order += [i + 1, i]
    if len(a) % 2:
        order.append(len(a) - 1)
    for k in order:
        p = a[k] * b[k]  # exact in float64 (16 bits), its zero sign IEEE's
        unbounded = lambda s: rnd(s, 24, -10_000, 127, "rne")  # noqa: E731
        r = ftz(add(r, p, unbounded), tiny)
    return r


@pytest.mark.parametrize("k", [1, 2, 3, 6])
def test_vdpbf16ps_preset_is_the_measured_chain(k):
    rng = np.random.default_rng(k)
    n = 1500
    a = bf16_values(rng, (n, k), -66, -58, sub=0.2)
    b = bf16_values(rng, (n, k), -66, -58, sub=0.2)
    c = np.where(rng.random(n) < 0.5, -1, 1) * rng.integers(0, 2**24, n) * 2.0**-150
    c = np.asarray(pl.round_to(c, "fp32"), dtype=np.float64)
    d = run("x86", "bf16", a, b, c)
    for i in range(n):
        want = vdpbf16ps_oracle(float(c[i]), a[i].tolist(), b[i].tolist())
        assert same(float(d[i]), want), (c[i], a[i], b[i], d[i], want)


def test_tininess_after_rounding_is_x86_ftz():
    # 2**-126 - 2**-151 rounds (unbounded exponent) to 2**-126: kept; 2**-126 - 2**-150 is
    # tiny after rounding: flushed; the subnormal-grid rule keeps both (as 2**-126)
    a = np.array([[0.0, -(2.0**-75)], [0.0, -(2.0**-75)]])
    b = np.array([[0.0, 2.0**-76], [0.0, 2.0**-75]])
    c = np.array([2.0**-126, 2.0**-126])
    assert run("x86", "bf16", a, b, c).tolist() == [2.0**-126, 0.0]
    grid = pl.tensor_core("x86", "bf16").replace(tininess="subnormal_grid")
    d = pl.gemm(a[:, None, :], b[:, :, None], c[:, None, None], input_format="bf16",
                accumulator=grid)[:, 0, 0]  # fmt: skip
    assert d.tolist() == [2.0**-126, 2.0**-126]


def test_double_rounding_and_pair_order_of_vdpbf16ps():
    # 1 + 2**-24 + 2**-30 rounds (once) up to 1 + 2**-23; two roundings give 1
    assert float(ci.vdpbf16ps(np.float32(1), [2.0**-30, 2.0**-24], [1.0, 1.0])) == 1.0
    assert run("x86", "bf16", np.array([[2.0**-30, 2.0**-24]]), np.ones((1, 2)), np.ones(1))[0] == 1
    # the odd product first: c = 1, a1 b1 = 2**-25 ties back to 1, then a0 b0 = -1.25 * 2**-25
    # gives 1 - 2**-24; the even one first gives 1 - 2**-25 * 1.25 -> 1, then + 2**-25 -> 1
    a = np.array([[-1.25 * 2.0**-25, 2.0**-25]])
    want = vdpbf16ps_oracle(1.0, a[0].tolist(), [1.0, 1.0])
    swapped = vdpbf16ps_oracle(1.0, a[0, ::-1].tolist(), [1.0, 1.0])
    assert (want, swapped) == (1 - 2.0**-24, 1.0)
    assert run("x86", "bf16", a, np.ones((1, 2)), np.ones(1))[0] == want


def test_vdpbf16ps_daz_keeps_the_sign():
    # c = -0, a1 b1 = -0, a0 = -subnormal: the signed DAZ gives -0 (+0 with an unsigned flush)
    a = np.array([[-(2.0**-130), -0.0]])
    b = np.array([[1.0, 1.0]])
    d = run("x86", "bf16", a, b, np.array([-0.0]))
    assert d[0] == 0 and math.copysign(1, d[0]) < 0


# ----- Arm BF16 -----------------------------------------------------------------------------------
def bfdotadd_ebf0(c: float, a0, a1, b0, b1) -> float:
    """BFDotAdd, FPCR.EBF = 0: BFMulH (fp32 round-to-odd, FZ, FIZ) twice, FPAdd_BF16 of the
    products, then of the addend and that sum, all round-to-odd with overflow to inf."""
    tiny = 2.0**-126
    c, a0, a1, b0, b1 = (daz(x, tiny) for x in (c, a0, a1, b0, b1))

    def r(s):
        return ftz(fp32(s, "rto"), tiny)

    def mul(x, y):
        p = F(x) * F(y)
        return math.copysign(0.0, x * y) if p == 0 else r(p)

    prod = add(mul(a0, b0), mul(a1, b1), r)
    return add(c, prod, r)


def bfdotadd_ebf1(c: float, a0, a1, b0, b1) -> float:
    """FEAT_EBF16, EBF = 1: FPDot (the exact pair sum, one RNE rounding), then FPAdd (RNE)."""
    s = F(a0) * F(b0) + F(a1) * F(b1)
    if s != 0:
        prod = fp32(s)
    else:  # an exact zero: -0 only from two -0 products (IEEE)
        both_neg = math.copysign(1, a0 * b0) < 0 and math.copysign(1, a1 * b1) < 0
        prod = -0.0 if (a0 * b0 == 0 and both_neg) else 0.0
    return add(c, prod, fp32)


@pytest.mark.parametrize(
    "instruction", ["bfdot", "bfmmla", "bfdot.ebf0", "bfmmla.ebf1", "bfdot.ebf1"]
)
def test_arm_bf16_dot_is_bfdotadd(instruction):
    ebf1 = instruction.endswith("ebf1")
    oracle = bfdotadd_ebf1 if ebf1 else bfdotadd_ebf0
    rng = np.random.default_rng(len(instruction))
    n, k = 800, 6
    wide = rng.random((n, 1)) < 0.3  # exponents near the ends of the range too
    a = np.where(wide, bf16_values(rng, (n, k), 60, 66), bf16_values(rng, (n, k), -66, 4, 0.1))
    b = np.where(wide, bf16_values(rng, (n, k), 60, 66), bf16_values(rng, (n, k), -66, 4, 0.1))
    c = np.asarray(pl.round_to(rng.standard_normal(n) * 2.0 ** rng.integers(-130, 3, n), "fp32"),
                   dtype=np.float64)  # fmt: skip
    d = run("arm", "bf16", a, b, c, instruction=instruction)
    for i in range(n):
        want = float(c[i])
        for j in range(0, k, 2):
            want = oracle(want, a[i, j], a[i, j + 1], b[i, j], b[i, j + 1])
        assert same(float(d[i]), want), (instruction, c[i], a[i], b[i], d[i], want)


def test_arm_bf16_round_to_odd_and_overflow_to_inf():
    # 1 + 2**-24 + 2**-40: round to odd gives 1 + 2**-23 (inexact: last bit set)
    a = np.array([[2.0**-24, 2.0**-40]])
    d = run("arm", "bf16", a, np.ones((1, 2)), np.ones(1), instruction="bfdot")
    assert d[0] == 1 + 2.0**-23
    # an overflow is inf (round to odd would otherwise stay at max)
    big = np.array([[2.0**127, 2.0**127]])
    assert run("arm", "bf16", big, np.full((1, 2), 1.5), np.zeros(1), instruction="bfdot")[0] == INF
    # EBF = 1 rounds to nearest even: 1 + 2**-24 + 2**-40 -> 1 + 2**-23 too (above the tie),
    # 1 + 2**-24 -> 1 (the tie, to even)
    assert run("arm", "bf16", np.array([[2.0**-24, 0.0]]), np.ones((1, 2)), np.ones(1),
               instruction="bfdot.ebf1")[0] == 1.0  # fmt: skip


def test_arm_bf16_fiz_keeps_the_sign():
    # FIZ: a negative subnormal input is -0, so c = -0 plus (-sub) * 1 + (-0) * 1 is -0
    a, b = np.array([[-(2.0**-130), -0.0]]), np.ones((1, 2))
    for ins in ("bfdot", "bfmmla"):
        d = run("arm", "bf16", a, b, np.array([-0.0]), instruction=ins)
        assert d[0] == 0 and math.copysign(1, d[0]) < 0
        assert same(d[0], bfdotadd_ebf0(-0.0, a[0, 0], a[0, 1], 1.0, 1.0))


def test_bfmlal_is_an_fp32_fma_chain():
    rng = np.random.default_rng(3)
    a, b = bf16_values(rng, (200, 5)), bf16_values(rng, (200, 5))
    c = np.zeros(200)
    d = run("arm", "bf16", a, b, c, instruction="bfmlal")
    for i in range(200):
        want = 0.0
        for j in range(5):
            want = add(want, a[i, j] * b[i, j], fp32)
        assert same(float(d[i]), want)


# ----- Arm FP8 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("pair", [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"),
                                  ("e5m2", "e5m2")])  # fmt: skip
@pytest.mark.parametrize(("instruction", "out", "n_per"), [
    ("fdot", "fp32", 4), ("fdot", "fp16", 2), ("fmlal", "fp16", 1), ("fmlall", "fp32", 1),
])  # fmt: skip
def test_arm_fp8_is_fp8dotaddfp(pair, instruction, out, n_per):
    rng = np.random.default_rng(n_per)
    n, k = 300, 8
    a, b = fp8_values(rng, pair[0], (n, k)), fp8_values(rng, pair[1], (n, k))
    r = fp32 if out == "fp32" else fp16
    c = np.asarray(pl.round_to(rng.standard_normal(n) * 4, out), dtype=np.float64)
    fmt = pair if pair[0] != pair[1] else pair[0]
    d = run("arm", fmt, a, b, c, out=out, instruction=instruction)
    assert pl.tensor_core("arm", fmt, out_format=out, instruction=instruction).name.startswith(
        "arm"
    )
    for i in range(n):
        want = float(c[i])
        for j in range(0, k, n_per):  # one rounding of the addend plus n_per exact products
            prods = a[i, j : j + n_per] * b[i, j : j + n_per]  # (exact in float64)
            if not math.isfinite(want):
                want = want + float(prods.sum())
                continue
            s = F(want) + sum(F(float(p)) for p in prods)
            want = r(s) if s != 0 else add(want, float(prods.sum()), r)
        assert same(float(d[i]), want), (instruction, out, c[i], a[i], b[i], d[i], want)


# ----- the table and the names --------------------------------------------------------------------
def test_cpu_rows_are_in_the_table_with_evidence():
    rows = [r for r in pl.tensor_core.list() if r["arch"] in ("x86", "arm")]
    assert {r["instruction"] for r in rows} == set(ci.CPU_INSTRUCTIONS)
    x86 = [r for r in rows if r["arch"] == "x86"]
    assert [r["instruction"] for r in x86] == [
        "vdpbf16ps",
        "tdpbf16ps",
        "tdpfp16ps",
        "vfmadd231ph",
        "vdpphps",
        "tdpbf8ps",
        "tdpbhf8ps",
        "tdphbf8ps",
        "tdphf8ps",
    ]
    assert x86[0]["evidence"].startswith("measured: AMD EPYC 9004 (Zen 4")
    assert "Intel Xeon" in x86[0]["evidence"]  # VDPBF16PS: the same bits on both CPUs
    assert x86[1]["evidence"].startswith("measured: Intel Xeon")  # AMX-BF16 (this Xeon)
    assert x86[2]["evidence"].startswith("published: Intel")  # AMX-FP16: no such CPU here
    assert x86[3]["evidence"].startswith("measured: Intel Xeon")  # AVX512-FP16
    assert x86[3]["out_format"] == "fp16" and x86[3]["kind"] == "avx512_fp16"
    assert x86[4]["evidence"].startswith("published: Bochs")  # AVX10.2: no such CPU here
    assert all(r["evidence"].startswith("published: Arm ARM") for r in rows if r["arch"] == "arm")
    assert pl.tensor_core.list("zen4") == pl.tensor_core.list("x86")
    assert "vdpbf16ps" in {r["instruction"] for r in pl.tensor_core.list("sapphirerapids")}


def test_names_read_like_the_gpu_ones():
    assert pl.tensor_core("x86", "bf16", instruction="vdpbf16ps") == pl.tensor_core("x86", "bf16")
    assert pl.tensor_core("arm", "bf16").name == "arm bf16 -> fp32 (bfmmla (FPCR.EBF=0))"
    acc = pl.tensor_core("arm", ("e4m3", "e5m2"), instruction="fdot")
    assert (acc.order, acc.block) == ("exact_block", 4)
    assert pl.tensor_core("arm", "e5m2", out_format="fp16").block == 2  # fdot 2-way
    with pytest.raises(ValueError, match=r"instruction: x86 \(x86\) has vdpbf16ps"):
        pl.tensor_core("x86", "bf16", instruction="bfdot")
    with pytest.raises(ValueError, match=r"input_format: x86 \(x86\) vdpbf16ps takes bf16"):
        pl.tensor_core("x86", "fp16", instruction="vdpbf16ps")


def test_cli_lists_the_cpu_rows(capsys):
    from precision_lab.cli import main

    assert main(["tensor-cores", "--gpu", "arm"]) == 0
    out = capsys.readouterr().out
    assert "bfmmla" in out and "fdot" in out and "FPCR.EBF" in out


def test_the_cpu_rules_are_checked():
    with pytest.raises(ValueError, match="tininess='after_rounding' needs subnormals='flush'"):
        pl.Accumulator(tininess="after_rounding")
    with pytest.raises(ValueError, match="pair_order must be one of natural, odd_first"):
        pl.Accumulator(pair_order="even_first")
    with pytest.raises(ValueError, match="input_subnormals must be one of keep, flush, flush_s"):
        pl.Accumulator(input_subnormals="daz")
    with pytest.raises(ValueError, match="pair_order='odd_first' takes no scales"):
        pl.gemm(np.ones((1, 2)), np.ones((2, 1)), input_format="bf16", scale_a=2.0,
                accumulator=pl.tensor_core("x86", "bf16"))  # fmt: skip


# ----- conversions (an integer-arithmetic oracle, independent of the rounding core) -------------
def cvt_oracle(u: np.ndarray) -> np.ndarray:
    """The SDM's convert_fp32_to_bfloat16 (VCVTNEPS2BF16), in integers."""
    u = u.astype(np.uint64)
    exp = (u >> 23) & 0xFF
    nan = (exp == 0xFF) & ((u & 0x7FFFFF) != 0)
    sub = exp == 0
    rne = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # carries into the exponent: overflow to inf
    out = np.where(nan, (u >> 16) | 0x40, np.where(sub, (u >> 16) & 0x8000, rne))
    return out.astype(np.uint16)


def test_vcvtneps2bf16_oracle_on_a_million_words():
    rng = np.random.default_rng(9)
    u = np.concatenate([
        rng.integers(0, 2**32, 1_000_000, dtype=np.uint64),
        np.arange(0x7F7F0000, 0x7F810000, dtype=np.uint64),  # max, overflow, inf, NaN
        np.arange(0, 0x00820000, 7, dtype=np.uint64),  # subnormals and the smallest normals
    ]).astype(np.uint32)  # fmt: skip
    got = ci.vcvtneps2bf16(u.view(np.float32))
    want = cvt_oracle(u)
    assert np.array_equal(got, want)
    x, y = u[:1024].view(np.float32), u[1024:2048].view(np.float32)
    both = ci.vcvtne2ps2bf16(x, y)
    assert np.array_equal(both, np.concatenate([want[1024:2048], want[:1024]]))


def test_vfmadd231ph_row_is_an_fp16_fma_chain_by_mxcsr_rounding():
    """AVX512-FP16's FMA (measured on an Intel Xeon: tests/gemm/test_cpu_isa_fp16.py): an fp16
    chain along K, one rounding per step, subnormals kept; the row answers without out_format
    (fp16 is its only output) and takes MXCSR.RC through ``replace(rounding=...)``."""
    acc = pl.tensor_core("x86", "fp16", instruction="vfmadd231ph")
    assert acc == pl.tensor_core("x86", "fp16", out_format="fp16")  # the x86 fp16 -> fp16 row
    assert (acc.format.name, acc.rounding, acc.order, acc.lanes) == (
        "fp16", "nearest_even", "sequential", None)  # fmt: skip
    assert (acc.subnormals, acc.input_subnormals) == ("keep", "keep")
    assert pl.tensor_core("x86", "fp16").name == "x86 fp16 -> fp32 (tdpfp16ps)"  # unchanged
    # against exact rationals: 1 + 2**-11 + 2**-11 in fp16 steps: two ties to even stay at 1;
    # rounding up gives 1 + 2**-9 (each step up), toward zero 1
    a, b = np.array([[2.0**-11, 2.0**-11]], np.float16), np.ones((2, 1), np.float16)
    c = np.ones((1, 1), np.float16)
    for mode, want in (("nearest_even", 1.0), ("up", 1 + 2.0**-9), ("toward_zero", 1.0),
                       ("down", 1.0)):  # fmt: skip
        d = pl.gemm(a, b, c, input_format="fp16", accumulator=acc.replace(rounding=mode),
                    out_format="fp16")  # fmt: skip
        assert float(np.asarray(d)[0, 0]) == want, mode
    # the one-element function: subnormal products kept, the x86 default NaN 0xfe00
    tiny = ci.vfmadd231ph(np.float16(0), np.float16(2.0**-14), np.float16(2.0**-10))
    assert float(tiny) == 2.0**-24
    nan = ci.vfmadd231ph(np.float16(0), np.float16(np.inf), np.float16(0))
    assert int(nan.view(np.uint16)) == 0xFE00


def test_fp16_conversions_hold_to_integer_oracles():
    """VCVTPS2PHX / VCVTPH2PSX on any CPU, against integer rules written here (RNE on the
    bits; NaN: sign, quiet bit, payload's upper bits)."""
    rng = np.random.default_rng(40)
    x = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    got = ci.vcvtps2phx(x.view(np.float32))
    sign = (x >> 16) & 0x8000
    e = ((x >> 23) & 0xFF).astype(np.int64) - 127
    nan = ((x >> 23) & 0xFF == 0xFF) & (x & 0x7FFFFF != 0)
    assert np.array_equal(got[nan], (sign | 0x7E00 | ((x >> 13) & 0x3FF))[nan])
    normal = (e >= -14) & (e <= 15)  # results in fp16's normal range (or overflow at the top)
    m = (x & 0x7FFFFF) | 0x800000  # 24-bit significand; keep 11 bits
    r = m >> 13
    rem = m & 0x1FFF
    r = r + ((rem > 0x1000) | ((rem == 0x1000) & (r & 1 == 1)))
    code = (((e + 15) << 10) + (r - 1024)).astype(np.int64)  # a carry moves the exponent up
    code = np.where(code >= 0x7C00, 0x7C00, code) | sign
    assert np.array_equal(got[normal], code[normal].astype(np.uint16))
    # fp16 -> fp32: every code, exact; NaN quieted with its payload
    h = np.arange(2**16, dtype=np.uint16)
    back = ci.vcvtph2psx(h)
    ok = ~np.isnan(h.view(np.float16))
    assert np.array_equal(back[ok], h.view(np.float16)[ok].astype(np.float32))
    hn = h[~ok].astype(np.uint32)
    want = ((hn & 0x8000) << 16) | 0x7FC00000 | ((hn & 0x3FF) << 13)
    assert np.array_equal(back.view(np.uint32)[~ok], want)


def test_out_format_none_is_fp32_or_the_instructions_one_output():
    assert pl.tensor_core("h100", "e4m3") == pl.tensor_core("h100", "e4m3", out_format="fp32")
    fma = pl.tensor_core("x86", "fp16", instruction="vfmadd231ph")
    assert fma.format == pl.get_format("fp16")
    assert fma == pl.tensor_core("x86", "fp16", instruction="vfmadd231ph", out_format="fp16")
    with pytest.raises(ValueError):
        pl.tensor_core("x86", "fp16", instruction="vfmadd231ph", out_format="fp32")
