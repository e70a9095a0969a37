"""The fast paths of block quantization added for issue 34 give the bits of the paths they
replace: the ``"rceil"`` scale rule on the native kernel against the numpy passes, and blocks
along a leading axis quantized with that axis moved last against the quantization in place.
Each comparison also checks that the fast path was the one taken, so the test can fail."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from test_scale_rules import boundary_blocks

import precision_lab as pl
from precision_lab.backends.native import kernels
from precision_lab.quant.blocks import get_block_format

passes = importlib.import_module("precision_lab.quant.block_passes")
blocks = importlib.import_module("precision_lab.quant.blocks")

MODES = ["nearest_even", "up", "down", "toward_zero", "stochastic"]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _same_blocks(p, q) -> bool:  # type: ignore[no-untyped-def]
    return (
        _same(p.codes, q.codes)
        and _same(p.scale_codes, q.scale_codes)
        and _same(p.scales, q.scales)
        and p.shape == q.shape
        and p.axis == q.axis
        and p.dtype == q.dtype
        and p.tensor_scale == q.tensor_scale
        and p.tensor_amax == q.tensor_amax
    )


def _data(dtype: type, name: str) -> np.ndarray:
    """Boundary amaxes of the rules (float32 subnormal and overflowing quotients among them),
    zero blocks, signed zeros, infinities and NaN."""
    rng = np.random.default_rng(5)
    x = np.concatenate([boundary_blocks(name), rng.standard_normal((40, 32))]).astype(dtype)
    x[3] = 0.0
    x[4, ::2] = -0.0
    x[5, 7] = np.inf
    x[6, 1] = np.nan
    if dtype == np.float64:
        x[7, 0] = 1e300  # past FP32: the float32 quotient is inf, a NaN block
        x[8, 0] = 1e-300  # below FP32's subnormals: rounds to 0
    return x


@pytest.mark.skipif(not kernels.available(), reason="the native extension is not built")
@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e3m2", "mxint8"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rceil_native_equals_the_numpy_passes(
    name: str, dtype: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    bf = get_block_format(name, scale_rule="rceil")
    x = _data(dtype, name)
    taken = []
    orig = passes._native_blocks

    def spy(*a, **k):  # type: ignore[no-untyped-def]
        taken.append(1)
        return orig(*a, **k)

    for mode in MODES:
        monkeypatch.setattr(passes, "_native_blocks", spy)
        got_q = pl.quantize_blocks(x, bf, rounding=mode, seed=3)
        got_v = pl.round_to_blocks(x, bf, rounding=mode, seed=3)
        assert len(taken) == 2, mode
        taken.clear()
        monkeypatch.setattr(passes, "_native_ext", lambda *a: None)
        want_q = pl.quantize_blocks(x, bf, rounding=mode, seed=3)
        want_v = pl.round_to_blocks(x, bf, rounding=mode, seed=3)
        monkeypatch.undo()
        assert _same_blocks(got_q, want_q), mode
        assert _same(got_v, want_v), mode


FORMATS = {
    "mxfp8_e4m3 rceil": get_block_format("mxfp8_e4m3", scale_rule="rceil"),
    "mxfp4_e2m1": get_block_format("mxfp4_e2m1"),
    "nvfp4": get_block_format("nvfp4"),
    "mxint8": get_block_format("mxint8"),
}


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("mode", ["nearest_even", "toward_zero", "up"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blocks_along_a_leading_axis_equal_the_quantization_in_place(
    name: str, mode: str, dtype: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(9)
    calls = []
    orig = blocks._along_last_axis

    def spy(*a, **k):  # type: ignore[no-untyped-def]
        out = orig(*a, **k)
        calls.append(out is not None)
        return out

    bf = FORMATS[name]
    k = bf.block_shape[0]
    for shape, pad in (((3, 70, 20), True), ((2, 64, 32), False)):
        x = (rng.standard_normal(shape) * np.exp2(rng.integers(-8, 8, shape))).astype(dtype)
        x[0, :32, 0] = 0.0
        x[1, 5, 3] = np.nan
        x[-1, 9, 4] = -np.inf
        for axis in (0, 1, -2):
            if not pad and x.shape[axis] % k:
                continue
            monkeypatch.setattr(blocks, "_along_last_axis", spy)
            got = pl.quantize_blocks(x, bf, axis=axis, rounding=mode, pad=pad)
            monkeypatch.setattr(blocks, "_along_last_axis", lambda *a, **k: None)
            want = pl.quantize_blocks(x, bf, axis=axis, rounding=mode, pad=pad)
            monkeypatch.undo()
            # (float32 blocks the native kernel runs in place are not moved)
            assert calls.pop() is not passes._native_in_place(bf, x.dtype, mode)
            assert _same_blocks(got, want), (shape, axis)
            assert _same(pl.dequantize_blocks(got), pl.dequantize_blocks(want))


def test_stochastic_rounding_along_a_leading_axis_stays_in_place() -> None:
    """The random words follow the flat index, which moving the axis would change."""
    x = np.random.default_rng(1).standard_normal((64, 8)).astype(np.float32)
    bf = get_block_format("nvfp4")
    assert blocks._along_last_axis(x, bf, 0, "stochastic", 1, None, False) is None
    # (a deterministic mode moves the axis where the native kernel does not run it in place:
    # float64 data)
    x64 = x.astype(np.float64)
    assert blocks._along_last_axis(x64, bf, 0, "stochastic", 1, None, False) is None
    assert blocks._along_last_axis(x64, bf, 0, "nearest_even", 1, None, False) is not None


@pytest.mark.parametrize("name", ["nvfp4_16x16", "fp8_128x128"])
@pytest.mark.parametrize("mode", ["nearest_even", "toward_zero", "up"])
def test_tiles_as_runs_equal_the_quantization_in_place(
    name: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(4)
    tr, tc = get_block_format(name).block_shape
    calls = []
    orig = blocks._tiles_as_runs

    def spy(*a, **k):  # type: ignore[no-untyped-def]
        out = orig(*a, **k)
        calls.append(out is not None)
        return out

    for shape in ((2 * tr, 3 * tc), (2, tr, 2 * tc), (tr + 3, tc)):
        x = (rng.standard_normal(shape) * np.exp2(rng.integers(-10, 10, shape))).astype(np.float32)
        x[..., :tr, :tc] = 0.0  # a zero tile
        x.reshape(-1)[5] = np.nan
        x.reshape(-1)[-7] = np.inf
        for axis in (-1, -2):
            monkeypatch.setattr(blocks, "_tiles_as_runs", spy)
            got = pl.quantize_blocks(x, name, axis=axis, rounding=mode, pad=True)
            monkeypatch.setattr(blocks, "_tiles_as_runs", lambda *a, **k: None)
            want = pl.quantize_blocks(x, name, axis=axis, rounding=mode, pad=True)
            monkeypatch.undo()
            assert calls.pop() is (shape[-2] % tr == 0), shape  # (padded tiles: in place)
            assert _same_blocks(got, want), (shape, axis)
            assert _same(pl.dequantize_blocks(got), pl.dequantize_blocks(want))
    x = rng.standard_normal((tr, tc)).astype(np.float32)
    assert orig(x, get_block_format(name), -1, "stochastic", 1, None, False) is None


@pytest.mark.skipif(not kernels.available(), reason="the native extension is not built")
@pytest.mark.parametrize("n", [2, 16, 32, 256])
def test_exact_hadamard_native_equals_the_numpy_butterflies(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hadamard(..., arithmetic="exact") of float32 data on the native kernel against the numpy
    passes, bit for bit (NaN payloads included): rows within and past the exponent test (then
    the Python-integer path), rows of signed zeros, subnormals, infinities and NaN."""
    had = importlib.import_module("precision_lab.quant.hadamard")
    rng = np.random.default_rng(n)
    rows = 400
    x = rng.standard_normal((rows, n)) * np.exp2(rng.integers(-12, 12, (rows, n)))
    x[::7] *= np.exp2(rng.integers(-60, 60, (len(x[::7]), n)))  # past the exponent test
    x = x.astype(np.float32)
    x[rng.random(x.shape) < 0.2] = 0.0
    x[rng.random(x.shape) < 0.1] *= -0.0
    x[3] = -0.0
    x[4] = 0.0
    x[5, 0] = np.float32(2.0**-149)
    x[6, -1], x[7, 0], x[8, n // 2] = np.inf, -np.inf, np.nan
    x[9, 0], x[9, -1] = np.inf, -np.inf  # inf - inf
    x[10, :2] = np.array([np.nan, -np.nan], np.float32)
    calls = []
    orig = had._exact_native32

    def spy(*a, **k):  # type: ignore[no-untyped-def]
        out = orig(*a, **k)
        calls.append(out is not None)
        return out

    for seed in (None, 11):
        for inverse in (False, True):
            for axis in (-1, 0):
                xa = x if axis == -1 else np.ascontiguousarray(x.T)
                monkeypatch.setattr(had, "_exact_native32", spy)
                got = pl.hadamard(xa, block=n, seed=seed, inverse=inverse, axis=axis)
                monkeypatch.setattr(had, "_exact_native32", lambda *a, **k: None)
                want = pl.hadamard(xa, block=n, seed=seed, inverse=inverse, axis=axis)
                monkeypatch.undo()
                assert calls.pop() is True
                assert got.dtype == want.dtype == np.float64
                assert got.tobytes() == want.tobytes(), (seed, inverse, axis)


@pytest.mark.skipif(not kernels.available(), reason="the native extension is not built")
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4_e2m1", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp8_e4m3"])
def test_stochastic_rounding_below_the_normal_range_equals_the_numpy_passes(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The native kernel's stochastic rounding of elements below the element format's smallest
    normal (round_mag_sr in blocks.inc: FP4 puts about 40% of a block's values there) against
    the numpy passes, for several random-bit widths, with values at the quantum's multiples
    and halves, tiny values, signed zeros, inf and NaN."""
    rng = np.random.default_rng(17)
    x = rng.standard_normal((96, 64)) * np.exp2(rng.integers(-30, 3, (96, 64)))
    x[0] = np.arange(64) * 0.125 - 4  # multiples of a quarter: exact and half-way elements
    x[1, ::3] = -0.0
    x[2, 5] = 2.0**-140
    x[3, 7], x[4, 9], x[5, 11] = np.inf, -np.inf, np.nan
    x = x.astype(np.float32)
    taken = []
    orig = passes._native_blocks

    def spy(*a, **k):  # type: ignore[no-untyped-def]
        taken.append(1)
        return orig(*a, **k)

    for bits in (None, 8, 40):
        for seed in (0, 12345):
            kw = dict(rounding="stochastic", seed=seed, random_bits=bits)
            monkeypatch.setattr(passes, "_native_blocks", spy)
            got_q = pl.quantize_blocks(x, name, **kw)
            got_v = pl.round_to_blocks(x, name, **kw)
            assert len(taken) == 2
            taken.clear()
            monkeypatch.setattr(passes, "_native_ext", lambda *a: None)
            want_q = pl.quantize_blocks(x, name, **kw)
            want_v = pl.round_to_blocks(x, name, **kw)
            monkeypatch.undo()
            assert _same_blocks(got_q, want_q), (bits, seed)
            assert _same(got_v, want_v), (bits, seed)


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4_e2m1", "nvfp4_16x16"])
def test_packed_element_values_are_the_decoded_nibbles(name: str) -> None:
    """element_values of 4-bit formats (one gather from the values of the 256 bytes) against
    decode of the unpacked codes, for every code, odd and even last axes and batches."""
    from precision_lab.core.codec import decode

    rng = np.random.default_rng(2)
    for shape, axis in (((2, 16, 33), -1), ((16, 64), 0), ((32, 32), -1), ((1, 7), -1)):
        x = (rng.standard_normal(shape) * 3).astype(np.float32)
        x.reshape(-1)[:16] = np.arange(-8, 8)[: x.size]  # every E2M1 code (scale about 1)
        bf = get_block_format(name)
        if len(bf.block_shape) == 2 and (shape[-1] % 16 or shape[-2] % 16):
            continue
        q = pl.quantize_blocks(x, bf, axis=axis, pad=True)
        want = decode(q.element_codes(), bf.element).astype(np.float32)
        got = q.element_values()
        assert got.shape == want.shape == q.shape and got.dtype == np.float32
        assert got.tobytes() == want.tobytes(), shape
        assert x.size < 16 or len(np.unique(q.element_codes())) > 8
