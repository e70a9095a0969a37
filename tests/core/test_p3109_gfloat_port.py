"""gfloat's P3109 tests, ported to precision_lab (issue 35).

From github.com/graphcore-research/gfloat (MIT licence, copyright 2023-2024 Graphcore Ltd.),
test/test_p3109_spec.py, test/test_decode.py and test/test_round.py at b142762: the assertions
and expected values are gfloat's, the calls precision_lab's (``pl.decode``, ``pl.round_to``;
gfloat's ``sat=False`` is ``overflow="ieee"``, ``sat=True`` ``overflow="saturate"``). gfloat's
P3109 formats of signed P = K (which the 4.0 report no longer defines) are kept, as
precision_lab accepts them like gfloat; K = 2 is left out (below).
"""

from __future__ import annotations

import numpy as np
import pytest

import precision_lab as pl

# test_p3109_spec.py and test_decode.py's list of (k, p), less K = 2 (gfloat's (2, 1) and (2, 2)):
# their signed extended formats hold only zero, inf and NaN, which precision_lab refuses, and
# 4.0 defines K > 2 only
P3109_FORMATS_TO_TEST = [
    (3, 1), (3, 2), (3, 3), (4, 1), (4, 2), (4, 3), (4, 4),
    (6, 1), (6, 5), (8, 3), (8, 1), (11, 3),
]  # fmt: skip


def _dec(fmt: pl.FloatFormat, code: int) -> float:
    return float(pl.decode(np.array(code, dtype=fmt.code_dtype), fmt))


def _spec_is_normal(k: int, p: int, signed: bool, x: int, specials: set[int]) -> bool:
    """gfloat's copy of the spec's isNormal."""
    if x in specials:
        return False
    if signed:
        return (x % 2 ** (k - 1)) // 2 ** (p - 1) > 0
    return x // 2 ** (p - 1) > 0


@pytest.mark.parametrize("kp", P3109_FORMATS_TO_TEST)
@pytest.mark.parametrize("signed", [True, False])
def test_p3109_specials_is_normal(kp: tuple[int, int], signed: bool) -> None:
    k, p = kp
    fmt = pl.p3109(k, p, signed=signed, domain="extended")
    codes = np.arange(2**k, dtype=fmt.code_dtype)
    v = np.asarray(pl.decode(codes, fmt), dtype=np.float64)
    specials = {int(c) for c in codes if not np.isfinite(v[c]) or v[c] == 0}
    normal = np.isfinite(v) & (np.abs(v) >= fmt.smallest_normal)
    for c in range(2**k):
        assert _spec_is_normal(k, p, signed, c, specials) == normal[c], (k, p, signed, c)


def test_spot_check_p3109_8p3() -> None:
    fmt = pl.p3109(8, 3)
    assert _dec(fmt, 0x01) == 2.0**-17
    assert _dec(fmt, 0x40) == 1.0
    assert np.isnan(_dec(fmt, 0x80))
    assert _dec(fmt, 0xFF) == -np.inf
    assert np.floor(np.log2(_dec(fmt, 0x7E))) == fmt.emax


def test_spot_check_p3109_8p1() -> None:
    fmt = pl.p3109(8, 1)
    assert _dec(fmt, 0x01) == 2.0**-63
    assert _dec(fmt, 0x40) == 1.0
    assert np.isnan(_dec(fmt, 0x80))
    assert _dec(fmt, 0xFF) == -np.inf
    assert np.floor(np.log2(_dec(fmt, 0x7E))) == fmt.emax


@pytest.mark.parametrize("kp", P3109_FORMATS_TO_TEST)
def test_p3109_specials_signed(kp: tuple[int, int]) -> None:
    k, p = kp
    fmt = pl.p3109(k, p, signed=True, domain="extended")
    assert np.isnan(_dec(fmt, 2 ** (k - 1)))  # code_of_nan
    assert _dec(fmt, 0) == 0
    assert _dec(fmt, 2 ** (k - 1) - 1) == np.inf
    assert _dec(fmt, 2**k - 1) == -np.inf
    assert _dec(fmt, 2 ** (k - 2)) == 1.0
    fmt = pl.p3109(k, p, signed=True, domain="finite")
    assert np.isnan(_dec(fmt, 2 ** (k - 1)))
    assert _dec(fmt, 2 ** (k - 2)) == 1.0
    v = np.asarray(pl.decode(np.arange(2**k, dtype=fmt.code_dtype), fmt))
    assert not np.isinf(v).any()


@pytest.mark.parametrize("kp", P3109_FORMATS_TO_TEST)
def test_p3109_specials_unsigned(kp: tuple[int, int]) -> None:
    k, p = kp
    fmt = pl.p3109(k, p, signed=False, domain="extended")
    assert np.isnan(_dec(fmt, 2**k - 1))
    assert _dec(fmt, 0) == 0
    assert _dec(fmt, 2**k - 2) == np.inf
    assert _dec(fmt, 2 ** (k - 1)) == 1.0
    v = np.asarray(pl.decode(np.arange(2**k, dtype=fmt.code_dtype), fmt))
    assert not (v == -np.inf).any()


def test_finfo_smallest_subnormal() -> None:
    assert pl.p3109(8, 1).smallest_subnormal == 2.0**-63
    assert pl.p3109(8, 4).smallest_subnormal == 2.0**-10
    assert pl.p3109(8, 7).smallest_subnormal == 2.0**-6


def _r(fmt: str | pl.FloatFormat, v: float, mode: str = "nearest_even", sat: bool = False) -> float:
    return float(
        pl.round_to(np.float64(v), fmt, rounding=mode, overflow="saturate" if sat else "ieee")
    )


def test_round_p3109() -> None:
    fmt = pl.p3109(8, 4)
    assert fmt.max == 224.0
    for v in (0.0068359375, 0.0029296875, 0.0078125, 0.017578125, 224.0):
        assert _r(fmt, v) == v
    assert _r(fmt, 240.0) == np.inf
    assert _r(fmt, 224.1, "up") == np.inf
    assert _r(fmt, 232.0) == 224.0
    assert _r(fmt, 232.0, "nearest_away") == np.inf
    assert _r(fmt, 232.0, "toward_zero") == 224.0
    assert _r(fmt, 232.0, "down") == 224.0
    assert _r(fmt, 232.0, "up") == np.inf
    assert _r(fmt, -232.0) == -224.0
    assert _r(fmt, -232.0, "nearest_away") == -np.inf
    assert _r(fmt, -232.0, "toward_zero") == -224.0
    assert _r(fmt, -232.0, "down") == -np.inf
    assert _r(fmt, -232.0, "up") == -224.0
    assert _r(fmt, 232.1) == np.inf
    assert _r(fmt, 224.1, "odd") == np.inf
    # binary4p2se: top three values 1.0, 1.5, 2.0 (even, odd, even codes)
    f = pl.p3109(4, 2, signed=True, domain="extended")
    assert f.max == 2.0
    for v, want in ((1.0, 1.0), (1.01, 1.5), (1.5, 1.5), (1.99, 1.5), (2.0, 2.0), (2.01, np.inf)):
        assert _r(f, v, "odd") == want, v
    # binary4p2ue: top two values 4.0, 6.0 (6.0's code is odd)
    f = pl.p3109(4, 2, signed=False, domain="extended")
    assert f.max == 6.0
    for v, want in ((4.0, 4.0), (4.01, 6.0), (6.0, 6.0), (6.01, 6.0), (7.99, 6.0), (8.0, np.inf)):
        assert _r(f, v, "odd") == want, v
    # binary4p2uf: top three 4.0, 6.0, 8.0; saturating
    f = pl.p3109(4, 2, signed=False, domain="finite")
    assert f.max == 8.0
    for v, want in ((3.99, 3.0), (4.01, 6.0), (6.01, 6.0), (7.99, 6.0), (8.0, 8.0), (8.01, 8.0)):
        assert _r(f, v, "odd", sat=True) == want, v


P4MIN = 2.0**-10  # smallest subnormal of binary8p4
ROUND_P3109B = {
    "toward_zero": [
        (P4MIN, P4MIN), (P4MIN / 4, 0.0), (P4MIN / 2, 0.0), (-P4MIN, -P4MIN), (-P4MIN / 4, 0.0),
        (-P4MIN / 2, 0.0), (64.0, 64.0), (63.0, 60.0), (62.0, 60.0), (-64.0, -64.0),
        (-63.0, -60.0), (-62.0, -60.0),
    ],
    "up": [
        (P4MIN, P4MIN), (P4MIN / 4, P4MIN), (P4MIN / 2, P4MIN), (-P4MIN, -P4MIN),
        (-P4MIN / 4, 0.0), (-P4MIN / 2, 0.0), (64.0, 64.0), (63.0, 64.0), (62.0, 64.0),
        (-64.0, -64.0), (-63.0, -60.0), (-62.0, -60.0),
    ],
    "down": [
        (P4MIN, P4MIN), (P4MIN / 4, 0.0), (P4MIN / 2, 0.0), (-P4MIN, -P4MIN),
        (-P4MIN / 4, -P4MIN), (-P4MIN / 2, -P4MIN), (64.0, 64.0), (63.0, 60.0), (62.0, 60.0),
        (-64.0, -64.0), (-63.0, -64.0), (-62.0, -64.0),
    ],
    "nearest_even": [
        (P4MIN, P4MIN), (P4MIN / 4, 0.0), (P4MIN / 2, 0.0), (-P4MIN, -P4MIN), (-P4MIN / 4, 0.0),
        (-P4MIN / 2, 0.0), (64.0, 64.0), (63.0, 64.0), (62.0, 64.0), (61.0, 60.0),
        (-64.0, -64.0), (-63.0, -64.0), (-62.0, -64.0), (-61.0, -60.0), (-58.0, -56.0),
    ],
    "nearest_away": [
        (P4MIN, P4MIN), (P4MIN / 4, 0.0), (P4MIN / 2, P4MIN), (-P4MIN, -P4MIN),
        (-P4MIN / 4, 0.0), (-P4MIN / 2, -P4MIN), (64.0, 64.0), (63.0, 64.0), (62.0, 64.0),
        (61.0, 60.0), (-64.0, -64.0), (-63.0, -64.0), (-62.0, -64.0), (-61.0, -60.0),
        (-58.0, -60.0),
    ],
    "odd": [
        (P4MIN, P4MIN), (P4MIN / 4, P4MIN), (P4MIN / 2, P4MIN), (-P4MIN, -P4MIN),
        (-P4MIN / 4, -P4MIN), (-P4MIN / 2, -P4MIN), (64.0, 64.0), (63.0, 60.0), (62.0, 60.0),
        (61.0, 60.0), (-64.0, -64.0), (-63.0, -60.0), (-62.0, -60.0), (-61.0, -60.0),
        (-58.0, -60.0),
    ],
}  # fmt: skip


@pytest.mark.parametrize("mode", list(ROUND_P3109B))
def test_round_p3109b(mode: str) -> None:
    for sat in (True, False):
        for v, want in ROUND_P3109B[mode]:
            assert _r("p3109_k8p4se", v, mode, sat) == want, (v, sat)
            # the 4.0 projection agrees here (no overflow among these values)
            sat_mode = "sat_finite" if sat else "sat_none"
            got = float(pl.round_to(v, "p3109_k8p4se", rounding=mode, overflow=sat_mode))
            assert got == want, (v, sat_mode)
