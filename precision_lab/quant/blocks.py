"""Block-scaled formats: OCP Microscaling (MX), NVIDIA NVFP4 and DeepSeek-V3 fine-grained FP8 tiles.

A block-scaled tensor stores low-precision *elements* and one *scale* per block of elements
(32 consecutive values for MX, 16 for NVFP4, 128 or a 128x128 tile for DeepSeek-V3); a value is
``element * scale`` (times a per-tensor FP32 scale for NVFP4). The scale is chosen from the block's
largest magnitude ``amax`` by a rule (:data:`SCALE_RULES`):

``"floor"`` (OCP MX v1.0, section 6.3)
    ``scale = 2**(floor(log2(amax)) - emax_elem)`` where ``emax_elem`` is the exponent of the
    element format's largest power of two (8 for E4M3, 2 for E2M1, 0 for MX INT8). The block's
    amax lands in the element format's top binade; elements above the element maximum after scaling
    are clamped to it (OCP: "clamping normal numbers to max"; MX E4M3 maps amax 500 to scale 1 and
    clips 500 to 448).
``"ceil"`` (round-up rule of Transformer Engine / cuBLAS MXFP8)
    ``scale = 2**ceil(log2(amax / elem_max))``: the smallest power of two that makes nothing clip
    (amax 500 -> scale 2 for E4M3). Computed exactly (not as ``amax * (1/448)`` in float32).
``"nearest_even"`` (torchao's ``EVEN``)
    ``scale = 2**(floor(log2(r)) - emax_elem)`` with ``r`` = amax rounded to the element's
    significand width (mantissa bits + 1; 6 fraction bits for MX INT8), ties away: the exponent of
    amax goes up by one iff its significand is at least ``2 - 2**-(mantissa_bits + 1)`` (1.75 for
    E2M1, 1.9375 for E4M3), so fewer blocks clip than under floor (amax 7 in E2M1: scale 2, 7/2
    rounds to 4). torchao's ``to_mx`` is run against it in ``tests/quant/test_torchao_mx.py``.
``"rceil"`` (torchao / cuBLAS ``RCEIL``; TE's MXFP8 ``cvt.rp.satfinite.ue8m0x2.f32``)
    ``scale = 2**ceil(log2(d))``, ``d = fp32(fp32(amax) * fp32(1 / elem_max))``: the round-up rule
    as the kernels compute it, on the float32 product. For float32 data and the OCP float
    element formats it equals ``"ceil"`` (``fp32(1 / elem_max)`` lies less than half an ulp above
    ``1 / elem_max``, so the product never rounds across a power of two; the tests search every
    boundary); float64 data differs where amax rounds to float32 (``amax = 6 * (1 + 2**-40)`` in
    MXFP4 gets scale 1 and clips to 6, instead of 2), and so does MX INT8, whose
    ``fp32(64 / 127)`` lies below ``64 / 127`` (an amax just above ``127/64 * 2**k`` gets
    ``2**k`` and clips). torchao's ``to_mx`` is run against it in ``tests/quant/test_torchao_mx.py``
    (its eager CPU fallback departs from the rule just above powers of two: see there).
``"ceil_emax"`` (torchao's ``ScaleCalculationMode.CEIL``)
    ``scale = 2**(ceil(log2(amax)) - emax_elem)``: the floor rule's formula with ``ceil``; a block
    whose amax is not a power of two gets twice the floor scale, so nothing clips but the block's
    largest element is at most ``2**emax_elem`` (256 for E4M3, 4 for E2M1: the element format's
    top binade goes unused; E4M3 amax 384 -> scale 2,
    where ``"ceil"`` keeps 1: 384 <= 448). Unlike ``"ceil"`` (TE / cuBLAS: the smallest power of
    two with ``amax / scale <= elem_max``) it ignores the element maximum's significand.
    Bit for bit with torchao's ``to_mx(..., ScaleCalculationMode.CEIL)`` on float32 data:
    ``tests/quant/test_torchao_mx.py`` (which also shows where torchao's code departs from its
    rules: tiny scales, infinities, NaN).
``"amax"`` (NVFP4, DeepSeek-V3 tiles)
    ``scale = amax / elem_max`` rounded (to nearest even) to the scale format (E4M3 for NVFP4,
    FP32 for the DeepSeek tiles).
``"amax_div"`` (NVFP4: Transformer Engine's Python reference quantizer)
    ``s = e4m3((amax / 6) * S_enc)`` (float32, divide first) instead of the CUDA kernel's
    ``e4m3(amax * (S_enc * (1/6)))``; the two differ in the last bit of the float32 product for
    some amax and then, where that crosses an E4M3 rounding boundary, in the scale.
``"4over6_mse"`` / ``"4over6_mae"`` (NVFP4: Four Over Six, Cook et al., arXiv 2512.02010)
    per block, the ``"amax"`` scale (block max to 6) or ``e4m3(amax * (S_enc * (1/4)))`` (block max
    to 4), whichever gives the smaller sum of squared (MSE) or absolute (MAE) errors of the
    block's dequantized values; elements rounded to nearest even for the choice; a tie keeps 6.
    The per-tensor bound is ``256 * 6`` by default (``BlockFormat.tensor_scale_bound``).

The per-tensor scale of NVFP4 is ``S_enc = elem_max * bound / amax_tensor`` with bound 448 (the
``448 * 6`` of NVIDIA's recipe) or ``BlockFormat.tensor_scale_bound`` (256 for 4/6).
:func:`clipped_blocks` / :func:`clipped_fraction` say which blocks saturate their largest element.
The native backend serves floor, ceil and amax (NVFP4 with the 448 bound); the other rules run the
numpy passes (same results by construction: one implementation).

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

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..core.codec import decode, encode
from ..core.formats import FloatFormat, get_format
from ..core.inputs import as_input
from ..core.ptx import cvt_rs_bits
from ..core.rounding import (
    STOCHASTIC_MODES,
    check_rounding,
    for_chunks,
    round_to,
)
from .block_formats import (
    BLOCK_FORMATS,
    SCALE_RULES,
    BlockFormat,
    get_block_format,
    known_block_formats,
)
from .block_layout import (
    _block_amax,
    _layout,
    _nvfp4_scales,
    _pow2_exponents,
    _units_per_chunk,
)
from .block_passes import (
    _codes,
    _data_dtype,
    _elements,
    _native_in_place,
    _pow2_fits,
    _prepare,
)

__all__ = [
    "BLOCK_FORMATS",
    "SCALE_RULES",
    "BlockFormat",
    "QuantizedBlocks",
    "clipped_blocks",
    "clipped_fraction",
    "dequantize_blocks",
    "get_block_format",
    "known_block_formats",
    "nvfp4_rbits_words",
    "quantize_blocks",
    "round_to_blocks",
]


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
    tensor_amax:
        NVFP4 (formats with a tensor scale): the global amax ``S_enc`` and ``S_dec`` come from,
        as the quantizer holds it (float32: the largest amax of the blocks without NaN or
        infinity; Transformer Engine's ``amax_rowwise``); None for the other formats.
    four_over_six:
        Under the 4/6 rules (``"4over6_mse"``, ``"4over6_mae"``): bool on the block grid, True
        where the block's scale maps its amax to 4 (``e4m3(amax * S_enc / 4)``), False where
        to 6 (and for NaN blocks); None for the other rules.
    """

    codes: np.ndarray
    scale_codes: np.ndarray
    scales: np.ndarray
    shape: tuple[int, ...]
    block_format: BlockFormat
    axis: int
    dtype: np.dtype
    tensor_scale: float = 1.0
    tensor_amax: float | None = None
    four_over_six: np.ndarray | None = None
    #: the rounded element values (float32, the tensor's shape, read-only; a NaN block's
    #: elements 0) where the quantizer kept them: :meth:`element_values` returns them, and
    #: ``codes`` given as :data:`_LAZY` are encoded from them when first read (a GEMM of the
    #: recipes reads only the values: the encoding and decoding cost 15% of a te_nvfp4 step)
    _elements: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.codes is _LAZY:
            if self._elements is None:
                raise ValueError("QuantizedBlocks: lazy codes need the element values")
            object.__delattr__(self, "codes")  # (__getattr__ encodes them when first read)
        if self.scale_codes is _LAZY:  # (encoded from scales when first read)
            object.__delattr__(self, "scale_codes")

    def __getattr__(self, name: str) -> Any:
        """``codes`` of a quantizer that kept the element values and ``scale_codes`` given as
        :data:`_LAZY`, encoded on first use (the recipes' GEMMs read neither)."""
        elems = self.__dict__.get("_elements")
        if name == "scale_codes" and "scales" in self.__dict__:
            scale_codes = encode(self.scales, self.block_format.scale)
            object.__setattr__(self, "scale_codes", scale_codes)
            return scale_codes
        if name != "codes" or elems is None:
            raise AttributeError(f"'QuantizedBlocks' object has no attribute {name!r}")
        codes = _codes(elems, self.block_format.element)
        codes = _pack4(codes) if self.block_format.packed else codes
        object.__setattr__(self, "codes", codes)
        return codes

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
        if self._elements is not None:
            return self._elements
        bf = self.block_format
        if bf.packed:  # one gather from the values of the 256 bytes (two elements each)
            n = self.shape[-1] if self.shape else 1
            pairs = np.take(_byte_values(bf.element), self.codes, axis=0)
            pairs = pairs.reshape(*self.codes.shape[:-1], -1)
            v = pairs if pairs.shape[-1] == n else np.ascontiguousarray(pairs[..., :n])
            v = v.reshape(self.shape)
        else:
            v = decode(self.element_codes(), bf.element).astype(np.float32)
        if bf.element_exponent:
            v *= np.float32(math.ldexp(1.0, bf.element_exponent))
        return v

    def dequantize(self) -> np.ndarray:
        """Same as :func:`dequantize_blocks` (self)."""
        return dequantize_blocks(self)


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
    rbits: Any = None,
    keep_values: bool = False,
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
    rbits:
        FP4 (E2M1) elements under ``rounding="stochastic"``: the random registers of the GPU's
        ``cvt.rs.satfinite.e2m1x4.f32`` instead of ``seed`` (uint32, shape ``x.shape[:-1] +
        (x.shape[-1] // 4,)``), so a kernel's stochastic quantization (Transformer Engine's NVFP4,
        which draws them with curand) is reproduced from its own random bits. See
        :func:`nvfp4_rbits_words` for which bits round which element.
    keep_values:
        Keep the rounded element values (float elements) and encode ``codes`` only when they are
        first read: for a consumer of the values alone (:func:`~precision_lab.gemm_blocks`, the
        recipes' GEMMs), which then skips the encoding and the decoding. The codes are the same;
        the result's ``__dict__`` lacks ``codes`` until they are read.

    Returns
    -------
    :class:`QuantizedBlocks`; :func:`dequantize_blocks` turns it back into values.

    >>> import numpy as np
    >>> q = quantize_blocks(np.linspace(-1, 1, 16, dtype=np.float32), "nvfp4")
    >>> q.codes.shape, q.codes.dtype, q.scale_codes.shape, q.tensor_scale
    ((8,), dtype('uint8'), (1,), 0.0003720238...)
    """
    bf = get_block_format(block_format)
    x, _ = as_input(x)  # the one input conversion (DLPack and array-API arrays: torch tensors)
    if rbits is None:
        moved = _along_last_axis(x, bf, axis, rounding, seed, random_bits, pad, keep_values)
        if moved is None:
            moved = _tiles_as_runs(x, bf, axis, rounding, seed, random_bits, pad, keep_values)
        if moved is not None:
            return moved
    words = _given_words(rbits, np.shape(x), bf, rounding, seed, random_bits)
    keep = keep_values and isinstance(bf.element, FloatFormat) and not bf.element_exponent
    codes, lay, ps, out_dtype = _elements(
        x, bf, axis=axis, rounding=rounding, seed=seed, random_bits=random_bits, pad=pad,
        codes="values" if keep else True, words=words,
    )  # fmt: skip
    vals = ps.values.reshape(lay.grid)
    elems = None
    if codes.dtype.kind == "f":  # the rounded elements: the codes are encoded when first read
        elems = _kept(codes, nan=bool(np.isnan(vals).any()))  # (NaN scale: a NaN block)
        codes = _LAZY
    elif bf.packed:
        codes = _pack4(codes)
    four = ps.info.get("four_over_six")
    return QuantizedBlocks(
        _elements=elems,
        codes=codes,
        scale_codes=_LAZY if elems is not None else encode(vals, bf.scale),
        scales=vals,
        shape=lay.shape,
        block_format=bf,
        axis=lay.axis,
        dtype=out_dtype,
        tensor_scale=ps.tensor_scale,
        tensor_amax=ps.info.get("tensor_amax") if bf.tensor_scale else None,
        four_over_six=None if four is None else np.asarray(four, dtype=bool).reshape(lay.grid),
    )


def _along_last_axis(
    x: Any,
    bf: BlockFormat,
    axis: Any,
    rounding: str,
    seed: int | None,
    random_bits: int | None,
    pad: bool,
    keep_values: bool = False,
) -> QuantizedBlocks | None:
    """:func:`quantize_blocks` of 1-D blocks along an axis other than the last, under a
    deterministic rounding, as the quantization of ``x`` with that axis moved last, moved back
    (None where that does not apply: the caller quantizes in place, and reports bad arguments).

    Every block holds the same elements either way, so it has the same amax and scale (NVFP4's
    per-tensor scale comes from the largest amax), and a deterministic rounding of an element
    depends on its value and its block's scale alone: the codes and scales are the same, moved.
    (Stochastic rounding draws each element's random word from its flat index, which moving the
    axis changes: not taken.) Blocks along a leading axis interleave in memory: where the native
    kernel's float32 path runs them in place (``block_passes._native_in_place``) that is faster,
    and this returns None; its general path ran them element by element (a (128, 512) MXFP8
    operand along axis 0 took 0.62 ms, moved 0.25 ms, on a Xeon).
    """
    a = np.asarray(x)
    if len(bf.block_shape) != 1 or a.ndim < 2 or a.dtype.kind != "f":
        return None
    if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
        return None
    if not -a.ndim <= axis < a.ndim or int(axis) % a.ndim == a.ndim - 1:
        return None
    try:
        mode = check_rounding(rounding)
    except ValueError:
        return None
    ax = int(axis) % a.ndim
    if mode in STOCHASTIC_MODES or (not pad and a.shape[ax] % bf.block_shape[0]):
        return None
    if _native_in_place(bf, _data_dtype(a.dtype), mode):
        return None  # (the native kernel runs these blocks in place, faster)
    q = quantize_blocks(np.moveaxis(a, ax, -1), bf, axis=-1, rounding=rounding, seed=seed,
                        random_bits=random_bits, pad=pad, keep_values=keep_values)  # fmt: skip

    def back(g: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(g, -1, ax))

    elems, codes = _moved_codes(q, back)
    return QuantizedBlocks(
        _elements=elems,
        codes=codes,
        scale_codes=back(q.scale_codes),
        scales=back(q.scales),
        shape=tuple(a.shape),
        block_format=bf,
        axis=ax,
        dtype=q.dtype,
        tensor_scale=q.tensor_scale,
        tensor_amax=q.tensor_amax,
        four_over_six=None if q.four_over_six is None else back(q.four_over_six),
    )


def _tiles_as_runs(
    x: Any,
    bf: BlockFormat,
    axis: Any,
    rounding: str,
    seed: int | None,
    random_bits: int | None,
    pad: bool,
    keep_values: bool = False,
) -> QuantizedBlocks | None:
    """:func:`quantize_blocks` of 2-D tiles (``nvfp4_16x16``, ``fp8_128x128``) under a
    deterministic rounding, as 1-D blocks of ``rows * cols`` contiguous elements: each tile's
    elements gathered into one run, quantized with the same format on 1-D blocks, and put back
    (None where that does not apply: tiles that need padding, stochastic rounding, bad
    arguments; the caller quantizes in place).

    A tile's run holds its elements, so it has the same amax and scale (NVFP4's tensor scale
    comes from the largest amax either way) and the same element roundings. The native kernel
    runs a 16 x 16 tile as sixteen rows of 16 (blocks_unit); the run of 256 in vectorised
    passes: a (128, 384) NVFP4 16 x 16 operand took 1.02 ms, as runs 0.45 ms (this Xeon).
    """
    a = np.asarray(x)
    if len(bf.block_shape) != 2 or a.ndim < 2 or a.dtype.kind != "f":
        return None
    tr, tc = bf.block_shape
    r, c = a.shape[-2:]
    if r % tr or c % tc or a.size == 0:
        return None
    try:
        lay = _layout(a.shape, bf, axis, pad)
        mode = check_rounding(rounding)
    except (TypeError, ValueError):
        return None
    if mode in STOCHASTIC_MODES:
        return None
    lead = a.shape[:-2]
    runs = a.reshape(*lead, r // tr, tr, c // tc, tc).swapaxes(-3, -2)
    runs = runs.reshape(*lead, r // tr, (c // tc) * tr * tc)
    q = quantize_blocks(runs, replace(bf, block_shape=(tr * tc,)), axis=-1, rounding=rounding,
                        seed=seed, random_bits=random_bits, keep_values=keep_values)  # fmt: skip

    def back(g: np.ndarray) -> np.ndarray:
        g = g.reshape(*lead, r // tr, c // tc, tr, tc).swapaxes(-3, -2)
        return np.ascontiguousarray(g.reshape(a.shape))

    elems, codes = _moved_codes(q, back)
    return QuantizedBlocks(
        _elements=elems,
        codes=codes,
        scale_codes=q.scale_codes,
        scales=q.scales,
        shape=tuple(a.shape),
        block_format=bf,
        axis=lay.axis,
        dtype=q.dtype,
        tensor_scale=q.tensor_scale,
        tensor_amax=q.tensor_amax,
        four_over_six=q.four_over_six,
    )


@functools.cache
def _byte_values(elem: Any) -> np.ndarray:
    """The two 4-bit elements of every byte (low nibble first, as :func:`_pack4` packs them) as
    float32 values, ``(256, 2)``: :func:`~precision_lab.core.codec.decode` of each nibble, read
    only. (Unpacking the nibbles, then decoding: 73 us for a (512, 128) NVFP4 operand; the
    gather (np.take; fancy indexing took 270): 23 us, this Xeon.)"""
    nib = decode(np.arange(16, dtype=np.uint8), elem).astype(np.float32)
    b = np.arange(256)
    out = np.stack([nib[b & 0x0F], nib[b >> 4]], axis=-1)
    out.flags.writeable = False
    return out


#: ``codes=`` of a :class:`QuantizedBlocks` whose codes are encoded from its element values
#: when first read
_LAZY = np.empty(0, dtype=np.uint8)


def _kept(q: np.ndarray, nan: bool = True) -> np.ndarray:
    """Rounded element values as :meth:`QuantizedBlocks.element_values` gives them: float32,
    a NaN block's elements 0 (code 0), read-only (``nan=False``: ``q`` holds no NaN; a
    float32 ``q`` is then taken as it is, not copied)."""
    out = np.where(np.isnan(q), np.float32(0), q) if nan else q
    out = np.ascontiguousarray(out, dtype=np.float32)
    out.flags.writeable = False
    return out


def _moved_codes(q: QuantizedBlocks, back: Any) -> tuple[np.ndarray | None, np.ndarray]:
    """(kept element values, codes) of ``q`` rearranged by ``back`` into another tensor's
    layout (the same block format): the kept values moved and the codes left lazy, else the
    unpacked codes moved and packed again."""
    if q._elements is not None:
        return _kept(back(q._elements), nan=False), _LAZY
    codes = back(q.element_codes())
    return None, _pack4(codes) if q.block_format.packed else codes


def _pack4(codes: np.ndarray) -> np.ndarray:
    if codes.ndim == 0:
        codes = codes.reshape(1)
    n = codes.shape[-1]
    if n % 2:
        codes = np.concatenate([codes, np.zeros((*codes.shape[:-1], 1), np.uint8)], axis=-1)
    return (codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))).astype(np.uint8)


def _transposed_tiles(q: QuantizedBlocks) -> QuantizedBlocks:
    """The quantization of ``x.swapaxes(-1, -2)`` from ``q``, the quantization of ``x`` in
    square 2-D tiles (``nvfp4_16x16``, ``fp8_128x128``) under a deterministic rounding: a
    recipe's weight serves its forward GEMM as ``w.T`` and its input-gradient GEMM as ``w``,
    quantized once (Transformer Engine keeps one quantized weight for both).

    Tile (i, j) of the transpose holds the elements of tile (j, i), transposed: the same amax,
    so the same scale (NVFP4's tensor scale comes from the largest amax either way; the 4/6
    rules compare the same errors), and each element rounded from its value and that scale
    alone; the ragged tiles at the ends are transposes of each other too. (Stochastic rounding
    draws an element's random word from its flat index, which the transpose changes: the
    caller must not pass it.) The element values, scales and 4/6 choices are transposed; the
    codes are encoded again where read.

    >>> x = np.arange(32 * 16, dtype=np.float32).reshape(32, 16) / 64
    >>> q = quantize_blocks(x, "nvfp4_16x16")
    >>> t = _transposed_tiles(q)
    >>> bool((dequantize_blocks(t) == dequantize_blocks(quantize_blocks(x.T, "nvfp4_16x16"))).all())
    True
    """
    bf = q.block_format
    if len(bf.block_shape) != 2 or bf.block_shape[0] != bf.block_shape[1] or len(q.shape) < 2:
        raise ValueError(f"q must be quantized in square 2-D tiles, got {bf} of shape {q.shape}")

    def t(g: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.swapaxes(g, -1, -2))

    elems, codes = _moved_codes(q, t)
    return QuantizedBlocks(
        _elements=elems,
        codes=codes,
        scale_codes=t(q.scale_codes) if "scale_codes" in q.__dict__ else _LAZY,
        scales=t(q.scales),
        shape=(*q.shape[:-2], q.shape[-1], q.shape[-2]),
        block_format=bf,
        axis=q.axis,
        dtype=q.dtype,
        tensor_scale=q.tensor_scale,
        tensor_amax=q.tensor_amax,
        four_over_six=None if q.four_over_six is None else t(q.four_over_six),
    )


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
    if not bf.pow2_scales or _pow2_fits(f, dtype):
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
    rbits: Any = None,
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
        words=_given_words(rbits, np.shape(x), bf, rounding, seed, random_bits),
    )
    return restore(values)  # type: ignore[no-any-return]


#: which operand of ``cvt.rs.satfinite.e2m1x4.f32 d, {a, b, e, f}, rbits`` element ``4g + j``
#: is (j = 0..3): Transformer Engine passes four consecutive elements as ``{v3, v2, v1, v0}``
#: (``mul_cvt_bf16_to_fp4_8x_stochastic_rounding`` in transformer_engine/common/util/ptx.cuh,
#: NVIDIA/TransformerEngine 03198ae1; the same order in its Hadamard cast fusion), so that
#: element 4g lands in the low nibble: element j is operand ``(f, e, b, a)[j]``
_TE_OPERAND = (3, 2, 1, 0)  # index into (a, b, e, f)


def nvfp4_rbits_words(rbits: Any, shape: tuple[int, ...]) -> np.ndarray:
    """The random words (uint64, one per element of an array of ``shape``, C order) that the
    stochastic rounding of the FP4 elements draws from the ``cvt.rs.satfinite.e2m1x4.f32``
    registers ``rbits`` (uint32, shape ``shape[:-1] + (shape[-1] // 4,)``): register ``g`` of a
    row rounds its elements ``4g .. 4g + 3``, passed as ``{a, b, e, f} = {x[4g+3], x[4g+2],
    x[4g+1], x[4g]}`` (Transformer Engine's order); operand ``a`` takes ``rbits[31:24]``, ``b``
    ``rbits[15:8]``, ``e`` ``rbits[23:16]``, ``f`` ``rbits[7:0]`` (``precision_lab.core.ptx.
    LAYOUTS``, the choice :func:`~precision_lab.cvt_rs` documents), and rounds away from zero iff
    its discarded fraction plus ``r * 2**-8`` reaches one quantum (8-bit add-and-truncate: the
    word is the 8 bits at the top).

    >>> nvfp4_rbits_words(np.array([0xA1_B2_C3_D4], dtype=np.uint32), (4,)) >> np.uint64(56)
    array([212, 178, 195, 161], dtype=uint64)
    """
    if not shape or shape[-1] % 4:
        raise ValueError(
            f"rbits needs the last axis of x to hold whole groups of 4 elements (one cvt.rs "
            f"e2m1x4 each), got shape {tuple(shape)}"
        )
    want = (*shape[:-1], shape[-1] // 4)
    r = np.asarray(rbits)
    if r.dtype.kind not in "ui" or r.shape != want:
        raise ValueError(
            f"rbits must be uint32 of shape {want} (one register per 4 elements), got "
            f"{r.dtype} of shape {r.shape}"
        )
    fields = cvt_rs_bits(r, "e2m1").reshape(*want, 4)  # operands a, b, e, f
    elems = fields[..., list(_TE_OPERAND)].reshape(shape).astype(np.uint64)
    return np.ascontiguousarray(elems << np.uint64(56)).reshape(-1)


def _given_words(
    rbits: Any,
    shape: tuple[int, ...],
    bf: BlockFormat,
    rounding: str,
    seed: int | None,
    random_bits: int | None,
) -> np.ndarray | None:
    if rbits is None:
        return None
    elem = bf.element
    if not (isinstance(elem, FloatFormat) and elem == get_format("e2m1")):
        raise ValueError(f"rbits (cvt.rs e2m1x4 registers) needs FP4 E2M1 elements, not {bf.name}")
    if check_rounding(rounding) != "stochastic":
        raise ValueError(f"rbits needs rounding='stochastic', got rounding={rounding!r}")
    if seed is not None or random_bits not in (None, 8):
        raise ValueError("rbits replaces seed and random_bits (8 bits per element): pass neither")
    return nvfp4_rbits_words(rbits, tuple(shape))


def clipped_blocks(
    x: Any, block_format: str | BlockFormat, *, axis: int = -1, pad: bool = False
) -> np.ndarray:
    """Which blocks clip: those whose largest scaled magnitude exceeds the element maximum.

    A block clips when ``amax / scale`` (as the quantizer forms it: exactly for power-of-two and
    ``"amax"`` scales, ``amax * enc`` in the data's float dtype for NVFP4) is above the element
    format's largest value, so that saturation changes its largest element: under the OCP floor
    rule a block whose amax has a significand above ``elem_max / 2**emax_elem`` (1.5 for E2M1,
    1.75 for E4M3); never under ``"ceil"``; under ``"rceil"`` only where the float32 quotient
    rounds down onto a power of two. NaN blocks do not clip. Returns a bool array on the block
    grid (the shape of :attr:`QuantizedBlocks.scales`).

    >>> import numpy as np
    >>> x = np.array([[7.0] + [0.0] * 31, [6.0] + [0.0] * 31], dtype=np.float32)
    >>> clipped_blocks(x, "mxfp4_e2m1").ravel().tolist()   # 7 = 1.75 * 4: scale 1, clips to 6
    [True, False]
    >>> clipped_blocks(x, get_block_format("mxfp4_e2m1", scale_rule="ceil")).any()
    np.False_
    """
    bf = get_block_format(block_format)
    a, _ = as_input(x)
    data, lay = _prepare(a, bf, axis, pad)
    amax = _block_amax(data, lay)
    with np.errstate(all="ignore"):
        if bf.pow2_scales:
            k, nan = _pow2_exponents(amax, bf)
            scaled = np.ldexp(np.where(nan, 0.0, amax), -k)  # exact (k >= -127)
            out = ~nan & (scaled > bf.element_max)
        elif bf.tensor_scale:
            _, _, enc = _nvfp4_scales(amax, bf, data, lay)
            dt = data.dtype.type
            scaled = amax.astype(data.dtype) * enc.astype(data.dtype)
            out = np.isfinite(enc) & (scaled > dt(bf.element_max))
        else:  # "amax": s = RN(amax / elem_max); amax / s in float64
            finite = np.isfinite(amax)
            sv = round_to(np.where(finite, amax, 0.0) / bf.element_max, bf.scale)
            sv = sv.astype(np.float64)
            q = np.where(sv > 0, amax / np.where(sv > 0, sv, 1.0), np.where(amax > 0, np.inf, 0))
            out = finite & np.isfinite(sv) & (q > bf.element_max)
    return np.asarray(out).reshape(lay.grid)


def clipped_fraction(
    x: Any, block_format: str | BlockFormat, *, axis: int = -1, pad: bool = False
) -> float:
    """Fraction of the blocks of ``x`` that clip (:func:`clipped_blocks`); 0.0 for no blocks.

    The OCP floor rule clips about 29% of MXFP4 blocks of 32 standard normal values (and 15-16%
    of MXFP8 E4M3 blocks), the round-up rules none:

    >>> import numpy as np
    >>> x = np.random.default_rng(0).standard_normal((512, 32)).astype(np.float32)
    >>> round(clipped_fraction(x, "mxfp4_e2m1"), 3), clipped_fraction(x, get_block_format(
    ...     "mxfp4_e2m1", scale_rule="ceil"))
    (0.287, 0.0)
    """
    m = clipped_blocks(x, block_format, axis=axis, pad=pad)
    return float(m.mean()) if m.size else 0.0
