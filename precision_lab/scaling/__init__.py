"""Loss scaling and FP8 scaling: scalers, scaling recipes, and simulation over gradients.

Holds :mod:`.scalers` (``StaticLossScaler``, ``DynamicLossScaler`` and the presets of PyTorch,
Keras, apex, DeepSpeed and Megatron), :mod:`.fp8` (per-tensor scales from amax: current and
delayed scaling as Transformer Engine defines them, block scales), :mod:`.simulate`
(``simulate`` a scaler over a sequence of gradient steps, and ``diagnose`` the run) and
:mod:`.gradients` (seeded gradient-like populations, and storage of recorded gradients).

May import: :mod:`precision_lab.core`, :mod:`precision_lab.backends`, :mod:`precision_lab.quant`,
:mod:`precision_lab.gemm` and :mod:`precision_lab.arith`; not :mod:`precision_lab.analysis`
(a sibling).

Where a new thing goes: a new loss scaler is a :class:`LossScaler` subclass in :mod:`.scalers`
(a new framework's defaults: an entry of ``PRESETS``); a new FP8/FP4 scaling recipe goes into
:mod:`.fp8`; a new gradient population into :mod:`.gradients`.

>>> import precision_lab as pl
>>> s = pl.scaling.DynamicLossScaler(init_scale=2.0**16)
>>> s.update(found_inf=True), s.scale
(False, 32768.0)
"""

from . import gradients
from .fp8 import (
    BlockScales,
    DelayedScaling,
    block_scales,
    current_scale,
    quantize_current,
    scale_from_amax,
)
from .scalers import (
    PRESETS,
    DynamicLossScaler,
    LossScaleCollapseWarning,
    LossScaleError,
    LossScaler,
    StaticLossScaler,
    has_inf_or_nan,
    trajectory,
)
from .simulate import Diagnosis, Simulation, diagnose, simulate

__all__ = [
    "PRESETS",
    "BlockScales",
    "DelayedScaling",
    "Diagnosis",
    "DynamicLossScaler",
    "LossScaleCollapseWarning",
    "LossScaleError",
    "LossScaler",
    "Simulation",
    "StaticLossScaler",
    "block_scales",
    "current_scale",
    "diagnose",
    "gradients",
    "has_inf_or_nan",
    "quantize_current",
    "scale_from_amax",
    "simulate",
    "trajectory",
]
