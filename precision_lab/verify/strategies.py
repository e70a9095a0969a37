"""Hypothesis strategies for property-testing code that meets low-precision formats.

Needs ``hypothesis`` (a test dependency; ``import precision_lab`` never imports this module):

>>> from hypothesis import given
>>> from precision_lab import strategies as pls
>>> import precision_lab as pl
>>> @given(v=pls.values("e4m3", allow_nan=False))
... def test_values_are_fixed_points(v):
...     assert float(pl.round_to(v, "e4m3")) == v
>>> test_values_are_fixed_points()

- :func:`values` draws representable values (every one reachable, edge cases first),
- :func:`codes` draws bit patterns,
- :func:`floats_near_ties` draws float32/float64 inputs exactly at, or one float step next to,
  the rounding midpoints of a format (the overflow threshold and the subnormal range included),
- :func:`formats` draws random valid custom :class:`~precision_lab.FloatFormat` objects,
- :func:`rounding_modes` draws rounding mode names.

Everything here is computed from the format's parameters, not from the rounding core, so the
strategies can be used to test the core.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

try:
    from hypothesis import reject
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - exercised where hypothesis is missing
    raise ImportError(
        "precision_lab.strategies needs hypothesis: pip install hypothesis (or "
        "pip install 'precision_lab[test]')"
    ) from None

from ..core.formats import FloatFormat, IntFormat, get_format
from ..core.rounding import ROUNDING_MODES, is_stochastic

__all__ = ["codes", "floats_near_ties", "formats", "rounding_modes", "values"]

_ALIASES = ("rne", "rna", "rtz", "rup", "rdn", "rto", "rnz")


def _format(fmt: Any) -> FloatFormat | IntFormat:
    return get_format(fmt)


def _max_code(fmt: FloatFormat) -> int:
    """Largest finite magnitude code, from the NaN convention."""
    return _max_code_of(fmt.exponent_bits, fmt.mantissa_bits, fmt.nan)


def _max_code_of(e: int, m: int, nan: str) -> int:
    if nan == "ieee":
        return (((1 << e) - 2) << m) | ((1 << m) - 1)
    if nan == "fn":
        return (1 << (e + m)) - 2
    return (1 << (e + m)) - 1


def _code_value(fmt: FloatFormat, code: int) -> Fraction:
    """Exact value of a finite magnitude code (sign bit clear), by the format's definition."""
    m = fmt.mantissa_bits
    assert fmt.bias is not None
    ef, frac = code >> m, code & ((1 << m) - 1)
    if ef == 0 and fmt.has_zero:
        if not fmt.has_subnormals:
            frac = 0
        return Fraction(frac, 1 << m) * Fraction(2) ** (1 - fmt.bias)
    return (1 + Fraction(frac, 1 << m)) * Fraction(2) ** (ef - fmt.bias)


def _edge_codes(fmt: FloatFormat) -> list[int]:
    """Magnitude codes of the edge cases: zero, subnormals, smallest normal, one, max."""
    m = fmt.mantissa_bits
    top = _max_code(fmt)
    assert fmt.bias is not None
    one = fmt.bias << m  # the code of 1.0 (when 1.0 is in range)
    cands = [0, 1, (1 << m) - 1, 1 << m, (1 << m) + 1, one, one + 1, top - 1, top]
    return sorted({c for c in cands if 0 <= c <= top})


def codes(fmt: str | FloatFormat | IntFormat) -> st.SearchStrategy[int]:
    """Codes (bit patterns, as Python ints in ``0 .. 2**bits - 1``) of ``fmt``.

    Every code is reachable; the codes of zero, -0, the smallest subnormal and normal, ±max,
    ±inf and NaN are drawn first (and shrink towards them).

    >>> from hypothesis import find
    >>> find(codes("e4m3"), lambda c: c >= 0x80)  # shrinks to -0
    128
    """
    f = _format(fmt)
    full = st.integers(0, (1 << f.bits) - 1)
    if isinstance(f, IntFormat):
        special = [0, 1, f.max, (1 << f.bits) - 1]
        if f.signed:
            special.append(1 << (f.bits - 1))
        return st.one_of(st.sampled_from(sorted(set(special))), full)
    top = (1 << (f.exponent_bits + f.mantissa_bits)) - 1
    mags = [*_edge_codes(f), top, _max_code(f) + 1]  # + the inf / NaN codes
    special = sorted({c for c in mags if c <= top} | {c | f.sign_code for c in mags if c <= top})
    return st.one_of(st.sampled_from(special), full)


def values(
    fmt: str | FloatFormat | IntFormat,
    *,
    allow_nan: bool = True,
    allow_infinity: bool = True,
) -> st.SearchStrategy[float]:
    """Values representable in ``fmt``, as Python floats (every value of a format is a float64).

    Every finite value is reachable; ±0 (where the format has -0), the smallest subnormal, the
    largest subnormal, the smallest normal, 1, ±max, and (where the format has them and they are
    allowed) ±inf and NaN are drawn first. For integer formats: the integers ``min .. max``.

    >>> from hypothesis import find
    >>> find(values("e5m2"), lambda v: v > 50000)
    57344.0
    >>> find(values("e5m2"), lambda v: v > 60000)
    inf
    """
    f = _format(fmt)
    if isinstance(f, IntFormat):
        edges = sorted({0.0, 1.0, float(f.max), float(f.min), -1.0 if f.signed else 0.0})
        return st.one_of(st.sampled_from(edges), st.integers(f.min, f.max).map(float))
    top = _max_code(f)
    signs = [1.0, -1.0] if f.signed else [1.0]

    def build(mag: int, sign: float) -> float:
        v = float(_code_value(f, mag))
        if sign < 0 and v == 0 and not f.has_negative_zero:
            return 0.0
        return math.copysign(v, sign)

    edges = [build(c, s) for c in _edge_codes(f) for s in signs]
    if allow_infinity and f.has_inf:
        edges += [math.inf, -math.inf] if f.signed else [math.inf]
    if allow_nan and f.has_nan:
        edges.append(math.nan)
    finite = st.builds(build, st.integers(0, top), st.sampled_from(signs))
    return st.one_of(st.sampled_from(edges), finite)


def _representable(v: Fraction, width: int) -> bool:
    if width == 64:
        try:
            return Fraction(float(v)) == v
        except OverflowError:
            return False
    f32 = np.float32(float(v)) if abs(v) < 2**128 else np.float32(np.inf)
    return bool(np.isfinite(f32)) and Fraction(float(f32)) == v


@st.composite
def _near_ties(draw: Any, f: FloatFormat | IntFormat, width: int) -> np.floating:
    dtype = np.float32 if width == 32 else np.float64
    if isinstance(f, IntFormat):  # midpoints k + 1/2, one past each end included
        k = draw(
            st.one_of(
                st.sampled_from([f.min - 1, f.min, -1, 0, f.max - 1, f.max]),
                st.integers(f.min - 1, f.max),
            )
        )
        mid = Fraction(2 * k + 1, 2)
    else:
        top, m = _max_code(f), f.mantissa_bits
        lo_code = draw(st.one_of(st.sampled_from(_edge_codes(f)), st.integers(0, top)))
        if f.has_zero and not f.has_subnormals and lo_code < (1 << m):
            lo_code = 0  # the codes below the smallest normal are all zero
            hi = _code_value(f, 1 << m)
        elif lo_code < top:
            hi = _code_value(f, lo_code + 1)
        else:  # the overflow threshold: max + ulp(max) with an unbounded exponent range
            assert f.bias is not None
            hi = _code_value(f, top) + Fraction(2) ** ((top >> m) - f.bias - m)
        mid = (_code_value(f, lo_code) + hi) / 2
        if f.signed and draw(st.booleans()):
            mid = -mid
    if not _representable(mid, width):
        reject()  # only for custom formats whose range goes beyond float32/float64
    x = dtype(float(mid))
    step = draw(st.sampled_from([0, -1, 1]))
    if step:
        x = np.nextafter(x, dtype(step * np.inf))
    return x


def floats_near_ties(
    fmt: str | FloatFormat | IntFormat, *, width: int = 64
) -> st.SearchStrategy[np.floating]:
    """float32 (``width=32``) or float64 (``width=64``) scalars exactly at a rounding midpoint of
    ``fmt`` (halfway between two adjacent values) or one float step either side of it.

    Midpoints come from every part of the range, edge cases first: between 0 and the smallest
    subnormal, inside the subnormal range, across the subnormal/normal boundary, around 1, and
    the overflow threshold ``max + ulp(max) / 2`` (for e4m3: 464). Both signs for signed formats.
    For integer formats: ``k + 1/2`` from ``min - 1/2`` to ``max + 1/2``.

    The midpoint of a format with ``p`` bits of precision needs ``p + 1`` bits, so float32 serves
    formats with at most 22 mantissa bits and float64 those with at most 51 (ValueError
    otherwise).

    >>> from hypothesis import find
    >>> float(find(floats_near_ties("e4m3", width=32), lambda x: x > 448))
    464.0
    """
    f = _format(fmt)
    if width not in (32, 64):
        raise ValueError(f"width must be 32 or 64, got {width!r}")
    if isinstance(f, FloatFormat) and f.mantissa_bits + 2 > (24 if width == 32 else 53):
        raise ValueError(
            f"midpoints of {f} (mantissa_bits={f.mantissa_bits}) are not float{width} values: "
            f"width {width} serves formats with at most {22 if width == 32 else 51} mantissa bits"
        )
    if isinstance(f, IntFormat) and width == 32 and f.bits > 23:
        raise ValueError(f"midpoints of {f} are not all float32 values: use width=64")
    return _near_ties(f, width)


@st.composite
def _formats(
    draw: Any, max_bits: int, max_exponent_bits: int, max_mantissa_bits: int
) -> FloatFormat:
    nan = draw(st.sampled_from(["ieee", "fn", "fnuz", "none"]))
    signed = True if nan == "fnuz" else draw(st.booleans())
    has_zero = True
    if not signed and nan != "fnuz":
        has_zero = draw(st.sampled_from([True, True, True, False]))  # e8m0-style now and then
    e = draw(st.integers(1, min(max_exponent_bits, max_bits - int(signed))))
    m_max = min(max_mantissa_bits, max_bits - int(signed) - e)
    m = draw(st.integers(1 if nan == "ieee" else 0, max(m_max, 1 if nan == "ieee" else 0)))
    default_bias = (1 << (e - 1)) - 1
    bias = draw(st.one_of(st.just(default_bias), st.integers(default_bias - 4, default_bias + 4)))
    has_subnormals = has_zero and draw(st.booleans())
    if has_zero and _max_code_of(e, m, nan) < (1 << m):
        reject()  # no normal value at all (e.g. e1m1 with bias 0): FloatFormat refuses these
    try:
        return FloatFormat(
            e,
            m,
            bias=bias,
            nan=nan,
            has_inf=nan == "ieee",
            has_subnormals=has_subnormals,
            has_zero=has_zero,
            signed=signed,
        )
    except ValueError:  # e.g. no finite non-zero value
        reject()
        raise  # unreachable: reject() raises


def formats(
    *, max_bits: int = 16, max_exponent_bits: int = 8, max_mantissa_bits: int = 10
) -> st.SearchStrategy[FloatFormat]:
    """Random valid custom :class:`~precision_lab.FloatFormat` objects.

    Exponent widths ``1..max_exponent_bits``, mantissa widths ``0..max_mantissa_bits``, total
    width at most ``max_bits``; the IEEE bias or one up to 4 away from it; every NaN convention
    (``ieee`` with infinities, ``fn``, ``fnuz``, ``none``); with and without subnormals; signed
    and unsigned, and now and then an e8m0-style format without zero. Only combinations that
    ``FloatFormat`` accepts are drawn (so every format has at least one normal value). With the
    default ``max_bits=16``, ``fmt.values()`` works.

    >>> from hypothesis import find
    >>> find(formats(), lambda f: f.nan == "fnuz").nan
    'fnuz'
    """
    if max_bits < 2:
        raise ValueError(f"max_bits must be >= 2, got {max_bits}")
    return _formats(max_bits, max_exponent_bits, max_mantissa_bits)


def rounding_modes(*, stochastic: bool = False, aliases: bool = False) -> st.SearchStrategy[str]:
    """Rounding mode names: the deterministic modes of :func:`~precision_lab.round_to`, plus
    the stochastic modes with ``stochastic=True`` and the short aliases (``rne`` ...) with
    ``aliases=True``.

    >>> from hypothesis import find
    >>> find(rounding_modes(), lambda m: True)
    'nearest_even'
    """
    modes = [m for m in ROUNDING_MODES if stochastic or not is_stochastic(m)]
    if aliases:
        modes += list(_ALIASES) + (["sr", "sre"] if stochastic else [])
    return st.sampled_from(modes)
