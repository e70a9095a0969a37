"""Numerical-analysis experiments run in emulated arithmetic (the figures of
:mod:`precision_lab.figures.fig_emulated_sums` and
:mod:`~precision_lab.figures.fig_emulated_algorithms`, the notebook ``06_emulated_algorithms``
and the tests).

Everything here is bit-reproducible on any machine: every operation is a :mod:`precision_lab.ops`
call or an :class:`~precision_lab.Emulated` array operation (each result rounded from its exact
value by the core), float64 work is elementwise IEEE arithmetic or :func:`math.fsum`, and no
BLAS or LAPACK routine is called.

>>> harmonic_stagnation("bf16")
(65, 5.0625)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..analysis.bounds import exact_solve, gamma_tilde, probability_q
from ..arith import ops
from ..arith.emulated import emulate
from ..core.formats import FloatFormat, get_format
from ..core.rounding import round_to
from ..gemm.accumulator import Accumulator
from ..training import RUNS, train_seeds

__all__ = [
    "HARMONIC_FORMATS",
    "WEIGHT_UPDATE_RULES",
    "IRResult",
    "harmonic_stagnation",
    "harmonic_sums",
    "iterative_refinement",
    "lambda_for",
    "random_matrix",
    "sgd_weight_updates",
    "sr_bound",
    "summation_errors",
    "training_weight_updates",
]

HARMONIC_FORMATS = ("fp16", "bf16", "tf32", "e5m2", "e4m3")
_COUNTER = 2**64  # seed step between rounding operations (the Emulated counter's rule)


def _fmt(fmt: Any) -> FloatFormat:
    f = get_format(fmt)
    assert isinstance(f, FloatFormat)
    return f


# ----- (a) harmonic series --------------------------------------------------------------------
def harmonic_stagnation(fmt: Any, rounding: str = "nearest_even") -> tuple[int, float]:
    """``(n, s)``: the first ``n`` with ``s + 1/n == s`` in ``fmt`` (terms ``1/k`` rounded to the
    format, the sum ``s = 1 + 1/2 + ... + 1/(n-1)`` rounded at every step), and that sum.

    >>> harmonic_stagnation("fp16")
    (513, 7.0859375)
    """
    s, k = 0.0, 1
    while True:
        term = float(ops.div(1.0, float(k), fmt))
        new = float(ops.add(s, term, fmt, rounding=rounding))
        if new == s:
            return k, s
        s, k = new, k + 1


def harmonic_sums(
    fmt: Any, n: int, *, seeds: int = 16, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Partial sums of the harmonic series to ``n`` terms: exact (float64 of the exact sum of
    the rounded terms, :func:`math.fsum`), round-to-nearest in ``fmt``, and stochastic rounding
    in ``fmt`` for ``seeds`` seeds (array ``(seeds, n)``). Terms ``1/k`` are rounded to nearest.
    """
    f = _fmt(fmt)
    terms = np.asarray(ops.div(1.0, np.arange(1, n + 1, dtype=np.float64), f), dtype=np.float64)
    exact = np.array([math.fsum(terms[: k + 1].tolist()) for k in range(n)])
    rn = np.asarray(ops.cumsum(terms, accumulator=Accumulator(f)), dtype=np.float64)
    sr = np.asarray(
        ops.cumsum(
            np.broadcast_to(terms, (seeds, n)),
            accumulator=Accumulator(f, rounding="stochastic", seed=seed),
            axis=1,
        ),
        dtype=np.float64,
    )
    return exact, rn, sr


# ----- (b, c) summation error versus n ---------------------------------------------------------
def lambda_for(n: int, u: float, prob: float = 0.99) -> float:
    """The smallest ``lam`` with ``Q(lam, n, u) >= prob`` (Higham & Mary's inner-product
    probability).

    >>> round(lambda_for(1024, 2.0**-8), 3)
    4.965
    """
    lam = math.sqrt(2 * math.log(2 * n / (1 - prob))) / (1 - u)
    while probability_q(lam, n, u) < prob:  # the closed form, up to float64 rounding
        lam *= 1 + 2.0**-40
    return lam


def summation_errors(
    fmt: Any,
    ns: list[int],
    *,
    low: float = 0.0,
    trials: int = 20,
    seed: int = 0,
    accumulators: dict[str, Accumulator] | None = None,
) -> dict[str, np.ndarray]:
    """Relative errors ``|s_hat - s| / sum |x_i|`` of recursive sums of ``n`` values drawn
    uniformly from ``[low, 1)`` and rounded to ``fmt`` (``trials`` vectors per n, one array
    ``(len(ns), trials)`` per accumulator). Default accumulators: ``RN`` and ``SR`` in ``fmt``.
    The exact sum is :func:`math.fsum` of the values (exact in float64 here).
    """
    f = _fmt(fmt)
    accs = accumulators or {
        "RN": Accumulator(f),
        "SR": Accumulator(f, rounding="stochastic", seed=seed),
    }
    rng = np.random.default_rng(seed)
    out = {name: np.empty((len(ns), trials)) for name in accs}
    for i, n in enumerate(ns):
        x = np.asarray(round_to(rng.uniform(low, 1.0, (trials, n)), f), dtype=np.float64)
        exact = np.array([math.fsum(row) for row in x.tolist()])
        absum = np.array([math.fsum(row) for row in np.abs(x).tolist()])
        for name, acc in accs.items():
            s = np.asarray(ops.sum(x, accumulator=acc, axis=1), dtype=np.float64)
            out[name][i] = np.abs(s - exact) / absum
    return out


def sr_bound(n: int, fmt: Any, prob: float = 0.99) -> float:
    """Probabilistic bound of a stochastically rounded sum of n terms: ``gamma_tilde(n, 2u,
    lam)`` with ``Q(lam, n, 2u) = prob`` (SR errors are at most one spacing, ``2u``)."""
    u2 = 2 * _fmt(fmt).unit_roundoff
    return gamma_tilde(n, u2, lambda_for(n, u2, prob))


# ----- (c) weight updates -----------------------------------------------------------------------
def sgd_weight_updates(
    steps: int = 400,
    *,
    features: int = 16,
    batch: int = 32,
    lr: float = 0.005,
    noise: float = 0.1,
    every: int = 10,
    seed: int = 0,
    fmt: Any = "bf16",
) -> dict[str, np.ndarray]:
    """Mini-batch SGD on a seeded least-squares problem with the weights held in ``fmt``
    (bf16), updated with round-to-nearest, stochastic rounding, or Kahan-compensated updates
    (weights and compensation in ``fmt``), against fp32 weights. Gradients are computed in fp32
    (:func:`precision_lab.ops.dot`, sequential fp32 sums). Returns the training loss (mean
    squared error on the whole set, fp32 sums) every ``every`` steps (and after the last),
    per method.

    Zamirai et al. (2020): with 16-bit weights, updates below half an ulp of the weight are lost
    under round-to-nearest; stochastic rounding keeps them in expectation but adds noise;
    Kahan-compensated updates track fp32.
    """
    f = _fmt(fmt)
    fp32 = _fmt("fp32")
    acc32 = Accumulator(fp32)
    rng = np.random.default_rng(seed)
    n_rows = 512
    X = np.asarray(round_to(rng.normal(size=(n_rows, features)), fp32), dtype=np.float64)
    w_true = rng.normal(size=features) * 4.0
    y = np.asarray(
        round_to(
            np.asarray(ops.dot(X, round_to(w_true, fp32), accumulator=acc32))
            + noise * rng.normal(size=n_rows),
            fp32,
        ),
        dtype=np.float64,
    )
    order = rng.integers(0, n_rows, (steps, batch))
    w0 = np.asarray(round_to(rng.normal(size=features), f), dtype=np.float64)
    losses: dict[str, np.ndarray] = {}
    for method in ("fp32", "RN", "SR", "Kahan"):
        w = w0.copy()
        comp = np.zeros(features)
        hist = []
        for t in range(steps):
            idx = order[t]
            Xb, yb = X[idx], y[idx]
            r = ops.sub(ops.dot(Xb, w, accumulator=acc32), yb, fp32)
            g = ops.mul(ops.dot(Xb.T, r, accumulator=acc32), 2.0 / batch, fp32)
            step = np.asarray(ops.mul(g, -lr, fp32), dtype=np.float64)  # the update, in fp32
            if method == "fp32":
                w = np.asarray(ops.add(w, step, fp32), dtype=np.float64)
            elif method == "RN":
                w = np.asarray(ops.add(w, step, f), dtype=np.float64)
            elif method == "SR":
                w = np.asarray(
                    ops.add(w, step, f, rounding="stochastic", seed=seed + t * _COUNTER),
                    dtype=np.float64,
                )
            else:  # Kahan: the low part lost by the bf16 add is carried to the next step
                yk = ops.sub(step, comp, f)
                tk = ops.add(w, yk, f)
                comp = np.asarray(ops.sub(ops.sub(tk, w, f), yk, f), dtype=np.float64)
                w = np.asarray(tk, dtype=np.float64)
            if (t + 1) % every == 0 or t == steps - 1:
                res = ops.sub(ops.dot(X, w, accumulator=acc32), y, fp32)
                hist.append(float(ops.dot(res, res, accumulator=acc32)) / n_rows)
        losses[method] = np.array(hist)
    return losses


#: the weight-update rules compared on the training emulation
WEIGHT_UPDATE_RULES = ("fp32", "bf16_rn", "bf16_sr", "bf16_kahan")


def training_weight_updates(
    seeds: tuple[int, ...] = (0, 1, 2),
    *,
    epochs: int = 15,
    lr: float = 0.005,
    batch_size: int = 64,
    hidden: tuple[int, ...] = (64,),
) -> dict[str, list[Any]]:
    """The digits MLP of :mod:`precision_lab.training` (fp32 GEMMs and activations, SGD with
    momentum 0.9, constant ``lr``) trained with each weight-update rule of
    :data:`WEIGHT_UPDATE_RULES` (:mod:`precision_lab.training.updates`: fp32 master weights, or
    bf16 weights updated with round to nearest, stochastic rounding or a Kahan-compensated
    update), once per seed; ``{rule: [TrainResult per seed]}``.

    Bit-reproducible: the GEMMs are :func:`~precision_lab.training.model.matmul_fixed_order`
    (no BLAS), the updates single roundings by the core with words keyed by the seed.
    """
    base = RUNS["fp32"].replace(
        optimizer="sgd",
        lr=lr,
        lr_schedule="constant",
        momentum=0.9,
        batch_size=batch_size,
        epochs=epochs,
        hidden=hidden,
        init_std=0.05,
    )
    return {
        rule: train_seeds(base.replace(weight_update=rule, name=rule), list(seeds))
        for rule in WEIGHT_UPDATE_RULES
    }


# ----- (d) mixed-precision iterative refinement ------------------------------------------------
def random_matrix(n: int, kappa: float, seed: int) -> np.ndarray:
    """A seeded ``n x n`` matrix with singular values geometrically spaced from 1 to
    ``1/kappa`` (2-norm condition number ``kappa``): ``H1 diag(sigma) H2`` with Householder
    reflections ``H = I - 2 v v^T``, formed with elementwise float64 operations and
    :func:`math.fsum` only (bit-reproducible; no BLAS)."""
    rng = np.random.default_rng(seed)
    # math.pow (the C library's pow), not numpy's power: numpy dispatches float64 power to SIMD
    # code chosen by the CPU (SVML on AVX-512), whose last bits differ from other CPUs'
    sigma = np.array([math.pow(kappa, -i / max(n - 1, 1)) for i in range(n)])
    u = rng.normal(size=n)
    w = rng.normal(size=n)
    u = u / math.sqrt(math.fsum((u * u).tolist()))
    w = w / math.sqrt(math.fsum((w * w).tolist()))
    # (I - 2uu^T) S (I - 2ww^T) = S - 2u(S u)^T - 2(S w)w^T + 4 (u^T S w) u w^T, S diagonal
    su, sw = sigma * u, sigma * w
    usw = math.fsum((u * sw).tolist())
    return (
        np.diag(sigma)
        - 2.0 * np.outer(u, su)
        - 2.0 * np.outer(sw, w)
        + (4.0 * usw) * np.outer(u, w)
    )


def lu_factor(A: Any) -> tuple[Any, np.ndarray]:
    """Gaussian elimination with partial pivoting, written with numpy operators (run it on an
    :class:`~precision_lab.Emulated` array): returns the packed ``L\\U`` and the row order."""
    A = A.copy()
    n = A.shape[0]
    perm = np.arange(n)
    for k in range(n - 1):
        p = k + int(np.argmax(np.abs(A[k:, k])))
        if p != k:
            A[[k, p]] = A[[p, k]]
            perm[[k, p]] = perm[[p, k]]
        A[k + 1 :, k] = A[k + 1 :, k] / A[k, k]
        A[k + 1 :, k + 1 :] -= np.outer(A[k + 1 :, k], A[k, k + 1 :])
    return A, perm


def lu_solve(LU: Any, perm: np.ndarray, b: Any) -> Any:
    """Forward and back substitution with the factors of :func:`lu_factor`."""
    n = LU.shape[0]
    y = b[perm].copy()
    for i in range(1, n):
        y[i] = y[i] - LU[i, :i] @ y[:i]
    x = y.copy()
    for i in range(n - 1, -1, -1):
        if i < n - 1:
            x[i] = x[i] - LU[i, i + 1 :] @ x[i + 1 :]
        x[i] = x[i] / LU[i, i]
    return x


def _matvec(A: np.ndarray, x: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """``A @ x`` with sequential round-to-nearest sums in ``fmt`` (fp64: IEEE float64
    multiply and add in a fixed order, which is what :mod:`precision_lab.ops` gives in fp64)."""
    if fmt.precision <= 26:
        return np.asarray(ops.dot(A, x, accumulator=Accumulator(fmt)), dtype=np.float64)
    s = np.zeros(A.shape[0])
    for j in range(A.shape[1]):
        s = s + A[:, j] * x[j]
    return s


@dataclass(frozen=True)
class IRResult:
    """Errors of mixed-precision iterative refinement, per iteration (iteration 0: the LU
    solve)."""

    factor_format: str
    residual_format: str
    kappa: float
    errors: tuple[float, ...]  # ||x_i - x||_inf / ||x||_inf

    @property
    def limit(self) -> float:
        """``4 kappa u_r``: the limiting accuracy of refinement whose residual precision is the
        working precision (Higham 2002, section 12.1); errors are measured against the exact
        solution of the system held in the residual format."""
        return 4 * max(self.kappa, 1.0) * _fmt(self.residual_format).unit_roundoff

    @property
    def iterations(self) -> int | None:
        """The step at which refinement converged, None if it did not within the run.

        Converged at step ``i`` means: the error is within :attr:`limit` *and* it has stopped
        falling: no later step gains a bit on it (``min(errors[i + 1:]) > errors[i] / 2``).
        The first condition alone is not convergence: with a loose limit (4 kappa u_r is far
        above the factor format's u_f for fp32 residuals) a run can be inside it while its
        error still halves at every step. This is the stagnation test refinement codes stop on
        (Carson & Higham 2018, section 6: stop when the correction no longer decreases enough)
        applied to the forward error, which the study measures exactly.
        """
        e = self.errors
        for i in range(len(e) - 1):
            if e[i] <= self.limit and min(e[i + 1 :]) > e[i] / 2:
                return i
        return None

    @property
    def converged(self) -> bool:
        """Refinement reached its limiting accuracy and stopped improving (:attr:`iterations`)."""
        return self.iterations is not None

    @property
    def broke_down(self) -> bool:
        """The low-precision LU or a correction gave inf/NaN (no finite error at the end)."""
        return not math.isfinite(self.errors[-1])


def iterative_refinement(
    A: np.ndarray,
    factor_format: str,
    residual_format: str,
    *,
    iterations: int = 8,
    seed: int = 0,
    kappa: float = math.nan,
) -> IRResult:
    """LU-based iterative refinement (Carson & Higham 2018): the LU factorization and the
    correction solves in ``factor_format`` (an :class:`~precision_lab.Emulated` array, partial
    pivoting), the solution and the residual ``r = b - A x`` in ``residual_format`` (fp32 or
    fp64: :func:`precision_lab.ops` with sequential sums in that format). ``A`` is rounded to the
    residual format, ``b`` is a seeded random vector on its grid, and errors are measured
    against the exact solution of that system (:func:`precision_lab.analysis.bounds.exact_solve`).
    ``kappa`` is a label for the result."""
    n = A.shape[0]
    rf = _fmt(residual_format)
    rng = np.random.default_rng(seed)
    A_r = np.asarray(round_to(A, rf), dtype=np.float64)
    b = np.asarray(round_to(rng.uniform(-1, 1, n), rf), dtype=np.float64)
    x_true = np.array([float(v) for v in exact_solve(A_r, b)])  # to 0.5 ulp of float64
    norm_x = float(np.max(np.abs(x_true)))
    LU, perm = lu_factor(emulate(A_r, factor_format))
    x = np.asarray(lu_solve(LU, perm, emulate(b, factor_format)), dtype=np.float64)
    errors = [float(np.max(np.abs(x - x_true))) / norm_x]
    for _ in range(iterations):
        r = np.asarray(ops.sub(b, _matvec(A_r, x, rf), rf), dtype=np.float64)
        # scale r by a power of two near its norm (exact), so that it neither underflows nor
        # overflows in the factor format (Higham, Pranesh & Zounon 2019)
        rmax = float(np.max(np.abs(r)))
        if rmax == 0 or not math.isfinite(rmax):
            errors.append(errors[-1])
            continue
        scale = math.ldexp(1.0, -math.frexp(rmax)[1])
        d = np.asarray(lu_solve(LU, perm, emulate(r * scale, factor_format)), dtype=np.float64)
        d = d / scale
        x = np.asarray(ops.add(x, d, rf), dtype=np.float64)
        err = float(np.max(np.abs(x - x_true))) / norm_x
        errors.append(err if math.isfinite(err) else math.inf)
    return IRResult(factor_format, residual_format, kappa, tuple(errors))
