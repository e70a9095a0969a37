"""The fast paths of ``add``, ``sub``, ``mul`` and ``fma``: the compiled extension
(``_native_path``) and, for narrow formats, float32 arithmetic where it is exact
(``_float32_path``). Each returns None when it does not apply, and the op then runs its
general numpy path (:mod:`.correctly_rounded`); where it applies, its results are those of the
general path bit for bit.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ...backends import native
from ...core.formats import FloatFormat, get_format
from ...core.rounding import (
    RoundingOptions,
    _fits_float32,
    as_float_array,
    check_options,
    for_chunks,
    is_stochastic,
    round_to,
)
from .call import _on_grid, as_operand

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
    """``op`` (add, sub, mul, fma, div, sqrt) on the compiled extension
    (:func:`precision_lab.backends.native.elementwise`: the same results bit for bit, stochastic
    rounding keyed by the same (seed, flat index) words); None when it does not apply: the
    numpy backend selected or the extension not built, an operand that is not an array of
    float32 values (float32, float16, ml_dtypes floats of at most 32 bits), a format whose
    values do not fit in float32, or ``stochastic_equal`` (whose numpy path draws its own
    seed), or a stochastic sum the extension declines."""
    if native.ext is None or native.choice()[0] == "numpy":
        return None
    operands = tuple(as_operand(v, n) for v, n in zip(operands, "xyz", strict=False))
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
    x, y = as_operand(x, "x"), as_operand(y, "y")
    if x.dtype not in _F32_OPERANDS or y.dtype not in _F32_OPERANDS:
        return None
    f = get_format(fmt)
    if not (isinstance(f, FloatFormat) and _fits_float32(f) and f.precision <= 12):
        return None
    o = check_options(rounding, overflow, subnormals, seed, None)
    if x.shape == y.shape and not is_stochastic(o.mode):  # in cache-sized chunks, on all cores
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
        seed=o.seed if is_stochastic(o.mode) else None,
    )


def _grid32(v: np.ndarray, f: FloatFormat, o: RoundingOptions) -> np.ndarray:
    """A float32 operand on ``f``'s grid (as :func:`_on_grid`; no rounding for arrays of
    ``f``'s own ml_dtypes type)."""
    if v.dtype.kind == "V" or v.dtype not in (np.float32, np.float16):
        keep = o.subnormals == "keep" or not f.has_subnormals  # else subnormals are flushed
        if keep and _own_format(v.dtype, f):
            return v.astype(np.float32)
    return _on_grid(as_float_array(v), f, o).astype(np.float32, copy=False)
