"""The faithful ops: ``exp log tanh rsqrt``, computed in float64 by numpy and rounded once to the
format (faithful, not correctly rounded: see :mod:`.elementwise`).

>>> import precision_lab as pl
>>> float(pl.ops.log(1.0, "e4m3"))
0.0
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...core.exact import round_scaled
from .call import Call, unary_op

__all__ = ["exp", "log", "rsqrt", "tanh"]


def _faithful(func: Callable[[np.ndarray], np.ndarray]) -> Callable[[Call, np.ndarray], np.ndarray]:
    def compute(c: Call, a: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            v = func(a)
        return c.round_values(v)

    return compute


#: ln 2 split for Cody and Waite's reduction: _LN2_HI has 32 significant bits (k * _LN2_HI is
#: exact for |k| < 2**21), _LN2_HI + _LN2_LO is ln 2 to about 2**-86 (fdlibm's constants)
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10


def _exp(c: Call, a: np.ndarray) -> np.ndarray:
    """float64 exp where it is a normal float64; elsewhere ``exp(x) = m * 2**k`` with
    ``k = rint(x / ln 2)`` and ``m = exp(x - k ln 2)`` (Cody-Waite reduction, relative error
    below ``2**-50``), rounded at its real magnitude by
    :func:`~precision_lab.core.exact.round_scaled`: so every mode sees the right side of the
    format's overflow and underflow thresholds, which float64 exp's inf and 0 would hide."""
    with np.errstate(all="ignore"):
        v = np.exp(a)
    out = c.round_values(v)
    far = np.flatnonzero(np.isfinite(a) & (np.abs(a) > 700.0))
    if far.size:
        x = np.clip(a[far], -2000.0, 2000.0)  # beyond: every format's result is the same
        k = np.rint(x / np.log(2.0))
        r = (x - k * _LN2_HI) - k * _LN2_LO
        words = c.words()
        res = round_scaled(
            np.exp(r),
            np.zeros(far.size),
            k.astype(np.int64),
            c.rounder,
            None if words is None else words[far],
        )
        out.reshape(-1)[far] = res
    return out


exp = unary_op(
    "exp",
    """``exp(x)``: float64 exp rounded once to ``fmt`` (faithful: see :mod:`.elementwise`).

    >>> import precision_lab as pl
    >>> float(pl.ops.exp(1.0, "bf16"))
    2.71875
    """,
    _exp,
    __name__,
    own_words=False,
)

log = unary_op(
    "log",
    """Natural logarithm: float64 log rounded once to ``fmt`` (faithful).

    >>> import precision_lab as pl
    >>> float(pl.ops.log(2.0, "fp16"))
    0.693359375
    """,
    _faithful(np.log),
    __name__,
    own_words=False,
)

tanh = unary_op(
    "tanh",
    """``tanh(x)``: float64 tanh rounded once to ``fmt`` (faithful).

    >>> import precision_lab as pl
    >>> float(pl.ops.tanh(0.5, "e4m3"))
    0.46875
    """,
    _faithful(np.tanh),
    __name__,
    own_words=False,
)

rsqrt = unary_op(
    "rsqrt",
    """``1 / sqrt(x)``: computed in float64 (two roundings there) and rounded once (faithful).

    >>> import precision_lab as pl
    >>> float(pl.ops.rsqrt(4.0, "bf16"))
    0.5
    """,
    _faithful(lambda v: 1.0 / np.sqrt(v)),
    __name__,
    own_words=False,
)
