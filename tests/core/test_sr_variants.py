"""The few-bit SR variants stochastic_offset (SRF) and stochastic_corrected (SRC) beside
stochastic (SRFF): each decision against an exact rational referee of its stated rule, exact
distributions by enumerating every random word, seeded reproducibility and chunking, and the
biases of Fitzgibbon & Felix (studies.sr_variants) pinned.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.core.random_words import random_words
from precision_lab.core.rounding import round_with_words, sr_mode, word_bits
from precision_lab.studies import sr_variants as sv

MODES = ["stochastic", "stochastic_offset", "stochastic_corrected"]


def _away(mode: str, frac: Fraction, n: int, nb: int) -> bool:
    """The stated rule in exact arithmetic: frac is the discarded fraction (in quanta), its 64-bit
    truncation is the rules' input; n the top nb bits of the word."""
    x = Fraction(math.floor(frac * 2**64), 2**64)
    if x == 0:
        return False
    if mode == "stochastic":
        return x + Fraction(n, 2**nb) >= 1
    if mode == "stochastic_offset":
        return x + (n + Fraction(1, 2)) / 2**nb >= 1
    y = x * 2**nb
    c = math.floor(y)
    if y - c > Fraction(1, 2) or (y - c == Fraction(1, 2) and c % 2 == 1):
        c += 1
    return c + n >= 2**nb


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nb", [1, 3, 7, 13, 40])
@pytest.mark.parametrize("fmt", ["e4m3", "bf16", "e2m1"])
def test_each_decision_matches_the_exact_rule(mode: str, nb: int, fmt: str) -> None:
    f = pl.get_format(fmt)
    rng = np.random.default_rng(nb)
    e = rng.integers(f.emin - f.mantissa_bits - 2, f.emax, 3000)
    x = np.ldexp(rng.random(3000) + 0.5, e) * rng.choice([-1.0, 1.0], 3000)
    grid = np.array(f.values())
    x = np.concatenate([x, grid[np.isfinite(grid)][::7] * 1.0])  # exact values too
    for dt in (np.float32, np.float64):
        xs = x.astype(dt)
        got = pl.round_to(xs, f, rounding=mode, seed=99, random_bits=nb, overflow="saturate")
        words = random_words(99, xs.size, 0)
        lo = pl.round_to(xs, f, rounding="toward_zero", overflow="saturate")
        hi = pl.round_to(xs, f, rounding="up", overflow="saturate")
        hi = np.where(xs < 0, pl.round_to(xs, f, rounding="down", overflow="saturate"), hi)
        for i in range(xs.size):
            a, lo_i, hi_i = (Fraction(float(v[i])) for v in (xs, lo, hi))
            if hi_i == lo_i:
                want = float(lo_i)
            else:
                frac = (a - lo_i) / (hi_i - lo_i)
                up = _away(mode, frac, int(words[i]) >> (64 - nb), nb)
                want = float(hi_i if up else lo_i)
            assert float(got[i]) == want, (mode, nb, fmt, dt, float(xs[i]))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("nb", "d"), [(1, 1), (2, 3), (3, 3), (3, 6), (4, 2), (5, 8)])
def test_exact_distribution_enumerating_all_words(mode: str, nb: int, d: int) -> None:
    """Every D-bit fraction, every one of the 2**N words: P(away) is the closed form exactly."""
    p = sv.exact_distribution(mode, nb, d)
    for i, pi in enumerate(p):
        y = Fraction(i, 2**d) * 2**nb
        if mode == "stochastic":
            want = math.floor(y)
        elif mode == "stochastic_offset":
            want = math.floor(y + Fraction(1, 2))
        else:
            want = round(y)  # Python's round: nearest, ties to even
        assert pi == Fraction(want, 2**nb), (mode, nb, d, i)
    assert sv.exact_bias(mode, nb, d) == sv.closed_form_bias(mode, nb, d)


def test_closed_forms_of_the_paper() -> None:
    assert sv.closed_form_bias("srff", 4) == Fraction(-1, 32)  # -2**-(N+1)
    assert sv.closed_form_bias("srff", 4, 10) == Fraction(-1, 32) + Fraction(1, 2**11)
    assert sv.closed_form_bias("srf", 4) == 0 and sv.closed_form_bias("src", 4, 10) == 0
    assert sv.closed_form_bias("srf", 4, 10) == Fraction(1, 2**11)
    assert sv.closed_form_bias("srff", 6, 4) == 0  # D <= N: exact SR


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nb", [2, 4, 6, 8])
@pytest.mark.parametrize("d", [None, 10])
def test_measured_bias_within_1e3_of_the_closed_form(mode: str, nb: int, d: int | None) -> None:
    """2**22 seeded draws: the standard error of the mean is below 2.4e-4 quanta."""
    meas = sv.measured_bias(mode, nb, d)
    assert abs(meas - float(sv.closed_form_bias(mode, nb, d))) < 1e-3


def test_bias_numbers_pinned() -> None:
    """The report's numbers (seed 2025, 2**22 draws): deterministic to the last bit."""
    rows = {(r["variant"], r["N"], r["D"]): r["measured"] for r in sv.bias_table((2, 8), (None,))}
    assert rows[("SRFF", 2, None)] == pytest.approx(-0.125232, abs=5e-7)
    assert rows[("SRFF", 8, None)] == pytest.approx(-0.002131, abs=5e-7)
    assert rows[("SRF", 2, None)] == pytest.approx(-0.000041, abs=5e-7)
    assert rows[("SRC", 8, None)] == pytest.approx(-0.000163, abs=5e-7)


@pytest.mark.parametrize("mode", ["stochastic_offset", "stochastic_corrected"])
def test_variants_are_reproducible_whatever_the_chunking(mode: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal(300_001).astype(np.float32)
    whole = pl.round_to(x, "e4m3", rounding=mode, seed=5, random_bits=4)
    parts = np.concatenate(
        [
            pl.round_to(x[i : i + 70_001], "e4m3", rounding=mode, seed=5, random_bits=4)
            for i in range(0, x.size, 70_001)
        ]
    )  # each part restarts the flat index: compare against the words of its own indices
    starts = list(range(0, x.size, 70_001))
    for s in starts:
        seg = slice(s, s + 70_001)
        w = random_words(5, x[seg].size, 0)
        np.testing.assert_array_equal(
            parts[seg], round_with_words(x[seg], "e4m3", w, rounding=mode, random_bits=4)
        )
    np.testing.assert_array_equal(
        whole, round_with_words(x, "e4m3", random_words(5, x.size, 0), rounding=mode, random_bits=4)
    )
    with pl.use_backend("numpy"):
        np.testing.assert_array_equal(
            whole, pl.round_to(x, "e4m3", rounding=mode, seed=5, random_bits=4)
        )


@pytest.mark.parametrize("mode", MODES)
def test_native_equals_numpy(mode: str) -> None:
    """The compiled backend (the shared header) gives the numpy reference's bits."""
    rng = np.random.default_rng(2)
    x = np.concatenate(
        [rng.standard_normal(50_000) * 10.0 ** rng.integers(-8, 4, 50_000), [0.0, -0.0, 1e9]]
    )
    for dt in (np.float32, np.float64):
        for fmt in ("e4m3", "e2m1", "bf16", "e5m2", "int8"):
            for nb in (1, 3, 8, 20):
                kw = {"rounding": mode, "seed": 11, "random_bits": nb, "overflow": "saturate"}
                got = pl.round_to(x.astype(dt), fmt, **kw)
                with pl.use_backend("numpy"):
                    want = pl.round_to(x.astype(dt), fmt, **kw)
                np.testing.assert_array_equal(got, want, err_msg=f"{fmt} {dt} {nb}")
                codes = pl.encode(x.astype(dt), fmt, **kw) if fmt != "int8" else None
                if codes is not None:
                    np.testing.assert_array_equal(pl.decode(codes, fmt), want.astype(np.float32))


def test_blocks_take_the_variants() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    for mode in ("stochastic_offset", "stochastic_corrected"):
        got = pl.round_to_blocks(x, "nvfp4", rounding=mode, seed=3, random_bits=4)
        with pl.use_backend("numpy"):
            want = pl.round_to_blocks(x, "nvfp4", rounding=mode, seed=3, random_bits=4)
        np.testing.assert_array_equal(got, want)
        other = pl.round_to_blocks(x, "nvfp4", rounding="stochastic", seed=3, random_bits=4)
        assert not np.array_equal(got, other)  # the variant decides differently somewhere


def test_64_bits_is_stochastic_and_aliases() -> None:
    x = np.random.default_rng(4).standard_normal(1000)
    base = pl.round_to(x, "bf16", rounding="sr", seed=1)
    for alias in ("srf", "src", "srff", "stochastic_offset", "stochastic_corrected"):
        np.testing.assert_array_equal(pl.round_to(x, "bf16", rounding=alias, seed=1), base)
    assert sr_mode("stochastic_offset", 64) == "stochastic"
    assert word_bits("stochastic_corrected", 5) == 69 and word_bits("stochastic", 5) == 5
    with pytest.raises(ValueError, match="not supported by accumulators"):
        pl.Accumulator("bf16", rounding="srf", random_bits=4)
    assert pl.Accumulator("bf16", rounding="srf").rounding == "stochastic"


def test_round_with_words_equals_seeded_rounding() -> None:
    x = np.random.default_rng(6).standard_normal(5000).astype(np.float32)
    for mode in (*MODES, "stochastic_equal"):
        for nb in (None, 3):
            want = pl.round_to(x, "e5m2", rounding=mode, seed=8, random_bits=nb)
            got = round_with_words(
                x, "e5m2", random_words(8, x.size), rounding=mode, random_bits=nb
            )
            np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="stochastic mode"):
        round_with_words(x, "e5m2", 0, rounding="nearest_even")


def test_summation_numbers_pinned() -> None:
    """El Arar et al.'s effect, small: with 2 random bits SRFF's bias (n u_{p+r}) dominates the
    bf16 sum of 1024 summands; with r >= ceil(log2 n / 2) = 5 the error is near exact SR's.
    The numbers are deterministic (fixed seeds): pinned."""
    res = sv.summation_error(1024, (2, 5, None), modes=("stochastic",), reps=8)
    err = res["error"]["stochastic"]
    assert res["r_star"] == 5
    assert err == pytest.approx({"2": 0.304984, "5": 0.059124, "exact": 0.039267}, abs=5e-7)
    assert res["nearest_even"] == pytest.approx(0.503895, abs=5e-7)
    assert err["2"] > 5 * err["exact"] and err["5"] < 2 * err["exact"] < res["nearest_even"]
