"""scaling.simulate / scaling.diagnose on synthetic gradient dumps whose answer is known, and the
scalers' repr (issue 10, "what a user could not find")."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from precision_lab import scaling as sc


@pytest.fixture(autouse=True)
def _warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def clean_steps(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(64).astype(np.float32) * 1e-3 for _ in range(n)]


@pytest.mark.parametrize("init", [2.0**-10, 1.0, 2.0**16])
def test_a_real_inf_is_skipped_at_every_scale(init):
    steps = clean_steps(12)
    steps[5] = steps[5].copy()
    steps[5][7] = np.inf
    steps[9] = [steps[9], np.array([np.nan, 1.0], dtype=np.float32)]  # a list of layers
    s = sc.DynamicLossScaler(init_scale=init, growth_interval=1000)
    r = sc.simulate(s, steps, "fp16")
    assert len(r) == 12
    assert r.skipped[5] and r.skipped[9] and r.found_inf[5] and r.found_inf[9]
    assert r.nonfinite_count.tolist() == [0] * 5 + [1] + [0] * 3 + [1] + [0, 0]
    assert r.overflow_count[5] >= 1 and r.overflow_count[9] >= 1
    assert r.n_values[9] == 66
    # the scale used at each step: halved after each skipped step
    assert r.scale[6] == r.scale[5] / 2 and r.scale[10] == r.scale[9] / 2
    assert s.scale == r.final_scale == r.scale_after[-1]


def test_overflow_is_detected_in_the_format_at_the_current_scale():
    # 1000 * S overflows fp16 (to inf) while 1000 * S >= 65520: S = 2**16 .. 2**7
    steps = [np.array([1000.0, 1e-3], dtype=np.float32)] * 14
    r = sc.simulate(sc.DynamicLossScaler(), steps, "fp16")
    assert r.skipped.tolist() == [True] * 10 + [False] * 4
    assert np.log2(r.scale).tolist() == [16 - i for i in range(11)] + [6, 6, 6]
    assert r.overflow_count.tolist() == [1] * 10 + [0] * 4
    assert r.nonfinite_count.sum() == 0
    # e4m3 has no inf: overflow is NaN (above 464)
    r8 = sc.simulate(sc.StaticLossScaler(1.0), [np.array([464.0, 465.0, 448.0])], "e4m3")
    assert r8.overflow_count.tolist() == [1] and r8.skipped.tolist() == [True]


def test_vanishing_gradients_need_the_scale_reached_after_six_growth_intervals():
    # 2**-30 * S is 0 in fp16 (ties to even at 2**-25) until S = 2**6; 1.5 * 2**-30 survives
    # from S = 2**5. Growth every 3 clean steps from S = 1: step i uses 2**(i // 3).
    g = np.array([2.0**-30] * 3 + [1.5 * 2.0**-30], dtype=np.float32)
    s = sc.DynamicLossScaler(init_scale=1.0, growth_interval=3)
    r = sc.simulate(s, [g] * 24, "fp16")
    assert np.log2(r.scale).tolist() == [i // 3 for i in range(24)]
    want = [1.0] * 15 + [0.75] * 3 + [0.0] * 6
    assert r.underflow_fraction.tolist() == want
    assert int(np.argmax(r.underflow_fraction == 0)) == 18
    assert not r.skipped.any()


def test_diagnose_inf_in_the_gradients_themselves():
    steps = [np.array([np.nan, 1e-3], dtype=np.float32)] * 40
    s = sc.DynamicLossScaler(on_collapse="ignore")
    r = sc.simulate(s, steps, "fp16")
    d = sc.diagnose(r)
    assert "nonfinite_gradients" in d.kinds and "scale_collapse" in d.kinds
    text = str(d)
    assert "40 of 40 steps" in text and "not fixable by scaling" in text
    assert "65536" in text  # the scale it started from


def test_diagnose_gradients_beyond_the_format_unscaled():
    # gradients of 1e5 overflow fp16 at every scale >= 1; with a floor of 1 (DeepSpeed,
    # Megatron) every step is skipped
    steps = [np.array([1e5, 1.0], dtype=np.float32)] * 30
    r = sc.simulate(sc.DynamicLossScaler(init_scale=4.0, min_scale=1.0), steps, "fp16")
    assert r.skipped.all() and r.scale[-1] == 1.0
    d = sc.diagnose(r)
    assert "persistent_overflow" in d.kinds and "overflow_unscaled" in d.kinds
    assert "nonfinite_gradients" not in d.kinds
    assert "100000" in str(d) and "65504" in str(d) and "30 of 30" in str(d)


def test_diagnose_vanishing_gradients_with_slow_growth_and_ceiling():
    g = np.array([2.0**-30] * 4, dtype=np.float32)
    r = sc.simulate(sc.DynamicLossScaler(init_scale=1.0, growth_interval=2000), [g] * 20, "fp16")
    d = sc.diagnose(r)
    assert "vanishing_gradients" in d.kinds and "slow_growth" in d.kinds
    assert "100%" in str(d) and "2**6" in str(d)
    capped = sc.DynamicLossScaler(init_scale=1.0, growth_interval=1, max_scale=8.0)
    d2 = sc.diagnose(sc.simulate(capped, [g] * 20, "fp16"))
    assert "scale_at_ceiling" in d2.kinds and "max_scale=8" in str(d2)


def test_diagnose_healthy_run():
    r = sc.simulate(sc.DynamicLossScaler(growth_interval=5), clean_steps(20), "fp16")
    d = sc.diagnose(r)
    assert d.kinds == ("healthy",) and "healthy" in str(d)
    assert "20 steps" in r.summary()


def test_simulate_rejects_bad_input():
    with pytest.raises(TypeError, match="scaler"):
        sc.simulate(object(), [np.ones(3)], "fp16")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="gradient_steps"):
        sc.simulate(sc.DynamicLossScaler(), [np.array(["a"])], "fp16")
    with pytest.raises(ValueError, match="unknown format"):
        sc.simulate(sc.DynamicLossScaler(), [np.ones(3)], "fp99")
    r = sc.simulate(sc.DynamicLossScaler(), [], "fp16")
    assert len(r) == 0 and "0 steps" in r.summary()


def test_scaler_reprs_are_readable():
    s = sc.DynamicLossScaler()
    assert repr(s) == (
        "DynamicLossScaler(scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, "
        "growth_interval=2000; steps=0, skipped=0)"
    )
    d = sc.DynamicLossScaler.preset("deepspeed")
    assert repr(d).startswith("DynamicLossScaler(name='deepspeed', scale=2.0**16, ")
    assert "hysteresis=2" in repr(d) and "min_scale=1.0" in repr(d)
    assert repr(sc.StaticLossScaler(1024.0)) == (
        "StaticLossScaler(scale=2.0**10, skip_on_inf=True; steps=0, skipped=0)"
    )
    assert repr(sc.DelayedScaling("e4m3", amax_history_len=16)) == (
        "DelayedScaling(fmt='e4m3', amax_history_len=16, amax_compute_algo='max', margin=0; "
        "scale=1.0, steps=0)"
    )
