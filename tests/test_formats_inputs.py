"""Formats and input conversion at the edges (issue 10, items 6 and 10-14).

Each test is named after what it pins down; the oracles are independent of the core: exact
``fractions.Fraction`` arithmetic, the format's value list, and numpy's own conversions.
"""

from __future__ import annotations

import itertools
import math
import os
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import precision_lab as pl
from precision_lab.formats import FloatFormat, IntFormat
from precision_lab.rounding import ROUNDING_MODES, _fits_float32

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")

DETERMINISTIC = [m for m in ROUNDING_MODES if not m.startswith("stochastic")]
ALL_HALF = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


# ----------------------------------------------------------------- item 6: fmt=None is refused
def _format_entries():
    x = np.ones((2, 2))
    acc = pl.Accumulator()
    return {
        "round_to fmt": lambda: pl.round_to(x, None),
        "encode fmt": lambda: pl.encode(x, None),
        "decode fmt": lambda: pl.decode(np.zeros(2, np.uint8), None),
        "quantize fmt": lambda: pl.quantize(x, None, 1.0),
        "calibrate fmt": lambda: pl.calibrate(x, None),
        "get_format fmt": lambda: pl.get_format(None),
        "Accumulator format": lambda: pl.Accumulator(None),
        "gemm out_format": lambda: pl.gemm(
            x, x, input_format="bf16", accumulator=acc, out_format=None
        ),
        "gemm input_format": lambda: pl.gemm(x, x, input_format=None, accumulator=acc),
        "tensor_core input_format": lambda: pl.tensor_core("h100", None),
        "underflow_stats fmt": lambda: pl.underflow_stats(x, None),
        "pick_loss_scale fmt": lambda: pl.pick_loss_scale(x, None),
        "DelayedScaling fmt": lambda: pl.scaling.DelayedScaling(fmt=None),
        "round_to_blocks element": lambda: pl.BlockFormat("b", None, "e8m0", (32,), "floor"),
    }


@pytest.mark.parametrize("entry", list(_format_entries()))
def test_format_none_is_a_type_error_naming_the_argument(entry):
    argument = entry.split()[-1]
    with pytest.raises(TypeError, match=rf"{argument}.*got None"):
        _format_entries()[entry]()


# ------------------------------------ item 10: float32 and float64 paths agree, monotonically
def test_zero_less_unsigned_format_float32_equals_float64():
    """e8m0-like with bias 130 and without NaN: negative numbers, -0 and 0 go to the least value
    2**-130 from float32 as from float64 (float32 gave 2**-126, the working dtype's minimum)."""
    f = FloatFormat(
        8,
        0,
        bias=130,
        nan="none",
        has_inf=False,
        has_subnormals=False,
        has_zero=False,
        signed=False,
    )
    x = np.array([-1.0, -0.0, 0.0, 3e-45, 1e-40, 2.0**-131, -np.inf], dtype=np.float32)
    want = [2.0**-130] * 6 + [2.0**-130]
    for mode in DETERMINISTIC:
        r32 = pl.round_to(x, f, rounding=mode)
        r64 = pl.round_to(x.astype(np.float64), f, rounding=mode)
        assert r32.tolist() == r64.tolist() == want, mode


@st.composite
def custom_formats(draw):
    e = draw(st.integers(0, 8))
    m = draw(st.integers(0, 5))
    nan = draw(st.sampled_from(["ieee", "fn", "fnuz", "none"]))
    has_inf = draw(st.booleans()) if nan != "ieee" else True
    has_zero = draw(st.booleans())
    signed = draw(st.booleans()) if has_zero else False
    has_sub = draw(st.booleans()) if has_zero else False
    if e == 0:
        has_zero = has_sub = True
    bias = draw(st.integers(-20, 150))
    try:
        f = FloatFormat(
            e,
            m,
            bias=bias,
            nan=nan,
            has_inf=has_inf and nan != "none",
            has_subnormals=has_sub,
            has_zero=has_zero,
            signed=signed,
        )
    except ValueError:
        assume(False)
    assume(_fits_float32(f))
    return f


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return bool(np.array_equal(a64, b64, equal_nan=True)) and bool(
        (np.signbit(a64) == np.signbit(b64))[~np.isnan(a64)].all()
    )


def _monotone(x: np.ndarray, r: np.ndarray) -> bool:
    order = np.argsort(x.astype(np.float64), kind="stable")
    rs = r.astype(np.float64)[order]
    rs = rs[~np.isnan(rs)]
    return bool((rs[1:] >= rs[:-1]).all())


@settings(max_examples=int(os.environ.get("PL_EXAMPLES", 60)), deadline=None)
@given(fmt=custom_formats(), data=st.data())
def test_float32_and_float64_paths_agree_on_random_formats(fmt, data):
    xs = data.draw(st.lists(st.floats(width=32, allow_nan=True), min_size=1, max_size=40))
    x32 = np.array(xs, dtype=np.float32)
    for mode in DETERMINISTIC:
        for overflow in ("ieee", "saturate"):
            kw = {"rounding": mode, "overflow": overflow}
            r32 = pl.round_to(x32, fmt, **kw)
            r64 = pl.round_to(x32.astype(np.float64), fmt, **kw)
            assert _same(r32, r64), (fmt, kw, x32, r32, r64)


@settings(max_examples=int(os.environ.get("PL_EXAMPLES", 25)), deadline=None)
@given(fmt=custom_formats())
def test_float32_and_float64_paths_agree_on_every_float16_and_are_monotone(fmt):
    x32 = ALL_HALF.astype(np.float32)
    finite = np.isfinite(x32)
    for mode in DETERMINISTIC:
        r32 = pl.round_to(x32, fmt, rounding=mode)
        r64 = pl.round_to(x32.astype(np.float64), fmt, rounding=mode)
        assert _same(r32, r64), (fmt, mode)
        if fmt.signed:
            assert _monotone(x32[finite], r32[finite]), (fmt, mode)
        else:  # negative inputs of unsigned formats are NaN or the least value
            pos = finite & ~np.signbit(x32)
            assert _monotone(x32[pos], r32[pos]), (fmt, mode)


# ----------------------------------------------- item 11: constructor fields are type-checked
@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("exponent_bits", True),
        ("exponent_bits", None),
        ("exponent_bits", 4.0),
        ("exponent_bits", "4"),
        ("mantissa_bits", False),
        ("mantissa_bits", 3.0),
        ("bias", 7.0),
        ("bias", "7"),
        ("bias", True),
        ("has_inf", "yes"),
        ("has_inf", None),
        ("has_subnormals", 1),
        ("has_zero", None),
        ("signed", "true"),
        ("nan", None),
        ("name", 3),
    ],
)
def test_float_format_rejects_wrong_field_types_naming_the_field(field, bad):
    kw = {"exponent_bits": 4, "mantissa_bits": 3, "nan": "fn", "has_inf": False, field: bad}
    with pytest.raises(TypeError, match=field):
        FloatFormat(**kw)


@pytest.mark.parametrize(
    ("field", "bad"),
    [("bits", True), ("bits", 8.0), ("bits", None), ("signed", None), ("signed", 1), ("name", 1)],
)
def test_int_format_rejects_wrong_field_types_naming_the_field(field, bad):
    kw = {"bits": 8, field: bad}
    with pytest.raises(TypeError, match=field):
        IntFormat(**kw)


def test_formats_accept_numpy_integers_and_bools():
    f = FloatFormat(np.int64(4), np.uint8(3), bias=np.int32(7), nan="fn", has_inf=np.bool_(False))
    assert f == pl.get_format("e4m3") and hash(f) == hash(pl.get_format("e4m3"))
    assert type(f.exponent_bits) is int and type(f.bias) is int and type(f.has_inf) is bool
    i = IntFormat(np.int16(8), signed=np.bool_(True))
    assert i == pl.get_format("int8") and type(i.bits) is int
    assert float(pl.round_to(1.3, f)) == 1.25


def test_accumulator_accepts_numpy_integer_seeds_as_round_to_does():
    a = pl.Accumulator("bf16", "stochastic", seed=np.int64(5))
    assert a.seed == 5 and type(a.seed) is int
    assert a == pl.Accumulator("bf16", "stochastic", seed=5)
    x = np.linspace(-1, 1, 12).reshape(3, 4)
    g1 = pl.gemm(x, x.T, input_format="bf16", accumulator=a)
    g2 = pl.gemm(x, x.T, input_format="bf16", accumulator=pl.Accumulator("bf16", "sr", seed=5))
    np.testing.assert_array_equal(g1, g2)
    for bad in (True, 1.0, "5"):
        with pytest.raises((TypeError, ValueError), match="seed"):
            pl.Accumulator("bf16", "stochastic", seed=bad)


# ------------------------------------------------- item 12: ulp is the gap around |x|
SMALL = [f for f in pl.FORMATS.values() if isinstance(f, FloatFormat) and f.bits <= 8] + [
    FloatFormat(3, 2, nan="none", has_inf=False, has_subnormals=False),
    FloatFormat(4, 0, nan="fn", has_inf=False, has_subnormals=False, has_zero=False, signed=False),
    pl.formats.p3109(4, 4),
    pl.formats.p3109(6, 1, signed=False),
    pl.formats.p3109(5, 3, domain="finite"),
]


def _ulp_referee(fmt: FloatFormat, x: Fraction) -> Fraction:
    """The gap between the two grid values around |x|, from the sorted value list."""
    vals = sorted({Fraction(v) for v in fmt.values() if v >= 0})
    top = Fraction(fmt.max)
    # above max the grid goes on as if the exponent were unbounded
    if fmt.max >= fmt.smallest_normal:
        vals.append(top + Fraction(2) ** (fmt.emax - fmt.mantissa_bits))
    else:  # every value subnormal: the subnormal quantum
        vals.append(top + Fraction(fmt.smallest_subnormal))
    a = abs(x)
    if a < vals[0]:  # below the least value of a format without zero
        return vals[1] - vals[0]
    for lo, hi in itertools.pairwise(vals):
        if lo <= a < hi:
            return hi - lo
    return vals[-1] - vals[-2]


@pytest.mark.parametrize("fmt", SMALL, ids=str)
def test_ulp_is_the_gap_around_x_exhaustively(fmt):
    v = np.unique(np.abs(fmt.values()))
    pts = np.concatenate([v, (v[:-1] + v[1:]) / 2, [0.0, fmt.max * 1.5, fmt.max * 4]])
    pts = np.concatenate([pts, -pts, [fmt.smallest_subnormal / 3]])
    got = fmt.ulp(pts)
    want = [float(_ulp_referee(fmt, Fraction(float(p)))) for p in pts]
    np.testing.assert_array_equal(got, want)


def test_ulp_of_zero_inf_nan_and_error_stats_at_zero():
    fp16 = pl.get_format("fp16")
    assert float(fp16.ulp(0.0)) == 2.0**-24 == fp16.smallest_subnormal
    assert float(fp16.ulp(-0.0)) == 2.0**-24
    assert math.isnan(float(fp16.ulp(np.nan)))
    assert float(fp16.ulp(np.inf)) == math.inf and float(fp16.ulp(-np.inf)) == math.inf
    assert fp16.ulp(np.ones((2, 3))).shape == (2, 3)
    # the fp64 grid agrees with Python's math.ulp
    xs = [0.0, 5e-324, 1e-310, 1.0, 3.5, 1e300, 1.7976931348623157e308]
    assert pl.get_format("fp64").ulp(xs).tolist() == [math.ulp(x) for x in xs]
    # a reference of 0 and an approximation one subnormal away: 1 ulp, not 2**-24 / eps
    e = pl.error_stats(np.array([2.0**-24], np.float16), np.array([0.0], np.float16))
    assert e.max_ulp == 1.0
