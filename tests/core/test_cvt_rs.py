"""pl.cvt_rs: the PTX cvt.rs conversions replayed from the kernel's random registers.

Referee: the rule stated in precision_lab.core.ptx, evaluated in exact rational arithmetic on the
format's value list (fmt.values(), no bit tricks): the two neighbours of |x| on the grid, the
exact fraction between them, away iff floor(frac * 2**N) + r >= 2**N with r the operand's field
of rbits as LAYOUTS places it; .satfinite clamps to max, NaN stays NaN.
"""

from __future__ import annotations

import bisect
import functools
import math
from fractions import Fraction

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.core.ptx import LAYOUTS, _decode_packed, cvt_rs_bits

FORMATS = ["e2m1", "e4m3", "e5m2", "bf16", "fp16"]


def _field(word: int, fmt: str, operand: int) -> int:
    """The ISA's bit positions, written out per format from the ISA sentences (not LAYOUTS)."""
    hi, lo = word >> 16, word & 0xFFFF
    if fmt == "fp16":  # 13 LSBs of each half; a: upper half
        return (hi if operand == 0 else lo) & 0x1FFF
    if fmt == "bf16":
        return hi if operand == 0 else lo
    if fmt in ("e4m3", "e5m2"):  # upper half for a, b; lower half for e, f
        return hi if operand in (0, 1) else lo
    # e2m1: upper bytes of both halves for a, b (a: the upper half's); lower bytes for e, f
    return [hi >> 8, lo >> 8, hi & 0xFF, lo & 0xFF][operand]


@functools.cache
def _grid(fmt: str) -> list[Fraction]:
    """The format's non-negative finite values, ascending, as exact rationals."""
    return [Fraction(v) for v in pl.get_format(fmt).values() if v >= 0]


def _reference(x: float, fmt: str, r: int, satfinite: bool = True) -> float:
    f = pl.get_format(fmt)
    n = LAYOUTS[fmt][1]
    if math.isnan(x):
        return math.nan
    grid = _grid(fmt)
    top = Fraction(f.max)
    sign = -1.0 if math.copysign(1.0, x) < 0 else 1.0
    if math.isinf(x):
        return sign * (float(top) if satfinite else math.inf)
    a = Fraction(abs(x))
    if a >= top:
        if a == top or satfinite:
            return sign * float(top)
        lo, hi = top, top + (top - grid[-2])  # the next binade's first step (an unbounded grid)
    else:
        i = bisect.bisect_right(grid, a) - 1
        lo, hi = grid[i], grid[i + 1]
    frac = (a - lo) / (hi - lo)
    up = frac != 0 and math.floor(frac * 2**n) + r >= 2**n
    res = hi if up else lo
    if res > top:
        return sign * math.inf
    return sign * float(res)


def _inputs(fmt: str, n: int, seed: int) -> np.ndarray:
    f = pl.get_format(fmt)
    rng = np.random.default_rng(seed)
    e = rng.integers(f.emin - f.mantissa_bits - 3, f.emax + 2, n)
    x = np.ldexp(rng.random(n) + 0.5, e) * rng.choice([-1.0, 1.0], n)
    vals = np.array(f.values())
    on_grid = rng.choice(vals[np.isfinite(vals)], n // 8)
    mids = (on_grid[:-1] + on_grid[1:]) / 2
    edge = [0.0, -0.0, f.max, -f.max, f.max * 1.01, -f.max * 1.3, np.inf, -np.inf, 2**-140]
    if f.has_nan:
        edge.append(np.nan)
    out = np.concatenate([x, on_grid, mids, edge]).astype(np.float32)
    k = LAYOUTS[fmt][0]
    return out[: out.size - out.size % k]


@pytest.mark.parametrize("fmt", FORMATS)
def test_cvt_rs_matches_exact_rule(fmt: str) -> None:
    x = _inputs(fmt, 4000, FORMATS.index(fmt))
    k = LAYOUTS[fmt][0]
    rng = np.random.default_rng(100 + FORMATS.index(fmt))
    rbits = rng.integers(0, 2**32, x.size // k, dtype=np.uint64).astype(np.uint32)
    got = pl.cvt_rs(x, fmt, rbits, output="values")
    assert got.dtype == np.float32 and got.shape == x.shape
    for i, v in enumerate(x.tolist()):
        want = _reference(v, fmt, _field(int(rbits[i // k]), fmt, i % k))
        g = float(got[i])
        assert (math.isnan(want) and math.isnan(g)) or (
            g == want and math.copysign(1, g) == math.copysign(1, want)
        ), (fmt, v, hex(int(rbits[i // k])), i % k, g, want)


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_cvt_rs_without_satfinite_overflows_to_inf(fmt: str) -> None:
    f = pl.get_format(fmt)
    x = np.array([f.max * 1.0004, -f.max * 1.0004, np.inf, 1.5], dtype=np.float32)
    rng = np.random.default_rng(7)
    rbits = rng.integers(0, 2**32, 2, dtype=np.uint64).astype(np.uint32)
    got = pl.cvt_rs(x, fmt, rbits, satfinite=False, output="values")
    for i, v in enumerate(x.tolist()):
        want = _reference(v, fmt, _field(int(rbits[i // 2]), fmt, i % 2), satfinite=False)
        assert float(got[i]) == want


def test_hand_made_cases() -> None:
    # e2m1: 1.25 is halfway between 1 and 1.5: up iff the operand's byte is >= 0x80
    x = np.full(4, 1.25, dtype=np.float32)
    assert pl.cvt_rs(x, "e2m1x4", np.uint32(0x80_7F_00_FF), output="values").tolist() == [
        1.5, 1.0, 1.0, 1.5
    ]  # fmt: skip
    # e4m3: 1 + 2**-4 is halfway between 1 and 1.125; a and b share rbits[31:16]
    x = np.full(4, 1.0625, dtype=np.float32)
    got = pl.cvt_rs(x, "e4m3x4", np.uint32(0x8000_7FFF), output="values")
    assert got.tolist() == [1.125, 1.125, 1.0, 1.0]
    # e5m2: -3.25 is halfway between -3 and -3.5: away from zero iff r >= 0x8000
    x = np.array([-3.25, -3.25, -3.25, -3.25], dtype=np.float32)
    got = pl.cvt_rs(x, "e5m2", np.uint32(0x7FFF_8000), output="values")
    assert got.tolist() == [-3.0, -3.0, -3.5, -3.5]
    # fp16: the 3 high bits of each half are ignored; 13 bits = the 13 dropped bits (exact SR)
    x = np.array([1 + 2**-11, 1 + 2**-11], dtype=np.float32)  # 1/2 of an fp16 quantum
    got = pl.cvt_rs(x, "f16x2", np.uint32(0xF000_EFFF), output="values")
    assert got.tolist() == [1 + 2**-10, 1.0]  # 0x1000 >= 0x1000; 0x0FFF < 0x1000
    # satfinite: far beyond max and inf clamp to max; exact values never move
    x = np.array([1e9, -np.inf, 6.0, -0.0], dtype=np.float32)
    assert pl.cvt_rs(x, "e2m1", np.uint32(0xFFFFFFFF), output="values").tolist() == [
        6.0, -6.0, 6.0, -0.0
    ]  # fmt: skip
    # relu: negatives and -0 become +0
    got = pl.cvt_rs(x, "e2m1", np.uint32(0xFFFFFFFF), relu=True, output="values")
    assert got.tolist() == [6.0, 0.0, 6.0, 0.0] and not np.signbit(got).any()


@pytest.mark.parametrize("fmt", FORMATS)
def test_packed_and_codes_agree(fmt: str) -> None:
    x = _inputs(fmt, 400, 3)
    x = x[~np.isnan(x)]
    k = LAYOUTS[fmt][0]
    x = x[: x.size - x.size % k].reshape(-1, k)
    rbits = (np.arange(x.shape[0], dtype=np.uint32) * np.uint32(2654435761))[:, None]
    vals = pl.cvt_rs(x, fmt, rbits, output="values")
    codes = pl.cvt_rs(x, fmt, rbits)
    packed = pl.cvt_rs(x, fmt, rbits, output="packed")
    assert packed.shape == (x.shape[0], 1)
    np.testing.assert_array_equal(pl.decode(codes, fmt), vals)
    np.testing.assert_array_equal(_decode_packed(packed, fmt).reshape(vals.shape), vals)
    assert packed.dtype == (np.uint16 if fmt == "e2m1" else np.uint32)


def test_fields_follow_the_isa_sentences() -> None:
    rng = np.random.default_rng(5)
    words = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    for fmt in FORMATS:
        k = LAYOUTS[fmt][0]
        got = cvt_rs_bits(words, fmt).reshape(-1, k)
        want = [[_field(int(w), fmt, j) for j in range(k)] for w in words]
        assert got.tolist() == want, fmt


def test_bad_arguments() -> None:
    x = np.ones(4, dtype=np.float32)
    with pytest.raises(ValueError, match=r"fmt must be a cvt\.rs destination type"):
        pl.cvt_rs(x, "e3m2", np.uint32(0))
    with pytest.raises(ValueError, match=r"requires \.satfinite"):
        pl.cvt_rs(x, "e4m3", np.uint32(0), satfinite=False)
    with pytest.raises(ValueError, match="multiple of 4"):
        pl.cvt_rs(x[:3], "e2m1", np.uint32(0))
    with pytest.raises(ValueError, match="rbits must have shape"):
        pl.cvt_rs(x, "e2m1", np.zeros(3, dtype=np.uint32))
    with pytest.raises(ValueError, match="float32 values"):
        pl.cvt_rs(np.full(2, 0.1), "bf16", np.uint32(0))
    with pytest.raises(ValueError, match="NaN"):
        pl.cvt_rs(np.array([np.nan, 1, 1, 1], dtype=np.float32), "e2m1", np.uint32(0))
    with pytest.raises(TypeError, match="rbits must hold unsigned 32-bit words"):
        pl.cvt_rs(x, "e2m1", np.float32(1.0))
    with pytest.raises(ValueError, match="output must be"):
        pl.cvt_rs(x, "e2m1", np.uint32(0), output="bits")
