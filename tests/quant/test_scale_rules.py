"""The FP4-era scale rules (nearest_even, rceil, amax_div, 4/6), the NVFP4 tensor-scale bound and
the clipped-block report, against exact references.

Power-of-two rules: the scale exponent from ``fractions.Fraction`` and integer log2 reasoning,
then the element referee of test_blocks (``ref_round``). NVFP4 variants: float32 arithmetic as
numpy's IEEE float32 operations (independent of the rounding core), E4M3 and E2M1 rounding by the
referee. 4/6: brute force per block, both candidates quantized and their exact errors compared
in Fractions.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from test_blocks import GRIDS, as_float, floor_log2, mixed_blocks, ref_round, same

import precision_lab as pl
from precision_lab.quant.blocks import clipped_blocks, clipped_fraction, get_block_format

MANT = {"e4m3": 3, "e5m2": 2, "e2m3": 3, "e3m2": 2, "e2m1": 1, "int8/64": 6}
ELEM = {
    "mxfp8_e4m3": "e4m3",
    "mxfp8_e5m2": "e5m2",
    "mxfp6_e2m3": "e2m3",
    "mxfp6_e3m2": "e3m2",
    "mxfp4_e2m1": "e2m1",
    "mxint8": "int8/64",
}
F32 = np.float32


def ref_k(amax: float, rule: str, grid: str) -> int | None:
    """Scale exponent by the rule's definition (None: NaN scale)."""
    elem_max = GRIDS[grid][-1]
    a = Fraction(amax)
    if rule == "rceil":  # d = fp32(fp32(amax) * fp32(1 / elem_max)), IEEE float32 (numpy)
        inv = F32(1.0) / F32(float(elem_max))
        with np.errstate(over="ignore"):
            d = F32(amax) * inv
        if not np.isfinite(d):
            return None
        a = Fraction(float(d))
        if a == 0:
            return -127
        k = floor_log2(a)
        k = k if Fraction(2) ** k == a else k + 1  # ceil(log2 d)
    elif a == 0:
        return -127
    elif rule == "nearest_even":  # amax rounded to mant + 1 significant bits, ties up
        e = floor_log2(a)
        q = Fraction(2) ** (e - MANT[grid])
        r = math.floor(a / q + Fraction(1, 2)) * q
        k = floor_log2(r) - floor_log2(elem_max)
    elif rule == "floor":
        k = floor_log2(a) - floor_log2(elem_max)
    elif rule == "ceil_emax":  # torchao's CEIL: ceil(log2 amax) - emax_elem
        k = floor_log2(a)
        k = (k if Fraction(2) ** k == a else k + 1) - floor_log2(elem_max)
    elif rule == "ceil":  # the smallest k with a / 2**k <= elem_max
        k = floor_log2(a / elem_max)
        k = k if Fraction(2) ** k == a / elem_max else k + 1
    else:
        raise AssertionError(rule)
    k = max(k, -127)
    return None if k > 127 else k


def ref_values(x: np.ndarray, name: str, rule: str, mode: str = "nearest_even"):
    grid = ELEM[name]
    out = np.empty(x.shape, dtype=np.float64)
    ks = []
    for r in range(x.shape[0]):
        vals = x[r].tolist()
        k = None
        if all(math.isfinite(v) for v in vals):
            k = ref_k(max(abs(v) for v in vals), rule, grid)
        ks.append(k)
        for i, v in enumerate(vals):
            if k is None:
                out[r, i] = math.nan
                continue
            neg, m = ref_round(
                Fraction(v) / Fraction(2) ** k, grid, mode, neg=math.copysign(1, v) < 0
            )
            val = as_float(neg, m * Fraction(2) ** k)
            out[r, i] = 0.0 if (val == 0 and grid == "int8/64") else val
    return out, ks


def boundary_blocks(name: str) -> np.ndarray:
    """Blocks whose amax sits at and next to every rounding boundary of the rules."""
    grid = ELEM[name]
    emax = float(GRIDS[grid][-1])
    mb = MANT[grid]
    amaxes = []
    for k in (-130, -126, -3, 0, 5):
        for base in (emax, 2.0 ** math.floor(math.log2(emax)), 2.0 - 2.0 ** -(mb + 1), 1.0):
            a = F32(base * 2.0**k)
            for step in range(-3, 4):
                v = a
                for _ in range(abs(step)):
                    v = np.nextafter(v, F32(np.inf) if step > 0 else F32(0))
                amaxes.append(float(v))
    rng = np.random.default_rng(len(name))
    x = rng.uniform(-1, 1, (len(amaxes), 32)) * np.array(amaxes)[:, None]
    x[:, 3] = amaxes
    return x.astype(np.float32)


@pytest.mark.parametrize("name", list(ELEM))
@pytest.mark.parametrize("rule", ["nearest_even", "rceil", "ceil_emax"])
def test_pow2_rules_match_the_exact_definition(name: str, rule: str) -> None:
    rng = np.random.default_rng(5)
    x = np.concatenate([mixed_blocks(rng, (8, 32)), boundary_blocks(name)])
    x[2, 4] = np.nan
    bf = get_block_format(name, scale_rule=rule)
    for mode in ("nearest_even", "toward_zero", "up"):
        got = pl.round_to_blocks(x, bf, rounding=mode)
        want, ks = ref_values(x, name, rule, mode)
        assert same(got, want), (name, rule, mode)
    q = pl.quantize_blocks(x, bf)
    assert q.scale_codes.ravel().tolist() == [255 if k is None else k + 127 for k in ks]


def test_nearest_even_published_example_and_clipping() -> None:
    x = np.zeros((2, 32), dtype=np.float32)
    x[0, 0] = 7.0  # 1.75 * 4: floor keeps scale 1 and clips to 6; EVEN takes scale 2
    x[1, 0] = 6.5  # 1.625 * 4: both rules keep scale 1; 6.5 clips
    fl = get_block_format("mxfp4_e2m1")
    ev = get_block_format("mxfp4_e2m1", scale_rule="nearest_even")
    assert pl.quantize_blocks(x, fl).scales.ravel().tolist() == [1.0, 1.0]
    assert pl.quantize_blocks(x, ev).scales.ravel().tolist() == [2.0, 1.0]
    assert pl.round_to_blocks(x, ev)[:, 0].tolist() == [8.0, 6.0]
    assert clipped_blocks(x, fl).ravel().tolist() == [True, True]
    assert clipped_blocks(x, ev).ravel().tolist() == [False, True]


def test_rceil_equals_ceil_on_float32_and_differs_on_float64() -> None:
    for name in ELEM:
        x = boundary_blocks(name)
        up = pl.quantize_blocks(x, get_block_format(name, scale_rule="ceil")).scales
        rc = pl.quantize_blocks(x, get_block_format(name, scale_rule="rceil")).scales
        if name != "mxint8":
            assert same(up, rc), name
        else:  # fp32(64 / 127) is below 64 / 127: amax just above 127/64 * 2**k rounds onto 2**k
            assert (rc <= up).all() and (rc < up).any()
            assert F32(1.0) / F32(127 / 64) < Fraction(64, 127)
    x = np.zeros(32)
    x[0] = 6 * (1 + 2.0**-40)
    assert pl.quantize_blocks(x, get_block_format("mxfp4_e2m1", scale_rule="ceil")).scales[0] == 2
    rc = get_block_format("mxfp4_e2m1", scale_rule="rceil")
    assert pl.quantize_blocks(x, rc).scales[0] == 1
    assert pl.round_to_blocks(x, rc)[0] == 6.0 and clipped_blocks(x, rc).tolist() == [True]


# ----- clipped blocks ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mxfp4_e2m1", "mxfp8_e4m3", "mxint8"])
@pytest.mark.parametrize("rule", ["floor", "ceil", "nearest_even", "rceil", "ceil_emax"])
def test_clipped_blocks_are_those_whose_amax_saturates(name: str, rule: str) -> None:
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.standard_normal((64, 32)), boundary_blocks(name)]).astype(np.float32)
    got = clipped_blocks(x, get_block_format(name, scale_rule=rule)).ravel()
    elem_max = GRIDS[ELEM[name]][-1]
    want = []
    for r in range(x.shape[0]):
        amax = max(abs(float(v)) for v in x[r])
        k = ref_k(amax, rule, ELEM[name])
        want.append(k is not None and Fraction(amax) / Fraction(2) ** k > elem_max)
    assert got.tolist() == want
    if rule in ("ceil", "ceil_emax") or (rule == "rceil" and name != "mxint8"):
        assert not got.any()


def test_clipped_fraction_of_normal_blocks_floor_rule() -> None:
    """Floor clips a block iff the significand of its amax exceeds elem_max / 2**emax_elem."""
    x = np.random.default_rng(0).standard_normal((4096, 32)).astype(np.float32)
    sig = np.frexp(np.abs(x).max(axis=1))[0] * 2
    assert clipped_fraction(x, "mxfp4_e2m1") == (sig > 1.5).mean()
    assert clipped_fraction(x, "mxfp8_e4m3") == (sig > 1.75).mean()
    assert 0.25 < clipped_fraction(x, "mxfp4_e2m1") < 0.35


# ----- NVFP4 variants ---------------------------------------------------------------------------
def ref_nvfp4(x: np.ndarray, rule: str, bound: float = 448.0):
    """Values, block scales and the per-tensor S_dec by the definitions (numpy float32 ops)."""
    a = np.abs(x).max(axis=1).astype(np.float32)
    s_enc = F32(6.0) * F32(bound) / a.max()
    s_dec = F32(1.0) / s_enc
    if rule == "amax_div":
        sb = (a / F32(6.0)) * s_enc
    else:
        sb = a * (s_enc * (F32(1.0) / F32(6.0)))
    s = np.array([as_float(*ref_round(Fraction(float(v)), "e4m3", "nearest_even")) for v in sb])
    s = s.astype(np.float32)
    enc = F32(1.0) / (s * s_dec)
    out = np.empty(x.shape)
    for r in range(x.shape[0]):
        for i in range(x.shape[1]):
            v = F32(x[r, i]) * enc[r]
            q = as_float(*ref_round(Fraction(float(v)), "e2m1", "nearest_even"))
            out[r, i] = float(F32(F32(q) * s[r]) * s_dec)
    return out, s, s_dec


@pytest.mark.parametrize("rule", ["amax", "amax_div"])
def test_nvfp4_scale_variants_match_their_definitions(rule: str) -> None:
    rng = np.random.default_rng(17)
    x = (rng.standard_t(4, (256, 16)) * np.exp2(rng.integers(-6, 6, (256, 1)))).astype(np.float32)
    bf = get_block_format("nvfp4", scale_rule=rule)
    q = pl.quantize_blocks(x, bf)
    want, s, s_dec = ref_nvfp4(x, rule)
    assert q.scales.ravel().tolist() == s.astype(np.float64).tolist()
    assert q.tensor_scale == float(s_dec)
    assert same(pl.round_to_blocks(x, bf), want)


def test_amax_div_differs_from_the_kernel_near_e4m3_midpoints() -> None:
    """S_enc = 1 (tensor amax 2688): the kernel's amax * fp32(1/6) lands on the E4M3 midpoint
    0.296875 and rounds to even (0.3125); TE's reference amax / 6 lies just below it and rounds
    down (0.28125)."""
    x = np.zeros((2, 16), dtype=np.float32)
    x[0, 0] = 2688.0
    x[1, 0] = np.float32(1.7812498807907104)
    k = pl.quantize_blocks(x, "nvfp4").scales.ravel()
    d = pl.quantize_blocks(x, get_block_format("nvfp4", scale_rule="amax_div")).scales.ravel()
    a = F32(x[1, 0])
    kernel = a * (F32(1.0) * (F32(1.0) / F32(6.0)))
    ref = (a / F32(6.0)) * F32(1.0)
    assert kernel == F32(0.296875) and ref < kernel  # the midpoint of 0.28125 and 0.3125
    assert k.tolist() == [448.0, 0.3125] and d.tolist() == [448.0, 0.28125]


def test_tensor_scale_bound() -> None:
    x = np.random.default_rng(3).standard_normal((64, 16)).astype(np.float32)
    bf = pl.BlockFormat(
        "nvfp4_256", "e2m1", "e4m3", (16,), "amax", tensor_scale=True, tensor_scale_bound=256.0
    )
    q = pl.quantize_blocks(x, bf)
    want, _, s_dec = ref_nvfp4(x, "amax", 256.0)
    assert q.scales.max() <= 256 and q.tensor_scale == float(s_dec)
    assert same(pl.round_to_blocks(x, bf), want)
    assert get_block_format("nvfp4", scale_rule="4over6_mse").scale_bound == 256.0
    assert get_block_format("nvfp4").scale_bound == 448.0
    with pytest.raises(ValueError, match="tensor_scale_bound must be"):
        pl.BlockFormat(
            "b", "e2m1", "e4m3", (16,), "amax", tensor_scale=True, tensor_scale_bound=500.0
        )
    with pytest.raises(ValueError, match="needs NVFP4's per-tensor scale"):
        get_block_format("mxfp4_e2m1", scale_rule="4over6_mse")
    with pytest.raises(ValueError, match="scale_rule must be one of"):
        get_block_format("nvfp4", scale_rule="ceiling")


# ----- 4/6 --------------------------------------------------------------------------------------
def brute_force_4over6(x: np.ndarray, metric: str):
    """Per block: both candidates quantized, exact errors compared in Fractions."""
    a = np.abs(x).max(axis=1).astype(np.float32)
    s_enc = F32(6.0) * F32(256.0) / a.max()
    s_dec = F32(1.0) / s_enc
    out, chosen, margin = np.empty(x.shape), [], []
    for r in range(x.shape[0]):
        cands = []
        for m in (F32(6.0), F32(4.0)):
            sb = a[r] * (s_enc * (F32(1.0) / m))
            s = F32(as_float(*ref_round(Fraction(float(sb)), "e4m3", "nearest_even")))
            enc = F32(1.0) / (s * s_dec)
            vals, err = [], Fraction(0)
            for v in x[r]:
                q = as_float(*ref_round(Fraction(float(F32(v) * enc)), "e2m1", "nearest_even"))
                exact = Fraction(q) * Fraction(float(s)) * Fraction(float(s_dec))
                d = Fraction(float(v)) - exact
                err += d * d if metric == "mse" else abs(d)
                vals.append(float(F32(F32(q) * s) * s_dec))
            cands.append((err, vals))
        four = cands[1][0] < cands[0][0]
        chosen.append(four)
        margin.append(abs(cands[1][0] - cands[0][0]) / max(cands[0][0], Fraction(1, 10**30)))
        out[r] = cands[1][1] if four else cands[0][1]
    return out, chosen, margin


@pytest.mark.parametrize("metric", ["mse", "mae"])
def test_4over6_chooses_the_block_scale_with_the_smaller_error(metric: str) -> None:
    x = np.random.default_rng(23).standard_normal((300, 16)).astype(np.float32)
    x[7] = [6.0, 4.0, 2.0] + [0.0] * 13  # scaled to 6 exactly representable: keeps 6
    bf = get_block_format("nvfp4", scale_rule=f"4over6_{metric}")
    got = pl.round_to_blocks(x, bf)
    want, chosen, margin = brute_force_4over6(x, metric)
    close = np.array([float(m) < 1e-9 for m in margin])  # float64 error sums may break near-ties
    assert same(got[~close], want[~close])
    assert 0.2 < np.mean(chosen) < 0.8 and not chosen[7]
    q = pl.quantize_blocks(x, bf)
    assert same(pl.dequantize_blocks(q), got)
    # the choice per block is exposed (issue 31, item 8): the brute force's, block by block
    assert q.four_over_six is not None and q.four_over_six.shape == q.scales.shape
    assert q.four_over_six.ravel()[~close].tolist() == np.array(chosen)[~close].tolist()
    assert pl.quantize_blocks(x, "nvfp4").four_over_six is None
    plain = pl.round_to_blocks(x, "nvfp4")
    xx = x.astype(np.float64)
    err = ((got - xx) ** 2).sum(axis=1) if metric == "mse" else np.abs(got - xx).sum(axis=1)
    d = plain - xx
    assert err.sum() < ((d**2).sum(axis=1) if metric == "mse" else np.abs(d).sum(axis=1)).sum()


def test_named_formats_2d_and_4over6() -> None:
    x = np.random.default_rng(4).standard_normal((32, 48)).astype(np.float32)
    q = pl.quantize_blocks(x, "nvfp4_16x16")
    assert q.scales.shape == (2, 3) and q.block_format.block_shape == (16, 16)
    tile = x[16:32, 16:32]
    a = F32(np.abs(tile).max())
    s_enc = F32(2688.0) / F32(np.abs(x).max())
    sb = a * (s_enc * (F32(1.0) / F32(6.0)))
    assert q.scales[1, 1] == as_float(*ref_round(Fraction(float(sb)), "e4m3", "nearest_even"))
    assert pl.get_block_format("nvfp4_4over6").scale_rule == "4over6_mse"


@pytest.mark.parametrize("backend", ["numpy", "auto"])
@pytest.mark.parametrize("rule", ["amax", "amax_div", "4over6_mse"])
def test_nvfp4_exposes_the_tensor_amax(backend: str, rule: str) -> None:
    """QuantizedBlocks.tensor_amax (issue 31, item 8): the float32 amax of the blocks without NaN
    or infinity, from which S_enc comes (TE's amax_rowwise): S_dec = amax / (6 * bound)
    rounded as the quantizer does; the native pass (backend "auto", rule amax) and numpy agree.
    A float64 value beyond FP32's range is an infinity: its block does not count."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((6, 32)) * 2.0 ** rng.integers(-10, 10, (6, 1))
    x[2, 5], x[3, 1] = np.nan, -np.inf
    x[4, 0] = 1e300  # beyond FP32: an infinity to the quantizer
    bf = get_block_format("nvfp4", scale_rule=rule)
    with pl.use_backend(backend):
        q = pl.quantize_blocks(x, bf)
    with np.errstate(over="ignore"):
        fin = [b for b in x.reshape(-1, 16) if np.isfinite(b.astype(np.float32)).all()]
    want = F32(max(float(np.abs(b).max()) for b in fin))
    assert q.tensor_amax == float(want)
    bound = F32(bf.scale_bound)
    assert q.tensor_scale == float(F32(1.0) / (F32(6.0) * bound / want))
    assert pl.quantize_blocks(np.ones(32, np.float32), "mxfp4_e2m1").tensor_amax is None


# ----- stochastic FP4 from given cvt.rs registers -------------------------------------------------
def _cvt_rs_te(scaled: np.ndarray, rbits: np.ndarray) -> np.ndarray:
    """E2M1 codes of cvt.rs.satfinite.e2m1x4.f32 as Transformer Engine issues it: four
    consecutive elements as {v3, v2, v1, v0} (pl.cvt_rs replays the instruction)."""
    g = scaled.reshape(*scaled.shape[:-1], -1, 4)[..., ::-1]  # operands a, b, e, f
    codes = pl.cvt_rs(np.ascontiguousarray(g).reshape(scaled.shape), "e2m1x4", rbits)
    return codes.reshape(g.shape)[..., ::-1].reshape(scaled.shape)


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4_e2m1"])
def test_stochastic_fp4_from_given_rbits_is_cvt_rs(name: str) -> None:
    """Issue 31, item 8: quantize_blocks(..., rbits=) rounds each scaled element as the GPU's
    cvt.rs.satfinite.e2m1x4.f32 with those registers (TE's operand order); the scaled elements
    are x * enc in float32 (NVFP4: enc = min(1 / (s * S_dec), FLT_MAX) from the block scale) or
    x / 2**k (MX), and pl.cvt_rs is the instruction's replay."""
    rng = np.random.default_rng(44)
    x = (rng.standard_normal((6, 64)) * 2.0 ** rng.integers(-6, 6, (6, 1))).astype(np.float32)
    rb = rng.integers(0, 2**32, (6, 16), dtype=np.uint64).astype(np.uint32)
    q = pl.quantize_blocks(x, name, rounding="stochastic", rbits=rb)
    bs = q.block_format.block_size
    s = np.repeat(q.scales, bs, axis=-1)
    if name == "nvfp4":
        enc = np.minimum(F32(1.0) / (s.astype(np.float32) * F32(q.tensor_scale)), F32(3.4e38))
        scaled = x * enc.astype(np.float32)
    else:
        scaled = (x / s).astype(np.float32)  # exact: power-of-two scales
    want = _cvt_rs_te(scaled, rb)
    np.testing.assert_array_equal(q.element_codes(), want)
    vals = pl.round_to_blocks(x, name, rounding="stochastic", rbits=rb)
    assert same(vals, pl.dequantize_blocks(q))
    # all-zero registers truncate (toward zero); other registers give other codes
    zero = pl.quantize_blocks(x, name, rounding="stochastic", rbits=np.zeros_like(rb))
    tz = pl.quantize_blocks(x, name, rounding="toward_zero")
    np.testing.assert_array_equal(zero.element_codes(), tz.element_codes())
    other = pl.quantize_blocks(x, name, rounding="stochastic", rbits=rb ^ np.uint32(0x80808080))
    assert (other.element_codes() != q.element_codes()).mean() > 0.1


def test_given_rbits_are_checked() -> None:
    x = np.ones((2, 32), dtype=np.float32)
    rb = np.zeros((2, 8), dtype=np.uint32)
    with pytest.raises(ValueError, match="needs FP4 E2M1 elements"):
        pl.quantize_blocks(x, "mxfp8_e4m3", rounding="stochastic", rbits=rb)
    with pytest.raises(ValueError, match="needs rounding='stochastic'"):
        pl.quantize_blocks(x, "nvfp4", rbits=rb)
    with pytest.raises(ValueError, match="replaces seed"):
        pl.quantize_blocks(x, "nvfp4", rounding="stochastic", rbits=rb, seed=1)
    with pytest.raises(ValueError, match=r"uint32 of shape \(2, 8\)"):
        pl.quantize_blocks(x, "nvfp4", rounding="stochastic", rbits=rb[:, :4])
    with pytest.raises(ValueError, match="without padding"):
        pl.round_to_blocks(np.ones((2, 20), np.float32), "nvfp4", rounding="stochastic",
                           rbits=np.zeros((2, 5), np.uint32), pad=True)  # fmt: skip
