"""The rounding core beyond the exhaustive sweep: named traps, bad input, array handling, stochastic
rounding, flush-to-zero, and hypothesis tests over float32/float64 inputs against the referee."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from referee import DETERMINISTIC, referee_formula

import precision_lab as pl
from precision_lab.core import pool as _parallel

# the tests build float32 values from float64 ones that may be out of float32's range on purpose
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

# ---------------------------------------------------------------- named traps (the core issue)


def test_float64_is_rounded_once_not_through_float32():
    x = np.float64(1.0625 + 2.0**-40)
    assert float(pl.round_to(x, "e4m3")) == 1.125
    # the double rounding that torch does: float64 -> float32 -> e4m3 gives 1.0
    assert float(pl.round_to(x.astype(np.float32), "e4m3")) == 1.0


def test_e4m3_boundary_464():
    assert float(pl.round_to(464.0, "e4m3")) == 448.0
    assert math.isnan(float(pl.round_to(464.0001, "e4m3")))
    assert float(pl.round_to(464.0001, "e4m3", overflow="saturate")) == 448.0
    assert float(pl.round_to(-1e9, "e4m3", overflow="saturate")) == -448.0
    assert pl.encode(464.0001, "e4m3") == 0x7F


def test_e5m2_61440_overflows_under_nearest_but_not_toward_zero():
    assert float(pl.round_to(61440.0, "e5m2")) == math.inf
    assert float(pl.round_to(61440.0, "e5m2", rounding="toward_zero")) == 57344.0
    assert float(pl.round_to(-61440.0, "e5m2", rounding="up")) == -57344.0
    assert float(pl.round_to(-61440.0, "e5m2", rounding="down")) == -math.inf
    assert float(pl.round_to(61440.0, "e5m2", rounding="odd")) == 57344.0


@pytest.mark.parametrize(
    "name", [n for n, f in pl.FORMATS.items() if isinstance(f, pl.FloatFormat)]
)
def test_negative_zero_keeps_its_sign_where_the_format_has_it(name):
    fmt = pl.get_format(name)
    for dtype in (np.float32, np.float64):
        tiny = dtype(-fmt.smallest_subnormal / 4)  # rounds to -0 (or is -0 already)
        r = pl.round_to(np.array([-0.0, tiny], dtype=dtype), fmt)
        if not fmt.has_zero:
            assert np.isnan(r).all()
        elif fmt.has_negative_zero:
            assert (r == 0).all() and np.signbit(r).all()
        else:
            assert (r == 0).all() and not np.signbit(r).any()


@pytest.mark.parametrize("name", ["e2m1", "e2m3", "e3m2"])
def test_formats_without_nan_or_inf(name):
    fmt = pl.get_format(name)
    assert not fmt.has_nan and not fmt.has_inf
    # overflow and infinities saturate whatever the overflow switch says
    for overflow in ("ieee", "saturate"):
        r = pl.round_to([1e6, -np.inf, np.inf], fmt, overflow=overflow)
        np.testing.assert_array_equal(r, [fmt.max, -fmt.max, fmt.max])
    # NaN stays NaN as a value, but has no code
    assert np.isnan(pl.round_to(np.nan, fmt))
    with pytest.raises(ValueError, match="NaN"):
        pl.encode([1.0, np.nan], fmt)


def test_e8m0_tie_rules():
    assert float(pl.round_to(192.0, "e8m0")) == 128.0  # even code (gfloat)
    assert float(pl.round_to(192.0, "e8m0", rounding="nearest_away")) == 256.0  # ml_dtypes, torch
    ref = np.array([192.0, 3 * 2.0**-128], dtype=np.float32).astype(ml_dtypes.float8_e8m0fnu)
    ours = pl.encode(np.array([192.0, 3 * 2.0**-128], dtype=np.float32), "e8m0", rounding="rna")
    np.testing.assert_array_equal(ours, ref.view(np.uint8))
    # no zero, no sign: zero and negative numbers are NaN; tiny positives go to 2**-127
    r = pl.round_to(np.array([0.0, -1.0, 1e-45, 2.0**130], dtype=np.float64), "e8m0")
    assert np.isnan(r[[0, 1, 3]]).all() and r[2] == 2.0**-127
    assert float(pl.round_to(2.0**130, "e8m0", overflow="saturate")) == 2.0**127


def test_fnuz_nan_and_zero():
    codes = pl.encode([np.nan, -np.nan, np.inf, -0.0, 1e9], "e4m3fnuz")
    np.testing.assert_array_equal(codes, [0x80, 0x80, 0x80, 0, 0x80])
    assert np.isnan(pl.decode([0x80], "e4m3fnuz")).all()


def test_nan_sign_is_kept_where_the_format_can_hold_it():
    x = np.array([np.nan, -np.nan], dtype=np.float32)
    np.testing.assert_array_equal(pl.encode(x, "e4m3"), [0x7F, 0xFF])
    np.testing.assert_array_equal(pl.encode(x, "e5m2"), [0x7E, 0xFE])
    np.testing.assert_array_equal(pl.encode(x, "bf16"), [0x7FC0, 0xFFC0])
    assert np.signbit(pl.round_to(x, "fp16")).tolist() == [False, True]


def test_infinity_maps_by_format_and_overflow_switch():
    x = np.array([np.inf, -np.inf])
    np.testing.assert_array_equal(pl.round_to(x, "fp16"), x)
    np.testing.assert_array_equal(pl.round_to(x, "fp16", overflow="saturate"), [65504, -65504])
    assert np.isnan(pl.round_to(x, "e4m3")).all()  # no inf: NaN
    np.testing.assert_array_equal(pl.round_to(x, "e4m3", overflow="saturate"), [448, -448])
    # an infinite input is not an overflow: toward_zero does not turn it into max
    np.testing.assert_array_equal(pl.round_to(x, "e5m2", rounding="toward_zero"), x)


def test_integer_formats_round_then_saturate():
    x = np.array([2.5, -2.5, 3.5, -0.4, 127.6, -300.0, np.inf])
    np.testing.assert_array_equal(pl.round_to(x, "int8"), [2, -2, 4, 0, 127, -128, 127])
    np.testing.assert_array_equal(
        pl.round_to(x, "int8", rounding="toward_zero"), [2, -2, 3, 0, 127, -128, 127]
    )
    np.testing.assert_array_equal(pl.round_to(x, "int4", rounding="up"), [3, -2, 4, 0, 7, -8, 7])
    np.testing.assert_array_equal(pl.round_to(x, "uint8"), [2, 0, 4, 0, 128, 0, 255])
    assert not np.signbit(pl.round_to(-0.4, "int8"))
    np.testing.assert_array_equal(pl.encode([-1.0, -8.0, 7.0], "int4"), [15, 8, 7])
    np.testing.assert_array_equal(pl.decode(np.array([15, 8, 7], np.uint8), "int4"), [-1, -8, 7])


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: pl.round_to(1.0, "fp7"),
            ValueError,
            "unknown format 'fp7'; did you mean .*known_formats",
        ),
        (lambda: pl.round_to(1.0, 3.5), TypeError, "fmt must be"),
        (lambda: pl.round_to(1.0, "e4m3", rounding="banker"), ValueError, "rounding must be"),
        (lambda: pl.round_to(1.0, "e4m3", overflow="clip"), ValueError, "overflow must be"),
        (lambda: pl.round_to(1.0, "e4m3", subnormals="daz"), ValueError, "subnormals must be"),
        (lambda: pl.round_to([1 + 2j], "e4m3"), TypeError, "x must hold floating.*complex"),
        (lambda: pl.round_to(np.array([1.0], dtype=object), "e4m3"), TypeError, "object"),
        (lambda: pl.round_to(["1.0"], "e4m3"), TypeError, "x must hold floating"),
        (lambda: pl.quantize(np.arange(3), "int8", 1.0), TypeError, "int64"),
        (lambda: pl.round_to(np.ma.masked_array([1.0]), "e4m3"), TypeError, "masked.*filled"),
        (lambda: pl.round_to(1.0, "e4m3", rounding="sr", random_bits=0), ValueError, "1..64"),
        (lambda: pl.round_to(1.0, "e4m3", rounding="sr", random_bits=65), ValueError, "1..64"),
        (lambda: pl.round_to(1.0, "e4m3", rounding="sr", random_bits=2.5), TypeError, "int"),
        (lambda: pl.round_to(1.0, "e4m3", rounding="sr", seed=-1), ValueError, "seed"),
        (lambda: pl.round_to(1.0, "e4m3", rounding="sr", seed="a"), TypeError, "seed"),
        (lambda: pl.decode([256], "e4m3"), ValueError, "codes must be in 0..255"),
        (lambda: pl.decode([-1], "e4m3"), ValueError, "non-negative"),
        (lambda: pl.decode([1.0], "e4m3"), TypeError, "integer"),
        (lambda: pl.encode(1.0, "nope"), ValueError, "unknown format"),
        (lambda: pl.FloatFormat(0, 3), ValueError, "exponent_bits"),
        (lambda: pl.FloatFormat(4, -1), ValueError, "mantissa_bits"),
        (lambda: pl.FloatFormat(4, 3, nan="none", has_inf=True), ValueError, "has_inf"),
        (lambda: pl.FloatFormat(12, 60), ValueError, "64 bits"),
        (lambda: pl.FloatFormat(12, 40), ValueError, "float64"),
        (lambda: pl.FloatFormat(5, 0), ValueError, "mantissa_bits >= 1"),
    ],
)
def test_bad_input_raises_a_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ------------------------------------------------------------------------- array handling


def test_array_kinds_and_dtype_rules():
    base = np.array([[0.1, -3.3, 1e-3], [500.0, np.nan, -0.0]])
    want = pl.round_to(base, "e4m3")
    assert want.dtype == np.float64 and want.shape == (2, 3)
    ro = base.copy()
    ro.flags.writeable = False
    variants = {
        "read-only": ro,
        "fortran": np.asfortranarray(base),
        "non-contiguous": np.repeat(base, 2, axis=1)[:, ::2],
        "big-endian": base.astype(">f8"),
        "list": base.tolist(),
    }
    for name, v in variants.items():
        got = pl.round_to(v, "e4m3")
        assert got.dtype == np.float64, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert pl.round_to(base.astype(np.float32), "e4m3").dtype == np.float32
    assert pl.round_to(base.astype(np.float16), "e4m3").dtype == np.float32
    assert pl.round_to(base.astype(ml_dtypes.bfloat16), "e4m3").dtype == np.float32
    assert pl.round_to(np.float32(1.0), "fp64").dtype == np.float64  # holds any fp64 value
    assert pl.round_to(np.float32(1.0), pl.FloatFormat(10, 5)).dtype == np.float64
    zero_d = pl.round_to(np.float32(0.3), "bf16")
    assert zero_d.shape == () and float(zero_d) == 0.30078125
    assert pl.round_to(np.zeros((0, 4), np.float32), "e4m3").shape == (0, 4)
    assert pl.encode(np.zeros((3, 0)), "fp16").shape == (3, 0)
    assert pl.encode(np.zeros(2), "fp32").dtype == np.uint32
    assert pl.encode(np.zeros(2), "fp64").dtype == np.uint64


def test_python_integers_are_rounded_once_or_refused():
    """numpy makes float64 of [2**64 - 1, 1] (2**64 - 1 becomes 2**64 first) and an object
    array of ints beyond uint64: round_to takes the exact ints up to 2**64 - 1 and refuses the
    rest with a clear error. Toward zero, bf16 keeps the top 8 bits (integer arithmetic)."""
    top8 = float(((2**64 - 1) >> 56) << 56)
    got = pl.round_to([2**64 - 1, 1], "bf16", rounding="toward_zero")
    assert got.tolist() == [top8, 1.0]
    assert float(pl.round_to(2**64 - 1, "bf16", rounding="toward_zero")) == top8
    assert pl.round_to((-(2**63), -1), "bf16", rounding="toward_zero").tolist() == [-(2.0**63), -1]
    with pytest.raises(ValueError, match=r"integer 1180591620717411303425, outside the range"):
        pl.round_to(2**70 + 1, "bf16")
    with pytest.raises(ValueError, match="mixes negative integers and integers above"):
        pl.round_to([-1, 2**64 - 1], "bf16")


def test_torch_tensor_that_requires_grad_points_to_precision_lab_torch():
    torch = pytest.importorskip("torch", reason="the torch input case needs PyTorch")
    t = torch.ones(3, requires_grad=True)
    with pytest.raises(TypeError, match=r"requires grad.*precision_lab\.torch\.round_to"):
        pl.round_to(t, "bf16")
    assert pl.round_to(t.detach(), "bf16").tolist() == [1.0, 1.0, 1.0]


def test_input_is_never_modified():
    x = np.random.default_rng(1).standard_normal(300_000).astype(np.float32) * 1000
    x[::97] = np.nan
    keep = x.copy()
    for mode in ("nearest_even", "stochastic", "odd"):
        pl.round_to(x, "e4m3", rounding=mode, seed=3)
        pl.encode(x, "e5m2", rounding=mode, seed=3)
    np.testing.assert_array_equal(x.view(np.uint32), keep.view(np.uint32))


def test_large_arrays_match_small_ones(monkeypatch):
    """Chunking and threads do not change results (also checks the deferred repair pass)."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(400_000) * rng.choice([1e-6, 1.0, 1e3], 400_000)).astype(np.float32)
    x[rng.integers(0, x.size, 500)] = np.inf
    for mode in ("nearest_even", "up", "stochastic"):
        big = pl.round_to(x, "e4m3", rounding=mode, seed=9)
        codes = pl.encode(x, "e4m3", rounding=mode, seed=9)
        monkeypatch.setattr(_parallel, "CHUNK", 1000)
        monkeypatch.setattr(_parallel, "WORKERS", 1)
        small = pl.round_to(x, "e4m3", rounding=mode, seed=9)
        small_codes = pl.encode(x, "e4m3", rounding=mode, seed=9)
        monkeypatch.undo()
        np.testing.assert_array_equal(big.view(np.uint32), small.view(np.uint32))
        np.testing.assert_array_equal(codes, small_codes)
        np.testing.assert_array_equal(pl.decode(codes, "e4m3"), big)


# ---------------------------------------------------------------------- stochastic rounding


def _neighbours(x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    return (
        pl.round_to(x, fmt, rounding="down", overflow="saturate"),
        pl.round_to(x, fmt, rounding="up", overflow="saturate"),
    )


@pytest.mark.parametrize(
    ("value", "fmt"),
    [
        (1.0375, "e4m3"),  # 0.3 of the way from 1.0 to 1.125
        (-1.0375, "e4m3"),
        (3.1 * 2.0**-9, "e4m3"),  # subnormal range: the exact float64 path
        (0.1, "bf16"),
        (1e-7, "fp16"),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stochastic_rounding_is_unbiased(value, fmt, dtype):
    n = 200_000
    x = np.full(n, value, dtype=dtype)
    r = pl.round_to(x, fmt, rounding="stochastic", seed=42).astype(np.float64)
    lo, hi = _neighbours(x[:1], fmt)
    assert set(np.unique(r)) <= {float(lo[0]), float(hi[0])}
    exact = float(x[0])
    p = (exact - float(lo[0])) / (float(hi[0]) - float(lo[0]))
    stderr = (float(hi[0]) - float(lo[0])) * math.sqrt(p * (1 - p) / n)
    assert abs(r.mean() - exact) < 4 * stderr


def test_stochastic_rounding_is_reproducible_and_seeded():
    x = np.random.default_rng(5).standard_normal(100_000)
    a = pl.round_to(x, "e5m2", rounding="sr", seed=7)
    b = pl.round_to(x, "e5m2", rounding="sr", seed=7)
    c = pl.round_to(x, "e5m2", rounding="sr", seed=8)
    np.testing.assert_array_equal(a, b)
    assert (a != c).mean() > 0.1
    lo, hi = _neighbours(x, "e5m2")
    assert ((a == lo) | (a == hi)).all()
    # the same values as float32 and as float64 give the same results
    x32 = x.astype(np.float32)
    np.testing.assert_array_equal(
        pl.round_to(x32, "e5m2", rounding="sr", seed=7),
        pl.round_to(x32.astype(np.float64), "e5m2", rounding="sr", seed=7),
    )
    # keyed by flat index: element i of a reshaped array gets the same random word
    np.testing.assert_array_equal(
        pl.round_to(x.reshape(100, 1000), "e5m2", rounding="sr", seed=7).ravel(), a
    )


def test_few_random_bits_truncate_the_probability():
    # with k random bits, P(up) = floor(frac * 2**k) / 2**k (hardware SR)
    n = 100_000
    base, step = 1.0, 0.125  # e4m3 spacing at 1
    for frac, k, p_up in [(0.3, 1, 0.0), (0.5, 1, 0.5), (0.75, 1, 0.5), (0.3, 2, 0.25)]:
        x = np.full(n, base + frac * step)
        r = pl.round_to(x, "e4m3", rounding="sr", seed=1, random_bits=k)
        share = (r > base).mean()
        assert abs(share - p_up) < 0.01, (frac, k, share)


# ------------------------------------------------------------------------- flush to zero


def test_flush_subnormal_results_keeps_sign():
    fp16 = pl.get_format("fp16")
    tiny = fp16.smallest_normal
    x = np.array([tiny * 0.5, -tiny * 0.25, tiny, tiny * (1 - 2**-12), -3e-8, 1.0])
    r = pl.round_to(x, fp16, subnormals="flush")
    np.testing.assert_array_equal(r, [0.0, -0.0, tiny, tiny, -0.0, 1.0])
    assert np.signbit(r).tolist() == [False, True, False, False, True, False]
    kept = pl.round_to(x, fp16)
    assert kept[0] == tiny * 0.5 and kept[4] == -(2.0**-25) * 2  # -3e-8 -> -2**-24


# ------------------------------------------------------------------ hypothesis vs referee

FORMULA_FORMATS = ["fp32", "tf32", "bf16", "fp16", "e4m3", "e5m2", "e4m3fnuz", "e3m2", "e2m1"]
CUSTOM = [pl.FloatFormat(6, 9), pl.FloatFormat(3, 5, nan="fn", has_inf=False)]


def _near_ties(fmt: pl.FloatFormat) -> st.SearchStrategy[float]:
    """Midpoints between adjacent values of fmt (and their float64/float32 neighbours)."""

    @st.composite
    def build(draw: st.DrawFn) -> float:
        code = draw(st.integers(0, (1 << (fmt.bits - 1)) - 1))
        v = float(pl.decode(np.array([code], dtype=np.uint64), fmt)[0])
        if not math.isfinite(v):
            v = fmt.max
        up = float(fmt.next_up(v))
        if not math.isfinite(up):  # above max: the midpoint towards the overflow threshold
            up = v + float(fmt.ulp(v))
        mid = (v + up) / 2
        which = draw(st.sampled_from(["mid", "above", "below", "above32", "below32"]))
        if which == "above":
            mid = math.nextafter(mid, math.inf)
        elif which == "below":
            mid = math.nextafter(mid, -math.inf)
        elif which in ("above32", "below32"):
            m32 = np.float32(mid)
            step = np.inf if which == "above32" else -np.inf
            mid = float(np.nextafter(m32, np.float32(step)))
        return -mid if draw(st.booleans()) else mid

    return build()


@pytest.mark.parametrize("fmt", [pl.get_format(n) for n in FORMULA_FORMATS] + CUSTOM, ids=str)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_hypothesis_against_formula_referee(fmt, data):
    x = data.draw(
        st.one_of(
            _near_ties(fmt),
            st.floats(width=64, allow_subnormal=True),
            st.floats(width=32, allow_subnormal=True),
            st.sampled_from([fmt.max, fmt.smallest_normal, fmt.smallest_subnormal / 2, 0.0]),
        )
    )
    for dtype in (np.float64, np.float32):
        xd = dtype(x)
        if dtype is np.float32 and float(xd) != x and math.isfinite(x):
            continue  # not representable in float32: only the float64 path applies
        for mode in DETERMINISTIC:
            for overflow in ("ieee", "saturate"):
                want = referee_formula(float(xd), fmt, mode, overflow)
                got = float(pl.round_to(xd, fmt, rounding=mode, overflow=overflow))
                ok = (math.isnan(got) and math.isnan(want)) or (
                    got == want and math.copysign(1, got) == math.copysign(1, want)
                )
                assert ok, (float(xd), np.dtype(dtype).name, mode, overflow, got, want)


@settings(max_examples=200, deadline=None)
@given(bits=st.integers(0, 2**32 - 1))
def test_float32_nan_payloads_and_all_patterns_are_handled(bits):
    x = np.array([bits], dtype=np.uint32).view(np.float32)
    for name in ("e4m3", "bf16", "e5m2"):
        fmt = pl.get_format(name)
        r = pl.round_to(x, fmt)
        if np.isnan(x[0]):
            assert np.isnan(r[0]) and np.signbit(r[0]) == np.signbit(x[0])
        else:
            want = referee_formula(float(x[0]), fmt, "nearest_even")
            assert float(r[0]) == want or (math.isnan(want) and np.isnan(r[0]))


# -------------------------------------------------------------------------------- formats


@pytest.mark.parametrize("name", list(pl.FORMATS))
def test_format_properties_are_consistent(name):
    fmt = pl.get_format(name)
    if fmt.bits <= 16:
        vals = fmt.values()
        assert np.all(np.diff(vals) > 0)
        assert vals.max() == fmt.max
        pos = vals[vals > 0]
        assert pos.min() == fmt.smallest_subnormal
    if isinstance(fmt, pl.FloatFormat):
        assert fmt.smallest_normal == 2.0**fmt.emin
        assert fmt.eps == 2.0**-fmt.mantissa_bits
        assert math.isclose(fmt.unit_roundoff, fmt.eps / 2)


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("fp16", np.float16),
        ("bf16", ml_dtypes.bfloat16),
        ("e4m3", ml_dtypes.float8_e4m3fn),
        ("e5m2", ml_dtypes.float8_e5m2),
        ("e4m3fnuz", ml_dtypes.float8_e4m3fnuz),
        ("e5m2fnuz", ml_dtypes.float8_e5m2fnuz),
        ("e3m4", ml_dtypes.float8_e3m4),
        ("e2m1", ml_dtypes.float4_e2m1fn),
        ("e2m3", ml_dtypes.float6_e2m3fn),
        ("e3m2", ml_dtypes.float6_e3m2fn),
        ("e8m0", ml_dtypes.float8_e8m0fnu),
        ("fp32", np.float32),
        ("fp64", np.float64),
    ],
)
def test_format_constants_match_finfo(name, dtype):
    fmt = pl.get_format(name)
    fi = ml_dtypes.finfo(dtype)
    assert fmt.max == float(fi.max)
    assert fmt.smallest_normal == float(fi.smallest_normal)
    assert fmt.smallest_subnormal == float(fi.smallest_subnormal)
    assert fmt.eps == float(fi.eps)
    assert fmt.bits == fi.bits
    assert pl.get_format(np.dtype(dtype)) == fmt


def test_next_up_down_and_ulp():
    e4m3 = pl.get_format("e4m3")
    assert float(e4m3.next_up(448.0)) == math.inf or math.isnan(float(e4m3.next_up(448.0)))
    assert float(e4m3.next_up(0.0)) == 2.0**-9
    assert float(e4m3.next_down(0.0)) == -(2.0**-9)
    assert float(e4m3.next_up(1.01)) == 1.125
    np.testing.assert_array_equal(e4m3.ulp([1.0, 3.0, 1e-4, 400.0]), [0.125, 0.25, 2.0**-9, 32.0])
    assert pl.get_format("fp16").values().size == 2 * 31744 - 1
