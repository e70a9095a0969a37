"""How a tensor is cut into blocks, and each block's amax and scale.

``_layout`` maps a shape, a block format and an axis to a view in which every block is
contiguous (padding where the axis is not a multiple of the block); the amax of each block and
the scale rules of :mod:`precision_lab.quant.blocks` (floor, ceil, amax; NVFP4's per-tensor
scale) are computed here, in exact arithmetic.

>>> from precision_lab.quant.block_formats import get_block_format
>>> _layout((4, 64), get_block_format("mxfp8_e4m3"), -1, pad=False).dims
(8, 32, 1, 1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.native import kernels as native_kernels
from ..core.formats import FloatFormat
from ..core.rounding import (
    CHUNK,
    for_chunks,
    round_to,
)
from .block_formats import BlockFormat

#: elements per chunk of the fused pass over the data (per-chunk overhead against cache misses:
#: measured best between 2**17 and 2**19 elements)
_CHUNK = 8 * CHUNK


# ----- layout -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Layout:
    """Where the blocks of an array lie.

    The (padded, C-contiguous) array is viewed as ``(U, A, B, C)`` with a block = ``[u, :, b, :]``:
    1-D blocks of n along axis k of shape S: ``(prod(S[:k]) * S[k]/n, n, prod(S[k+1:]), 1)``;
    2-D tiles (r, c) over the last two axes (M, K): ``(prod(S[:-2]) * M/r, r, K/c, c)``.
    """

    shape: tuple[int, ...]
    padded: tuple[int, ...]
    dims: tuple[int, int, int, int]
    grid: tuple[int, ...]  # shape of the scale grid
    axis: int

    @property
    def needs_pad(self) -> bool:
        return self.padded != self.shape

    @property
    def crop(self) -> tuple[slice, ...]:
        return tuple(slice(0, n) for n in self.shape)

    def data_shape(self) -> tuple[int, ...]:
        """The (U, A, B, C) view with unit axes dropped (fast numpy broadcasting)."""
        U, A, B, C = self.dims
        return (U, A) + ((B,) if B > 1 else ()) + ((C,) if C > 1 else ())

    def grid_view_shape(self) -> tuple[int, ...]:
        """Shape of the scale grid broadcastable against :meth:`data_shape`."""
        U, _, B, C = self.dims
        return (U, 1) + ((B,) if B > 1 else ()) + ((1,) if C > 1 else ())


def _normalize_axis(axis: Any, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
        raise TypeError(f"axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for an array of {ndim} dimension(s)")
    return int(axis) % ndim


def _layout(shape: tuple[int, ...], bf: BlockFormat, axis: Any, pad: bool) -> _Layout:
    ndim = len(shape)
    if len(bf.block_shape) == 2:
        if ndim < 2:
            raise ValueError(
                f"{bf.name} uses {bf.block_shape[0]}x{bf.block_shape[1]} tiles over the last two "
                f"axes and needs an array of at least 2 dimensions, got shape {shape}"
            )
        ax = _normalize_axis(axis, ndim)
        if ax < ndim - 2:
            raise ValueError(
                f"axis must be -1 or -2 for {bf.name} (tiles cover the last two axes), got {axis}"
            )
        blocked = {ndim - 2: bf.block_shape[0], ndim - 1: bf.block_shape[1]}
        ax = ndim - 1
    else:
        if ndim < 1:
            raise ValueError("x must have at least one dimension to be split into blocks")
        ax = _normalize_axis(axis, ndim)
        blocked = {ax: bf.block_shape[0]}
    padded = list(shape)
    for k, n in blocked.items():
        if shape[k] % n:
            if not pad:
                raise ValueError(
                    f"the blocked axis {k} of x has length {shape[k]}, not a multiple of "
                    f"{bf.name}'s block size {n} (pass pad=True to pad the last block with zeros)"
                )
            padded[k] = -(-shape[k] // n) * n
    P = padded
    if len(bf.block_shape) == 2:
        r, c = bf.block_shape
        lead = math.prod(P[:-2])
        dims = (lead * P[-2] // r, r, P[-1] // c, c)
        grid = (*P[:-2], P[-2] // r, P[-1] // c)
    else:
        n = bf.block_shape[0]
        dims = (math.prod(P[:ax]) * P[ax] // n, n, math.prod(P[ax + 1 :]), 1)
        grid = (*P[:ax], P[ax] // n, *P[ax + 1 :])
    return _Layout(tuple(shape), tuple(P), dims, grid, ax)


def _units_per_chunk(lay: _Layout) -> int:
    _, A, B, C = lay.dims
    return max(1, _CHUNK // max(1, A * B * C))


# ----- amax and scales --------------------------------------------------------------------------
def _block_amax(data: np.ndarray, lay: _Layout) -> np.ndarray:
    """Largest magnitude of each block (float64, on the (U, B) grid); NaN if the block has a NaN.

    Works on the magnitude bits (sign cleared) as unsigned integers: their order is the order of
    the magnitudes, and NaN's bits are above infinity's.
    """
    U, _, B, C = lay.dims
    ext = native_kernels.ext if native_kernels.active() else None
    if ext is not None and data.dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        amax = np.empty((U, B), dtype=np.float64)
        dims = np.array(lay.dims, dtype=np.int64)
        src = np.ascontiguousarray(data)
        for_chunks(
            U,
            lambda lo, hi: ext.block_amax(src, dims, amax, lo, hi),
            chunk=_units_per_chunk(lay),
        )
        return amax
    uint = np.uint32 if data.dtype == np.float32 else np.uint64
    mask = uint(np.iinfo(uint).max >> 1)
    bits = data.view(uint).reshape(lay.data_shape())
    out = np.empty((U, B) if B > 1 else (U,), dtype=uint)

    def work(lo: int, hi: int) -> None:
        m = bits[lo:hi] & mask
        if C > 1:
            m = m.max(axis=-1)
        out[lo:hi] = m.max(axis=1)

    for_chunks(U, work, chunk=_units_per_chunk(lay))
    with np.errstate(invalid="ignore"):  # a signaling NaN's bits may be the largest: quiet it
        return out.view(data.dtype).astype(np.float64).reshape(U, B)


def _pow2_exponents(amax: np.ndarray, bf: BlockFormat) -> tuple[np.ndarray, np.ndarray]:
    """Scale exponents k (int64) of the power-of-two rules, and the mask of NaN blocks.

    ``floor``: ``floor(log2 amax) - emax_elem``; ``ceil``: ``ceil(log2(amax / elem_max))``
    exactly; ``nearest_even``: ``floor(log2 r) - emax_elem`` with ``r`` amax rounded to the
    element's significand width (``mantissa_bits + 1``), ties up (torchao's EVEN: amax's
    exponent goes up by one iff its significand is at least ``2 - 2**-(mantissa_bits + 1)``);
    ``rceil``: ``ceil(log2 d)`` with ``d = fp32(fp32(amax) * fp32(1 / elem_max))`` (cuBLAS /
    torchao RCEIL, Transformer Engine's MXFP8 ``cvt.rp.satfinite.ue8m0x2.f32``);
    ``ceil_emax``: ``ceil(log2 amax) - emax_elem`` (torchao's CEIL).
    """
    sf = bf.scale
    kmin = math.frexp(sf.smallest_subnormal)[1] - 1
    kmax = sf.emax
    nan = ~np.isfinite(amax)
    a = np.where(nan, 1.0, amax)
    rule = bf.scale_rule
    if rule == "rceil":  # the quotient in float32, as the quantizers compute it
        a32 = round_to(a, "fp32").astype(np.float64)
        inv = float(round_to(np.float64(1.0 / bf.element_max), "fp32"))  # fp32(1 / elem_max)
        a = round_to(a32 * inv, "fp32").astype(np.float64)  # exact product, rounded once
        nan |= ~np.isfinite(a)
        a = np.where(nan, 1.0, a)
    zero = a == 0
    m, e = np.frexp(np.where(zero, 1.0, a))  # a = m * 2**e, 0.5 <= m < 1, exact
    if rule == "floor":
        k = (e - 1) - bf.element_emax
    elif rule == "nearest_even":
        mb = _element_fraction_bits(bf)
        k = (e - 1) + (m >= 1.0 - math.ldexp(1.0, -(mb + 2))) - bf.element_emax
    elif rule == "rceil":  # ceil(log2 d)
        k = e - (m == 0.5)
    elif rule == "ceil_emax":  # ceil(log2 amax) - emax_elem (torchao's CEIL)
        k = e - (m == 0.5) - bf.element_emax
    else:  # ceil(log2(a / elem_max)), exactly
        mm, em = math.frexp(bf.element_max)
        k = (e - em) + (m > mm)
    k = np.where(zero, kmin, np.maximum(k, kmin)).astype(np.int64)
    nan |= k > kmax
    return np.where(nan, 0, k), nan


def _element_fraction_bits(bf: BlockFormat) -> int:
    """Fraction bits of the element grid's top binade: the mantissa bits (6 for MX INT8's 1.6)."""
    elem = bf.element
    if isinstance(elem, FloatFormat):
        return int(elem.mantissa_bits)
    return int(elem.bits) - 2


def _nvfp4_s_enc(gamax: np.float32, bf: BlockFormat) -> np.float32:
    """NVFP4's per-tensor encode scale ``S_enc = elem_max * bound / gamax`` in float32
    (FLT_MAX if that overflows, 1 if it is 0; bound: :attr:`BlockFormat.scale_bound`, 448)."""
    f32 = np.float32
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s_enc = f32(f32(bf.element_max) * f32(bf.scale_bound)) / gamax
        s_enc = min(s_enc, f32(np.finfo(np.float32).max))
    return f32(1.0) if s_enc == 0 else f32(s_enc)


def _nvfp4_tensor_scale(gamax: np.float32, bf: BlockFormat) -> tuple[np.float32, np.float32]:
    """NVFP4's per-tensor decode scale ``S_dec = 1 / S_enc`` and the block scales' factor
    ``S_enc * (1 / elem_max)`` (float32) from the largest finite block amax ``gamax``.

    >>> from precision_lab.quant.block_formats import get_block_format
    >>> [float(v) for v in _nvfp4_tensor_scale(np.float32(2688.0), get_block_format("nvfp4"))]
    [1.0, 0.1666666716337204]
    """
    f32 = np.float32
    s_enc = _nvfp4_s_enc(gamax, bf)
    return f32(1.0) / s_enc, s_enc * (f32(1.0) / f32(bf.element_max))


def _nvfp4_scales(
    amax: np.ndarray,
    bf: BlockFormat,
    data: np.ndarray | None = None,
    lay: _Layout | None = None,
    info: dict[str, Any] | None = None,
) -> tuple[np.ndarray, float, np.ndarray]:
    """Block scales (float32 values on the scale format), S_dec and the encode factors (float32).

    Float32 arithmetic exactly as Transformer Engine's NVFP4 quantizers: ``"amax"`` (the CUDA
    kernel) ``s = e4m3(amax * (S_enc * (1/6)))``, ``"amax_div"`` (the Python reference,
    ``quantization_nvfp4.py``) ``s = e4m3((amax / 6) * S_enc)``; the 4/6 rules choose per block
    between the ``"amax"`` scale and ``e4m3(amax * (S_enc * (1/4)))`` (:func:`_four_over_six`,
    which needs the data). Scales saturate at the scale format's maximum; the element factor is
    ``min(1 / (s * S_dec), FLT_MAX)``. A dict ``info`` receives ``"tensor_amax"`` (the float32
    amax S_enc comes from) and, under the 4/6 rules, ``"four_over_six"`` (bool, True where a
    block's scale maps its amax to 4).
    """
    f32 = np.float32
    fmax = f32(np.finfo(np.float32).max)
    # the quantizer's FP32 view of amax: float64 values that overflow FP32 are infinities
    a32 = round_to(amax, "fp32").astype(np.float32)
    finite = np.isfinite(a32)
    a32 = np.where(finite, a32, f32(0.0))
    gamax = f32(a32.max()) if a32.size else f32(0.0)
    if info is not None:
        info["tensor_amax"] = float(gamax)
    s_enc = _nvfp4_s_enc(gamax, bf)
    s_dec = f32(1.0) / s_enc

    def scales(sb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            s = round_to(np.minimum(sb, fmax), bf.scale, overflow="saturate").astype(np.float32)
            enc = np.minimum(f32(1.0) / (s * s_dec), fmax)
        return s, enc

    with np.errstate(over="ignore", invalid="ignore"):
        if bf.scale_rule == "amax_div":
            s, enc = scales((a32 / f32(bf.element_max)) * s_enc)
        else:
            s, enc = scales(a32 * (s_enc * (f32(1.0) / f32(bf.element_max))))
            if bf.scale_rule.startswith("4over6"):
                assert data is not None and lay is not None
                s4, enc4 = scales(a32 * (s_enc * (f32(1.0) / f32(4.0))))
                four = _four_over_six(data, lay, bf, (s, enc), (s4, enc4), float(s_dec))
                if info is not None:
                    info["four_over_six"] = four & finite
                s, enc = np.where(four, s4, s), np.where(four, enc4, enc)
    s = np.where(finite, s, f32(np.nan))
    enc = np.where(finite, enc, f32(np.nan))
    return s, float(s_dec), enc.astype(np.float32)


def _four_over_six(
    data: np.ndarray,
    lay: _Layout,
    bf: BlockFormat,
    six: tuple[np.ndarray, np.ndarray],
    four: tuple[np.ndarray, np.ndarray],
    s_dec: float,
) -> np.ndarray:
    """Blocks (U, B) where the scale that maps amax to 4 has the smaller error (Four Over Six,
    Cook et al., arXiv 2512.02010): each candidate quantizes the block as the elements are
    (``e2m1(x * enc)``, round to nearest even, saturating), the error is that of the
    dequantized values ``e2m1 * s * S_dec`` (float64) against x: the sum of squares
    (``4over6_mse``) or of magnitudes (``4over6_mae``); a tie keeps the scale to 6."""
    src = data.reshape(lay.data_shape())
    gv = lay.grid_view_shape()
    x64 = src.astype(np.float64)
    errs = []
    for s, enc in (six, four):
        with np.errstate(all="ignore"):
            scaled = src * enc.astype(data.dtype).reshape(gv)
            q = round_to(scaled, bf.element, overflow="saturate").astype(np.float64)
            v = q * s.astype(np.float64).reshape(gv) * s_dec
            d = x64 - v
            e = d * d if bf.scale_rule == "4over6_mse" else np.abs(d)
        axes = (1, e.ndim - 1) if lay.dims[3] > 1 else (1,)
        errs.append(np.nan_to_num(e, nan=0.0).sum(axis=axes).reshape(lay.dims[0], lay.dims[2]))
    return errs[1] < errs[0]
