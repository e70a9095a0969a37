"""Rounding-error analysis: probabilistic bounds, backward errors, condition numbers, trials.

Probabilistic bounds (Higham & Mary, "A new approach to probabilistic rounding error analysis",
SIAM J. Sci. Comput. 41(5), 2019). Model: the relative rounding errors ``delta_k`` of a
computation are independent random variables of mean zero with ``|delta_k| <= u``. Then

* (their Theorem 2.4) ``prod_{k=1}^n (1 + delta_k) = 1 + theta_n`` with
  ``|theta_n| <= gamma_tilde(n, u, lam) = exp(lam sqrt(n) u + n u^2 / (1 - u)) - 1`` holds with
  probability at least ``P(lam, u) = 1 - 2 exp(-lam^2 (1 - u)^2 / 2)``;
* (their Theorem 3.1) a computed inner product of length n satisfies
  ``|s_hat - s| <= gamma_tilde(n, u, lam) sum |x_i y_i|`` with probability at least
  ``Q(lam, n, u) = 1 - n (1 - P(lam, u))``.

``gamma_tilde`` is ``lam sqrt(n) u + O(u^2)`` where the deterministic ``gamma_n = n u / (1 - n u)``
(:func:`precision_lab.analysis.gamma_n`) is ``n u``. Stochastic rounding (Connolly, Higham &
Mary, "Stochastic rounding and its probabilistic backward error analysis", SIAM J. Sci.
Comput. 43(1), 2021) satisfies the mean-zero hypothesis by construction (no independence is
needed: the errors form a martingale), with ``|delta_k| <= 2u`` (one spacing, not half):
:func:`gamma_tilde` with ``u`` replaced by ``2u`` bounds SR results with the same probability,
and for any data, not only random data. Round-to-nearest meets the model only for random-like
data (a harmonic series or a stagnating sum violates it).

>>> round(gamma_tilde(1024, 2.0**-8, 1.0), 6), round(probability_q(6.0, 1024, 2.0**-8), 6)
(0.151063, 0.999964)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ..core.formats import FloatFormat, get_format
from .measures import gamma_n

__all__ = [
    "TrialStats",
    "backward_error_dot",
    "backward_error_solve",
    "cond_dot",
    "cond_sum",
    "deterministic_bound",
    "exact_dot",
    "exact_solve",
    "gamma_n",
    "gamma_tilde",
    "probability_p",
    "probability_q",
    "run_trials",
]


def _unit_roundoff(u: float | str | FloatFormat) -> float:
    if isinstance(u, str | FloatFormat):
        f = get_format(u)
        if not isinstance(f, FloatFormat):
            raise ValueError(f"u must be a number or a float format, got integer format {f}")
        return f.unit_roundoff
    uu = float(u)
    if not 0 < uu < 1:
        raise ValueError(f"u must be a unit roundoff in (0, 1), got {u!r}")
    return uu


def _check(n: int, lam: float) -> None:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if not (math.isfinite(lam) and lam > 0):
        raise ValueError(f"lam must be a positive finite number, got {lam!r}")


def gamma_tilde(n: int, u: float | str | FloatFormat, lam: float) -> float:
    """Higham-Mary probabilistic constant ``exp(lam sqrt(n) u + n u^2/(1-u)) - 1``.

    ``u``: a unit roundoff or a format (its ``unit_roundoff``; pass ``2 * u`` for stochastic
    rounding). ``inf`` where the exponent overflows (the bound says nothing), like
    :func:`gamma_n` for ``n u >= 1``.

    >>> round(gamma_tilde(100, "fp16", 1.0), 8)   # about sqrt(100) * 2**-11
    0.00491872
    >>> gamma_tilde(10**30, "fp16", 1.0)
    inf
    """
    _check(n, lam)
    uu = _unit_roundoff(u)
    try:  # a huge n: the bound is inf (as gamma_n's), not an OverflowError
        nf = float(n)
        return math.expm1(lam * math.sqrt(nf) * uu + nf * uu * uu / (1 - uu))
    except OverflowError:
        return math.inf


def probability_p(lam: float, u: float | str | FloatFormat) -> float:
    """``P(lam) = 1 - 2 exp(-lam^2 (1-u)^2 / 2)``: probability that ``|theta_n| <=
    gamma_tilde(n, u, lam)`` for a product of n factors ``1 + delta_k`` (Higham & Mary 2019).

    >>> round(probability_p(3.0, "bf16"), 6)
    0.976989
    """
    _check(1, lam)
    uu = _unit_roundoff(u)
    return 1.0 - 2.0 * math.exp(-(lam**2) * (1 - uu) ** 2 / 2)


def probability_q(lam: float, n: int, u: float | str | FloatFormat) -> float:
    """``Q(lam, n) = 1 - n (1 - P(lam))``: probability that the inner-product bound with
    :func:`gamma_tilde` holds (Higham & Mary 2019, Theorem 3.1). May be negative (no
    information) for small ``lam``.

    >>> round(probability_q(5.0, 1000, "fp16"), 6)
    0.992455
    """
    _check(n, lam)
    miss = 1.0 - probability_p(lam, u)
    try:
        return 1.0 - float(n) * miss
    except OverflowError:  # n beyond float: no information unless P is exactly 1
        return 1.0 if miss == 0 else -math.inf


# ----- exact reference values ------------------------------------------------------------------
def _check_finite(a: np.ndarray, name: str, what: str) -> None:
    """ValueError naming the argument and the first NaN or inf of ``a`` (no exact value)."""
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{what} needs finite {name}: {name}[{i}] is {float(a[i])!r} ({bad.size} non-finite "
            "entries); NaN and inf have no exact value"
        )


def _finite(*arrays: np.ndarray) -> bool:
    return all(bool(np.isfinite(a).all()) for a in arrays)


def exact_dot(x: Any, y: Any) -> Fraction:
    """The exact inner product of two float vectors, as a Fraction. ValueError naming the entry
    for NaN or inf (they have no exact value).

    >>> exact_dot([0.1, 0.2], [3.0, 1.0]) == Fraction(0.1) * 3 + Fraction(0.2)
    True
    """
    xa = np.asarray(x, dtype=np.float64).reshape(-1)
    ya = np.asarray(y, dtype=np.float64).reshape(-1)
    if xa.shape != ya.shape:
        raise ValueError(f"x and y must have the same length, got {xa.size} and {ya.size}")
    _check_finite(xa, "x", "exact_dot")
    _check_finite(ya, "y", "exact_dot")
    return sum(
        (Fraction(a) * Fraction(b) for a, b in zip(xa.tolist(), ya.tolist(), strict=True)),
        Fraction(0),
    )


def cond_sum(x: Any) -> float:
    """Condition number of a sum: ``sum |x_i| / |sum x_i|`` (exact sums; inf for a zero sum;
    NaN when an ``x_i`` is NaN or inf, as from an overflowed low-precision run: no condition
    number is defined there).

    >>> cond_sum([1.0, -1.0, 1e-8])
    200000001.0
    >>> cond_sum([1.0, float("inf")])
    nan
    """
    xa = np.asarray(x, dtype=np.float64).reshape(-1)
    if not _finite(xa):
        return math.nan
    s = sum((Fraction(v) for v in xa.tolist()), Fraction(0))
    a = sum((Fraction(abs(v)) for v in xa.tolist()), Fraction(0))
    return math.inf if s == 0 else float(a / abs(s))


def cond_dot(x: Any, y: Any) -> float:
    """Condition number of an inner product, ``2 sum |x_i y_i| / |x^T y|`` (Ogita, Rump &
    Oishi 2005; perturbations in both x and y). Exact sums; inf for a zero product; NaN when
    an entry is NaN or inf.

    >>> cond_dot([1.0, 1.0], [1.0, -1.0 + 2**-20])
    4194302.0
    """
    xa = np.asarray(x, dtype=np.float64).reshape(-1)
    ya = np.asarray(y, dtype=np.float64).reshape(-1)
    if xa.shape == ya.shape and not _finite(xa, ya):
        return math.nan
    s = exact_dot(xa, ya)
    a = exact_dot(np.abs(xa), np.abs(ya))
    return math.inf if s == 0 else float(2 * a / abs(s))


def backward_error_dot(s_hat: float, x: Any, y: Any) -> float:
    """Componentwise relative backward error of a computed inner product:
    ``|s_hat - x^T y| / sum |x_i y_i|`` (the smallest ``eps`` with ``s_hat = sum x_i y_i (1 +
    d_i)``, ``|d_i| <= eps``). Exact arithmetic; 0 for an exact result. A computed result
    that overflowed (``s_hat`` = ±inf) has an infinite backward error, a NaN result a NaN one,
    and so do NaN or inf data (NaN: no backward error is defined).

    >>> backward_error_dot(1.0, [1.0, 1.0], [1.0, 2.0**-9])   # lost 2**-9 out of 1 + 2**-9
    0.001949317738791423
    >>> backward_error_dot(float("inf"), [1.0], [2.0])
    inf
    """
    xa = np.asarray(x, dtype=np.float64).reshape(-1)
    ya = np.asarray(y, dtype=np.float64).reshape(-1)
    if xa.shape == ya.shape and not _finite(xa, ya):
        return math.nan
    if not math.isfinite(float(s_hat)):
        return math.nan if math.isnan(float(s_hat)) else math.inf
    a = exact_dot(np.abs(xa), np.abs(ya))
    err = abs(Fraction(float(s_hat)) - exact_dot(xa, ya))
    if err == 0:
        return 0.0
    return math.inf if a == 0 else float(err / a)


def backward_error_solve(A: Any, x_hat: Any, b: Any) -> float:
    """Normwise backward error of a computed solution of ``A x = b`` (Rigal & Gaches):
    ``||b - A x_hat||_inf / (||A||_inf ||x_hat||_inf + ||b||_inf)``, the residual exact.
    An overflowed solution (an inf in ``x_hat``, no NaN) gives inf; a NaN in ``x_hat`` gives
    NaN, and so do NaN or inf in ``A`` or ``b`` (no backward error is defined).

    >>> backward_error_solve([[2.0, 0.0], [0.0, 4.0]], [0.5, 0.25], [1.0, 1.0])
    0.0
    >>> backward_error_solve([[2.0]], [float("inf")], [1.0])
    inf
    """
    Am = np.asarray(A, dtype=np.float64)
    xv = np.asarray(x_hat, dtype=np.float64).reshape(-1)
    bv = np.asarray(b, dtype=np.float64).reshape(-1)
    if Am.ndim != 2 or Am.shape != (bv.size, xv.size):
        raise ValueError(
            f"A must be {bv.size} x {xv.size} for b of length {bv.size} and x_hat of length "
            f"{xv.size}, got shape {Am.shape}"
        )
    if not _finite(Am, bv) or np.isnan(xv).any():
        return math.nan
    if not _finite(xv):
        return math.inf
    r = max(
        (abs(Fraction(float(bv[i])) - exact_dot(Am[i], xv)) for i in range(bv.size)),
        default=Fraction(0),
    )
    norm_a = max((math.fsum(np.abs(row).tolist()) for row in Am), default=0.0)
    denom = Fraction(norm_a) * Fraction(float(np.max(np.abs(xv), initial=0.0))) + Fraction(
        float(np.max(np.abs(bv), initial=0.0))
    )
    if r == 0:
        return 0.0
    return math.inf if denom == 0 else float(r / denom)


def exact_solve(A: Any, b: Any) -> list[Fraction]:
    """The exact solution of ``A x = b`` (float entries taken exactly), by Gaussian elimination
    in rational arithmetic: the reference for forward errors of small systems (n of a few
    dozen). ValueError for a singular matrix, and for NaN or inf entries (naming the first).

    >>> [str(v) for v in exact_solve([[4.0, 1.0], [1.0, 3.0]], [1.0, 1.0])]
    ['2/11', '3/11']
    """
    Am = np.asarray(A, dtype=np.float64)
    bv = np.asarray(b, dtype=np.float64).reshape(-1)
    n = bv.size
    if Am.shape != (n, n):
        raise ValueError(f"A must be {n} x {n} for b of length {n}, got shape {Am.shape}")
    _check_finite(Am.reshape(-1), "A", "exact_solve")
    _check_finite(bv, "b", "exact_solve")
    M = [
        [Fraction(v) for v in row] + [Fraction(bi)]
        for row, bi in zip(Am.tolist(), bv.tolist(), strict=True)
    ]
    for k in range(n):
        p = max(range(k, n), key=lambda i: abs(M[i][k]))
        if M[p][k] == 0:
            raise ValueError("A is singular")
        M[k], M[p] = M[p], M[k]
        piv = M[k][k]
        for i in range(k + 1, n):
            f = M[i][k] / piv
            if f:
                M[i] = [mi - f * mk for mi, mk in zip(M[i], M[k], strict=True)]
    x = [Fraction(0)] * n
    for i in range(n - 1, -1, -1):
        x[i] = (M[i][n] - sum((M[i][j] * x[j] for j in range(i + 1, n)), Fraction(0))) / M[i][i]
    return x


# ----- trials ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialStats:
    """The error distribution of :func:`run_trials`."""

    errors: np.ndarray  # one per trial, in trial order
    seeds: tuple[int, ...]

    @property
    def mean(self) -> float:
        return float(np.mean(self.errors))

    @property
    def median(self) -> float:
        return float(np.median(self.errors))

    @property
    def max(self) -> float:
        return float(np.max(self.errors))

    def quantile(self, q: float) -> float:
        """The q-quantile of the errors (numpy's linear interpolation)."""
        return float(np.quantile(self.errors, q))

    def fraction_within(self, bound: float) -> float:
        """Fraction of trials whose error is at most ``bound``."""
        return float(np.mean(self.errors <= bound))

    def summary(self) -> str:
        """One line for reports: the mean, median, 90% and 99% quantiles and max error."""
        return (
            f"{self.errors.size} trials: mean {self.mean:.3g}, median {self.median:.3g}, "
            f"90% {self.quantile(0.9):.3g}, 99% {self.quantile(0.99):.3g}, max {self.max:.3g}"
        )


def run_trials(fn: Callable[[int], float], n_trials: int, seed: int = 0) -> TrialStats:
    """Run ``fn(seed_i)`` for ``n_trials`` seeds ``seed_i = seed + i`` and collect the errors it
    returns (reproducible: the same seeds give the same distribution).

    >>> import precision_lab as pl
    >>> def err(s):
    ...     x = pl.ops.add(1.0, 2.0**-10, "bf16", rounding="stochastic", seed=s)
    ...     return abs(float(x) - (1 + 2.0**-10))
    >>> st = run_trials(err, 200, seed=1)
    >>> st.errors.size, st.max <= 2.0**-7
    (200, True)
    """
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
        raise ValueError(f"n_trials must be a positive int, got {n_trials!r}")
    seeds = tuple(seed + i for i in range(n_trials))
    errors = np.array([float(fn(s)) for s in seeds])
    return TrialStats(errors, seeds)


def deterministic_bound(n: int, u: float | str | FloatFormat) -> float:
    """``gamma_{n-1}``: the worst-case bound of a recursive sum of n terms (one rounding per
    addition after the first); 0 for ``n`` of 0 or 1. ValueError for a negative ``n``.

    >>> deterministic_bound(1025, "fp16")
    1.0
    """
    _check(n, 1.0)
    return gamma_n(n - 1, u) if n > 1 else 0.0
