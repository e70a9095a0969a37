"""P3109 interim report 4.0, clause 5: the block operations against the report's definitions.

``pl.p3109_block_project`` (ωBlockProject / ConvertToBlock), ``pl.p3109_convert_to_block``
(ConvertToBlockMaxAbsFinite) and ``pl.p3109_block_decode`` (ωBlockDecode) against the
transcription in exact rational arithmetic (tests/p3109_spec.py): every pair of an element of
Binary5p2se and a scale of Binary4p2ue or Binary4p2se (NaN, ±inf, zero, negative scales) in every
deterministic mode and saturation; random blocks with specials for the scale computation; and
wide 16-bit scales, whose quotients the float64 division must round as the exact ones (the
argument in precision_lab/core/p3109_blocks.py).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from p3109_spec import v4_block_project, v4_decode, v4_max_abs_finite, v4_project

import precision_lab as pl
from precision_lab.core.random_words import random_words

MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")
SATS = ("sat_finite", "sat_propagate", "sat_none")


def _all_values(k: int, p: int, signed: bool, ext: bool) -> np.ndarray:
    return np.array([float(v4_decode(c, k, p, signed, ext)) for c in range(2**k)])


def _name(f: tuple[int, int, bool, bool]) -> str:
    k, p, signed, ext = f
    return f"p3109_k{k}p{p}{'s' if signed else 'u'}{'e' if ext else 'f'}"


def _same(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return (got == want) | (np.isnan(got) & np.isnan(want))


@pytest.mark.parametrize("fr", [(4, 2, True, True), (4, 3, False, False), (5, 2, True, False)],
                         ids=_name)  # fmt: skip
def test_block_project_every_element_and_scale(fr: tuple[int, int, bool, bool]) -> None:
    xs = _all_values(5, 2, True, True)
    ss = np.concatenate([_all_values(4, 2, False, True), _all_values(4, 2, True, True)])
    x, s = (a.ravel() for a in np.meshgrid(xs, ss, indexing="ij"))
    for mode in MODES:
        for sat in SATS:
            got = pl.p3109_block_project(x, s, _name(fr), block_size=1, rounding=mode,
                                         saturation=sat)  # fmt: skip
            want = np.array(
                [v4_block_project(b, a, fr, mode, sat) for a, b in zip(x, s, strict=True)]
            )
            bad = ~_same(np.asarray(got, np.float64), want)
            assert not bad.any(), (mode, sat, x[bad][:3], s[bad][:3], got[bad][:3], want[bad][:3])


def test_convert_to_block_max_abs_finite_random_blocks() -> None:
    rng = np.random.default_rng(5)
    xs = _all_values(5, 2, True, True)
    x = rng.choice(xs, (200, 4))
    specials = [
        [np.nan] * 4,
        [np.inf, -np.inf, np.nan, np.inf],
        [0.0] * 4,
        [np.nan, 1.0, -np.inf, 0.5],
        [1e-30, 0.0, 0.0, 0.0],
        [np.inf] * 4,
    ]
    x[:6] = specials
    fs, fr = (4, 1, False, True), (4, 2, True, True)
    for smode, ssat, mode, sat in [
        ("nearest_even", "sat_finite", "nearest_even", "sat_none"),
        ("up", "sat_propagate", "toward_zero", "sat_finite"),
        ("down", "sat_none", "nearest_away", "sat_propagate"),
        ("odd", "sat_finite", "up", "sat_none"),
    ]:
        s, r = pl.p3109_convert_to_block(x, _name(fs), _name(fr), block_size=4,
                                         scale_rounding=smode, scale_saturation=ssat,
                                         rounding=mode, saturation=sat)  # fmt: skip
        for i, row in enumerate(x):
            m = v4_max_abs_finite(list(row))
            want_s = v4_project(m, fs, smode, ssat) if not math.isnan(m) else math.nan
            assert _same(np.float64(s[i, 0]), np.float64(want_s)), (smode, ssat, row, s[i])
            want_r = [v4_block_project(want_s, v, fr, mode, sat) for v in row]
            assert _same(np.asarray(r[i], np.float64), np.array(want_r)).all(), (row, r[i], want_r)


@pytest.mark.parametrize(
    "mode", [*MODES, "stochastic", "stochastic_offset", "stochastic_corrected"]
)
def test_wide_scales_round_as_the_exact_quotient(mode: str) -> None:
    """16-bit scales (Binary16p11ue), elements of Binary16p11se: quotients that float64 cannot
    hold exactly, every mode (stochastic: 4 random bits, the report's R from the seeded word)."""
    rng = np.random.default_rng(16)
    fx, fs, fr = (
        pl.get_format("p3109_k16p11se"),
        pl.get_format("p3109_k16p11ue"),
        (8, 3, True, True),
    )
    x = np.asarray(pl.decode(rng.integers(0, 2**16, 3000).astype(np.uint16), fx), np.float64)
    s = np.asarray(pl.decode(rng.integers(0, 2**16, 3000).astype(np.uint16), fs), np.float64)
    keep = (
        np.isfinite(x) & np.isfinite(s) & (s != 0) & (np.abs(x / s) < 1e4) & (np.abs(x / s) > 1e-4)
    )
    x, s = x[keep], s[keep]
    inexact = sum(Fraction(a) / Fraction(b) != Fraction(a / b) for a, b in zip(x, s, strict=True))
    assert inexact > 0.9 * x.size
    n, seed = 4, 99
    r = (random_words(seed, x.size, 0) >> np.uint64(64 - n)).astype(int)
    got = pl.p3109_block_project(x, s, _name(fr), block_size=1, rounding=mode, seed=seed,
                                 random_bits=n)  # fmt: skip
    want = np.array([v4_block_project(b, a, fr, mode, "sat_none", int(ri), n)
                     for a, b, ri in zip(x, s, r, strict=True)])  # fmt: skip
    assert _same(np.asarray(got, np.float64), want).all()


def test_block_decode_is_the_exact_product_and_round_trips() -> None:
    rng = np.random.default_rng(7)
    xs = _all_values(8, 3, True, True)
    ss = _all_values(8, 1, False, True)
    x = rng.choice(xs[np.isfinite(xs)], (6, 32))
    s = rng.choice(ss[np.isfinite(ss)], (6, 4))
    z = pl.p3109_block_decode(s, x, block_size=8)
    for i in range(6):
        for j in range(32):
            assert Fraction(z[i, j]) == Fraction(s[i, j // 8]) * Fraction(x[i, j])
    # along axis 0, and the shape errors
    assert np.array_equal(pl.p3109_block_decode(s.T, x.T, block_size=8, axis=0), z.T)
    with pytest.raises(ValueError, match="multiple of block_size=5"):
        pl.p3109_block_decode(s, x, block_size=5)
    with pytest.raises(ValueError, match="one scale per block"):
        pl.p3109_block_decode(s[:, :2], x, block_size=8)
    # ConvertFromBlock: project the decoded values
    back = pl.p3109_project(
        z, "p3109_k16p5se"
    )  # (products of 3 + 1 bits, exponents 2**-145..2**142)
    assert np.array_equal(back, z)
