"""precision_lab: bit-exact emulation of low-precision number formats, and what they do to
real computations (GEMMs, loss scaling, quantization, training).

Main entry points (all at the top level, ``import precision_lab as pl``):

* formats: ``pl.get_format("e4m3")`` (``.max``, ``.eps``, ``.values()`` ...), ``pl.FloatFormat``,
  ``pl.IntFormat``, ``pl.FORMATS``, ``pl.known_formats()``
* casts: ``pl.round_to(x, fmt, rounding=..., overflow=..., subnormals=..., seed=...)``,
  ``pl.encode`` / ``pl.decode`` (values <-> codes)
* quantization: ``pl.quantize`` / ``pl.dequantize`` / ``pl.calibrate`` (INT8 ...),
  ``pl.round_to_blocks`` / ``pl.quantize_blocks`` / ``pl.dequantize_blocks`` (MX, NVFP4 ...)
* GEMM: ``pl.gemm(a, b, input_format=..., accumulator=...)``, ``pl.Accumulator``,
  ``pl.tensor_core("h100", "e4m3")``
* analysis: ``pl.underflow_stats``, ``pl.pick_loss_scale``, ``pl.error_stats``,
  ``pl.gamma_n``, ``pl.sqrt_n_u``
* scaling: ``pl.scaling.DynamicLossScaler`` (``.preset("deepspeed")`` ...),
  ``pl.scaling.DelayedScaling``, ``pl.scaling.simulate`` / ``pl.scaling.diagnose``
* emulated arithmetic: ``pl.ops.add(x, y, fmt, rounding=...)`` ..., ``pl.emulate(x, "bf16")``
* policies: ``pl.get_policy("mixed_float16")``, ``pl.Policy``, ``pl.POLICIES``
* command line: ``precision-lab formats | cast | figures | report`` (``python -m precision_lab``)

Modules:

* :mod:`~precision_lab.formats`: number formats as dataclasses, and their registry
* :mod:`~precision_lab.rounding`: the rounding core every other module calls
* :mod:`~precision_lab.codec`: values <-> the integer codes (bit patterns) of a format
* :mod:`~precision_lab.quantization`: integer quantization, dequantization and calibration
* :mod:`~precision_lab.blocks`: block-scaled formats (OCP MX, NVFP4, DeepSeek-V3 FP8 tiles)
* :mod:`~precision_lab.gemm`: GEMM with a configurable accumulator, and tensor-core models
* :mod:`~precision_lab.analysis`: underflow statistics, loss-scale choice, error measures, bounds
* :mod:`~precision_lab.scaling`: loss scalers, FP8 scaling recipes, simulation over gradients
* :mod:`~precision_lab.gradients`: seeded gradient-like values, storage of recorded gradients
* :mod:`~precision_lab.policy`: precision policies (which format each part of a step uses)
* :mod:`~precision_lab.training`: a real training run (digits MLP) under emulated precision
* :mod:`~precision_lab.ptq` / :mod:`~precision_lab.qat`: INT8 post-training quantization and
  quantization-aware training of that network
* :mod:`~precision_lab.ops`: correctly rounded elementwise arithmetic and reductions in any format
* :mod:`~precision_lab.emulated`: ``pl.emulate`` and the ``Emulated`` array (numpy code in a format)
* :mod:`~precision_lab.bounds`: deterministic and probabilistic rounding-error bounds, condition
  numbers, backward errors, repeated trials
* :mod:`~precision_lab.experiments_policy`: the policy and INT8 studies behind the figures
* :mod:`~precision_lab.experiments_emulated`: the emulated-arithmetic studies behind the figures
* :mod:`~precision_lab.strategies`: hypothesis strategies for property tests (needs hypothesis)
* :mod:`~precision_lab.dispatch`: chooses the backend (numpy, native, cupy) of each operation;
  ``pl.backend_info()``, ``pl.use_backend(...)``
* :mod:`~precision_lab.native`: the compiled CPU backend (C++ from the CUDA headers): build,
  loading and staleness check
* :mod:`~precision_lab.native_kernels`: the compiled GEMM, INT quantization and block kernels
* :mod:`~precision_lab.gpu`: the CuPy backend (optional, ``precision_lab[gpu]``)
* :mod:`~precision_lab.sweep`: exhaustive verification of casts over every input bit pattern, on
  Dask (``precision_lab[dask]``), checkpointed and resumable
* :mod:`~precision_lab.oracles`: independent fast oracles for those sweeps (referee, ml_dtypes,
  torch)
* :mod:`~precision_lab.grid`: experiment grids (training runs, GEMM errors) as Dask tasks
* :mod:`~precision_lab.figures`: the figure jobs and ``figures/REPORT.md``
* :mod:`~precision_lab.cli`: the ``precision-lab`` command line

>>> import precision_lab as pl
>>> pl.get_format("e4m3").max
448.0
>>> float(pl.round_to(0.3, "bf16"))
0.30078125
"""

from . import analysis, gradients, ops, scaling
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
from .dispatch import backend_info, use_backend
from .emulated import Emulated, emulate
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
    "Emulated",
    "FloatFormat",
    "IntFormat",
    "Policy",
    "QuantizedBlocks",
    "analysis",
    "backend_info",
    "calibrate",
    "decode",
    "dequantize",
    "dequantize_blocks",
    "emulate",
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
    "ops",
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
    "use_backend",
]

__version__ = "0.1.0"
