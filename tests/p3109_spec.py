"""The IEEE P3109 interim report 4.0 (2026) transcribed into exact rational arithmetic: an oracle.

Written from the report alone (github.com/P3109/Public, "IEEE P3109 WG Interim Report.pdf"):
clause 3 (format parameters: K > 2; 0 < P < K signed, P <= K unsigned; bias ``2**(K-P-1)``
signed, ``2**(K-P)`` unsigned), 4.7.6 ``ωDecode`` (NaN on the negative-zero code of signed
formats and the all-ones code of unsigned ones; the extended domain's infinities next to it),
4.7.4 ``ωRoundToPrecision`` (its ``RoundAway`` rules, StochasticA/B/C; 3.1's StochasticOdd as
gfloat 0.5.2 has it) and 4.7.5 ``ωSaturate`` (its table, first matching row). It knows nothing of
precision_lab. tests/core/test_p3109_tables.py checks ``v4_decode`` against the working group's
published value tables; tests/core/test_p3109_v4.py checks precision_lab against this module.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import cache

INF, NAN = math.inf, math.nan


def v4_formats(k: int) -> list[tuple[int, int, bool, bool]]:
    """(K, P, signed, extended) of every K-bit format 4.0 defines: 0 < P < K signed, P <= K
    unsigned (clause 3)."""
    out = []
    for p in range(1, k + 1):
        for signed in (True, False):
            if signed and p == k:
                continue
            for ext in (True, False):
                out.append((k, p, signed, ext))
    return out


def v4_decode(code: int, k: int, p: int, signed: bool, ext: bool) -> float | Fraction:
    """ωDecode: the datum of a code point (inf/NaN as floats, finite values as Fractions)."""
    bias = 2 ** (k - p - 1) if signed else 2 ** (k - p)
    if signed:
        if code == 2 ** (k - 1):
            return NAN
        if ext and code == 2 ** (k - 1) - 1:
            return INF
        if ext and code == 2**k - 1:
            return -INF
        sign, mag = code >> (k - 1), code % 2 ** (k - 1)
    else:
        if code == 2**k - 1:
            return NAN
        if ext and code == 2**k - 2:
            return INF
        sign, mag = 0, code
    e, t = mag >> (p - 1), mag % 2 ** (p - 1)
    s = t if e == 0 else 2 ** (p - 1) + t
    v = Fraction(s) * Fraction(2) ** (max(e, 1) - bias + 1 - p)
    return -v if sign else v


@cache
def v4_range(k: int, p: int, signed: bool, ext: bool) -> tuple[Fraction, Fraction]:
    vals = [v4_decode(c, k, p, signed, ext) for c in range(2**k)]
    fin = [v for v in vals if isinstance(v, Fraction)]
    return min(fin), max(fin)


def _rnit(x: Fraction, odd: bool) -> int:
    f = math.floor(x)
    if x - f != Fraction(1, 2):
        return f + (x - f > Fraction(1, 2))
    return f + ((f % 2 == 0) == odd)  # a tie: to the even (odd) neighbour


def v4_round(x: Fraction, p: int, bias: int, mode: str, r: int = 0, n: int = 0) -> Fraction:
    """ωRoundToPrecision (4.7.4) of a nonzero finite x; ``r`` the random integer of N bits."""
    ax = abs(x)
    q = max(math.floor(math.log2(ax)), 1 - bias) - p + 1
    while Fraction(2) ** (q + p - 1) > ax and q > 1 - bias - p + 1:  # floor(log2) exactly
        q -= 1
    while Fraction(2) ** (q + p) <= ax:
        q += 1
    st = ax / Fraction(2) ** q
    fl = math.floor(st)
    nu = st - fl
    even = (fl % 2 == 0) if p > 1 else (fl == 0 or (q + bias) % 2 == 0)
    away = {
        "toward_zero": False,
        "up": nu > 0 and x > 0,
        "down": nu > 0 and x < 0,
        "nearest_away": nu >= Fraction(1, 2),
        "nearest_even": nu > Fraction(1, 2) or (nu == Fraction(1, 2) and not even),
        "odd": nu > 0 and even,
        "stochastic": math.floor(nu * 2**n) + r >= 2**n,  # StochasticA
        "stochastic_offset": math.floor(nu * 2 ** (n + 1)) + 2 * r + 1 >= 2 ** (n + 1),  # B
        "stochastic_corrected": _rnit(nu * 2**n, False) + r >= 2**n,  # C
        "stochastic_corrected_odd": _rnit(nu * 2**n, True) + r >= 2**n,  # 3.1 StochasticOdd
    }[mode]
    z = (fl + away) * Fraction(2) ** q
    return z if x > 0 else -z


def v4_saturate(
    sat: str, mode: str, z: float | Fraction, lo: Fraction, hi: Fraction, signed: bool, ext: bool
) -> float | Fraction:
    """ωSaturate (4.7.5), first matching row."""
    if isinstance(z, float) and math.isnan(z):
        return NAN
    if not isinstance(z, float) and lo <= z <= hi:
        return z
    pinf, ninf = z == INF, z == -INF
    if sat == "sat_finite":
        return hi if (pinf or z > hi) else lo
    if sat == "sat_propagate":
        if pinf:
            return INF if ext else hi
        if ninf:
            return -INF if (signed and ext) else lo
        return lo if z < lo else hi
    # sat_none
    if pinf:
        return INF if ext else hi
    if ninf:
        if signed and ext:
            return -INF
        return NAN if not signed else lo
    if mode == "odd" and not signed and ext and z > hi:
        return hi
    if mode in ("toward_zero", "down") and z > hi:
        return hi
    if mode in ("toward_zero", "up") and z < lo:
        return lo
    if z < lo:
        if signed and ext:
            return -INF
        return NAN if not signed else lo
    return INF if ext else hi


def v4_project(
    x: float, fmt: tuple[int, int, bool, bool], mode: str, sat: str, r: int = 0, n: int = 0
) -> float:
    k, p, signed, ext = fmt
    bias = 2 ** (k - p - 1) if signed else 2 ** (k - p)
    if math.isnan(x):
        return NAN
    z: float | Fraction = (
        x if (math.isinf(x) or x == 0) else v4_round(Fraction(x), p, bias, mode, r, n)
    )
    if z == 0:
        z = Fraction(0)
    lo, hi = v4_range(k, p, signed, ext)
    return float(v4_saturate(sat, mode, z, lo, hi, signed, ext))


def _sgn(v: float | Fraction) -> int:
    return int(v > 0) - int(v < 0)


def v4_block_project(
    s: float,
    x: float,
    fmt: tuple[int, int, bool, bool],
    mode: str,
    sat: str,
    r: int = 0,
    n: int = 0,
) -> float:
    """ωBlockProject (5.1.2) of one element ``x`` under the scale ``s`` (both exact floats)."""
    if math.isnan(s) or math.isnan(x):
        return NAN
    z: float | Fraction
    if s == 0:
        z = Fraction(0)
    elif math.isinf(s):
        z = Fraction(_sgn(x) * _sgn(s))
    elif math.isinf(x):
        z = x * _sgn(s)  # ωDivide(±inf, finite non-zero S)
    else:
        z = Fraction(x) / Fraction(s)
    return v4_project(z, fmt, mode, sat, r, n)  # type: ignore[arg-type]


def v4_max_abs_finite(xs: list[float]) -> float:
    """reduce(ωMaximumFinite, [NaN, |X_1|, ..., |X_B|]) (5.2.3, 4.7 of MaximumFinite)."""
    fin = [abs(v) for v in xs if math.isfinite(v)]
    if fin:
        return max(fin)
    return INF if any(math.isinf(v) for v in xs) else NAN
