"""The vectorised referee (referee_table) against the scalar Fraction referee (referee_all) it
stands in for in the exhaustive tests: every format of 16 bits or fewer, every deterministic mode
and both overflow switches, on inputs chosen where rounding rules differ: every midpoint of the
format's grid (all of them for formats of <= 8 bits, every 61st and the ends for 16-bit ones) and
its float32 and float64 neighbours, every grid value and its neighbours, the overflow threshold,
zeros, infinities, NaN, and 600 random float16 and bfloat16 patterns."""

from __future__ import annotations

import itertools
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from referee import KEYS, _grid_arrays, grid, referee_all, referee_table

import precision_lab as pl

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast")

SMALL_FORMATS = [n for n, f in pl.FORMATS.items() if f.bits <= 16]


def around(v: np.ndarray) -> np.ndarray:
    """v and its float32 and float64 neighbours, both signs."""
    v = v[np.isfinite(v)]
    v32 = v.astype(np.float32)
    near = [
        v,
        np.nextafter(v, np.inf),
        np.nextafter(v, -np.inf),
        np.nextafter(v32, np.float32(np.inf)).astype(np.float64),
        np.nextafter(v32, np.float32(-np.inf)).astype(np.float64),
    ]
    out = np.concatenate(near)
    return np.concatenate([out, -out])


def inputs(name: str) -> np.ndarray:
    fmt = pl.get_format(name)
    rng = np.random.default_rng(20261203)
    codes = rng.integers(0, 1 << 16, size=600).astype(np.uint16)
    halves = [codes.view(np.float16), codes.view(ml_dtypes.bfloat16)]
    patterns = np.concatenate([h.astype(np.float64) for h in halves])
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, 2.0**-200, 0.3, 7.5])
    if isinstance(fmt, pl.IntFormat):
        k = np.arange(fmt.min - 2, fmt.max + 3, dtype=np.float64)
        return np.concatenate([around(k), around(k + 0.5), patterns, special])
    values, _, mids = _grid_arrays(fmt)
    step = 1 if fmt.bits <= 8 else 61
    pick = np.unique(np.r_[0 : len(mids) : step, len(mids) - 8 : len(mids)].clip(0, len(mids) - 1))
    return np.concatenate([around(mids[pick]), around(values[pick]), patterns, special])


def same(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    nan = np.isnan(got) & np.isnan(want)
    return nan | ((got == want) & (np.signbit(got) == np.signbit(want)))


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_table_matches_fraction_referee(name):
    fmt = pl.get_format(name)
    x = inputs(name)
    table = referee_table(x, fmt)
    rows = [referee_all(float(v), fmt) for v in x]
    for key in KEYS:
        want = np.array([row[key] for row in rows])
        ok = same(table[key], want)
        i = np.flatnonzero(~ok)[:5]
        assert ok.all(), f"{name} {key}: x={x[i]} table={table[key][i]} fraction={want[i]}"


def test_the_sample_holds_ties_and_both_rounding_directions():
    """The sample is not all easy: for e4m3 it holds ties, and inputs just above and just below
    each of them that round to different neighbours."""
    fmt = pl.get_format("e4m3")
    x = inputs("e4m3")
    g = grid(fmt)
    mids = {(Fraction(a) + Fraction(b)) / 2 for a, b in itertools.pairwise(g.values)}
    ties = [v for v in x if np.isfinite(v) and Fraction(abs(v)) in mids]
    assert len(ties) >= 2 * 120
    t = referee_table(x, fmt)["nearest_even", "ieee"]
    assert len(np.unique(np.abs(t[np.isfinite(t)]))) == len(g.values)  # every value is reached
