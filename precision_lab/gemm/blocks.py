"""GEMM on block-quantized operands (MX, NVFP4, DeepSeek-V3 tiles): :func:`gemm_blocks`.

Each operand's elements are multiplied by their block scales exactly (powers of two, or products
that fit the working format) and the GEMM runs under any :class:`~precision_lab.Accumulator`.

>>> import numpy as np, precision_lab as pl
>>> x = np.arange(64, dtype=np.float32).reshape(2, 32) / 8
>>> qa = pl.quantize_blocks(x, "mxfp8_e4m3")
>>> qb = pl.quantize_blocks(np.ones((32, 1), np.float32), "mxfp8_e4m3", axis=0)
>>> pl.gemm_blocks(qa, qb)[:, 0]          # exact row sums 62 and 190: x rounded to MXFP8 first
array([ 61.25, 186.5 ], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.formats import FloatFormat, get_format
from ..core.rounding import (
    round_to,
)
from ..quant.block_formats import _float
from ..quant.blocks import QuantizedBlocks
from .accumulator import Accumulator, _float_format
from .native_backend import ON_GRID
from .reference import _as_accumulator, gemm, gemm_scaled_internal

__all__ = ["gemm_blocks"]

_FP32 = _float("fp32")


# ----- GEMM on block-quantized operands ---------------------------------------------------------
def _k_block(q: QuantizedBlocks, which: str) -> int:
    """The block size along K of an operand (A: (..., M, K) blocked along K; B: (..., K, N))."""
    bf = q.block_format
    nd = len(q.shape)
    if nd < 2:
        raise ValueError(f"{which} must be at least 2-D, got shape {q.shape}")
    if len(bf.block_shape) == 2:
        return bf.block_shape[1] if which == "a" else bf.block_shape[0]
    want = nd - 1 if which == "a" else nd - 2
    if q.axis != want:
        axis_name = "-1 (K of (..., M, K))" if which == "a" else "-2 (K of (..., K, N))"
        raise ValueError(
            f"{which} must be block-quantized along K: axis {axis_name}, got axis {q.axis} "
            f"of shape {q.shape}"
        )
    return bf.block_shape[0]


def _per_element(grid: np.ndarray, q: QuantizedBlocks) -> np.ndarray:
    """A block-grid array repeated onto the elements (the tensor's shape)."""
    bf, out = q.block_format, grid
    if len(bf.block_shape) == 2:
        out = np.repeat(np.repeat(out, bf.block_shape[0], axis=-2), bf.block_shape[1], axis=-1)
    else:
        out = np.repeat(out, bf.block_shape[0], axis=q.axis)
    return out[tuple(slice(0, n) for n in q.shape)]


def _with_blocks_set(
    vals: np.ndarray, q: QuantizedBlocks, nan: np.ndarray, zero: np.ndarray
) -> np.ndarray:
    """``vals`` (the tensor's shape) with every element of a block marked in ``nan`` NaN and of
    one marked in ``zero`` +0 (both on the block grid). Where the tensor is whole blocks, one
    copy written through a blocked view with the grid masks broadcast over each block (the
    attention probabilities' masked blocks made this 75 us per operand with per-element masks,
    this Zen 3); else with the masks repeated onto the elements."""
    bf, shape = q.block_format, tuple(vals.shape)
    blocked: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # (view shape, block axes)
    if len(bf.block_shape) == 2 and len(shape) >= 2:
        (tr, tc), (r, c) = bf.block_shape, shape[-2:]
        if r % tr == 0 and c % tc == 0:
            blocked = (*shape[:-2], r // tr, tr, c // tc, tc), (len(shape) - 1, len(shape) + 1)
    elif len(bf.block_shape) == 1 and shape:
        ax, blk = q.axis, bf.block_shape[0]
        if shape[ax] % blk == 0:
            blocked = (*shape[:ax], shape[ax] // blk, blk, *shape[ax + 1 :]), (ax + 1,)
    if blocked is None:
        vals = np.where(_per_element(nan, q), np.nan, vals)
        return np.where(_per_element(zero, q), 0.0, vals)
    view_shape, block_axes = blocked
    out = np.array(vals, order="C")
    view = out.reshape(view_shape)
    for mask, value in ((nan, np.nan), (zero, 0.0)):
        np.copyto(view, np.float32(value), where=np.expand_dims(mask, block_axes))
    return out


def _gemm_operand(q: QuantizedBlocks) -> tuple[np.ndarray, np.ndarray, FloatFormat]:
    """Element values, positive finite fp32 scales and the elements' input format.

    A NaN block's elements become NaN (so every product with them is NaN); a block whose scale is
    0 holds zeros. Both then take the scale 1, as the GEMM wants positive finite scales. The
    values stay float32 (:meth:`QuantizedBlocks.element_values`, exact): a float64 copy doubled
    the memory that the GEMM's input check and packing read (5% of a te_mxfp8 step of
    benchmarks/bench_simulate.py, measured on this Xeon).
    """
    vals = q.element_values()
    s = q.scales
    if not (s > 0).all():  # (scales are never negative: a NaN or a zero is here)
        nan, zero = np.isnan(s), s == 0
        vals = _with_blocks_set(vals, q, nan, zero)
        s = np.where(nan | zero, 1.0, s)
    elem = q.block_format.element
    # MX INT8 elements k / 64 (|k| <= 127) are exact in bf16
    fmt = elem if isinstance(elem, FloatFormat) else _float("bf16")
    return vals, s, fmt


def _check_block_scaled(acc: Accumulator, a: QuantizedBlocks, b: QuantizedBlocks, kb: int) -> None:
    """The operands of a block-scaled preset: its scale format, blocks a multiple of its
    groups (ValueError naming the accumulator otherwise)."""
    for q, name in ((a, "a"), (b, "b")):
        bf = q.block_format
        if acc.scale_format is not None and bf.scale != acc.scale_format:
            raise ValueError(
                f"accumulator: {acc.name or 'the model'} takes {acc.scale_format} scales, but "
                f"{name} is {bf} with {bf.scale} scales"
            )
    if acc.group is not None and kb % acc.group:
        raise ValueError(
            f"accumulator: {acc.name or 'the model'} sums groups of {acc.group} products under "
            f"one scale, but the operands' blocks along K hold {kb}"
        )


def gemm_blocks(
    a: QuantizedBlocks,
    b: QuantizedBlocks,
    c: Any = None,
    *,
    accumulator: Any = None,
    out_format: str | FloatFormat = "fp32",
    backend: str = "auto",
) -> Any:
    """``d = c + A @ B`` of block-quantized operands, scales applied per block along K.

    ``a`` is ``(..., M, K)`` quantized along K (``axis=-1``, or 2-D tiles), ``b`` is
    ``(..., K, N)`` quantized along K (``axis=-2``, or 2-D tiles), with the same block size along
    K. The element values go into :func:`precision_lab.gemm` exactly (``input_rounding="exact"``)
    with their block scales as ``scale_a`` / ``scale_b``: each block of K is summed in the
    accumulator, then multiplied by ``scale_a * scale_b`` and added into the wide accumulator at
    promotion (FP32 by default), as DeepSeek-V3's FP8 GEMM and the block-scaled MMA of Blackwell
    do. NVFP4's per-tensor scales multiply the FP32 result afterwards (cuBLAS' ``alpha``).

    With a block-scaled tensor-core preset (``accumulator=pl.tensor_core("b200", "nvfp4",
    instruction="tcgen05")``, ``"mxfp8_e4m3"``, ``"mxfp4_e2m1"`` ..., ``scales="in_block"`` in
    the accumulator) the scales enter the block FMA instead, as the hardware computes it
    (tcgen05 ``kind::mxf8f6f4`` / ``kind::mxf4nvf4``, sm_120 ``mma.block_scale``; spec 3b of
    :mod:`precision_lab.gemm.accumulator`): there is no promotion, and c is the accumulator
    input of the first block.

    Parameters
    ----------
    a, b:
        :class:`QuantizedBlocks` from :func:`quantize_blocks`.
    c:
        Accumulator input (see :func:`precision_lab.gemm`); not with NVFP4 operands.
    accumulator, out_format, backend:
        As :func:`precision_lab.gemm` (default: FP32 sequential accumulation, promoted to FP32
        at every block of K).

    Examples
    --------
    >>> import numpy as np, precision_lab as pl
    >>> x = np.array([[1.0, -2.0, 0.5, 4.0] * 8, [3.0, 0.25, -1.5, 2.0] * 8])
    >>> w = np.ones((32, 3))
    >>> qa = pl.quantize_blocks(x, "mxfp8_e4m3")
    >>> qb = pl.quantize_blocks(w, "mxfp8_e4m3", axis=0)
    >>> pl.gemm_blocks(qa, qb)[:, 0]                      # x and w are exact in MXFP8
    array([28., 30.], dtype=float32)
    """
    for q, name in ((a, "a"), (b, "b")):
        if not isinstance(q, QuantizedBlocks):
            raise TypeError(
                f"{name} must be a QuantizedBlocks (from quantize_blocks), got {type(q).__name__}"
            )
    ka, kb = _k_block(a, "a"), _k_block(b, "b")
    if ka != kb:
        raise ValueError(
            f"a and b must have the same block size along K, got {ka} ({a.block_format}) and "
            f"{kb} ({b.block_format})"
        )
    acc = accumulator
    if isinstance(acc, Accumulator) and acc.scales == "in_block":
        _check_block_scaled(acc, a, b, ka)
    va, sa, fa = _gemm_operand(a)
    vb, sb, fb = _gemm_operand(b)
    alpha = np.float32(a.tensor_scale) * np.float32(b.tensor_scale)  # float32 product
    opts: dict[str, Any] = {
        "input_format": (fa, fb),
        "accumulator": accumulator,
        "backend": backend,
        "input_rounding": "exact",
        "scale_a": sa,
        "scale_b": sb,
        "scale_block": ka,
    }
    # decoded element codes of float elements are on their formats' grids: the native path's
    # input check would only round them again (integer elements go to bf16 after a shift)
    on_grid = all(
        isinstance(q.block_format.element, FloatFormat) and not q.block_format.element_exponent
        for q in (a, b)
    )
    # the package's internal entry where the arguments are valid by construction (the same
    # bits as gemm, without its per-call resolution: about 0.1 ms of each recipe GEMM)
    internal = (
        on_grid
        and c is None
        and backend == "auto"
        and (acc is None or isinstance(acc, Accumulator))
    )
    token = ON_GRID.set(True) if on_grid else None
    try:
        if alpha == 1:
            if internal:
                out_fmt = _float_format(out_format, "out_format")
                return gemm_scaled_internal(
                    va, vb, fa, fb, _as_accumulator(acc), out_fmt, sa, sb, ka
                )
            return gemm(va, vb, c, out_format=out_format, **opts)
        if c is not None:
            raise ValueError("c is not supported with per-tensor scales (NVFP4): add it afterwards")
        if internal:
            d = gemm_scaled_internal(va, vb, fa, fb, _as_accumulator(acc), _FP32, sa, sb, ka)
        else:
            d = gemm(va, vb, out_format="fp32", **opts)  # float32
    finally:
        if token is not None:
            ON_GRID.reset(token)
    with np.errstate(over="ignore"):
        # the FP32 epilogue (float32 product: one rounding, IEEE overflow), in d's own memory
        # (a fresh result of gemm: a second array of the output's size cost page faults)
        y = np.multiply(d, alpha, out=d) if isinstance(d, np.ndarray) else d * alpha
        if d.dtype == np.float32 and get_format(out_format) == _FP32:
            return y  # (round_to fp32 would return it unchanged)
        return round_to(y, out_format)  # then the output format
