"""QuantizedBlocks whose codes are encoded from the quantizer's element values on first read
(the recipes' GEMMs read only the values), and whose scale codes are encoded from the scales on
first read: the same codes, values and scales as an eager encoding, through every path of
quantize_blocks, and after pickling."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import precision_lab as pl
from precision_lab.core.codec import decode
from precision_lab.quant.blocks import QuantizedBlocks


def eager_codes(q: QuantizedBlocks) -> np.ndarray:
    """The codes from the element values, by the core's encoder, packed as quantize_blocks packs."""
    bf = q.block_format
    codes = np.asarray(pl.encode(q.element_values(), bf.element))
    if bf.packed:
        if codes.shape[-1] % 2:
            codes = np.concatenate([codes, np.zeros((*codes.shape[:-1], 1), np.uint8)], -1)
        codes = (codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))).astype(np.uint8)
    return codes


@pytest.mark.parametrize(
    ("fmt", "axis", "rounding"),
    [
        ("nvfp4", -1, "nearest_even"),
        ("nvfp4", -1, "stochastic"),
        ("nvfp4", 0, "nearest_even"),  # moved to the last axis and back
        ("mxfp8_e4m3", -1, "stochastic"),
        ("mxfp4_e2m1", 0, "toward_zero"),
        ("nvfp4_16x16", -1, "nearest_even"),  # 2-D tiles as runs
        ("mxint8", -1, "nearest_even"),  # integer elements: codes encoded at once
    ],
)
def test_lazy_codes_are_the_eager_ones(fmt: str, axis: int, rounding: str) -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((32, 64)) * 2.0 ** rng.integers(-12, 6, (32, 64))).astype(np.float32)
    x[3, :16] = np.nan  # a NaN block (its elements read as 0, its scale NaN)
    seed = 5 if rounding == "stochastic" else None
    eager = pl.quantize_blocks(x, fmt, axis=axis, rounding=rounding, seed=seed)
    assert "codes" in vars(eager)  # the default: codes at once (vars(q) rebuilds a q)
    q = pl.quantize_blocks(x, fmt, axis=axis, rounding=rounding, seed=seed, keep_values=True)
    lazy = "codes" not in vars(q)
    assert lazy == (fmt != "mxint8")
    if (fmt, axis) in (("nvfp4", -1), ("mxfp8_e4m3", -1), ("mxfp4_e2m1", 0)):
        assert "scale_codes" not in vars(q)  # (in place: the scale codes are lazy too)
    vals = q.element_values().copy()
    codes = q.codes  # encoded now
    np.testing.assert_array_equal(q.scale_codes, eager.scale_codes)
    assert "scale_codes" in vars(q) and q.scale_codes is q.scale_codes  # once
    assert "codes" in vars(q) and q.codes is codes  # once
    elem, e = q.block_format.element, q.block_format.element_exponent
    np.testing.assert_array_equal(codes, eager.codes)
    np.testing.assert_array_equal(q.scales, eager.scales)
    if not e:  # (MX INT8's codes are integers k of the values k * 2**e: encoded at once)
        np.testing.assert_array_equal(codes, eager_codes(q))
    got = np.asarray(decode(q.element_codes(), elem), np.float32) * np.float32(2.0**e)
    assert np.array_equal(got.view(np.uint32), vals.view(np.uint32))  # -0 kept
    again = pl.quantize_blocks(x, fmt, axis=axis, rounding=rounding, seed=seed, keep_values=True)
    back = pickle.loads(pickle.dumps(again))  # lazy across pickling
    np.testing.assert_array_equal(back.codes, codes)
    np.testing.assert_array_equal(back.scale_codes, eager.scale_codes)
    np.testing.assert_array_equal(pl.dequantize_blocks(back), pl.dequantize_blocks(q))
    if lazy:  # the kept values are shared: read-only
        with pytest.raises(ValueError, match="read-only"):
            q.element_values()[0] = 1.0
    with pytest.raises(AttributeError, match="no attribute 'other'"):
        _ = q.other
