"""The special-value rules of the accumulator spec (issue 20 item 1), on every backend.

Each rule is checked on the numpy reference, the native kernels and the CUDA header built for
the host (the kernels of pl_gemm.cu run on the CPU through tests/backends/cuda_harness, as in
test_cuda_host.py), against an independent referee: the spec's steps written out with exact
``fractions.Fraction`` arithmetic and the rounding referee of tests/referee.py, Python floats for
the IEEE arithmetic of infinities and NaNs. Rules: overflow (``"ieee"``, ``"infinity"``),
infinities meeting overflowed partial sums, zeros in the block-FMA alignment anchor, subnormal
products, the sign of zero results and the NaN encoding; plus the issue's bit patterns, which
the hardware model (MMA-Sim) gives and precision_lab did not.
"""

from __future__ import annotations

import math
import zlib
from fractions import Fraction

import numpy as np
import pytest
from referee import referee, referee_formula
from test_cuda_host import _emu_gemm, gemm_lib  # noqa: F401  (gemm_lib: a fixture)

import precision_lab as pl
from precision_lab.gemm import native_backend
from precision_lab.gemm.accumulator import ZERO_EXPONENT
from precision_lab.gemm.reference import _canonical_nan
from precision_lab.gemm.tensor_core import NVIDIA_SPECIALS, NVIDIA_TRUNCATING

BACKENDS = ("numpy", "native", "cuda-host")
IEEE_RULES = {
    "overflow": "ieee",
    "zeros_in_anchor": False,
    "zero_sign": "ieee",
    "nan_encoding": "quiet",
}


@pytest.fixture(params=BACKENDS)
def run_gemm(request: pytest.FixtureRequest):
    """``f(a, b, c, **gemm_kw)`` on one backend (the header's kernels via the host harness)."""
    name = request.param
    if name == "native" and not native_backend.available():
        pytest.skip("precision_lab.backends._native_kernels is not built")
    if name == "cuda-host":
        lib = request.getfixturevalue("gemm_lib")

        def run(a, b, c=None, **kw):
            out, _ = _emu_gemm(lib, a, b, c, **kw)
            return _canonical_nan(out, kw["accumulator"].nan_encoding)

        return run
    return lambda a, b, c=None, **kw: pl.gemm(a, b, c, backend=name, **kw)


def _same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    ok = (got == want) | (np.isnan(got) & np.isnan(want))
    ok &= (np.signbit(got) == np.signbit(want)) | np.isnan(want)
    bad = np.argwhere(~ok)
    if bad.size:
        i = tuple(bad[0])
        raise AssertionError(f"{what}: {len(bad)} differ, first at {i}: {got[i]!r} != {want[i]!r}")


# ----- the referee ---------------------------------------------------------------------------
def _next_above_max(fmt: pl.FloatFormat) -> Fraction:
    return Fraction(fmt.max) + Fraction(2) ** (fmt.emax - fmt.mantissa_bits)


def ref_round(x: float, fmt: pl.FloatFormat, mode: str, overflow: str, zero_sign: str) -> float:
    """One rounding of the exact float x: the referee's, with ``"infinity"`` and zero signs."""
    small = fmt.bits <= 16
    core = "ieee" if overflow == "infinity" else overflow
    r = referee(x, fmt, mode, core) if small else referee_formula(x, fmt, mode, core)
    if overflow == "infinity" and math.isfinite(x) and abs(Fraction(x)) >= _next_above_max(fmt):
        r = math.copysign(math.inf, x)
    if zero_sign == "positive" and r == 0:
        r = 0.0
    return r


def _exact_float(x: Fraction) -> float:
    f = float(x)
    assert Fraction(f) == x, "the model's exact sums are float64 numbers"
    return f


def _odd53(x: Fraction) -> float:
    """x rounded to 53 bits by round-to-odd: for formats of at most 51 bits, rounding this
    float once is rounding x once (Boldo & Melquiond), and it keeps x's side of every value of
    at most 52 bits (max + ulp(max) included)."""
    f = float(x)
    if Fraction(f) == x:
        return f
    if abs(Fraction(f)) > abs(x):
        f = math.nextafter(f, 0.0)
    if int(np.float64(f).view(np.uint64)) % 2 == 0:
        f = math.nextafter(f, math.copysign(math.inf, f))
    return f


def ref_sequential(ps, c: float, fmt, mode: str, overflow: str, zero_sign: str) -> float:
    """``s = c; s = round(s + p)`` with specials added unrounded (spec sections 3-5)."""
    s = c
    for p in ps:
        if not (math.isfinite(s) and math.isfinite(p)):
            s = s + p
            continue
        x = Fraction(s) + Fraction(p)
        if x == 0:  # IEEE 754 6.3
            if s == 0 and p == 0 and math.copysign(1, s) == math.copysign(1, p):
                z = s
            else:
                z = -0.0 if mode == "down" else 0.0
            s = 0.0 if zero_sign == "positive" else z
            continue
        s = ref_round(_odd53(x), fmt, mode, overflow, zero_sign)
    return s


def _align_exp(x: float, emin: int, zero: int | None) -> int | None:
    if x == 0:
        return zero
    return max(math.frexp(x)[1] - 1, emin)


def ref_block_fma(a, b, c: float, fa, fb, acc: pl.Accumulator) -> float:
    """The in-block block FMA of the spec (section 3), every block in exact arithmetic: a zero
    product and a zero running value align at ``zero_exponent`` with ``zeros_in_anchor``."""
    fmt = acc.format
    n, F = acc.block, acc.align_bits
    zero = acc.zero_exponent if acc.zeros_in_anchor else None
    r = c
    for j0 in range(0, len(a), n):
        blk = list(zip(a[j0 : j0 + n], b[j0 : j0 + n], strict=True))
        specials = [x * y for x, y in blk if not math.isfinite(x * y)]
        if specials or not math.isfinite(r):
            for p in specials:
                r = r + p
            continue
        terms = []
        for x, y in blk:
            if x == 0 or y == 0:
                if zero is not None:
                    terms.append((Fraction(0), zero))
                continue
            terms.append(
                (
                    Fraction(x) * Fraction(y),
                    _align_exp(x, fa.emin, None) + _align_exp(y, fb.emin, None),
                )
            )
        er = _align_exp(r, fmt.emin, zero)
        if er is not None:
            terms.append((Fraction(r), er))
        if not terms:
            r = 0.0
            continue
        q = Fraction(2) ** (max(e for _, e in terms) - F)
        X = sum((math.trunc(v / q) * q for v, _ in terms), Fraction(0))
        if X == 0:
            r = 0.0
            continue
        r = ref_round(_exact_float(X), fmt, acc.rounding, acc.overflow, acc.zero_sign)
    return r


def _grid_values(fmt: str, rng: np.random.Generator, shape, specials: bool) -> np.ndarray:
    """Values of fmt: normal, subnormal, huge, signed zeros (and inf/NaN with ``specials``)."""
    f = pl.get_format(fmt)
    m = rng.uniform(1, 2, shape) * rng.choice([-1.0, 1.0], shape)
    e = rng.integers(-4, 5, shape).astype(float)
    kind = rng.random(shape)
    e = np.where(kind < 0.15, f.emax - rng.integers(0, 2, shape), e)  # near the top
    e = np.where((kind >= 0.15) & (kind < 0.25), f.emin - rng.integers(1, 6, shape), e)  # sub
    x = np.asarray(pl.round_to(m * 2.0**e, f, rounding="toward_zero"), np.float64)
    x = np.where((kind >= 0.25) & (kind < 0.35), rng.choice([0.0, -0.0], shape), x)
    if specials:
        sp = rng.choice([np.inf, -np.inf, np.nan], shape, p=[0.45, 0.45, 0.1])
        x = np.where(kind > 0.97, sp, x)
    return x


# ----- the issue's bit patterns ----------------------------------------------------------------
def _h16(v: int) -> float:
    return float(np.array(v, np.uint16).view(np.float16))


def _bf16(v: int) -> float:
    return float(np.array(v << 16, np.uint32).view(np.float32))


def _f32(v: int) -> float:
    return float(np.array(v, np.uint32).view(np.float32))


# (gpu, input format, K, {k: a bits}, {k: b bits}, c bits, out format, result bits of the
# hardware model, result bits before the fix)
# The first two (zeros beside 2**127 and 2): issue 20 had 0x3E800000 and 0x80000736 from
# MMA-Sim's earlier snapshot (a zero at -126 plus its partner's exponent); MMA-Sim 2.1.1 (zeros
# at its fixed e_zero, -133 and -131 here) gives c back unchanged (checked against mmasim in
# tests/gemm/test_mmasim_nvidia.py), as the IEEE rules do.
ISSUE_CASES = [
    ("h100", "bf16", 16, {0: 0x7F00}, {0: 0x0000}, 0x3E800001, "fp32", 0x3E800001, 0x3E800001),
    ("v100", "fp16", 4, {0: 0x4000}, {0: 0x8000}, 0x80000737, "fp32", 0x80000737, 0x80000737),
    ("h100", "bf16", 16, {0: 0x7F00}, {0: 0x4000}, 0, "fp32", 0x7F800000, 0x7F7FFFFF),
    ("a100", "bf16", 16, {0: 0x7F00, 8: 0xFF00}, {0: 0x4000, 8: 0x4080}, 0, "fp32", 0x7F800000,
     0xFF7FFFFF),
    ("a100", "fp16", 16, {0: 0x7BFF, 8: 0x7C00}, {0: 0xC000, 8: 0x3C00}, 0, "fp16", 0x7FFF,
     0x7E00),
]  # fmt: skip


@pytest.mark.parametrize("case", ISSUE_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[7]:#x}")
def test_issue_20_bit_patterns(run_gemm, case) -> None:
    gpu, fmt, k, a_bits, b_bits, c_bits, out, want, before = case
    conv = _bf16 if fmt == "bf16" else _h16
    a, b = np.zeros((1, k)), np.zeros((k, 1))
    for i, v in a_bits.items():
        a[0, i] = conv(v)
    for i, v in b_bits.items():
        b[i, 0] = conv(v)
    c = np.array([[_f32(c_bits) if out == "fp32" else _h16(c_bits)]])
    for acc, expect in (
        (pl.tensor_core(gpu, fmt, out_format=out), want),
        (pl.tensor_core(gpu, fmt, out_format=out).replace(**IEEE_RULES), before),
    ):
        d = run_gemm(a, b, c, input_format=fmt, accumulator=acc, out_format=out)
        d = np.asarray(d, np.float32)
        got = (
            int(d.view(np.uint32)[0, 0])
            if out == "fp32"
            else int(d.astype(np.float16).view(np.uint16)[0, 0])
        )
        assert got == expect, f"{acc.describe()}: {got:#x} != {expect:#x}"


def test_infinity_after_overflow_is_nan(run_gemm) -> None:
    """Issue 20: the partial sum overflows to -inf, then meets +inf: NaN (was +inf); the other
    order is +inf (the infinity comes first and stays)."""
    acc = pl.Accumulator("fp16")
    kw = {"input_format": "fp16", "accumulator": acc, "out_format": "fp16"}
    d = run_gemm(np.array([[65504.0, np.inf]]), np.array([[-2.0], [1.0]]), **kw)
    assert np.isnan(d[0, 0])
    d = run_gemm(np.array([[np.inf, 65504.0]]), np.array([[1.0], [-2.0]]), **kw)
    assert d[0, 0] == np.inf
    for order in ("pairwise", "blocked"):  # the first step adds both: +inf
        acc = pl.Accumulator("fp16", order=order, block=2 if order == "blocked" else None)
        d = run_gemm(
            np.array([[65504.0, 65504.0, np.inf]]),
            np.array([[-2.0], [-2.0], [1.0]]),
            input_format="fp16",
            accumulator=acc,
            out_format="fp16",
        )
        assert np.isnan(d[0, 0]), order


# ----- every rule against the referee ---------------------------------------------------------
SEQ_MODES = ("nearest_even", "toward_zero", "up", "down")


@pytest.mark.parametrize("overflow", ["ieee", "infinity"])
@pytest.mark.parametrize("zero_sign", ["ieee", "positive"])
@pytest.mark.parametrize("specials", [False, True], ids=["finite", "inf-nan"])
def test_sequential_rules_against_referee(run_gemm, overflow, zero_sign, specials) -> None:
    """fp16 sequential accumulation near the top of the range, with exact cancellations,
    underflows, signed zeros (and infinities and NaNs): each step rounded once by the referee,
    specials added in IEEE arithmetic in order."""
    rng = np.random.default_rng(20 + 2 * specials + (zero_sign == "positive"))
    m, k, n = 40, 5, 3
    a = _grid_values("fp16", rng, (m, k), specials)
    b = _grid_values("fp16", rng, (k, n), specials)
    a[:5] = np.array([65504.0, -65504.0, 1.0, -1.0, 2.0**-24])  # cancellations and overflows
    b[:, 0] = np.array([1.0, 1.0, 2.0**-14, 2.0**-14, -0.5])
    c = _grid_values("fp16", rng, (m, n), specials)
    fp16 = pl.get_format("fp16")
    for mode in SEQ_MODES:
        acc = pl.Accumulator("fp16", mode, overflow=overflow, zero_sign=zero_sign)
        d = run_gemm(a, b, c, input_format="fp16", accumulator=acc, out_format="fp16")
        want = np.empty((m, n))
        for i in range(m):
            for j in range(n):
                ps = [float(a[i, t]) * float(b[t, j]) for t in range(k)]
                s = ref_sequential(ps, float(c[i, j]), fp16, mode, overflow, zero_sign)
                out = ref_round(s, fp16, "nearest_even", overflow, zero_sign)
                want[i, j] = s if math.isnan(s) else out
        _same(d, want, f"sequential {mode} {overflow} {zero_sign} specials={specials}")


@pytest.mark.parametrize("rules", ["nvidia", "ieee"])
@pytest.mark.parametrize("specials", [False, True], ids=["finite", "inf-nan"])
@pytest.mark.parametrize(("gpu", "fmt"), [("h100", "bf16"), ("a100", "fp16"), ("v100", "fp16")])
def test_block_fma_rules_against_referee(run_gemm, gpu, fmt, rules, specials) -> None:
    """Tensor-core presets with their NVIDIA rules and with the IEEE defaults: overflow of the
    truncating datapath, zeros in the anchor, subnormal products, zero signs, infinities."""
    rng = np.random.default_rng(zlib.crc32(f"{gpu} {fmt} {rules} {specials}".encode()))
    acc = pl.tensor_core(gpu, fmt)
    if rules == "ieee":
        acc = acc.replace(**IEEE_RULES)
    n = acc.block
    m, k, cols = 30, 2 * n, 4
    a = _grid_values(fmt, rng, (m, k), specials)
    b = _grid_values(fmt, rng, (k, cols), specials)
    c = np.asarray(pl.round_to(_grid_values("fp32", rng, (m, cols), specials), "fp32"), float)
    c[:6, 0] = [0.0, -0.0, _f32(0x80000737), _f32(0x3E800001), -(2.0**-149), 3e38]
    c = np.asarray(pl.round_to(c, "fp32"), np.float64)  # (gemm rounds c to out_format)
    f = pl.get_format(fmt)
    d = run_gemm(a, b, c, input_format=fmt, accumulator=acc, out_format="fp32")
    want = np.empty((m, cols))
    for i in range(m):
        for j in range(cols):
            want[i, j] = ref_block_fma(
                [float(x) for x in a[i]], [float(y) for y in b[:, j]], float(c[i, j]), f, f, acc
            )
    _same(d, want, f"{acc.describe()} specials={specials}")


def test_zeros_in_anchor_and_overflow_rules_differ() -> None:
    """The rules the referee checks do change results (a test that cannot fail is a defect).
    Hopper bf16, c = 0, two products near 2**-145: the zero c aligns at e_zero = -133 (25 bits:
    a grain of 2**-158, MMA-Sim 2.1.1) and gives 0x37; at -126 (the old rule) 0x38; with
    zero_exponent=-60 and no running value in the block, the zero products cut both to 0."""
    a = np.zeros((1, 16))
    b = np.zeros((16, 1))
    a[0, :2] = [1.5021599923962983e-21, 2.2540671692070004e-23]
    b[:2, 0] = [5.459392042849983e-23, -1.5881867761018131e-22]
    h100 = pl.tensor_core("h100", "bf16", instruction="mma")
    kw = {"input_format": "bf16", "out_format": "fp32", "backend": "numpy"}
    assert h100.zero_exponent == -133
    got = pl.gemm(a, b, accumulator=h100, **kw).view(np.uint32)[0, 0]
    old = pl.gemm(a, b, accumulator=h100.replace(zero_exponent=ZERO_EXPONENT), **kw)
    assert got == 0x37 and old.view(np.uint32)[0, 0] == 0x38
    # a zero product takes part too where no running value is in the block (after_block)
    big = h100.replace(zero_exponent=-60, addend="after_block", block_rounding="toward_zero")
    without = big.replace(zeros_in_anchor=False)
    assert pl.gemm(a, b, accumulator=big, **kw)[0, 0] == 0.0
    assert pl.gemm(a, b, accumulator=without, **kw).view(np.uint32)[0, 0] == 0x37


def test_underflow_sign(run_gemm) -> None:
    """A negative block sum below fp32's range truncates to zero: -0 under IEEE rules, +0 with
    zero_sign="positive" (a fixed-point datapath, MMA-Sim); an exact cancellation is +0."""
    a = np.zeros((2, 16))
    b = np.zeros((16, 1))
    # bf16 subnormal x normal: -2**-150, exact in the block (quantum 2**-151 even with the zero
    # c in the anchor), below fp32's smallest subnormal 2**-149: truncated to zero
    a[0, 0], b[0, 0] = -(2.0**-130), 2.0**-20
    a[1, 0], a[1, 1], b[1, 0] = 1.0, -1.0, 2.0**-20  # row 1: 2**-20 - 2**-20, exactly 0
    acc = pl.tensor_core("h100", "bf16")
    kw = {"input_format": "bf16", "out_format": "fp32"}
    ieee = run_gemm(a, b, accumulator=acc.replace(zero_sign="ieee"), **kw)
    pos = run_gemm(a, b, accumulator=acc, **kw)
    assert ieee[0, 0] == 0 and np.signbit(ieee[0, 0])
    assert pos[0, 0] == 0 and not np.signbit(pos[0, 0])
    assert not np.signbit(ieee[1, 0]) and not np.signbit(pos[1, 0])


@pytest.mark.parametrize("out", ["fp32", "fp16", "fp64"])
def test_nan_encoding(run_gemm, out) -> None:
    a = np.array([[np.inf, 1.0], [np.nan, 1.0], [1.0, 1.0]])
    b = np.array([[0.0], [1.0]])
    for encoding, bits in (("quiet", None), ("nvidia", True)):
        acc = pl.Accumulator("fp16" if out == "fp16" else "fp32", nan_encoding=encoding)
        d = np.asarray(run_gemm(a, b, input_format="fp16", accumulator=acc, out_format=out))
        assert np.isnan(d[:2, 0]).all() and d[2, 0] == 1.0
        if d.dtype == np.float64:
            u = d.view(np.uint64)[:2, 0]
            want = 0x7FFF_FFFF_FFFF_FFFF if bits else 0x7FF8_0000_0000_0000
        else:
            u = d.view(np.uint32)[:2, 0]
            want = 0x7FFF_FFFF if bits else 0x7FC0_0000
        assert [int(x) for x in u] == [want, want], encoding
        if out == "fp16":
            h = d.astype(np.float16).view(np.uint16)[:2, 0]
            assert [int(x) for x in h] == [0x7FFF if bits else 0x7E00] * 2


def test_infinity_overflow_every_mode() -> None:
    """overflow="infinity": a value at or beyond max + ulp(max) is inf in every mode, values
    between max and there round as under "ieee" (the referee's rounding)."""
    fp16 = pl.get_format("fp16")
    top = 65536.0  # max + ulp(max)
    xs = [65504.0, 65519.0, 65520.0, 65535.0, top, 1e6, -65535.0, -top]
    for mode in ("nearest_even", "toward_zero", "up", "down", "odd", "nearest_away"):
        r = pl.gemm(
            np.array(xs)[:, None],
            np.ones((1, 1)),
            input_format="fp32",
            accumulator=pl.Accumulator("fp16", mode, overflow="infinity"),
            out_format="fp32",
            backend="numpy",
        )[:, 0]
        for x, got in zip(xs, r.tolist(), strict=True):
            assert got == ref_round(x, fp16, mode, "infinity", "ieee"), (mode, x, got)
        assert r[4] == np.inf and r[7] == -np.inf


def test_accumulator_field_validation() -> None:
    with pytest.raises(ValueError, match="zero_sign must be one of ieee, positive, got 'neg'"):
        pl.Accumulator(zero_sign="neg")
    with pytest.raises(ValueError, match="nan_encoding must be one of quiet, nvidia, got 'x'"):
        pl.Accumulator(nan_encoding="x")
    with pytest.raises(ValueError, match="overflow must be one of ieee, saturate, infinity"):
        pl.Accumulator(overflow="inf")
    with pytest.raises(ValueError, match="zeros_in_anchor=True needs order='block_fma'"):
        pl.Accumulator(zeros_in_anchor=True)
    with pytest.raises(ValueError, match="zeros_in_anchor must be True or False, got 1"):
        pl.Accumulator(order="block_fma", block=4, align_bits=23, zeros_in_anchor=1)
    acc = pl.tensor_core("h100", "bf16")
    rules = {**NVIDIA_SPECIALS, **NVIDIA_TRUNCATING}  # bf16 -> fp32 truncates
    assert {k: getattr(acc, k) for k in rules} == rules
    assert "overflow gives ±inf" in acc.describe() and "NaN is 0x7fffffff" in acc.describe()
    assert pl.Accumulator().describe() == "sequential sum in fp32 (nearest_even)"
