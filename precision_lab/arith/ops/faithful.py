"""The faithful ops: ``exp log tanh rsqrt``, computed in float64 by numpy and rounded once to the
format (faithful, not correctly rounded: see :mod:`.elementwise`).

>>> import precision_lab as pl
>>> float(pl.ops.log(1.0, "e4m3"))
0.0
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .call import Call, unary_op

__all__ = ["exp", "log", "rsqrt", "tanh"]


def _faithful(func: Callable[[np.ndarray], np.ndarray]) -> Callable[[Call, np.ndarray], np.ndarray]:
    def compute(c: Call, a: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            v = func(a)
        return c.round_values(v)

    return compute


exp = unary_op(
    "exp",
    """``exp(x)``: float64 exp rounded once to ``fmt`` (faithful: see :mod:`.elementwise`).

    >>> import precision_lab as pl
    >>> float(pl.ops.exp(1.0, "bf16"))
    2.71875
    """,
    _faithful(np.exp),
    __name__,
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
)
