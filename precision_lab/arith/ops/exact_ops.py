"""The exact ops: ``neg abs minimum maximum`` and the six comparisons (no rounding beyond the
operands', which are put on the format's grid as every op does: see :mod:`.elementwise`).

Each is made by :func:`.call.unary_op` / :func:`.call.binary_op` from its one-line rule.

>>> import precision_lab as pl
>>> pl.ops.less([1.0, 2.0], [1.001, 3.0], "bf16").tolist()   # 1.001 is 1.0 in bf16
[False, True]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .call import BinaryOp, Call, binary_op, unary_op

__all__ = [
    "abs",
    "equal",
    "greater",
    "greater_equal",
    "less",
    "less_equal",
    "maximum",
    "minimum",
    "neg",
    "not_equal",
]


def _min_max(c: Call, a: np.ndarray, b: np.ndarray, smaller: bool) -> np.ndarray:
    m = np.minimum(a, b) if smaller else np.maximum(a, b)  # NaN propagates
    zeros = (a == 0) & (b == 0)
    if zeros.any():  # -0 < +0 (IEEE 754-2019 minimum / maximum)
        neg_zero = (np.signbit(a) | np.signbit(b)) if smaller else (np.signbit(a) & np.signbit(b))
        m = np.where(zeros, np.where(neg_zero, -0.0, 0.0), m)
    return c.round_values(m)


def _compare(
    x: Any, y: Any, fmt: Any, opts: tuple[str, str, str, int | None], ufunc: Any
) -> np.ndarray:
    """``ufunc(x, y)`` on the values in ``fmt`` (``opts``: rounding, overflow, subnormals,
    seed), a bool array of the broadcast shape."""
    c = Call.make(fmt, *opts, {"x": x, "y": y})
    a, b = c.vals
    return np.asarray(ufunc(a, b)).reshape(c.shape)


def _comparison(name: str, ufunc: Any, doc: str) -> BinaryOp:
    return binary_op(name, doc, lambda c, a, b: np.asarray(ufunc(a, b)).reshape(c.shape), __name__)


neg = unary_op(
    "neg",
    """``-x`` (exact).

    >>> import precision_lab as pl
    >>> pl.ops.neg([0.0, 1.5], "e4m3").tolist()
    [-0.0, -1.5]
    """,
    lambda c, a: c.round_values(-a),
    __name__,
)

abs = unary_op(
    "abs",
    """``|x|`` (exact).

    >>> import precision_lab as pl
    >>> pl.ops.abs([-0.0, -1.5], "e4m3").tolist()
    [0.0, 1.5]
    """,
    lambda c, a: c.round_values(np.abs(a)),
    __name__,
)

minimum = binary_op(
    "minimum",
    """Elementwise minimum (exact; NaN propagates; ``-0 < +0``).

    >>> import precision_lab as pl
    >>> pl.ops.minimum([0.0, 1.0], [-0.0, float("nan")], "bf16").tolist()
    [-0.0, nan]
    """,
    lambda c, a, b: _min_max(c, a, b, True),
    __name__,
)

maximum = binary_op(
    "maximum",
    """Elementwise maximum (exact; NaN propagates; ``-0 < +0``).

    >>> import precision_lab as pl
    >>> pl.ops.maximum([0.0, 1.0], [-0.0, 3.0], "bf16").tolist()
    [0.0, 3.0]
    """,
    lambda c, a, b: _min_max(c, a, b, False),
    __name__,
)

equal = _comparison(
    "equal",
    np.equal,
    """``x == y`` on the values in ``fmt`` (a bool array).

    >>> import precision_lab as pl
    >>> pl.ops.equal(1.0, 1.001, "bf16").tolist()   # both round to 1.0
    True
    """,
)
not_equal = _comparison("not_equal", np.not_equal, "``x != y`` on the values in ``fmt``.")
less = _comparison("less", np.less, "``x < y`` on the values in ``fmt``.")
less_equal = _comparison("less_equal", np.less_equal, "``x <= y`` on the values in ``fmt``.")
greater = _comparison("greater", np.greater, "``x > y`` on the values in ``fmt``.")
greater_equal = _comparison(
    "greater_equal", np.greater_equal, "``x >= y`` on the values in ``fmt``."
)
