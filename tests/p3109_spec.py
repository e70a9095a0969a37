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
    if isinstance(x, float) and math.isnan(x):  # (no float() of a huge Fraction)
        return NAN
    z: float | Fraction = (
        x
        if ((isinstance(x, float) and math.isinf(x)) or x == 0)
        else v4_round(Fraction(x), p, bias, mode, r, n)
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
    if _nan(s) or _nan(x):
        return NAN
    z: float | Fraction
    if s == 0:
        z = Fraction(0)
    elif s in (INF, -INF):
        z = Fraction(_sgn(x) * _sgn(s))
    elif x in (INF, -INF):
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


# --- clause 5.3-5.5: block reductions, dot product, elementwise and scaled operations ---------
# The ω operations as their tables in clause 4 list them (first matching row), on closed
# extended reals: finite values as Fractions, ±inf and NaN as floats.


def _nan(v: float | Fraction) -> bool:
    return isinstance(v, float) and math.isnan(v)


def v4_w_add(x: float | Fraction, y: float | Fraction) -> float | Fraction:
    """ωAdd (the table of Add)."""
    if _nan(x) or _nan(y):
        return NAN
    if (x == INF and y == -INF) or (x == -INF and y == INF):
        return NAN
    if x == INF or y == INF:
        return INF
    if x == -INF or y == -INF:
        return -INF
    return x + y


def v4_w_subtract(x: float | Fraction, y: float | Fraction) -> float | Fraction:
    """ωSubtract (the table of Subtract)."""
    if _nan(x) or _nan(y):
        return NAN
    if (x == INF and y == INF) or (x == -INF and y == -INF):
        return NAN
    if y == INF:
        return -INF
    if x == INF:
        return INF
    if y == -INF:
        return INF
    if x == -INF:
        return -INF
    return x - y


def v4_w_multiply(x: float | Fraction, y: float | Fraction) -> float | Fraction:
    """ωMultiply (the table of Multiply)."""
    if _nan(x) or _nan(y):
        return NAN
    for a, b in ((x, y), (y, x)):  # the table is symmetric in its rows
        if a in (INF, -INF):
            if b == 0:
                return NAN
            return INF if (a > 0) == (b > 0) else -INF
    return x * y


def v4_w_divide(x: float | Fraction, y: float | Fraction) -> float | Fraction:
    """ωDivide (the table of Divide)."""
    if _nan(x) or _nan(y):
        return NAN
    if x in (INF, -INF) and y in (INF, -INF):
        return NAN
    if y == 0:
        return NAN
    if x in (INF, -INF):
        return INF if (x > 0) == (y > 0) else -INF
    if y in (INF, -INF):
        return Fraction(0)
    return Fraction(x) / Fraction(y)


def v4_w_fma(x: float | Fraction, y: float | Fraction, z: float | Fraction) -> float | Fraction:
    """ωFMA: "equivalent to the behavior of ωAdd(ωMultiply(X, Y), Z)" (the FMA clause)."""
    return v4_w_add(v4_w_multiply(x, y), z)


def v4_w_faa(x: float | Fraction, y: float | Fraction, z: float | Fraction) -> float | Fraction:
    """ωFAA (the table of FAA, first matching row)."""
    if _nan(x) or _nan(y) or _nan(z):
        return NAN
    for a, b in ((x, y), (x, z), (y, z)):
        if (a == INF and b == -INF) or (a == -INF and b == INF):
            return NAN
    if INF in (x, y, z):
        return INF
    if -INF in (x, y, z):
        return -INF
    return x + y + z


def v4_w_copysign(x: float | Fraction, y: float | Fraction) -> float | Fraction:
    """ωCopySign (the table of CopySign)."""
    if _nan(x) or _nan(y):
        return NAN
    if x in (INF, -INF):
        return INF if (y == INF or y >= 0) else -INF
    ax = x if x >= 0 else -x
    return ax if (y == INF or y >= 0) else -ax


def v4_w_minimum(x: float | Fraction, y: float | Fraction) -> float | Fraction:
    """ωMinimum (the table of Minimum)."""
    if _nan(x) or _nan(y):
        return NAN
    if x == INF and y == INF:
        return INF
    if x == -INF or y == -INF:
        return -INF
    if x == INF:
        return y
    if y == INF:
        return x
    return x if x < y else y


def v4_w_maximum(x: float | Fraction, y: float | Fraction) -> float | Fraction:
    """ωMaximum (the table of Maximum)."""
    if _nan(x) or _nan(y):
        return NAN
    if x == -INF and y == -INF:
        return -INF
    if x == INF or y == INF:
        return INF
    if x == -INF:
        return y
    if y == -INF:
        return x
    return y if x < y else x


def v4_w_minimum_number(x: float | Fraction, y: float | Fraction) -> float | Fraction:
    if _nan(x) and _nan(y):
        return NAN
    if _nan(y):
        return x
    if _nan(x):
        return y
    return v4_w_minimum(x, y)


def v4_w_maximum_number(x: float | Fraction, y: float | Fraction) -> float | Fraction:
    if _nan(x) and _nan(y):
        return NAN
    if _nan(y):
        return x
    if _nan(x):
        return y
    return v4_w_maximum(x, y)


def _absx(v: float | Fraction) -> float | Fraction:
    return -v if v < 0 else v


def v4_w_minimum_magnitude(x: float | Fraction, y: float | Fraction) -> float | Fraction:
    """ωMinimumMagnitude (its table, first matching row)."""
    if _nan(x) or _nan(y):
        return NAN
    if x == INF and y == INF:
        return INF
    if x == -INF and y == -INF:
        return -INF
    if (x == INF and y == -INF) or (x == -INF and y == INF):
        return -INF
    if x in (INF, -INF):
        return y
    if y in (INF, -INF):
        return x
    if _absx(x) < _absx(y):
        return x
    if _absx(x) > _absx(y):
        return y
    return x if x < y else y


def v4_w_maximum_magnitude(x: float | Fraction, y: float | Fraction) -> float | Fraction:
    """ωMaximumMagnitude (its table, first matching row)."""
    if _nan(x) or _nan(y):
        return NAN
    if x == INF or y == INF:
        return INF
    if x == -INF or y == -INF:
        return -INF
    if _absx(x) > _absx(y):
        return x
    if _absx(x) < _absx(y):
        return y
    return y if x < y else x


def v4_w_minimum_magnitude_number(x: float | Fraction, y: float | Fraction) -> float | Fraction:
    if _nan(y):
        return x
    if _nan(x):
        return y
    return v4_w_minimum_magnitude(x, y)


def v4_w_maximum_magnitude_number(x: float | Fraction, y: float | Fraction) -> float | Fraction:
    if _nan(y):
        return x
    if _nan(x):
        return y
    return v4_w_maximum_magnitude(x, y)


def _finite_rows(x, y, both_inf):  # type: ignore[no-untyped-def]
    """The rows MinimumFinite and MaximumFinite share (NaN and one-infinity rows)."""
    if _nan(x) and _nan(y):
        return NAN
    if _nan(x):
        return y
    if _nan(y):
        return x
    if x in (INF, -INF) and y in (INF, -INF):
        return both_inf
    if x in (INF, -INF):
        return y
    if y in (INF, -INF):
        return x
    return None


def v4_w_minimum_finite(x: float | Fraction, y: float | Fraction) -> float | Fraction:
    """ωMinimumFinite (its table: (+inf, +inf) -> +inf, (-inf, -inf) and mixed -> -inf; last
    row "if X < Y then X else Y")."""
    both = INF if (x == INF and y == INF) else -INF
    r = _finite_rows(x, y, both)
    if r is not None:
        return r
    return x if x < y else y


def v4_w_maximum_finite(x: float | Fraction, y: float | Fraction) -> float | Fraction:
    """ωMaximumFinite (its table; last row "if X < Y then Y else X")."""
    both = -INF if (x == -INF and y == -INF) else INF
    r = _finite_rows(x, y, both)
    if r is not None:
        return r
    return y if x < y else x


def v4_w_clamp(x: float | Fraction, lo: float | Fraction, hi: float | Fraction) -> float | Fraction:
    """ωClamp (its table, first matching row)."""
    if _nan(x) or _nan(lo) or _nan(hi):
        return NAN
    if lo > hi:
        return NAN
    if lo == INF and hi == INF:
        return INF
    if lo == -INF and hi == -INF:
        return -INF
    if hi == -INF:
        return NAN
    if lo == INF:
        return NAN
    if x == INF and hi == INF:
        return INF
    if x == INF:
        return hi
    if x == -INF and lo == -INF:
        return -INF
    if x == -INF:
        return lo
    if lo == -INF and hi == INF:
        return x
    if lo == -INF:
        return x if x <= hi else hi
    if hi == INF:
        return lo if x <= lo else x
    return lo if x <= lo else (hi if x >= hi else x)


V4_OPS = {
    "convert": lambda x: x,
    "abs": lambda x: x if _nan(x) else abs(x),
    "negate": lambda x: x if _nan(x) else -x,
    "add": v4_w_add,
    "subtract": v4_w_subtract,
    "multiply": v4_w_multiply,
    "divide": v4_w_divide,
    "fma": v4_w_fma,
    "faa": v4_w_faa,
    "copysign": v4_w_copysign,
    "minimum": v4_w_minimum,
    "maximum": v4_w_maximum,
    "minimum_number": v4_w_minimum_number,
    "maximum_number": v4_w_maximum_number,
    "minimum_magnitude": v4_w_minimum_magnitude,
    "maximum_magnitude": v4_w_maximum_magnitude,
    "minimum_magnitude_number": v4_w_minimum_magnitude_number,
    "maximum_magnitude_number": v4_w_maximum_magnitude_number,
    "minimum_finite": v4_w_minimum_finite,
    "maximum_finite": v4_w_maximum_finite,
    "clamp": v4_w_clamp,
}


def v4_reduce(f, xs: list) -> float | Fraction:  # type: ignore[no-untyped-def]
    """reduce (clause 5): reduce(f, [x1, x2]) = f(x1, x2); else reduce(f, [f(x1, x2), x3, ...])."""
    if len(xs) == 2:
        return f(xs[0], xs[1])
    return v4_reduce(f, [f(xs[0], xs[1]), *xs[2:]])


def v4_block_decode(s: float | Fraction, xs: list) -> list:
    """ωBlockDecode (5.1.1): Z_i = ωMultiply(ωDecode(s), ωDecode(x_i))."""
    return [v4_w_multiply(s, x) for x in xs]


def _ext(v: float) -> float | Fraction:
    return v if (math.isnan(v) or math.isinf(v)) else Fraction(v)


def v4_block_reduce_add(s: float, xs: list[float], fmt, mode, sat, r=0, n=0) -> float:  # type: ignore[no-untyped-def]
    """BlockReduceAdd (5.3.1)."""
    big = v4_reduce(v4_w_add, [Fraction(0), *v4_block_decode(_ext(s), [_ext(x) for x in xs])])
    return v4_project(big, fmt, mode, sat, r, n)  # type: ignore[arg-type]


def v4_block_reduce_multiply(s: float, xs: list[float], fmt, mode, sat, r=0, n=0) -> float:  # type: ignore[no-untyped-def]
    """BlockReduceMultiply (5.3.1)."""
    big = v4_reduce(v4_w_multiply, [Fraction(1), *v4_block_decode(_ext(s), [_ext(x) for x in xs])])
    return v4_project(big, fmt, mode, sat, r, n)  # type: ignore[arg-type]


def v4_block_dot(sx, xs, sy, ys, fmt, mode, sat, r=0, n=0) -> float:  # type: ignore[no-untyped-def]
    """BlockDotProduct (5.3.2)."""
    bx = v4_block_decode(_ext(sx), [_ext(v) for v in xs])
    by = v4_block_decode(_ext(sy), [_ext(v) for v in ys])
    ps = [v4_w_multiply(a, b) for a, b in zip(bx, by, strict=True)]
    return v4_project(v4_reduce(v4_w_add, [Fraction(0), *ps]), fmt, mode, sat, r, n)  # type: ignore[arg-type]


def v4_block_op(op: str, operands: list, sr: float, fmt, mode, sat, rs=None, n=0) -> list[float]:  # type: ignore[no-untyped-def]
    """BlockOp (5.4): Z_i = ωOp(X_1i, ..., X_ni), then ωBlockProject(sr, Z) (5.1.2)."""
    dec = [v4_block_decode(_ext(s), [_ext(v) for v in xs]) for s, xs in operands]
    zs = [V4_OPS[op](*col) for col in zip(*dec, strict=True)]
    rs = rs if rs is not None else [0] * len(zs)
    return [v4_block_project(sr, z, fmt, mode, sat, r, n) for z, r in zip(zs, rs, strict=True)]  # type: ignore[arg-type]
