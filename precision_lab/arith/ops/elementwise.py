"""Elementwise arithmetic in a format: every result rounded once, by the rounding core.

Semantics (the same for every function here):

* **Operands** are values of the format: each operand is first put on ``fmt``'s grid by
  :func:`~precision_lab.round_to` (``nearest_even``, with the call's ``overflow`` and
  ``subnormals`` switches; infinities stay infinite where the format has them). That is a
  no-op for operands already on the grid, the usual case (results of earlier ops,
  :class:`~precision_lab.Emulated` arrays); an off-grid operand is converted exactly as
  storing it in the format would.
* **Correctly rounded** (``add``, ``sub``, ``mul``, ``div``, ``fma``, ``sqrt``,
  ``reciprocal``): the exact real result of the operation on those values is rounded once,
  in every mode (``odd`` and ``stochastic`` included), with the core's overflow and subnormal
  rules. How the exact result reaches the core: it is held as a float64 pair ``s + t`` (``s``
  a float64 neighbour of it, ``t`` the exact error or, for ``/`` and sqrt, a float64 with
  the sign of the exact remainder), collapsed by round-to-odd to 53 bits (exact for targets of
  at most 51 significant bits: Boldo & Melquiond) and rounded by
  :func:`~precision_lab.round_to` (:func:`precision_lab.core.exact.round_sum`, the helper the
  GEMM models use). Products of operands of at most 26 significant bits are exact in float64,
  other products use Dekker's exact product; sums use TwoSum; the remainder of ``x / y`` and
  ``sqrt(x)`` is exact (Dekker's product and Sterbenz's lemma). Stochastic rounding of ``/``
  and sqrt takes the exact discarded fraction from integer arithmetic (a slower path, about a
  microsecond per element).
* **Exact** (no rounding beyond the operands'): ``neg``, ``abs``, ``minimum``, ``maximum`` and
  the comparisons.
* **Faithful, not correctly rounded** (``exp``, ``log``, ``tanh``, ``rsqrt``): computed in
  float64 by numpy (error below 4 float64 ulps, relative error below ``2**-50``) and then
  rounded once to ``fmt``. The result is the correct rounding of the exact value unless that
  lies within ``2**-50`` (relative) of a rounding boundary of ``fmt``; its error is below one
  ulp of ``fmt`` plus ``2**-50`` relative (half an ulp plus ``2**-50`` under round-to-nearest).
* **Special values** follow IEEE 754: NaN propagates, ``inf - inf``, ``0 * inf``, ``0 / 0``
  and ``sqrt(-1)`` are NaN, ``x / 0`` is a signed infinity; infinite results then go through
  the core like any value (NaN in formats without inf, ``±max`` under ``overflow="saturate"``).
  An exact zero sum (``x + (-x)``, ``(+0) + (-0)``, an fma that cancels) is ``+0`` in every
  mode except ``down``, where it is ``-0``; ``(-0) + (-0)`` is ``-0``.
* **Stochastic rounding** uses the random word of each element's flat index (C order over the
  broadcast shape) keyed by ``seed``, as :func:`~precision_lab.round_to` does.
* **Formats**: any float format of at most 51 significant bits, and fp64. For fp64 and formats
  beyond fp32's range, the Dekker product must neither overflow nor underflow: ``*``, ``/``,
  sqrt and fma are correctly rounded while their operands, products and results stay within
  ``[2**-960, 2**990]`` in magnitude (every format whose values fit in float32 is always
  inside; add, sub and sqrt have no such limit: a sum beyond float64's range is rounded at
  half scale).

Backends: where the compiled extension is active (:func:`precision_lab.backend_info`),
``add``, ``sub``, ``mul`` and ``fma`` of arrays of float32 values (float32, float16,
ml_dtypes floats such as bfloat16) to a format whose values fit in float32 run in C++
(:func:`precision_lab.backends.native.elementwise`, the same bits as the numpy path, stochastic
words included); everything else, and ``PRECISION_LAB_BACKEND=numpy``, runs the numpy code here.

Results are float32 arrays when the format's values fit in float32 and no operand is float64
(Python floats are float64), else float64.

>>> import precision_lab as pl
>>> float(pl.ops.add(1.0, 2.0**-9, "bf16", rounding="up"))
1.0078125
>>> float(pl.ops.fma(1.0 + 2**-7, 1.0 - 2**-7, -1.0, "bf16"))  # exact -2**-14: single rounding
-6.103515625e-05
>>> float(pl.ops.sub(1.0, 1.0, "fp16", rounding="down"))
-0.0
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import ml_dtypes
import numpy as np

from ...backends import native
from ...core.exact import (
    Rounder,
    odd_collapse,
    quantum_exponent,
    round_sum,
    two_product_error,
    two_sum,
)
from ...core.formats import FloatFormat, get_format
from ...core.rounding import (
    STOCHASTIC_MODES,
    RoundingOptions,
    _fits_float32,
    as_float_array,
    check_options,
    for_chunks,
    round_to,
)

__all__ = [
    "abs",
    "add",
    "div",
    "equal",
    "exp",
    "fma",
    "greater",
    "greater_equal",
    "less",
    "less_equal",
    "log",
    "maximum",
    "minimum",
    "mul",
    "neg",
    "not_equal",
    "reciprocal",
    "rsqrt",
    "sqrt",
    "sub",
    "tanh",
]

_FP64 = get_format("fp64")


def float_format(fmt: Any, name: str = "fmt") -> FloatFormat:
    """``fmt`` as a FloatFormat of at most 51 significant bits or fp64 (ValueError otherwise)."""
    f = get_format(fmt)
    if not isinstance(f, FloatFormat):
        raise ValueError(f"{name} must be a floating-point format, got integer format {f}")
    if f.precision > 51 and f != _FP64:
        raise ValueError(
            f"{name} {f} has {f.precision} significant bits: the ops support at most 51 "
            "(exact single rounding via round-to-odd in float64), or fp64 itself"
        )
    return f


def _tame(fmt: FloatFormat) -> bool:
    """Operands of at most 26 bits in a range where products and quotients stay normal in
    float64 (products exact, Dekker's product error representable)."""
    return fmt.precision <= 26 and fmt.max < 2.0**250 and fmt.smallest_subnormal > 2.0**-250


def _on_grid(a: np.ndarray, f: FloatFormat, o: RoundingOptions) -> np.ndarray:
    """An operand as a value of ``f`` (round_to's dtype): rounded nearest_even with the call's
    switches; infinities stay infinite in formats that have them (values of the format)."""
    r = round_to(a, f, overflow=o.overflow, subnormals=o.subnormals)
    if f.has_inf and o.overflow == "saturate":
        inf = np.isinf(a)
        if inf.any():
            r[inf] = a[inf]
    return r


@dataclass(frozen=True)
class Call:
    """One elementwise call: the format, the validated options, the operands on the grid."""

    fmt: FloatFormat
    opts: RoundingOptions
    vals: tuple[np.ndarray, ...]  # float64, broadcast to shape, on fmt's grid
    shape: tuple[int, ...]
    dtype: np.dtype

    @classmethod
    def make(
        cls,
        fmt: Any,
        rounding: str,
        overflow: str,
        subnormals: str,
        seed: int | None,
        operands: dict[str, Any],
    ) -> Call:
        f = float_format(fmt)
        o = check_options(rounding, overflow, subnormals, seed, None)
        arrs = [as_float_array(v, name) for name, v in operands.items()]
        try:
            shape = np.broadcast_shapes(*(a.shape for a in arrs))
        except ValueError:
            shapes = ", ".join(f"{n}{a.shape}" for n, a in zip(operands, arrs, strict=True))
            raise ValueError(f"operands do not broadcast together: {shapes}") from None
        wide = any(a.dtype == np.float64 for a in arrs) or not _fits_float32(f)
        vals = tuple(
            np.broadcast_to(_on_grid(a, f, o).astype(np.float64), shape).reshape(-1) for a in arrs
        )
        return cls(f, o, vals, shape, np.dtype(np.float64 if wide else np.float32))

    @property
    def rounder(self) -> Rounder:
        o = self.opts
        return Rounder(self.fmt, o.mode, o.overflow, o.subnormals, o.seed, o.random_bits)

    def words(self) -> np.ndarray | None:
        n = int(np.prod(self.shape, dtype=np.int64))
        return self.opts.words(n, 0)

    def out(self, flat: np.ndarray) -> np.ndarray:
        return flat.astype(self.dtype).reshape(self.shape)

    def round_values(self, v: np.ndarray) -> np.ndarray:
        """Round float64 values (exact, or float64 approximations for the faithful functions)."""
        o = self.opts
        r = round_to(
            v,
            self.fmt,
            rounding=o.mode,
            overflow=o.overflow,
            subnormals=o.subnormals,
            seed=o.seed if o.mode in STOCHASTIC_MODES else None,
        )
        return self.out(r)

    def finish(
        self,
        s: np.ndarray,
        t: np.ndarray,
        shadow: np.ndarray,
        ok: np.ndarray,
        zero_pair: tuple[np.ndarray, np.ndarray] | None = None,
        exact_fraction: Any = None,
    ) -> np.ndarray:
        """Round the exact results ``s + t`` where ``ok``; elsewhere the IEEE float64 result
        ``shadow`` (special values) goes through the core.

        ``zero_pair``: the two addends of a sum (for the sign of an exact zero under ``down``).
        ``exact_fraction``: for stochastic rounding of quotients and square roots (whose ``t``
        is not exact), see :meth:`_fraction_pairs`.
        """
        o = self.opts
        res = np.empty(s.shape)
        words = self.words()
        idx = np.flatnonzero(ok)
        if idx.size:
            si, ti = s[idx], t[idx]
            w = None if words is None else words[idx]
            if exact_fraction is not None and o.mode in STOCHASTIC_MODES:
                ti = self._fraction_pairs(si, ti, idx, exact_fraction)
            rounder = self.rounder
            nearest_tie_rule = o.mode in ("nearest_away", "nearest_zero")
            if exact_fraction is not None and nearest_tie_rule and self.fmt == _FP64:
                # t is not exact, so fp64 cannot see a tie; a quotient or root of 53-bit values
                # is never a 54-bit midpoint, so any tie rule is ties-to-even here
                rounder = Rounder(self.fmt, "nearest_even", o.overflow, o.subnormals)
            res[idx] = round_sum(si, ti, rounder, w)
            if zero_pair is not None and o.mode == "down":
                x, y = zero_pair
                xi, yi = x[idx], y[idx]
                plus_zeros = (xi == 0) & (yi == 0) & ~np.signbit(xi) & ~np.signbit(yi)
                z = (si == 0) & (ti == 0) & ~plus_zeros
                res[idx[z]] = -0.0
        bad = np.flatnonzero(~ok)
        if bad.size:
            res[bad] = self._special(shadow[bad])
        return self.out(res)

    def _special(self, shadow: np.ndarray) -> np.ndarray:
        """IEEE special results (NaN, infinities) through the core."""
        o = self.opts
        mode = "nearest_even" if o.mode in STOCHASTIC_MODES else o.mode
        return round_to(
            shadow, self.fmt, rounding=mode, overflow=o.overflow, subnormals=o.subnormals
        )

    def _fraction_pairs(
        self, s: np.ndarray, t: np.ndarray, idx: np.ndarray, floor_scaled: Any
    ) -> np.ndarray:
        """A ``t`` that makes :func:`round_sum`'s stochastic choice exact: the exact error
        ``v - s`` truncated (toward -inf, in the orientation of ``s``'s sign) to a multiple of
        ``2**(qexp - 64)``, ``qexp`` the quantum exponent of the truncated result.
        ``floor_scaled(i, s, sign, k)`` is ``floor(sign * (v_i - s) * 2**k)`` in integers."""
        z = odd_collapse(s, t)
        trunc = round_to(z, self.fmt, rounding="toward_zero", overflow=self.opts.overflow)
        finite = np.isfinite(s) & np.isfinite(trunc)
        qexp = quantum_exponent(np.where(finite, trunc, 0.0).astype(np.float64), self.fmt)
        out = t.copy()
        for j in np.flatnonzero(finite & (t != 0)):
            sign = -1 if np.signbit(s[j]) else 1
            k = 64 - int(qexp[j])
            n = floor_scaled(int(idx[j]), Fraction(float(s[j])), sign, k)
            out[j] = sign * math.ldexp(float(n), -k)
        return out


def _product(a: np.ndarray, b: np.ndarray, tame: bool) -> tuple[np.ndarray, np.ndarray]:
    """The exact product ``a * b`` as ``h + l`` (``l = 0`` when float64 holds it)."""
    with np.errstate(invalid="ignore", over="ignore"):
        h = a * b
        if tame:
            return h, np.zeros_like(h)
        fin = np.isfinite(h)
        lo = np.zeros_like(h)
        lo[fin] = two_product_error(a[fin], b[fin], h[fin])
    return h, lo


_F32_OPERANDS = {np.dtype(np.float32), np.dtype(np.float16)} | {
    np.dtype(getattr(ml_dtypes, n))
    for n in dir(ml_dtypes)
    if n.startswith(("float8", "float6", "float4", "bfloat16"))
}


def _own_format(dtype: np.dtype, f: FloatFormat) -> bool:
    """Whether arrays of ``dtype`` hold values of ``f`` (its ml_dtypes type, float32 for fp32)."""
    try:
        return get_format(dtype) == f
    except (TypeError, ValueError):
        return False


def _native_path(
    op: str,
    operands: tuple[Any, ...],
    fmt: Any,
    rounding: str,
    overflow: str,
    subnormals: str,
    seed: int | None,
) -> np.ndarray | None:
    """``op`` (add, sub, mul, fma) on the compiled extension
    (:func:`precision_lab.backends.native.elementwise`: the same results bit for bit, stochastic
    rounding keyed by the same (seed, flat index) words); None when it does not apply: the
    numpy backend selected or the extension not built, an operand that is not an array of
    float32 values (float32, float16, ml_dtypes floats of at most 32 bits), a format whose
    values do not fit in float32, or ``stochastic_equal`` (whose numpy path draws its own
    seed), or a stochastic sum the extension declines."""
    if native.ext is None or native.choice()[0] == "numpy":
        return None
    if not all(
        isinstance(v, np.ndarray) and v.dtype.newbyteorder("=") in _F32_OPERANDS for v in operands
    ):
        return None
    f = get_format(fmt)
    if not (isinstance(f, FloatFormat) and _fits_float32(f)):
        return None
    o = check_options(rounding, overflow, subnormals, seed, None)
    if o.mode == "stochastic_equal":
        return None
    keep = o.subnormals == "keep" or not f.has_subnormals
    on_grid = keep and all(_own_format(v.dtype, f) for v in operands)
    return native.elementwise(op, list(operands), f, o, on_grid)


def _float32_path(
    op: str,
    x: Any,
    y: Any,
    fmt: Any,
    rounding: str,
    overflow: str,
    subnormals: str,
    seed: int | None,
) -> np.ndarray | None:
    """``x + y`` or ``x * y`` computed in float32 and rounded once by the core, where that is
    the exact result (or, for nearest_even sums, where double rounding is innocuous); None
    when it does not apply (float64 operands, wide formats, or any element that would need
    the general path).

    For formats of at most 12 significant bits whose values are float32 values, products are
    exact in float32 unless they fall below float32's normal range or overflow (those
    elements send the call to the general path), and a float32 sum is exact where its
    TwoSum error is zero; nearest_even sums of formats of at most 11 bits need no check
    (rounding to 24 then to at most 11 bits is innocuous: Figueroa 1995, 24 >= 2p + 2).
    """
    if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
        return None
    if x.dtype not in _F32_OPERANDS or y.dtype not in _F32_OPERANDS:
        return None
    f = get_format(fmt)
    if not (isinstance(f, FloatFormat) and _fits_float32(f) and f.precision <= 12):
        return None
    o = check_options(rounding, overflow, subnormals, seed, None)
    if x.shape == y.shape and o.mode not in STOCHASTIC_MODES:  # in cache-sized chunks, on all cores
        xf, yf = x.reshape(-1), y.reshape(-1)
        out = np.empty(xf.size, dtype=np.float32)
        failed = []

        def work(lo: int, hi: int) -> None:
            r = _float32_chunk(op, _grid32(xf[lo:hi], f, o), _grid32(yf[lo:hi], f, o), f, o)
            if r is None:
                failed.append(lo)
            else:
                out[lo:hi] = r

        for_chunks(xf.size, work, chunk=1 << 16)
        return None if failed else out.reshape(x.shape)
    return _float32_chunk(op, _grid32(x, f, o), _grid32(y, f, o), f, o)


def _float32_chunk(
    op: str, a: np.ndarray, b: np.ndarray, f: FloatFormat, o: RoundingOptions
) -> np.ndarray | None:
    with np.errstate(all="ignore"):
        if op == "add":
            r = a + b
            nearest = o.mode == "nearest_even" and f.precision <= 11
            if not nearest:
                bb = r - a
                bad = ((a - (r - bb)) + (b - bb)) != 0
                if o.mode == "down":  # exact zero sums are -0 in this mode
                    bad |= r == 0
                bad |= ~np.isfinite(r) & np.isfinite(a) & np.isfinite(b)
                if bad.any():
                    return None
        else:
            r = a * b
            m = np.abs(r)
            # underflow below float32's normal range (a zero product of non-zero operands too)
            if (m < np.float32(2.0**-126)).any():
                tiny = m < np.float32(2.0**-126)
                if (tiny & ((r != 0) | ((a != 0) & (b != 0)))).any():
                    return None
            if np.isinf(m).any() and (np.isinf(m) & np.isfinite(a) & np.isfinite(b)).any():
                return None
    return round_to(
        r,
        f,
        rounding=o.mode,
        overflow=o.overflow,
        subnormals=o.subnormals,
        seed=o.seed if o.mode in STOCHASTIC_MODES else None,
    )


def _grid32(v: np.ndarray, f: FloatFormat, o: RoundingOptions) -> np.ndarray:
    """A float32 operand on ``f``'s grid (as :func:`_on_grid`; no rounding for arrays of
    ``f``'s own ml_dtypes type)."""
    if v.dtype.kind == "V" or v.dtype not in (np.float32, np.float16):
        keep = o.subnormals == "keep" or not f.has_subnormals  # else subnormals are flushed
        if keep and _own_format(v.dtype, f):
            return v.astype(np.float32)
    return _on_grid(as_float_array(v), f, o).astype(np.float32, copy=False)


# ----- correctly rounded ---------------------------------------------------------------------
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
    c = Call.make(fmt, rounding, overflow, subnormals, seed, {"x": x, "y": y})
    return _add_vals(c, *c.vals)


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
    c = Call.make(fmt, rounding, overflow, subnormals, seed, {"x": x, "y": y})
    a, b = c.vals
    return _add_vals(c, a, -b)


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
    c = Call.make(fmt, rounding, overflow, subnormals, seed, {"x": x, "y": y})
    a, b = c.vals
    h, lo = _product(a, b, _tame(c.fmt))
    ok = np.isfinite(h)
    return c.finish(h, np.where(ok, lo, 0.0), h, ok)


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
    c = Call.make(fmt, rounding, overflow, subnormals, seed, {"x": x, "y": y, "z": z})
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
    return c.finish(s, t, shadow, ok, zero_pair=(h, d))


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
    c = Call.make(fmt, rounding, overflow, subnormals, seed, {"x": x, "y": y})
    a, b = c.vals
    return _div_vals(c, a, b)


def _div_vals(c: Call, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        q = a / b
    ok = np.isfinite(q) & (b != 0) & np.isfinite(a) & np.isfinite(b)
    a0, b0, q0 = (np.where(ok, v, 1.0) for v in (a, b, q))
    with np.errstate(invalid="ignore", over="ignore"):
        h = q0 * b0
        r = (a0 - h) - two_product_error(q0, b0, h)  # the exact remainder a - q * b
        t = np.where(ok, r / b0, 0.0)

    def floor_scaled(i: int, s: Fraction, sign: int, k: int) -> int:
        v = Fraction(float(a[i])) / Fraction(float(b[i]))
        return math.floor(sign * (v - s) * Fraction(2) ** k)

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
    c = Call.make(fmt, rounding, overflow, subnormals, seed, {"x": x})
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
    c = Call.make(fmt, rounding, overflow, subnormals, seed, {"x": x})
    (a,) = c.vals
    return _div_vals(c, np.ones_like(a), a)


# ----- exact ---------------------------------------------------------------------------------
def neg(
    x: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``-x`` (exact).

    >>> import precision_lab as pl
    >>> pl.ops.neg([0.0, 1.5], "e4m3").tolist()
    [-0.0, -1.5]
    """
    c = Call.make(fmt, rounding, overflow, subnormals, seed, {"x": x})
    return c.round_values(-c.vals[0])


def abs(
    x: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``|x|`` (exact).

    >>> import precision_lab as pl
    >>> pl.ops.abs([-0.0, -1.5], "e4m3").tolist()
    [0.0, 1.5]
    """
    c = Call.make(fmt, rounding, overflow, subnormals, seed, {"x": x})
    return c.round_values(np.abs(c.vals[0]))


def _min_max(
    x: Any, y: Any, fmt: Any, opts: tuple[str, str, str, int | None], smaller: bool
) -> np.ndarray:
    c = Call.make(fmt, *opts, {"x": x, "y": y})
    a, b = c.vals
    m = np.minimum(a, b) if smaller else np.maximum(a, b)  # NaN propagates
    zeros = (a == 0) & (b == 0)
    if zeros.any():  # -0 < +0 (IEEE 754-2019 minimum / maximum)
        neg_zero = (np.signbit(a) | np.signbit(b)) if smaller else (np.signbit(a) & np.signbit(b))
        m = np.where(zeros, np.where(neg_zero, -0.0, 0.0), m)
    return c.round_values(m)


def minimum(
    x: Any,
    y: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """Elementwise minimum (exact; NaN propagates; ``-0 < +0``).

    >>> import precision_lab as pl
    >>> pl.ops.minimum([0.0, 1.0], [-0.0, float("nan")], "bf16").tolist()
    [-0.0, nan]
    """
    return _min_max(x, y, fmt, (rounding, overflow, subnormals, seed), True)


def maximum(
    x: Any,
    y: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """Elementwise maximum (exact; NaN propagates; ``-0 < +0``).

    >>> import precision_lab as pl
    >>> pl.ops.maximum([0.0, 1.0], [-0.0, 3.0], "bf16").tolist()
    [0.0, 3.0]
    """
    return _min_max(x, y, fmt, (rounding, overflow, subnormals, seed), False)


def _compare(
    x: Any, y: Any, fmt: Any, opts: tuple[str, str, str, int | None], ufunc: Any
) -> np.ndarray:
    c = Call.make(fmt, *opts, {"x": x, "y": y})
    a, b = c.vals
    return np.asarray(ufunc(a, b)).reshape(c.shape)


def equal(
    x: Any,
    y: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``x == y`` on the values in ``fmt`` (a bool array).

    >>> import precision_lab as pl
    >>> pl.ops.equal(1.0, 1.001, "bf16").tolist()   # both round to 1.0
    True
    """
    return _compare(x, y, fmt, (rounding, overflow, subnormals, seed), np.equal)


def not_equal(
    x: Any,
    y: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``x != y`` on the values in ``fmt``."""
    return _compare(x, y, fmt, (rounding, overflow, subnormals, seed), np.not_equal)


def less(
    x: Any,
    y: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``x < y`` on the values in ``fmt``."""
    return _compare(x, y, fmt, (rounding, overflow, subnormals, seed), np.less)


def less_equal(
    x: Any,
    y: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``x <= y`` on the values in ``fmt``."""
    return _compare(x, y, fmt, (rounding, overflow, subnormals, seed), np.less_equal)


def greater(
    x: Any,
    y: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``x > y`` on the values in ``fmt``."""
    return _compare(x, y, fmt, (rounding, overflow, subnormals, seed), np.greater)


def greater_equal(
    x: Any,
    y: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``x >= y`` on the values in ``fmt``."""
    return _compare(x, y, fmt, (rounding, overflow, subnormals, seed), np.greater_equal)


# ----- faithful ------------------------------------------------------------------------------
def _faithful(x: Any, fmt: Any, opts: tuple[str, str, str, int | None], func: Any) -> np.ndarray:
    c = Call.make(fmt, *opts, {"x": x})
    with np.errstate(all="ignore"):
        v = func(c.vals[0])
    return c.round_values(v)


def exp(
    x: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``exp(x)``: float64 exp rounded once to ``fmt`` (faithful, see the module docstring).

    >>> import precision_lab as pl
    >>> float(pl.ops.exp(1.0, "bf16"))
    2.71875
    """
    return _faithful(x, fmt, (rounding, overflow, subnormals, seed), np.exp)


def log(
    x: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """Natural logarithm: float64 log rounded once to ``fmt`` (faithful).

    >>> import precision_lab as pl
    >>> float(pl.ops.log(2.0, "fp16"))
    0.693359375
    """
    return _faithful(x, fmt, (rounding, overflow, subnormals, seed), np.log)


def tanh(
    x: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``tanh(x)``: float64 tanh rounded once to ``fmt`` (faithful).

    >>> import precision_lab as pl
    >>> float(pl.ops.tanh(0.5, "e4m3"))
    0.46875
    """
    return _faithful(x, fmt, (rounding, overflow, subnormals, seed), np.tanh)


def rsqrt(
    x: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
) -> np.ndarray:
    """``1 / sqrt(x)``: computed in float64 (two roundings there) and rounded once (faithful).

    >>> import precision_lab as pl
    >>> float(pl.ops.rsqrt(4.0, "bf16"))
    0.5
    """
    return _faithful(x, fmt, (rounding, overflow, subnormals, seed), lambda v: 1.0 / np.sqrt(v))
