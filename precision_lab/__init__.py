"""precision_lab: bit-exact emulation of low-precision number formats.

>>> import precision_lab as pl
>>> pl.get_format("e4m3").max
448.0
>>> float(pl.round_to(0.3, "bf16"))
0.30078125
"""

from . import analysis, gradients, scaling
from .analysis import error_stats, gamma_n, pick_loss_scale, sqrt_n_u, underflow_stats
from .blocks import (
    BlockFormat,
    QuantizedBlocks,
    dequantize_blocks,
    gemm_blocks,
    get_block_format,
    quantize_blocks,
    round_to_blocks,
)
from .codec import decode, encode
from .formats import FORMATS, FloatFormat, IntFormat, get_format, known_formats, p3109
from .gemm import Accumulator, gemm, tensor_core
from .policy import POLICIES, Policy, get_policy
from .quantization import Calibration, calibrate, dequantize, quantize
from .rounding import ROUNDING_MODES, round_to

__all__ = [
    "FORMATS",
    "POLICIES",
    "ROUNDING_MODES",
    "Accumulator",
    "BlockFormat",
    "Calibration",
    "FloatFormat",
    "IntFormat",
    "Policy",
    "QuantizedBlocks",
    "analysis",
    "calibrate",
    "decode",
    "dequantize",
    "dequantize_blocks",
    "encode",
    "error_stats",
    "gamma_n",
    "gemm",
    "gemm_blocks",
    "get_block_format",
    "get_format",
    "get_policy",
    "gradients",
    "known_formats",
    "p3109",
    "pick_loss_scale",
    "quantize",
    "quantize_blocks",
    "round_to",
    "round_to_blocks",
    "scaling",
    "sqrt_n_u",
    "tensor_core",
    "underflow_stats",
]

__version__ = "0.1.0"
