"""The FP4 papers' published numbers, recomputed by precision_lab.studies.fp4 and pinned.

Each recomputed number must lie within the paper's stated precision (half a unit of its last
digit) plus three sampling standard errors; and the deterministic values (fixed seed) are pinned
to four significant digits so that any change to the quantizers shows here.
"""

from __future__ import annotations

import numpy as np
import pytest

from precision_lab.studies import fp4


@pytest.fixture(scope="module")
def q2(quartet2_numbers) -> dict[str, fp4.Number]:
    """seed 0, 1024 x 1024 (the defaults: shared with tests/figures/test_fig_fp4.py)."""
    return quartet2_numbers


@pytest.mark.parametrize(
    ("key", "rqe_digits", "bits_digits"),
    [
        ("nvfp4_rtn", 4, 3),
        ("nvfp4_4over6", 4, 3),
        ("nvfp4_16x16", 4, 3),
        ("hadamard128_rtn", 4, None),
        ("hadamard128_sr", 4, None),
    ],
)
def test_quartet2_numbers_within_the_papers_precision(q2, key, rqe_digits, bits_digits) -> None:
    n = q2[key]
    rqe, bits = fp4.QUARTET2_PUBLISHED[key]
    assert fp4._isclose_published(n.rqe, rqe, rqe_digits, n.stderr), (key, n)
    if bits is not None:  # effective bits: d bits = d rqe / (2 ln2 rqe)
        se_bits = n.stderr / (2 * 0.6931471805599453 * n.rqe)
        assert fp4._isclose_published(n.effective_bits, bits, bits_digits, se_bits), (key, n)


def test_quartet2_values_are_deterministic(q2) -> None:
    got = {k: float(f"{v.rqe:.4g}") for k, v in q2.items()}
    assert got == {
        "nvfp4_rtn": 0.009028,
        "nvfp4_4over6": 0.007559,
        "nvfp4_16x16": 0.01237,
        "hadamard128_rtn": 0.009023,
        "hadamard128_sr": 0.02359,
        "hadamard128_rtn_code": 0.008956,
    }


@pytest.fixture(scope="module")
def tries(quartet2_sr_attempts) -> dict[str, fp4.Number]:
    """seed 0, 512 x 1024 (the defaults: shared with tests/figures/test_fig_fp4.py)."""
    return quartet2_sr_attempts


def test_sr_with_nvidias_rule_is_twice_rtn_not_the_published_value(q2, tries) -> None:
    """With NVIDIA's NVFP4 scale rule (block amax to 6), SR's error is about twice RTN's (exact
    SR: d**2/6 against d**2/12) and far from Quartet II's 23.5e-3; with the 17/16 headroom of
    Quartet II's code, on N(0, 1) data and on the code's own data, it is the published value."""
    sr, rtn = tries["sr"].rqe, q2["hadamard128_rtn"].rqe
    assert 1.9 < sr / rtn < 2.2
    assert abs(sr - 23.5e-3) > 10 * tries["sr"].stderr
    for key in ("sr_headroom_17_16", "sr_quartet2_code"):
        assert fp4._isclose_published(tries[key].rqe, 23.5e-3, 4, tries[key].stderr), key
    assert {k: round(v.rqe * 1e3, 2) for k, v in tries.items() if "17" in k or "code" in k} == {
        "sr_headroom_17_16": 23.55,
        "sr_quartet2_code": 23.45,
    }


def test_quartet2_code_convention_at_override_16_17_is_nvidias_rule() -> None:
    """An independent oracle: with scale_override = 16/17 the code's element maximum is 6 and
    its tensor scale maps the amax to 447.99, which is the library's NVFP4 with
    ``tensor_scale_bound=447.99``; both quantizers agree up to the float32 rounding of the
    library's result (the same stochastic-rounding words: same seed, same element order)."""
    import dataclasses

    from precision_lab.quant.blocks import get_block_format, round_to_blocks

    bf = dataclasses.replace(get_block_format("nvfp4"), tensor_scale_bound=447.99)
    x = np.random.default_rng(3).standard_normal((64, 256)).astype(np.float32)
    for mode, seed in (("nearest_even", None), ("stochastic", 5)):
        ours = fp4.nvfp4_quartet2_code(x, rounding=mode, scale_override=16 / 17, seed=seed)
        lib = round_to_blocks(x, bf, rounding=mode, seed=seed).astype(np.float64)
        np.testing.assert_allclose(ours, lib, rtol=2.0**-23, atol=0)
    # the 17/16 headroom: no scaled value passes 6 (E4M3 rounds a block scale down by at most
    # 1/16), so rounding up never saturates: q >= x everywhere. Without it (16/17: amax to 6)
    # blocks whose scale rounds down clamp, and q < x somewhere.
    x64 = x.astype(np.float64)
    assert np.all(fp4.nvfp4_quartet2_code(x, rounding="up") >= x64)
    assert np.any(fp4.nvfp4_quartet2_code(x, rounding="up", scale_override=16 / 17) < x64)


def test_mx_scale_rules_on_normal_blocks() -> None:
    r = fp4.mx_scale_rule_numbers(seed=0, blocks=16384)
    for name in ("mxfp4_e2m1", "mxfp8_e4m3"):
        v = r[name]
        assert v["ceil"]["clipped"] == v["rceil"]["clipped"] == 0.0
        assert v["ceil"]["qsnr_db"] == v["rceil"]["qsnr_db"]  # equal on float32 data
        assert 0 < v["nearest_even"]["clipped"] < v["floor"]["clipped"]
    assert 0.28 < r["mxfp4_e2m1"]["floor"]["clipped"] < 0.31
    assert 0.15 < r["mxfp8_e4m3"]["floor"]["clipped"] < 0.18
    # MXFP4: EVEN is best; floor beats ceil (clipping a little costs less than a coarser grid)
    f4 = r["mxfp4_e2m1"]
    assert f4["nearest_even"]["qsnr_db"] > f4["floor"]["qsnr_db"] > f4["ceil"]["qsnr_db"]
    # MXFP8: clipping costs more than the coarser grid: ceil is best
    f8 = r["mxfp8_e4m3"]
    assert f8["ceil"]["qsnr_db"] > f8["nearest_even"]["qsnr_db"] > f8["floor"]["qsnr_db"]
    text = fp4.markdown({k: fp4.Number(1e-3, 5.0, 0.0) for k in fp4.QUARTET2_PUBLISHED}, r)
    assert "| mxfp4_e2m1 | floor |" in text and "| nvfp4_rtn |" in text


def test_recipe_training_compares_recipes_on_the_same_seeds() -> None:
    r = fp4.recipe_training(("fp32", "te_nvfp4"), seeds=(0,), epochs=1)
    assert set(r) == {"fp32", "te_nvfp4"}
    assert len(r["fp32"]["test_acc"]) == 1 and 0 <= r["te_nvfp4"]["test_acc"][0] <= 1
    assert r["fp32"]["train_loss"] != r["te_nvfp4"]["train_loss"]
