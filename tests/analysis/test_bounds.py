"""Numerical-analysis helpers and the reproduced numbers of the emulated-arithmetic report."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.analysis import bounds
from precision_lab.arith import ops
from precision_lab.studies.emulated import (
    harmonic_stagnation,
    iterative_refinement,
    lambda_for,
    random_matrix,
    sr_bound,
    summation_errors,
)

RNG = np.random.default_rng(7)


def test_gamma_tilde_and_probabilities() -> None:
    u = 2.0**-11
    for n in (1, 10, 1000):
        lam = 2.0
        g = bounds.gamma_tilde(n, u, lam)
        assert g == pytest.approx(math.exp(lam * math.sqrt(n) * u + n * u * u / (1 - u)) - 1)
        assert g < bounds.gamma_n(n, u) or n < 5  # sqrt(n) beats n for moderate n
    assert bounds.probability_p(3.0, u) == pytest.approx(1 - 2 * math.exp(-4.5 * (1 - u) ** 2))
    assert bounds.probability_q(3.0, 10, u) == pytest.approx(
        1 - 10 * (1 - bounds.probability_p(3.0, u))
    )
    assert bounds.gamma_tilde(64, "fp16", 1.0) == bounds.gamma_tilde(64, u, 1.0)
    lam = lambda_for(4096, u)
    assert bounds.probability_q(lam, 4096, u) >= 0.99 > bounds.probability_q(lam * 0.95, 4096, u)
    with pytest.raises(ValueError, match="lam"):
        bounds.gamma_tilde(4, u, -1.0)
    with pytest.raises(ValueError, match="u must"):
        bounds.gamma_tilde(4, 2.0, 1.0)


def test_backward_errors_and_condition_numbers() -> None:
    x = RNG.uniform(-1, 1, 50)
    y = RNG.uniform(-1, 1, 50)
    exact = sum((Fraction(a) * Fraction(b) for a, b in zip(x, y, strict=True)), Fraction(0))
    assert bounds.exact_dot(x, y) == exact
    s_hat = float(ops.dot(pl.round_to(x, "fp32"), pl.round_to(y, "fp32"), accumulator="bf16"))
    xr, yr = (np.asarray(pl.round_to(v, "fp32"), dtype=float) for v in (x, y))
    eta = bounds.backward_error_dot(s_hat, xr, yr)
    absum = sum(abs(Fraction(a) * Fraction(b)) for a, b in zip(xr, yr, strict=True))
    assert eta == pytest.approx(float(abs(Fraction(s_hat) - bounds.exact_dot(xr, yr)) / absum))
    assert eta <= bounds.gamma_n(49, "bf16")  # the deterministic bound always holds
    assert bounds.cond_sum([1.0, 2.0]) == 1.0
    assert bounds.cond_dot(x, y) >= 2.0
    A = np.array([[4.0, 1.0], [1.0, 3.0]])
    xs = np.array([2.0 / 11, 3.0 / 11])  # near the solution of A x = (1, 1)
    be = bounds.backward_error_solve(A, xs, [1.0, 1.0])
    assert 0 < be < 1e-15
    with pytest.raises(ValueError, match="A must be"):
        bounds.backward_error_solve(np.ones((3, 2)), xs, [1.0, 1.0])


def test_run_trials_is_reproducible() -> None:
    def err(seed: int) -> float:
        v = ops.add(np.ones(64), 2.0**-10, "bf16", rounding="stochastic", seed=seed)
        return float(np.mean(np.asarray(v)) - (1 + 2.0**-10))

    a = bounds.run_trials(err, 30, seed=3)
    b = bounds.run_trials(err, 30, seed=3)
    assert np.array_equal(a.errors, b.errors) and a.seeds == tuple(range(3, 33))
    assert abs(a.mean) < 2.0**-9
    assert 0 <= a.fraction_within(a.median) - 0.5 <= 1 / 30 + 1e-12
    assert "30 trials" in a.summary()


# ----- reproduced numbers ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fmt", "n", "s"),
    [
        ("fp16", 513, 7.0859375),
        ("bf16", 65, 5.0625),
        ("tf32", 513, 7.0859375),
        ("e5m2", 5, 2.0),
        ("e4m3", 9, 3.0),
    ],
)
def test_harmonic_stagnation_points(fmt: str, n: int, s: float) -> None:
    assert harmonic_stagnation(fmt) == (n, s)
    # independent check: in Fractions, 1/n (rounded) is at most half an ulp of the sum
    f = pl.get_format(fmt)
    assert float(pl.round_to(s + float(pl.round_to(1.0 / n, f)), f)) == s


def test_sr_error_within_probabilistic_bound_on_99_percent_of_seeds() -> None:
    n, seeds = 1024, 200
    err = summation_errors("fp16", [n], trials=seeds, seed=11)
    bound = sr_bound(n, "fp16")
    assert bound < 0.2  # a meaningful bound
    assert float(np.mean(err["SR"][0] <= bound)) >= 0.99


def test_kahan_in_bf16_matches_fp32_summation() -> None:
    accs = {
        "bf16": pl.Accumulator("bf16"),
        "kahan": pl.Accumulator("bf16", order="compensated"),
        "fp32": pl.Accumulator("fp32"),
    }
    err = summation_errors("bf16", [4096], trials=5, seed=1, accumulators=accs)
    assert np.median(err["kahan"]) < 2 * 2.0**-8 < np.median(err["bf16"]) / 10


def test_iterative_refinement_converges_for_moderate_condition() -> None:
    A = random_matrix(12, 100.0, 3)
    r = iterative_refinement(A, "fp16", "fp64", iterations=6, seed=0, kappa=100.0)
    assert r.errors[0] > 1e-4 and r.converged and r.errors[-1] < 1e-12
    bad = iterative_refinement(random_matrix(12, 1e7, 3), "bf16", "fp64", iterations=3, kappa=1e7)
    assert not bad.converged


# ----- issue 19 item 17: NaN/inf inputs, overflow of gamma_tilde, negative n ------------------
def test_non_finite_inputs_give_nan_inf_or_a_named_error() -> None:
    nan, inf = math.nan, math.inf
    assert math.isnan(bounds.cond_sum([1.0, nan]))
    assert math.isnan(bounds.cond_sum([1.0, inf, -inf]))
    assert math.isnan(bounds.cond_dot([1.0, 2.0], [inf, 1.0]))
    # an overflowed computed result: infinite backward error; a NaN result: NaN
    assert bounds.backward_error_dot(inf, [1.0, 2.0], [3.0, 4.0]) == inf
    assert bounds.backward_error_dot(-inf, [1.0], [3.0]) == inf
    assert math.isnan(bounds.backward_error_dot(nan, [1.0], [3.0]))
    assert math.isnan(bounds.backward_error_dot(1.0, [nan], [3.0]))
    A = [[2.0, 0.0], [0.0, 4.0]]
    assert bounds.backward_error_solve(A, [inf, 0.25], [1.0, 1.0]) == inf
    assert math.isnan(bounds.backward_error_solve(A, [nan, inf], [1.0, 1.0]))
    assert math.isnan(bounds.backward_error_solve(A, [0.5, 0.25], [inf, 1.0]))
    with pytest.raises(ValueError, match=r"exact_dot needs finite y: y\[1\] is nan"):
        bounds.exact_dot([1.0, 2.0], [3.0, nan])
    with pytest.raises(ValueError, match=r"exact_solve needs finite A: A\[3\] is inf"):
        bounds.exact_solve([[1.0, 0.0], [0.0, inf]], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"exact_solve needs finite b"):
        bounds.exact_solve([[1.0]], [-inf])
    # finite inputs: unchanged, exact (Fraction referee)
    x, y = [1.0, -1.0 + 2.0**-30], [3.0, 3.0]
    want = float(abs(Fraction(1) * 3 - (Fraction(1) - Fraction(2) ** -30) * 3) / 1)
    assert bounds.backward_error_dot(0.0, x, y) == pytest.approx(
        want / float(Fraction(3) + (Fraction(1) - Fraction(2) ** -30) * 3), rel=1e-15
    )


def test_gamma_tilde_overflows_to_inf_and_negative_n_is_refused() -> None:
    assert bounds.gamma_n(10**30, "fp16") == math.inf
    assert bounds.gamma_tilde(10**30, "fp16", 1) == math.inf  # was OverflowError
    assert bounds.gamma_tilde(10**400, "fp16", 1.0) == math.inf  # beyond float: inf too
    assert bounds.gamma_tilde(2**40, 2.0**-24, 1.0) == pytest.approx(
        math.expm1(2.0**20 * 2.0**-24 + 2.0**40 * 2.0**-48 / (1 - 2.0**-24))
    )
    assert bounds.probability_q(3.0, 10**400, "fp16") == -math.inf
    with pytest.raises(ValueError, match="n must be a non-negative int, got -5"):
        bounds.deterministic_bound(-5, "fp16")  # was 0.0, silently
    with pytest.raises(ValueError, match="n must be"):
        bounds.deterministic_bound(2.5, "fp16")
    assert bounds.deterministic_bound(0, "fp16") == bounds.deterministic_bound(1, "fp16") == 0.0
    assert bounds.deterministic_bound(3, 2.0**-11) == 2 * 2.0**-11 / (1 - 2 * 2.0**-11)
