"""precision_lab: bit-exact emulation of low-precision number formats.

>>> import precision_lab as pl
>>> pl.get_format("e4m3").max
448.0
>>> float(pl.round_to(0.3, "bf16"))
0.30078125
"""

from . import scaling
from .analysis import error_stats, gamma_n, pick_loss_scale, sqrt_n_u, underflow_stats
from .codec import decode, encode
from .formats import FORMATS, FloatFormat, IntFormat, get_format, known_formats
from .quantization import Calibration, calibrate, dequantize, quantize
from .rounding import ROUNDING_MODES, round_to

__all__ = [
    "FORMATS",
    "ROUNDING_MODES",
    "Calibration",
    "FloatFormat",
    "IntFormat",
    "calibrate",
    "decode",
    "dequantize",
    "encode",
    "error_stats",
    "gamma_n",
    "get_format",
    "known_formats",
    "pick_loss_scale",
    "quantize",
    "round_to",
    "scaling",
    "sqrt_n_u",
    "underflow_stats",
]

__version__ = "0.1.0"
