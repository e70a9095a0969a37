"""An independent, deliberately simple referee for rounding, written with exact rational arithmetic.

It knows nothing of the core's bit tricks: it lists a format's values from the format's definition,
finds the two neighbours of the exact input by bisection, and applies each rounding rule to exact
``fractions.Fraction`` distances. Slow, obviously right, and used as the oracle for the core.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

from precision_lab.formats import FloatFormat, IntFormat

DETERMINISTIC = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd", "nearest_zero")
OVERFLOWS = ("ieee", "saturate")
KEYS = [(m, o) for m in DETERMINISTIC for o in OVERFLOWS]


@dataclass(frozen=True)
class Grid:
    """Non-negative finite magnitudes of a format, ascending, with their magnitude codes."""

    values: tuple[float, ...]  # exact (every value of a <= 64-bit format is a float64)
    codes: tuple[int, ...]
    max: float
    max_code: int
    next_above_max: Fraction  # the value max + ulp(max) would have with an unbounded exponent
    has_zero: bool
    signed: bool
    neg_zero: bool  # does the format hold -0?
    inf: bool
    nan: bool


@cache
def grid(fmt: FloatFormat | IntFormat) -> Grid:
    assert isinstance(fmt, FloatFormat)
    e, m, bias = fmt.exponent_bits, fmt.mantissa_bits, fmt.bias
    assert bias is not None
    pairs = []
    for code in range(1 << (e + m)):  # magnitude codes, sign bit clear
        ef, frac = code >> m, code % (1 << m)
        if fmt.nan == "ieee" and ef == (1 << e) - 1:
            continue  # inf and NaN
        if fmt.nan == "fn" and code == (1 << (e + m)) - 1:
            continue  # the NaN code
        if fmt.has_inf and fmt.nan != "ieee" and code == fmt.inf_code:
            continue  # P3109 extended domain: inf next to the NaN code
        if ef == 0 and fmt.has_zero:
            if frac and not fmt.has_subnormals:
                continue
            value = Fraction(frac, 1 << m) * Fraction(2) ** (1 - bias)
        else:
            value = (1 + Fraction(frac, 1 << m)) * Fraction(2) ** (ef - bias)
        pairs.append((value, code))
    pairs.sort()
    top, top_code = pairs[-1]
    ulp_top = Fraction(2) ** (max(top_code >> m, 1) - bias - m)  # a subnormal top: field 1
    return Grid(
        tuple(float(v) for v, _ in pairs),
        tuple(c for _, c in pairs),
        float(top),
        top_code,
        top + ulp_top,
        fmt.has_zero,
        fmt.signed,
        fmt.signed and fmt.has_zero and fmt.nan != "fnuz",
        fmt.has_inf,
        fmt.nan != "none",
    )


def _magnitude_mode(mode: str, neg: bool) -> str:
    if mode == "up":
        return "zero" if neg else "away"
    if mode == "down":
        return "away" if neg else "zero"
    if mode == "toward_zero":
        return "zero"
    return mode


def _overflow(g: Grid, overflow: str) -> float:
    if overflow == "saturate" or not (g.inf or g.nan):
        return g.max
    return math.inf if g.inf else math.nan


def referee(x: float, fmt: FloatFormat | IntFormat, mode: str, overflow: str = "ieee") -> float:
    """The correctly rounded value of x in fmt (a Python float; NaN for NaN results)."""
    return referee_all(x, fmt)[mode, overflow]


def referee_all(x: float, fmt: FloatFormat | IntFormat) -> dict[tuple[str, str], float]:
    """:func:`referee` for every deterministic mode and both overflow switches at once."""
    if isinstance(fmt, IntFormat):
        return {(m, o): _referee_int(x, fmt, m) for m in DETERMINISTIC for o in OVERFLOWS}
    g = grid(fmt)
    if math.isnan(x):
        return dict.fromkeys(KEYS, math.nan)
    neg = math.copysign(1.0, x) < 0
    if neg and not g.signed:  # unsigned: negative numbers (and -0 when 0 is missing) are NaN,
        if x == 0 and g.has_zero:  # or the least value in a format without NaN
            return dict.fromkeys(KEYS, 0.0)
        return dict.fromkeys(KEYS, math.nan if g.nan else g.values[0])
    sign = -1.0 if neg else 1.0
    if math.isinf(x):
        res = {}
        for o in OVERFLOWS:
            if o == "saturate" or not (g.inf or g.nan):
                r = sign * g.max
            else:
                r = sign * math.inf if g.inf else math.nan
            res.update({(m, o): r for m in DETERMINISTIC})
        return res
    if x == 0 and not g.has_zero:  # NaN, or the least value in a format without NaN
        return dict.fromkeys(KEYS, math.nan if g.nan else g.values[0])
    a = Fraction(abs(x))
    res = {}
    if a > Fraction(g.max):
        mid = (Fraction(g.max) + g.next_above_max) / 2
        max_is_even = g.max_code % 2 == 0
        for m in DETERMINISTIC:
            mm = _magnitude_mode(m, neg)
            for o in OVERFLOWS:
                if mm in ("zero", "odd"):
                    r = g.max
                elif mm == "away":
                    r = _overflow(g, o)
                elif a < mid or (
                    a == mid and (mm == "nearest_zero" or (mm == "nearest_even" and max_is_even))
                ):
                    r = g.max
                else:
                    r = _overflow(g, o)
                res[m, o] = r if math.isnan(r) else sign * r
        return res
    i = bisect.bisect_left(g.values, abs(x))
    exact = i < len(g.values) and g.values[i] == abs(x)
    for m in DETERMINISTIC:
        mm = _magnitude_mode(m, neg)
        if exact:
            r = g.values[i]
        elif i == 0:  # below the smallest value of a format without zero (e8m0)
            r = g.values[0]
        else:
            lo, hi = g.values[i - 1], g.values[i]
            lo_code = g.codes[i - 1]
            if mm == "zero":
                r = lo
            elif mm == "away":
                r = hi
            elif mm == "odd":
                r = lo if lo_code % 2 else hi
            else:
                below, above = a - Fraction(lo), Fraction(hi) - a
                if below != above:
                    r = lo if below < above else hi
                elif mm == "nearest_away":
                    r = hi
                elif mm == "nearest_zero":
                    r = lo
                else:
                    r = lo if lo_code % 2 == 0 else hi
        if r == 0:
            r = -0.0 if neg and g.neg_zero else 0.0
        else:
            r = sign * r
        res.update({(m, o): r for o in OVERFLOWS})
    return res


def _referee_int(x: float, fmt: IntFormat, mode: str) -> float:
    """Integers: round the exact value to an integer by the mode, then clamp (always saturate)."""
    if math.isnan(x):
        return math.nan
    if math.isinf(x):
        return float(fmt.max if x > 0 else fmt.min)
    a = Fraction(x)
    lo = math.floor(a)
    hi = lo if lo == a else lo + 1
    if lo == hi:
        k = lo
    elif mode == "toward_zero":
        k = lo if a > 0 else hi
    elif mode == "up":
        k = hi
    elif mode == "down":
        k = lo
    elif mode == "odd":
        k = lo if lo % 2 else hi
    else:
        below, above = a - lo, hi - a
        if below != above:
            k = lo if below < above else hi
        elif mode == "nearest_away":
            k = hi if a > 0 else lo
        elif mode == "nearest_zero":
            k = lo if a > 0 else hi
        else:
            k = lo if lo % 2 == 0 else hi
    return float(min(max(k, fmt.min), fmt.max))


def referee_formula(x: float, fmt: FloatFormat, mode: str, overflow: str = "ieee") -> float:
    """The same rules by formula rather than by list, for formats of any width.

    For signed formats with zero and subnormals (IEEE-like, fn, fnuz, finite): the result is
    ``k * q`` with ``q = 2**(max(e, emin) - mantissa_bits)``, the quantum of the exact
    input's binade.
    """
    assert fmt.signed and fmt.has_zero and fmt.has_subnormals
    if math.isnan(x):
        return math.nan
    neg = math.copysign(1.0, x) < 0
    sign = -1.0 if neg else 1.0
    finite_only = not (fmt.has_inf or fmt.nan != "none")
    if math.isinf(x):
        if overflow == "saturate" or finite_only:
            return sign * fmt.max
        return sign * math.inf if fmt.has_inf else math.nan
    neg_zero = -0.0 if fmt.nan != "fnuz" else 0.0
    if x == 0:
        return neg_zero if neg else 0.0
    a = Fraction(abs(x))
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    q = Fraction(2) ** (max(e, fmt.emin) - fmt.mantissa_bits)
    k = a / q
    lo = math.floor(k)
    mm = _magnitude_mode(mode, neg)
    if k == lo:
        kr = lo
    elif mm == "zero":
        kr = lo
    elif mm == "away":
        kr = lo + 1
    elif mm == "odd":
        kr = lo if lo % 2 else lo + 1
    elif k - lo != Fraction(1, 2):
        kr = lo if k - lo < Fraction(1, 2) else lo + 1
    elif mm == "nearest_away":
        kr = lo + 1
    elif mm == "nearest_zero":
        kr = lo
    else:
        kr = lo if lo % 2 == 0 else lo + 1
    r = kr * q
    if r > Fraction(fmt.max):
        if overflow == "saturate" or finite_only or mm in ("zero", "odd"):
            return sign * fmt.max
        return sign * math.inf if fmt.has_inf else math.nan
    if r == 0:
        return neg_zero if neg else 0.0
    return sign * float(r)
