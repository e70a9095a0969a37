"""Conversions between block formats (precision_lab.quant.convert).

Oracles: Model Optimizer's closed form for MXFP4 -> NVFP4 re-derived here from its definition
(``numeric_utils.mxfp4_to_nvfp4_global_amax`` / ``_per_block_amax``: integers and powers of two),
exact rational values for the lossless claims, and the re-quantization definition elsewhere.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.quant.convert import conversion_error, convert_blocks, mxfp4_to_nvfp4
from precision_lab.quant.fine_grained import deepgemm_quantize


def _mx(seed: int, spread: int) -> pl.QuantizedBlocks:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 128)) * np.exp2(
        rng.integers(-spread, spread + 1, (6, 4)).repeat(32, 1)
    )
    x[0, :32] = 0.0  # an all-zero block (E8M0 code 0): ignored by k_max
    return pl.quantize_blocks(x.astype(np.float32), "mxfp4_e2m1")


def test_mxfp4_to_nvfp4_closed_form_and_lossless_blocks() -> None:
    q = _mx(0, 12)  # spread 24 binades: some blocks fall outside E4M3's 18-binade window
    nv = mxfp4_to_nvfp4(q)
    codes = q.scale_codes.astype(int)
    k = codes - 127
    k_max = int(k[codes > 0].max())
    m = k_max - 8
    assert Fraction(nv.tensor_scale) == Fraction(2) ** m
    assert nv.tensor_amax == 6 * 448 * 2.0**m
    kk = np.repeat(k, 2, axis=-1)
    lossless = ((kk - m >= -9) & (kk - m <= 8)) | (np.repeat(codes, 2, axis=-1) == 0)
    assert 0 < lossless.mean() < 1  # both kinds present
    # lossless blocks: scale 2**(k_j - m) exactly, the nibbles kept, the values equal
    live = lossless & (np.repeat(codes, 2, axis=-1) > 0)
    np.testing.assert_array_equal(nv.scales[live], np.exp2((kk - m)[live].astype(float)))
    mxc = q.element_codes().reshape(6, 8, 16)
    nvc = nv.element_codes().reshape(6, 8, 16)
    np.testing.assert_array_equal(nvc[live], mxc[live])
    src, out = q.dequantize().reshape(6, 8, 16), nv.dequantize().reshape(6, 8, 16)
    np.testing.assert_array_equal(out[lossless], src[lossless])
    # the others: NVFP4's rounding at a clamped scale; never larger than the block's amax
    err = np.abs(out - src)[~lossless]
    assert (err <= np.abs(src[~lossless]).max(axis=-1, keepdims=True)).all()
    assert (out[~lossless] != src[~lossless]).any()


def test_mxfp4_to_nvfp4_is_exact_within_18_binades() -> None:
    q = _mx(1, 4)
    nv = convert_blocks(q, "nvfp4")
    np.testing.assert_array_equal(nv.dequantize(), q.dequantize())
    assert conversion_error(q, nv)["exact_fraction"] == 1.0


@pytest.mark.parametrize("rule", ["ceil", "rceil"])
def test_fp8_per_tensor_pow2_to_mxfp8_is_exact(rule: str) -> None:
    """Every E4M3 value, in random order and blocks, with power-of-two tensor scales, under the
    round-up rules; the OCP floor rule clips some of the same blocks."""
    vals = pl.get_format("e4m3").values().astype(np.float64)
    rng = np.random.default_rng(2)
    clipped = False
    for e in (-20, -3, 0, 7):
        x = rng.permutation(np.tile(vals, 2))[: (vals.size * 2 // 32) * 32].reshape(-1, 32)
        x[::3] /= 2.0**8  # blocks whose amax is far below 448: elements shift up
        x = pl.round_to(x, "e4m3")
        mx = convert_blocks(x, f"mxfp8_e4m3[{rule}]", scale=2.0**e)
        np.testing.assert_array_equal(mx.dequantize(), x * 2.0**e)
        floor = convert_blocks(x, "mxfp8_e4m3", scale=2.0**e)
        clipped |= bool((floor.dequantize() != x * 2.0**e).any())
    assert clipped
    # a non-power-of-two scale rounds somewhere
    mx = convert_blocks(x, f"mxfp8_e4m3[{rule}]", scale=0.3)
    assert conversion_error(x, mx, scale=0.3)["max_abs"] > 0


def test_blockwise_fp8_ue8m0_to_mxfp8_is_exact() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 256)) * np.exp2(rng.integers(-8, 8, (4, 1)))
    q = deepgemm_quantize(x)
    mx = convert_blocks(q, "mxfp8_e4m3[rceil]")
    np.testing.assert_array_equal(mx.dequantize(), q.dequantize())


@pytest.mark.parametrize("src", ["nvfp4", "fp8"])
def test_lossy_conversions_are_requantization(src: str) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    q = pl.quantize_blocks(x, "nvfp4") if src == "nvfp4" else deepgemm_quantize(x, ue8m0=False)
    mx = convert_blocks(q, "mxfp4_e2m1")
    want = pl.quantize_blocks(q.dequantize(), "mxfp4_e2m1")
    np.testing.assert_array_equal(mx.codes, want.codes)
    np.testing.assert_array_equal(mx.scales, want.scales)
    # the error added: at most 2 scale units per element (half the largest E2M1 step, 1, or
    # the OCP floor rule's clipping of (6, 8) to 6)
    err = np.abs(mx.dequantize() - q.dequantize()).reshape(8, 2, 32)
    assert (err <= 2 * mx.scales[..., None]).all()
    assert conversion_error(q, mx)["max_rel"] > 0


def test_errors() -> None:
    with pytest.raises(ValueError, match="must be MXFP4"):
        mxfp4_to_nvfp4(pl.quantize_blocks(np.ones((1, 32)), "mxfp8_e4m3"))
    with pytest.raises(ValueError, match="scale must be a positive"):
        convert_blocks(np.ones((1, 32)), "mxfp8_e4m3", scale=0.0)
