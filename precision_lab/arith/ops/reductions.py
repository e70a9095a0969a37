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
from ...core.rounding import STOCHASTIC_MODES, _fits_float32, as_float_array, round_to
from ...gemm.accumulator import Accumulator, _float_format
from ...gemm.reference import _as_accumulator, gemm

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


def _on_grid(v: np.ndarray, f: FloatFormat) -> bool:
    r = round_to(v, f).astype(np.float64)
    v64 = v.astype(np.float64)
    return bool(((r == v64) | (np.isnan(r) & np.isnan(v64))).all())


def _out_format(acc: Accumulator, out_format: Any) -> FloatFormat:
    if out_format is not None:
        return _float_format(out_format, "out_format")
    f = acc.promote_format if acc.promote_every is not None else acc.format
    assert isinstance(f, FloatFormat)
    return f


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
) -> np.ndarray:
    """Sum of ``x`` along ``axis`` (``None``: all elements) under ``accumulator``.

    ``accumulator``: an :class:`~precision_lab.Accumulator` or a format name (sequential,
    round-to-nearest-even); default fp32. The result has ``x``'s shape without ``axis``.

    >>> import numpy as np, precision_lab as pl
    >>> h = pl.round_to(1.0 / np.arange(1, 601), "fp16")
    >>> float(pl.ops.sum(h, accumulator="fp16"))   # the fp16 harmonic series stagnates
    7.0859375
    """
    acc = _as_accumulator(accumulator)
    a = as_float_array(x, "x")
    v = _axis_last(a, axis)
    return dot(
        v,
        np.ones(v.shape[-1:]),
        accumulator=acc,
        axis=-1,
        input_format=input_format,
        out_format=out_format,
    )


def dot(
    x: Any,
    y: Any,
    *,
    accumulator: Accumulator | str | FloatFormat | None = None,
    axis: int = -1,
    input_format: str | FloatFormat | None = None,
    out_format: str | FloatFormat | None = None,
) -> np.ndarray:
    """Inner products ``sum_k x[..., k] * y[..., k]`` along ``axis`` (x and y broadcast).

    >>> import numpy as np, precision_lab as pl
    >>> x = np.full(1024, 0.1015625)   # on the bf16 grid
    >>> float(pl.ops.dot(x, x, accumulator="bf16")), float(pl.ops.dot(x, x))
    (4.0, 10.5625)
    """
    acc = _as_accumulator(accumulator)
    xa = _axis_last(as_float_array(x, "x"), axis)
    ya = _axis_last(as_float_array(y, "y"), axis)
    try:
        shape = np.broadcast_shapes(xa.shape, ya.shape)
    except ValueError:
        raise ValueError(
            f"x{xa.shape} and y{ya.shape} (reduction axis last) do not broadcast"
        ) from None
    fin = _input_format([xa, ya], acc, input_format)
    out_fmt = _out_format(acc, out_format)
    xb = np.broadcast_to(xa, shape)
    yb = np.broadcast_to(ya, shape)
    d = gemm(
        xb[..., None, :],
        yb[..., :, None],
        input_format=fin,
        accumulator=acc,
        out_format=out_fmt,
        input_rounding="exact",
        backend="numpy",
    )
    return np.asarray(d).reshape(shape[:-1])


def cumsum(
    x: Any,
    *,
    accumulator: Accumulator | str | FloatFormat | None = None,
    axis: int | None = None,
    input_format: str | FloatFormat | None = None,
) -> np.ndarray:
    """Running sums of ``x`` along ``axis`` (``None``: the flattened array), each partial sum
    rounded to the accumulator's format.

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
    v = _axis_last(as_float_array(x, "x"), axis)
    if v.size == 0:
        assert isinstance(acc.format, FloatFormat)
        empty = np.empty(v.shape, dtype=np.float32 if _fits_float32(acc.format) else np.float64)
        return empty if axis is None else np.moveaxis(empty, -1, axis)
    if not one_pass or acc.promote_every is not None or acc.product_format is not None:
        parts = [
            sum(v[..., : i + 1], accumulator=acc, axis=-1, input_format=input_format)
            for i in range(v.shape[-1])
        ]
        res = np.stack(parts, axis=-1)
        return res if axis is None else np.moveaxis(res, -1, axis)
    v = np.ascontiguousarray(v).astype(np.float64)
    _input_format([v], acc, input_format)  # values on a <= 26-bit grid (as sum and dot)
    rows = v.reshape(-1, v.shape[-1]) if v.ndim else v.reshape(1, 1)
    n_rows, K = rows.shape
    fmt = acc.format
    assert isinstance(fmt, FloatFormat)
    seed = 0 if acc.seed is None else acc.seed
    r = Rounder(fmt, acc.rounding, acc.overflow, acc.subnormals, seed, acc.random_bits)

    def add(p: np.ndarray, q: np.ndarray, event: int) -> np.ndarray:
        w = None
        if acc.rounding in STOCHASTIC_MODES:
            w = stochastic_words(seed, event, n_rows, (n_rows,), acc.random_bits)
        s, t = two_sum(p, q)
        with np.errstate(invalid="ignore"):
            out = round_sum(s, t, r, w)
        special = ~np.isfinite(s)
        out[special] = s[special]
        return out

    out = np.empty_like(rows)
    s = np.zeros(n_rows)
    comp = np.zeros(n_rows)
    for k in range(K):
        p = rows[:, k]
        if acc.order == "sequential":
            s = out[:, k] = add(s, p, k)
            continue
        y = add(p, -comp, 5 * K + k)
        t = add(s, y, k)
        comp = add(add(t, -s, 6 * K + k), -y, 7 * K + k)
        s = out[:, k] = t
    res = round_to(out, fmt).reshape(v.shape)  # on the grid already (a no-op but for -0/NaN)
    res = res.astype(np.float32 if _fits_float32(fmt) else np.float64)
    return res if axis is None else np.moveaxis(res, -1, axis)
