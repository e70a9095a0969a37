"""Loss scalers and FP8 scaling recipes against published trajectories and hand-derived cases."""

from __future__ import annotations

import json
import math
import warnings
from fractions import Fraction

import numpy as np
import pytest

import precision_lab as pl
from precision_lab import scaling as sc

OVERFLOW_STEPS = {0, 1, 2, 9, 10, 16}
PATTERN = [i in OVERFLOW_STEPS for i in range(24)]

# log2 of the scale after each update: real outputs of the frameworks (recorded) for
# init 2**16, interval 4, hysteresis 2, overflows at steps 0, 1, 2, 9, 10, 16
PUBLISHED = {
    "torch": "15 14 13 13 13 13 14 14 14 13 12 12 12 12 13 13 12 12 12 12 13 13 13 13",
    "deepspeed": "16 15 14 14 14 14 14 15 15 15 14 14 14 14 14 15 15 15 15 15 15 16 16 16",
    "megatron": "16 15 14 14 14 14 15 15 15 15 14 14 14 14 15 15 15 15 15 15 16 16 16 16",
}


def make(name: str, **kw: object) -> sc.DynamicLossScaler:
    opts: dict[str, object] = {"init_scale": 2.0**16, "growth_interval": 4}
    if name != "torch":
        opts["hysteresis"] = 2
    opts.update(kw)
    return sc.DynamicLossScaler.preset(name, **opts)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_trajectories(name: str) -> None:
    scales, taken = sc.trajectory(make(name), PATTERN)
    assert [int(v) for v in np.log2(scales)] == [int(t) for t in PUBLISHED[name].split()]
    # every framework skips the optimizer step on an overflow, hysteresis or not
    assert taken.tolist() == [not f for f in PATTERN]
    assert np.all(scales == np.exp2(np.round(np.log2(scales))))  # exact powers of two


def test_default_is_torch_gradscaler() -> None:
    s = sc.DynamicLossScaler()
    assert (s.scale, s.growth_factor, s.backoff_factor, s.growth_interval) == (
        65536.0,
        2.0,
        0.5,
        2000,
    )
    for _ in range(1999):
        s.update(False)
    assert s.scale == 65536.0
    s.update(False)
    assert s.scale == 131072.0


def test_presets_defaults() -> None:
    keras = sc.DynamicLossScaler.preset("keras")
    assert (keras.scale, keras.growth_interval) == (2.0**15, 2000)
    ds = sc.DynamicLossScaler.preset("deepspeed")
    assert (ds.scale, ds.growth_interval, ds.hysteresis, ds.min_scale) == (2.0**16, 1000, 2, 1.0)
    mg = sc.DynamicLossScaler.preset("megatron")
    assert (mg.scale, mg.growth_interval, mg.hysteresis, mg.min_scale) == (2.0**32, 1000, 2, 1.0)
    apex = sc.DynamicLossScaler.preset("apex")
    assert (apex.scale, apex.max_scale, apex.min_scale) == (2.0**16, 2.0**24, None)


def test_torch_collapses_to_zero_after_166_overflows() -> None:
    s = sc.DynamicLossScaler.preset("torch")
    for _ in range(165):
        s.update(True)
    # 2**16 * 2**-165 = 2**-149, the smallest float32 subnormal
    assert s.scale == 2.0**-149 and not s.collapsed
    with pytest.warns(sc.LossScaleCollapseWarning, match="collapsed to 0.0"):
        assert s.update(True) is False
    # 2**-150 is a tie between 0 and 2**-149 in float32: round-to-even gives exactly 0.0
    assert s.scale == 0.0 and s.collapsed
    # what PyTorch would then do silently: unscaling gives inf/NaN gradients
    g = s.unscale(np.array([1.0, 0.0], dtype=np.float32))
    assert np.isinf(g[0]) and np.isnan(g[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reported once, not on every later step
        s.update(True)
    strict = sc.DynamicLossScaler.preset("torch", on_collapse="raise")
    for _ in range(165):
        strict.update(True)
    with pytest.raises(sc.LossScaleError, match="collapsed"):
        strict.update(True)


def test_float64_scaler_does_not_collapse_at_166() -> None:
    s = sc.DynamicLossScaler(dtype="float64")
    for _ in range(166):
        s.update(True)
    assert s.scale == 2.0**-150 and not s.collapsed


def test_growth_cap_at_float32_max() -> None:
    s = sc.DynamicLossScaler(init_scale=2.0**127, growth_interval=1)
    for _ in range(3):
        assert s.update(False)
        assert s.scale == 2.0**127  # 2**128 is inf in float32: growth refused
    assert not s.collapsed
    s.update(True)
    assert s.scale == 2.0**126
    s.update(False)
    assert s.scale == 2.0**127
    # Keras does not check: the scale becomes inf, which the simulator reports
    k = sc.DynamicLossScaler.preset("keras", init_scale=2.0**127, growth_interval=1)
    with pytest.warns(sc.LossScaleCollapseWarning, match="inf"):
        k.update(False)
    assert math.isinf(k.scale)


def test_floor_and_ceiling() -> None:
    s = sc.DynamicLossScaler(init_scale=2.0**12, min_scale=2.0**10, growth_interval=2)
    scales, _ = sc.trajectory(s, [True] * 5)
    assert np.log2(scales).tolist() == [11, 10, 10, 10, 10]
    apex = sc.DynamicLossScaler.preset("apex", init_scale=2.0**23, growth_interval=1)
    scales, _ = sc.trajectory(apex, [False] * 3)
    assert np.log2(scales).tolist() == [24, 24, 24]
    apex_min = sc.DynamicLossScaler.preset("apex", init_scale=4.0, min_scale=2.0)
    scales, _ = sc.trajectory(apex_min, [True] * 3)
    assert scales.tolist() == [2.0, 2.0, 2.0]


def test_deepspeed_raises_at_min_scale() -> None:
    s = sc.DynamicLossScaler.preset("deepspeed", init_scale=4.0, hysteresis=1)
    s.update(True)
    s.update(True)
    assert s.scale == 1.0
    with pytest.raises(sc.LossScaleError, match="min_scale"):
        s.update(True)
    t = sc.DynamicLossScaler.preset(
        "deepspeed", init_scale=4.0, hysteresis=1, raise_at_min_scale=False
    )
    scales, _ = sc.trajectory(t, [True] * 4)
    assert scales.tolist() == [2.0, 1.0, 1.0, 1.0]


def test_hysteresis_refill_rules() -> None:
    # overflow, clean, overflow, clean, ...: with consecutive_hysteresis the tracker refills on
    # every clean step, so isolated overflows never back off; without it (DeepSpeed default,
    # Megatron) the second overflow backs off and so does every later one until a growth.
    alt = [True, False] * 4
    cons = make("deepspeed", consecutive_hysteresis=True, growth_interval=100)
    scales, taken = sc.trajectory(cons, alt)
    assert np.log2(scales).tolist() == [16] * 8
    assert taken.tolist() == [False, True] * 4
    plain = make("deepspeed", growth_interval=100)
    scales, _ = sc.trajectory(plain, alt)
    assert np.log2(scales).tolist() == [16, 16, 15, 15, 14, 14, 13, 13]
    mega = make("megatron", growth_interval=100)
    scales, _ = sc.trajectory(mega, alt)
    assert np.log2(scales).tolist() == [16, 16, 15, 15, 14, 14, 13, 13]


def test_deepspeed_growth_needs_window_plus_one_clean_steps() -> None:
    ds = make("deepspeed", hysteresis=1)
    scales, _ = sc.trajectory(ds, [False] * 13)
    # grows at the 5th, 9th, 13th clean step (stable interval 4, 8, 12)
    assert np.log2(scales).tolist() == [16] * 4 + [17] * 4 + [18] * 4 + [19]
    torch = make("torch")
    scales, _ = sc.trajectory(torch, [False] * 12)
    assert np.log2(scales).tolist() == [16] * 3 + [17] * 4 + [18] * 4 + [19]


@pytest.mark.parametrize("name", ["torch", "keras", "apex", "deepspeed", "megatron"])
def test_state_dict_round_trip(name: str) -> None:
    a = make(name)
    sc.trajectory(a, PATTERN[:11])
    state = json.loads(json.dumps(a.state_dict()))  # plain types only
    b = sc.DynamicLossScaler(init_scale=3.0)
    b.load_state_dict(state)
    assert b.state_dict() == a.state_dict()
    rest_a, _ = sc.trajectory(a, PATTERN[11:])
    rest_b, _ = sc.trajectory(b, PATTERN[11:])
    assert rest_a.tolist() == rest_b.tolist()
    if name in PUBLISHED:
        expect = [int(t) for t in PUBLISHED[name].split()][11:]
        assert np.log2(rest_b).tolist() == expect


def test_static_scaler() -> None:
    s = sc.StaticLossScaler(512.0)
    assert [s.update(f) for f in (False, True, False)] == [True, False, True]
    assert s.scale == 512.0 and s.skipped == 1
    t = sc.StaticLossScaler(512.0, skip_on_inf=False)
    assert t.update(True) is True
    u = sc.StaticLossScaler()
    u.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert u.state_dict() == s.state_dict()
    with pytest.raises(ValueError, match="StaticLossScaler"):
        u.load_state_dict(make("torch").state_dict())
    with pytest.raises(ValueError, match="DynamicLossScaler"):
        make("torch").load_state_dict(s.state_dict())


def test_scale_and_unscale_helpers() -> None:
    s = sc.StaticLossScaler(2.0**10)
    g = np.array([3.0, -1.5], dtype=np.float32)
    g.setflags(write=False)
    scaled = s.scale_loss(g)
    assert scaled.dtype == np.float32 and scaled.tolist() == [3072.0, -1536.0]
    assert s.unscale(scaled).tolist() == g.tolist()
    # PyTorch's inv_scale: reciprocal in float64, rounded to float32
    s3 = sc.StaticLossScaler(3.0)
    assert s3.inv_scale == float(np.float32(1 / 3))
    assert sc.has_inf_or_nan(np.zeros(3), np.array([np.nan]))
    assert not sc.has_inf_or_nan(np.zeros(3), np.arange(3))


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"growth_factor": 1.0}, ValueError, "growth_factor must be > 1"),
        ({"growth_factor": 0.5}, ValueError, "growth_factor"),
        ({"backoff_factor": 1.0}, ValueError, r"backoff_factor must be in \(0, 1\)"),
        ({"backoff_factor": 0.0}, ValueError, "backoff_factor"),
        ({"backoff_factor": -0.5}, ValueError, "backoff_factor"),
        ({"backoff_factor": 1.5}, ValueError, "backoff_factor"),
        ({"growth_interval": 0}, ValueError, "growth_interval must be an integer >= 1"),
        ({"growth_interval": -3}, ValueError, "growth_interval"),
        ({"growth_interval": 2.5}, TypeError, "growth_interval"),
        ({"init_scale": 0.0}, ValueError, "init_scale must be a positive finite number"),
        ({"init_scale": -1.0}, ValueError, "init_scale"),
        ({"init_scale": math.inf}, ValueError, "init_scale"),
        ({"init_scale": math.nan}, ValueError, "init_scale"),
        ({"init_scale": "big"}, TypeError, "init_scale"),
        ({"hysteresis": 0}, ValueError, "hysteresis"),
        ({"min_scale": 2.0**20}, ValueError, "min_scale must be <= init_scale"),
        ({"max_scale": 2.0}, ValueError, "max_scale must be >= init_scale"),
        ({"dtype": "float16"}, ValueError, "dtype"),
        ({"on_collapse": "panic"}, ValueError, "on_collapse"),
    ],
)
def test_bad_arguments(kwargs: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        sc.DynamicLossScaler(**kwargs)


def test_bad_update_and_preset() -> None:
    with pytest.raises(TypeError, match="found_inf must be a bool"):
        sc.DynamicLossScaler().update(1)  # type: ignore[arg-type]
    assert sc.DynamicLossScaler().update(np.bool_(False)) is True
    with pytest.raises(ValueError, match="unknown preset 'caffe'"):
        sc.DynamicLossScaler.preset("caffe")
    with pytest.raises(ValueError, match="scale must be a positive"):
        sc.StaticLossScaler(0.0)


def test_exported_as_pl_scaling() -> None:
    assert pl.scaling.DynamicLossScaler is sc.DynamicLossScaler


# ---------------------------------------------------------------------------------------------
# FP8 scaling
# ---------------------------------------------------------------------------------------------


def nearest_float32(q: Fraction) -> float:
    """The float32 nearest to the exact rational q (ties to even), by exact comparison."""
    if q > Fraction(float(np.finfo(np.float32).max)) * (1 + Fraction(1, 2**24)):
        return math.inf
    c = np.float32(float(q))
    best = c
    for cand in (np.nextafter(c, np.float32(-np.inf)), np.nextafter(c, np.float32(np.inf))):
        d_c, d_b = abs(Fraction(float(cand)) - q), abs(Fraction(float(best)) - q)
        if d_c < d_b or (d_c == d_b and int(cand.view(np.uint32)) % 2 == 0):
            best = cand
    return float(best)


def delayed_oracle(amaxes: list[float], n: int, fmax: float, margin: int) -> list[float]:
    """Scale after each step: window max of the last n amaxes, exact division rounded once
    (and then the power-of-two margin, exact), old scale kept for amax 0 / non-finite."""
    out, scale = [], 1.0
    for t in range(len(amaxes)):
        window = [float(np.float32(a)) for a in amaxes[max(0, t - n + 1) : t + 1]]
        amax = math.nan if any(math.isnan(a) for a in window) else max(window)
        if amax > 0 and math.isfinite(amax):
            s = nearest_float32(Fraction(fmax) / Fraction(amax))
            s = s / 2.0**margin
            scale = float(np.finfo(np.float32).max) if math.isinf(s) else s
        out.append(scale)
    return out


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("n", [1, 3, 16])
@pytest.mark.parametrize("margin", [0, 2])
def test_delayed_scaling_against_window_oracle(fmt: str, n: int, margin: int) -> None:
    rng = np.random.default_rng(n * 10 + margin)
    amaxes = list(np.exp2(rng.uniform(-12, 12, 40)).astype(np.float32).astype(float))
    amaxes[5] = 0.0
    amaxes[17] = math.inf
    amaxes[30] = 3.0e-45  # scale overflows float32
    ds = sc.DelayedScaling(fmt, amax_history_len=n, margin=margin)
    got = [ds.update(a) for a in amaxes]
    want = delayed_oracle(amaxes, n, pl.get_format(fmt).max, margin)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, (i, amaxes[max(0, i - n + 1) : i + 1], g, w)


def test_delayed_scaling_history_layout_matches_te() -> None:
    ds = sc.DelayedScaling("e4m3", amax_history_len=3)
    ds.update(1.0)
    assert ds.amax_history.tolist() == [0.0, 0.0, 1.0]
    ds.update(2.0)
    assert ds.amax_history.tolist() == [0.0, 1.0, 2.0]
    ds.update(4.0)
    assert ds.amax_history.tolist() == [0.0, 2.0, 4.0]
    assert ds.scale == 112.0  # 448 / 4
    ds.update(0.5)  # window {2, 4, 0.5}
    assert ds.scale == 112.0
    ds.update(0.5)
    ds.update(0.5)  # window {0.5, 0.5, 0.5}
    assert ds.scale == 896.0


def test_delayed_scaling_special_amax() -> None:
    ds = sc.DelayedScaling("e4m3", amax_history_len=1, init_scale=2.0)
    assert ds.update(0.0) == 2.0  # kept
    assert ds.update(math.inf) == 2.0  # kept
    assert ds.update(math.nan) == 2.0  # kept
    assert ds.update(1e-45) == float(np.finfo(np.float32).max)
    recent = sc.DelayedScaling("e4m3", amax_history_len=4, amax_compute_algo="most_recent")
    assert [recent.update(a) for a in (1.0, 4.0, 2.0)] == [448.0, 112.0, 224.0]
    custom = sc.DelayedScaling("e4m3", amax_history_len=4, amax_compute_algo=lambda h: 7.0)
    assert custom.update(1.0) == 64.0


def test_delayed_scaling_bad_input_and_state() -> None:
    ds = sc.DelayedScaling("e5m2", amax_history_len=4, margin=1)
    with pytest.raises(ValueError, match="amax must be >= 0"):
        ds.update(-1.0)
    with pytest.raises(TypeError, match="amax"):
        ds.update("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="amax_history_len must be an integer >= 1"):
        sc.DelayedScaling("e4m3", amax_history_len=0)
    with pytest.raises(ValueError, match="amax_compute_algo"):
        sc.DelayedScaling("e4m3", amax_compute_algo="mean")
    with pytest.raises(TypeError, match="floating-point format"):
        sc.DelayedScaling("int8")
    for a in (3.0, 5.0, 0.25):
        ds.update(a)
    other = sc.DelayedScaling()
    other.load_state_dict(json.loads(json.dumps(ds.state_dict())))
    assert other.state_dict() == ds.state_dict()
    assert [other.update(a) for a in (1.0, 9.0)] == [ds.update(a) for a in (1.0, 9.0)]


def test_delayed_quantize_saturates_and_uses_old_scale() -> None:
    ds = sc.DelayedScaling("e4m3", amax_history_len=2)
    x = np.array([0.5, 1000.0, -3.0], dtype=np.float32)
    q = ds.quantize(x)  # scale 1 (initial): 1000 saturates to 448
    assert q.tolist() == [0.5, 448.0, -3.0]
    assert ds.scale == float(np.float32(448.0) / np.float32(1000.0))
    q2 = ds.quantize(np.array([100.0], dtype=np.float32), update=False)
    assert abs(q2[0] - 100.0) <= 100.0 * 2.0**-4  # within half an e4m3 ulp


def test_scale_from_amax_and_current_scaling() -> None:
    rng = np.random.default_rng(3)
    amax = np.exp2(rng.uniform(-30, 30, 200))
    s = sc.scale_from_amax(amax, "e4m3")
    for a, v in zip(amax.astype(np.float32).tolist(), s.tolist(), strict=True):
        assert v == nearest_float32(Fraction(448) / Fraction(a))
    p2 = sc.scale_from_amax(amax, "e4m3", power_of_two=True)
    # rounded down to a power of two: p2 <= s < 2 * p2, p2 a power of two
    assert np.all(p2 <= s) and np.all(s < 2 * p2)
    assert np.all(np.frexp(p2)[0] == 0.5)
    assert sc.scale_from_amax(0.001, "e4m3", amax_epsilon=0.5).tolist() == 896.0
    with pytest.raises(ValueError, match="amax must be >= 0"):
        sc.scale_from_amax([-1.0], "e4m3")
    x = np.array([[0.0, -2.0], [1.0, 0.5]], dtype=np.float32)
    assert sc.current_scale(x, "e5m2") == 28672.0
    assert sc.current_scale(np.zeros(3), "e4m3") == 1.0
    q, scale = sc.quantize_current(x, "e4m3", power_of_two=True)
    assert scale == 128.0 and q.tolist() == x.tolist()


def test_block_scales_tiles_and_mx() -> None:
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((130, 300)) * np.exp2(rng.integers(-8, 8, (130, 1)))).astype(
        np.float32
    )
    for block in [(1, 128), (128, 128)]:
        bs = sc.block_scales(x, "e4m3", block=block)
        r, c = block
        assert bs.scales.shape == (-(-130 // r), -(-300 // c))
        for i in range(bs.scales.shape[0]):
            for j in range(bs.scales.shape[1]):
                tile = x[i * r : (i + 1) * r, j * c : (j + 1) * c]
                want = sc.scale_from_amax(np.abs(tile).max(), "e4m3", power_of_two=True)
                assert bs.scales[i, j] == want
        # the power-of-two multiplier is 1/X of blocks' round-up rule (independent code)
        bf = pl.BlockFormat("t", "e4m3", "fp32", (c,) if r == 1 else (r, c), "ceil")
        ref = pl.quantize_blocks(x, bf, axis=-1, pad=True).scales
        assert np.array_equal(bs.scales.astype(np.float64), 1.0 / ref)
        q = bs.quantize(x)
        # half an e4m3 ulp (relative 2**-4), or half the subnormal quantum 2**-9 in scaled units
        bound = np.maximum(np.abs(x) * 2.0**-4, 2.0**-10 / bs.expand(x.shape))
        assert np.all(np.abs(q - x) <= bound)
    mx = sc.block_scales(x, "e4m3", block="mxfp8")
    assert mx.scales.shape == (130, 10)
    pad = np.zeros((130, 320))
    pad[:, :300] = np.abs(x)
    amax = pad.reshape(130, 10, 32).max(axis=2)
    m = mx.scales.astype(np.float64)
    assert np.all(np.frexp(m)[0] == 0.5)  # powers of two (E8M0)
    assert np.all(amax * m <= 448.0)  # no saturation ...
    assert np.all(amax * m * 2 > 448.0)  # ... and the largest such power of two
    with pytest.raises(ValueError, match="block"):
        sc.block_scales(x, block=(0, 4))
