"""Analysis: what a format does to a population of values, and rounding-error bounds.

Holds :mod:`.measures` (``underflow_stats``, ``pick_loss_scale``, ``error_stats``, the
analytic zero fraction, ``gamma_n`` and ``sqrt_n_u``) and :mod:`.bounds` (deterministic and
probabilistic bounds of sums, dot products and solves, condition numbers, backward errors,
repeated trials against exact rational references).

May import: :mod:`precision_lab.core` only (the bounds are computed from a format's unit
roundoff; the exact references use ``fractions``). :mod:`precision_lab.scaling` beside it does
not import it, nor does it import scaling.

Where a new thing goes: a new statistic of a population of values under a format into
:mod:`.measures`; a new error bound or exact reference into :mod:`.bounds`.

>>> import precision_lab as pl
>>> pl.analysis.gamma_n(10, "fp16") > 10 * 2.0**-11
True
"""

from .bounds import (
    TrialStats,
    backward_error_dot,
    backward_error_solve,
    cond_dot,
    cond_sum,
    deterministic_bound,
    exact_dot,
    exact_solve,
    gamma_tilde,
    probability_p,
    probability_q,
    run_trials,
)
from .measures import (
    ErrorStats,
    LossScaleChoice,
    QuantError,
    UnderflowStats,
    analytic_zero_fraction,
    error_stats,
    gamma_n,
    pick_loss_scale,
    quant_error,
    sqrt_n_u,
    underflow_stats,
    zero_threshold,
)

__all__ = [
    "ErrorStats",
    "LossScaleChoice",
    "QuantError",
    "TrialStats",
    "UnderflowStats",
    "analytic_zero_fraction",
    "backward_error_dot",
    "backward_error_solve",
    "cond_dot",
    "cond_sum",
    "deterministic_bound",
    "error_stats",
    "exact_dot",
    "exact_solve",
    "gamma_n",
    "gamma_tilde",
    "pick_loss_scale",
    "probability_p",
    "probability_q",
    "quant_error",
    "run_trials",
    "sqrt_n_u",
    "underflow_stats",
    "zero_threshold",
]
