"""P3109 interim report 4.0: projection (rounding, then saturation) and the stochastic roundings.

The oracle here is a transcription of the report's own definitions into exact rational
arithmetic, written from the report and nothing else: the datum set from ``ωDecode`` (4.7.6,
format parameters of 3: bias ``2**(K-P-1)`` signed, ``2**(K-P)`` unsigned), ``ωRoundToPrecision``
(4.7.4, with its ``RoundAway`` rules and ``StochasticA/B/C``) and ``ωSaturate`` (4.7.5, its
table read first-match). It knows nothing of precision_lab's formats or bit tricks. The library's
:func:`precision_lab.p3109_project` (= ``round_to(..., overflow="sat_*")``) must agree with it on
every value, midpoint, quarter point, beyond-range value and infinity of every v4 format of 3 to 6
bits, in every rounding mode, and for the stochastic modes with every 2-bit random word.

gfloat 0.5.2 (P3109 3.1's reference code) is the second oracle: its ``StochasticFastest``,
``StochasticFast``, ``Stochastic`` and ``StochasticOdd`` against ``round_with_words`` with every
random word, and its ``sat=True`` against ``sat_finite`` on signed formats.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from p3109_spec import v4_decode, v4_formats, v4_project

import precision_lab as pl
from precision_lab.core.random_words import random_words
from precision_lab.core.rounding import round_with_words

gfloat = pytest.importorskip("gfloat")
from gfloat import Domain, RoundMode, Signedness, round_ndarray  # noqa: E402
from gfloat.formats import format_info_p3109  # noqa: E402

INF, NAN = math.inf, math.nan


# --------------------------------------------------------------------------------------------

DETERMINISTIC = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")
SR = ("stochastic", "stochastic_offset", "stochastic_corrected", "stochastic_corrected_odd")
SATS = ("sat_finite", "sat_propagate", "sat_none")


def _inputs(k: int, p: int, signed: bool, ext: bool) -> np.ndarray:
    vals = sorted(
        float(v) for c in range(2**k) if isinstance(v := v4_decode(c, k, p, signed, ext), Fraction)
    )
    pos = np.array([v for v in vals if v >= 0])
    lo, hi = pos[:-1], pos[1:]
    steps = np.arange(4) / 4
    between = (lo[:, None] + (hi - lo)[:, None] * steps).ravel()
    top = pos[-1] * (1 + np.arange(1, 9) / 2.0 ** (p + 1))  # beyond the max, up to 2 ulps
    tiny = pos[1] * np.array([0.25, 0.5, 0.75])
    mags = np.concatenate([between, pos[-1:], top, tiny, [2 * pos[-1], 1e30, INF]])
    return np.concatenate([mags, -mags, [NAN, -0.0]])


def _same(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return (got == want) | (np.isnan(got) & np.isnan(want))


#: every 4.0 format of 3 to 5 bits, and the 6-bit ones of precision 1, 3 and 6 (the suite's time)
ALL_SMALL = [f for k in range(3, 7) for f in v4_formats(k) if k < 6 or f[1] in (1, 3, 6)]


def _name(f: tuple[int, int, bool, bool]) -> str:
    k, p, signed, ext = f
    return f"p3109_k{k}p{p}{'s' if signed else 'u'}{'e' if ext else 'f'}"


@pytest.mark.parametrize("fmt", ALL_SMALL, ids=_name)
def test_project_deterministic_modes_equal_the_report(fmt: tuple[int, int, bool, bool]) -> None:
    x = _inputs(*fmt)
    for mode in DETERMINISTIC:
        for sat in SATS:
            want = np.array([v4_project(float(v), fmt, mode, sat) for v in x])
            got = np.asarray(pl.p3109_project(x, _name(fmt), rounding=mode, saturation=sat))
            bad = ~_same(got.astype(np.float64), want)
            assert not bad.any(), (mode, sat, x[bad][:4], got[bad][:4], want[bad][:4])


@pytest.mark.parametrize("fmt", [f for f in ALL_SMALL if f[0] == 4 or f[:2] == (6, 3)], ids=_name)
def test_project_stochastic_modes_equal_the_report(fmt: tuple[int, int, bool, bool]) -> None:
    x = _inputs(*fmt)
    n = 2
    seed = 1234
    words = random_words(seed, x.size, 0)
    r = (words >> np.uint64(64 - n)).astype(int)
    for mode in SR:
        for sat in SATS:
            pairs = zip(x, r, strict=True)
            want = np.array([v4_project(float(v), fmt, mode, sat, int(ri), n) for v, ri in pairs])
            got = pl.round_to(x, _name(fmt), rounding=mode, overflow=sat, seed=seed, random_bits=n)
            bad = ~_same(np.asarray(got, dtype=np.float64), want)
            assert not bad.any(), (mode, sat, x[bad][:4], got[bad][:4], want[bad][:4])


def test_saturation_names_and_errors() -> None:
    x = np.array([1e6, -np.inf, np.inf])
    for name in ("SatPropagate", "sat_propagate", "satpropagate"):
        assert pl.round_to(x, "p3109_k8p3se", overflow=name).tolist() == [49152.0, -INF, INF]
    assert pl.round_to(x, "p3109_k8p3se", overflow="SatFinite").tolist() == [
        49152.0,
        -49152.0,
        49152.0,
    ]
    # 3.x's OvfInf is overflow="ieee" (gfloat's sat=False): NaN in the finite domain, 4.0: max
    assert np.isnan(pl.round_to(1e6, "p3109_k8p3sf", overflow="OvfInf"))
    assert float(pl.round_to(1e6, "p3109_k8p3sf", overflow="SatNone")) == 57344.0
    with pytest.raises(ValueError, match="P3109 format"):
        pl.round_to(x, "e4m3", overflow="sat_none")
    with pytest.raises(ValueError, match="subnormals must be 'keep'"):
        pl.round_to(x, "p3109_k8p3se", overflow="sat_none", subnormals="flush")
    with pytest.raises(ValueError, match="saturation must be one of"):
        pl.p3109_project(x, "p3109_k8p3se", saturation="saturate")
    assert pl.P3109_SATURATION_MODES == ("sat_finite", "sat_propagate", "sat_none")
    # 0-d, float32 and integer input
    assert float(pl.p3109_project(np.float32(-3.0), "p3109_k8p3ue", saturation="sat_finite")) == 0.0
    assert pl.p3109_project([3, -1], "p3109_k8p3ue").tolist()[0] == 3.0


def test_sat_none_differs_from_ieee_only_where_the_report_changed() -> None:
    """The three differences named in p3109_project's docstring, each pinned."""
    assert float(pl.round_to(8.0, "p3109_k4p2ue", rounding="odd")) == INF  # ieee: as gfloat
    assert float(pl.round_to(8.0, "p3109_k4p2ue", rounding="odd", overflow="sat_none")) == 6.0
    assert float(pl.round_to(-1e-20, "p3109_k8p3ue", overflow="sat_none")) == 0.0
    assert np.isnan(pl.round_to(-1e-20, "p3109_k8p3ue"))


# --------------------------------------------------------------------------------------------
# gfloat 0.5.2 as the second oracle

GFLOAT_SR = {
    "stochastic_fastest": RoundMode.StochasticFastest,
    "stochastic_fast": RoundMode.StochasticFast,
    "stochastic_c": RoundMode.Stochastic,
    "stochastic_odd": RoundMode.StochasticOdd,
}


@pytest.mark.parametrize("kp", [(6, 3), (8, 3), (8, 4)])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_sr_modes_equal_gfloat_for_every_word(kp: tuple[int, int], n: int) -> None:
    k, p = kp
    fi = format_info_p3109(k, p, Signedness.Signed, Domain.Extended)
    vals = np.asarray(pl.p3109(k, p).values(), dtype=np.float64)
    lo, hi = vals[:-1], vals[1:]
    x = (lo[:, None] + (hi - lo)[:, None] * np.arange(64) / 64).ravel()
    for name, rm in GFLOAT_SR.items():
        for r in range(2**n):
            w = np.full(x.shape, r, dtype=np.uint64) << np.uint64(64 - n)
            for dt in (np.float32, np.float64):
                xd = x.astype(dt)
                got = round_with_words(xd, pl.p3109(k, p), w, rounding=name, random_bits=n)
                want = round_ndarray(
                    fi, xd.astype(np.float64), rm, srbits=np.full(x.shape, r), srnumbits=n
                )
                assert _same(got.astype(np.float64), want).all(), (name, r, dt)


def test_stochastic_odd_differs_from_stochastic_c_only_on_ties() -> None:
    """A fraction of exactly 1/8 quantum with N = 2: C rounds 0.5 to 0 (even), Odd to 1."""
    x = np.full(4, 1.0 + 2.0**-3 * 2.0**-2)  # k8p3: quantum 0.25 at 1; nu = 1/8, nu*4 = 1/2
    w = np.arange(4, dtype=np.uint64) << np.uint64(62)
    c = round_with_words(x, "p3109_k8p3se", w, rounding="stochastic_c", random_bits=2)
    o = round_with_words(x, "p3109_k8p3se", w, rounding="stochastic_odd", random_bits=2)
    assert c.tolist() == [1.0, 1.0, 1.0, 1.0]
    assert o.tolist() == [1.0, 1.0, 1.0, 1.25]


def test_stochastic_odd_is_seeded_and_numpy_served_on_every_backend() -> None:
    x = np.linspace(0.1, 3.0, 1000).astype(np.float32)
    a = pl.round_to(x, "e4m3", rounding="stochastic_odd", random_bits=3, seed=7)
    with pl.use_backend("numpy"):
        b = pl.round_to(x, "e4m3", rounding="srco", random_bits=3, seed=7)
    assert np.array_equal(a, b)
    codes = pl.encode(x, "e4m3", rounding="stochastic_corrected_odd", random_bits=3, seed=7)
    assert np.array_equal(pl.decode(codes, "e4m3"), a)
    # 64 bits: every variant is SRFF (stochastic)
    s = pl.round_to(x, "e4m3", rounding="stochastic", seed=7)
    assert np.array_equal(pl.round_to(x, "e4m3", rounding="stochastic_odd", seed=7), s)
    # accumulators: 64 bits is "stochastic"; few-bit variants are refused, this one too
    assert pl.Accumulator(format="fp16", rounding="stochastic_odd").rounding == "stochastic"
    with pytest.raises(ValueError, match="not supported by accumulators"):
        pl.Accumulator(format="fp16", rounding="stochastic_odd", random_bits=4)


@pytest.mark.parametrize("kp", [(4, 2), (6, 3), (8, 3), (8, 4)])
def test_sat_finite_equals_gfloat_sat_true(kp: tuple[int, int]) -> None:
    k, p = kp
    for domain in (Domain.Extended, Domain.Finite):
        fi = format_info_p3109(k, p, Signedness.Signed, domain)
        name = _name((k, p, True, domain == Domain.Extended))
        x = _inputs(k, p, True, domain == Domain.Extended)
        for mode, rm in [
            ("nearest_even", RoundMode.TiesToEven),
            ("nearest_away", RoundMode.TiesToAway),
            ("toward_zero", RoundMode.TowardZero),
            ("up", RoundMode.TowardPositive),
            ("down", RoundMode.TowardNegative),
        ] + ([("odd", RoundMode.ToOdd)] if hasattr(RoundMode, "ToOdd") else []):
            got = pl.round_to(x, name, rounding=mode, overflow="SatFinite")
            want = round_ndarray(fi, x, rm, sat=True)
            assert _same(np.asarray(got), want).all(), (name, mode)


def test_p3109_rounding_names() -> None:
    assert pl.P3109_ROUNDING_MODES["StochasticA"] == "stochastic"
    for p3109_name, mode in pl.P3109_ROUNDING_MODES.items():
        if p3109_name == "Stochastic":  # "stochastic" is SRFF here: P3109's is "stochastic_c"
            continue
        snake = "".join("_" + c.lower() if c.isupper() else c for c in p3109_name).lstrip("_")
        assert pl.core.rounding.check_rounding(snake) == mode, p3109_name


def test_stochastic_odd_few_bits_in_the_block_quantizers() -> None:
    """The block kernels have no mode number for it: they decline, and numpy serves (before, the
    native pass raised "tuple.index(x): x not in tuple")."""
    x = np.linspace(-3.0, 3.0, 64).reshape(2, 32)
    a = pl.round_to_blocks(x, "mxfp8_e4m3", rounding="srco", random_bits=4, seed=1)
    with pl.use_backend("numpy"):
        b = pl.round_to_blocks(x, "mxfp8_e4m3", rounding="srco", random_bits=4, seed=1)
    assert np.array_equal(a, b)
