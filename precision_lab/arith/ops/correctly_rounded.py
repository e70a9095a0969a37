"""The correctly rounded ops: ``add sub mul fma div sqrt reciprocal`` (the exact real result
rounded once, in every mode; semantics in :mod:`.elementwise`).

>>> import precision_lab as pl
>>> float(pl.ops.div(1.0, 3.0, "bf16", rounding="down"))
0.33203125
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

import numpy as np

from ...core.exact import (
    Rounder,
    odd_collapse,
    round_scaled,
    round_sum,
    two_product_error,
    two_sum,
)
from .call import Call, _product, _tame, run
from .fast_paths import _float32_path, _native_path

__all__ = ["add", "div", "fma", "mul", "reciprocal", "sqrt", "sub"]


def add(
    x: Any,
    y: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``x + y`` correctly rounded to ``fmt`` (see the module docstring for the semantics).

    >>> import precision_lab as pl
    >>> pl.ops.add([1.0, 448.0], [0.0625, 32.0], "e4m3").tolist()   # 1.0625 ties to even; overflow
    [1.0, nan]
    """
    fast = _native_path("add", (x, y), fmt, rounding, overflow, subnormals, seed)
    if fast is None:
        fast = _float32_path("add", x, y, fmt, rounding, overflow, subnormals, seed)
    if fast is not None:
        return fast
    ops = {"x": x, "y": y}
    return run(fmt, rounding, overflow, subnormals, seed, ops, lambda c: _add_vals(c, *c.vals))


def _add_vals(c: Call, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        shadow = a + b
    ok = np.isfinite(shadow)
    s, t = two_sum(np.where(ok, a, 0.0), np.where(ok, b, 0.0))
    s = np.where(ok, s, shadow)
    out = c.finish(s, t, shadow, ok, zero_pair=(a, b))
    over = np.flatnonzero(~ok & np.isfinite(a) & np.isfinite(b))
    if over.size:  # finite operands whose sum leaves float64's range (formats that wide only)
        out.reshape(-1)[over] = _add_at_half_scale(c, a[over], b[over], over)
    return out


def _add_at_half_scale(c: Call, a: np.ndarray, b: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Round ``a + b`` beyond float64's range: ``(a/2 + b/2)`` (exact: such operands are
    normal) rounded onto a format with the same grid near its top at half the scale (the same
    overflow rule at half the threshold), then doubled (exact)."""
    f, o = c.fmt, c.opts
    assert f.bias is not None
    # (no subnormals: they are never reached here, and fp64's would fall below float64's)
    # one exponent bit fewer and emax one lower: the same grid and overflow threshold at half
    # the scale, with a lowest binade float64 still holds (bias + 1 alone would need quanta below
    # 2**-1074 there)
    half = dataclasses.replace(f, exponent_bits=f.exponent_bits - 1, bias=0, has_subnormals=False,
                               name=None)  # fmt: skip
    half = dataclasses.replace(half, bias=half.emax - (f.emax - 1))
    words = c.words()
    r = Rounder(half, o.mode, o.overflow, o.subnormals, o.seed, o.random_bits)
    s, t = two_sum(a / 2, b / 2)
    return round_sum(s, t, r, None if words is None else words[idx]) * 2


def sub(
    x: Any,
    y: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``x - y`` correctly rounded to ``fmt``.

    >>> import precision_lab as pl
    >>> float(pl.ops.sub(1.0, 2.0**-12, "bf16", rounding="toward_zero"))
    0.99609375
    """
    fast = _native_path("sub", (x, y), fmt, rounding, overflow, subnormals, seed)
    if fast is not None:
        return fast
    ops = {"x": x, "y": y}
    return run(
        fmt,
        rounding,
        overflow,
        subnormals,
        seed,
        ops,
        lambda c: _add_vals(c, c.vals[0], -c.vals[1]),
    )


def mul(
    x: Any,
    y: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``x * y`` correctly rounded to ``fmt``.

    >>> import precision_lab as pl
    >>> float(pl.ops.mul(1.125, 1.125, "e4m3", rounding="odd"))   # exact 1.265625
    1.375
    """
    fast = _native_path("mul", (x, y), fmt, rounding, overflow, subnormals, seed)
    if fast is None:
        fast = _float32_path("mul", x, y, fmt, rounding, overflow, subnormals, seed)
    if fast is not None:
        return fast
    return run(fmt, rounding, overflow, subnormals, seed, {"x": x, "y": y}, _mul_vals)


def _mul_vals(c: Call) -> np.ndarray:
    a, b = c.vals
    if not _tame(c.fmt):  # fp64 and wide formats: scaled by powers of two, any magnitude
        ok = np.isfinite(a) & np.isfinite(b) & (a != 0) & (b != 0)
        with np.errstate(invalid="ignore", over="ignore", under="ignore"):
            shadow = a * b
        h, lo, e = _scaled_product(np.where(ok, a, 1.0), np.where(ok, b, 1.0))
        return c.finish(h, lo, shadow, ok, scale=e)
    h, lo = _product(a, b, True)
    ok = np.isfinite(h)
    return c.finish(h, np.where(ok, lo, 0.0), h, ok)


def _scaled_product(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``a * b == (h + lo) * 2**e`` exactly for finite non-zero ``a``, ``b``: the product of
    their significands in [1/2, 1) (Dekker's product neither overflows nor underflows there)."""
    ma, ea = np.frexp(a)
    mb, eb = np.frexp(b)
    h = ma * mb
    return h, two_product_error(ma, mb, h), ea.astype(np.int64) + eb


def _fma_scaled(
    c: Call, a: np.ndarray, b: np.ndarray, d: np.ndarray, idx: np.ndarray
) -> np.ndarray:
    """``a * b + d`` (finite, ``a * b != 0``) at elements ``idx``, at any magnitude: the terms
    scaled by the largest one's power of two (exact); a term below ``2**-200`` of it only
    decides the direction of the rounding, so a value of its sign stands in for it."""
    a, b, d = a[idx], b[idx], d[idx]
    h1, l1, p = _scaled_product(a, b)
    md, de = np.frexp(d)
    m = np.where(d == 0, p, np.maximum(p, de))
    far_p = p - m < -200
    far_d = (d != 0) & (de - m < -200)
    hs = np.where(far_p, np.copysign(2.0**-300, h1), np.ldexp(h1, np.maximum(p - m, -300)))
    ls = np.where(far_p, 0.0, np.ldexp(l1, np.maximum(p - m, -300)))
    ds = np.where(far_d, np.copysign(2.0**-300, md), np.ldexp(md, np.maximum(de - m, -300)))
    down = c.opts.mode == "down"
    s, t = two_sum(hs, ds, down=down)
    u, v = two_sum(t, ls, down=down)
    s, t = two_sum(s, odd_collapse(u, v), down=down)
    words = c.words()
    return round_scaled(s, t, m, c.rounder, None if words is None else words[idx])


def fma(
    x: Any,
    y: Any,
    z: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``x * y + z`` with one rounding (fused multiply-add), correctly rounded to ``fmt``.

    >>> import precision_lab as pl
    >>> a, b = 1.0 + 2**-8, 1.0 - 2**-8
    >>> float(pl.ops.fma(a, b, -1.0, "fp16"))   # exact -2**-16
    -1.52587890625e-05
    >>> float(pl.ops.sub(pl.ops.mul(a, b, "fp16"), 1.0, "fp16"))   # a * b rounds to 1 first
    0.0
    """
    fast = _native_path("fma", (x, y, z), fmt, rounding, overflow, subnormals, seed)
    if fast is not None:
        return fast
    ops = {"x": x, "y": y, "z": z}
    return run(fmt, rounding, overflow, subnormals, seed, ops, _fma_vals)


def _fma_vals(c: Call) -> np.ndarray:
    a, b, d = c.vals
    tame = _tame(c.fmt)
    h, lo = _product(a, b, tame)
    with np.errstate(invalid="ignore", over="ignore"):
        shadow = h + d
    ok = np.isfinite(shadow)
    h0, lo0, d0 = (np.where(ok, v, 0.0) for v in (h, lo, d))
    s, t = two_sum(h0, d0)
    if not tame:  # exact h + lo + d: round-to-odd of the small terms, then one more two-sum
        u, v = two_sum(t, lo0)
        s, t = two_sum(s, odd_collapse(u, v))
    s = np.where(ok, s, shadow)
    out = c.finish(s, t, shadow, ok, zero_pair=(h, d))
    if not tame:  # finite non-zero products at any magnitude (fp64 and wide formats)
        idx = np.flatnonzero(np.isfinite(a) & np.isfinite(b) & np.isfinite(d) & (a != 0) & (b != 0))
        if idx.size:
            out.reshape(-1)[idx] = _fma_scaled(c, a, b, d, idx)
    return out


def div(
    x: Any,
    y: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``x / y`` correctly rounded to ``fmt`` (``x / 0`` is a signed infinity, ``0 / 0`` NaN).

    >>> import precision_lab as pl
    >>> pl.ops.div([1.0, 1.0, 1.0], [3.0, 3.0, 0.0], "bf16", rounding="up").tolist()
    [0.333984375, 0.333984375, inf]
    """
    fast = _native_path("div", (x, y), fmt, rounding, overflow, subnormals, seed)
    if fast is not None:
        return fast
    ops = {"x": x, "y": y}
    return run(fmt, rounding, overflow, subnormals, seed, ops, lambda c: _div_vals(c, *c.vals))


def _div_vals(c: Call, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore", divide="ignore", under="ignore"):
        q = a / b
    scale = None
    if _tame(c.fmt):
        ok = np.isfinite(q) & (b != 0) & np.isfinite(a) & np.isfinite(b)
        a0, b0, q0 = (np.where(ok, v, 1.0) for v in (a, b, q))
    else:  # fp64 and wide formats: the significands' quotient, scaled by powers of two
        ok = (a != 0) & (b != 0) & np.isfinite(a) & np.isfinite(b)
        a0, ea = np.frexp(np.where(ok, a, 1.0))
        b0, eb = np.frexp(np.where(ok, b, 1.0))
        scale = ea.astype(np.int64) - eb
        q0 = a0 / b0
    with np.errstate(invalid="ignore", over="ignore"):
        h = q0 * b0
        r = (a0 - h) - two_product_error(q0, b0, h)  # the exact remainder a - q * b
        t = np.where(ok, r / b0, 0.0)
    if scale is not None:
        q0 = np.where(ok, q0, q)

    def floor_scaled(i: int, s: Fraction, sign: int, k: int) -> int:
        v = Fraction(float(a[i])) / Fraction(float(b[i]))
        return math.floor(sign * (v - s) * Fraction(2) ** k)

    if scale is not None:
        return c.finish(q0, t, q, ok, exact_fraction=floor_scaled, scale=scale)
    return c.finish(q, t, q, ok, exact_fraction=floor_scaled)


def sqrt(
    x: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``sqrt(x)`` correctly rounded to ``fmt`` (``sqrt(-0) = -0``, negative numbers give NaN).

    >>> import precision_lab as pl
    >>> pl.ops.sqrt([2.0, 2.0], "e4m3", rounding="down").tolist()
    [1.375, 1.375]
    """
    fast = _native_path("sqrt", (x,), fmt, rounding, overflow, subnormals, seed)
    if fast is not None:
        return fast
    return run(fmt, rounding, overflow, subnormals, seed, {"x": x}, _sqrt_vals)


def _sqrt_vals(c: Call) -> np.ndarray:
    (a,) = c.vals
    with np.errstate(invalid="ignore"):
        q = np.sqrt(a)
    ok = np.isfinite(q) & (a > 0)
    # work on a * 4**k near 1 (exact), so that Dekker's product neither overflows nor underflows
    k = np.where(ok, -(np.frexp(np.where(ok, a, 1.0))[1] // 2), 0)
    a0 = np.where(ok, np.ldexp(a, 2 * k), 1.0)
    q0 = np.sqrt(a0)
    with np.errstate(invalid="ignore", over="ignore"):
        h = q0 * q0
        r = (a0 - h) - two_product_error(q0, q0, h)  # the exact remainder a0 - q0 * q0
        t = np.where(ok, np.ldexp(r / (2.0 * q0), -k), 0.0)

    def floor_scaled(i: int, s: Fraction, sign: int, k: int) -> int:
        # sign = +1 (s > 0); floor(sqrt(v) * 2**k) = isqrt(floor(v * 4**k)); s * 2**k is an
        # integer (s has 53 bits, the quantum 2**(k - 64) is at least 2**11 ulps of s)
        sk = s * Fraction(2) ** k
        assert sign == 1 and sk.denominator == 1
        return math.isqrt(math.floor(Fraction(float(a[i])) * Fraction(4) ** k)) - int(sk)

    return c.finish(q, t, q, ok, exact_fraction=floor_scaled)


def reciprocal(
    x: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``1 / x`` correctly rounded to ``fmt`` (:func:`div` with ``x = 1``).

    >>> import precision_lab as pl
    >>> float(pl.ops.reciprocal(3.0, "fp16"))
    0.333251953125
    """
    fast = _native_path("div", (_ONE32, x), fmt, rounding, overflow, subnormals, seed)
    if fast is not None:
        return fast
    return run(
        fmt,
        rounding,
        overflow,
        subnormals,
        seed,
        {"x": x},
        lambda c: _div_vals(c, np.ones_like(c.vals[0]), c.vals[0]),
    )


_ONE32 = np.ones((), dtype=np.float32)  # the dividend of reciprocal on the native path
