"""The gradient-to-noise study of "FP4 all the way" (precision_lab.studies.gradient_noise).

Small configurations (one hidden layer of 16, a few epochs): the noise is exactly zero where the
backward is exact, the switched run is a fork of the FP4 run, the norms are the norms of the
gradients they name, the run is deterministic, and its values are pinned.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from precision_lab.studies import gradient_noise as gn

SMALL = {"epochs": 4, "hidden": (16,), "batch_size": 256}


@pytest.fixture(scope="module")
def fp4run() -> dict:
    return gn.gradient_noise_study(**SMALL)


def test_threshold_is_the_papers_sqrt3() -> None:
    assert gn.THRESHOLD == math.sqrt(3.0)


def test_an_exact_backward_adds_no_noise_and_trains_like_fp32() -> None:
    """Recipe fp32: Q(g) == g bit for bit, so every noise norm is 0, the ratio is inf, there is
    no crossing, and the 'fp4' run (here fp32) is the fp32 run."""
    r = gn.gradient_noise_study(recipe="fp32", **SMALL)
    assert all(v == 0.0 for v in r["step"]["noise_norm"])
    assert all(v > 0.0 for v in r["step"]["grad_norm"])
    assert all(math.isinf(v) for v in r["epoch"]["ratio"])
    assert r["crossing"] is None
    assert r["epoch"]["fp4"] == r["epoch"]["fp32"]
    # the fork at epochs // 2 then trains with the same (exact) backward: the same run again
    sw = r["switch"]
    assert sw == SMALL["epochs"] // 2
    assert r["epoch"]["switched"][sw - 1 :] == r["epoch"]["fp4"][sw - 1 :]


def test_switched_run_forks_from_the_fp4_run(fp4run) -> None:
    ep, sw = fp4run["epoch"], fp4run["switch"]
    assert fp4run["crossing"] is None and sw == SMALL["epochs"] // 2
    assert ep["switched"][: sw - 1] == [None] * (sw - 1)
    assert ep["switched"][sw - 1] == ep["fp4"][sw - 1]
    assert ep["switched"][sw:] != ep["fp4"][sw:]  # a different backward from then on


def test_ratio_is_the_norms_ratio_per_epoch(fp4run) -> None:
    """ratio = sqrt(sum ||g||^2 / sum ||Q(g) - g||^2) over each epoch's steps."""
    spe = fp4run["steps_per_epoch"]
    g, q = fp4run["step"]["grad_norm"], fp4run["step"]["noise_norm"]
    for e, ratio in enumerate(fp4run["epoch"]["ratio"]):
        sl = slice(e * spe, (e + 1) * spe)
        want = math.sqrt(math.fsum(v * v for v in g[sl]) / math.fsum(v * v for v in q[sl]))
        assert ratio == pytest.approx(want, rel=1e-12)
    assert all(v > 0 for v in q)  # stochastic rounding in the backward does add noise


def test_a_forced_switch_and_an_early_crossing() -> None:
    """switch_epoch is honoured; a threshold above every ratio crosses in the first epoch."""
    r = gn.gradient_noise_study(switch_epoch=3, **SMALL)
    assert r["switch"] == 3 and r["crossing"] is None
    r = gn.gradient_noise_study(threshold=1e9, **SMALL)
    assert r["crossing"] == 1 and r["switch"] == 1
    with pytest.raises(ValueError, match="switch_epoch"):
        gn.gradient_noise_study(switch_epoch=0, **SMALL)


def test_deterministic_and_pinned(fp4run) -> None:
    again = gn.gradient_noise_study(**SMALL)
    assert again == fp4run
    got = [round(v, 4) for v in fp4run["epoch"]["ratio"]]
    assert np.all(np.array(got) > gn.THRESHOLD)
    assert got == PINNED_RATIOS


#: seed 0, SMALL: the per-epoch ratios to 4 decimals
PINNED_RATIOS = [16.3566, 15.6571, 13.1229, 11.2324]
