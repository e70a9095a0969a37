"""Arithmetic in a format: elementwise operations and reductions, each result rounded by the core.

* :mod:`.elementwise`: ``add sub mul div fma sqrt reciprocal`` (correctly rounded), ``neg abs
  minimum maximum`` and comparisons (exact), ``exp log tanh rsqrt`` (faithful).
* :mod:`.reductions`: ``sum dot cumsum`` along an axis with any
  :class:`~precision_lab.Accumulator`.

Special values follow IEEE 754: NaN operands give NaN, the sign of a NaN result of arithmetic is
unspecified (IEEE 754-2019 6.3; it may differ between the numpy and native backends, as it does
between numpy's own SIMD and scalar loops), and signs of zero follow the standard's rules.

>>> import precision_lab as pl
>>> float(pl.ops.add(1.0, 2.0**-8, "bf16")), float(pl.ops.add(1.0, 2.0**-8, "bf16", rounding="up"))
(1.0, 1.0078125)
"""

from .elementwise import (
    abs,
    add,
    div,
    equal,
    exp,
    fma,
    greater,
    greater_equal,
    less,
    less_equal,
    log,
    maximum,
    minimum,
    mul,
    neg,
    not_equal,
    reciprocal,
    rsqrt,
    sqrt,
    sub,
    tanh,
)
from .reductions import cumsum, dot, sum

__all__ = [
    "abs",
    "add",
    "cumsum",
    "div",
    "dot",
    "equal",
    "exp",
    "fma",
    "greater",
    "greater_equal",
    "less",
    "less_equal",
    "log",
    "maximum",
    "minimum",
    "mul",
    "neg",
    "not_equal",
    "reciprocal",
    "rsqrt",
    "sqrt",
    "sub",
    "sum",
    "tanh",
]
