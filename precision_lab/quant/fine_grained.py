"""Fine-grained FP8 (and DeepGEMM's FP4) quantizers as their peers compute them, to the bit.

DeepSeek-V3's FP8 recipe quantizes activations and gradients in 1x128 tiles and weights in
128x128 tiles, E4M3, one scale per tile. Two peers publish the exact arithmetic, and they differ
from the library's exact ``"amax"`` and ``"ceil"`` rules (:mod:`precision_lab.quant.blocks`) in
ways that change bits, so each is modelled here as its own quantizer:

:func:`deepgemm_quantize` (DeepGEMM, ``deep_gemm/utils/math.py``: ``per_token_cast_to_fp8``,
``per_block_cast_to_fp8``, ``ceil_to_ue8m0``; deepseek-ai/DeepGEMM 54e2261), in float32:

* ``amax = max(|x|)`` over the tile, clamped below at ``fp32(1e-4)`` (so a tile of zeros, or of
  values below 1e-4, gets the scale of amax 1e-4, not the smallest scale);
* ``sf = fp32(amax / 448)``; with ``ue8m0=True`` rounded *up* to a power of two by its bits:
  biased exponent plus one if any mantissa bit is set, clamped to 1..254 (``2**-126`` to
  ``2**127``; a NaN or infinite ``sf`` gets ``2**127``);
* elements ``e4m3(fp32(x * fp32(1 / sf)))``: multiplied by the float32 reciprocal, *not*
  divided (with FP32 scales ``1 / sf`` is rounded, and the product is rounded again before the
  E4M3 conversion), E4M3 by torch's cast: round to nearest even, saturating (torch 2.13 clamps
  every finite value and the infinities to ±448; the scaled finite values never exceed 448).

:func:`te_blockwise_quantize` (Transformer Engine's ``Float8BlockScaling`` quantizer:
``tests/pytorch/references/blockwise_quantizer_reference.py`` and ``quantize_scale_calc.py``,
NVIDIA/TransformerEngine d0067d0), in float32:

* ``amax = max(max(|x|), fp32(eps))`` over the 1x128 row tile or the 128x128 square tile;
* the *quantization* scale ``scale = fp32(fp8_max / amax)``; an infinite one (amax 0 or tiny)
  becomes the input dtype's largest finite value; with ``pow2=True`` (TE's default,
  ``power_2_scale``) ``scale = 2**floor(log2(scale))`` (frexp); amax infinite gives scale 0,
  amax zero scale 1;
* elements ``e4m3(clamp(fp32(x * scale), -fp8_max, fp8_max))``; the stored dequantization
  scale is ``scale_inv = fp32(1 / scale)``.

For float32 data the power-of-two scales of both equal the library's exact ``"ceil"`` rule
(``2**ceil(log2(amax / 448))``) except where the clamps act (amax below 1e-4 for DeepGEMM; amax
0 or ``448 / amax`` beyond float32 for TE): the float32 quotient never rounds across a power of
two (checked in ``tests/quant/test_fine_grained.py``). The FP32-scale variants do not equal the
exact ``"amax"`` rule of ``fp8_1x128``: the reciprocal (DeepGEMM) and the product (both) are
rounded to float32 before the element is rounded to E4M3 (a double rounding the exact rule
avoids).

:func:`deepgemm_fp4_quantize` (DeepGEMM's ``per_token_cast_to_fp4``): ``sf = fp32(max(amax,
1e-4) / 6)`` (UE8M0-ceiled or FP32), ``fp32(x * fp32(1 / sf))``, and E2M1 codes by counting the
midpoints ``0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5`` that ``|x|`` exceeds: ties go toward zero
(``nearest_zero``), magnitudes above 5 saturate to 6, a NaN becomes +0, and a value that rounds
to zero is +0 (the sign bit is only set on a non-zero code).

Inputs are taken in float32, as the peers take them (``.float()`` of a bf16 tensor): float64
data is first rounded to float32 (the one rounding the peers' float32 arithmetic implies);
bf16 and fp16 data are exact. Every rounding goes through the core
(:func:`~precision_lab.round_to`); float32 quotients and products are formed in float64 and
rounded once, which is the correctly rounded float32 operation (for ``+ - * /`` on float32
operands float64's 53 >= 2 * 24 + 2 bits make the double rounding innocuous: Figueroa 1995).

The results are :class:`~precision_lab.quant.blocks.QuantizedBlocks` (blocks along ``axis``
for 1-D tiles, the last two axes for 2-D tiles), so :func:`~precision_lab.dequantize_blocks`,
:func:`~precision_lab.gemm_blocks` and :func:`~precision_lab.gemm.blockwise.blockwise_gemm`
take them.

>>> import numpy as np
>>> x = np.zeros((1, 128), np.float32); x[0, :3] = [500.0, 1.0, -3.0]
>>> q = deepgemm_quantize(x, tile=(1, 128))
>>> float(q.scales[0, 0]), q.dequantize()[0, :3].tolist()      # 500/448 -> scale 2
(2.0, [512.0, 1.0, -3.0])
>>> float(deepgemm_quantize(np.zeros((1, 128)), tile=(1, 128)).scales[0, 0]) == 2.0**-22
True
>>> float(te_blockwise_quantize(x, tile=(1, 128)).scales[0, 0])
2.0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.codec import encode
from ..core.formats import FloatFormat, get_format
from ..core.inputs import as_input
from ..core.rounding import as_float_array, round_to
from .block_formats import BlockFormat, _float
from .block_layout import _layout
from .blocks import QuantizedBlocks

__all__ = [
    "FINE_GRAINED_FORMATS",
    "FineGrained",
    "deepgemm_fp4_quantize",
    "deepgemm_quantize",
    "fine_grained_quantize",
    "te_blockwise_quantize",
]

_FP32 = _float("fp32")
#: DeepGEMM's amax clamp (``clamp(1e-4)`` of a float32 tensor: the float32 nearest 1e-4)
DEEPGEMM_AMAX_FLOOR = float(np.float32(1e-4))

TILES = ((1, 128), (128, 128))


def _tile_format(tile: tuple[int, int], element: FloatFormat, pow2: bool, tag: str) -> BlockFormat:
    shape = (tile[1],) if tile[0] == 1 else tile
    scale = _float("e8m0") if pow2 else _FP32
    name = f"{tag}_{tile[0]}x{tile[1]}{'_ue8m0' if pow2 else ''}"
    return BlockFormat(name, element, scale, shape, "ceil" if pow2 else "amax")


def _check_tile(tile: Any, name: str = "tile") -> tuple[int, int]:
    t = tuple(tile) if isinstance(tile, tuple | list) else tile
    if t not in TILES:
        raise ValueError(f"{name} must be (1, 128) or (128, 128), got {tile!r}")
    return t  # type: ignore[return-value]


def _fp32_data(x: Any) -> np.ndarray:
    a, _ = as_input(x)
    a = as_float_array(a, "x")
    if a.dtype == np.float64:
        return round_to(a, _FP32).astype(np.float32)
    return a.astype(np.float32)


def _tiles(a: np.ndarray, bf: BlockFormat, axis: int) -> tuple[np.ndarray, Any]:
    """The zero-padded data as (U, A, B, C) and its layout (blocks ``[u, :, b, :]``)."""
    lay = _layout(a.shape, bf, axis, pad=True)
    if lay.needs_pad:
        data = np.zeros(lay.padded, dtype=a.dtype)
        data[lay.crop] = a
    else:
        data = np.ascontiguousarray(a)
    return data.reshape(lay.dims), lay


def _amax(t: np.ndarray) -> np.ndarray:
    """Tile maxima of |x| as float64 on the (U, B) grid; NaN where the tile has a NaN."""
    with np.errstate(invalid="ignore"):
        m = np.abs(t.astype(np.float64)).max(axis=(1, 3))  # NaN propagates (torch.amax)
    return m


def ceil_to_ue8m0(sf: np.ndarray) -> np.ndarray:
    """DeepGEMM's ``ceil_to_ue8m0`` of float32 values, from their bits: the biased exponent,
    plus one where a mantissa bit is set, clamped to 1..254; returns float64 powers of two.

    >>> ceil_to_ue8m0(np.array([1.0, 1.5, 3e-39, np.inf], np.float32)).tolist()[:3]
    [1.0, 2.0, 1.1754943508222875e-38]
    """
    bits = np.asarray(sf, dtype=np.float32).view(np.uint32) & np.uint32(0x7FFFFFFF)
    e = (bits >> np.uint32(23)).astype(np.int64) + ((bits & np.uint32(0x7FFFFF)) != 0)
    return np.ldexp(1.0, np.clip(e, 1, 254) - 127)


def _f32(v: np.ndarray) -> np.ndarray:
    """One rounding of an exact float64 value (or a float64 quotient of float32 operands) to
    float32, kept as float64."""
    with np.errstate(all="ignore"):
        return round_to(np.asarray(v, dtype=np.float64), _FP32).astype(np.float64)


def _finish(
    a_shape: tuple[int, ...],
    lay: Any,
    elems: np.ndarray,
    elem: FloatFormat,
    scales: np.ndarray,
    bf: BlockFormat,
    codes: np.ndarray | None = None,
) -> QuantizedBlocks:
    """Codes of the rounded elements (U, A, B, C) cropped to x's shape, in a QuantizedBlocks."""
    if codes is None:
        codes = encode(elems.reshape(lay.padded)[lay.crop], elem)
    else:
        codes = codes.reshape(lay.padded)[lay.crop]
    if elem.bits == 4:
        from .blocks import _pack4

        codes = _pack4(codes)
    grid = scales.reshape(lay.grid)
    with np.errstate(all="ignore"):
        finite = np.isfinite(grid)
        sc = encode(np.where(finite, grid, np.nan), bf.scale)
    return QuantizedBlocks(
        codes=codes,
        scale_codes=sc,
        scales=grid,
        shape=a_shape,
        block_format=bf,
        axis=lay.axis,
        dtype=np.dtype(np.float32),
    )


def deepgemm_quantize(
    x: Any,
    *,
    tile: tuple[int, int] = (1, 128),
    ue8m0: bool = True,
    axis: int = -1,
    element: str = "e4m3",
) -> QuantizedBlocks:
    """DeepGEMM's FP8 cast (``per_token_cast_to_fp8`` for ``tile=(1, 128)``,
    ``per_block_cast_to_fp8`` for ``(128, 128)``), bit for bit (module docstring).

    Parameters
    ----------
    x:
        Float array, at least 1-D (2-D for 128x128 tiles); taken in float32.
    tile:
        ``(1, 128)`` (blocks of 128 along ``axis``) or ``(128, 128)`` (the last two axes).
    ue8m0:
        Power-of-two scales rounded up (``ceil_to_ue8m0``, DeepGEMM's SM100 path and
        DeepSeek-V3.1's UE8M0 scales; E8M0 scale codes) or FP32 scales ``fp32(amax / 448)``.
    axis:
        The blocked axis of 1x128 tiles (-1 for activations ``(M, K)``; -2 for a ``(K, N)``
        operand blocked along K).
    element:
        ``"e4m3"`` (DeepGEMM's) or ``"e5m2"``.

    Examples
    --------
    >>> import numpy as np
    >>> q = deepgemm_quantize(np.full((1, 128), 0.3, np.float32), ue8m0=False)
    >>> float(q.scales[0, 0]) == float(np.float32(np.float32(0.3) / np.float32(448)))
    True
    """
    t = _check_tile(tile)
    elem = get_format(element, name="element")
    assert isinstance(elem, FloatFormat)
    bf = _tile_format(t, elem, ue8m0, "deepgemm")
    a = _fp32_data(x)
    data, lay = _tiles(a, bf, axis)
    amax = _amax(data)
    with np.errstate(invalid="ignore"):
        amax = np.where(np.isnan(amax), np.nan, np.maximum(amax, DEEPGEMM_AMAX_FLOOR))
    emax = float(elem.max)
    sf = _f32(amax / emax)
    if ue8m0:
        sf = ceil_to_ue8m0(sf.astype(np.float32))
    inv = _f32(1.0 / sf)  # exact for powers of two
    g = inv[:, None, :, None]
    with np.errstate(all="ignore"):
        scaled = _f32(data.astype(np.float64) * g)  # float32 product (exact operands)
        # torch's float32 -> float8 cast: RNE, saturating (infinities included), NaN kept
        q = round_to(scaled, elem, overflow="saturate")
    return _finish(a.shape, lay, q, elem, sf, bf)


def te_blockwise_quantize(
    x: Any,
    *,
    tile: tuple[int, int] = (1, 128),
    pow2: bool = True,
    eps: float = 0.0,
    axis: int = -1,
    element: str = "e4m3",
    x_dtype: str | None = None,
) -> QuantizedBlocks:
    """Transformer Engine's blockwise FP8 quantizer (``Float8BlockScaling``), bit for bit
    (module docstring); the stored scales are TE's dequantization scales ``scale_inv``.

    Parameters
    ----------
    x:
        Float array, at least 1-D (2-D for 128x128 tiles); taken in float32.
    tile:
        ``(1, 128)`` (1-D blocks along ``axis``) or ``(128, 128)`` (2-D, the last two axes).
    pow2:
        TE's ``power_2_scale`` (default True; ``NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1`` gives
        False): scales rounded to powers of two (E8M0 scale codes), else FP32 scales.
    eps:
        TE's ``amax_epsilon`` (default 0): amax is clamped below at ``fp32(eps)``.
    axis:
        The blocked axis of 1-D tiles.
    element:
        ``"e4m3"`` or ``"e5m2"``.
    x_dtype:
        The input's dtype in TE (``"fp32"``, ``"bf16"``, ``"fp16"``): its largest value replaces
        an infinite quantization scale. Default: ``"bf16"``/``"fp16"`` for ml_dtypes bfloat16 /
        float16 input, else ``"fp32"``.

    Examples
    --------
    >>> import numpy as np
    >>> q = te_blockwise_quantize(np.full((1, 128), 0.3, np.float32), pow2=False)
    >>> float(q.scales[0, 0]) == float(np.float32(1 / np.float32(448 / np.float32(0.3))))
    True
    """
    t = _check_tile(tile)
    elem = get_format(element, name="element")
    assert isinstance(elem, FloatFormat)
    bf = _tile_format(t, elem, pow2, "te")
    if x_dtype is None:  # numpy / ml_dtypes dtypes ("bfloat16") and torch's ("torch.bfloat16")
        dt = str(getattr(x, "dtype", ""))
        x_dtype = (
            "bf16" if dt.endswith("bfloat16") else "fp16" if dt.endswith("float16") else "fp32"
        )
    dmax = float(get_format(x_dtype, name="x_dtype").max)
    a = _fp32_data(x)
    data, lay = _tiles(a, bf, axis)
    amax = _amax(data)
    e32 = float(np.float32(eps))
    emax = float(elem.max)
    with np.errstate(all="ignore"):
        amax = np.where(np.isnan(amax), np.nan, np.maximum(amax, e32))
        scale = _f32(emax / amax)
        scale = np.where(scale == np.inf, dmax, scale)
        if pow2:
            _, ex = np.frexp(scale)
            scale = np.where(np.isfinite(scale), np.ldexp(1.0, ex - 1), scale)
            scale = np.where(amax == np.inf, 0.0, scale)
        scale = np.where(amax == 0, 1.0, scale)
        scale_inv = _f32(1.0 / scale)
        g = scale[:, None, :, None]
        scaled = _f32(data.astype(np.float64) * g)
        scaled = np.clip(scaled, -emax, emax)  # NaN stays NaN
        q = round_to(scaled, elem, overflow="saturate")
    return _finish(a.shape, lay, q, elem, scale_inv, bf)


#: DeepGEMM's E2M1 rounding midpoints (``_quantize_to_fp4_e2m1``): a magnitude strictly above
#: the i-th gets code i + 1
FP4_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def deepgemm_fp4_quantize(
    x: Any, *, ue8m0: bool = True, gran_k: int = 128, axis: int = -1
) -> QuantizedBlocks:
    """DeepGEMM's FP4 cast (``per_token_cast_to_fp4``): blocks of ``gran_k`` along ``axis``,
    ``sf = fp32(max(amax, 1e-4) / 6)`` (UE8M0-ceiled with ``ue8m0``), ``fp32(x * fp32(1/sf))``,
    E2M1 by the midpoint count (ties toward zero, NaN to +0, no -0; module docstring).

    >>> import numpy as np
    >>> x = np.array([0.5, 1.5, -2.5, 10.0, -0.1, 12.0] + [0.0] * 26, np.float32)
    >>> deepgemm_fp4_quantize(x, gran_k=32).dequantize()[:6].tolist()  # scale 2; ties go down
    [0.0, 1.0, -2.0, 8.0, 0.0, 12.0]
    """
    if isinstance(gran_k, bool) or not isinstance(gran_k, int) or gran_k < 2 or gran_k % 2:
        raise ValueError(f"gran_k must be a positive even int, got {gran_k!r}")
    elem = _float("e2m1")
    bf = BlockFormat(
        f"deepgemm_fp4_1x{gran_k}{'_ue8m0' if ue8m0 else ''}",
        elem,
        _float("e8m0") if ue8m0 else _FP32,
        (gran_k,),
        "ceil" if ue8m0 else "amax",
    )
    a = _fp32_data(x)
    data, lay = _tiles(a, bf, axis)
    amax = _amax(data)
    with np.errstate(invalid="ignore"):
        amax = np.where(np.isnan(amax), np.nan, np.maximum(amax, DEEPGEMM_AMAX_FLOOR))
    sf = _f32(amax / 6.0)
    if ue8m0:
        sf = ceil_to_ue8m0(sf.astype(np.float32))
    inv = _f32(1.0 / sf)
    with np.errstate(all="ignore"):
        scaled = _f32(data.astype(np.float64) * inv[:, None, :, None])
        mag = round_to(np.where(np.isnan(scaled), 0.0, np.abs(scaled)), elem,
                       rounding="nearest_zero", overflow="saturate")  # fmt: skip
    codes = encode(mag, elem)  # magnitudes: codes 0..7
    neg = (scaled < 0) & (codes != 0)
    codes = codes | (neg.astype(np.uint8) << np.uint8(3))
    return _finish(a.shape, lay, mag, elem, sf, bf, codes=codes)


@dataclass(frozen=True)
class FineGrained:
    """A named fine-grained quantizer: which peer's arithmetic, tile, and scale kind (an
    operand format of the recipes, :data:`FINE_GRAINED_FORMATS`)."""

    name: str
    peer: str  # "deepgemm" | "te"
    tile: tuple[int, int]
    pow2: bool

    def quantize(self, x: Any, *, axis: int = -1) -> QuantizedBlocks:
        """Quantize ``x`` (1x128 tiles along ``axis``; 128x128 tiles: the last two axes)."""
        if self.peer == "deepgemm":
            return deepgemm_quantize(x, tile=self.tile, ue8m0=self.pow2, axis=axis)
        return te_blockwise_quantize(x, tile=self.tile, pow2=self.pow2, axis=axis)


#: Operand formats of the recipes that run a peer's quantizer: DeepGEMM (UE8M0 or FP32
#: scales) and Transformer Engine's ``Float8BlockScaling`` (power-of-two or FP32 scales)
FINE_GRAINED_FORMATS: dict[str, FineGrained] = {
    f.name: f
    for f in (
        FineGrained("deepgemm_1x128", "deepgemm", (1, 128), True),
        FineGrained("deepgemm_128x128", "deepgemm", (128, 128), True),
        FineGrained("deepgemm_1x128_fp32", "deepgemm", (1, 128), False),
        FineGrained("deepgemm_128x128_fp32", "deepgemm", (128, 128), False),
        FineGrained("te_block_1x128", "te", (1, 128), True),
        FineGrained("te_block_128x128", "te", (128, 128), True),
        FineGrained("te_block_1x128_fp32", "te", (1, 128), False),
        FineGrained("te_block_128x128_fp32", "te", (128, 128), False),
    )
}


def fine_grained_quantize(x: Any, name: str, *, axis: int = -1) -> QuantizedBlocks:
    """Quantize ``x`` with the quantizer of :data:`FINE_GRAINED_FORMATS` called ``name``.

    >>> import numpy as np
    >>> fine_grained_quantize(np.ones((2, 128)), "deepgemm_1x128").scales.ravel().tolist()
    [0.00390625, 0.00390625]
    """
    if name not in FINE_GRAINED_FORMATS:
        raise ValueError(
            f"unknown fine-grained format {name!r}; known: {', '.join(FINE_GRAINED_FORMATS)}"
        )
    return FINE_GRAINED_FORMATS[name].quantize(x, axis=axis)
