"""Elementwise arithmetic in a format: every result rounded once, by the rounding core.

This module states the semantics and exports the ops; the code lives in :mod:`.call` (the
machinery every op shares: operands on the grid, one rounding of an exact result),
:mod:`.fast_paths` (the compiled and float32 paths of add/sub/mul/fma),
:mod:`.correctly_rounded`, :mod:`.exact_ops` and :mod:`.faithful` (the ops of each kind).

Semantics (the same for every function here):

* **Operands** are values of the format: each operand is first put on ``fmt``'s grid by
  :func:`~precision_lab.round_to` (``nearest_even``, with the call's ``overflow`` and
  ``subnormals`` switches; infinities stay infinite where the format has them). That is a
  no-op for operands already on the grid, the usual case (results of earlier ops,
  :class:`~precision_lab.Emulated` arrays); an off-grid operand is converted exactly as
  storing it in the format would.
* **Correctly rounded** (``add``, ``sub``, ``mul``, ``div``, ``fma``, ``sqrt``,
  ``reciprocal``): the exact real result of the operation on those values is rounded once,
  in every mode (``odd`` and ``stochastic`` included), with the core's overflow and subnormal
  rules. How the exact result reaches the core: it is held as a float64 pair ``s + t`` (``s``
  a float64 neighbour of it, ``t`` the exact error or, for ``/`` and sqrt, a float64 with
  the sign of the exact remainder), collapsed by round-to-odd to 53 bits (exact for targets of
  at most 51 significant bits: Boldo & Melquiond) and rounded by
  :func:`~precision_lab.round_to` (:func:`precision_lab.core.exact.round_sum`, the helper the
  GEMM models use). Products of operands of at most 26 significant bits are exact in float64,
  other products use Dekker's exact product; sums use TwoSum; the remainder of ``x / y`` and
  ``sqrt(x)`` is exact (Dekker's product and Sterbenz's lemma). Stochastic rounding of ``/``
  and sqrt takes the exact discarded fraction from integer arithmetic (a slower path, about a
  microsecond per element).
* **Exact** (no rounding beyond the operands'): ``neg``, ``abs``, ``minimum``, ``maximum`` and
  the comparisons.
* **Faithful, not correctly rounded** (``exp``, ``log``, ``tanh``, ``rsqrt``): computed in
  float64 by numpy (error below 4 float64 ulps, relative error below ``2**-50``) and then
  rounded once to ``fmt``. The result is the correct rounding of the exact value unless that
  lies within ``2**-50`` (relative) of a rounding boundary of ``fmt``; its error is below one
  ulp of ``fmt`` plus ``2**-50`` relative (half an ulp plus ``2**-50`` under round-to-nearest).
  ``exp`` of ``|x| > 700`` is ``m * 2**k`` by Cody-Waite reduction, rounded at its real
  magnitude, so directed modes see the right side of the overflow and underflow thresholds
  (``exp(1000, "bf16", rounding="toward_zero")`` is bf16's max, not inf).
* **Special values** follow IEEE 754: NaN propagates, ``inf - inf``, ``0 * inf``, ``0 / 0``
  and ``sqrt(-1)`` are NaN, ``x / 0`` is a signed infinity; infinite results then go through
  the core like any value (NaN in formats without inf, ``±max`` under ``overflow="saturate"``).
  An exact zero sum (``x + (-x)``, ``(+0) + (-0)``, an fma that cancels) is ``+0`` in every
  mode except ``down``, where it is ``-0``; ``(-0) + (-0)`` is ``-0``.
* **Stochastic rounding** uses the random word of each element's flat index (C order over the
  broadcast shape) keyed by ``seed``, as :func:`~precision_lab.round_to` does.
* **Formats**: any float format of at most 51 significant bits, and fp64. For fp64 and formats
  beyond fp32's range, ``*``, ``/`` and fma work on the operands' significands and scale by
  powers of two (exact), so their results are correctly rounded at any magnitude, beyond
  float64's range on either side included (:func:`precision_lab.core.exact.round_scaled`:
  ``mul(1e300, 1e10, "fp64", rounding="toward_zero")`` is fp64's max, ``mul(2**-600,
  2**-600, "fp64", rounding="up")`` its smallest subnormal). One case is refused
  (ValueError) rather than rounded twice: stochastic rounding of a quotient outside
  ``[2**-900, 2**1000]`` in such a format. add, sub and sqrt have no limit (a sum beyond
  float64's range is rounded at half scale).
* **Formats without -0** (fnuz, P3109): an exact zero result is ``+0`` in every mode, on both
  backends (``sub(1, 1, "p3109_k8p3se", rounding="down")`` is ``+0``: there is no ``-0``).
* **Inputs**: numpy arrays, Python and numpy scalars, nested lists, and any array
  :func:`precision_lab.core.inputs.as_numpy` takes (DLPack and array-API arrays: torch
  tensors, bfloat16 ones included); integer and boolean operands are rounded to ``fmt``
  exactly, as :func:`~precision_lab.round_to` does. The results are numpy arrays.

Backends: where the compiled extension is active (:func:`precision_lab.backend_info`),
``add``, ``sub``, ``mul``, ``fma``, ``div``, ``reciprocal`` and ``sqrt`` of arrays of float32
values (float32, float16,
ml_dtypes floats such as bfloat16) to a format whose values fit in float32 run in C++
(:func:`precision_lab.backends.native.elementwise`, the same bits as the numpy path, stochastic
words included); everything else, and ``PRECISION_LAB_BACKEND=numpy``, runs the numpy code here.

Results are float32 arrays when the format's values fit in float32 and no operand is float64
(Python floats are float64) or integer (Python ints are int64; as round_to, whose result for
integers is float64), else float64.

>>> import precision_lab as pl
>>> float(pl.ops.add(1.0, 2.0**-9, "bf16", rounding="up"))
1.0078125
>>> float(pl.ops.fma(1.0 + 2**-7, 1.0 - 2**-7, -1.0, "bf16"))  # exact -2**-14: single rounding
-6.103515625e-05
>>> float(pl.ops.sub(1.0, 1.0, "fp16", rounding="down"))
-0.0
"""

from __future__ import annotations

from .call import Call as Call
from .call import float_format as float_format
from .correctly_rounded import add, div, fma, mul, reciprocal, sqrt, sub
from .exact_ops import (
    _compare as _compare,
)
from .exact_ops import (
    abs,
    equal,
    greater,
    greater_equal,
    less,
    less_equal,
    maximum,
    minimum,
    neg,
    not_equal,
)
from .faithful import exp, log, rsqrt, tanh
from .fast_paths import _float32_path as _float32_path
from .fast_paths import _native_path as _native_path

__all__ = [
    "abs",
    "add",
    "div",
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
    "tanh",
]
