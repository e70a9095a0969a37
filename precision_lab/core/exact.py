"""Exact sums in float64 and their single rounding onto a format (helpers of the GEMM models).

``x + y`` of two float64 numbers is held exactly as the pair ``s + t`` (two-sum: ``s`` the
float64 sum, ``t`` its rounding error). :func:`round_sum` rounds ``s + t`` onto a format once:

* non-stochastic modes: round-to-odd at 53 bits (:func:`odd_collapse`) and then
  :func:`~precision_lab.round_to`; exact for formats of at most 51 significant bits (Boldo &
  Melquiond: rounding to odd at p + 2 bits and then to p bits is a correct rounding);
* stochastic: the two neighbours come from :func:`~precision_lab.round_to` and the choice is the
  core's rule ``floor(f * 2**64) + R >= 2**64`` with the exact fraction ``f``, computed from the
  pair in integer arithmetic, and caller-supplied random words ``R``.

>>> import numpy as np
>>> s, t = two_sum(np.array([1.0]), np.array([2.0**-60]))
>>> float(s[0]), float(t[0])
(1.0, 8.673617379884035e-19)
>>> float(round_sum(s, t, Rounder("fp32", "up"))[0]) == 1.0 + 2.0**-23
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .formats import FloatFormat, get_format
from .random_words import random_words
from .rounding import is_stochastic, round_to

__all__ = [
    "SPLIT",
    "Rounder",
    "odd_collapse",
    "quantum_exponent",
    "round_sum",
    "stochastic_words",
    "two_product_error",
    "two_sum",
]


#: 2**27 + 1, Veltkamp's splitting constant for float64
SPLIT = 134217729.0


def two_product_error(a: np.ndarray, b: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``a * b - p`` exactly, for ``p = fl(a * b)`` in float64 (Dekker; no overflow or underflow).

    >>> a = np.float64(1 + 2.0**-30)
    >>> float(two_product_error(a, a, a * a)) == 2.0**-60
    True
    """
    ca, cb = SPLIT * a, SPLIT * b
    ah = ca - (ca - a)
    bh = cb - (cb - b)
    al, bl = a - ah, b - bh
    return ((ah * bh - p) + ah * bl + al * bh) + al * bl


def two_sum(x: np.ndarray, y: np.ndarray, *, down: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(s, t)`` with ``s = fl(x + y)`` and ``s + t == x + y`` exactly (Knuth's TwoSum).

    Non-finite ``s`` gives ``t = 0``. An exact zero sum is ``+0`` (``(-0) + (-0)`` is ``-0``);
    with ``down`` (the sum is to be rounded toward -inf) it is ``-0`` unless both addends are
    ``+0`` (IEEE 754-2019 6.3), computed as ``-((-x) + (-y))``: float64 addition rounds to
    nearest, which is symmetric, so only the signs of zeros change.

    >>> s, t = two_sum(np.array([1.0, 0.0]), np.array([-1.0, 0.0]), down=True)
    >>> s.tolist(), t.tolist()
    ([-0.0, 0.0], [0.0, 0.0])
    """
    if down:
        s, t = two_sum(-x, -y)
        return -s, -t
    with np.errstate(invalid="ignore", over="ignore"):
        s = x + y
        bb = s - x
        t = (x - (s - bb)) + (y - bb)
    np.copyto(t, 0.0, where=~np.isfinite(t))
    return s, t


def odd_collapse(s: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The 53-bit round-to-odd of the exact ``s + t`` (``s = fl(s + t)``), as float64.

    ``s`` is moved one ulp toward zero when ``t`` points toward zero, and its last bit is set
    when ``t != 0``.
    """
    inexact = t != 0
    if not inexact.any():
        return s
    bits = s.view(np.int64)
    inward = inexact & (np.signbit(t) != np.signbit(s))
    out = (bits - inward.view(np.int8)) | inexact.view(np.int8)
    return out.view(np.float64)


@dataclass(frozen=True)
class Rounder:
    """One rounding step of a model: format, mode, overflow/subnormal switches, random words.

    ``overflow`` takes :func:`~precision_lab.round_to`'s ``"ieee"`` and ``"saturate"``, and
    ``"infinity"``: as ``"ieee"``, and a value at or beyond ``max + ulp(max)`` (the next point
    of the grid without an exponent bound) gives ±inf (NaN in a format without inf) in every
    rounding mode, as a truncating datapath does. ``zero_sign="positive"`` makes every zero
    result ``+0`` (``"ieee"``: the sign IEEE 754 gives it).

    >>> r = Rounder("fp16", "toward_zero", overflow="infinity")
    >>> r.round(np.array([65519.0, 65536.0, -1e6])).tolist()
    [65504.0, inf, -inf]
    >>> Rounder("fp16", zero_sign="positive").round(np.array([-1e-9])).tolist()
    [0.0]
    """

    fmt: FloatFormat | str
    mode: str = "nearest_even"
    overflow: str = "ieee"
    subnormals: str = "keep"
    seed: int = 0
    random_bits: int | None = None
    zero_sign: str = "ieee"

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", get_format(self.fmt))
        if self.overflow not in ("ieee", "saturate", "infinity"):
            raise ValueError(
                f"overflow must be one of ieee, saturate, infinity, got {self.overflow!r}"
            )
        if self.zero_sign not in ("ieee", "positive"):
            raise ValueError(f"zero_sign must be one of ieee, positive, got {self.zero_sign!r}")

    @cached_property
    def fp64_native(self) -> bool:
        """float64 RN is the answer (fp64 with nearest_even)."""
        return self.fmt == get_format("fp64") and self.mode == "nearest_even"

    @property
    def core_overflow(self) -> str:
        """The overflow switch handed to :func:`~precision_lab.round_to`."""
        return "ieee" if self.overflow == "infinity" else self.overflow

    @cached_property
    def overflow_threshold(self) -> float:
        """``max + ulp(max)``: from there on every rounding overflows with ``"infinity"``
        (float64 inf for fp64)."""
        fmt = self.fmt
        assert isinstance(fmt, FloatFormat)
        with np.errstate(over="ignore"):
            return float(np.float64(fmt.max) + np.float64(2.0 ** (fmt.emax - fmt.mantissa_bits)))

    def finish(self, z: np.ndarray, out: np.ndarray) -> np.ndarray:
        """The rounding ``out`` of the exact (or 53-bit round-to-odd) ``z`` with this
        rounder's ``"infinity"`` overflow and zero sign applied."""
        if self.overflow == "infinity":
            with np.errstate(invalid="ignore"):
                big = np.abs(z) >= self.overflow_threshold
            if big.any():
                over = round_to(np.where(big, z, 0.0), self.fmt, overflow="ieee")
                out = np.where(big, over, out)
        if self.zero_sign == "positive":
            out = out + 0.0
        return out

    def round(self, x: np.ndarray, words: np.ndarray | None = None) -> np.ndarray:
        """Round float64 ``x`` (exact values) onto the format (float64 result)."""
        if is_stochastic(self.mode):
            return round_sum(x, np.zeros_like(x), self, words)
        r = round_to(
            x,
            self.fmt,
            rounding=self.mode,
            overflow=self.core_overflow,
            subnormals=self.subnormals,
        )
        if self.overflow == "ieee" and self.zero_sign == "ieee":
            return r
        return self.finish(x, r)  # (numpy or CuPy arrays: finish dispatches on them)


def stochastic_words(
    seed: int, event: int, total: int, shape: tuple[int, ...], random_bits: int | None
) -> np.ndarray:
    """Random words of rounding event ``event`` for ``total`` output elements (word ``e*T+i``)."""
    w = random_words(seed, total, event * total)
    if random_bits is not None and random_bits < 64:
        w &= np.uint64(((1 << 64) - 1) ^ ((1 << (64 - random_bits)) - 1))
    return w.reshape(shape)


def quantum_exponent(trunc: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """Exponent of the quantum of ``fmt`` at the (on-grid, finite) values ``trunc``: that of
    their binade, or the format's subnormal quantum below the normal range."""
    sub_m = fmt.mantissa_bits if fmt.has_subnormals else 0
    e = np.frexp(trunc)[1] - 1
    return np.where((trunc != 0) & (e >= fmt.emin), e - fmt.mantissa_bits, fmt.emin - sub_m)


def _toward_zero_pair(s: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Float64 truncation (round toward zero at 53 bits) of the exact ``s + t``."""
    inward = (t != 0) & (np.signbit(t) != np.signbit(s))
    return (s.view(np.int64) - inward.view(np.int8)).view(np.float64)


def _round_sum_fp64(s: np.ndarray, t: np.ndarray, r: Rounder) -> np.ndarray:
    """Deterministic modes onto fp64 itself (``s = RN(s + t)``): the neighbour of ``s`` on
    ``t``'s side, or ``s``."""
    mode = r.mode
    with np.errstate(invalid="ignore", over="ignore"):
        side = np.nextafter(s, np.where(t > 0, np.inf, -np.inf))
        if mode == "odd":
            z = odd_collapse(s, t)
        elif mode == "toward_zero":
            z = _toward_zero_pair(s, t)
        elif mode == "up":
            z = np.where(t > 0, side, s)
        elif mode == "down":
            z = np.where(t < 0, side, s)
        elif mode in ("nearest_away", "nearest_zero"):  # RNE's tie went to the even neighbour
            tie = (t != 0) & (2 * np.abs(t) == np.abs(side - s))
            outward = np.signbit(t) == np.signbit(s)  # the side neighbour is the outer one
            z = np.where(tie & (outward if mode == "nearest_away" else ~outward), side, s)
        else:
            z = s
    # z is on the float64 grid: this applies the mode's overflow rule and the subnormal switch
    return round_to(z, r.fmt, rounding=mode, overflow=r.core_overflow, subnormals=r.subnormals)


def round_sum(
    s: np.ndarray, t: np.ndarray, r: Rounder, words: np.ndarray | None = None
) -> np.ndarray:
    """Round the exact ``s + t`` (a two-sum pair, float64) onto ``r.fmt`` once (float64 result).

    ``s`` need only be a float64 neighbour of the exact value (``|t|`` below one ulp of ``s``)
    for formats of at most 51 significant bits; for fp64 itself ``s`` must be ``RN(s + t)``.
    """
    out = _round_sum(s, t, r, words)
    if r.overflow == "ieee" and r.zero_sign == "ieee":
        return out
    return r.finish(odd_collapse(s, t), out)


def _round_sum(
    s: np.ndarray, t: np.ndarray, r: Rounder, words: np.ndarray | None = None
) -> np.ndarray:
    """:func:`round_sum` with round_to's overflow switch (``"infinity"`` as ``"ieee"``)."""
    fmt = r.fmt
    ov = r.core_overflow
    assert isinstance(fmt, FloatFormat)
    if r.fp64_native:
        return round_to(s, fmt, overflow=ov, subnormals=r.subnormals)
    wide = fmt.precision > 51
    if not is_stochastic(r.mode):
        if wide:
            return _round_sum_fp64(s, t, r)
        z = odd_collapse(s, t)
        return round_to(z, fmt, rounding=r.mode, overflow=ov, subnormals=r.subnormals)
    if words is None:
        raise ValueError("stochastic rounding needs random words")
    z = odd_collapse(s, t)
    if wide:
        trunc = _toward_zero_pair(s, t)
    else:
        trunc = round_to(z, fmt, rounding="toward_zero", overflow=ov).astype(np.float64)
    finite = np.isfinite(s) & np.isfinite(trunc)
    qexp = quantum_exponent(np.where(finite, trunc, 0.0), fmt)
    # exact discarded fraction: d = |s + t| - |trunc| = (|s| - |trunc|) + sign(s) * t
    with np.errstate(invalid="ignore", over="ignore"):
        d1 = np.abs(s) - np.abs(trunc)  # exact (Sterbenz), a multiple of ulp(s)
        st = np.where(np.signbit(s), -t, t)
        d1s = np.ldexp(np.where(finite, d1, 0.0), 64 - qexp)  # integer < 2**64
        ts = np.floor(np.ldexp(np.where(finite, st, 0.0), 64 - qexp))
    # d1s can reach 2**64 (when s rounded up onto the next grid point); keep it mod 2**64:
    # the true fraction is below 2**64, so the modular sum is exact
    d1u = np.where(d1s >= 2.0**64, 0.0, d1s).astype(np.uint64)
    frac = d1u + ts.astype(np.int64).view(np.uint64)
    if r.mode == "stochastic_equal":  # inexact: away iff the top random bit is set
        away = finite & (frac != 0) & ((words >> np.uint64(63)) == 1)
    else:
        away = finite & (frac != 0) & (words >= np.uint64(0) - frac)
    # beyond the largest value plus one quantum, every rounding of the unbounded grid overflows
    # (trunc was clamped to max, so frac above says nothing): as round_to does, overflow per the
    # overflow switch, which round-to-nearest gives too
    top = fmt.max + math.ldexp(1.0, fmt.emax - fmt.mantissa_bits)  # on float64's grid (or inf)
    beyond = finite & ((np.abs(s) > top) | ((np.abs(s) == top) & (st >= 0)))
    step = np.ldexp(np.where(np.signbit(z), -1.0, 1.0), qexp)
    with np.errstate(over="ignore"):  # trunc + step may pass the float64 range (fp64 itself)
        up = round_to(np.where(away, trunc + step, trunc), fmt, overflow=ov)
    out = np.where(finite, up, round_to(s, fmt, overflow=ov))
    if beyond.any():
        out = np.where(beyond, round_to(np.where(beyond, z, 0.0), fmt, overflow=ov), out)
    if r.subnormals == "flush":
        out = round_to(out, fmt, subnormals="flush", overflow=ov)
    return out.astype(np.float64)


def _shifted(fmt: FloatFormat, k: int, keep: str) -> FloatFormat:
    """A format whose values are ``fmt``'s times ``2**k`` at the end ``keep`` ("top": the
    largest values, their grid and overflow; "bottom": the smallest, their grid and underflow),
    with as few exponent bits fewer as float64 needs (the other end is then nearer)."""
    import dataclasses

    m = fmt.mantissa_bits
    for e in range(fmt.exponent_bits, 1, -1):
        if fmt.nan == "ieee":
            top_field = (1 << e) - 2
        else:  # as FloatFormat.max_code_magnitude
            code = (1 << (e + m)) - 1 - int(fmt.nan == "fn") - int(fmt.has_inf)
            top_field = code >> m
        if keep == "top":
            bias = top_field - (fmt.emax + k)
        else:
            bias = (1 if fmt.has_zero else 0) - (fmt.emin + k)
        try:
            return dataclasses.replace(fmt, exponent_bits=e, bias=bias, name=None)
        except ValueError:
            continue
    raise ValueError(f"no float64 format holds {fmt} scaled by 2**{k}")  # pragma: no cover


def _round_on_grid(s: float, t: float, fmt: FloatFormat, r: Rounder, word: int | None) -> float:
    """The exact ``s + t`` (non-zero, below ``fmt``'s normal range) rounded onto the subnormal
    grid of ``fmt`` by ``r``'s mode, in integer arithmetic (the core's rules: stochastic
    rounding goes away iff ``floor(f * 2**64) + word >= 2**64``, f the discarded fraction)."""
    from fractions import Fraction

    q = Fraction(2) ** (fmt.emin - fmt.mantissa_bits)
    v = Fraction(s) + Fraction(t)
    neg = v < 0
    u = abs(v) / q
    n = u.numerator // u.denominator
    f = u - n
    mode = r.mode
    if f == 0:
        away = False
    elif mode == "toward_zero":
        away = False
    elif mode in ("up", "down"):
        away = (mode == "up") != neg
    elif mode == "odd":
        away = n % 2 == 0
    elif mode == "stochastic":
        assert word is not None
        away = (f * 2**64).__floor__() + word >= 2**64
    elif mode == "stochastic_equal":
        assert word is not None
        away = word >> 63 == 1
    else:
        half = Fraction(1, 2)
        tie_away = {"nearest_even": n % 2 == 1, "nearest_away": True, "nearest_zero": False}
        away = f > half or (f == half and tie_away[mode])
    mag = float((n + int(away)) * q)
    res = -mag if neg else mag
    return float(round_to(np.float64(res), fmt, subnormals=r.subnormals))


def round_scaled(
    s: np.ndarray, t: np.ndarray, e: np.ndarray, r: Rounder, words: np.ndarray | None = None
) -> np.ndarray:
    """Round the exact ``(s + t) * 2**e`` onto ``r.fmt`` once, at any magnitude (float64 result).

    ``s + t`` is a pair as :func:`round_sum` takes (finite, ``|t|`` below an ulp of ``s``, ``t``
    zero when ``s`` is), ``e`` integers. Where ``(s + t) * 2**e`` and its error term are
    float64 numbers this is :func:`round_sum` of the scaled pair. Beyond float64's range the
    value is rounded as a value of a format shifted by a power of two (exact): above ``2**1024``
    every value lies beyond the format's largest value plus one quantum, so it overflows by the
    mode's and the ``overflow`` rule; below ``2**-940`` the pair is rounded at ``2**512`` times
    the scale, onto a format whose smallest values are ``fmt``'s times ``2**512`` (a value below
    ``2**-64`` quanta of the smallest subnormal rounds as any such value of its sign: a stand-in
    is used). ``t`` below ``2**-13`` ulps of ``s`` is replaced by a value of its sign below that
    (the rounding, stochastic included, sees only its sign there), so no error term is lost.

    >>> r = Rounder("fp64", "toward_zero")
    >>> float(round_scaled(np.array([1.0]), np.array([0.0]), np.array([5000]), r)[0])
    1.7976931348623157e+308
    >>> r = Rounder("fp64", "up")
    >>> float(round_scaled(np.array([1.0]), np.array([0.0]), np.array([-1200]), r)[0])
    5e-324
    """
    fmt = r.fmt
    assert isinstance(fmt, FloatFormat)
    s, t, e = np.broadcast_arrays(
        np.asarray(s, np.float64), np.asarray(t, np.float64), np.asarray(e, np.int64)
    )
    s, t, e = s.reshape(-1), t.reshape(-1), e.reshape(-1)
    out = np.empty(s.shape)
    ulp = np.ldexp(1.0, np.frexp(s)[1] - 53)
    small = np.abs(t) < ulp * 2.0**-13
    t = np.where(small, np.where(t == 0, 0.0, np.copysign(ulp * 2.0**-14, t)), t)
    E = np.where(s == 0, 0, np.frexp(s)[1] + e)  # |value| in [2**(E-1), 2**E)
    w = None if words is None else np.asarray(words).reshape(-1)

    def part(mask: np.ndarray, rr: Rounder, shift: int, stand_in: float | None) -> None:
        idx = np.flatnonzero(mask)
        if not idx.size:
            return
        si, ti = np.ldexp(s[idx], e[idx] + shift), np.ldexp(t[idx], e[idx] + shift)
        if stand_in is not None:  # below 2**-64 quanta: a value of the same class
            off = E[idx] + shift < math.log2(stand_in)
            si = np.where(off, np.copysign(stand_in, s[idx]), si)
            ti = np.where(off, 0.0, ti)
        wi = None if w is None else w[idx]
        res = round_sum(si, ti, rr, wi)
        sub = rr.fmt
        assert isinstance(sub, FloatFormat)
        if stand_in is not None and sub.precision > 51:
            # fp64-like formats in their subnormal range: the 53-bit pair would be rounded
            # twice (round_sum's fp64 path takes s as the format's rounding), so the exact
            # pair is rounded onto the uniform subnormal grid in integers
            j = np.flatnonzero((ti != 0) & (np.abs(si) < 2.0**sub.emin))
            for i in j.tolist():
                res[i] = _round_on_grid(
                    float(si[i]), float(ti[i]), sub, rr, None if wi is None else int(wi[i])
                )
        out[idx] = np.ldexp(res, -shift)

    mid = (E >= -940) & (E <= 1024)
    part(mid, r, 0, None)

    def shifted_rounder(f: FloatFormat) -> Rounder:
        return Rounder(f, r.mode, r.overflow, r.subnormals, r.seed, r.random_bits, r.zero_sign)

    top = E > 1024
    if top.any():  # beyond max + one quantum in every format: 2**1010 in one whose top <= 2**960
        hi = fmt if fmt.emax <= 1000 else _shifted(fmt, -64, "top")
        shift = 0 if hi is fmt else -64
        idx = np.flatnonzero(top)
        res = round_sum(
            np.copysign(2.0**1010, s[idx]), np.zeros(idx.size), shifted_rounder(hi),
            None if w is None else w[idx],
        )  # fmt: skip
        out[idx] = np.ldexp(res, -shift)
    tiny = E < -940
    if tiny.any():
        sub_m = fmt.mantissa_bits if fmt.has_subnormals else 0
        q = fmt.emin - sub_m  # exponent of the smallest quantum
        if q >= -870:  # every such value is below 2**-64 quanta: one stand-in of its sign
            idx = np.flatnonzero(tiny)
            res = round_sum(
                np.copysign(2.0**-1000, s[idx]), np.zeros(idx.size), r,
                None if w is None else w[idx],
            )  # fmt: skip
            out[idx] = res
        else:
            lo = _shifted(fmt, 512, "bottom")
            part(tiny, shifted_rounder(lo), 512, 2.0 ** (q + 512 - 72))
    return out
