"""Training the digits MLP under a recipe (precision_lab.training.recipe_model)."""

from __future__ import annotations

import numpy as np
import pytest

from precision_lab.training import RUNS, train_seeds
from precision_lab.training.recipe_model import RecipeMLP, recipe_model

CFG = RUNS["fp32"].replace(epochs=2, hidden=(32,), batch_size=256)


@pytest.fixture(scope="module")
def fp32_recipe_runs() -> list:
    """Seeds 0 and 1 under the recipe ``fp32``: compared with the plain model below, and its
    seed 0 with the FP4 run (one training instead of two)."""
    return train_seeds(CFG, [0, 1], model=recipe_model("fp32"))


def test_fp32_recipe_reproduces_the_plain_model_bit_for_bit(fp32_recipe_runs) -> None:
    plain = train_seeds(CFG, [0, 1])
    for a, b in zip(plain, fp32_recipe_runs, strict=True):
        assert np.array_equal(a.train_loss, b.train_loss)
        assert np.array_equal(a.test_acc, b.test_acc)


def test_fp4_recipe_runs_are_reproducible_per_seed_and_differ_from_fp32(fp32_recipe_runs) -> None:
    a = train_seeds(CFG, [0, 1], model=recipe_model("te_nvfp4"))
    b = train_seeds(CFG, [1], model=recipe_model("te_nvfp4"))
    again = train_seeds(CFG, [0, 1], model=recipe_model("te_nvfp4"))
    assert np.array_equal(a[1].train_loss, b[0].train_loss)  # replicas are independent
    assert np.array_equal(a[0].train_loss, again[0].train_loss)
    assert not np.array_equal(a[0].train_loss, fp32_recipe_runs[0].train_loss)
    assert np.isfinite(a[0].train_loss).all()


def test_recipe_gemms_quantize_their_operands() -> None:
    rngs = [np.random.default_rng(0)]
    net = RecipeMLP([64, 16, 10], CFG, rngs, "te_nvfp4")
    x = np.random.default_rng(1).standard_normal((1, 32, 64)).astype(np.float32)
    out = net.forward(x, train=True)
    exact = np.maximum(x[0] @ net.W[0][0], 0) @ net.W[1][0]
    err = np.abs(out[0] - exact).max() / np.abs(exact).max()
    assert 1e-3 < err < 0.5  # FP4 operands: visibly inexact, but the same function
