"""The fast oracles of precision_lab.verify.oracles against the exact Fraction referee
(tests/referee.py): every float16 and every bfloat16 bit pattern for several formats, in every
deterministic mode and both overflow switches, and a random sample of float32 inputs; the ml_dtypes
oracle on the same patterns. These oracles judge the 2**32-input sweeps, so they are judged here
first."""

from __future__ import annotations

from functools import cache

import ml_dtypes
import numpy as np
import pytest
from referee import KEYS, referee_all, referee_table

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
    with pytest.raises(ValueError, match="signed format with zero"):
        referee(x, "e8m0")
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
