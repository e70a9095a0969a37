"""Reductions in a modelled accumulator: ``sum``, ``dot`` and ``cumsum`` along an axis.

``sum`` and ``dot`` are inner products evaluated by :func:`precision_lab.gemm` (numpy
reference) under an :class:`~precision_lab.Accumulator`: every order (``sequential``,
``pairwise``, ``blocked``, ``block_fma``, ``compensated``), promotion, stochastic rounding with
its event numbering. ``sum(x)`` is the inner product of ``x`` with ones, so its summation is
exactly the model's. ``cumsum`` runs the ``sequential`` or ``compensated`` recurrence and
returns every partial result, or under the other models reduces each prefix as its own sum (its
last entry equals ``sum`` with the same accumulator).

Inputs are values of a format of at most 26 significant bits (``input_format``; by default the
accumulator's format if every value is on its grid, else fp32): products are then exact in
float64, as the accumulator model requires. Values off that grid raise ValueError.

Signs of zero and overflow follow one rule in ``sum``, ``dot`` and ``cumsum`` (and in every
backend's accumulator, :func:`precision_lab.gemm`): a reduction starts from the additive
identity (``-0``; ``+0`` under round-down), and every addition is IEEE 754's, so an exact zero
sum is ``+0``, ``-0`` under round-down, and a sum of ``-0`` terms is ``-0``. Infinities (and
NaN) propagate through the running state; every result is rounded with the accumulator's
``overflow`` rule, so under ``overflow="saturate"`` an infinite partial result is reported as
``±max`` by ``sum`` and ``cumsum`` alike.

Results are float32 when the result format fits in float32 (float64 otherwise). The result
format is the accumulator's (its ``promote_format`` when it promotes), or ``out_format``.

>>> import numpy as np, precision_lab as pl
>>> x = np.full(4096, 1.0)
>>> float(pl.ops.sum(x, accumulator="bf16")), float(pl.ops.sum(x, accumulator="fp32"))
(256.0, 4096.0)
>>> acc = pl.Accumulator("bf16", order="compensated")
>>> float(pl.ops.sum(x, accumulator=acc))
4096.0
"""

from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from ...core.exact import Rounder, round_sum, stochastic_words, two_sum
from ...core.formats import FloatFormat, get_format
from ...core.inputs import as_numpy
from ...core.rounding import _fits_float32, as_float_array, is_stochastic, round_to
from ...gemm.accumulator import Accumulator, _float_format
from ...gemm.reference import _as_accumulator, _canonical_nan, gemm
from ...gemm.reference import _on_grid as _put_on_grid

__all__ = ["cumsum", "dot", "sum"]

_FP32 = get_format("fp32")


def _input_format(values: list[np.ndarray], acc: Accumulator, given: Any) -> FloatFormat:
    if given is not None:
        f = _float_format(given, "input_format")
        if f.precision > 26:
            raise ValueError(
                f"input_format {f} has {f.precision} significant bits; at most 26 are supported "
                "(products must be exact in float64)"
            )
        return f
    for cand in (acc.format, _FP32):
        assert isinstance(cand, FloatFormat)
        if cand.precision > 26:
            continue
        if builtins.all(_on_grid(v, cand) for v in values):
            return cand
    raise ValueError(
        "the values are not on the grid of the accumulator's format or of fp32: pass "
        "input_format=, or round them first (e.g. pl.round_to(x, 'fp32'))"
    )


def _input_rounding(input_format: Any, input_rounding: str) -> str:
    """How the reductions put their inputs on the input grid, as :func:`precision_lab.gemm`
    does: ``input_rounding`` when ``input_format`` is given; values already on an inferred grid
    otherwise ("exact")."""
    if not isinstance(input_rounding, str):
        raise TypeError(
            f"input_rounding must be a rounding mode or 'exact', got {input_rounding!r}"
        )
    return "exact" if input_format is None else input_rounding


def _on_grid(v: np.ndarray, f: FloatFormat) -> bool:
    flat = v.reshape(-1)
    step = 1 << 18  # in chunks: no whole-array float64 copies
    for lo in range(0, flat.size, step):
        c = flat[lo : lo + step]
        r = round_to(c, f).astype(np.float64)
        c64 = c.astype(np.float64)
        if not bool(((r == c64) | (np.isnan(r) & np.isnan(c64))).all()):
            return False
    return True


def _out_format(acc: Accumulator, out_format: Any) -> FloatFormat:
    if out_format is not None:
        return _float_format(out_format, "out_format")
    f = acc.promote_format if acc.promote_every is not None else acc.format
    assert isinstance(f, FloatFormat)
    return f


def _values(x: Any, name: str) -> np.ndarray:
    """``x`` as a float array (:func:`~precision_lab.core.inputs.as_numpy`: torch tensors and
    other DLPack/array-API arrays too); integers and booleans as float64 where float64 holds
    them exactly (ValueError otherwise: such a value is on no grid the reductions take)."""
    a = as_numpy(x, name)
    if a.dtype.kind in "biu":
        f = a.astype(np.float64)
        with np.errstate(invalid="ignore"):
            exact = (f < 2.0**63) & (f.astype(a.dtype) == a) if a.dtype.kind != "b" else True
        if not np.all(exact):
            raise ValueError(f"{name} holds integers that float64 cannot hold exactly")
        return f
    return as_float_array(a, name)


def _identity(acc: Accumulator) -> float:
    """The value a reduction starts from: the additive identity of the accumulator's rounding,
    so that the result is the IEEE 754 sum of the terms, signs of zero included: ``-0``
    (``-0 + x = x`` for every ``x``, ``+0`` too), and ``+0`` under round-down (where
    ``+0 + (-0) = -0``). ``sum([-0.0])`` is then ``-0.0``, like ``numpy.cumsum`` and
    ``numpy.dot``, and ``sum([1.0, -1.0])`` is ``-0.0`` under round-down, like :func:`add`."""
    return 0.0 if acc.rounding == "down" else -0.0


def _axis_last(x: np.ndarray, axis: int | None) -> np.ndarray:
    if axis is None:
        return x.reshape(-1)
    try:
        return np.moveaxis(x, axis, -1)
    except np.exceptions.AxisError:
        raise ValueError(
            f"axis {axis} is out of range for an array of {x.ndim} dimensions"
        ) from None


def sum(
    x: Any,
    *,
    accumulator: Accumulator | str | FloatFormat | None = None,
    axis: int | None = None,
    input_format: str | FloatFormat | None = None,
    out_format: str | FloatFormat | None = None,
    input_rounding: str = "nearest_even",
) -> np.ndarray:
    """Sum of ``x`` along ``axis`` (``None``: all elements) under ``accumulator``.

    ``accumulator``: an :class:`~precision_lab.Accumulator` or a format name (sequential,
    round-to-nearest-even); default fp32. The result has ``x``'s shape without ``axis``.

    Inputs, as in :func:`precision_lab.gemm`: with ``input_format`` given, values off its grid
    are rounded onto it once with ``input_rounding`` (default ``nearest_even``; ``"exact"``
    refuses them); without it, the values must lie on the accumulator's format's grid or
    fp32's, which is then the input format.

    >>> import numpy as np, precision_lab as pl
    >>> h = pl.round_to(1.0 / np.arange(1, 601), "fp16")
    >>> float(pl.ops.sum(h, accumulator="fp16"))   # the fp16 harmonic series stagnates
    7.0859375
    """
    acc = _as_accumulator(accumulator)
    v = _axis_last(_values(x, "x"), axis)
    fin = _input_format([v], acc, input_format)
    out_fmt = _out_format(acc, out_format)
    mode = _input_rounding(input_format, input_rounding)
    # the inner products of the rows with one column of ones: what dot(v, ones) computes (the
    # same order, events and words), without a broadcast copy of the ones
    k = v.shape[-1]
    rows = v.reshape(int(np.prod(v.shape[:-1], dtype=np.int64)), k)
    n = rows.shape[0]

    def reduce(r: np.ndarray) -> np.ndarray:
        d = gemm(
            r,
            np.ones((k, 1)),
            np.full((r.shape[0], 1), _identity(acc)),
            input_format=fin,
            accumulator=acc,
            out_format=out_fmt,
            input_rounding=mode,
            backend="numpy",
        )
        return np.asarray(d).reshape(-1)

    # rows in chunks of about 2**20 elements: the reference's float64 copies stay that small
    # (stochastic rounding numbers its random words by the whole output: one call)
    step = max(1, (1 << 20) // max(k, 1))
    if is_stochastic(acc.rounding) or n <= step:
        return reduce(rows).reshape(v.shape[:-1])
    out = np.empty(n, dtype=np.float32 if _fits_float32(out_fmt) else np.float64)
    for lo in range(0, n, step):
        out[lo : lo + step] = reduce(rows[lo : lo + step])
    return out.reshape(v.shape[:-1])


def dot(
    x: Any,
    y: Any,
    *,
    accumulator: Accumulator | str | FloatFormat | None = None,
    axis: int = -1,
    input_format: str | FloatFormat | None = None,
    out_format: str | FloatFormat | None = None,
    input_rounding: str = "nearest_even",
) -> np.ndarray:
    """Inner products ``sum_k x[..., k] * y[..., k]`` along ``axis`` (x and y broadcast).

    Defaults as :func:`precision_lab.gemm`'s: the accumulator is fp32 (sequential, nearest
    even); with ``input_format`` given, x and y are rounded onto its grid once with
    ``input_rounding`` (default ``nearest_even``; ``"exact"`` refuses values off the grid);
    without it they must lie on the accumulator's format's grid or fp32's.

    >>> import numpy as np, precision_lab as pl
    >>> x = np.full(1024, 0.1015625)   # on the bf16 grid
    >>> float(pl.ops.dot(x, x, accumulator="bf16")), float(pl.ops.dot(x, x))
    (4.0, 10.5625)
    """
    acc = _as_accumulator(accumulator)
    xa = _axis_last(_values(x, "x"), axis)
    ya = _axis_last(_values(y, "y"), axis)
    try:
        shape = np.broadcast_shapes(xa.shape, ya.shape)
    except ValueError:
        raise ValueError(
            f"x{xa.shape} and y{ya.shape} (reduction axis last) do not broadcast"
        ) from None
    fin = _input_format([xa, ya], acc, input_format)
    out_fmt = _out_format(acc, out_format)
    mode = _input_rounding(input_format, input_rounding)
    xb = np.broadcast_to(xa, shape)
    yb = np.broadcast_to(ya, shape)
    d = gemm(
        xb[..., None, :],
        yb[..., :, None],
        np.full((*shape[:-1], 1, 1), _identity(acc)),
        input_format=fin,
        accumulator=acc,
        out_format=out_fmt,
        input_rounding=mode,
        backend="numpy",
    )
    return np.asarray(d).reshape(shape[:-1])


def cumsum(
    x: Any,
    *,
    accumulator: Accumulator | str | FloatFormat | None = None,
    axis: int | None = None,
    input_format: str | FloatFormat | None = None,
    input_rounding: str = "nearest_even",
) -> np.ndarray:
    """Running sums of ``x`` along ``axis`` (``None``: the flattened array), each partial sum
    rounded to the accumulator's format. Inputs as in :func:`sum` (``input_format``,
    ``input_rounding``).

    ``sequential`` and ``compensated`` orders run one pass (each partial sum is the running
    state). Under every other order (pairwise, blocked, block_fma, promotion, product formats)
    partial sum ``i`` is :func:`sum` of ``x[..., :i + 1]`` under the accumulator: what a
    program that reduces each prefix with that hardware model gets (``K`` reductions, so
    ``O(K**2)`` work). Stochastic rounding uses the event numbers of the accumulator model, so
    the last partial sum equals :func:`sum` with the same accumulator and seed.

    >>> import precision_lab as pl
    >>> pl.ops.cumsum([1.0, 2.0**-8, 2.0**-8, 2.0**-8], accumulator="bf16").tolist()
    [1.0, 1.0, 1.0, 1.0]
    >>> acc = pl.Accumulator("bf16", order="compensated")
    >>> pl.ops.cumsum([1.0, 2.0**-8, 2.0**-8, 2.0**-8], accumulator=acc).tolist()
    [1.0, 1.0, 1.0078125, 1.015625]
    """
    acc = _as_accumulator(accumulator)
    one_pass = acc.order in ("sequential", "compensated")
    v = _axis_last(_values(x, "x"), axis)
    if v.size == 0:
        assert isinstance(acc.format, FloatFormat)
        empty = np.empty(v.shape, dtype=np.float32 if _fits_float32(acc.format) else np.float64)
        return empty if axis is None else np.moveaxis(empty, -1, axis)
    if not one_pass or acc.promote_every is not None or acc.product_format is not None:
        parts = [
            sum(
                v[..., : i + 1],
                accumulator=acc,
                axis=-1,
                input_format=input_format,
                input_rounding=input_rounding,
            )
            for i in range(v.shape[-1])
        ]
        res = np.stack(parts, axis=-1)
        return res if axis is None else np.moveaxis(res, -1, axis)
    v = np.ascontiguousarray(v).astype(np.float64)
    fin = _input_format([v], acc, input_format)  # values on a <= 26-bit grid (as sum and dot)
    mode = _input_rounding(input_format, input_rounding)
    seed_in = 0 if acc.seed is None else acc.seed  # stochastic input rounding: as gemm does
    v = np.ascontiguousarray(_put_on_grid(v, fin, "x", mode, seed_in))
    rows = v.reshape(-1, v.shape[-1]) if v.ndim else v.reshape(1, 1)
    n_rows, K = rows.shape
    fmt = acc.format
    assert isinstance(fmt, FloatFormat)
    seed = 0 if acc.seed is None else acc.seed
    r = Rounder(
        fmt, acc.rounding, acc.overflow, acc.subnormals, seed, acc.random_bits, acc.zero_sign
    )

    def add(p: np.ndarray, q: np.ndarray, event: int) -> np.ndarray:
        w = None
        if is_stochastic(acc.rounding):
            w = stochastic_words(seed, event, n_rows, (n_rows,), acc.random_bits)
        s, t = two_sum(p, q, down=acc.rounding == "down")
        with np.errstate(invalid="ignore"):
            out = round_sum(s, t, r, w)
        special = ~np.isfinite(s)
        out[special] = s[special]
        return out

    out = np.empty_like(rows)
    s = np.full(n_rows, _identity(acc))
    comp = np.zeros(n_rows)
    for k in range(K):
        p = rows[:, k]
        if acc.order == "sequential":
            s = out[:, k] = add(s, p, k)
            continue
        y = add(p, -comp, 5 * K + k)
        t = add(s, y, k)
        comp = add(add(t, -s, 6 * K + k), -y, 7 * K + k)
        # an infinity or NaN (input or overflow) is added as it is, the compensation dropped,
        # as gemm's compensated order does (accumulator spec section 5)
        with np.errstate(invalid="ignore"):
            bad = ~(np.isfinite(p) & np.isfinite(s))
            t = np.where(bad, s + p, t)
        comp = np.where(bad, 0.0, comp)
        s = out[:, k] = t
    # on the grid already, but for the signs of zero and NaN of the format, and infinities,
    # which the running state keeps (as sum's model does) and each output rounds with the
    # overflow rule (to max under "saturate", as sum's result)
    overflow = "ieee" if acc.overflow == "infinity" else acc.overflow  # (the same on the grid)
    res = round_to(out, fmt, overflow=overflow).reshape(v.shape)
    res = _canonical_nan(
        res.astype(np.float32 if _fits_float32(fmt) else np.float64), acc.nan_encoding
    )
    return res if axis is None else np.moveaxis(res, -1, axis)
