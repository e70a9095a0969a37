"""Property tests of the core with the shipped hypothesis strategies
(precision_lab.verify.strategies), against an exact referee written here with fractions.Fraction
and integer code arithmetic.

The referee is independent of tests/referee.py: it never lists a format's values; it finds the
code just below |x| by bisection on codes and works on codes and exact rationals from there, so
it also serves custom formats wider than 16 bits.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import precision_lab as pl
from precision_lab.core.formats import FloatFormat
from precision_lab.verify import strategies as pls

DETERMINISTIC = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")
NAMED_FLOATS = [n for n, f in pl.FORMATS.items() if isinstance(f, FloatFormat)]
NAMED_SMALL = [n for n in NAMED_FLOATS if pl.get_format(n).bits <= 16]
# PL_EXAMPLES=5000 python -m pytest tests/verify/test_strategies.py searches harder
SETTINGS = settings(
    max_examples=int(os.environ.get("PL_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# ----- the referee -------------------------------------------------------------------------------
def max_code(f: FloatFormat) -> int:
    e, m = f.exponent_bits, f.mantissa_bits
    if f.nan == "ieee":  # the all-ones exponent holds inf and NaN
        return (((1 << e) - 1) << m) - 1
    if f.nan == "fn":  # only the all-ones code is NaN
        return (1 << (e + m)) - 2
    return (1 << (e + m)) - 1


def code_value(f: FloatFormat, c: int) -> Fraction:
    m, bias = f.mantissa_bits, f.bias
    assert bias is not None
    ef, frac = divmod(c, 1 << m)
    if ef == 0 and f.has_zero:
        return Fraction(frac if f.has_subnormals else 0, 1 << m) * Fraction(2) ** (1 - bias)
    return Fraction((1 << m) + frac, 1 << m) * Fraction(2) ** (ef - bias)


def neighbours(f: FloatFormat, a: Fraction) -> tuple[int, Fraction, Fraction]:
    """For a >= 0 not below the smallest value: the code and value lo <= a of the largest format
    value, and the next value hi above it (beyond max: max + ulp(max), unbounded exponent)."""
    lo, hi = 0, max_code(f)
    while lo < hi:  # largest code whose value is <= a (values grow with codes)
        mid = (lo + hi + 1) // 2
        if code_value(f, mid) <= a:
            lo = mid
        else:
            hi = mid - 1
    m = f.mantissa_bits
    if f.has_zero and not f.has_subnormals and lo < (1 << m):
        return 0, Fraction(0), code_value(f, 1 << m)  # only zero lies below the smallest normal
    if lo < max_code(f):
        return lo, code_value(f, lo), code_value(f, lo + 1)
    assert f.bias is not None
    field = max(lo >> m, 1) if f.has_zero else lo >> m  # a subnormal max: the quantum of field 1
    return lo, code_value(f, lo), code_value(f, lo) + Fraction(2) ** (field - f.bias - m)


def lower_is_even(f: FloatFormat, lo_code: int, lo: Fraction, hi: Fraction) -> bool:
    """Ties-to-even / round-to-odd parity. With mantissa bits: lo is an even multiple of the
    spacing hi - lo (the mantissa's last bit). Without (e8m0-like): the code's last bit, as
    documented for e8m0 (192 -> 128)."""
    if f.mantissa_bits == 0:
        return lo_code % 2 == 0
    k = lo / (hi - lo)
    assert k.denominator == 1
    return k.numerator % 2 == 0


def is_p3109(f: FloatFormat) -> bool:
    """Laid out as P3109's K``k``P``p`` (interim report, "Binary formats"): signed with bias
    2**(k-p-1) and NaN on the negative-zero code, or unsigned with bias 2**(k-p) and NaN on the
    all-ones code; zero and subnormals; infinities in the extended domain only."""
    m, e = f.mantissa_bits, f.exponent_bits
    k = e + m + int(f.signed)
    if f.signed:
        ok = e == k - m - 1 and f.bias == (1 << (k - m - 2) if k - m - 2 >= 0 else 0)
        ok = ok and f.nan == "fnuz"
    else:
        ok = f.bias == 1 << (k - m - 1) and f.nan == "fn"
    return ok and f.has_zero and f.has_subnormals


def overflowed(f: FloatFormat, mode: str, neg: bool, overflow: str) -> float:
    """Result of a finite input whose rounding went beyond max (sign applied by the caller).
    Round to odd overflows like the nearest modes in P3109 formats (P3109's projection: round
    with an unbounded exponent, then everything beyond max is inf), and gives max elsewhere."""
    outward = mode in ("nearest_even", "nearest_away") or mode == ("down" if neg else "up")
    outward = outward or (mode == "odd" and is_p3109(f))
    if overflow == "saturate" or not outward or f.nan == "none":
        return float(code_value(f, max_code(f)))
    return math.inf if f.has_inf else math.nan


def ref_round(x: float, f: FloatFormat, mode: str, overflow: str, subnormals: str) -> float:
    """x rounded to f, exactly, by the definitions in DESIGN.md and round_to's docstring."""
    if math.isnan(x):
        return math.nan
    neg = math.copysign(1.0, x) < 0
    if x == 0 and not f.has_zero:  # e8m0 and the like: zero is NaN, or the least value
        return math.nan if f.has_nan else float(code_value(f, 0))  # in a format without NaN
    if neg and not f.signed:  # round_to: negative numbers become NaN, or the least value
        if x == 0:  # when the format has no NaN; -0 becomes +0
            return 0.0
        return math.nan if f.has_nan else float(code_value(f, 0))
    fmax = code_value(f, max_code(f))
    if math.isinf(x):
        if overflow == "saturate" or f.nan == "none":
            r = float(fmax)
        else:
            r = math.inf if f.has_inf else math.nan
    elif not f.has_zero and Fraction(x) < code_value(f, 0):
        return float(code_value(f, 0))  # e8m0: positive values below 2**-bias go up
    else:
        a = Fraction(abs(x))
        lo_code, lo, hi = neighbours(f, a)
        if a == lo:
            away = False
        elif mode in ("nearest_even", "nearest_away"):
            mid = (lo + hi) / 2
            if a != mid:
                away = a > mid
            else:
                away = mode == "nearest_away" or not lower_is_even(f, lo_code, lo, hi)
        elif mode == "odd":
            away = lower_is_even(f, lo_code, lo, hi)
            # P3109 rounds with an unbounded exponent first: at or past the value after max the
            # result lies beyond max whatever max's parity (then overflows)
            away = away or (is_p3109(f) and lo_code == max_code(f) and a >= hi)
        else:
            away = {"toward_zero": False, "up": not neg, "down": neg}[mode]
        exact = hi if away else lo
        if exact > fmax:  # overflow (round to odd: max, or inf in P3109 formats)
            r = overflowed(f, mode, neg, overflow)
            all_sub = f.has_zero and max_code(f) < 1 << f.mantissa_bits
            if subnormals == "flush" and all_sub and 0 < r < math.inf:
                r = 0.0  # a format whose every value is subnormal: a saturated max flushes too
        elif (
            subnormals == "flush" and f.has_zero and 0 < exact < code_value(f, 1 << f.mantissa_bits)
        ):
            r = 0.0
        else:
            r = float(exact)
    if not neg:
        return r
    if r == 0:
        return -0.0 if f.has_negative_zero else 0.0
    return -r


@pytest.mark.parametrize(
    ("x", "mode", "want"),
    [(1.5, "nearest_even", 1.0), (1.5, "odd", 2.0), (3.0, "nearest_even", 4.0), (0.75, "odd", 0.5)],
)
def test_exponent_only_format_with_even_bias_ties_by_code(x, mode, want):
    # found with formats(): ties were broken by the float64 exponent's parity (fixed in 30a4195)
    f = FloatFormat(3, 0, bias=2, nan="fn", has_inf=False)  # 0, 2**-1 .. 2**4: 1.0 has code 2
    assert ref_round(x, f, mode, "ieee", "keep") == want
    assert core(np.float64(x), f, mode) == want
    assert core(np.float32(x), f, mode) == want


def test_format_without_normal_values_rounds_correctly():
    # found with formats(): e1m1 with bias 0 has only subnormals and crashed round_to; such
    # formats (P3109 K3P3 ...) are supported now: every input goes the core's exact path
    f = FloatFormat(1, 1, bias=0)  # 0 and the subnormal 1.0; the exponent field 1 is inf/NaN
    assert f.values().tolist() == [-1.0, 0.0, 1.0]
    for x in (0.0, -0.0, 0.3, 0.5, 0.7, 1.0, 1.4, 1.5, 1.6, 3.0, -1.5, -0.5, 1e-300):
        check_all_modes(np.float64(x), f)
        check_all_modes(np.float32(x), f)


def same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def core(x, fmt, mode, overflow="ieee", subnormals="keep") -> float:
    return float(pl.round_to(x, fmt, rounding=mode, overflow=overflow, subnormals=subnormals))


def check_all_modes(x, f: FloatFormat) -> None:
    for mode in DETERMINISTIC:
        for overflow in ("ieee", "saturate"):
            for sub in ("keep", "flush"):
                want = ref_round(float(x), f, mode, overflow, sub)
                got = core(x, f, mode, overflow, sub)
                assert same(got, want), (float(x), str(f), f, mode, overflow, sub, got, want)


def test_referee_on_known_traps():
    e4m3, e5m2, e8m0 = (pl.get_format(n) for n in ("e4m3", "e5m2", "e8m0"))
    assert ref_round(1.0625 + 2**-40, e4m3, "nearest_even", "ieee", "keep") == 1.125
    assert ref_round(464.0, e4m3, "nearest_even", "ieee", "keep") == 448.0
    assert math.isnan(ref_round(464.0001, e4m3, "nearest_even", "ieee", "keep"))
    assert ref_round(464.0001, e4m3, "nearest_even", "saturate", "keep") == 448.0
    assert ref_round(61440.0, e5m2, "nearest_even", "ieee", "keep") == math.inf
    assert ref_round(61440.0, e5m2, "toward_zero", "ieee", "keep") == 57344.0
    assert ref_round(192.0, e8m0, "nearest_even", "ieee", "keep") == 128.0
    assert ref_round(192.0, e8m0, "nearest_away", "ieee", "keep") == 256.0
    assert same(ref_round(-0.0, e4m3, "up", "ieee", "keep"), -0.0)
    assert same(ref_round(-1e-9, e4m3, "up", "ieee", "keep"), -0.0)


# ----- the strategies themselves -----------------------------------------------------------------
SEEN: set[tuple[float, float]] = set()  # (value, sign): 0.0 and -0.0 apart


@settings(max_examples=400, deadline=None, derandomize=True)
@given(v=pls.values("e2m1"))
def collect_e2m1_values(v):
    SEEN.add((v, math.copysign(1.0, v)))


def test_values_reach_every_value_of_a_small_format():
    collect_e2m1_values()
    # (fmt.values() holds a single zero, whose sign is not reliable: add both zeros)
    vals = [*pl.get_format("e2m1").values().tolist(), -0.0, 0.0]
    assert {(v, math.copysign(1.0, v)) for v in vals} == SEEN


@SETTINGS
@given(data=st.data(), fmt=st.sampled_from(NAMED_SMALL))
def test_near_ties_are_midpoints_or_their_neighbours(data, fmt):
    f = pl.get_format(fmt)
    width = 32 if f.mantissa_bits <= 22 else 64
    x = data.draw(pls.floats_near_ties(f, width=width))
    dt = np.float32 if width == 32 else np.float64
    assert isinstance(x, dt)
    _, lo, hi = neighbours(f, Fraction(abs(float(x))))
    vals = f.values()
    assert float(lo) in vals and (float(hi) in vals or hi > f.max)  # adjacent values
    mid = dt(float((lo + hi) / 2))
    assert Fraction(float(mid)) == (lo + hi) / 2
    near = (mid, np.nextafter(mid, dt(0)), np.nextafter(mid, dt(np.inf)))
    assert abs(x) in near


@SETTINGS
@given(fmt=pls.formats())
def test_formats_are_valid(fmt):
    assert fmt.bits <= 16
    vals = fmt.values()
    assert vals.size >= 1 + fmt.has_zero and np.all(np.diff(vals) > 0)
    assert vals[-1] == fmt.max > 0 and fmt.max >= fmt.smallest_normal
    assert fmt.has_inf == (fmt.nan == "ieee")


def test_strategy_arguments_are_checked():
    with pytest.raises(ValueError, match="float32 values"):
        pls.floats_near_ties("fp32", width=32)
    with pytest.raises(ValueError, match="width must be 32 or 64"):
        pls.floats_near_ties("fp16", width=16)
    with pytest.raises(ValueError, match="max_bits"):
        pls.formats(max_bits=1)


def test_hypothesis_is_not_imported_by_the_package():
    import subprocess
    import sys

    code = "import sys, precision_lab; print('hypothesis' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ----- the core, property-tested -----------------------------------------------------------------
@SETTINGS
@given(data=st.data(), fmt=st.sampled_from(NAMED_FLOATS))
def test_decode_encode_round_trip_named(data, fmt):
    v = data.draw(pls.values(fmt))
    f = pl.get_format(fmt)
    got = float(pl.decode(pl.encode(np.float64(v), f), f)[()])
    assert same(got, v)
    c = data.draw(pls.codes(fmt))
    dv = pl.decode(np.array(c, dtype=f.code_dtype), f)
    assert same(float(pl.decode(pl.encode(dv, f), f)), float(dv))


@SETTINGS
@given(data=st.data(), fmt=pls.formats(max_bits=12))
def test_values_are_fixed_points_and_round_trip_custom(data, fmt):
    v = data.draw(pls.values(fmt))
    for mode in DETERMINISTIC:
        assert same(core(np.float64(v), fmt, mode), v)
    if not math.isnan(v) or fmt.has_nan:
        assert same(float(pl.decode(pl.encode(np.float64(v), fmt), fmt)), v)


@SETTINGS
@given(data=st.data(), fmt=pls.formats())
def test_core_matches_referee_near_ties_custom_formats(data, fmt):
    x = data.draw(pls.floats_near_ties(fmt, width=64))
    check_all_modes(x, fmt)


@SETTINGS
@given(data=st.data(), fmt=pls.formats(max_bits=10))
def test_core_matches_referee_anywhere_custom_formats(data, fmt):
    x = data.draw(st.one_of(st.floats(width=64), st.floats(width=32).map(np.float32)))
    check_all_modes(np.float64(x) if isinstance(x, float) else x, fmt)


@SETTINGS
@given(data=st.data(), fmt=st.sampled_from([*NAMED_SMALL, "tf32"]))
def test_core_matches_referee_near_ties_named_float32(data, fmt):
    f = pl.get_format(fmt)
    x = data.draw(pls.floats_near_ties(f, width=32))
    check_all_modes(x, f)
    x64 = data.draw(pls.floats_near_ties(f, width=64))
    check_all_modes(x64, f)


@SETTINGS
@given(data=st.data(), fmt=pls.formats(max_bits=12), mode=pls.rounding_modes())
def test_idempotent_monotone_and_between_neighbours(data, fmt, mode):
    xs = data.draw(
        st.lists(
            st.one_of(pls.floats_near_ties(fmt), st.floats(allow_nan=False).map(np.float64)),
            min_size=2,
            max_size=2,
        )
    )
    x = np.sort(np.array(xs, dtype=np.float64))
    r = pl.round_to(x, fmt, rounding=mode)
    r2 = pl.round_to(r, fmt, rounding=mode)
    np.testing.assert_array_equal(r, r2)  # idempotent (NaN == NaN here)
    finite = ~np.isnan(r)
    if finite.all():
        assert r[0] <= r[1]  # monotone
    vals = fmt.values()
    for xi, ri in zip(x, r, strict=True):
        if np.isnan(ri) or not vals[0] <= xi <= vals[-1]:
            continue
        lo = vals[np.searchsorted(vals, xi, side="right") - 1]
        hi = vals[np.searchsorted(vals, xi, side="left")]
        assert ri in (lo, hi)  # one of the two neighbours
        if mode in ("nearest_even", "nearest_away"):  # within half a spacing
            assert abs(Fraction(ri) - Fraction(xi)) <= (Fraction(hi) - Fraction(lo)) / 2


@SETTINGS
@given(
    data=st.data(),
    fmt=st.one_of(st.sampled_from(NAMED_FLOATS), pls.formats()),
    mode=pls.rounding_modes(stochastic=True, aliases=True),
)
def test_saturation_never_exceeds_max(data, fmt, mode):
    f = pl.get_format(fmt)
    x = data.draw(st.lists(st.floats(allow_nan=False), min_size=1, max_size=8))
    r = pl.round_to(np.array(x), f, rounding=mode, overflow="saturate", seed=1)
    ok = ~np.isnan(r)
    assert np.all(np.abs(r[ok]) <= f.max)
    if f.signed and f.has_zero:
        assert ok.all()


@SETTINGS
@given(data=st.data(), fmt=st.one_of(st.sampled_from(NAMED_SMALL), pls.formats()))
def test_exact_ties_go_to_even_and_away(data, fmt):
    f = pl.get_format(fmt)
    x = data.draw(pls.floats_near_ties(f))
    a = Fraction(abs(float(x)))
    if not f.has_zero and a < code_value(f, 0):
        return
    lo_code, lo, hi = neighbours(f, a)
    if a != (lo + hi) / 2 or hi > code_value(f, max_code(f)):
        return  # a neighbour of a tie, or the overflow threshold (covered by the referee tests)
    even = float(lo if lower_is_even(f, lo_code, lo, hi) else hi)
    sign = -1.0 if x < 0 else 1.0
    r_even = abs(core(x, f, "nearest_even"))
    r_away = abs(core(x, f, "nearest_away"))
    assert r_away == float(hi)
    assert r_even == even
    if f.mantissa_bits and hi < code_value(f, max_code(f)) and r_even != 0:
        code = int(pl.encode(np.float64(sign * r_even), f))
        assert code % 2 == 0  # the mantissa's last bit is 0
