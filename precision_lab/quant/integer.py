"""Integer quantization (INT8, UINT8, INT4 ...): quantize, dequantize and calibrate.

Affine quantization maps a float ``x`` to the integer

    q = clamp(round(x / scale) + zero_point, qmin, qmax)

with one ``scale``/``zero_point`` for the whole tensor or one per index along ``axis`` (per
channel), as ``torch.quantize_per_tensor`` / ``torch.quantize_per_channel`` define it: round first
(half to even by default), then add the zero point, then clamp. ``dequantize`` is
``(q - zero_point) * scale``.

**The quotient is rounded once, exactly.** ``round`` is applied to the exact real number
``x / scale``, not to a float approximation of it: the quotient is formed in float64 in
round-to-odd (a float64 division whose residual ``x - q * scale`` is computed exactly with
Dekker's product), which holds enough information for any rounding of it to an integer to be the
correct rounding of the exact quotient; the rounding itself is the core's
:func:`~precision_lab.round_to` to an integer format. torch instead rounds
``float32(x * float32(1 / float32(scale)))`` (fbgemm's reciprocal trick), which rounds the
wrong way about once per 10**6 random float32 inputs (and often for inputs next to a tie
``(k + 1/2) * scale``); ``division="torch"`` reproduces that
quotient bit for bit (measured against torch 2.13 ``quantize_per_tensor``/``per_channel`` and
``fake_quantize_per_tensor_affine``; with a non-zero zero point torch's x86 kernels add the zero
point *before* rounding, so they differ from their own documented formula at ties).

Dtype rules. ``quantize`` returns int8 for signed formats of at most 8 bits (int8, int4: an int4
value is held in an int8), uint8 for unsigned ones (uint8, uint4), and int16/uint16, int32/uint32
for wider formats. ``dequantize`` returns float32, correctly rounded from the exact product
``(q - zero_point) * scale`` (so equal to torch's float32 product when the scale is a float32
value), unless ``scale`` is a float64 NumPy array or ``numpy.float64`` scalar: then float64.
Python floats count as float32-result scales (like NumPy's weak scalars); ``dtype=`` overrides.

>>> import numpy as np
>>> x = np.array([-1.0, -0.26, 0.0, 0.25, 0.5, 2.0], dtype=np.float32)
>>> q = quantize(x, "int8", 2**-6)
>>> q
array([-64, -17,   0,  16,  32, 127], dtype=int8)
>>> dequantize(q, 2**-6)
array([-1.      , -0.265625,  0.      ,  0.25    ,  0.5     ,  1.984375], dtype=float32)
>>> cal = calibrate(x, "int8")
>>> float(cal.scale) * 127 >= 2.0, int(cal.zero_point)
(True, 0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.native import kernels as native_kernels
from ..core.exact import SPLIT as _SPLIT
from ..core.exact import two_product_error
from ..core.formats import IntFormat, get_format
from ..core.inputs import as_input
from ..core.random_words import check_seed
from ..core.rounding import (
    ROUNDING_MODES,
    STOCHASTIC_MODES,
    _random_for,
    _round_int_chunk,
    as_float_array,
    check_random_bits,
    check_rounding,
    for_chunks,
    round_to,
    sr_mode,
    word_bits,
)
from ..core.shapes import broadcast_shapes

__all__ = ["CALIBRATION_METHODS", "Calibration", "calibrate", "dequantize", "quantize"]

CALIBRATION_METHODS = ("max", "percentile", "mse", "entropy")
DIVISIONS = ("exact", "torch")

#: the most histogram bins calibrate accepts
_MAX_BINS = 1 << 24
#: integer format wide enough for every rounded quotient before the zero point and the clamp
_WIDE = IntFormat(32, True, "int32")


# ----- argument checks -------------------------------------------------------------------------
def _int_format(fmt: Any) -> IntFormat:
    f = get_format(fmt)
    if not isinstance(f, IntFormat):
        raise ValueError(
            f"fmt must be an integer format (int8, uint8, int4, uint4 or an IntFormat), got {f}; "
            "float formats are reached with round_to or quantize_blocks"
        )
    return f


def _q_dtype(fmt: IntFormat) -> np.dtype:
    for bits, signed, unsigned in ((8, np.int8, np.uint8), (16, np.int16, np.uint16)):
        if fmt.bits <= bits:
            return np.dtype(signed if fmt.signed else unsigned)
    return np.dtype(np.int32 if fmt.signed else np.uint32)


def qrange(fmt: str | IntFormat, narrow_range: bool = False) -> tuple[int, int]:
    """``(qmin, qmax)`` of an integer format; ``narrow_range`` drops the lowest code.

    >>> qrange("int8"), qrange("int8", narrow_range=True), qrange("uint4")
    ((-128, 127), (-127, 127), (0, 15))
    """
    f = _int_format(fmt)
    return f.min + int(bool(narrow_range)), f.max


def _check_axis(axis: Any, ndim: int) -> int | None:
    if axis is None:
        return None
    if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
        raise TypeError(f"axis must be an int or None, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for an array with {ndim} dimension(s)")
    return int(axis) % ndim


def _per_axis(
    value: Any, name: str, shape: tuple[int, ...], axis: int | None, kinds: str
) -> np.ndarray:
    """``value`` as an array broadcasting against ``shape`` (one entry, or one per axis index)."""
    a = np.asarray(value)
    if a.dtype.kind not in kinds:
        want = "an integer" if kinds == "iu" else "a real number"
        raise TypeError(f"{name} must be {want} or an array of them, got dtype {a.dtype.name}")
    if axis is None:
        if a.size != 1:
            raise ValueError(
                f"{name} has shape {a.shape} but axis=None needs a single {name}; "
                "pass axis= for per-channel values"
            )
        return a.reshape(())
    n = shape[axis]
    if a.size == 1:  # a single value broadcasts along the axis
        return a.reshape((1,) * len(shape))
    if a.ndim != 1 or a.shape[0] != n:
        raise ValueError(
            f"{name} has shape {a.shape} but axis={axis} of x has length {n}: "
            f"expected a single value or shape ({n},)"
        )
    out_shape = [1] * len(shape)
    out_shape[axis] = a.shape[0]
    return a.reshape(out_shape)


def _scale(scale: Any, shape: tuple[int, ...], axis: int | None) -> np.ndarray:
    s = _per_axis(scale, "scale", shape, axis, "fiu").astype(np.float64)
    bad = ~(np.isfinite(s) & (s > 0))
    if bad.any():
        raise ValueError(f"scale must be finite and > 0, got {s[bad].flat[0]!r}")
    return s


def _zero_point(
    zero_point: Any, fmt: IntFormat | None, shape: tuple[int, ...], axis: int | None
) -> np.ndarray:
    """The zero point(s) as int64, checked against ``fmt``'s range (int64's without a format).

    Values are compared before any conversion, so ``np.uint64(2**63)`` or ``2**70`` are reported
    as they are instead of wrapping around.
    """
    lo, hi = (fmt.min, fmt.max) if fmt is not None else (-(2**63), 2**63 - 1)
    where = f" for {fmt}" if fmt is not None else " (int64)"

    def out_of_range(v: int) -> ValueError:
        return ValueError(f"zero_point must lie in {lo}..{hi}{where}, got {v}")

    if isinstance(zero_point, int) and not isinstance(zero_point, bool):
        if not lo <= zero_point <= hi:
            raise out_of_range(zero_point)
        zero_point = np.int64(zero_point)
    z = _per_axis(zero_point, "zero_point", shape, axis, "iu")
    if z.dtype == np.uint64:  # beyond int64: compare as unsigned (lo <= 0 for every format)
        bad = z > np.uint64(hi)
    else:
        z = z.astype(np.int64)
        bad = (z < lo) | (z > hi)
    if bad.any():
        raise out_of_range(int(z[bad].flat[0]))
    return z.astype(np.int64)


# ----- exact arithmetic helpers ----------------------------------------------------------------
def _to_odd(v: np.ndarray, residual_sign: np.ndarray) -> np.ndarray:
    """Round-to-odd from ``v = RN(exact)`` and the sign of ``exact - v`` (0 where exact).

    Where ``v`` is inexact and even, the result is its neighbour on the side of the exact value
    (one bit-pattern step; both neighbours of an even pattern are odd). ``v`` must be finite and
    non-zero where the residual is non-zero.
    """
    u = np.asarray(v, dtype=np.float64).view(np.int64)
    step = (u & 1) ^ 1  # 1 where the pattern is even
    step *= residual_sign
    np.negative(step, out=step, where=u < 0)  # for negative v, a larger pattern is further down
    step += u
    return step.view(np.float64)


def _residual_sign(d: np.ndarray, e: np.ndarray) -> np.ndarray:
    """sign(d - e) as int8, for exact d and e (NaN compares as 0)."""
    rs = (d > e).view(np.int8)
    rs -= (d < e).view(np.int8)
    return rs


_SAFE = 2.0**900  # inside [2**-900, 2**900] Dekker's product neither overflows nor underflows
_LOW27 = np.uint64((1 << 27) - 1)
_LOW29 = np.uint64((1 << 29) - 1)


def _odd_quotient(x: Any, s: Any) -> np.ndarray:
    """float64 round-to-odd of the exact quotient ``x / s`` (``s > 0`` finite; broadcasts).

    Rounding this value to an integer, in any deterministic mode, gives the rounding of the exact
    quotient: round-to-odd at 53 bits keeps the sticky information the later rounding needs (the
    float64 grid is at least 2 bits finer than the integers wherever ``|x / s| < 2**51``, and
    beyond that the result saturates anyway). ``q = RN(x / s)`` is exact or not according to the
    sign of the residual ``x - q * s``, which is computed exactly: ``q * s = p + err`` (Dekker's
    product) and ``x - p`` is exact (Sterbenz). Chunked over the flat index (temporaries stay in
    cache); a shorter path serves float16/float32 ``x`` with scales of at most 26 significant bits
    (every float32 scale) in a tame range.
    """
    xa = np.asarray(x)
    sa = np.asarray(s, dtype=np.float64)
    shape = broadcast_shapes(xa.shape, sa.shape)
    xf = np.broadcast_to(xa, shape).reshape(-1)
    sf = sa.reshape(()) if sa.size == 1 else np.broadcast_to(sa, shape).reshape(-1)
    short = bool(np.all(sa.view(np.uint64) & _LOW27 == 0))
    tame = xa.dtype.itemsize <= 4 and bool(np.all((sa >= 2.0**-400) & (sa <= 2.0**400)))
    flat = _odd_quotient_short if short and tame else _odd_quotient_flat
    out = np.empty(xf.size, dtype=np.float64)

    def work(lo: int, hi: int) -> None:
        sc = sf if sf.ndim == 0 else sf[lo:hi]
        out[lo:hi] = flat(xf[lo:hi].astype(np.float64), sc)

    with np.errstate(all="ignore"):
        for_chunks(xf.size, work)
    return out.reshape(shape)


def _odd_quotient_short(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """x from float16/32, s with <= 26 significant bits in [2**-400, 2**400]: split q only,
    ``q * s = qh * s + ql * s`` with both products exact; no under- or overflow can occur.
    Zeros and infinities come out exact (NaN comparisons give a zero residual sign)."""
    q = x / s
    c = _SPLIT * q
    qh = c - (c - q)
    ql = q - qh
    qh *= s
    d = x - qh  # exact (Sterbenz)
    ql *= s
    return _to_odd(q, _residual_sign(d, ql))


def _odd_quotient_flat(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    s = np.broadcast_to(s, x.shape)
    q = x / s
    p = q * s
    err = two_product_error(q, s, p)
    d = x - p
    rs = _residual_sign(d, err)
    ax, aq = np.abs(x), np.abs(q)
    safe = (ax >= 1 / _SAFE) & (ax <= _SAFE) & (aq >= 1 / _SAFE) & (aq <= _SAFE)
    safe &= (s >= 1 / _SAFE) & (s <= _SAFE)
    special = (x == 0) | ~np.isfinite(x)  # q is exact (or inf)
    safe |= special
    rs[~safe | special] = 0
    out = _to_odd(q, rs)
    if not safe.all():
        idx = np.flatnonzero(~safe)
        out[idx] = _odd_quotient_scaled(x[idx], s[idx])
    return out


def _odd_quotient_scaled(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """:func:`_odd_quotient` for extreme magnitudes: the same on the frexp mantissas.

    Quotients below 2**-1000 become ±2**-1000 (the same integer rounding in every deterministic
    mode), so no subnormal float64 is ever formed; huge ones become ±inf (they saturate).
    """
    mx, ex = np.frexp(x)
    ms, es = np.frexp(s)
    q = mx / ms  # |q| in (1/2, 2): no overflow, no underflow
    p = q * ms
    err = two_product_error(q, ms, p)
    q_odd = _to_odd(q, _residual_sign(mx - p, err))
    k = np.clip(ex - es, -1000, 2000).astype(np.int64)
    return np.ldexp(q_odd, k)


def _torch_quotient(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """``float32(x) * float32(1 / float32(scale))`` in float32, as torch's CPU kernels compute."""
    inv = np.float32(1.0) / s.astype(np.float32)
    return x.astype(np.float32) * inv


# ----- quantize / dequantize -------------------------------------------------------------------
def quantize(
    x: Any,
    fmt: str | IntFormat,
    scale: Any,
    zero_point: Any = 0,
    *,
    axis: int | None = None,
    rounding: str = "nearest_even",
    narrow_range: bool = False,
    seed: int | None = None,
    random_bits: int | None = None,
    division: str = "exact",
) -> np.ndarray:
    """Quantize floats to an integer format: ``clamp(round(x / scale) + zero_point, qmin, qmax)``.

    Parameters
    ----------
    x:
        Float array (float16/32/64 or an ml_dtypes float; integer arrays raise TypeError); never
        modified. NaN raises ValueError (integers have no NaN); ±inf saturates.
    fmt:
        Integer format: ``"int8"``, ``"uint8"``, ``"int4"``, ``"uint4"`` or an ``IntFormat``.
    scale, zero_point:
        One value each (``axis=None``, per tensor), or one per index of ``x`` along ``axis``
        (per channel; a single value broadcasts). ``scale`` must be finite and > 0; the zero point
        an integer inside the format's range.
    rounding:
        Any rounding mode of :func:`~precision_lab.round_to`, applied to the exact quotient
        ``x / scale`` before the zero point is added (stochastic rounding is keyed by ``seed`` and
        the flat index of ``x``).
    narrow_range:
        Drop the lowest code (``-127..127`` for int8, ``1..255`` for uint8), as TensorRT and
        TensorFlow's ``narrow_range`` do.
    division:
        ``"exact"`` (default) rounds the exact quotient; ``"torch"`` rounds torch's float32
        quotient ``float32(x) * float32(1 / float32(scale))`` instead (bit-compatible with
        ``torch.quantize_per_tensor`` for zero point 0, and with
        ``torch.fake_quantize_per_tensor_affine`` for any zero point).

    Returns
    -------
    Integer array of x's shape: int8/uint8 for formats of at most 8 bits (int4 values in int8),
    int16/uint16 up to 16 bits, int32/uint32 beyond.

    >>> quantize([0.3, -0.3, 1e9, -np.inf], "int8", 0.1)
    array([   3,   -3,  127, -128], dtype=int8)
    >>> x = np.float32(0.35)  # 0.3499999940..., just below 3.5 * 0.1
    >>> int(quantize(x, "int8", 0.1)), int(quantize(x, "int8", 0.1, division="torch"))
    (3, 4)
    >>> quantize([1.25, 1.35], "uint8", 0.1, zero_point=128, rounding="toward_zero")
    array([140, 141], dtype=uint8)
    >>> quantize([[1.0, -1.0], [1.0, -1.0]], "int4", [0.25, 0.5], axis=0, narrow_range=True)
    array([[ 4, -4],
           [ 2, -2]], dtype=int8)
    """
    f = _int_format(fmt)
    mode = sr_mode(check_rounding(rounding), check_random_bits(random_bits))
    if division not in DIVISIONS:
        raise ValueError(f"division must be one of {DIVISIONS}, got {division!r}")
    x, restore = as_input(x)
    a = as_float_array(x)
    ax = _check_axis(axis, a.ndim)
    s = _scale(scale, a.shape, ax)
    z = _zero_point(zero_point, f, a.shape, ax)
    qmin, qmax = qrange(f, narrow_range)
    native = _quantize_native(a, f, s, z, ax, mode, qmin, qmax, division)
    if native is not None:
        return restore(native)  # type: ignore[no-any-return]
    if np.isnan(a).any():
        raise ValueError(f"x contains NaN, which {f} cannot represent")
    q = _quantize_numpy(a, f, s, z, ax, mode, qmin, qmax, division, seed, random_bits)
    return restore(q)  # type: ignore[no-any-return]


def _quantize_numpy(
    a: np.ndarray,
    f: IntFormat,
    s: np.ndarray,
    z: np.ndarray,
    axis: int | None,
    mode: str,
    qmin: int,
    qmax: int,
    division: str,
    seed: int | None,
    random_bits: int | None,
) -> np.ndarray:
    """:func:`quantize` on numpy, chunk by chunk of the flat index: the quotient, the random words
    of the chunk's flat indices (stochastic modes) and the rounding stay chunk-sized (no
    whole-array float64 copies), with the same results as one ``round_to`` of the whole quotient.
    """
    rbits = check_random_bits(random_bits)
    key = check_seed(seed) if mode in STOCHASTIC_MODES else None
    c, inner, sv, zv = _channels(a.shape, axis, s, z)
    flat = np.ascontiguousarray(a).reshape(-1)
    out = np.empty(a.size, dtype=_q_dtype(f))

    def work(lo: int, hi: int) -> None:
        ch = (np.arange(lo, hi) // inner) % c if c > 1 else np.zeros(1, dtype=np.intp)
        sc, zc = sv[ch], zv[ch]
        with np.errstate(all="ignore"):
            if division == "exact":
                quotient = _odd_quotient(flat[lo:hi].astype(np.float64), sc)
            else:
                quotient = _torch_quotient(flat[lo:hi], sc)
        rw = None if key is None else _random_for(word_bits(mode, rbits), key, hi - lo, lo)
        k = np.empty(hi - lo, dtype=np.float64)
        _round_int_chunk(_WIDE, mode, quotient, k, rw)
        k += zc  # exact: integers below 2**53
        np.clip(k, qmin, qmax, out=k)
        out[lo:hi] = k

    for_chunks(a.size, work)
    return out.reshape(a.shape)


# ----- the native kernels (precision_lab._native_kernels): same results, no float64 copies -----
_CODES = {np.dtype(t): i for i, t in enumerate((np.int8, np.uint8, np.int16, np.uint16, np.int32,
                                                np.uint32))}  # fmt: skip


def _channels(
    shape: tuple[int, ...], axis: int | None, s: np.ndarray, z: np.ndarray
) -> tuple[int, int, np.ndarray, np.ndarray]:
    """(C, inner, scales, zero points) of the kernels: channel ``(i // inner) % C`` of flat i."""
    n = int(np.prod(shape))
    if axis is None or (s.size == 1 and z.size == 1):
        return 1, max(n, 1), s.reshape(1).astype(np.float64), z.reshape(1).astype(np.float64)
    c = shape[axis]
    inner = int(np.prod(shape[axis + 1 :]))
    sv = np.ascontiguousarray(np.broadcast_to(s.reshape(-1), (c,)), dtype=np.float64)
    zv = np.ascontiguousarray(np.broadcast_to(z.reshape(-1), (c,)), dtype=np.float64)
    return c, max(inner, 1), sv, zv


def _quantize_native(
    a: np.ndarray,
    f: IntFormat,
    s: np.ndarray,
    z: np.ndarray,
    axis: int | None,
    mode: str,
    qmin: int,
    qmax: int,
    division: str,
) -> np.ndarray | None:
    """:func:`quantize` on the native kernels, or None where they do not apply (then numpy)."""
    ext = native_kernels.ext if native_kernels.active() else None
    qdt = _q_dtype(f)
    if (
        ext is None
        or mode in STOCHASTIC_MODES
        or a.dtype not in (np.dtype(np.float32), np.dtype(np.float64))
        or not a.flags.c_contiguous
        or qdt not in _CODES
        or a.size == 0
    ):
        return None
    c, inner, sv, zv = _channels(a.shape, axis, s, z)
    if division == "torch":  # float32 scales that under- or overflow: numpy's NaN handling
        with np.errstate(all="ignore"):
            s32 = np.abs(sv.astype(np.float32))
        if not bool(np.all((s32 >= np.finfo(np.float32).tiny) & np.isfinite(s32))):
            return None
    short = bool(np.all(sv.view(np.uint64) & _LOW27 == 0)) and (
        a.itemsize <= 4 and bool(np.all((sv >= 2.0**-400) & (sv <= 2.0**400)))
    )
    out = np.empty(a.shape, dtype=qdt)
    nans: list[int] = []
    code, m = _CODES[qdt], ROUNDING_MODES.index(mode)
    torch = division == "torch"

    def work(lo: int, hi: int) -> None:
        nans.append(
            ext.quantize(a, out, code, c, inner, sv, zv, m, short, torch, qmin, qmax, lo, hi)
        )

    for_chunks(a.size, work)
    if sum(nans):
        raise ValueError(f"x contains NaN, which {f} cannot represent")
    return out


def _dequantize_native(
    c: np.ndarray, s: np.ndarray, z: np.ndarray, axis: int | None, out: np.dtype
) -> np.ndarray | None:
    """:func:`dequantize` on the native kernels, or None where they do not apply (then numpy)."""
    ext = native_kernels.ext if native_kernels.active() else None
    if ext is None or c.dtype not in _CODES or not c.flags.c_contiguous or c.size == 0:
        return None
    ch, inner, sv, zv = _channels(c.shape, axis, s, z)
    # the float64 product is exact: <= 24-bit scales and |q - z| < 2**29
    short = bool(np.all(sv.view(np.uint64) & _LOW29 == 0)) and (
        c.itemsize <= 2 and float(np.abs(zv).max()) < 2.0**28
    )
    res = np.empty(c.shape, dtype=out)
    code = _CODES[c.dtype]
    for_chunks(
        c.size, lambda lo, hi: ext.dequantize(c, code, res, short, ch, inner, sv, zv, lo, hi)
    )
    return res


def _result_dtype(scale: Any, dtype: Any) -> np.dtype:
    if dtype is not None:
        dt = np.dtype(dtype)
        if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"dtype must be float32 or float64, got {dt.name}")
        return dt
    if isinstance(scale, np.ndarray | np.generic) and scale.dtype == np.float64:
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def dequantize(
    q: Any,
    scale: Any,
    zero_point: Any = 0,
    *,
    axis: int | None = None,
    dtype: Any = None,
) -> np.ndarray:
    """Floats from integer codes: ``(q - zero_point) * scale``, rounded once to the result dtype.

    ``q`` must hold integers (TypeError otherwise). The result is float32 (the exact product
    rounded to nearest even), or float64 when ``scale`` is a float64 NumPy array or
    ``numpy.float64`` (or ``dtype=np.float64`` is passed). Exact products are guaranteed for
    ``|q - zero_point| < 2**29``.

    >>> dequantize(np.array([-128, 0, 127], dtype=np.int8), 0.5)
    array([-64. ,   0. ,  63.5], dtype=float32)
    >>> dequantize([10, 10], np.array([0.1, 0.2]), [0, 5], axis=0)
    array([1., 1.])
    """
    c, restore = as_input(q, "q")
    return restore(_dequantize(c, scale, zero_point, axis, dtype))  # type: ignore[no-any-return]


def _dequantize(c: np.ndarray, scale: Any, zero_point: Any, axis: int | None, dtype: Any) -> Any:
    if c.dtype.kind not in "iu":
        raise TypeError(f"q must be an integer array, got dtype {c.dtype.name}")
    ax = _check_axis(axis, c.ndim)
    s = _scale(scale, c.shape, ax)
    z = _zero_point(zero_point, None, c.shape, ax)
    out = _result_dtype(scale, dtype)
    native = _dequantize_native(c, s, z, ax, out)
    if native is not None:
        return native
    k = c.astype(np.float64)  # exact below 2**53
    k -= z
    with np.errstate(all="ignore"):
        p = k * s
        if out == np.float64:
            return np.asarray(p, dtype=np.float64)
        short = bool(np.all(s.view(np.uint64) & _LOW29 == 0))  # <= 24 significant bits
        if short and (k.size == 0 or float(np.abs(k).max()) < 2.0**29):
            return np.asarray(p.astype(np.float32))  # p is exact: one rounding
        err = two_product_error(k, np.broadcast_to(s, p.shape), p)  # k * s - p, exactly
        odd = _to_odd(p, _residual_sign(err, np.zeros((), dtype=np.float64)))
        return np.asarray(odd.astype(np.float32))  # round-to-odd, then once to float32: exact


# ----- calibration -----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Calibration:
    """Quantization parameters chosen by :func:`calibrate`.

    Attributes
    ----------
    scale:
        float32 array, shape ``()`` per tensor or ``(C,)`` per channel.
    zero_point:
        int32 array of the same shape (0 for symmetric signed formats).
    amax:
        The clipping threshold the method chose (float64; for asymmetric ``max`` calibration the
        larger of ``-min`` and ``max``). Values with ``|x| <= amax`` are not clipped.
    format, method, axis, symmetric, narrow_range:
        What was asked for (``axis`` normalised to a non-negative int or None).
    """

    scale: np.ndarray
    zero_point: np.ndarray
    amax: np.ndarray
    format: IntFormat
    method: str
    axis: int | None
    symmetric: bool
    narrow_range: bool

    @property
    def qmin(self) -> int:
        return qrange(self.format, self.narrow_range)[0]

    @property
    def qmax(self) -> int:
        return qrange(self.format, self.narrow_range)[1]

    @property
    def clip_min(self) -> np.ndarray:
        """Smallest representable value, ``(qmin - zero_point) * scale`` (float64)."""
        return (self.qmin - self.zero_point.astype(np.int64)) * self.scale.astype(np.float64)

    @property
    def clip_max(self) -> np.ndarray:
        """Largest representable value, ``(qmax - zero_point) * scale`` (float64)."""
        return (self.qmax - self.zero_point.astype(np.int64)) * self.scale.astype(np.float64)

    def quantize(self, x: Any, **kwargs: Any) -> np.ndarray:
        """:func:`quantize` with these parameters (keyword options pass through)."""
        return quantize(
            x,
            self.format,
            self.scale,
            self.zero_point,
            axis=self.axis,
            narrow_range=self.narrow_range,
            **kwargs,
        )

    def dequantize(self, q: Any, **kwargs: Any) -> np.ndarray:
        """:func:`dequantize` with these parameters."""
        return dequantize(q, self.scale, self.zero_point, axis=self.axis, **kwargs)


def _scale_for(amax: float, levels: int) -> np.float32:
    """The smallest float32 scale with ``amax / scale <= levels`` exactly (1.0 when amax == 0).

    ValueError when it is beyond float32's range (float64 data wider than ``levels * FLT_MAX``).
    """
    if amax == 0:
        return np.float32(1.0)
    s = round_to(np.float64(amax) / levels, "fp32", rounding="up").astype(np.float32)
    s = np.maximum(s, np.float32(2.0**-149))
    # the division above is rounded, so check exactly (round-to-odd keeps order with integers)
    while np.isfinite(s) and _odd_quotient(np.float64(amax), np.float64(s)) > levels:
        s = np.nextafter(s, np.float32(np.inf))
    if not np.isfinite(s):
        raise ValueError(
            f"x needs the scale {amax:.6g} / {levels} = {amax / levels:.6g}, beyond float32's "
            f"largest value {float(np.finfo(np.float32).max):.6g} (calibration scales are "
            "float32): scale the data down first"
        )
    return np.float32(s)


def _histogram(absx: np.ndarray, num_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """pytorch-quantization's histogram of |x|: ``num_bins`` equal bins over ``[0, max|x|]``."""
    return np.histogram(absx, bins=num_bins, range=(0.0, float(absx.max())))


def _amax_percentile(hist: np.ndarray, edges: np.ndarray, percentile: float) -> float:
    """pytorch-quantization ``_compute_amax_percentile``: the lower edge of the bin where the
    cumulative fraction first reaches ``percentile / 100``."""
    cdf = np.cumsum(hist / hist.sum())
    idx = int(np.searchsorted(cdf, percentile / 100))
    return float(edges[min(idx, len(edges) - 1)])


def _amax_mse(
    hist: np.ndarray, edges: np.ndarray, levels: int, qmin: int, start_bin: int, stride: int
) -> float:
    """pytorch-quantization ``_compute_amax_mse``: the bin centre ``c_i`` (i >= start_bin) that,
    used as amax, minimises the histogram-weighted squared error of quantizing the centres.

    It runs on the edges scaled by the power of two that brings the largest to [1/2, 1), which
    changes no rounding (for data in float64's normal range) but keeps the centres and squared
    errors of data near float64's ends (1e300, 1e-310) from overflowing or underflowing.
    """
    top = math.frexp(float(edges[-1]))[1]
    if top:
        return math.ldexp(
            _amax_mse(hist, np.ldexp(edges, -top), levels, qmin, start_bin, stride), top
        )
    centers = (edges[1:] + edges[:-1]) / 2
    cand = np.arange(start_bin, len(centers), stride)
    if cand.size == 0:
        return float(edges[-1])
    amax = centers[cand]
    scale = amax / levels
    best, best_err = float(edges[-1]), np.inf
    for lo in range(0, cand.size, 64):  # blocks of candidates keep temporaries small
        sl = slice(lo, lo + 64)
        k = round_to(_odd_quotient(centers[None, :], scale[sl, None]), _WIDE)
        deq = np.clip(k, qmin, levels) * scale[sl, None]
        mse = (((deq - centers[None, :]) ** 2) * hist[None, :]).mean(axis=1)
        i = int(np.argmin(mse))
        if mse[i] < best_err:  # first minimum wins, as np.argmin over all candidates
            best, best_err = float(amax[sl][i]), float(mse[i])
    return best


def _amax_entropy(
    hist: np.ndarray, edges: np.ndarray, nbins: int, start_bin: int, stride: int
) -> float:
    """pytorch-quantization ``_compute_amax_entropy`` (TensorRT's KL-divergence calibration).

    For every candidate ``i`` (``start_bin..len(hist)`` step ``stride``): the reference
    distribution P is ``hist[:i]`` with the outliers ``sum(hist[i:])`` folded into its last bin;
    the candidate Q merges ``hist[:i]`` into ``nbins`` groups (``np.digitize`` on
    ``linspace(0, i, nbins + 1)``), spreads each group's count evenly over its non-empty bins and
    leaves empty bins empty. Both are normalised; the threshold is the right edge ``edges[i]`` of
    the candidate with the smallest KL(P || Q), the largest such ``i`` on ties. As in
    pytorch-quantization, the first bin's count is replaced by the second's before all this
    (it damps the spike of exact zeros after a ReLU).

    Cost: O(len(hist) + candidates * nbins), not O(len(hist)) per candidate. With ``b`` the bins,
    ``B = sum(b)``, group ``g`` of candidate ``i`` the bins ``[ceil(s_g), ceil(s_{g+1}))`` of
    ``s = linspace(0, i, nbins + 1)`` (what ``digitize`` gives), ``S_g`` its sum and ``a_g`` its
    mean over non-empty bins, and the last bin ``b' = b[i-1] + sum(b[i:])``::

        B * KL = sum_{j < i-1, b_j > 0} b_j log b_j - sum_g S'_g log a_g
                 + b' log(b' / a_last) + B log(sum(b[:i]) / B)

    (``S'`` without bin ``i-1``), where the first sum is a prefix sum (compensated) and group
    sums and counts come from prefix sums of ``b`` and of ``b > 0``. It is infinite when
    ``b[i-1] == 0 < b'`` (Q is 0 where P is not); candidates with ``sum(b[:i]) == 0`` are
    skipped.
    """
    bins = hist.astype(np.float64)
    bins[0] = bins[1]
    n = bins.size
    total = float(bins.sum())
    csum = np.concatenate([[0.0], np.cumsum(bins)])  # exact: integer counts below 2**53
    cnz = np.concatenate([[0], np.cumsum(bins != 0)])
    with np.errstate(divide="ignore", invalid="ignore"):
        blogb = np.where(bins > 0, bins * np.log(np.where(bins > 0, bins, 1.0)), 0.0)
    bl = _compensated_prefix(blogb)  # bl[k] = sum(blogb[:k])
    cand = np.arange(start_bin, n + 1, stride)
    if cand.size == 0 or total == 0:
        return float(edges[-1])
    kl = np.empty(cand.size)
    step = max(1, (1 << 20) // (nbins + 1))  # candidates per block: bounded temporaries
    for lo in range(0, cand.size, step):
        kl[lo : lo + step] = _entropy_kl(cand[lo : lo + step], bins, csum, cnz, bl, total, nbins)
    valid = ~np.isnan(kl)  # NaN: skipped candidate
    if not valid.any():
        return float(edges[-1])
    best = np.flatnonzero(valid & (kl == kl[valid].min()))[-1]  # the largest i on ties
    return float(edges[cand[best]])


def _compensated_prefix(v: np.ndarray) -> np.ndarray:
    """Prefix sums ``out[k] = sum(v[:k])`` with Neumaier compensation (few ulps, any length)."""
    out = np.empty(v.size + 1)
    out[0] = s = c = 0.0
    for k, x in enumerate(v.tolist(), 1):
        t = s + x
        c += (s - t) + x if abs(s) >= abs(x) else (x - t) + s
        s = t
        out[k] = s + c
    return out


def _entropy_kl(
    cand: np.ndarray,
    bins: np.ndarray,
    csum: np.ndarray,
    cnz: np.ndarray,
    bl: np.ndarray,
    total: float,
    nbins: int,
) -> np.ndarray:
    """KL(P || Q) of the candidates ``cand`` (see :func:`_amax_entropy`); NaN when skipped."""
    i = cand.astype(np.float64)
    # group boundaries exactly as np.digitize(arange(i), linspace(0, i, nbins + 1)) - 1 puts them
    space = np.linspace(0.0, i, num=nbins + 1, axis=-1)
    first = np.minimum(np.ceil(space), i[:, None]).astype(np.int64)  # first bin of each group
    sums = csum[first[:, 1:]] - csum[first[:, :-1]]
    counts = cnz[first[:, 1:]] - cnz[first[:, :-1]]
    with np.errstate(divide="ignore", invalid="ignore"):
        avg = sums / np.maximum(counts, 1)
        group_term = np.where(sums > 0, sums * np.log(np.where(sums > 0, avg, 1.0)), 0.0)
        last = cand - 1
        g_last = (first[:, :-1] <= last[:, None]).sum(axis=1) - 1  # the group of bin i - 1
        a_last = avg[np.arange(cand.size), g_last]
        b_last = bins[last]
        b_tail = b_last + (total - csum[cand])  # the last bin of P, outliers folded in
        qsum = csum[cand]
        kl_b = (
            bl[last]
            - (group_term.sum(axis=1) - np.where(b_last > 0, b_last * np.log(a_last), 0.0))
            + np.where(b_tail > 0, b_tail * np.log(b_tail / a_last), 0.0)
        )
        kl = kl_b / total + np.log(qsum / total)
    kl = np.where((b_last == 0) & (b_tail > 0), np.inf, kl)
    return np.where(qsum == 0, np.nan, kl)


def calibrate(
    x: Any,
    fmt: str | IntFormat = "int8",
    *,
    method: str = "max",
    axis: int | None = None,
    symmetric: bool = True,
    narrow_range: bool = False,
    percentile: float = 99.99,
    num_bins: int = 2048,
    start_bin: int = 128,
    stride: int = 1,
) -> Calibration:
    """Choose ``scale`` and ``zero_point`` for quantizing data like ``x`` to ``fmt``.

    Methods (the clipping threshold ``amax``; histogram methods follow NVIDIA
    pytorch-quantization's ``HistogramCalibrator``, on a histogram of ``|x|`` with ``num_bins``
    equal bins over ``[0, max|x|]``):

    - ``"max"``: ``amax = max|x|`` (asymmetric: the range ``[min(x, 0), max(x, 0)]``).
    - ``"percentile"``: the lower edge of the histogram bin where the cumulative fraction of
      ``|x|`` first reaches ``percentile`` percent.
    - ``"mse"``: the bin centre (from ``start_bin`` on) minimising the histogram-weighted mean
      squared error of quantize-dequantize (nearest even).
    - ``"entropy"``: TensorRT's KL-divergence calibration (see ``_amax_entropy``): candidate
      thresholds ``edges[i]`` for ``i`` from ``start_bin`` (128) to ``num_bins`` (2048), reference
      distribution with the outliers folded into its last bin, quantized distribution merged into
      ``qmax - zero_point + 1`` levels (128 for int8) and expanded back, minimal KL divergence.

    Scales. Symmetric signed formats: zero point 0 and ``scale = amax / qmax`` (127 for int8,
    also with ``narrow_range``; torch's MinMaxObserver divides by 127.5 instead and so clips
    ``+max``). Symmetric unsigned formats: zero point at the middle code (128 for uint8, as torch
    quint8) and ``scale = amax / (qmax - zero_point)``. Asymmetric (``max`` only): zero point
    ``qmin - round(min / scale0)`` with ``scale0 = (max - min) / (qmax - qmin)``, then the
    smallest scale that fits both ends around that zero point. Every scale is the smallest
    float32 that fits, checked exactly, so ``max`` calibration never clips its calibration set
    (under any rounding mode). ``amax == 0`` gives scale 1.

    ``axis``: per-channel parameters, one per index along ``axis`` (statistics over the other
    axes). ``x`` must be a non-empty finite float array.

    >>> import numpy as np
    >>> x = np.linspace(-2.0, 1.0, 7)
    >>> c = calibrate(x, "int8")
    >>> float(c.amax), float(c.scale), int(c.zero_point)
    (2.0, 0.015748033300042152, 0)
    >>> c = calibrate(x, "uint8", symmetric=False)
    >>> int(c.zero_point), bool(c.clip_min <= -2.0), bool(c.clip_max >= 1.0)
    (170, True, True)
    """
    f = _int_format(fmt)
    if method not in CALIBRATION_METHODS:
        raise ValueError(f"method must be one of {', '.join(CALIBRATION_METHODS)}, got {method!r}")
    a = as_float_array(x)
    if a.size == 0:
        raise ValueError("x is empty: calibration needs data")
    if not np.isfinite(a).all():
        raise ValueError("x contains NaN or inf: calibration needs finite data")
    ax = _check_axis(axis, a.ndim)
    if not symmetric and method != "max":
        raise ValueError(f"symmetric=False is supported with method='max' only, got {method!r}")
    if isinstance(percentile, bool) or not isinstance(
        percentile, int | float | np.integer | np.floating
    ):
        raise TypeError(f"percentile must be a real number in (0, 100], got {percentile!r}")
    if method == "percentile" and not 0 < percentile <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {percentile!r}")
    for name, flag in (("symmetric", symmetric), ("narrow_range", narrow_range)):
        if not isinstance(flag, bool | np.bool_):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    for name, v in (("num_bins", num_bins), ("start_bin", start_bin), ("stride", stride)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            raise TypeError(f"{name} must be an int, got {v!r}")
        if name != "num_bins" and v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    min_bins = 2 if method == "entropy" else 1  # entropy replaces bin 0's count by bin 1's
    if not min_bins <= num_bins <= _MAX_BINS:
        raise ValueError(
            f"num_bins must be in {min_bins}..{_MAX_BINS} for method={method!r}, got {num_bins!r}"
        )
    if method in ("mse", "entropy") and start_bin > num_bins:
        raise ValueError(f"start_bin ({start_bin}) must not exceed num_bins ({num_bins})")

    qmin, qmax = qrange(f, narrow_range)
    if symmetric:
        zp = 0 if f.signed else (qmin + qmax + 1) // 2
        levels = min(qmax - zp, zp - qmin) if not f.signed else qmax
    a64 = a.astype(np.float64)
    if ax is None:
        channels = [a64.reshape(-1)]
    else:
        channels = list(np.moveaxis(a64, ax, 0).reshape(a64.shape[ax], -1))

    scales, zps, amaxes = [], [], []
    for c in channels:
        if symmetric:
            absx = np.abs(c)
            amax = _amax_of(
                absx, method, levels, qmin - zp, percentile, num_bins, start_bin, stride
            )
            scales.append(_scale_for(amax, levels))
            zps.append(zp)
            amaxes.append(amax)
        else:
            s, z, amax = _asymmetric(float(c.min()), float(c.max()), qmin, qmax)
            scales.append(s)
            zps.append(z)
            amaxes.append(amax)
    shape: tuple[int, ...] = () if ax is None else (len(channels),)
    return Calibration(
        scale=np.array(scales, dtype=np.float32).reshape(shape),
        zero_point=np.array(zps, dtype=np.int32).reshape(shape),
        amax=np.array(amaxes, dtype=np.float64).reshape(shape),
        format=f,
        method=method,
        axis=ax,
        symmetric=bool(symmetric),
        narrow_range=bool(narrow_range),
    )


def _amax_of(
    absx: np.ndarray,
    method: str,
    levels: int,
    qlow: int,
    percentile: float,
    num_bins: int,
    start_bin: int,
    stride: int,
) -> float:
    top = float(absx.max())
    if method == "max" or top == 0:
        return top
    hist, edges = _histogram(absx, num_bins)
    if method == "percentile":
        return _amax_percentile(hist, edges, percentile)
    if method == "mse":
        return _amax_mse(hist, edges, levels, qlow, start_bin, stride)
    return _amax_entropy(hist, edges, levels + 1, start_bin, stride)


def _asymmetric(lo: float, hi: float, qmin: int, qmax: int) -> tuple[np.float32, int, float]:
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    amax = max(-lo, hi)
    if hi == lo:
        return np.float32(1.0), min(max(0, qmin), qmax), amax
    width = hi - lo
    levels = qmax - qmin
    scale0 = width / levels if math.isfinite(width) else hi / levels - lo / levels
    k = round_to(_odd_quotient(np.float64(lo), np.float64(scale0)), _WIDE)
    # keep at least one code on each side that holds data, so neither end is clipped
    zp_lo, zp_hi = qmin + int(lo < 0), qmax - int(hi > 0)
    zp = int(np.clip(qmin - int(k), zp_lo, max(zp_lo, zp_hi)))
    # the smallest float32 scale that fits both ends around the (integer) zero point
    scale = np.float32(0.0)
    if hi > 0 and qmax > zp:
        scale = max(scale, _scale_for(hi, qmax - zp))
    if lo < 0 and zp > qmin:
        scale = max(scale, _scale_for(-lo, zp - qmin))
    return np.float32(scale), zp, amax
