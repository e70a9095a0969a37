"""Independent oracles for exhaustive verification of :func:`~precision_lab.round_to` and
:func:`~precision_lab.encode`: a fast vectorised referee, ml_dtypes and torch.

None of them calls the rounding core or the codec. Each oracle maps a float array ``x`` (float32,
float16 or bfloat16 values; anything float64 holds exactly) to ``(values, codes)``: the correctly
rounded values (float64) and the format's codes (the dtype of :attr:`FloatFormat.code_dtype`).

``referee``
    Rounds by the textbook formula in exact integer arithmetic, written independently of the
    rounding core's add-and-mask trick: the input, widened to float64, is split into its binary
    exponent ``E`` and 53-bit integer significand; the quantum of the exact input's binade is
    ``q = 2**(max(E, emin) - mantissa_bits)``, so ``k = floor(|x| / q)`` is the significand
    shifted right and the remainder ``|x| - k*q`` the bits shifted out; the mode picks ``k`` or
    ``k + 1`` from the remainder's comparison with half a quantum; the result is ``k' * q``
    (``ldexp``, exact), then overflow, flushing and signs follow the rules of DESIGN.md. Ties
    and round to odd look at the parity of the candidate's code, so ``p = 1`` formats (whose
    significand is always 1) break ties on the exponent field's last bit. Codes are built from
    the rounded value's exponent and significand fields (not by the codec). Formats named
    ``p3109_k{k}p{p}{s|u}{e|f}`` are laid out from the P3109 specification itself (bias, the
    codes of inf and NaN, the largest finite value; not from :class:`FloatFormat`'s derived
    properties) and follow its overflow rule: round to odd, like every mode but toward-zero and
    the inward directed one, overflows to inf without saturation. It covers every format of
    the registry (signed and unsigned, any NaN style, P3109 included) except those without zero
    or subnormals (e8m0), which it refuses; inputs must be numbers float64 holds as normal
    numbers (every float32, float16 and bfloat16 value; not float64 subnormals). It is checked
    against the exact ``fractions.Fraction`` referee of the test suite (tests/referee.py) on
    every float16 and bfloat16 pattern for several formats and on a sample of float32 inputs,
    and for P3109 formats against a table built from the specification and against gfloat.
``ml_dtypes``
    ``x.astype(ml_dtypes type)``: round to nearest even only, IEEE overflow of ml_dtypes (inf, or
    NaN in formats without inf). For ``overflow="saturate"`` the input is first clamped to
    ``[-max, max]`` (infinities included; NaN passes), then cast by ml_dtypes: the clamped
    value is on the format's grid, so ml_dtypes returns ``±max`` exactly, and every in-range
    input is rounded by ml_dtypes alone. The codes are ml_dtypes' own bytes.
``torch``
    ``torch.from_numpy(x).to(torch dtype)`` for fp16, bf16, e4m3, e5m2, e4m3fnuz, e5m2fnuz; round
    to nearest even; saturation by the same clamp as ml_dtypes. Its IEEE overflow is torch's own
    (DESIGN.md: torch saturates E4M3): a sweep against it with ``overflow="ieee"`` reports where
    torch's semantics differ from IEEE 754.

NaN results compare as NaN whatever their payload; for codes, any NaN code of the format matches
any other with the same sign bit (see :func:`nan_codes`).

>>> import numpy as np
>>> v, c = referee(np.array([1.0625, 464.0, 465.0, -1e-9], dtype=np.float32), "e4m3")
>>> v
array([ 1.,  448.,  nan,  -0.])
>>> c
array([ 56, 126, 127, 128], dtype=uint8)
>>> ml_dtypes_oracle(np.array([465.0, np.inf], dtype=np.float32), "e4m3", overflow="saturate")[0]
array([448., 448.], dtype=float32)
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import ml_dtypes
import numpy as np

from ..core.formats import FORMATS, FloatFormat, IntFormat, get_format

__all__ = [
    "ML_DTYPES",
    "ORACLES",
    "TORCH_DTYPES",
    "ml_dtypes_oracle",
    "nan_codes",
    "referee",
    "torch_oracle",
]

#: registered format name -> ml_dtypes / numpy type (what the ``ml_dtypes`` oracle can cast to)
ML_DTYPES: dict[str, Any] = {
    "fp16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "e4m3b11fnuz": ml_dtypes.float8_e4m3b11fnuz,
    "e4m3ieee": ml_dtypes.float8_e4m3,
    "e3m4": ml_dtypes.float8_e3m4,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
}
#: registered format name -> name of the torch dtype (the ``torch`` oracle)
TORCH_DTYPES: dict[str, str] = {
    "fp16": "float16",
    "bf16": "bfloat16",
    "e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2",
    "e4m3fnuz": "float8_e4m3fnuz",
    "e5m2fnuz": "float8_e5m2fnuz",
}

_U0, _U1, _U52 = np.uint64(0), np.uint64(1), np.uint64(52)
_MANT = np.uint64((1 << 52) - 1)
_P3109_NAME = re.compile(r"p3109_k(\d+)p(\d+)([su])([ef])")


@dataclass(frozen=True)
class _Layout:
    """What the referee needs of a format: its grid, its special codes and its overflow rule.

    Built from the P3109 specification for formats named ``p3109_k{k}p{p}{s|u}{e|f}`` (not from
    :class:`FloatFormat`'s derived properties), and from the documented layout of
    :class:`FloatFormat` for the others."""

    m: int  # trailing significand bits (precision - 1)
    e_bits: int
    bias: int
    emin: int  # exponent of the smallest normal number
    max: float  # largest finite magnitude
    signed: bool
    neg_zero: bool  # is there a -0 code
    inf_mag: int  # magnitude code of +inf, -1 without inf
    nan_mag: int  # magnitude code of the NaN (signed formats: the sign bit is added per value)
    nan_signed: bool  # does a NaN result keep its sign (ieee and fn styles, signed formats)
    has_nan: bool
    p3109: bool  # round to odd overflows like the other outward modes (P3109), not to max


def _p3109_layout(f: FloatFormat, k: int, p: int, signed: bool, extended: bool) -> _Layout:
    """The P3109 format K``k``P``p`` from the specification's definitions (P3109 interim report,
    section "Binary formats"; the same as gfloat's ``format_info_p3109``).

    Signed: ``k - p`` exponent bits, bias ``floor(2**(k - p - 1))``, NaN on the code
    ``2**(k-1)`` (the negative-zero code: there is no -0), ``+inf`` on ``2**(k-1) - 1`` and
    ``-inf`` on ``2**k - 1`` in the extended domain. Unsigned: ``k - p + 1`` exponent bits, bias
    ``2**(k - p)``, NaN on ``2**k - 1``, ``+inf`` on ``2**k - 2`` (extended). Every exponent
    field is a binade (subnormals below ``2**(1 - bias)``); the largest finite code is the one
    below the infinity (extended) or below the NaN (finite)."""
    m = p - 1
    if signed:
        e_bits, bias = k - p, (1 << (k - p - 1)) if k > p else 0
        nan_mag, top = 0, (1 << (k - 1)) - 1  # NaN: the sign bit alone
    else:
        e_bits, bias = k - p + 1, 1 << (k - p)
        nan_mag, top = (1 << k) - 1, (1 << k) - 2
    inf_mag = top if extended else -1
    max_code = top - 1 if extended else top
    field, frac = max_code >> m, max_code & ((1 << m) - 1)
    emin = 1 - bias
    if field == 0:
        top_value = math.ldexp(frac, emin - m)
    else:
        top_value = math.ldexp((1 << m) | frac, field - bias - m)
    lay = _Layout(
        m, e_bits, bias, emin, top_value, signed, False, inf_mag, nan_mag, False, True, True
    )
    same = (
        (f.exponent_bits, f.mantissa_bits, f.bias, f.signed, f.has_inf)
        == (e_bits, m, bias, signed, extended)
        and f.nan == ("fnuz" if signed else "fn")
        and f.has_zero
        and f.has_subnormals
    )
    if not same:
        raise ValueError(
            f"fmt {f!r} is named like a P3109 format but its layout is not K{k}P{p}'s; "
            "the referee oracle refuses it"
        )
    return lay


def _layout(f: FloatFormat) -> _Layout:
    """A P3109 format by name (refused if its layout is not the name's), or by layout: formats
    compare by layout whatever their names, so a format laid out exactly as K``k``P``p`` of
    the specification (``e4m3fnuz`` is K8P4 in the finite domain) follows P3109's rules too."""
    match = _P3109_NAME.fullmatch(f.name or "")
    if match:
        k, p, s, d = match.groups()
        return _p3109_layout(f, int(k), int(p), s == "s", d == "e")
    k = f.exponent_bits + f.mantissa_bits + int(f.signed)
    if f.nan in ("fn", "fnuz") and f.exponent_bits >= 1:
        try:
            return _p3109_layout(f, k, f.mantissa_bits + 1, f.signed, f.has_inf)
        except ValueError:
            pass  # not laid out as P3109: the IEEE-style rules below
    if not (f.has_zero and f.has_subnormals):
        raise ValueError(
            f"the referee oracle needs a format with zero and subnormals, got {f} "
            "(e8m0 and formats with has_subnormals=False are not covered); use a callable "
            "oracle for them"
        )
    e, m = f.exponent_bits, f.mantissa_bits
    assert f.bias is not None
    all_mag = (1 << (e + m)) - 1
    if f.nan == "ieee":  # all-ones exponent: inf (zero mantissa) and NaN (quiet bit set)
        inf_mag, nan_mag = ((1 << e) - 1) << m, (((1 << e) - 1) << m) | (1 << (m - 1))
    elif f.nan == "fn":  # the all-ones code is NaN; an inf takes the code below it
        inf_mag, nan_mag = (all_mag - 1 if f.has_inf else -1), all_mag
    elif f.nan == "fnuz":  # NaN on the negative-zero code; an inf on the top magnitude code
        inf_mag, nan_mag = (all_mag if f.has_inf else -1), 0
    else:
        inf_mag, nan_mag = -1, 0
    return _Layout(
        m,
        e,
        f.bias,
        1 - f.bias,
        f.max,
        f.signed,
        f.signed and f.nan != "fnuz",
        inf_mag,
        nan_mag,
        f.signed and f.nan in ("ieee", "fn"),
        f.nan != "none",
        False,
    )


def _float_format(fmt: Any) -> FloatFormat:
    f = get_format(fmt)
    if isinstance(f, IntFormat):
        raise ValueError(f"fmt must be a floating-point format, got {f}")
    return f


def _registered_name(f: FloatFormat, table: dict[str, Any], oracle: str) -> str:
    for name in table:
        if FORMATS[name] == f:
            return name
    raise ValueError(f"fmt {f} has no {oracle} type; the {oracle} oracle knows {', '.join(table)}")


def _check_nearest_even(mode: str, subnormals: str, oracle: str) -> None:
    if mode != "nearest_even":
        raise ValueError(f"the {oracle} oracle rounds to nearest even only, got mode {mode!r}")
    if subnormals != "keep":
        raise ValueError(
            f"the {oracle} oracle keeps subnormals only, got subnormals {subnormals!r}"
        )


def _magnitude_rule(mode: str, neg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(round magnitude away, round magnitude toward zero) masks for the directed modes."""
    if mode == "up":
        return ~neg, neg
    if mode == "down":
        return neg, ~neg
    return np.zeros_like(neg), np.zeros_like(neg)


def referee(
    x: np.ndarray,
    fmt: str | FloatFormat,
    *,
    mode: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
) -> tuple[np.ndarray, np.ndarray]:
    """Correctly rounded ``(values, codes)`` of ``x`` in ``fmt`` by exact integer arithmetic.

    ``mode`` is a deterministic rounding mode (full name), ``overflow`` ``"ieee"`` or
    ``"saturate"``, ``subnormals`` ``"keep"`` or ``"flush"``. Values come back as float64, codes
    in ``fmt.code_dtype``; NaN input gives NaN (its code keeps the input's sign where the format
    has signed NaN). Formats without NaN have no code for NaN: the code of a NaN input is 0 there,
    and callers leave NaN inputs out. Formats without zero or without subnormals (e8m0) are
    refused.

    Ties and round to odd look at the parity of the candidate's *code* (its last trailing
    significand bit; with ``p = 1`` that is the exponent field's last bit, as P3109 and gfloat
    define it). Rounding is with an unbounded exponent; then overflow: ``±max`` when
    saturating, in formats with neither inf nor NaN, under ``toward_zero`` and under the inward
    directed mode; else ``±inf`` (NaN in a format without inf). Round to odd gives ``±max`` in
    the IEEE-style formats (DESIGN.md) and overflows to ``±inf`` in P3109 formats (the P3109
    rule: without saturation only toward-zero and the inward directed mode stay finite).
    Unsigned formats turn negative inputs (not -0) into NaN, or 0 without NaN.

    >>> import numpy as np
    >>> referee(np.array([2.5, -2.5, 0.75], dtype=np.float32), "e2m1", mode="up")[0]
    array([ 3., -2.,  1.])
    >>> v, c = referee(np.array([np.inf, 1.5 * 2.0**-62], dtype=np.float32), "p3109_k8p1se")
    >>> v == [np.inf, 2.0**-62], c
    (array([ True,  True]), array([127,   2], dtype=uint8))
    >>> referee(np.array([232.0], dtype=np.float32), "p3109_k8p4se", mode="odd")[0]
    array([inf])
    """
    f = _float_format(fmt)
    lay = _layout(f)
    if mode not in (
        "nearest_even",
        "nearest_away",
        "nearest_zero",
        "toward_zero",
        "up",
        "down",
        "odd",
    ):
        raise ValueError(f"mode must be a deterministic rounding mode, got {mode!r}")
    if overflow not in ("ieee", "saturate"):
        raise ValueError(f"overflow must be 'ieee' or 'saturate', got {overflow!r}")
    if subnormals not in ("keep", "flush"):
        raise ValueError(f"subnormals must be 'keep' or 'flush', got {subnormals!r}")
    m = lay.m
    with np.errstate(all="ignore"):  # signalling NaNs among the inputs make casts warn
        xd = np.asarray(x).astype(np.float64)
        neg = np.signbit(xd)
        a = np.abs(xd)
        nan = np.isnan(a)
        inf = np.isinf(a)
        finite = ~(nan | inf)
        if np.any((a > 0) & (a < np.finfo(np.float64).tiny)):
            raise ValueError("the referee oracle needs x without float64 subnormals")
        # a = sig * 2**(e - 52) exactly, sig a 53-bit integer (inputs narrower than float64 are
        # never subnormal in float64); the quantum of a's binade in fmt is 2**qexp
        bits = a.view(np.uint64)
        e = (bits >> _U52).astype(np.int64) - 1023
        sig = np.where(a == 0, _U0, (bits & _MANT) | (_U1 << _U52))
        qexp = np.maximum(e, lay.emin) - m
        shift = qexp - (e - 52)  # bits of sig below the quantum (<= 0: a is on the grid)
        drop = np.clip(shift, 1, 63).astype(np.uint64)
        k = sig >> drop  # floor(a / 2**qexp)
        rem = sig - (k << drop)  # a - k * 2**qexp, in units of 2**(e - 52)
        rem = np.where(shift <= 0, _U0, rem)
        half = _U1 << (drop - _U1)
        # parity of the lower candidate's code: the last trailing significand bit, which is the
        # last bit of k, except for p = 1 in the normal range (k = 1), where it is the last bit
        # of the exponent field e + bias (the grid continues above max: unbounded exponent)
        if m == 0:
            lo_odd = np.where(e >= lay.emin, ((e + lay.bias) & 1) == 1, (k & _U1) == 1)
        else:
            lo_odd = (k & _U1) == 1
        away, inward = _magnitude_rule(mode, neg)
        if mode in ("toward_zero", "up", "down"):
            up = away & (rem > 0)
        elif mode == "odd":
            up = (rem > 0) & ~lo_odd
        elif mode == "nearest_away":
            up = rem >= half
        elif mode == "nearest_zero":
            up = rem > half
        else:  # nearest_even
            up = (rem > half) | ((rem == half) & lo_odd)
        r = np.where(shift <= 0, a, np.ldexp((k + up).astype(np.float64), qexp.astype(np.int32)))
        finite_only = not (lay.has_nan or lay.inf_mag >= 0)
        beyond = np.inf if lay.inf_mag >= 0 else np.nan
        # beyond max: ±max when saturating, in formats without inf/NaN, or when the rule points
        # inward (toward_zero; odd outside P3109); else inf (or NaN where the format has no inf)
        big = finite & (r > lay.max)
        inward_mode = mode == "toward_zero" or (mode == "odd" and not lay.p3109)
        clamp = overflow == "saturate" or finite_only or inward_mode
        to_max = big & (clamp | inward)
        r = np.where(to_max, lay.max, r)
        r = np.where(big & ~to_max, beyond, r)
        # infinite input: ±max when saturating (or no inf/NaN), else inf, or NaN without inf
        inf_max = overflow == "saturate" or finite_only
        r = np.where(inf, lay.max if inf_max else beyond, r)
        if subnormals == "flush":
            r = np.where(finite & (r < math.ldexp(1.0, lay.emin)), 0.0, r)
        if not lay.signed:  # negative inputs (not -0) have no value: NaN, or 0 without NaN
            negative = neg & (a != 0)
            r = np.where(negative, np.nan if lay.has_nan else 0.0, r)
        r = np.where(nan, np.nan, r)
    if not lay.signed:
        keep_sign = np.zeros_like(neg)
    elif lay.neg_zero:  # NaN keeps its sign where the format's NaN is signed
        keep_sign = neg if lay.nan_signed else neg & ~np.isnan(r)
    else:  # no -0, and the one NaN is unsigned
        keep_sign = neg & (r != 0) & ~np.isnan(r)
    values = np.where(keep_sign, -r, r)
    return values, _codes(values, f, lay)


def _codes(values: np.ndarray, f: FloatFormat, lay: _Layout) -> np.ndarray:
    """Codes of on-grid values, from their exponent and significand (not through the codec)."""
    m, bias = lay.m, lay.bias
    a = np.abs(values)
    nan = np.isnan(a)
    inf = np.isinf(a)
    finite = ~(nan | inf) & (a > 0)
    bits = a.view(np.uint64)
    e = (bits >> _U52).astype(np.int64) - 1023
    sig = (bits & _MANT) | (_U1 << _U52)
    sub = e < lay.emin
    with np.errstate(all="ignore"):
        shift = np.clip(52 - m + lay.emin - e, 0, 63).astype(np.uint64)
        field_sub = sig >> shift  # exact: the value is on fmt's grid
        frac = (bits >> np.uint64(52 - m)) & np.uint64((1 << m) - 1)
        field = (e + bias).astype(np.uint64)
        mag = np.where(sub, field_sub, (field << np.uint64(m)) | frac)
    mag = np.where(finite, mag, _U0)
    mag = np.where(inf, np.uint64(max(lay.inf_mag, 0)), mag)
    mag = np.where(nan, np.uint64(lay.nan_mag), mag)
    if lay.signed:
        # the sign bit: negative values, signed NaN, and the NaN of the fnuz style (-0's code)
        signbit = np.signbit(values) | (nan & (lay.nan_mag == 0) & lay.has_nan)
        mag = mag | (signbit.astype(np.uint64) << np.uint64(f.bits - 1))
    return mag.astype(f.code_dtype)


def nan_codes(codes: np.ndarray, fmt: str | FloatFormat) -> np.ndarray:
    """Mask of the codes that are NaN in ``fmt``, from the format's definition.

    >>> import numpy as np
    >>> nan_codes(np.array([0x7F, 0xFF, 0x7E], dtype=np.uint8), "e4m3")
    array([ True,  True, False])
    """
    f = _float_format(fmt)
    c = np.asarray(codes).astype(np.uint64)
    e_bits, m = f.exponent_bits, f.mantissa_bits
    mag = c & np.uint64((1 << (e_bits + m)) - 1)
    if f.nan == "ieee":
        return ((mag >> np.uint64(m)) == (1 << e_bits) - 1) & ((mag & np.uint64((1 << m) - 1)) != 0)
    if f.nan == "fn":
        return mag == (1 << (e_bits + m)) - 1
    if f.nan == "fnuz":
        return c == f.sign_code
    return np.zeros(c.shape, dtype=bool)


def _clamped(x: np.ndarray, f: FloatFormat, overflow: str) -> np.ndarray:
    if overflow == "saturate":
        return np.clip(x, -f.max, f.max)  # infinities too; NaN passes through
    if overflow != "ieee":
        raise ValueError(f"overflow must be 'ieee' or 'saturate', got {overflow!r}")
    return x


def ml_dtypes_oracle(
    x: np.ndarray,
    fmt: str | FloatFormat,
    *,
    mode: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
) -> tuple[np.ndarray, np.ndarray]:
    """``(values, codes)`` of ``x`` cast by ml_dtypes (see the module docstring)."""
    f = _float_format(fmt)
    dt = ML_DTYPES[_registered_name(f, ML_DTYPES, "ml_dtypes")]
    _check_nearest_even(mode, subnormals, "ml_dtypes")
    with np.errstate(all="ignore"):
        y = _clamped(np.asarray(x), f, overflow).astype(dt)
    codes = y.view(f.code_dtype)
    return np.take(_ml_dtypes_values(dt), codes), codes


@cache
def _ml_dtypes_values(dt: Any) -> np.ndarray:
    """float32 value of every byte pattern of ``dt``, converted by ml_dtypes (a gather from this
    table beats its per-element cast)."""
    unsigned = np.uint8 if np.dtype(dt).itemsize == 1 else np.uint16
    codes = np.arange(1 << (8 * np.dtype(dt).itemsize), dtype=unsigned)
    with np.errstate(all="ignore"):
        return codes.view(dt).astype(np.float32)


def torch_oracle(
    x: np.ndarray,
    fmt: str | FloatFormat,
    *,
    mode: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
) -> tuple[np.ndarray, np.ndarray]:
    """``(values, codes)`` of ``x`` cast by torch (``Tensor.to``; see the module docstring)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("the torch oracle needs torch: pip install torch") from None
    f = _float_format(fmt)
    tdt = getattr(torch, TORCH_DTYPES[_registered_name(f, TORCH_DTYPES, "torch")])
    _check_nearest_even(mode, subnormals, "torch")
    xt = torch.from_numpy(np.ascontiguousarray(_clamped(np.asarray(x), f, overflow)))
    y = xt.to(tdt)
    values = y.to(torch.float32).numpy()
    bits = torch.uint8 if f.bits <= 8 else torch.int16
    codes = y.view(bits).numpy().view(f.code_dtype)
    return values, codes


#: oracle name -> function ``(x, fmt, *, mode, overflow, subnormals) -> (values, codes)``
ORACLES: dict[str, Callable[..., tuple[np.ndarray, np.ndarray]]] = {
    "referee": referee,
    "ml_dtypes": ml_dtypes_oracle,
    "torch": torch_oracle,
}
