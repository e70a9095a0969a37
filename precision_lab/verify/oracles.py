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
    (``ldexp``, exact), then overflow, flushing and signs follow the rules of DESIGN.md. Codes
    are built from the rounded value's exponent and significand fields (not by the codec). It
    needs a signed format with zero and subnormals (every registered float format but e8m0) and
    inputs that float64 holds as normal numbers (every float32, float16 and bfloat16 value; not
    float64 subnormals). It is checked against the exact
    ``fractions.Fraction`` referee of the test suite (tests/referee.py) on every float16 and
    bfloat16 pattern for several formats and on a sample of float32 inputs.
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

from collections.abc import Callable
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

_INWARD = {"toward_zero", "odd"}  # magnitude rules that never leave the finite range
_U0, _U1, _U52 = np.uint64(0), np.uint64(1), np.uint64(52)
_MANT = np.uint64((1 << 52) - 1)


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
    and callers leave NaN inputs out.

    >>> import numpy as np
    >>> referee(np.array([2.5, -2.5, 0.75], dtype=np.float32), "e2m1", mode="up")[0]
    array([ 3., -2.,  1.])
    """
    f = _float_format(fmt)
    if not (f.signed and f.has_zero and f.has_subnormals) or f.mantissa_bits > 50:
        raise ValueError(
            f"the referee oracle needs a signed format with zero and subnormals and at most 50 "
            f"mantissa bits, got {f}; use against='ml_dtypes' or a callable"
        )
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
    m = f.mantissa_bits
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
        qexp = np.maximum(e, f.emin) - m
        drop = np.minimum(qexp - (e - 52), 63).astype(np.uint64)  # bits below the quantum: >= 2
        k = sig >> drop  # floor(a / 2**qexp)
        rem = sig - (k << drop)  # a - k * 2**qexp, in units of 2**(e - 52)
        half = _U1 << (drop - _U1)
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
        r = np.ldexp((k + up).astype(np.float64), qexp.astype(np.int32))  # exact
        finite_only = f.nan == "none"
        # beyond max: ±max when saturating, in formats without inf/NaN, or when the rule points
        # inward; else inf (or NaN where the format has no inf)
        big = finite & (r > f.max)
        clamp = overflow == "saturate" or finite_only or mode in _INWARD
        to_max = big & (clamp | inward)
        r = np.where(to_max, f.max, r)
        r = np.where(big & ~to_max, np.inf if f.has_inf else np.nan, r)
        # infinite input: ±max when saturating (or no inf/NaN), else inf, or NaN without inf
        inf_max = overflow == "saturate" or finite_only
        r = np.where(inf, f.max if inf_max else (np.inf if f.has_inf else np.nan), r)
        if subnormals == "flush":
            r = np.where(finite & (r < f.smallest_normal), 0.0, r)
        r = np.where(nan, np.nan, r)
    keep_sign = neg
    if f.nan == "fnuz":  # no -0, and the one NaN is unsigned
        keep_sign = neg & (r != 0) & ~np.isnan(r)
    elif f.nan == "none":  # NaN (of NaN input only) is a positive float NaN
        keep_sign = neg & ~np.isnan(r)
    values = np.where(keep_sign, -r, r)
    return values, _codes(values, f)


def _codes(values: np.ndarray, f: FloatFormat) -> np.ndarray:
    """Codes of on-grid values, from their exponent and significand (not through the codec)."""
    e_bits, m = f.exponent_bits, f.mantissa_bits
    bias = f.bias
    assert bias is not None
    a = np.abs(values)
    nan = np.isnan(a)
    inf = np.isinf(a)
    finite = ~(nan | inf) & (a > 0)
    bits = a.view(np.uint64)
    e = (bits >> _U52).astype(np.int64) - 1023
    sig = (bits & _MANT) | (_U1 << _U52)
    sub = e < f.emin
    with np.errstate(all="ignore"):
        shift = np.clip(52 - m + f.emin - e, 0, 63).astype(np.uint64)
        field_sub = (sig >> shift).astype(np.int64)  # exact: the value is on fmt's grid
    frac = ((bits >> np.uint64(52 - m)) & np.uint64((1 << m) - 1)).astype(np.int64)
    mag = np.where(sub, field_sub, ((e + bias) << m) | frac)
    mag = np.where(finite, mag, 0)
    all_ones = (1 << e_bits) - 1
    mag = np.where(inf, all_ones << m, mag)
    if f.nan == "ieee":
        nan_mag = (all_ones << m) | (1 << (m - 1))
    elif f.nan == "fn":
        nan_mag = (1 << (e_bits + m)) - 1
    else:
        nan_mag = 0  # fnuz: the sign bit alone (below); none: no NaN code
    mag = np.where(nan, nan_mag, mag)
    signbit = np.signbit(values) | (nan & (f.nan == "fnuz"))
    codes = mag | (signbit.astype(np.int64) << (e_bits + m))
    return codes.astype(f.code_dtype)


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
