"""Block-scaled formats: OCP Microscaling (MX), NVIDIA NVFP4 and DeepSeek-V3 fine-grained FP8 tiles.

A block-scaled tensor stores low-precision *elements* and one *scale* per block of elements
(32 consecutive values for MX, 16 for NVFP4, 128 or a 128x128 tile for DeepSeek-V3); a value is
``element * scale`` (times a per-tensor FP32 scale for NVFP4). The scale is chosen from the block's
largest magnitude ``amax`` by one of three rules (:data:`SCALE_RULES`):

``"floor"`` (OCP MX v1.0, section 6.3)
    ``scale = 2**(floor(log2(amax)) - emax_elem)`` where ``emax_elem`` is the exponent of the
    element format's largest power of two (8 for E4M3, 2 for E2M1, 0 for MX INT8). The block's
    amax lands in the element format's top binade; elements above the element maximum after scaling
    are clamped to it (OCP: "clamping normal numbers to max"; MX E4M3 maps amax 500 to scale 1 and
    clips 500 to 448).
``"ceil"`` (round-up rule of Transformer Engine / cuBLAS MXFP8)
    ``scale = 2**ceil(log2(amax / elem_max))``: the smallest power of two that makes nothing clip
    (amax 500 -> scale 2 for E4M3). Computed exactly (not as ``amax * (1/448)`` in float32).
``"amax"`` (NVFP4, DeepSeek-V3 tiles)
    ``scale = amax / elem_max`` rounded (to nearest even) to the scale format (E4M3 for NVFP4,
    FP32 for the DeepSeek tiles).

Power-of-two scales are clamped below to the smallest power of two of the scale format (2**-127
for E8M0: an all-zero block gets scale 2**-127, as the OCP reference code and gfloat do); a scale
above its largest (2**127) is NaN. Elements are rounded by the core
(:func:`~precision_lab.round_to`, any rounding mode, stochastic included) with saturation, and keep
subnormals. Scaling by a power of two is exact, so each element is rounded once from its exact value
``x / scale``.

NaN and infinity (OCP MX: "if the scale is NaN, all values of the block are NaN"): a block holding a
NaN or an infinity gets a NaN scale (E8M0 code 0xFF; the scale format's NaN for the others), every
value of that block decodes to NaN, finite ones included, and its element codes are stored as 0
(the spec leaves them free). Other blocks of the tensor are unaffected. Blocks whose scale the
scale format cannot represent (float64 input) are treated alike: an MX scale 2**k above 2**127
(E8M0's largest) and an FP32 scale ``amax / elem_max`` that overflows FP32 are NaN scales, so
such a block is NaN, as a block holding an infinity (NVFP4: see below).

Exact definitions of the non-power-of-two rules:

* ``"amax"`` without a tensor scale (``fp8_1x128``, ``fp8_128x128``, DeepSeek-V3's
  ``s = amax / 448``; ``y = x / s``): ``s`` is ``amax / elem_max`` correctly rounded to the scale
  format and each element is ``x / s`` correctly rounded to the element format (the quotient is
  formed in float64, which for float32 input never moves it onto a rounding boundary). A block whose
  scale rounds to zero stores its non-zero elements as ``±elem_max`` and decodes to ``±0``.
* ``nvfp4`` follows NVIDIA's definition (Transformer Engine's reference NVFP4 quantizer), in
  float32 arithmetic: ``S_enc = 448 * 6 / amax_tensor`` (FLT_MAX if that overflows), the per-tensor
  decode scale ``S_dec = 1 / S_enc``, the block scale ``s = e4m3(amax_block * (S_enc * (1/6)))``
  (saturating) and the element ``e2m1(x * min(1 / (s * S_dec), FLT_MAX))``; a value is
  ``e2m1 * s * S_dec``. ``amax_tensor`` is taken over the blocks without NaN or infinity.
  As the quantizer computes in FP32, a float64 value beyond FP32's range (one that
  ``round_to(x, "fp32")`` makes infinite, e.g. 1e300 or 3.5e38) is an infinity: its block is
  NaN and the other blocks are as if it were not there.

Values after dequantization are rounded once to the output dtype (float32 for float32 input,
float64 for float64 input); for power-of-two scales they are exact.

MX INT8 elements are the fixed-point numbers ``k / 64``, ``|k| <= 127``, saturating symmetrically
as the OCP reference code (microxcaling) does; the byte 0x80 (-2.0) decodes but is never produced
(gfloat's MX INT8 produces it). The floor rule takes the exact ``floor(log2(amax))`` from the
exponent bits (microxcaling's float32 ``log2`` rounds up for amax just below a large power of two).

How it runs: one fused pass over chunks of blocks on all cores: the amax of each block from the
magnitude bits, the scale exponent from amax's exponent field, exact scaling, the core's rounding
kernel (the one behind :func:`~precision_lab.round_to`, as :func:`~precision_lab.encode` uses it),
and scaling back, while the chunk is in cache. Under stochastic rounding element ``i`` of ``x`` (its
C-order flat index) uses the core's random word ``i`` for the seed, exactly as one ``round_to`` call
on the whole scaled tensor: results do not depend on chunking or threads. The native backend
(``precision_lab/native/blocks.inc``) runs the same pass compiled, with the same bits: float32
data in contiguous blocks (MX along the last axis, NVFP4) is scaled and rounded in float32 bits,
NVFP4 takes one pass for the per-tensor amax and computes its block scales inside the element
pass, and stochastic rounding draws the same random words (numpy runs it where x is padded).

>>> import numpy as np
>>> x = np.array([500.0, 1.0, -3.0] + [0.0] * 29, dtype=np.float32)
>>> q = quantize_blocks(x, "mxfp8_e4m3")                 # OCP floor rule: scale 1, 500 clips
>>> float(q.scales[0]), float(dequantize_blocks(q)[0])
(1.0, 448.0)
>>> up = get_block_format("mxfp8_e4m3", scale_rule="ceil")  # round-up rule: scale 2, no clipping
>>> round_to_blocks(x, up)[:3]
array([512.,   1.,  -3.], dtype=float32)
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from . import native_kernels
from ._arrays import as_input
from ._random import check_seed
from .codec import decode, encode
from .formats import FloatFormat, IntFormat, get_format
from .rounding import (
    CHUNK,
    ROUNDING_MODES,
    STOCHASTIC_MODES,
    _plan,
    _random_for,
    _round_float_chunk,
    _round_int_chunk,
    as_float_array,
    check_random_bits,
    check_rounding,
    for_chunks,
    round_to,
    working_dtype,
)

__all__ = [
    "BLOCK_FORMATS",
    "SCALE_RULES",
    "BlockFormat",
    "QuantizedBlocks",
    "dequantize_blocks",
    "gemm_blocks",
    "get_block_format",
    "known_block_formats",
    "quantize_blocks",
    "round_to_blocks",
]

#: How a block's scale is chosen from its largest magnitude (see the module docstring).
SCALE_RULES = ("floor", "ceil", "amax")

#: elements per chunk of the fused pass over the data (per-chunk overhead against cache misses:
#: measured best between 2**17 and 2**19 elements)
_CHUNK = 8 * CHUNK


@dataclass(frozen=True)
class BlockFormat:
    """A block-scaled format: element format, scale format, block shape and scale rule.

    Parameters
    ----------
    name:
        Display name.
    element:
        Element format (name or format object): ``"e4m3"``, ``"e2m1"``, ``"int8"`` ...
    scale:
        Scale format: ``"e8m0"`` (MX), ``"e4m3"`` (NVFP4), ``"fp32"`` (DeepSeek-V3 tiles).
    block_shape:
        ``(n,)``: blocks of n consecutive elements along the blocked axis; ``(r, c)``: 2-D tiles
        over the last two axes.
    scale_rule:
        ``"floor"``, ``"ceil"`` or ``"amax"`` (:data:`SCALE_RULES`).
    element_exponent:
        Elements are ``code * 2**element_exponent``: -6 for MX INT8, whose elements are the
        fixed-point numbers ``k/64``, ``k`` in -127..127 (1.6 format); 0 otherwise.
    tensor_scale:
        NVFP4's second-level per-tensor FP32 scale (only with ``scale_rule="amax"``).

    >>> f = get_block_format("mxfp4_e2m1")
    >>> f.element_max, f.element_emax, f.block_size, f.bits_per_element
    (6.0, 2, 32, 4.25)
    >>> get_block_format("mxint8").element_max
    1.984375
    """

    name: str
    element: FloatFormat | IntFormat
    scale: FloatFormat
    block_shape: tuple[int, ...]
    scale_rule: str = "floor"
    element_exponent: int = 0
    tensor_scale: bool = False
    _emax: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        elem = get_format(self.element, name="element")
        scale = get_format(self.scale, name="scale")
        object.__setattr__(self, "element", elem)
        object.__setattr__(self, "scale", scale)
        if not isinstance(scale, FloatFormat):
            raise ValueError(f"scale must be a floating-point format, got {scale}")
        shape = tuple(self.block_shape)
        if len(shape) not in (1, 2) or not all(
            isinstance(n, int | np.integer) and not isinstance(n, bool) and n >= 1 for n in shape
        ):
            raise ValueError(
                "block_shape must be (n,) or (rows, cols) of positive ints, "
                f"got {self.block_shape!r}"
            )
        object.__setattr__(self, "block_shape", tuple(int(n) for n in shape))
        if self.scale_rule not in SCALE_RULES:
            raise ValueError(f"scale_rule must be one of {SCALE_RULES}, got {self.scale_rule!r}")
        if self.tensor_scale and self.scale_rule != "amax":
            raise ValueError("tensor_scale=True (NVFP4) needs scale_rule='amax'")
        if isinstance(elem, IntFormat) and not elem.signed:
            raise ValueError(f"integer elements must be signed, got {elem}")
        if not isinstance(self.element_exponent, int):
            raise ValueError(f"element_exponent must be an int, got {self.element_exponent!r}")
        if self.element_exponent and self.scale_rule == "amax":
            raise ValueError("element_exponent needs a power-of-two scale rule ('floor' or 'ceil')")
        emax = math.frexp(self.element_max)[1] - 1
        object.__setattr__(self, "_emax", emax)

    @property
    def element_max(self) -> float:
        """Largest element value: 448 for E4M3, 6 for E2M1, 127/64 for MX INT8."""
        return math.ldexp(float(self.element.max), self.element_exponent)

    @property
    def element_emax(self) -> int:
        """Exponent of the largest power of two <= :attr:`element_max` (the OCP ``emax_elem``)."""
        return self._emax

    @property
    def block_size(self) -> int:
        """Elements per block (128 * 128 for a 128x128 tile)."""
        return math.prod(self.block_shape)

    @property
    def bits_per_element(self) -> float:
        """Storage per element, the block's share of its scale included (not the tensor scale)."""
        return self.element.bits + self.scale.bits / self.block_size

    @property
    def packed(self) -> bool:
        """Whether element codes are packed two per byte (4-bit elements)."""
        return self.element.bits == 4

    def __str__(self) -> str:
        return self.name


def _float(name: str) -> FloatFormat:
    f = get_format(name)
    assert isinstance(f, FloatFormat)
    return f


def _mx(name: str, elem: str, **kw: Any) -> BlockFormat:
    return BlockFormat(name, get_format(elem), _float("e8m0"), (32,), "floor", **kw)


#: The named block formats. MX formats use the OCP floor rule; ``get_block_format(name,
#: scale_rule="ceil")`` gives the round-up variant.
BLOCK_FORMATS: dict[str, BlockFormat] = {
    f.name: f
    for f in (
        _mx("mxfp8_e4m3", "e4m3"),
        _mx("mxfp8_e5m2", "e5m2"),
        _mx("mxfp6_e2m3", "e2m3"),
        _mx("mxfp6_e3m2", "e3m2"),
        _mx("mxfp4_e2m1", "e2m1"),
        _mx("mxint8", "int8", element_exponent=-6),
        BlockFormat("nvfp4", _float("e2m1"), _float("e4m3"), (16,), "amax", tensor_scale=True),
        BlockFormat("fp8_1x128", _float("e4m3"), _float("fp32"), (128,), "amax"),
        BlockFormat("fp8_128x128", _float("e4m3"), _float("fp32"), (128, 128), "amax"),
    )
}


def known_block_formats() -> list[str]:
    """Names accepted by :func:`get_block_format`."""
    return list(BLOCK_FORMATS)


def get_block_format(
    block_format: str | BlockFormat, *, scale_rule: str | None = None
) -> BlockFormat:
    """Look a block format up by name (or pass one through), optionally with another scale rule.

    >>> get_block_format("mxfp8_e4m3", scale_rule="ceil").scale_rule
    'ceil'
    >>> get_block_format("mxfp9")
    Traceback (most recent call last):
    ...
    ValueError: unknown block format 'mxfp9'; known block formats: mxfp8_e4m3, mxfp8_e5m2, ...
    """
    if isinstance(block_format, BlockFormat):
        bf = block_format
    elif isinstance(block_format, str):
        key = block_format.strip().lower()
        if key not in BLOCK_FORMATS:
            names = ", ".join(BLOCK_FORMATS)
            raise ValueError(f"unknown block format {block_format!r}; known block formats: {names}")
        bf = BLOCK_FORMATS[key]
    else:
        raise TypeError(
            f"block_format must be a name or a BlockFormat, got {type(block_format).__name__}"
        )
    if scale_rule is not None and scale_rule != bf.scale_rule:
        bf = replace(bf, scale_rule=scale_rule, name=f"{bf.name}[{scale_rule}]")
    return bf


# ----- results ----------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class QuantizedBlocks:
    """Element codes and block scales of a block-quantized tensor.

    Attributes
    ----------
    codes:
        Element codes (uint8; MX INT8 as two's complement bytes). 4-bit elements are packed two per
        byte along the last axis, the even index in the low nibble (shape ``(..., ceil(n / 2))``).
    scale_codes:
        Codes of the block scales in ``block_format.scale`` (uint8 for E8M0/E4M3, uint32 for FP32),
        on the block grid: the input shape with the blocked axis divided by the block size (both
        of the last two axes for 2-D tiles).
    scales:
        The block scales' values (float64, on the block grid); NaN marks a NaN block.
    shape:
        Shape of the quantized tensor.
    block_format, axis:
        The block format and the (non-negative) blocked axis (the last axis for 2-D tiles).
    dtype:
        dtype of :func:`dequantize_blocks`' result (float32, or float64 for float64 input).
    tensor_scale:
        NVFP4's per-tensor FP32 decode scale ``S_dec`` (1.0 for the other formats).
    """

    codes: np.ndarray
    scale_codes: np.ndarray
    scales: np.ndarray
    shape: tuple[int, ...]
    block_format: BlockFormat
    axis: int
    dtype: np.dtype
    tensor_scale: float = 1.0

    def element_codes(self) -> np.ndarray:
        """Element codes unpacked to one per uint8, in the tensor's shape."""
        if not self.block_format.packed:
            return self.codes
        n = self.shape[-1] if self.shape else 1
        lo = self.codes & np.uint8(0x0F)
        hi = self.codes >> np.uint8(4)
        both = np.stack([lo, hi], axis=-1).reshape(*self.codes.shape[:-1], -1)
        return both[..., :n]

    def element_values(self) -> np.ndarray:
        """Element values before scaling (float32): ``decode(codes) * 2**element_exponent``."""
        bf = self.block_format
        v = decode(self.element_codes(), bf.element).astype(np.float32)
        if bf.element_exponent:
            v *= np.float32(math.ldexp(1.0, bf.element_exponent))
        return v

    def dequantize(self) -> np.ndarray:
        """Same as :func:`dequantize_blocks` (self)."""
        return dequantize_blocks(self)


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
    """Scale exponents k (int64) of the floor/ceil rules, and the mask of NaN blocks."""
    sf = bf.scale
    kmin = math.frexp(sf.smallest_subnormal)[1] - 1
    kmax = sf.emax
    nan = ~np.isfinite(amax)
    a = np.where(nan, 1.0, amax)
    zero = a == 0
    m, e = np.frexp(np.where(zero, 1.0, a))  # a = m * 2**e, 0.5 <= m < 1, exact
    if bf.scale_rule == "floor":
        k = (e - 1) - bf.element_emax
    else:  # ceil(log2(a / elem_max)), exactly
        mm, em = math.frexp(bf.element_max)
        k = (e - em) + (m > mm)
    k = np.where(zero, kmin, np.maximum(k, kmin)).astype(np.int64)
    nan |= k > kmax
    return np.where(nan, 0, k), nan


def _nvfp4_tensor_scale(gamax: np.float32, bf: BlockFormat) -> tuple[np.float32, np.float32]:
    """NVFP4's per-tensor decode scale ``S_dec`` and the block scales' factor
    ``S_enc * (1 / elem_max)`` (float32) from the largest finite block amax ``gamax``.

    >>> [float(v) for v in _nvfp4_tensor_scale(np.float32(2688.0), get_block_format("nvfp4"))]
    [1.0, 0.1666666716337204]
    """
    f32 = np.float32
    fmax = f32(np.finfo(np.float32).max)
    elem_max, scale_max = f32(bf.element_max), f32(bf.scale.max)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s_enc = f32(elem_max * scale_max) / gamax
        s_enc = min(s_enc, fmax)
        if s_enc == 0:
            s_enc = f32(1.0)
        return f32(1.0) / s_enc, s_enc * (f32(1.0) / elem_max)


def _nvfp4_scales(amax: np.ndarray, bf: BlockFormat) -> tuple[np.ndarray, float, np.ndarray]:
    """Block scales (float32 values on the scale format), S_dec and the encode factors (float32).

    Float32 arithmetic exactly as Transformer Engine's reference NVFP4 quantizer.
    """
    f32 = np.float32
    fmax = f32(np.finfo(np.float32).max)
    # the quantizer's FP32 view of amax: float64 values that overflow FP32 are infinities
    a32 = round_to(amax, "fp32").astype(np.float32)
    finite = np.isfinite(a32)
    a32 = np.where(finite, a32, f32(0.0))
    s_dec, mult = _nvfp4_tensor_scale(f32(a32.max()) if a32.size else f32(0.0), bf)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        sb = np.minimum(a32 * mult, fmax)
        s = round_to(sb, bf.scale, overflow="saturate").astype(np.float32)
        enc = np.minimum(f32(1.0) / (s * s_dec), fmax)
    s = np.where(finite, s, f32(np.nan))
    enc = np.where(finite, enc, f32(np.nan))
    return s, float(s_dec), enc.astype(np.float32)


# ----- the passes over the data -----------------------------------------------------------------
def _prepare(x: Any, bf: BlockFormat, axis: Any, pad: bool) -> tuple[np.ndarray, _Layout]:
    a = as_float_array(x)
    if a.dtype != np.float64 and a.dtype != np.float32:
        a = a.astype(np.float32)
    lay = _layout(a.shape, bf, axis, pad)
    if lay.needs_pad:
        data = np.zeros(lay.padded, dtype=a.dtype)
        data[lay.crop] = a
    else:
        data = np.ascontiguousarray(a)
    return data, lay


def _pow2_fits(p: np.ndarray, dtype: np.dtype) -> bool:
    """Whether every (non-NaN) power of two in ``p`` is a value of ``dtype``."""
    fin = p[~np.isnan(p)]
    info = np.finfo(dtype)
    return bool(((fin >= info.smallest_subnormal) & (fin <= info.max)).all())


_TLS = threading.local()


def _scratch(dtype: np.dtype, shape: tuple[int, ...], slot: int) -> np.ndarray:
    """A per-thread scratch array (chunks reuse it: no allocation and page faults per chunk)."""
    n = math.prod(shape)
    cache = _TLS.__dict__.setdefault("buffers", {})
    key = (np.dtype(dtype).str, slot)
    buf = cache.get(key)
    if buf is None or buf.size < n:
        buf = cache[key] = np.empty(max(n, _CHUNK), dtype=dtype)
    return buf[:n].reshape(shape)


class _Pass:
    """The blocks of one array, chunk by chunk (a chunk is a range of units of the layout).

    ``scaled(lo, hi)`` chooses the scales of the chunk's blocks (storing them in ``values``) and
    returns its elements in units of the element grid, ``x / (scale * 2**element_exponent)``,
    clamped to the element format's range (clamping before rounding is the same as saturating
    after, the bound being on the grid) and NaN in NaN blocks, with ``dec``, the per-block factors
    that scale rounded elements back. ``unscale`` multiplies by them, rounding once to the output
    dtype (exact for power-of-two scales). NVFP4's per-tensor scale needs the whole tensor's amax
    first: its block scales are computed in an earlier pass.
    """

    def __init__(
        self, data: np.ndarray, lay: _Layout, bf: BlockFormat, mode: str, tensor_scales: bool = True
    ) -> None:
        U, _, B, C = lay.dims
        self.lay, self.bf, self.dtype = lay, bf, data.dtype
        self.src = data.reshape(lay.data_shape())
        uint = np.uint32 if data.dtype == np.float32 else np.uint64
        self.bits = data.view(uint).reshape(lay.data_shape())
        self.mask = uint(np.iinfo(uint).max >> 1)
        self.C = C
        self.tail = lay.grid_view_shape()[1:]
        self.values = np.empty((U, B), dtype=np.float64)  # the block scales, NaN: NaN block
        self.directed = mode in ("up", "down", "odd")
        self.bound = float(bf.element.max)
        self.tiny = data.dtype.type(np.finfo(data.dtype).smallest_subnormal)
        self.tensor_scale = 1.0
        if bf.tensor_scale and tensor_scales:  # (the native kernels compute their own)
            s, s_dec, enc = _nvfp4_scales(_block_amax(data, lay), bf)
            self.values[...] = s
            self.tensor_scale = s_dec
            self.enc = enc.astype(data.dtype)
        self.ts = data.dtype.type(self.tensor_scale)
        # fast path of the power-of-two rules: the exponent k from amax's exponent field
        self.P = 23 if data.dtype == np.float32 else 52
        self.BI = 127 if data.dtype == np.float32 else 1023
        self.uint = uint
        if bf.scale_rule in ("floor", "ceil"):
            ee = bf.element_exponent
            kmin = math.frexp(bf.scale.smallest_subnormal)[1] - 1
            mm, em = math.frexp(bf.element_max)  # elem_max = (2 mm) * 2**(em - 1)
            if bf.scale_rule == "floor":
                self.k_off = -self.BI - bf.element_emax
            else:
                self.k_off = -self.BI - (em - 1)
                self.m_max = uint(round((2 * mm - 1) * 2**self.P))  # elem_max's mantissa bits
            # k in [lo_k, hi_k]: within the scale format's range, and both 2**(k + ee) and
            # 2**-(k + ee) are normal numbers of the data's dtype
            self.lo_k = max(kmin, 1 - self.BI - ee)
            self.hi_k = min(bf.scale.emax, self.BI - 1 - ee)

    def _grid(self, a: np.ndarray) -> np.ndarray:
        return a.reshape(a.shape[0], *self.tail)

    def amax(self, lo: int, hi: int) -> np.ndarray:
        """Largest magnitude of each block of the chunk (float64, (h, B)); NaN for a NaN.

        Works on the magnitude bits as unsigned integers: their order is the magnitudes' order,
        and NaN's bits lie above infinity's.
        """
        m = self._amax_bits(lo, hi)
        return m.view(self.dtype).astype(np.float64).reshape(hi - lo, -1)

    def _amax_bits(self, lo: int, hi: int) -> np.ndarray:
        """Magnitude bits of each block's amax: the unsigned max of the sign-cleared bits."""
        b = self.bits[lo:hi]
        m = np.bitwise_and(b, self.mask, out=_scratch(b.dtype, b.shape, 0))
        if m.ndim == 2 and m.size:  # contiguous blocks: reduceat is far faster than max(axis=1)
            A = m.shape[1]
            return np.maximum.reduceat(m.reshape(-1), np.arange(0, m.size, A))
        if self.C > 1:
            m = m.max(axis=-1)
        return m.max(axis=1)

    def scaled(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        bf, x = self.bf, self.src[lo:hi]
        with np.errstate(all="ignore"):
            fast = bf.scale_rule in ("floor", "ceil") and self._pow2_fast(lo, hi)
            if fast:
                inv, dec = fast
                o = np.multiply(x, self._grid(inv), out=_scratch(x.dtype, x.shape, 1))
                if self.directed:  # results that underflow keep their sign and non-zero-ness
                    lost = (o == 0) & (x != 0)
                    if lost.any():
                        o[lost] = np.copysign(self.tiny, x[lost])
            elif bf.scale_rule in ("floor", "ceil"):
                k, nan = _pow2_exponents(self.amax(lo, hi), bf)
                self.values[lo:hi] = np.where(nan, np.nan, np.ldexp(1.0, k))
                shift = -k - bf.element_exponent
                inv = np.where(nan, np.nan, np.ldexp(1.0, shift))
                dec = np.where(nan, np.nan, np.ldexp(1.0, -shift))
                if _pow2_fits(inv, self.dtype):
                    o = x * self._grid(inv.astype(self.dtype))
                else:  # 2**133 (MX INT8 with the scale 2**-127) is not a float32
                    o = np.where(self._grid(nan), np.nan, np.ldexp(x, self._grid(shift)))
                if self.directed:  # results that underflow keep their sign and non-zero-ness
                    lost = (o == 0) & (x != 0)
                    if lost.any():
                        o[lost] = np.copysign(self.tiny, x[lost])
            elif bf.tensor_scale:  # NVFP4: x * encode factor in float32 (float64 for float64 x)
                dec = self.values[lo:hi]
                o = x * self._grid(self.enc[lo:hi])
            else:  # "amax": s = amax / elem_max rounded to the scale format; x / s in float64
                amax = self.amax(lo, hi)
                finite = np.isfinite(amax)
                sv = round_to(np.where(finite, amax, 0.0) / bf.element_max, bf.scale)
                sv = np.where(finite & np.isfinite(sv), sv, np.nan).astype(np.float64)
                self.values[lo:hi] = dec = sv
                s = self._grid(sv)
                zero = s == 0
                x64 = x.astype(np.float64)
                o = x64 / np.where(zero, 1.0, s)
                if zero.any():  # scale 0: non-zero elements saturate, zeros stay signed zeros
                    zb = np.broadcast_to(zero, o.shape)
                    o[zb] = np.where(x64 == 0, x64, np.copysign(np.inf, x64))[zb]
            if bf.scale_rule != "ceil":  # the round-up rule never exceeds the bound
                np.clip(o, -self.bound, self.bound, out=o)  # NaN stays NaN
        return o, dec

    def _pow2_fast(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(1 / (scale 2**ee), scale 2**ee) in the data's dtype, built from amax's exponent field,
        when every block of the chunk is ordinary (finite non-zero normal amax, k in range)."""
        amb = self._amax_bits(lo, hi)
        if amb.size == 0:
            return None
        P, BI = self.P, self.BI
        lo_ef, hi_ef = int(amb.min()) >> P, int(amb.max()) >> P
        ceil = self.bf.scale_rule == "ceil"
        if not (
            lo_ef >= 1
            and hi_ef < 2 * BI + 1
            and lo_ef + self.k_off >= self.lo_k
            and hi_ef + self.k_off + ceil <= self.hi_k
        ):
            return None
        sint = np.int32 if P == 23 else np.int64
        ef = amb.view(sint) >> P  # the sign bit is clear
        if ceil:
            ef += (amb & self.uint((1 << P) - 1)) > self.m_max
        shift = self.k_off + self.bf.element_exponent  # k + ee = ef + shift
        dec = ((ef + (BI + shift)) << P).view(self.dtype)
        inv = (((BI - shift) - ef) << P).view(self.dtype)
        inv, dec = inv.reshape(hi - lo, -1), dec.reshape(hi - lo, -1)
        ee = self.bf.element_exponent
        self.values[lo:hi] = np.ldexp(dec.astype(np.float64), -ee) if ee else dec
        return inv, dec

    def dec(self, lo: int, hi: int) -> np.ndarray:
        """The factors of ``unscale`` from the stored scales."""
        v = self.values[lo:hi]
        return np.ldexp(v, self.bf.element_exponent) if self.bf.element_exponent else v

    def unscale(self, q: np.ndarray, dec: np.ndarray, out: np.ndarray) -> None:
        """out = q * dec (* tensor scale): each value rounded once to out's dtype."""
        if dec.dtype != out.dtype and (self.bf.scale_rule == "amax" or _pow2_fits(dec, out.dtype)):
            dec = dec.astype(out.dtype)
        with np.errstate(all="ignore"):
            if self.bf.tensor_scale:
                np.multiply(q * self._grid(dec), self.ts, out=out)  # q * s is exact
            else:
                np.multiply(q, self._grid(dec), out=out)
        if self.bf.scale_rule == "amax":  # NaN blocks are +NaN (which NaN q * NaN gives depends
            nan = self._grid(np.isnan(dec))  # on numpy's loops: x's for some shapes)
            if nan.any():
                out[np.broadcast_to(nan, out.shape)] = np.nan


class _Kernel:
    """The core's rounding of one chunk (the kernel behind :func:`~precision_lab.round_to`, used
    as :func:`~precision_lab.encode` uses it): called from the fused per-chunk pass, so the
    scaled chunk is rounded while it is in cache, and element ``i`` of the tensor gets the random
    word of flat index ``i`` under stochastic rounding, exactly as one ``round_to`` call over the
    whole scaled tensor would give it. Elements saturate (``overflow="saturate"``).
    """

    def __init__(
        self, elem: FloatFormat | IntFormat, mode: str, seed: int | None, random_bits: int | None
    ) -> None:
        self.elem, self.mode = elem, mode
        self.rbits = check_random_bits(random_bits)
        self.key = check_seed(seed) if mode in STOCHASTIC_MODES else 0

    def __call__(self, scaled: np.ndarray, start: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rounded values of the chunk ``scaled`` (C order), whose first element has flat index
        ``start``; float32 (float64 for float64 chunks), written into ``out`` if it is given
        (contiguous, of that dtype)."""
        src = np.ascontiguousarray(scaled).reshape(-1)
        wdt = working_dtype(src.dtype, self.elem)
        if out is None or out.dtype != wdt:
            out = np.empty(scaled.shape, dtype=wdt)
        res = out
        out = out.reshape(-1)
        rw = (
            _random_for(self.rbits, self.key, src.size, start)
            if self.mode in STOCHASTIC_MODES
            else None
        )
        with np.errstate(all="ignore"):
            if isinstance(self.elem, IntFormat):
                _round_int_chunk(self.elem, self.mode, src, out, rw)
            else:
                p = _plan(self.elem, wdt.name, self.mode, "saturate", False)
                _round_float_chunk(p, src, out, rw)
        return res.reshape(scaled.shape)


def _codes(q: np.ndarray, elem: FloatFormat | IntFormat) -> np.ndarray:
    """Codes of rounded element values (exact); NaN-block elements get code 0."""
    flat = np.where(np.isnan(q), 0.0, q).astype(q.dtype).reshape(-1)
    step = 4 * CHUNK  # pieces the core encodes in the calling thread (no nested thread pools)
    parts = [encode(flat[i : i + step], elem) for i in range(0, max(flat.size, 1), step)]
    return (parts[0] if len(parts) == 1 else np.concatenate(parts)).reshape(q.shape)


def _elements(
    x: Any,
    bf: BlockFormat,
    *,
    axis: Any,
    rounding: str,
    seed: int | None,
    random_bits: int | None,
    pad: bool,
    codes: bool,
) -> tuple[np.ndarray, _Layout, _Pass, np.dtype]:
    """Element codes (``codes=True``) or values after scaling back, in x's shape; and the scales.

    One fused pass over chunks of blocks, on all cores: amax, scales, exact scaling, the core's
    rounding, scaling back, while the chunk is in cache. Stochastic rounding of a padded tensor
    (whose padded layout is not x's) scales in one pass, rounds x's whole scaled array in ONE call
    of the core, and scales back in another pass; both key the random words by x's flat index.
    """
    mode = check_rounding(rounding)
    data, lay = _prepare(x, bf, axis, pad)
    ext = _native_ext(data, lay, bf, mode)
    ps = _Pass(data, lay, bf, mode, tensor_scales=ext is None)
    kern = _Kernel(bf.element, mode, seed, random_bits)
    out_dtype = _out_dtype(data)
    U, A, B, C = lay.dims
    upc = _units_per_chunk(lay)
    if ext is not None:
        native = _native_blocks(ext, data, lay, ps, kern, codes)
        res = (_codes(native, bf.element) if codes else native).reshape(lay.padded)
        return (res[lay.crop] if lay.needs_pad else res), lay, ps, out_dtype
    out = np.empty(ps.src.shape, dtype=bf.element.code_dtype if codes else out_dtype)
    if not (mode in STOCHASTIC_MODES and lay.needs_pad):

        def work(lo: int, hi: int) -> None:
            o, dec = ps.scaled(lo, hi)
            if codes:
                out[lo:hi] = _codes(kern(o, lo * A * B * C), bf.element)
            else:  # round into the output, then scale back in place, while it is in cache
                q = kern(o, lo * A * B * C, out[lo:hi])
                ps.unscale(q, dec, out[lo:hi])

        for_chunks(U, work, chunk=upc)
    else:
        scaled = np.empty(ps.src.shape, dtype=np.float64 if bf.scale_rule == "amax" else data.dtype)

        def scale_work(lo: int, hi: int) -> None:
            scaled[lo:hi] = ps.scaled(lo, hi)[0]

        for_chunks(U, scale_work, chunk=upc)
        s = scaled.reshape(lay.padded)[lay.crop]  # x's own elements, in x's flat order
        q = round_to(
            s,
            bf.element,
            rounding=mode,
            overflow="saturate",
            seed=kern.key,
            random_bits=random_bits,
        )
        full = np.zeros(lay.padded, dtype=q.dtype)
        full[lay.crop] = q
        qv = full.reshape(ps.src.shape)
        if codes:
            out = _codes(qv, bf.element)
        else:

            def unscale_work(lo: int, hi: int) -> None:
                ps.unscale(qv[lo:hi], ps.dec(lo, hi), out[lo:hi])

            for_chunks(U, unscale_work, chunk=upc)
    res = out.reshape(lay.padded)
    return (res[lay.crop] if lay.needs_pad else res), lay, ps, out_dtype


_RULES = {"floor": 0, "ceil": 1, "amax": 2}


def _native_ext(data: np.ndarray, lay: _Layout, bf: BlockFormat, mode: str) -> Any:
    """The kernels extension where it serves this pass (else None): every rounding mode (the
    stochastic ones where x needs no padding: the layout's flat index is then x's), float32 and
    float64 data, float elements and MX INT8."""
    ext = native_kernels.ext if native_kernels.active() else None
    elem = bf.element
    if (
        ext is None
        or (mode in STOCHASTIC_MODES and lay.needs_pad)
        or data.dtype not in (np.dtype(np.float32), np.dtype(np.float64))
        or data.size == 0
        or (isinstance(elem, IntFormat) and elem.bits != 8)
    ):
        return None
    return ext


def _native_blocks(
    ext: Any, data: np.ndarray, lay: _Layout, ps: _Pass, kern: _Kernel, codes: bool
) -> np.ndarray:
    """The fused pass on the native kernels (the same values as the numpy passes).

    The kernel follows :meth:`_Pass.scaled`, :class:`_Kernel` and :meth:`_Pass.unscale`
    operation by operation (``precision_lab/native/blocks.inc``), and for NVFP4
    :func:`_nvfp4_scales` block by block, after a first pass for the per-tensor amax. With
    ``codes`` it returns the rounded elements (before scaling back), which :func:`_codes` encodes.
    Stochastic rounding draws the random word of each element's flat index, as :class:`_Kernel`.
    """
    from .gpu import format_args

    bf, mode = ps.bf, kern.mode
    elem = bf.element
    is_int = isinstance(elem, IntFormat)
    sf = bf.scale
    dims = np.array(lay.dims, dtype=np.int64)
    upc = _units_per_chunk(lay)
    mult = 0.0
    if bf.tensor_scale:  # NVFP4: the per-tensor amax first (blocks without NaN or infinity)
        big: list[float] = []
        for_chunks(lay.dims[0], lambda lo, hi: big.append(ext.block_amax(data, dims, None, lo, hi)),
                   chunk=upc)  # fmt: skip
        s_dec, m32 = _nvfp4_tensor_scale(np.float32(max(big)), bf)
        ps.tensor_scale, mult = float(s_dec), float(m32)
    mm, em = math.frexp(bf.element_max)
    kmin = math.frexp(sf.smallest_subnormal)[1] - 1
    ints = np.array([kmin, sf.emax, bf.element_emax, bf.element_exponent, em], dtype=np.int32)
    dbls = np.array([mm, float(elem.max), bf.element_max, ps.tensor_scale, mult], dtype=np.float64)
    efmt = np.array(format_args(sf if is_int else elem), dtype=np.int32)  # type: ignore[arg-type]
    sfmt = np.array(format_args(sf), dtype=np.int32)
    rule = 3 if bf.tensor_scale else _RULES[bf.scale_rule]
    out = np.empty(lay.padded, dtype=data.dtype)
    m = ROUNDING_MODES.index(mode)
    key = None
    if mode in STOCHASTIC_MODES:
        key = np.array([kern.key & (2**64 - 1), kern.key >> 64, kern.rbits], dtype=np.uint64)

    def work(lo: int, hi: int) -> None:
        ext.blocks(data, out, dims, rule, m, codes, is_int, 8, efmt, sfmt, ints, dbls,
                   ps.values, key, lo, hi)  # fmt: skip

    for_chunks(lay.dims[0], work, chunk=upc)
    res = out.reshape(ps.src.shape)
    if bf.scale_rule in ("floor", "ceil") and not codes:
        _positive_nan_blocks(res, ps, lay, bf, data.dtype)
    return res


def _positive_nan_blocks(
    res: np.ndarray, ps: _Pass, lay: _Layout, bf: BlockFormat, dtype: np.dtype
) -> None:
    """NaN blocks of the chunks where :meth:`_Pass.scaled` takes its ``ldexp`` branch (a block
    factor ``2**-(k + ee)`` that is no value of ``dtype``) come out as +NaN there, not as
    ``x * NaN`` (whose sign is x's when x is a NaN): the same here."""
    nan = np.isnan(ps.values)
    if not nan.any():
        return
    info = np.finfo(dtype)
    k = np.frexp(np.where(nan, 1.0, ps.values))[1] - 1
    shift = -k - bf.element_exponent
    lo_sh = int(np.log2(info.smallest_subnormal))
    bad = ~nan & ((shift < lo_sh) | (shift > info.maxexp - 1))
    upc = _units_per_chunk(lay)
    for lo in range(0, lay.dims[0], upc):
        hi = min(lo + upc, lay.dims[0])
        if bad[lo:hi].any() and nan[lo:hi].any():
            blk = ps._grid(nan[lo:hi])
            chunk = res[lo:hi]
            chunk[np.broadcast_to(blk, chunk.shape)] = np.nan


def _out_dtype(data: np.ndarray) -> np.dtype:
    return np.dtype(np.float64) if data.dtype == np.float64 else np.dtype(np.float32)


# ----- public API -------------------------------------------------------------------------------
def quantize_blocks(
    x: Any,
    block_format: str | BlockFormat,
    *,
    axis: int = -1,
    rounding: str = "nearest_even",
    seed: int | None = None,
    random_bits: int | None = None,
    pad: bool = False,
) -> QuantizedBlocks:
    """Quantize ``x`` to a block-scaled format: element codes and one scale per block.

    Parameters
    ----------
    x:
        Array-like of floats (float16/32/64 or an ml_dtypes float), at least 1-D (2-D for 2-D
        tiles). Integer input is a TypeError. Never modified.
    block_format:
        A name of :data:`BLOCK_FORMATS` (``"mxfp8_e4m3"``, ``"nvfp4"``, ``"fp8_128x128"`` ...) or a
        :class:`BlockFormat`.
    axis:
        The axis split into blocks (for 2-D tiles: -1 or -2, the tiles cover the last two axes).
    rounding:
        Rounding mode of the elements (any mode of :func:`~precision_lab.round_to`); elements
        saturate at the element format's maximum. Scales are chosen by the format's scale rule.
    seed, random_bits:
        For stochastic rounding: element ``i`` of ``x`` (C-order flat index) uses the core's random
        word ``i`` for ``seed``, so results are reproducible and equal to :func:`round_to_blocks`'.
    pad:
        Pad a blocked axis whose length is not a multiple of the block size with zeros (the last
        block is then partial); without it such an axis is a ValueError.

    Returns
    -------
    :class:`QuantizedBlocks`; :func:`dequantize_blocks` turns it back into values.

    >>> import numpy as np
    >>> q = quantize_blocks(np.linspace(-1, 1, 16, dtype=np.float32), "nvfp4")
    >>> q.codes.shape, q.codes.dtype, q.scale_codes.shape, q.tensor_scale
    ((8,), dtype('uint8'), (1,), 0.0003720238...)
    """
    bf = get_block_format(block_format)
    codes, lay, ps, out_dtype = _elements(
        x, bf, axis=axis, rounding=rounding, seed=seed, random_bits=random_bits, pad=pad, codes=True
    )
    if bf.packed:
        codes = _pack4(codes)
    vals = ps.values.reshape(lay.grid)
    return QuantizedBlocks(
        codes=codes,
        scale_codes=encode(vals, bf.scale),
        scales=vals,
        shape=lay.shape,
        block_format=bf,
        axis=lay.axis,
        dtype=out_dtype,
        tensor_scale=ps.tensor_scale,
    )


def _pack4(codes: np.ndarray) -> np.ndarray:
    if codes.ndim == 0:
        codes = codes.reshape(1)
    n = codes.shape[-1]
    if n % 2:
        codes = np.concatenate([codes, np.zeros((*codes.shape[:-1], 1), np.uint8)], axis=-1)
    return (codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))).astype(np.uint8)


def dequantize_blocks(q: QuantizedBlocks) -> np.ndarray:
    """Values of a :class:`QuantizedBlocks`: element value x block scale (x NVFP4's tensor scale).

    The result has ``q.shape`` and ``q.dtype``; every value of a NaN block is NaN.

    >>> import numpy as np
    >>> x = np.array([0.3, -1.7] * 16, dtype=np.float32)
    >>> dequantize_blocks(quantize_blocks(x, "mxfp4_e2m1"))[:2]
    array([ 0.25, -1.5 ], dtype=float32)
    """
    if not isinstance(q, QuantizedBlocks):
        raise TypeError(
            f"q must be a QuantizedBlocks (from quantize_blocks), got {type(q).__name__}"
        )
    bf = q.block_format
    lay = _layout(q.shape, bf, q.axis, pad=True)
    dtype = np.dtype(q.dtype)
    vals = decode(q.element_codes(), bf.element)
    if lay.needs_pad:
        full = np.zeros(lay.padded, dtype=vals.dtype)
        full[lay.crop] = vals
        vals = full
    qv = vals.reshape(lay.data_shape())
    f = np.ldexp(q.scales, bf.element_exponent).reshape(lay.grid_view_shape())
    if bf.scale_rule == "amax" or _pow2_fits(f, dtype):
        f = f.astype(dtype)
    ts = dtype.type(q.tensor_scale)
    out = np.empty(qv.shape, dtype=dtype)

    def work(lo: int, hi: int) -> None:
        with np.errstate(all="ignore"):
            r = qv[lo:hi] * f[lo:hi]  # exact: element x scale
            out[lo:hi] = r * ts if bf.tensor_scale else r

    for_chunks(lay.dims[0], work, chunk=_units_per_chunk(lay))
    res = out.reshape(lay.padded)
    return res[lay.crop] if lay.needs_pad else res


def round_to_blocks(
    x: Any,
    block_format: str | BlockFormat,
    *,
    axis: int = -1,
    rounding: str = "nearest_even",
    seed: int | None = None,
    random_bits: int | None = None,
    pad: bool = False,
) -> np.ndarray:
    """Fake quantization: the values ``x`` takes in a block-scaled format (quantize + dequantize).

    Same arguments and the same values as ``dequantize_blocks(quantize_blocks(x, ...))``, without
    forming the codes. Returns float32 (float64 for float64 input) of ``x``'s shape.

    >>> import numpy as np
    >>> x = np.array([1.0, 0.1, -0.01, 3e-3] * 8, dtype=np.float32)
    >>> round_to_blocks(x, "mxfp4_e2m1")[:4]     # scale 2**-2: elements 0.25 * {4, 0.5, 0, 0}
    array([ 1.   ,  0.125, -0.   ,  0.   ], dtype=float32)
    >>> round_to_blocks(x, "mxfp8_e4m3")[:4]
    array([ 1.        ,  0.1015625 , -0.00976562,  0.00292969], dtype=float32)
    """
    bf = get_block_format(block_format)
    x, restore = as_input(x)
    values, *_ = _elements(
        x,
        bf,
        axis=axis,
        rounding=rounding,
        seed=seed,
        random_bits=random_bits,
        pad=pad,
        codes=False,
    )
    return restore(values)  # type: ignore[no-any-return]


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


def _gemm_operand(q: QuantizedBlocks) -> tuple[np.ndarray, np.ndarray, FloatFormat]:
    """Element values, positive finite fp32 scales and the elements' input format.

    A NaN block's elements become NaN (so every product with them is NaN); a block whose scale is
    0 holds zeros. Both then take the scale 1, as the GEMM wants positive finite scales.
    """
    vals = q.element_values().astype(np.float64)
    s = q.scales
    nan, zero = np.isnan(s), s == 0
    if nan.any() or zero.any():
        vals = np.where(_per_element(nan, q), np.nan, vals)
        vals = np.where(_per_element(zero, q), 0.0, vals)
        s = np.where(nan | zero, 1.0, s)
    elem = q.block_format.element
    # MX INT8 elements k / 64 (|k| <= 127) are exact in bf16
    fmt = elem if isinstance(elem, FloatFormat) else _float("bf16")
    return vals, s, fmt


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

    Parameters
    ----------
    a, b:
        :class:`QuantizedBlocks` from :func:`quantize_blocks`.
    c:
        Accumulator input (see :func:`precision_lab.gemm`); not with NVFP4 operands.
    accumulator, out_format, backend:
        As :func:`precision_lab.gemm` (default: FP32 sequential accumulation, promoted to FP32
        at every block of K).

    >>> import numpy as np, precision_lab as pl
    >>> x = np.array([[1.0, -2.0, 0.5, 4.0] * 8, [3.0, 0.25, -1.5, 2.0] * 8])
    >>> w = np.ones((32, 3))
    >>> qa = pl.quantize_blocks(x, "mxfp8_e4m3")
    >>> qb = pl.quantize_blocks(w, "mxfp8_e4m3", axis=0)
    >>> pl.gemm_blocks(qa, qb)[:, 0]                      # x and w are exact in MXFP8
    array([28., 30.], dtype=float32)
    """
    from .gemm import gemm

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
    if alpha == 1:
        return gemm(va, vb, c, out_format=out_format, **opts)
    if c is not None:
        raise ValueError("c is not supported with per-tensor scales (NVFP4): add it afterwards")
    d = gemm(va, vb, out_format="fp32", **opts)  # float32
    with np.errstate(over="ignore"):
        return round_to(d * alpha, out_format)  # the FP32 epilogue, then the output format
