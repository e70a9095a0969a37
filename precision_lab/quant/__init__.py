"""Quantization: integer formats with scales and zero points, and block-scaled formats.

Holds :mod:`.integer` (``quantize``, ``dequantize``, ``calibrate``: INT8/INT4 with per-tensor or
per-channel scales), and the block formats: :mod:`.block_formats` (``BlockFormat``, the
registry of MX, NVFP4 and 1x128/128x128 tiles), :mod:`.block_layout` (how a tensor is cut into
blocks, block maxima and scales), :mod:`.block_passes` (the chunked passes over the data, numpy
and native) and :mod:`.blocks` (``quantize_blocks``, ``dequantize_blocks``, ``round_to_blocks``);
the FP4-era recipe pieces: :mod:`.hadamard` (``hadamard``: blockwise random Hadamard rotations,
exact or in a format's arithmetic), :mod:`.recipes` (training recipes as frozen dataclasses: the
formats, scale rules, rounding and rotations of each GEMM of a linear layer).

May import: :mod:`precision_lab.core` and :mod:`precision_lab.backends`.

Where a new thing goes: a new block format is an entry of ``BLOCK_FORMATS`` in
:mod:`.block_formats`; a new scale rule a name in ``SCALE_RULES`` and a branch in
:mod:`.block_layout`; the FP4-era recipe pieces (rotations, scale rules) are modules of their
own here. GEMM on block-quantized operands is :func:`precision_lab.gemm.gemm_blocks`.

>>> import precision_lab as pl
>>> q = pl.quantize([0.5, -1.0], "int8", scale=1 / 127)
>>> q.tolist()
[64, -127]
"""

from .blocks import (
    BLOCK_FORMATS,
    SCALE_RULES,
    BlockFormat,
    QuantizedBlocks,
    dequantize_blocks,
    get_block_format,
    known_block_formats,
    quantize_blocks,
    round_to_blocks,
)
from .convert import conversion_error, convert_blocks
from .fine_grained import (
    FINE_GRAINED_FORMATS,
    deepgemm_fp4_quantize,
    deepgemm_quantize,
    te_blockwise_quantize,
)
from .hadamard import TE_NVFP4_SIGNS, hadamard, hadamard_matrix, random_signs
from .integer import CALIBRATION_METHODS, Calibration, calibrate, dequantize, quantize
from .recipes import RECIPES, GemmRole, Operand, Recipe, get_recipe

__all__ = [
    "BLOCK_FORMATS",
    "CALIBRATION_METHODS",
    "FINE_GRAINED_FORMATS",
    "RECIPES",
    "SCALE_RULES",
    "TE_NVFP4_SIGNS",
    "BlockFormat",
    "Calibration",
    "GemmRole",
    "Operand",
    "QuantizedBlocks",
    "Recipe",
    "calibrate",
    "conversion_error",
    "convert_blocks",
    "deepgemm_fp4_quantize",
    "deepgemm_quantize",
    "dequantize",
    "dequantize_blocks",
    "get_block_format",
    "get_recipe",
    "hadamard",
    "hadamard_matrix",
    "known_block_formats",
    "quantize",
    "quantize_blocks",
    "random_signs",
    "round_to_blocks",
    "te_blockwise_quantize",
]
