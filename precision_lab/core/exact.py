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
from .rounding import STOCHASTIC_MODES, round_to

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


def two_sum(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(s, t)`` with ``s = fl(x + y)`` and ``s + t == x + y`` exactly (Knuth's TwoSum).

    Non-finite ``s`` gives ``t = 0``.
    """
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
    """One rounding step of a model: format, mode, overflow/subnormal switches, random words."""

    fmt: FloatFormat | str
    mode: str = "nearest_even"
    overflow: str = "ieee"
    subnormals: str = "keep"
    seed: int = 0
    random_bits: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", get_format(self.fmt))

    @cached_property
    def fp64_native(self) -> bool:
        """float64 RN is the answer (fp64 with nearest_even)."""
        return self.fmt == get_format("fp64") and self.mode == "nearest_even"

    def round(self, x: np.ndarray, words: np.ndarray | None = None) -> np.ndarray:
        """Round float64 ``x`` (exact values) onto the format (float64 result)."""
        if self.mode in STOCHASTIC_MODES:
            return round_sum(x, np.zeros_like(x), self, words)
        r = round_to(
            x, self.fmt, rounding=self.mode, overflow=self.overflow, subnormals=self.subnormals
        )
        return r


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
    return round_to(z, r.fmt, rounding=mode, overflow=r.overflow, subnormals=r.subnormals)


def round_sum(
    s: np.ndarray, t: np.ndarray, r: Rounder, words: np.ndarray | None = None
) -> np.ndarray:
    """Round the exact ``s + t`` (a two-sum pair, float64) onto ``r.fmt`` once (float64 result).

    ``s`` need only be a float64 neighbour of the exact value (``|t|`` below one ulp of ``s``)
    for formats of at most 51 significant bits; for fp64 itself ``s`` must be ``RN(s + t)``.
    """
    fmt = r.fmt
    assert isinstance(fmt, FloatFormat)
    if r.fp64_native:
        return round_to(s, fmt, overflow=r.overflow, subnormals=r.subnormals)
    wide = fmt.precision > 51
    if r.mode not in STOCHASTIC_MODES:
        if wide:
            return _round_sum_fp64(s, t, r)
        z = odd_collapse(s, t)
        return round_to(z, fmt, rounding=r.mode, overflow=r.overflow, subnormals=r.subnormals)
    if words is None:
        raise ValueError("stochastic rounding needs random words")
    z = odd_collapse(s, t)
    if wide:
        trunc = _toward_zero_pair(s, t)
    else:
        trunc = round_to(z, fmt, rounding="toward_zero", overflow=r.overflow).astype(np.float64)
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
        up = round_to(np.where(away, trunc + step, trunc), fmt, overflow=r.overflow)
    out = np.where(finite, up, round_to(s, fmt, overflow=r.overflow))
    if beyond.any():
        out = np.where(beyond, round_to(np.where(beyond, z, 0.0), fmt, overflow=r.overflow), out)
    if r.subnormals == "flush":
        out = round_to(out, fmt, subnormals="flush", overflow=r.overflow)
    return out.astype(np.float64)
