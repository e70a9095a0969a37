"""gfloat (the P3109/OCP reference code) on the OCP element formats, every rounding mode the two
share: ``round_to`` against ``gfloat.round_ndarray`` and ``encode`` against
``gfloat.encode_ndarray`` for E4M3, E5M2 (both overflow switches) and E2M3, E3M2, E2M1
(saturating: gfloat has no non-saturating conversion to a format without inf or NaN), float64
and float32 input, and stochastic rounding with gfloat's ``StochasticFastest`` fed the top bits of
the library's random words. The P3109 formats run the same comparison in
tests/core/test_formats_inputs.py; this file fills the OCP gap (issue 31)."""

from __future__ import annotations

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.core.random_words import random_words

gf = pytest.importorskip("gfloat", reason="gfloat (the [test] extra) is missing")
from gfloat import formats as gff  # noqa: E402

OCP = ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1"]
MODES = {
    "nearest_even": "TiesToEven",
    "nearest_away": "TiesToAway",
    "toward_zero": "TowardZero",
    "up": "TowardPositive",
    "down": "TowardNegative",
}


def _inputs(fmt) -> np.ndarray:
    """Grid points, midpoints, their float64 neighbours, thirds, values past max, specials."""
    v = np.unique(np.abs(fmt.values()))
    top = float(fmt.max) * 1.25
    pts = np.concatenate([v, (v[:-1] + v[1:]) / 2, [top, 3 * top, (fmt.max + top) / 2]])
    pts = np.concatenate([pts, np.nextafter(pts, np.inf), np.nextafter(pts, 0), pts / 3])
    pts = np.concatenate([pts, [0.0, 1e-300, np.inf]])
    return np.concatenate([pts, -pts, [np.nan]])


def _same(got, want) -> np.ndarray:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    nan = np.isnan(got) & np.isnan(want)
    return nan | ((got == want) & (np.signbit(got) == np.signbit(want)))


@pytest.mark.parametrize("name", OCP)
def test_ocp_formats_round_and_encode_like_gfloat(name: str) -> None:
    fmt = pl.get_format(name)
    fi = getattr(gff, f"format_info_ocp_{name}")
    x = _inputs(fmt)
    if fi.num_nans == 0:  # FP6/FP4: no NaN to give, saturating conversions only
        x = x[np.isfinite(x)]
    for mode, gmode in MODES.items():
        for sat in (False, True) if fi.num_nans else (True,):
            kw = {"rounding": mode, "overflow": "saturate" if sat else "ieee"}
            want = gf.round_ndarray(fi, x, getattr(gf.RoundMode, gmode), sat)
            got = pl.round_to(x, fmt, **kw)
            assert _same(got, want).all(), (name, kw, x[~_same(got, want)][:5])
            x32 = x.astype(np.float32)
            want32 = gf.round_ndarray(fi, x32.astype(np.float64), getattr(gf.RoundMode, gmode), sat)
            assert _same(pl.round_to(x32, fmt, **kw), want32).all(), (name, kw, "float32")
            fin = ~np.isnan(want)  # NaN codes: one canonical NaN each, compared by value above
            np.testing.assert_array_equal(
                pl.encode(x, fmt, **kw)[fin], gf.encode_ndarray(fi, want)[fin], err_msg=str(kw)
            )


@pytest.mark.parametrize("name", OCP)
@pytest.mark.parametrize("nbits", [3, 8])
def test_ocp_stochastic_rounding_like_gfloat(name: str, nbits: int) -> None:
    """gfloat's StochasticFastest (add the random integer, truncate) with the top ``nbits`` of the
    library's random words: the library's ``stochastic`` with ``random_bits=nbits``, saturating.
    Inputs: finite ones whose distance to the grid float64 holds with the random fraction (gfloat
    adds in float64; tests/core/test_formats_inputs.py handles its documented rounding there)."""
    fmt = pl.get_format(name)
    fi = getattr(gff, f"format_info_ocp_{name}")
    rng = np.random.default_rng(nbits)
    x = rng.uniform(-1, 1, 4000) * float(fmt.max) * 1.2
    x = x.astype(np.float32).astype(np.float64)  # 24-bit significands: no float64 rounding
    words = random_words(11, x.size, 0)
    srbits = (words >> np.uint64(64 - nbits)).astype(np.int64)
    want = gf.round_ndarray(fi, x, gf.RoundMode.StochasticFastest, True, srbits, nbits)
    got = pl.round_to(x, fmt, rounding="stochastic", seed=11, random_bits=nbits,
                      overflow="saturate")  # fmt: skip
    assert _same(got, want).all(), (name, x[~_same(got, want)][:5])
