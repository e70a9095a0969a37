"""Number formats: floating-point and integer formats as frozen dataclasses, and their registry.

A :class:`FloatFormat` is described by its parameters (exponent and mantissa widths, bias, which
codes are NaN, whether it has infinities, subnormals, a zero and a sign bit); everything else
(``max``, ``eps``, ``values()`` ...) is derived from them, in the spirit of :func:`numpy.finfo`.

>>> fmt = get_format("e4m3")
>>> fmt.max, fmt.smallest_normal, fmt.smallest_subnormal, fmt.bits
(448.0, 0.015625, 0.001953125, 8)
>>> get_format("float8_e5m2").max
57344.0
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any, Literal

import numpy as np

__all__ = [
    "FORMATS",
    "FloatFormat",
    "Format",
    "IntFormat",
    "format_rows",
    "formats_table",
    "get_format",
    "known_formats",
    "p3109",
]

NanStyle = Literal["ieee", "fn", "fnuz", "none"]
_NAN_STYLES = ("ieee", "fn", "fnuz", "none")


def _check_int(value: object, name: str, expected: str = "an int") -> int:
    """``value`` as a Python int (numpy integers accepted); TypeError for bool/float/str/None."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")
    return int(value)


def _check_bool(value: object, name: str) -> bool:
    """``value`` as a Python bool (numpy bools accepted); TypeError for anything else."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
    return bool(value)


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format ``eXmY``.

    Parameters
    ----------
    exponent_bits, mantissa_bits:
        Widths of the exponent and trailing-significand fields (ints; numpy integers are
        accepted). ``exponent_bits=0`` gives a format whose every value is subnormal (P3109
        K3P3, K4P4 ...).
    bias:
        Exponent bias; ``None`` means the IEEE default ``2**(exponent_bits - 1) - 1`` (0 when
        ``exponent_bits`` is 0).
    nan:
        Which codes are NaN. ``"ieee"``: all-ones exponent with a non-zero mantissa (and the
        all-ones exponent with a zero mantissa is infinity). ``"fn"``: only the all-ones code
        (S.111..1) is NaN, every other code is finite (OCP E4M3, e8m0). ``"fnuz"``: only the
        negative-zero code is NaN (there is no -0). ``"none"``: no NaN (OCP FP6/FP4).
    has_inf:
        Whether the format has infinities (default: exactly with ``nan="ieee"``). With
        ``nan="ieee"`` they are the all-ones exponent with a zero mantissa; with ``nan="fn"`` or
        ``"fnuz"`` they take the largest magnitude code that is not NaN (the P3109 extended
        domain: ``+inf`` is 0x7F in a signed 8-bit P3109 format, 0xFE in an unsigned one, see
        :func:`p3109`).
    has_subnormals:
        Whether exponent-field 0 holds subnormal numbers; without them the only value below the
        smallest normal is zero.
    has_zero:
        ``False`` for exponent-only scale formats such as e8m0, where exponent-field 0 is the
        smallest normal number ``2**-bias``.
    signed:
        Whether there is a sign bit.
    name:
        Display name (not part of equality).

    Examples
    --------
    >>> half = FloatFormat(5, 10, name="my_fp16")
    >>> half.max, half.emin, half.emax, half.eps
    (65504.0, -14, 15, 0.0009765625)
    >>> FloatFormat(4, 3, nan="fn", has_inf=False) == get_format("e4m3")
    True
    """

    exponent_bits: int
    mantissa_bits: int
    bias: int | None = None
    nan: NanStyle = "ieee"
    has_inf: bool = None  # type: ignore[assignment]  # None: True exactly for nan="ieee"
    has_subnormals: bool = True
    has_zero: bool = True
    signed: bool = True
    name: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for fname in ("exponent_bits", "mantissa_bits"):
            object.__setattr__(self, fname, _check_int(getattr(self, fname), fname))
        if self.bias is not None:
            object.__setattr__(self, "bias", _check_int(self.bias, "bias", "an int or None"))
        if self.has_inf is None:
            object.__setattr__(self, "has_inf", self.nan == "ieee")
        for fname in ("has_inf", "has_subnormals", "has_zero", "signed"):
            object.__setattr__(self, fname, _check_bool(getattr(self, fname), fname))
        if not isinstance(self.nan, str):
            raise TypeError(f"nan must be one of {_NAN_STYLES}, got {self.nan!r}")
        if self.name is not None and not isinstance(self.name, str):
            raise TypeError(f"name must be a str or None, got {self.name!r}")
        e, m = self.exponent_bits, self.mantissa_bits
        if e < 0:
            raise ValueError(f"exponent_bits must be an integer >= 0, got {e!r}")
        if m < 0:
            raise ValueError(f"mantissa_bits must be an integer >= 0, got {m!r}")
        if self.nan not in _NAN_STYLES:
            raise ValueError(f"nan must be one of {_NAN_STYLES}, got {self.nan!r}")
        if self.has_inf and self.nan == "none":
            raise ValueError(
                "has_inf=True needs a NaN style other than 'none' (inf uses the codes next to NaN)"
            )
        if self.nan == "ieee" and not self.has_inf:
            raise ValueError(
                "nan='ieee' reserves the all-ones exponent for inf and NaN: set has_inf=True"
            )
        if self.nan == "ieee" and (m == 0 or e == 0):
            raise ValueError(
                "nan='ieee' needs mantissa_bits >= 1 and exponent_bits >= 1 "
                "(NaN is the all-ones exponent with a non-zero mantissa)"
            )
        if self.nan == "fnuz" and not self.signed:
            raise ValueError("nan='fnuz' puts NaN on the negative-zero code and needs signed=True")
        if not self.has_zero and (self.has_subnormals or self.signed):
            raise ValueError(
                "has_zero=False (e8m0 style) needs has_subnormals=False and signed=False"
            )
        if e == 0 and not (self.has_zero and self.has_subnormals):
            raise ValueError(
                "exponent_bits=0 (every value subnormal, as P3109 K3P3) needs has_zero=True and "
                "has_subnormals=True"
            )
        if self.bits > 64:
            raise ValueError(f"a format is at most 64 bits wide, got {self.bits} bits")
        if self.bias is None:
            object.__setattr__(self, "bias", (1 << (e - 1)) - 1 if e else 0)
        # every value must be a float64 so the rounding core can hold it exactly
        if self.emax > 1023 or self.emin - m < -1074 or m > 52:
            raise ValueError(
                f"format e{e}m{m} with bias {self.bias} has values outside float64 "
                "(emax <= 1023, a quantum >= 2**-1074 in the lowest binade and mantissa_bits <= 52 "
                "are needed)"
            )
        top = self.max_code_magnitude
        if top < 1 or (self.has_zero and not self.has_subnormals and top >> m == 0):
            raise ValueError(
                f"format e{e}m{m} with nan={self.nan!r} and has_inf={self.has_inf} has no "
                "positive finite value (its codes hold only zero, inf and NaN)"
            )

    # ----- layout --------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        """Total width in bits."""
        return self.exponent_bits + self.mantissa_bits + int(self.signed)

    @cached_property
    def precision(self) -> int:
        """Significand precision in bits, the hidden bit included."""
        return self.mantissa_bits + 1

    @property
    def is_float(self) -> bool:
        return True

    @property
    def has_nan(self) -> bool:
        return self.nan != "none"

    @property
    def has_negative_zero(self) -> bool:
        return self.signed and self.has_zero and self.nan != "fnuz"

    @property
    def code_dtype(self) -> np.dtype:
        """Unsigned integer dtype of codes: uint8 for formats of 8 bits or fewer."""
        for dt in (np.uint8, np.uint16, np.uint32, np.uint64):
            if self.bits <= np.dtype(dt).itemsize * 8:
                return np.dtype(dt)
        raise AssertionError  # pragma: no cover  (bits <= 64 is checked)

    @property
    def sign_code(self) -> int:
        """The code bit that holds the sign (0 for unsigned formats)."""
        return (1 << (self.bits - 1)) if self.signed else 0

    @cached_property
    def max_code_magnitude(self) -> int:
        """The largest finite magnitude code (sign bit clear)."""
        e, m = self.exponent_bits, self.mantissa_bits
        top = (1 << (e + m)) - 1
        if self.nan == "ieee":
            return (((1 << e) - 2) << m) | ((1 << m) - 1)
        # fn: the all-ones code is NaN; a non-IEEE inf takes the next code below the NaNs
        return top - int(self.nan == "fn") - int(self.has_inf)

    @property
    def inf_code(self) -> int:
        """Magnitude code of +inf (-1 when the format has no inf)."""
        return self.max_code_magnitude + 1 if self.has_inf else -1

    # ----- exponents -------------------------------------------------------------------------
    @cached_property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        assert self.bias is not None
        return (1 if self.has_zero else 0) - self.bias

    @cached_property
    def emax(self) -> int:
        """Exponent of the largest finite number."""
        assert self.bias is not None
        return (self.max_code_magnitude >> self.mantissa_bits) - self.bias

    # ----- values ----------------------------------------------------------------------------
    def _magnitude(self, code: int) -> float:
        m = self.mantissa_bits
        exp_field, frac = code >> m, code & ((1 << m) - 1)
        if exp_field == 0 and self.has_zero:
            return math.ldexp(frac, self.emin - m)
        assert self.bias is not None
        return math.ldexp((1 << m) | frac, exp_field - self.bias - m)

    @cached_property
    def max(self) -> float:
        """Largest finite value."""
        return self._magnitude(self.max_code_magnitude)

    @property
    def min(self) -> float:
        """Most negative finite value (the least value for unsigned formats)."""
        if self.signed:
            return -self.max
        return 0.0 if self.has_zero else self.smallest_subnormal

    @cached_property
    def smallest_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @cached_property
    def smallest_subnormal(self) -> float:
        """Smallest positive value (the smallest normal when there are no subnormals)."""
        if self.has_subnormals and self.mantissa_bits > 0:
            return math.ldexp(1.0, self.emin - self.mantissa_bits)
        return self.smallest_normal

    @property
    def eps(self) -> float:
        """Distance from 1 to the next larger value: ``2**-mantissa_bits``."""
        return math.ldexp(1.0, -self.mantissa_bits)

    @property
    def unit_roundoff(self) -> float:
        """Unit roundoff u = eps/2 of round-to-nearest."""
        return math.ldexp(1.0, -self.mantissa_bits - 1)

    @property
    def dynamic_range_decades(self) -> float:
        """log10(max / smallest positive value)."""
        return math.log10(self.max) - math.log10(self.smallest_subnormal)

    def values(self) -> np.ndarray:
        """Every finite value, sorted ascending, as float64 (formats of at most 16 bits).

        >>> get_format("e2m1").values()[7:]
        array([0. , 0.5, 1. , 1.5, 2. , 3. , 4. , 6. ])
        """
        if self.bits > 16:
            raise ValueError(
                f"values() enumerates formats of at most 16 bits, {self} has {self.bits}"
            )
        return _values(self)

    def ulp(self, x: float | np.ndarray) -> np.ndarray:
        """Gap between the two values of the format around ``|x|`` (float64, x's shape).

        The convention of Python's :func:`math.ulp`, on the format's grid: for ``v <= |x| < w``
        with ``v``, ``w`` adjacent values of the format, ``ulp(x) = w - v``; so ``ulp(0)`` is the
        smallest positive value (the smallest subnormal), and ``ulp(v)`` of a value ``v`` is the
        distance to the next larger one. At and beyond ``max`` the grid continues as if the
        exponent were unbounded (``ulp(max)`` is the spacing of max's binade), and below the
        least value of a format without zero (e8m0) it is the gap above that least value.
        ``ulp(±inf)`` is inf and ``ulp(nan)`` is NaN.

        >>> get_format("e4m3").ulp([300.0, 1.0, 0.0, np.inf, np.nan])
        array([3.2000000e+01, 1.2500000e-01, 1.9531250e-03,           inf,           nan])
        """
        a = np.abs(np.asarray(x, dtype=np.float64))
        finite = np.isfinite(a)
        m = self.mantissa_bits
        if self.max < self.smallest_normal:  # every value subnormal (exponent_bits=0)
            out = np.full(a.shape, self.smallest_subnormal)
        else:
            e = np.frexp(np.where(finite, a, 0.0))[1] - 1  # exponent of |x|
            q = np.clip(e, self.emin, self.emax) - m
            # below the smallest normal: the subnormal quantum, or 2**emin without subnormals
            below = a < self.smallest_normal
            q = np.where(below, self.emin - (m if self.has_subnormals else 0), q)
            out = np.ldexp(1.0, q.astype(np.int64))
        return np.where(finite, out, a)

    def next_up(self, x: float | np.ndarray) -> np.ndarray:
        """Smallest value of the format strictly greater than ``x`` (float64, x's shape).

        Off-grid ``x`` gives the value just above it. Where no finite value is greater, the
        result is ``+inf`` for a format with infinities (so ``next_up(max)`` and
        ``next_up(inf)`` are inf, as IEEE 754's nextUp) and NaN otherwise; a zero reached from
        below is ``-0.0`` where the format has a negative zero; NaN gives NaN. Computed from the
        format's bit layout (magnitude codes in order), without the rounding core.

        >>> e4m3 = get_format("e4m3")
        >>> e4m3.next_up([1.0, 1.01, 0.0, -2.0**-9, -np.inf, 448.0]).tolist()
        [1.125, 1.125, 0.001953125, -0.0, -448.0, nan]
        >>> get_format("e5m2").next_up([57344.0, np.inf])
        array([inf, inf])
        """
        return _next(self, x, up=True)

    def next_down(self, x: float | np.ndarray) -> np.ndarray:
        """Largest value of the format strictly less than ``x`` (float64, x's shape).

        The mirror image of :meth:`next_up`: ``-inf`` (with infinities) or NaN where no finite
        value is less (``next_down(-max)``, any ``x <= min`` of an unsigned or zero-less
        format), ``+0.0`` for a zero reached from above, NaN for NaN.

        >>> e4m3 = get_format("e4m3")
        >>> e4m3.next_down([1.0, 0.0, 2.0**-9, np.inf, -448.0]).tolist()
        [0.9375, -0.001953125, 0.0, 448.0, nan]
        >>> get_format("e8m0").next_down([1.0, 2.0**-127])
        array([0.5, nan])
        """
        return _next(self, x, up=False)

    def __str__(self) -> str:
        return self.name or f"e{self.exponent_bits}m{self.mantissa_bits}"


@dataclass(frozen=True)
class IntFormat:
    """A two's-complement (or unsigned) integer format.

    >>> fmt = get_format("int8")
    >>> fmt.min, fmt.max, fmt.bits
    (-128, 127, 8)
    """

    bits: int
    signed: bool = True
    name: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bits", _check_int(self.bits, "bits", "an int in 1..32"))
        object.__setattr__(self, "signed", _check_bool(self.signed, "signed"))
        if self.name is not None and not isinstance(self.name, str):
            raise TypeError(f"name must be a str or None, got {self.name!r}")
        if not 1 <= self.bits <= 32:
            raise ValueError(f"bits must be an integer in 1..32, got {self.bits!r}")

    @property
    def is_float(self) -> bool:
        return False

    @property
    def max(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    @property
    def min(self) -> int:
        return -(1 << (self.bits - 1)) if self.signed else 0

    smallest_normal = 1
    smallest_subnormal = 1
    eps = 1
    unit_roundoff = 0.5
    emin = 0
    has_inf = False
    has_nan = False

    @property
    def emax(self) -> int:
        return self.max.bit_length() - 1

    @property
    def precision(self) -> int:
        """Binary digits of the largest magnitude (``bits - 1`` signed, ``bits`` unsigned):
        every integer of the range is exact, as every value of a float format's precision is
        within a binade."""
        return self.bits - int(self.signed)

    def ulp(self, x: float | np.ndarray) -> np.ndarray:
        """Gap between the two values of the format around ``|x|``: 1 for every finite ``x`` (as
        :meth:`FloatFormat.ulp`, the grid continues beyond the range), inf for ±inf, NaN for NaN.

        >>> get_format("int8").ulp([0.0, 300.0, np.inf]).tolist()
        [1.0, 1.0, inf]
        """
        a = np.abs(np.asarray(x, dtype=np.float64))
        return np.where(np.isfinite(a), 1.0, a)

    def next_up(self, x: float | np.ndarray) -> np.ndarray:
        """Smallest integer of the range strictly greater than ``x`` (float64, x's shape);
        ``min`` for ``x`` below the range (``-inf`` included), NaN where none is greater
        (``x >= max``; integers have no inf) and for NaN. Zero is ``+0.0``.

        >>> get_format("int8").next_up([1.0, 1.5, -0.5, 127.0, -np.inf]).tolist()
        [2.0, 2.0, 0.0, nan, -128.0]
        """
        return self._next(x, up=True)

    def next_down(self, x: float | np.ndarray) -> np.ndarray:
        """Largest integer of the range strictly less than ``x``: the mirror image of
        :meth:`next_up` (``max`` above the range, NaN at or below ``min``).

        >>> get_format("uint8").next_down([1.0, 0.5, 0.0, 300.0]).tolist()
        [0.0, 0.0, nan, 255.0]
        """
        return self._next(x, up=False)

    def _next(self, x: float | np.ndarray, *, up: bool) -> np.ndarray:
        a = np.asarray(x, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            n = np.floor(a) + 1.0 if up else np.ceil(a) - 1.0
            n = np.clip(n, self.min, self.max)  # beyond the range: its end (NaN stays NaN)
            none = a >= self.max if up else a <= self.min
        return np.where(none | np.isnan(a), np.nan, n + 0.0)

    @property
    def code_dtype(self) -> np.dtype:
        for dt in (np.uint8, np.uint16, np.uint32):
            if self.bits <= np.dtype(dt).itemsize * 8:
                return np.dtype(dt)
        raise AssertionError  # pragma: no cover

    @property
    def dynamic_range_decades(self) -> float:
        return math.log10(self.max)

    def values(self) -> np.ndarray:
        """Every value, ascending, as float64."""
        if self.bits > 16:
            raise ValueError(
                f"values() enumerates formats of at most 16 bits, {self} has {self.bits}"
            )
        return np.arange(self.min, self.max + 1, dtype=np.float64)

    def __str__(self) -> str:
        return self.name or f"{'' if self.signed else 'u'}int{self.bits}"


Format = FloatFormat | IntFormat


def _code_values(fmt: FloatFormat, code: np.ndarray) -> np.ndarray:
    """float64 magnitudes of magnitude codes ``0 .. max_code_magnitude`` (int64 array), from
    the format's layout: exponent field and trailing significand (no codec: formats sit below
    it)."""
    assert fmt.bias is not None
    m = fmt.mantissa_bits
    field, frac = code >> m, (code & ((1 << m) - 1)).astype(np.float64)
    sub = (field == 0) & fmt.has_zero  # zero and subnormals (zero only without subnormals)
    return np.where(
        sub,
        np.ldexp(frac if fmt.has_subnormals else 0.0 * frac, fmt.emin - m),
        np.ldexp(frac + 2.0**m, (field - fmt.bias - m).astype(np.int64)),
    )


def _values(fmt: FloatFormat) -> np.ndarray:
    """Every finite value, from the format's definition."""
    mag = _code_values(fmt, np.arange(fmt.max_code_magnitude + 1, dtype=np.int64))
    v = np.concatenate([-mag, mag]) if fmt.signed else mag
    return np.unique(v) + 0.0  # + 0.0: the zero is +0, not -0


def _floor_code(fmt: FloatFormat, a: np.ndarray) -> np.ndarray:
    """The largest magnitude code whose value is ``<= a`` (``a >= 0`` float64, inf allowed),
    as int64; -1 where ``a`` is below every value (zero-less formats)."""
    assert fmt.bias is not None
    m, top = fmt.mantissa_bits, fmt.max_code_magnitude
    with np.errstate(invalid="ignore", over="ignore"):  # lanes np.where drops
        fin = np.where(np.isfinite(a), a, 0.0)
        e = np.frexp(fin)[1].astype(np.int64) - 1  # 2**e <= fin < 2**(e + 1)
        normal = fin >= fmt.smallest_normal
        # normal: field e + bias, trailing significand floor((fin / 2**e - 1) * 2**m); capped at
        # the exponent field of max (larger magnitudes clip to top below)
        ec = np.minimum(e, (top >> m) - fmt.bias)
        frac = np.floor(np.ldexp(fin, m - ec)) - 2.0**m
        frac = np.minimum(frac, 2.0**m - 1)
        code = np.where(normal, ((ec + fmt.bias) << m) + frac.astype(np.int64), 0)
        if fmt.has_subnormals:  # below the smallest normal: the subnormal codes
            sub = np.floor(np.ldexp(fin, m - fmt.emin)).astype(np.int64)
            code = np.where(normal, code, sub)
        elif fmt.has_zero:  # field 0 is zero for every trailing significand: the last such
            code = np.where(normal, code, (1 << m) - 1)  # code, whose next is the smallest normal
        else:
            code = np.where(normal, code, -1)
    return np.where(np.isinf(a), top, np.minimum(code, top))


def _next(fmt: FloatFormat, x: float | np.ndarray, *, up: bool) -> np.ndarray:
    """:meth:`FloatFormat.next_up` (``up``) or ``next_down``: the next value in magnitude
    code order, on the side of ``x`` that moves away from zero or towards it."""
    a = np.asarray(x, dtype=np.float64)
    top = fmt.max_code_magnitude
    beyond = np.inf if fmt.has_inf else np.nan  # nothing further out
    mag = np.abs(a)
    floor = _floor_code(fmt, mag)
    on_grid = (floor >= 0) & (_code_values(fmt, np.maximum(floor, 0)) == mag)
    # outward (away from zero, or up from a zero): the code above floor; inward: the largest
    # value below |x|, i.e. floor, or floor - 1 where |x| is itself a value
    outward = ~np.signbit(a) if up else np.signbit(a)
    outward |= mag == 0
    above = floor + 1
    below = floor - on_grid
    pick = np.where(outward, above, below)
    val = _code_values(fmt, np.clip(pick, 0, top))
    val = np.where(outward & (above > top), beyond, val)
    val = np.where(~outward & (below < 0), np.nan, val)  # nothing inward (zero-less: below min)
    val = np.where(outward == up, val, -val)  # x's side: next_up outward or next_down inward: +
    if not fmt.signed:  # no negative values: from below 0 up to the least value; nothing below
        least = float(_code_values(fmt, np.zeros((), dtype=np.int64)))
        neg = np.signbit(a) & (mag != 0)
        val = np.where(neg, least if up else np.nan, val)
        val = np.where((mag == 0) & (not up), np.nan, val)
    zero = val == 0
    if fmt.has_negative_zero:  # a zero approached from below keeps the sign of the side
        val = np.where(zero & up & np.signbit(a) & (mag != 0), -0.0, np.where(zero, 0.0, val))
    else:
        val = np.where(zero, 0.0, val)
    return np.where(np.isnan(a), np.nan, val)


def _f(e: int, m: int, name: str, **kw: object) -> FloatFormat:
    return FloatFormat(e, m, name=name, **kw)  # type: ignore[arg-type]


_FINITE: dict[str, object] = {"nan": "none", "has_inf": False}
_FN: dict[str, object] = {"nan": "fn", "has_inf": False}
_FNUZ: dict[str, object] = {"nan": "fnuz", "has_inf": False}

#: The named formats of DESIGN.md (and a few more that ml_dtypes has).
FORMATS: dict[str, FloatFormat | IntFormat] = {
    "fp64": _f(11, 52, "fp64"),
    "fp32": _f(8, 23, "fp32"),
    "tf32": _f(8, 10, "tf32"),
    "fp16": _f(5, 10, "fp16"),
    "bf16": _f(8, 7, "bf16"),
    "e4m3": _f(4, 3, "e4m3", **_FN),
    "e5m2": _f(5, 2, "e5m2"),
    "e4m3fnuz": _f(4, 3, "e4m3fnuz", bias=8, **_FNUZ),
    "e5m2fnuz": _f(5, 2, "e5m2fnuz", bias=16, **_FNUZ),
    "e4m3b11fnuz": _f(4, 3, "e4m3b11fnuz", bias=11, **_FNUZ),
    "e4m3ieee": _f(4, 3, "e4m3ieee"),
    "e3m4": _f(3, 4, "e3m4"),
    "e2m3": _f(2, 3, "e2m3", **_FINITE),
    "e3m2": _f(3, 2, "e3m2", **_FINITE),
    "e2m1": _f(2, 1, "e2m1", **_FINITE),
    "e8m0": _f(8, 0, "e8m0", has_subnormals=False, has_zero=False, signed=False, **_FN),
    "int8": IntFormat(8, True, "int8"),
    "uint8": IntFormat(8, False, "uint8"),
    "int4": IntFormat(4, True, "int4"),
    "uint4": IntFormat(4, False, "uint4"),
}

#: Other names accepted by :func:`get_format` (ml_dtypes, numpy and common spellings).
ALIASES: dict[str, str] = {
    "float64": "fp64",
    "double": "fp64",
    "float32": "fp32",
    "single": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "tensorfloat32": "tf32",
    "float8_e4m3fn": "e4m3",
    "e4m3fn": "e4m3",
    "fp8_e4m3": "e4m3",
    "float8_e5m2": "e5m2",
    "fp8_e5m2": "e5m2",
    "float8_e4m3fnuz": "e4m3fnuz",
    "float8_e5m2fnuz": "e5m2fnuz",
    "float8_e4m3b11fnuz": "e4m3b11fnuz",
    "float8_e4m3": "e4m3ieee",
    "float8_e3m4": "e3m4",
    "float6_e2m3fn": "e2m3",
    "fp6_e2m3": "e2m3",
    "float6_e3m2fn": "e3m2",
    "fp6_e3m2": "e3m2",
    "float4_e2m1fn": "e2m1",
    "fp4_e2m1": "e2m1",
    "fp4": "e2m1",
    # The same format as ml_dtypes' float8_e8m0fnu, but not its tie rule: ml_dtypes rounds ties
    # away from zero, round_to's default picks the even code ([0.75, 3.0] -> [0.5, 2.0], ml_dtypes
    # [1.0, 4.0]); rounding="nearest_away" gives ml_dtypes' values (tests/core/test_exhaustive.py,
    # test_nearest_even_matches_ml_dtypes[e8m0], every float32).
    "float8_e8m0fnu": "e8m0",
    "e8m0fnu": "e8m0",
}


def p3109(k: int, p: int, *, signed: bool = True, domain: str = "extended") -> FloatFormat:
    """The IEEE P3109 binary format K``k``P``p`` (``k`` bits, precision ``p`` bits).

    As gfloat's ``format_info_p3109(k, p, signedness, domain)`` and the P3109 interim report:
    ``p - 1`` mantissa bits; signed formats have ``k - p`` exponent bits, bias
    ``floor(2**(k - p - 1))``, one NaN on the negative-zero code (0x80 for k = 8) and no -0;
    unsigned formats have ``k - p + 1`` exponent bits, bias ``2**(k - p)`` and their NaN on the
    all-ones code. The ``"extended"`` domain has ``±inf`` on the largest magnitude codes below
    the NaN; ``"finite"`` uses them for finite values. Subnormals are always there: with
    ``p = k`` (signed) there are no exponent bits and every value is subnormal. Registry names
    are ``p3109_k{k}p{p}{s|u}{e|f}``.

    >>> f = p3109(8, 3)
    >>> f.name, f.max, f.smallest_subnormal, f.bias
    ('p3109_k8p3se', 49152.0, 7.62939453125e-06, 16)
    >>> get_format("p3109_k8p4sf") == get_format("e4m3fnuz")
    True
    """
    k = _check_int(k, "k")
    p = _check_int(p, "p")
    signed = _check_bool(signed, "signed")
    if domain not in ("extended", "finite"):
        raise ValueError(f"domain must be 'extended' or 'finite', got {domain!r}")
    if not 2 <= k <= 64 or not 1 <= p <= k:
        raise ValueError(f"P3109 formats need 2 <= k <= 64 and 1 <= p <= k, got k={k}, p={p}")
    name = f"p3109_k{k}p{p}{'s' if signed else 'u'}{domain[0]}"
    exp_bits = k - p if signed else k - p + 1
    bias = (1 << (k - p - 1) if k - p >= 1 else 0) if signed else 1 << (k - p)
    return FloatFormat(
        exp_bits,
        p - 1,
        bias=bias,
        nan="fnuz" if signed else "fn",
        has_inf=domain == "extended",
        has_subnormals=True,
        has_zero=True,
        signed=signed,
        name=name,
    )


_P3109_NAME = re.compile(r"p3109_k(\d+)p(\d+)([su])([ef])")


#: The 8-bit P3109 names :func:`known_formats` lists (every k and p are accepted, see there).
P3109_8BIT = tuple(f"p3109_k8p{p}{s}{d}" for p in range(1, 9) for s in "su" for d in "ef")


def known_formats() -> list[str]:
    """Names accepted by :func:`get_format`: registry names, then aliases, then the 8-bit P3109
    formats (``p3109_k8p1se`` ... ``p3109_k8p8uf``).

    P3109 names ``p3109_k{k}p{p}{s|u}{e|f}`` (:func:`p3109`) are accepted for every width too,
    ``2 <= k <= 64`` and ``1 <= p <= k``: too many to list.

    >>> names = known_formats()
    >>> names[:3], names[-1], len(names) == len(FORMATS) + len(ALIASES) + 32
    (['fp64', 'fp32', 'tf32'], 'p3109_k8p8uf', True)
    """
    return list(FORMATS) + list(ALIASES) + list(P3109_8BIT)


def format_rows() -> list[dict[str, Any]]:
    """One dict per registry format (:data:`FORMATS`, in order): what ``precision-lab formats
    --json`` prints (name, kind, bits, range, precision, special values, aliases)."""
    return [_format_row(name, f) for name, f in FORMATS.items()]


def formats_table() -> str:
    """The table ``precision-lab formats`` prints: one line per registry format (bits, fields,
    bias, range, eps, inf/NaN), then the aliases and the P3109 family.

    >>> formats_table().splitlines()[2].split()[:6]
    ['fp64', '64', '11', '52', '1023', '1.79769e+308']
    """
    head = ("name", "bits", "e", "m", "bias", "max", "min normal", "min subnormal", "eps")
    lines = [(*head, "inf", "NaN")]
    for r in format_rows():
        if r["kind"] == "int":
            lo = r["min"]
            cells = (str(r["bits"]), "-", "-", "-", str(r["max"]), f"(min {lo})", "-", "1")
            lines.append((r["name"], *cells, "no", "no"))
            continue
        sub = _g(r["smallest_subnormal"]) if r["has_subnormals"] and r["mantissa_bits"] else "-"
        lines.append(
            (
                r["name"],
                str(r["bits"]),
                str(r["exponent_bits"]),
                str(r["mantissa_bits"]),
                str(r["bias"]),
                _g(r["max"]),
                _g(r["smallest_normal"]),
                sub,
                _g(r["eps"]),
                "yes" if r["has_inf"] else "no",
                "yes" if r["has_nan"] else "no",
            )
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    out = []
    for k, row in enumerate(lines):
        pairs = enumerate(zip(row, widths, strict=True))
        text = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs]
        out.append("  ".join(text).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    out.append("")
    out.append("Aliases: " + ", ".join(f"{a}={t}" for a, t in ALIASES.items()))
    out.append(
        "P3109: p3109_k{k}p{p}{s|u}{e|f} for 2 <= k <= 64, 1 <= p <= k (signed/unsigned, "
        "extended/finite), e.g. p3109_k8p3se; known_formats() lists the 8-bit ones"
    )
    return "\n".join(out)


def _g(v: float) -> str:
    return f"{v:.6g}"


def _format_row(name: str, f: FloatFormat | IntFormat) -> dict[str, Any]:
    aliases = sorted(a for a, target in ALIASES.items() if target == name)
    if isinstance(f, IntFormat):
        return {
            "name": name,
            "kind": "int",
            "bits": f.bits,
            "signed": f.signed,
            "min": f.min,
            "max": f.max,
            "aliases": aliases,
        }
    return {
        "name": name,
        "kind": "float",
        "bits": f.bits,
        "exponent_bits": f.exponent_bits,
        "mantissa_bits": f.mantissa_bits,
        "bias": f.bias,
        "signed": f.signed,
        "max": f.max,
        "smallest_normal": f.smallest_normal,
        "smallest_subnormal": f.smallest_subnormal,
        "eps": f.eps,
        "has_inf": bool(f.has_inf),
        "has_nan": bool(f.has_nan),
        "nan": f.nan,
        "has_subnormals": f.has_subnormals,
        "aliases": aliases,
    }


def get_format(
    fmt: str | FloatFormat | IntFormat | np.dtype | type, *, name: str = "fmt"
) -> FloatFormat | IntFormat:
    """Look a format up by name (or pass a format through).

    Accepts registry names (``"e4m3"``), ml_dtypes/numpy names (``"float8_e4m3fn"``,
    ``"bfloat16"``), P3109 names (``"p3109_k8p3se"``), numpy/ml_dtypes dtypes, and
    ``FloatFormat``/``IntFormat`` instances. An ml_dtypes name gives the same format, and
    :func:`round_to` to nearest even gives ml_dtypes' values, except for ties in
    ``"float8_e8m0fnu"`` (``"e8m0"``): ml_dtypes rounds them away from zero, ``round_to`` to the
    even code (``[0.75, 3.0]`` -> ``[0.5, 2.0]``, ml_dtypes ``[1.0, 4.0]``); pass
    ``rounding="nearest_away"`` for ml_dtypes' values. ``name`` is the argument's name in error
    messages. ``None`` is refused (numpy would read it as float64).

    >>> get_format("bfloat16").mantissa_bits
    7
    >>> get_format("e4m4")
    Traceback (most recent call last):
    ...
    ValueError: unknown format 'e4m4'; did you mean 'e4m3', 'e3m4', ...? known_formats() ...
    >>> get_format(None, name="out_format")
    Traceback (most recent call last):
    ...
    TypeError: out_format must be a format name, FloatFormat, IntFormat or dtype, got None
    """
    if isinstance(fmt, FloatFormat | IntFormat):
        return fmt
    expected = f"{name} must be a format name, FloatFormat, IntFormat or dtype"
    if fmt is None:
        raise TypeError(f"{expected}, got None")
    if not isinstance(fmt, str):
        try:
            fmt = str(np.dtype(fmt).name)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"{expected}, got {type(fmt).__name__}") from None
    assert isinstance(fmt, str)
    key = fmt.strip().lower()
    key = ALIASES.get(key, key)
    if key in FORMATS:
        return FORMATS[key]
    match = _P3109_NAME.fullmatch(key)
    if match:
        k, p, sign, dom = match.groups()
        return _p3109_cached(int(k), int(p), sign == "s", "extended" if dom == "e" else "finite")
    close = difflib.get_close_matches(key, known_formats(), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
    raise ValueError(
        f"unknown format {fmt!r}; {hint}known_formats() (precision-lab formats) lists every "
        "name; P3109 formats are p3109_k{k}p{p}{s|u}{e|f}"
    )


@cache
def _p3109_cached(k: int, p: int, signed: bool, domain: str) -> FloatFormat:
    return p3109(k, p, signed=signed, domain=domain)
