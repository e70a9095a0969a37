"""Integer quantization: quantize/dequantize against exact Fraction referees and torch, calibration
against hand-derived numbers and a literal transcription of pytorch-quantization's algorithms."""

from __future__ import annotations

import math
import warnings
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import precision_lab as pl
from precision_lab.core.formats import IntFormat
from precision_lab.quant.integer import qrange

DETERMINISTIC = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")
INT_FORMATS = ("int8", "uint8", "int4", "uint4")


# ----- referees --------------------------------------------------------------------------------
def round_int(v: Fraction, mode: str) -> int:
    """An exact rational rounded to an integer by ``mode`` (the obvious definitions)."""
    lo = math.floor(v)
    if lo == v:
        return lo
    hi = lo + 1
    if mode == "toward_zero":
        return lo if v > 0 else hi
    if mode == "up":
        return hi
    if mode == "down":
        return lo
    if mode == "odd":
        return lo if lo % 2 else hi
    if v - lo != hi - v:
        return lo if v - lo < hi - v else hi
    if mode == "nearest_away":
        return hi if v > 0 else lo
    return lo if lo % 2 == 0 else hi


def ref_quantize(x: float, fmt: str, scale: float, zp: int, mode: str, narrow: bool) -> int:
    """clamp(round(x / scale) + zero_point, qmin, qmax) in exact arithmetic."""
    f = pl.get_format(fmt)
    assert isinstance(f, IntFormat)
    qmin = f.min + int(narrow)
    if math.isinf(x):
        return f.max if x > 0 else qmin
    return min(max(round_int(Fraction(x) / Fraction(scale), mode) + zp, qmin), f.max)


def ref_float32(v: Fraction) -> np.float32:
    """The float32 nearest to v, ties to even, by exact comparison with the candidates."""
    with np.errstate(over="ignore"):
        c = np.float32(float(v))  # within one float32 step of the answer
    cands = [np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf))]
    cands = [k for k in cands if np.isfinite(k)]
    best = min(abs(Fraction(float(k)) - v) for k in cands)
    near = [k for k in cands if abs(Fraction(float(k)) - v) == best]
    if len(near) == 1:
        return near[0]
    return next(k for k in near if int(np.array(k).view(np.uint32)) % 2 == 0)


# ----- quantize ----------------------------------------------------------------------------------
def test_int4_held_in_int8_and_dtypes():
    x = np.linspace(-10, 10, 41, dtype=np.float32)
    assert pl.quantize(x, "int4", 1.0).dtype == np.int8
    assert pl.quantize(x, "uint4", 1.0).dtype == np.uint8
    assert pl.quantize(x, "uint8", 1.0).dtype == np.uint8
    assert pl.quantize(x, IntFormat(12), 1.0).dtype == np.int16
    assert pl.quantize(x, IntFormat(20, False), 1.0).dtype == np.uint32
    q = pl.quantize(x, "int4", 1.0)
    assert q.min() == -8 and q.max() == 7
    assert pl.quantize(x, "int4", 1.0, narrow_range=True).min() == -7
    assert pl.quantize(x, "uint8", 1.0, 5, narrow_range=True).min() == 1


def test_round_then_add_zero_point():
    # ties: round(2.5) = 2 (even), then + 3; adding first would give round(5.5) = 6
    assert pl.quantize([2.5], "uint8", 1.0, 3).tolist() == [5]
    assert pl.quantize([2.5], "uint8", 1.0, 3, rounding="odd").tolist() == [6]
    assert pl.quantize([-2.5], "int8", 1.0, -1, rounding="nearest_away").tolist() == [-4]


def test_exact_quotient_is_rounded_once():
    # fbgemm's example: 0.273939937f / 0.00214854861f = 127.4999953..., torch's float32 reciprocal
    # product is 127.5 exactly and rounds to 128
    x, s = np.float32(0.273939937), np.float32(0.00214854861)
    assert Fraction(float(x)) / Fraction(float(s)) < Fraction(255, 2)
    assert int(pl.quantize(x, IntFormat(16), s)) == 127
    assert int(pl.quantize(x, IntFormat(16), s, division="torch")) == 128
    # a float64 division would round these quotients to exact ties; the exact ones are not ties
    for x64, s64, tie in [
        (1.3012169049202433, 0.5204867619680973, 2.5),  # exact quotient just above 2.5
        (0.7623957266463968, 0.5082638177642645, 1.5),  # just below 1.5
    ]:
        exact = Fraction(x64) / Fraction(s64)
        assert x64 / s64 == tie and exact != Fraction(tie)
        for mode in DETERMINISTIC:
            assert int(pl.quantize(np.float64(x64), "int8", s64, rounding=mode)) == round_int(
                exact, mode
            )
    assert int(pl.quantize(np.float64(1.3012169049202433), "int8", 0.5204867619680973)) == 3


scales = st.one_of(
    st.floats(2.0**-20, 1024.0, width=32),
    st.integers(1, 255).map(lambda k: k * 2.0**-8),  # few-bit scales: exact ties are common
    st.floats(1e-30, 1e30),
)


@st.composite
def quant_case(draw):
    fmt = draw(st.sampled_from(INT_FORMATS))
    f = pl.get_format(fmt)
    scale = draw(scales)
    zp = draw(st.integers(f.min, f.max)) if draw(st.booleans()) else max(f.min, 0)
    # x at, or one float step next to, a tie (k + 1/2) * scale, or anything
    tie = Fraction(2 * draw(st.integers(-300, 300)) + 1, 2) * Fraction(scale)
    near = draw(st.sampled_from([float(tie), float(np.float32(float(tie)))]))
    step = draw(st.sampled_from([0.0, -np.inf, np.inf]))
    near = float(np.nextafter(near, step)) if step else near
    x = draw(
        st.one_of(st.just(near), st.floats(allow_nan=False, width=32), st.floats(allow_nan=False))
    )
    return fmt, scale, zp, x


@settings(max_examples=400, deadline=None)
@given(case=quant_case(), mode=st.sampled_from(DETERMINISTIC), narrow=st.booleans())
def test_quantize_matches_exact_referee(case, mode, narrow):
    fmt, scale, zp, x = case
    got = pl.quantize(np.float64(x), fmt, scale, zp, rounding=mode, narrow_range=narrow)
    assert int(got) == ref_quantize(x, fmt, scale, zp, mode, narrow)
    x32 = np.float32(x) if abs(x) < 3e38 or math.isinf(x) else None
    if x32 is not None:
        got32 = pl.quantize(x32, fmt, scale, zp, rounding=mode, narrow_range=narrow)
        assert int(got32) == ref_quantize(float(x32), fmt, scale, zp, mode, narrow)


def test_quantize_random_arrays_every_mode_per_channel():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 5, 40)) * 4).astype(np.float32)
    scales = np.array([0.03125, 0.1, 0.37], dtype=np.float32)
    zps = np.array([0, -3, 5])
    for mode in DETERMINISTIC:
        for narrow in (False, True):
            q = pl.quantize(x, "int8", scales, zps, axis=0, rounding=mode, narrow_range=narrow)
            for c in range(3):
                # per-channel equals per-tensor on each slice
                qc = pl.quantize(
                    x[c], "int8", scales[c], int(zps[c]), rounding=mode, narrow_range=narrow
                )
                np.testing.assert_array_equal(q[c], qc)
            for idx in [(0, 0, 0), (1, 2, 3), (2, 4, 39), (1, 1, 17)]:
                c = idx[0]
                want = ref_quantize(
                    float(x[idx]), "int8", float(scales[c]), int(zps[c]), mode, narrow
                )
                assert int(q[idx]) == want
    # negative axis and a middle axis
    q1 = pl.quantize(x, "int8", np.full(5, 0.1), axis=1)
    q2 = pl.quantize(x, "int8", np.full(5, 0.1), axis=-2)
    np.testing.assert_array_equal(q1, q2)
    np.testing.assert_array_equal(q1, pl.quantize(x, "int8", 0.1))


def test_every_code_reached_and_round_trip():
    codes = np.arange(-128, 128)
    x = (codes * 0.05).astype(np.float64)
    q = pl.quantize(x, "int8", 0.05)
    np.testing.assert_array_equal(q, codes)
    back = pl.dequantize(q, np.float64(0.05))
    np.testing.assert_array_equal(back, codes * 0.05)


def test_stochastic_rounding_reproducible_and_unbiased():
    x = np.full(20000, 0.3, dtype=np.float32)
    a = pl.quantize(x, "int8", 1.0, rounding="stochastic", seed=5)
    b = pl.quantize(x, "int8", 1.0, rounding="stochastic", seed=5)
    np.testing.assert_array_equal(a, b)
    assert set(np.unique(a).tolist()) == {0, 1}
    p = Fraction(float(np.float32(0.3)))
    se = math.sqrt(float(p * (1 - p)) / x.size)
    assert abs(a.mean() - float(p)) < 5 * se
    c = pl.quantize(x, "int8", 1.0, rounding="stochastic", seed=6)
    assert (a != c).any()


def test_inputs_not_modified_and_layouts():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2] * 0.3
    x.setflags(write=False)
    before = x.copy()
    big = x.astype(">f4")
    q = pl.quantize(x, "int8", 0.25)
    np.testing.assert_array_equal(pl.quantize(big, "int8", 0.25), q)
    np.testing.assert_array_equal(x, before)
    assert pl.quantize(np.float32(1.0), "int8", 0.25).shape == ()
    assert pl.quantize(
        np.zeros((0, 3), np.float32),
        "int8",
        0.25,
        axis=1,
    ).shape == (0, 3)
    d = pl.dequantize(q[::-1], np.array(0.25, dtype=np.float32))
    assert d.dtype == np.float32


def test_torch_semantics_hand_checked():
    # torch.quantize_per_tensor(torch.tensor([-1.0, 0.5, 1.5, 2.5, 300.0]), 1.0, 0, torch.qint8)
    # gives [-1, 0, 2, 2, 127]: half to even, then clamp
    q = pl.quantize([-1.0, 0.5, 1.5, 2.5, 300.0], "int8", 1.0)
    assert q.tolist() == [-1, 0, 2, 2, 127]
    q = pl.quantize([-1.0, 0.5, 1.5, 2.5, 300.0], "uint8", 1.0, 128)
    assert q.tolist() == [127, 128, 130, 130, 255]


# ----- dequantize --------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(
    q=st.one_of(st.integers(-128, 127), st.integers(-(2**31), 2**31 - 1)),
    zp=st.integers(-128, 127),
    scale=st.one_of(st.floats(1e-30, 1e30), st.floats(2.0**-100, 2.0**100, width=32)),
)
def test_dequantize_rounds_exact_product_once(q, zp, scale):
    got32 = pl.dequantize(np.array([q], dtype=np.int64), scale, zp)
    assert got32.dtype == np.float32
    exact = Fraction(q - zp) * Fraction(scale)
    want = ref_float32(exact)
    assert got32[0] == want or (np.isinf(got32[0]) and abs(exact) > 3.4e38)
    got64 = pl.dequantize(np.array([q]), np.float64(scale), zp)
    assert got64.dtype == np.float64 and got64[0] == float(exact)


def test_dequantize_per_axis_and_dtype_rules():
    q = np.array([[1, 2], [3, 4]], dtype=np.int8)
    d = pl.dequantize(q, np.array([0.5, 2.0], dtype=np.float32), np.array([1, 0]), axis=1)
    np.testing.assert_array_equal(d, [[0.0, 4.0], [1.0, 8.0]])
    assert d.dtype == np.float32
    assert pl.dequantize(q, np.array([0.5, 2.0]), axis=0).dtype == np.float64
    assert pl.dequantize(q, 0.5).dtype == np.float32
    assert pl.dequantize(q, 0.5, dtype=np.float64).dtype == np.float64


# ----- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"scale": 0.0}, ValueError, "scale must be finite and > 0"),
        ({"scale": -1.0}, ValueError, "scale must be finite and > 0"),
        ({"scale": float("nan")}, ValueError, "scale must be finite and > 0"),
        ({"scale": float("inf")}, ValueError, "scale must be finite and > 0"),
        ({"scale": "a"}, TypeError, "scale must be a real number"),
        ({"scale": [0.1, 0.2]}, ValueError, "axis=None needs a single scale"),
        ({"scale": [0.1, 0.2], "axis": 1}, ValueError, r"axis=1 of x has length 3"),
        ({"axis": 2}, ValueError, "axis 2 is out of range"),
        ({"axis": 1.0}, TypeError, "axis must be an int"),
        ({"zero_point": 0.5}, TypeError, "zero_point must be an integer"),
        ({"zero_point": 200}, ValueError, r"zero_point must lie in -128..127"),
        ({"fmt": "e4m3"}, ValueError, "fmt must be an integer format"),
        ({"fmt": "int7"}, ValueError, "unknown format 'int7'"),
        ({"rounding": "banker"}, ValueError, "rounding must be one of"),
        ({"division": "float"}, ValueError, "division must be one of"),
    ],
)
def test_quantize_bad_input(kwargs, exc, match):
    args = {"fmt": "int8", "scale": 0.1, **kwargs}
    x = np.ones((2, 3), dtype=np.float32)
    with pytest.raises(exc, match=match):
        pl.quantize(x, args.pop("fmt"), args.pop("scale"), **args)


def test_quantize_rejects_integer_and_nan_input():
    with pytest.raises(TypeError, match="x must hold floating-point numbers"):
        pl.quantize(np.array([1, 2]), "int8", 0.1)
    with pytest.raises(TypeError, match="complex"):
        pl.quantize(np.array([1j]), "int8", 0.1)
    with pytest.raises(ValueError, match="x contains NaN"):
        pl.quantize([1.0, float("nan")], "int8", 0.1)
    with pytest.raises(TypeError, match="q must be an integer array"):
        pl.dequantize([1.5], 0.1)
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        pl.dequantize([1], 0)


# ----- calibration -------------------------------------------------------------------------------
def fits_exactly(x: np.ndarray, cal: pl.Calibration) -> bool:
    """Every x satisfies qmin <= x / scale + zero_point <= qmax exactly (no clipping)."""
    xs = np.moveaxis(np.asarray(x, np.float64), cal.axis, 0) if cal.axis is not None else [x]
    scales = np.atleast_1d(cal.scale)
    zps = np.atleast_1d(cal.zero_point)
    for c, row in enumerate(xs):
        s, z = Fraction(float(scales[c])), int(zps[c])
        lo, hi = Fraction(float(np.min(row))), Fraction(float(np.max(row)))
        if not (cal.qmin <= lo / s + z and hi / s + z <= cal.qmax):
            return False
    return True


def is_smallest_fitting(scale: np.float32, amax: float, levels: int) -> bool:
    """amax / scale <= levels exactly, and one float32 step below the scale it is not."""
    smaller = np.nextafter(np.float32(scale), np.float32(0))
    fits = Fraction(amax) / Fraction(float(scale)) <= levels
    return fits and (smaller == 0 or Fraction(amax) / Fraction(float(smaller)) > levels)


arrays = st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=1, max_size=30).map(
    lambda v: np.array(v, dtype=np.float32)
)


@settings(max_examples=200, deadline=None)
@given(
    x=arrays,
    fmt=st.sampled_from(INT_FORMATS),
    symmetric=st.booleans(),
    narrow=st.booleans(),
    mode=st.sampled_from(DETERMINISTIC),
)
def test_max_calibration_never_clips(x, fmt, symmetric, narrow, mode):
    cal = pl.calibrate(x, fmt, symmetric=symmetric, narrow_range=narrow)
    assert cal.scale.dtype == np.float32 and cal.scale > 0
    assert fits_exactly(x, cal)
    qmin, qmax = qrange(fmt, narrow)
    q = cal.quantize(x, rounding=mode)
    for v, got in zip(x.tolist(), q.tolist(), strict=True):
        exact = round_int(Fraction(v) / Fraction(float(cal.scale)), mode) + int(cal.zero_point)
        assert qmin <= exact <= qmax and got == exact  # the clamp never acts
    if symmetric and pl.get_format(fmt).signed:
        assert int(cal.zero_point) == 0
        if cal.amax > 0:  # the smallest float32 scale that fits
            assert is_smallest_fitting(cal.scale, float(cal.amax), qmax)


def test_max_calibration_per_channel_and_named_numbers():
    x = np.array([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [3.0, 1.0, -0.25]], dtype=np.float32)
    cal = pl.calibrate(x, "int8", axis=0)
    np.testing.assert_array_equal(cal.amax, [2.0, 0.0, 3.0])
    assert cal.scale.shape == (3,) and cal.zero_point.shape == (3,)
    assert cal.scale[1] == 1.0  # all-zero channel
    assert fits_exactly(x, cal)
    assert is_smallest_fitting(cal.scale[0], 2.0, 127)  # amax / 127 rounded up to float32
    q = cal.quantize(x)
    # 1.0 / scale = 63.4999999... (the scale is rounded up) and rounds to 63, not 64
    assert Fraction(1) / Fraction(float(cal.scale[0])) < Fraction(127, 2)
    assert q[0].tolist() == [63, -127, 32] and q[2].tolist() == [127, 42, -11]
    calc = pl.calibrate(x, "int8", axis=1)
    np.testing.assert_array_equal(calc.amax, [3.0, 2.0, 0.5])
    # uint8 symmetric: zero point 128 (torch quint8), asymmetric with non-negative data: 0
    assert int(pl.calibrate(x, "uint8").zero_point) == 128
    pos = np.abs(x)
    cal_u = pl.calibrate(pos, "uint8", symmetric=False)
    assert int(cal_u.zero_point) == 0 and is_smallest_fitting(cal_u.scale, 3.0, 255)


def test_percentile_hand_derived():
    # |x| = 1..10000: 2048 bins of width 10000/2048 = 4.8828125; the last bin holds 9996..10000,
    # so the cumulative fraction reaches 0.9999 only in the last bin: amax is its lower edge
    x = np.arange(1, 10001, dtype=np.float64)
    cal = pl.calibrate(x, "int8", method="percentile", percentile=99.99)
    assert float(cal.amax) == 2047 * 10000 / 2048 == 9995.1171875
    cal = pl.calibrate(x, "int8", method="percentile", percentile=50)
    # bins are [edge_j, edge_j+1): the cdf after bin 1023 counts 1..4999 (< 0.5), after bin 1024
    # (which starts at 5000.0) 1..5004: amax = edge_1024 = 5000
    assert float(cal.amax) == 1024 * 10000 / 2048 == 5000.0
    assert abs(float(cal.amax) - np.percentile(x, 50)) <= 10000 / 2048


def original_entropy(calib_hist, calib_bin_edges, num_bits, unsigned, stride=1, start_bin=128):
    """pytorch-quantization's ``_compute_amax_entropy``, transcribed loop for loop (scipy's
    ``entropy`` written out: it normalises both distributions and sums p * log(p / q))."""
    bins = calib_hist[:].copy()
    bins[0] = bins[1]
    divergences = []
    nbins = 1 << (num_bits - 1 + int(unsigned))
    starting, stop = start_bin, len(bins)
    new_density_counts = np.zeros(nbins, dtype=np.float64)
    for i in range(starting, stop + 1, stride):
        new_density_counts.fill(0)
        space = np.linspace(0, i, num=nbins + 1)
        digitized_space = np.digitize(range(i), space) - 1
        digitized_space[bins[:i] == 0] = -1
        for idx, digitized in enumerate(digitized_space):
            if digitized != -1:
                new_density_counts[digitized] += bins[idx]
        counter = Counter(digitized_space)
        for key, val in counter.items():
            if key != -1:
                new_density_counts[key] = new_density_counts[key] / val
        new_density = np.zeros(i, dtype=np.float64)
        for idx, digitized in enumerate(digitized_space):
            if digitized != -1:
                new_density[idx] = new_density_counts[digitized]
        reference_density = np.array(bins[: len(digitized_space)], dtype=np.float64)
        reference_density[-1] += np.sum(bins[i:])
        p = reference_density / reference_density.sum()
        q = new_density / new_density.sum()
        if np.any((p > 0) & (q == 0)):
            ent = np.inf
        else:
            m = p > 0
            ent = float(np.sum(p[m] * np.log(p[m] / q[m])))
        divergences.append(ent)
    divergences = np.array(divergences)
    last_argmin = len(divergences) - 1 - np.argmin(divergences[::-1])
    return calib_bin_edges[last_argmin * stride + starting]


@pytest.mark.parametrize(("fmt", "num_bits"), [("int8", 8), ("int4", 4)])
def test_entropy_matches_pytorch_quantization_loop(fmt, num_bits):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.laplace(0, 1, 20000), [40.0, -35.0]]).astype(np.float32)
    num_bins, start_bin = 512, 128 if num_bits == 8 else 16
    absx = np.abs(x.astype(np.float64))
    hist, edges = np.histogram(absx, bins=num_bins, range=(0, absx.max()))
    want = original_entropy(hist, edges, num_bits, False, 1, start_bin)
    cal = pl.calibrate(x, fmt, method="entropy", num_bins=num_bins, start_bin=start_bin)
    assert float(cal.amax) == float(want)
    assert edges[start_bin] <= float(cal.amax) < absx.max()  # the outliers are clipped
    cal3 = pl.calibrate(x, fmt, method="entropy", num_bins=num_bins, start_bin=start_bin, stride=3)
    assert float(cal3.amax) == float(original_entropy(hist, edges, num_bits, False, 3, start_bin))


def test_entropy_default_bins_gaussian():
    x = np.random.default_rng(0).standard_normal(200000).astype(np.float32)
    cal = pl.calibrate(x, "int8", method="entropy")
    # TensorRT-style KL calibration of a Gaussian clips a little below the maximum
    assert 3.0 < float(cal.amax) < float(np.abs(x).max())
    assert float(cal.scale) * 127 >= float(cal.amax)


def original_mse(calib_hist, calib_bin_edges, num_bits, start_bin=128, stride=1):
    """pytorch-quantization's ``_compute_amax_mse`` with its ``fake_tensor_quant`` written out in
    exact rational arithmetic (round half to even, clamp to the signed range, rescale)."""
    centers = (calib_bin_edges[1:] + calib_bin_edges[:-1]) / 2
    max_bound = (1 << (num_bits - 1)) - 1
    best, best_mse = None, None
    for i in range(start_bin, len(centers), stride):
        amax = Fraction(float(centers[i]))
        scale = amax / max_bound
        err = Fraction(0)
        for c, n in zip(centers.tolist(), calib_hist.tolist(), strict=True):
            if n:
                k = min(round_int(Fraction(c) / scale, "nearest_even"), max_bound)
                err += (k * scale - Fraction(c)) ** 2 * n
        if best_mse is None or err < best_mse:
            best, best_mse = centers[i], err
    return best


def test_mse_matches_exhaustive_search():
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.standard_normal(3000), [9.0]]).astype(np.float32)
    num_bins, start_bin = 64, 8
    absx = np.abs(x.astype(np.float64))
    hist, edges = np.histogram(absx, bins=num_bins, range=(0, absx.max()))
    want = original_mse(hist, edges, 4, start_bin)
    cal = pl.calibrate(x, "int4", method="mse", num_bins=num_bins, start_bin=start_bin)
    assert float(cal.amax) == float(want)
    assert float(cal.amax) < 9.0


def test_mse_is_near_the_brute_force_optimum():
    # int4 on a Gaussian: the MSE-optimal clipping is about 2.4 sigma, far below max|x|
    x = np.random.default_rng(2).standard_normal(50000).astype(np.float32)
    x64 = x.astype(np.float64)

    def mse(scale):
        return float(np.mean((pl.dequantize(pl.quantize(x, "int4", scale), scale) - x64) ** 2))

    brute = min(mse(np.float64(a / 7)) for a in np.linspace(1.0, 4.5, 141))
    c_mse = pl.calibrate(x, "int4", method="mse")
    c_max = pl.calibrate(x, "int4")
    c_pct = pl.calibrate(x, "int4", method="percentile", percentile=99.9)
    assert 2.0 < float(c_mse.amax) < 3.0
    assert brute <= mse(c_mse.scale) <= 1.03 * brute
    assert mse(c_mse.scale) < mse(c_pct.scale) < mse(c_max.scale)


def test_histogram_methods_per_channel():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 5000)).astype(np.float32) * np.array([[1.0], [10.0]], np.float32)
    for method in ("percentile", "mse", "entropy"):
        cal = pl.calibrate(x, "int8", method=method, axis=0)
        one = pl.calibrate(x[1], "int8", method=method)
        assert cal.amax.shape == (2,) and float(cal.amax[1]) == float(one.amax)
        assert 5 < cal.amax[1] / cal.amax[0] < 20


@pytest.mark.parametrize(
    ("x", "kwargs", "exc", "match"),
    [
        (np.array([1, 2]), {}, TypeError, "floating-point"),
        (np.array([], np.float32), {}, ValueError, "empty"),
        (np.array([1.0, np.inf]), {}, ValueError, "NaN or inf"),
        (np.array([1.0, np.nan]), {}, ValueError, "NaN or inf"),
        (np.ones(4), {"method": "kl"}, ValueError, "method must be one of"),
        (np.ones(4), {"method": "mse", "symmetric": False}, ValueError, "symmetric=False"),
        (np.ones(4), {"method": "percentile", "percentile": 0}, ValueError, "percentile"),
        (np.ones(4), {"method": "entropy", "num_bins": 64}, ValueError, "start_bin"),
        (np.ones(4), {"num_bins": 0}, ValueError, "num_bins"),
        (np.ones(4), {"axis": 3}, ValueError, "axis 3 is out of range"),
        (np.ones(4), {"fmt": "bf16"}, ValueError, "integer format"),
    ],
)
def test_calibrate_bad_input(x, kwargs, exc, match):
    fmt = kwargs.pop("fmt", "int8")
    with pytest.raises(exc, match=match):
        pl.calibrate(x, fmt, **kwargs)


# ----- torch -------------------------------------------------------------------------------------
def _torch():
    torch = pytest.importorskip("torch")
    warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
    return torch


def _tie_heavy(scale: np.float32, n: int, rng: np.random.Generator) -> np.ndarray:
    k = rng.integers(-140, 140, n) + 0.5
    x = (k * np.float64(scale)).astype(np.float32)
    return np.concatenate(
        [
            x,
            np.nextafter(x, np.float32(np.inf)),
            np.nextafter(x, np.float32(-np.inf)),
            (rng.standard_normal(n) * 40 * scale).astype(np.float32),
        ]
    )


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_torch_division_matches_torch_bit_for_bit():
    torch = _torch()
    rng = np.random.default_rng(1)
    for scale in map(np.float32, (0.37, 1 / 3, 0.0123, 2.0**-7, 1e-3)):
        x = _tie_heavy(scale, 5000, rng)
        tx = torch.from_numpy(x)
        for dt, fmt in ((torch.qint8, "int8"), (torch.quint8, "uint8"), (torch.qint32, None)):
            f = IntFormat(32) if fmt is None else fmt
            want = torch.quantize_per_tensor(tx, float(scale), 0, dt).int_repr().numpy()
            np.testing.assert_array_equal(pl.quantize(x, f, scale, division="torch"), want)
        # per channel: scales differ per row (zero point 0)
        x2 = np.stack([x, -x, x * 3])
        sc = np.array([scale, scale * 2, 0.1], dtype=np.float32)
        tq = torch.quantize_per_channel(
            torch.from_numpy(x2),
            torch.from_numpy(sc.astype(np.float64)),
            torch.zeros(3),
            0,
            torch.qint8,
        )
        got = pl.quantize(x2, "int8", sc, axis=0, division="torch")
        np.testing.assert_array_equal(got, tq.int_repr().numpy())
        # torch dequantize: float32(scale) * (q - zp) in float32, as ours for a float32 scale
        np.testing.assert_array_equal(pl.dequantize(got, sc, axis=0), tq.dequantize().numpy())
        # fake quantization: any zero point, narrow ranges, round-then-add-zero-point
        for fmt, zp, narrow, lo, hi in (
            ("int8", 0, True, -127, 127),
            ("int8", 3, False, -128, 127),
            ("uint8", 7, False, 0, 255),
            ("int4", -3, False, -8, 7),
        ):
            fq = torch.fake_quantize_per_tensor_affine(tx, float(scale), zp, lo, hi).numpy()
            q = pl.quantize(x, fmt, scale, zp, narrow_range=narrow, division="torch")
            assert qrange(fmt, narrow) == (lo, hi)
            np.testing.assert_array_equal(pl.dequantize(q, scale, zp), fq)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_exact_division_differs_from_torch_only_where_torch_is_wrong():
    torch = _torch()
    rng = np.random.default_rng(2)
    total = differ = 0
    for scale in map(np.float32, (0.37, 1 / 3, 0.0123, 0.1)):
        x = np.concatenate(
            [
                _tie_heavy(scale, 2000, rng),
                (rng.standard_normal(20000) * 40 * scale).astype(np.float32),
            ]
        )
        want = torch.quantize_per_tensor(torch.from_numpy(x), float(scale), 0, torch.qint32)
        t = want.int_repr().numpy().astype(np.int64)
        e = pl.quantize(x, IntFormat(32), scale).astype(np.int64)
        bad = np.flatnonzero(t != e)
        total += x.size
        differ += bad.size
        for i in bad[:200]:
            exact = Fraction(float(x[i])) / Fraction(float(scale))
            assert e[i] == round_int(exact, "nearest_even") and abs(t[i] - e[i]) == 1
    assert 0 < differ < total / 5  # the tie-heavy part differs, random data almost never


def _quantize_whole_array(x, fmt, s, z, axis, mode, seed, rbits, division):
    """quantize's rounding as one round_to call over the whole quotient (the referee of the
    chunked stochastic path: same flat-index keys)."""
    from precision_lab.quant import integer as Q

    f = Q._int_format(fmt)
    a = Q.as_float_array(np.asarray(x))
    ax = Q._check_axis(axis, a.ndim)
    ss, zz = Q._scale(s, a.shape, ax), Q._zero_point(z, f, a.shape, ax)
    qmin, qmax = Q.qrange(f, False)
    with np.errstate(all="ignore"):
        if division == "exact":
            qu = Q._odd_quotient(a.astype(np.float64), ss)
        else:
            qu = Q._torch_quotient(a, ss)
    k = pl.round_to(np.broadcast_to(qu, a.shape), Q._WIDE, rounding=mode, seed=seed,
                    random_bits=rbits)  # fmt: skip
    return np.clip(k + zz, qmin, qmax).astype(Q._q_dtype(f))


@pytest.mark.parametrize("trial", range(16))
def test_stochastic_quantize_in_chunks_equals_one_whole_array_rounding(trial, monkeypatch):
    """Chunk sizes of 7..199 elements, 1 and 2 workers, per tensor and per channel, every integer
    format, both stochastic modes, random_bits None/5/13, exact and torch division, inf inputs."""
    from precision_lab.core import pool as _parallel

    rng = np.random.default_rng(trial)
    shape = tuple(int(v) for v in rng.integers(1, 30, size=rng.integers(1, 4)))
    dtype = [np.float32, np.float64, np.float16][trial % 3]
    x = (rng.standard_normal(shape) * [0.01, 1.0, 100.0][trial % 3]).astype(dtype)
    x.flat[rng.integers(0, x.size)] = -np.inf if trial % 2 else np.inf
    axis = None if trial % 4 == 0 else int(rng.integers(0, x.ndim))
    fmt = ["int8", "uint8", "int4", "uint4"][trial % 4]
    n = 1 if axis is None else shape[axis]
    s = rng.uniform(0.001, 0.5, size=n) if axis is not None else 0.037
    z = 0 if fmt.startswith("int") else (rng.integers(0, 15, size=n) if axis is not None else 7)
    mode = ["stochastic", "stochastic_equal"][trial % 2]
    seed = int(rng.integers(0, 2**62)) * 5
    rbits, division = [None, 5, 13][trial % 3], ["exact", "torch"][(trial // 2) % 2]
    want = _quantize_whole_array(x, fmt, s, z, axis, mode, seed, rbits, division)
    for workers in (1, 2):
        monkeypatch.setattr(_parallel, "CHUNK", int(rng.integers(7, 200)))
        with _parallel.use_workers(workers):
            got = pl.quantize(x, fmt, s, z, axis=axis, rounding=mode, seed=seed,
                              random_bits=rbits, division=division)  # fmt: skip
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
