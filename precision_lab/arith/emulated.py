"""``Emulated`` arrays: run an unmodified numpy algorithm in a low-precision format.

:func:`emulate` wraps an array; every numpy ufunc result, reduction and matrix product on it is
rounded to its format by :mod:`precision_lab.ops` (NEP 13 ``__array_ufunc__`` and NEP 18
``__array_function__``), so ``A[k+1:] -= l * A[k]`` is a bf16 multiply and a bf16 subtract,
each correctly rounded, and ``A @ x`` / ``x.sum()`` / ``np.dot`` go through the array's
:class:`~precision_lab.Accumulator`.

Rules.

* **Values** are kept in a float64 (or float32) numpy array, always on the format's grid.
  Indexing, slicing, reshape, transpose, concatenate, where, copy and friends pass through
  (the values stay on the grid); assignment rounds the assigned values to the format.
* **Supported ufuncs**: ``+ - * /`` (``add subtract multiply true_divide``), ``sqrt``,
  ``square``, ``reciprocal``, ``power`` with exponent 2, 0.5 or -1, ``negative positive
  absolute``, ``minimum maximum fmin fmax``,
  the comparisons, ``exp log tanh``, ``matmul``, ``isnan isinf isfinite signbit``;
  ``add.reduce``/``add.accumulate`` (``sum``/``cumsum``), ``maximum.reduce``,
  ``minimum.reduce``. Correctly rounded where :mod:`precision_lab.ops` is; ``exp log tanh`` are
  faithful. Anything else raises TypeError naming the function (it would compute in float64),
  for example ``np.linalg.solve`` or ``np.sin``. ``np.asarray(e)`` is the explicit way out.
* **Promotion**: an operation between Emulated arrays of different formats takes the format
  (and the rounding, seed counter and accumulator) of the operand with more significand bits
  (then the wider range); Python scalars, numpy arrays and ml_dtypes arrays take the Emulated
  operand's format (they are rounded to it, nearest_even, as any operand of
  :mod:`precision_lab.ops`).
* **Stochastic rounding**: every array made by one :func:`emulate` call shares a counter; each
  rounding operation takes the next value ``n`` and rounds with the seed ``seed + n * 2**64``
  (the random words of element ``i`` are then the Philox words of key ``(seed, n)``): fresh
  random words for every operation, and the same sequence on every run of the same program.
* **Accumulator** (``matmul``, ``dot``, ``sum``, ``cumsum``): by default a sequential sum in
  the array's format and rounding mode (what a loop of ``+`` would do); any
  :class:`~precision_lab.Accumulator` may be given (fp32 accumulation, pairwise, compensated,
  tensor-core models ...).

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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.formats import FloatFormat
from ..core.inputs import as_numpy
from ..core.random_words import check_seed
from ..core.rounding import STOCHASTIC_MODES, as_float_array, check_options, round_to
from ..gemm.accumulator import Accumulator
from ..gemm.reference import gemm
from . import ops
from .ops.elementwise import float_format

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
        if self.rounding not in STOCHASTIC_MODES:
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
) -> Emulated:
    """Wrap ``x`` (rounded to ``fmt``) as an :class:`Emulated` array.

    ``accumulator``: an :class:`~precision_lab.Accumulator` or a format name for matmul, dot
    and sum; default ``Accumulator(fmt, rounding)`` (with ``seed``): sequential in the format.
    ``seed``: stochastic rounding seed (``None`` draws one; see the module docstring).

    >>> import precision_lab as pl
    >>> e = pl.emulate([1.0, 0.1], "bf16")
    >>> e
    Emulated([1.0, 0.10009765625], fmt=bf16)
    >>> (e + 2.0**-9).tolist()
    [1.0, 0.10205078125]
    """
    f = float_format(fmt)
    o = check_options(rounding, overflow, subnormals, seed, None)
    if accumulator is None:
        acc = Accumulator(
            f if f.precision <= 51 else "fp64",
            rounding=o.mode if f.precision <= 51 else "nearest_even",
            out_rounding=o.mode,
            overflow=o.overflow,
            subnormals=o.subnormals,
            seed=o.seed % 2**64 if o.mode in STOCHASTIC_MODES else None,
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
        check_seed(seed) if o.mode in STOCHASTIC_MODES else 0,
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


def _wider(a: EmulationContext, b: EmulationContext) -> EmulationContext:
    fa, fb = a.fmt, b.fmt
    return a if (fa.precision, fa.max) >= (fb.precision, fb.max) else b


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
_COMPARE = {
    np.less: np.less,
    np.less_equal: np.less_equal,
    np.greater: np.greater,
    np.greater_equal: np.greater_equal,
    np.equal: np.equal,
    np.not_equal: np.not_equal,
}
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

#: numpy functions that only move, select or copy values (they stay on the grid)
_PASS_THROUGH = {
    np.reshape,
    np.transpose,
    np.concatenate,
    np.stack,
    np.vstack,
    np.hstack,
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
    np.zeros_like,
    np.empty_like,
    np.ones_like,
    np.where,
    np.sort,
    np.tile,
    np.repeat,
    np.array_split,
    np.split,
}
#: numpy functions that join a sequence of arrays
_JOIN = {np.concatenate, np.stack, np.vstack, np.hstack}
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
        return self._v.tolist()

    def _wrap(self, v: Any) -> Emulated:
        return Emulated(np.asarray(v), self.ctx)

    def __getitem__(self, key: Any) -> Emulated:
        return self._wrap(self._v[_plain_key(key)])

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(value, Emulated) and value.fmt == self.fmt:
            self._v[_plain_key(key)] = value._v
            return
        target = self._v[_plain_key(key)]
        self._v[_plain_key(key)] = _to_grid(
            np.broadcast_to(_values(value), np.shape(target)), self.ctx
        )

    def copy(self) -> Emulated:
        return self._wrap(self._v.copy())

    def reshape(self, *shape: Any) -> Emulated:
        return self._wrap(self._v.reshape(*shape))

    def transpose(self, *axes: Any) -> Emulated:
        return self._wrap(self._v.transpose(*axes))

    def ravel(self) -> Emulated:
        return self._wrap(self._v.ravel())

    def sum(self, axis: int | None = None) -> Emulated:
        return _reduce_sum(self, axis)

    def cumsum(self, axis: int | None = None) -> Emulated:
        return _cumsum(self, axis)

    def dot(self, other: Any) -> Emulated:
        return _matmul(self, other)

    def max(self, axis: int | None = None) -> Emulated:
        return self._wrap(np.max(self._v, axis=axis))

    def min(self, axis: int | None = None) -> Emulated:
        return self._wrap(np.min(self._v, axis=axis))

    def astype(self, dtype: Any) -> np.ndarray:
        """The values as a plain numpy array of ``dtype`` (leaves the emulation)."""
        return self._v.astype(dtype)

    # ----- NEP 13 ---------------------------------------------------------------------------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.pop("out", None)
        if kwargs.get("where", True) is not True or kwargs.get("dtype") is not None:
            raise TypeError(f"Emulated arrays do not support {ufunc.__name__}(where=, dtype=)")
        kwargs.pop("where", None)
        kwargs.pop("dtype", None)
        ctx = _context_of(inputs)
        if method == "__call__":
            result = _call_ufunc(ufunc, inputs, ctx)
        elif method == "reduce" and ufunc is np.add and not kwargs.get("keepdims"):
            result = _reduce_sum(inputs[0], kwargs.get("axis", 0))
        elif method == "accumulate" and ufunc is np.add:
            result = _cumsum(inputs[0], kwargs.get("axis", 0))
        elif method == "reduce" and ufunc in (np.maximum, np.minimum, np.fmax, np.fmin):
            v = ufunc.reduce(_values(inputs[0]), **kwargs)
            result = Emulated(v, ctx)
        else:
            raise TypeError(
                f"numpy.{ufunc.__name__}.{method} is not supported by Emulated arrays "
                "(it would compute in float64)"
            )
        if out is None:
            return result
        (target,) = out
        if not isinstance(target, Emulated):
            raise TypeError("out= must be an Emulated array")
        target[...] = result
        return target

    # ----- NEP 18 ---------------------------------------------------------------------------
    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        ctx = _context_of(args)
        if func in (np.sum,):
            return _reduce_sum(args[0], kwargs.get("axis", args[1] if len(args) > 1 else None))
        if func in (np.cumsum,):
            return _cumsum(args[0], kwargs.get("axis", args[1] if len(args) > 1 else None))
        if func is np.dot:
            return _matmul(args[0], args[1])
        if func in (np.max, np.amax, np.min, np.amin):
            return Emulated(func(*_plain_args(args), **kwargs), ctx)
        if func is np.outer:
            a, b = args[0], args[1]
            return np.multiply(_as_em(a, ctx).ravel()[:, None], _as_em(b, ctx).ravel()[None, :])
        if func is np.where and len(args) == 3:
            cond = _values(args[0])
            x, y = (_as_em(v, ctx) for v in args[1:])
            wide = _wider(x.ctx, y.ctx)
            xv, yv = (_to_grid(v, wide) if v.ctx.fmt != wide.fmt else v._v for v in (x, y))
            return Emulated(np.where(cond, xv, yv), wide)
        if func in _JOIN:  # every array joined is a value: plain ones are rounded first
            parts = [
                _to_grid(v, ctx) if not isinstance(v, Emulated) or v.fmt != ctx.fmt else v._v
                for v in args[0]
            ]
            return Emulated(func(parts, *args[1:], **kwargs), ctx)
        if func in _PASS_THROUGH:
            v = func(*_plain_args(args), **{k: _plain_args(v) for k, v in kwargs.items()})
            if isinstance(v, list):
                return [Emulated(x, ctx) for x in v]
            return Emulated(v, ctx)
        if func in _PLAIN:
            return func(*_plain_args(args), **{k: _plain_args(v) for k, v in kwargs.items()})
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


def _context_of(items: Any) -> EmulationContext:
    ctx: EmulationContext | None = None
    for x in _flatten(items):
        if isinstance(x, Emulated):
            ctx = x.ctx if ctx is None else _wider(ctx, x.ctx)
    assert ctx is not None
    return ctx


def _flatten(items: Any) -> Any:
    for x in items:
        if isinstance(x, list | tuple):
            yield from _flatten(x)
        else:
            yield x


def _as_em(x: Any, ctx: EmulationContext) -> Emulated:
    return x if isinstance(x, Emulated) else Emulated(_to_grid(x, ctx), ctx)


def _call_ufunc(ufunc: Any, inputs: tuple[Any, ...], ctx: EmulationContext) -> Any:
    vals = [_operand(x) for x in inputs]
    if ufunc in _BINARY:
        return Emulated(_BINARY[ufunc](vals[0], vals[1], ctx.fmt, **ctx.opts()), ctx)
    if ufunc is np.power and np.ndim(vals[1]) == 0 and float(vals[1]) in (2.0, 0.5, -1.0):
        p = float(vals[1])
        fn = {2.0: np.square, 0.5: np.sqrt, -1.0: np.reciprocal}[p]
        return _call_ufunc(fn, (inputs[0],), ctx)
    if ufunc is np.square:
        return Emulated(ops.mul(vals[0], vals[0], ctx.fmt, **ctx.opts()), ctx)
    if ufunc is np.positive:
        return Emulated(_to_grid(vals[0], ctx), ctx)
    if ufunc in _UNARY:
        return Emulated(_UNARY[ufunc](vals[0], ctx.fmt, **ctx.opts()), ctx)
    if ufunc in _COMPARE:
        return ops.elementwise._compare(
            vals[0],
            vals[1],
            ctx.fmt,
            ("nearest_even", ctx.overflow, ctx.subnormals, None),
            _COMPARE[ufunc],
        )
    if ufunc in _PREDICATES:
        return ufunc(vals[0])
    if ufunc is np.matmul:
        return _matmul(inputs[0], inputs[1])
    raise TypeError(
        f"numpy.{ufunc.__name__} is not supported by Emulated arrays (it would compute in float64)"
    )


def _acc_input_format(ctx: EmulationContext) -> FloatFormat:
    if ctx.fmt.precision > 26:
        raise TypeError(
            f"matmul/dot/sum of Emulated {ctx.fmt} arrays: the accumulator model takes inputs of "
            "at most 26 significant bits"
        )
    return ctx.fmt


def _matmul(a: Any, b: Any) -> Emulated:
    ctx = _context_of((a, b))
    A, B = (_as_em(x, ctx) for x in (a, b))
    av, bv = A._v, B._v
    a1, b1 = av.ndim == 1, bv.ndim == 1
    d = gemm(
        av[None, :] if a1 else av,
        bv[:, None] if b1 else bv,
        input_format=(_acc_input_format(A.ctx), _acc_input_format(B.ctx)),
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
    return Emulated(d.astype(A._v.dtype), ctx)


def _reduce_sum(x: Any, axis: int | None) -> Emulated:
    e = x if isinstance(x, Emulated) else None
    assert e is not None
    ctx = e.ctx
    r = ops.sum(
        e._v,
        accumulator=ctx.next_accumulator(),
        axis=axis,
        input_format=_acc_input_format(ctx),
        out_format=ctx.fmt,
    )
    return Emulated(np.asarray(r).astype(e._v.dtype), ctx)


def _cumsum(x: Any, axis: int | None) -> Emulated:
    e = x if isinstance(x, Emulated) else None
    assert e is not None
    ctx = e.ctx
    r = ops.cumsum(
        e._v, accumulator=ctx.next_accumulator(), axis=axis, input_format=_acc_input_format(ctx)
    )
    return Emulated(np.asarray(r).astype(e._v.dtype), ctx)
