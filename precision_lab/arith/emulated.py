"""``Emulated`` arrays: run an unmodified numpy algorithm in a low-precision format.

:func:`emulate` wraps an array; every numpy ufunc result, reduction and matrix product on it is
rounded to its format by :mod:`precision_lab.ops` (NEP 13 ``__array_ufunc__`` and NEP 18
``__array_function__``), so ``A[k+1:] -= l * A[k]`` is a bf16 multiply and a bf16 subtract,
each correctly rounded, and ``A @ x`` / ``x.sum()`` / ``np.dot`` go through the array's
:class:`~precision_lab.Accumulator`.

Rules.

* **Values** are kept in a float64 (or float32) numpy array, always on the format's grid: no
  operation lets a value off the grid in (plain operands, ``initial=`` and the fill values of
  ``ones_like`` are rounded to the format first; ``empty_like`` gives zeros).
  Indexing, slicing, reshape, transpose, concatenate, where, copy and friends pass through
  (the values stay on the grid); assignment rounds the assigned values to the format.
* **Supported ufuncs**: ``+ - * /`` (``add subtract multiply true_divide``), ``sqrt``,
  ``square``, ``reciprocal``, ``power`` with exponent 0.5 or an integer (``x ** 3`` is
  ``(x * x) * x``: repeated correctly rounded multiplications from the left, then a
  reciprocal for negative exponents; ``|n| <= 1024``), ``negative positive
  absolute``, ``minimum maximum fmin fmax``,
  the comparisons, ``exp log tanh``, ``matmul``, ``isnan isinf isfinite signbit``;
  ``add.reduce``/``add.accumulate`` (``sum``/``cumsum``), ``maximum.reduce``,
  ``minimum.reduce``. Correctly rounded where :mod:`precision_lab.ops` is; ``exp log tanh`` are
  faithful. Anything else raises TypeError naming the function (it would compute in float64),
  for example ``np.linalg.solve`` or ``np.sin``. ``np.asarray(e)`` is the explicit way out;
  ``np.array([e1, e2])`` of a *list* of Emulated arrays is one too (numpy converts each element
  through ``__array__`` and no override can tell it from ``np.asarray``): ``np.stack`` and
  ``np.concatenate`` keep the format.
* **Reductions** take numpy's arguments: ``sum`` (``axis`` an int, a tuple or None,
  ``keepdims``, ``initial``: the accumulator's starting value, rounded to the format;
  ``where``: the masked-out terms are zeros, so the summation order and the stochastic event
  numbers are those of the whole axis; ``out``), ``cumsum`` (an int ``axis`` or None, ``out``),
  ``max``/``min`` (all of numpy's; ``initial`` rounded to the format; IEEE 754 ``maximum`` /
  ``minimum``: ``-0 < +0``, NaN propagates), ``dot`` (``out``). ``dtype=`` other than None
  is refused (the result's type is the format). ``out=`` takes an Emulated array (the result is
  assigned to it: rounded to its format if that differs) or a numpy array (the values are
  written, cast by numpy's ``same_kind`` rule); an Emulated array that is only the ``out=``
  target gives its format to the operation.
* **Comparisons** (``== != < <= > >=``) and the predicates compare the exact values: two
  Emulated arrays of different formats are compared as they are (nothing is rounded); a plain
  operand is first rounded to the Emulated operand's format, as in arithmetic. ``e == None`` is
  elementwise False (``!=``: True), as in numpy.
* **Promotion**: an operation between Emulated arrays of different formats runs in the format
  that holds the other's values exactly (every finite value, signed zero, infinity and NaN of
  it: bf16 with e4m3 gives bf16, fp32 with bf16 gives fp32, ``FloatFormat(10, 10)`` with bf16
  gives ``FloatFormat(10, 10)``), with that array's rounding, seed counter and accumulator. The
  operands then enter exactly and the result is rounded once (one IEEE 754-2019 formatOf
  operation, 5.1, on exact operands), whatever the operand order. Formats of which neither holds
  the other (bf16 and fp16, e4m3 and e5m2) raise TypeError: either choice would round one
  operand before the operation, so convert one explicitly. Arrays of one format from different
  :func:`emulate` calls must agree on rounding, overflow, subnormals and accumulator (else
  TypeError); of those the one with the smaller seed (then the further advanced counter) lends
  its counter, so the choice does not depend on the operand order either. Python scalars,
  numpy arrays and ml_dtypes arrays take the Emulated operand's format (they are rounded to it,
  nearest_even, as any operand of :mod:`precision_lab.ops`).
* **Stochastic rounding** (``stochastic`` and ``stochastic_equal``): every array made by one
  :func:`emulate` call shares a counter; each rounding operation takes the next value ``n`` and
  rounds with the seed ``seed + n * 2**64`` (the random words of element ``i`` are then the
  Philox words of key ``(seed, n)``): fresh random words for every operation, and the same
  sequence on every run of the same program.
* **Accumulator** (``matmul``, ``dot``, ``sum``, ``cumsum``): by default a sequential sum in the
  array's format and rounding mode. ``sum`` and ``cumsum`` then round exactly as a loop of
  ``s = s + x[k]`` does (stochastic modes draw their random words per event of the model).
  ``@`` and ``dot`` keep each product exact and round once per step, ``s = round(s + a[k] *
  b[k])``: a chain of fused multiply-adds (IEEE 754-2019
  fusedMultiplyAdd, what BLAS kernels and GPU dot products use); ``emulate(..., fma=False)``
  rounds each product to the format first, which is exactly a loop of ``s = s + a[k] * b[k]``.
  Any :class:`~precision_lab.Accumulator` may be given instead (fp32 accumulation, pairwise,
  compensated, tensor-core models ...).

>>> import numpy as np, precision_lab as pl
>>> x = pl.emulate(np.full(600, 1.0), "fp16")
>>> h = 1.0 / np.cumsum(x)          # 1/1, 1/2, ... in fp16 (cumsum is exact here)
>>> print(h.sum())                  # the harmonic series stagnates in fp16
Emulated(7.0859375, fmt=fp16)
>>> float(np.sqrt(pl.emulate(2.0, "e4m3")))
1.375
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.formats import FloatFormat
from ..core.inputs import as_numpy
from ..core.random_words import check_seed
from ..core.rounding import (
    as_float_array,
    check_options,
    is_stochastic,
    round_to,
    working_dtype,
)
from ..gemm.accumulator import Accumulator
from ..gemm.reference import gemm
from . import ops
from .ops.call import float_format

__all__ = ["Emulated", "EmulationContext", "emulate"]


@dataclass
class EmulationContext:
    """Format, rounding options, accumulator and the stochastic-rounding counter of a family of
    Emulated arrays (those made from one :func:`emulate` call)."""

    fmt: FloatFormat
    rounding: str = "nearest_even"
    overflow: str = "ieee"
    subnormals: str = "keep"
    seed: int = 0
    accumulator: Accumulator = field(default_factory=Accumulator)
    counter: int = 0

    def next_seed(self) -> int | None:
        """The seed of the next rounding operation (None unless stochastic)."""
        if not is_stochastic(self.rounding):
            return None
        self.counter += 1
        return (self.seed + self.counter * 2**64) % 2**128

    def opts(self) -> dict[str, Any]:
        return {
            "rounding": self.rounding,
            "overflow": self.overflow,
            "subnormals": self.subnormals,
            "seed": self.next_seed(),
        }

    def next_accumulator(self) -> Accumulator:
        acc = self.accumulator
        if acc.stochastic:
            return dataclasses.replace(acc, seed=self.next_seed() or acc.seed or 0)
        return acc


def emulate(
    x: Any,
    fmt: Any,
    *,
    rounding: str = "nearest_even",
    overflow: str = "ieee",
    subnormals: str = "keep",
    seed: int | None = None,
    accumulator: Accumulator | str | None = None,
    fma: bool = True,
) -> Emulated:
    """Wrap ``x`` (rounded to ``fmt``) as an :class:`Emulated` array.

    ``accumulator``: an :class:`~precision_lab.Accumulator` or a format name for matmul, dot
    and sum; default ``Accumulator(fmt, rounding)`` (with ``seed``): sequential in the format.
    ``fma`` (default accumulator only): True keeps the products of ``@``/``dot`` exact, one
    rounding per step (a chain of fused multiply-adds); False rounds each product to ``fmt``
    first (``product_format=fmt``), what a loop of ``s = s + a[k] * b[k]`` gives.
    ``seed``: stochastic rounding seed (``None`` draws one; see the module docstring).

    >>> import precision_lab as pl
    >>> e = pl.emulate([1.0, 0.1], "bf16")
    >>> e
    Emulated([1.0, 0.10009765625], fmt=bf16)
    >>> (e + 2.0**-9).tolist()
    [1.0, 0.10205078125]
    >>> a, b = [1.0, 1.0078125], [1.0, 0.75390625]   # a @ b = 1.7597...
    >>> float(pl.emulate(a, "bf16") @ b), float(pl.emulate(a, "bf16", fma=False) @ b)
    (1.7578125, 1.765625)
    """
    f = float_format(fmt, user="Emulated arrays")
    o = check_options(rounding, overflow, subnormals, seed, None)
    if not isinstance(fma, bool):
        raise TypeError(f"fma must be True or False, got {fma!r}")
    if accumulator is None:
        wide = f.precision > 51
        acc = Accumulator(
            "fp64" if wide else f,
            rounding="nearest_even" if wide else o.mode,
            out_rounding=o.mode,
            overflow=o.overflow,
            subnormals=o.subnormals,
            seed=o.seed % 2**64 if is_stochastic(o.mode) else None,
            product_format=None if fma else f,
            product_rounding="nearest_even" if fma else o.mode,
        )
    elif not fma:
        raise ValueError(
            "fma=False shapes the default accumulator only: with accumulator= given, set its "
            "product_format (pl.Accumulator(..., product_format=fmt)) instead"
        )
    elif isinstance(accumulator, Accumulator):
        acc = accumulator
    else:
        acc = Accumulator(accumulator)
    ctx = EmulationContext(
        f,
        o.mode,
        o.overflow,
        o.subnormals,
        check_seed(seed) if is_stochastic(o.mode) else 0,
        acc,
    )
    return Emulated._from_values(_to_grid(x, ctx), ctx)


def _to_grid(x: Any, ctx: EmulationContext) -> np.ndarray:
    """``x`` rounded once to the context's format and mode (float32 or float64 values)."""
    a = as_float_array(_operand(x))
    v = round_to(
        a,
        ctx.fmt,
        rounding=ctx.rounding,
        overflow=ctx.overflow,
        subnormals=ctx.subnormals,
        seed=ctx.next_seed(),
    )
    return np.asarray(v)


def _plain_to_grid(x: Any, ctx: EmulationContext) -> np.ndarray:
    """A plain operand (scalar, numpy or ml_dtypes array) rounded to the context's format as
    :mod:`precision_lab.ops` rounds its operands: nearest_even, the context's overflow and
    subnormal switches. An Emulated operand's values as they are (held exactly: promotion)."""
    if isinstance(x, Emulated):
        return x._v
    a = as_float_array(_operand(x))
    return np.asarray(round_to(a, ctx.fmt, overflow=ctx.overflow, subnormals=ctx.subnormals))


# ----- promotion ---------------------------------------------------------------------------------
def _holds(big: FloatFormat, small: FloatFormat) -> bool:
    """Whether every value of ``small`` (finite values, signed zeros, infinities, NaN) is a value
    of ``big``.

    Binade by binade: ``small``'s values in the binade ``[2**e, 2**(e+1))`` are multiples of its
    quantum there, which must be a multiple of ``big``'s quantum there (and ``big`` must have
    values in that binade and up to ``small.max``).

    >>> from precision_lab import get_format
    >>> bf16, fp16, e4m3 = (get_format(n) for n in ("bf16", "fp16", "e4m3"))
    >>> _holds(bf16, e4m3), _holds(e4m3, bf16), _holds(bf16, fp16), _holds(fp16, bf16)
    (True, False, False, False)
    """
    if big == small:
        return True
    if (
        (small.signed and not big.signed)
        or (small.has_zero and not big.has_zero)
        or (small.has_negative_zero and not big.has_negative_zero)
        or (small.has_inf and not big.has_inf)
        or (small.has_nan and not big.has_nan)
        or small.max > big.max
    ):
        return False
    sub = small.has_subnormals and small.has_zero and small.mantissa_bits > 0
    lowest = small.emin - small.mantissa_bits if sub else small.emin
    top = math.frexp(small.max)[1] - 1
    for e in range(lowest, top + 1):
        q_small = max(e, small.emin) - small.mantissa_bits
        if e < big.emin and not (big.has_subnormals and big.has_zero):
            return False
        if max(e, big.emin) - big.mantissa_bits > q_small:
            return False
    return True


def _settings(ctx: EmulationContext) -> tuple[Any, ...]:
    return (
        ctx.rounding,
        ctx.overflow,
        ctx.subnormals,
        dataclasses.replace(ctx.accumulator, seed=None),
    )


def _promote(a: EmulationContext, b: EmulationContext) -> EmulationContext:
    """The context of an operation between arrays of contexts ``a`` and ``b`` (see the module
    docstring, Promotion): symmetric in ``a`` and ``b``."""
    if a is b:
        return a
    ab, ba = _holds(a.fmt, b.fmt), _holds(b.fmt, a.fmt)
    if ab != ba:
        return a if ab else b
    if not ab:
        raise TypeError(
            f"Emulated arrays of {a.fmt} and {b.fmt}: neither format holds the other's values, "
            "so either choice would round one operand first; convert one explicitly, e.g. "
            f"pl.emulate(np.asarray(y), {str(a.fmt)!r})"
        )
    if _settings(a) != _settings(b):
        raise TypeError(
            f"Emulated {a.fmt} arrays from two emulate() calls with different options "
            f"(rounding={a.rounding!r}, overflow={a.overflow!r}, subnormals={a.subnormals!r}, "
            f"{a.accumulator.describe()} against rounding={b.rounding!r}, "
            f"overflow={b.overflow!r}, subnormals={b.subnormals!r}, "
            f"{b.accumulator.describe()}): which applies is ambiguous; wrap one again with "
            "the other's options"
        )
    return min((a, b), key=lambda c: (c.seed, -c.counter, str(c.fmt)))


def _context_of(items: Any, out: Any = None) -> EmulationContext:
    """The promoted context of the Emulated arrays among ``items`` (else of the ``out`` target)."""
    ctx: EmulationContext | None = None
    for x in _flatten(items):
        if isinstance(x, Emulated):
            ctx = x.ctx if ctx is None else _promote(ctx, x.ctx)
    if ctx is None:
        for x in _flatten(out if isinstance(out, tuple | list) else (out,)):
            if isinstance(x, Emulated):
                return x.ctx
        raise TypeError("no Emulated operand")  # (numpy dispatches only when there is one)
    return ctx


_BINARY = {
    np.add: ops.add,
    np.subtract: ops.sub,
    np.multiply: ops.mul,
    np.true_divide: ops.div,
    np.minimum: ops.minimum,
    np.maximum: ops.maximum,
    np.fmin: ops.minimum,
    np.fmax: ops.maximum,
}
_COMPARE = (np.less, np.less_equal, np.greater, np.greater_equal, np.equal, np.not_equal)
_UNARY = {
    np.sqrt: ops.sqrt,
    np.reciprocal: ops.reciprocal,
    np.negative: ops.neg,
    np.absolute: ops.abs,
    np.exp: ops.exp,
    np.log: ops.log,
    np.tanh: ops.tanh,
}
_PREDICATES = (np.isnan, np.isinf, np.isfinite, np.signbit)
_EXTREMES = {np.maximum: True, np.fmax: True, np.minimum: False, np.fmin: False}

#: numpy functions that only move, select or copy values (they stay on the grid)
_PASS_THROUGH = {
    np.reshape,
    np.transpose,
    np.copy,
    np.ravel,
    np.squeeze,
    np.expand_dims,
    np.swapaxes,
    np.moveaxis,
    np.atleast_1d,
    np.atleast_2d,
    np.broadcast_to,
    np.take,
    np.flip,
    np.roll,
    np.tril,
    np.triu,
    np.diag,
    np.diagonal,
    np.sort,
    np.tile,
    np.repeat,
    np.array_split,
    np.split,
}
#: numpy functions that join a sequence of arrays
_JOIN = {np.concatenate, np.stack, np.vstack, np.hstack}
#: numpy functions that make a new array of the operand's shape (fill values rounded)
_LIKE = {np.zeros_like: 0.0, np.ones_like: 1.0, np.empty_like: 0.0}
#: numpy functions whose result is not a value of the format (shapes, indices, booleans)
_PLAIN = {
    np.shape,
    np.ndim,
    np.size,
    np.argmax,
    np.argmin,
    np.argsort,
    np.nonzero,
    np.any,
    np.all,
    np.array_equal,
    np.isclose,
    np.allclose,
    np.count_nonzero,
    np.isnan,
    np.isfinite,
    np.isinf,
    np.result_type,
}


class Emulated(np.lib.mixins.NDArrayOperatorsMixin):
    """An array whose arithmetic is rounded to a format (make one with :func:`emulate`).

    >>> import numpy as np, precision_lab as pl
    >>> a = pl.emulate(np.array([[2.0, 1.0], [1.0, 3.0]]), "bf16")
    >>> (a @ a).tolist(), a.T.shape, float(a[1, 1])
    ([[5.0, 5.0], [5.0, 10.0]], (2, 2), 3.0)
    >>> np.linalg.solve(a, np.ones(2))
    Traceback (most recent call last):
    ...
    TypeError: numpy.linalg.solve is not supported by Emulated arrays (it would compute in ...
    """

    __array_priority__ = 100

    def __init__(self, values: Any, ctx: EmulationContext) -> None:
        self._v = np.asarray(values)
        self.ctx = ctx

    @classmethod
    def _from_values(cls, values: np.ndarray, ctx: EmulationContext) -> Emulated:
        return cls(values, ctx)

    # ----- array protocol -------------------------------------------------------------------
    @property
    def fmt(self) -> FloatFormat:
        return self.ctx.fmt

    @property
    def values(self) -> np.ndarray:
        """The values (a read-only view of the float array)."""
        v = self._v.view()
        v.flags.writeable = False
        return v

    @property
    def shape(self) -> tuple[int, ...]:
        return self._v.shape

    @property
    def ndim(self) -> int:
        return self._v.ndim

    @property
    def size(self) -> int:
        return self._v.size

    @property
    def dtype(self) -> np.dtype:
        return self._v.dtype

    @property
    def T(self) -> Emulated:
        return self._wrap(self._v.T)

    def __len__(self) -> int:
        return len(self._v)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.array(self._v, dtype=dtype, copy=True)

    def __float__(self) -> float:
        return float(self._v)

    def __int__(self) -> int:
        return int(self._v)

    def __bool__(self) -> bool:
        return bool(self._v)

    def __iter__(self) -> Any:
        for v in self._v:
            yield self._wrap(v)

    def __repr__(self) -> str:
        body = self._v.tolist()
        return f"Emulated({body!r}, fmt={self.fmt})"

    def tolist(self) -> Any:
        """The values as (nested) Python floats, like :meth:`numpy.ndarray.tolist`."""
        return self._v.tolist()

    def _wrap(self, v: Any) -> Emulated:
        return Emulated(np.asarray(v), self.ctx)

    def __getitem__(self, key: Any) -> Emulated:
        return self._wrap(self._v[_plain_key(key)])

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(value, Emulated) and _holds(self.fmt, value.fmt):
            self._v[_plain_key(key)] = value._v  # held exactly: no rounding
            return
        target = self._v[_plain_key(key)]
        self._v[_plain_key(key)] = _to_grid(
            np.broadcast_to(_values(value), np.shape(target)), self.ctx
        )

    def copy(self) -> Emulated:
        """A copy, in the same format and context."""
        return self._wrap(self._v.copy())

    def reshape(self, *shape: Any) -> Emulated:
        """Like :meth:`numpy.ndarray.reshape`, in the same format and context."""
        return self._wrap(self._v.reshape(*shape))

    def transpose(self, *axes: Any) -> Emulated:
        """Like :meth:`numpy.ndarray.transpose`, in the same format and context."""
        return self._wrap(self._v.transpose(*axes))

    def ravel(self) -> Emulated:
        """Like :meth:`numpy.ndarray.ravel`, in the same format and context."""
        return self._wrap(self._v.ravel())

    def sum(
        self,
        axis: Any = None,
        dtype: Any = None,
        out: Any = None,
        keepdims: bool = False,
        initial: Any = None,
        where: Any = True,
    ) -> Any:
        """Sum under the array's accumulator (numpy's arguments; see the module docstring)."""
        return _sum(self, axis, dtype, out, keepdims, initial, where)

    def cumsum(self, axis: Any = None, dtype: Any = None, out: Any = None) -> Any:
        """Running sums under the array's accumulator."""
        return _cumsum(self, axis, dtype, out)

    def dot(self, other: Any, out: Any = None) -> Any:
        """``np.dot(self, other)`` under the accumulator."""
        return _store(_matmul(self, other, "dot", _context_of((self, other))), out)

    def max(
        self,
        axis: Any = None,
        out: Any = None,
        keepdims: bool = False,
        initial: Any = None,
        where: Any = True,
    ) -> Any:
        """Largest value (IEEE 754 maximum: NaN propagates, ``-0 < +0``)."""
        return _extreme(self, True, axis, out, keepdims, initial, where)

    def min(
        self,
        axis: Any = None,
        out: Any = None,
        keepdims: bool = False,
        initial: Any = None,
        where: Any = True,
    ) -> Any:
        """Smallest value (IEEE 754 minimum: NaN propagates, ``-0 < +0``)."""
        return _extreme(self, False, axis, out, keepdims, initial, where)

    def astype(self, dtype: Any) -> np.ndarray:
        """The values as a plain numpy array of ``dtype`` (leaves the emulation)."""
        return self._v.astype(dtype)

    # ----- NEP 13 ---------------------------------------------------------------------------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        name = f"numpy.{ufunc.__name__}"
        out = kwargs.pop("out", None)
        if method == "__call__":
            if kwargs.get("where", True) is not True or kwargs.get("dtype") is not None:
                raise TypeError(f"Emulated arrays do not support {name}(where=, dtype=)")
            kwargs.pop("where", None)
            kwargs.pop("dtype", None)
            if kwargs:
                raise TypeError(
                    f"Emulated arrays do not support {name}({', '.join(kwargs)}=): only out="
                )
            if ufunc in _COMPARE or ufunc in _PREDICATES:
                return _store_plain(_compare(ufunc, inputs), out)
            return _store(_call_ufunc(ufunc, inputs, _context_of(inputs, out)), out)
        x = _arg_em(inputs[0], out)
        kw: dict[str, Any] = {k: (None if v is np._NoValue else v) for k, v in kwargs.items()}
        if method == "reduce" and ufunc is np.add:
            return _sum(x, kw.pop("axis", 0), out=out, **kw)
        if method == "accumulate" and ufunc is np.add:
            return _cumsum(x, kw.pop("axis", 0), out=out, **kw)
        if method == "reduce" and ufunc in _EXTREMES:
            if kw.pop("dtype", None) is not None:
                raise TypeError(f"Emulated arrays do not support {name}.reduce(dtype=)")
            return _extreme(x, _EXTREMES[ufunc], kw.pop("axis", 0), out, **kw)
        raise TypeError(
            f"{name}.{method} is not supported by Emulated arrays (it would compute in float64)"
        )

    # ----- NEP 18 ---------------------------------------------------------------------------
    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if func is np.sum:
            kw = _bind(func, args, kwargs)
            return _sum(_arg_em(kw.pop("a"), kw.get("out")), **kw)
        if func is np.cumsum:
            kw = _bind(func, args, kwargs)
            return _cumsum(_arg_em(kw.pop("a"), kw.get("out")), **kw)
        if func is np.dot:
            kw = _bind(func, args, kwargs)
            ctx = _context_of((kw["a"], kw["b"]), kw.get("out"))
            return _store(_matmul(kw["a"], kw["b"], "dot", ctx), kw.get("out"))
        if func in (np.max, np.amax, np.min, np.amin):
            kw = _bind(func, args, kwargs)
            largest = func in (np.max, np.amax)
            return _extreme(_arg_em(kw.pop("a"), kw.get("out")), largest, **kw)
        if func is np.where:
            return _where(args, kwargs)
        if func is np.outer:
            ctx = _context_of(args[:2])
            a, b = (_as_em(v, ctx) for v in args[:2])
            cols, rows = a.ravel()[:, None], b.ravel()[None, :]
            return _store(_call_ufunc(np.multiply, (cols, rows), ctx), kwargs.get("out"))
        if func in _PLAIN:
            return func(*_plain_args(args), **{k: _plain_args(v) for k, v in kwargs.items()})
        ctx = _context_of(args)
        if func in _JOIN:  # every array joined is a value: plain ones are rounded first
            parts = [_plain_to_grid(v, ctx) for v in args[0]]
            return Emulated(func(parts, *args[1:], **kwargs), ctx)
        if func in _LIKE:
            v = np.full_like(_values(args[0]), _LIKE[func], *args[1:], **kwargs)
            return Emulated(_plain_to_grid(v, ctx), ctx)
        if func in _PASS_THROUGH:
            v = func(*_plain_args(args), **{k: _plain_args(v) for k, v in kwargs.items()})
            if isinstance(v, list):
                return [Emulated(x, ctx) for x in v]
            return Emulated(v, ctx)
        name = f"{func.__module__}.{func.__name__}".replace("numpy.linalg._linalg", "numpy.linalg")
        raise TypeError(
            f"{name} is not supported by Emulated arrays (it would compute in float64): use the "
            "elementwise operators, @, sum, cumsum, dot, or np.asarray(e) to leave the emulation"
        )


# ----- helpers ---------------------------------------------------------------------------------
def _values(x: Any) -> Any:
    return x._v if isinstance(x, Emulated) else x


def _operand(x: Any) -> Any:
    """An operand's values; Python and numpy integers and booleans become float64."""
    if isinstance(x, Emulated):
        return x._v
    a = as_numpy(x)  # the one input conversion (DLPack and array-API arrays: torch tensors)
    return a.astype(np.float64) if a.dtype.kind in "iub" else a


def _plain_key(key: Any) -> Any:
    if isinstance(key, tuple):
        return tuple(_values(k) for k in key)
    return _values(key)


def _plain_args(a: Any) -> Any:
    if isinstance(a, Emulated):
        return a._v
    if isinstance(a, list | tuple):
        return type(a)(_plain_args(v) for v in a)
    return a


def _flatten(items: Any) -> Any:
    for x in items:
        if isinstance(x, list | tuple):
            yield from _flatten(x)
        else:
            yield x


def _bind(func: Any, args: Any, kwargs: Any) -> dict[str, Any]:
    """numpy function arguments by name (those given; numpy's ``<no value>`` dropped)."""
    try:
        bound = inspect.signature(func).bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"numpy.{func.__name__}: {exc}") from None
    return {k: v for k, v in bound.arguments.items() if v is not np._NoValue}


def _as_em(x: Any, ctx: EmulationContext) -> Emulated:
    """``x`` as an Emulated array: itself, or a plain operand rounded to ``ctx``'s format."""
    return x if isinstance(x, Emulated) else Emulated(_plain_to_grid(x, ctx), ctx)


def _arg_em(x: Any, out: Any) -> Emulated:
    """The operand of a reduction: an Emulated array, or (only the ``out=`` target is one) a
    plain operand rounded to the target's format."""
    return x if isinstance(x, Emulated) else _as_em(x, _context_of((), out))


def _result_dtype(ctx: EmulationContext, *arrays: np.ndarray) -> np.dtype:
    """float32 when every operand is float32 and the format fits, else float64."""
    return working_dtype(np.result_type(*arrays), ctx.fmt)


def _store(result: Emulated, out: Any) -> Any:
    """``result``, or written to ``out`` (an Emulated or numpy array, or numpy's 1-tuple)."""
    if out is None:
        return result
    if isinstance(out, tuple):
        if len(out) != 1:
            raise TypeError(f"out= takes one array, got {len(out)}")
        out = out[0]
        if out is None:
            return result
    if isinstance(out, Emulated | np.ndarray):
        if out.shape != result.shape:
            raise ValueError(f"out= has shape {out.shape}, the result has shape {result.shape}")
        if isinstance(out, Emulated):
            out[...] = result
        else:
            np.copyto(out, result._v, casting="same_kind")
        return out
    raise TypeError(f"out= must be an Emulated or numpy array, got {type(out).__name__}")


def _store_plain(result: np.ndarray, out: Any) -> Any:
    """A boolean result, or written to a numpy ``out`` (Emulated arrays hold format values)."""
    if out is None or (isinstance(out, tuple) and all(o is None for o in out)):
        return result
    target = out[0] if isinstance(out, tuple) else out
    if isinstance(target, np.ndarray):
        np.copyto(target, result, casting="same_kind")
        return target
    raise TypeError(
        "out= of a comparison or predicate must be a numpy array (it holds booleans, not "
        f"values of a format), got {type(target).__name__}"
    )


def _compare(ufunc: Any, inputs: tuple[Any, ...]) -> np.ndarray:
    """Comparisons and predicates on the exact values (a plain operand rounded to the Emulated
    operand's format first; ``None`` is unequal to every value)."""
    if ufunc in _PREDICATES:
        return ufunc(_values(inputs[0]))
    a, b = inputs
    if a is None or b is None:
        e = a if isinstance(a, Emulated) else b
        if ufunc is np.equal:
            return np.zeros(e.shape, bool)
        if ufunc is np.not_equal:
            return np.ones(e.shape, bool)
        raise TypeError(f"numpy.{ufunc.__name__} is not supported between Emulated and None")
    ea, eb = isinstance(a, Emulated), isinstance(b, Emulated)
    ctx = (a if ea else b).ctx
    av = a._v if ea else _plain_to_grid(a, ctx)
    bv = b._v if eb else _plain_to_grid(b, ctx)
    with np.errstate(invalid="ignore"):
        return np.asarray(ufunc(av, bv))


def _call_ufunc(ufunc: Any, inputs: tuple[Any, ...], ctx: EmulationContext) -> Emulated:
    vals = [_operand(x) for x in inputs]
    if ufunc in _BINARY:
        return Emulated(_BINARY[ufunc](vals[0], vals[1], ctx.fmt, **ctx.opts()), ctx)
    if ufunc is np.power and np.ndim(vals[1]) == 0 and float(vals[1]) in (2.0, 0.5, -1.0):
        p = float(vals[1])
        fn = {2.0: np.square, 0.5: np.sqrt, -1.0: np.reciprocal}[p]
        return _call_ufunc(fn, (inputs[0],), ctx)
    if ufunc is np.power and isinstance(inputs[0], Emulated) and _int_power(vals[1]) is not None:
        return _integer_power(inputs[0], int(_int_power(vals[1])), ctx)  # type: ignore[arg-type]
    if ufunc is np.square:
        return Emulated(ops.mul(vals[0], vals[0], ctx.fmt, **ctx.opts()), ctx)
    if ufunc is np.positive:
        return Emulated(_plain_to_grid(inputs[0], ctx), ctx)
    if ufunc in _UNARY:
        return Emulated(_UNARY[ufunc](vals[0], ctx.fmt, **ctx.opts()), ctx)
    if ufunc is np.matmul:
        return _matmul(inputs[0], inputs[1], "matmul", ctx)
    raise TypeError(
        f"numpy.{ufunc.__name__} is not supported by Emulated arrays (it would compute in float64)"
    )


#: the largest ``|n|`` of ``x ** n`` done as a chain of multiplications
MAX_INTEGER_POWER = 1024


def _int_power(p: Any) -> int | None:
    """``p`` as an int when it is a scalar with an integer value of at most
    :data:`MAX_INTEGER_POWER` in magnitude, else None."""
    if np.ndim(p) != 0 or isinstance(p, bool | np.bool_):
        return None
    try:
        v = float(p)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(v) or v != int(v) or abs(v) > MAX_INTEGER_POWER:
        return None
    return int(v)


def _integer_power(x: Emulated, n: int, ctx: EmulationContext) -> Emulated:
    """``x ** n`` for an integer ``n``: ``((x * x) * x) * ...``, ``|n| - 1`` correctly rounded
    multiplications from the left (what a loop of ``*`` in the format gives; not one correctly
    rounded power), then one correctly rounded reciprocal for ``n < 0``; ``x ** 0`` is 1
    (also for NaN, as IEEE 754's pown and numpy)."""
    if n == 0:
        return Emulated(_plain_to_grid(np.ones(np.shape(x._v)), ctx), ctx)
    r = x
    for _ in range(abs(n) - 1):
        r = _call_ufunc(np.multiply, (r, x), ctx)
    return _call_ufunc(np.reciprocal, (r,), ctx) if n < 0 else r


def _acc_input_format(ctx: EmulationContext, what: str) -> FloatFormat:
    if ctx.fmt.precision > 26:
        raise TypeError(
            f"{what} of Emulated {ctx.fmt} arrays: the accumulator model takes inputs of "
            "at most 26 significant bits"
        )
    return ctx.fmt


def _matmul(a: Any, b: Any, what: str, ctx: EmulationContext) -> Emulated:
    A, B = (_as_em(x, ctx) for x in (a, b))
    av, bv = A._v, B._v
    if av.ndim == 0 or bv.ndim == 0:
        raise ValueError(f"{what} of Emulated arrays needs operands of at least 1 dimension")
    a1, b1 = av.ndim == 1, bv.ndim == 1
    d = gemm(
        av[None, :] if a1 else av,
        bv[:, None] if b1 else bv,
        input_format=(_acc_input_format(A.ctx, what), _acc_input_format(B.ctx, what)),
        accumulator=ctx.next_accumulator(),
        out_format=ctx.fmt,
        input_rounding="exact",
        backend="numpy",
    )
    d = np.asarray(d)
    if b1:
        d = d[..., 0]
    if a1:
        d = d[..., 0] if b1 else d[..., 0, :]
    return Emulated(d.astype(_result_dtype(ctx, av, bv)), ctx)


def _axes(axis: Any, ndim: int) -> tuple[int, ...]:
    """``axis`` (None, an int or a tuple of ints) as sorted non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, tuple) else (axis,)
    out: list[int] = []
    for ax in items:
        if isinstance(ax, bool) or not isinstance(ax, int | np.integer):
            raise TypeError(f"axis must be None, an int or a tuple of ints, got {axis!r}")
        if not -ndim <= ax < ndim:
            raise np.exceptions.AxisError(int(ax), ndim)
        out.append(int(ax) % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"axis {axis!r} repeats an axis")
    return tuple(sorted(out))


def _no_dtype(dtype: Any, what: str) -> None:
    if dtype is not None:
        raise TypeError(
            f"{what} of an Emulated array takes no dtype= (got {dtype!r}): the result is a "
            "value of the array's format; use np.asarray(e) to leave the emulation"
        )


def _sum(
    e: Emulated,
    axis: Any = None,
    dtype: Any = None,
    out: Any = None,
    keepdims: bool = False,
    initial: Any = None,
    where: Any = True,
) -> Any:
    """Sum along ``axis`` under the accumulator: the axes reduced (a tuple too) are moved last
    and flattened in C order; ``initial`` is the accumulator's starting value ``c``; terms
    masked out by ``where`` are zeros (the summation order and event numbers stay those of the
    whole axis)."""
    _no_dtype(dtype, "sum")
    ctx = e.ctx
    v = e._v
    axes = _axes(axis, v.ndim)
    if where is not True:
        mask = np.broadcast_to(np.asarray(_values(where), dtype=bool), v.shape)
        v = np.where(mask, v, v.dtype.type(0))
    keep = [i for i in range(v.ndim) if i not in axes]
    moved = np.transpose(v, keep + list(axes))
    rest = moved.shape[: len(keep)]
    k = math.prod(moved.shape[len(keep) :])
    rows = moved.reshape(*rest, 1, k)
    c = None
    if initial is not None:
        init = np.asarray(_values(initial))
        if init.ndim:
            raise ValueError(f"initial= must be a scalar, got an array of shape {init.shape}")
        c = as_float_array(_operand(init), "initial")
    fmt = _acc_input_format(ctx, "sum")
    d = gemm(
        rows,
        np.ones((k, 1), dtype=v.dtype),
        c,
        input_format=fmt,
        accumulator=ctx.next_accumulator(),
        out_format=fmt,
        input_rounding="exact",
        backend="numpy",
    )
    r = np.asarray(d).reshape(rest).astype(_result_dtype(ctx, e._v))
    if keepdims:
        r = r.reshape([1 if i in axes else n for i, n in enumerate(v.shape)])
    return _store(Emulated(r, ctx), out)


def _cumsum(e: Emulated, axis: Any = None, dtype: Any = None, out: Any = None) -> Any:
    _no_dtype(dtype, "cumsum")
    if isinstance(axis, tuple):
        raise TypeError(f"cumsum takes an int axis or None, got the tuple {axis!r}")
    if axis is not None:
        axis = _axes(axis, e.ndim)[0]
    ctx = e.ctx
    r = ops.cumsum(
        e._v,
        accumulator=ctx.next_accumulator(),
        axis=axis,
        input_format=_acc_input_format(ctx, "cumsum"),
    )
    return _store(Emulated(np.asarray(r).astype(_result_dtype(ctx, e._v)), ctx), out)


def _extreme(
    e: Emulated,
    largest: bool,
    axis: Any = None,
    out: Any = None,
    keepdims: bool = False,
    initial: Any = None,
    where: Any = True,
) -> Any:
    """max (``largest``) or min along ``axis``: IEEE 754-2019 maximum / minimum (9.6): NaN
    propagates and ``-0 < +0``; ``initial`` is rounded to the format first."""
    ctx = e.ctx
    v = e._v
    axes = _axes(axis, v.ndim) if axis is not None else None
    kw: dict[str, Any] = {"axis": axes, "keepdims": bool(keepdims)}
    init = None
    if initial is not None:
        init_arr = np.asarray(_values(initial))
        if init_arr.ndim:
            raise ValueError(f"initial= must be a scalar, got an array of shape {init_arr.shape}")
        init = _plain_to_grid(initial, ctx).astype(np.float64)[()]
        kw["initial"] = init
    mask = None
    if where is not True:
        mask = np.broadcast_to(np.asarray(_values(where), dtype=bool), v.shape)
        kw["where"] = mask
    with np.errstate(invalid="ignore"):
        r = np.asarray((np.max if largest else np.min)(v, **kw))
    zero = r == 0
    if zero.any():  # numpy's max/min keep whichever zero comes first
        # the zero that wins: +0 for max (if there is one), -0 for min (if there is one)
        z = (v == 0) & (np.signbit(v) != largest)
        if mask is not None:
            z &= mask
        winner = np.any(z, axis=axes, keepdims=bool(keepdims))
        if init is not None and init == 0 and bool(np.signbit(init)) != largest:
            winner = np.ones_like(winner)
        signed = (~winner) if largest else winner
        r = np.where(zero, np.where(signed, -0.0, 0.0), r).astype(r.dtype)
    return _store(Emulated(r.astype(_result_dtype(ctx, v)), ctx), out)


def _where(args: Any, kwargs: Any) -> Any:
    """``np.where(cond)``: index arrays; ``np.where(cond, x, y)``: values of the promoted
    format of the Emulated ones among x and y (else of ``cond``)."""
    if kwargs:
        raise TypeError(f"numpy.where takes no keyword arguments, got {', '.join(kwargs)}")
    if len(args) == 1:
        return np.nonzero(_values(args[0]))
    if len(args) != 3:
        raise TypeError(f"numpy.where takes 1 or 3 arguments, got {len(args)}")
    cond, x, y = args
    ems = [v for v in (x, y) if isinstance(v, Emulated)]
    ctx = _context_of(ems) if ems else _context_of((cond,))
    xv, yv = (_plain_to_grid(v, ctx) for v in (x, y))
    return Emulated(np.where(np.asarray(_values(cond), dtype=bool), xv, yv), ctx)
