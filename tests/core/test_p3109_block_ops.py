"""P3109 interim report 4.0, clauses 5.3-5.5: block reductions, dot product, BlockOp, ScaledOp.

``pl.p3109_block_reduce_add`` / ``_multiply`` (5.3.1), ``pl.p3109_block_dot`` (5.3.2),
``pl.p3109_block_op`` (5.4) and ``pl.p3109_scaled_op`` (5.5) against the transcription in
exact rational arithmetic (tests/p3109_spec.py: the ω tables of clause 4 row by row, clause 5's
``reduce``, ``ωBlockDecode``, ``ωBlockProject``, ``ωProject``): every block of two elements of
Binary4p2se under every scale of Binary3p1ue (NaN, inf, zero scales) in every deterministic mode
and saturation; every single-element product of 3-bit operands and scales; random blocks with
specials by hypothesis; sums float64 cannot hold; stochastic rounding with the seeded words.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from p3109_spec import (
    v4_block_dot,
    v4_block_op,
    v4_block_reduce_add,
    v4_block_reduce_multiply,
    v4_decode,
)

import precision_lab as pl
from precision_lab.core.random_words import random_words

MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")
SATS = ("sat_finite", "sat_propagate", "sat_none")
Fmt = tuple[int, int, bool, bool]


def _values(k: int, p: int, signed: bool, ext: bool) -> np.ndarray:
    return np.array([float(v4_decode(c, k, p, signed, ext)) for c in range(2**k)])


def _name(f: Fmt) -> str:
    k, p, signed, ext = f
    return f"p3109_k{k}p{p}{'s' if signed else 'u'}{'e' if ext else 'f'}"


def _same(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return (got == want) | (np.isnan(got) & np.isnan(want))


OUTS = [(4, 2, True, True), (3, 1, False, False), (5, 3, True, False)]


@pytest.mark.parametrize("fr", OUTS, ids=_name)
def test_reduce_add_and_multiply_every_block_of_two(fr: Fmt) -> None:
    """Every (s, [x1, x2]): x from Binary3p2se (NaN, ±inf, 0, ±0.5, ±1), s from Binary3p1ue."""
    xs, ss = _values(3, 2, True, True), _values(3, 1, False, True)
    grid = np.array(list(itertools.product(ss, xs, xs)))
    s, x = grid[:, :1], grid[:, 1:]
    for mode, sat in itertools.product(MODES, SATS):
        kw = {"block_size": 2, "rounding": mode, "saturation": sat}
        got_add = pl.p3109_block_reduce_add(s, x, _name(fr), **kw)[:, 0]
        got_mul = pl.p3109_block_reduce_multiply(s, x, _name(fr), **kw)[:, 0]
        pairs = [(a[0], list(b)) for a, b in zip(s, x, strict=True)]
        want_add = [v4_block_reduce_add(a, b, fr, mode, sat) for a, b in pairs]
        want_mul = [v4_block_reduce_multiply(a, b, fr, mode, sat) for a, b in pairs]
        bad = ~_same(got_add, want_add)
        assert not bad.any(), ("add", mode, sat, s[bad][:3], x[bad][:3], got_add[bad][:3])
        bad = ~_same(got_mul, want_mul)
        assert not bad.any(), ("mul", mode, sat, s[bad][:3], x[bad][:3], got_mul[bad][:3])


def test_dot_every_single_product_of_3_bit_operands() -> None:
    """B = 1: every (sx, x, sy, y) of Binary3p2se elements and Binary3p1ue scales."""
    xs, ss = _values(3, 2, True, True), _values(3, 1, False, True)
    g = np.array(list(itertools.product(ss, xs, ss, xs)))
    fr = (4, 2, True, True)
    for mode, sat in zip(MODES, itertools.cycle(SATS)):
        got = pl.p3109_block_dot(g[:, 0], g[:, 1], g[:, 2], g[:, 3], _name(fr), block_size=1,
                                 rounding=mode, saturation=sat)  # fmt: skip
        want = [v4_block_dot(a, [b], c, [d], fr, mode, sat) for a, b, c, d in g]
        bad = ~_same(got, want)
        assert not bad.any(), (mode, sat, g[bad][:3], got[bad][:3])


_X8 = _values(8, 3, True, True)
_S8 = _values(8, 1, False, True)
_S8 = _S8[np.abs(np.log2(np.where(_S8 > 0, _S8, 1.0))) <= 20]  # NaN, inf, 0, 2**-20..2**20


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    block=st.integers(1, 12),
    n_blocks=st.integers(1, 4),
    fr=st.sampled_from(
        [(8, 3, True, True), (8, 4, True, False), (8, 3, False, True), (6, 3, False, False)]
    ),
    mode=st.sampled_from(MODES),
    sat=st.sampled_from(SATS),
)  # fmt: skip
def test_reductions_and_dot_random_blocks(data, block, n_blocks, fr, mode, sat) -> None:  # type: ignore[no-untyped-def]
    """Blocks of Binary8p3se values (specials included) under Binary8p1ue scales."""
    idx = st.integers(0, _X8.size - 1)
    x = _X8[data.draw(st.lists(idx, min_size=block * n_blocks, max_size=block * n_blocks))]
    y = _X8[data.draw(st.lists(idx, min_size=block * n_blocks, max_size=block * n_blocks))]
    sidx = st.integers(0, _S8.size - 1)
    sx = _S8[data.draw(st.lists(sidx, min_size=n_blocks, max_size=n_blocks))]
    sy = _S8[data.draw(st.lists(sidx, min_size=n_blocks, max_size=n_blocks))]
    kw = {"block_size": block, "rounding": mode, "saturation": sat}
    xb, yb = x.reshape(n_blocks, block), y.reshape(n_blocks, block)
    got = pl.p3109_block_reduce_add(sx, x, _name(fr), **kw)
    want = [v4_block_reduce_add(a, list(b), fr, mode, sat) for a, b in zip(sx, xb, strict=True)]
    assert _same(got, want).all(), (sx, xb, got, want)
    if block <= 4:  # products of many values leave float64 (and the oracle's log2)
        got = pl.p3109_block_reduce_multiply(sx, x, _name(fr), **kw)
        want = [
            v4_block_reduce_multiply(a, list(b), fr, mode, sat) for a, b in zip(sx, xb, strict=True)
        ]
        assert _same(got, want).all(), (sx, xb, got, want)
    got = pl.p3109_block_dot(sx, x, sy, y, _name(fr), **kw)
    want = [v4_block_dot(a, list(b), c, list(d), fr, mode, sat)
            for a, b, c, d in zip(sx, xb, sy, yb, strict=True)]  # fmt: skip
    assert _same(got, want).all(), (sx, xb, sy, yb, got, want)


def test_sums_float64_cannot_hold_are_rounded_once() -> None:
    """Exact sums, one projection: a float64 sum (np.sum, then project) loses the low terms."""
    x = np.array([[1.0, 2.0**-60, 2.0**-60, -(2.0**-61)], [1.0, -(2.0**-70), 0.0, 0.0]])
    s = np.ones((2, 1))
    fr = (8, 3, True, True)
    for mode in MODES:
        got = pl.p3109_block_reduce_add(s, x, _name(fr), block_size=4, rounding=mode)[:, 0]
        want = [v4_block_reduce_add(1.0, list(row), fr, mode, "sat_none") for row in x]
        assert _same(got, want).all(), (mode, got, want)
    up = pl.p3109_block_reduce_add(s, x, _name(fr), block_size=4, rounding="up")[:, 0]
    assert up.tolist() == [1.25, 1.0]  # float64's sum is 1.0 in both rows
    down = pl.p3109_block_reduce_add(s, x, _name(fr), block_size=4, rounding="down")[:, 0]
    assert down.tolist() == [1.0, 0.875]
    # the dot product of wide operands (Binary16p11se values, 16-bit scales): exact, once
    rng = np.random.default_rng(3)
    fx, fs = pl.get_format("p3109_k16p11se"), pl.get_format("p3109_k16p11ue")
    xv = np.asarray(pl.decode(rng.integers(0, 2**15, (40, 8)).astype(np.uint16), fx), np.float64)
    yv = np.asarray(pl.decode(rng.integers(0, 2**15, (40, 8)).astype(np.uint16), fx), np.float64)
    sv = np.asarray(
        pl.decode(rng.integers(2**14, 2**15, (40, 2)).astype(np.uint16), fs), np.float64
    )
    xv, yv = np.where(np.isfinite(xv), xv, 1.0), np.where(np.isfinite(yv), yv, -1.0)
    for mode in MODES:
        got = pl.p3109_block_dot(sv[:, :1], xv, sv[:, 1:], yv, "p3109_k16p11se", block_size=8,
                                 rounding=mode)[:, 0]  # fmt: skip
        want = [v4_block_dot(a[0], list(b), a[1], list(c), (16, 11, True, True), mode, "sat_none")
                for a, b, c in zip(sv, xv, yv, strict=True)]  # fmt: skip
        assert _same(got, want).all(), mode


@pytest.mark.parametrize("mode", ["stochastic", "stochastic_offset", "stochastic_corrected"])
def test_stochastic_rounding_of_the_exact_sum(mode: str) -> None:
    """StochasticA/B/C with 4 random bits: the report's R is the top bits of the seeded word."""
    rng = np.random.default_rng(11)
    fin = _X8[np.isfinite(_X8)]
    x = rng.choice(fin, (300, 6))
    s = rng.choice(_S8[np.isfinite(_S8) & (_S8 > 0)], (300, 1))
    fr, n, seed = (8, 3, True, True), 4, 123
    r = (random_words(seed, 300, 0) >> np.uint64(64 - n)).astype(int)
    got = pl.p3109_block_reduce_add(s, x, _name(fr), block_size=6, rounding=mode, seed=seed,
                                    random_bits=n)[:, 0]  # fmt: skip
    want = [v4_block_reduce_add(a[0], list(b), fr, mode, "sat_none", int(ri), n)
            for a, b, ri in zip(s, x, r, strict=True)]  # fmt: skip
    assert _same(got, want).all()
    for other in ("toward_zero", "up"):  # not a deterministic rounding in disguise
        det = pl.p3109_block_reduce_add(s, x, _name(fr), block_size=6, rounding=other)[:, 0]
        assert (got != det).any(), other


@pytest.mark.parametrize("op", list(pl.P3109_BLOCK_OPS))
def test_block_op_against_the_report(op: str) -> None:
    """BlockOp (5.4): random operands of Binary4p2se under Binary3p1ue scales (specials
    included) and result scales NaN, 0, ±inf, 3, -1.5, 0.25: every mode and saturation."""
    arity = pl.P3109_BLOCK_OPS[op][0]
    rng = np.random.default_rng(list(pl.P3109_BLOCK_OPS).index(op))
    xs, ss = _values(4, 2, True, True), _values(3, 1, False, True)
    srs = np.array([np.nan, 0.0, np.inf, -np.inf, 3.0, -1.5, 0.25])
    fr = (5, 2, True, True)
    nb, b = 36, 4
    for mode, sat in itertools.product(MODES, SATS):
        ops = [(rng.choice(ss, (nb, 1)), rng.choice(xs, (nb, b))) for _ in range(arity)]
        sr = rng.choice(srs, (nb, 1))
        sr_out, got = pl.p3109_block_op(op, ops, sr, _name(fr), block_size=b, rounding=mode,
                                        saturation=sat)  # fmt: skip
        assert _same(sr_out, sr).all()
        for j in range(nb):
            want = v4_block_op(op, [(s[j, 0], list(x[j])) for s, x in ops], sr[j, 0], fr, mode,
                               sat)  # fmt: skip
            assert _same(got[j], want).all(), (op, mode, sat, [o[1][j] for o in ops], got[j])


def test_scaled_op_is_block_op_of_one_element() -> None:
    """ScaledOp (5.5) = BlockOp with B = 1 and result scale 1, against the oracle too."""
    rng = np.random.default_rng(2)
    xs, ss = _values(4, 2, True, True), _values(3, 1, False, True)
    x1, x2, s1, s2 = (rng.choice(v, 50) for v in (xs, xs, ss, ss))
    fr = (4, 2, True, False)
    for op in ("add", "divide"):
        got = pl.p3109_scaled_op(op, [(s1, x1), (s2, x2)], _name(fr), rounding="nearest_away")
        _, blk = pl.p3109_block_op(op, [(s1, x1), (s2, x2)], np.ones(50), _name(fr),
                                   block_size=1, rounding="nearest_away")  # fmt: skip
        assert _same(got, blk).all()
        for i in range(50):
            want = v4_block_op(op, [(s1[i], [x1[i]]), (s2[i], [x2[i]])], 1.0, fr, "nearest_away",
                               "sat_none")  # fmt: skip
            assert _same(got[i], want[0]), (op, s1[i], x1[i], s2[i], x2[i], got[i], want)


def test_axes_shapes_and_errors() -> None:
    rng = np.random.default_rng(4)
    x = rng.choice(_X8[np.isfinite(_X8)], (3, 8))
    s = rng.choice(_S8[np.isfinite(_S8) & (_S8 > 0)], (3, 2))
    f = "p3109_k8p4se"
    r = pl.p3109_block_reduce_add(s, x, f, block_size=4)
    assert r.shape == (3, 2)
    assert np.array_equal(pl.p3109_block_reduce_add(s.T, x.T, f, block_size=4, axis=0), r.T)
    d = pl.p3109_block_dot(s, x, s, x, f, block_size=4)
    assert np.array_equal(pl.p3109_block_dot(s.T, x.T, s.T, x.T, f, block_size=4, axis=0), d.T)
    # the sum is exact and rounded once: the dot of x with itself under scale 1 is >= 0
    assert (pl.p3109_block_dot(np.ones((3, 2)), x, np.ones((3, 2)), x, f, block_size=4) >= 0).all()
    with pytest.raises(ValueError, match="multiple of block_size=3"):
        pl.p3109_block_reduce_add(s, x, f, block_size=3)
    with pytest.raises(ValueError, match="one shape"):
        pl.p3109_block_dot(s, x, s, x[:, :4], f, block_size=4)
    with pytest.raises(ValueError, match="op must be one of"):
        pl.p3109_block_op("hypot", [(s, x), (s, x)], s, f, block_size=4)
    with pytest.raises(ValueError, match="takes 2 operands"):
        pl.p3109_block_op("add", [(s, x)], s, f, block_size=4)
    with pytest.raises(ValueError, match="P3109 format"):
        pl.p3109_block_reduce_add(s, x, "int8", block_size=4)
    assert math.isnan(pl.p3109_block_reduce_add([[np.nan]], [[1.0]], f, block_size=1)[0, 0])
    prod = pl.p3109_block_reduce_multiply([[0.5]], [[3.0, 3.0]], f, block_size=2)
    assert Fraction(float(prod[0, 0])) == Fraction(9, 4)


def test_no_intermediate_overflow_or_underflow() -> None:
    """Binary12p2se values (2**-512 .. 2**511): decoded values and partial sums beyond float64's
    range stay exact (a float64 sum gives inf, then NaN); results beyond it saturate per the
    mode; results below float64's normal range still round up to the smallest subnormal."""
    big, f12, f8 = 2.0**511, "p3109_k12p2se", "p3109_k8p3se"
    x = np.array([[big] * 4 + [-big] * 4 + [1.0]])
    assert pl.p3109_block_reduce_add([[big]], x, f12, block_size=9).tolist() == [[big]]
    with np.errstate(over="ignore", invalid="ignore"):
        assert math.isnan(np.sum(big * x))  # what float64 gives
    prod = [[big, big, -big]]
    for sat, want in [("sat_none", -np.inf), ("sat_finite", -49152.0), ("sat_propagate", -49152.0)]:
        got = pl.p3109_block_reduce_multiply([[big]], prod, f8, block_size=3, saturation=sat)
        assert got.tolist() == [[want]], sat
    tiny = 2.0**-512
    fmt = pl.get_format(f8)
    for mode, want in [("up", fmt.smallest_subnormal), ("nearest_even", 0.0), ("down", 0.0)]:
        got = pl.p3109_block_dot([[tiny]], [[tiny, 0.0]], [[1.0]], [[1.0, 1.0]], f8,
                                 block_size=2, rounding=mode)  # fmt: skip
        assert got.tolist() == [[want]], mode
    got = pl.p3109_block_reduce_add([[tiny]], [[-tiny]], f8, block_size=1, rounding="down")
    assert got.tolist() == [[-fmt.smallest_subnormal]]


@pytest.mark.parametrize("mode", ["stochastic", "stochastic_offset", "stochastic_corrected"])
def test_stochastic_rounding_with_35_random_bits_is_exact(mode: str) -> None:
    """The module's claim: SR with up to 35 random bits sees the exact sum (here dot products of
    Binary16p11se values under 16-bit scales, whose exact sums need far more than 53 bits)."""
    rng = np.random.default_rng(8)
    fx, fs = pl.get_format("p3109_k16p11se"), pl.get_format("p3109_k16p11ue")
    x = np.asarray(pl.decode(rng.integers(0, 2**15, (60, 8)).astype(np.uint16), fx), np.float64)
    y = np.asarray(pl.decode(rng.integers(0, 2**15, (60, 8)).astype(np.uint16), fx), np.float64)
    s = np.asarray(pl.decode(rng.integers(2**14, 2**15, (60, 2)).astype(np.uint16), fs), np.float64)
    x, y = np.where(np.isfinite(x), x, 1.0), np.where(np.isfinite(y), y, -1.0)
    wide = 0
    for a, b, c in zip(s, x, y, strict=True):
        exact = sum(Fraction(a[0]) * Fraction(u) * Fraction(a[1]) * Fraction(v)
                    for u, v in zip(b, c, strict=True))  # fmt: skip
        wide += Fraction(float(exact)) != exact
    assert wide > 30  # float64 cannot hold most of these sums
    n, seed, fr = 35, 5, (16, 11, True, True)
    r = (random_words(seed, 60, 0) >> np.uint64(64 - n)).astype(int)
    got = pl.p3109_block_dot(s[:, :1], x, s[:, 1:], y, _name(fr), block_size=8, rounding=mode,
                             seed=seed, random_bits=n)[:, 0]  # fmt: skip
    want = [v4_block_dot(a[0], list(b), a[1], list(c), fr, mode, "sat_none", int(ri), n)
            for a, b, c, ri in zip(s, x, y, r, strict=True)]  # fmt: skip
    assert _same(got, want).all()
