"""Scale factors on A and B for the GEMM models: per tensor, per row/column, per block along K.

Scales follow ``torch._scaled_mm`` and DeepSeek-V3: ``a`` is ``(..., M, K)`` and ``scale_a`` is
a scalar (per tensor) or ``(..., Ma, Ka)``; ``b`` is ``(..., K, N)`` and ``scale_b`` a scalar or
``(..., Kb, Nb)``, with

* ``Ma`` in ``{1, M, ceil(M / block)}`` and ``Nb`` in ``{1, N, ceil(N / block)}`` (per tensor, per
  row/column, per block of rows/columns),
* ``Ka``, ``Kb`` in ``{1, ceil(K / block)}`` (one scale for the whole of K, or one per block of
  ``block`` along K: 1x128 activation tiles and 128x128 weight blocks with ``block=128``, MX-style
  1x32 blocks with ``block=32``).

Scales are rounded to fp32 (nearest_even) and must be positive and finite. They are applied
where the hardware applies them: to each partial sum at promotion (see
:mod:`precision_lab.gemm.accumulator`).

>>> import numpy as np
>>> sa, sb, kb = expand_scales(np.ones((2, 256)), np.ones((256, 3)), None, None, 128)
>>> sa is None, sb is None
(True, True)
>>> sa, sb, kb = expand_scales(np.ones((2, 256)), np.ones((256, 3)), np.full((2, 2), 0.5), 2.0, 128)
>>> sa.shape, sb.shape, kb
((1, 2, 2), (1, 2, 1), 128)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core.rounding import round_to
from ..core.shapes import broadcast_shapes

__all__ = ["expand_scales"]


def _one(
    scale: Any,
    name: str,
    rows: int,
    k: int,
    block: int,
    batch: tuple[int, ...],
    rows_name: str,
    row_axis: int,
) -> tuple[np.ndarray, bool]:
    """Scale as float64 (*batch, R, Kx) (R in {1, rows}) and whether it varies along K."""
    s = np.asarray(scale)
    if s.dtype.kind not in "fiu" or s.dtype == bool:
        raise TypeError(f"{name} must hold real numbers, got an array of {s.dtype}")
    s = s.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        exact = bool((s.astype(np.float32) == s).all())  # (block scales: float32 values already)
    if not exact:
        s = round_to(s, "fp32").astype(np.float64)
    if not (np.isfinite(s).all() and (s > 0).all()):
        raise ValueError(
            f"{name} must be positive and finite, got values such as "
            f"{s[~(np.isfinite(s) & (s > 0))].ravel()[:3].tolist()}"
        )
    nkb = -(-k // block)
    if s.ndim == 0:
        s = s.reshape(1, 1)
    elif s.ndim == 1:
        raise ValueError(
            f"{name} must be a scalar or at least 2-D ({rows_name}-scales x K-scales), got shape "
            f"{s.shape}; use shape ({s.shape[0]}, 1) or (1, {s.shape[0]})"
        )
    if row_axis == 1:  # b's scales are (Kb, Nb): move to (Nb, Kb)
        s = np.swapaxes(s, -1, -2)
    r, kx = s.shape[-2:]
    nrb = -(-rows // block)
    if r not in (1, rows, nrb):
        raise ValueError(
            f"{name}: the {rows_name} axis has {r} scales; expected 1, {rows} (one per "
            f"{rows_name}) or {nrb} (blocks of {block})"
        )
    if kx not in (1, nkb):
        raise ValueError(
            f"{name}: the K axis has {kx} scales; expected 1 or {nkb} (blocks of {block} along "
            f"K={k})"
        )
    if r not in (1, rows):  # blocks of rows
        s = np.repeat(s, block, axis=-2)[..., :rows, :]
    try:
        if s.shape[:-2] != batch:
            s = np.broadcast_to(s, (*batch, s.shape[-2], kx))
    except ValueError:
        raise ValueError(
            f"{name}: batch shape {s.shape[:-2]} does not broadcast to {batch}"
        ) from None
    return s, kx > 1


def expand_scales(
    a: np.ndarray, b: np.ndarray, scale_a: Any, scale_b: Any, block: int | None
) -> tuple[np.ndarray | None, np.ndarray | None, int | None]:
    """Expand scales to ``(B, M or 1, nk)`` and ``(B, nk, N or 1)`` float64 arrays.

    ``a``/``b`` give the shapes (``(..., M, K)``, ``(..., K, N)``). Returns ``(sa, sb, kblock)``
    with the batch flattened to one axis; ``nk`` is 1 or ``ceil(K / block)``; ``kblock`` is the
    K-block length when scales vary along K, else ``None``. ``(None, None, None)`` without scales.
    """
    if scale_a is None and scale_b is None:
        return None, None, None
    blk = 128 if block is None else block
    if isinstance(blk, bool) or not isinstance(blk, int) or blk < 1:
        raise ValueError(f"scale_block must be a positive int, got {block!r}")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k = a.shape[-2:]
    n = b.shape[-1]
    sa, ka = _one(1.0 if scale_a is None else scale_a, "scale_a", m, k, blk, batch, "row", 0)
    sb, kbb = _one(1.0 if scale_b is None else scale_b, "scale_b", n, k, blk, batch, "column", 1)
    nk = max(sa.shape[-1], sb.shape[-1])
    if sa.shape[-1] != nk:
        sa = np.broadcast_to(sa, (*batch, sa.shape[-2], nk))
    if sb.shape[-1] != nk:
        sb = np.broadcast_to(sb, (*batch, sb.shape[-2], nk))
    nb = math.prod(batch)
    sa = np.ascontiguousarray(sa).reshape(nb, sa.shape[-2], nk)
    sb = np.ascontiguousarray(np.swapaxes(sb, -1, -2)).reshape(nb, nk, sb.shape[-2])
    return sa, sb, (blk if (ka or kbb) else None)
