"""Block-scaled formats (precision_lab.quant.blocks) against an independent referee.

The referee below knows nothing of the implementation: it loops over blocks in plain Python, keeps
every number as an exact ``fractions.Fraction``, takes the element grids and maxima from the
published format tables, and applies the scale rules and rounding rules as the specifications
state them.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import precision_lab as pl
from precision_lab.core.random_words import random_words
from precision_lab.quant.blocks import BLOCK_FORMATS, BlockFormat, QuantizedBlocks

MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")
MX = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4_e2m1", "mxint8")

# ----- the referee ----------------------------------------------------------------------------
# element grids from the OCP tables: ("float", precision incl. hidden bit, emin, max)
# or ("fixed", quantum, max) for MX INT8 (1.6 fixed point, symmetric -127/64 .. 127/64)
GRIDS = {
    "e4m3": ("float", 4, -6, Fraction(448)),
    "e5m2": ("float", 3, -14, Fraction(57344)),
    "e2m3": ("float", 4, 0, Fraction(15, 2)),
    "e3m2": ("float", 3, -2, Fraction(28)),
    "e2m1": ("float", 2, 0, Fraction(6)),
    "int8/64": ("fixed", Fraction(1, 64), Fraction(127, 64)),
    "fp32": ("float", 24, -126, Fraction((2**24 - 1) * 2**104)),
    "bf16": ("float", 8, -126, Fraction((2**8 - 1) * 2**120)),
}
ELEMENT = {
    "mxfp8_e4m3": "e4m3",
    "mxfp8_e5m2": "e5m2",
    "mxfp6_e2m3": "e2m3",
    "mxfp6_e3m2": "e3m2",
    "mxfp4_e2m1": "e2m1",
    "mxint8": "int8/64",
    "nvfp4": "e2m1",
    "nvfp4_16x16": "e2m1",
    "nvfp4_4over6": "e2m1",
    "mxfp4_e2m1_b16": "e2m1",
    "nvfp4_b32": "e2m1",
    "fp8_1x128": "e4m3",
    "fp8_128x128": "e4m3",
}
TWO64 = 1 << 64
NAN = float("nan")


def floor_log2(a: Fraction) -> int:
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    return e


def ref_round(
    v: Fraction,
    grid: str,
    mode: str,
    word: int = 0,
    overflow: str = "saturate",
    neg: bool | None = None,
):
    """Round the exact v to the grid; returns (negative?, magnitude as Fraction or inf).

    ``neg`` gives the sign of a zero v (a Fraction has no -0).
    """
    kind, *spec = GRIDS[grid]
    neg = v < 0 if neg is None else neg
    a = abs(v)
    if kind == "fixed":
        q, top = spec
    else:
        p, emin, top = spec
        e = max(floor_log2(a), emin) if a else emin
        q = Fraction(2) ** (e - p + 1)
    k = a / q
    f = math.floor(k)
    frac = k - f
    if mode == "nearest_even":
        up = frac > Fraction(1, 2) or (frac == Fraction(1, 2) and f % 2 == 1)
    elif mode == "nearest_away":
        up = frac >= Fraction(1, 2)
    elif mode == "toward_zero":
        up = False
    elif mode == "up":
        up = frac > 0 and not neg
    elif mode == "down":
        up = frac > 0 and neg
    elif mode == "odd":
        up = frac > 0 and f % 2 == 0
    else:  # stochastic: up iff floor(frac * 2**64) + R >= 2**64
        up = math.floor(frac * TWO64) + word >= TWO64
    r = (f + up) * q
    if r > top:
        r = top if overflow == "saturate" else math.inf
    return neg, r


def sgn(v: float) -> bool:
    return math.copysign(1.0, float(v)) < 0


def as_float(neg: bool, r) -> float:
    return -float(r) if neg else float(r)


def f32(v: Fraction):
    """float32 arithmetic: the exact v rounded to nearest even float32 (inf on overflow)."""
    neg, r = ref_round(v, "fp32", "nearest_even", overflow="ieee")
    if r == math.inf:
        return -math.inf if neg else math.inf
    return -r if neg else r


def ref_pow2_scale(amax, rule: str, elem_max: Fraction):
    """Scale exponent of the OCP floor rule or the round-up rule; None for a NaN scale."""
    if amax is None:
        return None
    if amax == 0:
        k = -127
    elif rule == "floor":
        k = floor_log2(amax) - floor_log2(elem_max)
    else:
        k = -200
        while amax / Fraction(2) ** k > elem_max:  # the smallest k that makes nothing clip
            k += 1
    k = max(k, -127)
    return None if k > 127 else k


def blocks_of(shape, axis, n):
    """Index lists of the blocks of n along axis (plain loops)."""
    shape = tuple(shape)
    axis %= len(shape)
    others = [range(s) for i, s in enumerate(shape) if i != axis]
    out = []
    for rest in np.ndindex(*[len(r) for r in others]) if others else [()]:
        for b in range(shape[axis] // n):
            idx = []
            for j in range(b * n, (b + 1) * n):
                full = list(rest)
                full.insert(axis, j)
                idx.append(tuple(full))
            out.append(idx)
    return out


def ref_mx(x, name, rule, mode="nearest_even", axis=-1, seed=None):
    """Referee values and per-block scale exponents of an MX format."""
    x = np.asarray(x)
    words = None
    if mode == "stochastic":
        words = random_words(seed, x.size, 0).tolist()
    grid = ELEMENT[name]
    elem_max = GRIDS[grid][-1]
    out = np.empty(x.shape, dtype=np.float64)
    scales = []
    for idx in blocks_of(x.shape, axis, 32):
        vals = [float(x[i]) for i in idx]
        if any(not math.isfinite(v) for v in vals):
            k = None
        else:
            k = ref_pow2_scale(max(abs(Fraction(v)) for v in vals), rule, elem_max)
        scales.append(k)
        for i, v in zip(idx, vals, strict=True):
            if k is None:
                out[i] = NAN
                continue
            flat = int(np.ravel_multi_index(i, x.shape))
            w = words[flat] if words is not None else 0
            neg, r = ref_round(Fraction(v) / Fraction(2) ** k, grid, mode, w, neg=sgn(v))
            value = as_float(neg, r * Fraction(2) ** k)
            if value == 0 and grid == "int8/64":
                value = 0.0  # integers have no negative zero
            out[i] = value
    return out, scales


def same(a, b) -> bool:
    """Bit-for-bit equal values: NaN where NaN, and the sign of zeros."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return (
        a.shape == b.shape
        and bool(np.array_equal(a, b, equal_nan=True))
        and bool((np.signbit(a) == np.signbit(b))[a == 0].all())
    )


def mixed_blocks(rng, shape, spread=40):
    """Student-t values with a random power-of-two magnitude per row."""
    x = rng.standard_t(3, size=shape) * np.exp2(rng.integers(-spread, spread, size=(shape[0], 1)))
    return x.astype(np.float32)


def edge_blocks(name: str) -> np.ndarray:
    """One 32-element block per row: the edge cases of the issue."""
    rng = np.random.default_rng(7)
    emax = float(GRIDS[ELEMENT[name]][-1])
    rows = []
    rows.append(np.zeros(32))  # all zeros
    r = rng.standard_normal(32)
    r[5] = 3e30  # one huge outlier: the others round to zero
    r[6:8] = [1e-30, -1e-30]  # and these underflow in float32 once scaled (directed modes)
    rows.append(r)
    r = rng.uniform(-1, 1, 32)
    r[0] = 4.0  # amax exactly a power of two
    rows.append(r)
    r = rng.uniform(-1, 1, 32) * emax
    r[1] = -emax  # amax at the element format's max
    rows.append(r)
    r = rng.uniform(-1, 1, 32) * emax * 2.0**-20
    r[2] = emax * 2.0**-20 * 1.03  # just above the max after scaling
    rows.append(r)
    r = np.full(32, 1.0)
    r[3:] = rng.uniform(-1, 1, 29) * 2.0**-9  # subnormal element results
    rows.append(r)
    r = rng.standard_normal(32)
    r[4] = np.nan
    rows.append(r)
    r = rng.standard_normal(32)
    r[6] = -np.inf
    rows.append(r)
    rows.append(rng.standard_normal(32) * 1e-40)  # float32 subnormals: the scale clamps to 2**-127
    rows.append(np.array([-0.0, 0.0] * 16))
    rows.append(rng.choice([-1.0, 1.0], 32) * (1 + 2.0 ** -np.arange(32)))  # near a power of two
    r = rng.uniform(-1, 1, 32) * 2.0**19
    r[9] = 2.0**20 * (1 - 2.0**-24)  # just below 2**20 (float32 log2 rounds it to 20.0)
    rows.append(r)
    return np.array(rows, dtype=np.float32)


# ----- MX: exact agreement with the referee ---------------------------------------------------
@pytest.mark.parametrize("name", MX)
@pytest.mark.parametrize("rule", ["floor", "ceil"])
def test_mx_random_and_edge_blocks_match_referee(name, rule):
    rng = np.random.default_rng(zlib.crc32(f"{name}{rule}".encode()))
    x = np.concatenate([mixed_blocks(rng, (6, 32)), edge_blocks(name)])
    bf = pl.get_block_format(name, scale_rule=rule)
    for mode in MODES:
        got = pl.round_to_blocks(x, bf, rounding=mode)
        want, scales = ref_mx(x, name, rule, mode)
        assert got.dtype == np.float32
        assert same(got, want), (name, rule, mode)
    q = pl.quantize_blocks(x, bf)
    ks = [s if s is not None else None for s in scales]
    want_codes = [255 if k is None else k + 127 for k in ks]
    assert q.scale_codes.ravel().tolist() == want_codes
    assert same(q.scales.ravel(), [NAN if k is None else 2.0**k for k in ks])
    assert same(pl.dequantize_blocks(q), pl.round_to_blocks(x, bf))


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4_e2m1", "mxint8"])
def test_mx_float64_input_and_other_axes_match_referee(name):
    rng = np.random.default_rng(3)
    x = mixed_blocks(rng, (64, 3)).astype(np.float64) * (1 + 2.0**-40)  # not float32 values
    for rule in ("floor", "ceil"):
        bf = pl.get_block_format(name, scale_rule=rule)
        got = pl.round_to_blocks(x, bf, axis=0, rounding="nearest_away")
        want, _ = ref_mx(x, name, rule, "nearest_away", axis=0)
        assert got.dtype == np.float64
        assert same(got, want)


def test_stochastic_rounding_matches_referee_with_flat_indices():
    rng = np.random.default_rng(11)
    x = mixed_blocks(rng, (4, 64), spread=10)
    for name in ("mxfp8_e4m3", "mxfp4_e2m1", "mxint8"):
        got = pl.round_to_blocks(x, name, rounding="stochastic", seed=1234)
        want, _ = ref_mx(x, name, "floor", "stochastic", seed=1234)
        assert same(got, want), name
        # a blocked axis other than the last: the words still follow x's flat (C) index
        got0 = pl.round_to_blocks(x.T.copy(), name, axis=0, rounding="sr", seed=99)
        want0, _ = ref_mx(x.T.copy(), name, "floor", "stochastic", axis=0, seed=99)
        assert same(got0, want0), name
        # and a non-contiguous view is indexed as its logical C order
        gotv = pl.round_to_blocks(x.T, name, axis=0, rounding="sr", seed=99)
        assert same(gotv, want0), name


def test_stochastic_rounding_is_reproducible_and_unbiased():
    x = np.full((64, 32), 1.0, dtype=np.float32)
    x[:, 1:] = 0.3  # scale 2**-2: 0.3 / 0.25 = 1.2 lies between the E2M1 values 1 and 1.5
    a = pl.round_to_blocks(x, "mxfp4_e2m1", rounding="sr", seed=5)
    b = pl.round_to_blocks(x, "mxfp4_e2m1", rounding="sr", seed=5)
    c = pl.round_to_blocks(x, "mxfp4_e2m1", rounding="sr", seed=6)
    assert same(a, b) and not same(a, c)
    assert set(np.unique(a[:, 1:])) == {0.25, 0.375}  # neighbours on the E2M1 grid x 2**-2
    assert abs(a[:, 1:].mean() - 0.3) < 0.005
    q = pl.quantize_blocks(x, "mxfp4_e2m1", rounding="sr", seed=5)
    assert same(pl.dequantize_blocks(q), a)


# ----- published values -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("amax", "rule", "scale", "top"),
    [
        (500.0, "ceil", 2.0, 512.0),  # elements <= 250: 500 / 2 = 250 rounds to 256 in E4M3
        (448.0, "ceil", 1.0, 448.0),
        (1.0, "ceil", 2.0**-8, 1.0),
        (500.0, "floor", 1.0, 448.0),  # OCP rule: scale 1 and 500 clips to 448
    ],
)
def test_published_mxfp8_e4m3_scales(amax, rule, scale, top):
    x = np.zeros(32, dtype=np.float32)
    x[0] = amax
    x[1] = -amax / 3
    q = pl.quantize_blocks(x, pl.get_block_format("mxfp8_e4m3", scale_rule=rule))
    assert q.scales.tolist() == [scale]
    assert q.scale_codes.tolist() == [127 + int(math.log2(scale))]
    assert pl.dequantize_blocks(q)[0] == top
    if rule == "ceil":
        assert float(q.element_values()[0]) <= 448.0
        assert abs(float(q.element_values()[0]) * scale - amax) < 0.1 * amax


def test_floor_rule_uses_the_exact_exponent_of_amax():
    amax = np.float32(2.0**20 * (1 - 2.0**-24))
    assert np.log2(amax) == np.float32(20.0)  # a float32 log2 would pick the scale 2**12
    x = np.zeros(32, dtype=np.float32)
    x[0] = amax
    q = pl.quantize_blocks(x, "mxfp8_e4m3")
    assert q.scales.tolist() == [2.0**11]  # floor(log2(amax)) = 19; 19 - 8 = 11
    assert pl.dequantize_blocks(q)[0] == 448 * 2.0**11  # amax / 2**11 = 511.99 clips to 448


def test_round_up_rule_is_exact_where_float32_amax_times_reciprocal_is_not():
    # Transformer Engine forms amax * fp32(1/elem_max) in float32. For MX INT8 (elem_max 127/64)
    # and amax = the float32 just above 127/64 the product rounds down onto 1.0, so that formula
    # picks scale 1 and clips; the exact rule picks scale 2. (For the MX float elements the
    # float32 formula agrees with the exact rule near every elem_max * 2**j.)
    amax = np.nextafter(np.float32(127 / 64), np.float32(2))
    assert amax * (np.float32(1) / np.float32(127 / 64)) == np.float32(1.0)
    x = np.zeros(32, dtype=np.float32)
    x[0] = amax
    bf = pl.get_block_format("mxint8", scale_rule="ceil")
    q = pl.quantize_blocks(x, bf)
    assert q.scales.tolist() == [2.0]
    assert pl.dequantize_blocks(q)[0] == 2.0  # 64 / 64 * 2: rounded, not clipped to 127/64


# ----- NaN and infinity -----------------------------------------------------------------------
@pytest.mark.parametrize("name", [*MX, "nvfp4", "fp8_1x128"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_makes_the_whole_block_nan_and_only_that_block(name, bad):
    bf = pl.get_block_format(name)
    n = bf.block_size
    x = np.linspace(-1, 1, 3 * n).astype(np.float32).reshape(3, n)
    x[1, 2] = bad
    q = pl.quantize_blocks(x, bf)
    v = pl.dequantize_blocks(q)
    assert np.isnan(v[1]).all()  # the finite elements of that block are NaN too
    assert np.isfinite(v[[0, 2]]).all()
    assert np.isnan(q.scales[1]).all() and np.isfinite(q.scales[[0, 2]]).all()
    assert (q.element_codes()[1] == 0).all()  # the spec leaves them free: stored as 0
    nan_code = {"e8m0": 0xFF, "e4m3": 0x7F, "fp32": 0x7FC00000}[str(bf.scale)]
    assert q.scale_codes[1].tolist() == [nan_code]
    assert same(v, pl.round_to_blocks(x, bf))
    if name == "nvfp4":  # the per-tensor scale ignores the NaN block
        assert q.tensor_scale == float(np.float32(1) / (np.float32(2688) / np.float32(1)))


def test_scale_above_e8m0_range_is_nan_below_is_clamped():
    x = np.zeros((2, 32))
    x[0, 0] = 2.0**140  # floor(log2) - 8 = 132 > 127: NaN scale
    x[1, 0] = 2.0**-140  # 2**-148 clamps to 2**-127: the element rounds to 0
    q = pl.quantize_blocks(x, "mxfp8_e4m3")
    assert q.scale_codes.tolist() == [[255], [0]]
    v = pl.dequantize_blocks(q)
    assert np.isnan(v[0]).all() and (v[1] == 0).all()


# ----- codes and packing ----------------------------------------------------------------------
def test_codes_decode_to_the_referee_elements_and_fp4_packs_low_nibble_first():
    x = np.array([[0.5, -1.5, 6.0, -0.0] + [0.25] * 28], dtype=np.float32)
    q = pl.quantize_blocks(x, "mxfp4_e2m1")  # amax 6: scale 2**(2 - 2) = 1
    assert q.scales.tolist() == [[1.0]]
    assert q.codes.shape == (1, 16)
    # E2M1 codes: 0.5 -> 1, -1.5 -> 0b1011, 6 -> 7, -0 -> 8, 0.25 -> 0 (tie to even)
    assert q.codes[0, :3].tolist() == [1 | (0b1011 << 4), 7 | (8 << 4), 0]
    assert q.element_codes().tolist()[0][:5] == [1, 11, 7, 8, 0]
    assert same(q.element_values(), pl.round_to_blocks(x, "mxfp4_e2m1"))


def test_packing_along_an_odd_last_axis():
    x = np.random.default_rng(2).standard_normal((32, 3)).astype(np.float32)
    q = pl.quantize_blocks(x, "mxfp4_e2m1", axis=0)
    assert q.codes.shape == (32, 2)
    assert q.element_codes().shape == (32, 3)
    assert same(pl.dequantize_blocks(q), pl.round_to_blocks(x, "mxfp4_e2m1", axis=0))


def test_mxint8_is_fixed_point_1_6_with_symmetric_saturation():
    x = np.array([-1.999, 1.0, 0.51, -(2**-9), 0.5 + 2**-7] + [0.0] * 27, dtype=np.float64)
    q = pl.quantize_blocks(x, "mxint8")  # amax 1.999: scale 2**0, elements k / 64
    assert q.scales.tolist() == [1.0]
    # -1.999 * 64 = -127.94 saturates to -127 (not -128: the OCP reference code is symmetric);
    # 0.51 * 64 = 32.64 -> 33; -2**-9 * 64 = -0.125 -> 0; 32.5 is a tie -> 32 (even)
    assert q.codes[:5].tolist() == [256 - 127, 64, 33, 0, 32]
    assert pl.dequantize_blocks(q)[:5].tolist() == [-127 / 64, 1.0, 33 / 64, 0.0, 0.5]
    assert pl.decode(np.array([0x80], np.uint8), "int8").tolist() == [-128.0]  # -2.0 decodes


def test_scale_codes_dtypes_and_grid_shapes():
    x = np.ones((256, 384), dtype=np.float32)
    assert pl.quantize_blocks(x, "mxfp8_e4m3").scale_codes.shape == (256, 12)
    assert pl.quantize_blocks(x, "mxfp8_e4m3", axis=0).scale_codes.shape == (8, 384)
    assert pl.quantize_blocks(x, "nvfp4").scale_codes.shape == (256, 24)
    q = pl.quantize_blocks(x, "fp8_1x128")
    assert q.scale_codes.shape == (256, 3) and q.scale_codes.dtype == np.uint32
    q = pl.quantize_blocks(x, "fp8_128x128")
    assert q.scale_codes.shape == (2, 3)
    assert pl.quantize_blocks(x[None], "fp8_128x128").scales.shape == (1, 2, 3)


# ----- NVFP4 and the DeepSeek-V3 tiles against the referee ------------------------------------
def ref_nvfp4(x):
    """NVIDIA's NVFP4 definition in float32 arithmetic (exact Fractions rounded to float32)."""
    fmax = GRIDS["fp32"][-1]
    flat = x.reshape(-1, 16)
    rows = [[Fraction(float(v)) for v in row] for row in flat]
    amaxes = [max(abs(v) for v in r) for r in rows]
    gamax = max(amaxes)
    s_enc = f32(Fraction(2688) / gamax) if gamax else math.inf
    s_enc = min(s_enc, fmax)
    s_dec = f32(1 / s_enc)
    mult = f32(s_enc * f32(Fraction(1, 6)))
    out, scales = [], []
    for r, xr, amax in zip(rows, flat, amaxes, strict=True):
        sb = min(f32(amax * mult), fmax)
        s = ref_round(sb, "e4m3", "nearest_even")[1]
        scales.append(s)
        enc = min(f32(1 / f32(s * s_dec)), fmax) if s else fmax
        for v, xv in zip(r, xr, strict=True):
            scaled = f32(v * enc)
            if abs(scaled) == math.inf:  # saturates
                e = GRIDS["e2m1"][-1]
            else:
                e = ref_round(scaled, "e2m1", "nearest_even", neg=sgn(xv))[1]
            out.append(as_float(sgn(xv), f32(f32(e * s) * s_dec)))
    return np.array(out).reshape(x.shape), np.array([float(s) for s in scales]), float(s_dec)


def test_nvfp4_matches_referee():
    rng = np.random.default_rng(5)
    x = rng.standard_t(4, size=(8, 64)).astype(np.float32)
    x[0, :16] *= 1000.0  # the block that sets the tensor amax
    x[1, :16] = 0.0
    x[2, :16] *= 1e-6  # block scale below E4M3's smallest subnormal: it rounds to 0
    x[3, 16:32] = x[3, 16:32] * 2.0**-130  # float32 subnormals
    want, scales, s_dec = ref_nvfp4(x)
    q = pl.quantize_blocks(x, "nvfp4")
    assert q.tensor_scale == s_dec
    assert same(q.scales.ravel(), scales)
    assert same(pl.dequantize_blocks(q), want)
    assert same(pl.round_to_blocks(x, "nvfp4"), want)
    assert q.scales.ravel()[8] == 0  # the 1e-6 block
    assert same(pl.dequantize_blocks(q)[2, :16], np.copysign(0.0, x[2, :16]))


def test_nvfp4_hand_computed_block():
    # tensor amax 6 * 448: S_enc = 1, S_dec = 1; the block amax 6 gets scale 1 exactly
    x = np.zeros((2, 16), dtype=np.float32)
    x[0, 0] = 2688.0
    x[1, :4] = [6.0, -2.6, 0.74, 5.0]
    q = pl.quantize_blocks(x, "nvfp4")
    assert q.tensor_scale == 1.0
    assert q.scales[1].tolist() == [1.0]
    # 5.0 is halfway between 4 and 6: ties to even (4); -2.6 -> -3; 0.74 -> 0.5
    assert pl.dequantize_blocks(q)[1, :4].tolist() == [6.0, -3.0, 0.5, 4.0]


def ref_tiles(x, rows, cols, mode="nearest_even"):
    """DeepSeek-V3 tiles: s = fp32(amax / 448); element = x / s rounded once; value fp32(q s)."""
    out = np.empty(x.shape)
    scales = np.empty((x.shape[0] // rows, x.shape[1] // cols))
    for bi in range(x.shape[0] // rows):
        for bj in range(x.shape[1] // cols):
            blk = [
                (i, j)
                for i in range(bi * rows, (bi + 1) * rows)
                for j in range(bj * cols, (bj + 1) * cols)
            ]
            amax = max(abs(Fraction(float(x[i]))) for i in blk)
            s = f32(amax / 448)
            scales[bi, bj] = float(s)
            for i in blk:
                v, neg = Fraction(float(x[i])), sgn(x[i])
                if s == 0:  # x / 0 saturates; zeros stay zeros
                    e = Fraction(448) if v else Fraction(0)
                else:
                    e = ref_round(v / s, "e4m3", mode, neg=neg)[1]
                out[i] = as_float(neg, f32(e * s))
    return out, scales


def tile_test_input(shape, tile):
    rng = np.random.default_rng(8)
    x = rng.standard_t(3, size=shape).astype(np.float32)
    r, c = tile
    x[:r, c : 2 * c] = 0.0  # an all-zero tile: scale 0, values 0
    x[r:, :c] *= 1e4  # a tile with a larger scale
    x[r + 2, 5 % c] = 3e7  # one huge outlier in it
    x[0, 0] = 1e-42  # a float32 subnormal
    return x


@pytest.mark.parametrize("mode", MODES)
def test_fp32_scaled_tiles_match_referee(mode):
    small = BlockFormat("fp8_4x8", "e4m3", "fp32", (4, 8), "amax")  # type: ignore[arg-type]
    x = tile_test_input((8, 24), (4, 8))
    want, scales = ref_tiles(x, 4, 8, mode)
    q = pl.quantize_blocks(x, small, rounding=mode)
    assert same(q.scales, scales)
    assert same(pl.dequantize_blocks(q), want)
    assert same(pl.round_to_blocks(x, small, rounding=mode), want)


def test_deepseek_tiles_match_referee():
    x = tile_test_input((256, 256), (128, 128))
    want, scales = ref_tiles(x, 128, 128)
    q = pl.quantize_blocks(x, "fp8_128x128")
    assert same(q.scales, scales)
    assert q.scales[0, 1] == 0 and (pl.dequantize_blocks(q)[:128, 128:] == 0).all()
    assert same(pl.dequantize_blocks(q), want)
    x1 = x[126:130]
    want1, scales1 = ref_tiles(x1, 1, 128, "down")
    q1 = pl.quantize_blocks(x1, "fp8_1x128", rounding="down")
    assert same(q1.scales, scales1)
    assert same(pl.dequantize_blocks(q1), want1)


# ----- axes, padding, shapes and dtypes ------------------------------------------------------
def test_axis_is_the_transposed_last_axis():
    x = mixed_blocks(np.random.default_rng(4), (64, 96), spread=8)
    for name in ("mxfp8_e5m2", "nvfp4"):
        for mode in ("nearest_even", "down"):
            a = pl.round_to_blocks(x, name, axis=0, rounding=mode)
            b = pl.round_to_blocks(x.T, name, axis=-1, rounding=mode).T
            assert same(a, b)
    y = x.reshape(2, 32, 96)
    assert same(
        pl.round_to_blocks(y, "mxfp6_e3m2", axis=1)[1],
        pl.round_to_blocks(x[32:], "mxfp6_e3m2", axis=0),
    )
    # 2-D tiles cover the last two axes whatever -1/-2 says
    z = np.random.default_rng(1).standard_normal((256, 128)).astype(np.float32)
    assert same(pl.round_to_blocks(z, "fp8_128x128", axis=-2), pl.round_to_blocks(z, "fp8_128x128"))


def test_padding_equals_explicit_zero_padding():
    x = mixed_blocks(np.random.default_rng(9), (5, 45), spread=6)
    with pytest.raises(ValueError, match=r"length 45, not a multiple of .*block size 32.*pad=True"):
        pl.round_to_blocks(x, "mxfp8_e4m3")
    padded = np.zeros((5, 64), dtype=np.float32)
    padded[:, :45] = x
    for mode in ("nearest_even", "up"):
        got = pl.round_to_blocks(x, "mxfp8_e4m3", pad=True, rounding=mode)
        assert same(got, pl.round_to_blocks(padded, "mxfp8_e4m3", rounding=mode)[:, :45])
    q = pl.quantize_blocks(x, "mxfp4_e2m1", pad=True)
    assert q.shape == (5, 45) and q.scales.shape == (5, 2) and q.codes.shape == (5, 23)
    assert same(pl.dequantize_blocks(q), pl.round_to_blocks(x, "mxfp4_e2m1", pad=True))
    # stochastic rounding with padding keys the random words by x's own flat index
    got = pl.round_to_blocks(x, "mxfp8_e4m3", pad=True, rounding="sr", seed=3)
    words = random_words(3, x.size, 0).tolist()
    for i in range(x.size):
        r, c = divmod(i, 45)
        k = floor_log2(max(abs(Fraction(float(v))) for v in padded[r, (c // 32) * 32 :][:32])) - 8
        v = Fraction(float(x[r, c])) / Fraction(2) ** k
        neg, e = ref_round(v, "e4m3", "stochastic", words[i], neg=sgn(x[r, c]))
        assert got[r, c] == as_float(neg, e * Fraction(2) ** k)
    t = np.ones((130, 200), dtype=np.float32)
    q = pl.quantize_blocks(t, "fp8_128x128", pad=True)
    assert q.scales.shape == (2, 2) and pl.dequantize_blocks(q).shape == (130, 200)


def test_dtypes_and_inputs_are_left_alone():
    import ml_dtypes

    x = mixed_blocks(np.random.default_rng(6), (2, 64), spread=4)
    ref = pl.round_to_blocks(x, "mxfp8_e4m3")
    ro = x.copy()
    ro.flags.writeable = False
    assert same(pl.round_to_blocks(ro, "mxfp8_e4m3"), ref)
    assert same(pl.round_to_blocks(x.astype(">f4"), "mxfp8_e4m3"), ref)
    assert same(
        pl.round_to_blocks(x.tolist(), "mxfp8_e4m3"),
        pl.round_to_blocks(x.astype(np.float64), "mxfp8_e4m3"),
    )
    h = x.astype(np.float16)
    assert same(
        pl.round_to_blocks(h, "mxfp8_e4m3"), pl.round_to_blocks(h.astype(np.float32), "mxfp8_e4m3")
    )
    b = x.astype(ml_dtypes.bfloat16)
    assert pl.round_to_blocks(b, "mxfp8_e4m3").dtype == np.float32
    before = x.copy()
    pl.quantize_blocks(x, "nvfp4", rounding="sr", seed=1)
    assert same(x, before)
    empty = np.zeros((0, 32), dtype=np.float32)
    assert pl.round_to_blocks(empty, "mxfp8_e4m3").shape == (0, 32)
    assert pl.quantize_blocks(empty, "mxfp4_e2m1").codes.shape == (0, 16)


# ----- bad input ------------------------------------------------------------------------------
def test_bad_input_gives_clear_errors():
    x = np.ones((4, 32), dtype=np.float32)
    with pytest.raises(
        ValueError, match="unknown block format 'mxfp9'; known block formats: mxfp8"
    ):
        pl.round_to_blocks(x, "mxfp9")
    with pytest.raises(TypeError, match="block_format must be a name or a BlockFormat"):
        pl.quantize_blocks(x, 8)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match="x must hold floating-point numbers, got an array of int64"
    ):
        pl.round_to_blocks(np.ones((4, 32), dtype=np.int64), "mxfp8_e4m3")
    with pytest.raises(ValueError, match="axis 0 of x has length 4, not a multiple of"):
        pl.round_to_blocks(x, "mxfp8_e4m3", axis=0)
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        pl.round_to_blocks(x, "mxfp8_e4m3", axis=2)
    with pytest.raises(ValueError, match="needs an array of at least 2 dimensions"):
        pl.round_to_blocks(np.ones(128), "fp8_128x128")
    with pytest.raises(ValueError, match="at least one dimension"):
        pl.round_to_blocks(np.float32(1.0), "mxfp8_e4m3")
    with pytest.raises(ValueError, match="rounding must be one of"):
        pl.round_to_blocks(x, "mxfp8_e4m3", rounding="nearest_odd")
    with pytest.raises(ValueError, match="scale_rule must be one of"):
        pl.get_block_format("mxfp8_e4m3", scale_rule="round")
    with pytest.raises(ValueError, match="tensor_scale=True"):
        BlockFormat("x", "e2m1", "e4m3", (16,), "floor", tensor_scale=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_shape must be"):
        BlockFormat("x", "e2m1", "e8m0", (0,))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="QuantizedBlocks"):
        pl.dequantize_blocks(x)  # type: ignore[arg-type]


def test_registry_and_custom_formats():
    assert list(BLOCK_FORMATS) == [
        *MX,
        "nvfp4",
        "nvfp4_16x16",
        "nvfp4_4over6",
        "mxfp4_e2m1_b16",
        "nvfp4_b32",
        "fp8_1x128",
        "fp8_128x128",
    ]
    for name, bf in BLOCK_FORMATS.items():
        assert bf.element_max == float(GRIDS[ELEMENT[name]][-1])
        assert 2.0**bf.element_emax <= bf.element_max < 2.0 ** (bf.element_emax + 1)
    assert BLOCK_FORMATS["mxfp8_e4m3"].bits_per_element == 8.25
    assert BLOCK_FORMATS["nvfp4"].bits_per_element == 4.5
    # a custom format: E4M3 elements, blocks of 64, round-up E8M0 scales
    bf = BlockFormat("my64", "e4m3", "e8m0", (64,), "ceil")  # type: ignore[arg-type]
    x = mixed_blocks(np.random.default_rng(1), (2, 64), spread=3)
    got = pl.round_to_blocks(x, bf)
    for r in range(2):
        k = ref_pow2_scale(max(abs(Fraction(float(v))) for v in x[r]), "ceil", Fraction(448))
        for c in range(64):
            neg, e = ref_round(Fraction(float(x[r, c])) / Fraction(2) ** k, "e4m3", "nearest_even")
            assert got[r, c] == as_float(neg, e * Fraction(2) ** k)
    assert isinstance(pl.quantize_blocks(x, bf), QuantizedBlocks)


def test_agrees_with_gfloat_where_installed():
    pytest.importorskip("gfloat")
    from gfloat import formats as gf
    from gfloat.block import compute_scale_amax, quantize_block

    rng = np.random.default_rng(12)
    x = mixed_blocks(rng, (24, 32), spread=30)
    x[3] = np.abs(x[3])
    x[3, 7] = -1.999 * 2.0 ** np.floor(np.log2(x[3].max()))  # gfloat's MX INT8 gives -2.0 here
    for name in MX:
        fi = getattr(gf, f"format_info_{name}")
        want = np.stack([quantize_block(fi, r.astype(np.float64), compute_scale_amax) for r in x])
        got = pl.round_to_blocks(x, name)
        if name == "mxint8":  # gfloat's INT8 is two's complement down to -2.0, ours to -127/64
            scales = pl.quantize_blocks(x, name).scales
            assert want[3, 7] == -2.0 * scales[3, 0] and got[3, 7] == -127 / 64 * scales[3, 0]
            want[3, 7] = got[3, 7]
        assert same(got, want), name


def test_large_tiles_run_in_parallel_chunks():
    # a 128-row unit of 128 x 2048 (262144 values) is more than the core rounds in one thread
    x = np.random.default_rng(3).standard_normal((640, 2048)).astype(np.float32)
    x[128:256] *= 1000.0
    got = pl.round_to_blocks(x, "fp8_128x128")
    s = np.abs(x).reshape(5, 128, 16, 128).max(axis=(1, 3)) / np.float32(448)
    assert np.array_equal(pl.quantize_blocks(x, "fp8_128x128").scales, s.astype(np.float64))
    q = pl.round_to(x / np.repeat(np.repeat(s, 128, 0), 128, 1).astype(np.float64), "e4m3")
    assert same(got, (q * np.repeat(np.repeat(s, 128, 0), 128, 1)).astype(np.float32))


# ----- GEMM of block-quantized operands -------------------------------------------------------
def ref_block_gemm(a, b, sa, sb, kblock, acc="fp32", alpha=None):
    """DeepSeek-V3 / Blackwell block-scaled GEMM in exact arithmetic: each block of K summed
    sequentially in the accumulator (fp32 or bf16 here, from 0), times fp32(sa * sb), added to
    the fp32 wide accumulator at promotion (one rounding); alpha scales the fp32 result."""
    M, K = a.shape
    N = b.shape[1]
    d = np.empty((M, N))
    for i in range(M):
        for j in range(N):
            W = Fraction(0)
            for k0 in range(0, K, kblock):
                P = Fraction(0)
                for k in range(k0, min(k0 + kblock, K)):
                    P = ref_round(P + Fraction(a[i, k]) * Fraction(b[k, j]), acc, "nearest_even")
                    P = -P[1] if P[0] else P[1]
                sigma = f32(Fraction(sa[i, k0 // kblock]) * Fraction(sb[k0 // kblock, j]))
                W = f32(W + P * sigma)
            if alpha is not None:
                W = f32(W * Fraction(float(alpha)))
            d[i, j] = float(W)
    return d


@pytest.mark.parametrize(("fa", "fb"), [("mxfp8_e4m3", "mxfp8_e5m2"), ("mxfp4_e2m1", "mxint8")])
def test_gemm_blocks_matches_referee(fa, fb):
    rng = np.random.default_rng(21)
    a = mixed_blocks(rng, (3, 96), spread=6)
    b = mixed_blocks(rng, (96, 4), spread=6)
    qa = pl.quantize_blocks(a, fa)
    qb = pl.quantize_blocks(b, fb, axis=0)
    va, vb = qa.element_values().astype(np.float64), qb.element_values().astype(np.float64)
    want = ref_block_gemm(va, vb, qa.scales, qb.scales, 32)
    assert same(pl.gemm_blocks(qa, qb), want)
    # the same products in a bf16 accumulator (promoted to fp32 at every block)
    got = pl.gemm_blocks(qa, qb, accumulator=pl.Accumulator("bf16"))
    assert same(got, ref_block_gemm(va, vb, qa.scales, qb.scales, 32, acc="bf16"))


def test_gemm_blocks_deepseek_tiles_and_nvfp4():
    rng = np.random.default_rng(22)
    x = rng.standard_t(4, size=(2, 256)).astype(np.float32)
    w = rng.standard_normal((256, 128)).astype(np.float32)
    w[128:] *= 100.0  # the second weight tile has a larger scale
    qa = pl.quantize_blocks(x, "fp8_1x128")
    qb = pl.quantize_blocks(w, "fp8_128x128")
    assert qa.scales.shape == (2, 2) and qb.scales.shape == (2, 1)
    va, vb = qa.element_values().astype(np.float64), qb.element_values().astype(np.float64)
    sb = np.repeat(qb.scales, 128, axis=1)  # one scale per 128 columns: expand for the referee
    got = pl.gemm_blocks(qa, qb)
    assert same(got[:, :5], ref_block_gemm(va, vb[:, :5], qa.scales, sb[:, :5], 128))
    # against the dequantized product (float64): close, not equal (fp32 accumulation)
    exact = pl.dequantize_blocks(qa).astype(np.float64) @ pl.dequantize_blocks(qb)
    assert np.allclose(got, exact, rtol=1e-5, atol=1e-3)
    na = pl.quantize_blocks(x[:, :64], "nvfp4")
    nb = pl.quantize_blocks(w[:64, :3], "nvfp4", axis=0)
    alpha = np.float32(na.tensor_scale) * np.float32(nb.tensor_scale)
    va, vb = na.element_values().astype(np.float64), nb.element_values().astype(np.float64)
    want = ref_block_gemm(va, vb, na.scales, nb.scales, 16, alpha=alpha)
    assert same(pl.gemm_blocks(na, nb), want)
    with pytest.raises(ValueError, match="c is not supported with per-tensor scales"):
        pl.gemm_blocks(na, nb, np.zeros((2, 3)))


def test_gemm_blocks_nan_and_zero_blocks_and_errors():
    a = np.ones((3, 64), dtype=np.float32)
    a[1, 40] = np.nan  # the second block of row 1 is a NaN block
    b = np.ones((64, 2), dtype=np.float32)
    d = pl.gemm_blocks(
        pl.quantize_blocks(a, "mxfp8_e4m3"), pl.quantize_blocks(b, "mxfp8_e4m3", axis=0)
    )
    assert np.isnan(d[1]).all() and (d[[0, 2]] == 64).all()
    t = np.ones((128, 256), dtype=np.float32)
    t[:, 128:] = 0.0  # a zero tile: scale 0 (its elements saturate but its values are 0)
    q = pl.quantize_blocks(t, "fp8_128x128")
    assert q.scales[0, 1] == 0
    d = pl.gemm_blocks(pl.quantize_blocks(np.ones((1, 128), np.float32), "fp8_1x128"), q)
    # 448 * 448 * 128 * fp32(fp32(1/448)**2): scales that are not powers of two are inexact
    assert np.allclose(d[0, :128], 128.0, rtol=1e-6) and (d[0, 128:] == 0).all()
    qa = pl.quantize_blocks(a, "mxfp8_e4m3")
    with pytest.raises(ValueError, match="b must be block-quantized along K: axis -2"):
        pl.gemm_blocks(qa, pl.quantize_blocks(b.T.copy(), "mxfp8_e4m3"))
    with pytest.raises(ValueError, match="same block size along K, got 32"):
        pl.gemm_blocks(qa, pl.quantize_blocks(b, "nvfp4", axis=0))
    with pytest.raises(TypeError, match="a must be a QuantizedBlocks"):
        pl.gemm_blocks(a, pl.quantize_blocks(b, "mxfp8_e4m3", axis=0))  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    vals=st.lists(
        st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=32, max_size=32
    ),
    name=st.sampled_from(MX),
    rule=st.sampled_from(["floor", "ceil"]),
    mode=st.sampled_from(MODES),
)
def test_any_float32_block_matches_referee(vals, name, rule, mode):
    x = np.array(vals, dtype=np.float32)
    got = pl.round_to_blocks(x, pl.get_block_format(name, scale_rule=rule), rounding=mode)
    # values are rounded once to the output dtype: an MX value beyond float32 (256 * 2**120
    # under the ceil rule) is inf in the float32 result
    with np.errstate(over="ignore"):
        want = ref_mx(x, name, rule, mode)[0].astype(got.dtype)
    assert same(got, want)


@pytest.mark.parametrize(
    ("name", "shape", "axis"),
    [
        ("mxfp8_e4m3", (3, 96), -1),
        ("mxfp8_e4m3", (96, 5), 0),
        ("nvfp4", (2, 4, 48), 1),
        ("nvfp4", (5, 40), -1),  # (padded: the per-element masks)
        ("nvfp4_16x16", (32, 48), -1),
        ("nvfp4_16x16", (2, 48, 32), -1),
        ("fp8_128x128", (128, 256), -1),
    ],
)
def test_gemm_operand_marks_nan_and_zero_blocks(name, shape, axis):
    """The GEMM's operand: a NaN block's elements NaN, a zero-scale block's +0 (whatever its
    saturated elements), scale 1 for both; the blocked-view writes against masks repeated onto
    every element."""
    from precision_lab.gemm.blocks import _gemm_operand

    rng = np.random.default_rng(len(name) + len(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    q0 = pl.quantize_blocks(x, name, axis=axis, pad=True)
    grid = q0.scales.shape
    kind = rng.integers(0, 3, grid)  # 0: as it is, 1: NaN block, 2: zero block
    kind.flat[:2] = [1, 2]
    scales = np.where(kind == 1, np.nan, np.where(kind == 2, 0.0, q0.scales))
    q = dataclasses.replace(q0, scales=scales, codes=q0.codes, scale_codes=q0.scale_codes)
    vals, s, _ = _gemm_operand(q)
    bf = q.block_format
    per = kind
    for ax, n in (
        enumerate(bf.block_shape, start=len(shape) - 2)
        if len(bf.block_shape) == 2
        else [(q.axis, bf.block_shape[0])]
    ):
        per = np.repeat(per, n, axis=ax)
    per = per[tuple(slice(0, n) for n in q.shape)]
    ev = q.element_values()
    want = np.where(per == 1, np.float32(np.nan), np.where(per == 2, np.float32(0), ev))
    assert vals.dtype == np.float32 and same(vals, want)
    assert not np.signbit(vals[per == 2]).any()
    assert np.array_equal(s, np.where(kind > 0, 1.0, q0.scales))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("nvfp4_16x16", (32, 48)),
        ("nvfp4_16x16", (2, 48, 32)),
        ("nvfp4_16x16", (40, 24)),  # ragged tiles at both ends
        ("nvfp4_4over6_16x16", (48, 32)),
        ("fp8_128x128", (256, 136)),
    ],
)
def test_transposed_tiles_is_the_quantization_of_the_transpose(name, shape, mode):
    """A weight quantized once serves w.T and w: the transposed tiles (values kept or codes
    only) equal quantize_blocks of the transposed tensor: codes, scale codes, scales, the 4/6
    choices, the tensor scale and amax, the dequantized values; NaN, inf and zero tiles too."""
    from precision_lab.quant.blocks import _transposed_tiles

    if name == "nvfp4_4over6_16x16":
        bf = dataclasses.replace(
            pl.get_block_format("nvfp4_16x16"),
            scale_rule=pl.get_block_format("nvfp4_4over6").scale_rule,
            tensor_scale_bound=pl.get_block_format("nvfp4_4over6").tensor_scale_bound,
            name=name,
        )
    else:
        bf = pl.get_block_format(name)
    rng = np.random.default_rng(len(shape) * 7 + len(mode))
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-6, 6, shape))).astype(np.float32)
    x[..., 1, 2] = np.nan
    x[..., -1, 0] = np.inf
    x[..., : bf.block_shape[0], -3:] = 0.0
    for keep in (True, False):
        q = pl.quantize_blocks(x, bf, rounding=mode, pad=True, keep_values=keep)
        got = _transposed_tiles(q)
        want = pl.quantize_blocks(
            np.swapaxes(x, -1, -2), bf, rounding=mode, pad=True, keep_values=keep
        )
        assert got.shape == want.shape and got.axis == want.axis
        assert np.array_equal(got.codes, want.codes)
        assert np.array_equal(got.scale_codes, want.scale_codes)
        assert same(got.scales, want.scales)
        assert same(got.element_values(), want.element_values())
        assert same(pl.dequantize_blocks(got), pl.dequantize_blocks(want))
        assert got.tensor_scale == want.tensor_scale
        assert same(got.tensor_amax or 0.0, want.tensor_amax or 0.0)
        if want.four_over_six is None:
            assert got.four_over_six is None
        else:
            assert np.array_equal(got.four_over_six, want.four_over_six)
    with pytest.raises(ValueError, match="square 2-D tiles"):
        _transposed_tiles(pl.quantize_blocks(np.ones((4, 32), np.float32), "nvfp4"))
