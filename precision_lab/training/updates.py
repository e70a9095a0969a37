"""Weight-update rules: how ``w <- w + delta`` is stored (Zamirai et al. 2020).

``"fp32"`` keeps fp32 master weights (the usual mixed-precision recipe: the model's own
``master_format`` store). The ``bf16_*`` rules keep the weights themselves in bf16 and round the
*exact* sum ``w + delta`` (``delta`` the float32 optimizer step) once to bf16:

* ``"bf16_rn"``: round to nearest even. An update smaller than half an ulp of ``w`` is lost
  (the stagnation that makes pure-bf16 training lag fp32).
* ``"bf16_sr"``: stochastic rounding, unbiased: ``E[w'] = w + delta``. The random words are
  keyed by (seed, flat index) as everywhere in precision_lab; the caller gives one seed per
  tensor and step.
* ``"bf16_kahan"``: Kahan-compensated update with a bf16 compensation buffer ``c``, every
  operation rounded to nearest even in bf16: ``y = delta - c``, ``s = w + y``,
  ``c = (s - w) - y``, ``w = s``. What rounding loses is carried to the next step.

Each bf16 operation is a single rounding of the exact result (the TwoSum pair of the two
operands, :func:`precision_lab.core.exact.round_sum`), whatever the operands' exponent gap.

>>> import numpy as np
>>> w, d = np.ones(1, np.float32), np.full(1, 1e-3, np.float32)
>>> apply_update("bf16_rn", w, d)[0].tolist()        # below half an ulp of 1: lost
[1.0]
>>> w2, c = apply_update("bf16_kahan", w, d, np.zeros(1, np.float32))
>>> w2.tolist(), float(c[0]) != 0.0                    # lost now, kept in c
([1.0], True)
"""

from __future__ import annotations

import numpy as np

from ..core.exact import Rounder, round_sum, two_sum
from ..core.formats import FloatFormat
from ..core.rounding import check_options

__all__ = ["WEIGHT_UPDATES", "apply_update", "bf16_add"]

#: the weight-update rules of :class:`~precision_lab.training.TrainConfig` ``weight_update``
WEIGHT_UPDATES = ("fp32", "bf16_rn", "bf16_sr", "bf16_kahan")

_BF16 = FloatFormat(exponent_bits=8, mantissa_bits=7, name="bf16")


def bf16_add(
    a: np.ndarray, b: np.ndarray, *, rounding: str = "nearest_even", seed: int = 0
) -> np.ndarray:
    """``a + b`` (float arrays of one shape) rounded once to bf16 from the exact sum; float32.

    Stochastic rounding draws the words of flat indices ``0 .. a.size - 1`` under ``seed``.

    >>> float(bf16_add(np.float32([1.0]), np.float32([2.0**-9]), rounding="up")[0])
    1.0078125
    """
    o = check_options(rounding, "ieee", "keep", seed, None)
    s, t = two_sum(np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel())
    r = Rounder(_BF16, o.mode, seed=o.seed, random_bits=o.random_bits)
    out = round_sum(s, t, r, o.words(s.size, 0))
    return out.astype(np.float32).reshape(np.shape(a))


def apply_update(
    rule: str,
    w: np.ndarray,
    delta: np.ndarray,
    comp: np.ndarray | None = None,
    *,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(new weights, new compensation)`` of ``w + delta`` under ``rule`` (one of
    :data:`WEIGHT_UPDATES`; ``comp`` is the Kahan buffer, None for the other rules, which
    return None for it). ``w`` holds bf16 values for the ``bf16_*`` rules; float32 arrays.

    >>> w, d = np.ones(4, np.float32), np.full(4, 1e-3, np.float32)
    >>> apply_update("fp32", w, d)[0].tolist() == (w + d).tolist()
    True
    """
    if rule == "fp32":
        return (w + delta).astype(np.float32), comp
    if rule == "bf16_rn":
        return bf16_add(w, delta), comp
    if rule == "bf16_sr":
        return bf16_add(w, delta, rounding="stochastic", seed=seed), comp
    if rule == "bf16_kahan":
        c = np.zeros_like(w) if comp is None else comp
        y = bf16_add(delta, -c)
        s = bf16_add(w, y)
        # s - w in float64: exact unless the two are more than 45 binades apart
        c = bf16_add(s.astype(np.float64) - w, -y)
        return s, c
    raise ValueError(f"weight_update must be one of {WEIGHT_UPDATES}, got {rule!r}")
