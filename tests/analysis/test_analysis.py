"""underflow_stats, zero thresholds, pick_loss_scale, error_stats and bounds against oracles:
ml_dtypes casts, exact Fraction arithmetic, the closed-form log-normal answer."""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import precision_lab as pl
from precision_lab.analysis import measures as an
from precision_lab.scaling import gradients as gr

ML = {
    "fp16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "e5m2": ml_dtypes.float8_e5m2,
    "e4m3": ml_dtypes.float8_e4m3fn,
}


def oracle_counts(g: np.ndarray, fmt: str, scale: float) -> tuple[int, int, int, int]:
    """Non-zero count, zeros, subnormals, overflows by casting with ml_dtypes (RNE, IEEE)."""
    f = pl.get_format(fmt)
    x = g.astype(np.float64) * scale  # exact for a power-of-two scale
    nz = (g != 0) & np.isfinite(g)
    with np.errstate(over="ignore"):
        c = x.astype(ML[fmt]).astype(np.float64)
    zero = int(np.sum((c == 0) & nz))
    sub = int(np.sum((c != 0) & (np.abs(c) < f.smallest_normal) & nz))
    over = int(np.sum(~np.isfinite(c) & nz))
    return int(nz.sum()), zero, sub, over


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "e5m2", "e4m3"])
@pytest.mark.parametrize("scale", [1.0, 2.0**-3, 2.0**10])
def test_counts_match_ml_dtypes(fmt: str, scale: float) -> None:
    f = pl.get_format(fmt)
    rng = np.random.default_rng(11)
    # magnitudes around the format's underflow and overflow ends, and exact ties
    lo, hi = math.log2(f.smallest_subnormal), math.log2(f.max)
    e = rng.uniform(lo - 4, min(hi + 2, 127.0 + math.log2(scale)), 20_000)
    g = (np.exp2(e) * rng.choice([-1.0, 1.0], e.size) / scale).astype(np.float32)
    ties = np.array([f.smallest_subnormal / 2, f.smallest_subnormal * 0.75], dtype=np.float32)
    g = np.concatenate([g, ties / np.float32(scale), np.zeros(5, np.float32)])
    st = an.underflow_stats(g, fmt, scale)
    n_nz, zero, sub, over = oracle_counts(g, fmt, scale)
    assert st.n == g.size and st.n_nonzero == n_nz
    assert round(st.zero_fraction * n_nz) == zero
    assert round(st.subnormal_fraction * n_nz) == sub
    assert round(st.overflow_fraction * n_nz) == over
    assert st.hist_counts.sum() == n_nz
    assert st.hist_zero.sum() == zero and st.hist_subnormal.sum() == sub


@pytest.mark.parametrize(
    ("fmt", "mu", "sigma", "scale"),
    [
        ("fp16", -24.0, 3.0, 1.0),
        ("fp16", -24.0, 3.0, 2.0**10),
        ("fp16", -30.0, 4.0, 2.0**16),
        ("bf16", -130.0, 3.0, 1.0),
        ("e4m3", -8.0, 2.0, 1.0),
        ("e5m2", -17.0, 2.5, 4.0),
    ],
)
def test_zero_fraction_matches_lognormal_closed_form(
    fmt: str, mu: float, sigma: float, scale: float
) -> None:
    n = 400_000
    g = gr.lognormal(n, mu=mu, sigma=sigma, seed=int(-mu * 10 + scale), dtype=np.float64)
    st = an.underflow_stats(g, fmt, scale)
    t = pl.get_format(fmt).smallest_subnormal / 2  # nearest_even threshold, inclusive
    p = 0.5 * math.erfc(-((math.log2(t / scale) - mu) / sigma) / math.sqrt(2))
    assert p == pytest.approx(an.analytic_zero_fraction(mu, sigma, fmt, scale), rel=1e-12)
    se = math.sqrt(p * (1 - p) / n)
    assert abs(st.zero_fraction - p) <= 5 * se + 1e-12


def test_fp16_threshold_is_inclusive_tie_to_even_zero() -> None:
    t = np.float32(2.0**-25)
    up = np.nextafter(t, np.float32(1))
    down = np.nextafter(t, np.float32(0))
    st = an.underflow_stats(np.array([t, -t, up, down], dtype=np.float32), "fp16")
    assert st.zero_fraction == 0.75  # t, -t and below go to zero; just above goes to 2**-24
    assert st.subnormal_fraction == 0.25
    assert an.zero_threshold("fp16") == (2.0**-25, True)


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "e4m3", "e5m2", "e2m1", "e3m2"])
@pytest.mark.parametrize("mode", ["nearest_even", "nearest_away", "toward_zero"])
@pytest.mark.parametrize("subnormals", ["keep", "flush"])
def test_zero_threshold_against_core(fmt: str, mode: str, subnormals: str) -> None:
    t, inclusive = an.zero_threshold(fmt, mode, subnormals)
    probe = np.array([t, np.nextafter(t, 0.0), np.nextafter(t, 1.0)], dtype=np.float64)
    r = pl.round_to(probe, fmt, rounding=mode, subnormals=subnormals)
    assert (r[0] == 0) == inclusive
    assert r[1] == 0 and r[2] != 0


def test_zero_threshold_bad_input() -> None:
    with pytest.raises(ValueError, match="no magnitude threshold"):
        an.zero_threshold("fp16", "up")
    with pytest.raises(ValueError, match="subnormals"):
        an.zero_threshold("fp16", subnormals="drop")
    with pytest.raises(ValueError, match="has no zero"):
        an.zero_threshold("e8m0")
    with pytest.raises(TypeError, match="floating-point format"):
        an.zero_threshold("int8")


def test_overflow_follows_ieee_unbounded_rounding() -> None:
    x = np.array([448.0, 464.0, 464.0001, 1e6], dtype=np.float64)
    st = an.underflow_stats(x, "e4m3")
    assert st.overflow_fraction == 0.5  # 464 is a tie to 448 (even); 464.0001 and 1e6 overflow
    sat = an.underflow_stats(x, "e4m3", overflow="saturate")
    assert sat.overflow_fraction == 0.5  # clamped to 448: still lost range
    h = np.array([65504.0, 65519.0, 65520.0, 70000.0], dtype=np.float32)
    assert an.underflow_stats(h, "fp16").overflow_fraction == 0.5
    # toward_zero never gives inf, but 70000 exceeds max with an unbounded exponent
    rtz = an.underflow_stats(h, "fp16", rounding="toward_zero")
    assert rtz.overflow_fraction == 0.25  # 65520 -> 65504 ordinary; 70000 -> 69632 overflow
    # overflowed values are left out of the error sums, the others are counted
    assert math.isfinite(st.rel_l1_error) and st.rel_l1_error > 0


def test_errors_and_histogram_against_float64_oracle() -> None:
    rng = np.random.default_rng(5)
    g = (np.exp2(rng.uniform(-150, 10, 50_000)) * rng.choice([-1, 1], 50_000)).astype(np.float32)
    g[:7] = [0.0, -0.0, np.inf, np.nan, 1e-45, 3e-39, 2.0**-126]
    for scale in (1.0, 2.0**12, 3.0):
        st = an.underflow_stats(g, "fp16", scale)
        ok = np.isfinite(g)
        x = g[ok].astype(np.float64)
        q = pl.round_to(x * scale, "fp16").astype(np.float64) / scale
        keep = np.isfinite(q)
        d = q[keep] - x[keep]
        assert st.rel_l1_error == pytest.approx(np.abs(d).sum() / np.abs(x[keep]).sum(), rel=1e-6)
        assert st.rel_l2_error == pytest.approx(
            math.sqrt(np.dot(d, d) / np.dot(x[keep], x[keep])), rel=1e-5
        )
        assert st.n_nonfinite == 2 and st.n_nonzero == g.size - 4
        nz = x[x != 0]
        k = np.floor(np.log2(np.abs(nz))).astype(int)
        ks, counts = np.unique(k, return_counts=True)
        hist = dict(zip(st.hist_log2.tolist(), st.hist_counts.tolist(), strict=True))
        assert {kk: hist[kk] for kk in ks.tolist()} == dict(
            zip(ks.tolist(), counts.tolist(), strict=True)
        )
        assert sum(hist.values()) == nz.size
        assert st.hist_log2[0] == -149  # 1e-45 is the smallest float32 subnormal


def test_float64_and_odd_inputs() -> None:
    g = np.array([[1e-9, 3e-8], [2.5e-5, 0.5]], dtype=">f8")  # big-endian
    g.setflags(write=False)
    view = g[:, ::-1]  # non-contiguous
    st = an.underflow_stats(view, "fp16", scale=3.0)  # non-power-of-two scale: float64 path
    x = np.array([1e-9, 3e-8, 2.5e-5, 0.5]) * 3.0
    c = x.astype(np.float16)
    assert st.zero_fraction == np.mean(c == 0) and st.subnormal_fraction == np.mean(
        (c != 0) & (np.abs(c) < 2.0**-14)
    )
    assert an.underflow_stats(np.float32(2.0**-30), "fp16").zero_fraction == 1.0  # 0-d
    empty = an.underflow_stats(np.zeros(0, np.float32), "fp16")
    assert empty.n == 0 and empty.zero_fraction == 0.0 and empty.hist_counts.size == 0
    half = an.underflow_stats(np.array([2.0**-17, 1.0], dtype=np.float16), "e5m2")
    assert half.zero_fraction == 0.5


def test_stochastic_rounding_zero_fraction() -> None:
    # a quarter of the smallest subnormal rounds up with probability 1/4
    g = np.full(200_000, 2.0**-26, dtype=np.float32)
    st = an.underflow_stats(g, "fp16", rounding="stochastic", seed=1)
    assert abs(st.zero_fraction - 0.75) < 5 * math.sqrt(0.75 * 0.25 / g.size)
    again = an.underflow_stats(g, "fp16", rounding="stochastic", seed=1)
    assert again.zero_fraction == st.zero_fraction


def test_underflow_stats_bad_input() -> None:
    with pytest.raises(ValueError, match="scale must be a positive finite number"):
        an.underflow_stats(np.ones(3), "fp16", scale=0.0)
    with pytest.raises(ValueError, match="scale"):
        an.underflow_stats(np.ones(3), "fp16", scale=-2.0)
    with pytest.raises(TypeError, match="scale"):
        an.underflow_stats(np.ones(3), "fp16", scale="big")
    with pytest.raises(TypeError, match="grads must hold floating-point"):
        an.underflow_stats(np.arange(3), "fp16")
    with pytest.raises(TypeError, match="grads must hold floating-point"):
        an.underflow_stats(np.ones(3, dtype=complex), "fp16")
    with pytest.raises(ValueError, match="unknown format"):
        an.underflow_stats(np.ones(3), "fp7")
    with pytest.raises(ValueError, match="rounding"):
        an.underflow_stats(np.ones(3), "fp16", rounding="banker")


# ---------------------------------------------------------------------------------------------
# pick_loss_scale
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["fp16", "e5m2", "e4m3", "bf16"])
@pytest.mark.parametrize("margin", [0, 1, 3])
def test_max_rule_is_largest_power_of_two(fmt: str, margin: int) -> None:
    f = pl.get_format(fmt)
    for seed in range(5):
        g = gr.lognormal(1000, mu=-20 + 6 * seed, sigma=3.0, seed=seed)
        c = an.pick_loss_scale(g, fmt, margin=margin, scale_dtype="float64")
        amax = Fraction(float(np.abs(g).max()))
        limit = Fraction(f.max) / 2**margin
        assert c.scale == 2.0**c.log2_scale and c.rule == "max"
        assert amax * Fraction(c.scale) <= limit < amax * Fraction(c.scale) * 2
        assert c.overflow_fraction == 0.0
        assert c.headroom_log2 == pytest.approx(math.log2(f.max / (float(amax) * c.scale)))
        assert c.headroom_log2 >= margin
        st = an.underflow_stats(g, fmt, c.scale)
        assert (c.zero_fraction, c.subnormal_fraction) == (
            st.zero_fraction,
            st.subnormal_fraction,
        )
        assert str(fmt) in c.reason and "underflow" in c.reason


@pytest.mark.parametrize(("dtype", "lo", "hi"), [("float32", -126, 127), (np.float16, -14, 15)])
def test_scales_stay_in_the_scale_dtype(dtype, lo, hi) -> None:
    """Issue 22 item 10: bf16 gradients asked for 2**132, which a float32 loss scale (PyTorch's)
    cannot hold. The scale is capped at the dtype's largest power of two and says so; the
    uncapped rule is one argument away; a margin below the dtype's smallest normal is refused."""
    g = gr.lognormal(1000, mu=-20.0, sigma=3.0, seed=0)
    free = an.pick_loss_scale(g, "bf16", scale_dtype="float64")
    assert free.log2_scale > 127 and not free.capped  # the rule really asks for more
    c = an.pick_loss_scale(g, "bf16", scale_dtype=dtype)
    assert (c.log2_scale, c.capped) == (hi, True) and c.scale == 2.0**hi
    assert np.isfinite(np.dtype(dtype).type(c.scale)) and f"capped at 2**{hi}" in c.reason
    assert c.zero_fraction == an.underflow_stats(g, "bf16", c.scale).zero_fraction
    ones = np.array([1.0, -0.5])  # fp16 asks for 2**14: within every scale dtype
    fits = an.pick_loss_scale(ones, "fp16", scale_dtype=dtype)
    assert not fits.capped and fits.log2_scale == 14
    with pytest.raises(ValueError, match=rf"smallest normal {np.dtype(dtype).name} 2\*\*{lo}"):
        an.pick_loss_scale(np.full(3, 1e30), "e4m3", margin=10 - lo, scale_dtype=dtype)
    with pytest.raises(TypeError, match="scale_dtype"):
        an.pick_loss_scale(g, "bf16", scale_dtype=np.int32)


def test_micikevicius_style_example() -> None:
    # max |g| = 1.5 * 2**-4: 65504 / 2 / 0.09375 = 349354.7 -> 2**18 = 262144
    g = np.array([0.09375, -(2.0**-30), 2.0**-20, 3.0e-3], dtype=np.float32)
    c = an.pick_loss_scale(g, "fp16")
    assert c.scale == 2.0**18
    assert c.zero_fraction == 0.0  # 2**-30 * 2**18 = 2**-12: a normal fp16 number
    raw = an.underflow_stats(g, "fp16")
    assert raw.zero_fraction == 0.25 and raw.subnormal_fraction == 0.25


def test_target_underflow_rule() -> None:
    g = gr.lognormal(50_000, mu=-28.0, sigma=3.0, seed=9)
    for target in (0.2, 0.01, 0.001):
        c = an.pick_loss_scale(g, "fp16", target_underflow=target)
        assert c.rule == "underflow"
        assert an.underflow_stats(g, "fp16", c.scale).zero_fraction <= target
        assert an.underflow_stats(g, "fp16", c.scale / 2).zero_fraction > target
        assert c.scale <= an.pick_loss_scale(g, "fp16").scale
    # a wide spread: the target cannot be met below the overflow limit
    wide = gr.lognormal(50_000, mu=-10.0, sigma=12.0, seed=2)
    c = an.pick_loss_scale(wide, "fp16", target_underflow=1e-4)
    assert c.rule == "underflow-unmet" and c.scale == an.pick_loss_scale(wide, "fp16").scale
    assert c.zero_fraction > 1e-4 and "unreachable" in c.reason
    # modes without a magnitude threshold use the core
    sr = an.pick_loss_scale(g, "fp16", target_underflow=0.01, rounding="stochastic")
    assert sr.rule == "underflow"


def test_pick_loss_scale_edge_cases() -> None:
    c = an.pick_loss_scale(np.zeros(4, np.float32), "fp16")
    assert c.scale == 1.0 and "no non-zero" in c.reason
    c = an.pick_loss_scale(np.array([np.inf, 1e-3], np.float32), "fp16")
    assert c.max_abs == pytest.approx(1e-3)
    with pytest.raises(TypeError, match="margin"):
        an.pick_loss_scale(np.ones(3), "fp16", margin=0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="target_underflow"):
        an.pick_loss_scale(np.ones(3), "fp16", target_underflow=1.5)
    assert float(an.pick_loss_scale(np.ones(3), "fp16", margin=0)) == 32768.0


# ---------------------------------------------------------------------------------------------
# error_stats and bounds
# ---------------------------------------------------------------------------------------------


def test_error_stats_against_fractions() -> None:
    rng = np.random.default_rng(4)
    ref = rng.standard_normal(200)
    ref[3] = 0.0
    approx = pl.round_to(ref, "bf16")
    e = an.error_stats(approx, ref, fmt="bf16")
    d = [abs(Fraction(float(a)) - Fraction(float(r))) for a, r in zip(approx, ref, strict=True)]
    rel = [di / abs(Fraction(float(r))) for di, r in zip(d, ref, strict=True) if r != 0]
    assert e.max_abs == float(max(d))
    assert e.mean_abs == pytest.approx(float(sum(d) / len(d)), rel=1e-12)
    assert e.max_rel == pytest.approx(float(max(rel)), rel=1e-12)
    assert e.max_rel <= 2.0**-8  # the unit roundoff of bf16
    assert e.max_ulp <= 0.5  # correctly rounded: at most half an ulp
    num = sum(di * di for di in d)
    den = sum(Fraction(float(r)) ** 2 for r in ref)
    assert e.normwise == pytest.approx(math.sqrt(num / den), rel=1e-12)
    assert e.snr_db == pytest.approx(10 * math.log10(den / num), rel=1e-12)
    assert e.n == 200 and e.fmt == "bf16"


def test_error_stats_defaults_and_edges() -> None:
    r = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    assert an.error_stats(r, r).snr_db == math.inf
    assert an.error_stats(r, r).fmt == "fp32"
    h = r.astype(np.float16)
    assert an.error_stats(h, r).fmt == "fp16"
    b = r.astype(ml_dtypes.bfloat16)
    assert an.error_stats(b, r).fmt == "bf16"
    one_ulp = an.error_stats(np.array([1.0 + 2.0**-10]), np.array([1.0]), fmt="fp16")
    assert one_ulp.max_ulp == 1.0
    with pytest.raises(ValueError, match="same shape"):
        an.error_stats(np.ones(3), np.ones(4))
    with pytest.raises(TypeError, match="approx must hold floating-point"):
        an.error_stats(np.arange(3), np.ones(3))
    e = an.error_stats(np.array([np.inf]), np.array([1.0]))
    assert e.max_abs == math.inf


def test_bounds() -> None:
    u = 2.0**-11
    assert an.gamma_n(100, "fp16") == pytest.approx(100 * u / (1 - 100 * u))
    assert an.gamma_n(100, u) == an.gamma_n(100, pl.get_format("fp16"))
    assert an.gamma_n(2048, "fp16") == math.inf  # n u = 1: no bound
    assert an.gamma_n(0, "fp16") == 0.0
    assert an.sqrt_n_u(400, "bf16") == 20 * 2.0**-8
    assert an.sqrt_n_u(400, "bf16", lam=2.0) == 40 * 2.0**-8
    # the probabilistic bound is the smaller one for long sums
    assert an.sqrt_n_u(10_000, "fp32") < an.gamma_n(10_000, "fp32")
    with pytest.raises(ValueError, match="n must be a non-negative integer"):
        an.gamma_n(-1, "fp16")
    with pytest.raises(ValueError, match="u must be a unit roundoff"):
        an.gamma_n(10, 2.0)
    with pytest.raises(ValueError, match="lam"):
        an.sqrt_n_u(10, "fp16", lam=0.0)


def test_exports() -> None:
    assert pl.underflow_stats is an.underflow_stats
    assert pl.pick_loss_scale is an.pick_loss_scale
    assert pl.error_stats is an.error_stats


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e3m2", "fp16"])
def test_error_stats_counts_ulps_of_the_grid_the_values_lie_on(fmt: str) -> None:
    """Issue 22 item 11: error_stats(round_to(x, "e4m3"), x) counted ULPs of float32 (max_ulp
    16721589). Values on a narrower format's grid are counted in that format; the referee is
    the format's own spacing at each reference value, with Fractions."""
    f = pl.get_format(fmt)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(2000) * f.max / 8).astype(np.float32)
    y = pl.round_to(x, fmt, overflow="saturate")
    e = an.error_stats(y, x)
    assert e.fmt == fmt
    want = max(
        abs(Fraction(float(a)) - Fraction(float(r))) / Fraction(float(f.ulp(float(r))))
        for a, r in zip(y, x, strict=True)
    )
    assert e.max_ulp == float(want) and e.max_ulp <= 0.5
    assert an.error_stats(y, x, fmt="fp32").fmt == "fp32"  # fmt= still decides


def test_error_stats_keeps_the_dtype_when_the_grid_is_unclear() -> None:
    """Few values, values off every narrow grid: fp32 as before; two formats of the same width
    holding the values (bf16 and fp16 both hold (1 + 2**-7) * 2**k for small k): fp32."""
    x = np.linspace(0.1, 3.0, 50, dtype=np.float32)
    assert an.error_stats(x, x).fmt == "fp32"  # off the narrow grids
    assert an.error_stats(x[:4], x[:4]).fmt == "fp32"  # too few values to tell
    p2 = np.float32(2.0) ** np.arange(-12, 4, dtype=np.float32) * np.float32(1 + 2.0**-7)
    assert an.error_stats(p2, p2).fmt == "fp32"  # bf16 and fp16 both hold them: no guess
    assert an.error_stats(p2, p2, fmt="bf16").fmt == "bf16"
