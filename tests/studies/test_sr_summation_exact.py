"""Why one-bit SRF/SRC sums U[0, 1) values to bf16 more accurately than exact SR at n = 1024
(precision_lab.studies.sr_variants.summation_error; the report's few-bit SR table).

Not a bug, two effects, both checked here with exact arithmetic (``Fraction``) on every random
word through the rounding core:

1. with one random bit, SRF (``stochastic_offset``) rounds a fraction f of the spacing up with
   probability 0 (f < 1/4), 1/2 (1/4 <= f < 3/4) or 1 (f >= 3/4): over f uniform its mean error
   is 0 and its mean square error 7/48, below exact SR's 1/6 = 8/48;
2. once the spacing reaches four times the largest summand, every fraction is below 1/4 and
   the sum stops growing (for bf16 and summands below 1: at 512). The expected exact sum of
   n = 1024 summands U[0, 1) is 512: the stagnation holds the sum next to its target, which
   cuts the error; where the target lies past the barrier, the same rounding stagnates far from
   it (n = 1536: error about (768 - 512) / 768).

The tiny case for effect 2: a 3-bit-significand format (E4M2: spacing 1 on [4, 8)) and
summands 0 or 1/8 with probability 1/2 each (the barrier, spacing 1 = 8 x 1/8, sits at 4); the
exact joint distribution of (rounded sum, exact sum) over every summand sequence and random
word (saturating at E4M2's 224, which exact SR reaches only on paths of negligible
probability). Effect 1 is checked on its own, over fractions uniform on 2**10 values.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.core.rounding import round_to, round_with_words
from precision_lab.studies import sr_variants as sv

FMT = pl.FloatFormat(exponent_bits=4, mantissa_bits=2)
SUMMANDS = (Fraction(0), Fraction(1, 8))
_TOP = np.uint64(1) << np.uint64(63)


def _round_dist(v: Fraction, mode: str) -> dict[Fraction, Fraction]:
    """Exact distribution of the rounding of ``v`` to FMT: one random bit through the core for
    the few-bit modes (both words, probability 1/2 each), the exact SR probability otherwise."""
    x = np.array([float(v)] * 2)  # exact: dyadic with few bits
    if mode == "exact":
        lo = Fraction(float(round_to(x[:1], FMT, rounding="down", overflow="saturate")[0]))
        hi = Fraction(float(round_to(x[:1], FMT, rounding="up", overflow="saturate")[0]))
        if lo == hi:
            return {lo: Fraction(1)}
        p = (v - lo) / (hi - lo)
        return {lo: 1 - p, hi: p}
    words = np.array([0, _TOP], dtype=np.uint64)
    r = round_with_words(x, FMT, words, rounding=mode, random_bits=1, overflow="saturate")
    out: dict[Fraction, Fraction] = {}
    for val in r:
        out[Fraction(float(val))] = out.get(Fraction(float(val)), Fraction(0)) + Fraction(1, 2)
    return out


#: one step's probability factor q / len(SUMMANDS) is a multiple of 2**-STEP_BITS (checked)
STEP_BITS = 24


def exact_sums(
    mode: str, ns: tuple[int, ...]
) -> dict[int, dict[tuple[Fraction, Fraction], Fraction]]:
    """The exact joint distributions of (rounded recursive sum, exact sum) after each n in
    ``ns`` summands, from one recursion (the first 64 steps of n = 96 are those of n = 64).

    Exact: every probability is dyadic (a random word's 1/2, or exact SR's (v - lo) / spacing
    with v a multiple of 1/8), so it is carried as an integer over 2**(STEP_BITS * steps) and
    turned into a ``Fraction`` at the end (the same values as ``Fraction`` arithmetic, without
    its gcd at every addition)."""
    eighth = Fraction(1, 8)
    dist: dict[tuple[int, int], int] = {(0, 0): 1}  # sums in units of 1/8 -> weight
    cache: dict[int, list[tuple[int, int]]] = {}
    out = {}
    for step in range(1, max(ns) + 1):
        new: dict[tuple[int, int], int] = {}
        for (s, t), w in dist.items():
            for x in SUMMANDS:
                k = int(x / eighth)
                v = s + k
                if v not in cache:
                    cache[v] = []
                    for r, q in _round_dist(v * eighth, mode).items():
                        scaled = q / len(SUMMANDS) * 2**STEP_BITS
                        units = r / eighth
                        assert scaled.denominator == 1 and units.denominator == 1, (v, r, q)
                        cache[v].append((int(units), int(scaled)))
                for r, q in cache[v]:
                    key = (r, t + k)
                    new[key] = new.get(key, 0) + w * q
        dist = new
        if step in ns:
            den = 2 ** (STEP_BITS * step)
            out[step] = {(s * eighth, t * eighth): Fraction(w, den) for (s, t), w in dist.items()}
    return out


def _mean_abs_error(dist: dict[tuple[Fraction, Fraction], Fraction]) -> Fraction:
    return sum((p * abs(s - t) for (s, t), p in dist.items()), Fraction(0))


def test_one_bit_srf_per_step_error_is_unbiased_with_7_48_mean_square() -> None:
    """Over fractions uniform on 2**D values, enumerating both random words (sv's exact
    distribution, through the core): mean error 2**-(D+1) (SRF's bias) -> 0 and mean square
    error -> 7/48, against exact SR's sum f (1 - f) / 2**D -> 1/6."""
    d = 10
    f = [Fraction(i, 2**d) for i in range(2**d)]
    for mode in ("stochastic_offset", "stochastic_corrected"):
        p = sv.exact_distribution(mode, 1, d)
        bias = sum((pi - fi for pi, fi in zip(p, f, strict=True)), Fraction(0)) / 2**d
        mse = (
            sum(
                (pi * (1 - fi) ** 2 + (1 - pi) * fi**2 for pi, fi in zip(p, f, strict=True)),
                Fraction(0),
            )
            / 2**d
        )
        assert bias == sv.closed_form_bias(mode, 1, d)
        # f < 1/4: f**2; 1/4 <= f < 3/4: ((1-f)**2 + f**2) / 2; f >= 3/4: (1-f)**2 (D = inf)
        assert abs(mse - Fraction(7, 48)) < Fraction(1, 2**d)
    exact_sr = sum((fi * (1 - fi) for fi in f), Fraction(0)) / 2**d
    assert abs(exact_sr - Fraction(1, 6)) < Fraction(1, 2**d)


@pytest.mark.parametrize("mode", ["stochastic_offset", "stochastic_corrected"])
def test_one_bit_srf_stagnates_at_four_times_the_summand_spacing(mode: str) -> None:
    """From 4 on (spacing 1 = 8 x the summand 1/8) one-bit SRF/SRC never rounds up."""
    for s in (4, 5, 6, 7):
        assert _round_dist(Fraction(s) + Fraction(1, 8), mode) == {Fraction(s): Fraction(1)}
    # below it the sum still moves: at 2 (spacing 1/2) some word rounds 2 + 1/8 up
    assert Fraction(5, 2) in _round_dist(Fraction(2) + Fraction(1, 8), "stochastic_offset")


def test_the_barrier_at_the_expected_sum_beats_exact_sr_past_it_it_does_not() -> None:
    """n = 64: expected exact sum 4 = the barrier: one-bit SRF's sum ends at 4 with probability
    0.93 and its mean absolute error is under half exact SR's (0.387 against 0.792: the study's
    n = 1024 case). n = 96: expected sum 6, past the barrier: SRF's sum cannot pass 4 and its
    error is 1.5 times exact SR's (2.000 against 1.295)."""
    srf, sr = exact_sums("stochastic_offset", (64, 96)), exact_sums("exact", (64, 96))
    srf64, sr64, srf96, sr96 = srf[64], sr[64], srf[96], sr[96]
    assert max(s for s, _ in srf64) <= 4
    assert sum((p for (s, _), p in srf64.items() if s == 4), Fraction(0)) > Fraction(9, 10)
    assert 2 * _mean_abs_error(srf64) < _mean_abs_error(sr64)
    assert max(s for s, _ in srf96) <= 4
    assert _mean_abs_error(srf96) > Fraction(3, 2) * _mean_abs_error(sr96)
    # exact SR is unbiased: E[rounded sum] = E[exact sum] but for the saturation at 224
    for dist in (sr64, sr96):
        assert abs(sum((p * (s - t) for (s, t), p in dist.items()), Fraction(0))) < 2.0**-30


def test_the_study_shows_the_same_at_n_1536() -> None:
    """bf16, U[0, 1): past the barrier (512; expected sum 768) one-bit SRF stagnates."""
    res = sv.summation_error(1536, (1, None), modes=("stochastic_offset",), reps=4)
    e = res["error"]["stochastic_offset"]
    assert e["1"] > 4 * e["exact"]
    assert e["1"] == pytest.approx(1 - 512 / 768, abs=0.02)  # stuck at 512, the target 768
