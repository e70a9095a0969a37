"""Arithmetic in a format: elementwise operations and reductions, each result rounded by the core.

* :mod:`.elementwise`: the semantics of the elementwise ops, and their names:
  :mod:`.correctly_rounded` (``add sub mul div fma sqrt reciprocal``), :mod:`.exact_ops`
  (``neg abs minimum maximum`` and the comparisons), :mod:`.faithful` (``exp log tanh
  rsqrt``), on the shared machinery of :mod:`.call` (operands on the grid, one rounding of an
  exact result, chunks, the ``unary_op``/``binary_op`` factories) and :mod:`.fast_paths`
  (compiled and float32 paths). A new op is a compute function and one factory call (or, with
  a fast path, a function) in the module of its kind.
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
