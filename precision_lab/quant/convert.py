"""Conversions between block formats: :func:`convert_blocks`.

``MXFP4 -> NVFP4`` (exact where possible): NVIDIA Model Optimizer's closed form
(``modelopt/torch/quantization/utils/numeric_utils.py``: ``mxfp4_to_nvfp4_global_amax``,
``mxfp4_to_nvfp4_per_block_amax``; ``examples/hf_ptq/cast_mxfp4_to_nvfp4.py``,
NVIDIA/Model-Optimizer a2fbac7). With ``k_j`` the E8M0 exponent of MXFP4 block ``j`` and
``k_max`` the largest over the non-zero blocks (E8M0 code > 0), the per-tensor amax is pinned to
``6 * 448 * 2**m``, ``m = k_max - 8``, so NVFP4's tensor scale is ``S_dec = 2**m``; each MXFP4
block of 32 becomes two NVFP4 blocks of 16 whose amax is taken as ``6 * 2**k_j`` where ``k_j -
m`` lies in E4M3's power-of-two window ``[-9, 8]`` (block scale ``2**(k_j - m)``, exact in E4M3,
and every E2M1 nibble is kept: *lossless*), and as the block's decoded ``max |x|`` elsewhere
(blocks more than 17 binades below the largest: their scale leaves E4M3's range). The NVFP4
arithmetic is the library's (Transformer Engine's kernel, float32): ``s = e4m3(amax * (S_enc *
(1/6)))`` saturating, elements ``e2m1(x * min(1 / (s * S_dec), FLT_MAX))``. Error added: none on
the lossless blocks; on the others, NVFP4's own rounding of the decoded values under the pinned
tensor scale (a block whose scale underflows E4M3 loses its values).

Every other pair re-quantizes the decoded values (exact: element x scale) with the target's
quantizer (:func:`~precision_lab.quantize_blocks`, blocks along the same axis), so the error added
is the target format's quantization error of those values:

* ``NVFP4 -> MXFP4`` and ``FP8 -> MXFP4``: MXFP4's rounding (and, under the OCP floor rule,
  clipping of blocks whose amax significand exceeds 1.5);
* FP8 with a per-tensor power-of-two scale (``scale=2**e``) ``-> MXFP8`` (E4M3) under a
  round-up scale rule (``"ceil"``, ``"rceil"``: Transformer Engine's and cuBLAS's MXFP8):
  *exact*. The block scale ``2**ceil(log2(amax / 448))`` is at most the tensor scale (amax <=
  448 * 2**e), so every element ``c * 2**e / scale`` is the E4M3 value ``c`` times a power of
  two >= 1 whose result is at most 448: representable. Under the OCP floor rule a block whose
  amax has an E4M3 significand above 1.75 (1.875) clips, as for any data (240 * 2**-3 gets the
  scale 2**-4 and 480 clips to 448). Blockwise FP8 with power-of-two scales (1x128 tiles,
  UE8M0) -> MXFP8 with a round-up rule is exact by the same argument per tile.
  Non-power-of-two scales round.

:func:`conversion_error` measures what a conversion added.

>>> import numpy as np, precision_lab as pl
>>> x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
>>> q = pl.quantize_blocks(x, "mxfp4_e2m1")
>>> nv = convert_blocks(q, "nvfp4")
>>> nv.block_format.name, bool((nv.dequantize() == q.dequantize()).all())
('nvfp4', True)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.codec import encode
from ..core.rounding import as_float_array, round_to
from .block_formats import BlockFormat, get_block_format
from .blocks import QuantizedBlocks, _pack4, quantize_blocks

__all__ = ["conversion_error", "convert_blocks", "mxfp4_to_nvfp4"]

_E4M3_KMIN, _E4M3_KMAX = -9, 8  # E4M3 holds 2**k exactly for k in [-9, 8]


def _is_mxfp4(bf: BlockFormat) -> bool:
    return (
        bf.element.name == "e2m1"
        and bf.scale.name == "e8m0"
        and bf.block_shape == (32,)
        and not bf.tensor_scale
    )


def mxfp4_to_nvfp4(q: QuantizedBlocks) -> QuantizedBlocks:
    """Model Optimizer's closed-form MXFP4 -> NVFP4 cast (module docstring).

    >>> import numpy as np, precision_lab as pl
    >>> q = pl.quantize_blocks(np.array([[3.0] + [0.5] * 31]), "mxfp4_e2m1")
    >>> nv = mxfp4_to_nvfp4(q)
    >>> nv.tensor_scale, nv.scales.ravel().tolist()     # k = -1, m = -9: S_dec 2**-9, s 2**8
    (0.001953125, [256.0, 256.0])
    """
    if not isinstance(q, QuantizedBlocks) or not _is_mxfp4(q.block_format):
        raise ValueError(f"q must be MXFP4 (E2M1, E8M0 scales, blocks of 32), got {q!r:.60}")
    if q.axis != len(q.shape) - 1:
        raise ValueError(f"q must be blocked along its last axis, got axis {q.axis}")
    f32 = np.float32
    codes = np.asarray(q.scale_codes).astype(np.int64)
    nan_block = np.isnan(q.scales)
    k = codes - 127
    live = (codes > 0) & ~nan_block
    k_max = int(k[live].max()) if live.any() else 0
    m = k_max - _E4M3_KMAX
    s_dec = f32(2.0**m)
    s_enc = f32(1.0) / s_dec  # 448 * 6 / global_amax, exact
    vals = (
        q.element_values().astype(np.float64) * np.repeat(q.scales, 32, axis=-1)[..., : q.shape[-1]]
    )  # the decoded MXFP4 values (exact; NaN blocks NaN)
    n = q.shape[-1]
    nb = -(-n // 16)
    padded = np.zeros((*q.shape[:-1], nb * 16))
    padded[..., :n] = vals
    blocks = padded.reshape(*q.shape[:-1], nb, 16)
    kk = np.repeat(k, 2, axis=-1)[..., :nb]
    in_range = (kk - m >= _E4M3_KMIN) & (kk - m <= _E4M3_KMAX)
    with np.errstate(all="ignore"):
        data_amax = np.abs(blocks).max(axis=-1)
        amax = np.where(in_range, 6.0 * np.exp2(kk.astype(np.float64)), data_amax)
        amax = round_to(amax, "fp32").astype(f32)
        factor = s_enc * (f32(1.0) / f32(6.0))
        s = round_to(amax * factor, "e4m3", overflow="saturate").astype(f32)
        enc = np.minimum(f32(1.0) / (s * s_dec), f32(np.finfo(np.float32).max))
        scaled = blocks.astype(f32) * enc[..., None]  # float32, as the kernel
        e = round_to(scaled, "e2m1", overflow="saturate")
    nan = np.repeat(nan_block, 2, axis=-1)[..., :nb]
    s64 = np.where(nan, np.nan, s.astype(np.float64))
    e = np.where(nan[..., None], 0.0, e).reshape(*q.shape[:-1], nb * 16)[..., :n]
    bf = get_block_format("nvfp4")
    return QuantizedBlocks(
        codes=_pack4(encode(e, bf.element)),
        scale_codes=encode(s64, bf.scale),
        scales=s64,
        shape=q.shape,
        block_format=bf,
        axis=q.axis,
        dtype=q.dtype,
        tensor_scale=float(s_dec),
        tensor_amax=float(f32(6.0 * 448.0 * 2.0**m)),
    )


def convert_blocks(
    q: QuantizedBlocks | Any,
    to: str | BlockFormat,
    *,
    scale: float = 1.0,
    axis: int | None = None,
) -> QuantizedBlocks:
    """Convert a block-quantized tensor (or a per-tensor-scaled FP8 one) to another block format.

    Parameters
    ----------
    q:
        A :class:`~precision_lab.quant.blocks.QuantizedBlocks` (MXFP4, NVFP4, MXFP8, 1x128 /
        128x128 FP8 tiles ...), or the element values of a per-tensor-scaled FP8 tensor (an
        array on the E4M3/E5M2 grid) with its dequantization ``scale``.
    to:
        The target block format (a name of
        :data:`~precision_lab.quant.block_formats.BLOCK_FORMATS`, optionally with a ``[rule]``
        suffix as ``"mxfp8_e4m3[ceil]"``, or a :class:`~precision_lab.BlockFormat`).
    scale:
        The per-tensor scale of an array ``q`` (ignored for a QuantizedBlocks).
    axis:
        The blocked axis of the result (default: ``q``'s; -1 for an array).

    Returns
    -------
    :class:`~precision_lab.quant.blocks.QuantizedBlocks` in ``to``. MXFP4 -> NVFP4 is Model
    Optimizer's closed form (:func:`mxfp4_to_nvfp4`); everything else re-quantizes the decoded
    values (module docstring: which conversions are exact and what the others add).

    >>> import numpy as np
    >>> fp8 = np.array([[448.0, -3.0, 0.015625] * 32 + [1.0] * 32])   # E4M3 values
    >>> mx = convert_blocks(fp8, "mxfp8_e4m3[ceil]", scale=2.0**-4)
    >>> bool((mx.dequantize() == fp8 * 2.0**-4).all())                 # exact
    True
    """
    if isinstance(to, str) and "[" in to:
        base, _, rule = to.partition("[")
        target = get_block_format(base, scale_rule=rule.rstrip("]"))
    else:
        target = get_block_format(to)
    if isinstance(q, QuantizedBlocks):
        if _is_mxfp4(q.block_format) and target.name == "nvfp4" and axis in (None, q.axis):
            return mxfp4_to_nvfp4(q)
        values = q.dequantize()
        ax = q.axis if axis is None else axis
        if len(q.block_format.block_shape) == 2 and len(target.block_shape) == 1 and axis is None:
            ax = len(q.shape) - 1
    else:
        a = as_float_array(q, "q")
        s = np.float64(scale)
        if not (np.isfinite(s) and s > 0):
            raise ValueError(f"scale must be a positive finite number, got {scale!r}")
        values = a.astype(np.float64) * s
        if a.dtype == np.float32 and np.all(values == values.astype(np.float32)):
            values = values.astype(np.float32)
        ax = -1 if axis is None else axis
    return quantize_blocks(values, target, axis=ax, pad=True)


def conversion_error(q: QuantizedBlocks | Any, converted: QuantizedBlocks, *, scale: float = 1.0):
    """What a conversion added: ``pl.error_stats``-like max abs and max relative error of the
    converted values against the source's decoded values (NaN ignored), as a dict.

    >>> import numpy as np, precision_lab as pl
    >>> q = pl.quantize_blocks(np.random.default_rng(1).standard_normal((2, 64)), "nvfp4")
    >>> e = conversion_error(q, convert_blocks(q, "mxfp4_e2m1"))
    >>> e["max_abs"] > 0
    True
    """
    if isinstance(q, QuantizedBlocks):
        src = q.dequantize().astype(np.float64)
    else:
        src = as_float_array(q, "q").astype(np.float64) * float(scale)
    out = converted.dequantize().astype(np.float64)
    ok = ~(np.isnan(src) | np.isnan(out))
    err = np.abs(out - src)[ok]
    mag = np.abs(src)[ok]
    nz = mag > 0
    return {
        "max_abs": float(err.max()) if err.size else 0.0,
        "max_rel": float((err[nz] / mag[nz]).max()) if nz.any() else 0.0,
        "exact_fraction": float((err == 0).mean()) if err.size else 1.0,
    }
