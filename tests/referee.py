"""An independent, deliberately simple referee for rounding, written with exact rational arithmetic.

It knows nothing of the core's bit tricks: it lists a format's values from the format's definition,
finds the two neighbours of the exact input by bisection, and applies each rounding rule to exact
``fractions.Fraction`` distances. Slow, obviously right, and used as the oracle for the core.

Overflow (``overflow="ieee"``) follows IEEE 754 clause 7.4 in most formats: round to nearest and
the directed mode pointing outward give inf (NaN in a format without inf), ``toward_zero``, the
inward directed mode and ``odd`` (truncation with a sticky bit) give ``±max``. IEEE P3109 formats
(:func:`is_p3109`, from the P3109 interim report's format definition) follow P3109 instead: the
value is rounded with an unbounded exponent, and a result beyond ``max`` becomes inf (NaN in the
finite domain) in every mode but ``toward_zero`` and the inward directed mode, ``odd`` included.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

import numpy as np

from precision_lab.core.formats import FloatFormat, IntFormat

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
    p3109: bool  # overflow by P3109's rules (is_p3109)


def is_p3109(fmt: FloatFormat | IntFormat) -> bool:
    """Whether fmt is an IEEE P3109 format, from the interim report's definition of K-bit formats
    of precision P: subnormals and one zero always; signed: K - P exponent bits, bias
    2**(K - P - 1) (0 when K = P), the NaN on the negative-zero code; unsigned: K - P + 1 exponent
    bits, bias 2**(K - P), the NaN on the all-ones code; the extended domain has infinities on the
    codes next below the NaN, the finite domain none."""
    if not isinstance(fmt, FloatFormat) or not (fmt.has_zero and fmt.has_subnormals):
        return False
    k, p = fmt.bits, fmt.mantissa_bits + 1
    if fmt.signed:
        bias = 2 ** (k - p - 1) if k > p else 0
        return fmt.nan == "fnuz" and fmt.exponent_bits == k - p and fmt.bias == bias
    return fmt.nan == "fn" and fmt.exponent_bits == k - p + 1 and fmt.bias == 2 ** (k - p)


def _odd_keeps_max(g: Grid, a: Fraction) -> bool:
    """Round to odd of a magnitude a > max: does it stay at max? Always in the IEEE style; under
    P3109 only when max's code is odd and a lies below the next value of an unbounded exponent
    (else the unbounded result exceeds max, an overflow)."""
    return not g.p3109 or (g.max_code % 2 == 1 and a < g.next_above_max)


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
        is_p3109(fmt),
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
                if mm == "zero" or (mm == "odd" and _odd_keeps_max(g, a)):
                    r = g.max
                elif mm == "odd":
                    r = _overflow(g, o)
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
    p3109 = is_p3109(fmt)
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
    if r > Fraction(fmt.max):  # (kr is the rounding with an unbounded exponent)
        if overflow == "saturate" or finite_only or mm == "zero" or (mm == "odd" and not p3109):
            return sign * fmt.max
        return sign * math.inf if fmt.has_inf else math.nan
    if r == 0:
        return neg_zero if neg else 0.0
    return sign * float(r)


@cache
def _grid_arrays(fmt: FloatFormat) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The grid's values, codes and the midpoints between neighbours, as float64 arrays.

    Every midpoint is checked to be exact in float64 (against Fraction), so comparing an input
    with it in float64 is the exact comparison of :func:`referee_all`.
    """
    g = grid(fmt)
    values = np.array(g.values, dtype=np.float64)
    mids = [(Fraction(lo) + Fraction(hi)) / 2 for lo, hi in itertools.pairwise(g.values)]
    mids.append((Fraction(g.max) + g.next_above_max) / 2)  # between max and the value above
    assert all(Fraction(float(m)) == m for m in mids), f"{fmt}: a midpoint float64 cannot hold"
    return values, np.array(g.codes, dtype=np.int64), np.array([float(m) for m in mids])


def referee_table(x: np.ndarray, fmt: FloatFormat | IntFormat) -> dict[tuple[str, str], np.ndarray]:
    """:func:`referee_all` of every element of ``x`` at once, keyed like it, as float64 arrays.

    The same list-and-bisect rules, vectorised: the neighbours come from ``np.searchsorted`` on
    the format's value list, and a tie is decided by comparing the input with the exact float64
    midpoint of its neighbours (no subtraction, so nothing rounds). tests/core/test_referee.py
    checks it against :func:`referee_all` on a sample that holds every tie and both neighbours of
    every midpoint.
    """
    x = np.asarray(x, dtype=np.float64)
    if isinstance(fmt, IntFormat):
        return _int_table(x, fmt)
    g = grid(fmt)
    values, codes, mids = _grid_arrays(fmt)
    nan = np.isnan(x)
    neg = np.signbit(x)
    sign = np.where(neg, -1.0, 1.0)
    a = np.abs(x)
    with np.errstate(invalid="ignore"):
        over = ~nan & (a > g.max)  # inf included
    i = np.searchsorted(values, np.where(nan | over, 0.0, a), side="left")
    ic = np.minimum(i, len(values) - 1)
    exact = (i < len(values)) & (values[ic] == a)
    lo = values[np.maximum(i - 1, 0)]
    hi = values[ic]
    lo_odd = codes[np.maximum(i - 1, 0)] % 2 == 1
    mid = mids[np.maximum(i - 1, 0)]
    below, tie = a < mid, a == mid
    top_mid = mids[-1]
    max_even = g.max_code % 2 == 0
    overflow_value = {o: _overflow(g, o) for o in OVERFLOWS}
    out: dict[tuple[str, str], np.ndarray] = {}
    for m in DETERMINISTIC:
        # the rule on magnitudes: "up"/"down" depend on the sign (_magnitude_mode)
        rules = {False: _magnitude_mode(m, False), True: _magnitude_mode(m, True)}
        in_range = np.empty_like(a)
        to_max = np.empty(a.shape, dtype=bool)  # for inputs above max: keep max?
        for s, mm in rules.items():
            sel = neg == s
            if mm == "zero":
                r, keep = lo, np.ones_like(sel)
            elif mm == "away":
                r, keep = hi, np.zeros_like(sel)
            elif mm == "odd":  # above max: max, or under P3109 the unbounded result
                r = np.where(lo_odd, lo, hi)
                if g.p3109:
                    keep = (g.max_code % 2 == 1) & (a < float(g.next_above_max))
                else:
                    keep = np.ones_like(sel)
            else:
                tie_down = mm == "nearest_zero" or (mm == "nearest_even" and max_even)
                tie_lo = {"nearest_zero": True, "nearest_away": False}.get(mm)
                tie_r = lo if tie_lo else hi if tie_lo is not None else np.where(lo_odd, hi, lo)
                r = np.where(below, lo, np.where(tie, tie_r, hi))
                keep = (a < top_mid) | ((a == top_mid) & tie_down)
            in_range[sel] = r[sel]
            to_max[sel] = keep[sel]
        in_range = np.where(exact, a, np.where(i == 0, values[0], in_range))
        zero = in_range == 0
        signed_zero = -0.0 if g.neg_zero else 0.0
        in_range = np.where(zero, np.where(neg, signed_zero, 0.0), sign * in_range)
        for o in OVERFLOWS:
            big = np.where(to_max & ~np.isinf(x), g.max, overflow_value[o])
            r = np.where(over, sign * big, in_range)  # (NaN stays NaN)
            if not g.signed:  # negative inputs (and -0 when 0 is missing): NaN or the least value
                r = np.where(neg, np.where(x == 0, 0.0, math.nan if g.nan else g.values[0]), r)
            if not g.has_zero:
                r = np.where(x == 0, math.nan if g.nan else g.values[0], r)
            out[m, o] = np.where(nan, math.nan, r)
    return out


def _int_table(x: np.ndarray, fmt: IntFormat) -> dict[tuple[str, str], np.ndarray]:
    """:func:`_referee_int` vectorised. Exact: a float64 of magnitude >= 2**52 is a whole number
    (its floor is itself), and below that ``floor(x) + 0.5`` is a float64."""
    lo = np.floor(np.where(np.isfinite(x), x, 0.0))
    whole = lo == x
    hi = np.where(whole, lo, lo + 1)
    half = lo + 0.5
    pos = x > 0
    lo_even = lo % 2 == 0
    out = {}
    for m in DETERMINISTIC:
        if m == "toward_zero":
            k = np.where(pos, lo, hi)
        elif m == "up":
            k = hi
        elif m == "down":
            k = lo
        elif m == "odd":
            k = np.where(lo_even, hi, lo)
        else:
            tie_k = {
                "nearest_away": np.where(pos, hi, lo),
                "nearest_zero": np.where(pos, lo, hi),
                "nearest_even": np.where(lo_even, lo, hi),
            }[m]
            k = np.where(x < half, lo, np.where(x == half, tie_k, hi))
        k = np.where(whole, lo, k)
        k = np.clip(k, fmt.min, fmt.max) + 0.0  # (integers have one zero: -0.0 + 0.0 is +0.0)
        k = np.where(np.isinf(x), np.where(x > 0, float(fmt.max), float(fmt.min)), k)
        k = np.where(np.isnan(x), math.nan, k)
        for o in OVERFLOWS:
            out[m, o] = k
    return out


def round_in_range(
    x: Fraction, mantissa_bits: int, emin: int, mode: str = "nearest_even"
) -> Fraction:
    """``x`` rounded onto the binary grid of ``mantissa_bits`` fraction bits and exponent floor
    ``emin``, with no exponent ceiling (callers stay in range): ``nearest_even``,
    ``toward_zero``, ``up`` or ``down``. The in-range referee of the GEMM and quantizer tests."""
    if x == 0:
        return Fraction(0)
    ax = abs(x)
    e = ax.numerator.bit_length() - ax.denominator.bit_length()
    if Fraction(2) ** e > ax:  # the bit lengths put floor(log2 |x|) at e or e - 1
        e -= 1
    q = Fraction(2) ** (max(e, emin) - mantissa_bits)
    fl, rem = divmod(ax, q)
    up = {
        "nearest_even": rem * 2 > q or (rem * 2 == q and fl % 2 == 1),
        "toward_zero": False,
        "up": rem > 0 and x > 0,
        "down": rem > 0 and x < 0,
    }[mode]
    r = (fl + up) * q
    return r if x > 0 else -r


def fr_round(x: Fraction, fmt: FloatFormat, mode: str = "nearest_even") -> Fraction:
    """:func:`round_in_range` onto ``fmt``'s grid (no overflow handling: tests stay in range)."""
    return round_in_range(x, fmt.mantissa_bits, fmt.emin, mode)
