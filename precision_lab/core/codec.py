"""Codecs: values <-> the integer codes (bit patterns) of a format.

``encode`` rounds with the core (:func:`precision_lab.core.rounding.round_to`'s machinery, in the
same pass) and packs sign, exponent and mantissa into unsigned codes of the format's width (uint8
for formats of 8 bits or fewer); ``decode`` is its exact inverse. For every format that ml_dtypes
also has, ``encode`` under nearest_even/ieee gives the codes of
``x.astype(ml_dtype).view(uint8/16)``.

>>> import numpy as np
>>> encode(np.array([1.0, -448.0, np.nan], dtype=np.float32), "e4m3")
array([ 56, 254, 127], dtype=uint8)
>>> decode(np.array([56, 254, 127], dtype=np.uint8), "e4m3")
array([   1., -448.,   nan], dtype=float32)
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from . import rounding as _core
from .formats import FloatFormat, IntFormat, get_format
from .inputs import as_input, is_device_array
from .rounding import (
    _Plan,
    _plan,
    _round_float_chunk,
    _scratch,
    as_float_array,
    check_options,
    for_chunks,
    repair,
    round_to,
    working_dtype,
)

__all__ = ["decode", "encode"]


def _nan_code(fmt: FloatFormat) -> int:
    """Magnitude-and-sign code of the canonical positive NaN (-1 when the format has none)."""
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    if fmt.nan == "ieee":
        return (((1 << e) - 1) << m) | (1 << (m - 1)) if m else -1
    if fmt.nan == "fn":
        return (1 << (e + m)) - 1
    if fmt.nan == "fnuz":
        return fmt.sign_code
    return -1


def _fast_codes(p: _Plan, rb: np.ndarray, out: np.ndarray) -> None:
    """Codes (into ``out``, the code dtype) of rounded values in the format's normal range.

    Shifting the full bits right by ``s`` leaves sign | exponent | mantissa with the working
    dtype's exponent bias; subtracting the bias difference re-biases the exponent (no borrow
    reaches the sign for normal results), then the sign bit moves down to the format's.
    """
    fmt, U = p.fmt, p.U
    assert fmt.bias is not None
    bias_in = 127 if p.W == 32 else 1023
    offset = ((bias_in - fmt.bias) << fmt.mantissa_bits) % (1 << p.W)
    drop = (p.W - 1 - p.s) - (fmt.bits - 1)
    code = _scratch(U, rb.size, slot=3)
    np.right_shift(rb, U(p.s), out=code)
    if offset:
        code -= U(offset)
    if fmt.signed and drop:
        sign = _scratch(U, rb.size, slot=4)
        np.right_shift(code, U(drop), out=sign)
        sign &= U(fmt.sign_code)
        code &= U(fmt.sign_code - 1)
        np.bitwise_or(code, sign, out=out, casting="unsafe")
    else:
        np.copyto(out, code, casting="unsafe")


def _float_codes(p: _Plan, rb: np.ndarray) -> np.ndarray:
    """Codes (in the working unsigned type) of already-rounded values with bits ``rb``."""
    fmt, U, W = p.fmt, p.U, p.W
    m = fmt.mantissa_bits
    assert fmt.bias is not None
    bias_in = 127 if W == 32 else 1023
    offset = ((bias_in - fmt.bias) << m) % (1 << W)
    mag = rb & U(p.abs_mask)
    code = mag >> U(p.s)
    code -= U(offset)
    low = mag < U(p.threshold)
    if low.any():
        idx = np.flatnonzero(low)
        v = mag[idx].view(p.F).astype(np.float64)
        e = np.frexp(v)[1] - 1
        normal = (e >= fmt.emin) & (v > 0)
        field = np.where(normal, e + fmt.bias, 0).astype(np.int64)
        sig = np.ldexp(v, np.where(normal, m - e, -p.qexp)) - np.where(normal, 1 << m, 0)
        code[idx] = ((field << m) + sig.astype(np.int64)).astype(U)
    special = mag >= U(p.inf_bits)
    if fmt.signed:
        code |= (rb >> U(W - 1)) << U(fmt.bits - 1)
    if special.any():
        idx = np.flatnonzero(special)
        nan = mag[idx] > U(p.inf_bits)
        if nan.any() and not fmt.has_nan:
            raise ValueError(f"x contains NaN, which {fmt} cannot represent (it has no NaN code)")
        sign = (rb[idx] >> U(W - 1)) << U(fmt.bits - 1) if fmt.signed else U(0)
        inf_code = max(fmt.inf_code, 0)
        nan_code = _nan_code(fmt)
        nan_sign = sign if fmt.nan in ("ieee", "fn") else U(0)
        code[idx] = np.where(nan, U(max(nan_code, 0)) | nan_sign, U(inf_code) | sign)
    return code


def encode(
    x: Any,
    fmt: str | FloatFormat | IntFormat,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
    random_bits: int | None = None,
) -> np.ndarray:
    """Round ``x`` to ``fmt`` (as :func:`~precision_lab.round_to`) and return the codes.

    Codes are unsigned integers of the format's width: uint8 for formats of 8 bits or fewer (the
    low bits hold the code), then uint16, uint32, uint64. Integer formats use two's complement.
    ``x`` is converted as by :func:`~precision_lab.round_to` (integer and bool input, DLPack and
    array-API arrays, whose type the codes come back in); a 0-d input gives a 0-d array.
    NaN is the format's canonical quiet NaN with the input's sign where the format has one; NaN
    input raises ValueError for formats without NaN (e2m1, e2m3, e3m2, integers).

    >>> encode([1.5, -6.0, 0.3], "e2m1")
    array([ 3, 15,  1], dtype=uint8)
    >>> encode([-3.0, 200.0], "int8")
    array([253, 127], dtype=uint8)
    """
    f = get_format(fmt)
    o = check_options(rounding, overflow, subnormals, seed, random_bits)
    x, restore = as_input(x)
    if is_device_array(x) or x.dtype.kind not in "biu":  # integers: the numpy path below
        served = _core.route("encode", x, f, o)
        if served is not None:
            return restore(served)  # type: ignore[no-any-return]
    if isinstance(f, IntFormat):
        vals = round_to(x, f, rounding=o.mode, seed=o.seed, random_bits=o.random_bits)
        if np.isnan(vals).any():
            raise ValueError(f"x contains NaN, which {f} cannot represent")
        return restore(
            np.asarray((vals.astype(np.int64) & ((1 << f.bits) - 1)).astype(f.code_dtype))
        )  # type: ignore[no-any-return]
    if x.dtype.kind in "biu":  # integers: rounded once (round_to), then the exact grid values
        kw: dict[str, Any] = {"subnormals": o.subnormals, "random_bits": o.random_bits}
        vals = round_to(x, f, rounding=o.mode, overflow=o.overflow, seed=o.seed, **kw)
        return restore(encode(vals, f, overflow=o.overflow, **kw))  # type: ignore[no-any-return]
    a = as_float_array(x)
    wdt = working_dtype(a.dtype, f)
    p = _plan(f, wdt.name, o.mode, o.overflow, o.subnormals == "flush")
    src = np.ascontiguousarray(a).reshape(-1)
    out = np.empty(a.shape, dtype=f.code_dtype)
    flat = out.reshape(-1)

    flagged: list[tuple[np.ndarray, np.ndarray | None]] = []

    def work(lo: int, hi: int) -> None:
        rw = o.words(hi - lo, lo)
        r = _scratch(p.F, hi - lo, slot=2)
        with np.errstate(all="ignore"):
            idx = _round_float_chunk(
                p, src[lo:hi], r, rw, masked=False, patch=False, fast_zero=False
            )
            _fast_codes(p, r.view(p.U), flat[lo:hi])
        if idx is not None:
            flagged.append((idx + lo, None if rw is None else rw[idx]))

    for_chunks(src.size, work)
    if flagged:
        with np.errstate(all="ignore"):
            where, res = repair(p, src, flagged)
            flat[where] = _float_codes(p, res.view(p.U))
    return restore(out)  # type: ignore[no-any-return]


def _decode_arith(codes: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """float64 values of uint64 codes, by the format's definition."""
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    assert fmt.bias is not None
    c = codes.astype(np.uint64)
    if fmt.signed:
        neg = (c >> np.uint64(fmt.bits - 1)) & np.uint64(1) == 1
        mag = c & np.uint64(fmt.sign_code - 1)
    else:
        neg = np.zeros(c.shape, dtype=bool)
        mag = c
    exp_field = (mag >> np.uint64(m)).astype(np.int64)
    frac = (mag & np.uint64((1 << m) - 1)).astype(np.float64)
    with np.errstate(all="ignore"):
        normal = np.ldexp(frac + float(1 << m), exp_field - fmt.bias - m)
        if fmt.has_zero:
            sub = np.ldexp(frac, fmt.emin - m) if fmt.has_subnormals else np.zeros_like(frac)
            val = np.where(exp_field == 0, sub, normal)
        else:
            val = normal
    top = (1 << e) - 1
    if fmt.nan == "ieee":
        val = np.where(exp_field == top, np.where(frac == 0, np.inf, np.nan), val)
    elif fmt.nan == "fn":
        val = np.where(mag == np.uint64((1 << (e + m)) - 1), np.nan, val)
    elif fmt.nan == "fnuz":
        val = np.where(neg & (mag == 0), np.nan, val)
    if fmt.has_inf and fmt.nan != "ieee":  # P3109 extended: inf next to the NaN code
        val = np.where(mag == np.uint64(fmt.inf_code), np.inf, val)
    nan_keeps_sign = fmt.nan in ("ieee", "fn")
    return np.where(neg & (nan_keeps_sign | ~np.isnan(val)), -val, val)


def _out_dtype(fmt: FloatFormat | IntFormat) -> np.dtype:
    return working_dtype(np.dtype(np.float32), fmt)


@lru_cache(maxsize=64)
def _table(fmt: FloatFormat | IntFormat) -> np.ndarray:
    codes = np.arange(1 << fmt.bits, dtype=np.uint64)
    return _decode_any(codes, fmt).astype(_out_dtype(fmt))


def _decode_any(codes: np.ndarray, fmt: FloatFormat | IntFormat) -> np.ndarray:
    if isinstance(fmt, IntFormat):
        c = codes.astype(np.int64)
        if fmt.signed:
            c = np.where(c >= (1 << (fmt.bits - 1)), c - (1 << fmt.bits), c)
        return c.astype(np.float64)
    return _decode_arith(codes, fmt)


def decode(codes: Any, fmt: str | FloatFormat | IntFormat) -> np.ndarray:
    """Values of ``codes`` (any unsigned or non-negative integer array) in ``fmt``.

    Returns float32 (float64 for formats float32 cannot hold, such as fp64), of the codes' shape
    (0-d for 0-d codes) and array type (numpy, or the DLPack / array-API type passed in).

    >>> decode([0x3C00, 0x7C00, 0x0001], "fp16")
    array([1.0000000e+00,           inf, 5.9604645e-08], dtype=float32)
    >>> decode([16], "e2m1")
    Traceback (most recent call last):
    ...
    ValueError: codes must be in 0..15 for e2m1 (a 4-bit format), got values up to 16
    """
    f = get_format(fmt)
    codes, restore = as_input(codes, "codes")
    served = _core.route("decode", codes, f, None)
    if served is not None:
        return restore(served)  # type: ignore[no-any-return]
    return restore(_decode_numpy(codes, f))  # type: ignore[no-any-return]


def _decode_numpy(c: np.ndarray, f: FloatFormat | IntFormat) -> np.ndarray:
    if c.dtype.kind not in "ui":
        raise TypeError(f"codes must be an integer array, got {c.dtype.name}")
    if c.size:
        top = (1 << f.bits) - 1
        if c.dtype.kind == "i" and c.min() < 0:
            raise ValueError(f"codes must be non-negative, got {c.min()}")
        if c.dtype.itemsize * 8 > f.bits and int(c.max()) > top:
            raise ValueError(
                f"codes must be in 0..{top} for {f} (a {f.bits}-bit format), "
                f"got values up to {int(c.max())}"
            )
    if f.bits <= 16:
        return np.asarray(_table(f)[c.astype(np.intp, copy=False)])
    out = _out_dtype(f)
    if isinstance(f, FloatFormat) and f == get_format("fp32"):
        return c.astype(np.uint32).view(np.float32).copy()
    if isinstance(f, FloatFormat) and f == get_format("fp64"):
        return c.astype(np.uint64).view(np.float64).copy()
    return _decode_any(c, f).astype(out)
