"""The machinery every elementwise op shares: the format check, the operands put on the grid,
and :class:`Call`, which rounds the exact results (held as float64 pairs) once by the core.

Each op in :mod:`.correctly_rounded`, :mod:`.exact_ops` and :mod:`.faithful` builds a
:class:`Call` from its arguments (:meth:`Call.make`), computes its exact result from
``Call.vals`` and hands it to :meth:`Call.finish` (a pair ``s + t``) or
:meth:`Call.round_values` (float64 values). The semantics are stated in :mod:`.elementwise`.

>>> import numpy as np
>>> c = Call.make("bf16", "up", "ieee", "keep", None, {"x": [1.0, 3.0]})
>>> c.vals[0].tolist(), c.round_values(c.vals[0] / 3).tolist()
([1.0, 3.0], [0.333984375, 1.0])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol

import numpy as np

from ...core.exact import (
    Rounder,
    odd_collapse,
    quantum_exponent,
    round_scaled,
    round_sum,
    two_product_error,
)
from ...core.formats import FloatFormat, get_format
from ...core.inputs import as_numpy
from ...core.rounding import (
    RoundingOptions,
    _fits_float32,
    as_float_array,
    check_options,
    for_chunks,
    is_stochastic,
    round_to,
)

__all__ = ["BinaryOp", "Call", "UnaryOp", "binary_op", "float_format", "unary_op"]

_FP64 = get_format("fp64")


def float_format(fmt: Any, name: str = "fmt", user: str = "the ops") -> FloatFormat:
    """``fmt`` as a FloatFormat of at most 51 significant bits or fp64 (ValueError otherwise,
    saying that ``user``, the ops or Emulated arrays, supports no more)."""
    f = get_format(fmt)
    if not isinstance(f, FloatFormat):
        raise ValueError(f"{name} must be a floating-point format, got integer format {f}")
    if f.precision > 51 and f != _FP64:
        raise ValueError(
            f"{name} {f} has {f.precision} significant bits: {user} support at most 51 "
            "(exact single rounding via round-to-odd in float64), or fp64 itself"
        )
    return f


def as_operand(x: Any, name: str) -> np.ndarray:
    """An operand as a numpy array of numbers: floats (float16/32/64, ml_dtypes floats),
    integers or booleans (rounded to the format exactly, as :func:`~precision_lab.round_to`
    does), from any array :func:`precision_lab.core.inputs.as_numpy` takes (DLPack and
    array-API arrays such as torch tensors, bfloat16 ones included); TypeError otherwise."""
    a = as_numpy(x, name)
    if a.dtype.kind in "biu":
        return a
    return as_float_array(a, name)


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


#: elements per chunk of the general numpy path (the casts' chunk size): the float64 temporaries
#: of a chunk (a few dozen arrays) stay small, so the peak extra memory is about the output's
CHUNK = 1 << 16


def _broadcast_shape(operands: dict[str, Any], arrs: list[np.ndarray]) -> tuple[int, ...]:
    try:
        return np.broadcast_shapes(*(a.shape for a in arrs))
    except ValueError:
        shapes = ", ".join(f"{n}{a.shape}" for n, a in zip(operands, arrs, strict=True))
        raise ValueError(f"operands do not broadcast together: {shapes}") from None


def _result_dtype(arrs: list[np.ndarray], f: FloatFormat) -> np.dtype:
    """float64 for float64 operands (Python floats), integer ones (as round_to) and formats
    beyond float32; float32 otherwise."""
    wide = any(a.dtype == np.float64 or a.dtype.kind in "biu" for a in arrs)
    return np.dtype(np.float64 if wide or not _fits_float32(f) else np.float32)


def run(
    fmt: Any,
    rounding: str,
    overflow: str,
    subnormals: str,
    seed: int | None,
    operands: dict[str, Any],
    compute: Callable[[Call], np.ndarray],
    *,
    own_words: bool = True,
) -> np.ndarray:
    """``compute(call)`` over the operands: one :class:`Call` for small or broadcasting
    operands, else one per chunk of :data:`CHUNK` elements of the flat index, on all cores
    (:func:`~precision_lab.core.pool.for_chunks`), so that the float64 temporaries of the
    general path never exceed a chunk's. Stochastic words follow the flat index
    (``Call.offset``); ``own_words=False``: ``compute`` rounds stochastically without
    :meth:`Call.words` (the whole array is then one call)."""
    f = float_format(fmt)
    o = check_options(rounding, overflow, subnormals, seed, None)
    arrs = [as_operand(v, name) for name, v in operands.items()]
    shape = _broadcast_shape(operands, arrs)
    n = int(np.prod(shape, dtype=np.int64))
    chunked = (
        n > 4 * CHUNK
        and all(a.shape == shape or a.size == 1 for a in arrs)
        and (own_words or not is_stochastic(o.mode))
    )
    if not chunked:
        return compute(
            Call.make(
                f, rounding, overflow, subnormals, seed, dict(zip(operands, arrs, strict=True))
            )
        )
    flat = [a.reshape(-1) for a in arrs]
    out = np.empty(n, dtype=_result_dtype(arrs, f))

    def work(lo: int, hi: int) -> None:
        sub = {k: (v if v.size == 1 else v[lo:hi]) for k, v in zip(operands, flat, strict=True)}
        c = Call.make(f, rounding, overflow, subnormals, seed, sub, offset=lo)
        out[lo:hi] = compute(c).reshape(-1)

    for_chunks(n, work, chunk=CHUNK)
    return out.reshape(shape)


@dataclass(frozen=True)
class Call:
    """One elementwise call: the format, the validated options, the operands on the grid."""

    fmt: FloatFormat
    opts: RoundingOptions
    vals: tuple[np.ndarray, ...]  # float64, broadcast to shape, on fmt's grid
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int = 0  # flat index of the first element (a chunk of a larger call)

    @classmethod
    def make(
        cls,
        fmt: Any,
        rounding: str,
        overflow: str,
        subnormals: str,
        seed: int | None,
        operands: dict[str, Any],
        offset: int = 0,
    ) -> Call:
        """Validate the options and put the operands on ``fmt``'s grid, broadcast together."""
        f = float_format(fmt)
        o = check_options(rounding, overflow, subnormals, seed, None)
        arrs = [as_operand(v, name) for name, v in operands.items()]
        shape = _broadcast_shape(operands, arrs)
        vals = tuple(
            np.broadcast_to(_on_grid(a, f, o).astype(np.float64), shape).reshape(-1) for a in arrs
        )
        return cls(f, o, vals, shape, _result_dtype(arrs, f), offset)

    @property
    def rounder(self) -> Rounder:
        o = self.opts
        return Rounder(self.fmt, o.mode, o.overflow, o.subnormals, o.seed, o.random_bits)

    def words(self) -> np.ndarray | None:
        """The stochastic-rounding words of this call's elements (None when not stochastic)."""
        n = int(np.prod(self.shape, dtype=np.int64))
        return self.opts.words(n, self.offset)

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
            seed=o.seed if is_stochastic(o.mode) else None,
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
        scale: np.ndarray | None = None,
    ) -> np.ndarray:
        """Round the exact results ``s + t`` (times ``2**scale`` where given: any magnitude,
        :func:`~precision_lab.core.exact.round_scaled`) where ``ok``; elsewhere the IEEE
        float64 result ``shadow`` (special values) goes through the core.

        ``zero_pair``: the two addends of a sum (for the sign of an exact zero under ``down``).
        ``exact_fraction``: for stochastic rounding of quotients and square roots (whose ``t``
        is not exact), see ``_fraction_pairs``.
        """
        o = self.opts
        res = np.empty(s.shape)
        words = self.words()
        idx = np.flatnonzero(ok)
        if idx.size:
            si, ti = s[idx], t[idx]
            w = None if words is None else words[idx]
            if scale is not None:
                ei = scale[idx]
                if exact_fraction is None or not is_stochastic(o.mode):
                    rr = self.rounder if exact_fraction is None else self.rounder_for_quotients
                    res[idx] = round_scaled(si, ti, ei, rr, w)
                    bad = np.flatnonzero(~ok)
                    if bad.size:
                        res[bad] = self._special(shadow[bad])
                    return self.out(res)
                # stochastic quotients: the exact fraction needs the unscaled pair
                with np.errstate(over="ignore", under="ignore"):
                    si, ti = np.ldexp(si, ei), np.ldexp(ti, ei)
                big = np.abs(si) > 2.0**1000
                tiny = (si != 0) & (np.abs(si) < 2.0**-900)
                if big.any() or tiny.any():
                    raise ValueError(
                        "stochastic rounding of a quotient outside [2**-900, 2**1000] is not "
                        f"supported in {self.fmt} (its exact discarded fraction is not available)"
                    )
            if exact_fraction is not None and is_stochastic(o.mode):
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
                # -0 where the format has it (not fnuz nor P3109: there it is +0, as round_to)
                res[idx[z]] = -0.0 if self.fmt.has_negative_zero else 0.0
        bad = np.flatnonzero(~ok)
        if bad.size:
            res[bad] = self._special(shadow[bad])
        return self.out(res)

    @property
    def rounder_for_quotients(self) -> Rounder:
        """The rounder (fp64's tie rules of quotients and roots are ties-to-even: see finish)."""
        o = self.opts
        if o.mode in ("nearest_away", "nearest_zero") and self.fmt == _FP64:
            return Rounder(self.fmt, "nearest_even", o.overflow, o.subnormals)
        return self.rounder

    def _special(self, shadow: np.ndarray) -> np.ndarray:
        """IEEE special results (NaN, infinities) through the core."""
        o = self.opts
        mode = "nearest_even" if is_stochastic(o.mode) else o.mode
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


class UnaryOp(Protocol):
    """The signature of a one-operand op (``sqrt``, ``neg``, ``exp``, ...)."""

    def __call__(
        self,
        x: Any,
        fmt: Any,
        *,
        rounding: str = "nearest_even",
        overflow: str = "ieee",
        subnormals: str = "keep",
        seed: int | None = None,
    ) -> np.ndarray: ...


class BinaryOp(Protocol):
    """The signature of a two-operand op (``minimum``, ``less``, ...)."""

    def __call__(
        self,
        x: Any,
        y: Any,
        fmt: Any,
        *,
        rounding: str = "nearest_even",
        overflow: str = "ieee",
        subnormals: str = "keep",
        seed: int | None = None,
    ) -> np.ndarray: ...


def _named(op: Any, name: str, doc: str, module: str) -> None:
    # __module__ is what doctest (and pytest --doctest-modules) uses to find the docstring
    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    op.__module__ = module


def unary_op(
    name: str,
    doc: str,
    compute: Callable[[Call, np.ndarray], np.ndarray],
    module: str,
    *,
    own_words: bool = True,
) -> UnaryOp:
    """The public op ``name`` of one operand: ``compute(call, x_on_grid)`` is its result.

    ``module`` is the ``__name__`` of the module that exports it (its doctest runs there);
    ``own_words``: as :func:`run`'s (False where ``compute`` rounds by :meth:`Call.round_values`).
    """

    def op(
        x: Any,
        fmt: Any,
        *,
        rounding: str = "nearest_even",
        overflow: str = "ieee",
        subnormals: str = "keep",
        seed: int | None = None,
    ) -> np.ndarray:
        return run(
            fmt,
            rounding,
            overflow,
            subnormals,
            seed,
            {"x": x},
            lambda c: compute(c, c.vals[0]),
            own_words=own_words,
        )

    _named(op, name, doc, module)
    return op


def binary_op(
    name: str,
    doc: str,
    compute: Callable[[Call, np.ndarray, np.ndarray], np.ndarray],
    module: str,
) -> BinaryOp:
    """The public op ``name`` of two operands: ``compute(call, x, y)`` (on the grid, broadcast
    and flattened) is its result."""

    def op(
        x: Any,
        y: Any,
        fmt: Any,
        *,
        rounding: str = "nearest_even",
        overflow: str = "ieee",
        subnormals: str = "keep",
        seed: int | None = None,
    ) -> np.ndarray:
        return run(
            fmt,
            rounding,
            overflow,
            subnormals,
            seed,
            {"x": x, "y": y},
            lambda c: compute(c, *c.vals),
        )

    _named(op, name, doc, module)
    return op
