"""The fast oracles of precision_lab.verify.oracles against the exact Fraction referee
(tests/referee.py): every float16 and every bfloat16 bit pattern for several formats, in every
deterministic mode and both overflow switches, and a random sample of float32 inputs; the ml_dtypes
oracle on the same patterns. These oracles judge the 2**32-input sweeps, so they are judged here
first."""

from __future__ import annotations

import math
from functools import cache

import ml_dtypes
import numpy as np
import pytest
from referee import KEYS, referee_all, referee_formula, referee_table

import precision_lab as pl
from precision_lab.verify.oracles import ml_dtypes_oracle, nan_codes, referee

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast")

# one format of each NaN style: fn, ieee, fnuz, none (and fp16's wide exponent from bfloat16)
FORMATS = {"fp16": ["e4m3", "e2m1"], "bf16": ["e5m2", "e4m3fnuz", "fp16"]}


def patterns(source: str) -> np.ndarray:
    dtype = np.float16 if source == "fp16" else ml_dtypes.bfloat16
    return np.arange(1 << 16, dtype=np.uint16).view(dtype).astype(np.float32)


@cache
def fraction_table(source: str, name: str) -> dict[tuple[str, str], np.ndarray]:
    """The Fraction referee's answer for every pattern, each mode and overflow switch (its
    vectorised form, checked against the scalar one in tests/core/test_referee.py)."""
    return referee_table(patterns(source), pl.get_format(name))


def same(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    got, want = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(got) & np.isnan(want)
    return nan | ((got == want) & (np.signbit(got) == np.signbit(want)))


def first_wrong(x, got, want, ok) -> str:
    i = np.flatnonzero(~ok)[:5]
    return f"{(~ok).sum()} wrong, e.g. x={x[i]} got={got[i]} want={want[i]}"


@pytest.mark.parametrize(("source", "name"), [(s, n) for s, ns in FORMATS.items() for n in ns])
def test_referee_matches_fraction_referee_on_every_pattern(source, name):
    x = patterns(source)
    fmt = pl.get_format(name)
    table = fraction_table(source, name)
    for mode, overflow in KEYS:
        want = table[mode, overflow]
        got, codes = referee(x, fmt, mode=mode, overflow=overflow)
        ok = same(got, want)
        assert ok.all(), f"{source}->{name} {mode}/{overflow}: {first_wrong(x, got, want, ok)}"
        # the codes are those of the values: decode them with the format's own table
        keep = ~np.isnan(x) if fmt.nan == "none" else slice(None)
        back = pl.decode(codes[keep], fmt)
        ok = same(back, want[keep])
        assert ok.all(), f"codes {source}->{name} {mode}/{overflow}"
        # NaN codes keep the sign of a NaN result in formats with signed NaN
        if fmt.nan in ("ieee", "fn"):
            nan = np.isnan(want)
            sign = codes[nan].astype(np.int64) >> (fmt.bits - 1)
            assert (sign == np.signbit(got[nan])).all()


def test_referee_flush_matches_fraction_referee_with_flushing():
    x = patterns("fp16")
    fmt = pl.get_format("e4m3")
    table = fraction_table("fp16", "e4m3")
    for mode, overflow in KEYS:
        want = table[mode, overflow].copy()
        tiny = np.abs(want) < fmt.smallest_normal  # subnormal results flush, keeping the sign
        want[tiny] = np.copysign(0.0, want[tiny])
        got, _ = referee(x, fmt, mode=mode, overflow=overflow, subnormals="flush")
        assert same(got, want).all(), f"{mode}/{overflow}"


def test_referee_matches_fraction_referee_on_float32_sample():
    rng = np.random.default_rng(20261203)
    bits = rng.integers(0, 1 << 32, size=3000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    for name in ("e4m3", "bf16", "e3m2"):
        fmt = pl.get_format(name)
        rows = [referee_all(float(v), fmt) for v in x]
        for mode, overflow in KEYS:
            want = np.array([r[mode, overflow] for r in rows])
            got, _ = referee(x, fmt, mode=mode, overflow=overflow)
            ok = same(got, want)
            assert ok.all(), f"{name} {mode}/{overflow}: {first_wrong(x, got, want, ok)}"


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e4m3fnuz", "e2m1", "bf16"])
@pytest.mark.parametrize("overflow", ["ieee", "saturate"])
def test_ml_dtypes_oracle_matches_fast_referee(name, overflow):
    x = patterns("bf16")
    fmt = pl.get_format(name)
    if fmt.nan == "none":  # ml_dtypes turns NaN into a number there
        x = x[~np.isnan(x)]
    want, want_codes = referee(x, fmt, overflow=overflow)
    got, codes = ml_dtypes_oracle(x, fmt, overflow=overflow)
    ok = same(got, want)
    assert ok.all(), first_wrong(x, got, want, ok)
    nan = nan_codes(codes, fmt)
    assert (nan == np.isnan(want)).all()
    assert (codes[~nan] == want_codes[~nan]).all()


def test_oracles_refuse_what_they_cannot_check():
    x = np.ones(3, dtype=np.float32)
    with pytest.raises(ValueError, match="nearest even only"):
        ml_dtypes_oracle(x, "e4m3", mode="up")
    with pytest.raises(ValueError, match="ml_dtypes oracle knows"):
        ml_dtypes_oracle(x, "tf32")
    with pytest.raises(ValueError, match="format with zero and subnormals, got e8m0"):
        referee(x, "e8m0")
    with pytest.raises(ValueError, match="format with zero and subnormals"):
        referee(x, pl.FloatFormat(4, 3, has_subnormals=False))
    with pytest.raises(ValueError, match="named like a P3109 format"):  # name and layout differ
        referee(x, pl.FloatFormat(4, 3, name="p3109_k8p3se"))
    with pytest.raises(ValueError, match="overflow"):
        referee(x, "e4m3", overflow="clamp")
    with pytest.raises(ValueError, match="subnormals"):
        referee(np.array([5e-324]), "e4m3")


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "bf16", "fp16"])
def test_torch_oracle_matches_fast_referee_when_saturating(name):
    pytest.importorskip("torch")
    from precision_lab.verify.oracles import torch_oracle

    x = patterns("bf16")
    fmt = pl.get_format(name)
    want, want_codes = referee(x, fmt, overflow="saturate")
    got, codes = torch_oracle(x, fmt, overflow="saturate")
    ok = same(got, want)
    assert ok.all(), first_wrong(x, got, want, ok)
    nan = np.isnan(want)
    assert (codes[~nan] == want_codes[~nan]).all()


# ----- P3109 formats: a table from the specification, and gfloat ---------------------------------
P3109 = [
    "p3109_k8p3se",  # the issue's 768 false mismatches (inf code)
    "p3109_k8p4se",
    "p3109_k6p3se",
    "p3109_k8p8se",  # one exponent bit; its inf code 0x7F was given as 0
    "p3109_k8p1se",  # p = 1: ties on the exponent field's parity
    "p3109_k8p1sf",
    "p3109_k8p3sf",
    "p3109_k8p3ue",
    "p3109_k8p1uf",
    "p3109_k4p2ue",
    "p3109_k3p3se",  # no exponent bits: every value subnormal
    "p3109_k5p2sf",
]


@cache
def p3109_spec_table(name: str) -> tuple[np.ndarray, np.ndarray, int, int, bool, bool]:
    """(magnitudes, their codes) of a P3109 format read from the specification's decoding of
    each code, the grid continued past max with an unbounded exponent, and (inf code, NaN code,
    signed, extended). Written from the P3109 interim report, not from precision_lab."""
    k, p = (int(v) for v in name[len("p3109_k") :].rstrip("seuf").split("p"))
    signed, extended = name[-2] == "s", name[-1] == "e"
    m = p - 1
    bias = (2 ** (k - p - 1) if k > p else 0) if signed else 2 ** (k - p)
    n_mag = 2 ** (k - 1) if signed else 2**k
    nan = 2 ** (k - 1) if signed else 2**k - 1
    inf = (2 ** (k - 1) - 1 if signed else 2**k - 2) if extended else -1
    finite = [c for c in range(n_mag) if c not in (nan, inf)]
    top = max(finite)
    codes = finite + list(range(top + 1, top + 2 ** (p + 1) + 4))  # unbounded exponent

    def value(c: int) -> float:
        field, t = c >> m, c % 2**m
        if field == 0:
            return math.ldexp(t, 1 - bias - m)
        return math.ldexp(2**m + t, field - bias - m)

    return np.array([value(c) for c in codes]), np.array(codes), top, inf, nan, signed


def p3109_spec_round(x: np.ndarray, name: str, mode: str, overflow: str):
    """Values and codes of ``x`` rounded to a P3109 format by the table: exact neighbours,
    distances compared in float64 (exact: every value, input and midpoint is a float64)."""
    vals, codes, top, inf, nan, signed = p3109_spec_table(name)
    vmax = vals[list(codes).index(top)]
    a = np.abs(x.astype(np.float64))
    neg = np.signbit(x)
    fin = np.isfinite(a)
    af = np.where(fin, a, 0.0)
    i = np.clip(np.searchsorted(vals, af, side="right") - 1, 0, len(vals) - 2)
    lo, hi = vals[i], vals[i + 1]
    exact = lo == af
    lo_odd = codes[i] % 2 == 1
    below, above = af - lo, hi - af
    if mode == "nearest_even":
        up = (above < below) | ((above == below) & lo_odd)
    elif mode == "nearest_away":
        up = above <= below
    elif mode == "nearest_zero":
        up = above < below
    elif mode == "toward_zero":
        up = np.zeros_like(exact)
    elif mode == "up":
        up = ~neg
    elif mode == "down":
        up = neg.copy()
    else:  # odd
        up = ~lo_odd
    up &= ~exact
    r = np.where(up, hi, lo)
    rc = np.where(up, codes[i + 1], codes[i])
    stay = overflow == "saturate" or mode == "toward_zero"
    stay_here = stay | ((mode == "up") & neg) | ((mode == "down") & ~neg)
    beyond_v, beyond_c = (np.inf, inf) if inf >= 0 else (np.nan, nan)
    over = fin & (r > vmax)
    r = np.where(over, np.where(stay_here, vmax, beyond_v), r)
    rc = np.where(over, np.where(stay_here, top, beyond_c), rc)
    r = np.where(np.isinf(a), vmax if overflow == "saturate" else beyond_v, r)
    rc = np.where(np.isinf(a), top if overflow == "saturate" else beyond_c, rc)
    r = np.where(np.isnan(a), np.nan, r)
    rc = np.where(np.isnan(a), nan, rc)
    if not signed:  # unsigned: a negative number has no value
        bad = neg & (a != 0)
        r, rc = np.where(bad, np.nan, r), np.where(bad, nan, rc)
    else:
        sign = neg & ~np.isnan(r) & (r != 0)
        r = np.where(sign, -r, r)
        rc = np.where(sign & (rc != nan), rc + 2 ** (k_of(name) - 1), rc)
    return r, rc


def k_of(name: str) -> int:
    return int(name[len("p3109_k") :].split("p")[0])


@pytest.mark.parametrize("name", P3109)
def test_referee_matches_p3109_spec_table_on_every_float16(name):
    """Issue 19 item 1: the inf code of the extended domain (k8p3se gave 124, k8p8se 0) and
    the ties of p = 1 (1.5 * 2**-62 in k8p1se), every mode (round to odd overflowing to inf),
    both overflow switches, every float16 pattern, values and codes."""
    x = patterns("fp16")
    fmt = pl.get_format(name)
    for mode, overflow in KEYS:
        want, want_codes = p3109_spec_round(x, name, mode, overflow)
        got, codes = referee(x, fmt, mode=mode, overflow=overflow)
        ok = same(got, want)
        assert ok.all(), f"{name} {mode}/{overflow}: {first_wrong(x, got, want, ok)}"
        bad = codes.astype(np.int64) != want_codes
        assert not bad.any(), (
            f"{name} {mode}/{overflow} codes: {first_wrong(x, codes, want_codes, ~bad)}"
        )


def test_referee_p3109_cases_of_the_issue():
    f32 = np.float32
    v, c = referee(np.array([np.inf, -np.inf], dtype=f32), "p3109_k8p3se")
    assert c.tolist() == [0x7F, 0xFF]
    assert referee(np.array([np.inf], dtype=f32), "p3109_k8p8se")[1].tolist() == [0x7F]
    assert referee(np.array([np.inf], dtype=f32), "p3109_k8p3ue")[1].tolist() == [0xFE]
    v, _ = referee(np.array([1.5 * 2.0**-62], dtype=f32), "p3109_k8p1se")
    assert v.tolist() == [2.0**-62]
    # round to odd overflows to inf in P3109 (224.1, 232, 240 in k8p4se), to max elsewhere;
    # e4m3fnuz is laid out as P3109 K8P4 in the finite domain (NaN), e4m3 is not (max)
    x = np.array([224.1, 232.0, -240.0, 224.0], dtype=f32)
    assert referee(x, "p3109_k8p4se", mode="odd")[0].tolist() == [np.inf, np.inf, -np.inf, 224.0]
    assert referee(np.array([2.01], dtype=f32), "p3109_k4p2se", mode="odd")[0].tolist() == [np.inf]
    assert referee(np.array([8.0], dtype=f32), "p3109_k4p2ue", mode="odd")[0].tolist() == [np.inf]
    assert np.isnan(referee(np.array([500.0], dtype=f32), "e4m3fnuz", mode="odd")[0]).all()
    assert referee(np.array([500.0], dtype=f32), "e4m3", mode="odd")[0].tolist() == [448.0]
    assert referee(np.array([500.0], dtype=f32), "e4m3b11fnuz", mode="odd")[0].tolist() == [30.0]


def _gfloat_info(name: str):
    from gfloat import Domain, Signedness
    from gfloat.formats import format_info_p3109

    k, p = (int(v) for v in name[len("p3109_k") :].rstrip("seuf").split("p"))
    s = Signedness.Signed if name[-2] == "s" else Signedness.Unsigned
    d = Domain.Extended if name[-1] == "e" else Domain.Finite
    return format_info_p3109(k, p, s, d)


@pytest.mark.parametrize("name", P3109)
def test_referee_matches_gfloat_on_p3109(name):
    """A second, independent check of P3109 values and codes: gfloat (it has no round to odd
    nor ties to zero; unsigned formats get non-negative inputs only, gfloat's domain)."""
    gfloat = pytest.importorskip("gfloat")
    from gfloat import RoundMode

    fi = _gfloat_info(name)
    fmt = pl.get_format(name)
    x = patterns("fp16")
    if not fmt.signed:
        x = x[~np.signbit(x)]
    gmodes = {
        "nearest_even": RoundMode.TiesToEven,
        "nearest_away": RoundMode.TiesToAway,
        "toward_zero": RoundMode.TowardZero,
        "up": RoundMode.TowardPositive,
        "down": RoundMode.TowardNegative,
    }
    for mode, rnd in gmodes.items():
        for overflow in ("ieee", "saturate"):
            want = gfloat.round_ndarray(fi, x.astype(np.float64), rnd, overflow == "saturate")
            want_codes = gfloat.encode_ndarray(fi, want)
            got, codes = referee(x, fmt, mode=mode, overflow=overflow)
            ok = same(got, want)
            assert ok.all(), f"{name} {mode}/{overflow}: {first_wrong(x, got, want, ok)}"
            ok = codes.astype(np.int64) == np.asarray(want_codes).astype(np.int64)
            ok |= nan_codes(codes, fmt) & np.isnan(want)
            assert ok.all(), f"{name} {mode}/{overflow} codes"


@pytest.mark.parametrize("name", ["fp32", "tf32", "fp64", "p3109_k16p11se", "p3109_k60p53se"])
def test_referee_wide_formats(name):
    """Formats beyond the old 50-mantissa-bit limit (fp64, p3109_k60p53se were refused) and wide
    P3109 formats, against the Fraction referee's formula on a float32 sample."""
    rng = np.random.default_rng(19)
    x = rng.integers(0, 1 << 32, size=600, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([x, np.float32([65504.0, 65520.0, -65536.0, 1e38, 3e-39, np.inf])])
    fmt = pl.get_format(name)
    for mode, overflow in KEYS:
        if name.startswith("p3109") and mode == "odd" and overflow == "ieee":
            continue  # tests/referee.py keeps the IEEE-style odd overflow (to max)
        want = np.array([referee_formula(float(v), fmt, mode, overflow) for v in x])
        got, _ = referee(x, fmt, mode=mode, overflow=overflow)
        ok = same(got, want)
        assert ok.all(), f"{name} {mode}/{overflow}: {first_wrong(x, got, want, ok)}"
