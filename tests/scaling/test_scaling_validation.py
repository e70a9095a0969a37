"""Issue 10 item 9: every bad scaler setting or state is a clear error naming the field (or a
documented saturation); never a silent NaN, 0 or inf, and no stray numpy RuntimeWarning."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from precision_lab import scaling as sc


@pytest.fixture(autouse=True)
def _warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"init_scale": 1e39}, "init_scale"),
        ({"init_scale": 1e-50}, "init_scale"),
        ({"growth_factor": 1e39}, "growth_factor"),
        ({"growth_factor": 1 + 1e-9}, "growth_factor"),  # 1.0 in float32: never grows
        ({"backoff_factor": 1e-50}, "backoff_factor"),
        ({"backoff_factor": 1 - 1e-9}, "backoff_factor"),  # 1.0 in float32: never backs off
        ({"min_scale": 1e-50}, "min_scale"),
        ({"max_scale": 1e39}, "max_scale"),
    ],
)
def test_dynamic_scaler_rejects_settings_float32_cannot_hold(kw, field):
    with pytest.raises(ValueError, match=field):
        sc.DynamicLossScaler(**kw)


def test_dynamic_scaler_float64_holds_what_float32_cannot():
    s = sc.DynamicLossScaler(init_scale=1e39, dtype="float64")
    assert s.scale == 1e39
    with pytest.raises(ValueError, match="init_scale"):
        sc.DynamicLossScaler(init_scale=1e-330, dtype="float64")


def test_delayed_scaling_rejects_init_scale_float32_cannot_hold():
    with pytest.raises(ValueError, match="init_scale"):
        sc.DelayedScaling("e4m3", init_scale=1e39)


def _dynamic_state() -> dict:
    s = sc.DynamicLossScaler(growth_interval=2, hysteresis=2)
    for f in (True, False, False, True):
        s.update(f)
    return s.state_dict()


@pytest.mark.parametrize(
    ("change", "field", "exc"),
    [
        ({"scale": float("nan")}, "scale", ValueError),
        ({"scale": -1.0}, "scale", ValueError),
        ({"scale": 0.0}, "scale", ValueError),
        ({"scale": 1e39}, "scale", ValueError),
        ({"scale": "big"}, "scale", TypeError),
        ({"growth_tracker": -1}, "growth_tracker", ValueError),
        ({"hysteresis_tracker": -2}, "hysteresis_tracker", ValueError),
        ({"hysteresis_tracker": 3}, "hysteresis_tracker", ValueError),  # above hysteresis=2
        ({"steps": -5}, "steps", ValueError),
        ({"skipped": 1.5}, "skipped", TypeError),
        ({"skipped": 99}, "skipped", ValueError),  # more skipped than steps
        ({"collapsed": "no"}, "collapsed", TypeError),
        ({"collapsed": 1}, "collapsed", TypeError),
        ({"consecutive_hysteresis": "yes"}, "consecutive_hysteresis", TypeError),
        ({"growth_interval": 0}, "growth_interval", ValueError),
    ],
)
def test_dynamic_load_state_dict_rejects_bad_fields(change, field, exc):
    s = sc.DynamicLossScaler()
    before = s.state_dict()
    with pytest.raises(exc, match=field):
        s.load_state_dict({**_dynamic_state(), **change})
    assert s.state_dict() == before  # a refused state leaves the scaler as it was


@pytest.mark.parametrize("key", ["scale", "steps", "skipped", "hysteresis_tracker", "collapsed"])
def test_load_state_dict_names_missing_keys(key):
    state = _dynamic_state()
    del state[key]
    with pytest.raises(ValueError, match=f"missing.*{key}"):
        sc.DynamicLossScaler().load_state_dict(state)
    static = sc.StaticLossScaler(8.0).state_dict()
    if key in static:
        del static[key]
        with pytest.raises(ValueError, match=f"missing.*{key}"):
            sc.StaticLossScaler().load_state_dict(static)


@pytest.mark.parametrize("bad", [None, [1, 2], "state", 3])
def test_load_state_dict_rejects_non_dicts(bad):
    for scaler in (sc.DynamicLossScaler(), sc.StaticLossScaler(), sc.DelayedScaling()):
        with pytest.raises(TypeError, match="state must be a dict"):
            scaler.load_state_dict(bad)


@pytest.mark.parametrize(
    ("change", "field", "exc"),
    [
        ({"scale": float("nan")}, "scale", ValueError),
        ({"scale": -1.0}, "scale", ValueError),
        ({"steps": -1}, "steps", ValueError),
        ({"skipped": -1}, "skipped", ValueError),
        ({"skip_on_inf": "false"}, "skip_on_inf", TypeError),
    ],
)
def test_static_load_state_dict_rejects_bad_fields(change, field, exc):
    good = sc.StaticLossScaler(8.0).state_dict()
    with pytest.raises(exc, match=field):
        sc.StaticLossScaler().load_state_dict({**good, **change})


@pytest.mark.parametrize(
    ("change", "field", "exc"),
    [
        ({"scale": float("nan")}, "scale", ValueError),
        ({"scale": -1.0}, "scale", ValueError),
        ({"steps": -1}, "steps", ValueError),
        ({"amax_history": [1.0, -2.0, 0.0, 0.0]}, "amax_history", ValueError),
        ({"amax_history": [1.0, 0.0]}, "amax_history", ValueError),
        ({"margin": float("nan")}, "margin", ValueError),
        ({"margin": 200}, "margin", ValueError),
    ],
)
def test_delayed_load_state_dict_rejects_bad_fields(change, field, exc):
    ds = sc.DelayedScaling("e4m3", amax_history_len=4)
    ds.update(3.0)
    with pytest.raises(exc, match=field):
        sc.DelayedScaling().load_state_dict({**ds.state_dict(), **change})
    state = ds.state_dict()
    del state["steps"]
    with pytest.raises(ValueError, match=r"missing.*steps"):
        sc.DelayedScaling().load_state_dict(state)


def test_collapsed_state_round_trips():
    s = sc.DynamicLossScaler(init_scale=2.0**-140, on_collapse="ignore")
    s.update(True)  # 2**-141: float32 subnormal; keeps halving to 0
    for _ in range(10):
        s.update(True)
    assert s.collapsed and s.scale == 0.0
    t = sc.DynamicLossScaler()
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == s.state_dict()


@pytest.mark.parametrize("margin", [float("nan"), float("inf"), 200, -200])
def test_margin_that_breaks_the_scale_is_an_error(margin):
    with pytest.raises(ValueError, match="margin"):
        sc.scale_from_amax(3.0, "e4m3", margin=margin)
    with pytest.raises(ValueError, match="margin"):
        sc.DelayedScaling("e4m3", margin=margin)
    with pytest.raises(ValueError, match="margin"):
        sc.current_scale(np.ones(3), "e4m3", margin=margin)


def test_scale_that_underflows_float32_is_an_error_not_zero():
    # margin 126 is fine for amax 1, but 448 / 1e30 / 2**126 is below float32's range
    assert sc.scale_from_amax(1.0, "e4m3", margin=120) == np.float32(448 * 2.0**-120)
    with pytest.raises(ValueError, match="underflows float32"):
        sc.scale_from_amax(1e30, "e4m3", margin=126)


def test_amax_beyond_float32_keeps_the_previous_scale_without_warnings():
    # TE's amax is a float32: beyond float32 it is inf, and the previous scale is kept
    assert float(sc.scale_from_amax(1e50, "e4m3", previous=4.0)) == 4.0
    ds = sc.DelayedScaling("e4m3", amax_history_len=2)
    ds.update(3.5)
    assert ds.update(1e39) == ds.scale == 128.0
    assert math.isinf(ds.amax_history[-1]) or math.isinf(ds.amax_history.max())
    b = sc.block_scales(np.array([[1e300, 1.0] + [0.0] * 126, [1.0] * 128]), "e4m3")
    assert b.scales.tolist() == [[1.0], [256.0]]
