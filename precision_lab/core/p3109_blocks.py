"""The block operations of the IEEE P3109 interim report 4.0 (clause 5): decode, project, convert.

A block is a scale ``s`` (in a P3109 format ``fs``) and ``B`` elements (in ``fx``). The report
defines every operation on the exact (closed extended real) values and one projection
(:func:`~precision_lab.p3109_project`: rounding, then saturation) at the end:

* ``ωBlockDecode`` (5.1.1): ``Z_i = S * X_i`` (:func:`p3109_block_decode`); ``ConvertFromBlock``
  (5.2.1) is ``p3109_project(p3109_block_decode(s, x), fr, ...)``;
* ``ωBlockProject`` / ``ConvertToBlock`` (5.1.2, 5.2.2) with a given scale: ``r_i =
  Project(X_i / S)``, NaN where S or X_i is NaN, 0 where S = 0, ``sgn(X_i) sgn(S)`` where S is
  infinite (:func:`p3109_block_project`);
* ``ConvertToBlockMaxAbsFinite`` (5.2.3): ``s = Project_fs(max of the finite |X_i|)`` (NaN when
  every X_i is NaN, +inf when none is finite), then ``ωBlockProject`` with it
  (:func:`p3109_convert_to_block`).

Exactness: a product ``S * X`` of two P3109 values (at most 16 significant bits each) is exact in
float64 unless it leaves float64's range (an overflow becomes ``±`` float64's max, beyond every
P3109 format's range). A quotient ``X / S`` is computed in float64 and then projected, and that
is one rounding of the exact quotient: with ``S = b 2**f`` (``b`` of at most 16 bits) an inexact
``X / S`` differs from every number ``m 2**j`` of ``L`` significant bits by at least
``2**-(16 + L)`` of itself (``|X/S - m 2**j| >= 2**min(k, j) / b`` for ``X = a 2**k``), more
than float64's error ``2**-53`` while ``L <= 36``. The rounding boundaries of a P3109 target
(its values and midpoints: at most 17 bits; stochastic rounding with N random bits: 16 + N)
are such numbers, so the float64 quotient falls on the same side of each as the exact one (for
stochastic rounding up to N = 20; beyond, the probability is the float64 quotient's, off by at
most ``2**-53`` relative). ``tests/core/test_p3109_blocks.py`` checks it against exact
rational arithmetic.

>>> import numpy as np
>>> x = np.array([[1.0, -3.0, 0.25, 6.0]])
>>> s, r = p3109_convert_to_block(x, "p3109_k8p1ue", "p3109_k8p3se", block_size=4)
>>> s.tolist(), r.tolist()
([[4.0]], [[0.25, -0.75, 0.0625, 1.5]])
>>> p3109_block_decode(s, r, block_size=4).tolist()
[[1.0, -3.0, 0.25, 6.0]]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .formats import FloatFormat, IntFormat, get_format
from .rounding import check_rounding, p3109_project

__all__ = ["p3109_block_decode", "p3109_block_project", "p3109_convert_to_block"]

_F64_MAX = float(np.finfo(np.float64).max)


def _blocked(a: np.ndarray, block_size: int, axis: int, name: str) -> np.ndarray:
    """``a`` with ``axis`` last, split into blocks: (..., n_blocks, block_size)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    m = np.moveaxis(a, axis, -1)
    n = m.shape[-1]
    if n % block_size:
        raise ValueError(
            f"{name}: its axis {axis} holds {n} values, not a multiple of block_size={block_size}"
        )
    return m.reshape(*m.shape[:-1], n // block_size, block_size)


def _unblocked(b: np.ndarray, axis: int) -> np.ndarray:
    m = b.reshape(*b.shape[:-2], b.shape[-2] * b.shape[-1])
    return np.moveaxis(m, -1, axis)


def _scales(s: Any, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """The scales as (..., n_blocks, 1), checked against the blocked shape of x."""
    sa = np.asarray(s, dtype=np.float64)
    want = shape[:-1]
    sm = np.moveaxis(sa, axis, -1) if sa.ndim else sa
    if sm.shape != want:
        raise ValueError(
            f"s must hold one scale per block, shape {_moved(want, axis)} (x's shape with its "
            f"axis {axis} divided by block_size), got {sa.shape}"
        )
    return sm[..., None]


def _moved(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return np.moveaxis(np.empty(shape, dtype=np.bool_), -1, axis).shape


def _float_values(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "fiub":
        raise TypeError(f"{name} must hold real numbers, got an array of {a.dtype}")
    return a.astype(np.float64)


def _product(s: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``s * x`` (IEEE: NaN, inf * 0 = NaN), a finite overflow as ``±`` float64's max."""
    with np.errstate(over="ignore", invalid="ignore"):
        z = s * x
    over = np.isinf(z) & np.isfinite(s) & np.isfinite(x)
    return np.where(over, np.copysign(_F64_MAX, z), z)


def p3109_block_decode(s: Any, x: Any, *, block_size: int, axis: int = -1) -> np.ndarray:
    """``ωBlockDecode`` (report 4.0, 5.1.1): the values ``S * X_i`` of blocks of ``x``.

    ``x``: the element values (any shape; ``axis`` holds the blocks, a multiple of
    ``block_size`` long); ``s``: one scale per block (x's shape with that axis divided by
    ``block_size``). Returns float64 values (exact; see the module docstring).

    >>> p3109_block_decode([[2.0, 0.5]], [[1.0, 3.0, 1.0, 3.0]], block_size=2).tolist()
    [[2.0, 6.0, 0.5, 1.5]]
    """
    xb = _blocked(_float_values(x, "x"), block_size, axis, "x")
    sb = _scales(_float_values(s, "s"), xb.shape, axis)
    return _unblocked(_product(sb, xb), axis)


def p3109_block_project(
    x: Any,
    s: Any,
    out_format: str | FloatFormat | IntFormat,
    *,
    block_size: int,
    axis: int = -1,
    rounding: str = "nearest_even",
    saturation: str = "sat_none",
    seed: int | None = None,
    random_bits: int | None = None,
) -> np.ndarray:
    """``ωBlockProject`` / ``ConvertToBlock`` (report 4.0, 5.1.2 and 5.2.2): the elements
    ``r_i = Project(X_i / S)`` of blocks of ``x`` under the given scales ``s``.

    ``Z_i`` is NaN where S or X_i is NaN, 0 where S = 0, ``sgn(X_i) sgn(S)`` where S is
    infinite, else the exact quotient; :func:`~precision_lab.p3109_project` (``rounding``,
    ``saturation``, ``seed``, ``random_bits``) takes it to ``out_format`` (a P3109 format).
    Shapes as :func:`p3109_block_decode`.

    >>> p3109_block_project([[3.0, -1.0]], [[np.inf]], "p3109_k8p3se", block_size=2).tolist()
    [[1.0, -1.0]]
    """
    fr = get_format(out_format)
    if not isinstance(fr, FloatFormat):
        raise ValueError(f"out_format must be a P3109 format, got {fr}")
    mode = check_rounding(rounding)
    xb = _blocked(_float_values(x, "x"), block_size, axis, "x")
    sb = np.broadcast_to(_scales(_float_values(s, "s"), xb.shape, axis), xb.shape)
    with np.errstate(invalid="ignore"):
        z = np.sign(xb) * np.sign(sb)  # S = ±inf (also: NaN X gives NaN)
        ok = np.isfinite(sb) & (sb != 0) & np.isfinite(xb)
        z = np.where(sb == 0, 0.0, z)
        z = np.where(np.isinf(xb) & np.isfinite(sb) & (sb != 0), xb * np.sign(sb), z)
        z = np.where(np.isnan(sb) | np.isnan(xb), np.nan, z)
    if ok.any():
        z[ok] = xb[ok] / sb[ok]  # rounds as the exact quotient (module docstring)
    flat = _unblocked(z, axis)
    kw: dict[str, Any] = {"seed": seed, "random_bits": random_bits}
    return p3109_project(flat, fr, rounding=mode, saturation=saturation, **kw)


def p3109_convert_to_block(
    x: Any,
    scale_format: str | FloatFormat | IntFormat,
    out_format: str | FloatFormat | IntFormat,
    *,
    block_size: int,
    axis: int = -1,
    scale_rounding: str = "nearest_even",
    scale_saturation: str = "sat_finite",
    rounding: str = "nearest_even",
    saturation: str = "sat_none",
    seed: int | None = None,
    random_bits: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``ConvertToBlockMaxAbsFinite`` (report 4.0, 5.2.3): ``(s, r)`` with ``s`` the largest
    finite ``|X_i|`` of each block projected to ``scale_format`` (``scale_rounding``,
    ``scale_saturation``), and ``r`` = :func:`p3109_block_project` of the block under ``s``.

    A block of NaNs gets a NaN scale; a block without finite values gets +inf (or the scale
    format's max under ``scale_saturation="sat_finite"``); a maximum that projects to 0 gives a
    zero scale and zero elements. ``seed`` and ``random_bits`` serve the elements' projection
    (a stochastic ``scale_rounding`` draws with ``seed + 1``).

    >>> s, r = p3109_convert_to_block([[np.nan, np.inf, 2.0, -0.5]], "p3109_k8p1ue",
    ...                               "p3109_k8p3se", block_size=4)
    >>> s.tolist(), r.tolist()
    ([[2.0]], [[nan, inf, 1.0, -0.25]])
    """
    xa = _float_values(x, "x")
    xb = _blocked(xa, block_size, axis, "x")
    a = np.abs(xb)
    fin = np.isfinite(a)
    m = np.max(np.where(fin, a, -1.0), axis=-1)  # -1: no finite value
    any_inf = np.isinf(a).any(axis=-1)
    m = np.where(m >= 0, m, np.where(any_inf, np.inf, np.nan))
    scale_seed = None if seed is None else seed + 1
    s = p3109_project(
        np.moveaxis(m, -1, axis) if m.ndim else m,
        get_format(scale_format),
        rounding=scale_rounding,
        saturation=scale_saturation,
        seed=scale_seed,
        random_bits=random_bits,
    )
    r = p3109_block_project(
        xa,
        s,
        out_format,
        block_size=block_size,
        axis=axis,
        rounding=rounding,
        saturation=saturation,
        seed=seed,
        random_bits=random_bits,
    )
    return np.asarray(s), r
