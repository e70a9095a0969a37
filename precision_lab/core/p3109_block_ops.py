"""The block reductions, dot product and elementwise block operations of the IEEE P3109 interim
report 4.0 (clauses 5.3-5.5), in exact arithmetic with one projection.

Every operation of the report's clause 5 decodes its blocks exactly (``ωBlockDecode``, 5.1.1:
``X_i = ωMultiply(S, x_i)``), computes on closed extended reals (the ``ω`` operations of clause
4: exact, with NaN and ±inf by their tables) and projects once at the end:

* ``BlockReduceAdd`` (5.3.1): ``r = Project(reduce(ωAdd, [0, X_1, ..., X_B]))``
  (:func:`p3109_block_reduce_add`);
* ``BlockReduceMultiply`` (5.3.1): ``r = Project(reduce(ωMultiply, [1, X_1, ..., X_B]))``
  (:func:`p3109_block_reduce_multiply`);
* ``BlockDotProduct`` (5.3.2): ``r = Project(reduce(ωAdd, [0, ωMultiply(X_1, Y_1), ...]))``
  (:func:`p3109_block_dot`);
* ``BlockOp`` (5.4): ``Z_i = ωOp(X_1i, ..., X_ni)``, then ``ωBlockProject`` (5.1.2) under the
  given result scale ``s_r``: ``r_i = Project(Z_i / S_r)`` (NaN where S_r or Z_i is NaN, 0
  where S_r = 0, ``sgn(Z_i) sgn(S_r)`` where S_r is infinite) (:func:`p3109_block_op`), for
  the arithmetic, sign, comparison and clamping ops (:data:`P3109_BLOCK_OPS`);
* ``ScaledOp`` (5.5): ``BlockOp`` on blocks of one element with ``s_r = 1``
  (:func:`p3109_scaled_op`).

``reduce(f, [x_1, ..., x_n])`` of clause 5 is a left fold; the report's ``ωAdd`` and
``ωMultiply`` are exact, so the order of the fold decides nothing except which NaN rule fires
(any NaN gives NaN; +inf and -inf together give NaN in a sum; 0 and ±inf together give NaN in a
product, whichever comes first): there is no intermediate rounding, no accumulator format and no
intermediate overflow. These functions compute the exact values with Python's rational numbers
(:class:`fractions.Fraction`; the values are taken exactly from float64) and are a reference:
10 to 30 microseconds per element (measured: 64 x 1024 Binary8p3se values, blocks
of 32, at load 6 on 2 cores: reduce_add 0.64 s, dot 1.3 s, block_op add 1.9 s).

Projection of an exact value: round to odd at float64's 53 bits (a finite value beyond float64's
range becomes ``±`` float64's max, beyond every P3109 format's range; one below float64's
subnormals becomes ``±2**-1074``), then :func:`~precision_lab.p3109_project`. Rounding to odd at
``P + 2`` or more bits and then to ``P`` bits is one correct rounding (Boldo & Melquiond), as in
:mod:`precision_lab.core.exact`: exact for every deterministic mode and every saturation mode, as
every P3109 format has at most 16 significant bits and a smallest subnormal of at least
``2**-1060`` (checked). Stochastic rounding with N random bits (``random_bits``) sees the
discarded fraction's first ``52 - P`` bits exactly and the rest as a sticky bit: exact for
``N <= 35``; with more bits (the default is 64) the probability of rounding away is off by at
most ``2**(P - 52)`` (inferred: the same bound as p3109_blocks' quotients; the core's rounding is
kept as the one rounding of the package rather than a second one on rationals).

``out_format`` must be a P3109 format (the report lets ``fr`` be any format, e.g. binary32 in
its annex D.2 example; :func:`~precision_lab.p3109_project` takes P3109 formats only, so that is
not here). Inputs are element and scale *values*, not codes, as the other block functions take
them (inferred: ``ωDecode`` of a code is ``pl.decode``; the operations need only the values, and
values that lie in no P3109 format are computed exactly all the same).

>>> s, x = [[2.0]], [[1.0, 2.0, -0.5, 4.0]]
>>> p3109_block_reduce_add(s, x, "p3109_k8p3se", block_size=4).tolist()  # 2 * 6.5 = 13 -> 12
[[12.0]]
>>> p3109_block_dot([[1.0]], [[1.0, 1.0]], [[0.5]], [[3.0, 0.25]], "p3109_k8p4se",
...                 block_size=2).tolist()
[[1.625]]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from .formats import FloatFormat, IntFormat, get_format
from .p3109_blocks import _blocked, _float_values, _scales, _unblocked
from .rounding import check_rounding, p3109_project

__all__ = [
    "P3109_BLOCK_OPS",
    "p3109_block_dot",
    "p3109_block_op",
    "p3109_block_reduce_add",
    "p3109_block_reduce_multiply",
    "p3109_scaled_op",
]

_INF, _NAN = math.inf, math.nan
_F64_MAX = float(np.finfo(np.float64).max)

#: an extended real: a finite Fraction, or a float ±inf / NaN
Ext = Fraction | float


def _ext(v: float) -> Ext:
    return v if not math.isfinite(v) else Fraction(v)


def _isnan(a: Ext) -> bool:
    return isinstance(a, float) and math.isnan(a)


def _isinf(a: Ext) -> bool:
    return isinstance(a, float) and math.isinf(a)


def _sgn(a: Ext) -> int:
    return int(a > 0) - int(a < 0)


def w_add(a: Ext, b: Ext) -> Ext:
    """ωAdd (report 4.0, 4.7): NaN in, NaN out; +inf + -inf is NaN; inf wins; else exact."""
    if _isnan(a) or _isnan(b):
        return _NAN
    if _isinf(a) and _isinf(b) and a != b:
        return _NAN
    if _isinf(a):
        return a
    if _isinf(b):
        return b
    return a + b


def w_subtract(a: Ext, b: Ext) -> Ext:
    """ωSubtract: ``ωAdd(a, -b)`` (the report's table is that)."""
    return w_add(a, w_negate(b))


def w_multiply(a: Ext, b: Ext) -> Ext:
    """ωMultiply: NaN in, NaN out; 0 times ±inf is NaN; ±inf with the product's sign; exact."""
    if _isnan(a) or _isnan(b):
        return _NAN
    if _isinf(a) or _isinf(b):
        sg = _sgn(a) * _sgn(b)
        return _NAN if sg == 0 else math.copysign(_INF, sg)
    return a * b


def w_divide(a: Ext, b: Ext) -> Ext:
    """ωDivide: NaN in, NaN out; inf/inf and anything/0 are NaN; inf/Y signed inf; X/inf 0."""
    if _isnan(a) or _isnan(b) or (_isinf(a) and _isinf(b)) or b == 0:
        return _NAN
    if _isinf(a):
        return math.copysign(_INF, _sgn(a) * _sgn(b))
    if _isinf(b):
        return Fraction(0)
    return Fraction(a) / Fraction(b)


def w_negate(a: Ext) -> Ext:
    """ωNegate."""
    return -a


def w_abs(a: Ext) -> Ext:
    """ωAbs."""
    return -a if a < 0 else a  # NaN: NaN


def w_fma(a: Ext, b: Ext, c: Ext) -> Ext:
    """ωFMA: the report says it behaves as ``ωAdd(ωMultiply(a, b), c)`` (4.7, FMA)."""
    return w_add(w_multiply(a, b), c)


def w_faa(a: Ext, b: Ext, c: Ext) -> Ext:
    """ωFAA: the report says it behaves as ``ωAdd(ωAdd(a, b), c)`` (4.10, FAA)."""
    return w_add(w_add(a, b), c)


def w_copysign(a: Ext, b: Ext) -> Ext:
    """ωCopySign: NaN in, NaN out; ``|a|`` where ``b >= 0`` (+inf included), else ``-|a|``."""
    if _isnan(a) or _isnan(b):
        return _NAN
    m = w_abs(a)
    return m if b >= 0 else -m


def w_minimum(a: Ext, b: Ext) -> Ext:
    """ωMinimum: NaN in, NaN out; else the lesser (on the extended reals)."""
    if _isnan(a) or _isnan(b):
        return _NAN
    return a if a < b else b


def w_maximum(a: Ext, b: Ext) -> Ext:
    """ωMaximum: NaN in, NaN out; else the greater."""
    if _isnan(a) or _isnan(b):
        return _NAN
    return b if a < b else a


def w_minimum_number(a: Ext, b: Ext) -> Ext:
    """ωMinimumNumber: a NaN operand is ignored (NaN only when both are)."""
    return b if _isnan(a) else a if _isnan(b) else w_minimum(a, b)


def w_maximum_number(a: Ext, b: Ext) -> Ext:
    """ωMaximumNumber: a NaN operand is ignored (NaN only when both are)."""
    return b if _isnan(a) else a if _isnan(b) else w_maximum(a, b)


def w_minimum_magnitude(a: Ext, b: Ext) -> Ext:
    """ωMinimumMagnitude: NaN in, NaN out; the lesser magnitude, ties by ωMinimum."""
    if _isnan(a) or _isnan(b):
        return _NAN
    ma, mb = w_abs(a), w_abs(b)
    return a if ma < mb else b if mb < ma else w_minimum(a, b)


def w_maximum_magnitude(a: Ext, b: Ext) -> Ext:
    """ωMaximumMagnitude: NaN in, NaN out; the greater magnitude, ties by ωMaximum."""
    if _isnan(a) or _isnan(b):
        return _NAN
    ma, mb = w_abs(a), w_abs(b)
    return a if ma > mb else b if mb > ma else w_maximum(a, b)


def w_minimum_magnitude_number(a: Ext, b: Ext) -> Ext:
    """ωMinimumMagnitudeNumber: a NaN operand is ignored."""
    return b if _isnan(a) else a if _isnan(b) else w_minimum_magnitude(a, b)


def w_maximum_magnitude_number(a: Ext, b: Ext) -> Ext:
    """ωMaximumMagnitudeNumber: a NaN operand is ignored."""
    return b if _isnan(a) else a if _isnan(b) else w_maximum_magnitude(a, b)


def w_minimum_finite(a: Ext, b: Ext) -> Ext:
    """ωMinimumFinite: NaN and infinite operands are ignored where the other is finite (a NaN
    where the other is anything); two infinities give ωMinimum."""
    if _isnan(a) or _isnan(b):
        return b if _isnan(a) else a
    if _isinf(a) != _isinf(b):
        return b if _isinf(a) else a
    return w_minimum(a, b)


def w_maximum_finite(a: Ext, b: Ext) -> Ext:
    """ωMaximumFinite: as ωMinimumFinite, with ωMaximum."""
    if _isnan(a) or _isnan(b):
        return b if _isnan(a) else a
    if _isinf(a) != _isinf(b):
        return b if _isinf(a) else a
    return w_maximum(a, b)


def w_clamp(x: Ext, lo: Ext, hi: Ext) -> Ext:
    """ωClamp: NaN if an operand is NaN, ``lo > hi``, ``hi = -inf`` or ``lo = +inf`` (but
    ``lo = hi = ±inf`` gives that infinity); else ``lo`` if ``x <= lo``, ``hi`` if ``x >= hi``,
    else ``x``."""
    if _isnan(x) or _isnan(lo) or _isnan(hi) or lo > hi:
        return _NAN
    if lo == hi and _isinf(lo):
        return lo
    if hi == -_INF or lo == _INF:
        return _NAN
    return lo if x <= lo else hi if x >= hi else x


#: the ωOps of clause 5.4 implemented here, with their arity
P3109_BLOCK_OPS: dict[str, tuple[int, Callable[..., Ext]]] = {
    "convert": (1, lambda a: a),
    "abs": (1, w_abs),
    "negate": (1, w_negate),
    "add": (2, w_add),
    "subtract": (2, w_subtract),
    "multiply": (2, w_multiply),
    "divide": (2, w_divide),
    "fma": (3, w_fma),
    "faa": (3, w_faa),
    "copysign": (2, w_copysign),
    "minimum": (2, w_minimum),
    "maximum": (2, w_maximum),
    "minimum_number": (2, w_minimum_number),
    "maximum_number": (2, w_maximum_number),
    "minimum_magnitude": (2, w_minimum_magnitude),
    "maximum_magnitude": (2, w_maximum_magnitude),
    "minimum_magnitude_number": (2, w_minimum_magnitude_number),
    "maximum_magnitude_number": (2, w_maximum_magnitude_number),
    "minimum_finite": (2, w_minimum_finite),
    "maximum_finite": (2, w_maximum_finite),
    "clamp": (3, w_clamp),
}


def _odd64(v: Ext) -> float:
    """``v`` rounded to odd at float64's 53 bits (its subnormals included), beyond float64's
    range ``±`` its max; NaN and ±inf as they are."""
    if not isinstance(v, Fraction):
        return float(v)
    if v == 0:
        return 0.0
    sg = -1.0 if v < 0 else 1.0  # (not float(v): it may be beyond float64)
    n, d = abs(v.numerator), v.denominator
    e = n.bit_length() - d.bit_length()  # floor(log2 |v|) is e or e - 1
    if (n << max(0, -e)) < (d << max(0, e)):
        e -= 1
    if e > 1023:
        return sg * _F64_MAX
    e = max(e, -1022)  # the subnormals' quantum 2**-1074 below that
    sh = 52 - e
    m, rem = divmod(n << sh, d) if sh >= 0 else divmod(n, d << -sh)
    if rem:
        m |= 1
    return sg * math.ldexp(m, e - 52)


def _project(
    vals: list[Ext],
    shape: tuple[int, ...],
    out_format: str | FloatFormat | IntFormat,
    rounding: str,
    saturation: str,
    seed: int | None,
    random_bits: int | None,
) -> np.ndarray:
    fr = _p3109_format(out_format)
    z = np.array([_odd64(v) for v in vals], dtype=np.float64).reshape(shape)
    return p3109_project(
        z, fr, rounding=rounding, saturation=saturation, seed=seed, random_bits=random_bits
    )


def _p3109_format(out_format: str | FloatFormat | IntFormat) -> FloatFormat:
    fr = get_format(out_format)
    if not isinstance(fr, FloatFormat) or fr.smallest_subnormal < 2.0**-1060:
        raise ValueError(f"out_format must be a P3109 format, got {fr}")
    return fr


def _decode_blocks(s: Any, x: Any, block_size: int, axis: int, name: str) -> list[list[Ext]]:
    """ωBlockDecode of every block: a list (blocks in C order) of lists of exact values."""
    xb = _blocked(_float_values(x, name), block_size, axis, name)
    sb = _scales(_float_values(s, "s" if name == "x" else f"s{name[-1:]}"), xb.shape, axis)
    sf = sb.reshape(-1).tolist()
    xf = xb.reshape(len(sf), block_size).tolist()
    return [[w_multiply(_ext(si), _ext(v)) for v in row] for si, row in zip(sf, xf, strict=True)]


def _block_shape(x: Any, block_size: int, axis: int) -> tuple[int, ...]:
    xb = _blocked(np.asarray(x), block_size, axis, "x")
    return tuple(xb.shape[:-1])


def _reduce(f: Callable[[Ext, Ext], Ext], init: Ext, xs: Sequence[Ext]) -> Ext:
    acc = init
    for v in xs:
        acc = f(acc, v)
    return acc


def _per_block(vals: list[Ext], bshape: tuple[int, ...], axis: int, **kw: Any) -> np.ndarray:
    r = _project(vals, bshape, **kw)
    return np.moveaxis(r, -1, axis)


def p3109_block_reduce_add(
    s: Any,
    x: Any,
    out_format: str | FloatFormat | IntFormat,
    *,
    block_size: int,
    axis: int = -1,
    rounding: str = "nearest_even",
    saturation: str = "sat_none",
    seed: int | None = None,
    random_bits: int | None = None,
) -> np.ndarray:
    """``BlockReduceAdd`` (report 4.0, 5.3.1): ``Project(S * (x_1 + ... + x_B))`` of each block,
    the sum exact and rounded once.

    ``R = reduce(ωAdd, [0, X_1, ..., X_B])`` with ``X_i = ωMultiply(S, x_i)``: NaN if an
    ``X_i`` is NaN (a NaN scale or element, or ``0 * inf``) or the block holds both +inf and
    -inf, else ±inf if it holds one, else the exact sum; then ``Project`` to ``out_format`` (a
    P3109 format) with ``rounding``, ``saturation``, ``seed``, ``random_bits`` as
    :func:`~precision_lab.p3109_project`. ``x``: element values, blocks along ``axis`` (a
    multiple of ``block_size`` long); ``s``: one scale per block. Returns one value per block
    (``s``'s shape).

    >>> p3109_block_reduce_add([[1.0]], [[np.inf, -np.inf]], "p3109_k8p3se", block_size=2)
    array([[nan]])
    """
    mode = check_rounding(rounding)
    blocks = _decode_blocks(s, x, block_size, axis, "x")
    vals = [_reduce(w_add, Fraction(0), b) for b in blocks]
    kw = {"rounding": mode, "saturation": saturation, "seed": seed, "random_bits": random_bits}
    return _per_block(vals, _block_shape(x, block_size, axis), axis, out_format=out_format, **kw)


def p3109_block_reduce_multiply(
    s: Any,
    x: Any,
    out_format: str | FloatFormat | IntFormat,
    *,
    block_size: int,
    axis: int = -1,
    rounding: str = "nearest_even",
    saturation: str = "sat_none",
    seed: int | None = None,
    random_bits: int | None = None,
) -> np.ndarray:
    """``BlockReduceMultiply`` (report 4.0, 5.3.1): ``Project((S x_1) (S x_2) ... (S x_B))`` of
    each block, the product exact and rounded once.

    Each element carries the scale (``X_i = S x_i``), so the product holds ``S**B``.
    ``R = reduce(ωMultiply, [1, X_1, ..., X_B])``: NaN if an ``X_i`` is NaN or the block holds
    both a zero and an infinity, else ±inf if it holds an infinity (the sign is the product of
    the signs), else the exact product. Options and shapes as :func:`p3109_block_reduce_add`.

    >>> p3109_block_reduce_multiply([[2.0]], [[1.5, -3.0]], "p3109_k8p3se", block_size=2).tolist()
    [[-16.0]]
    """
    mode = check_rounding(rounding)
    blocks = _decode_blocks(s, x, block_size, axis, "x")
    vals = [_reduce(w_multiply, Fraction(1), b) for b in blocks]
    kw = {"rounding": mode, "saturation": saturation, "seed": seed, "random_bits": random_bits}
    return _per_block(vals, _block_shape(x, block_size, axis), axis, out_format=out_format, **kw)


def p3109_block_dot(
    sx: Any,
    x: Any,
    sy: Any,
    y: Any,
    out_format: str | FloatFormat | IntFormat,
    *,
    block_size: int,
    axis: int = -1,
    rounding: str = "nearest_even",
    saturation: str = "sat_none",
    seed: int | None = None,
    random_bits: int | None = None,
) -> np.ndarray:
    """``BlockDotProduct`` (report 4.0, 5.3.2): ``Project(sum_i (Sx x_i) (Sy y_i))`` of each
    pair of blocks, exact and rounded once.

    ``P_i = ωMultiply(X_i, Y_i)`` and ``R = reduce(ωAdd, [0, P_1, ..., P_B])``: NaN if a
    ``P_i`` is NaN (a NaN operand, or a zero times an infinity, scales included) or the
    products hold both +inf and -inf, else ±inf if they hold one, else the exact sum. ``x`` and
    ``y`` have one shape (blocks along ``axis``); ``sx`` and ``sy`` one scale per block each.
    Options as :func:`p3109_block_reduce_add`; returns one value per pair of blocks.

    >>> p3109_block_dot([[1.0]], [[0.0, 1.0]], [[1.0]], [[np.inf, 1.0]], "p3109_k8p3se",
    ...                 block_size=2).tolist()
    [[nan]]
    """
    mode = check_rounding(rounding)
    xa, ya = np.asarray(x), np.asarray(y)
    if xa.shape != ya.shape:
        raise ValueError(f"x and y must have one shape, got {xa.shape} and {ya.shape}")
    bx = _decode_blocks(sx, xa, block_size, axis, "x")
    by = _decode_blocks(sy, ya, block_size, axis, "y")
    vals = [
        _reduce(w_add, Fraction(0), [w_multiply(a, b) for a, b in zip(u, v, strict=True)])
        for u, v in zip(bx, by, strict=True)
    ]
    kw = {"rounding": mode, "saturation": saturation, "seed": seed, "random_bits": random_bits}
    return _per_block(vals, _block_shape(xa, block_size, axis), axis, out_format=out_format, **kw)


def _block_project_value(z: Ext, s: Ext) -> Ext:
    """ωBlockProject's ``Z_i`` (5.1.2) before the projection: ``z`` under the scale ``s``."""
    if _isnan(s) or _isnan(z):
        return _NAN
    if s == 0:
        return Fraction(0)
    if _isinf(s):
        return Fraction(_sgn(z) * _sgn(s))
    return w_divide(z, s)


def p3109_block_op(
    op: str,
    operands: Sequence[tuple[Any, Any]],
    sr: Any,
    out_format: str | FloatFormat | IntFormat,
    *,
    block_size: int,
    axis: int = -1,
    rounding: str = "nearest_even",
    saturation: str = "sat_none",
    seed: int | None = None,
    random_bits: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``BlockOp`` (report 4.0, 5.4): ``(s_r, r)`` with ``r_i = Project(ωOp(X_1i, ..., X_ni)
    / S_r)``, each element's exact result divided exactly by the given result scale and rounded
    once.

    ``op``: one of :data:`P3109_BLOCK_OPS`: ``"convert"``, ``"abs"``, ``"negate"``,
    ``"add"``, ``"subtract"``, ``"multiply"``, ``"divide"``, ``"fma"``, ``"faa"``,
    ``"copysign"``, ``"minimum"``, ``"maximum"``, ``"minimum_number"``, ``"maximum_number"``,
    ``"minimum_magnitude"``, ``"maximum_magnitude"`` (and ``_number``), ``"minimum_finite"``,
    ``"maximum_finite"``, ``"clamp"`` (operands x, lo, hi). The report's elementary functions
    (Sqrt, Exp, Log, Sin ..., Softplus), Hypot and ArcTan2 are not here: their exact values are
    not rational.
    ``operands``: one ``(s, x)`` pair per operand (``x`` element values of one shape, blocks
    along ``axis``; ``s`` one scale per block); ``sr``: the result's scale per block (the report
    leaves its computation to the caller). ``X_ki = ωMultiply(S_k, x_ki)`` (5.1.1); the
    division is ωBlockProject's (5.1.2): NaN where ``S_r`` or ``Z_i`` is NaN, 0 where
    ``S_r = 0``, ``sgn(Z_i) sgn(S_r)`` where ``S_r`` is infinite. Options as
    :func:`p3109_block_reduce_add`. Returns ``s_r`` (as float64) and ``r`` (``x``'s shape).

    >>> sr, r = p3109_block_op("add", [([[1.0]], [[1.0, 3.0]]), ([[0.5]], [[1.0, 6.0]])],
    ...                        [[2.0]], "p3109_k8p3se", block_size=2)
    >>> sr.tolist(), r.tolist()
    ([[2.0]], [[0.75, 3.0]])
    """
    if op not in P3109_BLOCK_OPS:
        raise ValueError(f"op must be one of {', '.join(map(repr, P3109_BLOCK_OPS))}, got {op!r}")
    arity, f = P3109_BLOCK_OPS[op]
    if len(operands) != arity:
        raise ValueError(f"op {op!r} takes {arity} operands, got {len(operands)}")
    mode = check_rounding(rounding)
    xs = [np.asarray(x) for _, x in operands]
    if any(a.shape != xs[0].shape for a in xs):
        raise ValueError(f"operands' x must have one shape, got {[a.shape for a in xs]}")
    dec = [_decode_blocks(s, x, block_size, axis, "x") for s, x in operands]
    xb = _blocked(_float_values(xs[0], "x"), block_size, axis, "x")
    srb = _scales(_float_values(sr, "sr"), xb.shape, axis).reshape(-1).tolist()
    vals: list[Ext] = []
    for j, srj in enumerate(srb):
        for i in range(block_size):
            z = f(*(d[j][i] for d in dec))
            vals.append(_block_project_value(z, _ext(srj)))
    r = _project(vals, tuple(xb.shape), out_format, mode, saturation, seed, random_bits)
    return np.asarray(sr, dtype=np.float64), _unblocked(r, axis)


def p3109_scaled_op(
    op: str,
    operands: Sequence[tuple[Any, Any]],
    out_format: str | FloatFormat | IntFormat,
    *,
    rounding: str = "nearest_even",
    saturation: str = "sat_none",
    seed: int | None = None,
    random_bits: int | None = None,
) -> np.ndarray:
    """``ScaledOp`` (report 4.0, 5.5): ``BlockOp`` on blocks of one element with result scale
    1, i.e. ``r = Project(ωOp(S_1 x_1, ..., S_n x_n))`` elementwise.

    ``operands``: ``(s, x)`` pairs of one shape (a scale per element). Options as
    :func:`p3109_block_op`.

    >>> p3109_scaled_op("multiply", [(4.0, 1.5), (0.5, 3.0)], "p3109_k8p3se").tolist()  # 9 -> 8
    8.0
    """
    xs = [np.asarray(x, dtype=np.float64) for _, x in operands]
    ss = [np.asarray(s, dtype=np.float64) for s, _ in operands]
    if any(a.shape != xs[0].shape for a in xs + ss):
        raise ValueError(
            f"every scale and element must have one shape, got {[a.shape for a in ss + xs]}"
        )
    shape = xs[0].shape
    _, r = p3109_block_op(
        op,
        [(s.reshape(-1), x.reshape(-1)) for s, x in zip(ss, xs, strict=True)],
        np.ones(xs[0].size),
        out_format,
        block_size=1,
        rounding=rounding,
        saturation=saturation,
        seed=seed,
        random_bits=random_bits,
    )
    return r.reshape(shape)
